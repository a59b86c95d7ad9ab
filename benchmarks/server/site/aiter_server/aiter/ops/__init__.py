"""Stand-in for ``aiter.ops`` (see the package docstring)."""

"""Stand-in for ``aiter.ops.flydsl`` (see the package docstring)."""

"""Stand-in for ``aiter.jit.utils``."""

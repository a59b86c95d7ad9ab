"""Stand-in for ``aiter.ops`` (only the MoE sort ops)."""

"""Stand-in for ``aiter.jit`` (only ``utils.torch_guard``)."""

"""What a user runs: ``sglang-amd-moe audit``, ``check`` and ``demo`` (``cli`` dispatches).
Never imported by :mod:`sglang_amd_moe.runtime`."""

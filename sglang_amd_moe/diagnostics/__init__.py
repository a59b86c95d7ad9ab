"""What a user runs: ``sglang-amd-moe audit``, ``check`` and ``demo`` (``cli`` dispatches);
the end-to-end check itself is :mod:`sglang_amd_moe.diagnostics.e2e`. Never imported by
:mod:`sglang_amd_moe.runtime`."""

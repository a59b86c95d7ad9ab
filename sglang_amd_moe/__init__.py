"""sglang-amd-moe: correct padded-row MoE routing on AMD GPUs for SGLang and aiter.

Where things are (``docs/architecture.md`` draws it):

- :mod:`sglang_amd_moe.runtime`: everything that runs inside a server process. The
  entry points (``runtime.plugin.register`` for SGLang, ``register_vllm`` for vLLM),
  the hook skeleton (``runtime.target``) and the two targets (``runtime.sglang``,
  ``runtime.aiter``).
- :mod:`sglang_amd_moe.kernels`: the Triton kernels the hooks call, with plain-torch
  references.
- :mod:`sglang_amd_moe.diagnostics`: what a user runs (``sglang-amd-moe audit``,
  ``check``, ``demo``); never imported by the runtime.
- ``sglang_amd_moe.patches``: unified diffs for people who patch their images.
"""

__version__ = "0.2.0"

"""sglang-amd-moe: correct padded-row MoE routing on AMD GPUs for SGLang and aiter.

The kernels live in :mod:`sglang_amd_moe.kernels`; the SGLang plugin entry point is
:func:`sglang_amd_moe.plugin.register`; ``sglang-amd-moe audit`` reports what is
installed and what the plugin changes.
"""

import logging

__version__ = "0.1.0"

logger = logging.getLogger("sglang_amd_moe")

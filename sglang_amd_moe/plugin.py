"""Plugin entry points: SGLang's ``sglang.srt.plugins`` and vLLM's ``vllm.general_plugins``.

``register()`` runs once in every SGLang process (engine, scheduler, DP controller,
detokenizer), called by ``sglang.srt.plugins.load_plugins()``. It must never take a
server down: every failure while detecting or hooking is logged and leaves upstream
untouched.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_amd_moe")


def register() -> None:
    """SGLang entry point (``sglang.srt.plugins``)."""
    raise NotImplementedError  # filled in by the SGLang plugin issue


def register_vllm() -> None:
    """vLLM entry point (``vllm.general_plugins``): the aiter part only (ATOM under vLLM)."""
    raise NotImplementedError  # filled in by the aiter issue

"""Plugin entry points: SGLang's ``sglang.srt.plugins`` and vLLM's ``vllm.general_plugins``.

``register()`` runs once in every SGLang process (engine, scheduler, DP controller,
detokenizer), called by ``sglang.srt.plugins.load_plugins()``. It must never take a
server down: every failure while detecting or hooking is logged and leaves upstream
untouched. SGLang's own ``SGLANG_PLUGINS`` whitelist decides whether it runs at all;
``SGLANG_AMD_MOE_DISABLE=1`` turns it off; hooks are registered only on ROCm unless
``SGLANG_AMD_MOE_FORCE=1``.
"""

from __future__ import annotations

import logging

from sglang_amd_moe import _env

logger = logging.getLogger("sglang_amd_moe")
_AITER_MISSING_LOGGED = False


def _make_log_visible() -> None:
    """Give this package's log lines a stderr handler when nothing else would print them.

    SGLang runs ``load_plugins()`` in each process before it configures logging, so the
    one INFO line saying what was found and done would otherwise be dropped (Python's
    last-resort handler prints WARNING and above only). When neither our logger nor the
    root logger has a handler, ours gets one of its own and stops propagating, so the
    line is printed exactly once even after SGLang configures the root logger later.
    """
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(asctime)s %(process)d] %(name)s %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.propagate = False


def register() -> None:
    """SGLang entry point (``sglang.srt.plugins``): the SGLang hook, then the aiter one."""
    _make_log_visible()
    if _env.disabled():
        logger.info("sglang-amd-moe: disabled by SGLANG_AMD_MOE_DISABLE=1; nothing hooked")
        return
    try:
        from sglang_amd_moe import sglang_hook

        sglang_hook.install()
    except Exception:  # install() itself never raises; this guards its import
        logger.exception("sglang-amd-moe: the SGLang hook could not be installed; SGLang left untouched")
    _install_aiter()


def register_vllm() -> None:
    """vLLM entry point (``vllm.general_plugins``): the aiter part only (ATOM under vLLM)."""
    _make_log_visible()
    if _env.disabled():
        logger.info("sglang-amd-moe: disabled by SGLANG_AMD_MOE_DISABLE=1; nothing hooked")
        return
    _install_aiter()


def _install_aiter() -> None:
    global _AITER_MISSING_LOGGED
    try:
        from sglang_amd_moe import aiter_hook
    except ImportError as exc:
        if not _AITER_MISSING_LOGGED:
            logger.warning("sglang-amd-moe: aiter hook unavailable (%s); aiter left untouched", exc)
            _AITER_MISSING_LOGGED = True
        return
    try:
        aiter_hook.install()
    except Exception:
        logger.exception("sglang-amd-moe: the aiter hook could not be installed; aiter left untouched")

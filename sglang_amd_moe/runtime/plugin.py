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

from sglang_amd_moe.runtime import env as _env

logger = logging.getLogger("sglang_amd_moe")
_AITER_MISSING_LOGGED = False


class _UntilRootConfigured(logging.Filter):
    """Passes records only while the root logger has no handler of its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not logging.getLogger().handlers


def _make_log_visible() -> None:
    """Give this package's log lines a stderr handler until the process configures logging.

    SGLang runs ``load_plugins()`` in each process before it configures logging, so the
    one INFO line saying what was found and done would otherwise be dropped (Python's
    last-resort handler prints WARNING and above only). Our handler prints only while the
    root logger has no handler; once SGLang (or anyone) configures logging, records
    propagate to its handlers as usual and ours stays silent, so nothing prints twice.
    """
    if any(isinstance(f, _UntilRootConfigured) for h in logger.handlers for f in h.filters):
        return
    if logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.addFilter(_UntilRootConfigured())
    handler.setFormatter(logging.Formatter("[%(asctime)s %(process)d] %(name)s %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)


def register() -> None:
    """SGLang entry point (``sglang.srt.plugins``): the SGLang hook, then the aiter one."""
    _make_log_visible()
    if _env.disabled():
        logger.info("sglang-amd-moe: disabled by SGLANG_AMD_MOE_DISABLE=1; nothing hooked")
        return
    try:
        from sglang_amd_moe.runtime import sglang_hook

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
        from sglang_amd_moe.runtime import aiter_hook
    except ImportError as exc:
        if not _AITER_MISSING_LOGGED:
            logger.warning("sglang-amd-moe: aiter hook unavailable (%s); aiter left untouched", exc)
            _AITER_MISSING_LOGGED = True
        return
    try:
        aiter_hook.install()
    except Exception:
        logger.exception("sglang-amd-moe: the aiter hook could not be installed; aiter left untouched")

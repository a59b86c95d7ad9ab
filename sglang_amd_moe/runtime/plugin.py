"""Plugin entry points: SGLang's ``sglang.srt.plugins`` and vLLM's ``vllm.general_plugins``.

``register()`` runs once in every SGLang process (launcher, scheduler, DP controller,
detokenizer), called by ``sglang.srt.plugins.load_plugins()``. It never takes a server down:
every failure while detecting or hooking, whatever upstream raises (only ``KeyboardInterrupt``
passes), is logged and leaves upstream untouched, so the plugins after this one still load.
It makes the package's log line visible, applies the gate once (``env.gate``) and installs
each target with it: the SGLang hook (``register`` only), then the aiter hook; a closed gate
is one line for all. Calls are serialised by a lock (made anew in a forked child), so
threads calling it at once hook once.
"""

from __future__ import annotations

import builtins
import gc
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from sglang_amd_moe.runtime import env

logger = logging.getLogger("sglang_amd_moe")

_LOCK = threading.RLock()


def _new_lock_in_child() -> None:
    global _LOCK
    _LOCK = threading.RLock()


os.register_at_fork(after_in_child=_new_lock_in_child)
_FORMAT = "[%(asctime)s %(process)d] %(name)s %(levelname)s: %(message)s"


class _WhenNobodyElsePrints(logging.Filter):
    """Passes a record only if no other handler on its way to the root would emit it."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__()
        self._handler = handler

    def filter(self, record: logging.LogRecord) -> bool:
        lg: logging.Logger | None = logging.getLogger(record.name)
        while lg is not None:
            for h in lg.handlers:
                if h is not self._handler and record.levelno >= h.level:
                    return False
            if not lg.propagate:
                break
            lg = lg.parent  # type: ignore[assignment]
        return True


def _make_log_visible() -> None:
    """Make this package's INFO line reach the process's log exactly once.

    SGLang calls ``load_plugins()`` before it configures logging: the root logger has no
    handler yet (Python's last resort prints WARNING and up only), or an import already
    called ``logging.basicConfig()`` (0.5.23's scheduler), leaving the root at WARNING. So
    this logger gets level INFO unless someone set one, and one stderr handler that prints a
    record only when no other handler on its way to the root would: once SGLang (or anyone)
    configures a handler, records reach it and ours stays silent.
    """
    if logger.level == logging.NOTSET and logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    if any(getattr(h, "_sglang_amd_moe_handler", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler()
    handler._sglang_amd_moe_handler = True  # type: ignore[attr-defined]
    handler.addFilter(_WhenNobodyElsePrints(handler))
    handler.setFormatter(logging.Formatter(_FORMAT))
    logger.addHandler(handler)


def register() -> None:
    """SGLang entry point (``sglang.srt.plugins``): the SGLang hook, then the aiter ones."""
    _run(_targets(sglang=True))


def register_vllm() -> None:
    """vLLM entry point (``vllm.general_plugins``): the aiter sort hook and the guard."""
    _run(_targets(sglang=False))


def _targets(*, sglang: bool) -> list[tuple[str, str, Callable[[], Any]]]:
    """(what, whose code, how to get the target) of each hook, in install order."""
    out = [("the aiter hook", "aiter", _aiter), ("the guard", "aiter", _guard)]
    return [("the SGLang hook", "SGLang", _sglang), *out] if sglang else out


def _sglang() -> Any:
    from sglang_amd_moe.runtime.sglang.hook import HOOK

    return HOOK


def _aiter() -> Any:
    from sglang_amd_moe.runtime.aiter.hook import HOOK

    return HOOK


def _guard() -> Any:
    from sglang_amd_moe.runtime.aiter.guard import HOOK

    return HOOK


def _run(targets: list[tuple[str, str, Callable[[], Any]]]) -> None:
    # Python's collector paused while the plugin decides: right after SGLang's imports a
    # full collection of their objects is due (seconds on a busy host), and the plugin's
    # parse of topk.py would otherwise be the allocation that runs it. It runs later, in
    # the process's own time, as it would without the plugin.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with _LOCK:
            _make_log_visible()
            allowed, why = env.gate()
            changed = False
            for what, upstream, get in targets:
                try:
                    target = get()
                    before = target.status()
                    after = target.install((allowed, why))
                    changed |= before is None or before.message != after.message
                except BaseException as exc:
                    _swallow(
                        exc,
                        f"sglang-amd-moe: {what} could not be installed; {upstream} left untouched",
                    )
            if not allowed and changed:
                logger.info("sglang-amd-moe: %s; nothing hooked", why)
    except BaseException as exc:  # the lock, logging itself: still never raise
        _swallow(exc, "sglang-amd-moe: the plugin failed; nothing hooked")
    finally:
        if collecting:
            gc.enable()


def _swallow(exc: BaseException, text: str) -> None:
    """Log ``exc`` (with its traceback) and return; re-raise only a KeyboardInterrupt."""
    if isinstance(exc, KeyboardInterrupt):
        raise exc
    group = getattr(builtins, "BaseExceptionGroup", None)  # Python 3.11+
    if group is not None and isinstance(exc, group) and exc.subgroup(KeyboardInterrupt):
        raise exc
    try:
        logger.error("%s (%s: %s)", text, type(exc).__name__, exc, exc_info=exc)
    except Exception:  # a broken logging setup must not take the server down either
        pass

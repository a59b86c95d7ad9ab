"""Plugin entry points: SGLang's ``sglang.srt.plugins`` and vLLM's ``vllm.general_plugins``.

``register()`` runs once in every SGLang process (launcher, scheduler, DP controller,
detokenizer), called by ``load_plugins()``. It never takes a server down: any failure
(only ``KeyboardInterrupt`` passes) is logged and leaves upstream untouched, so the plugins
after this one still load. It applies the gate once (``env.gate``) and installs each target
with it; a closed gate is one line for all. A lock (new in a forked child) serialises calls.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from sglang_amd_moe.runtime import collector_paused

logger = logging.getLogger("sglang_amd_moe")
_LOCK = threading.RLock()


def _new_lock_in_child() -> None:
    global _LOCK
    _LOCK = threading.RLock()


os.register_at_fork(after_in_child=_new_lock_in_child)


class _WhenNobodyElsePrints(logging.Filter):
    """Passes a record only if no other handler on its way to the root would emit it."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__()
        self._handler = handler

    def filter(self, record: logging.LogRecord) -> bool:
        lg: logging.Logger | None = logging.getLogger(record.name)
        while lg is not None:
            if any(h is not self._handler and record.levelno >= h.level for h in lg.handlers):
                return False
            lg = lg.parent if lg.propagate else None  # type: ignore[assignment]
        return True


def _make_log_visible() -> None:
    """Make this package's INFO line reach the process's log exactly once.

    SGLang calls ``load_plugins()`` before it configures logging: the root has no handler
    yet (Python's last resort prints WARNING and up only), or an import already called
    ``logging.basicConfig()`` (0.5.23's scheduler), leaving the root at WARNING. So this
    logger gets level INFO unless someone set one, and a stderr handler that prints a record
    only while no other handler on its way to the root would.
    """
    if logger.level == logging.NOTSET and logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    if any(getattr(h, "_sglang_amd_moe_handler", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler()
    handler._sglang_amd_moe_handler = True  # type: ignore[attr-defined]
    handler.addFilter(_WhenNobodyElsePrints(handler))
    handler.setFormatter(
        logging.Formatter("[%(asctime)s %(process)d] %(name)s %(levelname)s: %(message)s")
    )
    logger.addHandler(handler)


def _hook(module: str) -> Any:
    return importlib.import_module(f"sglang_amd_moe.runtime.{module}").HOOK


_sglang = functools.partial(_hook, "sglang.hook")
_aiter = functools.partial(_hook, "aiter.hook")
_guard = functools.partial(_hook, "aiter.guard")


def register() -> None:
    """SGLang entry point (``sglang.srt.plugins``): the SGLang hook, then the aiter ones."""
    _run([("the SGLang hook", "SGLang", _sglang), *_aiter_targets()])


def register_vllm() -> None:
    """vLLM entry point (``vllm.general_plugins``): the aiter sort hook and the guard."""
    _run(_aiter_targets())


def _aiter_targets() -> list[tuple[str, str, Callable[[], Any]]]:
    return [("the aiter hook", "aiter", _aiter), ("the guard", "aiter", _guard)]


def _run(targets: list[tuple[str, str, Callable[[], Any]]]) -> None:
    with collector_paused():
        try:
            # Imported here, with the collector paused: see collector_paused().
            from sglang_amd_moe.runtime import env

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
                        text = f"sglang-amd-moe: {what} could not be installed; "
                        text += f"{upstream} left untouched"
                        _swallow(exc, text)
                if not allowed and changed:
                    logger.info("sglang-amd-moe: %s; nothing hooked", why)
        except BaseException as exc:  # the lock, logging itself: still never raise
            _swallow(exc, "sglang-amd-moe: the plugin failed; nothing hooked")


def _swallow(exc: BaseException, text: str) -> None:
    """Log ``exc`` (with its traceback) and return; re-raise only a KeyboardInterrupt."""
    if isinstance(exc, KeyboardInterrupt) or (
        isinstance(exc, BaseExceptionGroup) and exc.subgroup(KeyboardInterrupt)
    ):
        raise exc
    try:
        logger.error("%s (%s: %s)", text, type(exc).__name__, exc, exc_info=exc)
    except Exception:  # a broken logging setup must not take the server down either
        pass

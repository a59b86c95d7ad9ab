"""The shape both hooks share: what each reports about itself.

Both hook modules (:mod:`sglang_amd_moe.runtime.sglang_hook` and
:mod:`sglang_amd_moe.runtime.aiter_hook`) expose the same four calls, and the plugin and
the audit use nothing else:

- ``install() -> HookStatus``: decide from the installed code and hook it if it needs
  it; idempotent, never raises;
- ``uninstall() -> None``: put every patched attribute back;
- ``status() -> HookStatus | None``: the last decision in this process (None: never
  installed);
- ``is_live() -> bool``: the wrapper is in place now.

Every wrapper a hook installs carries :data:`MARK`, set to the callable it wraps, so a
hook can tell its own wrapper from anyone else's (:func:`mark`, :func:`find_marked`).

Each process logs one line per hook and state: :func:`announce` writes a status's
message when it differs from the previous one the hook announced, at the level its
state calls for, so neither hook repeats itself nor formats its own line differently.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Attribute set on every wrapper this package installs: the wrapped original.
MARK = "__sglang_amd_moe_original__"

#: ``HookStatus.state`` values.
#: live: the wrapper is in place. pending: registered, waiting to be applied (SGLang:
#: inside ``load_plugins()`` before ``apply_hooks()``; aiter: an import hook waiting for
#: ``aiter.fused_moe``). not-needed: the installed code is right, nothing to hook.
#: off: disabled by the environment or the platform gate. refused: the plugin decided
#: not to touch upstream (a form it cannot fix exactly, a signature it does not know).
#: error: something failed while deciding or hooking; upstream left untouched.
STATES: tuple[str, ...] = ("live", "pending", "not-needed", "off", "refused", "error")


@dataclass(frozen=True)
class HookStatus:
    """What one hook decided in this process, and the one log line that says so."""

    #: ``"sglang"`` or ``"aiter"``.
    target: str
    #: One of :data:`STATES`.
    state: str
    #: The form the decision rests on (None: nothing was read).
    form: str | None
    #: The one log line's text (the audit shows it too).
    message: str
    #: Target-specific extras (patched attributes, source file, sha256, ...).
    detail: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"HookStatus.state must be one of {STATES}, got {self.state!r}")

    @property
    def hooked(self) -> bool:
        """The wrapper is in place or about to be (``live`` or ``pending``)."""
        return self.state in ("live", "pending")


#: The level each state's line is logged at. A hook may ask for another one: the aiter
#: hook logs "aiter is not installed" and its ``pending`` state at DEBUG (normal, and its
#: ``live`` line follows when aiter is imported), while the SGLang hook's ``pending``
#: (inside ``load_plugins()``, applied right after) is its process's line.
LEVELS: dict[str, int] = {
    "live": logging.INFO,
    "pending": logging.INFO,
    "not-needed": logging.INFO,
    "off": logging.INFO,
    "refused": logging.WARNING,
    "error": logging.WARNING,
}


def same(a: HookStatus | None, b: HookStatus | None) -> bool:
    """Whether two statuses say the same thing (target, state, form and message)."""
    if a is None or b is None:
        return a is b
    return (a.target, a.state, a.form, a.message) == (b.target, b.state, b.form, b.message)


def announce(
    logger: logging.Logger,
    status: HookStatus,
    previous: HookStatus | None,
    *,
    level: int | None = None,
    exc_info: bool = False,
) -> bool:
    """Log ``status.message`` unless ``previous`` said the same; return whether it logged.

    ``level``: overrides :data:`LEVELS` for this line. ``exc_info``: append the current
    exception's traceback (for ``error`` statuses raised by an exception).
    """
    if same(status, previous):
        return False
    chosen = LEVELS[status.state] if level is None else level
    logger.log(chosen, "%s", status.message, exc_info=exc_info)
    return True


def mark(wrapper: Any, original: Any) -> Any:
    """Set :data:`MARK` on ``wrapper`` (to ``original``) and return ``wrapper``.

    A wrapper that also sets ``__wrapped__`` (``functools.wraps``) must set it to the
    same ``original``: :func:`find_marked` relies on it.
    """
    setattr(wrapper, MARK, original)
    return wrapper


def find_marked(fn: Any, depth: int = 32) -> Any | None:
    """The first wrapper of this package in ``fn``'s ``__wrapped__`` chain, or None.

    Other plugins may wrap on top of ours; their wrappers are followed through
    ``__wrapped__`` (what ``functools.wraps`` and SGLang's HookRegistry set).
    """
    for _ in range(depth):
        if fn is None:
            return None
        original = getattr(fn, MARK, None)
        # functools.wraps copies __dict__, so a wrapper put on top of ours carries our
        # mark too; only ours wraps exactly what the mark names.
        if original is not None and getattr(fn, "__wrapped__", original) is original:
            return fn
        fn = getattr(fn, "__wrapped__", None)
    return None

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
hook can tell its own wrapper from anyone else's.
"""

from __future__ import annotations

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

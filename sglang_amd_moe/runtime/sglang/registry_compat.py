"""The one place that reads SGLang's ``HookRegistry`` (``sglang.srt.plugins.hook_registry``,
0.5.11 and later) beyond its documented ``register`` and ``apply_hooks``: ``_hooks`` (target
-> ``(HookType, hook, source)`` entries), ``_patched`` (targets applied: later hooks are
skipped), ``_current_plugin_source`` (set inside ``load_plugins()``) and ``is_hook_applied``
where a release has it, as read from the 0.5.11 - 0.5.23 wheels. Every accessor tolerates a
registry without them and imports SGLang only when asked to.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

Hook = Callable[..., Any]
MODULE = "sglang.srt.plugins.hook_registry"


def load() -> Any | None:
    """Import ``hook_registry`` (None for an SGLang without a plugin framework, 0.5.10)."""
    try:
        from sglang.srt.plugins import hook_registry
    except ImportError:
        return None
    return hook_registry


def _registry() -> Any:
    return getattr(sys.modules.get(MODULE), "HookRegistry", None)


def _entries(target: str) -> list:
    try:
        return getattr(_registry(), "_hooks", {}).get(target) or []
    except (AttributeError, TypeError):
        return []


def registered(target: str, hook: Hook) -> bool:
    """``hook`` is in the registry's list for ``target`` (applied or not)."""
    try:
        return any(entry[1] is hook for entry in _entries(target))
    except (IndexError, TypeError):
        return False


def patched(target: str) -> bool:
    """The registry has applied its hooks to ``target`` (later registrations are skipped)."""
    try:
        return target in getattr(_registry(), "_patched", ())
    except TypeError:
        return False


def hook_applied(target: str, hook: Hook) -> bool | None:
    """``HookRegistry.is_hook_applied`` where the release has it; else None."""
    query = getattr(_registry(), "is_hook_applied", None)
    try:
        return bool(query(target, hook)) if callable(query) else None
    except Exception:
        return None


def pending(target: str, hook: Hook) -> bool:
    """Registered for ``target`` and not applied yet (inside ``load_plugins()``)."""
    if not registered(target, hook):
        return False
    applied = hook_applied(target, hook)
    return not (patched(target) if applied is None else applied)


def inside_load_plugins() -> bool:
    """This call runs inside ``load_plugins()`` (which applies the hooks right after)."""
    current = getattr(sys.modules.get(MODULE), "_current_plugin_source", None)
    try:
        return current is not None and current.get() is not None
    except Exception:
        return False


def register_around(target: str, hook: Hook, module: Any) -> None:
    """``HookRegistry.register(target, hook, HookType.AROUND)``, once."""
    if not registered(target, hook):
        module.HookRegistry.register(target, hook, module.HookType.AROUND)


def unregister(target: str, hook: Hook) -> None:
    """Take ``hook`` out of the registry's list for ``target`` before it is applied."""
    items = _entries(target)
    with contextlib.suppress(IndexError, TypeError):
        items[:] = [e for e in items if e[1] is not hook]

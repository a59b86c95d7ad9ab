"""The one place that reads SGLang's ``HookRegistry`` (``sglang.srt.plugins.hook_registry``,
0.5.11 and later) beyond its documented ``register`` and ``apply_hooks``: ``_hooks`` (target
-> ``(HookType, hook, source)`` entries), ``_patched`` (targets applied: later hooks are
skipped), ``_current_plugin_source`` (set inside ``load_plugins()``) and ``is_hook_applied``
where a release has it, as read from the 0.5.11 - 0.5.23 wheels. Every accessor tolerates a
registry without them and imports SGLang only when asked to.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

Hook = Callable[..., Any]


def _module(module: Any | None) -> Any | None:
    return module or sys.modules.get("sglang.srt.plugins.hook_registry")


def load() -> Any | None:
    """Import ``hook_registry`` (None for an SGLang without a plugin framework, 0.5.10)."""
    try:
        from sglang.srt.plugins import hook_registry
    except ImportError:
        return None
    return hook_registry


def _entries(module: Any | None, target: str) -> list:
    try:
        return (
            getattr(getattr(_module(module), "HookRegistry", None), "_hooks", {}).get(target) or []
        )
    except (AttributeError, TypeError):
        return []


def registered(target: str, hook: Hook, module: Any | None = None) -> bool:
    """``hook`` is in the registry's list for ``target`` (applied or not)."""
    try:
        return any(entry[1] is hook for entry in _entries(module, target))
    except (IndexError, TypeError):
        return False


def patched(target: str, module: Any | None = None) -> bool:
    """The registry has applied its hooks to ``target`` (later registrations are skipped)."""
    try:
        return target in getattr(getattr(_module(module), "HookRegistry", None), "_patched", ())
    except TypeError:
        return False


def hook_applied(target: str, hook: Hook, module: Any | None = None) -> bool | None:
    """``HookRegistry.is_hook_applied`` where the release has it; else None."""
    query = getattr(getattr(_module(module), "HookRegistry", None), "is_hook_applied", None)
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


def inside_load_plugins(module: Any | None = None) -> bool:
    """This call runs inside ``load_plugins()`` (which applies the hooks right after)."""
    current = getattr(_module(module), "_current_plugin_source", None)
    try:
        return current is not None and current.get() is not None
    except Exception:
        return False


def register_around(target: str, hook: Hook, module: Any) -> None:
    """``HookRegistry.register(target, hook, HookType.AROUND)``, once."""
    if not registered(target, hook, module):
        module.HookRegistry.register(target, hook, module.HookType.AROUND)


def unregister(target: str, hook: Hook) -> None:
    """Take ``hook`` out of the registry's list for ``target`` before it is applied."""
    items = _entries(None, target)
    try:
        keep = [e for e in items if e[1] is not hook]
        if len(keep) != len(items):
            items[:] = keep
    except (IndexError, TypeError):
        pass

"""The one place that reads SGLang's ``HookRegistry`` beyond its public calls.

SGLang's plugin framework (``sglang.srt.plugins``, 0.5.11 and later) documents
``HookRegistry.register(target, hook, hook_type)`` and ``apply_hooks()``. The hook also
needs: whether its hook is registered (``HookRegistry._hooks``: target -> list of
``(HookType, hook, source)``), whether a target was patched already (``_patched``: the
registry then skips later hooks), and whether it runs inside ``load_plugins()`` (the
context variable ``hook_registry._current_plugin_source``). Read from the 0.5.11,
0.5.12.post1, 0.5.13, 0.5.13.post1, 0.5.14 and 0.5.23 wheels; newer SGLang's public
``HookRegistry.is_hook_applied`` is used where it exists. Every accessor tolerates a
registry without these fields and imports SGLang only when asked to.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

REGISTRY_MODULE = "sglang.srt.plugins.hook_registry"


def loaded() -> Any | None:
    """The ``hook_registry`` module if SGLang's plugin framework is imported (no import)."""
    return sys.modules.get(REGISTRY_MODULE)


def load() -> Any | None:
    """Import ``hook_registry`` (None for an SGLang without a plugin framework, 0.5.10)."""
    try:
        from sglang.srt.plugins import hook_registry
    except ImportError:
        return None
    return hook_registry


def _registry(module: Any | None) -> Any | None:
    return getattr(module, "HookRegistry", None) if module is not None else None


def registered(target: str, hook: Callable[..., Any], module: Any | None = None) -> bool:
    """``hook`` is in the registry's list for ``target`` (applied or not)."""
    registry = _registry(module or loaded())
    entries = getattr(registry, "_hooks", {}) if registry is not None else {}
    try:
        return any(entry[1] is hook for entry in entries.get(target, ()))
    except (AttributeError, IndexError, TypeError):
        return False


def patched(target: str, module: Any | None = None) -> bool:
    """The registry has applied its hooks to ``target`` (later registrations are skipped)."""
    registry = _registry(module or loaded())
    done = getattr(registry, "_patched", ()) if registry is not None else ()
    try:
        return target in done
    except TypeError:
        return False


def hook_applied(target: str, hook: Callable[..., Any], module: Any | None = None) -> bool | None:
    """SGLang's own answer (``HookRegistry.is_hook_applied``) where the release has it;
    None where it does not (the caller then looks at the function itself)."""
    registry = _registry(module or loaded())
    query = getattr(registry, "is_hook_applied", None) if registry is not None else None
    if not callable(query):
        return None
    try:
        return bool(query(target, hook))
    except Exception:
        return None


def pending(target: str, hook: Callable[..., Any], module: Any | None = None) -> bool:
    """Registered for ``target`` and not applied yet (inside ``load_plugins()``)."""
    module = module or loaded()
    if module is None or not registered(target, hook, module):
        return False
    applied = hook_applied(target, hook, module)
    if applied is not None:
        return not applied
    return not patched(target, module)


def inside_load_plugins(module: Any | None = None) -> bool:
    """This call runs inside ``load_plugins()`` (which applies the hooks right after)."""
    module = module or loaded()
    current = getattr(module, "_current_plugin_source", None) if module is not None else None
    try:
        return current is not None and current.get() is not None
    except Exception:
        return False


def register_around(target: str, hook: Callable[..., Any], module: Any) -> None:
    """``HookRegistry.register(target, hook, HookType.AROUND)``, once."""
    if not registered(target, hook, module):
        module.HookRegistry.register(target, hook, module.HookType.AROUND)


def apply_hooks(module: Any) -> None:
    """``HookRegistry.apply_hooks()`` (idempotent per target)."""
    module.HookRegistry.apply_hooks()


def unregister(target: str, hook: Callable[..., Any], module: Any | None = None) -> bool:
    """Take ``hook`` out of the registry's list for ``target`` before it is applied;
    True when it was there."""
    registry = _registry(module or loaded())
    entries = getattr(registry, "_hooks", None) if registry is not None else None
    try:
        items = entries.get(target) if entries is not None else None
        if not items:
            return False
        keep = [e for e in items if e[1] is not hook]
        if len(keep) == len(items):
            return False
        items[:] = keep
        return True
    except (AttributeError, IndexError, TypeError):
        return False

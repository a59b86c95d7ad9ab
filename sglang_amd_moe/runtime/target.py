"""The skeleton every hook of this package is built on (after OpenTelemetry's
``BaseInstrumentor``). A :class:`Target` names itself and writes ``_install(gate)`` (read the
installed code, decide, apply), ``is_live()`` and ``_undo()``; the base serialises calls under
one lock, keeps the last status, logs one line per change of state, turns any exception but
``KeyboardInterrupt`` into an ``error`` status and makes ``install`` idempotent. Below it, the
helpers the hooks share: wrapper marks, ``from m import f`` copies rebound, the import watch,
parameters read without binding.
"""

from __future__ import annotations

import ast
import importlib.abc
import inspect
import logging
import os
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_amd_moe import __version__ as _VERSION
from sglang_amd_moe.runtime import collector_paused, env

logger = logging.getLogger("sglang_amd_moe")


def logged(message: str) -> str:
    """A decision's log line: its message and this package's version, which a user quotes
    in a report (the message itself, as the audit shows it, carries no version)."""
    return f"{message} (sglang-amd-moe {_VERSION})"


#: Attribute set on every wrapper this package installs: the wrapped original.
MARK = "__sglang_amd_moe_original__"

#: live: in place. pending: applied later (by ``load_plugins()``, or when the hooked module
#: is imported). not-needed: the installed code is right. off: disabled or gated off.
#: refused: upstream left alone on purpose. error: a failure.
STATES: tuple[str, ...] = ("live", "pending", "not-needed", "off", "refused", "error")

#: ``(allowed, why)``: the plugin's gate (``env.gate()``).
Gate = tuple[bool, str]


@dataclass(frozen=True)
class HookStatus:
    """What one hook decided in this process, and the one log line that says so."""

    target: str  # "sglang", "aiter" or "guard"
    state: str  # one of STATES
    form: str | None  # the form the decision rests on (None: nothing was read)
    message: str  # the log line (the audit shows it too)
    detail: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"HookStatus.state must be one of {STATES}, got {self.state!r}")

    @property
    def hooked(self) -> bool:
        return self.state in ("live", "pending")


@dataclass(frozen=True)
class Refusal:
    """Why nothing is hooked: ``state`` is ``not-needed``, ``refused`` or ``error``."""

    state: str
    reason: str


class Target:
    """One hooked upstream function (see the module docstring for the contract)."""

    name = ""  # HookStatus.target
    what = ""  # the hooked module or function, for messages
    upstream = ""  # whose code it is, for messages ("SGLang", "aiter")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._status: HookStatus | None = None
        self._failures: set[str] = set()
        _TARGETS.add(self)

    def _install(self, gate: Gate) -> HookStatus:
        raise NotImplementedError

    def _undo(self) -> None:
        raise NotImplementedError

    def is_live(self) -> bool:
        """The wrapper is in place now (possibly under other plugins' wrappers)."""
        raise NotImplementedError

    def _still_hooked(self) -> bool:  # a live or pending status still holds
        return self.is_live()

    def install(self, gate: Gate | None = None) -> HookStatus:
        """Decide from the installed code and hook it if it needs it. Never raises;
        idempotent while the hook is live or pending. A closed gate records ``off`` without
        logging: the plugin logs that line once for every target."""
        if gate is None:
            gate = env.gate()
        with self.lock:
            current = self.status()
            if current is not None and current.hooked and self._still_hooked():
                return current
            if not gate[0]:
                self._status = self.make_status("off", None, f"{gate[1]}; nothing hooked")
                return self._status
            return self.guarded(self._install, gate, f"hooking {self.what}")

    def guarded(self, step: Callable[[Any], HookStatus], arg: Any, doing: str) -> HookStatus:
        """``step(arg)`` under the lock; any exception but ``KeyboardInterrupt`` becomes an
        ``error`` status, logged with its traceback and never raised."""
        with self.lock:
            try:
                return step(arg)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - never take a server down
                text = f"{doing} failed ({type(exc).__name__}: {exc}); "
                text += f"{self.upstream} left untouched"
                return self.record(self.make_status("error", None, text), exc_info=True)

    def status(self) -> HookStatus | None:
        """The last decision in this process (None: never installed, or uninstalled)."""
        with self.lock:
            return self._status

    def uninstall(self) -> None:
        """Put every patched attribute back and forget the decision."""
        with self.lock:
            self._undo()
            self._status = None
            self._failures.clear()

    def make_status(self, state: str, form: str | None, text: str, **detail: Any) -> HookStatus:
        prefix = "" if text.startswith("sglang-amd-moe:") else "sglang-amd-moe: "
        return HookStatus(self.name, state, form, prefix + text, detail)

    def record(
        self, status: HookStatus, *, level: int | None = None, exc_info: bool = False
    ) -> HookStatus:
        """Keep ``status``; log its line (at ``level``, else the state's) when it says
        something new."""
        with self.lock:
            previous, self._status = self._status, status
        said = [(s.target, s.state, s.form, s.message) for s in (status, previous) if s]
        if len(said) == 1 or said[0] != said[1]:
            if level is None:
                level = logging.WARNING if status.state in ("refused", "error") else logging.INFO
            logger.log(level, "%s", logged(status.message), exc_info=exc_info)
        return status

    def once(
        self, key: str, text: str, *, level: int = logging.WARNING, exc_info: bool = False
    ) -> None:
        """Log ``text`` the first time ``key`` comes up in a hooked call since install, then
        only at DEBUG: a call that fails, fails on every batch."""
        first = key not in self._failures
        self._failures.add(key)
        logger.log(level if first else logging.DEBUG, "sglang-amd-moe: %s", text, exc_info=exc_info)

    def log_call_failure(self, what: str, text: str) -> None:
        """A failure inside a hooked call: an ERROR with its traceback, once per ``what``."""
        self.once(what, text, level=logging.ERROR, exc_info=True)


_TARGETS: weakref.WeakSet[Target] = weakref.WeakSet()


def _new_locks_in_child() -> None:
    """A forked child has only the forking thread: a lock another thread held stays held."""
    for target in list(_TARGETS):
        target.lock = threading.RLock()


os.register_at_fork(after_in_child=_new_locks_in_child)


# --- wrappers --------------------------------------------------------------------------


def mark(wrapper: Any, original: Any) -> Any:
    setattr(wrapper, MARK, original)
    return wrapper


def chain(fn: Any, depth: int = 32) -> Iterator[Any]:
    """``fn`` and what it wraps, through ``__wrapped__`` (functools.wraps, HookRegistry)."""
    for _ in range(depth):
        if fn is None:
            return
        yield fn
        fn = getattr(fn, "__wrapped__", None)


def find_marked(fn: Any) -> Any | None:
    """The first wrapper of this package in ``fn``'s chain, or None."""
    for f in chain(fn):
        original = getattr(f, MARK, None)
        # functools.wraps copies __dict__, so a wrapper put on top of ours carries our
        # mark too; only ours wraps exactly what the mark names.
        if original is not None and getattr(f, "__wrapped__", original) is original:
            return f
    return None


def closes_over(fn: Any, value: Any) -> bool:
    """``fn`` is a closure over ``value`` (SGLang's registry wraps a hook that way)."""
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            if cell.cell_contents is value:
                return True
        except ValueError:  # an empty cell
            continue
    return False


def holds(fn: Any, obj: Any) -> bool:
    """``obj`` is in ``fn``'s chain, itself or as the hook a wrapper closes over."""
    return any(f is obj or closes_over(f, obj) for f in chain(fn))


def rebind_copies(original: Any, replacement: Any, *, name: str | None = None, skip=()) -> list:
    """Point every module attribute that is ``original`` (of ``name`` only, if given) at
    ``replacement``, except ``(id(module), attribute)`` pairs in ``skip``; return them."""
    rebound: list[tuple[types.ModuleType, str]] = []
    for mod in list(sys.modules.values()):
        namespace = getattr(mod, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        try:
            names = (
                [name] if name is not None else [k for k, v in namespace.items() if v is original]
            )
            for attr in names:
                if (id(mod), attr) not in skip and namespace.get(attr) is original:
                    setattr(mod, attr, replacement)
                    rebound.append((mod, attr))
        except Exception:  # an exotic module object: leave it alone
            continue
    return rebound


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def params_of(fn: Any) -> tuple[str, ...] | None:
    """``fn``'s parameter names (None: not callable, or no signature)."""
    try:
        return tuple(inspect.signature(fn).parameters) if callable(fn) else None
    except (TypeError, ValueError):
        return None


class Args:
    """Reads and replaces arguments of calls to ``fn`` by name, without binding them:
    binding costs microseconds of host time per call."""

    __slots__ = ("positions", "defaults")

    def __init__(self, fn: Any) -> None:
        params = inspect.signature(fn).parameters.values()
        self.positions = {p.name: i for i, p in enumerate(params) if p.kind in _POSITIONAL}
        self.defaults = {p.name: p.default for p in params if p.default is not p.empty}

    def get(self, name: str, args: tuple, kwargs: dict) -> Any:
        """The argument (else the default, else None)."""
        if name in kwargs:
            return kwargs[name]
        i = self.positions.get(name)
        return args[i] if i is not None and i < len(args) else self.defaults.get(name)

    def put(self, name: str, value: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """New ``(args, kwargs)`` with ``name`` set where the call passed it (or by keyword)."""
        i = self.positions.get(name)
        if name not in kwargs and i is not None and i < len(args):
            return (*args[:i], value, *args[i + 1 :]), kwargs
        return args, {**kwargs, name: value}


def call_name(call: ast.Call) -> str:
    """The called name: ``f`` for ``f(...)`` and ``m.f(...)``, "" otherwise."""
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


# --- the import watch ------------------------------------------------------------------

_WATCHED: dict[str, list[Callable[[types.ModuleType], None]]] = {}
_busy = threading.local()


def when_imported(module: str, callback: Callable[[types.ModuleType], None]) -> None:
    """Call ``callback(module)`` right after ``module`` executes, before its importer
    sees it. One finder on ``sys.meta_path`` serves every module and callback."""
    callbacks = _WATCHED.setdefault(module, [])
    if callback not in callbacks:
        callbacks.append(callback)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def forget(module: str, callback: Callable[[types.ModuleType], None]) -> None:
    """Undo :func:`when_imported`; the finder leaves when nothing is watched."""
    callbacks = _WATCHED.get(module, [])
    if callback in callbacks:
        callbacks.remove(callback)
    if not callbacks:
        _WATCHED.pop(module, None)
    if not _WATCHED:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


def watching(module: str) -> bool:
    return bool(_WATCHED.get(module)) and any(isinstance(f, _Finder) for f in sys.meta_path)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds a watched module through the other finders and wraps its loader."""

    _sglang_amd_moe_finder = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _WATCHED or getattr(_busy, "active", False):
            return None
        _busy.active = True  # a finder below may look the module up again: not through us
        try:
            others = [f for f in sys.meta_path if not isinstance(f, _Finder)]
            finds = (f.find_spec(fullname, path, target) for f in others if hasattr(f, "find_spec"))
            spec = next((found for found in finds if found is not None), None)
            if spec is None or not hasattr(spec.loader, "exec_module"):
                return None
            spec.loader = _Loader(spec.loader)
            return spec
        except Exception:
            logger.exception("sglang-amd-moe: import hook for %s failed; left untouched", fullname)
            return None
        finally:
            _busy.active = False


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then the callbacks on the freshly executed module."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)  # upstream's own errors propagate unchanged
        with collector_paused():
            for callback in list(_WATCHED.get(module.__name__, ())):
                try:
                    callback(module)
                except KeyboardInterrupt:
                    raise
                except BaseException:  # noqa: BLE001 - ours must not fail upstream's import
                    logger.exception("sglang-amd-moe: patching %s failed", module.__name__)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)

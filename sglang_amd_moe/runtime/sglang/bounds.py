"""Limits for running upstream code inside a server process while the plugin decides: that
code must not hang the process, start CUDA before a scheduler chose its GPU, or leave
anything changed. :class:`Bounded` gives one run

- a :class:`Deadline` (CPU time of this thread, and wall time: a loaded machine stretches
  the one, not the other), checked by a trace function on every call and line of Python in
  this thread and, in the main thread, by an interval timer (``SIGALRM``, when unused) that
  also interrupts blocking calls; both raise :class:`ProbeAbort`, which ``except Exception``
  does not catch;
- ``torch.cuda`` out of reach: the trace function stops a call of any of its functions;
- no garbage collection inside the run (a full one would spend the CPU limit on its own);
- torch's global settings, and the namespace and containers of every module whose code runs
  (torch, Triton, the standard library and this package aside), put back after (named in
  ``restored`` and ``written``); an ``lru_cache`` that held entries cannot be (``kept``);
- threads it started and left running named in ``threads`` (not stopped).

Not bounded: a C call that blocks without returning to Python outside the main thread (its
time is reported); code that catches ``BaseException`` and loops on stops the trace function,
not the timer; containers are compared one level deep.
"""

from __future__ import annotations

import collections
import copy
import functools
import gc
import operator
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: What one decision may spend running upstream code (all its probes together).
CPU_SECONDS, WALL_SECONDS = 0.25, 1.0
_CONTAINERS = (dict, list, set, bytearray, collections.deque)
_UNWATCHED = frozenset({"torch", "triton", "sglang_amd_moe", "numpy", "__main__"})


@dataclass(frozen=True)
class Deadline:
    """When running stops: ``cpu`` on ``time.thread_time()``, ``wall`` on
    ``time.monotonic()`` (of the thread that makes it and runs the probes)."""

    cpu: float
    wall: float

    @classmethod
    def start(cls, cpu: float = CPU_SECONDS, wall: float = WALL_SECONDS) -> Deadline:
        return cls(time.thread_time() + cpu, time.monotonic() + wall)

    def passed(self) -> bool:
        return time.monotonic() > self.wall or time.thread_time() > self.cpu


class ProbeAbort(BaseException):
    """Raised into probed code to stop it (a ``BaseException``: ``except Exception`` in
    upstream's code lets it through)."""


#: torch's global settings a run may change: name -> (getter, setter) under ``torch``.
_TORCH_STATE = {
    "default dtype": ("get_default_dtype", "set_default_dtype"),
    "default device": ("get_default_device", "set_default_device"),
    "grad mode": ("is_grad_enabled", "set_grad_enabled"),
    "thread count": ("get_num_threads", "set_num_threads"),
    "RNG state": ("random.get_rng_state", "random.set_rng_state"),
    "deterministic algorithms": (
        "are_deterministic_algorithms_enabled",
        "use_deterministic_algorithms",
    ),
}


def _torch_state(torch: Any) -> dict[str, Any]:
    out = {}
    for key, (getter, _) in _TORCH_STATE.items():
        try:
            out[key] = operator.attrgetter(getter)(torch)()
        except AttributeError:  # an older torch (get_default_device is new in 2.3)
            continue
    return out


def _same(a: Any, b: Any) -> bool:
    """Identity, element by element (never ``==`` on values: a tensor's is no answer)."""
    if isinstance(a, dict):
        return len(a) == len(b) and all(k in b and b[k] is v for k, v in a.items())
    if isinstance(a, set):
        return a == b
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class Bounded:
    """One bounded run. ``modules``: watched from the start (others from their first call)."""

    def __init__(self, deadline: Deadline, modules: Iterable[types.ModuleType] = ()) -> None:
        import torch

        self.torch, self.deadline = torch, deadline
        self.why, self.reached_cuda = "", False  # why the run was stopped ("": it was not)
        self.restored: list[str] = []  # torch settings put back
        self.written: list[str] = []  # module state put back
        self.kept: list[str] = []  # module state that cannot be put back
        self.threads: list[str] = []
        self._cuda = os.path.dirname(torch.cuda.__file__) + os.sep
        self._saved: dict[str, tuple[types.ModuleType, dict, dict]] = {}
        self._active, self._timer = False, False
        for module in modules:
            self._watch(module)

    def _watch(self, module: types.ModuleType) -> None:
        name = getattr(module, "__name__", "")
        top = name.partition(".")[0]
        if name in self._saved or top in _UNWATCHED or top in sys.stdlib_module_names:
            return
        try:
            namespace, inner = dict(vars(module)), {}
            for key, value in namespace.items():
                if isinstance(value, _CONTAINERS) and not key.startswith("__"):
                    inner[key] = copy.copy(value)
                elif isinstance(value, functools._lru_cache_wrapper):
                    inner[key] = value.cache_info().currsize
        except Exception:  # an exotic module: not watched (a failure must not reach upstream)
            return
        self._saved[name] = (module, namespace, inner)

    def _compare(self) -> None:
        for name, (module, namespace, inner) in self._saved.items():
            now = vars(module)
            for key in [k for k in now if k not in namespace]:
                if not isinstance(now[key], types.ModuleType):  # a submodule imported: fine
                    del now[key]
                    self.written.append(f"{name}.{key} (bound; removed)")
            for key, value in namespace.items():
                if key not in now or now[key] is not value:
                    now[key] = value
                    self.written.append(f"{name}.{key} (rebound; put back)")
            for key, saved in inner.items():
                value = namespace[key]
                if not isinstance(saved, int):
                    if not _same(saved, value):
                        _put_back(value, saved)
                        self.written.append(f"{name}.{key} (written; put back)")
                elif value.cache_info().currsize != saved:
                    if saved:  # an lru_cache cannot be put back to what it held
                        self.kept.append(f"{name}.{key} (an lru_cache; written)")
                    else:
                        value.cache_clear()
                        self.written.append(f"{name}.{key} (an lru_cache; cleared)")

    def _abort(self, why: str) -> None:
        self.why = self.why or why
        raise ProbeAbort(self.why)

    def _trace(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            if frame.f_code.co_filename.startswith(self._cuda):
                self.reached_cuda = True
                self._abort(f"the code run reaches torch.cuda ({frame.f_code.co_name})")
            name = frame.f_globals.get("__name__")
            module = sys.modules.get(name) if isinstance(name, str) else None
            if module is not None and name not in self._saved:
                if getattr(module, "__dict__", None) is frame.f_globals:
                    self._watch(module)
        if self.deadline.passed():
            self._abort("the time limit was hit")
        return self._trace

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self._active:
            self._abort("the time limit was hit")

    def __enter__(self) -> Bounded:
        self._threads = set(threading.enumerate())
        self._state = _torch_state(self.torch)
        self._previous_trace = sys.gettrace()
        # A full collection of an SGLang process's heap takes 0.1-0.6 s of CPU: the limit.
        self._gc, self._active = gc.isenabled(), True
        gc.disable()
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        ):
            signal.signal(signal.SIGALRM, self._on_alarm)
            left = max(self.deadline.wall - time.monotonic(), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, 0.05)  # again every 50 ms after
            self._timer = True
        sys.settrace(self._trace)
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        sys.settrace(self._previous_trace)
        self._active = False
        if self._gc:
            gc.enable()
        if self._timer:
            signal.setitimer(signal.ITIMER_REAL, 0, 0)
            _let_pending_signals_run()
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
        torch, now = self.torch, _torch_state(self.torch)
        for key, value in self._state.items():
            same = torch.equal(now[key], value) if isinstance(value, torch.Tensor) else None
            if now[key] is not value and not (now[key] == value if same is None else same):
                operator.attrgetter(_TORCH_STATE[key][1])(torch)(value)
                self.restored.append(key)
        self._compare()
        self.threads = [
            t.name for t in threading.enumerate() if t not in self._threads and t.is_alive()
        ]
        return kind is not None and issubclass(kind, ProbeAbort)


def _put_back(value: Any, saved: Any) -> None:
    if isinstance(value, list | bytearray):
        value[:] = saved
    else:
        value.clear()
        (value.extend if isinstance(value, collections.deque) else value.update)(saved)


def _let_pending_signals_run() -> None:
    """A Python function call: a SIGALRM already delivered runs its (now inert) handler
    here, not after the default disposition is back."""

"""Counters of what the guard and the mask change, kept on the device, and the line that
reports them.

The guard at aiter's MoE entry and the hook's mask add to a small int64 buffer per
target and device inside their own launch (atomic adds: no host synchronization, and a
captured CUDA/HIP graph adds on every replay). The slots:

``calls``
    launches (graph replays included);
``out_of_range``
    entries whose id was outside ``[0, E)`` and that the guard turned into expert 0,
    weight 0, in rows not past a count (without a count: every row);
``past_count``
    entries of rows at or past the count that were changed (their id was not 0 or their
    weight not 0);
``real_out_of_range``
    of ``out_of_range``, those in rows a count marks as real: the router itself handed
    out a bad id, which is an upstream bug rather than padding (logged once as a WARNING).

The mask has no expert count, so its ``out_of_range`` stays 0.

The process logs one line per target (``sglang-amd-moe stats: target=guard calls=...``)
while its counts grow: the first about 5 s after counting starts, then after gaps that
double (10, 20, 40 s) up to one a minute, and once at exit. The early lines are there
because a short run may never write the exit line (SGLang's launcher kills its scheduler
processes at shutdown, so their exit handlers do not run). Reading never blocks the
stream that launches the kernels: the counters are copied on a side stream into pinned
memory, and the line is written by a later call once that copy's event has completed
(eager calls only; a call being captured into a graph starts nothing). At exit the copy
is waited for. ``SGLANG_AMD_MOE_STATS=0`` turns the counters off (the kernels then
launch without them).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import Any

from sglang_amd_moe.runtime import env

logger = logging.getLogger("sglang_amd_moe")

TARGETS = ("guard", "mask")
SLOTS = ("calls", "out_of_range", "past_count", "real_out_of_range")
#: Seconds between two lines of one process while its counts grow, at most.
INTERVAL_S = 60.0
#: Seconds from the first count to the first line; each later gap is twice the one before,
#: up to INTERVAL_S.
FIRST_S = 5.0
_SIZE = 8  # elements per buffer: the four slots, and room (64 bytes: one aligned block)

_LOCK = threading.Lock()
_BUFFERS: dict[tuple[str, Any], Any] = {}  # (target, torch.device) -> int64 tensor
_ENABLED: list[bool] = []  # cached SGLANG_AMD_MOE_STATS decision
_STATE: dict[str, Any] = {
    "next_due": 0.0,
    "gap": FIRST_S,  # seconds from the copy started last to the next one
    "pending": None,  # (event or None, [(target, device, pinned copy)]) of a copy in flight
    "logged": {},  # target -> counts of its last line
    "warned": False,
    "atexit": False,
}


def enabled() -> bool:
    """Counters on (``SGLANG_AMD_MOE_STATS`` is not 0/false/no/off), decided once."""
    if not _ENABLED:
        _ENABLED.append(env.stats_on())
    return _ENABLED[0]


def buffer(target: str, device: Any) -> Any:
    """The counters of ``target`` on ``device`` (an int64 tensor the kernels add to), made
    on first use; None when counters are off, or when the first use is being captured into
    a graph (a buffer made then would belong to the graph's memory pool)."""
    buf = _BUFFERS.get((target, device))
    if buf is not None or not enabled():
        return buf
    import torch

    if torch.compiler.is_compiling():  # a buffer made while tracing would be the trace's
        return None
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    with _LOCK:
        buf = _BUFFERS.get((target, device))
        if buf is None:
            buf = torch.zeros(_SIZE, dtype=torch.int64, device=device)
            if device.type == "cuda":
                # Made now, beside the buffer: the reader then allocates nothing.
                _PINNED[(target, device)] = torch.empty(_SIZE, dtype=torch.int64, pin_memory=True)
                if device not in _SIDE:
                    _SIDE[device] = torch.cuda.Stream(device=device)
            if not _BUFFERS:  # the first line a few seconds after counting starts
                _STATE["gap"] = min(FIRST_S, INTERVAL_S)
                _STATE["next_due"] = time.monotonic() + _STATE["gap"]
            _BUFFERS[(target, device)] = buf
            if not _STATE["atexit"]:
                _STATE["atexit"] = True
                _bind_compiling()
                atexit.register(log_at_exit)
    return buf


def tick() -> None:
    """After an eager call: write the line of a finished copy, or start a copy when its
    gap since the last one has passed. Never waits for the device."""
    if not _BUFFERS or (_COMPILING[0] is not None and _COMPILING[0]()):
        return  # nothing counted yet, or traced by torch.compile: nothing to read
    pending = _STATE["pending"]
    if pending is None and time.monotonic() < _STATE["next_due"]:
        return
    try:
        _tick(pending)
    except Exception:  # counters must never fail a call
        logger.debug("sglang-amd-moe stats: reading the counters failed", exc_info=True)
        _STATE["pending"] = None


def _tick(pending: Any) -> None:
    import torch

    # Under graph capture no event is queried and no copy is queued (both are refused
    # while a stream captures): the next eager call does it.
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return
    if pending is not None:
        event, copies = pending
        if event is not None and not event.query():
            return
        _STATE["pending"] = None
        _emit(_sum(copies), final=False)
        return
    _STATE["gap"] = min(2 * _STATE["gap"], INTERVAL_S)
    _STATE["next_due"] = time.monotonic() + _STATE["gap"]
    _STATE["pending"] = _start_copy()


_COMPILING: list[Any] = [None]  # torch.compiler.is_compiling, once torch is imported here


def _bind_compiling() -> None:
    import torch

    _COMPILING[0] = torch.compiler.is_compiling


_SIDE: dict[Any, Any] = {}  # device -> side stream
_PINNED: dict[tuple[str, Any], Any] = {}  # (target, device) -> pinned host copy


def _start_copy() -> tuple[Any, list]:
    """Copy every buffer to the host: CPU buffers at once, device buffers on a side stream
    (which waits for nothing) into pinned memory; returns the event to poll (or None)."""
    import torch

    copies, event = [], None
    for (target, device), buf in list(_BUFFERS.items()):
        if device.type != "cuda":
            copies.append((target, device, buf.clone()))
            continue
        side = _SIDE.get(device)
        if side is None:
            side = _SIDE[device] = torch.cuda.Stream(device=device)
        host = _PINNED.get((target, device))
        if host is None:
            host = _PINNED[(target, device)] = torch.empty(
                _SIZE, dtype=torch.int64, pin_memory=True
            )
        with torch.cuda.stream(side):
            host.copy_(buf, non_blocking=True)
            event = torch.cuda.Event()
            event.record(side)
        copies.append((target, device, host))
    # One event per device would be tidier; one process serves one device in practice,
    # and an event recorded last on each side stream completes after its copies.
    if len({d for _, d, _ in copies if d.type == "cuda"}) > 1:
        events = []
        for side in _SIDE.values():
            e = torch.cuda.Event()
            e.record(side)
            events.append(e)
        event = _AllEvents(events)
    return event, copies


class _AllEvents:
    def __init__(self, events: list) -> None:
        self.events = events

    def query(self) -> bool:
        return all(e.query() for e in self.events)

    def synchronize(self) -> None:
        for e in self.events:
            e.synchronize()


def _sum(copies: list) -> dict[str, dict[str, int]]:
    """Counts per target, summed over devices."""
    out: dict[str, dict[str, int]] = {}
    for target, _device, host in copies:
        values = [int(v) for v in host[: len(SLOTS)].tolist()]
        acc = out.setdefault(target, dict.fromkeys(SLOTS, 0))
        for name, v in zip(SLOTS, values, strict=True):
            acc[name] += v
    return out


def counts(wait: bool = True) -> dict[str, dict[str, int]]:
    """This process's counts per target (``{}`` when nothing was counted), read on a side
    stream; ``wait``: wait for that copy (not for the streams that launch the kernels)."""
    if not _BUFFERS:
        return {}
    event, copies = _start_copy()
    if event is not None:
        if not wait and not event.query():
            return {}
        event.synchronize()
    return _sum(copies)


def line(target: str, values: dict[str, int]) -> str:
    """The summary line of one target."""
    from sglang_amd_moe import __version__

    fields = " ".join(f"{k}={values.get(k, 0)}" for k in SLOTS)
    return f"sglang-amd-moe stats: target={target} {fields} version={__version__}"


def _emit(now: dict[str, dict[str, int]], final: bool) -> None:
    logged = _STATE["logged"]
    for target in TARGETS:
        values = now.get(target)
        if not values or not values["calls"]:
            continue
        if not final and logged.get(target) == values:
            continue  # nothing grew: no line
        logged[target] = values
        logger.info("%s%s", line(target, values), " (at exit)" if final else "")
        if values["real_out_of_range"] and not _STATE["warned"]:
            _STATE["warned"] = True
            logger.warning(
                "sglang-amd-moe stats: %d expert ids out of range in rows the count marks as "
                "real (target %s): the router handed the MoE bad ids for real tokens, which is "
                "an upstream bug, not padding; the guard sent them to expert 0 with weight 0",
                values["real_out_of_range"],
                target,
            )


def log_at_exit() -> None:
    """The final line of every target that counted a call (registered at first use)."""
    try:
        _emit(counts(wait=True), final=True)
    except Exception:
        logger.debug("sglang-amd-moe stats: reading the counters at exit failed", exc_info=True)


def count_plain(target: str, delta: Any) -> None:
    """Add what a plain-torch fallback changed (an int64 ``[4]`` tensor on its device,
    computed there: no host synchronization) to ``target``'s counters."""
    buf = buffer(target, delta.device)
    if buf is not None:
        buf[: len(SLOTS)] += delta


def reset() -> None:
    """Forget every buffer and line (tests)."""
    with _LOCK:
        _BUFFERS.clear()
        _PINNED.clear()
        _ENABLED.clear()
        _STATE.update(next_due=0.0, gap=FIRST_S, pending=None, logged={}, warned=False)


def audit_view() -> dict[str, Any]:
    """What ``audit --load`` reports of this process's counters (read on a side stream)."""
    return {"enabled": enabled(), "counts": counts(wait=True) if enabled() else {}}


def audit_lines() -> list[str]:
    """The table lines of :func:`audit_view`."""
    if not enabled():
        return ["counters: off (SGLANG_AMD_MOE_STATS=0)"]
    now = counts(wait=True)
    if not now:
        return [
            "counters (this process): no guard or mask call ran here; a server logs "
            "`sglang-amd-moe stats:` lines (docs/reference.md: the counters)"
        ]
    return [f"counters (this process): {line(t, v)}" for t, v in sorted(now.items())]

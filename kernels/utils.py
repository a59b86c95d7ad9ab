"""Device helpers shared by every kernel of this package: one place, no kernel of its own.

- :func:`triton_backend`: how kernels run on a device (compiled Triton, Triton's
  interpreter, or the plain-torch reference on a CPU without the interpreter).
- :func:`device_guard`: make a tensor's GPU current for a launch (Triton launches on
  the current device), and nothing when it already is.
- :class:`KernelLauncher` / :func:`launch`: the one path through which every kernel of
  this package is launched. :func:`capture_launches` records the launches instead of
  running them, so tools can see exactly what the package's own launch planning asks
  for (e.g. with tensors on the ``meta`` device, which never run) and compile it for
  other targets.
- :class:`DirectProgram` / :class:`RowsProgram` / :class:`PairProgram`: the lean host
  path of a call signature seen before (see "direct calls" below); a
  :class:`RowsProgram` serves every row count of a signature, a :class:`PairProgram`
  (the routing guard's) also premakes its two outputs.
- :func:`rows_launch_config`: the grid and tile of the mask's and the guard's launch.
- :func:`scratch`: a reusable device buffer for a kernel's intermediate values.
- :func:`max_sorted_size`: the sort's worst-case output length, as aiter sizes it.
- :func:`real_rows`: a host-side row count, clamped as the kernels clamp it on the device.

Launch cost. ``kernel[grid](*args, **meta)`` (Triton's own launch path) binds the
arguments, computes their specialization key, looks the compiled kernel up and
builds launch metadata on every call: tens of microseconds of host time per launch on a
slow host CPU, more than these kernels run on the GPU. A :class:`KernelLauncher` takes
that path once per specialization, keeps the compiled kernel it returns, and later
calls the compiled kernel's launcher directly with the current stream (Triton 3.3 and
later; the same call Triton itself makes at the end of its path). Set
``SGLANG_AMD_MOE_PLAIN_LAUNCH=1`` to always take Triton's own path.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import itertools
import operator
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _interpreter_probe_kernel():
    pass


# Triton decides interpretation once, when a kernel is decorated.
_INTERPRETING = isinstance(_interpreter_probe_kernel, InterpretedFunction)


def triton_backend(device: torch.device) -> str:
    """How the kernels of this package run on ``device``.

    ``"triton"`` on a GPU, ``"triton-interpreter"`` when Triton was imported with
    ``TRITON_INTERPRET=1`` (any device), ``"torch-reference"`` on the CPU otherwise.
    Triton decides interpretation once, when a kernel is decorated, so setting the
    variable after ``import triton`` has no effect.
    """
    if _INTERPRETING:
        return "triton-interpreter"
    if device.type == "cpu":
        return "torch-reference"
    return "triton"


def device_guard(device: torch.device) -> contextlib.AbstractContextManager:
    """Make ``device`` current for a Triton launch (Triton launches on the current GPU).

    A no-op when ``device`` is not a GPU or is already the current one: switching the
    device costs host time on every call, and in a server it is nearly always current.
    """
    if device.type == "cuda" and device.index is not None:
        if device.index != _current_device():
            return torch.cuda.device(device)
    return _NO_GUARD


_NO_GUARD = contextlib.nullcontext()


@dataclass(frozen=True)
class Launch:
    """One kernel launch as the package's launch code asked for it."""

    kernel: Any  # the @triton.jit function
    grid: tuple[int, ...]
    args: tuple  # runtime arguments, in the kernel's parameter order
    meta: dict[str, Any] = field(default_factory=dict)  # constexprs and num_warps


_CAPTURED: contextvars.ContextVar[list[Launch] | None] = contextvars.ContextVar(
    "sglang_amd_moe_captured_launches", default=None
)


@contextlib.contextmanager
def capture_launches() -> Iterator[list[Launch]]:
    """Record every launch made inside the block (in order) instead of running it."""
    captured: list[Launch] = []
    token = _CAPTURED.set(captured)
    try:
        yield captured
    finally:
        _CAPTURED.reset(token)


# ----------------------------------------------------------------------------- launch
FAST_LAUNCH = os.environ.get("SGLANG_AMD_MOE_PLAIN_LAUNCH", "") not in ("1", "true", "yes")

_IS_HIP = torch.version.hip is not None
# Attributes Triton may specialize a runtime argument on that the fast path's key
# determines: 16-byte divisibility (pointers and ints), and on AMD a pointer whose
# buffer spans at most 2 GiB (32-bit buffer offsets). A compiled kernel with any other
# attribute is launched through Triton's own path only.
_KNOWN_ATTRS = (["tt.divisibility", 16], ["tt.pointer_range", 32])
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_TWO_GIB = 2**31 - 1

try:  # Triton >= 3.4
    from triton import knobs as _knobs

    def _launch_hooks_active() -> bool:
        hook = _knobs.runtime.launch_enter_hook
        return hook is not None and bool(getattr(hook, "calls", True))

except ImportError:  # Triton 3.3: the hooks are class attributes of CompiledKernel
    from triton.compiler import CompiledKernel as _CompiledKernel

    def _launch_hooks_active() -> bool:
        return _CompiledKernel.launch_enter_hook is not None


def _current_device() -> int:
    return torch._C._cuda_getDevice()


def _current_raw_stream(index: int) -> int:
    return torch._C._cuda_getCurrentRawStream(index)


def _arg_key(args: tuple) -> tuple:
    """What Triton may specialize each runtime argument on, as a hashable key.

    A superset of Triton's own rule (3.3 to 3.8): for an int, its type by range, whether
    it is 1 (then a constant) and whether it divides by 16; for a tensor, its dtype,
    whether its address divides by 16 and, on AMD, whether its buffer spans at most
    2 GiB. Two argument lists with one key compile to one kernel.
    """
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            ptr = a.data_ptr()
            if _IS_HIP:
                key.append((a.dtype, ptr & 15, a.untyped_storage().nbytes() <= _TWO_GIB))
            else:
                key.append((a.dtype, ptr & 15))
        elif isinstance(a, bool) or a is None:
            key.append(a)
        elif isinstance(a, int):
            if _INT32_MIN <= a <= _INT32_MAX:
                key.append((a == 1, a & 15 == 0))
            else:
                key.append((a == 1, a & 15 == 0, a > 0, a >= 2**63))
        else:
            key.append(type(a))
    return tuple(key)


def _generic_key(*args: Any) -> tuple:
    return _arg_key(args)


def _arg_kinds(args: tuple) -> str | None:
    """``"t"`` per tensor and ``"i"`` per int (not bool) argument; None for anything else."""
    kinds = []
    for a in args:
        if isinstance(a, torch.Tensor):
            kinds.append("t")
        elif type(a) is int:
            kinds.append("i")
        else:
            return None
    return "".join(kinds)


def _key_function(kinds: str):
    """The key of :func:`_arg_key` for arguments of ``kinds``, as straight-line code
    (about half the host time of the generic loop for the sort's place kernel)."""
    parts = []
    for i, kind in enumerate(kinds):
        if kind == "t":
            parts.append(f"a{i}.dtype, a{i}.data_ptr() & 15")
            if _IS_HIP:
                parts.append(f"a{i}.untyped_storage().nbytes() <= {_TWO_GIB}")
        else:
            parts.append(
                f"a{i} == 1, a{i} & 15 == 0, {_INT32_MIN} <= a{i} <= {_INT32_MAX}, a{i} > 0"
            )
    names = ", ".join(f"a{i}" for i in range(len(kinds)))
    namespace: dict[str, Any] = {}
    exec(f"def key({names}):\n    return ({', '.join(parts)},)\n", namespace)  # noqa: S102
    return namespace["key"]


def _fast_launch_ok(compiled: Any) -> bool:
    """Whether the compiled kernel can be launched directly with the fast path's key:
    the launcher and handles are where Triton 3.3-3.8 keep them, and every attribute
    it was specialized on is one the key determines."""
    try:
        if not callable(compiled.run) or compiled.function is None:
            return False
        _ = compiled.packed_metadata
        attrs = compiled.src.attrs
    except Exception:  # noqa: BLE001 - any other layout: keep Triton's own path
        return False
    return all(a in _KNOWN_ATTRS for values in attrs.values() for a in values)


class KernelLauncher:
    """A ``@triton.jit`` kernel with fixed constexprs and options (``num_warps``).

    Calling it with a grid and the runtime arguments (in parameter order) launches the
    kernel on the current device and stream, records it inside
    :func:`capture_launches`, or, on the first call for a specialization (and whenever
    Triton's launch hooks are set, e.g. by a profiler), goes through
    ``kernel[grid](*args, **meta)``. Thread-safe; one instance serves every device.
    """

    __slots__ = ("kernel", "meta", "_constexprs", "_nargs", "_compiled", "_lock", "_kinds", "_key")

    def __init__(self, kernel: Any, **meta: Any) -> None:
        self.kernel = kernel
        self.meta = meta
        names = list(getattr(kernel, "arg_names", ()))
        params = [n for n in names if n not in meta]
        self._nargs = len(params)
        # Constexpr values in parameter order, passed after the runtime arguments
        # (Triton's launcher takes every parameter and skips the constexprs).
        self._constexprs = tuple(meta[n] for n in names if n in meta)
        if names and names[self._nargs :] != [n for n in names if n in meta]:
            # Constexprs interleaved with runtime parameters: keep Triton's own path.
            self._nargs = -1
        self._compiled: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        # Argument kinds of the first call, and the key function built for them: a call
        # site passes a tensor or an int at each position, always the same.
        self._kinds: str | None = None
        self._key = _generic_key

    def __repr__(self) -> str:
        return f"KernelLauncher({getattr(self.kernel, '__name__', self.kernel)}, {self.meta})"

    def __call__(self, grid: tuple[int, ...], *args: Any) -> None:
        captured = _CAPTURED.get()
        if captured is not None:
            captured.append(Launch(self.kernel, tuple(grid), args, dict(self.meta)))
            return
        if not FAST_LAUNCH or self._nargs != len(args) or _INTERPRETING:
            self.kernel[grid](*args, **self.meta)
            return
        index = _current_device()
        try:
            key = (index, self._key(*args))
        except Exception:  # noqa: BLE001 - a position changed kind: key generically
            self._key = _generic_key
            key = (index, self._key(*args))
        compiled = self._compiled.get(key)
        if compiled is None or _launch_hooks_active():
            compiled = self.kernel[grid](*args, **self.meta)
            if compiled is not None and key not in self._compiled:
                self._learn(args)
                key = (index, self._key(*args))
                direct = False  # this specialization keeps Triton's own path
                if _fast_launch_ok(compiled):
                    direct = (compiled.run, compiled.function, compiled.packed_metadata)
                with self._lock:
                    self._compiled[key] = direct
            return
        if compiled is False:
            self.kernel[grid](*args, **self.meta)
            return
        # Triton's launcher: grid, stream, function, packed metadata, no launch metadata
        # or hooks (none are set: checked above), then every parameter in order.
        run, function, packed = compiled
        run(
            grid[0],
            grid[1] if len(grid) > 1 else 1,
            grid[2] if len(grid) > 2 else 1,
            _current_raw_stream(index),
            function,
            packed,
            None,
            None,
            None,
            *args,
            *self._constexprs,
        )

    def _learn(self, args: tuple) -> None:
        """On a miss: key with straight-line code while every call passes the same kinds
        of arguments as the first, generically otherwise."""
        kinds = _arg_kinds(args)
        if self._kinds is None and kinds is not None:
            self._kinds, self._key = kinds, _key_function(kinds)
        elif kinds != self._kinds:
            self._key = _generic_key

    def handle(self, args: tuple) -> tuple | None:
        """``(run, function, packed metadata)`` of the compiled kernel this launcher has
        launched for arguments like ``args`` on the current device, or None (not
        compiled yet, or kept on Triton's own path)."""
        try:
            key = (_current_device(), self._key(*args))
        except Exception:  # noqa: BLE001 - arguments it cannot key
            return None
        return self._compiled.get(key) or None

    def compiled_count(self) -> int:
        """How many specializations this launcher launches directly (for tests)."""
        return sum(1 for c in self._compiled.values() if c is not False)


_LAUNCHERS: dict[tuple, KernelLauncher] = {}


def launcher(kernel: Any, **meta: Any) -> KernelLauncher:
    """The shared :class:`KernelLauncher` for ``kernel`` with ``meta``."""
    key = (kernel, tuple(sorted(meta.items())))
    found = _LAUNCHERS.get(key)
    if found is None:
        found = _LAUNCHERS.setdefault(key, KernelLauncher(kernel, **meta))
    return found


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
    """Launch ``kernel`` over ``grid`` with ``args`` and ``meta`` (constexprs, num_warps).

    Inside :func:`capture_launches` the launch is recorded, not run. Hot paths keep the
    :func:`launcher` object instead, which saves building its key on every call.
    """
    launcher(kernel, **meta)(grid, *args)


# ----------------------------------------------------------------------- direct calls
# The lean host path of an eager call. What depends only on a call's signature (shapes,
# strides, dtypes, devices, sizes) is checked once, by the full checks, on the first
# call with that signature, and kept with everything the call launches: the compiled
# kernels' handles, grids, integer arguments and constants (a DirectProgram). A later
# call with the same signature reads its tensors' addresses, checks what depends on
# them (16-byte alignment, as one OR of the addresses; on AMD each buffer within 2 GiB;
# overlap, when the addresses differ from the last call's) and launches the compiled
# kernels with integer pointers. Anything else (a new signature, a misaligned tensor,
# addresses whose spans overlap, a launch hook, capture_launches, the interpreter)
# takes the full path, which raises what it always raised. The mask's and the guard's
# signatures leave the row count out, but for whether it is 0, 1 or more (the checks
# depend on nothing else of it, besides the spans a hit checks): one RowsProgram (below)
# serves every row count, so prefill, whose row count changes from forward to forward,
# keeps hitting. The sort's signature has the row count (its plan, checks and buffer
# sizes depend on it): its cache drops the programs used longest ago (lru_put).


def direct_calls_allowed() -> bool:
    """Whether a call may take its direct program now: not traced by ``torch.compile``,
    compiled kernels launched directly, no :func:`capture_launches` block, no launch
    hook (a profiler's)."""
    return (
        not torch.compiler.is_compiling()
        and FAST_LAUNCH
        and not _INTERPRETING
        and _CAPTURED.get() is None
        and not _launch_hooks_active()
    )


def _picker(slots: tuple[int, ...]):
    """A callable returning ``tuple(ptrs[i] for i in slots)``, fast."""
    if len(slots) == 1:
        (only,) = slots
        return lambda ptrs: (ptrs[only],)
    return operator.itemgetter(*slots)


class DirectLaunch:
    """One launch of a :class:`DirectProgram`: a compiled kernel's launcher and handles,
    its grid, which of the call's pointers it takes (in its parameter order: pointers
    first), and its integer arguments and constants."""

    __slots__ = ("run", "function", "packed", "g0", "g1", "g2", "slots", "pick", "tail")

    def __init__(self, handle: tuple, grid: tuple, slots: tuple[int, ...], tail: tuple) -> None:
        self.run, self.function, self.packed = handle
        self.g0 = grid[0]
        self.g1 = grid[1] if len(grid) > 1 else 1
        self.g2 = grid[2] if len(grid) > 2 else 1
        self.slots = slots
        self.pick = _picker(slots)
        self.tail = tail

    def __call__(self, stream: int, ptrs: tuple) -> None:
        self.run(
            self.g0, self.g1, self.g2, stream, self.function, self.packed, None, None, None,
            *self.pick(ptrs), *self.tail,
        )  # fmt: skip


# Bumped whenever a cached scratch or counter buffer is replaced or dropped: a direct
# program keeps the addresses of the buffers it last took, valid while this is unchanged.
_BUFFERS_GENERATION = [0]


def _capturing() -> bool:
    """Whether the current stream is being captured into a CUDA/HIP graph."""
    return torch._C._cuda_isCurrentStreamCapturing()


class DirectProgram:
    """Every launch of one call signature, launched with the call's pointers.

    ``extents``: bytes each caller pointer addresses (in pointer order), ``written``:
    which of them the launches write. :meth:`clear` tells whether a call's pointers may
    take the program: aligned, and no written span overlapping another span (checked
    only when the pointers differ from the last call's). ``buffers``: the int32 buffers
    the launches take after the call's pointers, each ``(name, elements, zeroed)``: a
    :func:`scratch` buffer, or (``zeroed``) a :func:`zeroed_state` one. Eagerly the
    program keeps the buffers it took last (and their addresses) for its stream and
    host thread, and takes them again while no cached buffer was replaced since."""

    __slots__ = (
        "launches", "index", "extents", "written", "last", "callers", "buffers", "_held", "used",
    )  # fmt: skip

    def __init__(
        self,
        launches: list[DirectLaunch],
        index: int,
        extents: tuple[int, ...],
        written: tuple[bool, ...],
        buffers: tuple[tuple[str, int, bool], ...] = (),
    ) -> None:
        self.launches = launches
        self.index = index
        self.extents = extents
        self.written = written
        self.callers = len(extents)
        self.last: tuple | None = None
        self.buffers = buffers
        # (stream, host thread, generation, buffers, their addresses) of the last eager call
        self._held: tuple | None = None
        self.used = 0  # stamp of the last hit (see lru_put)

    def clear(self, ptrs: tuple) -> bool:
        """Whether ``ptrs`` (the caller's tensors' addresses, then any the program's own
        outputs take) are 16-byte aligned and the caller's spans do not overlap where
        the program writes. Spans that overlap go to the full path, which checks
        byte-exactly."""
        callers = ptrs if len(ptrs) == self.callers else ptrs[: self.callers]
        if callers == self.last:
            return True
        acc = 0
        for p in ptrs:
            acc |= p
        if acc & 15:
            return False
        spans = sorted(
            (p, p + n, w) for p, n, w in zip(callers, self.extents, self.written, strict=True) if n
        )
        end_any = end_written = -1
        for start, end, written in spans:
            if start < (end_any if written else end_written):
                return False
            end_any = max(end_any, end)
            if written:
                end_written = max(end_written, end)
        self.last = callers
        return True

    def launch(self, ptrs: tuple) -> None:
        """Launch on the program's device (made current for the call when it is not)."""
        index = self.index
        if _current_device() != index:
            with torch.cuda.device(index):
                self.launch_on(_current_raw_stream(index), ptrs)
        else:
            self.launch_on(_current_raw_stream(index), ptrs)

    def launch_on(self, stream: int, ptrs: tuple) -> None:
        """Launch on ``stream`` of the program's device, which is current."""
        if self.buffers:
            # Hold the buffers until every launch is queued: under graph capture they are
            # fresh, and one freed early could be handed out again within the call.
            held, extra = self._take_buffers(stream)
            ptrs = (*ptrs, *extra)
        for launch in self.launches:
            launch.run(
                launch.g0, launch.g1, launch.g2, stream, launch.function, launch.packed,
                None, None, None, *launch.pick(ptrs), *launch.tail,
            )  # fmt: skip

    def _take_buffers(self, stream: int) -> tuple[list[torch.Tensor], tuple[int, ...]]:
        """The program's buffers on ``stream`` and their addresses."""
        if _capturing():  # fresh buffers from the graph's pool, every time
            held = self._fetch_buffers(stream)
            return held, tuple(b.data_ptr() for b in held)
        thread = threading.get_ident()
        last = self._held
        if (
            last is not None
            and last[0] == stream
            and last[1] == thread
            and last[2] == _BUFFERS_GENERATION[0]
        ):
            return last[3], last[4]
        generation = _BUFFERS_GENERATION[0]
        held = self._fetch_buffers(stream)
        extra = tuple(b.data_ptr() for b in held)
        self._held = (stream, thread, generation, held, extra)
        return held, extra

    def _fetch_buffers(self, stream: int) -> list[torch.Tensor]:
        return [
            (state_on if zeroed else scratch_on)(self.index, stream, name, numel)
            for name, numel, zeroed in self.buffers
        ]


def launch_and_take(
    launches: list[Launch], device: torch.device, tensors: list[torch.Tensor]
) -> list[DirectLaunch] | None:
    """Make the ``launches`` recorded by :func:`capture_launches` (on ``device``) through
    their launchers (so each specialization is compiled) and return each as a
    :class:`DirectLaunch` taking its pointers from ``tensors``' slots, or None when one of
    them cannot be launched directly (kept on Triton's path, a tensor argument not in
    ``tensors``, an argument that is neither a tensor nor an int, a pointer that is not
    16-byte aligned, or on AMD a buffer past 2 GiB: then every call takes the full path)."""
    with device_guard(device):
        for launch in launches:
            launcher(launch.kernel, **launch.meta)(launch.grid, *launch.args)
        if not launches or any(t.data_ptr() & 15 for t in tensors):
            return None
        if _IS_HIP and any(t.untyped_storage().nbytes() > _TWO_GIB for t in tensors):
            return None
        direct = [_direct_launch(launch, tensors) for launch in launches]
    if any(d is None for d in direct):
        return None
    return direct


def launch_and_keep(
    launches: list[Launch],
    device: torch.device,
    callers: list[torch.Tensor],
    extents: tuple[int, ...],
    written: tuple[bool, ...],
    own: list[torch.Tensor] = (),
    buffers: tuple[tuple[str, int, bool], ...] = (),
) -> DirectProgram | None:
    """:func:`launch_and_take`, kept as a :class:`DirectProgram` (None when a launch
    cannot be launched directly).

    ``callers``: the call's tensors in the order its direct path reads their addresses
    (``extents``: the bytes each spans, ``written``: which the launches write); ``own``:
    buffers the direct path allocates (outputs), whose addresses follow them, then the
    program's ``buffers`` (the last ``len(buffers)`` of ``own``)."""
    direct = launch_and_take(launches, device, [*callers, *own])
    if direct is None:
        return None
    return DirectProgram(
        direct, device.index if device.index is not None else 0, extents, written, buffers
    )


def _direct_launch(launch: Launch, tensors: list[torch.Tensor]) -> DirectLaunch | None:
    """``launch`` as a :class:`DirectLaunch` taking its pointers from ``tensors``' slots,
    or None (see :func:`launch_and_take`)."""
    runner = launcher(launch.kernel, **launch.meta)
    handle = runner.handle(launch.args)
    if handle is None or runner._nargs != len(launch.args):
        return None
    slots, ints = [], []
    for a in launch.args:
        if isinstance(a, torch.Tensor):
            if ints:  # a pointer after an int: not this layout
                return None
            found = next((i for i, t in enumerate(tensors) if a is t), None)
            if found is None:
                return None
            slots.append(found)
        elif type(a) is int:
            ints.append(a)
        else:
            return None
    if not slots:
        return None
    return DirectLaunch(handle, launch.grid, tuple(slots), (*ints, *runner._constexprs))


# ----------------------------------------------------------- programs for every row count
# The mask's and the guard's launches depend on the row count M in three ways only: the
# grid; the integer argument M itself, which neither kernel specializes on
# (do_not_specialize: Triton compiles it as a plain int32 below 2**31 rows and as an
# int64 from there); and the constants M picks, the tile (smaller while the whole tensor
# fits in less than one) and int64 offsets from 2**31 elements. Every other argument
# (the column count, the strides, the fill value or expert count, the dtypes) is part of
# the call's key. So a RowsProgram keeps one compiled handle per set of constants and
# serves every M: a hit computes the grid from M and takes the handle of M's constants.
INT32_LIMIT = 2**31


def rows_launch_config(
    num_rows: int, num_cols: int, flat: bool, flat_block: int, rows_block: int
) -> tuple[int, int, int]:
    """``(grid, BLOCK_M, BLOCK_K)`` of a one-launch kernel over ``[num_rows, num_cols]``
    routing tensors (the mask's and the guard's). ``flat`` (contiguous tensors): each
    program covers ``BLOCK_M * BLOCK_K`` consecutive elements, ``flat_block`` or the next
    power of two of all of them if fewer (``BLOCK_K`` is 1). Otherwise ``BLOCK_M`` rows
    of ``next_pow2(num_cols)`` columns, at most ``rows_block`` elements a program."""
    if flat:
        block = min(flat_block, triton.next_power_of_2(max(num_rows * num_cols, 1)))
        return triton.cdiv(num_rows * num_cols, block), block, 1
    block_k = triton.next_power_of_2(max(num_cols, 1))
    block_m = max(1, min(triton.next_power_of_2(max(num_rows, 1)), rows_block // block_k))
    return triton.cdiv(num_rows, block_m), block_m, block_k


class RowsProgram:
    """The direct program of a one-launch kernel over ``[M, K]`` routing tensors (the
    mask's, the guard's) for every row count ``M`` of one key.

    The kernel takes its pointers, then ``M``, then the arguments in ``tail`` (the same
    for every call of the key, constants last). :meth:`entry` gives, for ``M``, the grid
    and the handle compiled for ``M``'s constants (see :func:`rows_launch_config`; int64
    offsets from ``2**31`` elements, on the strided path too when ``int64_strided``), or
    None when that handle is not known yet or ``M`` is ``2**31`` or more (Triton then
    passes ``M`` as an int64): such a call takes the full path, whose launch
    :meth:`add` keeps. The constants stop changing once a tile is full, so from
    ``lo`` rows up to the int64 switch (``hi``) one handle serves."""

    __slots__ = (
        "index", "cols", "flat", "flat_block", "rows_block", "int64_strided", "mult", "per",
        "lo", "hi", "steady", "steady_config", "handles",
    )  # fmt: skip

    def __init__(
        self,
        index: int,
        cols: int,
        flat: bool,
        flat_block: int,
        rows_block: int,
        int64_strided: bool,
    ) -> None:
        self.index, self.cols, self.flat = index, cols, flat
        self.flat_block, self.rows_block, self.int64_strided = flat_block, rows_block, int64_strided
        if flat:
            # A program covers flat_block elements once M * K exceeds half of it.
            self.mult, self.per = cols, flat_block
            self.lo = (flat_block // 2) // cols + 1
        else:
            self.mult = 1
            self.per = max(1, rows_block // triton.next_power_of_2(cols))
            self.lo = self.per // 2 + 1
        self.hi = -(-INT32_LIMIT // cols) if flat or int64_strided else INT32_LIMIT
        self.steady_config = self.config(max(self.lo, 1))[1]
        self.steady: tuple | None = None  # (run, function, packed, tail) for lo <= M < hi
        self.handles: dict[tuple, tuple] = {}

    def config(self, rows: int) -> tuple[int, tuple[int, int, bool]]:
        """``(grid, (BLOCK_M, BLOCK_K, int64 offsets))`` of ``rows`` rows."""
        grid, block_m, block_k = rows_launch_config(
            rows, self.cols, self.flat, self.flat_block, self.rows_block
        )
        int64 = (self.flat or self.int64_strided) and rows * self.cols >= INT32_LIMIT
        return grid, (block_m, block_k, int64)

    def entry(self, rows: int) -> tuple[int, tuple] | None:
        """``(grid, (run, function, packed, tail))`` for ``rows`` rows, or None."""
        if self.lo <= rows < self.hi:
            steady = self.steady
            if steady is None:
                return None
            return (rows * self.mult + self.per - 1) // self.per, steady
        if rows < 1 or rows >= INT32_LIMIT:
            return None
        grid, config = self.config(rows)
        handle = self.handles.get(config)
        return None if handle is None else (grid, handle)

    def add(self, rows: int, launch: DirectLaunch) -> bool:
        """Keep ``launch`` (the full path's, for ``rows`` rows) as the handle of ``rows``'
        constants; False (nothing kept) when it is not the launch this program makes."""
        if not 1 <= rows < INT32_LIMIT or not launch.tail or launch.tail[0] != rows:
            return False
        grid, config = self.config(rows)
        if (launch.g0, launch.g1, launch.g2) != (grid, 1, 1):
            return False
        handle = (launch.run, launch.function, launch.packed, launch.tail[1:])
        self.handles[config] = handle
        if config == self.steady_config:
            self.steady = handle
        return True

    def launch(self, entry: tuple[int, tuple], rows: int, *ptrs: int) -> None:
        """Launch ``entry`` (from :meth:`entry`) with ``ptrs`` on the program's device,
        made current for the call when it is not."""
        index = self.index
        if _current_device() != index:
            with torch.cuda.device(index):
                self.launch(entry, rows, *ptrs)
            return
        grid, (run, function, packed, tail) = entry
        run(
            grid, 1, 1, _current_raw_stream(index), function, packed, None, None, None,
            *ptrs, rows, *tail,
        )  # fmt: skip


# Outputs of a hit are carved from slabs, SLAB_PAIRS_MAX pairs at most per slab and
# SLAB_BYTES at most per slab of each dtype (outputs larger than half a slab get two
# allocations per call). A stream's slab serves one row count at a time: the first call
# at a new count allocates its pair, a second call at that count makes a slab of 2
# pairs, each next one twice as many. Prefill runs every MoE layer of a forward at one
# row count, so its calls take slabs; a count that changes on every call allocates, as
# plain calls do. Slabs are kept, per stream, for the POOLED_PROGRAMS programs that
# refilled last.
SLAB_BYTES = 1 << 20
SLAB_PAIRS_MAX = 16
POOLED_PROGRAMS = 8


class PairProgram(RowsProgram):
    """The :class:`RowsProgram` of the routing guard, which returns two new ``[M, K]``
    tensors: its outputs of later calls, premade.

    Each output pair of a hit is two fresh, contiguous ``[M, K]`` tensors no one else
    holds: two plain allocations, or views of two slabs (one per dtype) made a batch at a
    time, one slab row per pair, each row 16-byte aligned, so such a hit allocates
    nothing itself and reads no output address (the addresses are known when the slab
    is made). Slabs are per stream (the caching allocator reuses a block on the stream it
    was allocated on), hold pairs of one row count, and are never used while the stream
    is being captured into a graph (a graph's outputs come from its own pool). A pair a
    caller keeps holds its slab alive (at most ``SLAB_BYTES`` per dtype)."""

    __slots__ = ("device", "ids_dtype", "w_dtype", "ids_size", "w_size", "pools")

    def __init__(
        self,
        index: int,
        cols: int,
        flat: bool,
        flat_block: int,
        rows_block: int,
        out_ids: torch.Tensor,
        out_w: torch.Tensor,
    ) -> None:
        super().__init__(index, cols, flat, flat_block, rows_block, False)
        self.device = out_ids.device
        self.ids_dtype, self.w_dtype = out_ids.dtype, out_w.dtype
        self.ids_size, self.w_size = out_ids.element_size(), out_w.element_size()
        # Per stream: [row count, premade pairs, pairs of the next slab]
        self.pools: dict[int, list] = {}

    def __call__(
        self, entry: tuple[int, tuple], rows: int, p_ids: int, p_w: int, p_count: int, p_stats: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        index = self.index
        if _current_device() != index:
            with torch.cuda.device(index):
                stream = _current_raw_stream(index)
                return self._launch(entry, rows, stream, p_ids, p_w, p_count, p_stats)
        return self._launch(entry, rows, _current_raw_stream(index), p_ids, p_w, p_count, p_stats)

    def _launch(
        self,
        entry: tuple[int, tuple],
        rows: int,
        stream: int,
        p_ids: int,
        p_w: int,
        p_count: int,
        p_stats: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pool = self.pools.get(stream)
        if pool is not None and pool[0] == rows and pool[1] and not _capturing():
            try:
                out_ids, out_w, p_out_ids, p_out_w = pool[1].pop()
            except IndexError:  # another host thread took the last pair
                out_ids, out_w, p_out_ids, p_out_w = self._outputs(stream, rows)
        else:
            out_ids, out_w, p_out_ids, p_out_w = self._outputs(stream, rows)
        grid, (run, function, packed, tail) = entry
        run(
            grid, 1, 1, stream, function, packed, None, None, None,
            p_ids, p_w, p_count, p_out_ids, p_out_w, p_stats, rows, *tail,
        )  # fmt: skip
        return out_ids, out_w

    def _outputs(self, stream: int, rows: int) -> tuple:
        """One output pair of ``rows`` rows: from a new slab when the stream's last call
        had the same row count, the outputs are small and the stream is not being
        captured; else two plain allocations."""
        if not _capturing():
            pool = self.pools.get(stream)
            if pool is not None and pool[0] == rows:
                pair = self._refill(stream, pool)
                if pair is not None:
                    return pair
            else:
                self.pools[stream] = [rows, [], 2]
        shape = (rows, self.cols)
        out_ids = torch.empty(shape, dtype=self.ids_dtype, device=self.device)
        out_w = torch.empty(shape, dtype=self.w_dtype, device=self.device)
        return out_ids, out_w, out_ids.data_ptr(), out_w.data_ptr()

    def _refill(self, stream: int, pool: list) -> tuple | None:
        """Make a slab of ``pool``'s row count, keep its pairs in ``pool`` and return its
        first; None when two pairs do not fit in a slab."""
        rows, cols = pool[0], self.cols
        numel = rows * cols
        # Slab row lengths in elements, rounded up to 16 bytes.
        ids_row = -(-numel * self.ids_size // 16) * 16 // self.ids_size
        w_row = -(-numel * self.w_size // 16) * 16 // self.w_size
        widest = max(ids_row * self.ids_size, w_row * self.w_size, 16)
        most = min(SLAB_PAIRS_MAX, SLAB_BYTES // widest)
        if most < 2:
            return None
        n = min(pool[2], most)
        pool[2] = min(2 * n, most)
        device = self.device
        made = []
        for dtype, row in ((self.ids_dtype, ids_row), (self.w_dtype, w_row)):
            slab = torch.empty(n * row, dtype=dtype, device=device)
            views = slab.as_strided((n, rows, cols), (row, cols, 1)).unbind(0)
            made.append((views, slab.data_ptr(), row * slab.element_size()))
        (ids_views, ids_base, ids_step), (w_views, w_base, w_step) = made
        # Popped from the end: the first pair of the slab is handed out first.
        pairs = [
            (ids_views[i], w_views[i], ids_base + i * ids_step, w_base + i * w_step)
            for i in range(n - 1, -1, -1)
        ]
        first = pairs.pop()
        pool[1] = pairs
        with _POOLED_LOCK:
            _POOLED.pop(self, None)
            _POOLED[self] = None
            while len(_POOLED) > POOLED_PROGRAMS:
                _POOLED.popitem(last=False)[0].pools.clear()
        return first


# Programs holding premade outputs, the one that refilled last at the end.
_POOLED: collections.OrderedDict[PairProgram, None] = collections.OrderedDict()
_POOLED_LOCK = threading.Lock()


def hip_buffers_small(*tensors: torch.Tensor) -> bool:
    """On AMD, whether every tensor's buffer spans at most 2 GiB (what the direct
    programs were compiled for); True elsewhere."""
    return not _IS_HIP or all(t.untyped_storage().nbytes() <= _TWO_GIB for t in tensors)


def bounded_put(cache: dict, key: object, value: object, limit: int = 1024) -> None:
    """``cache[key] = value``, emptying the cache first when it holds ``limit`` entries
    (a server sees few signatures; this only bounds a pathological caller)."""
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value


# Stamps of use for caches of direct programs that drop the least recently used.
_USES = itertools.count()


def use_stamp() -> int:
    """A stamp later than every earlier one (thread-safe): a hit sets its program's
    ``used`` to it, so :func:`lru_put` knows which programs were used longest ago."""
    return next(_USES)


def lru_put(cache: dict, key: object, value: object, limit: int) -> None:
    """``cache[key] = value`` for a cache of direct programs (each value a
    :class:`DirectProgram`, or a tuple whose first item is one): when the cache holds
    ``limit`` entries, the half whose programs were used longest ago (their ``used``
    stamps, set by hits) are dropped first."""
    if len(cache) >= limit:

        def stamp(item: tuple) -> int:
            found = item[1]
            return (found[0] if isinstance(found, tuple) else found).used

        for old, _ in sorted(cache.items(), key=stamp)[: len(cache) - limit // 2]:
            cache.pop(old, None)
    (value[0] if isinstance(value, tuple) else value).used = next(_USES)
    cache[key] = value


# ---------------------------------------------------------------------------- scratch
# Scratch buffers for eager calls, one per (device, stream, host thread, name): work
# queued on one stream runs in order, so consecutive calls on a stream can reuse one
# buffer, while calls on two streams (which may overlap on the GPU) or from two host
# threads (whose launches may interleave on one stream) never share one. Bounded, least
# recently used first out.
_SCRATCH: collections.OrderedDict[tuple, torch.Tensor] = collections.OrderedDict()
_SCRATCH_MAX = 64
_SCRATCH_LOCK = threading.Lock()


def scratch(name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A device buffer of at least ``numel`` elements whose contents are undefined.

    Eagerly, the buffer is cached per (device, current stream, host thread, ``name``)
    and grows to
    the largest size asked for, so a call allocates nothing. While the current stream
    is being captured into a CUDA/HIP graph, a fresh buffer is allocated instead: it
    comes from the graph's private memory pool, so a replay never shares memory with
    eager calls or with another graph that may run on another stream at the same time.
    Off the GPU (``meta`` or CPU tensors) a fresh buffer, too.
    """
    if device.type != "cuda" or torch._C._cuda_isCurrentStreamCapturing():
        return torch.empty(max(numel, 1), dtype=dtype, device=device)
    index = device.index if device.index is not None else _current_device()
    key = (index, _current_raw_stream(index), threading.get_ident(), name, dtype)
    buf = _SCRATCH.get(key)
    if buf is not None and buf.numel() >= numel:
        return buf
    with _SCRATCH_LOCK:
        buf = torch.empty(
            max(numel, 1024, 0 if buf is None else 2 * buf.numel()), dtype=dtype, device=device
        )
        _SCRATCH[key] = buf
        _SCRATCH.move_to_end(key)
        while len(_SCRATCH) > _SCRATCH_MAX:
            _SCRATCH.popitem(last=False)
        _BUFFERS_GENERATION[0] += 1
    return buf


# Buffers that kernels leave zero (self-resetting counters), one per (device, stream,
# host thread, name), zeroed once when allocated. Bounded like the scratch buffers: a
# buffer dropped is all zeros, so nothing is lost with it.
_STATE: collections.OrderedDict[tuple, torch.Tensor] = collections.OrderedDict()


def zeroed_state(name: str, numel: int, device: torch.device) -> torch.Tensor:
    """An int32 device buffer of at least ``numel`` elements that is all zeros, for
    kernels that leave it all zeros again when they finish (counters a last program
    resets). Eagerly it is cached per (device, current stream, host thread, ``name``)
    and zeroed only when allocated. While the current stream is being captured into a
    CUDA/HIP graph, a fresh buffer is allocated and zeroed in the graph (one memset per
    replay), so a graph never shares its counters with eager calls or other graphs.
    Off the GPU, a fresh zeroed buffer."""
    if device.type != "cuda" or torch._C._cuda_isCurrentStreamCapturing():
        return torch.zeros(max(numel, 1), dtype=torch.int32, device=device)
    index = device.index if device.index is not None else _current_device()
    key = (index, _current_raw_stream(index), threading.get_ident(), name)
    buf = _STATE.get(key)
    if buf is not None and buf.numel() >= numel:
        return buf
    with _SCRATCH_LOCK:
        buf = torch.zeros(max(numel, 1024), dtype=torch.int32, device=device)
        _STATE[key] = buf
        _STATE.move_to_end(key)
        while len(_STATE) > _SCRATCH_MAX:
            _STATE.popitem(last=False)
        _BUFFERS_GENERATION[0] += 1
    return buf


def state_on(index: int, stream: int, name: str, numel: int) -> torch.Tensor:
    """:func:`zeroed_state` for a direct program that already knows its device and
    stream: one dict lookup when the buffer exists and is large enough."""
    if not torch._C._cuda_isCurrentStreamCapturing():
        buf = _STATE.get((index, stream, threading.get_ident(), name))
        if buf is not None and buf.numel() >= numel:
            return buf
    return zeroed_state(name, numel, torch.device("cuda", index))


def scratch_on(index: int, stream: int, name: str, numel: int) -> torch.Tensor:
    """:func:`scratch` (int32) for a direct program that already knows its device and
    stream: one dict lookup when the buffer exists and is large enough."""
    if not torch._C._cuda_isCurrentStreamCapturing():
        buf = _SCRATCH.get((index, stream, threading.get_ident(), name, torch.int32))
        if buf is not None and buf.numel() >= numel:
            return buf
    return scratch(name, numel, torch.int32, torch.device("cuda", index))


# ------------------------------------------------------------------------------ sizes
def max_sorted_size(num_rows: int, topk: int, num_experts: int, block_size: int) -> int:
    """Worst-case sorted length, exactly as aiter's ``_adaptive_moe_sort`` allocates it.

    Every routed expert rounds its pair count up to a multiple of ``block_size``, so at
    most ``min(num_experts, pairs)`` experts each add at most ``block_size - 1`` slots.
    """
    pairs = num_rows * topk
    active = min(num_experts, pairs)
    return ((pairs + active * (block_size - 1) + block_size - 1) // block_size) * block_size


def real_rows(count: torch.Tensor | None, num_rows: int) -> int:
    """The real row count on the host: ``count`` clamped to ``[0, num_rows]`` (a host
    sync), or ``num_rows`` without one. For references and tests, never a hot path."""
    if count is None:
        return num_rows
    return min(max(int(count.item()), 0), num_rows)

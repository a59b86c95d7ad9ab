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
- :class:`DirectProgram` / :class:`PairProgram`: the lean host path of a call signature
  seen before (see "direct calls" below); a :class:`PairProgram` also premakes the two
  outputs of the routing guard.
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
# takes the full path, which raises what it always raised.


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

    __slots__ = ("launches", "index", "extents", "written", "last", "callers", "buffers", "_held")

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


def launch_and_keep(
    launches: list[Launch],
    device: torch.device,
    callers: list[torch.Tensor],
    extents: tuple[int, ...],
    written: tuple[bool, ...],
    own: list[torch.Tensor] = (),
    buffers: tuple[tuple[str, int, bool], ...] = (),
) -> DirectProgram | None:
    """Make the ``launches`` recorded by :func:`capture_launches` (on ``device``) through
    their launchers (so each specialization is compiled) and return their
    :class:`DirectProgram`, or None when one of them cannot be launched directly (kept on
    Triton's path, a tensor argument that is neither one of ``callers`` nor one of
    ``own``, an argument that is neither a tensor nor an int, a pointer that is not
    16-byte aligned, or on AMD a buffer past 2 GiB: then every call takes the full path).

    ``callers``: the call's tensors in the order its direct path reads their addresses
    (``extents``: the bytes each spans, ``written``: which the launches write); ``own``:
    buffers the direct path allocates (outputs), whose addresses follow them, then the
    program's ``buffers`` (the last ``len(buffers)`` of ``own``)."""
    with device_guard(device):
        for launch in launches:
            launcher(launch.kernel, **launch.meta)(launch.grid, *launch.args)
        tensors = [*callers, *own]
        if not launches or any(t.data_ptr() & 15 for t in tensors):
            return None
        if _IS_HIP and any(t.untyped_storage().nbytes() > _TWO_GIB for t in tensors):
            return None
        direct = [_direct_launch(launch, tensors) for launch in launches]
    if any(d is None for d in direct):
        return None
    return DirectProgram(
        direct, device.index if device.index is not None else 0, extents, written, buffers
    )


def _direct_launch(launch: Launch, tensors: list[torch.Tensor]) -> DirectLaunch | None:
    """``launch`` as a :class:`DirectLaunch` taking its pointers from ``tensors``' slots,
    or None (see :func:`launch_and_keep`)."""
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


# Outputs of a hit are carved from slabs, SLAB_PAIRS_MAX pairs at most per slab and
# SLAB_BYTES at most per slab of each dtype (a signature whose outputs are larger gets
# two allocations per call). A signature's first slab holds 2 pairs, each next one twice
# as many, so one seen rarely allocates little. Slabs are kept, per stream, for the
# POOLED_PROGRAMS signatures that refilled last.
SLAB_BYTES = 1 << 20
SLAB_PAIRS_MAX = 16
POOLED_PROGRAMS = 8


class PairProgram:
    """The direct program of a one-launch call that returns two new ``[M, K]`` tensors
    (the routing guard's): its compiled launch, and the outputs of later calls, premade.

    Each output pair of a hit is two fresh, contiguous ``[M, K]`` tensors no one else
    holds: views of two slabs (one per dtype) made a batch at a time, one slab row per
    pair, each row 16-byte aligned, so a hit allocates nothing itself and reads no
    output address (the addresses are known when the slab is made). Slabs are per
    stream (the caching allocator reuses a block on the stream it was allocated on) and
    never used while the stream is being captured into a graph (a graph's outputs come
    from its own pool). A pair a caller keeps holds its slab alive (at most
    ``SLAB_BYTES`` per dtype)."""

    __slots__ = (
        "run", "function", "packed", "grid", "tail", "index", "device", "shape", "ids_dtype",
        "w_dtype", "ids_row", "w_row", "ids_size", "w_size", "batch", "batch_max", "pools",
    )  # fmt: skip

    def __init__(
        self, launch: DirectLaunch, index: int, out_ids: torch.Tensor, out_w: torch.Tensor
    ) -> None:
        self.run, self.function, self.packed = launch.run, launch.function, launch.packed
        self.grid = (launch.g0, launch.g1, launch.g2)
        self.tail = launch.tail
        self.index = index
        self.device = out_ids.device
        self.shape = out_ids.shape
        self.ids_dtype, self.w_dtype = out_ids.dtype, out_w.dtype
        self.ids_size, self.w_size = out_ids.element_size(), out_w.element_size()
        numel = out_ids.numel()
        # Slab row lengths in elements, rounded up to 16 bytes.
        self.ids_row = -(-numel * self.ids_size // 16) * 16 // self.ids_size
        self.w_row = -(-numel * self.w_size // 16) * 16 // self.w_size
        widest = max(self.ids_row * self.ids_size, self.w_row * self.w_size, 16)
        self.batch_max = min(SLAB_PAIRS_MAX, SLAB_BYTES // widest)
        self.batch = 2
        self.pools: dict[int, list[tuple]] = {}

    def __call__(self, p_ids: int, p_w: int, p_count: int) -> tuple[torch.Tensor, torch.Tensor]:
        index = self.index
        if _current_device() != index:
            with torch.cuda.device(index):
                return self._launch(_current_raw_stream(index), p_ids, p_w, p_count)
        return self._launch(_current_raw_stream(index), p_ids, p_w, p_count)

    def _launch(
        self, stream: int, p_ids: int, p_w: int, p_count: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pool = self.pools.get(stream)
        if pool and not _capturing():
            try:
                out_ids, out_w, p_out_ids, p_out_w = pool.pop()
            except IndexError:  # another host thread took the last pair
                out_ids, out_w, p_out_ids, p_out_w = self._outputs(stream)
        else:
            out_ids, out_w, p_out_ids, p_out_w = self._outputs(stream)
        g0, g1, g2 = self.grid
        self.run(
            g0, g1, g2, stream, self.function, self.packed, None, None, None,
            p_ids, p_w, p_count, p_out_ids, p_out_w, *self.tail,
        )  # fmt: skip
        return out_ids, out_w

    def _outputs(self, stream: int) -> tuple:
        """One output pair, from a new slab when the signature's outputs are small and
        the stream is not being captured; else two plain allocations."""
        device = self.device
        if self.batch_max < 2 or _capturing():
            out_ids = torch.empty(self.shape, dtype=self.ids_dtype, device=device)
            out_w = torch.empty(self.shape, dtype=self.w_dtype, device=device)
            return out_ids, out_w, out_ids.data_ptr(), out_w.data_ptr()
        n = self.batch
        self.batch = min(2 * n, self.batch_max)
        rows, cols = self.shape
        pairs = []
        for dtype, row in ((self.ids_dtype, self.ids_row), (self.w_dtype, self.w_row)):
            slab = torch.empty(n * row, dtype=dtype, device=device)
            views = slab.as_strided((n, rows, cols), (row, cols, 1)).unbind(0)
            pairs.append((views, slab.data_ptr(), row * slab.element_size()))
        (ids_views, ids_base, ids_step), (w_views, w_base, w_step) = pairs
        # Popped from the end: the first pair of the slab is handed out first.
        pool = [
            (ids_views[i], w_views[i], ids_base + i * ids_step, w_base + i * w_step)
            for i in range(n - 1, -1, -1)
        ]
        first = pool.pop()
        with _POOLED_LOCK:
            self.pools[stream] = pool
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

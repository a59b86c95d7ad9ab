"""Guard MoE routing before aiter sorts it: new ids and weights with every invalid entry
turned into expert 0 with weight 0, in one Triton launch.

Why this exists: aiter's MoE kernels index their tables with the expert ids and cannot
take an id outside ``[0, E)``: the -1 that vLLM writes for skipped padded rows, the
garbage ids of CUDA-graph padded rows that no count marks, the id ``E`` a router emits
for an all-NaN gating row. Any one of them faults the GPU or corrupts real tokens.
:func:`guard_routing` hands the caller's routing to aiter in a form it can take:

* every id ``< 0`` or ``>= E`` becomes expert 0 with weight 0;
* with a count ``n`` (``num_local_tokens``, a 1-element int tensor read on the device
  and clamped to ``[0, M]``), the rows at and beyond ``n`` get expert 0 and weight 0 too;
* every other entry is copied bit for bit: an id in range is never changed (SGLang's
  sink slot, an id ``E - 1`` with an expert mask of ``E`` entries, passes through), and a
  real entry's weight keeps its bits, NaN and Inf included.

It returns NEW tensors and never writes the caller's: callers read their ids and
weights again after the MoE (SGLang keeps them for the combine step, recorders and
expert-load statistics read them). Ids are compared in int64, so no int64 id wraps into
range. One launch, no allocation besides the two outputs, no host synchronization: a
captured graph replays with new counts and new ids.

Layouts: the outputs are contiguous ``[M, K]`` tensors of the inputs' dtypes. The inputs
may have any strides (column slices, transposes, expanded rows): they are only read.

It is a ``torch.library`` custom op (``torch.ops.sglang_amd_moe.guard_routing``) with a
fake implementation, so ``torch.compile`` can trace through it; eager calls skip the
dispatcher. On the CPU it runs the Triton kernel through the interpreter when Triton was
imported with ``TRITON_INTERPRET=1``, and :func:`guard_routing_reference` otherwise.

Host cost: the first eager call of a signature (column count, strides, dtypes, devices,
expert count, whether there is a count, and whether there are 0, 1 or more rows) runs
the full checks and keeps a direct program (:class:`.utils.PairProgram`) that serves
every row count; later calls read three addresses, check their alignment, compute the
grid from the row count, take a pair of outputs (premade from a slab while the row
count repeats, as it does across the MoE layers of one forward) and launch the compiled
kernel with integer pointers. The inputs are only read, so no overlap check is needed.
A row count whose tile differs from every one launched before (the tile shrinks while
the whole tensor fits in less than one; int64 offsets from ``2**31`` elements) takes the
full path once.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._validate import check_guard_call, check_stats
from .reference import (
    STAT_CALLS,
    STATS_SLOTS,
    guard_routing_reference,
    guard_stats_reference,
)
from .utils import (
    KernelLauncher,
    PairProgram,
    bounded_put,
    capture_launches,
    device_guard,
    direct_calls_allowed,
    hip_buffers_small,
    launch_and_take,
    launcher,
    rows_launch_config,
    triton_backend,
)

# Elements per program. Contiguous inputs: a run of consecutive elements; strided ones:
# rows x next_pow2(K) columns. Every element is read and written (the outputs are new),
# so this is a copy: 512 elements per program keep M = 4096 at 64-88 programs.
FLAT_BLOCK = 512
ROWS_BLOCK = 512
FLAT_NUM_WARPS = 8
ROWS_NUM_WARPS = 4


@triton.jit(
    do_not_specialize=[
        "num_rows",
        "num_cols",
        "stride_ids_row",
        "stride_ids_col",
        "stride_w_row",
        "stride_w_col",
        "num_experts",
    ]
)
def _guard_routing_kernel(
    ids_ptr,
    w_ptr,
    count_ptr,
    out_ids_ptr,
    out_w_ptr,
    stats_ptr,
    num_rows,
    num_cols,
    stride_ids_row,
    stride_ids_col,
    stride_w_row,
    stride_w_col,
    num_experts,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FLAT: tl.constexpr,
    HAS_COUNT: tl.constexpr,
    INT64_OFFSETS: tl.constexpr,
    STATS: tl.constexpr,
):
    """Each program copies its tile of ids and weights into the outputs, with expert 0
    and weight 0 where the entry is invalid (id outside ``[0, num_experts)``, or a row at
    or past the count).

    ``FLAT`` (both inputs contiguous): program ``p`` covers elements ``[p * BLOCK_M *
    BLOCK_K, (p + 1) * BLOCK_M * BLOCK_K)`` of the flattened tensors (``BLOCK_K`` is 1),
    and the real rows are the elements below ``n * num_cols``. Otherwise program ``p``
    covers rows ``[p * BLOCK_M, (p + 1) * BLOCK_M)`` with their ``BLOCK_K >= num_cols``
    columns, read at each input's own strides. ``INT64_OFFSETS``: the tensors have
    ``2**31`` elements or more (flat path; the strided path always uses int64).

    ``STATS``: also add to the int64 counters at ``stats_ptr`` (see
    ``reference.guard_stats_reference``): program 0 counts the call; each program adds
    the entries its tile changes, one relaxed atomic per counter and only when it is not
    zero, so a tile with nothing to change costs no atomic.
    """
    if FLAT:
        if INT64_OFFSETS:
            start = tl.program_id(0).to(tl.int64) * (BLOCK_M * BLOCK_K)
            total = num_rows.to(tl.int64) * num_cols
        else:
            start = tl.program_id(0) * (BLOCK_M * BLOCK_K)
            total = num_rows * num_cols
        offs = start + tl.arange(0, BLOCK_M * BLOCK_K)
        inside = offs < total
        ids = tl.load(ids_ptr + offs, mask=inside, other=0)
        w = tl.load(w_ptr + offs, mask=inside, other=0)
        out_offs = offs
        if HAS_COUNT:
            # Clamp in int64 before narrowing: an int64 count past 2**31 must not wrap.
            n = tl.minimum(tl.maximum(tl.load(count_ptr).to(tl.int64), 0), num_rows)
            if INT64_OFFSETS:
                real = offs < n * num_cols
            else:
                real = offs < n.to(tl.int32) * num_cols
    else:
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_K)
        inside = (rows < num_rows)[:, None] & (cols < num_cols)[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        cols64 = cols.to(tl.int64)[None, :]
        ids = tl.load(
            ids_ptr + rows64 * stride_ids_row + cols64 * stride_ids_col, mask=inside, other=0
        )
        w = tl.load(w_ptr + rows64 * stride_w_row + cols64 * stride_w_col, mask=inside, other=0)
        out_offs = rows64 * num_cols + cols64
        if HAS_COUNT:
            n = tl.minimum(tl.maximum(tl.load(count_ptr).to(tl.int64), 0), num_rows)
            real = (rows.to(tl.int64) < n)[:, None]
    # Compare in int64: an int64 id such as 2**32 must not pass as 0 after narrowing.
    ids64 = ids.to(tl.int64)
    valid = (ids64 >= 0) & (ids64 < num_experts)
    if HAS_COUNT:
        valid = valid & real
    tl.store(out_ids_ptr + out_offs, tl.where(valid, ids, tl.zeros_like(ids)), mask=inside)
    tl.store(out_w_ptr + out_offs, tl.where(valid, w, tl.zeros_like(w)), mask=inside)
    if STATS:
        out_of_range = inside & ((ids64 < 0) | (ids64 >= num_experts))
        if HAS_COUNT:
            out_of_range = out_of_range & real
            past = inside & ~real & ((ids64 != 0) | (w != 0))
            n_past = tl.sum(past.to(tl.int32)).to(tl.int64)
            tl.atomic_add(stats_ptr + 2, n_past, mask=n_past > 0, sem="relaxed")
        n_bad = tl.sum(out_of_range.to(tl.int32)).to(tl.int64)
        tl.atomic_add(stats_ptr + 1, n_bad, mask=n_bad > 0, sem="relaxed")
        if HAS_COUNT:
            tl.atomic_add(stats_ptr + 3, n_bad, mask=n_bad > 0, sem="relaxed")
        one = tl.full([], 1, tl.int64)
        tl.atomic_add(stats_ptr, one, mask=tl.program_id(0) == 0, sem="relaxed")


def guard_launch_config(num_rows: int, num_cols: int, flat: bool) -> tuple[int, int, int]:
    """``(grid, BLOCK_M, BLOCK_K)`` for ``[num_rows, num_cols]`` routing tensors."""
    return rows_launch_config(num_rows, num_cols, flat, FLAT_BLOCK, ROWS_BLOCK)


@functools.lru_cache(maxsize=4096)
def guard_program(
    num_rows: int, num_cols: int, flat: bool, has_count: bool, stats: bool = False
) -> tuple[KernelLauncher, tuple[int]]:
    """The launcher (constants bound) and grid for one shape, built once and cached."""
    grid, block_m, block_k = guard_launch_config(num_rows, num_cols, flat)
    return launcher(
        _guard_routing_kernel,
        BLOCK_M=block_m,
        BLOCK_K=block_k,
        FLAT=flat,
        HAS_COUNT=has_count,
        INT64_OFFSETS=flat and num_rows * num_cols >= 2**31,
        STATS=stats,
        num_warps=FLAT_NUM_WARPS if flat else ROWS_NUM_WARPS,
    ), (grid,)


def _launch_guard(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    count: torch.Tensor | None,
    stats: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The launch itself, on checked arguments: returns the two new tensors."""
    rows, cols = topk_ids.shape
    device = topk_ids.device
    if triton_backend(device) == "torch-reference":
        if stats is not None:
            stats[:STATS_SLOTS] += guard_stats_reference(topk_ids, topk_weights, num_experts, count)
        return guard_routing_reference(topk_ids, topk_weights, num_experts, count)
    out_ids = torch.empty((rows, cols), dtype=topk_ids.dtype, device=device)
    out_w = torch.empty((rows, cols), dtype=topk_weights.dtype, device=device)
    if rows == 0 or cols == 0:
        if stats is not None:  # the call counts; it changes nothing
            stats[STAT_CALLS] += 1
        return out_ids, out_w
    s_ids, s_w = topk_ids.stride(), topk_weights.stride()
    flat = topk_ids.is_contiguous() and topk_weights.is_contiguous()
    kernel, grid = guard_program(rows, cols, flat, count is not None, stats is not None)
    with device_guard(device):
        kernel(
            grid,
            topk_ids,
            topk_weights,
            topk_ids if count is None else count,  # placeholder when absent: never read
            out_ids,
            out_w,
            topk_ids if stats is None else stats,  # placeholder when absent: never read
            rows,
            cols,
            s_ids[0],
            s_ids[1],
            s_w[0],
            s_w[1],
            num_experts,
        )
    return out_ids, out_w


# ``stats`` has no default on purpose: torch 2.10 and 2.11 drop an argument that equals its
# default before bumping the version of each mutated argument, and then fail with
# IndexError on a mutated ``Tensor?`` passed as None (under torch.compile, or any call
# through the op). Without a default every caller passes it and nothing is dropped.
@torch.library.custom_op("sglang_amd_moe::guard_routing", mutates_args=("stats",))
def _guard_routing_op(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    num_local_tokens: torch.Tensor | None,
    stats: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch_guard(topk_ids, topk_weights, num_experts, num_local_tokens, stats)


@_guard_routing_op.register_fake
def _guard_routing_fake(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    num_local_tokens: torch.Tensor | None,
    stats: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = topk_ids.shape
    return (
        topk_ids.new_empty((rows, cols)),
        topk_weights.new_empty((rows, cols)),
    )


# Direct programs by call signature (see guard_routing).
_DIRECT: dict[tuple, PairProgram] = {}


def guard_routing(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    num_local_tokens: torch.Tensor | None = None,
    stats: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """New ``(ids, weights)`` that aiter's MoE can take; the inputs are never written.

    Entry ``(r, k)`` keeps its id and its weight's bits when ``0 <= topk_ids[r, k] <
    num_experts`` and, with a count, ``r < n``; otherwise it becomes id 0, weight 0.
    ``n`` is ``num_local_tokens`` (a 1-element int32/int64 tensor on the routing tensors'
    device, read on the device, clamped to ``[0, M]``); ``None``: no row is padded.

    ``topk_ids`` int32 or int64 and ``topk_weights`` float32, bfloat16 or float16, both
    ``[M, K]`` on one device, any strides; ``num_experts`` an int in ``[1, 2**31 - 1]``.
    The outputs are contiguous, of the inputs' dtypes, memory no other tensor uses
    (eagerly, small ones are views of a slab shared with other calls' outputs: see
    :class:`~sglang_amd_moe.kernels.utils.PairProgram`). Bad inputs raise
    ``TypeError``/``ValueError`` before anything is launched. No host synchronization;
    capturable in a CUDA/HIP graph.

    ``stats``: counters the same launch adds to (a contiguous int64 tensor of at least 4
    elements on the routing tensors' device, kept by the caller: a captured graph adds
    to it on every replay): the call, the entries changed because their id is out of
    range, the entries of rows past the count it changed, and of the first, those in
    rows the count marks as real (see ``reference.guard_stats_reference``).
    """
    key = program = None
    if direct_calls_allowed():
        try:
            # One flat key of plain values (ints, dtypes, bools: cheap to hash), without
            # the row count: the checks do not depend on it, and the launch only through
            # whether it is 0, 1 or more (a single row is contiguous whatever its row
            # stride). A tensor that is not 2-D fails to unpack and takes the full path,
            # which says why.
            rows, cols = topk_ids.shape
            w_rows, w_cols = topk_weights.shape
            count = num_local_tokens
            key = (
                rows if rows < 2 else 2, cols, *topk_ids.stride(), topk_ids.dtype,
                topk_ids.get_device(), topk_ids.is_cuda, w_rows == rows, w_cols,
                *topk_weights.stride(), topk_weights.dtype, topk_weights.get_device(),
                topk_weights.is_cuda, type(num_experts), num_experts,
                None if count is None else (
                    count.numel(), count.dtype, count.get_device(), count.is_cuda
                ),
                None if stats is None else (
                    stats.numel(), stats.dtype, stats.get_device(), stats.is_cuda,
                    stats.is_contiguous(),
                ),
            )  # fmt: skip
            program = _DIRECT.get(key)
        except Exception:  # noqa: BLE001 - not tensors, or unhashable: the full path says why
            key = program = None
        if program is not None:
            p_ids, p_w = topk_ids.data_ptr(), topk_weights.data_ptr()
            p_count = p_ids if count is None else count.data_ptr()  # placeholder: never read
            p_stats = p_ids if stats is None else stats.data_ptr()  # likewise
            # The inputs are only read and the outputs are the program's own: alignment
            # is all that depends on the addresses.
            if not (p_ids | p_w | p_count | p_stats) & 15 and hip_buffers_small(
                topk_ids, topk_weights
            ):
                entry = program.entry(rows)
                if entry is not None:
                    return program(entry, rows, p_ids, p_w, p_count, p_stats)
    count, num_experts = check_guard_call(topk_ids, topk_weights, num_experts, num_local_tokens)
    stats = check_stats("stats", stats, topk_ids.device)
    if torch.compiler.is_compiling():
        return _guard_routing_op(topk_ids, topk_weights, num_experts, count, stats)
    # Eagerly (and under graph capture), skip the dispatcher: it costs more host time
    # than the launch itself.
    if key is None:
        return _launch_guard(topk_ids, topk_weights, num_experts, count, stats)
    # The first call of this signature, or of a row count whose tile is new to its
    # program: launch, and keep the launch in the program.
    with capture_launches() as launches:
        out_ids, out_w = _launch_guard(topk_ids, topk_weights, num_experts, count, stats)
    placeholder = topk_ids if count is None else count
    tensors = [topk_ids, topk_weights, placeholder, out_ids, out_w]
    tensors.append(topk_ids if stats is None else stats)
    direct = launch_and_take(launches, topk_ids.device, tensors)
    # The hit path passes the addresses in the kernel's order: ids, weights, count (or
    # the ids' again), the two outputs, then the counters (or the ids' again).
    if (
        direct is None
        or len(direct) != 1
        or direct[0].slots
        not in ((0, 1, 2, 3, 4, 5), (0, 1, 0, 3, 4, 5), (0, 1, 2, 3, 4, 0), (0, 1, 0, 3, 4, 0))
    ):
        return out_ids, out_w
    if program is None:
        device = topk_ids.device
        flat = topk_ids.is_contiguous() and topk_weights.is_contiguous()
        program = PairProgram(
            device.index if device.index is not None else 0,
            cols, flat, FLAT_BLOCK, ROWS_BLOCK, out_ids, out_w,
        )  # fmt: skip
        if program.add(rows, direct[0]):
            bounded_put(_DIRECT, key, program)
    else:
        program.add(rows, direct[0])
    return out_ids, out_w

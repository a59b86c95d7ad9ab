"""Mask the padded rows of MoE routing in place: one Triton launch for ids and weights.

Why this exists: with CUDA/HIP graphs a decode batch of ``n`` real tokens is padded to
a captured size ``M``, and the router output of rows ``>= n`` is garbage. aiter's MoE
kernels on AMD cannot take -1 or out-of-range expert ids, so every padded row must
carry a valid id (``fill_value``, normally 0) and a zero weight. SGLang does this with
two launches (ids, then weights) or, in older releases, with several eager ops; this
does both tensors in one launch.

The count ``n`` is read on the device and clamped to ``[0, M]``, so a captured graph
can be replayed with a new count; the launch allocates nothing and never synchronizes
with the host. The grid depends only on the shapes: each program covers ``BLOCK_M``
rows and every column (``next_pow2(topk)``), or, for contiguous tensors, a run of
consecutive elements; a program whose elements are all real writes nothing.

It is a ``torch.library`` custom op (``torch.ops.sglang_amd_moe.mask_padded_rows``)
mutating both tensors, with a fake implementation, so ``torch.compile`` can trace
through it. On the CPU it runs the Triton kernel through the interpreter when Triton
was imported with ``TRITON_INTERPRET=1``, and the plain-torch reference otherwise.

Host cost: the first eager call of a signature (column count, strides, dtypes, devices,
fill value, and whether there are 0, 1 or more rows) runs the full checks and keeps a
direct program (:class:`~sglang_amd_moe.kernels.utils.RowsProgram`) that serves every
row count; later calls of that signature read the three addresses, check their
alignment and (when they or the row count changed) that the two routing tensors and the
count do not overlap, compute the grid from the row count and launch the compiled kernel
with integer pointers. A row count whose tile differs from every one launched before
(the tile shrinks while the whole tensor fits in less than one; int64 offsets from
``2**31`` elements) takes the full path once. It allocates nothing.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._validate import check_mask_call, check_mask_disjoint, check_stats
from .reference import (
    STAT_CALLS,
    STATS_SLOTS,
    mask_padded_rows_reference_,
    mask_stats_reference,
)
from .utils import (
    KernelLauncher,
    RowsProgram,
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

# Elements per program: small enough that a program finishes in well under a
# microsecond, large enough that M = 4096 needs few programs. FLAT_BLOCK for contiguous
# tensors (consecutive elements), ROWS_BLOCK for strided rows (rows x padded columns).
FLAT_BLOCK = 512
ROWS_BLOCK = 512
# Flat path: 8 warps (2 elements per thread) measured fastest on an H200 at every M
# (1.21-1.49 us in graph replay, against 1.23-1.52 with 4 warps); strided path: 4.
FLAT_NUM_WARPS = 8
ROWS_NUM_WARPS = 4


@triton.jit(do_not_specialize=["num_rows"])
def _mask_padded_rows_kernel(
    ids_ptr,
    weights_ptr,
    count_ptr,
    stats_ptr,
    num_rows,
    num_cols,
    stride_ids,
    stride_weights,
    fill_value,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CONTIGUOUS: tl.constexpr,
    INT64_OFFSETS: tl.constexpr,
    STATS: tl.constexpr,
):
    """Each program reads the count ``n`` and writes ``fill_value`` / 0 into the
    elements of its tile that lie in padded rows (rows ``>= n``); nothing else.

    ``CONTIGUOUS`` (both tensors contiguous): program ``p`` covers elements
    ``[p * BLOCK_M * BLOCK_K, (p + 1) * BLOCK_M * BLOCK_K)`` of the flattened tensors,
    and the padded rows are the one range ``[n * num_cols, num_rows * num_cols)``.
    Otherwise program ``p`` covers rows ``[p * BLOCK_M, (p + 1) * BLOCK_M)``, each with
    its ``BLOCK_K >= num_cols`` columns, at each tensor's own row stride.
    ``INT64_OFFSETS``: the tensors have ``2**31`` elements or more.

    ``STATS``: also add to the int64 counters at ``stats_ptr`` (see
    ``reference.mask_stats_reference``): program 0 counts the call, and each program
    the padded entries it changes (id not ``fill_value`` or weight not 0), one relaxed
    atomic and only when not zero. On the contiguous path the tile is read before the
    count is known (the loads do not wait for it), so counting adds no round trip.
    """
    if CONTIGUOUS:
        # Offsets are int32 unless the tensors are that large, and the stores are
        # masked rather than branched around: both measured a little faster on an
        # H200, and a program whose elements are all real then writes nothing.
        # Clamp in int64 before narrowing: an int64 count past 2**31 must not wrap.
        n = tl.minimum(tl.maximum(tl.load(count_ptr).to(tl.int64), 0), num_rows)
        if INT64_OFFSETS:
            start = tl.program_id(0).to(tl.int64) * (BLOCK_M * BLOCK_K)
        else:
            n = n.to(tl.int32)
            start = tl.program_id(0) * (BLOCK_M * BLOCK_K)
        offs = start + tl.arange(0, BLOCK_M * BLOCK_K)
        if STATS:
            inside = offs < num_rows * num_cols
            old_ids = tl.load(ids_ptr + offs, mask=inside, other=0)
            old_w = tl.load(weights_ptr + offs, mask=inside, other=0)
        mask = (offs >= n * num_cols) & (offs < num_rows * num_cols)
        if STATS:
            changed = mask & ((old_ids.to(tl.int64) != fill_value) | (old_w != 0))
            n_changed = tl.sum(changed.to(tl.int32)).to(tl.int64)
            tl.atomic_add(stats_ptr + 2, n_changed, mask=n_changed > 0, sem="relaxed")
        ids = tl.zeros([BLOCK_M * BLOCK_K], dtype=ids_ptr.dtype.element_ty) + fill_value
        tl.store(ids_ptr + offs, ids.to(ids_ptr.dtype.element_ty), mask=mask)
        zeros = tl.zeros([BLOCK_M * BLOCK_K], dtype=weights_ptr.dtype.element_ty)
        tl.store(weights_ptr + offs, zeros, mask=mask)
    else:
        n = tl.load(count_ptr).to(tl.int64)
        n = tl.minimum(tl.maximum(n, 0), num_rows)
        row0 = tl.program_id(0) * BLOCK_M
        # Programs whose rows are all real (the common case) write nothing.
        if row0 + BLOCK_M > n:
            rows = row0 + tl.arange(0, BLOCK_M)
            cols = tl.arange(0, BLOCK_K)
            mask = ((rows >= n) & (rows < num_rows))[:, None] & (cols < num_cols)[None, :]
            rows64 = rows.to(tl.int64)[:, None]
            if STATS:
                old_ids = tl.load(ids_ptr + rows64 * stride_ids + cols[None, :], mask=mask, other=0)
                old_w = tl.load(
                    weights_ptr + rows64 * stride_weights + cols[None, :], mask=mask, other=0
                )
                changed = mask & ((old_ids.to(tl.int64) != fill_value) | (old_w != 0))
                n_changed = tl.sum(changed.to(tl.int32)).to(tl.int64)
                tl.atomic_add(stats_ptr + 2, n_changed, mask=n_changed > 0, sem="relaxed")
            ids = tl.zeros([BLOCK_M, BLOCK_K], dtype=ids_ptr.dtype.element_ty) + fill_value
            tl.store(
                ids_ptr + rows64 * stride_ids + cols[None, :],
                ids.to(ids_ptr.dtype.element_ty),
                mask=mask,
            )
            zeros = tl.zeros([BLOCK_M, BLOCK_K], dtype=weights_ptr.dtype.element_ty)
            tl.store(weights_ptr + rows64 * stride_weights + cols[None, :], zeros, mask=mask)
    if STATS:
        one = tl.full([], 1, tl.int64)
        tl.atomic_add(stats_ptr, one, mask=tl.program_id(0) == 0, sem="relaxed")


def mask_launch_config(num_rows: int, num_cols: int, flat: bool = False) -> tuple[int, int, int]:
    """``(grid, BLOCK_M, BLOCK_K)`` for a ``[num_rows, num_cols]`` routing tensor.

    ``flat`` (both tensors contiguous: the kernel's ``CONTIGUOUS`` path): each program
    covers ``BLOCK_M * BLOCK_K`` consecutive elements (``BLOCK_K`` is 1). Otherwise
    ``BLOCK_M`` rows of ``next_pow2(num_cols)`` columns.
    """
    return rows_launch_config(num_rows, num_cols, flat, FLAT_BLOCK, ROWS_BLOCK)


@functools.lru_cache(maxsize=4096)
def mask_program(
    num_rows: int, num_cols: int, contiguous: bool, stats: bool = False
) -> tuple[KernelLauncher, tuple[int]]:
    """The launcher (constants bound) and grid for one shape, built once and cached."""
    grid, block_m, block_k = mask_launch_config(num_rows, num_cols, contiguous)
    return launcher(
        _mask_padded_rows_kernel,
        BLOCK_M=block_m,
        BLOCK_K=block_k,
        CONTIGUOUS=contiguous,
        INT64_OFFSETS=num_rows * num_cols >= 2**31,
        STATS=stats,
        num_warps=FLAT_NUM_WARPS if contiguous else ROWS_NUM_WARPS,
    ), (grid,)


def _launch_mask(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_token_non_padded: torch.Tensor,
    fill_value: int,
    num_rows: int,
    num_cols: int,
    stride_ids: int,
    stride_weights: int,
    stats: torch.Tensor | None = None,
) -> None:
    """The launch itself, on checked arguments (and their shape and row strides)."""
    if num_rows == 0 or num_cols == 0:
        if stats is not None:  # the call counts; it changes nothing
            stats[STAT_CALLS] += 1
        return
    device = topk_ids.device
    if triton_backend(device) == "torch-reference":
        if stats is not None:
            stats[:STATS_SLOTS] += mask_stats_reference(
                topk_ids, topk_weights, num_token_non_padded, fill_value
            )
        mask_padded_rows_reference_(topk_ids, topk_weights, num_token_non_padded, fill_value)
        return
    contiguous = stride_ids == num_cols and stride_weights == num_cols
    kernel, grid = mask_program(num_rows, num_cols, contiguous, stats is not None)
    with device_guard(device):
        kernel(
            grid,
            topk_ids,
            topk_weights,
            num_token_non_padded,
            num_token_non_padded if stats is None else stats,  # placeholder: never read
            num_rows,
            num_cols,
            stride_ids,
            stride_weights,
            fill_value,
        )


# ``stats`` has no default on purpose: torch 2.10 and 2.11 drop an argument that equals its
# default before bumping the version of each mutated argument, and then fail with
# IndexError on a mutated ``Tensor?`` passed as None (under torch.compile, or any call
# through the op). Without a default every caller passes it and nothing is dropped.
@torch.library.custom_op(
    "sglang_amd_moe::mask_padded_rows", mutates_args=("topk_ids", "topk_weights", "stats")
)
def _mask_padded_rows_op(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_token_non_padded: torch.Tensor,
    fill_value: int,
    stats: torch.Tensor | None,
) -> None:
    # Under torch.compile the caller's checks ran on fake tensors, which have no memory:
    # check the overlap here, on the real ones.
    check_mask_disjoint(topk_ids, topk_weights, num_token_non_padded)
    rows, cols = topk_ids.shape
    _launch_mask(
        topk_ids, topk_weights, num_token_non_padded, fill_value,
        rows, cols, topk_ids.stride(0), topk_weights.stride(0), stats,
    )  # fmt: skip


@_mask_padded_rows_op.register_fake
def _mask_padded_rows_fake(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_token_non_padded: torch.Tensor,
    fill_value: int,
    stats: torch.Tensor | None,
) -> None:
    return None


class MaskProgram(RowsProgram):
    """The mask's :class:`~sglang_amd_moe.kernels.utils.RowsProgram`, with what a hit
    needs to tell that the call's two routing tensors and its count do not overlap: each
    routing tensor's row pitch and row width in bytes, and the count's size."""

    __slots__ = ("ids_pitch", "ids_width", "w_pitch", "w_width", "count_size", "last")

    def __init__(
        self,
        index: int,
        cols: int,
        contiguous: bool,
        ids: torch.Tensor,
        stride_ids: int,
        weights: torch.Tensor,
        stride_w: int,
        count: torch.Tensor,
    ) -> None:
        super().__init__(index, cols, contiguous, FLAT_BLOCK, ROWS_BLOCK, True)
        self.ids_pitch, self.ids_width = stride_ids * ids.element_size(), cols * ids.element_size()
        self.w_pitch, self.w_width = (
            stride_w * weights.element_size(),
            cols * weights.element_size(),
        )
        self.count_size = count.element_size()
        self.last: tuple | None = None  # addresses and row count of the last clear call

    def clear(self, p_ids: int, p_w: int, p_count: int, rows: int) -> bool:
        """Whether the addresses are 16-byte aligned and the spans of ``rows`` rows of the
        routing tensors and the count's are apart (spans that overlap go to the full
        path, which checks byte-exactly)."""
        call = (p_ids, p_w, p_count, rows)
        if call == self.last:
            return True
        if (p_ids | p_w | p_count) & 15:
            return False
        ids_end = p_ids + (rows - 1) * self.ids_pitch + self.ids_width
        w_end = p_w + (rows - 1) * self.w_pitch + self.w_width
        count_end = p_count + self.count_size
        if (
            (ids_end <= p_w or w_end <= p_ids)
            and (ids_end <= p_count or count_end <= p_ids)
            and (w_end <= p_count or count_end <= p_w)
        ):
            self.last = call
            return True
        return False


# Direct programs by call signature (see mask_padded_rows_).
_DIRECT: dict[tuple, MaskProgram] = {}


def mask_padded_rows_(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_token_non_padded: torch.Tensor | None,
    fill_value: int = 0,
    stats: torch.Tensor | None = None,
) -> None:
    """In place: rows ``r >= n`` get ``topk_ids[r, :] = fill_value``, ``topk_weights[r, :] = 0``.

    ``n`` is ``num_token_non_padded`` (a 1-element int32/int64 tensor on the routing
    tensors' device), read on the device and clamped to ``[0, rows]``; ``None`` means
    no padding and does nothing. ``topk_ids`` is int32 or int64, ``topk_weights``
    float32, bfloat16 or float16; both ``[rows, topk]`` with unit column stride (the
    row stride may differ, e.g. a column slice of a wider buffer). Bad inputs raise
    ``TypeError``/``ValueError`` before anything is launched or written.

    ``stats``: counters the same launch adds to (a contiguous int64 tensor of at least 4
    elements on the routing tensors' device, kept by the caller): the call, and the
    entries of padded rows it changed (see ``reference.mask_stats_reference``).
    """
    key = program = None
    if num_token_non_padded is not None and direct_calls_allowed():
        try:
            # One flat key of plain values (ints, dtypes, bools: cheap to hash), without
            # the row count: the checks depend on it only through whether it is 0, 1 or
            # more (a single row may have any row stride) and through the spans, which a
            # hit checks. A tensor that is not 2-D fails to unpack and takes the full
            # path, which says why.
            rows, cols = topk_ids.shape
            w_rows, w_cols = topk_weights.shape
            count = num_token_non_padded
            key = (
                rows if rows < 2 else 2, cols, *topk_ids.stride(), topk_ids.dtype,
                topk_ids.get_device(), topk_ids.is_cuda, w_rows == rows, w_cols,
                *topk_weights.stride(), topk_weights.dtype, topk_weights.get_device(),
                topk_weights.is_cuda, count.numel(), count.dtype, count.get_device(),
                count.is_cuda, type(fill_value), fill_value,
                None if stats is None else (
                    stats.numel(), stats.dtype, stats.get_device(), stats.is_cuda,
                    stats.is_contiguous(),
                ),
            )  # fmt: skip
            program = _DIRECT.get(key)
        except Exception:  # noqa: BLE001 - not tensors, or unhashable: the full path says why
            key = program = None
        if program is not None:
            entry = program.entry(rows)
            p_ids, p_w, p_count = topk_ids.data_ptr(), topk_weights.data_ptr(), count.data_ptr()
            # The counters are only added to atomically: alignment is all a hit checks.
            p_stats = p_count if stats is None else stats.data_ptr()
            if (
                entry is not None
                and not p_stats & 15
                and program.clear(p_ids, p_w, p_count, rows)
                and hip_buffers_small(topk_ids, topk_weights, count)
            ):
                program.launch(entry, rows, p_ids, p_w, p_count, p_stats)
                return
    count, rows, cols, stride_ids, stride_w = check_mask_call(
        topk_ids, topk_weights, num_token_non_padded, fill_value
    )
    if count is None:
        return
    stats = check_stats("stats", stats, topk_ids.device)
    if torch.compiler.is_compiling():
        # Traced by torch.compile: the custom op tells it both tensors are mutated.
        _mask_padded_rows_op(topk_ids, topk_weights, count, int(fill_value), stats)
        return
    # Eagerly (prefill, and graph capture), skip the dispatcher: going through the
    # custom op costs ~30 us of host time per call, more than the launch itself.
    args = (
        topk_ids, topk_weights, count, int(fill_value), rows, cols, stride_ids, stride_w, stats
    )  # fmt: skip
    if key is None:
        _launch_mask(*args)
        return
    # The first call of this signature, or of a row count whose tile is new to its
    # program: launch, and keep the launch in the program.
    with capture_launches() as launches:
        _launch_mask(*args)
    tensors = [topk_ids, topk_weights, count, count if stats is None else stats]
    direct = launch_and_take(launches, topk_ids.device, tensors)
    if direct is None or len(direct) != 1 or direct[0].slots not in ((0, 1, 2, 3), (0, 1, 2, 2)):
        return
    if program is None:
        index = topk_ids.device.index if topk_ids.device.index is not None else 0
        contiguous = stride_ids == cols and stride_w == cols
        program = MaskProgram(
            index, cols, contiguous, topk_ids, stride_ids, topk_weights, stride_w, count
        )
        if program.add(rows, direct[0]):
            bounded_put(_DIRECT, key, program)
    else:
        program.add(rows, direct[0])

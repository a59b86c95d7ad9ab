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
rows and every column (``next_pow2(topk)``), and a program whose rows are all real
writes nothing.

It is a ``torch.library`` custom op (``torch.ops.sglang_amd_moe.mask_padded_rows``)
mutating both tensors, with a fake implementation, so ``torch.compile`` can trace
through it. On the CPU it runs the Triton kernel through the interpreter when Triton
was imported with ``TRITON_INTERPRET=1``, and the plain-torch reference otherwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._validate import check_mask_args
from .reference import mask_padded_rows_reference_
from .utils import device_guard, launch, triton_backend

# Elements per program: small enough that a program finishes in well under a
# microsecond, large enough that M = 4096 needs few programs. FLAT_BLOCK for contiguous
# tensors (consecutive elements), ROWS_BLOCK for strided rows (rows x padded columns).
FLAT_BLOCK = 512
ROWS_BLOCK = 512
# Flat path: 8 warps (2 elements per thread) measured fastest on an H200 at every M
# (1.21-1.49 us in graph replay, against 1.23-1.52 with 4 warps); strided path: 4.
FLAT_NUM_WARPS = 8
ROWS_NUM_WARPS = 4


@triton.jit
def _mask_padded_rows_kernel(
    ids_ptr,
    weights_ptr,
    count_ptr,
    num_rows,
    num_cols,
    stride_ids,
    stride_weights,
    fill_value,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FLAT: tl.constexpr,
    WIDE: tl.constexpr,
):
    if FLAT:
        # Both tensors are contiguous: the padded rows are one contiguous range of
        # elements [n * cols, rows * cols); BLOCK_M * BLOCK_K elements per program.
        # Offsets are int32 unless the tensors have 2**31 elements or more (WIDE), and
        # the stores are masked rather than branched around: both measured a little
        # faster, and a program whose elements are all real then writes nothing.
        # Clamp in int64 before narrowing: an int64 count past 2**31 must not wrap.
        n = tl.minimum(tl.maximum(tl.load(count_ptr).to(tl.int64), 0), num_rows)
        if WIDE:
            start = tl.program_id(0).to(tl.int64) * (BLOCK_M * BLOCK_K)
        else:
            n = n.to(tl.int32)
            start = tl.program_id(0) * (BLOCK_M * BLOCK_K)
        offs = start + tl.arange(0, BLOCK_M * BLOCK_K)
        mask = (offs >= n * num_cols) & (offs < num_rows * num_cols)
        ids = tl.zeros([BLOCK_M * BLOCK_K], dtype=ids_ptr.dtype.element_ty) + fill_value
        tl.store(ids_ptr + offs, ids.to(ids_ptr.dtype.element_ty), mask=mask)
        zeros = tl.zeros([BLOCK_M * BLOCK_K], dtype=weights_ptr.dtype.element_ty)
        tl.store(weights_ptr + offs, zeros, mask=mask)
    else:
        n = tl.load(count_ptr).to(tl.int64)
        n = tl.minimum(tl.maximum(n, 0), num_rows)
        # Strided rows (e.g. column slices): BLOCK_M rows x next_pow2(cols) per program.
        row0 = tl.program_id(0) * BLOCK_M
        # Programs whose rows are all real (the common case) write nothing.
        if row0 + BLOCK_M > n:
            rows = row0 + tl.arange(0, BLOCK_M)
            cols = tl.arange(0, BLOCK_K)
            mask = ((rows >= n) & (rows < num_rows))[:, None] & (cols < num_cols)[None, :]
            rows64 = rows.to(tl.int64)[:, None]
            ids = tl.zeros([BLOCK_M, BLOCK_K], dtype=ids_ptr.dtype.element_ty) + fill_value
            tl.store(
                ids_ptr + rows64 * stride_ids + cols[None, :],
                ids.to(ids_ptr.dtype.element_ty),
                mask=mask,
            )
            zeros = tl.zeros([BLOCK_M, BLOCK_K], dtype=weights_ptr.dtype.element_ty)
            tl.store(weights_ptr + rows64 * stride_weights + cols[None, :], zeros, mask=mask)


def mask_launch_config(
    num_rows: int, num_cols: int, flat: bool = False
) -> tuple[int, int, int]:
    """``(grid, BLOCK_M, BLOCK_K)`` for a ``[num_rows, num_cols]`` routing tensor.

    ``flat`` (both tensors contiguous): each program covers ``BLOCK_M * BLOCK_K``
    consecutive elements (``BLOCK_K`` is 1). Otherwise ``BLOCK_M`` rows of
    ``next_pow2(num_cols)`` columns.
    """
    if flat:
        block = min(FLAT_BLOCK, triton.next_power_of_2(max(num_rows * num_cols, 1)))
        return triton.cdiv(num_rows * num_cols, block), block, 1
    block_k = triton.next_power_of_2(max(num_cols, 1))
    block_m = max(1, min(triton.next_power_of_2(max(num_rows, 1)), ROWS_BLOCK // block_k))
    return triton.cdiv(num_rows, block_m), block_m, block_k


def _launch_mask(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_token_non_padded: torch.Tensor,
    fill_value: int,
) -> None:
    """The launch itself, on checked arguments (the custom op's body)."""
    num_rows, num_cols = topk_ids.shape
    if num_rows == 0 or num_cols == 0:
        return
    if triton_backend(topk_ids.device) == "torch-reference":
        mask_padded_rows_reference_(topk_ids, topk_weights, num_token_non_padded, fill_value)
        return
    flat = topk_ids.stride(0) == num_cols and topk_weights.stride(0) == num_cols
    grid, block_m, block_k = mask_launch_config(num_rows, num_cols, flat)
    with device_guard(topk_ids.device):
        launch(
            _mask_padded_rows_kernel,
            (grid,),
            topk_ids,
            topk_weights,
            num_token_non_padded,
            num_rows,
            num_cols,
            topk_ids.stride(0),
            topk_weights.stride(0),
            fill_value,
            BLOCK_M=block_m,
            BLOCK_K=block_k,
            FLAT=flat,
            WIDE=num_rows * num_cols >= 2**31,
            num_warps=FLAT_NUM_WARPS if flat else ROWS_NUM_WARPS,
        )


@torch.library.custom_op(
    "sglang_amd_moe::mask_padded_rows", mutates_args=("topk_ids", "topk_weights")
)
def _mask_padded_rows_op(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_token_non_padded: torch.Tensor,
    fill_value: int,
) -> None:
    _launch_mask(topk_ids, topk_weights, num_token_non_padded, fill_value)


@_mask_padded_rows_op.register_fake
def _mask_padded_rows_fake(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_token_non_padded: torch.Tensor,
    fill_value: int,
) -> None:
    return None


def mask_padded_rows_(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_token_non_padded: torch.Tensor | None,
    fill_value: int = 0,
) -> None:
    """In place: rows ``r >= n`` get ``topk_ids[r, :] = fill_value``, ``topk_weights[r, :] = 0``.

    ``n`` is ``num_token_non_padded`` (a 1-element int32/int64 tensor on the routing
    tensors' device), read on the device and clamped to ``[0, rows]``; ``None`` means
    no padding and does nothing. ``topk_ids`` is int32 or int64, ``topk_weights``
    float32, bfloat16 or float16; both ``[rows, topk]`` with unit column stride (the
    row stride may differ, e.g. a column slice of a wider buffer). Bad inputs raise
    ``TypeError``/``ValueError`` before anything is launched or written.
    """
    count = check_mask_args(topk_ids, topk_weights, num_token_non_padded, fill_value)
    if count is None:
        return
    if torch.compiler.is_compiling():
        # Traced by torch.compile: the custom op tells it both tensors are mutated.
        _mask_padded_rows_op(topk_ids, topk_weights, count, int(fill_value))
    else:
        # Eagerly (prefill, and graph capture), skip the dispatcher: going through the
        # custom op costs ~30 us of host time per call, more than the launch itself.
        _launch_mask(topk_ids, topk_weights, count, int(fill_value))

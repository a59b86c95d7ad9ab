"""The device-side count behind the real-server run's ``topk_after_hook`` record.

Loaded by ``sitecustomize`` (from this folder, on first use in a process that captures
CUDA graphs) so that Triton is imported only where a graph is captured. One launch per
``TopK`` call: it reads the expert ids and weights ``TopK`` hands the MoE and the real
token count of the replay, and adds, for three groups of entries (padded rows' routed
columns, padded rows' appended shared-expert columns, real rows' shared-expert columns),
how many there were, how many ids fall outside ``[0, bound)``, how many weights are not
zero (NaN counts as not zero; both signs of zero count as zero), and the id range. The
counts accumulate over every replay in one int32 tensor; nothing is synchronised.
"""

from __future__ import annotations

import triton
import triton.language as tl

GROUPS = ("padded_routed", "padded_shared", "real_shared")
FIELDS = ("entries", "ids_out_of_range", "weights_nonzero", "id_min", "id_max")
ID_LIMIT = 2**31 - 1  # ids are clamped to +-ID_LIMIT for the range (int32 garbage fits)


@triton.jit
def _accumulate(out, sel, bad, nonzero, ids32):
    tl.atomic_add(out, tl.sum(sel.to(tl.int32)))
    tl.atomic_add(out + 1, tl.sum((sel & bad).to(tl.int32)))
    tl.atomic_add(out + 2, tl.sum((sel & nonzero).to(tl.int32)))
    tl.atomic_min(out + 3, tl.min(tl.where(sel, ids32, 2147483647)))
    tl.atomic_max(out + 4, tl.max(tl.where(sel, ids32, -2147483647)))


@triton.jit
def _count_topk_rows(
    ids_ptr,
    weight_bits_ptr,
    count_ptr,
    out_ptr,
    m,
    k,
    k_routed,
    bound,
    stride_ids,
    stride_w,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_K)
    inside = (rows[:, None] < m) & (cols[None, :] < k)
    ids = tl.load(ids_ptr + rows[:, None] * stride_ids + cols[None, :], mask=inside, other=0)
    ids = ids.to(tl.int64)
    bits = tl.load(weight_bits_ptr + rows[:, None] * stride_w + cols[None, :], mask=inside, other=0)
    padded = inside & (rows[:, None] >= tl.load(count_ptr))
    shared = (cols >= k_routed)[None, :]
    bad = (ids < 0) | (ids >= bound)
    nonzero = (bits & 0x7FFFFFFF) != 0
    ids32 = tl.minimum(tl.maximum(ids, -2147483647), 2147483647).to(tl.int32)
    _accumulate(out_ptr, padded & ~shared, bad, nonzero, ids32)
    _accumulate(out_ptr + 5, padded & shared, bad, nonzero, ids32)
    _accumulate(out_ptr + 10, inside & ~padded & shared, bad, nonzero, ids32)


def new_counts(device):
    """A zeroed int32[len(GROUPS), len(FIELDS)] count tensor (ranges start empty)."""
    import torch

    t = torch.zeros(len(GROUPS), len(FIELDS), dtype=torch.int32, device=device)
    t[:, 3] = ID_LIMIT
    t[:, 4] = -ID_LIMIT
    return t


def count_topk_rows(ids, weights, count, out, num_shared: int, bound: int) -> None:
    """Add one ``TopK`` output to ``out``: ``ids``/``weights`` [m, k], the last
    ``num_shared`` columns the fused shared experts, rows at and past ``count[0]`` padded."""
    import torch

    m, k = ids.shape
    if m == 0:
        return
    bits = (weights if weights.dtype == torch.float32 else weights.float()).view(torch.int32)
    block_m = 64
    _count_topk_rows[(triton.cdiv(m, block_m),)](
        ids,
        bits,
        count,
        out,
        m,
        k,
        k - num_shared,
        bound,
        ids.stride(0),
        bits.stride(0),
        BLOCK_M=block_m,
        BLOCK_K=max(2, triton.next_power_of_2(k)),
    )


def as_record(rows: list[list[int]]) -> dict:
    """The counts as the record shows them (an empty group's range is None)."""
    doc = {}
    for group, row in zip(GROUPS, rows, strict=True):
        entry = dict(zip(FIELDS, row, strict=True))
        if not entry["entries"]:
            entry["id_min"] = entry["id_max"] = None
        doc[group] = entry
    return doc

"""Plain-torch references for the Triton kernels: slow, simple, obviously right.

They define what the kernels must write; the CPU tests compare the kernels with them
bit for bit, and the kernels fall back to them on the CPU when the Triton interpreter
is off.

The mask and guard references are a few torch ops that read the count on the device:
no host synchronization, so they can be captured in a CUDA/HIP graph and replayed with
new counts, and serve as a fallback on the call's own device. The sort reference reads
the count with ``.item()`` (a host sync) and loops in Python: never use it on a hot
path or inside a CUDA graph.
"""

from __future__ import annotations

import torch

from ._validate import check_guard_call, check_mask_args, check_sort_args
from .utils import real_rows


def _real_row_mask(count: torch.Tensor, num_rows: int) -> torch.Tensor:
    """``[num_rows, 1]`` bools: row ``r`` is real (``r < count``, the count clamped to
    ``[0, num_rows]``), computed on the count's device without reading it on the host."""
    n = count.reshape(()).to(torch.int64).clamp(0, num_rows)
    return (torch.arange(num_rows, device=count.device) < n).unsqueeze(1)


def mask_padded_rows_reference_(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_token_non_padded: torch.Tensor | None,
    fill_value: int = 0,
) -> None:
    """Rows ``r >= n`` get ``topk_ids[r, :] = fill_value`` and ``topk_weights[r, :] = 0``.

    ``n`` is ``num_token_non_padded`` clamped to ``[0, rows]``, read on the device;
    ``None`` means no padding.
    """
    count = check_mask_args(topk_ids, topk_weights, num_token_non_padded, fill_value)
    if count is None:
        return
    padded = ~_real_row_mask(count, topk_ids.shape[0])
    topk_ids.masked_fill_(padded, fill_value)
    topk_weights.masked_fill_(padded, 0)


def guard_routing_reference(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    num_local_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """New contiguous ``(ids, weights)``: entry ``(r, k)`` keeps its id and weight when
    ``0 <= id < num_experts`` and (with a count) ``r < n``, else id 0 and weight 0.

    ``n`` is ``num_local_tokens`` clamped to ``[0, rows]``, read on the device; ``None``
    means no padded row. The inputs are not written.
    """
    count, num_experts = check_guard_call(topk_ids, topk_weights, num_experts, num_local_tokens)
    valid = (topk_ids >= 0) & (topk_ids < num_experts)
    if count is not None:
        valid &= _real_row_mask(count, topk_ids.shape[0])
    ids = torch.where(valid, topk_ids, 0).contiguous()
    weights = torch.where(valid, topk_weights, 0).contiguous()
    return ids, weights


# ------------------------------------------------------------------------------ counters
# What the mask and the guard count, when handed a counter buffer (``stats``: int64, at
# least STATS_SLOTS elements, on the routing tensors' device), one slot each:
STAT_CALLS = 0  # calls (launches; graph replays included)
STAT_OUT_OF_RANGE = 1  # entries changed because the id is outside [0, E) (guard only)
STAT_PAST_COUNT = 2  # entries changed because the row is at or past the count
STAT_REAL_OUT_OF_RANGE = 3  # of STAT_OUT_OF_RANGE: in rows a count marks as real
STATS_SLOTS = 4


def guard_stats_reference(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    num_local_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """What one guard call adds to its counters: int64 ``[STATS_SLOTS]`` on the routing
    tensors' device, computed there (no host synchronization).

    An entry past the count is counted when the guard changes it (its id is not 0 or
    its weight is not 0, NaN included); an entry not past the count when its id is out
    of range (without a count, every row is such a row), and apart when a count marks
    its row as real."""
    in_range = (topk_ids >= 0) & (topk_ids < num_experts)
    if num_local_tokens is None:
        real = torch.ones_like(in_range)
    else:
        real = _real_row_mask(num_local_tokens, topk_ids.shape[0]).to(topk_ids.device)
        real = real.expand_as(in_range)
    out_of_range = (~in_range & real).sum()
    changed_past = (~real & ((topk_ids != 0) | (topk_weights != 0))).sum()
    real_bad = out_of_range if num_local_tokens is not None else torch.zeros_like(out_of_range)
    return torch.stack([torch.ones_like(out_of_range), out_of_range, changed_past, real_bad]).to(
        torch.int64
    )


def mask_stats_reference(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_token_non_padded: torch.Tensor,
    fill_value: int = 0,
) -> torch.Tensor:
    """What one mask call adds to its counters (see :func:`guard_stats_reference`): the
    call, and the entries of padded rows whose id is not ``fill_value`` or whose weight is
    not 0. The mask has no expert count, so it counts no id as out of range."""
    padded = ~_real_row_mask(num_token_non_padded, topk_ids.shape[0]).to(topk_ids.device)
    changed = (padded & ((topk_ids != fill_value) | (topk_weights != 0))).sum()
    zero = torch.zeros_like(changed)
    return torch.stack([torch.ones_like(changed), zero, changed, zero]).to(torch.int64)


def mxfp4_moe_sort_reference(
    topk_ids: torch.Tensor,
    topk_weight: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    sorted_expert_ids: torch.Tensor,
    cumsum_tensor: torch.Tensor,
    reverse_sorted: torch.Tensor,
    sorted_weights: torch.Tensor,
    m_indices: torch.Tensor,
    bf16_zero_out: torch.Tensor,
    bf16_zero_workspace: torch.Tensor,
    M_logical: int,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    D_INTER: int,
    MB: int,
    prologue: int,
    num_local_tokens: torch.Tensor | None = None,
) -> None:
    """The output contract of ``aiter.mxfp4_moe_sort``, with ``num_local_tokens`` honored.

    With ``n`` real rows (the count clamped to ``[0, M]``, or ``M`` without one), pair
    ``i < n * TOPK`` is token ``t = i // TOPK``, slot ``s = i % TOPK``, expert
    ``e = topk_ids[t, s]``. Experts are laid out in order, each padded to a multiple of
    ``MB`` slots; within an expert, pairs come in ascending pair index (the HIP kernel
    uses atomics there, so its order is arbitrary). Pairs whose id is outside
    ``[0, NE)`` are dropped (``reverse_sorted = -1``), as are all pairs of padded rows.
    ``prologue`` selects the HIP kernel's strategy only; the outputs are the same.
    Slots past ``cumsum_tensor[0]`` are left untouched.
    """
    m, ne, k, mb, count = check_sort_args(
        topk_ids, topk_weight, sorted_token_ids, sorted_expert_ids, cumsum_tensor,
        reverse_sorted, sorted_weights, m_indices, bf16_zero_out, bf16_zero_workspace,
        M_logical, NE, TOPK, D_HIDDEN, D_INTER, MB, prologue, num_local_tokens,
    )  # fmt: skip
    n = real_rows(count, m)
    ids = topk_ids[:m].tolist()

    # pairs_of[e]: pair indices routed to expert e, ascending.
    pairs_of: list[list[int]] = [[] for _ in range(ne)]
    for i in range(n * k):
        e = ids[i // k][i % k]
        if 0 <= e < ne:
            pairs_of[e].append(i)

    token_ids: list[int] = []  # sorted_token_ids[0:total]
    rows: list[int] = []  # m_indices[0:total]
    weight_src: list[tuple[int, int] | None] = []  # (t, s) to copy the weight from, or None
    block_experts: list[int] = []  # sorted_expert_ids[0:total // MB]
    reverse = [-1] * (m * k)
    for e in range(ne):
        for i in pairs_of[e]:
            t, s = divmod(i, k)
            reverse[i] = len(token_ids)
            token_ids.append(t | (s << 24))
            rows.append(t)
            weight_src.append((t, s))
        while len(token_ids) % mb:  # gap slots: row M is past the activations
            token_ids.append(m)
            rows.append(m)
            weight_src.append(None)
        block_experts += [e] * (len(token_ids) // mb - len(block_experts))
    total = len(token_ids)

    dev = sorted_token_ids.device
    sorted_token_ids[:total] = torch.tensor(token_ids, dtype=torch.int32, device=dev)
    m_indices[:total] = torch.tensor(rows, dtype=torch.int32, device=dev)
    sorted_expert_ids[: len(block_experts)] = torch.tensor(
        block_experts, dtype=torch.int32, device=dev
    )
    weights = torch.zeros(total, dtype=torch.float32, device=dev)
    real = [j for j, src in enumerate(weight_src) if src is not None]
    if real:
        ts = torch.tensor([weight_src[j] for j in real], dtype=torch.long, device=dev)
        weights[real] = topk_weight[ts[:, 0], ts[:, 1]].to(torch.float32)
    sorted_weights[:total] = weights
    reverse_sorted[: m * k] = torch.tensor(reverse, dtype=torch.int32, device=dev)
    cumsum_tensor[0] = total
    cumsum_tensor[1] = n
    if bf16_zero_out.numel() > 0:
        bf16_zero_out.zero_()
    if bf16_zero_workspace.numel() > 0:
        bf16_zero_workspace.zero_()

"""Stand-in for aiter's CK and Opus MoE sorts (``aiter/ops/moe_sorting.py``, ``aiter.ops.opus``).

``_moe_sorting_impl``'s standard path calls ``aiter.moe_sorting_fwd`` (CK, 12 positional
arguments) or ``aiter.moe_sorting_opus_fwd`` (Opus, 16 positional arguments, optionally
emitting the aux outputs ``m_indices``/``reverse_sorted``). Both honour
``num_local_tokens`` upstream (aiter PR 7083's description: the Opus aux sort "reads the
count on device, routes only the leading rows, prefills reverse_sorted with -1 and
writes the count to cumsum_tensor[1]"). The positional order is the one
``_moe_sorting_impl`` uses; the parameter names are descriptive (the plugin never calls
these directly).

They write the same contract as ``mxfp4_moe_sort`` through the torch reference, into
scratch buffers sized for the reference's checks, then copy the common prefix into the
caller's (upstream-sized) buffers, which always hold the written part (E >= topk).
An expert mask drops the pairs of the experts it masks off (0 entries); upstream also
renumbers the others to local ids, which is not modelled, nor is ``local_topk_ids``.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Stand-in only: one entry per call, ("ck" | "opus", num_local_tokens is not None).
standin_calls: list[tuple[str, bool]] = []
#: Stand-in only: what each call was handed (copies of ``topk_ids`` and ``topk_weights``,
#: ``num_experts``, the expert mask), in call order.
standin_inputs: list[dict] = []


def moe_sorting_opus_get_workspace_size(
    M: int, num_experts: int, topk: int, dispatch_policy: int
) -> int:
    return 0


def _sort_into(
    topk_ids: Tensor,
    topk_weights: Tensor,
    sorted_ids: Tensor,
    sorted_weights: Tensor,
    sorted_expert_ids: Tensor,
    num_valid_ids: Tensor,
    moe_buf: Tensor,
    num_experts: int,
    block_size: int,
    expert_mask: Tensor | None,
    num_local_tokens: Tensor | None,
    m_indices: Tensor | None,
    reverse_sorted: Tensor | None,
) -> None:
    from sglang_amd_moe.kernels import mxfp4_moe_sort_reference
    from sglang_amd_moe.kernels._validate import max_sorted_size

    standin_inputs.append(
        {"ids": topk_ids.clone(), "weights": topk_weights.clone(), "E": num_experts,
         "mask": expert_mask}
    )  # fmt: skip
    if expert_mask is not None:  # a masked-off expert's pairs are dropped, as ids out of range
        routed = (topk_ids >= 0) & (topk_ids < expert_mask.numel())
        kept = routed & (expert_mask[topk_ids.clamp(0, expert_mask.numel() - 1).long()] != 0)
        topk_ids = torch.where(kept, topk_ids, -1)
    M, topk = topk_ids.shape
    dev = topk_ids.device
    bound = max_sorted_size(M, topk, num_experts, block_size)
    s_ids = torch.empty(bound, dtype=torch.int32, device=dev)
    s_w = torch.empty(bound, dtype=torch.float32, device=dev)
    s_e = torch.empty(bound // block_size, dtype=torch.int32, device=dev)
    s_m = torch.empty(bound, dtype=torch.int32, device=dev)
    s_rev = torch.empty(M * topk, dtype=torch.int32, device=dev)
    zero = moe_buf if moe_buf.numel() > 0 else torch.empty(0, dtype=torch.bfloat16, device=dev)
    mxfp4_moe_sort_reference(
        topk_ids,
        topk_weights,
        s_ids,
        s_e,
        num_valid_ids,
        s_rev,
        s_w,
        s_m,
        zero,
        torch.empty(0, dtype=torch.bfloat16, device=dev),
        M,
        num_experts,
        topk,
        moe_buf.shape[1] if moe_buf.numel() > 0 else 0,
        1,
        block_size,
        0,
        num_local_tokens,
    )
    # Copy the common prefix (no host sync): slots past num_valid_ids[0] hold no data.
    n = min(sorted_ids.numel(), bound)
    sorted_ids[:n] = s_ids[:n]
    sorted_weights[:n] = s_w[:n]
    nb = min(sorted_expert_ids.numel(), s_e.numel())
    sorted_expert_ids[:nb] = s_e[:nb]
    if m_indices is not None:
        m_indices[: min(m_indices.numel(), bound)] = s_m[: min(m_indices.numel(), bound)]
    if reverse_sorted is not None:
        reverse_sorted.copy_(s_rev)


def moe_sorting_fwd(
    topk_ids: Tensor,
    topk_weights: Tensor,
    sorted_token_ids: Tensor,
    sorted_weights: Tensor,
    sorted_expert_ids: Tensor,
    num_valid_ids: Tensor,
    moe_buf: Tensor,
    num_experts: int,
    unit_size: int,
    local_expert_mask: Tensor | None = None,
    num_local_tokens: Tensor | None = None,
    dispatch_policy: int = 0,
) -> None:
    standin_calls.append(("ck", num_local_tokens is not None))
    _sort_into(
        topk_ids, topk_weights, sorted_token_ids, sorted_weights, sorted_expert_ids,
        num_valid_ids, moe_buf, num_experts, unit_size, local_expert_mask,
        num_local_tokens, None, None,
    )  # fmt: skip


def moe_sorting_opus_fwd(
    topk_ids: Tensor,
    topk_weights: Tensor,
    sorted_token_ids: Tensor,
    sorted_weights: Tensor,
    sorted_expert_ids: Tensor,
    num_valid_ids: Tensor,
    moe_buf: Tensor,
    num_experts: int,
    unit_size: int,
    local_expert_mask: Tensor | None,
    num_local_tokens: Tensor | None,
    workspace: Tensor | None,
    dispatch_policy: int,
    local_topk_ids: Tensor | None,
    aux_m_indices: Tensor | None,
    aux_reverse_sorted: Tensor | None,
) -> None:
    standin_calls.append(("opus", num_local_tokens is not None))
    if local_topk_ids is not None:
        raise NotImplementedError("aiter stand-in: local_topk_ids is not modelled")
    _sort_into(
        topk_ids, topk_weights, sorted_token_ids, sorted_weights, sorted_expert_ids,
        num_valid_ids, moe_buf, num_experts, unit_size, local_expert_mask,
        num_local_tokens, aux_m_indices, aux_reverse_sorted,
    )  # fmt: skip

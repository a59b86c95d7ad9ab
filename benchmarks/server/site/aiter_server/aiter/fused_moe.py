"""Stand-in for ``aiter.fused_moe``: ``fused_moe`` -> ``fused_moe_`` -> ``_fused_moe_impl``,
aiter's call chain and Python signatures, with a plain-torch body (see the package
docstring). ``_fused_moe_impl`` is what the plugin's guard wraps, as in aiter.

Each call first looks every id up in a table of ``E`` entries with ``index_select``: an id
outside ``[0, E)`` trips CUDA's device-side bounds assert, which ends the process's CUDA
context the way an out-of-range id ends aiter's sort on AMD. Calls are counted in
``CALLS`` (the server record reads it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import ActivationType, QuantType
from .ops.flydsl.moe_common import GateMode

CALLS = [0]
_TABLES: dict = {}


def _expert_table(num_experts: int, device) -> torch.Tensor:
    key = (num_experts, device)
    t = _TABLES.get(key)
    if t is None:
        t = _TABLES[key] = torch.arange(num_experts, dtype=torch.int32, device=device)
    return t


def fused_moe(
    hidden_states,
    w1,  # [expert(local_expert:EP), inter_dim*2, dim] N,K
    w2,  # [expert(local_expert:EP), dim, inter_dim]
    topk_weight,
    topk_ids,
    expert_mask: torch.Tensor | None = None,  # EP
    activation=ActivationType.Silu,
    quant_type=QuantType.No,
    doweight_stage1=False,
    w1_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    a1_scale: torch.Tensor | None = None,
    a2_scale: torch.Tensor | None = None,
    block_size_M=None,
    num_local_tokens: torch.Tensor | None = None,
    moe_sorting_dispatch_policy=0,
    dtype=None,
    hidden_pad=0,
    intermediate_pad=0,
    bias1=None,
    bias2=None,
    splitk=0,
    swiglu_limit=None,
    gate_mode: str | None = GateMode.SEPARATED.value,
):
    if not block_size_M:
        block_size_M = -1
    return fused_moe_(
        hidden_states=hidden_states,
        w1=w1,
        w2=w2,
        topk_weight=topk_weight,
        topk_ids=topk_ids,
        expert_mask=expert_mask,
        activation=activation.value,
        quant_type=quant_type.value,
        doweight_stage1=doweight_stage1,
        w1_scale=w1_scale,
        w2_scale=w2_scale,
        a1_scale=a1_scale,
        a2_scale=a2_scale,
        block_size_M=block_size_M,
        num_local_tokens=num_local_tokens,
        moe_sorting_dispatch_policy=moe_sorting_dispatch_policy,
        dtype=dtype,
        hidden_pad=hidden_pad,
        intermediate_pad=intermediate_pad,
        bias1=bias1,
        bias2=bias2,
        swiglu_limit=swiglu_limit,
        gate_mode=gate_mode,
    )


def fused_moe_(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weight: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_mask: torch.Tensor | None = None,
    activation: int = ActivationType.Silu.value,
    quant_type: int = QuantType.No.value,
    doweight_stage1: bool = False,
    w1_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    a1_scale: torch.Tensor | None = None,
    a2_scale: torch.Tensor | None = None,
    block_size_M: int = -1,
    num_local_tokens: torch.Tensor | None = None,
    moe_sorting_dispatch_policy: int = 0,
    dtype: torch.dtype | None = None,
    hidden_pad: int = 0,
    intermediate_pad: int = 0,
    bias1: torch.Tensor | None = None,
    bias2: torch.Tensor | None = None,
    swiglu_limit: float | None = None,
    gate_mode: str = GateMode.SEPARATED.value,
) -> torch.Tensor:
    # aiter's fused_moe_ is a torch custom op that forwards every argument by keyword.
    return _fused_moe_impl(**locals())


def _fused_moe_impl(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weight: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_mask: torch.Tensor | None = None,
    activation: int = ActivationType.Silu.value,
    quant_type: int = QuantType.No.value,
    doweight_stage1: bool = False,
    w1_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    a1_scale: torch.Tensor | None = None,
    a2_scale: torch.Tensor | None = None,
    block_size_M: int = -1,
    num_local_tokens: torch.Tensor | None = None,
    moe_sorting_dispatch_policy: int = 0,
    dtype: torch.dtype | None = None,
    hidden_pad: int = 0,
    intermediate_pad: int = 0,
    bias1: torch.Tensor | None = None,
    bias2: torch.Tensor | None = None,
    swiglu_limit: float | None = None,
    gate_mode: str = GateMode.SEPARATED.value,
) -> torch.Tensor:
    if QuantType(quant_type) != QuantType.No or bias1 is not None or bias2 is not None:
        raise NotImplementedError("the server stand-in runs unquantized MoE without biases")
    CALLS[0] += 1
    num_experts = w1.shape[0] if expert_mask is None else expert_mask.numel()
    rows, topk = topk_ids.shape
    # aiter's sort indexes its per-expert tables with every id: out of range, a fault.
    torch.index_select(_expert_table(num_experts, topk_ids.device), 0, topk_ids.reshape(-1))
    # Row r combines the experts of its own entries with its own weights, nothing else.
    combine = torch.zeros(rows, w1.shape[0], dtype=torch.float32, device=topk_ids.device)
    combine.scatter_add_(1, topk_ids.long(), topk_weight.float())
    inter = w2.shape[2]
    x = hidden_states
    gate_up = torch.einsum("mh,eih->emi", x, w1)  # [E, rows, 2 * inter]
    gate, up = gate_up[..., :inter], gate_up[..., inter:]
    act = ActivationType(activation)
    h = (F.gelu(gate) if act == ActivationType.Gelu else F.silu(gate)) * up
    down = torch.einsum("emi,ehi->emh", h, w2)  # [E, rows, hidden]
    out = torch.einsum("me,emh->mh", combine, down.float())
    return out.to(hidden_states.dtype if dtype is None else dtype)

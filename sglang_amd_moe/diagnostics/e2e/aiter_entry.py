"""An aiter-shaped MoE entry for the check's no-count rows: ``fused_moe`` ->
``_fused_moe_impl`` with aiter's leading parameters (``hidden_states, w1, w2, topk_weight,
topk_ids, expert_mask``, ``num_local_tokens``), whose body is the check's aiter-like consumer.

Most deployments that pad with garbage hand aiter no count (DP attention with TP MoE,
EAGLE/MTP drafts, ATOM's DP pads, vLLM's -1 rows): the guard at aiter's entry is then the only
protection. aiter itself needs ROCm, so the check builds this entry in memory and lets the
plugin's guard recognise and wrap it exactly as it wraps aiter's ``_fused_moe_impl`` (the same
signature check, the same wrapper, the same counters)."""

from __future__ import annotations

import types
from typing import Any

import torch

from sglang_amd_moe.diagnostics.e2e.consumer import AiterLikeMoE, ConsumerStats


def make_entry(consumer: AiterLikeMoE) -> types.ModuleType:
    """A module holding ``fused_moe`` and ``_fused_moe_impl``; ``module.layer`` is the layer
    the next call runs, ``module.seen`` what the consumer saw on each call."""
    module = types.ModuleType("sglang_amd_moe_check.aiter_fused_moe")
    module.layer, module.seen = 0, []

    def _fused_moe_impl(
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        topk_weight: torch.Tensor,
        topk_ids: torch.Tensor,
        expert_mask: torch.Tensor | None = None,
        activation: int = 0,
        quant_type: int = 0,
        doweight_stage1: bool = False,
        block_size_M: int = -1,
        num_local_tokens: torch.Tensor | None = None,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        out, stats = consumer(module.layer, hidden_states, topk_ids, topk_weight, num_local_tokens)
        module.seen.append(stats)
        return out

    def fused_moe(
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        topk_weight: torch.Tensor,
        topk_ids: torch.Tensor,
        expert_mask: torch.Tensor | None = None,
        num_local_tokens: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        # As aiter's chain does: every argument by keyword to the impl (looked up on the
        # module, so a wrapper set there is what runs).
        return module._fused_moe_impl(
            hidden_states=hidden_states, w1=w1, w2=w2, topk_weight=topk_weight,
            topk_ids=topk_ids, expert_mask=expert_mask, num_local_tokens=num_local_tokens,
        )  # fmt: skip

    module._fused_moe_impl, module.fused_moe = _fused_moe_impl, fused_moe
    return module


def guard(module: types.ModuleType) -> tuple[bool, str]:
    """The plugin's guard on ``module``'s entry, as on aiter's: (live, its log line). Off
    under ``SGLANG_AMD_MOE_GUARD=0``, as in a server."""
    from sglang_amd_moe.runtime import env
    from sglang_amd_moe.runtime.aiter.guard import GuardHook

    if env.guard_off():
        return False, "guard off (SGLANG_AMD_MOE_GUARD=0)"
    status = GuardHook()._on_loaded(module)
    return status.state == "live", status.message


def seen(module: types.ModuleType) -> ConsumerStats:
    """What the consumer saw over every call since the last :func:`seen`."""
    total = ConsumerStats()
    for stats in module.seen:
        total.add(stats)
    module.seen.clear()
    return total

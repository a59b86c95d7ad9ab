"""Stand-in for ROCm ATOM's SGLang plugin (tests only; never installed or shipped).

ATOM ships itself as an SGLang plugin: an ``atom_sglang`` entry point in
``sglang.srt.plugins``. What of it matters to sglang-amd-moe is kept: when it runs it
imports ``aiter.fused_moe`` (its MoE layers are aiter's) and patches SGLang with plain
``setattr`` (no HookRegistry), here two of the attributes it replaces with its own
routing (``topk.select_experts``, ``TopK.forward_native``); it routes MoE itself, never
through SGLang's ``_post_process_topk_ids``; and its DP all-gather pads with
uninitialized rows (``torch.empty`` at ATOM main) that reach ``aiter.fused_moe`` with no
count (:func:`moe_forward_dp_padded`). Nothing else of ATOM is reproduced.

The test that uses it writes the distribution's metadata (``entry_points.txt``) into a
temporary directory, so that its place on ``sys.path`` decides the load order.
"""

from __future__ import annotations

import torch


def select_experts(*args, **kwargs):
    raise NotImplementedError("ATOM stand-in: ATOM's own routing is not modelled")


def forward_native(self, *args, **kwargs):
    raise NotImplementedError("ATOM stand-in: ATOM's own routing is not modelled")


def register() -> None:
    """The ``atom_sglang`` entry point."""
    import aiter.fused_moe  # noqa: F401  (ATOM's MoE layers are aiter's)
    from sglang.srt.layers.moe import topk

    setattr(topk, "select_experts", select_experts)  # noqa: B010 - as ATOM patches
    setattr(topk.TopK, "forward_native", forward_native)  # noqa: B010


def moe_forward_dp_padded(
    ids: torch.Tensor, weights: torch.Tensor, pad_rows: int, num_experts: int, dim: int
) -> torch.Tensor:
    """ATOM's DP all-gather, then aiter's MoE: the real rows, then ``pad_rows`` rows of
    uninitialized memory (filled here with what such memory holds on a GPU: any bit
    pattern, so any id and NaN/Inf weights), passed on with no count."""
    import aiter.fused_moe as fm

    g = torch.Generator().manual_seed(pad_rows)
    k = ids.shape[1]
    raw = torch.randint(-(2**31), 2**31 - 1, (pad_rows, 2 * k), generator=g, dtype=torch.int32)
    pad_ids, pad_weights = raw[:, :k], raw[:, k:].view(torch.float32)
    all_ids = torch.cat([ids, pad_ids])
    all_weights = torch.cat([weights, pad_weights])
    hidden = torch.zeros(all_ids.shape[0], dim, dtype=torch.bfloat16)
    w1 = torch.empty(1, 1, 1).expand(num_experts, 2 * 128, dim)
    w2 = torch.empty(1, 1, 1).expand(num_experts, dim, 128)
    return fm.fused_moe(hidden, w1, w2, all_weights, all_ids)

"""The check's model: a small DeepSeek-style MoE, built in memory from a fixed seed.

Why this exists: the users' symptom was end to end (GSM8K 0.94 -> 0.1 on AMD), so the
check runs the whole path on a model small enough for a CPU: hidden states -> router ->
SGLang's real ``select_experts`` / ``_post_process_topk_ids`` -> an MoE consumer shaped
like aiter's (:mod:`.consumer`) -> the next layer. Nothing is downloaded. Routing and
the MoE are plugged in by the caller (:mod:`.run`), so this module only holds weights
and the layer loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TinyMoEConfig:
    """Shape of the check's model: DeepSeek-V3-like routing, tiny sizes."""

    vocab_size: int = 512
    hidden: int = 256
    moe_inter: int = 64
    layers: int = 4
    routed_experts: int = 64
    shared_experts: int = 1
    top_k: int = 6
    n_group: int = 8
    topk_group: int = 4
    block_size: int = 16  # MB of aiter's inline MXFP4 sort (prologue 0)
    seed: int = 0

    @property
    def num_experts(self) -> int:
        """NE as aiter counts it: routed plus shared (e.g. 513 = 512 + 1)."""
        return self.routed_experts + self.shared_experts

    @property
    def slots(self) -> int:
        """TOPK as aiter counts it: routed top-k plus one slot per shared expert."""
        return self.top_k + self.shared_experts


class TinyMoE:
    """The model's weights (fp32) and its layer loop; routing and MoE are plugged in.

    A layer is ``h = h + MoE(h)`` with the router reading ``h`` directly (no norm in
    front of it, so garbage in padded rows reaches the router and the experts as it is).
    The shared expert is fused as expert id ``routed_experts`` with weight 1, the way
    SGLang appends it for aiter (``fused_append_shared_experts``).
    """

    def __init__(self, cfg: TinyMoEConfig, device: str | torch.device = "cpu") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        g = torch.Generator().manual_seed(cfg.seed)
        h, i, e = cfg.hidden, cfg.moe_inter, cfg.num_experts

        def randn(*shape: int, std: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) * std).to(self.device)

        self.embed = randn(cfg.vocab_size, h, std=1.0)
        self.gate = [randn(cfg.routed_experts, h, std=1 / math.sqrt(h)) for _ in range(cfg.layers)]
        self.bias = [randn(cfg.routed_experts, std=0.05) for _ in range(cfg.layers)]
        # w13 = [gate_proj; up_proj] as aiter stores it, w2 = down_proj.
        self.w13 = [randn(e, 2 * i, h, std=1 / math.sqrt(h)) for _ in range(cfg.layers)]
        self.w2 = [randn(e, h, i, std=0.5 / math.sqrt(i)) for _ in range(cfg.layers)]
        self.norm = torch.ones(h, device=self.device)
        self.lm_head = randn(cfg.vocab_size, h, std=1 / math.sqrt(h))

    def forward(
        self,
        hidden: torch.Tensor,
        route: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        moe: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """Run all layers. ``route(layer, h, logits) -> (weights, ids)`` of the routed
        experts; ``moe(layer, h, ids, weights) -> delta`` with the shared slot appended."""
        cfg = self.cfg
        h = hidden
        for layer in range(cfg.layers):
            logits = rows_matmul(h, self.gate[layer].t(), cfg.block_size)
            weights, ids = route(layer, h, logits)
            m = h.shape[0]
            shared_ids = torch.arange(
                cfg.routed_experts, cfg.num_experts, dtype=ids.dtype, device=ids.device
            ).expand(m, cfg.shared_experts)
            shared_w = torch.ones(m, cfg.shared_experts, dtype=weights.dtype, device=weights.device)
            ids = torch.cat([ids, shared_ids], dim=1).contiguous()
            weights = torch.cat([weights, shared_w], dim=1).contiguous()
            h = h + moe(layer, h, ids, weights)
        return h


def rows_matmul(x: torch.Tensor, w_t: torch.Tensor, tile: int) -> torch.Tensor:
    """``x @ w_t`` computed in fixed tiles of ``tile`` rows (one batched GEMM).

    A GEMM library picks its kernel by problem shape, so ``x @ w`` for 5 rows and for 8
    rows may round a shared row differently. Fixed tiles keep every row's result
    independent of how many rows the batch has, as a GPU's tiled GEMM does; that is what
    lets the check demand bit-identical real rows.
    """
    m = x.shape[0]
    t = -(-m // tile)
    xp = torch.zeros(t * tile, x.shape[1], dtype=x.dtype, device=x.device)
    xp[:m] = x
    out = torch.bmm(xp.view(t, tile, -1), w_t.unsqueeze(0).expand(t, -1, -1).contiguous())
    return out.reshape(t * tile, -1)[:m]

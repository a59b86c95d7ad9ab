"""The check's model: a small DeepSeek-style MoE built in memory from a fixed seed, so the
whole path the users' symptom came from (GSM8K 0.94 -> 0.1 on AMD) runs on a CPU. Routing
and the MoE are plugged in by the caller (:mod:`.run`): this holds weights and the loop."""

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
    def num_experts(self) -> int:  # NE as aiter counts it: routed plus shared (513 = 512 + 1)
        return self.routed_experts + self.shared_experts

    @property
    def slots(self) -> int:  # TOPK as aiter counts it: routed top-k plus one per shared expert
        return self.top_k + self.shared_experts


class TinyMoE:
    """The model's weights (fp32) and its layer loop. A layer is ``h = h + MoE(h)``, the
    router reading ``h`` with no norm in front (garbage in padded rows reaches it as it is);
    the shared expert is fused as id ``routed_experts`` with weight 1, as SGLang appends
    it for aiter (``fused_append_shared_experts``)."""

    def __init__(self, cfg: TinyMoEConfig, device: str | torch.device = "cpu") -> None:
        self.cfg, self.device = cfg, torch.device(device)
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
        # The check reads neither: they complete the weights into a checkpoint a real
        # server can load (the final norm and the LM head).
        self.norm = torch.ones(h, device=self.device)
        self.lm_head = randn(cfg.vocab_size, h, std=1 / math.sqrt(h))

    def forward(
        self,
        hidden: torch.Tensor,
        route: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        moe: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """All layers: ``route(layer, h, logits) -> (weights, ids)`` of the routed experts,
        ``moe(layer, h, ids, weights) -> delta`` with the shared slot appended."""
        cfg, h = self.cfg, hidden
        for layer in range(cfg.layers):
            weights, ids = route(layer, h, rows_matmul(h, self.gate[layer].t(), cfg.block_size))
            shared = torch.arange(cfg.routed_experts, cfg.num_experts, device=ids.device)
            shared = shared.to(ids.dtype).expand(h.shape[0], cfg.shared_experts)
            ids = torch.cat([ids, shared], dim=1).contiguous()
            weights = torch.cat([weights, torch.ones_like(shared, dtype=weights.dtype)], dim=1)
            h = h + moe(layer, h, ids, weights.contiguous())
        return h


def rows_matmul(x: torch.Tensor, w_t: torch.Tensor, tile: int) -> torch.Tensor:
    """``x @ w_t`` in fixed tiles of ``tile`` rows (one batched GEMM): a GEMM library picks
    its kernel by shape and may round a row differently for 5 rows than for 8; fixed tiles
    keep each row's result independent of the batch, as a GPU's tiled GEMM does."""
    m, t = x.shape[0], -(-x.shape[0] // tile)
    xp = torch.zeros(t * tile, x.shape[1], dtype=x.dtype, device=x.device)
    xp[:m] = x
    out = torch.bmm(xp.view(t, tile, -1), w_t.unsqueeze(0).expand(t, -1, -1).contiguous())
    return out.reshape(t * tile, -1)[:m]

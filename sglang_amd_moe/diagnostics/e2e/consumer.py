"""The check's MoE consumer, with aiter's data flow (sort -> per-block expert MLP -> reduce),
which is what turns a bad expert id into damage in real rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang_amd_moe import kernels
from sglang_amd_moe.diagnostics.e2e.amd_emulation import legacy_hip_sort
from sglang_amd_moe.diagnostics.e2e.model import TinyMoE, TinyMoEConfig
from sglang_amd_moe.kernels.utils import max_sorted_size, real_rows, triton_backend


@dataclass
class SortBuffers:
    """The sort's outputs, sized as aiter's ``_adaptive_moe_sort`` sizes them."""

    sorted_token_ids: torch.Tensor
    sorted_expert_ids: torch.Tensor
    cumsum: torch.Tensor  # num_valid_ids[2]
    sorted_weights: torch.Tensor
    reverse_sorted: torch.Tensor
    m_indices: torch.Tensor

    @classmethod
    def allocate(cls, m: int, k: int, ne: int, mb: int, device: torch.device) -> SortBuffers:
        """Zero-filled (aiter uses ``torch.empty``; slots nobody writes read as 0 here)."""
        n = max_sorted_size(m, k, ne, mb)
        out = [
            torch.zeros(s, dtype=torch.int32, device=device) for s in (n, n // mb, 2, n, m * k, n)
        ]
        return cls(*out[:3], out[3].float(), *out[4:])


@dataclass
class ConsumerStats:
    """What one MoE call saw; summed over layers by the check."""

    out_of_range_ids: int = 0  # ids outside [0, NE) in the rows the sort read
    oob_stores: int = 0  # legacy sort stores that fell outside the output buffers
    oob_reads: int = 0  # reverse_sorted entries outside the computed slots
    sorts: dict[str, int] = field(default_factory=dict)  # which sort ran, how often

    def add(self, other: ConsumerStats) -> None:
        for name in ("out_of_range_ids", "oob_stores", "oob_reads"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for k, v in other.sorts.items():
            self.sorts[k] = self.sorts.get(k, 0) + v


class AiterLikeMoE:
    """An MoE consumer with aiter's data flow.

    * Sort: aiter's MXFP4 aux-sort contract (:func:`sglang_amd_moe.kernels.mxfp4_moe_sort`),
      ``MB = 16``, ``NE`` and ``TOPK`` counting the fused shared expert: this package's
      sort where every id it reads is in ``[0, NE)``. Like the HIP kernels it cannot take
      other ids: it counts them and runs :func:`~.amd_emulation.legacy_hip_sort` (this
      package's sort would drop them, hiding the damage).
    * Stage 1: for each block of ``MB`` sorted slots below ``cumsum[0]``, the block's
      expert runs ``silu(x W1) * (x W3) W2`` on the rows ``m_indices`` names; a row
      ``>= M`` reads 0, as the hardware drops loads past the activations.
    * Stage 2: token ``t`` sums ``sorted_weights[sp] * y[sp]`` over its slots in order,
      ``sp = reverse_sorted[t * TOPK + s]``; -1 is skipped, an ``sp`` outside the computed
      slots reads 0 and is counted.
    """

    def __init__(self, cfg: TinyMoEConfig, model: TinyMoE) -> None:
        self.cfg, self.model, self.sort_fn = cfg, model, kernels.mxfp4_moe_sort
        self.sort_name = f"sglang_amd_moe.kernels.mxfp4_moe_sort ({triton_backend(model.device)})"
        # The sizes the model fixes; M_logical and TOPK come from each call's routing.
        sizes = (cfg.num_experts, cfg.hidden, cfg.moe_inter, cfg.block_size)
        self.sort_sizes = dict(zip(("NE", "D_HIDDEN", "D_INTER", "MB"), sizes, strict=True))

    def __call__(
        self,
        layer: int,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        num_local_tokens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ConsumerStats]:
        (m, k), ne, mb = topk_ids.shape, self.cfg.num_experts, self.cfg.block_size
        stats = ConsumerStats()
        read = topk_ids[: real_rows(num_local_tokens, m)]
        stats.out_of_range_ids = int(((read < 0) | (read >= ne)).sum())
        bufs = SortBuffers.allocate(m, k, ne, mb, x.device)
        if stats.out_of_range_ids:
            stats.oob_stores = legacy_hip_sort(topk_ids, topk_weights, bufs, m, ne, k, mb)
            stats.sorts["legacy HIP sort (emulated)"] = 1
        else:
            outs = "sorted_token_ids sorted_expert_ids reverse_sorted sorted_weights m_indices"
            kw = {n: getattr(bufs, n) for n in outs.split()} | {"cumsum_tensor": bufs.cumsum}
            kw["bf16_zero_out"] = torch.empty(0, 0, dtype=torch.bfloat16, device=x.device)
            kw["bf16_zero_workspace"] = torch.empty(0, dtype=torch.uint8, device=x.device)
            kw |= {"M_logical": m, "TOPK": k, "prologue": 0, "num_local_tokens": num_local_tokens}
            self.sort_fn(topk_ids=topk_ids, topk_weight=topk_weights, **kw, **self.sort_sizes)
            stats.sorts[self.sort_name] = 1
        y = self._stage1(layer, x, bufs)
        out, stats.oob_reads = self._stage2(bufs, y, m, k)
        return out, stats

    def _stage1(self, layer: int, x: torch.Tensor, bufs: SortBuffers) -> torch.Tensor:
        cfg, m, n_slots = self.cfg, x.shape[0], bufs.sorted_token_ids.numel()
        mb, i = cfg.block_size, cfg.moe_inter
        y = torch.zeros(n_slots, cfg.hidden, dtype=x.dtype, device=x.device)
        total = min(max(int(bufs.cumsum[0]), 0), n_slots)
        nb = total // mb
        if nb == 0:
            return y
        rows = bufs.m_indices[: nb * mb].long()
        rows = torch.where((rows >= 0) & (rows < m), rows, m)  # past the end: loads dropped
        x_ext = torch.cat([x, torch.zeros(1, x.shape[1], dtype=x.dtype, device=x.device)])
        a = x_ext[rows].view(nb, mb, -1)
        experts = bufs.sorted_expert_ids[:nb].long().clamp(0, cfg.num_experts - 1)
        w13 = self.model.w13[layer][experts]  # [nb, 2I, H]
        w2 = self.model.w2[layer][experts]  # [nb, H, I]
        gu = torch.bmm(a, w13.transpose(1, 2))
        act = torch.nn.functional.silu(gu[..., :i]) * gu[..., i:]
        y[: nb * mb] = torch.bmm(act, w2.transpose(1, 2)).reshape(nb * mb, -1)
        return y

    @staticmethod
    def _stage2(bufs: SortBuffers, y: torch.Tensor, m: int, k: int) -> tuple[torch.Tensor, int]:
        total = min(max(int(bufs.cumsum[0]), 0), y.shape[0])
        rev = bufs.reverse_sorted[: m * k].long().view(m, k)
        valid = (rev >= 0) & (rev < total)
        oob = int(((rev != -1) & ~valid).sum())
        idx = torch.where(valid, rev, 0)
        w = torch.where(valid, bufs.sorted_weights[idx], 0.0)
        yv = torch.where(valid[..., None], y[idx], 0.0)
        out = torch.zeros(m, y.shape[1], dtype=y.dtype, device=y.device)
        for s in range(k):  # slot order: the same sum for a token however it was padded
            out = out + w[:, s, None] * yv[:, s]
        return out, oob

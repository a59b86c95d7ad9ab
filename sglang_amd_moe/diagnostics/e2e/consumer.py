"""The check's MoE consumer: aiter's data flow (sort -> per-block expert MLP -> reduce).

The consumer is what turns a bad expert id into damage in real rows, so it follows
aiter's fused MXFP4 MoE where that matters: the sort's buffers are sized as aiter's
``_adaptive_moe_sort`` sizes them, stage 1 works on blocks of sorted slots, stage 2
reads each token's slots through ``reverse_sorted``. It is called as SGLang calls
aiter's ``fused_moe`` (no ``num_local_tokens``) unless a test passes one.
"""

from __future__ import annotations

from collections.abc import Callable
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
        i32 = {"dtype": torch.int32, "device": device}
        return cls(
            torch.zeros(n, **i32),
            torch.zeros(n // mb, **i32),
            torch.zeros(2, **i32),
            torch.zeros(n, dtype=torch.float32, device=device),
            torch.zeros(m * k, **i32),
            torch.zeros(n, **i32),
        )


@dataclass
class ConsumerStats:
    """What one MoE call saw; summed over layers by the check."""

    out_of_range_ids: int = 0  # ids outside [0, NE) in the rows the sort read
    oob_stores: int = 0  # legacy sort stores that fell outside the output buffers
    oob_reads: int = 0  # reverse_sorted entries outside the computed slots
    sorts: dict[str, int] = field(default_factory=dict)  # which sort ran, how often

    def add(self, other: ConsumerStats) -> None:
        self.out_of_range_ids += other.out_of_range_ids
        self.oob_stores += other.oob_stores
        self.oob_reads += other.oob_reads
        for k, v in other.sorts.items():
            self.sorts[k] = self.sorts.get(k, 0) + v


def _package_sort(device: torch.device) -> tuple[Callable[..., None], str]:
    """This package's sort and how it runs on ``device``: the Triton kernel on a GPU or
    under ``TRITON_INTERPRET=1`` (exact, slow on the CPU), else its torch reference
    (the kernel's own CPU fallback)."""
    name = f"sglang_amd_moe.kernels.mxfp4_moe_sort ({triton_backend(device)})"
    return kernels.mxfp4_moe_sort, name


class AiterLikeMoE:
    """An MoE consumer with aiter's data flow: sort -> per-block expert MLP -> reduce.

    * Sort: aiter's MXFP4 aux-sort contract (documented by
      :func:`sglang_amd_moe.kernels.mxfp4_moe_sort`), ``MB = 16``, ``NE`` and ``TOPK``
      counting the fused shared expert. It is this package's ``mxfp4_moe_sort`` (count
      honored when one is passed) whenever every id it reads is in ``[0, NE)``. Like the
      HIP kernels, the consumer cannot take other ids: it counts them and, instead of
      handing them to this package's sort (which would drop them, hiding the damage),
      runs :func:`~.amd_emulation.legacy_hip_sort`, the emulation of what aiter's HIP
      sort did with them.
    * Stage 1: for each block of ``MB`` sorted slots below ``cumsum[0]``, the block's
      expert (``sorted_expert_ids``) runs ``silu(x W1) * (x W3) W2`` on the rows
      ``m_indices`` names; a row ``>= M`` loads nothing (reads 0), as the hardware drops
      loads past the activations.
    * Stage 2: token ``t`` sums ``sorted_weights[sp] * y[sp]`` over its slots in slot
      order, ``sp = reverse_sorted[t * TOPK + s]``; -1 is skipped; an ``sp`` outside the
      computed slots reads 0 and is counted.
    """

    def __init__(self, cfg: TinyMoEConfig, model: TinyMoE) -> None:
        self.cfg = cfg
        self.model = model
        self.sort_fn, self.sort_name = _package_sort(model.device)
        # The sort's size arguments that the model fixes (NE counts the fused shared
        # expert); M_logical and TOPK come from each call's routing.
        self.sort_sizes = {
            "NE": cfg.num_experts,
            "D_HIDDEN": cfg.hidden,
            "D_INTER": cfg.moe_inter,
            "MB": cfg.block_size,
        }

    def __call__(
        self,
        layer: int,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        num_local_tokens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ConsumerStats]:
        cfg = self.cfg
        m, k = topk_ids.shape
        ne, mb = cfg.num_experts, cfg.block_size
        stats = ConsumerStats()
        read = topk_ids[: real_rows(num_local_tokens, m)]
        stats.out_of_range_ids = int(((read < 0) | (read >= ne)).sum())
        bufs = SortBuffers.allocate(m, k, ne, mb, x.device)
        if stats.out_of_range_ids:
            stats.oob_stores = legacy_hip_sort(topk_ids, topk_weights, bufs, m, ne, k, mb)
            stats.sorts["legacy HIP sort (emulated)"] = 1
        else:
            self.sort_fn(
                topk_ids=topk_ids,
                topk_weight=topk_weights,
                sorted_token_ids=bufs.sorted_token_ids,
                sorted_expert_ids=bufs.sorted_expert_ids,
                cumsum_tensor=bufs.cumsum,
                reverse_sorted=bufs.reverse_sorted,
                sorted_weights=bufs.sorted_weights,
                m_indices=bufs.m_indices,
                bf16_zero_out=torch.empty(0, 0, dtype=torch.bfloat16, device=x.device),
                bf16_zero_workspace=torch.empty(0, dtype=torch.uint8, device=x.device),
                M_logical=m,
                TOPK=k,
                **self.sort_sizes,
                prologue=0,
                num_local_tokens=num_local_tokens,
            )
            stats.sorts[self.sort_name] = 1
        y = self._stage1(layer, x, bufs)
        out, stats.oob_reads = self._stage2(bufs, y, m, k)
        return out, stats

    def _stage1(self, layer: int, x: torch.Tensor, bufs: SortBuffers) -> torch.Tensor:
        cfg = self.cfg
        mb, i = cfg.block_size, cfg.moe_inter
        m = x.shape[0]
        n_slots = bufs.sorted_token_ids.numel()
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

"""A graph-capturable MoE sort built from stock torch ops: the ``torch_argsort`` peer.

It writes the same outputs as the MXFP4 aux sort's contract (``mxfp4_moe_sort``'s
docstring), honoring a device count, with no host synchronization (no boolean indexing,
no ``bincount``): a stable ``argsort`` of expert ids, per-expert counts with
``scatter_add_``, block-padded offsets with ``cumsum``, and scatters into the output
buffers. What a careful engineer would write
in torch without a custom kernel; benchmarked against ours.
"""

from __future__ import annotations

import torch


def torch_argsort_sort(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    block: int,
    count: torch.Tensor,
    out: dict[str, torch.Tensor],
) -> None:
    M, K = topk_ids.shape
    E, B = num_experts, block
    dev = topk_ids.device
    P = M * K
    pair = torch.arange(P, device=dev)
    flat = topk_ids.reshape(-1).long()
    n = count.reshape(()).clamp(0, M).long()
    valid = (flat >= 0) & (flat < E) & (pair < n * K)
    key = torch.where(valid, flat, E)  # invalid pairs sort last, into bucket E
    order = torch.argsort(key, stable=True)
    # Bucket E (invalid pairs) is counted too, then dropped: no host-to-device write.
    counts = torch.zeros(E + 1, dtype=torch.long, device=dev).scatter_add_(
        0, key, torch.ones_like(key)
    )
    counts = torch.cat([counts[:E], torch.zeros_like(counts[:1])])
    padded = (counts + B - 1) // B * B
    start = torch.cumsum(padded, 0) - padded
    first = torch.cumsum(counts, 0) - counts
    skey = key[order]
    pos = start[skey] + (torch.arange(P, device=dev) - first[skey])
    svalid = skey < E

    sorted_ids = out["sorted_token_ids"]
    cap = sorted_ids.numel()
    # Invalid pairs are scattered to a position past the end, which the clamp below maps
    # to a slot the gap fill rewrites: no boolean indexing, no host sync.
    total = padded.sum()
    sorted_ids.fill_(M)
    out["m_indices"].fill_(M)
    out["sorted_weights"].zero_()
    dump = torch.where(svalid, pos, torch.full_like(pos, cap - 1))
    tok = order // K
    sl = order % K
    sorted_ids.scatter_(0, dump, torch.where(svalid, tok | (sl << 24), M).to(torch.int32))
    out["m_indices"].scatter_(0, dump, torch.where(svalid, tok, M).to(torch.int32))
    wflat = topk_weights.reshape(-1).float()
    out["sorted_weights"].scatter_(0, dump, torch.where(svalid, wflat[order], 0.0))
    rev = torch.full((P,), -1, dtype=torch.long, device=dev)
    rev.scatter_(0, order, torch.where(svalid, pos, -1))
    out["reverse_sorted"].copy_(rev)
    ends = torch.cumsum(padded[:E], 0)
    nblk = out["sorted_expert_ids"].numel()
    blk_start = torch.arange(nblk, device=dev) * B
    out["sorted_expert_ids"].copy_(torch.searchsorted(ends, blk_start, right=True).clamp(max=E - 1))
    out["cumsum_tensor"][0] = total
    out["cumsum_tensor"][1] = n

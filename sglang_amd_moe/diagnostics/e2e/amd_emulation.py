"""The two pieces of AMD device code the check cannot run here, each used only where the
real code cannot be, each saying what it emulates and assumes: :func:`hip_router_for`
(the routing of a row whose scores are NaN; real rows go through SGLang's own router) and
:func:`legacy_hip_sort` (aiter's pre-fix MXFP4 sort on ids outside ``[0, NE)``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from sglang_amd_moe.diagnostics.e2e.model import TinyMoEConfig

THREADS_PER_CTA = 256  # of the sort kernel: its count table has max(NE, 256) entries

if TYPE_CHECKING:  # only for the annotation: consumer imports this module
    from sglang_amd_moe.diagnostics.e2e.consumer import SortBuffers


def stale_lds_words(rows: int, cols: int, seed: int, device: torch.device) -> torch.Tensor:
    """Uninitialized shared memory, as the check fills it: int32 words from a fixed seed."""
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**31), 2**31, (rows, cols), generator=g, dtype=torch.int64)
    return words.to(torch.int32).to(device)


def hip_router_for(
    topk_module: Any, cfg: TinyMoEConfig, bias: torch.Tensor, seed: int
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A ``custom_routing_function``: DeepSeek grouped routing as SGLang runs it on AMD.

    Rows with a finite score go through the module's own ``biased_grouped_topk_impl``
    (every release 0.5.10 - 0.5.23 has it). Rows whose scores are all NaN get what aiter's
    HIP ``biased_grouped_topk_kernel`` (``csrc/kernels/topk_softmax_kernels_group.cu``)
    gives them: it selects with ``if (score > max_val)`` from ``-INFINITY`` and stores a
    choice only ``if (max_idx != -1)``; NaN never compares greater, so the row's ids and
    weights are copied from uninitialized LDS, here :func:`stale_lds_words` (ids as int32,
    weights as the same kind of words read as float32)."""
    impl = getattr(topk_module, "biased_grouped_topk_impl", None)
    if impl is None:
        raise RuntimeError(
            f"{getattr(topk_module, '__file__', topk_module)} has no biased_grouped_topk_impl: "
            "the check routes with SGLang's own grouped router and cannot run on this release"
        )
    impl = getattr(impl, "_torchdynamo_orig_callable", impl)
    calls: list[int] = []  # how many NaN batches it has routed

    def route(hidden_states, gating_output, topk, renormalize, **_):  # as SGLang calls it
        args = (hidden_states, gating_output, bias, topk, renormalize, cfg.n_group, cfg.topk_group)
        w, ids = impl(*args)
        w, ids = w.float().contiguous(), ids.to(torch.int32).contiguous()
        nan_rows = torch.isnan(gating_output.float()).all(dim=-1)
        if bool(nan_rows.any()):
            calls.append(1)
            shape, at = (int(nan_rows.sum()), ids.shape[1]), seed * 1000 + len(calls)
            ids[nan_rows] = stale_lds_words(*shape, at, ids.device)
            w[nan_rows] = stale_lds_words(*shape, at + 500, ids.device).view(torch.float32)
        return w, ids

    return route


def legacy_hip_sort(
    ids: torch.Tensor, weights: torch.Tensor, bufs: SortBuffers, m: int, ne: int, k: int, mb: int
) -> int:
    """aiter's MXFP4 sort before it learned to drop bad ids; returns the global stores dropped.

    Emulated: ``sort_subkernel`` of ``csrc/kernels/mxfp4_moe/moe_aux/moe_sort_quant.cuh``
    before ``is_valid_expert`` (e.g. aiter commit f1a213f): three LDS tables indexed with
    the raw id, unchecked (``atomicAdd(&count[eid], 1)``, ``pos = atomicAdd(&counter[eid],
    1)``, the pair stored at ``cumsum[eid] + pos``), then ``fill_padding_gaps`` pads each
    expert's range from ``count[e]`` up to ``cumsum[e + 1]``.

    Assumed, the device behaviour being undefined: the tables lie in one LDS array in
    declaration order (``count[max(NE, 256)]``, ``cumsum[NE + 1]``, ``counter[NE]``); an
    access outside it reads 0 and drops the write; ``count[NE:]`` reads 0; atomics land in
    ascending pair order; a global store outside its buffer is dropped. For ids in
    ``[0, NE)`` it writes what this package's reference writes (the tests check it)."""
    ids, weights = ids[:m].reshape(-1).tolist(), weights[:m].reshape(-1).tolist()  # as lists
    n_count = max(ne, THREADS_PER_CTA)
    base_count, base_cumsum, base_counter = 0, n_count, n_count + ne + 1
    lds = [0] * (base_counter + ne)

    def load(i: int) -> int:
        return lds[i] if 0 <= i < len(lds) else 0

    def atomic_add(i: int, v: int) -> int:
        old = load(i)
        if 0 <= i < len(lds):
            lds[i] = old + v
        return old

    # count_tokens_per_expert
    for eid in ids:
        atomic_add(base_count + eid, 1)
    # parallel_cumsum
    running = 0
    for e in range(ne):
        running += -(-lds[base_count + e] // mb) * mb
        lds[base_cumsum + e + 1] = running
        lds[base_counter + e] = 0
    # place_tokens
    st, mi, sw, rev, sei = [], [], [], [], []  # (index, value) stores, applied below
    dropped, n_slots = 0, bufs.sorted_token_ids.numel()
    for i, eid in enumerate(ids):
        pos = atomic_add(base_counter + eid, 1)
        sp = load(base_cumsum + eid) + pos
        t, s = divmod(i, k)
        if 0 <= sp < n_slots:
            st.append((sp, (t & 0xFFFFFF) | ((s & 0xFF) << 24)))
            mi.append((sp, t & 0xFFFFFF))
            sw.append((sp, weights[i]))
        else:
            dropped += 3
        rev.append(sp)
    # fill_padding_gaps (runs after place_tokens: it overwrites what lies in a gap)
    for e in range(ne):
        cnt, start, end = lds[base_count + e], lds[base_cumsum + e], lds[base_cumsum + e + 1]
        for j in range(start + cnt, end):
            if 0 <= j < n_slots:
                st.append((j, m & 0xFFFFFF))
                mi.append((j, m & 0xFFFFFF))
                sw.append((j, 0.0))
            else:
                dropped += 3
        for b in range(start // mb, end // mb):
            if 0 <= b < bufs.sorted_expert_ids.numel():
                sei.append((b, e))
            else:
                dropped += 1

    def store(buf: torch.Tensor, pairs: list[tuple[int, float]]) -> None:
        if pairs:
            idx = torch.tensor([p[0] for p in pairs], dtype=torch.long)
            val = torch.tensor([p[1] for p in pairs], dtype=buf.dtype)
            cpu = buf.cpu()
            cpu[idx] = val  # later stores win, as in program order
            buf.copy_(cpu)

    store(bufs.sorted_token_ids, st)
    store(bufs.m_indices, mi)
    store(bufs.sorted_weights, sw)
    store(bufs.sorted_expert_ids, sei)
    rev32 = torch.tensor(rev, dtype=torch.int64).clamp(-(2**31), 2**31 - 1).to(torch.int32)
    bufs.reverse_sorted[: m * k] = rev32.to(bufs.reverse_sorted.device)
    bufs.cumsum[0], bufs.cumsum[1] = lds[base_cumsum + ne], m
    return dropped

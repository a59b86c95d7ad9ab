"""The MXFP4 MoE aux sort in portable Triton, honoring ``num_local_tokens``.

Why this exists: aiter's fused MXFP4 path sorts routing pairs with a HIP kernel
(``aiter.mxfp4_moe_sort``) that has no notion of padded CUDA-graph rows: the caller's
real-row count (``num_local_tokens``) is dropped, so the garbage or -1 ids of padded
rows are sorted as if they were experts. :func:`mxfp4_moe_sort` is a drop-in with the
same keyword arguments plus a trailing ``num_local_tokens``; it writes the output
contract of the HIP kernel for the leading ``n`` rows only (``n`` read on the device),
and is stronger in three ways:

* deterministic: within an expert, pairs appear in ascending pair index (the HIP kernel
  places them with atomics), so identical calls give bit-identical outputs;
* ids outside ``[0, NE)`` in the real rows are dropped (``reverse_sorted = -1``),
  never counted into any expert's slots (older HIP kernels indexed ``count[-1]``);
* any ``M`` works, from 1 to beyond 65536 (the HIP kernel's single-CTA sort is sized
  for small ``M``).

Design. Pair ``i`` (token ``i // TOPK``, slot ``i % TOPK``) routed to expert ``e``
lands at ``start[e] + (pairs of e in earlier chunks) + (earlier pairs of e in its
chunk)``, where ``start`` is the exclusive prefix sum over experts of their pair
counts rounded up to ``MB``. The pairs are cut into chunks of 32 or 64; a pair's rank
inside its chunk is a row sum of the chunk's expert-equality matrix (lower triangle).
No sort, no histogram op and no atomics: the result is deterministic by construction,
and nothing here is CUDA-only. :func:`sort_plan` says what a shape launches.

* Single launch, when ``next_pow2(M * TOPK) <= 64`` and ``next_pow2(M * TOPK) *
  next_pow2(NE + 1) <= 16384`` (at NE 513/896 that is M = 1 with TOPK 9..16): the
  place kernel counts the experts itself.
* Otherwise the count kernel (one program per chunk) zeroes its chunk's row of an
  int32 count table, then writes each pair's in-chunk rank and the chunk's count of
  each present expert; then the place kernel (one program per chunk) writes the pairs.
  Each pair needs its chunk's offset per expert (the counts of the earlier chunks) and
  every expert's total. While the count table has at most ``INLINE_OFFSETS_MAX_ELEMS``
  values (``chunks * next_pow2(NE + 1)``), each place program sums it itself: two
  launches. Past that, an offsets kernel between the two (one program per few experts)
  turns the counts, in place, into each chunk's offsets and appends the totals: three.

The place kernel's grid also has programs that fill the gap slots of 64 experts each,
and programs that zero ``bf16_zero_out`` (stage 2 accumulates into it), so the zeroing
overlaps the sort. Nothing on the host depends on the count: grids and the scratch
size depend on shapes only, so a call can be captured in a CUDA/HIP graph and replayed
with a new count. The same source runs on ROCm, NVIDIA and, with ``TRITON_INTERPRET=1``,
on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._validate import (
    MAX_SORT_EXPERTS,
    MAX_SORT_TOPK,
    SORT_BLOCK_SIZES,
    check_int,
    check_sort_args,
    check_tensor,
)
from .reference import mxfp4_moe_sort_reference
from .utils import device_guard, launch, max_sorted_size, triton_backend

# Pairs per chunk: a chunk's pairs are ranked with one [chunk, chunk] comparison (a
# power of two; 64 keeps it at 32 values per thread with 4 warps). Up to
# SMALL_BATCH_PAIRS pairs, smaller chunks (more programs, shorter each) were faster on
# an H200; past it, 64.
CHUNK_PAIRS = 64
SMALL_BATCH_CHUNK_PAIRS = 32
SMALL_BATCH_PAIRS = 2048
# The single-launch path (all pairs in one chunk of at most CHUNK_PAIRS) counts every
# expert in one [next_pow2(NE + 1), pairs] comparison: used while that has at most
# SINGLE_MAX_ELEMS values.
SINGLE_MAX_ELEMS = 16384
# Offsets kernel: each program scans OFFSET_TILE values per step, rows (chunks) x experts:
# as many chunk rows as there are chunks, up to OFFSET_MAX_ROWS, so that large batches
# take few serial steps (each step waits on its loads) and get more programs.
OFFSET_TILE = 2048
OFFSET_MAX_ROWS = 512
# While the per-chunk count table ([chunks, next_pow2(NE + 1)]) has at most this many
# values, every place program sums it itself (its chunk's offsets and the totals) and
# the offsets kernel is not launched: a launch costs more than the redundant reads.
INLINE_OFFSETS_MAX_ELEMS = 16384
# Count-table values one place program reads per step on the inline-offsets path.
INLINE_OFFSETS_TILE = 4096
# The count kernel zeroes its chunk's row of the count table in tiles of this many.
COUNT_ROW_TILE = 1024
# Experts whose gap slots one program fills.
GAP_EXPERTS = 64
# bf16_zero_out elements one zeroing program clears, in tiles of ZERO_TILE.
ZERO_PER_PROGRAM = 32768
ZERO_TILE = 4096
# Warps per program of the count, offsets and place kernels. The count kernel's
# [chunk, chunk] comparison is its cost: with 8 warps it was faster with a count at every
# shape measured on an H200 (M 512-16384; e.g. 60.9 against 61.9 us at 896/16 M 16384),
# and without a count faster at 257/9 and 513/11 but slower at 896/16 from M 4096 on.
COUNT_NUM_WARPS = 8
OFFSETS_NUM_WARPS = 4
PLACE_NUM_WARPS = 4
# The single-launch path compares a [next_pow2(NE + 1), pairs] tile in one program: more
# warps share it (measured faster on an H200 at M = 1, NE 513 and 896).
SINGLE_NUM_WARPS = 8


@triton.jit
def _real_rows(count_ptr, M, HAS_COUNT: tl.constexpr):
    """The real row count: the device count clamped to [0, M], or M without one."""
    if HAS_COUNT:
        n = tl.load(count_ptr).to(tl.int64)
        n = tl.minimum(tl.maximum(n, 0), M).to(tl.int32)
    else:
        n = M + tl.zeros([], dtype=tl.int32)
    return n


@triton.jit
def _expert_of(ids_ptr, idx, limit, bound, stride_ids, NE: tl.constexpr, K: tl.constexpr):
    """Expert of pairs ``idx``; ``NE`` (a spare value) for pairs at or past ``limit``
    (padded rows) and for ids outside ``[0, NE)``. The load is bounded by ``bound`` (all
    pairs), not by ``limit``, so it need not wait for the device count."""
    tok = idx // K
    e = tl.load(
        ids_ptr + tok.to(tl.int64) * stride_ids + (idx - tok * K), mask=idx < bound, other=NE
    )
    valid = (idx < limit) & (e >= 0) & (e < NE)  # range check before narrowing int64 ids
    return tl.where(valid, e, NE).to(tl.int32)


@triton.jit
def _sort_count_kernel(
    ids_ptr,
    count_ptr,
    scratch_ptr,
    rank_ptr,
    M,
    stride_ids,
    NE: tl.constexpr,
    K: tl.constexpr,
    CH: tl.constexpr,
    ZT: tl.constexpr,
    HAS_COUNT: tl.constexpr,
):
    """For chunk ``pid``: each pair's rank among the earlier pairs of its expert in the
    chunk (-> ``rank_ptr``), and the chunk's count of every expert (-> scratch row
    ``pid``: zeroed here, then each present expert's count, written by its last pair so
    no two lanes collide)."""
    chunk = tl.program_id(0)
    row = scratch_ptr + chunk.to(tl.int64) * NE
    # Zero the row here rather than with a memset launch before this kernel (a launch
    # costs more than the stores). The barrier orders these stores before the counts.
    for z0 in range(0, NE, ZT):
        z = z0 + tl.arange(0, ZT)
        tl.store(row + z, tl.zeros([ZT], dtype=tl.int32), mask=z < NE)
    n = _real_rows(count_ptr, M, HAS_COUNT)
    lane = tl.arange(0, CH)
    idx = chunk * CH + lane
    # The ranks do not depend on the count: padded pairs come after every real pair, so
    # a real pair's earlier pairs are all real. Only the counts mask the padded pairs
    # out, so the comparisons run while the count is still being loaded.
    all_pairs = M * K
    e = _expert_of(ids_ptr, idx, all_pairs, all_pairs, stride_ids, NE, K)
    same = e[:, None] == e[None, :]
    rank = tl.sum((same & (lane[None, :] < lane[:, None])).to(tl.int32), axis=1)
    real = idx < n * K
    count = tl.sum((same & real[None, :]).to(tl.int32), axis=1)
    tl.store(rank_ptr + chunk.to(tl.int64) * CH + lane, rank)
    tl.debug_barrier()
    # The last real pair of each present expert writes its count.
    tl.store(row + e, count, mask=real & (e < NE) & (rank == count - 1))


@triton.jit(do_not_specialize=["num_chunks"])
def _sort_offsets_kernel(
    scratch_ptr,
    num_chunks,
    NE: tl.constexpr,
    ES: tl.constexpr,
    ROWS: tl.constexpr,
):
    """For a strip of experts: counts -> exclusive prefix over chunks (in place), and
    the per-expert totals into the row after the last chunk."""
    experts = tl.program_id(0) * ES + tl.arange(0, ES)
    live = experts < NE
    running = tl.zeros([ES], dtype=tl.int32)
    for r0 in range(0, num_chunks, ROWS):
        r = r0 + tl.arange(0, ROWS)
        ptrs = scratch_ptr + r.to(tl.int64)[:, None] * NE + experts[None, :]
        m = (r < num_chunks)[:, None] & live[None, :]
        rows = tl.load(ptrs, mask=m, other=0)
        tl.store(ptrs, running[None, :] + tl.cumsum(rows, axis=0) - rows, mask=m)
        running += tl.sum(rows, axis=0)
    tl.store(scratch_ptr + num_chunks.to(tl.int64) * NE + experts, running, mask=live)


@triton.jit(do_not_specialize=["num_chunks", "num_sort_programs"])
def _sort_place_kernel(
    ids_ptr,
    w_ptr,
    count_ptr,
    scratch_ptr,
    rank_ptr,
    sorted_token_ids_ptr,
    sorted_expert_ids_ptr,
    cumsum_ptr,
    reverse_sorted_ptr,
    sorted_weights_ptr,
    m_indices_ptr,
    zero_ptr,
    M,
    stride_ids,
    stride_w,
    num_chunks,
    num_sort_programs,
    zero_numel,
    NE: tl.constexpr,
    K: tl.constexpr,
    B: tl.constexpr,
    NE_B: tl.constexpr,
    CH: tl.constexpr,
    GE: tl.constexpr,
    ZCH: tl.constexpr,
    ZB: tl.constexpr,
    RT: tl.constexpr,
    HAS_COUNT: tl.constexpr,
    SINGLE: tl.constexpr,
    INLINE: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < num_sort_programs:
        n = _real_rows(count_ptr, M, HAS_COUNT)
        real_pairs = n * K
        all_pairs = M * K
        experts = tl.arange(0, NE_B)
        lane = tl.arange(0, CH)
        if SINGLE:
            # One chunk: count it here (no scratch); its offsets are all zero.
            e_chunk = _expert_of(ids_ptr, lane, real_pairs, all_pairs, stride_ids, NE, K)
            totals = tl.sum((e_chunk[None, :] == experts[:, None]).to(tl.int32), axis=1)
            totals = tl.where(experts < NE, totals, 0)
        elif INLINE:
            # Sum the count table here: every expert's total, and this chunk's offset
            # per expert (the counts of the chunks before it).
            totals = tl.zeros([NE_B], dtype=tl.int32)
            before = tl.zeros([NE_B], dtype=tl.int32)
            for r0 in range(0, num_chunks, RT):
                r = r0 + tl.arange(0, RT)
                counts = tl.load(
                    scratch_ptr + r.to(tl.int64)[:, None] * NE + experts[None, :],
                    mask=(r < num_chunks)[:, None] & (experts < NE)[None, :],
                    other=0,
                )
                totals += tl.sum(counts, axis=0)
                before += tl.sum(tl.where((r < pid)[:, None], counts, 0), axis=0)
        else:
            totals = tl.load(
                scratch_ptr + num_chunks.to(tl.int64) * NE + experts,
                mask=experts < NE,
                other=0,
            )
        padded = (totals + (B - 1)) // B * B
        start = tl.cumsum(padded, axis=0) - padded
        if pid == 0:
            tl.store(cumsum_ptr, tl.sum(padded, axis=0))
            tl.store(cumsum_ptr + 1, n)

        if pid < num_chunks:
            # Place the chunk's pairs: rank among earlier pairs of the same expert.
            # Everything up to the stores is independent of the count (padded pairs come
            # after every real pair, so a real pair's rank and offset never involve
            # them), so these loads are in flight together with the count's.
            idx = pid * CH + lane
            e = _expert_of(ids_ptr, idx, all_pairs, all_pairs, stride_ids, NE, K)
            known = e < NE
            tok = idx // K
            k_slot = idx - tok * K
            w = tl.load(w_ptr + tok.to(tl.int64) * stride_w + k_slot, mask=known, other=0.0)
            if SINGLE:
                earlier = lane[None, :] < lane[:, None]
                rank = tl.sum(((e[:, None] == e[None, :]) & earlier).to(tl.int32), axis=1)
                slot = tl.gather(start, e, 0) + rank
            elif INLINE:
                rank = tl.load(rank_ptr + pid.to(tl.int64) * CH + lane)
                slot = tl.gather(start + before, e, 0) + rank
            else:
                # rank from the count kernel; the chunk's offset from the offsets kernel
                rank = tl.load(rank_ptr + pid.to(tl.int64) * CH + lane)
                first = tl.load(scratch_ptr + pid.to(tl.int64) * NE + e, mask=known, other=0)
                slot = tl.gather(start, e, 0) + first + rank
            ok = known & (idx < real_pairs)
            tl.store(sorted_token_ids_ptr + slot, tok | (k_slot << 24), mask=ok)
            tl.store(m_indices_ptr + slot, tok, mask=ok)
            tl.store(sorted_weights_ptr + slot, w.to(tl.float32), mask=ok)
            # Every block of an expert begins with a real pair: it names the block.
            tl.store(sorted_expert_ids_ptr + slot // B, e, mask=ok & (slot % B == 0))
            tl.store(reverse_sorted_ptr + idx, tl.where(ok, slot, -1), mask=idx < all_pairs)
        else:
            # Gap slots (row M, weight 0) after the real pairs of GE experts.
            ge = (pid - num_chunks) * GE + tl.arange(0, GE)
            live = ge < NE
            ge = tl.where(live, ge, 0)
            counts = tl.gather(totals, ge, 0)
            gap_start = tl.gather(start, ge, 0) + counts
            gap_len = tl.where(live, tl.gather(padded, ge, 0) - counts, 0)
            g = tl.arange(0, B)
            pos = gap_start[:, None] + g[None, :]
            gap = g[None, :] < gap_len[:, None]
            tl.store(sorted_token_ids_ptr + pos, M + tl.zeros([GE, B], dtype=tl.int32), mask=gap)
            tl.store(m_indices_ptr + pos, M + tl.zeros([GE, B], dtype=tl.int32), mask=gap)
            tl.store(sorted_weights_ptr + pos, tl.zeros([GE, B], dtype=tl.float32), mask=gap)
    else:
        # Zero bf16_zero_out: stage 2 accumulates into all M rows.
        z0 = (pid - num_sort_programs).to(tl.int64) * ZCH
        for zs in range(0, ZCH, ZB):
            offs = z0 + zs + tl.arange(0, ZB)
            tl.store(
                zero_ptr + offs,
                tl.zeros([ZB], dtype=zero_ptr.dtype.element_ty),
                mask=offs < zero_numel,
            )


@dataclass(frozen=True)
class SortPlan:
    """How :func:`mxfp4_moe_sort` launches for one shape (it depends on shapes only)."""

    single: bool  # place kernel only (it counts the experts itself)
    inline_offsets: bool  # count + place, the place kernel sums the count table itself
    launches: int  # 1 (single), 2 (count, place) or 3 (count, offsets, place)
    chunks: int  # pair chunks: count-kernel programs and pair-placing programs
    chunk_pairs: int  # pairs per chunk (a power of two)
    experts_block: int  # next_pow2(NE + 1): the place kernel's per-expert vectors
    count_row_tile: int  # count kernel: row values zeroed per step
    inline_rows: int  # place kernel, inline offsets: count-table rows summed per step
    gap_programs: int  # place programs that fill gap slots (GAP_EXPERTS experts each)
    zero_programs: int  # place programs that zero bf16_zero_out
    offset_rows: int  # offsets kernel: chunk rows per step
    offset_experts: int  # offsets kernel: experts per program
    offset_programs: int  # offsets-kernel programs (0 when it is not launched)
    scratch_elems: int  # int32 scratch: counts [chunks, NE] | totals [NE] | ranks [pairs]


def sort_plan(M: int, NE: int, TOPK: int, zero_numel: int = 0) -> SortPlan:
    """The launch plan for ``M`` rows of ``TOPK`` pairs over ``NE`` experts."""
    pairs = max(M * TOPK, 1)
    pairs_p2 = triton.next_power_of_2(pairs)
    experts_p2 = triton.next_power_of_2(NE + 1)
    single = pairs_p2 <= CHUNK_PAIRS and pairs_p2 * experts_p2 <= SINGLE_MAX_ELEMS
    if single:
        chunk = pairs_p2
    else:
        chunk = SMALL_BATCH_CHUNK_PAIRS if pairs <= SMALL_BATCH_PAIRS else CHUNK_PAIRS
        chunk = min(chunk, pairs_p2)
    chunks = triton.cdiv(pairs, chunk)
    inline = not single and chunks * experts_p2 <= INLINE_OFFSETS_MAX_ELEMS
    offset_rows = min(triton.next_power_of_2(chunks), OFFSET_MAX_ROWS)
    offset_experts = max(1, min(OFFSET_TILE // offset_rows, triton.next_power_of_2(NE)))
    return SortPlan(
        single=single,
        inline_offsets=inline,
        launches=1 if single else 2 if inline else 3,
        chunks=chunks,
        chunk_pairs=chunk,
        experts_block=experts_p2,
        count_row_tile=min(COUNT_ROW_TILE, triton.next_power_of_2(NE)),
        inline_rows=max(1, INLINE_OFFSETS_TILE // experts_p2),
        gap_programs=triton.cdiv(NE, GAP_EXPERTS),
        zero_programs=triton.cdiv(zero_numel, ZERO_PER_PROGRAM),
        offset_rows=offset_rows,
        offset_experts=offset_experts,
        offset_programs=0 if single or inline else triton.cdiv(NE, offset_experts),
        scratch_elems=0 if single else (chunks + 1) * NE + chunks * chunk,
    )


def mxfp4_moe_sort(
    topk_ids: torch.Tensor,
    topk_weight: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    sorted_expert_ids: torch.Tensor,
    cumsum_tensor: torch.Tensor,
    reverse_sorted: torch.Tensor,
    sorted_weights: torch.Tensor,
    m_indices: torch.Tensor,
    bf16_zero_out: torch.Tensor,
    bf16_zero_workspace: torch.Tensor,
    M_logical: int,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    D_INTER: int,
    MB: int,
    prologue: int,
    num_local_tokens: torch.Tensor | None = None,
) -> None:
    """Drop-in for ``aiter.mxfp4_moe_sort`` that honors ``num_local_tokens``.

    With ``n`` real rows (``num_local_tokens`` clamped to ``[0, M_logical]`` on the
    device; ``M_logical`` without it), for ``M = M_logical``, ``K = TOPK``, ``B = MB``:
    pair ``i < n*K`` (token ``t = i // K``, slot ``s = i % K``, expert ``e``) goes to
    slot ``sp = start[e] + rank`` (``rank`` in ascending pair order), where ``start`` is
    the exclusive prefix sum over experts of their pair counts rounded up to ``B``:
    ``sorted_token_ids[sp] = t | (s << 24)``, ``m_indices[sp] = t``,
    ``sorted_weights[sp] = topk_weight[t, s]``, ``reverse_sorted[i] = sp``. Gap slots up to
    each expert's rounded end get ``M``, ``M``, ``0``; ``sorted_expert_ids[b]`` names the
    expert of block ``b``; ``cumsum_tensor = [total slots, n]``; ``reverse_sorted[i] = -1``
    for ``i >= n*K`` and for ids outside ``[0, NE)``. A non-empty ``bf16_zero_out``
    (``M * D_HIDDEN`` elements) and ``bf16_zero_workspace`` are zeroed. Slots past the
    total are not written. ``prologue`` (0 or 1) and ``D_INTER`` pick the HIP kernel's
    strategy and do not change the outputs.

    ``topk_ids`` int32/int64 and ``topk_weight`` float32/bfloat16/float16, ``[rows >= M,
    TOPK]`` with unit column stride; outputs int32 (``sorted_weights`` float32),
    contiguous, at least as large as aiter's ``_adaptive_moe_sort`` allocates them. Bad
    inputs raise ``TypeError``/``ValueError`` before anything is written. No host
    synchronization; capturable in a CUDA/HIP graph.
    """
    args = (
        topk_ids, topk_weight, sorted_token_ids, sorted_expert_ids, cumsum_tensor,
        reverse_sorted, sorted_weights, m_indices, bf16_zero_out, bf16_zero_workspace,
        M_logical, NE, TOPK, D_HIDDEN, D_INTER, MB, prologue, num_local_tokens,
    )  # fmt: skip
    m, ne, k, mb, count = check_sort_args(*args)
    device = topk_ids.device
    if triton_backend(device) == "torch-reference":
        mxfp4_moe_sort_reference(*args)
        return

    zero_numel = bf16_zero_out.numel()
    plan = sort_plan(m, ne, k, zero_numel)
    has_count = count is not None
    count_arg = count if has_count else cumsum_tensor  # placeholder when there is none
    with device_guard(device):
        if plan.single:
            scratch = ranks = cumsum_tensor  # placeholders, never read
        else:
            buf = torch.empty(plan.scratch_elems, dtype=torch.int32, device=device)
            ranks_at = plan.scratch_elems - plan.chunks * plan.chunk_pairs
            scratch, ranks = buf[:ranks_at], buf[ranks_at:]
            launch(
                _sort_count_kernel,
                (plan.chunks,),
                topk_ids,
                count_arg,
                scratch,
                ranks,
                m,
                topk_ids.stride(0),
                NE=ne,
                K=k,
                CH=plan.chunk_pairs,
                ZT=plan.count_row_tile,
                HAS_COUNT=has_count,
                num_warps=COUNT_NUM_WARPS,
            )
            if plan.offset_programs:
                launch(
                    _sort_offsets_kernel,
                    (plan.offset_programs,),
                    scratch,
                    plan.chunks,
                    NE=ne,
                    ES=plan.offset_experts,
                    ROWS=plan.offset_rows,
                    num_warps=OFFSETS_NUM_WARPS,
                )
        sort_programs = plan.chunks + plan.gap_programs
        launch(
            _sort_place_kernel,
            (sort_programs + plan.zero_programs,),
            topk_ids,
            topk_weight,
            count_arg,
            scratch,
            ranks,
            sorted_token_ids,
            sorted_expert_ids,
            cumsum_tensor,
            reverse_sorted,
            sorted_weights,
            m_indices,
            bf16_zero_out if zero_numel > 0 else sorted_weights,
            m,
            topk_ids.stride(0),
            topk_weight.stride(0),
            plan.chunks,
            sort_programs,
            zero_numel,
            NE=ne,
            K=k,
            B=mb,
            NE_B=plan.experts_block,
            CH=plan.chunk_pairs,
            GE=GAP_EXPERTS,
            ZCH=ZERO_PER_PROGRAM,
            ZB=ZERO_TILE,
            RT=plan.inline_rows,
            HAS_COUNT=has_count,
            SINGLE=plan.single,
            INLINE=plan.inline_offsets,
            num_warps=SINGLE_NUM_WARPS if plan.single else PLACE_NUM_WARPS,
        )
    if bf16_zero_workspace.numel() > 0:
        bf16_zero_workspace.zero_()


def adaptive_moe_sort(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    topk: int,
    block_size: int,
    model_dim: int,
    *,
    atomic: bool = False,
    emit_aux: bool = False,
    moebuf_dtype: torch.dtype = torch.bfloat16,
    num_local_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """aiter's ``_adaptive_moe_sort`` with the count passed through to the sort.

    Allocates exactly what aiter allocates (sizes depend on shapes only, never on the
    count, so a captured graph stays valid for every count) and returns
    ``(sorted_token_ids, sorted_weights, sorted_expert_ids, num_valid_ids, moe_buf)``,
    plus ``(m_indices, reverse_sorted)`` when ``emit_aux``. ``moe_buf`` is ``[M,
    model_dim]`` when ``atomic`` (zeroed by the sort only when ``block_size == 16``, as
    in aiter) and ``[0, 0]`` otherwise.
    """
    topk_ids = check_tensor("topk_ids", topk_ids)
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be 2-D [rows, topk], got shape {tuple(topk_ids.shape)}")
    num_experts = check_int("num_experts", num_experts, 1, MAX_SORT_EXPERTS)
    topk = check_int("topk", topk, 1, MAX_SORT_TOPK)
    BM = check_int("block_size", block_size)
    if BM not in SORT_BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {SORT_BLOCK_SIZES}, got {BM}")
    model_dim = check_int("model_dim", model_dim, 0)
    device = topk_ids.device
    M = topk_ids.shape[0]
    max_sorted = max_sorted_size(M, topk, num_experts, BM)
    i32 = torch.int32
    sorted_token_ids = torch.empty(max_sorted, dtype=i32, device=device)
    sorted_expert_ids = torch.empty(max_sorted // BM, dtype=i32, device=device)
    num_valid_ids = torch.empty(2, dtype=i32, device=device)
    sorted_weights = torch.empty(max_sorted, dtype=torch.float32, device=device)
    reverse_sorted = torch.empty(M * topk, dtype=i32, device=device)
    m_indices = torch.empty(max_sorted, dtype=i32, device=device)
    moe_buf = (
        torch.empty((M, model_dim), dtype=moebuf_dtype, device=device)
        if atomic
        else torch.empty((0, 0), dtype=moebuf_dtype, device=device)
    )
    empty_bf16 = torch.empty(0, dtype=torch.bfloat16, device=device)
    mxfp4_moe_sort(
        topk_ids=topk_ids,
        topk_weight=topk_weights,
        sorted_token_ids=sorted_token_ids,
        sorted_expert_ids=sorted_expert_ids,
        cumsum_tensor=num_valid_ids,
        reverse_sorted=reverse_sorted,
        sorted_weights=sorted_weights,
        m_indices=m_indices,
        bf16_zero_out=moe_buf if (atomic and BM == 16) else empty_bf16,
        bf16_zero_workspace=empty_bf16,
        M_logical=M,
        NE=num_experts,
        TOPK=topk,
        D_HIDDEN=model_dim,
        D_INTER=1,
        MB=BM,
        prologue=0 if BM == 16 else 1,
        num_local_tokens=num_local_tokens,
    )
    std = (sorted_token_ids, sorted_weights, sorted_expert_ids, num_valid_ids, moe_buf)
    if emit_aux:
        return (*std, m_indices, reverse_sorted)
    return std

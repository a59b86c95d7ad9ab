"""The MXFP4 MoE aux sort in portable Triton, honoring ``num_local_tokens``.

Why this exists: aiter's fused MXFP4 path sorts routing pairs with a HIP kernel
(``aiter.mxfp4_moe_sort``) that has no notion of padded CUDA-graph rows: the caller's
real-row count (``num_local_tokens``) is dropped, so the garbage or -1 ids of padded
rows are sorted as if they were experts. :func:`mxfp4_moe_sort` is a drop-in with the
same keyword arguments plus a trailing ``num_local_tokens``; it writes the output
contract of the HIP kernel for the leading ``n`` rows only (``n`` read on the device),
and is stronger in three ways:

* deterministic below ``ATOMIC_MIN_ROWS`` (8192) rows or ``ATOMIC_MIN_EXPERTS`` (768)
  experts, and at every size with ``SGLANG_AMD_MOE_DETERMINISTIC_SORT=1``: within an
  expert, pairs appear in ascending
  pair index (the HIP kernel places them with atomics), so identical calls give
  bit-identical outputs;
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

* Single launch, up to ``TINY_PAIRS`` (32) pairs: one program works in pair space
  (:func:`_sort_tiny_kernel`): [pairs, pairs] comparisons give every pair its rank, its
  expert's count and first slot, whatever NE.
* Otherwise the count kernel (one program per chunk) zeroes its chunk's row of an
  int32 count table, then writes each pair's in-chunk rank and the chunk's count of
  each present expert; then the place kernel (one program per chunk) writes the pairs.
  Each pair needs its chunk's offset per expert (the counts of the earlier chunks) and
  every expert's total. While the count table has at most ``INLINE_OFFSETS_MAX_ELEMS``
  values (``chunks * next_pow2(NE + 1)``), each place program sums it itself: two
  launches. Past that, an offsets kernel between the two (one program per strip of
  experts) writes, for every group of ``GROUP_CHUNKS`` consecutive chunks, the counts
  of all chunks before the group, and the totals; a place program adds the counts of
  the earlier chunks of its own group (at most ``GROUP_CHUNKS - 1`` rows): three
  launches.

The place kernel's grid also has programs that fill the gap slots of a few experts
each, and programs that zero ``bf16_zero_out`` (stage 2 accumulates into it), so the
zeroing overlaps the sort. Nothing on the host depends on the count: grids and the
scratch size depend on shapes only, so a call can be captured in a CUDA/HIP graph and
replayed with a new count. The same source runs on ROCm, NVIDIA and, with
``TRITON_INTERPRET=1``, on the CPU.

Large batches over many experts (``M >= ATOMIC_MIN_ROWS`` and ``NE >=
ATOMIC_MIN_EXPERTS``), as the C++ aligns of SGLang and vLLM and
aiter's own HIP sort do: a count kernel histograms tiles of pairs into global counters
and the program with the last ticket turns them into starts and a cursor (resetting
the counters, so nothing is zeroed before a call); a place kernel gives each pair the
next slot of its expert with an atomic add. Counts, ``cumsum_tensor``,
``sorted_expert_ids``, the gap slots and which pairs are dropped are the same as the
deterministic path's; only the order of pairs within an expert depends on timing.
Callers that see it: any call with ``M >= 8192`` rows and ``NE >= 768`` experts
(prefill and other large eager batches of the largest models; CUDA-graph decode batches
are far smaller). aiter's consumers do not depend on
it: its own HIP sort places pairs with ``atomicAdd`` on the expert's counter
(``place_tokens`` in ``csrc/kernels/mxfp4_moe/moe_aux/moe_sort_quant.cuh``), its GEMM
stages compute each sorted row on its own, and its scatter-reduce
(``moe_scatter_reduce.cuh``) reads each token's rows through ``reverse_sorted`` in slot
order, so the per-token sum does not depend on where the rows sit.

Host cost. Everything that depends only on the shapes (the plan, the grids, the kernel
launchers with their constants) is built once per shape and cached
(:func:`sort_program`); the scratch buffer is reused between eager calls
(:func:`~sglang_amd_moe.kernels.utils.scratch`); the checks read metadata only;
:func:`adaptive_moe_sort` checks only its inputs and allocates its outputs as views of
one buffer; and a repeated signature takes a direct program (see ``mxfp4_moe_sort``),
one per row count, at most ``SORT_PROGRAMS`` of them kept (the least recently used go).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._validate import (
    check_int,
    check_sort_args,
    check_sort_inputs,
    check_tensor,
)
from .reference import mxfp4_moe_sort_reference
from .utils import (
    DirectProgram,
    KernelLauncher,
    capture_launches,
    device_guard,
    direct_calls_allowed,
    hip_buffers_small,
    launch_and_keep,
    launcher,
    lru_put,
    max_sorted_size,
    scratch,
    triton_backend,
    use_stamp,
    zeroed_state,
)

# Pairs per chunk: a chunk's pairs are ranked with one [chunk, chunk] comparison (a
# power of two; 64 keeps it at 32 values per thread with 4 warps). Up to
# SMALL_BATCH_PAIRS pairs, smaller chunks (more programs, shorter each) were faster on
# an H200; past it, 64. (Chunks of 128 pairs counted at 16 warps, which would keep two
# launches up to 4x further, took twice as long on an H200: 11.1 against 6.5 us at 257/9
# M 256, 8.8 against 5.8 at 896/16 M 64, run 11 against run 9.)
CHUNK_PAIRS = 64
SMALL_BATCH_CHUNK_PAIRS = 32
SMALL_BATCH_PAIRS = 2048
# Up to TINY_PAIRS (token, slot) pairs the whole sort is one program in pair space
# (_sort_tiny_kernel): [pairs, pairs] comparisons give each pair's rank, its expert's
# count and first slot, so the cost does not depend on the expert count. On an H200 it
# took 1.8-1.9 us at 9-16 pairs (M = 1; the former single launch 2.3-3.5), but 3.6-4.6
# us at 36-64 pairs (M = 4), no faster than two launches there (3.4-4.2).
TINY_PAIRS = 32
# While the per-chunk count table ([chunks, next_pow2(NE + 1)]) has at most this many
# values, every place program sums it itself (its chunk's offsets and the totals) and
# the offsets kernel is not launched: a launch costs more than the redundant reads.
INLINE_OFFSETS_MAX_ELEMS = 16384
# Count-table values one place program reads per step on the inline-offsets path: 8 per
# lane on AMD (4 waves of 64 lanes), which keeps the place kernel within 64 VGPRs (8
# waves per SIMD) on gfx942/gfx950. A place grid smaller than LATENCY_BOUND_GRID puts
# at most one program on a compute unit, so waves per SIMD beyond its own cannot be used
# there: such a grid reads 4096 values per step (about 90 VGPRs on AMD; 0.2-0.9 us
# faster per call at M 16-64 on an H200, where the sum is the place kernel's latency).
INLINE_OFFSETS_TILE = 2048
INLINE_OFFSETS_TILE_LATENCY_BOUND = 4096
# Programs below which a grid counts as latency-bound: the compute units of the smaller
# AMD target (256 on MI355X; MI300X has 304). tools/amd_compile's policy checks every
# compilation that runs fewer than 8 waves per SIMD against the targets' counts.
LATENCY_BOUND_GRID = 256
# Offsets kernel: it writes the running counts once per group of GROUP_CHUNKS chunks,
# to a table GROUP_CHUNKS times smaller than the count table; each place program adds
# the counts of the at most GROUP_CHUNKS - 1 earlier chunks of its group. On an H200 at
# M = 16384, groups of 4 took the sort from 60.9 to 51.7 us at 896/16 (the writes of
# the offsets kernel halve, then quarter, while the place kernel's extra reads stay few).
GROUP_CHUNKS = 4
# Offsets kernel: each program scans OFFSET_TILE values per step, rows (chunks) x
# experts: as many chunk rows as there are chunks, up to OFFSET_MAX_ROWS, so that large
# batches take few serial steps (each step waits on its loads) and get more programs.
# 1024 values (8 per lane on AMD) keep it within 64 VGPRs on gfx942/gfx950 (2048 needed
# 66-70 at NE 896: 7 waves per SIMD).
OFFSET_TILE = 1024
OFFSET_MAX_ROWS = 512
# The count kernel zeroes its chunk's row of the count table in tiles of this many.
COUNT_ROW_TILE = 1024
# Gap slots one gap-filling program covers (experts x MB): 64 experts per program at
# MB = 128 needed more registers on AMD than 8 waves per SIMD allow.
GAP_SLOTS = 2048
MAX_GAP_EXPERTS = 64
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
# The tiny path's [pairs, pairs] comparisons and [pairs, MB] gap tile in one program.
TINY_NUM_WARPS = 4
# From ATOMIC_MIN_ROWS rows on, with at least ATOMIC_MIN_EXPERTS experts, the sort
# counts into global counters and places pairs with an atomic cursor
# (_sort_atomic_count_kernel, _sort_atomic_place_kernel): there the dense per-chunk
# count table of the deterministic path costs more than the scatter. On an H200 at
# M = 16384 (run 11 against run 9): 896/16 41.7-43.8 us against 60.9-61.3 (half the
# rows padded) and 54.8-54.9 against 65.0-65.3 (none); but 257/9 36.0 against 31.5
# and 58.8-59.3 against 34.3-34.5, 513/11 40.6-40.7 against 40.2-40.6 and 57.7-57.9
# against 43.3-43.6: with fewer experts, more pairs contend for each cursor. Within an
# expert the pairs' order then depends on timing. SGLANG_AMD_MOE_DETERMINISTIC_SORT=1
# (read at import) keeps the deterministic path at every size.
ATOMIC_MIN_ROWS = 8192
ATOMIC_MIN_EXPERTS = 768
ATOMIC_COUNT_TILE = 4096  # pairs one count program histograms
ATOMIC_PLACE_TILE = 1024  # pairs one place program places
ATOMIC_COUNT_NUM_WARPS = 16  # 58 VGPRs at 1024 bins on gfx942 (8 warps: 70, 7 waves)
ATOMIC_PLACE_NUM_WARPS = 4
DETERMINISTIC = os.environ.get("SGLANG_AMD_MOE_DETERMINISTIC_SORT", "") in ("1", "true", "yes")


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
def _expert_of(ids_ptr, idx, limit, bound, stride_ids, NE: tl.constexpr, TOPK: tl.constexpr):
    """Expert of pairs ``idx``; ``NE`` (a spare value) for pairs at or past ``limit``
    (padded rows) and for ids outside ``[0, NE)``. The load is bounded by ``bound`` (all
    pairs), not by ``limit``, so it need not wait for the device count."""
    tok = idx // TOPK
    e = tl.load(
        ids_ptr + tok.to(tl.int64) * stride_ids + (idx - tok * TOPK),
        mask=idx < bound,
        other=NE,
    )
    valid = (idx < limit) & (e >= 0) & (e < NE)  # range check before narrowing int64 ids
    return tl.where(valid, e, NE).to(tl.int32)


@triton.jit
def _store_pairs(
    sorted_token_ids_ptr,
    m_indices_ptr,
    sorted_weights_ptr,
    sorted_expert_ids_ptr,
    reverse_sorted_ptr,
    idx,
    slot,
    e,
    tok,
    k_slot,
    w,
    ok,
    all_pairs,
    BLOCK: tl.constexpr,
):
    """Write pairs ``idx`` at their slots (where ``ok``) and every pair's reverse entry."""
    tl.store(sorted_token_ids_ptr + slot, tok | (k_slot << 24), mask=ok)
    tl.store(m_indices_ptr + slot, tok, mask=ok)
    tl.store(sorted_weights_ptr + slot, w.to(tl.float32), mask=ok)
    # Every block of an expert begins with a real pair: it names the block.
    tl.store(sorted_expert_ids_ptr + slot // BLOCK, e, mask=ok & (slot % BLOCK == 0))
    tl.store(reverse_sorted_ptr + idx, tl.where(ok, slot, -1), mask=idx < all_pairs)


@triton.jit
def _store_gaps(
    sorted_token_ids_ptr,
    m_indices_ptr,
    sorted_weights_ptr,
    gap_start,
    gap_len,
    M,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Fill ``gap_len[r]`` gap slots (row ``M``, weight 0) from ``gap_start[r]`` for each of
    ``ROWS`` experts (``gap_len < BLOCK``)."""
    g = tl.arange(0, BLOCK)
    pos = gap_start[:, None] + g[None, :]
    gap = g[None, :] < gap_len[:, None]
    row_m = M + tl.zeros([ROWS, BLOCK], dtype=tl.int32)
    tl.store(sorted_token_ids_ptr + pos, row_m, mask=gap)
    tl.store(m_indices_ptr + pos, row_m, mask=gap)
    tl.store(sorted_weights_ptr + pos, tl.zeros([ROWS, BLOCK], dtype=tl.float32), mask=gap)


@triton.jit
def _zero_part(zero_ptr, part, zero_numel, ZERO_PER_PROGRAM: tl.constexpr, ZERO_TILE: tl.constexpr):
    """Zero part ``part`` (``ZERO_PER_PROGRAM`` elements) of ``bf16_zero_out``: stage 2
    accumulates into all M rows."""
    z0 = part.to(tl.int64) * ZERO_PER_PROGRAM
    for zs in range(0, ZERO_PER_PROGRAM, ZERO_TILE):
        offs = z0 + zs + tl.arange(0, ZERO_TILE)
        tl.store(
            zero_ptr + offs,
            tl.zeros([ZERO_TILE], dtype=zero_ptr.dtype.element_ty),
            mask=offs < zero_numel,
        )


@triton.jit(do_not_specialize=["M"])
def _sort_count_kernel(
    ids_ptr,
    count_ptr,
    scratch_ptr,
    M,
    stride_ids,
    ranks_at,
    NE: tl.constexpr,
    TOPK: tl.constexpr,
    CHUNK_PAIRS: tl.constexpr,
    ROW_ZERO_TILE: tl.constexpr,
    HAS_COUNT: tl.constexpr,
):
    """Program ``c`` handles chunk ``c`` (pairs ``c * CHUNK_PAIRS`` onwards): it writes
    each pair's rank among the earlier pairs of its expert in the chunk (at
    ``scratch_ptr + ranks_at``) and the chunk's row ``c`` of the int32 count table
    (``NE`` values at ``scratch_ptr``): zeroed here, then each present expert's count of
    real pairs, written by its last pair so no two lanes store to one entry."""
    chunk = tl.program_id(0)
    row = scratch_ptr + chunk.to(tl.int64) * NE
    # Zero the row here rather than with a memset launch before this kernel (a launch
    # costs more than the stores). The barrier orders these stores before the counts.
    for z0 in range(0, NE, ROW_ZERO_TILE):
        z = z0 + tl.arange(0, ROW_ZERO_TILE)
        tl.store(row + z, tl.zeros([ROW_ZERO_TILE], dtype=tl.int32), mask=z < NE)
    n = _real_rows(count_ptr, M, HAS_COUNT)
    lane = tl.arange(0, CHUNK_PAIRS)
    idx = chunk * CHUNK_PAIRS + lane
    # The ranks do not depend on the count: padded pairs come after every real pair, so
    # a real pair's earlier pairs are all real. Only the counts mask the padded pairs
    # out, so the comparisons run while the count is still being loaded.
    all_pairs = M * TOPK
    e = _expert_of(ids_ptr, idx, all_pairs, all_pairs, stride_ids, NE, TOPK)
    same = e[:, None] == e[None, :]
    rank = tl.sum((same & (lane[None, :] < lane[:, None])).to(tl.int32), axis=1)
    real = idx < n * TOPK
    count = tl.sum((same & real[None, :]).to(tl.int32), axis=1)
    tl.store(scratch_ptr + ranks_at + chunk.to(tl.int64) * CHUNK_PAIRS + lane, rank)
    tl.debug_barrier()
    # The last real pair of each present expert writes its count.
    tl.store(row + e, count, mask=real & (e < NE) & (rank == count - 1))


@triton.jit(do_not_specialize=["num_chunks", "offsets_at"])
def _sort_offsets_kernel(
    scratch_ptr,
    num_chunks,
    offsets_at,
    NE: tl.constexpr,
    GROUP_CHUNKS: tl.constexpr,
    STRIP_EXPERTS: tl.constexpr,
    ROWS_PER_STEP: tl.constexpr,
):
    """Program ``s`` handles experts ``[s * STRIP_EXPERTS, (s + 1) * STRIP_EXPERTS)``:
    it scans the count table down the chunks and writes, for every group ``g`` of
    ``GROUP_CHUNKS`` chunks, the counts of the chunks before the group (``offsets[g, e]``
    at ``scratch_ptr + offsets_at``), and after the last group each expert's total. The
    count table is only read."""
    experts = tl.program_id(0) * STRIP_EXPERTS + tl.arange(0, STRIP_EXPERTS)
    live = experts < NE
    offsets = scratch_ptr + offsets_at
    running = tl.zeros([STRIP_EXPERTS], dtype=tl.int32)
    for r0 in range(0, num_chunks, ROWS_PER_STEP):
        r = r0 + tl.arange(0, ROWS_PER_STEP)
        m = (r < num_chunks)[:, None] & live[None, :]
        rows = tl.load(
            scratch_ptr + r.to(tl.int64)[:, None] * NE + experts[None, :], mask=m, other=0
        )
        before = running[None, :] + tl.cumsum(rows, axis=0) - rows
        # The first chunk of each group stores the counts before it, for its group.
        group = (r // GROUP_CHUNKS).to(tl.int64)
        first = m & (r % GROUP_CHUNKS == 0)[:, None]
        tl.store(offsets + group[:, None] * NE + experts[None, :], before, mask=first)
        running += tl.sum(rows, axis=0)
    num_groups = (num_chunks + GROUP_CHUNKS - 1) // GROUP_CHUNKS
    tl.store(offsets + num_groups.to(tl.int64) * NE + experts, running, mask=live)


@triton.jit(do_not_specialize=["M"])
def _sort_tiny_kernel(
    ids_ptr,
    w_ptr,
    count_ptr,
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
    zero_numel,
    NE: tl.constexpr,
    TOPK: tl.constexpr,
    BLOCK: tl.constexpr,
    PAIRS: tl.constexpr,
    ZERO_PER_PROGRAM: tl.constexpr,
    ZERO_TILE: tl.constexpr,
    HAS_COUNT: tl.constexpr,
):
    """The whole sort of at most ``PAIRS`` pairs in program 0, in pair space; programs
    ``p >= 1`` zero ``bf16_zero_out``.

    Pair ``i``'s rank is the number of earlier pairs with its expert, its expert's count
    the number of all such pairs; the expert's first pair (rank 0) stands for it: the
    expert's first slot is the sum of the padded counts of the first pairs of smaller
    experts, the total the sum over all first pairs, and the first pair fills its
    expert's gap slots. Nothing is indexed by expert, so the cost does not depend on NE.
    """
    pid = tl.program_id(0)
    if pid == 0:
        n = _real_rows(count_ptr, M, HAS_COUNT)
        all_pairs = M * TOPK
        lane = tl.arange(0, PAIRS)
        e = _expert_of(ids_ptr, lane, n * TOPK, all_pairs, stride_ids, NE, TOPK)
        valid = e < NE
        tok = lane // TOPK
        k_slot = lane - tok * TOPK
        w = tl.load(w_ptr + tok.to(tl.int64) * stride_w + k_slot, mask=valid, other=0.0)
        same = (e[:, None] == e[None, :]) & valid[None, :]
        rank = tl.sum((same & (lane[None, :] < lane[:, None])).to(tl.int32), axis=1)
        count = tl.sum(same.to(tl.int32), axis=1)
        padded = (count + (BLOCK - 1)) // BLOCK * BLOCK
        first = valid & (rank == 0)
        smaller = (e[None, :] < e[:, None]) & first[None, :]
        start = tl.sum(tl.where(smaller, padded[None, :], 0), axis=1)
        _store_pairs(
            sorted_token_ids_ptr, m_indices_ptr, sorted_weights_ptr, sorted_expert_ids_ptr,
            reverse_sorted_ptr, lane, start + rank, e, tok, k_slot, w, valid, all_pairs, BLOCK,
        )  # fmt: skip
        # Each expert's first pair fills its gap slots (row M, weight 0).
        _store_gaps(
            sorted_token_ids_ptr, m_indices_ptr, sorted_weights_ptr, start + count,
            tl.where(first, padded - count, 0), M, PAIRS, BLOCK,
        )  # fmt: skip
        tl.store(cumsum_ptr, tl.sum(tl.where(first, padded, 0), axis=0))
        tl.store(cumsum_ptr + 1, n)
    else:
        _zero_part(zero_ptr, pid - 1, zero_numel, ZERO_PER_PROGRAM, ZERO_TILE)


@triton.jit(do_not_specialize=["M", "num_chunks", "num_sort_programs", "offsets_at"])
def _sort_place_kernel(
    ids_ptr,
    w_ptr,
    count_ptr,
    scratch_ptr,
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
    ranks_at,
    offsets_at,
    num_chunks,
    num_sort_programs,
    zero_numel,
    NE: tl.constexpr,
    TOPK: tl.constexpr,
    BLOCK: tl.constexpr,
    EXPERT_SLOTS: tl.constexpr,
    CHUNK_PAIRS: tl.constexpr,
    GROUP_CHUNKS: tl.constexpr,
    GAP_EXPERTS: tl.constexpr,
    ZERO_PER_PROGRAM: tl.constexpr,
    ZERO_TILE: tl.constexpr,
    INLINE_ROWS: tl.constexpr,
    HAS_COUNT: tl.constexpr,
    INLINE: tl.constexpr,
):
    """Writes the sorted outputs. Programs by id ``p``:

    * ``p < num_chunks``: place the pairs of chunk ``p`` (``sorted_token_ids``,
      ``m_indices``, ``sorted_weights``, the ``sorted_expert_ids`` entry of every block
      one of them begins, and ``reverse_sorted`` for every pair of the chunk, real or
      not); program 0 also writes ``cumsum_tensor``.
    * ``num_chunks <= p < num_sort_programs``: fill the gap slots (row ``M``, weight 0)
      after the real pairs of ``GAP_EXPERTS`` experts.
    * ``p >= num_sort_programs``: zero ``ZERO_PER_PROGRAM`` elements of ``bf16_zero_out``.

    Every sort program first works out each expert's total and first slot: by summing
    the count table (``INLINE``), or by reading the totals the offsets kernel wrote.
    """
    pid = tl.program_id(0)
    if pid < num_sort_programs:
        n = _real_rows(count_ptr, M, HAS_COUNT)
        real_pairs = n * TOPK
        all_pairs = M * TOPK
        experts = tl.arange(0, EXPERT_SLOTS)
        lane = tl.arange(0, CHUNK_PAIRS)
        if INLINE:
            # Sum the count table here: every expert's total, and this chunk's offset
            # per expert (the counts of the chunks before it).
            totals = tl.zeros([EXPERT_SLOTS], dtype=tl.int32)
            before = tl.zeros([EXPERT_SLOTS], dtype=tl.int32)
            for r0 in range(0, num_chunks, INLINE_ROWS):
                r = r0 + tl.arange(0, INLINE_ROWS)
                counts = tl.load(
                    scratch_ptr + r.to(tl.int64)[:, None] * NE + experts[None, :],
                    mask=(r < num_chunks)[:, None] & (experts < NE)[None, :],
                    other=0,
                )
                totals += tl.sum(counts, axis=0)
                before += tl.sum(tl.where((r < pid)[:, None], counts, 0), axis=0)
        else:
            num_groups = (num_chunks + GROUP_CHUNKS - 1) // GROUP_CHUNKS
            totals = tl.load(
                scratch_ptr + offsets_at + num_groups.to(tl.int64) * NE + experts,
                mask=experts < NE,
                other=0,
            )
        padded = (totals + (BLOCK - 1)) // BLOCK * BLOCK
        start = tl.cumsum(padded, axis=0) - padded
        if pid == 0:
            tl.store(cumsum_ptr, tl.sum(padded, axis=0))
            tl.store(cumsum_ptr + 1, n)

        if pid < num_chunks:
            # Place the chunk's pairs: rank among earlier pairs of the same expert.
            # Everything up to the stores is independent of the count (padded pairs come
            # after every real pair, so a real pair's rank and offset never involve
            # them), so these loads are in flight together with the count's.
            idx = pid * CHUNK_PAIRS + lane
            e = _expert_of(ids_ptr, idx, all_pairs, all_pairs, stride_ids, NE, TOPK)
            known = e < NE
            tok = idx // TOPK
            k_slot = idx - tok * TOPK
            w = tl.load(w_ptr + tok.to(tl.int64) * stride_w + k_slot, mask=known, other=0.0)
            if INLINE:
                rank = tl.load(scratch_ptr + ranks_at + pid.to(tl.int64) * CHUNK_PAIRS + lane)
                slot = tl.gather(start + before, e, 0) + rank
            else:
                # The rank from the count kernel; the chunk's offset: the offsets
                # kernel's value for its group plus the counts of the group's earlier
                # chunks (one gather each, at most GROUP_CHUNKS - 1).
                rank = tl.load(scratch_ptr + ranks_at + pid.to(tl.int64) * CHUNK_PAIRS + lane)
                group = pid // GROUP_CHUNKS
                first = tl.load(
                    scratch_ptr + offsets_at + group.to(tl.int64) * NE + e, mask=known, other=0
                )
                for j in tl.static_range(GROUP_CHUNKS - 1):
                    row = group * GROUP_CHUNKS + j
                    first += tl.load(
                        scratch_ptr + row.to(tl.int64) * NE + e, mask=known & (row < pid), other=0
                    )
                slot = tl.gather(start, e, 0) + first + rank
            ok = known & (idx < real_pairs)
            _store_pairs(
                sorted_token_ids_ptr, m_indices_ptr, sorted_weights_ptr, sorted_expert_ids_ptr,
                reverse_sorted_ptr, idx, slot, e, tok, k_slot, w, ok, all_pairs, BLOCK,
            )  # fmt: skip
        else:
            # Gap slots (row M, weight 0) after the real pairs of GAP_EXPERTS experts.
            ge = (pid - num_chunks) * GAP_EXPERTS + tl.arange(0, GAP_EXPERTS)
            live = ge < NE
            ge = tl.where(live, ge, 0)
            counts = tl.gather(totals, ge, 0)
            gap_start = tl.gather(start, ge, 0) + counts
            gap_len = tl.where(live, tl.gather(padded, ge, 0) - counts, 0)
            _store_gaps(
                sorted_token_ids_ptr, m_indices_ptr, sorted_weights_ptr, gap_start, gap_len, M,
                GAP_EXPERTS, BLOCK,
            )  # fmt: skip
    else:
        _zero_part(zero_ptr, pid - num_sort_programs, zero_numel, ZERO_PER_PROGRAM, ZERO_TILE)


@triton.jit(do_not_specialize=["M"])
def _sort_atomic_count_kernel(
    ids_ptr,
    count_ptr,
    state_ptr,
    work_ptr,
    cumsum_ptr,
    M,
    stride_ids,
    NE: tl.constexpr,
    TOPK: tl.constexpr,
    TILE: tl.constexpr,
    BINS: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_COUNT: tl.constexpr,
):
    """Large batches, step 1: program ``p`` histograms pairs ``[p * TILE, (p + 1) * TILE)``
    by expert and adds the non-zero bins into the global counters (``state[1:NE + 1]``),
    then takes a ticket (``state[0]``). The program with the last ticket turns the totals
    into each expert's first slot, writes it to the cursor (``work[0:NE]``) and, for the
    gap programs, to ``work[NE:2 * NE]`` with the totals (``work[2 * NE:3 * NE]``), writes
    ``cumsum_tensor``, and resets the counters and the ticket to zero: no memset, no spin.

    ``state`` must be zero when a call starts, and every call leaves it zero (it holds
    nothing else). A program's counter updates are ordered before its ticket (a barrier,
    then a release-acquire atomic); the last program reads the counters with atomic adds
    of zero (at the coherence point, whatever any cache holds), then zeroes them and the
    ticket with plain stores: every other program of the launch is done with them, and
    the next call's launches are queued after this one. (Not atomic exchanges: Triton's
    AMD backend emits a buffer-atomic exchange intrinsic that LLVM does not have.)
    """
    n = _real_rows(count_ptr, M, HAS_COUNT)
    idx = tl.program_id(0) * TILE + tl.arange(0, TILE)
    all_pairs = M * TOPK
    e = _expert_of(ids_ptr, idx, n * TOPK, all_pairs, stride_ids, NE, TOPK)
    hist = tl.histogram(e, BINS)
    bins = tl.arange(0, BINS)
    live = bins < NE
    counters = state_ptr + 1
    tl.atomic_add(counters + bins, hist, mask=live & (hist > 0), sem="relaxed")
    tl.debug_barrier()
    ticket = tl.atomic_add(state_ptr, 1, sem="acq_rel")
    if ticket == tl.num_programs(0) - 1:
        zeros = tl.zeros([BINS], dtype=tl.int32)
        totals = tl.atomic_add(counters + bins, zeros, mask=live, sem="acquire")
        totals = tl.where(live, totals, 0)
        tl.store(counters + bins, zeros, mask=live)
        padded = (totals + (BLOCK - 1)) // BLOCK * BLOCK
        start = tl.cumsum(padded, axis=0) - padded
        tl.store(work_ptr + bins, start, mask=live)  # the cursor
        tl.store(work_ptr + NE + bins, start, mask=live)
        tl.store(work_ptr + 2 * NE + bins, totals, mask=live)
        tl.store(cumsum_ptr, tl.sum(padded, axis=0))
        tl.store(cumsum_ptr + 1, n)
        tl.store(state_ptr, 0)


@triton.jit(do_not_specialize=["M", "num_chunks", "num_sort_programs"])
def _sort_atomic_place_kernel(
    ids_ptr,
    w_ptr,
    count_ptr,
    work_ptr,
    sorted_token_ids_ptr,
    sorted_expert_ids_ptr,
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
    TOPK: tl.constexpr,
    BLOCK: tl.constexpr,
    TILE: tl.constexpr,
    GAP_EXPERTS: tl.constexpr,
    ZERO_PER_PROGRAM: tl.constexpr,
    ZERO_TILE: tl.constexpr,
    HAS_COUNT: tl.constexpr,
):
    """Large batches, step 2. Programs by id ``p``:

    * ``p < num_chunks``: each real pair of ``[p * TILE, (p + 1) * TILE)`` takes the next
      slot of its expert from the cursor (an atomic add), so within an expert the order
      depends on timing; counts, ``cumsum_tensor`` and ``sorted_expert_ids`` do not.
    * ``num_chunks <= p < num_sort_programs``: fill the gap slots of ``GAP_EXPERTS``
      experts from the starts and totals of step 1.
    * ``p >= num_sort_programs``: zero ``ZERO_PER_PROGRAM`` elements of ``bf16_zero_out``.
    """
    pid = tl.program_id(0)
    if pid < num_chunks:
        n = _real_rows(count_ptr, M, HAS_COUNT)
        all_pairs = M * TOPK
        idx = pid * TILE + tl.arange(0, TILE)
        e = _expert_of(ids_ptr, idx, n * TOPK, all_pairs, stride_ids, NE, TOPK)
        ok = e < NE
        tok = idx // TOPK
        k_slot = idx - tok * TOPK
        w = tl.load(w_ptr + tok.to(tl.int64) * stride_w + k_slot, mask=ok, other=0.0)
        slot = tl.atomic_add(work_ptr + e, 1, mask=ok, sem="relaxed")
        _store_pairs(
            sorted_token_ids_ptr, m_indices_ptr, sorted_weights_ptr, sorted_expert_ids_ptr,
            reverse_sorted_ptr, idx, slot, e, tok, k_slot, w, ok, all_pairs, BLOCK,
        )  # fmt: skip
    elif pid < num_sort_programs:
        ge = (pid - num_chunks) * GAP_EXPERTS + tl.arange(0, GAP_EXPERTS)
        live = ge < NE
        start = tl.load(work_ptr + NE + ge, mask=live, other=0)
        totals = tl.load(work_ptr + 2 * NE + ge, mask=live, other=0)
        gap_len = (totals + (BLOCK - 1)) // BLOCK * BLOCK - totals
        _store_gaps(
            sorted_token_ids_ptr, m_indices_ptr, sorted_weights_ptr, start + totals, gap_len, M,
            GAP_EXPERTS, BLOCK,
        )  # fmt: skip
    else:
        _zero_part(zero_ptr, pid - num_sort_programs, zero_numel, ZERO_PER_PROGRAM, ZERO_TILE)


@dataclass(frozen=True)
class SortPlan:
    """How :func:`mxfp4_moe_sort` launches for one shape (it depends on shapes only)."""

    single: bool  # one launch: the whole sort in pair space (_sort_tiny_kernel)
    atomic: bool  # count into global counters, place with an atomic cursor
    inline_offsets: bool  # count + place, the place kernel sums the count table itself
    launches: int  # 1 (single), 2 (count, place) or 3 (count, offsets, place)
    chunks: int  # pair chunks: count-kernel programs and pair-placing programs
    chunk_pairs: int  # pairs per chunk (a power of two; all pairs when single)
    count_programs: int  # count-kernel programs
    count_warps: int  # warps of the count kernel
    expert_slots: int  # next_pow2(NE + 1): the place kernel's per-expert vectors
    row_zero_tile: int  # count kernel: row values zeroed per step
    inline_rows: int  # place kernel, inline offsets: count-table rows summed per step
    group_chunks: int  # offsets kernel: chunks per group (one offsets row per group)
    groups: int  # groups of chunks
    gap_experts: int  # experts whose gap slots one gap program fills
    gap_programs: int  # place programs that fill gap slots
    zero_programs: int  # programs that zero bf16_zero_out
    offset_rows: int  # offsets kernel: chunk rows per step
    offset_experts: int  # offsets kernel: experts per program
    offset_programs: int  # offsets-kernel programs (0 when it is not launched)
    ranks_at: int  # int32 scratch: counts [chunks, NE] | ranks [pairs] | offsets [groups + 1, NE]
    offsets_at: int
    scratch_elems: int  # atomic: cursor, starts, totals [3, NE]
    state_elems: int  # atomic: the self-resetting ticket and counters [1 + NE]


# The tiny path also needs its gap tile ([next_pow2(pairs), MB] slots) within this many:
# at [32, 128] the tiny kernel spills 22 SGPRs on gfx942 and gfx950 (the compile gate),
# so at MB = 128 it stops at 16 pairs and the two-launch path takes 17-32.
TINY_GAP_SLOTS = 2048


def sort_plan(
    M: int,
    NE: int,
    TOPK: int,
    zero_numel: int = 0,
    block: int = 16,
    deterministic: bool = False,
) -> SortPlan:
    """The launch plan for ``M`` rows of ``TOPK`` pairs over ``NE`` experts in blocks of
    ``block`` slots (the block size only sizes the gap-filling programs);
    ``deterministic``: never the atomic path."""
    pairs = max(M * TOPK, 1)
    pairs_p2 = triton.next_power_of_2(pairs)
    experts_p2 = triton.next_power_of_2(NE + 1)
    gap_experts = max(1, min(MAX_GAP_EXPERTS, GAP_SLOTS // block))
    if M >= ATOMIC_MIN_ROWS and NE >= ATOMIC_MIN_EXPERTS and not deterministic:
        return SortPlan(
            single=False,
            atomic=True,
            inline_offsets=False,
            launches=2,
            chunks=triton.cdiv(pairs, ATOMIC_PLACE_TILE),
            chunk_pairs=ATOMIC_PLACE_TILE,
            count_programs=triton.cdiv(pairs, ATOMIC_COUNT_TILE),
            count_warps=ATOMIC_COUNT_NUM_WARPS,
            expert_slots=experts_p2,
            row_zero_tile=0,
            inline_rows=0,
            group_chunks=1,
            groups=0,
            gap_experts=gap_experts,
            gap_programs=triton.cdiv(NE, gap_experts),
            zero_programs=triton.cdiv(zero_numel, ZERO_PER_PROGRAM),
            offset_rows=0,
            offset_experts=0,
            offset_programs=0,
            ranks_at=0,
            offsets_at=0,
            scratch_elems=3 * NE,
            state_elems=1 + NE,
        )
    single = pairs <= TINY_PAIRS and pairs_p2 * block <= TINY_GAP_SLOTS
    if single:
        chunk = pairs_p2
    else:
        chunk = SMALL_BATCH_CHUNK_PAIRS if pairs <= SMALL_BATCH_PAIRS else CHUNK_PAIRS
        chunk = min(chunk, pairs_p2)
    chunks = triton.cdiv(pairs, chunk)
    inline = not single and chunks * experts_p2 <= INLINE_OFFSETS_MAX_ELEMS
    three = not single and not inline
    group_chunks = GROUP_CHUNKS if three else 1
    groups = triton.cdiv(chunks, group_chunks)
    offset_rows = min(triton.next_power_of_2(chunks), OFFSET_MAX_ROWS)
    offset_experts = max(1, min(OFFSET_TILE // offset_rows, triton.next_power_of_2(NE)))
    gap_programs = triton.cdiv(NE, gap_experts)
    zero_programs = triton.cdiv(zero_numel, ZERO_PER_PROGRAM)
    place_grid = chunks + gap_programs + zero_programs
    tile = INLINE_OFFSETS_TILE
    if inline and place_grid < LATENCY_BOUND_GRID:
        tile = INLINE_OFFSETS_TILE_LATENCY_BOUND
    ranks_at = 0 if single else chunks * NE
    offsets_at = ranks_at + (0 if single else chunks * chunk)
    return SortPlan(
        single=single,
        atomic=False,
        inline_offsets=inline,
        launches=1 if single else 2 if inline else 3,
        chunks=chunks,
        chunk_pairs=chunk,
        count_programs=0 if single else chunks,
        count_warps=COUNT_NUM_WARPS,
        expert_slots=experts_p2,
        row_zero_tile=min(COUNT_ROW_TILE, triton.next_power_of_2(NE)),
        inline_rows=max(1, tile // experts_p2),
        group_chunks=group_chunks,
        groups=groups,
        gap_experts=gap_experts,
        gap_programs=gap_programs,
        zero_programs=zero_programs,
        offset_rows=offset_rows,
        offset_experts=offset_experts,
        offset_programs=triton.cdiv(NE, offset_experts) if three else 0,
        ranks_at=ranks_at,
        offsets_at=offsets_at,
        scratch_elems=0 if single else offsets_at + ((groups + 1) * NE if three else 0),
        state_elems=0,
    )


@dataclass(frozen=True)
class SortProgram:
    """Everything a call of one shape launches, built once per shape (see
    :func:`sort_program`): the plan, grids and launchers with their constants bound.
    A single-launch plan has only ``place`` (the tiny kernel)."""

    plan: SortPlan
    count: KernelLauncher | None
    offsets: KernelLauncher | None
    place: KernelLauncher
    place_grid: tuple[int]
    sort_programs: int


@functools.lru_cache(maxsize=4096)
def sort_program(
    M: int,
    NE: int,
    TOPK: int,
    MB: int,
    zero_numel: int,
    has_count: bool,
    deterministic: bool = False,
) -> SortProgram:
    """The cached :class:`SortProgram` of a shape: nothing in it depends on the data."""
    plan = sort_plan(M, NE, TOPK, zero_numel, MB, deterministic)
    if plan.atomic:
        count = launcher(
            _sort_atomic_count_kernel,
            NE=NE,
            TOPK=TOPK,
            TILE=ATOMIC_COUNT_TILE,
            BINS=plan.expert_slots,
            BLOCK=MB,
            HAS_COUNT=has_count,
            num_warps=plan.count_warps,
        )
        place = launcher(
            _sort_atomic_place_kernel,
            NE=NE,
            TOPK=TOPK,
            BLOCK=MB,
            TILE=ATOMIC_PLACE_TILE,
            GAP_EXPERTS=plan.gap_experts,
            ZERO_PER_PROGRAM=ZERO_PER_PROGRAM,
            ZERO_TILE=ZERO_TILE,
            HAS_COUNT=has_count,
            num_warps=ATOMIC_PLACE_NUM_WARPS,
        )
        sort_programs = plan.chunks + plan.gap_programs
        return SortProgram(
            plan, count, None, place, (sort_programs + plan.zero_programs,), sort_programs
        )
    if plan.single:
        tiny = launcher(
            _sort_tiny_kernel,
            NE=NE,
            TOPK=TOPK,
            BLOCK=MB,
            PAIRS=plan.chunk_pairs,
            ZERO_PER_PROGRAM=ZERO_PER_PROGRAM,
            ZERO_TILE=ZERO_TILE,
            HAS_COUNT=has_count,
            num_warps=TINY_NUM_WARPS,
        )
        return SortProgram(plan, None, None, tiny, (1 + plan.zero_programs,), 1)
    count = launcher(
        _sort_count_kernel,
        NE=NE,
        TOPK=TOPK,
        CHUNK_PAIRS=plan.chunk_pairs,
        ROW_ZERO_TILE=plan.row_zero_tile,
        HAS_COUNT=has_count,
        num_warps=plan.count_warps,
    )
    offsets = None
    if plan.offset_programs:
        offsets = launcher(
            _sort_offsets_kernel,
            NE=NE,
            GROUP_CHUNKS=plan.group_chunks,
            STRIP_EXPERTS=plan.offset_experts,
            ROWS_PER_STEP=plan.offset_rows,
            num_warps=OFFSETS_NUM_WARPS,
        )
    place = launcher(
        _sort_place_kernel,
        NE=NE,
        TOPK=TOPK,
        BLOCK=MB,
        EXPERT_SLOTS=plan.expert_slots,
        CHUNK_PAIRS=plan.chunk_pairs,
        GROUP_CHUNKS=plan.group_chunks,
        GAP_EXPERTS=plan.gap_experts,
        ZERO_PER_PROGRAM=ZERO_PER_PROGRAM,
        ZERO_TILE=ZERO_TILE,
        INLINE_ROWS=plan.inline_rows,
        HAS_COUNT=has_count,
        INLINE=plan.inline_offsets,
        num_warps=PLACE_NUM_WARPS,
    )
    sort_programs = plan.chunks + plan.gap_programs
    return SortProgram(
        plan=plan,
        count=count,
        offsets=offsets,
        place=place,
        place_grid=(sort_programs + plan.zero_programs,),
        sort_programs=sort_programs,
    )


def _launch_sort(
    topk_ids: torch.Tensor,
    topk_weight: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    sorted_expert_ids: torch.Tensor,
    cumsum_tensor: torch.Tensor,
    reverse_sorted: torch.Tensor,
    sorted_weights: torch.Tensor,
    m_indices: torch.Tensor,
    zero_out: torch.Tensor | None,
    m: int,
    ne: int,
    k: int,
    mb: int,
    count: torch.Tensor | None,
) -> list[tuple[torch.Tensor, str, int, bool]]:
    """The launches of one sort, on checked arguments (Triton backends only);
    ``zero_out``: the buffer to zero, if any. Returns the int32 buffers the launches
    took besides the call's tensors: ``(buffer, name, elements, zeroed)`` each."""
    zero_numel = 0 if zero_out is None else zero_out.numel()
    prog = sort_program(m, ne, k, mb, zero_numel, count is not None, DETERMINISTIC)
    plan = prog.plan
    count_arg = cumsum_tensor if count is None else count  # placeholder: never read
    zero_arg = sorted_weights if zero_out is None or zero_numel == 0 else zero_out
    device = topk_ids.device
    with device_guard(device):
        if plan.single:
            prog.place(
                prog.place_grid, topk_ids, topk_weight, count_arg, sorted_token_ids,
                sorted_expert_ids, cumsum_tensor, reverse_sorted, sorted_weights, m_indices,
                zero_arg, m, topk_ids.stride(0), topk_weight.stride(0), zero_numel,
            )  # fmt: skip
            return []
        buf = scratch("moe_sort", plan.scratch_elems, torch.int32, device)
        taken = [(buf, "moe_sort", plan.scratch_elems, False)]
        if plan.atomic:
            state = zeroed_state("moe_sort_counters", plan.state_elems, device)
            taken.append((state, "moe_sort_counters", plan.state_elems, True))
            prog.count(
                (plan.count_programs,), topk_ids, count_arg, state, buf, cumsum_tensor, m,
                topk_ids.stride(0),
            )  # fmt: skip
            prog.place(
                prog.place_grid, topk_ids, topk_weight, count_arg, buf, sorted_token_ids,
                sorted_expert_ids, reverse_sorted, sorted_weights, m_indices, zero_arg, m,
                topk_ids.stride(0), topk_weight.stride(0), plan.chunks, prog.sort_programs,
                zero_numel,
            )  # fmt: skip
            return taken
        prog.count((plan.chunks,), topk_ids, count_arg, buf, m, topk_ids.stride(0), plan.ranks_at)
        if prog.offsets is not None:
            prog.offsets((plan.offset_programs,), buf, plan.chunks, plan.offsets_at)
        prog.place(
            prog.place_grid, topk_ids, topk_weight, count_arg, buf, sorted_token_ids,
            sorted_expert_ids, cumsum_tensor, reverse_sorted, sorted_weights, m_indices,
            zero_arg, m, topk_ids.stride(0), topk_weight.stride(0), plan.ranks_at,
            plan.offsets_at, plan.chunks, prog.sort_programs, zero_numel,
        )  # fmt: skip
    return taken


def _sort_direct_program(
    launches: list,
    taken: list[tuple[torch.Tensor, str, int, bool]],
    callers: list[torch.Tensor],
    extents: tuple[int, ...],
    written: tuple[bool, ...],
    own: list[torch.Tensor],
    device: torch.device,
) -> DirectProgram | None:
    """Launch what a first call of a signature recorded, and keep its direct program
    (with the buffers the launches took)."""
    own = [*own, *(t[0] for t in taken)]
    buffers = tuple(t[1:] for t in taken)
    return launch_and_keep(launches, device, callers, extents, written, own, buffers)


# Direct programs by call signature (see mxfp4_moe_sort and adaptive_moe_sort). A
# signature holds the row count (the plan, the checks and the buffers' sizes depend on
# it), so prefill, whose row count changes from forward to forward, makes one program
# per count: each cache keeps at most SORT_PROGRAMS, dropping the half used longest ago
# when full.
SORT_PROGRAMS = 256
_DIRECT: dict[tuple, DirectProgram] = {}
_ADAPTIVE_DIRECT: dict[tuple, tuple[DirectProgram, AdaptiveLayout, torch.device]] = {}


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
    TOPK]`` with unit column stride and rows of their own (``TOPK <= 128``, the packed
    slot's 7 bits); outputs int32 (``sorted_weights`` float32), contiguous, at least as
    large as aiter's ``_adaptive_moe_sort`` allocates them, sharing no memory with each
    other or with the inputs. Bad inputs raise ``TypeError``/``ValueError`` before
    anything is written. No host synchronization; capturable in a CUDA/HIP graph.
    """
    key = None
    count = num_local_tokens
    if (
        type(M_logical) is type(NE) is type(TOPK) is type(D_HIDDEN) is int
        and type(D_INTER) is type(MB) is type(prologue) is int
        and direct_calls_allowed()
    ):
        try:
            # One flat key of plain values (ints, dtypes, bools: cheap to hash). The
            # routing tensors by shape and strides (one that is not 2-D fails to unpack
            # and takes the full path, which says why); the buffers by what the checks
            # read of them: dtype, device, contiguity, size.
            rows, cols = topk_ids.shape
            w_rows, w_cols = topk_weight.shape
            workspace = bf16_zero_workspace.numel()
            key = (
                rows, cols, *topk_ids.stride(), topk_ids.dtype, topk_ids.get_device(),
                topk_ids.is_cuda,
                w_rows, w_cols, *topk_weight.stride(), topk_weight.dtype,
                topk_weight.get_device(), topk_weight.is_cuda,
                sorted_token_ids.dtype, sorted_token_ids.get_device(), sorted_token_ids.is_cuda,
                sorted_token_ids.is_contiguous(), sorted_token_ids.numel(),
                sorted_expert_ids.dtype, sorted_expert_ids.get_device(),
                sorted_expert_ids.is_cuda, sorted_expert_ids.is_contiguous(),
                sorted_expert_ids.numel(),
                cumsum_tensor.dtype, cumsum_tensor.get_device(), cumsum_tensor.is_cuda,
                cumsum_tensor.is_contiguous(), cumsum_tensor.numel(),
                reverse_sorted.dtype, reverse_sorted.get_device(), reverse_sorted.is_cuda,
                reverse_sorted.is_contiguous(), reverse_sorted.numel(),
                sorted_weights.dtype, sorted_weights.get_device(), sorted_weights.is_cuda,
                sorted_weights.is_contiguous(), sorted_weights.numel(),
                m_indices.dtype, m_indices.get_device(), m_indices.is_cuda,
                m_indices.is_contiguous(), m_indices.numel(),
                bf16_zero_out.dtype, bf16_zero_out.get_device(), bf16_zero_out.is_cuda,
                bf16_zero_out.is_contiguous(), bf16_zero_out.numel(),
                bf16_zero_workspace.dtype, bf16_zero_workspace.get_device(),
                bf16_zero_workspace.is_cuda, bf16_zero_workspace.is_contiguous(), workspace,
                M_logical, NE, TOPK, D_HIDDEN, D_INTER, MB, prologue,
                None if count is None else (
                    count.numel(), count.dtype, count.get_device(), count.is_cuda
                ),
            )  # fmt: skip
            program = _DIRECT.get(key)
        except Exception:  # noqa: BLE001 - not tensors, or unhashable: the full path says why
            key = program = None
        if program is not None:
            ptrs = (
                topk_ids.data_ptr(), topk_weight.data_ptr(), sorted_token_ids.data_ptr(),
                sorted_expert_ids.data_ptr(), cumsum_tensor.data_ptr(),
                reverse_sorted.data_ptr(), sorted_weights.data_ptr(), m_indices.data_ptr(),
                bf16_zero_out.data_ptr(), bf16_zero_workspace.data_ptr(),
            ) if count is None else (
                topk_ids.data_ptr(), topk_weight.data_ptr(), sorted_token_ids.data_ptr(),
                sorted_expert_ids.data_ptr(), cumsum_tensor.data_ptr(),
                reverse_sorted.data_ptr(), sorted_weights.data_ptr(), m_indices.data_ptr(),
                bf16_zero_out.data_ptr(), bf16_zero_workspace.data_ptr(), count.data_ptr(),
            )  # fmt: skip
            if program.clear(ptrs) and hip_buffers_small(
                topk_ids, topk_weight, sorted_token_ids, sorted_weights, m_indices, bf16_zero_out
            ):
                program.used = use_stamp()
                program.launch(ptrs)
                if workspace > 0:
                    bf16_zero_workspace.zero_()
                return
    args = (
        topk_ids, topk_weight, sorted_token_ids, sorted_expert_ids, cumsum_tensor,
        reverse_sorted, sorted_weights, m_indices, bf16_zero_out, bf16_zero_workspace,
        M_logical, NE, TOPK, D_HIDDEN, D_INTER, MB, prologue, num_local_tokens,
    )  # fmt: skip
    m, ne, k, mb, count = check_sort_args(*args)
    if triton_backend(topk_ids.device) == "torch-reference":
        mxfp4_moe_sort_reference(*args)
        return
    launch = (
        topk_ids, topk_weight, sorted_token_ids, sorted_expert_ids, cumsum_tensor,
        reverse_sorted, sorted_weights, m_indices, bf16_zero_out, m, ne, k, mb, count,
    )  # fmt: skip
    if key is None:
        _launch_sort(*launch)
    else:
        # The first call of this signature: launch, and keep its direct program.
        with capture_launches() as launches:
            taken = _launch_sort(*launch)
        callers = [
            topk_ids, topk_weight, sorted_token_ids, sorted_expert_ids, cumsum_tensor,
            reverse_sorted, sorted_weights, m_indices, bf16_zero_out, bf16_zero_workspace,
        ]  # fmt: skip
        extents = tuple(_extent(x) for x in callers)
        written = (False, False) + (True,) * 8
        if count is not None:
            callers.append(count)
            extents += (count.element_size(),)
            written += (False,)
        program = _sort_direct_program(
            launches, taken, callers, extents, written, [], topk_ids.device
        )
        if program is not None:
            lru_put(_DIRECT, key, program, SORT_PROGRAMS)
    if bf16_zero_workspace.numel() > 0:
        bf16_zero_workspace.zero_()


def _extent(x: torch.Tensor) -> int:
    """Bytes from a checked tensor's first element to the end of its last (0 if empty)."""
    if x.numel() == 0:
        return 0
    last = sum((n - 1) * st for n, st in zip(x.shape, x.stride(), strict=True))
    return (last + 1) * x.element_size()


@dataclass(frozen=True)
class AdaptiveLayout:
    """Where :func:`adaptive_moe_sort`'s int32/float32 outputs lie in its one int32
    arena. ``sizes`` splits it: the three outputs of ``max_sorted`` elements first (a
    multiple of the block size, so each stays 16-byte aligned), then the others, with a
    pad after any whose length would misalign the next; ``parts``: which pieces are
    sorted_token_ids, sorted_expert_ids, num_valid_ids, reverse_sorted, sorted_weights
    and m_indices; ``offsets``: their first elements in the arena, in that order;
    ``moe_shape``: ``moe_buf``'s shape."""

    total: int
    sizes: tuple[int, ...]
    parts: tuple[int, ...]
    offsets: tuple[int, ...]
    moe_shape: tuple[int, int]


@functools.lru_cache(maxsize=4096)
def adaptive_layout(M: int, topk: int, NE: int, BM: int, model_dim: int, atomic: bool):
    """The arena layout of one shape: sorted_token_ids, sorted_expert_ids, num_valid_ids,
    reverse_sorted, sorted_weights, m_indices (sizes as aiter's ``_adaptive_moe_sort``)."""
    max_sorted = max_sorted_size(M, topk, NE, BM)
    # In arena order: sorted_token_ids, sorted_weights, m_indices, reverse_sorted,
    # sorted_expert_ids, num_valid_ids (output indices 0, 4, 5, 3, 1, 2).
    arena = ((0, max_sorted), (4, max_sorted), (5, max_sorted), (3, M * topk))
    arena += ((1, max_sorted // BM), (2, 2))
    sizes: list[int] = []
    parts, offsets = [0] * 6, [0] * 6
    at = 0
    for i, (out, n) in enumerate(arena):
        parts[out], offsets[out] = len(sizes), at
        sizes.append(n)
        at += n
        pad = -n % 4  # keep the next output 16-byte aligned
        if pad and i + 1 < len(arena):
            sizes.append(pad)
            at += pad
    moe_shape = (M, model_dim) if atomic else (0, 0)
    return AdaptiveLayout(at, tuple(sizes), tuple(parts), tuple(offsets), moe_shape)


def _adaptive_outputs(
    layout: AdaptiveLayout, moebuf_dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """``(sorted_token_ids, sorted_expert_ids, num_valid_ids, reverse_sorted,
    sorted_weights, m_indices, moe_buf)``: one int32 arena split in one call, and
    ``moe_buf``."""
    pieces = torch.empty(layout.total, dtype=torch.int32, device=device).split_with_sizes(
        layout.sizes
    )
    p = layout.parts
    moe_buf = torch.empty(layout.moe_shape, dtype=moebuf_dtype, device=device)
    return (
        pieces[p[0]], pieces[p[1]], pieces[p[2]], pieces[p[3]], pieces[p[4]].view(torch.float32),
        pieces[p[5]], moe_buf,
    )  # fmt: skip


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
    in aiter) and ``[0, 0]`` otherwise. Only the inputs are checked: the outputs are
    this function's own fresh buffers.
    """
    key = None
    count = num_local_tokens
    if type(num_experts) is type(topk) is type(block_size) is type(model_dim) is int and (
        direct_calls_allowed()
    ):
        try:
            # One flat key of plain values (see mxfp4_moe_sort).
            rows, cols = topk_ids.shape
            w_rows, w_cols = topk_weights.shape
            key = (
                rows, cols, *topk_ids.stride(), topk_ids.dtype, topk_ids.get_device(),
                topk_ids.is_cuda, w_rows, w_cols, *topk_weights.stride(), topk_weights.dtype,
                topk_weights.get_device(), topk_weights.is_cuda, num_experts, topk,
                block_size, model_dim, bool(atomic), moebuf_dtype,
                None if count is None else (
                    count.numel(), count.dtype, count.get_device(), count.is_cuda
                ),
            )  # fmt: skip
            found = _ADAPTIVE_DIRECT.get(key)
        except Exception:  # noqa: BLE001 - not tensors, or unhashable: the full path says why
            key = found = None
        if found is not None:
            program, layout, device = found
            outs = _adaptive_outputs(layout, moebuf_dtype, device)
            base = outs[0].data_ptr()  # the arena's first element
            o = layout.offsets
            ptrs = (
                topk_ids.data_ptr(), topk_weights.data_ptr(), base, base + 4 * o[1],
                base + 4 * o[2], base + 4 * o[3], base + 4 * o[4], base + 4 * o[5],
                outs[6].data_ptr(),
            ) if count is None else (
                topk_ids.data_ptr(), topk_weights.data_ptr(), count.data_ptr(), base,
                base + 4 * o[1], base + 4 * o[2], base + 4 * o[3], base + 4 * o[4],
                base + 4 * o[5], outs[6].data_ptr(),
            )  # fmt: skip
            if program.clear(ptrs) and hip_buffers_small(topk_ids, topk_weights):
                program.used = use_stamp()
                program.launch(ptrs)
                return _adaptive_result(outs, emit_aux)
    topk_ids = check_tensor("topk_ids", topk_ids)
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be 2-D [rows, topk], got shape {tuple(topk_ids.shape)}")
    topk_ids, topk_weights, M, num_experts, topk, BM, count = check_sort_inputs(
        topk_ids, topk_weights, topk_ids.shape[0], num_experts, topk, block_size,
        num_local_tokens, weights_name="topk_weights", names=("num_experts", "topk", "block_size"),
    )  # fmt: skip
    model_dim = check_int("model_dim", model_dim, 0)
    device = topk_ids.device
    layout = adaptive_layout(M, topk, num_experts, BM, model_dim, bool(atomic))
    outs = _adaptive_outputs(layout, moebuf_dtype, device)
    sorted_token_ids, sorted_expert_ids, num_valid_ids, reverse_sorted = outs[:4]
    sorted_weights, m_indices, moe_buf = outs[4:]
    zero_out = moe_buf if (atomic and BM == 16) else None
    if triton_backend(device) == "torch-reference":
        empty_bf16 = torch.empty(0, dtype=torch.bfloat16, device=device)
        mxfp4_moe_sort_reference(
            topk_ids, topk_weights, sorted_token_ids, sorted_expert_ids, num_valid_ids,
            reverse_sorted, sorted_weights, m_indices,
            empty_bf16 if zero_out is None else zero_out, empty_bf16,
            M, num_experts, topk, model_dim, 1, BM, 0 if BM == 16 else 1, count,
        )  # fmt: skip
        return _adaptive_result(outs, emit_aux)
    launch = (
        topk_ids, topk_weights, sorted_token_ids, sorted_expert_ids, num_valid_ids,
        reverse_sorted, sorted_weights, m_indices, zero_out, M, num_experts, topk, BM, count,
    )  # fmt: skip
    if key is None:
        _launch_sort(*launch)
        return _adaptive_result(outs, emit_aux)
    # The first call of this signature: launch, and keep its direct program.
    with capture_launches() as launches:
        taken = _launch_sort(*launch)
    callers = [topk_ids, topk_weights] + ([] if count is None else [count])
    own = [sorted_token_ids, sorted_expert_ids, num_valid_ids, reverse_sorted, sorted_weights]
    own += [m_indices, moe_buf]
    program = _sort_direct_program(
        launches, taken, callers, (0,) * len(callers), (False,) * len(callers), own, device
    )
    if program is not None:
        lru_put(_ADAPTIVE_DIRECT, key, (program, layout, device), SORT_PROGRAMS)
    return _adaptive_result(outs, emit_aux)


def _adaptive_result(outs: tuple[torch.Tensor, ...], emit_aux: bool) -> tuple[torch.Tensor, ...]:
    """aiter's return order: ``(sorted_token_ids, sorted_weights, sorted_expert_ids,
    num_valid_ids, moe_buf)``, plus ``(m_indices, reverse_sorted)`` with ``emit_aux``."""
    std = (outs[0], outs[4], outs[1], outs[2], outs[6])
    if emit_aux:
        return (*std, outs[5], outs[3])
    return std

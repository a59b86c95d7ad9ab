"""``mxfp4_moe_sort`` / ``adaptive_moe_sort``: the Triton kernels against the plain-torch
reference, bit for bit, plus the three ways the sort is stronger than aiter's HIP kernel
(deterministic, out-of-range ids dropped, any M).

Without a GPU the kernels run through Triton's interpreter (``tests/conftest.py`` sets
``TRITON_INTERPRET=1`` before Triton is imported); the reference fallback is disabled
in these tests, so a pass means the Triton kernels wrote the outputs. With a GPU (and
the variable unset) the same tests run the compiled kernels on it.
"""

from __future__ import annotations

import pytest
import sglang_amd_moe.kernels.moe_sort as sort_mod
import torch
import triton
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import (
    ROWS_COUNTS,
    assert_runs_through_triton,
    assert_same_sort,
    bits,
    forbid_reference,
    kernel_device,
)
from sglang_amd_moe.kernels import (
    adaptive_moe_sort,
    mxfp4_moe_sort,
    mxfp4_moe_sort_reference,
)
from sglang_amd_moe.kernels.moe_sort import ATOMIC_MIN_EXPERTS, ATOMIC_MIN_ROWS, sort_plan
from sglang_amd_moe.kernels.utils import max_sorted_size

DEV = kernel_device()
SHAPES = [(513, 11), (896, 16)]  # (NE, TOPK): routed experts + 1 shared
OUT_NAMES = (
    "sorted_token_ids",
    "sorted_expert_ids",
    "cumsum_tensor",
    "reverse_sorted",
    "sorted_weights",
    "m_indices",
    "bf16_zero_out",
    "bf16_zero_workspace",
)
POISON = -7


@pytest.fixture(autouse=True)
def _kernel_only(monkeypatch: pytest.MonkeyPatch) -> None:
    forbid_reference(monkeypatch, sort_mod, "mxfp4_moe_sort_reference")


def test_kernels_run_through_triton() -> None:
    assert_runs_through_triton(DEV)


# --------------------------------------------------------------------------- helpers
def _outputs(M: int, NE: int, K: int, MB: int, zero_cols: int = 0, workspace: int = 0):
    """Output buffers sized as aiter's _adaptive_moe_sort sizes them, poisoned."""
    ms = max_sorted_size(M, K, NE, MB)
    i32 = dict(dtype=torch.int32, device=DEV)
    return {
        "sorted_token_ids": torch.full((ms,), POISON, **i32),
        "sorted_expert_ids": torch.full((ms // MB,), POISON, **i32),
        "cumsum_tensor": torch.full((2,), POISON, **i32),
        "reverse_sorted": torch.full((M * K,), POISON, **i32),
        "sorted_weights": torch.full((ms,), float(POISON), device=DEV),
        "m_indices": torch.full((ms,), POISON, **i32),
        "bf16_zero_out": torch.full((M, zero_cols), 3.0, dtype=torch.bfloat16, device=DEV)
        if zero_cols
        else torch.empty(0, dtype=torch.bfloat16, device=DEV),
        "bf16_zero_workspace": torch.full((workspace,), 5.0, dtype=torch.bfloat16, device=DEV),
    }


def _routing(
    M: int,
    NE: int,
    K: int,
    n: int | None,
    seed: int,
    id_dtype: torch.dtype = torch.int32,
    w_dtype: torch.dtype = torch.float32,
    bad_ids: float = 0.0,
    extra_rows: int = 0,
    extra_cols: int = 0,
):
    """Router output: padded rows (>= n) hold -1 ids and NaN weights; a fraction of the
    real ids is out of range when ``bad_ids`` > 0."""
    g = torch.Generator().manual_seed(seed)
    rows = M + extra_rows
    ids = torch.randint(0, NE, (rows, K + extra_cols), generator=g, dtype=torch.int64)
    if bad_ids:
        bad = torch.rand(rows, K + extra_cols, generator=g) < bad_ids
        junk = torch.tensor([-1, -5, NE, NE + 7, 2**31 - 1], dtype=torch.int64)
        pick = torch.randint(0, len(junk), (rows, K + extra_cols), generator=g)
        ids = torch.where(bad, junk[pick], ids)
    w = torch.rand(rows, K + extra_cols, generator=g)
    if n is not None:
        pad = min(max(n, 0), M)
        ids[pad:] = -1
        w[pad:] = float("nan")
    ids = ids.to(id_dtype).to(DEV)[:, :K]
    w = w.to(w_dtype).to(DEV)[:, extra_cols:]
    return ids, w


def _count(n: int | None, dtype: torch.dtype = torch.int32) -> torch.Tensor | None:
    return None if n is None else torch.tensor([n], dtype=dtype, device=DEV)


def _call(fn, ids, w, outs, M, NE, K, MB, count, prologue=None, D_HIDDEN=None) -> None:
    fn(
        topk_ids=ids,
        topk_weight=w,
        **outs,
        M_logical=M,
        NE=NE,
        TOPK=K,
        D_HIDDEN=outs["bf16_zero_out"].shape[-1] if D_HIDDEN is None else D_HIDDEN,
        D_INTER=1,
        MB=MB,
        prologue=(0 if MB == 16 else 1) if prologue is None else prologue,
        num_local_tokens=count,
    )


def _check(
    ids, w, M, NE, K, MB, count, zero_cols=0, workspace=0, prologue=None
) -> dict[str, torch.Tensor]:
    """Run kernel and reference on poisoned buffers; assert every output is identical
    (on the atomic path, up to the order of pairs within an expert)."""
    got = _outputs(M, NE, K, MB, zero_cols, workspace)
    want = _outputs(M, NE, K, MB, zero_cols, workspace)
    _call(mxfp4_moe_sort, ids, w, got, M, NE, K, MB, count, prologue)
    _call(mxfp4_moe_sort_reference, ids, w, want, M, NE, K, MB, count, prologue)
    zero_numel = got["bf16_zero_out"].numel()
    if not sort_plan(M, NE, K, zero_numel, MB, sort_mod.DETERMINISTIC).atomic:
        for name in OUT_NAMES:
            assert torch.equal(bits(got[name]), bits(want[name])), (name, M, NE, K, MB)
        return got
    assert_same_sort(got, want, M, MB, exact=False)
    total = int(want["cumsum_tensor"][0])
    for name in ("sorted_token_ids", "m_indices", "sorted_weights"):
        assert torch.equal(bits(got[name][total:]), bits(want[name][total:])), name  # untouched
    for name in ("bf16_zero_out", "bf16_zero_workspace"):
        assert torch.equal(bits(got[name]), bits(want[name])), name
    return got


# ------------------------------------------------------------------------ fixed cases
@pytest.mark.parametrize(("NE", "K"), SHAPES)
@pytest.mark.parametrize(("M", "n"), ROWS_COUNTS)
def test_fixed_cases_every_block_size(NE: int, K: int, M: int, n: int) -> None:
    """Padded rows hold -1 ids and NaN weights; they must not reach the sort."""
    ids, w = _routing(M, NE, K, n, seed=M * 1000 + n)
    for MB in (16, 32, 64, 128):
        got = _check(ids, w, M, NE, K, MB, _count(n), zero_cols=8 if MB == 16 else 0)
        assert got["cumsum_tensor"][1].item() == n
        assert bool((got["reverse_sorted"][n * K :] == -1).all())
        total = got["cumsum_tensor"][0].item()
        assert total % MB == 0
        assert bool((got["sorted_token_ids"][total:] == POISON).all())  # past the end
        if MB == 16:
            assert bool((got["bf16_zero_out"] == 0).all())


@pytest.mark.parametrize(("NE", "K"), SHAPES)
def test_no_count_sorts_every_row(NE: int, K: int) -> None:
    ids, w = _routing(48, NE, K, None, seed=1)
    got = _check(ids, w, 48, NE, K, 16, None)
    assert got["cumsum_tensor"][1].item() == 48
    assert bool((got["reverse_sorted"] >= 0).all())


@pytest.mark.parametrize("n", [49, 1000, 2**31 - 1])
def test_count_larger_than_rows_sorts_every_row(n: int) -> None:
    ids, w = _routing(48, 513, 11, None, seed=2)
    got = _check(ids, w, 48, 513, 11, 32, _count(n))
    no_count = _check(ids, w, 48, 513, 11, 32, None)
    for name in OUT_NAMES:
        assert torch.equal(bits(got[name]), bits(no_count[name])), name


@pytest.mark.parametrize("n", [-1, -7, -(2**31)])
def test_negative_count_sorts_nothing(n: int) -> None:
    ids, w = _routing(16, 896, 16, None, seed=3)
    got = _check(ids, w, 16, 896, 16, 16, _count(n), zero_cols=8)
    assert got["cumsum_tensor"].tolist() == [0, 0]
    assert bool((got["reverse_sorted"] == -1).all())
    assert bool((got["sorted_token_ids"] == POISON).all())
    assert bool((got["bf16_zero_out"] == 0).all())  # stage 2 still accumulates into it


def test_int64_count_and_ids_bf16_weights() -> None:
    ids, w = _routing(40, 257, 9, 33, seed=4, id_dtype=torch.int64, w_dtype=torch.bfloat16)
    _check(ids, w, 40, 257, 9, 64, _count(33, torch.int64))
    _check(ids, w, 40, 257, 9, 64, _count(2**40, torch.int64))
    ids, w = _routing(40, 257, 9, 33, seed=4, w_dtype=torch.float16)
    _check(ids, w, 40, 257, 9, 16, _count(-(2**40), torch.int64))


def test_prologue_does_not_change_outputs() -> None:
    ids, w = _routing(48, 513, 11, 40, seed=5)
    for MB in (16, 128):
        a = _check(ids, w, 48, 513, 11, MB, _count(40), zero_cols=8, prologue=0)
        b = _check(ids, w, 48, 513, 11, MB, _count(40), zero_cols=8, prologue=1)
        for name in OUT_NAMES:
            assert torch.equal(bits(a[name]), bits(b[name])), name


def test_zero_workspace_is_zeroed() -> None:
    ids, w = _routing(4, 513, 11, 3, seed=6)
    got = _check(ids, w, 4, 513, 11, 16, _count(3), zero_cols=16, workspace=40)
    assert bool((got["bf16_zero_workspace"] == 0).all())


def test_leading_rows_of_a_taller_strided_routing_table() -> None:
    """M_logical below the table's rows, and column slices of wider buffers."""
    ids, w = _routing(30, 64, 6, 20, seed=7, extra_rows=5, extra_cols=2)
    assert ids.shape == (35, 6) and ids.stride(0) == 8 and w.stride(0) == 8
    _check(ids, w, 30, 64, 6, 16, _count(20))


# ------------------------------------------------------ stronger than the HIP kernel
def _decode_order(got: dict[str, torch.Tensor], K: int, MB: int) -> list[list[int]]:
    """Pair indices per expert block run, in slot order (gap slots skipped)."""
    total = int(got["cumsum_tensor"][0])
    tokens = got["sorted_token_ids"][:total].tolist()
    experts = got["sorted_expert_ids"][: total // MB].tolist()
    runs: dict[int, list[int]] = {}
    for slot, packed in enumerate(tokens):
        t, s = packed & 0xFFFFFF, packed >> 24
        if t < got["reverse_sorted"].numel() // K:
            runs.setdefault(experts[slot // MB], []).append(t * K + s)
    return list(runs.values())


def test_deterministic_and_in_pair_order() -> None:
    """Few experts, many pairs each: the HIP kernel's atomics would reorder them."""
    for M, NE, K, MB in [(256, 5, 8, 16), (64, 3, 16, 128), (1, 2, 9, 32)]:
        ids, w = _routing(M, NE, K, M - 1 if M > 1 else None, seed=M)
        first = _check(ids, w, M, NE, K, MB, _count(M - 1) if M > 1 else None)
        second = _outputs(M, NE, K, MB)
        _call(mxfp4_moe_sort, ids, w, second, M, NE, K, MB, _count(M - 1) if M > 1 else None)
        for name in OUT_NAMES:
            assert torch.equal(bits(first[name]), bits(second[name])), name
        for run in _decode_order(first, K, MB):
            assert run == sorted(run)


def test_out_of_range_ids_are_dropped() -> None:
    M, NE, K = 64, 33, 7
    ids, w = _routing(M, NE, K, 60, seed=8, bad_ids=0.2)
    bad = ((ids < 0) | (ids >= NE))[:60]
    assert bool(bad.any()) and bool((~bad).any())
    got = _check(ids, w, M, NE, K, 16, _count(60))
    rev = got["reverse_sorted"].view(M, K)[:60]
    assert bool((rev[bad] == -1).all())
    assert bool((rev[~bad] >= 0).all())
    # The dropped pairs take no slot: the real slots hold exactly the valid pairs.
    total = int(got["cumsum_tensor"][0])
    real = got["m_indices"][:total] < M
    assert int(real.sum()) == int((~bad).sum())
    # int64 ids beyond int32 are dropped too, not wrapped into range.
    ids64 = ids.to(torch.int64)
    ids64[:60][bad] = 2**32 + 3  # would wrap to expert 3 if narrowed first
    got64 = _check(ids64, w, M, NE, K, 16, _count(60))
    for name in OUT_NAMES:
        assert torch.equal(bits(got[name]), bits(got64[name])), name


def test_multi_program_path_large_batch() -> None:
    """M = 4000: the three-launch path (offsets kernel) with many chunks and programs,
    chunk groups and a last group that is not full."""
    plan = sort_plan(4000, 200, 4)
    assert not plan.single and not plan.inline_offsets and plan.launches == 3
    assert plan.chunks >= 128 and plan.group_chunks > 1
    assert plan.chunks % plan.group_chunks != 0 and plan.offset_programs > 1
    ids, w = _routing(4000, 200, 4, 3900, seed=9, bad_ids=0.01)
    _check(ids, w, 4000, 200, 4, 16, _count(3900), zero_cols=8)
    _check(ids, w, 4000, 200, 4, 128, None)


@pytest.mark.parametrize(
    ("M", "NE", "K", "n"), [(8, 513, 11, 5), (40, 257, 9, 29), (200, 64, 8, 111)]
)
def test_inline_offsets_path(M: int, NE: int, K: int, n: int) -> None:
    """Two launches: the place kernel sums the count table itself (several steps for the
    larger shapes)."""
    plan = sort_plan(M, NE, K)
    assert plan.inline_offsets and plan.launches == 2 and plan.chunks > 1
    ids, w = _routing(M, NE, K, n, seed=M)
    _check(ids, w, M, NE, K, 16, _count(n), zero_cols=8)
    _check(ids, w, M, NE, K, 32, None)


def test_the_largest_count_table_summed_inline() -> None:
    """A count table of exactly ``INLINE_OFFSETS_MAX_ELEMS`` values (64 chunks of 64 pairs
    over 256 expert slots) is summed by the place kernel; one chunk more takes the
    three-launch path. Both sort as the reference does."""
    at, past = sort_plan(4096, 255, 1), sort_plan(4097, 255, 1)
    assert at.inline_offsets and at.chunks * at.expert_slots == sort_mod.INLINE_OFFSETS_MAX_ELEMS
    assert not past.inline_offsets and past.launches == 3
    for M in (4096, 4097):
        ids, w = _routing(M, 255, 1, M - 3, seed=M)
        _check(ids, w, M, 255, 1, 32, _count(M - 3))


def test_m_65536() -> None:
    """65,536 rows (the largest batch tests/gpu sorts), one pair per row over 1024 experts
    (the atomic path), three rows padded."""
    M = 65536
    assert sort_plan(M, 1024, 1).atomic
    ids, w = _routing(M, 1024, 1, M - 3, seed=10)
    _check(ids, w, M, 1024, 1, 32, _count(M - 3))


def test_inline_tile_follows_the_place_grid() -> None:
    """A place grid below LATENCY_BOUND_GRID programs sums 4096 count-table values per
    step, a larger one 2048 (the tile that keeps 8 waves per SIMD on AMD)."""
    small, large = sort_plan(200, 64, 8), sort_plan(4100, 30, 4, zero_numel=4100 * 8)
    assert small.inline_offsets and small.inline_rows * small.expert_slots == 4096
    assert large.inline_offsets and large.chunks + large.gap_programs >= 256
    assert large.inline_rows * large.expert_slots == 2048
    ids, w = _routing(4100, 30, 4, 4000, seed=13)
    _check(ids, w, 4100, 30, 4, 16, _count(4000), zero_cols=8)


@pytest.mark.parametrize(("M", "NE", "K"), [(1, 896, 16), (2, 896, 16), (2, 513, 11), (3, 257, 9)])
def test_single_launch_path(M: int, NE: int, K: int) -> None:
    """Up to 32 pairs the whole sort is one program in pair space, whatever NE."""
    plan = sort_plan(M, NE, K)
    assert plan.single and plan.launches == 1 and M * K <= 32
    assert not sort_plan(32 // K + 1, NE, K).single and not sort_plan(1, NE, 33).single
    # At MB 128 the gap tile limits it to 16 pairs (a [32, 128] tile spills SGPRs on AMD).
    assert sort_plan(M, NE, K, block=128).single is (triton.next_power_of_2(M * K) <= 16)
    for n in (M, M - 1, 0):
        ids, w = _routing(M, NE, K, n, seed=11 + n, bad_ids=0.1)
        _check(ids, w, M, NE, K, 16, _count(n), zero_cols=8)
        _check(ids, w, M, NE, K, 128, _count(n))
    # Every pair in one expert: one expert spans up to 2 blocks of 16.
    ids = torch.full((M, K), 5, dtype=torch.int32, device=DEV)
    _check(ids, torch.rand(M, K, device=DEV), M, NE, K, 16, None)


@pytest.mark.parametrize(("M", "NE", "K", "n"), [(8192, 896, 2, 5000), (9000, 1024, 1, 9000)])
def test_atomic_path_for_large_batches(M: int, NE: int, K: int, n: int) -> None:
    """From 8192 rows over 768 experts or more: global counters, a last-program ticket
    and an atomic cursor. Totals, blocks, gaps, dropped pairs and each pair's slot within
    its expert's range match the reference; SGLANG_AMD_MOE_DETERMINISTIC_SORT keeps the
    exact order."""
    plan = sort_plan(M, NE, K)
    assert plan.atomic and plan.launches == 2 and plan.count_programs >= 1
    assert not sort_plan(M, NE, K, deterministic=True).atomic
    assert not sort_plan(ATOMIC_MIN_ROWS - 1, NE, K).atomic
    assert not sort_plan(M, ATOMIC_MIN_EXPERTS - 1, K).atomic
    ids, w = _routing(M, NE, K, n, seed=M + K, bad_ids=0.02)
    _check(ids, w, M, NE, K, 16, _count(n), zero_cols=8)
    _check(ids, w, M, NE, K, 64, None)


def test_atomic_counters_are_left_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """The counters and the ticket live in a buffer the sort reuses without zeroing it:
    every call must leave it zero, whatever its count and ids."""
    state = torch.zeros(4096, dtype=torch.int32, device=DEV)
    monkeypatch.setattr(sort_mod, "zeroed_state", lambda name, numel, device: state)
    M, NE, K = 8192, 896, 1
    for seed, n, bad in ((1, 8192, 0.0), (2, 3000, 0.1), (3, 0, 0.0), (4, 8191, 0.5)):
        ids, w = _routing(M, NE, K, n, seed=seed, bad_ids=bad)
        _check(ids, w, M, NE, K, 32, _count(n))
        assert bool((state == 0).all()), seed


def test_deterministic_switch_keeps_the_exact_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sort_mod, "DETERMINISTIC", True)
    M, NE, K = 8192, 896, 2
    assert not sort_plan(M, NE, K, deterministic=sort_mod.DETERMINISTIC).atomic
    ids, w = _routing(M, NE, K, 6000, seed=21)
    _check(ids, w, M, NE, K, 16, _count(6000))


def test_empty_batch() -> None:
    ids, w = _routing(0, 16, 4, None, seed=12)
    got = _check(ids, w, 0, 16, 4, 16, _count(5))
    assert got["cumsum_tensor"].tolist() == [0, 0]


@settings(max_examples=40, deadline=None)
@given(
    M=st.integers(1, 200),
    NE=st.one_of(st.integers(1, 130), st.sampled_from([257, 513])),
    K=st.integers(1, 16),
    MB=st.sampled_from([16, 32, 64, 128]),
    n=st.one_of(st.none(), st.integers(-3, 210)),
    id_dtype=st.sampled_from([torch.int32, torch.int64]),
    w_dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    bad_ids=st.sampled_from([0.0, 0.0, 0.1]),
    extra_rows=st.integers(0, 2),
    extra_cols=st.integers(0, 2),
    zero_cols=st.sampled_from([0, 8]),
    seed=st.integers(0, 2**16),
)
def test_matches_reference_randomized(
    M, NE, K, MB, n, id_dtype, w_dtype, bad_ids, extra_rows, extra_cols, zero_cols, seed
) -> None:
    ids, w = _routing(M, NE, K, n, seed, id_dtype, w_dtype, bad_ids, extra_rows, extra_cols)
    _check(ids, w, M, NE, K, MB, _count(n), zero_cols=zero_cols)


# ------------------------------------------------------------------ adaptive_moe_sort
@pytest.mark.parametrize(("BM", "atomic"), [(16, True), (16, False), (64, True), (128, False)])
@pytest.mark.parametrize("n", [None, 0, 5])
def test_adaptive_moe_sort_allocates_like_aiter(
    BM: int, atomic: bool, n: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    M, NE, K, D = 12, 513, 11, 32
    seen: dict[str, object] = {}
    real_launch = sort_mod._launch_sort

    def spy(*args: object) -> None:
        seen["zero_out"] = args[8]
        seen["count"] = args[13]
        real_launch(*args)

    monkeypatch.setattr(sort_mod, "_launch_sort", spy)
    ids, w = _routing(M, NE, K, n, seed=13)
    out = adaptive_moe_sort(
        ids, w, NE, K, BM, D, atomic=atomic, emit_aux=True, num_local_tokens=_count(n)
    )
    sti, sw, sei, nvi, moe_buf, m_idx, rev = out
    ms = ((M * K + min(NE, M * K) * (BM - 1) + BM - 1) // BM) * BM
    assert (sti.shape, sw.shape, sei.shape, nvi.shape) == ((ms,), (ms,), (ms // BM,), (2,))
    assert (m_idx.shape, rev.shape) == ((ms,), (M * K,))
    assert (sti.dtype, sw.dtype, sei.dtype, nvi.dtype) == (
        torch.int32,
        torch.float32,
        torch.int32,
        torch.int32,
    )
    assert moe_buf.shape == ((M, D) if atomic else (0, 0)) and moe_buf.dtype == torch.bfloat16
    # moe_buf is zeroed by the sort only with atomic and block 16, as in aiter.
    assert seen["zero_out"] is (moe_buf if (atomic and BM == 16) else None)
    assert seen["count"] is None if n is None else int(seen["count"]) == n
    if atomic and BM == 16:
        assert bool((moe_buf == 0).all())
    # The outputs are the sort's contract: compare with the reference on fresh buffers.
    want = _outputs(M, NE, K, BM)
    _call(mxfp4_moe_sort_reference, ids, w, want, M, NE, K, BM, _count(n))
    got = dict(sorted_token_ids=sti, sorted_expert_ids=sei, cumsum_tensor=nvi,
               reverse_sorted=rev, sorted_weights=sw, m_indices=m_idx)  # fmt: skip
    total = int(want["cumsum_tensor"][0])
    assert torch.equal(nvi, want["cumsum_tensor"])
    assert torch.equal(rev, want["reverse_sorted"])
    for name in ("sorted_token_ids", "m_indices", "sorted_weights"):
        assert torch.equal(bits(got[name][:total]), bits(want[name][:total])), name
    assert torch.equal(sei[: total // BM], want["sorted_expert_ids"][: total // BM])


def test_adaptive_moe_sort_returns_five_without_aux() -> None:
    ids, w = _routing(3, 16, 4, None, seed=14)
    assert len(adaptive_moe_sort(ids, w, 16, 4, 32, 8)) == 5


def test_adaptive_moe_sort_sizes_do_not_depend_on_the_count() -> None:
    ids, w = _routing(20, 257, 9, None, seed=15)
    shapes = [
        [tuple(t.shape) for t in adaptive_moe_sort(ids, w, 257, 9, 16, 8, atomic=True,
                                                   emit_aux=True, num_local_tokens=c)]
        for c in (None, _count(0), _count(7), _count(99))
    ]  # fmt: skip
    assert all(s == shapes[0] for s in shapes)


# ----------------------------------------------------------------------- bad inputs
def _bad_cases():
    """(label, mutate) where mutate(kwargs) edits a good call's kwargs -> expected error."""
    meta_i32 = torch.zeros(1, dtype=torch.int32, device="meta")

    def set_(key, value):
        def f(kw):
            kw[key] = value(kw) if callable(value) else value

        return f

    return [
        ("ids not a tensor", set_("topk_ids", lambda kw: kw["topk_ids"].tolist()), TypeError),
        ("weights not a tensor", set_("topk_weight", 1.0), TypeError),
        ("1-D ids", set_("topk_ids", lambda kw: kw["topk_ids"].reshape(-1)), ValueError),
        ("float ids", set_("topk_ids", lambda kw: kw["topk_ids"].float()), TypeError),
        ("int16 ids", set_("topk_ids", lambda kw: kw["topk_ids"].short()), TypeError),
        ("float64 weights", set_("topk_weight", lambda kw: kw["topk_weight"].double()), TypeError),
        ("shape mismatch", set_("topk_weight", lambda kw: kw["topk_weight"][:-1]), ValueError),
        (
            "non-unit column stride",
            set_(
                "topk_ids", lambda kw: torch.zeros(8, 2 * 11, dtype=torch.int32, device=DEV)[:, ::2]
            ),
            ValueError,
        ),
        ("TOPK != columns", set_("TOPK", 10), ValueError),
        ("M_logical > rows", set_("M_logical", 9), ValueError),
        ("negative M_logical", set_("M_logical", -1), ValueError),
        ("float M_logical", set_("M_logical", 8.0), TypeError),
        ("bool NE", set_("NE", True), TypeError),
        ("NE 0", set_("NE", 0), ValueError),
        ("TOPK 0", set_("TOPK", 0), ValueError),
        ("MB 8", set_("MB", 8), ValueError),
        ("MB 48", set_("MB", 48), ValueError),
        ("prologue 2", set_("prologue", 2), ValueError),
        (
            "int32 sorted_weights",
            set_("sorted_weights", lambda kw: kw["sorted_weights"].int()),
            TypeError,
        ),
        (
            "int64 sorted_token_ids",
            set_("sorted_token_ids", lambda kw: kw["sorted_token_ids"].long()),
            TypeError,
        ),
        (
            "sorted_token_ids too small",
            set_("sorted_token_ids", lambda kw: kw["sorted_token_ids"][:-1]),
            ValueError,
        ),
        (
            "sorted_expert_ids too small",
            set_("sorted_expert_ids", lambda kw: kw["sorted_expert_ids"][:-1]),
            ValueError,
        ),
        (
            "reverse_sorted too small",
            set_("reverse_sorted", lambda kw: kw["reverse_sorted"][:-1]),
            ValueError,
        ),
        (
            "cumsum_tensor too small",
            set_("cumsum_tensor", lambda kw: kw["cumsum_tensor"][:1]),
            ValueError,
        ),
        (
            "non-contiguous m_indices",
            set_(
                "m_indices",
                lambda kw: torch.zeros(2 * kw["m_indices"].numel(), dtype=torch.int32, device=DEV)[
                    ::2
                ],
            ),
            ValueError,
        ),
        ("outputs overlap", set_("m_indices", lambda kw: kw["sorted_token_ids"]), ValueError),
        (
            "output on another device",
            set_("sorted_token_ids", lambda kw: kw["sorted_token_ids"].to("meta")),
            ValueError,
        ),
        (
            "float count",
            set_("num_local_tokens", lambda kw: kw["num_local_tokens"].float()),
            TypeError,
        ),
        (
            "two-element count",
            set_("num_local_tokens", torch.zeros(2, dtype=torch.int32, device=DEV)),
            ValueError,
        ),
        ("count not a tensor", set_("num_local_tokens", 3), TypeError),
        ("count on another device", set_("num_local_tokens", meta_i32), ValueError),
        (
            "zero_out wrong size",
            set_("bf16_zero_out", torch.zeros(8, 7, dtype=torch.bfloat16, device=DEV)),
            ValueError,
        ),
        (
            "zero_out non-contiguous",
            set_(
                "bf16_zero_out",
                lambda kw: torch.zeros(16, 16, dtype=torch.bfloat16, device=DEV)[::2],
            ),
            ValueError,
        ),
        ("zero_out not a tensor", set_("bf16_zero_out", None), TypeError),
        (
            "expanded ids (stride 0)",
            set_("topk_ids", lambda kw: kw["topk_ids"][:1].expand(8, 11)),
            ValueError,
        ),
        (
            "ids rows overlap",
            set_("topk_ids", lambda kw: torch.as_strided(kw["topk_ids"], (8, 11), (5, 1))),
            ValueError,
        ),
        (
            "expanded weights",
            set_("topk_weight", lambda kw: kw["topk_weight"][3:4].expand(8, 11)),
            ValueError,
        ),
        (
            "output aliases topk_ids",
            set_("topk_ids", lambda kw: kw["sorted_token_ids"][:88].view(8, 11)),
            ValueError,
        ),
        (
            "reverse_sorted aliases topk_weight",
            set_("topk_weight", lambda kw: kw["reverse_sorted"].view(torch.float32).view(8, 11)),
            ValueError,
        ),
        (
            "zero_out aliases sorted_weights",
            set_("bf16_zero_out", lambda kw: kw["sorted_weights"].view(torch.bfloat16)[:128]),
            ValueError,
        ),
        (
            "zero_out aliases topk_weight",
            set_("topk_weight", lambda kw: kw["bf16_zero_out"].view(-1)[:88].view(8, 11)),
            ValueError,
        ),
        (
            "workspace aliases m_indices",
            set_("bf16_zero_workspace", lambda kw: kw["m_indices"].view(torch.bfloat16)[8:40]),
            ValueError,
        ),
        (
            "count aliases cumsum_tensor",
            set_("num_local_tokens", lambda kw: kw["cumsum_tensor"][1:]),
            ValueError,
        ),
    ]


_BAD = _bad_cases()


@pytest.mark.parametrize(("label", "mutate", "exc"), _BAD, ids=[c[0] for c in _BAD])
@pytest.mark.parametrize(
    "fn", [mxfp4_moe_sort, mxfp4_moe_sort_reference], ids=["kernel", "reference"]
)
def test_bad_input_raises_and_writes_nothing(label, mutate, exc, fn) -> None:
    M, NE, K, MB = 8, 513, 11, 16
    ids, w = _routing(M, NE, K, None, seed=16)
    outs = _outputs(M, NE, K, MB, zero_cols=16)
    kwargs = dict(
        topk_ids=ids, topk_weight=w, **outs, M_logical=M, NE=NE, TOPK=K,
        D_HIDDEN=16, D_INTER=1, MB=MB, prologue=0, num_local_tokens=_count(4),
    )  # fmt: skip
    mutate(kwargs)
    with pytest.raises(exc):
        fn(**kwargs)
    for name, t in outs.items():
        if name == "bf16_zero_out":
            assert bool((t == 3.0).all()), (label, name)
        elif name != "bf16_zero_workspace":
            assert bool((t == POISON).all()), (label, name)


@pytest.mark.parametrize("K", [129, 200, 256])
@pytest.mark.parametrize(
    "fn", [mxfp4_moe_sort, mxfp4_moe_sort_reference], ids=["kernel", "reference"]
)
def test_topk_past_the_packed_slot_bits_is_rejected(K: int, fn) -> None:
    """``sorted_token_ids`` packs the slot into bits 24-30: slot 128 would set the sign
    bit. A call with TOPK 129..256 and outputs sized for it is refused before any write."""
    M, NE, MB = 2, 16, 16
    ids, w = _routing(M, NE, K, None, seed=18)
    outs = _outputs(M, NE, K, MB)
    with pytest.raises(ValueError, match="TOPK"):
        _call(fn, ids, w, outs, M, NE, K, MB, None)
    assert bool((outs["sorted_token_ids"] == POISON).all())
    with pytest.raises(ValueError, match="topk"):
        adaptive_moe_sort(ids, w, NE, K, MB, 8)


def test_topk_128_uses_the_last_slot_bit() -> None:
    """TOPK = 128: slot 127 packs to ``127 << 24``, the largest that fits."""
    ids, w = _routing(2, 16, 128, None, seed=19)
    got = _check(ids, w, 2, 16, 128, 16, None)
    total = int(got["cumsum_tensor"][0])
    assert int((got["sorted_token_ids"][:total] >> 24).max()) == 127


def test_adaptive_moe_sort_bad_inputs() -> None:
    ids, w = _routing(4, 16, 4, None, seed=17)
    with pytest.raises(ValueError):
        adaptive_moe_sort(ids.reshape(-1), w, 16, 4, 16, 8)
    with pytest.raises(ValueError):
        adaptive_moe_sort(ids, w, 16, 4, 24, 8)
    with pytest.raises(TypeError):
        adaptive_moe_sort(ids.tolist(), w, 16, 4, 16, 8)
    with pytest.raises(ValueError):
        adaptive_moe_sort(ids, w, 16, 5, 16, 8)  # topk != columns

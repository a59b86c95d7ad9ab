"""The kernels compiled on a real GPU (not interpreted), compared exactly with their
plain-torch references (the sort's large-batch path up to the order of pairs within an
expert, which its atomics leave to timing), replayed from one CUDA graph with new counts
(the guard also with new garbage), and called from inside ``torch.compile``; both launch
paths (Triton's own and the direct launch of the compiled kernel), the direct programs
of repeated signatures, the reuse of scratch buffers between calls, streams and graphs.

Skipped without a CUDA/HIP device; ``make test-gpu`` runs this folder on one.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip(
        "GPU tests run the compiled kernels: unset TRITON_INTERPRET", allow_module_level=True
    )

import sglang_amd_moe.kernels.utils as kernel_utils  # noqa: E402
from kernel_helpers import ROWS_COUNTS, assert_same_sort, bits  # noqa: E402
from sglang_amd_moe.kernels import (  # noqa: E402
    adaptive_moe_sort,
    guard_routing,
    guard_routing_reference,
    mask_padded_rows_,
    mask_padded_rows_reference_,
    mxfp4_moe_sort,
    mxfp4_moe_sort_reference,
)
from sglang_amd_moe.kernels import moe_sort as sort_mod  # noqa: E402
from sglang_amd_moe.kernels.mask_padded_rows import mask_program  # noqa: E402
from sglang_amd_moe.kernels.moe_sort import sort_plan, sort_program  # noqa: E402

DEV = "cuda"
SORT_SHAPES = [(513, 11), (896, 16)]
BIG_M = [4096, 16384, 65536]


# ----------------------------------------------------------------------------- mask
def _mask_inputs(M: int, K: int, id_dtype: torch.dtype, w_dtype: torch.dtype, seed: int):
    g = torch.Generator(device=DEV).manual_seed(seed)
    ids = torch.randint(-1, 600, (M, K), generator=g, device=DEV, dtype=torch.int64).to(id_dtype)
    w = torch.rand(M, K, generator=g, device=DEV).to(w_dtype)
    w[M // 2 :] = float("nan")
    return ids, w


def _check_mask(M: int, K: int, n: int | None, id_dtype, w_dtype, seed: int = 0) -> None:
    ids, w = _mask_inputs(M, K, id_dtype, w_dtype, seed)
    count = None if n is None else torch.tensor([n], dtype=torch.int32, device=DEV)
    ref_ids, ref_w = ids.clone(), w.clone()
    mask_padded_rows_reference_(ref_ids, ref_w, count, 0)
    mask_padded_rows_(ids, w, count, 0)
    torch.cuda.synchronize()
    assert torch.equal(ids, ref_ids)
    assert torch.equal(torch.nan_to_num(w, nan=7.0), torch.nan_to_num(ref_w, nan=7.0))


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,n", ROWS_COUNTS + [(48, None), (48, 100), (48, -3)])
def test_mask_matches_reference(M, n, id_dtype, w_dtype):
    _check_mask(M, 11, n, id_dtype, w_dtype)


@pytest.mark.parametrize("M", BIG_M)
@pytest.mark.parametrize("K", [8, 11, 16])
def test_mask_large(M, K):
    for n in (0, 1, M // 3, M - 1, M):
        _check_mask(M, K, n, torch.int32, torch.float32, seed=n)


def test_mask_random_shapes():
    g = torch.Generator().manual_seed(1234)
    for i in range(200):
        M = int(torch.randint(1, 70000, (1,), generator=g))
        K = int(torch.randint(1, 33, (1,), generator=g))
        n = int(torch.randint(-5, M + 10, (1,), generator=g))
        _check_mask(M, K, n, torch.int32 if i % 2 else torch.int64, torch.float32, seed=i)


def test_mask_graph_replay_with_new_counts():
    M, K = 65536, 11
    src_ids, src_w = _mask_inputs(M, K, torch.int32, torch.float32, 7)
    ids, w = src_ids.clone(), src_w.clone()
    count = torch.tensor([M], dtype=torch.int32, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mask_padded_rows_(ids, w, count, 0)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mask_padded_rows_(ids, w, count, 0)
    for n in (0, 1, M // 2, M - 1, M, M + 7):
        ids.copy_(src_ids)
        w.copy_(src_w)
        count.fill_(n)
        graph.replay()
        ref_ids, ref_w = src_ids.clone(), src_w.clone()
        mask_padded_rows_reference_(ref_ids, ref_w, torch.tensor([n], device=DEV), 0)
        torch.cuda.synchronize()
        assert torch.equal(ids, ref_ids), n
        assert torch.equal(torch.nan_to_num(w, nan=7.0), torch.nan_to_num(ref_w, nan=7.0)), n


def test_mask_inside_torch_compile():
    @torch.compile(fullgraph=True)
    def route(ids: torch.Tensor, w: torch.Tensor, count: torch.Tensor):
        ids, w = ids.clone(), w * 2.0  # exact in floating point: compared bit for bit
        mask_padded_rows_(ids, w, count, 0)
        return ids, w

    src_ids, src_w = _mask_inputs(256, 8, torch.int32, torch.float32, 11)
    for n in (0, 100, 256):
        count = torch.tensor([n], dtype=torch.int32, device=DEV)
        ids, w = route(src_ids, src_w, count)
        eids, ew = src_ids.clone(), src_w * 2.0
        mask_padded_rows_reference_(eids, ew, count, 0)
        assert torch.equal(ids, eids)
        assert torch.equal(torch.nan_to_num(w, nan=7.0), torch.nan_to_num(ew, nan=7.0))


# ----------------------------------------------------------------------------- sort
def _sort_buffers(M: int, K: int, NE: int, BM: int, atomic: bool):
    active = min(NE, M * K)
    max_sorted = -(-(M * K + active * (BM - 1)) // BM) * BM
    return dict(
        sorted_token_ids=torch.full((max_sorted,), -7, dtype=torch.int32, device=DEV),
        sorted_expert_ids=torch.full((max_sorted // BM,), -7, dtype=torch.int32, device=DEV),
        cumsum_tensor=torch.full((2,), -7, dtype=torch.int32, device=DEV),
        reverse_sorted=torch.full((M * K,), -7, dtype=torch.int32, device=DEV),
        sorted_weights=torch.full((max_sorted,), -7.0, dtype=torch.float32, device=DEV),
        m_indices=torch.full((max_sorted,), -7, dtype=torch.int32, device=DEV),
        bf16_zero_out=(
            torch.full((M, 64), 3.0, dtype=torch.bfloat16, device=DEV)
            if atomic and BM == 16
            else torch.empty(0, 0, dtype=torch.bfloat16, device=DEV)
        ),
        bf16_zero_workspace=torch.empty(0, dtype=torch.bfloat16, device=DEV),
    )


def _call_sort(fn, ids, w, out, M, NE, K, BM, count):
    fn(
        ids,
        w,
        out["sorted_token_ids"],
        out["sorted_expert_ids"],
        out["cumsum_tensor"],
        out["reverse_sorted"],
        out["sorted_weights"],
        out["m_indices"],
        out["bf16_zero_out"],
        out["bf16_zero_workspace"],
        M,
        NE,
        K,
        64,
        32,
        BM,
        0 if BM == 16 else 1,
        count,
    )


def _assert_same_sort(out, ref, BM, M, NE, K):
    """Exactly, or on the atomic path up to the order within each expert."""
    zero_numel = out["bf16_zero_out"].numel()
    atomic = sort_plan(M, NE, K, zero_numel, BM, sort_mod.DETERMINISTIC).atomic
    torch.cuda.synchronize()
    assert_same_sort(out, ref, M, BM, exact=not atomic)
    assert torch.equal(out["bf16_zero_out"], ref["bf16_zero_out"])


def _sort_inputs(M, K, NE, n, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    ids = torch.randint(0, NE, (M, K), generator=g, device=DEV, dtype=torch.int32)
    w = torch.rand(M, K, generator=g, device=DEV)
    if n is not None and 0 <= n < M:
        ids[n:] = -1
        w[n:] = float("nan")
    return ids, w


def _check_sort(M, K, NE, BM, n, seed=0, atomic=True):
    ids, w = _sort_inputs(M, K, NE, n, seed)
    count = None if n is None else torch.tensor([n], dtype=torch.int32, device=DEV)
    out, ref = _sort_buffers(M, K, NE, BM, atomic), _sort_buffers(M, K, NE, BM, atomic)
    _call_sort(mxfp4_moe_sort, ids, w, out, M, NE, K, BM, count)
    _call_sort(mxfp4_moe_sort_reference, ids, w, ref, M, NE, K, BM, count)
    torch.cuda.synchronize()
    _assert_same_sort(out, ref, BM, M, NE, K)


@pytest.mark.parametrize("NE,K", SORT_SHAPES)
@pytest.mark.parametrize("BM", [16, 32, 64, 128])
@pytest.mark.parametrize("M,n", ROWS_COUNTS + [(48, None), (48, 100), (48, -3)])
def test_sort_matches_reference(NE, K, BM, M, n):
    _check_sort(M, K, NE, BM, n)


@pytest.mark.parametrize("M", BIG_M)
@pytest.mark.parametrize("NE,K", [(257, 9)] + SORT_SHAPES)
def test_sort_large(M, NE, K):
    for n in (M // 2, M):
        _check_sort(M, K, NE, 16, n, seed=n)
    _check_sort(M, K, NE, 32, None)


def test_sort_random_shapes():
    g = torch.Generator().manual_seed(99)
    for i in range(60):
        M = int(torch.randint(1, 70000 if i % 6 == 0 else 600, (1,), generator=g))
        NE = int(torch.randint(1, 1025, (1,), generator=g))
        K = int(torch.randint(1, 17, (1,), generator=g))
        BM = [16, 32, 64, 128][i % 4]
        n = int(torch.randint(-3, M + 5, (1,), generator=g))
        _check_sort(M, K, NE, BM, n, seed=i, atomic=i % 2 == 0)


def test_sort_graph_replay_with_new_counts():
    M, K, NE, BM = 65536, 11, 513, 16
    ids_src, w_src = _sort_inputs(M, K, NE, None, 3)
    ids, w = ids_src.clone(), w_src.clone()
    count = torch.tensor([M], dtype=torch.int32, device=DEV)
    out = _sort_buffers(M, K, NE, BM, True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _call_sort(mxfp4_moe_sort, ids, w, out, M, NE, K, BM, count)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _call_sort(mxfp4_moe_sort, ids, w, out, M, NE, K, BM, count)
    for n in (1, 5, 47, 48, M):
        ids.copy_(ids_src)
        w.copy_(w_src)
        ids[n:] = -1
        w[n:] = float("nan")
        count.fill_(n)
        out["bf16_zero_out"].fill_(3.0)
        graph.replay()
        ref = _sort_buffers(M, K, NE, BM, True)
        _call_sort(mxfp4_moe_sort_reference, ids, w, ref, M, NE, K, BM, count)
        torch.cuda.synchronize()
        _assert_same_sort(out, ref, BM, M, NE, K)
        assert int(out["cumsum_tensor"][1]) == n


# ---------------------------------------------------------------------- launch paths
@pytest.mark.parametrize("fast", [True, False], ids=["direct", "triton"])
def test_both_launch_paths_match_the_references(fast, monkeypatch):
    """The direct launch (``KernelLauncher`` calling the compiled kernel) and Triton's own
    path give the same outputs, for every sort plan (1, 2 and 3 launches) and the mask;
    the direct path really launches directly from the second call on."""
    monkeypatch.setattr(kernel_utils, "FAST_LAUNCH", fast)
    for M, NE, K, BM, n in [(1, 513, 11, 16, 1), (64, 257, 9, 32, 40), (4096, 896, 16, 128, 3000)]:
        for _ in range(3):  # the first call compiles; the later ones take the chosen path
            _check_sort(M, K, NE, BM, n, seed=M)
        prog = sort_program(M, NE, K, BM, M * 64 if BM == 16 else 0, True)
        for launcher in (prog.count, prog.offsets, prog.place):
            if launcher is not None and fast:
                assert launcher.compiled_count() > 0, launcher
    for M, K in [(7, 8), (4096, 11)]:
        for _ in range(3):
            _check_mask(M, K, M // 2, torch.int32, torch.float32)
        launcher, _ = mask_program(M, K, True)
        if fast:
            assert launcher.compiled_count() > 0


def test_direct_launch_respecializes_on_alignment_and_ints():
    """A routing tensor 4 bytes off a 16-byte boundary, and row counts 1 / 16 / 17, each
    compile their own specialization; every call matches the reference."""
    M, K, NE = 48, 11, 513
    for offset in (0, 1, 0, 1):
        buf = torch.randint(0, NE, (M * K + 1,), device=DEV, dtype=torch.int32)
        ids = buf[offset : offset + M * K].view(M, K)
        w = torch.rand(M, K, device=DEV)
        for n in (1, 16, 17, M):
            out, ref = _sort_buffers(M, K, NE, 16, True), _sort_buffers(M, K, NE, 16, True)
            count = torch.tensor([n], dtype=torch.int32, device=DEV)
            _call_sort(mxfp4_moe_sort, ids, w, out, M, NE, K, 16, count)
            _call_sort(mxfp4_moe_sort_reference, ids, w, ref, M, NE, K, 16, count)
            torch.cuda.synchronize()
            _assert_same_sort(out, ref, 16, M, NE, K)


def test_scratch_is_reused_per_stream_and_fresh_under_capture():
    dev = torch.device(DEV)
    a = kernel_utils.scratch("test", 100, torch.int32, dev)
    assert kernel_utils.scratch("test", 50, torch.int32, dev) is a
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        b = kernel_utils.scratch("test", 100, torch.int32, dev)
    assert b is not a
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = kernel_utils.scratch("test", 100, torch.int32, dev)
    assert c is not a and c is not b
    bigger = kernel_utils.scratch("test", 10 * a.numel(), torch.int32, dev)
    assert bigger.numel() >= 10 * a.numel()


def test_sorts_on_two_streams_at_once():
    """Each stream has its own scratch buffers: two sorts queued on two streams, which may
    overlap on the GPU, both match the reference."""
    M, K, NE, BM = 4096, 16, 896, 16
    inputs = [_sort_inputs(M, K, NE, n, seed=n) for n in (3000, 4096)]
    outs = [_sort_buffers(M, K, NE, BM, True) for _ in inputs]
    counts = [torch.tensor([n], dtype=torch.int32, device=DEV) for n in (3000, 4096)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    for _ in range(5):
        for (ids, w), out, count, stream in zip(inputs, outs, counts, streams, strict=True):
            with torch.cuda.stream(stream):
                _call_sort(mxfp4_moe_sort, ids, w, out, M, NE, K, BM, count)
    torch.cuda.synchronize()
    for (ids, w), out, count in zip(inputs, outs, counts, strict=True):
        ref = _sort_buffers(M, K, NE, BM, True)
        _call_sort(mxfp4_moe_sort_reference, ids, w, ref, M, NE, K, BM, count)
        _assert_same_sort(out, ref, BM, M, NE, K)


def test_adaptive_sort_in_a_graph_and_eagerly_after_it():
    """A graph captured around ``adaptive_moe_sort`` keeps its own scratch: eager calls on
    the same stream between replays (other shapes, other data) do not disturb it."""
    M, K, NE, BM = 512, 9, 257, 32
    ids, w = _sort_inputs(M, K, NE, None, seed=21)
    count = torch.tensor([M], dtype=torch.int32, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        adaptive_moe_sort(ids, w, NE, K, BM, 8, emit_aux=True, num_local_tokens=count)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = adaptive_moe_sort(ids, w, NE, K, BM, 8, emit_aux=True, num_local_tokens=count)
    other_ids, other_w = _sort_inputs(M, K, NE, None, seed=22)
    for n in (5, 300, M):
        count.fill_(n)
        graph.replay()
        adaptive_moe_sort(other_ids, other_w, NE, K, BM, 8, emit_aux=True, num_local_tokens=count)
        want = _sort_buffers(M, K, NE, BM, False)
        _call_sort(mxfp4_moe_sort_reference, ids, w, want, M, NE, K, BM, count)
        torch.cuda.synchronize()
        sti, sw, sei, nvi, _, m_idx, rev = got
        _assert_same_sort(
            dict(
                sorted_token_ids=sti,
                sorted_weights=sw,
                sorted_expert_ids=sei,
                cumsum_tensor=nvi,
                m_indices=m_idx,
                reverse_sorted=rev,
                bf16_zero_out=want["bf16_zero_out"],
            ),
            want,
            BM,
            M,
            NE,
            K,
        )


def test_no_device_switch_when_the_device_is_current():
    assert (
        kernel_utils.device_guard(torch.device("cuda", torch.cuda.current_device()))
        is kernel_utils._NO_GUARD
    )


# ---------------------------------------------------------------------------- guard
E_GUARD = 257
_GARBAGE = [-1, E_GUARD, E_GUARD + 3, 2**31 - 1, -(2**31)]
_GARBAGE64 = _GARBAGE + [2**32, 2**63 - 1, -(2**63)]


def _guard_inputs(M: int, K: int, id_dtype, w_dtype, seed: int, bad: float = 0.3):
    g = torch.Generator(device=DEV).manual_seed(seed)
    ids = torch.randint(0, E_GUARD, (M, K), generator=g, device=DEV, dtype=torch.int64)
    pool = torch.tensor(_GARBAGE64 if id_dtype == torch.int64 else _GARBAGE, device=DEV)
    pick = torch.randint(0, pool.numel(), (M, K), generator=g, device=DEV)
    ids = torch.where(torch.rand(M, K, generator=g, device=DEV) < bad, pool[pick], ids)
    w = torch.randn(M, K, generator=g, device=DEV)
    special = torch.tensor([float("nan"), float("inf"), -float("inf")], device=DEV)
    w = torch.where(torch.rand(M, K, generator=g, device=DEV) < 0.1, special[pick % 3], w)
    return ids.to(id_dtype), w.to(w_dtype)


def _check_guard(ids, w, n):
    count = None if n is None else torch.tensor([n], dtype=torch.int32, device=DEV)
    before_ids, before_w = ids.clone(), w.clone()
    got = guard_routing(ids, w, E_GUARD, count)
    want = guard_routing_reference(ids, w, E_GUARD, count)
    torch.cuda.synchronize()
    for g_, w_ in zip(got, want, strict=True):
        assert g_.is_contiguous() and torch.equal(bits(g_), bits(w_))
    assert torch.equal(ids, before_ids) and torch.equal(bits(w), bits(before_w))
    assert bool(((got[0] >= 0) & (got[0] < E_GUARD)).all())


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,n", ROWS_COUNTS + [(48, None), (48, 100), (48, -3)])
def test_guard_matches_reference(M, n, id_dtype, w_dtype):
    for _ in range(2):  # the second call of a signature takes its direct program
        ids, w = _guard_inputs(M, 11, id_dtype, w_dtype, seed=M)
        _check_guard(ids, w, n)


@pytest.mark.parametrize("M", BIG_M)
def test_guard_large_and_strided(M):
    ids, w = _guard_inputs(M, 9, torch.int32, torch.bfloat16, seed=M)
    for n in (None, 0, M // 3, M):
        _check_guard(ids, w, n)
    buf_ids, buf_w = _guard_inputs(M, 12, torch.int64, torch.float32, seed=M + 1)
    _check_guard(buf_ids[:, 1:10], buf_w[:, 2:11], M // 2)
    _check_guard(buf_ids[:, :9].t().contiguous().t(), buf_w[:, :9], M - 1)


@pytest.mark.parametrize("with_count", [True, False])
def test_guard_graph_replay_with_new_garbage_and_counts(with_count):
    """One captured guard call replayed with new garbage ids, new NaN/Inf weights and new
    counts written into the same input buffers: every replay's outputs match the
    reference, and the inputs are never written."""
    M, K = 4096, 11
    ids, w = _guard_inputs(M, K, torch.int64, torch.bfloat16, seed=5)
    count = torch.tensor([M], dtype=torch.int32, device=DEV) if with_count else None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        guard_routing(ids, w, E_GUARD, count)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_ids, out_w = guard_routing(ids, w, E_GUARD, count)
    for i, n in enumerate((0, 1, M // 2, M - 1, M, M + 9, -4)):
        new_ids, new_w = _guard_inputs(M, K, torch.int64, torch.bfloat16, seed=100 + i, bad=0.5)
        ids.copy_(new_ids)
        w.copy_(new_w)
        if count is not None:
            count.fill_(n)
        graph.replay()
        want_ids, want_w = guard_routing_reference(new_ids, new_w, E_GUARD, count)
        torch.cuda.synchronize()
        assert torch.equal(out_ids, want_ids), n
        assert torch.equal(bits(out_w), bits(want_w)), n
        assert torch.equal(ids, new_ids) and torch.equal(bits(w), bits(new_w))


def test_references_replay_in_a_graph_with_new_counts():
    """The guard's and the mask's plain-torch references read the count on the device:
    captured once, they follow the count at every replay (a fallback on the GPU)."""
    M, K = 300, 8
    ids, w = _guard_inputs(M, K, torch.int32, torch.float32, seed=9)
    mids, mw = ids.clone(), w.clone()
    count = torch.tensor([M], dtype=torch.int32, device=DEV)
    guard_routing_reference(ids, w, E_GUARD, count)
    mask_padded_rows_reference_(mids.clone(), mw.clone(), count, 0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gids, gw = guard_routing_reference(ids, w, E_GUARD, count)
        mask_padded_rows_reference_(mids, mw, count, 0)
    for n in (0, 7, M, M + 1):
        mids.copy_(ids)
        mw.copy_(w)
        count.fill_(n)
        graph.replay()
        torch.cuda.synchronize()
        real = min(n, M)
        valid = (ids >= 0) & (ids < E_GUARD)
        valid[real:] = False
        assert torch.equal(gids, torch.where(valid, ids, 0))
        assert torch.equal(bits(gw), bits(torch.where(valid, w, 0)))
        assert bool((mids[real:] == 0).all()) and torch.equal(mids[:real], ids[:real])


# -------------------------------------------------------------------- direct programs
def test_direct_programs_on_the_gpu():
    """The second call of a signature launches its direct program (compiled kernels,
    integer pointers): right results for every kernel, and a hit whose pointers overlap
    goes to the full checks and raises."""
    from sglang_amd_moe.kernels import mask_padded_rows as mask_mod
    from sglang_amd_moe.kernels import routing_guard as guard_mod

    for M, K in [(7, 8), (4096, 11)]:
        for seed in (1, 2):
            _check_mask(M, K, M // 2, torch.int32, torch.float32, seed=seed)
    assert mask_mod._DIRECT
    ids, w = _mask_inputs(64, 8, torch.int32, torch.float32, 3)
    with pytest.raises(ValueError, match="overlap in memory"):
        mask_padded_rows_(ids, w, ids.view(-1)[9:10])
    for seed in (1, 2):
        ids, w = _guard_inputs(512, 9, torch.int32, torch.float32, seed)
        _check_guard(ids, w, 300)
    assert guard_mod._DIRECT
    for M, NE, K, BM in [
        (3, 896, 16, 16),
        (64, 513, 11, 32),
        (512, 257, 9, 16),
        (16384, 257, 9, 16),
    ]:
        for seed in (1, 2):
            _check_sort(M, K, NE, BM, M // 2, seed=seed)
    assert sort_mod._DIRECT
    ids, w = _sort_inputs(64, 11, 513, None, 4)
    out = _sort_buffers(64, 11, 513, 32, True)
    _call_sort(mxfp4_moe_sort, ids, w, out, 64, 513, 11, 32, None)
    out["m_indices"] = out["sorted_token_ids"]
    with pytest.raises(ValueError, match="overlap in memory"):
        _call_sort(mxfp4_moe_sort, ids, w, out, 64, 513, 11, 32, None)


def test_direct_programs_across_row_counts():
    """Prefill's pattern: the row count changes from forward to forward, each count
    called several times (its MoE layers). The mask and the guard take one direct
    program for every count (after the first call, no other program is made), every
    result is the reference's, and the guard's outputs kept from all calls, some
    allocated and some from slabs, still hold their own results at the end."""
    from sglang_amd_moe.kernels import mask_padded_rows as mask_mod
    from sglang_amd_moe.kernels import routing_guard as guard_mod

    mask_mod._DIRECT.clear()
    guard_mod._DIRECT.clear()
    counts = [300, 7, 4096, 300, 2, 1000, 33, 7, 4095, 64, 1, 513, 3000]
    kept = []
    for i, M in enumerate(counts):
        for layer in range(3):
            seed = 1000 + 10 * i + layer
            _check_mask(M, 9, (M * layer) // 2, torch.int32, torch.bfloat16, seed=seed)
            ids, w = _guard_inputs(M, 9, torch.int64, torch.float32, seed)
            count = torch.tensor([M - layer], dtype=torch.int32, device=DEV)
            kept.append((ids, w, count, guard_routing(ids, w, E_GUARD, count)))
    assert len(mask_mod._DIRECT) == len(guard_mod._DIRECT) == 2  # one row; more rows
    torch.cuda.synchronize()
    spans = []
    for ids, w, count, (out_ids, out_w) in kept:
        want_ids, want_w = guard_routing_reference(ids, w, E_GUARD, count)
        assert torch.equal(out_ids, want_ids) and torch.equal(bits(out_w), bits(want_w))
        spans += [
            (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in (out_ids, out_w)
        ]
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert any(out[0]._base is not None for *_, out in kept)  # some came from slabs


def test_guard_slab_outputs_each_keep_their_own_call():
    """Hits hand out outputs carved from slabs: every output kept from 40 calls on two
    streams, with new inputs each time, still holds its own call's result at the end
    (no later call, on either stream, wrote into it), and no two share memory."""
    M, K = 64, 9
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    kept = []
    for i in range(40):
        ids, w = _guard_inputs(M, K, torch.int32, torch.float32, seed=200 + i, bad=0.5)
        count = torch.tensor([(7 * i) % (M + 1)], dtype=torch.int32, device=DEV)
        with torch.cuda.stream(streams[i % 2]):
            out = guard_routing(ids, w, E_GUARD, count)
        kept.append((ids, w, count, out))
    torch.cuda.synchronize()
    spans = []
    for ids, w, count, (out_ids, out_w) in kept:
        want_ids, want_w = guard_routing_reference(ids, w, E_GUARD, count)
        assert torch.equal(out_ids, want_ids) and torch.equal(bits(out_w), bits(want_w))
        for t in (out_ids, out_w):
            assert t.is_contiguous() and t.data_ptr() % 16 == 0
            spans.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_guard_graph_and_eager_hits_on_one_stream():
    """A graph captured on a stream after eager hits there, replayed between more eager
    hits on that stream: the graph's outputs are its own (from its pool), the eager
    outputs each their own."""
    M, K = 128, 8
    ids, w = _guard_inputs(M, K, torch.int64, torch.bfloat16, seed=31)
    count = torch.tensor([M], dtype=torch.int32, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            guard_routing(ids, w, E_GUARD, count)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            g_ids, g_w = guard_routing(ids, w, E_GUARD, count)
        eager = []
        for n in (0, 50, M):
            count.fill_(n)
            graph.replay()
            other_ids, other_w = _guard_inputs(M, K, torch.int64, torch.bfloat16, seed=n)
            other_count = torch.tensor([M - n], dtype=torch.int32, device=DEV)
            out = guard_routing(other_ids, other_w, E_GUARD, other_count)  # the same signature
            eager.append((other_ids, other_w, other_count, out))
            want_ids, want_w = guard_routing_reference(ids, w, E_GUARD, count)
            s.synchronize()
            assert torch.equal(g_ids, want_ids) and torch.equal(bits(g_w), bits(want_w)), n
    torch.cuda.synchronize()
    for other_ids, other_w, other_count, (out_ids, out_w) in eager:
        want_ids, want_w = guard_routing_reference(other_ids, other_w, E_GUARD, other_count)
        assert torch.equal(out_ids, want_ids) and torch.equal(bits(out_w), bits(want_w))


def test_direct_programs_follow_a_replaced_scratch_buffer():
    """A direct program keeps the scratch buffer it took last; another signature that
    needs a larger one replaces it, and the first program takes the new one after."""
    shapes = [(64, 257, 9, 16), (4096, 896, 16, 16), (64, 257, 9, 16), (512, 513, 11, 16)]
    for round_ in range(2):
        for i, (M, NE, K, BM) in enumerate(shapes):
            _check_sort(M, K, NE, BM, M // 2, seed=10 * round_ + i, atomic=False)


def test_adaptive_direct_program_matches_the_reference():
    M, K, NE, BM = 700, 11, 513, 16
    for seed in (1, 2, 3):
        ids, w = _sort_inputs(M, K, NE, 600, seed)
        count = torch.tensor([600], dtype=torch.int32, device=DEV)
        sti, sw, sei, nvi, moe_buf, m_idx, rev = adaptive_moe_sort(
            ids, w, NE, K, BM, 64, atomic=True, emit_aux=True, num_local_tokens=count
        )
        want = _sort_buffers(M, K, NE, BM, False)
        _call_sort(mxfp4_moe_sort_reference, ids, w, want, M, NE, K, BM, count)
        got = dict(
            sorted_token_ids=sti, sorted_weights=sw, sorted_expert_ids=sei, cumsum_tensor=nvi,
            m_indices=m_idx, reverse_sorted=rev, bf16_zero_out=want["bf16_zero_out"],
        )  # fmt: skip
        _assert_same_sort(got, want, BM, M, NE, K)
        assert bool((moe_buf == 0).all())
    assert sort_mod._ADAPTIVE_DIRECT


def test_atomic_counters_are_left_zero_on_every_stream():
    """Large batches count into per-stream counters that every call leaves zero: two
    streams, several calls each, every result right and every counter zero after."""
    from sglang_amd_moe.kernels import utils as kernel_utils

    M, K, NE, BM = 16384, 16, 896, 16
    assert sort_plan(M, NE, K, 0, BM, sort_mod.DETERMINISTIC).atomic
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    runs = []
    for i in range(6):
        n = [M, 5000, 1][i % 3]
        ids, w = _sort_inputs(M, K, NE, n, seed=i)
        out = _sort_buffers(M, K, NE, BM, False)
        count = torch.tensor([n], dtype=torch.int32, device=DEV)
        with torch.cuda.stream(streams[i % 2]):
            _call_sort(mxfp4_moe_sort, ids, w, out, M, NE, K, BM, count)
        runs.append((ids, w, out, count))
    torch.cuda.synchronize()
    for ids, w, out, count in runs:
        ref = _sort_buffers(M, K, NE, BM, False)
        _call_sort(mxfp4_moe_sort_reference, ids, w, ref, M, NE, K, BM, count)
        _assert_same_sort(out, ref, BM, M, NE, K)
    states = [b for k, b in kernel_utils._STATE.items() if k[3] == "moe_sort_counters"]
    assert states and all(bool((b == 0).all()) for b in states)

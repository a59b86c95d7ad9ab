"""Both kernels compiled on a real GPU (not interpreted), compared exactly with their
plain-torch references, replayed from one CUDA graph with new counts, and called from
inside ``torch.compile``.

Skipped without a CUDA/HIP device; ``make test-gpu`` runs this folder on one.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("GPU tests run the compiled kernels: unset TRITON_INTERPRET", allow_module_level=True)

from sglang_amd_moe.kernels import (  # noqa: E402
    mask_padded_rows_,
    mask_padded_rows_reference_,
    mxfp4_moe_sort,
    mxfp4_moe_sort_reference,
)

DEV = "cuda"
SORT_SHAPES = [(513, 11), (896, 16)]
ROWS_COUNTS = [(1, 1), (4, 0), (4, 3), (16, 5), (48, 47), (48, 48), (256, 200)]
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
        bf16_zero_out=(torch.full((M, 64), 3.0, dtype=torch.bfloat16, device=DEV) if atomic and BM == 16
                       else torch.empty(0, 0, dtype=torch.bfloat16, device=DEV)),
        bf16_zero_workspace=torch.empty(0, dtype=torch.bfloat16, device=DEV),
    )


def _call_sort(fn, ids, w, out, M, NE, K, BM, count):
    fn(ids, w, out["sorted_token_ids"], out["sorted_expert_ids"], out["cumsum_tensor"],
       out["reverse_sorted"], out["sorted_weights"], out["m_indices"], out["bf16_zero_out"],
       out["bf16_zero_workspace"], M, NE, K, 64, 32, BM, 0 if BM == 16 else 1, count)


def _assert_same_sort(out, ref, BM):
    total = int(ref["cumsum_tensor"][0])
    assert torch.equal(out["cumsum_tensor"], ref["cumsum_tensor"])
    for name in ("sorted_token_ids", "sorted_weights", "m_indices"):
        assert torch.equal(out[name][:total], ref[name][:total]), name
    assert torch.equal(out["sorted_expert_ids"][: total // BM], ref["sorted_expert_ids"][: total // BM])
    assert torch.equal(out["reverse_sorted"], ref["reverse_sorted"])
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
    _assert_same_sort(out, ref, BM)


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
        _assert_same_sort(out, ref, BM)
        assert int(out["cumsum_tensor"][1]) == n

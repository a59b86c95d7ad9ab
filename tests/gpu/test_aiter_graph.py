"""The aiter hook inside a CUDA graph captured once and replayed with new counts.

ATOM and SGLang capture the MoE layer in a CUDA/HIP graph with ``num_local_tokens`` as a
device tensor, then replay it with the real row count written into that tensor. The
patched sort (this package's Triton kernel behind aiter's stand-in) must be capturable
and honour each new count on replay. Both stand-in trees are driven through the public
``fused_moe`` (so ``count-dropped`` also exercises the count recovered from
``_fused_moe_impl``), and ``count-dropped`` also through ``_moe_sorting_impl`` at block 32.

Skipped without a CUDA/HIP device (``make test-gpu`` runs this folder on one).
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

from aiter_testlib import (  # noqa: E402  (tests/aiter, on pytest's pythonpath)
    SORT_OUTPUTS,
    STANDIN,
    assert_sort_of_leading_rows,
    forget_aiter,
    padded_routing,
)

from sglang_amd_moe.runtime.aiter import hook as aiter_hook  # noqa: E402

DEV = "cuda"
COUNTS = (1, 5, 47, 48, 0)
# (shape, M, topk, experts, model_dim, inter_dim): count-rejected uses aiter PR 7083's shape,
# which its stand-in lists as supported for the inline-sort path.
CASES = [
    ("count-dropped", 48, 8, 257, 512, 256),
    ("count-rejected", 48, 11, 513, 2560, 640),
]


@pytest.fixture
def standin(monkeypatch):
    aiter_hook.uninstall()
    forget_aiter()
    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.setenv("SGLANG_AMD_MOE_FORCE", "1")  # the hooks' gate: ROCm, or forced

    def load(shape: str):
        monkeypatch.setenv("SGLANG_AMD_MOE_TEST_AITER_STANDIN_SHAPE", shape)
        assert aiter_hook.install().state == "pending"
        import aiter.fused_moe as fm

        assert (aiter_hook.status().state, aiter_hook.status().form) == ("live", shape)
        return fm

    yield load
    aiter_hook.uninstall()
    forget_aiter()


def replay_and_check(graph, outputs, n_dev, ids, w, E, BM, dim) -> None:
    for n in COUNTS:
        n_dev.fill_(n)
        for name, t in zip(SORT_OUTPUTS, outputs, strict=True):  # stale data must be rewritten
            if t.numel():
                t.fill_(7 if name == "moe_buf" else -7)
        graph.replay()
        torch.cuda.synchronize()
        got = {k: v.cpu() for k, v in zip(SORT_OUTPUTS, outputs, strict=True)}
        assert_sort_of_leading_rows(got, ids, w, n, E, BM, dim)


@pytest.mark.parametrize(("shape", "M", "K", "E", "dim", "inter"), CASES)
def test_fused_moe_sort_in_a_cuda_graph(standin, shape, M, K, E, dim, inter) -> None:
    fm = standin(shape)
    fm.standin_metadata = fm.standin_inline_sort_metadata(block_m=16, atomic=True)
    ids, w = padded_routing(M, K, E, seed=1, device=DEV)
    hidden = torch.zeros(M, dim, dtype=torch.bfloat16, device=DEV)
    w1 = torch.empty(1, 1, 1, device=DEV).expand(E, 2 * inter, dim)
    w2 = torch.empty(1, 1, 1, device=DEV).expand(E, dim, inter)
    n_dev = torch.tensor([M], dtype=torch.int32, device=DEV)

    def call():
        fm.fused_moe(hidden, w1, w2, w, ids, num_local_tokens=n_dev)
        return fm.standin_sorts[-1]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # compiles the Triton kernels outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = call()
    assert len(outputs) == 7
    replay_and_check(graph, outputs, n_dev, ids, w, E, 16, dim)


def test_sort_impl_block_32_in_a_cuda_graph(standin) -> None:
    fm = standin("count-dropped")
    M, K, E, dim = 48, 8, 257, 512
    ids, w = padded_routing(M, K, E, seed=2, device=DEV)
    n_dev = torch.tensor([M], dtype=torch.int32, device=DEV)

    def call():
        return fm._moe_sorting_impl(
            ids,
            w,
            E,
            dim,
            torch.bfloat16,
            32,
            None,
            n_dev,
            0,
            True,
            accumulate=True,
            output_aux=True,
        )

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = call()
    replay_and_check(graph, outputs, n_dev, ids, w, E, 32, dim)

"""The counters on a real GPU: added to inside the guard's and the mask's launches in CUDA
graph replay (new counts and new garbage per replay, the counts of every replay summed),
equal to the torch reference's; read by ``runtime.stats`` without waiting for the stream
that launches the kernels.

Skipped without a CUDA/HIP device.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip(
        "GPU tests run the compiled kernels: unset TRITON_INTERPRET", allow_module_level=True
    )

from sglang_amd_moe.kernels import (  # noqa: E402
    guard_routing,
    guard_routing_reference,
    mask_padded_rows_,
    mask_padded_rows_reference_,
)
from sglang_amd_moe.kernels.reference import (  # noqa: E402
    guard_stats_reference,
    mask_stats_reference,
)

from sglang_amd_moe.runtime import stats  # noqa: E402

E = 257


def _garbage(M: int, K: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.randint(-3, E + 40, (M, K), dtype=torch.int32, device="cuda", generator=g)
    w = torch.rand(M, K, device="cuda", generator=g)
    w[torch.rand(M, K, device="cuda", generator=g) < 0.1] = float("nan")
    return ids, w


@pytest.mark.parametrize("M", [1, 7, 300, 4096])
@pytest.mark.parametrize("with_count", [True, False])
def test_guard_counters_in_graph_replay(M: int, with_count: bool) -> None:
    """One graph, replayed with new ids and counts: the counters add up every replay."""
    K = 9
    ids, w = _garbage(M, K, 0)
    count = torch.tensor([M // 2], dtype=torch.int32, device="cuda") if with_count else None
    buf = torch.zeros(8, dtype=torch.int64, device="cuda")
    guard_routing(ids, w, E, count, buf)  # warm: compile, keep the direct program
    torch.cuda.synchronize()
    buf.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_ids, out_w = guard_routing(ids, w, E, count, buf)
    expected = torch.zeros(4, dtype=torch.int64, device="cuda")
    for seed, n in ((1, 0), (2, M), (3, M // 3), (4, -5)):
        new_ids, new_w = _garbage(M, K, seed)
        ids.copy_(new_ids)
        w.copy_(new_w)
        if count is not None:
            count.fill_(n)
        graph.replay()
        expected += guard_stats_reference(ids, w, E, count)
    torch.cuda.synchronize()
    assert buf[:4].tolist() == expected.tolist()
    assert buf[4:].tolist() == [0, 0, 0, 0]
    assert expected[0].item() == 4 and expected[1].item() > 0


@pytest.mark.parametrize("M", [1, 300, 4096])
@pytest.mark.parametrize("contiguous", [True, False])
def test_mask_counters_in_graph_replay(M: int, contiguous: bool) -> None:
    K = 8
    buf_ids, buf_w = _garbage(M, K + 3, 5)
    ids, w = (
        (buf_ids[:, :K], buf_w[:, 3:])
        if not contiguous
        else (buf_ids[:, :K].clone(), buf_w[:, :K].clone())
    )
    count = torch.tensor([M // 2], dtype=torch.int32, device="cuda")
    buf = torch.zeros(8, dtype=torch.int64, device="cuda")
    mask_padded_rows_(ids, w, count, 0, buf)
    torch.cuda.synchronize()
    buf.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mask_padded_rows_(ids, w, count, 0, buf)
    expected = torch.zeros(4, dtype=torch.int64, device="cuda")
    for seed, n in ((6, 0), (7, M // 3), (8, M)):
        new_ids, new_w = _garbage(M, K, seed)
        ids.copy_(new_ids)
        w.copy_(new_w)
        count.fill_(n)
        expected += mask_stats_reference(ids, w, count)
        graph.replay()
    torch.cuda.synchronize()
    assert buf[:4].tolist() == expected.tolist()
    pad = torch.arange(M, device="cuda") >= count
    assert bool((ids[pad] == 0).all()) and bool((w[pad] == 0).all())


@pytest.mark.parametrize("with_stats", [False, True])
@pytest.mark.parametrize("with_count", [False, True])
def test_guard_inside_torch_compile(with_stats: bool, with_count: bool) -> None:
    """Traced by ``torch.compile`` (the custom op), with and without counters: the same
    outputs as the reference, and the counters of every call. Without counters this
    failed on torch 2.11 (a mutated ``Tensor?`` passed as its default None)."""

    @torch.compile(fullgraph=True)
    def route(ids, w, count, buf):
        out_ids, out_w = guard_routing(ids, w * 2.0, E, count, buf)
        return out_ids, out_w

    buf = torch.zeros(8, dtype=torch.int64, device="cuda") if with_stats else None
    expected = torch.zeros(4, dtype=torch.int64, device="cuda")
    for seed, n in ((11, 0), (12, 100), (13, 256)):
        ids, w = _garbage(256, 9, seed)
        count = torch.tensor([n], dtype=torch.int32, device="cuda") if with_count else None
        got_ids, got_w = route(ids, w, count, buf)
        ref_ids, ref_w = guard_routing_reference(ids, w * 2.0, E, count)
        expected += guard_stats_reference(ids, w * 2.0, E, count)
        assert torch.equal(got_ids, ref_ids)
        assert torch.equal(torch.nan_to_num(got_w, nan=7.0), torch.nan_to_num(ref_w, nan=7.0))
    torch.cuda.synchronize()
    if with_stats:
        assert buf[:4].tolist() == expected.tolist() and expected[1].item() > 0


@pytest.mark.parametrize("with_stats", [False, True])
def test_mask_inside_torch_compile_with_and_without_counters(with_stats: bool) -> None:
    """As the guard's: the mask traced by ``torch.compile``, in place, counted or not."""

    @torch.compile(fullgraph=True)
    def route(ids, w, count, buf):
        ids, w = ids.clone(), w * 2.0
        mask_padded_rows_(ids, w, count, 0, buf)
        return ids, w

    buf = torch.zeros(8, dtype=torch.int64, device="cuda") if with_stats else None
    expected = torch.zeros(4, dtype=torch.int64, device="cuda")
    for seed, n in ((14, 0), (15, 100), (16, 256)):
        src_ids, src_w = _garbage(256, 8, seed)
        count = torch.tensor([n], dtype=torch.int32, device="cuda")
        got_ids, got_w = route(src_ids, src_w, count, buf)
        ref_ids, ref_w = src_ids.clone(), src_w * 2.0
        expected += mask_stats_reference(ref_ids, ref_w, count)
        mask_padded_rows_reference_(ref_ids, ref_w, count, 0)
        assert torch.equal(got_ids, ref_ids)
        assert torch.equal(torch.nan_to_num(got_w, nan=7.0), torch.nan_to_num(ref_w, nan=7.0))
    torch.cuda.synchronize()
    if with_stats:
        assert buf[:4].tolist() == expected.tolist() and expected[2].item() > 0


def test_reading_the_counters_never_waits_for_the_launching_stream() -> None:
    """While the launching stream is still busy (a long sleep queued before a guard call),
    the reader's copy runs on its side stream and completes; the host returns at once; the
    counters read then do not yet hold the queued call, and do once the stream is done."""
    stats.reset()
    ids, w = _garbage(64, 8, 9)
    buf = stats.buffer("guard", ids.device)
    guard_routing(ids, w, E, None, buf)
    torch.cuda.synchronize()
    first = stats.counts()["guard"]
    assert first["calls"] == 1
    stream = torch.cuda.current_stream()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time on the launching stream
    guard_routing(ids, w, E, None, buf)
    t0 = time.perf_counter()
    event, copies = stats._start_copy()
    host_ms = (time.perf_counter() - t0) * 1000
    event.synchronize()  # the side stream's copy: done while the launching stream sleeps
    assert not stream.query(), "the launching stream finished first: the sleep was too short"
    assert host_ms < 50
    assert stats._sum(copies)["guard"] == first
    torch.cuda.synchronize()
    assert stats.counts()["guard"]["calls"] == 2
    stats.reset()


def test_tick_logs_a_line_once_a_copy_is_done(caplog, monkeypatch) -> None:
    """The periodic line: a tick past the interval starts a copy; a later tick writes the
    line (target, calls, entries changed by reason, version) once the copy is done."""
    import logging

    stats.reset()
    monkeypatch.setattr(stats, "INTERVAL_S", 0.0)
    ids, w = _garbage(32, 8, 10)
    buf = stats.buffer("guard", ids.device)
    stats._STATE["next_due"] = 0.0
    with caplog.at_level(logging.INFO, logger="sglang_amd_moe"):
        guard_routing(ids, w, E, None, buf)
        stats.tick()  # starts the copy
        torch.cuda.synchronize()
        stats.tick()  # writes the line
    lines = [r.getMessage() for r in caplog.records if "stats: target=guard" in r.getMessage()]
    assert len(lines) == 1 and " calls=1 " in lines[0] and "version=" in lines[0], lines
    stats.reset()

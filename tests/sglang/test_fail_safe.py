"""The hooked call fails safe: whatever keeps the mask kernel from running for a call, padded
rows still leave it with id 0 and weight 0 (the plain-torch mask takes over, the first
fallback per reason logged), and where nothing can mask them the call raises before
upstream sees them. In-process on the synthetic topk module (``run`` is what the wrapper
runs on every HIP call); the kernel is the real one, through Triton's interpreter."""

from __future__ import annotations

import logging
import threading

import pytest
import synthetic_topk as syn
import torch
from sglang_amd_moe.kernels import mask_padded_rows_

from sglang_amd_moe.runtime.sglang.call import Call, LiveEnv, Plan, mask_fallback_, run
from sglang_amd_moe.runtime.target import Args

ROWS, REAL, K = 8, 5, 4
HIP = "    elif _is_hip:\n        pass\n"  # upstream does nothing to padded rows


@pytest.fixture
def module(tmp_path):
    mod = syn.load(syn.source("no-hip-handling", HIP), tmp_path)
    mod._is_hip, mod._is_cuda = True, False
    return mod


def _batch(count_dtype=torch.int32):
    ids = torch.arange(ROWS * K, dtype=torch.int32).reshape(ROWS, K) % 16
    ids[REAL:] = 9999
    weights = torch.rand(ROWS, K)
    weights[REAL:] = float("nan")
    return ids, weights, torch.tensor([REAL], dtype=count_dtype)


PRE_MASK = Plan(True, "upstream", False)


def _hooked(module, mask, failures: list, plan: Plan = PRE_MASK):
    def on_failure(what: str, text: str) -> None:
        failures.append(what)
        logging.getLogger("sglang_amd_moe").exception("sglang-amd-moe: %s", text)

    fn = module._post_process_topk_ids
    call = Call(plan, module, Args(fn), mask, ("_is_hip",), (), on_failure)
    upstream_calls = []

    def upstream(*args, **kwargs):
        upstream_calls.append(kwargs)
        return module._post_process_topk_ids(*args, **kwargs)

    def hooked(ids, weights, count):
        kw = {
            "topk_ids": ids,
            "topk_weights": weights,
            "topk_config": module.TopKConfig(top_k=K),
            "router_logits": torch.zeros(ROWS, 16),
            "layer_id": 0,
            "num_token_non_padded": count,
        }
        return run(call, LiveEnv(call), upstream, (), kw)

    return hooked, upstream_calls


def _assert_masked(out_ids, out_w, ids_before, w_before) -> None:
    assert (out_ids[REAL:] == 0).all() and (out_w[REAL:] == 0).all()
    assert torch.equal(out_ids[:REAL], ids_before[:REAL])
    assert torch.equal(out_w[:REAL], w_before[:REAL])


def test_a_count_the_kernel_refuses_is_masked_by_torch(module, caplog) -> None:
    """An int16 count: the kernel raises TypeError; on main the call went to upstream with
    the garbage (ids 9999 came back)."""
    failures: list[str] = []
    hooked, upstream_calls = _hooked(module, mask_padded_rows_, failures)
    with caplog.at_level(logging.INFO, logger="sglang_amd_moe"):
        for _ in range(3):
            ids, w, n = _batch(torch.int16)
            before = ids.clone(), w.clone()
            out_ids, out_w = hooked(ids, w, n)
            _assert_masked(out_ids, out_w, *before)
    assert len(upstream_calls) == 3
    assert len(failures) == 3 and len(set(failures)) == 1  # one reason
    assert "TypeError" in failures[0]
    assert any("the plain-torch mask took over" in r.getMessage() for r in caplog.records)


def test_tensors_sharing_memory_are_masked(module) -> None:
    """ids and weights over one buffer (the kernel refuses tensors that share elements):
    both fills write zero bits, so padded rows come out id 0 and weight 0 either way."""
    buffer = torch.zeros(ROWS, 2 * K, dtype=torch.int32)
    ids = buffer[:, :K]
    weights = buffer[:, :K].view(torch.float32)  # the same elements
    ids[:REAL] = 3
    ids[REAL:] = 9999
    failures: list[str] = []
    hooked, _ = _hooked(module, mask_padded_rows_, failures)
    out_ids, out_w = hooked(ids, weights, torch.tensor([REAL], dtype=torch.int32))
    assert failures and "ValueError" in failures[0]
    assert (out_ids[REAL:] == 0).all() and (out_w[REAL:] == 0).all()
    assert (buffer[:REAL, :K] == 3).all()


def test_any_kernel_failure_falls_back_and_each_reason_is_logged_once(module) -> None:
    """A compile error, an allocation failure: the plain-torch mask takes over."""
    reasons = iter(["HIP out of memory", "HIP out of memory", "no kernel image for gfx1201"])

    def broken_kernel(*args, **kwargs):
        raise RuntimeError(next(reasons))

    failures: list[str] = []
    hooked, _ = _hooked(module, broken_kernel, failures)
    for _ in range(3):
        ids, w, n = _batch()
        before = ids.clone(), w.clone()
        _assert_masked(*hooked(ids, w, n), *before)
    assert len(set(failures)) == 2


def test_the_mask_after_upstream_falls_back_too(module) -> None:
    def broken_kernel(*args, **kwargs):
        raise RuntimeError("launch failed")

    failures: list[str] = []
    plan = Plan(False, "upstream", False, post_mask=True)
    hooked, _ = _hooked(module, broken_kernel, failures, plan)
    ids, w, n = _batch()
    before = ids.clone(), w.clone()
    _assert_masked(*hooked(ids, w, n), *before)


def test_when_nothing_can_mask_upstream_never_sees_the_garbage(module) -> None:
    """An empty count: the kernel and the torch mask both refuse it. The call raises;
    upstream is not called (main called it with the padded garbage)."""
    failures: list[str] = []
    hooked, upstream_calls = _hooked(module, mask_padded_rows_, failures)
    ids, w, _ = _batch()
    with pytest.raises(RuntimeError, match="not passing them on"):
        hooked(ids, w, torch.tensor([], dtype=torch.int32))
    assert upstream_calls == []


def test_threads_under_the_interpreter_all_come_out_masked(module) -> None:
    """Triton's interpreter is not thread-safe: concurrent launches raise in some threads
    (on main 2 of 48 calls came back unmasked). Every call comes out masked."""
    failures: list[str] = []
    hooked, _ = _hooked(module, mask_padded_rows_, failures)
    bad: list[str] = []
    start = threading.Barrier(8)

    def worker() -> None:
        start.wait()
        for _ in range(6):
            ids, w, n = _batch()
            before = ids.clone(), w.clone()
            try:
                _assert_masked(*hooked(ids, w, n), *before)
            except BaseException as exc:  # noqa: BLE001 - recorded, asserted below
                bad.append(repr(exc))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


def test_the_torch_mask_reads_the_count_on_the_device_and_clamps_it() -> None:
    for count, real in ((torch.tensor([3], dtype=torch.int16), 3), (torch.tensor(-2), 0)):
        ids, w, _ = _batch()
        before = ids.clone()
        mask_fallback_(ids, w, count)
        assert (ids[real:] == 0).all() and (w[real:] == 0).all()
        assert torch.equal(ids[:real], before[:real])
    ids, w, _ = _batch()
    mask_fallback_(ids, w, torch.tensor([100], dtype=torch.uint8))  # past the rows: nothing
    assert (ids[REAL:] == 9999).all()

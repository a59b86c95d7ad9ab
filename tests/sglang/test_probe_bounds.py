"""The probe is bounded and leaves the process as it found it: a time limit (a sleep, a
loop), module state the probed code writes put back (or the probe refused where it cannot
be), torch's global state restored, ``torch.cuda`` out of reach, threads it starts named,
the upstream calls it made counted. In-process on the synthetic topk module."""

from __future__ import annotations

import threading
import time

import pytest
import synthetic_topk as syn
import torch

HELPER = """
import functools
CACHE = {}
SEEN = None

def remember(key, value):
    global SEEN
    CACHE[key] = value
    SEEN = value
    return value

@functools.lru_cache(maxsize=None)
def platform_answer(name):
    return name

@functools.lru_cache(maxsize=None)
def warm_answer(name):
    return name

warm_answer("before the probe")
"""


def _hip_body(*lines: str) -> str:
    """A fixed form's HIP branch with ``lines`` run first."""
    return (
        "    elif _is_hip:\n"
        + "".join(f"        {ln}\n" for ln in lines)
        + (syn.BODIES["fixed"].split("elif _is_hip:\n", 1)[1])
    )


def _module(tmp_path, *lines: str, prelude: str = ""):
    return syn.load(prelude + syn.source("fixed", _hip_body(*lines)), tmp_path)


def test_a_sleep_in_upstream_is_cut_at_the_time_limit(tmp_path) -> None:
    """On main, four scenarios of a 5 s sleep: 20 s, and the probe 'ran'."""
    mod = _module(tmp_path, "import time", "time.sleep(5)")
    t0 = time.perf_counter()
    result = syn.probe_module(mod)
    took = time.perf_counter() - t0
    assert not result.ran and "the time limit was hit" in result.why, result
    assert took < 3, took
    assert "after 1 upstream calls" in result.why


def test_a_loop_in_another_thread_is_cut_at_the_time_limit(tmp_path) -> None:
    """No timer outside the main thread: the trace function stops a Python loop there.
    (On main this thread never ends.)"""
    mod = _module(tmp_path, "while True:", "    pass")
    out: list = []
    t = threading.Thread(target=lambda: out.append(syn.probe_module(mod)), daemon=True)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive() and out, "the probe did not return"
    assert not out[0].ran and "the time limit was hit" in out[0].why


def test_module_state_the_probed_code_writes_is_put_back(tmp_path) -> None:
    """A memo dict and a scratch cache in topk itself (a copy is written), a helper
    module's dict, global and empty lru_cache (written, then put back)."""
    helper = syn.load(HELPER, tmp_path)
    mod = _module(
        tmp_path,
        '_MEMO["eplb"] = _eplb_remap_enabled()',
        "_SCRATCH[tuple(topk_ids.shape)] = torch.empty(topk_ids.shape)",
        '_helper.remember("eplb", _eplb_remap_enabled())',
        '_helper.platform_answer("hip")',
        prelude="_MEMO = {}\n_SCRATCH = {}\n",
    )
    mod._helper = helper
    result = syn.probe_module(mod)
    assert result.ran and result.correct, result
    assert mod._MEMO == {} and mod._SCRATCH == {}
    assert helper.CACHE == {} and helper.SEEN is None
    assert helper.platform_answer.cache_info().currsize == 0
    written = " ".join(result.side_effects)
    assert f"{helper.__name__}.CACHE (written; put back)" in written
    assert f"{helper.__name__}.SEEN (rebound; put back)" in written
    assert f"{helper.__name__}.platform_answer (an lru_cache; cleared)" in written


def test_a_cache_that_cannot_be_put_back_refuses_the_probe(tmp_path) -> None:
    helper = syn.load(HELPER, tmp_path)
    mod = _module(tmp_path, '_helper.warm_answer("hip")')
    mod._helper = helper
    result = syn.probe_module(mod)
    assert not result.ran and "cannot be put back" in result.why
    assert f"{helper.__name__}.warm_answer" in result.why


def test_torch_global_state_is_restored(tmp_path) -> None:
    mod = _module(
        tmp_path,
        "torch.set_default_dtype(torch.float64)",
        "torch.rand(3)",  # the global generator's state moves
        "torch.set_num_threads(1)",
        "torch.set_grad_enabled(False)",
        "topk_weights = topk_weights.float()",
    )
    dtype, threads, grad = (
        torch.get_default_dtype(),
        torch.get_num_threads(),
        torch.is_grad_enabled(),
    )
    rng = torch.random.get_rng_state()
    result = syn.probe_module(mod)
    assert result.ran
    assert torch.get_default_dtype() == dtype and torch.get_num_threads() == threads
    assert torch.is_grad_enabled() == grad
    assert torch.equal(torch.random.get_rng_state(), rng)
    effects = " ".join(result.side_effects)
    for what in ("default dtype", "RNG state", "grad mode"):
        assert f"torch's {what} (put back)" in effects
    if threads != 1:
        assert "torch's thread count (put back)" in effects


def test_reaching_torch_cuda_fails_the_probe(tmp_path) -> None:
    mod = _module(tmp_path, "torch.cuda.is_available()")
    initialized = torch.cuda.is_initialized()
    result = syn.probe_module(mod)
    assert not result.ran and result.touched_cuda
    assert "reaches torch.cuda (is_available)" in result.why
    assert torch.cuda.is_initialized() == initialized


def test_threads_the_probed_code_starts_are_named(tmp_path) -> None:
    release = threading.Event()
    mod = _module(
        tmp_path,
        "import threading",
        "threading.Thread(target=_release.wait, name='upstream-worker').start()",
    )
    mod._release = release
    try:
        result = syn.probe_module(mod)
    finally:
        release.set()
    assert result.ran
    assert "thread upstream-worker started and still running" in result.side_effects


def test_the_upstream_calls_are_counted(tmp_path) -> None:
    result = syn.probe_module(_module(tmp_path))
    assert result.ran and result.calls == 4 and result.seconds > 0


@pytest.mark.parametrize("limit", ["cpu", "wall"])
def test_either_clock_ends_the_run(tmp_path, limit: str) -> None:
    from sglang_amd_moe.runtime.sglang.bounds import Deadline
    from sglang_amd_moe.runtime.sglang.probe import probe

    mod = _module(tmp_path)
    spent = Deadline(time.thread_time() - 1, time.monotonic() + 60)
    if limit == "wall":
        spent = Deadline(time.thread_time() + 60, time.monotonic() - 1)
    result = probe(mod._post_process_topk_ids, deadline=spent)
    assert not result.ran and "the time limit was hit" in result.why

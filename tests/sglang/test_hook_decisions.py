"""The SGLang hook's decision in-process, with the synthetic topk module standing in for
SGLang's (its file as topk.py, the module as ``sglang.srt.layers.moe.topk`` once "imported"):
a body not known as fixed is decided when topk is imported, from the ledger when it knows
the body (nothing run) and else from a child process's verdict; a child that runs out of
time leaves the decision to the ledger (or to a refusal); ``SGLANG_AMD_MOE_STRICT=1``
leaves unknown code to upstream, and a forked child never inherits a held lock."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import synthetic_topk as syn
import torch

from sglang_amd_moe.runtime import plugin
from sglang_amd_moe.runtime.sglang import hook as sglang_hook
from sglang_amd_moe.runtime.sglang import ledger
from sglang_amd_moe.runtime.sglang.call import STANDARD_PLANS
from sglang_amd_moe.runtime.sglang.names import TOPK_MODULE
from sglang_amd_moe.runtime.target import MARK, watching

#: Module-level code that blocks the child process's import of the module (the child is the
#: only process that runs with no GPU visible): the decision must not wait for it.
BLOCKS_IN_CHILD = (
    "import os as _os, time as _time\n"
    "if (_os.environ.get('CUDA_VISIBLE_DEVICES'), _os.environ.get('HIP_VISIBLE_DEVICES')) == "
    "('', ''):\n"
    "    _time.sleep(600)\n"
)


@pytest.fixture
def topk(tmp_path, monkeypatch):
    """``make(text, known=None, imported=True)``: the synthetic module as SGLang's topk,
    known to the ledger as ``known``; not in ``sys.modules`` unless ``imported``."""
    for var in ("DISABLE", "VERIFY", "STRICT", "PROBE_TIMEOUT"):
        monkeypatch.delenv(f"SGLANG_AMD_MOE_{var}", raising=False)
    monkeypatch.setenv("SGLANG_AMD_MOE_FORCE", "1")
    monkeypatch.setenv("SGLANG_AMD_MOE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delitem(sys.modules, TOPK_MODULE, raising=False)
    sglang_hook.uninstall()

    def make(text: str, known: str | None = None, imported: bool = True):
        mod = syn.load(text, tmp_path)
        monkeypatch.setattr(sglang_hook, "topk_path", lambda: Path(mod.__file__))
        if known is not None:
            plan = STANDARD_PLANS.get(known)
            entry = ledger.Entry(known, dataclasses.asdict(plan) if plan else None, ("a test",))
            fingerprint = ledger.read(text).fingerprint
            monkeypatch.setattr(ledger, "entries", lambda: {fingerprint: entry})
        if imported:
            monkeypatch.setitem(sys.modules, TOPK_MODULE, mod)
        return mod

    yield make
    sglang_hook.uninstall()


def _import(monkeypatch, mod) -> None:
    """What importing topk does once the hook waits for it: the module appears, the
    import hook's callback runs."""
    monkeypatch.setitem(sys.modules, TOPK_MODULE, mod)
    sglang_hook.HOOK._on_import(mod)


def _padded_call(mod):
    ids = torch.randint(0, 16, (8, 4), dtype=torch.int32)
    ids[5:] = 9999
    w = torch.rand(8, 4)
    w[5:] = float("nan")
    out = mod._post_process_topk_ids(
        topk_ids=ids,
        topk_weights=w,
        topk_config=mod.TopKConfig(top_k=4),
        router_logits=torch.zeros(8, 16),
        layer_id=0,
        num_token_non_padded=torch.tensor([5], dtype=torch.int32),
    )
    return out[0], out[1]


def test_a_known_broken_body_is_decided_when_topk_is_imported(topk, monkeypatch) -> None:
    """On main install() imported topk right away (here: SGLang's own, whatever form); the
    ledger's plan is applied at the import, and nothing of upstream's is run to get it."""
    mod = topk(syn.source("weights-only"), known="weights-only", imported=False)
    st = sglang_hook.install()
    assert st.state == "pending" and st.detail["deferred"]
    assert st.message.endswith(f"when {TOPK_MODULE} is imported"), st.message
    assert TOPK_MODULE not in sys.modules and watching(TOPK_MODULE)
    assert sglang_hook.install() is st  # idempotent while it waits
    _import(monkeypatch, mod)
    live = sglang_hook.status()
    assert live.state == "live" and not watching(TOPK_MODULE), live.message
    assert f"applied when {TOPK_MODULE} was imported" in live.message
    assert "verdict taken from the ledger (nothing run)" in live.message
    assert live.detail["verdict"]["source"] == "ledger"
    assert getattr(mod._post_process_topk_ids, MARK, None) is not None
    mod._is_hip, mod._is_cuda = True, False
    ids, w = _padded_call(mod)
    assert (ids[5:] == 0).all() and (w[5:] == 0).all()


def test_an_unknown_body_is_decided_by_the_childs_verdict(topk, monkeypatch) -> None:
    mod = topk(syn.source("weights-only", syn.BODIES["weights-only"] + "        pass\n"))
    st = sglang_hook.install()
    assert st.state == "live" and st.detail["plan"]["remap"] == "add", st.message
    assert "running it shows weights-only" in st.message
    assert "verdict probed now in a child process (the child took " in st.message
    assert st.detail["verdict"]["source"] == "probed" and st.detail["verdict"]["child_s"] > 0
    mod._is_hip, mod._is_cuda = True, False
    ids, w = _padded_call(mod)
    assert (ids[5:] == 0).all() and (w[5:] == 0).all()


def test_a_child_out_of_time_leaves_a_known_body_to_the_ledger(topk, monkeypatch, caplog) -> None:
    """topk imported before the plugin: a child is asked; it never answers (a WARNING)."""
    monkeypatch.setenv("SGLANG_AMD_MOE_PROBE_TIMEOUT", "3")
    topk(BLOCKS_IN_CHILD + syn.source("weights-only"), known="weights-only")
    t0 = time.perf_counter()
    with caplog.at_level(logging.INFO, logger="sglang_amd_moe"):
        st = sglang_hook.install()
    assert time.perf_counter() - t0 < 30
    assert st.state == "live" and st.detail["plan"]["remap"] == "add", st.message
    assert "ran past its 3 s limit and was killed; decided from the ledger" in st.message
    assert "no verdict from the child (" in st.message
    assert [r.levelno for r in caplog.records if "decided from the ledger" in r.getMessage()] == [
        logging.WARNING
    ]


def test_an_unknown_body_whose_child_runs_out_of_time_is_refused(topk, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_AMD_MOE_PROBE_TIMEOUT", "3")
    mod = topk(BLOCKS_IN_CHILD + syn.source("weights-only"))
    original = mod._post_process_topk_ids
    st = sglang_hook.install()
    assert st.state == "refused" and "ran past its 3 s limit" in st.message, st.message
    assert "the ledger does not know this body" in st.message
    assert not sglang_hook.is_live() and mod._post_process_topk_ids is original


def test_strict_leaves_an_unknown_body_to_upstream_without_importing(topk, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_AMD_MOE_STRICT", "1")
    topk(syn.source("weights-only"), imported=False)
    st = sglang_hook.install()
    assert st.state == "refused" and st.detail["strict"] is True
    assert "left to upstream: SGLANG_AMD_MOE_STRICT=1 hooks only bodies the ledger knows" in (
        st.message
    )
    assert "sha256" in st.message  # the fingerprint, as for every unknown body
    assert TOPK_MODULE not in sys.modules and not watching(TOPK_MODULE)


def test_strict_leaves_an_unknown_running_body_to_upstream_unprobed(topk, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_AMD_MOE_STRICT", "1")
    mod = topk(syn.source("weights-only"))
    original = mod._post_process_topk_ids
    st = sglang_hook.install()
    assert st.state == "refused" and "SGLANG_AMD_MOE_STRICT=1" in st.message, st.message
    assert "probe" not in st.detail or not st.detail["probe"].get("calls")
    assert mod._post_process_topk_ids is original


def test_strict_hooks_a_known_body_with_the_ledgers_plan(topk, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_AMD_MOE_STRICT", "1")
    mod = topk(syn.source("weights-only"), known="weights-only", imported=False)
    assert sglang_hook.install().state == "pending"
    _import(monkeypatch, mod)
    st = sglang_hook.status()
    assert st.state == "live" and st.detail["plan"]["remap"] == "add", st.message


def test_strict_refuses_a_known_body_that_runs_as_another_form(topk, monkeypatch) -> None:
    topk(syn.source("fixed"), known="weights-only")
    assert sglang_hook.install().state == "not-needed"  # without the switch: behaviour wins
    sglang_hook.uninstall()
    monkeypatch.setenv("SGLANG_AMD_MOE_STRICT", "1")
    st = sglang_hook.install()
    assert st.state == "refused", st.message
    assert "knows this body as weights-only but running it shows fixed" in st.message


def test_a_forked_child_does_not_inherit_held_locks() -> None:
    """Another thread holds the plugin's and the hook's locks while the process forks
    (on main the child's register() waited for them forever)."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with plugin._LOCK, sglang_hook.HOOK.lock:
            held.set()
            release.wait()

    t = threading.Thread(target=hold)
    t.start()
    held.wait()
    try:
        pid = os.fork()
        if pid == 0:  # the child: the holder thread does not exist here
            os.environ["SGLANG_AMD_MOE_DISABLE"] = "1"
            try:
                plugin.register()
                sglang_hook.HOOK.install((False, "a closed gate"))
            finally:
                os._exit(0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child deadlocked on a lock held by a thread it does not have")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        t.join()

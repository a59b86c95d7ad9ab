"""The probe runs in a child process, and the server process only reads its verdict: what
upstream's code does while it is probed (import modules, change process settings, block,
exit, start processes) never reaches the process that decides. The verdict cache: a hit, a
miss, a corrupt entry, several processes starting at once (one probe). On the synthetic topk
module (fast) and, for the lazy import SGLang 0.5.23 makes on the HIP branch under its
MegaMoE EPLB flags, on the real release in this interpreter's environment."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import synthetic_topk as syn
import torch

from sglang_amd_moe.runtime.sglang import hook as sglang_hook
from sglang_amd_moe.runtime.sglang import ledger, verdict
from sglang_amd_moe.runtime.sglang.names import TOPK_MODULE

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _clean(tmp_path, monkeypatch):
    for var in ("DISABLE", "VERIFY", "STRICT", "PROBE_TIMEOUT"):
        monkeypatch.delenv(f"SGLANG_AMD_MOE_{var}", raising=False)
    monkeypatch.setenv("SGLANG_AMD_MOE_FORCE", "1")
    monkeypatch.setenv("SGLANG_AMD_MOE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delitem(sys.modules, TOPK_MODULE, raising=False)
    sglang_hook.uninstall()
    yield
    sglang_hook.uninstall()


def _as_topk(monkeypatch, mod) -> None:
    """``mod`` is SGLang's topk, imported before the plugin (a child decides)."""
    monkeypatch.setattr(sglang_hook, "topk_path", lambda: Path(mod.__file__))
    monkeypatch.setitem(sys.modules, TOPK_MODULE, mod)


def _request(mod) -> dict:
    r = ledger.read(Path(mod.__file__).read_text())
    return {
        "module": mod.__name__,
        "qualname": "_post_process_topk_ids",
        "file": mod.__file__,
        "source": "",
        "hip_flags": list(r.hip_flags),
        "predicates": list(r.predicates),
        "remaps_on_hip": r.remaps_on_hip,
        "ledger_plan": None,
    }


def _in_child(code: str) -> str:
    """Module-level code the child process runs when it imports the module (the child is
    the only process with every GPU hidden), and no other process does."""
    cond = (
        "(__import__('os').environ.get('CUDA_VISIBLE_DEVICES'), "
        "__import__('os').environ.get('HIP_VISIBLE_DEVICES')) == ('', '')"
    )
    return f"if {cond}:\n" + textwrap.indent(textwrap.dedent(code), "    ") + "\n"


def _hip_body(code: str) -> str:
    """The fixed form's HIP branch with ``code`` run first (only the probe runs it)."""
    return syn.BODIES["fixed"].replace(
        "    elif _is_hip:\n",
        "    elif _is_hip:\n" + textwrap.indent(textwrap.dedent(code), " " * 8),
    )


def test_a_module_imported_while_deciding_keeps_its_names(tmp_path, monkeypatch) -> None:
    """On main the probe's put-back emptied a module first imported during the probe
    (jinja2 lost 583 names): every later import got the empty module."""
    helper = tmp_path / "lib" / "probe_helper_mod.py"
    helper.parent.mkdir()
    helper.write_text("".join(f"NAME_{i} = {i}\n" for i in range(300)))
    monkeypatch.syspath_prepend(str(helper.parent))
    marker = tmp_path / "ran"
    body = _hip_body(f"import probe_helper_mod\nopen({str(marker)!r}, 'w').close()\n")
    mod = syn.load(syn.source("fixed", body), tmp_path)
    _as_topk(monkeypatch, mod)
    st = sglang_hook.install()
    assert marker.exists(), st.message  # the child ran the branch that imports it
    assert st.state == "not-needed" and st.detail["verdict"]["source"] == "probed", st.message
    assert "probe_helper_mod" not in sys.modules  # the server never imported it
    import probe_helper_mod

    assert probe_helper_mod.NAME_299 == 299
    assert sum(n.startswith("NAME_") for n in vars(probe_helper_mod)) == 300


def _settings() -> dict:
    sigs = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
    return {
        "gc": (gc.isenabled(), gc.get_threshold()),
        "signals": {s: signal.getsignal(s) for s in sigs},
        "itimer": signal.getitimer(signal.ITIMER_REAL),
        "trace": (sys.gettrace(), sys.getprofile()),
        "environ": dict(os.environ),
        "matmul": torch.get_float32_matmul_precision(),
        "anomaly": torch.is_anomaly_enabled(),
        "cudnn": (torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark),
        "threads": torch.get_num_threads(),
        "rng": torch.random.get_rng_state().tolist(),
        "dtype": torch.get_default_dtype(),
        "grad": torch.is_grad_enabled(),
        "py_threads": sorted(t.name for t in threading.enumerate()),
    }


def test_what_the_probed_code_changes_never_reaches_the_server(tmp_path, monkeypatch) -> None:
    """Settings the in-process fence missed on main (matmul precision, anomaly mode,
    torch.backends, os.environ, gc thresholds, gc.enable in a host that turned it off) and
    more: signal handlers, the RNG, a thread left running, sys.settrace."""
    marker = tmp_path / "ran"
    changes = f"""
    import gc, os, signal, sys, threading, time
    import torch
    gc.disable()
    gc.set_threshold(1, 1, 1)
    signal.signal(signal.SIGUSR1, lambda *a: None)
    signal.signal(signal.SIGALRM, lambda *a: None)
    signal.setitimer(signal.ITIMER_REAL, 100)
    os.environ["SGLANG_AMD_MOE_TEST_LEAKED"] = "1"
    torch.set_float32_matmul_precision("medium")
    torch.autograd.set_detect_anomaly(True)
    torch.backends.cudnn.enabled = False
    torch.set_num_threads(1)
    torch.manual_seed(1)
    torch.set_default_dtype(torch.float64)
    torch.set_default_dtype(torch.float32)
    threading.Thread(target=time.sleep, args=(600,), name="left-running").start()
    sys.settrace(lambda *a: None)
    sys.settrace(None)
    open({str(marker)!r}, "w").close()
    """
    mod = syn.load(syn.source("fixed", _hip_body(changes)), tmp_path)
    _as_topk(monkeypatch, mod)
    gc.disable()  # a host that turned the collector off keeps it off
    try:
        before = _settings()
        st = sglang_hook.install()
        after = _settings()
    finally:
        gc.enable()
    assert marker.exists(), st.message
    assert st.state == "not-needed" and st.detail["probe"]["behaviour"] == "fixed", st.message
    assert after == before


def test_a_child_that_exits_or_raises_is_a_refusal_not_a_crash(tmp_path, monkeypatch) -> None:
    for code in ("import os\nos._exit(9)\n", "raise SystemExit(7)\n", "raise KeyboardInterrupt\n"):
        sglang_hook.uninstall()
        mod = syn.load(_in_child(code) + syn.source("weights-only"), tmp_path)
        _as_topk(monkeypatch, mod)
        original = mod._post_process_topk_ids
        st = sglang_hook.install()
        assert st.state == "refused", st.message
        assert "the probe could not run: the child process exited with" in st.message
        assert mod._post_process_topk_ids is original


def test_the_child_and_what_it_started_are_killed_at_the_limit(tmp_path) -> None:
    pids = tmp_path / "pids"
    code = f"""
    import os, subprocess, time
    p = subprocess.Popen(["sleep", "600"])
    open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{p.pid}}")
    time.sleep(600)
    """
    mod = syn.load(_in_child(code) + syn.source("weights-only"), tmp_path)
    t0 = time.monotonic()
    doc, why, seconds = verdict.run_child(_request(mod), limit=5)
    assert doc is None and "ran past its 5 s limit and was killed" in why
    assert 5 <= seconds < 20 and time.monotonic() - t0 < 20
    for pid in map(int, pids.read_text().split()):
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)  # the grandchild is reaped by init
        else:
            pytest.fail(f"process {pid} outlived the child's limit")


def test_a_signal_handler_of_the_host_raising_while_waiting_passes(tmp_path) -> None:
    """The host's own exception is not swallowed, and the child does not outlive it."""
    pids = tmp_path / "pids"
    code = f"import os, time\nopen({str(pids)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
    mod = syn.load(_in_child(code) + syn.source("weights-only"), tmp_path)

    class HostStop(BaseException):
        pass

    def handler(*_):
        raise HostStop

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 6)
        with pytest.raises(HostStop):
            verdict.obtain("a-fingerprint", _request(mod))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    pid = int(pids.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_cache_hit_miss_and_corrupt_entry(tmp_path) -> None:
    mod = syn.load(syn.source("weights-only"), tmp_path)
    request = _request(mod)
    first = verdict.obtain("fp", request)
    assert first.source == "probed" and first.upstream.behaviour == "weights-only"
    assert first.child_s > 0 and Path(first.path).parent == tmp_path / "cache"
    t0 = time.perf_counter()
    second = verdict.obtain("fp", request)
    assert time.perf_counter() - t0 < 0.5
    assert second.source == "cache" and second.upstream == first.upstream
    assert second.checked == first.checked and second.child_s == pytest.approx(first.child_s)
    assert "verdict read from the cache" in second.describe()
    shapes = {"schema": 1, "upstream": {"ran": True, "observations": [1]}, "checked": []}
    failed = {"schema": 1, "failed": True, "written_at": "soon", "child_s": None}
    junk_docs = [json.dumps({"schema": 1, "upstream": {}}), json.dumps(shapes), json.dumps(failed)]
    for junk in ("{not json", "", "[]", *junk_docs):
        Path(first.path).write_text(junk)
        again = verdict.obtain("fp", request)
        assert again.source == "probed" and again.upstream.behaviour == "weights-only"
        assert json.loads(Path(first.path).read_text())["upstream"]["behaviour"] == "weights-only"
    assert verdict.obtain("another-fp", request).source == "probed"  # keyed by fingerprint


def test_the_key_names_the_interpreter_and_the_body(monkeypatch) -> None:
    key = verdict.cache_key("fp", {"module": "m"})
    assert verdict.cache_key("fp", {"module": "m"}) == key
    assert verdict.cache_key("fp2", {"module": "m"}) != key
    monkeypatch.setattr(sys, "executable", "/another/python")
    assert verdict.cache_key("fp", {"module": "m"}) != key


def test_the_cache_directory_and_the_time_limit(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("SGLANG_AMD_MOE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert verdict.cache_dir() == tmp_path / "xdg" / "sglang-amd-moe"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert verdict.cache_dir() == tmp_path / "home" / ".cache" / "sglang-amd-moe"
    monkeypatch.setenv("SGLANG_AMD_MOE_CACHE_DIR", str(tmp_path / "here"))
    assert verdict.cache_dir() == tmp_path / "here"
    assert verdict.timeout() == verdict.DEFAULT_TIMEOUT
    for value, want in (("7.5", 7.5), ("0", verdict.DEFAULT_TIMEOUT), ("x", 120.0)):
        monkeypatch.setenv("SGLANG_AMD_MOE_PROBE_TIMEOUT", value)
        assert verdict.timeout() == want


def test_an_unwritable_cache_still_gets_a_verdict(tmp_path, monkeypatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("SGLANG_AMD_MOE_CACHE_DIR", str(blocked / "cache"))
    mod = syn.load(syn.source("weights-only"), tmp_path)
    v = verdict.obtain("fp", _request(mod))
    assert v.source == "probed" and v.upstream.behaviour == "weights-only"
    assert "is not usable" in v.note


STARTER = """
import json, sys, time
from sglang_amd_moe.runtime.sglang import verdict
request = json.loads(sys.argv[1])
while time.time() < float(sys.argv[2]):
    time.sleep(0.005)
v = verdict.obtain("fp", request)
print(json.dumps({"source": v.source, "ran": v.upstream.ran, "waited": v.waited_s,
                  "behaviour": v.upstream.behaviour, "why": v.upstream.why}))
"""


def _start_together(request: dict, n: int, env: dict) -> list[dict]:
    start = str(time.time() + 3)  # after every interpreter is up
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", STARTER, json.dumps(request), start],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    return [json.loads(o[0].strip().splitlines()[-1]) for o in outs]


def test_processes_starting_together_probe_once(tmp_path) -> None:
    runs = tmp_path / "children"
    code = f"open({str(runs)!r}, 'a').write('x')\n"
    mod = syn.load(_in_child(code) + syn.source("weights-only"), tmp_path)
    env = {**os.environ, "SGLANG_AMD_MOE_CACHE_DIR": str(tmp_path / "shared")}
    got = _start_together(_request(mod), 4, env)
    assert runs.read_text() == "x"  # one child for the four
    assert sorted(g["source"] for g in got) == ["cache", "cache", "cache", "probed"]
    assert {g["behaviour"] for g in got} == {"weights-only"}
    assert sum(g["waited"] > 0.5 for g in got) >= 1  # at least one waited for the probe


def test_processes_waiting_on_a_failed_probe_do_not_repeat_it(tmp_path) -> None:
    runs = tmp_path / "children"
    code = f"import time\nopen({str(runs)!r}, 'a').write('x')\ntime.sleep(600)\n"
    mod = syn.load(_in_child(code) + syn.source("weights-only"), tmp_path)
    env = {**os.environ, "SGLANG_AMD_MOE_CACHE_DIR": str(tmp_path / "shared")}
    env["SGLANG_AMD_MOE_PROBE_TIMEOUT"] = "4"
    got = _start_together(_request(mod), 3, env)
    assert runs.read_text() == "x"
    assert {g["source"] for g in got} == {"failed"} and not any(g["ran"] for g in got)
    assert all("ran past its 4 s limit" in g["why"] for g in got)
    # A later start probes again (the failure is kept for the waiting processes only).
    env["SGLANG_AMD_MOE_PROBE_TIMEOUT"] = "3"
    again = _start_together(_request(mod), 1, env)
    assert runs.read_text() == "xx" and again[0]["source"] == "failed"


REAL = """
import json, os, sys
os.environ.update({"SGLANG_AITER_MEGA_EPLB_PREFILL_ONLY": "1",
                   "SGLANG_AITER_MEGA_EPLB_FUSED_MAP_RECORD": "1",
                   "SGLANG_AITER_MEGA_RANK_SYNC": "1", "SGLANG_AMD_MOE_FORCE": "1"})
LAZY = "sglang.srt.eplb.eplb_map_record_fused"
order = sys.argv[1]
if order == "topk-first":
    import sglang.srt.layers.moe.topk
from sglang.srt.plugins import load_plugins
load_plugins()
if order != "topk-first":
    import sglang.srt.layers.moe.topk
from sglang_amd_moe.runtime.sglang import hook
st = hook.status()
decided_imported = LAZY in sys.modules
from sglang.srt.eplb.eplb_map_record_fused import eplb_map_and_record_fused
print(json.dumps({"state": st.state, "verdict": st.detail.get("verdict"),
                  "behaviour": (st.detail.get("probe") or {}).get("behaviour"),
                  "lazy_imported_by_the_decision": decided_imported,
                  "names": len(vars(sys.modules[LAZY])), "message": st.message}))
"""


@pytest.mark.parametrize("order", ["topk-first", "verify"])
def test_sglang_0_5_23s_lazy_import_on_the_hip_branch_is_intact(tmp_path, order) -> None:
    """On main, under SGLang 0.5.23's MegaMoE EPLB flags, the probe sent the HIP branch's
    lazy import of eplb_map_record_fused through the put-back, which emptied the module:
    SGLang's own import of eplb_map_and_record_fused then raised ImportError."""
    pytest.importorskip("sglang.srt.plugins")
    spec = __import__("importlib").util.find_spec("sglang.srt.eplb.eplb_map_record_fused")
    if spec is None:
        pytest.skip("this SGLang has no eplb_map_record_fused (0.5.23 has)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_AMD_MOE_")}
    env.update(SGLANG_AMD_MOE_CACHE_DIR=str(tmp_path / "cache"), PYTHONWARNINGS="ignore")
    if order == "verify":
        env["SGLANG_AMD_MOE_VERIFY"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", REAL, order], env=env, capture_output=True, text=True,
        timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["verdict"]["source"] == "probed", got["message"]
    assert got["behaviour"] == "fixed", got["message"]
    assert not got["lazy_imported_by_the_decision"] and got["names"] > 10

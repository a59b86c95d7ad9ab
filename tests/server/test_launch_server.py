"""The real server: ``python -m sglang.launch_server`` on the check's tiny checkpoint, CPU only.

Can SGLang serve the check's model on a CPU-only machine like CI's, with this package
installed? It cannot (SGLang 0.5.23):

* The CPU engine SGLang documents (``SGLANG_USE_CPU_ENGINE=1 ... --device cpu``) stops
  in the launcher, before any scheduler starts, importing ``sgl_kernel`` (first use:
  ``copy_all_layer_kv_cache_cpu`` in ``sglang/kernels/ops/kvcache/cache_move.py``). The
  registry's ``sglang-kernel`` (0.4.10, the version SGLang pins) holds CUDA builds only
  (``sm90``/``sm100`` ``common_ops``; importing it fails on ``libcuda.so.1``); the CPU
  build of sgl-kernel is not published to the registry.
* ``--device cpu`` alone gets further: the launcher, the scheduler and the detokenizer
  processes start, ``load_plugins()`` runs in each (this package's hook goes live), and
  in the scheduler ``load_model`` stops while constructing the model, at its first
  rotary embedding: ``from vllm._custom_ops import rotary_embedding``
  (``sglang/srt/layers/rotary_embedding/base.py``), the fallback SGLang takes on a
  platform that is neither CUDA, HIP nor its CPU engine. Installing vLLM is no way out:
  it brings its own torch build.

So this test launches the second way, loopback only, in bounded time, and checks
everything up to that point: this plugin loaded in the scheduler process started by
``launch_server`` and its hook is live there (``SGLANG_AMD_MOE_VERIFY=1`` makes the hook
live even on the `fixed` form 0.5.23 has). If the server ever comes up, the test sends a
completion and checks the answer instead; if it stops anywhere else, it fails with the
log, so the "Running it" section of docs/reference.md gets updated.

The server's extra packages are not in ``.venv``; the test runs when the interpreter
named by ``SGLANG_AMD_MOE_TEST_SERVER_PYTHON`` (default: this one) has them, else it skips.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from server.harness import free_port  # below 55535: SGLang adds 10000 for gRPC
from tiny_checkpoint import write_checkpoint

from sglang_amd_moe.diagnostics.e2e.model import TinyMoE, TinyMoEConfig

SERVER_PY = os.environ.get("SGLANG_AMD_MOE_TEST_SERVER_PYTHON", sys.executable)
# Modules launch_server imports beyond .venv's closure (package names: docs/reference.md,
# "Running it").
EXTRA_MODULES = (
    "fastapi",
    "uvicorn",
    "uvloop",
    "setproctitle",
    "multipart",
    "jsonschema",
    "xgrammar",
    "soundfile",
)
DEADLINE_S = 300

# Load-time log lines: load_plugins() runs before SGLang configures logging in each
# process, so SGLang's INFO lines would be dropped (this package makes its own line
# visible: test_plain_server_log_shows_the_plugin_line). This sitecustomize, put on the
# server's PYTHONPATH by the test only, prints them with the process's target function.
PROBE = """
import logging, multiprocessing, os
if os.environ.get("SGLANG_AMD_MOE_TEST_PROBE_LOGGING") == "1":
    class _Target(logging.Filter):
        def filter(self, record):
            t = getattr(multiprocessing.current_process(), "_target", None)
            record.target = getattr(t, "__name__", "launcher")
            return True
    _h = logging.StreamHandler()
    _h.addFilter(_Target())
    _h.setFormatter(logging.Formatter("PROBE %(target)s pid=%(process)d %(name)s: %(message)s"))
    for _name in ("sglang_amd_moe", "sglang.srt.plugins"):
        _lg = logging.getLogger(_name)
        _lg.setLevel(logging.INFO)
        _lg.addHandler(_h)
        _lg.propagate = False
"""

PLUGIN_LINE = re.compile(
    r"^PROBE run_scheduler_process pid=(\d+) sglang_amd_moe: sglang-amd-moe: sglang \S+ "
    r"_post_process_topk_ids form=(\S+) -> (.*)$",
    re.M,
)
HOOK_LINE = re.compile(
    r"^PROBE run_scheduler_process pid=(\d+) sglang\.srt\.plugins\.hook_registry: "
    r"Applied \d+ hook\(s\) to sglang\.srt\.layers\.moe\.topk\._post_process_topk_ids "
    r"\(from: plugin=sglang_amd_moe",
    re.M,
)
KNOWN_STOP = re.compile(
    r"sglang/srt/layers/rotary_embedding/base\.py\", line \d+, in __init__\n.*\n"
    r"(?:.*\n)*?ModuleNotFoundError: No module named 'vllm'"
)


@functools.cache  # one interpreter, asked once for both tests
def _have_extras() -> str | None:
    code = "import " + ", ".join(EXTRA_MODULES)
    proc = subprocess.run([SERVER_PY, "-c", code], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "import failed"
    return None


def _stop(proc: subprocess.Popen) -> None:
    """End the server we started: its process group (it spawns scheduler and detokenizer)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers in the group, if any
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@pytest.mark.sglang
def test_launch_server_on_cpu(tmp_path: Path) -> None:
    missing = _have_extras()
    if missing:
        msg = (
            f"{SERVER_PY} lacks the server's extra packages ({missing}); "
            "see docs/reference.md, 'Running it'"
        )
        # Asked for explicitly (make test): it must run.
        if "SGLANG_AMD_MOE_TEST_SERVER_PYTHON" in os.environ:
            pytest.fail(msg)
        pytest.skip(msg)

    ckpt = tmp_path / "tiny-moe"
    write_checkpoint(TinyMoE(TinyMoEConfig()), ckpt)
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(PROBE)
    port = free_port()
    env = dict(
        os.environ,
        SGLANG_AMD_MOE_FORCE="1",
        SGLANG_AMD_MOE_VERIFY="1",
        SGLANG_AMD_MOE_TEST_PROBE_LOGGING="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(probe), os.environ.get("PYTHONPATH", "")) if p),
    )
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    log_path = tmp_path / "server.log"
    server = ["--model-path", str(ckpt), "--device", "cpu"]
    cmd = [
        SERVER_PY,
        "-m",
        "sglang.launch_server",
        *server,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    served = False
    answer = None
    try:
        while time.monotonic() - t0 < DEADLINE_S:
            text = log_path.read_text(errors="replace")
            if "Uvicorn running on" in text:
                served = True
                break
            if proc.poll() is not None:
                break
            time.sleep(1)
        if served:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/generate",
                data=json.dumps(
                    {
                        "text": "the cat is",
                        "sampling_params": {"max_new_tokens": 4, "temperature": 0},
                    }
                ).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=120) as resp:
                answer = json.loads(resp.read())
    finally:
        _stop(proc)
    elapsed = time.monotonic() - t0
    text = log_path.read_text(errors="replace")
    tail = "\n".join(text.splitlines()[-40:])

    plugin = PLUGIN_LINE.search(text)
    assert plugin, f"no sglang-amd-moe line from the scheduler process:\n{tail}"
    hook = HOOK_LINE.search(text)
    assert hook and hook.group(1) == plugin.group(1), (
        f"the hook is not live in the scheduler:\n{tail}"
    )
    if served:
        assert answer and isinstance(answer.get("text"), str) and answer["text"], answer
        print(f"served in {elapsed:.0f} s; answer {answer['text']!r}")
    else:
        assert KNOWN_STOP.search(text), (
            f"the server stopped somewhere new after {elapsed:.0f} s:\n{tail}"
        )
        where = "where docs/reference.md says (no vllm._custom_ops.rotary_embedding)"
        print(f"stopped {where} after {elapsed:.0f} s")


# The plugin's line as the plain server log shows it (SGLang's own log format, no probe).
PLAIN_LINE = re.compile(r"^\[[^\]]+\] (sglang-amd-moe: .*)$", re.M)


@pytest.mark.sglang
def test_plain_server_log_shows_the_plugin_line(tmp_path: Path) -> None:
    """The command of docs/reference.md ("Running it") as a user runs it: no probe, no
    SGLANG_AMD_MOE_* variable. Each process that loads plugins (launcher, scheduler,
    detokenizer) logs the line once."""
    missing = _have_extras()
    if missing:
        msg = (
            f"{SERVER_PY} lacks the server's extra packages ({missing}); "
            "see docs/reference.md, 'Running it'"
        )
        if "SGLANG_AMD_MOE_TEST_SERVER_PYTHON" in os.environ:
            pytest.fail(msg)
        pytest.skip(msg)
    ckpt = tmp_path / "tiny-moe"
    write_checkpoint(TinyMoE(TinyMoEConfig()), ckpt)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_AMD_MOE_")}
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    log_path = tmp_path / "plain.log"
    cmd = [
        SERVER_PY, "-m", "sglang.launch_server", "--model-path", str(ckpt), "--device", "cpu",
        "--host", "127.0.0.1", "--port", str(free_port()),
    ]  # fmt: skip
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    t0 = time.monotonic()
    try:  # until it stops where the test above says, or serves
        while proc.poll() is None and time.monotonic() - t0 < DEADLINE_S:
            if "Uvicorn running on" in log_path.read_text(errors="replace"):
                break
            time.sleep(1)
    finally:
        _stop(proc)
    text = log_path.read_text(errors="replace")
    lines = PLAIN_LINE.findall(text)
    assert 2 <= len(lines) <= 3, f"{lines}\n" + "\n".join(text.splitlines()[-40:])
    assert len(set(lines)) == 1, lines  # every process decided the same

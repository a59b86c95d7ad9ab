#!/usr/bin/env python3
"""Real ``python -m sglang.launch_server`` runs with and without the plugin, on one GPU.

Why: "pip install the plugin, then launch the server" is what a user does, so this runs
exactly that, on SGLang 0.5.13.post1 (a release whose HIP branch zeroes padded weights
but leaves padded expert ids as the router wrote them), with this package installed
from its wheel, and checks the one thing the plugin promises: padded rows of CUDA-graph
batches cannot reach the MoE with garbage, and real rows come out exactly as before.

Five servers run side by side on the GPU, each a tiny MoE model (``--load-format dummy``:
SGLang's fixed-seed dummy weights; ``--skip-tokenizer-init``: token ids in, token ids
out), CUDA graphs captured at a few batch sizes, Triton attention and PyTorch sampling.
Two model classes (``--models``; one record each, docs/server.md):

``qwen3_moe``
    softmax top-8 of 64 experts (``fused_topk``), no shared expert.
``deepseek_v3``
    the class DeepSeek-R1 users serve: MLA attention with DeepSeek-V3's head dimensions
    (kv_lora_rank 512, rope 64, nope 128, v 128; SGLang's Triton MLA decode kernel uses
    the key block, latent plus rope, as the value, so the key's padded width must be the
    latent's: with 128 + 32 it was 256 against 128 and every server stopped at its first
    capture), DeepSeek-V3's routing (256 experts in 8 groups, the best 4 groups, top 8,
    sigmoid scores plus ``e_score_correction_bias``: ``biased_grouped_topk``), and the
    shared expert fused into the routed ones. SGLang 0.5.13.post1 fuses it by default (no
    server argument; ``--disable-shared-experts-fusion`` turns it off) when
    ``DeepseekV2ForCausalLM.determine_num_fused_shared_experts`` finds the architecture
    ``DeepseekV3ForCausalLM``, ``n_routed_experts`` in (256, 384) (384 only with Quark),
    ``n_shared_experts == 1``, a CUDA device of capability 8.0 or more (or gfx942+),
    expert parallelism 1 on CUDA, no TBO/SBO, no DeepEP and no W4AFP8. ``TopK`` then
    returns 9 columns: on ROCm without aiter (what these servers emulate) the router
    itself writes the shared expert, id 256, into the last column of every row before
    ``_post_process_topk_ids``; the append inside ``_post_process_topk_ids``
    (``fused_append_shared_experts``) runs only with aiter (``_use_aiter``), which cannot
    run here.

The same greedy requests go to every server, one batch of concurrent requests per round,
with batch sizes between the captured sizes so every decode replay has padded rows.
Expected: a == b == d token for token; c (and e) show the damage. Each scheduler's
record (``site/sitecustomize.py``) also counts, over every replay, what ``TopK`` hands the
MoE after ``_post_process_topk_ids``: in padded rows, ids in range and zero weights in the
routed columns and the appended shared-expert column, or not. Then the cost: (b) vs
(d) alone on the GPU, interleaved rounds of streamed requests at batch sizes 1, 8 and 32,
time per output token and decode throughput as ratios from the same run. ``--runs``
starts fewer servers (a rehearsal: ``--runs a`` is one server to its first decodes).

Standard library only, so it runs under whatever Python the GPU machine has. Output:
``--out``/server-h200.json (rewritten after every phase), one log per server, and this
program's own log on stdout.
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Servers (and the version probe) run from here, outside any checkout: `python -m` puts
# the working directory first on sys.path, and a source tree's `sglang_amd_moe/` there
# would shadow the installed wheel.
WORK = Path("/tmp/sglang-amd-moe-server-work")

# Batch sizes: CUDA graphs are captured at CAPTURE_BS; the correctness rounds use
# CHECK_SIZES and the overhead rounds OVERHEAD_SIZES, none of them a captured size, so
# every decode step replays a larger graph with padded rows (3, 10 -> 12; 33 -> 40;
# 1 -> 2; 8 -> 12; 32 -> 40).
CAPTURE_BS = (2, 12, 40)
CHECK_SIZES = (3, 10, 33)
OVERHEAD_SIZES = (1, 8, 32)
PROMPT_LEN = 16
PROMPT_SEED = 20260
FIRST_TOKEN_ID = 3  # ids 0-2 are the configs' pad/bos/eos

# A small config of a model class SGLang ships, per family. The router of both goes
# through SGLang's TopK -> select_experts -> _post_process_topk_ids. Each has its record:
# benchmarks/results/server-h200.json (qwen3_moe) and server-h200-deepseek.json.
MODELS: dict[str, dict] = {
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": 1024,
        "hidden_size": 512,
        "intermediate_size": 1024,
        "moe_intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    },
    "deepseek_v3": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": 1024,
        "hidden_size": 512,
        "intermediate_size": 1024,
        "moe_intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        # DeepSeek-V3's MLA head dimensions: the Triton MLA decode kernel takes the
        # latent (kv_lora_rank) as its value and needs next_power_of_2(kv_lora_rank +
        # qk_rope_head_dim) == next_power_of_2(kv_lora_rank) unless the sum is one of its
        # split cases (576 = 512 + 64, 288 = 256 + 32); 128 + 32 failed there.
        "q_lora_rank": 256,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        # DeepSeek-V3's routing: 256 routed experts in 8 groups, the best 4 groups, 8
        # experts a token, sigmoid scores plus e_score_correction_bias (noaux_tc), and one
        # shared expert, which SGLang 0.5.13.post1 fuses into the routed ones as expert 256
        # only for n_routed_experts in (256, 384) (DeepseekV2ForCausalLM.
        # determine_num_fused_shared_experts).
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "n_group": 8,
        "topk_group": 4,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 0,
        "moe_layer_freq": 1,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "num_nextn_predict_layers": 0,
    },
}


@dataclass(frozen=True)
class Run:
    label: str
    plugin: bool
    inject: bool
    pass_count: bool
    what: str
    aiter: bool = False  # the MoE layer calls aiter.fused_moe (the CUDA stand-in)


RUNS: tuple[Run, ...] = (
    Run("a", True, True, True, "plugin on, garbage injected"),
    Run("b", True, False, True, "plugin on, no injection"),
    Run("c", False, True, True, "plugin off, garbage injected"),
    Run("d", False, False, True, "plugin off, no injection"),
    Run("e", True, True, False, "plugin on, garbage injected, no count passed to TopK"),
    # The guard-only runs (``--runs f,g,h``): SGLang's MoE layer calls
    # aiter.fused_moe.fused_moe (site/aiter_server, a CUDA stand-in that faults on an id out
    # of range), and no count reaches TopK or aiter, so the guard at aiter's entry is the
    # only thing between the padded rows' garbage and the MoE.
    Run("f", True, True, False, "aiter path, plugin on (the guard alone), garbage, no count", True),
    Run("g", False, True, False, "aiter path, plugin off, garbage, no count", True),
    Run("h", False, False, False, "aiter path, plugin off, no injection, no count", True),
)
REFERENCE = "b"
EQUAL_RUNS = ("a", "b", "d")
OVERHEAD_PAIR = ("b", "d")
GUARD_REFERENCE = "h"
GUARD_EQUAL_RUNS = ("f", "h")
DEFAULT_RUNS = "a,b,c,d,e"


def select_runs(labels: str) -> tuple[Run, ...]:
    """The runs named in ``--runs`` (comma-separated labels; empty: a to e)."""
    wanted = [x.strip() for x in (labels or DEFAULT_RUNS).split(",") if x.strip()]
    unknown = sorted(set(wanted) - {r.label for r in RUNS})
    if unknown:
        raise SystemExit(f"unknown run label(s): {', '.join(unknown)}")
    return tuple(r for r in RUNS if r.label in wanted)


def reference_of(runs: tuple[Run, ...]) -> str:
    """The run the others are compared with: (b), else (h) for the guard-only runs, else
    the first (a rehearsal)."""
    labels = {r.label for r in runs}
    if REFERENCE in labels:
        return REFERENCE
    return GUARD_REFERENCE if GUARD_REFERENCE in labels else runs[0].label


def log(msg: str) -> None:
    print(f"[harness {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------ servers


def server_args(model_dir: Path, port: int) -> list[str]:
    """The launch_server arguments every run shares (only the environment differs)."""
    return [
        "--model-path",
        str(model_dir),
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--dtype",
        "bfloat16",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tp-size",
        "1",
        "--attention-backend",
        "triton",
        "--sampling-backend",
        "pytorch",
        "--moe-runner-backend",
        "triton",
        "--grammar-backend",
        "none",
        "--cuda-graph-bs",
        *[str(b) for b in CAPTURE_BS],
        "--max-running-requests",
        str(max(CAPTURE_BS)),
        "--disable-piecewise-cuda-graph",
        "--disable-radix-cache",
        "--skip-server-warmup",
        # Five servers share the GPU: each sizes its pool from what it sees free and caps
        # it at a fixed token budget, so start-up order does not matter.
        "--mem-fraction-static",
        "0.85",
        "--max-total-tokens",
        "16384",
        "--context-length",
        "1024",
        "--random-seed",
        "0",
        "--log-level",
        "info",
    ]


def server_env(run: Run, base: dict[str, str], site_dir: Path, record_dir: Path) -> dict[str, str]:
    """The environment of one run: the test-only switches and the plugin's own switch."""
    env = {k: v for k, v in base.items() if not k.startswith("SGLANG_AMD_MOE_")}
    env.pop("SGLANG_PLUGINS", None)
    env.update(
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(site_dir), base.get("PYTHONPATH", "")) if p),
        SGLANG_AMD_MOE_FORCE="1",  # not ROCm: the plugin registers its hooks only when forced
        SGLANG_AMD_MOE_TEST_HIP_BRANCH="1",
        SGLANG_AMD_MOE_TEST_PROBE_LOGGING="1",
        SGLANG_AMD_MOE_TEST_RECORD_DIR=str(record_dir),
    )
    if not run.plugin:
        env["SGLANG_AMD_MOE_DISABLE"] = "1"
    if run.inject:
        env["SGLANG_AMD_MOE_TEST_INJECT"] = "1"
    if run.pass_count:
        env["SGLANG_AMD_MOE_TEST_PASS_COUNT"] = "1"
    if run.aiter:
        env["SGLANG_AMD_MOE_TEST_AITER"] = "1"
    return env


# Each process walks the range from its own start (from its pid), so processes picking
# ports side by side (the test suite's parallel workers) do not pick the same one.
_START = 31000 + 37 * (os.getpid() % 200)
_PORTS = iter([*range(_START, 40000, 37), *range(31000, _START, 37)])


def free_port() -> int:
    """A free port well below 55535: SGLang derives its gRPC port as port + 10000 and
    refuses one above 65535."""
    for port in _PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 31000-40000")


class Server:
    """One ``python -m sglang.launch_server`` process group and its log."""

    def __init__(
        self,
        run: Run,
        python: str,
        model_dir: Path,
        out_dir: Path,
        site_dir: Path,
        extra_args: list[str],
    ) -> None:
        self.run = run
        self.port = free_port()
        self.log_path = out_dir / f"server-{run.label}.log"
        self.record_dir = Path(f"/tmp/sglang-amd-moe-server-records/{run.label}")
        shutil.rmtree(self.record_dir, ignore_errors=True)
        self.record_dir.mkdir(parents=True)
        self.cmd = [
            python,
            "-m",
            "sglang.launch_server",
            *server_args(model_dir, self.port),
            *extra_args,
        ]
        self.env = server_env(run, dict(os.environ), site_dir, self.record_dir)
        self.proc: subprocess.Popen | None = None
        self.t_start = 0.0
        self.ready_s: float | None = None
        self.failed: str = ""

    def start(self) -> None:
        self.t_start = time.monotonic()
        with open(self.log_path, "w") as f:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=WORK,
                start_new_session=True,
            )

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def poll_ready(self) -> bool:
        """True once the server says it is ready and answers /health."""
        if self.ready_s is not None:
            return True
        if "The server is fired up and ready to roll" not in self.log_text():
            return False
        try:  # /model_info answers without generating (/health would run a decode step)
            status, _ = http_get(self.port, "/model_info", timeout=5)
        except OSError:
            return False
        if status == 200:
            self.ready_s = round(time.monotonic() - self.t_start, 1)
            return True
        return False

    def stop(self) -> None:
        """End the process group we started (launcher, scheduler, detokenizer)."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # stragglers left in the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def records(self) -> list[dict]:
        out = []
        for path in sorted(glob.glob(str(self.record_dir / "record-*.json"))):
            try:
                out.append(json.loads(Path(path).read_text()))
            except (OSError, ValueError) as exc:
                out.append({"path": path, "error": repr(exc)})
        return out


def wait_ready(servers: list[Server], deadline_s: float) -> None:
    t0 = time.monotonic()
    pending = list(servers)
    while pending and time.monotonic() - t0 < deadline_s:
        for s in list(pending):
            if s.poll_ready():
                log(f"server {s.run.label} ready after {s.ready_s} s (port {s.port})")
                pending.remove(s)
            elif not s.alive():
                s.failed = f"exited with {s.proc.returncode} before it was ready"
                log(f"server {s.run.label} {s.failed}")
                pending.remove(s)
        time.sleep(1.0)
    for s in pending:
        s.failed = f"not ready after {deadline_s:.0f} s"
        log(f"server {s.run.label} {s.failed}")


# --------------------------------------------------------------------------------- HTTP


def http_get(port: int, path: str, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def post_json(port: int, path: str, body: dict, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            "POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def prompts(round_i: int, size: int, vocab: int) -> list[list[int]]:
    """Distinct, fixed token-id prompts for one round of one batch size."""
    rng = random.Random(PROMPT_SEED * 1000 + round_i * 100 + size)
    return [[rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(PROMPT_LEN)] for _ in range(size)]


def generate_batch(
    port: int, batch: list[list[int]], max_new_tokens: int, timeout: float
) -> list[dict]:
    """One /generate call carrying ``len(batch)`` requests (SGLang serves them
    concurrently); greedy, fixed length, with each output token's logprob. Returns one
    record per request: its output ids and logprobs, or the error."""
    body = {
        "input_ids": batch,
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": max_new_tokens,
            "ignore_eos": True,
        },
        "return_logprob": True,
    }
    try:
        status, raw = post_json(port, "/generate", body, timeout)
    except (OSError, http.client.HTTPException) as exc:
        return [{"error": f"{type(exc).__name__}: {exc}"} for _ in batch]
    if status != 200:
        return [{"error": f"HTTP {status}: {raw[:300].decode(errors='replace')}"} for _ in batch]
    try:
        answers = json.loads(raw)
    except ValueError as exc:
        return [{"error": f"bad JSON ({exc}): {raw[:300].decode(errors='replace')}"} for _ in batch]
    if isinstance(answers, dict):
        answers = [answers]
    out = []
    for ans in answers:
        meta = ans.get("meta_info", {})
        lps = [
            x[0] if isinstance(x, list | tuple) and x else None
            for x in meta.get("output_token_logprobs", [])
        ]
        out.append({"ids": ans.get("output_ids"), "logprobs": lps})
    return out


def stream_request(
    port: int, prompt: list[int], max_new_tokens: int, start: threading.Event, timeout: float
) -> dict:
    """One streamed greedy request: (time, completion tokens so far) for every chunk."""
    body = {
        "input_ids": prompt,
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": max_new_tokens,
            "ignore_eos": True,
        },
        "stream": True,
    }
    marks: list[tuple[float, int]] = []
    start.wait()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            "POST", "/generate", body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        if resp.status != 200:
            return {"error": f"HTTP {resp.status}"}
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            tokens = chunk.get("meta_info", {}).get("completion_tokens")
            if tokens is not None:
                marks.append((time.perf_counter(), int(tokens)))
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        conn.close()
    return {"marks": marks}


def decode_timing(results: list[dict]) -> dict:
    """Time per output token and decode throughput of one round of streamed requests.

    TPOT of a request: time from its first streamed token to its last, over the tokens
    in between (prefill excluded). Throughput: all those tokens over the span from the
    first request's first token to the last request's last token.
    """
    tpots, tokens, firsts, lasts = [], 0, [], []
    for r in results:
        marks = r.get("marks") or []
        if len(marks) < 2 or marks[-1][1] <= marks[0][1]:
            continue
        (t0, n0), (t1, n1) = marks[0], marks[-1]
        tpots.append((t1 - t0) / (n1 - n0))
        tokens += n1 - n0
        firsts.append(t0)
        lasts.append(t1)
    if not tpots:
        return {"ok": 0}
    span = max(lasts) - min(firsts)
    return {
        "ok": len(tpots),
        "tpot_ms": statistics.median(tpots) * 1e3,
        "decode_tok_s": tokens / span if span > 0 else float("nan"),
    }


# ----------------------------------------------------------------------------- analysis


# Not anchored at the line's start: a line written while a progress bar is drawn (the
# guard's, during graph capture) follows the bar on the same line.
PLUGIN_LINE = re.compile(r"PROBE (\S+) pid=(\d+) sglang_amd_moe: (.*)$", re.M)
HOOK_APPLIED = re.compile(
    r"^PROBE (\S+) pid=(\d+) sglang\.srt\.plugins\.hook_registry: (Applied \d+ hook\(s\) to "
    r"sglang\.srt\.layers\.moe\.topk\._post_process_topk_ids.*)$",
    re.M,
)
TEST_LINE = re.compile(r"^SERVER-TEST (\S+) pid=(\d+): (.*)$", re.M)
CAPTURE_LINE = re.compile(r"Capture cuda graph (bs \[[^\]]*\]|end\. Time elapsed: [^\n]*)")
# DeepseekV2ForCausalLM.determine_num_fused_shared_experts says so when it turns the
# shared-expert fusion off (and says nothing when it keeps it on).
FUSION_OFF_LINE = re.compile(r"^.*Shared experts fusion optimization is disabled.*$", re.M)
FAULT = re.compile(
    r"illegal memory access|CUDA error|device-side assert|unspecified launch failure|"
    r"misaligned address|Xid|CUBLAS_STATUS|cudaError",
    re.I,
)


def parse_log(text: str) -> dict:
    """What a server's log says about the plugin, the test switches, graphs and faults."""
    faults = []
    for line in text.splitlines():
        if FAULT.search(line) and not line.startswith(("PROBE", "SERVER-TEST")):
            if line.strip() not in faults:
                faults.append(line.strip())

    def lines(pattern: re.Pattern) -> list[dict]:
        return [{"process": m[0], "pid": int(m[1]), "line": m[2]} for m in pattern.findall(text)]

    return {
        "plugin_lines": lines(PLUGIN_LINE),
        "hook_applied": lines(HOOK_APPLIED),
        "test_switch_lines": lines(TEST_LINE),
        "capture_lines": CAPTURE_LINE.findall(text),
        "fusion_disabled_lines": [x.strip() for x in FUSION_OFF_LINE.findall(text)][:5],
        "fault_lines": faults[:20],
        "traceback": "Traceback (most recent call last)" in text,
    }


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def compare(outputs: list[dict], reference: list[dict]) -> dict:
    """One run's outputs against the reference run's, request by request."""
    served = sum(1 for o in outputs if "ids" in o and o["ids"] is not None)
    errors = [o["error"] for o in outputs if "error" in o]
    same = mismatched = nan_requests = 0
    first_mismatch = None
    max_lp_diff = 0.0
    for i, (o, r) in enumerate(zip(outputs, reference, strict=True)):
        if "ids" not in o or "ids" not in r or o["ids"] is None or r["ids"] is None:
            continue
        if any(_nan(x) for x in o.get("logprobs", [])):
            nan_requests += 1
        if o["ids"] == r["ids"]:
            same += 1
            for x, y in zip(o.get("logprobs", []), r.get("logprobs", []), strict=False):
                if not _nan(x) and not _nan(y):
                    max_lp_diff = max(max_lp_diff, abs(x - y))
        else:
            mismatched += 1
            if first_mismatch is None:
                pos = next(
                    (j for j, (a, b) in enumerate(zip(o["ids"], r["ids"], strict=False)) if a != b),
                    min(len(o["ids"]), len(r["ids"])),
                )
                first_mismatch = {
                    "request": i,
                    "position": pos,
                    "got": o["ids"][pos : pos + 8],
                    "reference": r["ids"][pos : pos + 8],
                }
    return {
        "requests": len(outputs),
        "served": served,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "identical": same,
        "mismatched": mismatched,
        "nan_logprob_requests": nan_requests,
        "max_abs_logprob_diff_when_identical": max_lp_diff,
        "first_mismatch": first_mismatch,
    }


def damage(cmp: dict, parsed: dict, died: bool) -> list[str]:
    """What went wrong in a run against the reference, in the words docs/server.md shows."""
    out = []
    if parsed["fault_lines"] or died:
        out.append("device fault" if parsed["fault_lines"] else "server died")
    if cmp["nan_logprob_requests"]:
        out.append("NaN")
    if cmp["mismatched"]:
        out.append("wrong tokens")
    if cmp["errors"] and not out:
        out.append("requests failed")
    return out


def padding_summary(records: list[dict]) -> dict:
    """Replays seen by the scheduler process(es): how many, and how many had padded rows."""
    total = padded = 0
    sizes: dict[str, int] = {}
    for rec in records:
        for key, n in (rec.get("replays") or {}).items():
            raw, pad = (int(x) for x in key.split("/"))
            total += n
            padded += n if raw < pad else 0
            sizes[key] = sizes.get(key, 0) + n
    return {"replays": total, "replays_with_padded_rows": padded, "by_real_over_padded": sizes}


def topk_summary(records: list[dict]) -> dict | None:
    """What ``TopK`` handed the MoE in the graph-replaying process (``sitecustomize``'s
    ``topk_after_hook`` counts, over every replay and MoE layer), and the verdict: padded
    rows are clean when every id is in range and every weight zero, in the routed columns
    and, where a shared expert is fused, in its appended column too. None: not recorded."""
    rec = next((r for r in records if r.get("topk_after_hook")), None)
    if rec is None:
        return None
    counts = rec["topk_after_hook"]
    config = rec.get("topk") or {}
    groups = ["padded_routed"]
    if config.get("num_fused_shared_experts"):
        groups.append("padded_shared")
    clean = all(
        counts[g]["entries"] > 0
        and counts[g]["ids_out_of_range"] == 0
        and counts[g]["weights_nonzero"] == 0
        for g in groups
    )
    return {"config": config, "counts": counts, "padded_rows_clean": clean}


def stats_summary(records: list[dict]) -> dict | None:
    """The plugin's own counters (``sglang_amd_moe.runtime.stats``) in the graph-replaying
    process, as last read (the aiter runs only). None: not recorded."""
    rec = next((r for r in records if r.get("plugin_stats")), None)
    return None if rec is None else rec["plugin_stats"]


# --------------------------------------------------------------------------------- main


class Results:
    """The results document, rewritten after every phase so a cut-off run still reports."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.doc: dict = {"schema": 1, "phases": {}}

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, sort_keys=False, default=str))
        os.replace(tmp, self.path)


def environment(python: str, manifest: Path | None) -> dict:
    info: dict = {"python_harness": platform.python_version(), "host": platform.node()}
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        info["gpu"] = smi.stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["gpu"] = f"nvidia-smi failed: {exc}"
    code = (
        "import importlib.metadata as m, platform, torch, triton; "
        "print(platform.python_version(), torch.__version__, triton.__version__, "
        "m.version('sglang'), m.version('sglang-amd-moe'), m.version('sglang-kernel'), "
        "m.version('flashinfer-python'), m.version('transformers'))"
    )
    proc = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, timeout=180, cwd=WORK
    )
    keys = (
        "python",
        "torch",
        "triton",
        "sglang",
        "sglang_amd_moe",
        "sglang_kernel",
        "flashinfer",
        "transformers",
    )
    if proc.returncode == 0:
        info.update(dict(zip(keys, proc.stdout.split(), strict=False)))
    else:
        info["versions_error"] = proc.stderr[-2000:]
    if manifest and manifest.is_file():
        info["bundle"] = json.loads(manifest.read_text())
    return info


def write_model(name: str, root: Path) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(MODELS[name], indent=1))
    return d


def run_checks(
    servers: dict[str, Server], vocab: int, rounds: int, max_new_tokens: int, timeout: float
) -> dict[str, list[dict]]:
    """Every round: the same batch to every live server at once; outputs per run."""
    outputs: dict[str, list[dict]] = {label: [] for label in servers}
    for r in range(rounds):
        for size in CHECK_SIZES:
            batch = prompts(r, size, vocab)
            answers: dict[str, list[dict]] = {}

            def send(label: str, batch=batch, answers=answers) -> None:
                s = servers[label]
                if s.failed or not s.alive():
                    why = s.failed or "server process had exited"
                    answers[label] = [{"error": f"not sent: {why}"} for _ in batch]
                    return
                answers[label] = generate_batch(s.port, batch, max_new_tokens, timeout)

            threads = [threading.Thread(target=send, args=(label,)) for label in servers]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for label, ans in answers.items():
                outputs[label].extend(ans)
                bad = sum(1 for a in ans if "error" in a)
                if bad and not servers[label].failed:
                    servers[label].failed = f"round {r} size {size}: {ans[0].get('error', '?')}"[
                        :300
                    ]
            log(
                f"round {r} size {size}: {time.monotonic() - t0:.1f} s; "
                + ", ".join(
                    f"{k}:{sum(1 for a in v if 'ids' in a)}/{len(v)}"
                    for k, v in sorted(answers.items())
                )
            )
    return outputs


def run_overhead(
    servers: dict[str, Server], vocab: int, rounds: int, max_new_tokens: int, timeout: float
) -> dict:
    """(b) vs (d), one server at a time, rounds interleaved (b d d b b d ...) so both see
    the same drift; the first round of each (server, size) is a warm-up and not counted."""
    out: dict = {"rounds": rounds, "max_new_tokens": max_new_tokens, "sizes": {}}
    for size in OVERHEAD_SIZES:
        per: dict[str, list[dict]] = {label: [] for label in OVERHEAD_PAIR}
        for r in range(rounds + 1):
            order = OVERHEAD_PAIR if r % 2 == 0 else tuple(reversed(OVERHEAD_PAIR))
            for label in order:
                s = servers[label]
                batch = prompts(1000 + r, size, vocab)
                start = threading.Event()
                res: list[dict] = [{} for _ in batch]

                def one(i: int, s=s, batch=batch, start=start, res=res) -> None:
                    res[i] = stream_request(s.port, batch[i], max_new_tokens, start, timeout)

                threads = [threading.Thread(target=one, args=(i,)) for i in range(len(batch))]
                for t in threads:
                    t.start()
                start.set()
                for t in threads:
                    t.join()
                timing = decode_timing(res)
                timing["errors"] = sum(1 for x in res if "error" in x)
                if r > 0:
                    per[label].append(timing)
        summary: dict = {}
        for label, rows in per.items():
            good = [x for x in rows if x.get("ok") == size]
            summary[label] = {
                "rounds_ok": len(good),
                "tpot_ms": [round(x["tpot_ms"], 4) for x in good],
                "decode_tok_s": [round(x["decode_tok_s"], 1) for x in good],
                "tpot_ms_median": round(statistics.median(x["tpot_ms"] for x in good), 4)
                if good
                else None,
                "decode_tok_s_median": round(statistics.median(x["decode_tok_s"] for x in good), 1)
                if good
                else None,
            }
        b, d = summary[OVERHEAD_PAIR[0]], summary[OVERHEAD_PAIR[1]]
        if b["tpot_ms_median"] and d["tpot_ms_median"]:
            summary["tpot_ratio_b_over_d"] = round(b["tpot_ms_median"] / d["tpot_ms_median"], 4)
            summary["throughput_ratio_b_over_d"] = round(
                b["decode_tok_s_median"] / d["decode_tok_s_median"], 4
            )
        out["sizes"][str(size)] = summary
        log(f"overhead bs={size}: {json.dumps(summary)[:400]}")
    return out


def attempt(model: str, args, results: Results) -> bool:
    """All runs with one model; False when the reference server never came up."""
    runs = select_runs(args.runs)
    reference = reference_of(runs)
    model_dir = write_model(model, WORK / "models")
    vocab = MODELS[model]["vocab_size"]
    doc = results.doc
    doc["model"] = {"name": model, "config": MODELS[model]}
    doc["server"] = {
        "command": ["python", "-m", "sglang.launch_server", *server_args(Path(f"<{model}>"), 0)],
        "capture_bs": list(CAPTURE_BS),
        "check_sizes": list(CHECK_SIZES),
        "overhead_sizes": list(OVERHEAD_SIZES),
        "rounds": args.rounds,
        "max_new_tokens": args.max_new_tokens,
        "prompt_len": PROMPT_LEN,
    }
    doc["runs"] = {
        r.label: {
            "what": r.what,
            "plugin": r.plugin,
            "inject": r.inject,
            "pass_count": r.pass_count,
            "aiter": r.aiter,
        }
        for r in runs
    }
    extra = args.extra_server_args.split()
    servers = {
        r.label: Server(r, args.python, model_dir, args.out, args.sitecustomize_dir, extra)
        for r in runs
    }
    for label, s in servers.items():
        doc["runs"][label]["env"] = {
            k: v for k, v in s.env.items() if k.startswith("SGLANG_AMD_MOE_")
        }
    t0 = time.monotonic()
    for s in servers.values():
        s.start()
        time.sleep(0.5)
    log(f"{model}: started {len(servers)} servers")
    try:
        wait_ready(list(servers.values()), min(args.ready_timeout, args.remaining() - 90))
        doc["phases"][f"{model}_startup_s"] = round(time.monotonic() - t0, 1)
        for label, s in servers.items():
            doc["runs"][label]["ready_s"] = s.ready_s
            doc["runs"][label]["startup_failure"] = s.failed or None
        results.save()
        doc["reference"] = reference
        if servers[reference].ready_s is None:
            doc["runs"][reference]["log_tail"] = servers[reference].log_text()[-6000:]
            return False

        t1 = time.monotonic()
        outputs = run_checks(servers, vocab, args.rounds, args.max_new_tokens, args.request_timeout)
        doc["phases"]["checks_s"] = round(time.monotonic() - t1, 1)
        time.sleep(2.5)  # the record files are rewritten once a second
        ref = outputs[reference]
        for label, s in servers.items():
            text = s.log_text()
            parsed = parse_log(text)
            records = s.records()
            cmp = compare(outputs[label], ref)
            died = not s.alive()
            doc["runs"][label].update(
                log=parsed,
                records=records,
                padding=padding_summary(records),
                topk_after_hook=topk_summary(records),
                plugin_stats=stats_summary(records),
                aiter_calls=sum(r.get("aiter_calls") or 0 for r in records),
                compare_to_b=cmp,
                alive_after_checks=not died,
                damage=damage(cmp, parsed, died),
                # one string of token ids per request (None: not served)
                outputs=[
                    " ".join(map(str, o["ids"])) if o.get("ids") else None for o in outputs[label]
                ],
            )
            if died or parsed["traceback"]:
                doc["runs"][label]["log_tail"] = text[-4000:]
        eq = {}
        present = [x for x in EQUAL_RUNS if x in servers]
        guard_present = [x for x in GUARD_EQUAL_RUNS if x in servers]
        for x, y in [(x, y) for g in (present, guard_present) for x in g for y in g if x < y]:
            eq[f"{x}=={y}"] = bool(outputs[x]) and all(
                "ids" in p and "ids" in q and p["ids"] == q["ids"]
                for p, q in zip(outputs[x], outputs[y], strict=True)
            )
        doc["equal"] = eq
        results.save()
        log(
            f"equal: {eq}; damage: "
            + ", ".join(f"{k}={v['damage']}" for k, v in doc["runs"].items())
        )

        for label in servers:
            if label not in OVERHEAD_PAIR:
                servers[label].stop()
        if args.remaining() < 45:
            doc["overhead"] = {"skipped": f"only {args.remaining():.0f} s of the time budget left"}
        elif not all(x in servers for x in OVERHEAD_PAIR):
            doc["overhead"] = {"skipped": "b and d were not both started (--runs)"}
        elif all(servers[x].alive() and not servers[x].failed for x in OVERHEAD_PAIR):
            t2 = time.monotonic()
            doc["overhead"] = run_overhead(
                servers, vocab, args.overhead_rounds, args.overhead_tokens, args.request_timeout
            )
            doc["phases"]["overhead_s"] = round(time.monotonic() - t2, 1)
        else:
            doc["overhead"] = {"skipped": "b or d was not serving"}
        results.save()
        return True
    finally:
        for s in servers.values():
            s.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--python", default=sys.executable, help="the interpreter that has SGLang and the plugin"
    )
    p.add_argument("--sitecustomize-dir", type=Path, default=HERE / "site")
    p.add_argument("--manifest", type=Path, default=None)
    p.add_argument(
        "--models", default="qwen3_moe", help="comma-separated; tried in order until one serves"
    )
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--overhead-rounds", type=int, default=8)
    p.add_argument("--overhead-tokens", type=int, default=128)
    p.add_argument("--ready-timeout", type=float, default=420)
    p.add_argument("--request-timeout", type=float, default=60)
    p.add_argument("--extra-server-args", default="", help="appended to every launch (rehearsals)")
    p.add_argument(
        "--runs", default="", help="comma-separated run labels to start (rehearsals; default all)"
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=270,
        help="seconds for everything (the device call's limit)",
    )
    args = p.parse_args()
    t_budget = time.monotonic() + args.time_budget
    args.remaining = lambda: t_budget - time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    results = Results(args.out / "server-h200.json")
    t0 = time.monotonic()
    results.doc["harness_args"] = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "remaining"
    }
    results.doc["environment"] = environment(args.python, args.manifest)
    results.doc["phases"]["environment_s"] = round(time.monotonic() - t0, 1)
    results.doc["attempts"] = []
    results.save()
    log(f"environment: {json.dumps(results.doc['environment'])[:600]}")
    ok = False
    for i, model in enumerate(m.strip() for m in args.models.split(",") if m.strip()):
        if i and args.remaining() < 240:
            log(f"no time left to try {model} ({args.remaining():.0f} s)")
            results.doc["attempts"].append(
                {"model": model, "served": False, "skipped": "no time left"}
            )
            break
        log(f"attempt with {model}")
        ok = attempt(model, args, results)
        entry: dict = {"model": model, "served": ok}
        if not ok:  # the next attempt reuses the log files: keep what this one said
            entry["startup"] = {
                k: {"ready_s": v.get("ready_s"), "failure": v.get("startup_failure")}
                for k, v in results.doc.get("runs", {}).items()
            }
            entry["log_tails"] = {
                label: Path(args.out / f"server-{label}.log").read_text(errors="replace")[-6000:]
                for label in (r.label for r in select_runs(args.runs))
                if (args.out / f"server-{label}.log").exists()
            }
        results.doc["attempts"].append(entry)
        results.save()
        if ok:
            break
    results.doc["phases"]["total_s"] = round(time.monotonic() - t0, 1)
    results.save()
    log(f"done in {results.doc['phases']['total_s']} s; served={ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

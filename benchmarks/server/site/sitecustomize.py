"""Test-only switches for the real-server run, put on the server's PYTHONPATH.

Python imports ``sitecustomize`` at start-up in every process, and SGLang starts its
scheduler and detokenizer as fresh interpreters that inherit the environment, so these
switches act in every server process without touching SGLang or this package. They
exist only to make a CUDA server look, at the padded rows, like an AMD one; nothing here
ships in the wheel. Each is off unless its variable is ``1``:

``SGLANG_AMD_MOE_TEST_HIP_BRANCH``
    Once ``sglang.srt.layers.moe.topk`` is imported, set its ``_is_hip=True`` and
    ``_is_cuda=False``: the module then routes and post-processes as it does on ROCm
    without aiter (the same flags ``sglang-amd-moe check`` and the tests set). Other
    modules keep their own flags, so the MoE kernels, attention and sampling stay CUDA's.
``SGLANG_AMD_MOE_TEST_INJECT``
    The router (``fused_topk``, ``grouped_topk``, ``biased_grouped_topk`` of that module)
    writes what AMD's router leaves in padded rows into rows at and beyond the real token
    count of a CUDA-graph batch: arbitrary int32 words as expert ids (stale shared memory,
    as the check emulates it) and NaN weights. The code is captured into the graphs and
    reads the count from a device tensor, so every replay writes its own padded rows.
``SGLANG_AMD_MOE_TEST_PASS_COUNT``
    Hand ``TopK`` that device count as ``num_token_non_padded`` while graphs are
    captured. SGLang 0.5.13.post1 passes the count only on its expert-parallel paths
    (DeepEP-style all-to-all, two-batch overlap) and keeps it current only when the
    expert-parallel size is above 1; a one-GPU server hands ``TopK`` none. This switch
    supplies what those paths supply, so the padded-row code in ``_post_process_topk_ids``
    (upstream's and the plugin's) has a count to act on.
``SGLANG_AMD_MOE_TEST_AITER``
    SGLang's unquantized MoE layer runs through aiter, as on ROCm with
    ``SGLANG_USE_AITER=1``: the folder ``aiter_server/`` (a CUDA stand-in for the aiter
    modules SGLang imports on that path, with aiter's signatures; an id out of range is a
    device fault there) goes first on ``sys.path``, and once
    ``sglang.srt.layers.quantization.unquant`` is imported its ``_use_aiter`` is set, the
    names its ``if _use_aiter:`` import would have bound are bound, and the MoE runner
    backend it sees is ``aiter``: every MoE call goes to ``aiter.fused_moe.fused_moe``.
    Other modules keep their own flags. The record then also holds the stand-in's call
    count and the plugin's own counters (``sglang_amd_moe.runtime.stats``), read once a
    second after the first replay.
``SGLANG_AMD_MOE_TEST_PROBE_LOGGING``
    Print the log lines of ``sglang_amd_moe`` and ``sglang.srt.plugins`` with the name of
    the process's target function (``load_plugins()`` runs before SGLang configures
    logging, so its INFO lines would otherwise be dropped).

``SGLANG_AMD_MOE_TEST_RECORD_DIR`` (a folder): each process that captures CUDA graphs
writes ``record-<pid>.json`` there: the topk flags and the plugin's hook state as seen at
the first capture, the batch sizes captured, every replay's (real, padded) token counts,
and what ``TopK`` hands the MoE (after ``_post_process_topk_ids``, so after the plugin's
hook): its configuration (columns, routed experts, fused shared experts) and, over every
graph replay and MoE layer, the padded rows' routed columns and appended shared-expert
columns apart, and the real rows' shared columns: entries seen, ids outside
``[0, routed + shared experts)``, weights not zero (NaN included), and the id range. One
small Triton kernel per ``TopK`` call, captured into the graphs, counts on the device; a
thread reads the counts once a second after the first replay (no synchronisation on the
server's own path). The harness reads these files; they are written at once for the first
three replays (a server that faults there keeps them), then at most once a second.

The padded-row count lives in one int32 device tensor per process: set to the capture
size while a graph is captured (no padded rows during capture) and to the real token
count by ``CudaGraphRunner.replay_prepare`` before every replay, on the replay's stream.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import itertools
import json
import logging
import multiprocessing
import os
import sys
import threading
import time
import traceback

PREFIX = "SGLANG_AMD_MOE_TEST_"
TOPK = "sglang.srt.layers.moe.topk"
GRAPH_RUNNER = "sglang.srt.model_executor.cuda_graph_runner"
ROUTERS = ("fused_topk", "grouped_topk", "biased_grouped_topk")


def _on(name: str) -> bool:
    return os.environ.get(PREFIX + name, "") == "1"


HIP_BRANCH = _on("HIP_BRANCH")
INJECT = _on("INJECT")
PASS_COUNT = _on("PASS_COUNT")
AITER = _on("AITER")
UNQUANT = "sglang.srt.layers.quantization.unquant"
RECORD_DIR = os.environ.get(PREFIX + "RECORD_DIR", "")


def _target() -> str:
    """The process's target function (``run_scheduler_process``, ...); a spawned child
    still unpickling its target is ``child``, the first process ``launcher``."""
    t = getattr(multiprocessing.current_process(), "_target", None)
    if t is not None:
        return getattr(t, "__name__", "child")
    return "child" if multiprocessing.parent_process() is not None else "launcher"


def _say(msg: str) -> None:
    """One line on stderr, prefixed so the harness can find it in the server log."""
    print(f"SERVER-TEST {_target()} pid={os.getpid()}: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ record


class _Record:
    """What this process saw; written as JSON by a daemon thread when it changed."""

    def __init__(self) -> None:
        self.data: dict = {
            "pid": os.getpid(),
            "target": _target(),
            "switches": {
                "hip_branch": HIP_BRANCH,
                "inject": INJECT,
                "pass_count": PASS_COUNT,
                "aiter": AITER,
            },
            "topk_flags_at_capture": None,
            "hook": None,
            "captured_bs": [],
            "count_supplied_at_capture": 0,
            "injected_at_capture": 0,
            "replays": {},
            "topk": None,
            "topk_after_hook": None,
            "aiter_calls": None,
            "plugin_stats": None,
            "errors": [],
        }
        self.dirty = False
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def update(self, fn) -> None:
        with self.lock:
            fn(self.data)
            self.dirty = True
        if RECORD_DIR and self.thread is None:
            self.thread = threading.Thread(
                target=self._writer, name="server-test-record", daemon=True
            )
            self.thread.start()

    def _writer(self) -> None:
        while True:
            time.sleep(1.0)
            _collect_topk_counts()
            _collect_aiter()
            self.flush()

    def flush(self) -> None:
        if not RECORD_DIR:
            return
        with self.lock:
            if not self.dirty:
                return
            text = json.dumps(self.data, sort_keys=True)
            self.dirty = False
        path = os.path.join(RECORD_DIR, f"record-{os.getpid()}.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)


RECORD = _Record()


def _error(where: str) -> None:
    text = f"{where}: {traceback.format_exc(limit=4)}"
    _say(text)
    RECORD.update(lambda d: d["errors"].append(text))


# ------------------------------------------------------------------------ the count

_STATE: dict = {
    "count": None,
    "salt": itertools.count(1),
    "replays": 0,
    "topk_counts": None,
    "topk_counts_seen": None,
    "topk_counts_failed": False,
}


def _capturing() -> bool:
    mod = sys.modules.get(GRAPH_RUNNER)
    return bool(mod is not None and mod.get_is_capture_mode())


def _count_tensor():
    """The process's int32[1] device count, created at the first capture."""
    if _STATE["count"] is None:
        import torch

        _STATE["count"] = torch.zeros(1, dtype=torch.int32, device=torch.cuda.current_device())
    return _STATE["count"]


def _garbage_words(n: int, salt: int, device):
    """``n`` arbitrary int32 words from a fixed integer hash (no RNG: the same words on
    every replay and in every run, and nothing for graph capture to object to)."""
    import torch

    x = torch.arange(n, device=device, dtype=torch.int64)
    x = (x * 2654435761 + salt * 40503 + 12345) & 0xFFFFFFFF
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & 0xFFFFFFFF
    x = x ^ (x >> 16)
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


def _inject(weights, ids) -> None:
    """Write AMD's padded-row garbage into rows at and beyond the count (capture only)."""
    import torch

    if not _capturing() or ids.dim() != 2 or ids.shape[0] == 0:
        return
    m, k = ids.shape
    pad = torch.arange(m, device=ids.device, dtype=torch.int32).unsqueeze(1) >= _count_tensor()
    words = _garbage_words(m * k, next(_STATE["salt"]), ids.device).view(m, k)
    ids.copy_(torch.where(pad, words.to(ids.dtype), ids))
    weights.copy_(torch.where(pad, torch.full_like(weights, float("nan")), weights))
    RECORD.update(lambda d: d.__setitem__("injected_at_capture", d["injected_at_capture"] + 1))


def _wrap_router(fn):
    def router(*args, **kwargs):
        out = fn(*args, **kwargs)
        try:
            _inject(out[0], out[1])
        except Exception:
            _error(f"inject in {fn.__name__}")
        return out

    router.__wrapped__ = fn
    router.__name__ = getattr(fn, "__name__", "router")
    return router


# ------------------------------------------------------ what TopK hands the MoE


def _counts_module():
    """``topk_counts.py`` beside this file (it imports Triton: loaded on first use)."""
    mod = sys.modules.get("_server_test_topk_counts")
    if mod is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "topk_counts.py")
        spec = importlib.util.spec_from_file_location("_server_test_topk_counts", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return mod


def _count_topk_output(layer, out) -> None:
    """Count what ``TopK`` returned (capture only: the launch is captured into the graph,
    so every replay counts its own rows against its own real token count)."""
    ids, weights = getattr(out, "topk_ids", None), getattr(out, "topk_weights", None)
    logits = getattr(out, "router_logits", None)
    if not _capturing() or ids is None or weights is None or ids.dim() != 2:
        return
    counts = _counts_module()
    cfg = layer.topk_config
    shared = int(getattr(cfg, "num_fused_shared_experts", 0) or 0)
    routed = int(logits.shape[-1]) if logits is not None else 0
    if RECORD.data["topk"] is None:
        info = {
            "top_k": int(cfg.top_k),
            "columns": int(ids.shape[1]),
            "routed_experts": routed,
            "num_fused_shared_experts": shared,
        }
        RECORD.update(lambda d: d.__setitem__("topk", d["topk"] or info))
    if _STATE["topk_counts"] is None:
        _STATE["topk_counts"] = counts.new_counts(ids.device)
    counts.count_topk_rows(
        ids, weights, _count_tensor(), _STATE["topk_counts"], shared, routed + shared
    )


def _collect_topk_counts(force: bool = False) -> None:
    """Copy the device counts into the record (after the first replay, when every graph
    is captured; ``force`` for a process that never replays)."""
    t = _STATE["topk_counts"]
    if t is None or _STATE["topk_counts_failed"] or not (force or _STATE["replays"]):
        return
    try:
        rows = t.tolist()
    except Exception:  # a faulted device: keep what was read before
        _STATE["topk_counts_failed"] = True
        _error("reading the TopK counts")
        return
    if rows == _STATE["topk_counts_seen"]:
        return
    _STATE["topk_counts_seen"] = rows
    doc = _counts_module().as_record(rows)
    RECORD.update(lambda d: d.__setitem__("topk_after_hook", doc))


def _collect_aiter() -> None:
    """The stand-in's call count and the plugin's counters, into the record (after the
    first replay: the counters are read on a side stream, never during a capture)."""
    if not AITER or not _STATE["replays"] or _STATE.get("stats_failed"):
        return
    moe = sys.modules.get("aiter.fused_moe")
    calls = moe.CALLS[0] if moe is not None else None
    stats_mod = sys.modules.get("sglang_amd_moe.runtime.stats")
    try:
        counts = stats_mod.counts(wait=True) if stats_mod is not None else None
    except Exception:  # a faulted device: keep what was read before
        _STATE["stats_failed"] = True
        _error("reading the plugin's counters")
        counts = None

    def put(d):
        d["aiter_calls"] = calls
        if counts is not None:
            d["plugin_stats"] = counts

    if (calls, counts) != _STATE.get("aiter_seen"):
        _STATE["aiter_seen"] = (calls, counts)
        RECORD.update(put)


# -------------------------------------------------------------------------- patches


def _patch_unquant(mod) -> None:
    """The MoE layer's aiter path, as on ROCm with SGLANG_USE_AITER=1 (see the docstring)."""
    from aiter.ops.shuffle import shuffle_weight
    from aiter.tuned_gemm import tgemm
    from sglang.srt.layers.moe.utils import MoeRunnerBackend

    mod._use_aiter = True
    mod.shuffle_weight, mod.tgemm = shuffle_weight, tgemm
    mod.get_moe_runner_backend = lambda: MoeRunnerBackend.AITER
    _say(f"{UNQUANT}: _use_aiter=True, MoE runner backend aiter (aiter.fused_moe.fused_moe)")


def _patch_topk(mod) -> None:
    if HIP_BRANCH:
        mod._is_hip, mod._is_cuda = True, False
        _say(f"{TOPK}: _is_hip=True, _is_cuda=False")
    if INJECT:
        for name in ROUTERS:
            fn = getattr(mod, name, None)
            if callable(fn):
                setattr(mod, name, _wrap_router(fn))
        _say(f"{TOPK}: router garbage in padded rows ({', '.join(ROUTERS)})")
    if PASS_COUNT or RECORD_DIR:
        cls = mod.TopK
        original = cls.forward_cuda

        def forward_cuda(self, hidden_states, router_logits, *args, **kwargs):
            if PASS_COUNT and kwargs.get("num_token_non_padded") is None and _capturing():
                kwargs["num_token_non_padded"] = _count_tensor()
                RECORD.update(
                    lambda d: d.__setitem__(
                        "count_supplied_at_capture", d["count_supplied_at_capture"] + 1
                    )
                )
            out = original(self, hidden_states, router_logits, *args, **kwargs)
            if RECORD_DIR and not _STATE["topk_counts_failed"]:
                try:
                    _count_topk_output(self, out)
                except Exception:
                    _STATE["topk_counts_failed"] = True  # report once, then stop counting
                    _error("counting TopK's output")
            return out

        cls.forward_cuda = forward_cuda
        if PASS_COUNT:
            _say(f"{TOPK}: TopK gets the real token count as num_token_non_padded in CUDA graphs")
        if RECORD_DIR:
            _say(f"{TOPK}: TopK's output counted in padded and real rows of every graph replay")


def _hook_state() -> dict:
    """The plugin's own view of its SGLang hook in this process (None: never loaded)."""
    hook = sys.modules.get("sglang_amd_moe.runtime.sglang.hook")
    if hook is None:
        return {"loaded": False}
    status = hook.status()
    package = sys.modules.get("sglang_amd_moe")
    out = {
        "loaded": True,
        "is_live": bool(hook.is_live()),
        "package_file": getattr(package, "__file__", None),
        "status": repr(status),
    }
    for field in ("form", "state", "hooked", "message"):
        if hasattr(status, field):
            out[field] = getattr(status, field)
    return out


def _patch_graph_runner(mod) -> None:
    cls = mod.CudaGraphRunner
    capture_one = cls.capture_one_batch_size
    replay_prepare = cls.replay_prepare

    def capture_one_batch_size(self, bs, *args, **kwargs):
        try:
            topk = sys.modules.get(TOPK)
            flags = {k: getattr(topk, k, None) for k in ("_is_hip", "_is_cuda")} if topk else None
            hook = _hook_state()

            def first(d):
                if d["topk_flags_at_capture"] is None:
                    d["target"] = _target()
                    d["topk_flags_at_capture"] = flags
                    d["hook"] = hook
                d["captured_bs"].append(bs)

            RECORD.update(first)
            if PASS_COUNT or INJECT or RECORD_DIR:
                _count_tensor().fill_(bs * self.num_tokens_per_bs)
        except Exception:
            _error("capture_one_batch_size")
        return capture_one(self, bs, *args, **kwargs)

    def replay_prepare_(self, forward_batch, *args, **kwargs):
        out = replay_prepare(self, forward_batch, *args, **kwargs)
        try:
            raw, padded = self.raw_num_token, self.bs * self.num_tokens_per_bs
            if _STATE["count"] is not None:
                _STATE["count"].fill_(raw)
            key = f"{raw}/{padded}"
            RECORD.update(lambda d: d["replays"].__setitem__(key, d["replays"].get(key, 0) + 1))
            _STATE["replays"] += 1
            if _STATE["replays"] <= 3:  # a server that faults on its first replays keeps them
                RECORD.flush()
        except Exception:
            _error("replay_prepare")
        return out

    cls.capture_one_batch_size = capture_one_batch_size
    cls.replay_prepare = replay_prepare_


# ----------------------------------------------------------------------- import hook


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then a callback on the fresh module; delegates the rest."""

    def __init__(self, inner, callback) -> None:
        self._inner = inner
        self._callback = callback

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        try:
            self._callback(module)
        except Exception:
            _error(f"patching {module.__name__}")

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, callbacks: dict) -> None:
        self._callbacks = callbacks

    def find_spec(self, name, path, target=None):
        callback = self._callbacks.get(name)
        if callback is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, callback)
                return spec
        return None


def _probe_logging() -> None:
    class _Target(logging.Filter):
        def filter(self, record):
            record.target = _target()
            return True

    handler = logging.StreamHandler()
    handler.addFilter(_Target())
    handler.setFormatter(
        logging.Formatter("PROBE %(target)s pid=%(process)d %(name)s: %(message)s")
    )
    for name in ("sglang_amd_moe", "sglang.srt.plugins"):
        lg = logging.getLogger(name)
        lg.setLevel(logging.INFO)
        lg.addHandler(handler)
        lg.propagate = False


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize this one shadows, if any (the image may rely on it)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


def _install() -> None:
    if _on("PROBE_LOGGING"):
        _probe_logging()
    callbacks = {}
    if AITER:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "aiter_server"))
        callbacks[UNQUANT] = _patch_unquant
    if HIP_BRANCH or INJECT or PASS_COUNT or RECORD_DIR:
        callbacks[TOPK] = _patch_topk
    if HIP_BRANCH or INJECT or PASS_COUNT or RECORD_DIR:
        callbacks[GRAPH_RUNNER] = _patch_graph_runner
    if callbacks:
        sys.meta_path.insert(0, _AfterImport(callbacks))


try:
    _install()
except Exception:
    _error("sitecustomize install")
try:
    _chain_next_sitecustomize()
except Exception:
    _error("chained sitecustomize")

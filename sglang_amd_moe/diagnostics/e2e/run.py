"""Run orchestration: every (form, batch) of the check, without and with the plugin.

:func:`run_check` is the whole check. For each batch (real tokens padded to a
CUDA-graph bucket) the model runs once unpadded (the reference) and once padded with
garbage rows, through SGLang's real routing and the aiter-like consumer; the real rows
are compared. Order matters, because the plugin loads once per process and classifies
the function that is running when it loads:

1. the installed form, without the plugin;
2. the rebuilt ``mask-under-eplb-guard`` form (``sglang_calls.guard_form``), without the plugin,
   put in place on the topk module for the duration;
3. the plugin loaded by SGLang's ``load_plugins()``, then the installed form again;
4. the rebuilt form with the plugin: in a worker subprocess (:mod:`.worker`, started
   first so it runs alongside), which puts the rebuilt function in place before the
   plugin loads and writes its rows to a JSON file.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from sglang_amd_moe.diagnostics.e2e.amd_emulation import hip_router_for
from sglang_amd_moe.diagnostics.e2e.consumer import AiterLikeMoE, ConsumerStats
from sglang_amd_moe.diagnostics.e2e.model import TinyMoE, TinyMoEConfig
from sglang_amd_moe.diagnostics.e2e.results import (
    REL_TOL,
    CheckResult,
    Compare,
    FormInfo,
    RowResult,
    row_from_dict,
)
from sglang_amd_moe.diagnostics.e2e.sglang_calls import (
    GUARD_FORM,
    GuardFormError,
    eager,
    function_in_place,
    guard_form,
    hip_branch,
    import_topk,
    load_plugin,
    make_topk_config,
    route_through_sglang,
)
from sglang_amd_moe.runtime.sglang import ledger
from sglang_amd_moe.runtime.sglang.names import TOPK_MODULE

logger = logging.getLogger(__name__)

#: (real tokens, padded batch): CUDA-graph buckets with 3, 1 and 56 padded rows.
BATCHES: tuple[tuple[int, int], ...] = ((5, 8), (47, 48), (200, 256))
HUGE = 1e30
WORKER_MODULE = "sglang_amd_moe.diagnostics.e2e.worker"
WORKER_TIMEOUT_S = 600


class SGLangUnavailable(RuntimeError):
    """SGLang's topk module cannot be imported here: the check cannot run."""


@dataclass
class Bench:
    """Model, consumer and inputs shared by every run in one process."""

    cfg: TinyMoEConfig
    model: TinyMoE
    consumer: AiterLikeMoE
    device: torch.device
    tokens: dict[int, torch.Tensor]
    refs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    direct: bool = False  # route into _post_process_topk_ids directly (sglang_calls)


def build_bench(device: str) -> Bench:
    cfg = TinyMoEConfig()
    model = TinyMoE(cfg, device)
    g = torch.Generator().manual_seed(cfg.seed + 7)
    tokens = {n: torch.randint(4, cfg.vocab_size, (n,), generator=g) for n, _ in BATCHES}
    return Bench(cfg, model, AiterLikeMoE(cfg, model), model.device, tokens)


def padded_hidden(bench: Bench, n: int, m: int) -> torch.Tensor:
    """Embeddings of the ``n`` real tokens, then ``m - n`` garbage rows: NaN rows and
    rows of +-1e30 (alternating, NaN first)."""
    h = bench.model.embed[bench.tokens[n].to(bench.device)]
    if m == n:
        return h.clone()
    g = torch.Generator().manual_seed(bench.cfg.seed + m)
    garbage = torch.sign(torch.randn(m - n, bench.cfg.hidden, generator=g)) * HUGE
    garbage[0::2] = float("nan")
    return torch.cat([h, garbage.to(bench.device)])


def run_model(bench: Bench, mod: ModuleType, n: int, m: int) -> tuple[torch.Tensor, ConsumerStats]:
    """Run the model on ``n`` real of ``m`` rows through SGLang's ``select_experts``;
    return the final hidden states and the consumer's summed stats."""
    cfg = bench.cfg
    count = torch.tensor([n], dtype=torch.int32, device=bench.device) if m > n else None
    total = ConsumerStats()

    def route(layer: int, h: torch.Tensor, logits: torch.Tensor) -> tuple[Any, Any]:
        router = hip_router_for(mod, cfg, bench.model.bias[layer], seed=1000 * m + layer)
        topk_config = make_topk_config(mod, cfg.top_k, router)
        w, ids, bench.direct = route_through_sglang(
            mod, router, topk_config, h, logits, layer, count, bench.direct
        )
        return w.float(), ids.to(torch.int32)

    def moe(layer: int, h: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out, stats = bench.consumer(layer, h, ids, w)  # as SGLang calls aiter: no count
        total.add(stats)
        return out

    with eager(), hip_branch(mod):
        out = bench.model.forward(padded_hidden(bench, n, m), route, moe)
    return out, total


def compare(got: torch.Tensor, ref: torch.Tensor) -> Compare:
    """The real rows ``got`` of a padded run against the unpadded run ``ref``."""
    finite = torch.isfinite(got) & torch.isfinite(ref)
    diff = (got - ref).abs()
    max_abs = float(diff[finite].max()) if bool(finite.any()) else float("nan")
    scale = float(ref.abs().max())
    max_rel = max_abs / scale if scale > 0 else max_abs
    nan_count = int((~torch.isfinite(got)).sum())
    bad_rows = int((~((got == ref) | (torch.isnan(got) & torch.isnan(ref)))).any(dim=1).sum())
    if torch.equal(got, ref):
        match = "exact"
    elif nan_count == 0 and max_rel <= REL_TOL:
        match = "within 1e-6"
    else:
        match = "MISMATCH"
    return Compare(match, max_abs, max_rel, nan_count, bad_rows)


def reference(bench: Bench, mod: ModuleType, n: int, m: int) -> torch.Tensor:
    if (n, m) not in bench.refs:
        out, stats = run_model(bench, mod, n, n)
        if stats.out_of_range_ids:
            raise RuntimeError("the unpadded reference run saw out-of-range ids")
        bench.refs[(n, m)] = out
    return bench.refs[(n, m)]


def run_form(
    bench: Bench, mod: ModuleType, source: str, form: str, plugin: bool
) -> list[RowResult]:
    rows = []
    for n, m in BATCHES:
        row = RowResult(form, source, n, m, plugin)
        try:
            ref = reference(bench, mod, n, m)
            out, stats = run_model(bench, mod, n, m)
            row.compare = compare(out[:n], ref)
            row.out_of_range_ids = stats.out_of_range_ids
            row.oob_stores, row.oob_reads, row.sorts = (
                stats.oob_stores,
                stats.oob_reads,
                stats.sorts,
            )
        except Exception as exc:  # a crash is a result too: report it, never hide it
            logger.debug("run failed", exc_info=True)
            row.error = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- worker


class Worker:
    """The rebuilt form with the plugin, in a subprocess (``python -m`` :mod:`.worker`),
    started at once so it runs alongside this process; it writes its result to a JSON
    file in a temporary directory this object owns."""

    def __init__(self, device: str) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="sglang-amd-moe-check-")
        self.json_file = Path(self._dir.name) / "rebuilt-with-plugin.json"
        env = dict(os.environ, SGLANG_AMD_MOE_FORCE="1")
        cmd = [
            sys.executable,
            "-m",
            WORKER_MODULE,
            "--device",
            device,
            "--json-file",
            str(self.json_file),
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
        )
        self.stderr = ""

    def result(self) -> dict[str, Any] | None:
        """Wait for the worker; its JSON document, or None when it wrote none."""
        try:
            _, self.stderr = self.proc.communicate(timeout=WORKER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, self.stderr = self.proc.communicate()
        try:
            return json.loads(self.json_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._dir.cleanup()


# ------------------------------------------------------------------------------ check


def run_check(device: str, rebuilt: bool, started: float) -> CheckResult:
    """The whole check (see the module docstring). ``started`` is the
    ``time.monotonic()`` the elapsed time counts from. Raises
    :class:`SGLangUnavailable` when SGLang's topk module does not import."""
    worker = Worker(device) if rebuilt else None
    try:
        return _run_check(device, worker, started)
    finally:
        if worker is not None:
            worker.close()


def _run_check(device: str, worker: Worker | None, started: float) -> CheckResult:
    try:
        mod = import_topk()
    except Exception as exc:
        raise SGLangUnavailable(
            f"cannot import {TOPK_MODULE}: {type(exc).__name__}: {exc}"
        ) from exc
    version = importlib.metadata.version("sglang")
    bench = build_bench(device)
    installed_form = ledger.read(inspect.getsource(mod)).form
    forms = [FormInfo("installed", installed_form)]
    without = run_form(bench, mod, "installed", installed_form, plugin=False)

    rebuilt_info = None
    if worker is not None:
        try:
            fn, src = guard_form(mod)
        except GuardFormError as exc:
            rebuilt_info = FormInfo("rebuilt", GUARD_FORM, note=str(exc), reachable=False)
        else:
            got = ledger.read(src).form
            note = "reconstruction: the installed topk.py with upstream PR 28378 reversed"
            if got != GUARD_FORM:
                note += f"; WARNING: the ledger knows it as {got}"
            rebuilt_info = FormInfo("rebuilt", GUARD_FORM, note=note)
            with function_in_place(mod, fn):
                without += run_form(bench, mod, "rebuilt", GUARD_FORM, plugin=False)
        forms.append(rebuilt_info)

    live, message = load_plugin()
    forms[0].hook_live, forms[0].hook_message = live, message
    with_ = run_form(bench, mod, "installed", installed_form, plugin=True)

    if worker is not None and rebuilt_info is not None:
        payload = worker.result()
        if payload is None:
            tail = "\n".join(worker.stderr.strip().splitlines()[-5:])
            for n, m in BATCHES:
                error = f"worker failed: {tail[-200:]}"
                with_.append(RowResult(GUARD_FORM, "rebuilt", n, m, True, error=error))
        elif payload["reachable"]:
            rebuilt_info.hook_live = payload["hook_live"]
            rebuilt_info.hook_message = payload["hook_message"]
            with_ += [row_from_dict(r) for r in payload["rows"]]

    sorts: dict[str, int] = {}
    for r in without + with_:
        for k, v in r.sorts.items():
            sorts[k] = sorts.get(k, 0) + v
    ok = bool(with_) and all(
        r.compare is not None and r.compare.match in ("exact", "within 1e-6") and not r.error
        for r in with_
    )
    expected = {("installed", n, m) for n, m in BATCHES}
    if rebuilt_info is not None and rebuilt_info.reachable:
        expected |= {("rebuilt", n, m) for n, m in BATCHES}
    ok = ok and expected <= {(r.source, r.real, r.padded) for r in with_}
    verdict = (
        "PASS: every row with the plugin matches"
        if ok
        else "FAIL: a row with the plugin does not match"
    )
    meta = {
        "config": asdict(bench.cfg),
        "device": str(bench.device),
        "sorts": "; ".join(f"{k} x{v}" for k, v in sorted(sorts.items())),
        "direct": bench.direct,
        "verdict": verdict,
        "elapsed_s": time.monotonic() - started,
    }
    return CheckResult(version, forms, without, with_, ok, meta)

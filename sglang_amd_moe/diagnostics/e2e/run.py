"""Every (form, batch) of the check: the model unpadded (the reference) and padded with
garbage rows, through SGLang's real routing and the aiter-like consumer, real rows compared.
The plugin loads once per process and decides from the function running when it loads,
hence the order: the installed and the rebuilt form without it, then the plugin and the
installed form; the rebuilt form with the plugin runs alongside in :mod:`.worker`."""

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
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from subprocess import DEVNULL, PIPE
from types import ModuleType
from typing import Any

import torch

from sglang_amd_moe.diagnostics.e2e import aiter_entry, results
from sglang_amd_moe.diagnostics.e2e import sglang_calls as calls
from sglang_amd_moe.diagnostics.e2e.amd_emulation import hip_router_for
from sglang_amd_moe.diagnostics.e2e.consumer import AiterLikeMoE, ConsumerStats
from sglang_amd_moe.diagnostics.e2e.model import TinyMoE, TinyMoEConfig
from sglang_amd_moe.diagnostics.e2e.results import CheckResult, Compare, FormInfo, RowResult
from sglang_amd_moe.runtime.sglang import ledger
from sglang_amd_moe.runtime.sglang.names import FUNCTION_NAME, TOPK_MODULE

logger = logging.getLogger(__name__)

#: (real tokens, padded batch): CUDA-graph buckets with 3, 1 and 56 padded rows.
BATCHES: tuple[tuple[int, int], ...] = ((5, 8), (47, 48), (200, 256))
HUGE = 1e30
WORKER_TIMEOUT_S = 600
GUARD = calls.GUARD_FORM


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
    """The ``n`` real tokens' embeddings, then ``m - n`` garbage rows: NaN, +-1e30 in turn."""
    h = bench.model.embed[bench.tokens[n].to(bench.device)]
    g = torch.Generator().manual_seed(bench.cfg.seed + m)
    garbage = torch.sign(torch.randn(m - n, bench.cfg.hidden, generator=g)) * HUGE
    garbage[0::2] = float("nan")
    return torch.cat([h, garbage.to(bench.device)])


def run_model(
    bench: Bench, mod: ModuleType, n: int, m: int, entry: ModuleType | None = None
) -> tuple[torch.Tensor, ConsumerStats]:
    """The model on ``n`` real of ``m`` rows through SGLang's ``select_experts``: the final
    hidden states and the consumer's summed stats. ``entry`` (the no-count rows): the batch
    carries no count, and each MoE call goes through that aiter-shaped ``fused_moe``."""
    cfg, total = bench.cfg, ConsumerStats()
    has_count = m > n and entry is None
    count = torch.tensor([n], dtype=torch.int32, device=bench.device) if has_count else None
    # aiter counts its experts from w1's first dimension: only that is read.
    w1 = torch.empty(1, 1, 1, device=bench.device).expand(cfg.num_experts, 1, 1)

    def route(layer: int, h: torch.Tensor, logits: torch.Tensor) -> tuple[Any, Any]:
        router = hip_router_for(mod, cfg, bench.model.bias[layer], seed=1000 * m + layer)
        topk_config = calls.make_topk_config(mod, cfg.top_k, router)
        w, ids, bench.direct = calls.route_through_sglang(
            mod, router, topk_config, h, logits, layer, count, bench.direct
        )
        return w.float(), ids.to(torch.int32)

    def moe(layer: int, h: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if entry is not None:
            entry.layer = layer
            out = entry.fused_moe(h, w1, w1, w, ids)  # as SGLang calls aiter: no count
            total.add(aiter_entry.seen(entry))
            return out
        out, stats = bench.consumer(layer, h, ids, w)  # as SGLang calls aiter: no count
        total.add(stats)
        return out

    with calls.eager(), calls.patched(mod, _is_hip=True, _is_cuda=False):
        return bench.model.forward(padded_hidden(bench, n, m), route, moe), total


def compare(got: torch.Tensor, ref: torch.Tensor) -> Compare:
    """The real rows ``got`` of a padded run against the unpadded run ``ref``."""
    finite = torch.isfinite(got) & torch.isfinite(ref)
    max_abs = float((got - ref).abs()[finite].max()) if bool(finite.any()) else float("nan")
    scale = float(ref.abs().max())
    max_rel = max_abs / scale if scale > 0 else max_abs
    nan_count = int((~torch.isfinite(got)).sum())
    bad_rows = int((~((got == ref) | (torch.isnan(got) & torch.isnan(ref)))).any(dim=1).sum())
    match = "within 1e-6" if nan_count == 0 and max_rel <= results.REL_TOL else "MISMATCH"
    return Compare(
        "exact" if torch.equal(got, ref) else match, max_abs, max_rel, nan_count, bad_rows
    )


def run_form(
    bench: Bench, mod: ModuleType, source: str, form: str, plugin: bool
) -> list[RowResult]:
    rows = []
    for n, m in BATCHES:
        row = RowResult(form, source, n, m, plugin)
        try:
            if (n, m) not in bench.refs:
                ref, stats = run_model(bench, mod, n, n)
                if stats.out_of_range_ids:
                    raise RuntimeError("the unpadded reference run saw out-of-range ids")
                bench.refs[(n, m)] = ref
            out, stats = run_model(bench, mod, n, m)
            row.compare = compare(out[:n], bench.refs[(n, m)])
            row.out_of_range_ids, row.oob_stores = stats.out_of_range_ids, stats.oob_stores
            row.oob_reads, row.sorts = stats.oob_reads, stats.sorts
        except Exception as exc:  # a crash is a result too: report it, never hide it
            logger.debug("run failed", exc_info=True)
            row.error = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return rows


#: The batches of the no-count rows (the two cheapest: 3 and 1 padded rows).
NO_COUNT_BATCHES: tuple[tuple[int, int], ...] = BATCHES[:2]
NO_COUNT = "no-count"  # RowResult.source of those rows
NO_COUNT_FORM = "aiter fused_moe entry"


def run_no_count(bench: Bench, mod: ModuleType, plugin: bool) -> tuple[list[RowResult], str]:
    """The no-count rows: the batch carries no count, so the HIP router's garbage in padded
    rows reaches aiter's entry; with the plugin its guard wraps that entry. Returns the rows
    and the guard's log line (with the plugin)."""
    from sglang_amd_moe.runtime import stats

    entry, note = aiter_entry.make_entry(bench.consumer), ""
    if plugin:
        _, note = aiter_entry.guard(entry)
    rows = []
    for n, m in NO_COUNT_BATCHES:
        row = RowResult(NO_COUNT_FORM, NO_COUNT, n, m, plugin)
        try:
            before = stats.counts().get("guard", {})
            out, seen = run_model(bench, mod, n, m, entry=entry)
            after = stats.counts().get("guard", {})
            row.compare = compare(out[:n], bench.refs[(n, m)])
            row.out_of_range_ids, row.oob_stores = seen.out_of_range_ids, seen.oob_stores
            row.oob_reads, row.sorts = seen.oob_reads, seen.sorts
            if after:
                row.guard = {k: v - before.get(k, 0) for k, v in after.items()}
        except Exception as exc:  # a crash is a result too
            logger.debug("no-count run failed", exc_info=True)
            row.error = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return rows, note


def run_check(device: str, rebuilt: bool, started: float) -> CheckResult:
    """The whole check; ``started``: the ``time.monotonic()`` the elapsed time counts from.
    Raises :class:`SGLangUnavailable` when SGLang's topk module does not import."""
    with tempfile.TemporaryDirectory(prefix="sglang-amd-moe-check-") as tmp:
        out, worker = Path(tmp) / "rebuilt-with-plugin.json", None
        if rebuilt:  # the rebuilt form with the plugin: started now, runs alongside
            env = dict(os.environ, SGLANG_AMD_MOE_FORCE="1")
            cmd = [sys.executable, "-m", "sglang_amd_moe.diagnostics.e2e.worker"]
            cmd += ["--device", device, "--json-file", str(out)]
            worker = subprocess.Popen(cmd, stdout=DEVNULL, stderr=PIPE, text=True, env=env)
        try:
            return _run_check(device, worker, out, started)
        finally:
            if worker is not None and worker.poll() is None:
                worker.kill()
                worker.wait()


def _worker_result(worker: subprocess.Popen, out: Path) -> tuple[dict | None, str]:
    """(the worker's JSON document, or None when it wrote none; its stderr)."""
    try:
        _, stderr = worker.communicate(timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        worker.kill()
        _, stderr = worker.communicate()
    try:
        return json.loads(out.read_text(encoding="utf-8")), stderr
    except (OSError, ValueError):
        return None, stderr


def _run_check(device: str, worker: Any, out: Path, started: float) -> CheckResult:
    try:
        mod = calls.import_topk()
    except Exception as exc:
        why = f"cannot import {TOPK_MODULE}: {type(exc).__name__}: {exc}"
        raise SGLangUnavailable(why) from exc
    bench, form = build_bench(device), ledger.read(inspect.getsource(mod)).form
    forms = [FormInfo("installed", form)]
    without = run_form(bench, mod, "installed", form, plugin=False)
    without += run_no_count(bench, mod, plugin=False)[0]
    rebuilt = None
    if worker is not None:
        try:
            fn, src = calls.guard_form(mod)
        except calls.GuardFormError as exc:
            rebuilt = FormInfo("rebuilt", GUARD, note=str(exc), reachable=False)
        else:
            got = ledger.read(src).form
            warn = "" if got == GUARD else f"; WARNING: the ledger knows it as {got}"
            note = "reconstruction: the installed topk.py with upstream PR 28378 reversed"
            rebuilt = FormInfo("rebuilt", GUARD, note + warn)
            with calls.patched(mod, **{FUNCTION_NAME: fn}):
                without += run_form(bench, mod, "rebuilt", GUARD, plugin=False)
        forms.append(rebuilt)
    forms[0].hook_live, forms[0].hook_message = calls.load_plugin()
    with_ = run_form(bench, mod, "installed", form, plugin=True)
    no_count, guard_note = run_no_count(bench, mod, plugin=True)
    with_ += no_count
    forms.append(FormInfo(NO_COUNT, NO_COUNT_FORM, "no count", bool(guard_note), guard_note))
    payload, stderr = _worker_result(worker, out) if rebuilt is not None else ({}, "")
    if payload is None:
        why = "worker failed: " + "\n".join(stderr.strip().splitlines()[-5:])[-200:]
        with_ += [RowResult(GUARD, "rebuilt", n, m, True, error=why) for n, m in BATCHES]
    elif payload.get("reachable"):
        rebuilt.hook_live, rebuilt.hook_message = payload["hook_live"], payload["hook_message"]
        with_ += [results.row_from_dict(r) for r in payload["rows"]]
    sorts = sum((Counter(r.sorts) for r in without + with_), Counter())
    good = ("exact", "within 1e-6")
    ok = bool(with_) and all(r.compare and r.compare.match in good and not r.error for r in with_)
    sources = ["installed"] + (["rebuilt"] if rebuilt is not None and rebuilt.reachable else [])
    ran = {(r.source, r.real, r.padded) for r in with_}
    ok = ok and all((s, n, m) in ran for s in sources for n, m in BATCHES)
    verdict = "PASS: every row with the plugin matches"
    verdict = verdict if ok else "FAIL: a row with the plugin does not match"
    meta = {"config": asdict(bench.cfg), "device": str(bench.device), "direct": bench.direct}
    meta["sorts"] = "; ".join(f"{k} x{v}" for k, v in sorted(sorts.items()))
    meta |= {"verdict": verdict, "elapsed_s": time.monotonic() - started}
    return CheckResult(importlib.metadata.version("sglang"), forms, without, with_, ok, meta)

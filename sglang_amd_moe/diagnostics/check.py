"""``sglang-amd-moe check``: the padded-batch accuracy regression, end to end, before and after.

Why: the users' symptom was end to end (GSM8K 0.94 -> ~0.1 on AMD): garbage expert ids
in padded CUDA-graph rows reached aiter's MoE kernels and corrupted real tokens. This
command shows the whole path on a small MoE model built in memory
(:mod:`sglang_amd_moe.diagnostics.tiny_moe`), on the CPU by default:

1. Real tokens padded to a CUDA-graph bucket (5 of 8, 47 of 48, 200 of 256); padded rows
   hold garbage activations (NaN rows and rows of +-1e30).
2. Each layer routes through SGLang's real ``select_experts`` and
   ``_post_process_topk_ids`` with the HIP branch forced (``_is_hip=True,
   _is_cuda=False`` on the topk module), ``num_token_non_padded`` set as a CUDA graph
   sets it.
3. An aiter-like consumer sorts (this package's MXFP4 sort), runs the per-expert MLP and
   reduces (:class:`sglang_amd_moe.diagnostics.tiny_moe.AiterLikeMoE`), called the way SGLang calls
   aiter's ``fused_moe`` (no ``num_local_tokens``).
4. The real rows are compared with an unpadded run of the same tokens.

One table row per (SGLang form, batch). The forms: the one installed, and a rebuilt
``mask-under-eplb-guard`` form: a reconstruction made here, from the installed
function, by an AST transform that moves the HIP branch's padded-region mask under the
EPLB remap guard (what upstream main had between PRs 28188 and 28378; never released),
exec'd in the topk module's globals. "Without the plugin" runs in this process before
the plugin loads; "with the plugin" means ``SGLANG_AMD_MOE_FORCE=1`` and SGLang's real
``sglang.srt.plugins.load_plugins()``, which finds this package's entry point. The
rebuilt form is checked with the plugin in a subprocess (the plugin loads once per
process and must see the rebuilt function when it loads).

Exit status 0 only when every row with the plugin matches the unpadded run.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.metadata
import inspect
import json
import linecache
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

from sglang_amd_moe.runtime.astutil import call_name
from sglang_amd_moe.runtime.sglang_forms import (
    FUNCTION_NAME,
    hip_branches,
    predicate_vars,
    refs_predicate,
)

logger = logging.getLogger("sglang_amd_moe")

TOPK_MODULE = "sglang.srt.layers.moe.topk"
FUNCTION = FUNCTION_NAME
BATCHES: tuple[tuple[int, int], ...] = ((5, 8), (47, 48), (200, 256))
HUGE = 1e30
REL_TOL = 1e-6
REBUILT = "mask-under-eplb-guard"


class RebuildError(RuntimeError):
    """The installed function cannot be turned into the mask-under-eplb-guard form."""


# ---------------------------------------------------------------------------- results


@dataclass
class Compare:
    """Real rows of a padded run against the unpadded run of the same tokens."""

    match: str  # "exact", "within 1e-6", "MISMATCH"
    max_abs_err: float  # over entries finite in both (nan if none)
    max_rel_err: float  # max_abs_err / max |reference|
    nan_count: int  # non-finite entries in the padded run's real rows
    bad_rows: int  # real rows not bit-identical to the reference


@dataclass
class RowResult:
    form: str
    source: str  # "installed" or "rebuilt"
    real: int
    padded: int
    plugin: bool
    compare: Compare | None = None
    out_of_range_ids: int = 0
    oob_stores: int = 0
    oob_reads: int = 0
    sorts: dict[str, int] = field(default_factory=dict)
    error: str = ""


@dataclass
class FormInfo:
    source: str
    form: str
    note: str = ""
    hook_live: bool | None = None
    hook_message: str = ""
    reachable: bool = True


# ----------------------------------------------------------------------------- SGLang


def import_topk() -> ModuleType:
    """Import SGLang's topk module (the first SGLang import costs several seconds)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(TOPK_MODULE)


@contextlib.contextmanager
def hip_branch(mod: ModuleType) -> Iterator[None]:
    """Force the HIP branch on the topk module, as the tests do (``_is_hip=True,
    _is_cuda=False``); restore the flags afterwards."""
    saved = {k: getattr(mod, k) for k in ("_is_hip", "_is_cuda") if hasattr(mod, k)}
    mod._is_hip, mod._is_cuda = True, False
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(mod, k, v)


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Run the routers SGLang decorates with ``torch.compile`` eagerly: the same code,
    without a ~17 s inductor compile on a 2-core CPU."""
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True):
        yield


@contextlib.contextmanager
def function_in_place(mod: ModuleType, fn: Callable | None) -> Iterator[None]:
    """Temporarily make ``fn`` the module's ``_post_process_topk_ids`` (``select_experts``
    looks it up in the module globals at call time)."""
    if fn is None:
        yield
        return
    saved = getattr(mod, FUNCTION)
    setattr(mod, FUNCTION, fn)
    try:
        yield
    finally:
        setattr(mod, FUNCTION, saved)


def _calls(node: ast.AST, name: str) -> bool:
    return any(isinstance(sub, ast.Call) and call_name(sub) == name for sub in ast.walk(node))


def rebuild_source(source: str) -> str:
    """Return ``_post_process_topk_ids`` from ``source`` (text of topk.py) with the HIP
    branch's padded-region mask moved to the top of the EPLB remap guard's body.

    This is a reconstruction of upstream main between PRs 28188 and 28378 (never
    released), made on whatever release is installed; tests use the real 0.5.14 source
    with the upstream fix reversed (``tools/compat/reverse_28378_mask_under_eplb_guard.diff``).
    Raises :class:`RebuildError` when the function has no mask outside the guard to move
    (forms ``no-hip-handling``, ``weights-only``, or already ``mask-under-eplb-guard``).
    """
    tree = ast.parse(source)
    fdef = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == FUNCTION), None
    )
    if fdef is None:
        raise RebuildError(f"no {FUNCTION} in topk.py")
    # The main HIP branch, as the classifier reads it.
    hips = hip_branches(fdef)
    if not hips:
        raise RebuildError("the installed function has no `_is_hip` branch: nothing to move")
    hip = hips[0]
    pvars = predicate_vars(fdef)
    guards = [
        s
        for s in hip.body
        if isinstance(s, ast.If)
        and refs_predicate(s.test, pvars)
        and _calls(s, "topk_ids_logical_to_physical")
    ]
    masks = [
        i
        for i, s in enumerate(hip.body)
        if s not in guards and _calls(s, "_mask_topk_ids_padded_region")
    ]
    if not masks:
        if any(_calls(g, "_mask_topk_ids_padded_region") for g in guards):
            raise RebuildError("the installed HIP branch already fills padded ids only under the EPLB guard")
        raise RebuildError("the installed HIP branch never fills padded ids: no mask to move")
    if not guards:
        raise RebuildError("the installed HIP branch has no EPLB-guarded remap to move the mask under")
    guard = guards[0]
    stmts = [hip.body[i] for i in masks]
    for i in reversed(masks):
        del hip.body[i]
    guard.body[:0] = stmts
    return ast.unparse(fdef) + "\n"


def rebuild_function(mod: ModuleType) -> tuple[Callable, str]:
    """Compile :func:`rebuild_source` of the installed topk.py in the module's globals.

    The function is defined in a separate namespace (the module keeps its own), its
    globals are the live module's, and its source is registered in ``linecache`` under
    a ``<...>`` name so ``inspect.getsource`` (which the plugin uses to classify the
    running function) reads the rebuilt text."""
    import __future__

    text = inspect.getsource(mod)
    new_src = rebuild_source(text)
    filename = f"<sglang-amd-moe check: {TOPK_MODULE}.{FUNCTION} rebuilt as {REBUILT}>"
    code = compile(
        new_src, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True
    )
    ns: dict[str, Any] = {}
    exec(code, mod.__dict__, ns)  # noqa: S102 - a transform of the installed function
    linecache.cache[filename] = (len(new_src), None, new_src.splitlines(True), filename)
    return ns[FUNCTION], new_src


def make_topk_config(mod: ModuleType, cfg: Any, router: Callable) -> Any:
    """``TopKConfig`` for the routed experts, built from the fields this release has."""
    fields = set(getattr(mod.TopKConfig, "__dataclass_fields__", {}))
    kwargs: dict[str, Any] = {"top_k": cfg.top_k, "renormalize": True, "custom_routing_function": router}
    return mod.TopKConfig(**{k: v for k, v in kwargs.items() if k in fields or k == "top_k"})


def _call(fn: Callable, **kwargs: Any) -> Any:
    params = inspect.signature(inspect.unwrap(fn)).parameters
    return fn(**{k: v for k, v in kwargs.items() if k in params})


DIRECT_NOTE = (
    "this release's select_experts asserts num_token_non_padded is None with a custom "
    "router, so the router's output goes straight into its _post_process_topk_ids"
)


def route_through_sglang(
    bench: Bench,
    mod: ModuleType,
    router: Callable,
    topk_config: Any,
    h: Any,
    logits: Any,
    layer: int,
    count: Any,
) -> tuple[Any, Any]:
    """Routed experts for one layer: SGLang's ``select_experts`` (with the router as its
    ``custom_routing_function``) and so its ``_post_process_topk_ids``.

    Releases up to 0.5.14 refuse ``num_token_non_padded`` on the custom-router path (an
    assert, before anything runs); there the same router's output is passed to the
    release's ``_post_process_topk_ids`` directly, looked up on the module at call time
    (so a plugin's hook, or the rebuilt form, is what runs)."""
    if not bench.direct:
        try:
            out = _call(
                mod.select_experts,
                hidden_states=h,
                router_logits=logits,
                topk_config=topk_config,
                layer_id=layer,
                num_token_non_padded=count,
            )
            return out[0], out[1]
        except AssertionError as exc:
            if "num_token_non_padded" not in str(exc):
                raise
            bench.direct = True
    w, ids = router(hidden_states=h, gating_output=logits, topk=topk_config.top_k, renormalize=True)
    out = _call(
        getattr(mod, FUNCTION),
        topk_ids=ids,
        topk_weights=w,
        topk_config=topk_config,
        router_logits=logits,
        layer_id=layer,
        num_token_non_padded=count,
        expert_location_dispatch_info=None,
    )
    return out[1], out[0]  # it returns (topk_ids, topk_weights, ...)


# ------------------------------------------------------------------------------- runs


@dataclass
class Bench:
    """Model, consumer and inputs shared by every run in one process."""

    torch: Any
    cfg: Any
    model: Any
    consumer: Any
    device: Any
    tokens: dict[int, Any]
    refs: dict[tuple[int, int], Any] = field(default_factory=dict)
    direct: bool = False  # route into _post_process_topk_ids directly (see DIRECT_NOTE)


def build_bench(device: str) -> Bench:
    import torch

    from sglang_amd_moe.diagnostics.tiny_moe import AiterLikeMoE, TinyMoE, TinyMoEConfig

    cfg = TinyMoEConfig()
    model = TinyMoE(cfg, device)
    g = torch.Generator().manual_seed(cfg.seed + 7)
    tokens = {n: torch.randint(4, cfg.vocab_size, (n,), generator=g) for n, _ in BATCHES}
    return Bench(torch, cfg, model, AiterLikeMoE(cfg, model), model.device, tokens)


def padded_hidden(bench: Bench, n: int, m: int) -> Any:
    """Embeddings of the ``n`` real tokens, then ``m - n`` garbage rows: NaN rows and
    rows of +-1e30 (alternating, NaN first)."""
    torch = bench.torch
    h = bench.model.embed[bench.tokens[n].to(bench.device)]
    if m == n:
        return h.clone()
    g = torch.Generator().manual_seed(bench.cfg.seed + m)
    garbage = torch.sign(torch.randn(m - n, bench.cfg.hidden, generator=g)) * HUGE
    garbage[0::2] = float("nan")
    return torch.cat([h, garbage.to(bench.device)])


def run_model(bench: Bench, mod: ModuleType, n: int, m: int) -> tuple[Any, Any]:
    """Run the model on ``n`` real of ``m`` rows through SGLang's ``select_experts``;
    return the final hidden states and the consumer's summed stats."""
    from sglang_amd_moe.diagnostics.tiny_moe import ConsumerStats, hip_router_for

    torch = bench.torch
    cfg = bench.cfg
    count = torch.tensor([n], dtype=torch.int32, device=bench.device) if m > n else None
    total = ConsumerStats()

    def route(layer: int, h: Any, logits: Any) -> tuple[Any, Any]:
        router = hip_router_for(mod, cfg, bench.model.bias[layer], seed=1000 * m + layer)
        topk_config = make_topk_config(mod, cfg, router)
        w, ids = route_through_sglang(bench, mod, router, topk_config, h, logits, layer, count)
        return w.float(), ids.to(torch.int32)

    def moe(layer: int, h: Any, ids: Any, w: Any) -> Any:
        out, stats = bench.consumer(layer, h, ids, w)  # as SGLang calls aiter: no count
        total.add(stats)
        return out

    with eager(), hip_branch(mod):
        out = bench.model.forward(padded_hidden(bench, n, m), route, moe)
    return out, total


def compare(torch: Any, got: Any, ref: Any) -> Compare:
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


def reference(bench: Bench, mod: ModuleType, n: int, m: int) -> Any:
    if (n, m) not in bench.refs:
        out, stats = run_model(bench, mod, n, n)
        if stats.out_of_range_ids:
            raise RuntimeError("the unpadded reference run saw out-of-range ids")
        bench.refs[(n, m)] = out
    return bench.refs[(n, m)]


def run_form(bench: Bench, mod: ModuleType, source: str, form: str, plugin: bool) -> list[RowResult]:
    rows = []
    for n, m in BATCHES:
        row = RowResult(form, source, n, m, plugin)
        try:
            ref = reference(bench, mod, n, m)
            out, stats = run_model(bench, mod, n, m)
            row.compare = compare(bench.torch, out[:n], ref)
            row.out_of_range_ids = stats.out_of_range_ids
            row.oob_stores, row.oob_reads, row.sorts = stats.oob_stores, stats.oob_reads, stats.sorts
        except Exception as exc:  # a crash is a result too: report it, never hide it
            logger.debug("run failed", exc_info=True)
            row.error = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- plugin


def load_plugin() -> tuple[bool, str]:
    """Load this package's plugin the real way: ``SGLANG_AMD_MOE_FORCE=1`` and SGLang's
    ``load_plugins()``. Returns (hook live, what happened)."""
    os.environ["SGLANG_AMD_MOE_FORCE"] = "1"
    try:
        from sglang.srt.plugins import load_plugins
    except ImportError:
        # SGLang 0.5.10 and earlier: no plugin loader; call our entry point directly.
        from sglang_amd_moe.runtime import plugin

        plugin.register()
        how = "no sglang.srt.plugins in this release: called sglang_amd_moe.runtime.plugin.register()"
    else:
        load_plugins()
        how = "sglang.srt.plugins.load_plugins()"
    try:
        from sglang_amd_moe.runtime import sglang_hook
    except ImportError as exc:
        return False, f"{how}; sglang_amd_moe.runtime.sglang_hook unavailable ({exc})"
    live = bool(sglang_hook.is_live())
    state = sglang_hook.status() if hasattr(sglang_hook, "status") else None
    message = getattr(state, "message", "") if state is not None else ""
    if state is None:
        message = "the plugin did not run (not discovered? SGLANG_PLUGINS excludes it?)"
    return live, f"{how}: {message}"


# ----------------------------------------------------------------------------- worker


def worker_rebuilt_with_plugin(device: str) -> dict[str, Any]:
    """Subprocess body: put the rebuilt function in place, load the plugin, run."""
    mod = import_topk()
    try:
        fn, _ = rebuild_function(mod)
    except RebuildError as exc:
        return {"reachable": False, "note": str(exc), "rows": []}
    setattr(mod, FUNCTION, fn)
    # topk is imported and the rebuilt function is the running one: the plugin classifies
    # the running function (not the installed file, whose form is `fixed`).
    live, message = load_plugin()
    bench = build_bench(device)
    rows = run_form(bench, mod, "rebuilt", REBUILT, plugin=True)
    return {
        "reachable": True,
        "hook_live": live,
        "hook_message": message,
        "direct": bench.direct,
        "rows": [asdict(r) for r in rows],
    }


def _row_from_dict(d: dict[str, Any]) -> RowResult:
    cmp = d.pop("compare", None)
    row = RowResult(**d)
    row.compare = Compare(**cmp) if cmp else None
    return row


def start_worker(device: str) -> subprocess.Popen:
    env = dict(os.environ, SGLANG_AMD_MOE_FORCE="1")
    cmd = [sys.executable, "-m", "sglang_amd_moe.diagnostics.check", "--worker", "rebuilt-plugin", "--device", device]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


# ------------------------------------------------------------------------------ table


def _fmt_err(x: float) -> str:
    if x != x:
        return "nan"
    return "0" if x == 0 else f"{x:.3g}"


def render(
    version: str,
    forms: list[FormInfo],
    without: list[RowResult],
    with_: list[RowResult],
    meta: dict[str, Any],
) -> str:
    lines = []
    c = meta["config"]
    lines.append(
        f"sglang-amd-moe check: tiny MoE, seed {c['seed']}: {c['layers']} MoE layers, hidden {c['hidden']}, "
        f"{c['routed_experts']} routed + {c['shared_experts']} shared experts, top-{c['top_k']}, "
        f"{c['n_group']} groups / top-{c['topk_group']} (DeepSeek grouped router), fp32 on {meta['device']}"
    )
    lines.append(
        f"SGLang {version}: real select_experts/{FUNCTION}, topk module forced to _is_hip=True, _is_cuda=False"
    )
    lines.append("padded rows: NaN rows and +-1e30 rows; NaN rows get stale-LDS ids from the HIP router (emulated)")
    lines.append(
        "routing: " + (DIRECT_NOTE if meta["direct"] else "select_experts(custom_routing_function=the HIP router)")
    )
    lines.append("consumer: aiter-like, called as SGLang calls aiter fused_moe (no num_local_tokens)")
    lines.append("sorts that ran: " + meta["sorts"])
    for f in forms:
        extra = f" ({f.note})" if f.note else ""
        lines.append(f"form {f.source}: {f.form}{extra}")
        if f.hook_message:
            lines.append(f"  plugin: hook live={f.hook_live}; {f.hook_message}")
    lines.append("")
    head = (
        f"{'SGLang form':<32} {'batch':>10} | {'WITHOUT plugin: max abs err':>27} {'NaN':>6} "
        f"{'bad rows':>9} {'out-of-range ids':>16} | WITH plugin vs unpadded run"
    )
    lines.append(head)
    lines.append("-" * len(head) + "-" * 24)
    by_key = {(r.source, r.real, r.padded): r for r in with_}
    for r in without:
        label = f"{r.source}: {r.form}"
        batch = f"{r.real} of {r.padded}"
        if r.error:
            left = f"{'error: ' + r.error[:60]:>70}"
        else:
            cmp = r.compare
            left = (
                f"{_fmt_err(cmp.max_abs_err):>27} {cmp.nan_count:>6} {cmp.bad_rows:>5}/{r.real:<3} "
                f"{r.out_of_range_ids:>16}"
            )
        w = by_key.get((r.source, r.real, r.padded))
        if w is None:
            right = "not run"
        elif w.error:
            right = f"error: {w.error[:60]}"
        else:
            wc = w.compare
            right = wc.match
            if wc.match == "within 1e-6":
                right += f" (max rel {wc.max_rel_err:.2g}; summation order differs)"
            elif wc.match == "MISMATCH":
                right += f" (max abs {_fmt_err(wc.max_abs_err)}, NaN {wc.nan_count}, ids seen {w.out_of_range_ids})"
        lines.append(f"{label:<32} {batch:>10} | {left} | {right}")
    for f in forms:
        if not f.reachable:
            lines.append(f"{f.source + ': ' + f.form:<32} {'':>10} | not reachable here: {f.note}")
    lines.append("")
    if forms and forms[0].form == "fixed":
        lines.append(
            "installed form `fixed`: upstream already masks padded ids on HIP, so without the plugin it "
            "already matches; the bug shows on the rebuilt form here, and on the installed form in an "
            "older release's environment (e.g. .compat/0.5.13.post1/bin/python -m sglang_amd_moe check)"
        )
    lines.append(
        "without plugin: real rows only; max abs err over entries finite in both runs, NaN = non-finite "
        "entries, bad rows = rows not bit-identical, out-of-range ids = ids outside [0, NE) read by the "
        "consumer's sort (all layers)"
    )
    lines.append(
        "  out-of-range ids are sorted by an emulation of aiter's pre-fix HIP sort (tiny_moe.legacy_hip_sort): "
        "the device behaviour is undefined"
    )
    lines.append("with plugin: exact = bit-identical to the unpadded run; within 1e-6 = max|diff| <= 1e-6 * max|ref|")
    lines.append(f"result: {meta['verdict']}  ({meta['elapsed_s']:.1f} s)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------- main


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="sglang-amd-moe check",
        description="Padded-batch end-to-end check on a small MoE model, without and with the plugin.",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("--json-file", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument(
        "--write-checkpoint",
        metavar="DIR",
        help="write the check's model as a DeepSeek-V3 Hugging Face checkpoint (config, "
        "safetensors, local tokenizer) into DIR and exit",
    )
    p.add_argument("--no-rebuilt", action="store_true", help="skip the rebuilt mask-under-eplb-guard form")
    p.add_argument("--worker", choices=["rebuilt-plugin"], help=argparse.SUPPRESS)
    return p.parse_args(argv)


def use_triton_interpreter(device: str) -> None:
    """On the CPU, run this package's Triton kernels through Triton's interpreter (the same
    kernel source as on a GPU; it adds about 2 s here) unless ``TRITON_INTERPRET`` is set
    already (``TRITON_INTERPRET=0`` selects the kernels' torch-reference fallback). It only
    takes effect before the first ``import triton``; the table says which ran."""
    if not device.startswith("cuda"):
        os.environ.setdefault("TRITON_INTERPRET", "1")


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    use_triton_interpreter(args.device)
    if args.write_checkpoint:
        from sglang_amd_moe.diagnostics.tiny_moe import TinyMoE, TinyMoEConfig

        files = write_checkpoint_dir(TinyMoE(TinyMoEConfig()), args.write_checkpoint)
        for f in files:
            print(f)
        return 0
    if args.worker == "rebuilt-plugin":
        result = worker_rebuilt_with_plugin(args.device)
        print("SGLANG_AMD_MOE_CHECK_RESULT " + json.dumps(result))
        return 0
    return _check(args)


def write_checkpoint_dir(model: Any, out: str) -> list[Any]:
    from sglang_amd_moe.diagnostics.tiny_moe import write_checkpoint

    return write_checkpoint(model, out)


def _check(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print("sglang-amd-moe check: --device cuda but torch sees no GPU", file=sys.stderr)
            return 2
    worker = None if args.no_rebuilt else start_worker(args.device)
    try:
        return _check_main(args, worker, t0)
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()


def _check_main(args: argparse.Namespace, worker: subprocess.Popen | None, t0: float) -> int:
    from sglang_amd_moe.runtime.sglang_forms import classify_source

    try:
        mod = import_topk()
    except Exception as exc:
        print(f"sglang-amd-moe check: cannot import {TOPK_MODULE}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    version = importlib.metadata.version("sglang")
    bench = build_bench(args.device)
    installed_form = classify_source(inspect.getsource(mod))
    forms = [FormInfo("installed", installed_form)]
    without = run_form(bench, mod, "installed", installed_form, plugin=False)

    rebuilt_info = None
    if not args.no_rebuilt:
        try:
            fn, src = rebuild_function(mod)
        except RebuildError as exc:
            rebuilt_info = FormInfo("rebuilt", REBUILT, note=str(exc), reachable=False)
        else:
            got = classify_source(src)
            note = "reconstruction: the installed function with the HIP mask moved under the EPLB guard (AST)"
            if got != REBUILT:
                note += f"; WARNING: the classifier reads it as {got}"
            rebuilt_info = FormInfo("rebuilt", REBUILT, note=note)
            with function_in_place(mod, fn):
                without += run_form(bench, mod, "rebuilt", REBUILT, plugin=False)
        forms.append(rebuilt_info)

    live, message = load_plugin()
    forms[0].hook_live, forms[0].hook_message = live, message
    with_ = run_form(bench, mod, "installed", installed_form, plugin=True)

    if worker is not None and rebuilt_info is not None:
        try:
            out, err = worker.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            worker.kill()
            out, err = worker.communicate()
        payload = None
        for line in out.splitlines():
            if line.startswith("SGLANG_AMD_MOE_CHECK_RESULT "):
                payload = json.loads(line.split(" ", 1)[1])
        if payload is None:
            tail = "\n".join(err.strip().splitlines()[-5:])
            for n, m in BATCHES:
                with_.append(RowResult(REBUILT, "rebuilt", n, m, True, error=f"worker failed: {tail[-200:]}"))
        elif payload["reachable"]:
            rebuilt_info.hook_live = payload["hook_live"]
            rebuilt_info.hook_message = payload["hook_message"]
            with_ += [_row_from_dict(r) for r in payload["rows"]]

    sorts: dict[str, int] = {}
    for r in without + with_:
        for k, v in r.sorts.items():
            sorts[k] = sorts.get(k, 0) + v
    ok = bool(with_) and all(
        r.compare is not None and r.compare.match in ("exact", "within 1e-6") and not r.error for r in with_
    )
    expected = {("installed", n, m) for n, m in BATCHES}
    if rebuilt_info is not None and rebuilt_info.reachable:
        expected |= {("rebuilt", n, m) for n, m in BATCHES}
    ok = ok and expected <= {(r.source, r.real, r.padded) for r in with_}
    meta = {
        "config": asdict(bench.cfg),
        "device": str(bench.device),
        "sorts": "; ".join(f"{k} x{v}" for k, v in sorted(sorts.items())),
        "direct": bench.direct,
        "verdict": "PASS: every row with the plugin matches" if ok else "FAIL: a row with the plugin does not match",
        "elapsed_s": time.monotonic() - t0,
    }
    doc = {
        "sglang": version,
        "forms": [asdict(f) for f in forms],
        "without_plugin": [asdict(r) for r in without],
        "with_plugin": [asdict(r) for r in with_],
        "ok": ok,
        **meta,
    }
    if args.json_file:
        with open(args.json_file, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(render(version, forms, without, with_, meta))
    return 0 if ok else 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(main())

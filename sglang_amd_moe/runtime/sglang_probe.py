"""Run ``_post_process_topk_ids`` on a tiny CPU batch the way a HIP process runs it.

Why: reading the source (``sglang_forms``) cannot be sure of everything a future
release may write, and a plugin that makes a correct SGLang wrong is worse than none.
So before it hooks, the plugin observes what the installed function does with padded
rows, and hooks only what it sees wrong; and it checks that the hooked call comes out
right before it keeps the hook.

How, without touching the process: the function (and every module-level function of its
module, so helpers that test ``_is_cuda`` too) is re-created over a *copy* of its
module's globals in which

* the platform flags say HIP (``_is_hip`` and the given aliases true; ``_is_cuda``,
  ``_is_npu``, ``_is_xpu``, ``_is_cpu``, ``_is_musa``, ``_is_hpu`` false; ``is_hip()`` and
  friends answer the same);
* the EPLB predicate (upstream's names, renamed ones the classifier found, and the
  server-argument accessors a predicate reads, also through an import inside it) answers
  the scenario's value and counts its reads;
* ``topk_ids_logical_to_physical`` is a recording stand-in: with the probe's dispatch
  info it applies a known rotation (so a second remap shows) and notes whether it was
  handed padded garbage; with ``None`` it returns its input, as upstream's does;
* the routed-experts capturer and the expert-distribution recorder are silent.

Nothing in the module, in ``sys.modules`` or in any other thread's view changes; the
batch lives on the CPU (nothing here touches a GPU; ``touched_cuda`` says whether the
code run did). Two scenarios: EPLB off and on, both with the probe's dispatch info
passed. The result is compared with what a correct release returns: padded rows with
ids in range and weight 0, real rows exactly as given (EPLB off) or remapped exactly
once (EPLB on), weights bit-identical. Never raises.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib.util
import inspect
import linecache
import time
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

FUNCTION_NAME = "_post_process_topk_ids"
REMAP_NAME = "topk_ids_logical_to_physical"

# The batch: 8 rows of which 5 are real, top-4 of 16 experts. Padded rows hold what a
# router can leave there: out of range both ways and -1, with NaN weights.
ROWS, REAL, TOPK, EXPERTS = 8, 5, 4, 16
PAD_IDS = ((9999, -1, 16, 123456), (-1, -1, -1, -1), (16, 17, 9999, -5))
SHIFT = 5  # the probe's placement: logical e lives at physical (e + SHIFT) % EXPERTS

_HIP_TRUE = ("_is_hip",)
_HIP_FALSE = ("_is_cuda", "_is_npu", "_is_xpu", "_is_cpu", "_is_musa", "_is_hpu")
_CALLS_TRUE = ("is_hip", "is_cuda_alike")
_CALLS_FALSE = ("is_cuda", "is_npu", "is_xpu", "is_cpu", "is_musa", "is_hpu")
_PREDICATES = ("_eplb_remap_enabled", "is_expert_remapping_enabled")
_ARGS_ACCESSORS = ("get_global_server_args", "get_server_args", "get_exec")
_ARGS_MODULES = ("sglang.srt.server_args", "sglang.srt.runtime_context")
_SILENT = ("get_global_experts_capturer", "get_global_expert_distribution_recorder")
_EPLB_SETTINGS = ("enable_eplb", "init_expert_location", "ep_num_redundant_experts")


@dataclass(frozen=True)
class Observation:
    """One scenario's run and what it showed."""

    #: ``"eplb-off"`` or ``"eplb-on"``.
    scenario: str
    #: The output is what a correct release returns.
    ok: bool
    #: What was wrong, in words (empty when ``ok``).
    findings: tuple[str, ...] = ()
    #: ``"Type: message"`` when the call raised.
    raised: str = ""
    #: Padded rows' ids are exactly the garbage they came in with.
    pad_ids_untouched: bool = False
    #: Padded rows' ids are all in ``[0, EXPERTS)``.
    pad_ids_in_range: bool = False
    #: Padded rows' weights are all 0.
    pad_weights_zero: bool = False
    #: Real rows' ids: ``"as-given"``, ``"remapped-once"``, ``"remapped-twice"``, ``"other"``.
    real_ids: str = ""
    #: Real rows' weights are bit-identical to the input.
    real_weights_same: bool = False
    #: Calls of the remap with the probe's dispatch info.
    remaps: int = 0
    #: One of those calls was handed padded ids out of range.
    remap_read_garbage: bool = False
    #: Reads of the EPLB predicate (or of the server's EPLB settings).
    predicate_reads: int = 0


@dataclass(frozen=True)
class ProbeResult:
    """What the probe saw. ``ran`` False: it could not run (``why``), decide otherwise."""

    ran: bool
    why: str = ""
    #: Every scenario came out as a correct release's.
    correct: bool = False
    #: The behaviour, named like the forms it matches (``fixed``, ``no-hip-handling``,
    #: ``weights-only``, ``mask-under-eplb-guard``) or ``unknown``; "" when not run.
    behaviour: str = ""
    findings: tuple[str, ...] = ()
    observations: tuple[Observation, ...] = ()
    #: Upstream called the remap with the probe's dispatch info in some scenario.
    upstream_remaps: bool = False
    #: Some code read the EPLB predicate (so the EPLB-on scenario really was one).
    eplb_steered: bool = False
    #: CUDA got initialised while the probe ran (the code run touched the GPU).
    touched_cuda: bool = False
    seconds: float = 0.0

    def summary(self) -> str:
        """One line for logs and the audit."""
        if not self.ran:
            return f"probe not run: {self.why}"
        if self.correct:
            return f"probe: right ({self.seconds * 1e3:.0f} ms)"
        return f"probe: {self.behaviour} ({'; '.join(self.findings[:3])})"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------- stand-ins


class _Record:
    """Counters one scenario's stand-ins write to."""

    def __init__(self, eplb: bool) -> None:
        self.eplb = eplb
        self.remaps = 0
        self.remap_read_garbage = False
        self.predicate_reads = 0


class DispatchInfo:
    """The probe's expert-location dispatch info: a static placement rotating experts
    by ``SHIFT`` (what upstream's ``ExpertLocationDispatchInfo`` carries, as plain
    attributes, so code reading it, or the real remap, works)."""

    def __init__(self, torch: Any) -> None:
        perm = (torch.arange(EXPERTS, dtype=torch.int32) + SHIFT) % EXPERTS
        self.ep_dispatch_algorithm = "static"
        self.partial_logical_to_rank_dispatch_physical_map = perm
        self.partial_logical_to_all_physical_map = perm[:, None].clone()
        self.partial_logical_to_all_physical_map_num_valid = torch.ones(EXPERTS, dtype=torch.int64)
        self.num_physical_experts = EXPERTS
        self.rank_invariant = True


class _EplbArgs:
    """Server arguments as the predicate reads them: the EPLB settings answer the
    scenario (and count), ``.moe`` is itself, anything else comes from the real ones."""

    def __init__(self, record: _Record, real: Callable[[], Any] | None) -> None:
        self._record, self._real = record, real

    def __getattr__(self, name: str) -> Any:
        if name in _EPLB_SETTINGS:
            self._record.predicate_reads += 1
            if name == "enable_eplb":
                return self._record.eplb
            return "trivial" if name == "init_expert_location" else 0
        if name == "moe":
            return self
        if self._real is None:
            raise AttributeError(name)
        return getattr(self._real(), name)


class _Silent:
    """A recorder or capturer that records nothing."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **k: None


class _ModuleView:
    """A module as an import inside the probed code sees it: some names overridden."""

    def __init__(self, module: Any, overrides: Mapping[str, Any]) -> None:
        self._module, self._overrides = module, overrides

    def __getattr__(self, name: str) -> Any:
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._module, name)


@dataclass
class ProbeEnv:
    """What a hook composed with the probed function uses in place of the process's
    own: the platform, the EPLB predicate and the remap of this scenario."""

    is_hip: Callable[[], bool]
    remap_enabled: Callable[[], bool]
    remap: Callable[..., Any]


def _standins(
    torch: Any, record: _Record, info: DispatchInfo, namespace: Mapping[str, Any]
) -> dict[str, Any]:
    perm = info.partial_logical_to_rank_dispatch_physical_map.to(torch.long)

    def remap(topk_ids: Any, dispatch_info: Any = None, *rest: Any, **kw: Any) -> Any:
        if dispatch_info is None:
            return topk_ids  # what upstream's remap does without dispatch info
        if dispatch_info is not info:
            raise RuntimeError("the probe's remap got a dispatch info it did not make")
        record.remaps += 1
        as_long = topk_ids.to(torch.long)
        if bool(((as_long < 0) | (as_long >= EXPERTS)).any()):
            record.remap_read_garbage = True
        return perm[as_long.clamp(0, EXPERTS - 1)].to(topk_ids.dtype)

    def predicate() -> bool:
        record.predicate_reads += 1
        return record.eplb

    out: dict[str, Any] = {REMAP_NAME: remap}
    for name in _PREDICATES:
        out[name] = predicate
    for name in _ARGS_ACCESSORS:
        real = namespace.get(name)
        out[name] = lambda real=real: _EplbArgs(record, real if callable(real) else None)
    for name in _SILENT:
        out[name] = lambda *a, **k: _Silent()
    out["capture_routed_experts_if_allowed"] = lambda *a, **k: None
    return out


def _hip_namespace(
    namespace: Mapping[str, Any],
    standins: Mapping[str, Any],
    hip_flags: Iterable[str],
    predicates: Iterable[str],
) -> dict[str, Any]:
    """A copy of ``namespace`` that says HIP, with the stand-ins, and with its own
    copies of the module's functions bound to it."""
    g = dict(namespace)
    for name in (*_HIP_TRUE, *hip_flags):
        g[name] = True
    for name in _HIP_FALSE:
        if name in g:
            g[name] = False
    for name in _CALLS_TRUE:
        g[name] = lambda *a, **k: True
    for name in _CALLS_FALSE:
        g[name] = lambda *a, **k: False
    g.update(standins)
    pred = standins[_PREDICATES[0]]
    for name in predicates:
        g[name] = pred
    overrides = {n: standins[n] for n in _ARGS_ACCESSORS}
    real_import = builtins.__import__
    package = namespace.get("__package__") or ""

    def probe_import(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        module = real_import(name, globals, locals, fromlist, level)
        if fromlist:
            try:
                full = importlib.util.resolve_name("." * level + name, package) if level else name
            except (ImportError, ValueError):
                full = name
            if full in _ARGS_MODULES:
                return _ModuleView(module, overrides)
        return module

    base = namespace.get("__builtins__", builtins.__dict__)
    g["__builtins__"] = {
        **(base if isinstance(base, dict) else vars(base)),
        "__import__": probe_import,
    }
    for name, value in list(g.items()):
        if (
            isinstance(value, types.FunctionType)
            and value.__globals__ is namespace
            and name not in standins
            and name not in predicates
        ):
            g[name] = rebind(value, g)
    return g


def rebind(fn: types.FunctionType, g: dict[str, Any]) -> types.FunctionType:
    """A copy of ``fn`` whose globals are ``g`` (same code, defaults and closure)."""
    new = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = dict(fn.__kwdefaults__) if fn.__kwdefaults__ else None
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__dict__.update(fn.__dict__)
    return new


# --------------------------------------------------------------------------- probe


Wrap = Callable[[Callable[..., Any], ProbeEnv], Callable[..., Any]]


def probe(
    fn: Callable[..., Any],
    namespace: Mapping[str, Any] | None = None,
    *,
    hip_flags: Iterable[str] = (),
    predicates: Iterable[str] = (),
    wrap: Wrap | None = None,
) -> ProbeResult:
    """Run ``fn`` (upstream's function, unwrapped) as a HIP process would, EPLB off and
    on, and compare with a correct release.

    ``namespace``: the globals to copy (default ``fn.__globals__``). ``hip_flags``:
    module names besides ``_is_hip`` that mean HIP; ``predicates``: module functions
    besides upstream's names that are the EPLB predicate (both as the classifier found
    them). ``wrap(upstream, env)``: a callable to run instead of upstream, composed with
    it (how a hook checks its plan); it gets the scenario's platform, predicate and remap
    in ``env``. Never raises.
    """
    t0 = time.perf_counter()
    try:
        return _probe(fn, namespace, tuple(hip_flags), tuple(predicates), wrap, t0)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a probe must never take its caller down
        return ProbeResult(
            False, f"probe failed: {type(exc).__name__}: {exc}", seconds=time.perf_counter() - t0
        )


def _probe(fn, namespace, hip_flags, predicates, wrap, t0) -> ProbeResult:
    import torch

    if not isinstance(fn, types.FunctionType):
        return ProbeResult(
            False, f"{FUNCTION_NAME} is not a plain Python function ({type(fn).__name__})"
        )
    namespace = fn.__globals__ if namespace is None else namespace
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as exc:
        return ProbeResult(False, f"no signature: {exc}")
    needed = ("topk_ids", "topk_weights", "num_token_non_padded", "expert_location_dispatch_info")
    missing = [p for p in needed if p not in params]
    if missing:
        return ProbeResult(False, f"the function has no parameter {', '.join(missing)}")
    cuda_before = _cuda_initialized(torch)
    info = DispatchInfo(torch)
    observations = []
    for scenario, eplb in (("eplb-off", False), ("eplb-on", True)):
        record = _Record(eplb)
        standins = _standins(torch, record, info, namespace)
        g = _hip_namespace(namespace, standins, hip_flags, predicates)
        hip_fn = rebind(fn, g)
        target = hip_fn
        if wrap is not None:
            env = ProbeEnv(lambda: True, standins[_PREDICATES[0]], standins[REMAP_NAME])
            target = wrap(hip_fn, env)
        observations.append(_run(torch, target, params, namespace, info, record, scenario))
    touched = not cuda_before and _cuda_initialized(torch)
    return _judge(observations, touched, time.perf_counter() - t0)


def _cuda_initialized(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def _batch(torch: Any, namespace: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    gen = torch.Generator().manual_seed(20261130)
    real_ids = torch.randint(0, EXPERTS, (REAL, TOPK), generator=gen, dtype=torch.int32)
    real_w = torch.rand((REAL, TOPK), generator=gen, dtype=torch.float32)
    ids = torch.cat([real_ids, torch.tensor(PAD_IDS, dtype=torch.int32)])
    weights = torch.cat([real_w, torch.full((ROWS - REAL, TOPK), float("nan"))])
    return ids, weights, real_ids, real_w


def _config(namespace: Mapping[str, Any]) -> Any:
    cls = namespace.get("TopKConfig")
    if cls is None:
        raise LookupError("the module has no TopKConfig")
    return cls(top_k=TOPK)


def _run(torch, target, params, namespace, info, record, scenario) -> Observation:
    ids, weights, real_ids, real_w = _batch(torch, namespace)
    kwargs: dict[str, Any] = {
        "topk_ids": ids,
        "topk_weights": weights,
        "num_token_non_padded": torch.tensor([REAL], dtype=torch.int32),
        "expert_location_dispatch_info": info,
    }
    if "topk_config" in params:
        kwargs["topk_config"] = _config(namespace)
    if "router_logits" in params:
        kwargs["router_logits"] = torch.randn(
            (ROWS, EXPERTS), generator=torch.Generator().manual_seed(7)
        )
    if "layer_id" in params:
        kwargs["layer_id"] = 0
    try:
        out = target(**kwargs)
        out_ids, out_w = out[0], out[1]
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - what upstream raised is an observation
        return Observation(
            scenario,
            False,
            (f"{scenario}: raised {type(exc).__name__}: {exc}",),
            f"{type(exc).__name__}: {exc}",
        )
    return _observe(torch, scenario, out_ids, out_w, real_ids, real_w, info, record)


def _observe(torch, scenario, out_ids, out_w, real_ids, real_w, info, record) -> Observation:
    findings: list[str] = []
    if tuple(out_ids.shape) != (ROWS, TOPK) or tuple(out_w.shape) != (ROWS, TOPK):
        findings.append(
            f"{scenario}: output shapes {tuple(out_ids.shape)}/{tuple(out_w.shape)}, "
            f"not {(ROWS, TOPK)}"
        )
        return Observation(
            scenario,
            False,
            tuple(findings),
            remaps=record.remaps,
            predicate_reads=record.predicate_reads,
        )
    ids = out_ids.to(torch.long)
    pad = ids[REAL:]
    pad_untouched = bool((pad == torch.tensor(PAD_IDS)).all())
    pad_in_range = bool(((pad >= 0) & (pad < EXPERTS)).all())
    pad_zero = bool((out_w[REAL:] == 0).all())
    perm = info.partial_logical_to_rank_dispatch_physical_map.to(torch.long)
    given = real_ids.to(torch.long)
    real = ids[:REAL]
    if torch.equal(real, given):
        real_state = "as-given"
    elif torch.equal(real, perm[given]):
        real_state = "remapped-once"
    elif torch.equal(real, perm[perm[given]]):
        real_state = "remapped-twice"
    else:
        real_state = "other"
    w_same = bool(
        torch.equal(out_w[:REAL].contiguous().view(torch.int32), real_w.view(torch.int32))
    )
    want = "remapped-once" if record.eplb else "as-given"
    if not pad_in_range:
        bad = sorted({int(x) for x in pad.flatten().tolist() if not 0 <= x < EXPERTS})[:3]
        findings.append(f"{scenario}: padded ids out of range ({', '.join(map(str, bad))})")
    if not pad_zero:
        vals = sorted({str(float(x)) for x in out_w[REAL:].flatten().tolist() if x != 0})[:2]
        findings.append(f"{scenario}: padded weights not zero ({', '.join(vals)})")
    if real_state != want:
        findings.append(
            f"{scenario}: real rows' ids {real_state.replace('-', ' ')}, "
            f"want {want.replace('-', ' ')}"
        )
    if not w_same:
        findings.append(f"{scenario}: real rows' weights changed")
    if record.remap_read_garbage:
        findings.append(f"{scenario}: the remap read padded ids out of range")
    return Observation(
        scenario,
        not findings,
        tuple(findings),
        pad_ids_untouched=pad_untouched,
        pad_ids_in_range=pad_in_range,
        pad_weights_zero=pad_zero,
        real_ids=real_state,
        real_weights_same=w_same,
        remaps=record.remaps,
        remap_read_garbage=record.remap_read_garbage,
        predicate_reads=record.predicate_reads,
    )


def _judge(obs: list[Observation], touched: bool, seconds: float) -> ProbeResult:
    off, on = obs
    findings = tuple(f for o in obs for f in o.findings)
    if touched:
        findings += ("the code run initialised CUDA",)
    common = {
        "observations": tuple(obs),
        "upstream_remaps": any(o.remaps for o in obs),
        "eplb_steered": on.predicate_reads > 0,
        "touched_cuda": touched,
        "seconds": seconds,
    }
    if off.raised or on.raised:
        return ProbeResult(True, "", False, "unknown", findings, **common)
    if not findings:
        return ProbeResult(True, "", True, "fixed", (), **common)
    untouched_no_remap = all(
        o.pad_ids_untouched and o.real_ids == "as-given" and o.real_weights_same for o in obs
    )
    if untouched_no_remap and not any(o.remaps for o in obs):
        if all(o.pad_weights_zero for o in obs):
            behaviour = "weights-only"
        elif not any(o.pad_weights_zero for o in obs):
            behaviour = "no-hip-handling"
        else:
            behaviour = "unknown"
    elif (
        on.ok
        and off.pad_ids_untouched
        and off.pad_weights_zero
        and off.real_ids == "as-given"
        and off.real_weights_same
    ):
        behaviour = "mask-under-eplb-guard"
    else:
        behaviour = "unknown"
    return ProbeResult(True, "", False, behaviour, findings, **common)


# ------------------------------------------------------------------ entry points


def probe_module(module: Any, **kw: Any) -> ProbeResult:
    """Probe the module's ``_post_process_topk_ids`` under any wrappers (what upstream
    itself does). Never raises."""
    try:
        fn = inspect.unwrap(getattr(module, FUNCTION_NAME))
    except Exception as exc:
        return ProbeResult(False, f"no {FUNCTION_NAME} to probe ({type(exc).__name__}: {exc})")
    return probe(fn, **kw)


def function_from_source(module: Any, source: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    """``_post_process_topk_ids`` as ``source`` (a full topk.py text, e.g. one a patch
    produced) defines it, over a copy of the live ``module``'s globals: the module-level
    statements of ``source`` that differ from the installed file's are run in the copy
    (nothing else; the module itself is not touched). Raises on a source that does not
    compile or binds no such function."""
    installed = inspect.getsource(module)
    tree = ast.parse(source)
    have = {ast.dump(s) for s in ast.parse(installed).body}
    changed = [s for s in tree.body if ast.dump(s) not in have and not isinstance(s, ast.Expr)]
    filename = f"<{getattr(module, '__file__', module.__name__)} as rewritten>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    import __future__

    code = compile(
        ast.Module(body=changed, type_ignores=[]),
        filename,
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    ns = dict(vars(module))
    exec(code, ns)  # noqa: S102 - the rewritten statements, in a copy of the namespace
    fn = ns.get(FUNCTION_NAME)
    if not isinstance(fn, types.FunctionType):
        raise LookupError(f"the source binds no function {FUNCTION_NAME}")
    # The copy's functions still point at the module's globals: rebind them to the copy.
    for name, value in list(ns.items()):
        if isinstance(value, types.FunctionType) and value.__globals__ is vars(module):
            ns[name] = rebind(value, ns)
    return ns[FUNCTION_NAME], ns


def probe_source(module: Any, source: str, **kw: Any) -> ProbeResult:
    """Probe the function a rewritten ``topk.py`` text defines (a patch checked before it
    is offered), against the live module's globals. Never raises."""
    try:
        fn, ns = function_from_source(module, source)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        return ProbeResult(
            False, f"the rewritten source does not load: {type(exc).__name__}: {exc}"
        )
    return probe(fn, ns, **kw)

"""Run ``_post_process_topk_ids`` on a tiny CPU batch the way a HIP process runs it: the
plugin hooks only what it sees wrong, then checks that the hooked call comes out right.

The function (and every module-level function of its module) is re-created over a copy of
its module's globals in which the platform says HIP, the EPLB predicate answers the
scenario, the remap is a stand-in that rotates experts (a second remap shows), recorders
are silent, the backend is not DeepEP and the fused shared-expert append is a torch copy of
upstream's kernel.

This runs upstream's code in the calling process: a server never calls it itself, it asks a
child process (:mod:`sglang_amd_moe.runtime.sglang.child`), which does, and reads its answer.
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import importlib.util
import inspect
import time
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sglang_amd_moe.runtime.sglang import names

# The batch: 8 rows of which 5 are real, top-4 of 16 experts. Padded rows hold what a
# router can leave there: out of range both ways and -1, with NaN weights.
ROWS, REAL, TOPK, EXPERTS = 8, 5, 4, 16
PAD_IDS = ((9999, -1, 16, 123456), (-1, -1, -1, -1), (16, 17, 9999, -5))
SHIFT = 5  # the probe's placement: logical e lives at physical (e + SHIFT) % EXPERTS

#: (name, EPLB on, dispatch info passed, a fused shared expert appended), as servers run.
SCENARIOS = (
    ("eplb-off", False, False, False),
    ("eplb-off+info", False, True, False),
    ("eplb-on", True, True, False),
    ("shared-expert", False, False, True),
)


@dataclass(frozen=True)
class Observation:
    """One scenario's run and what it showed."""

    scenario: str
    ok: bool  # the output is what a correct release returns
    findings: tuple[str, ...] = ()  # what was wrong, in words
    raised: str = ""  # "Type: message" when the call raised
    pad_ids_untouched: bool = False  # padded ids are exactly the garbage they came in with
    pad_weights_zero: bool = False
    real_ids: str = ""  # as-given, remapped-once, remapped-twice or other
    real_weights_same: bool = False  # bit-identical to the input
    remaps: int = 0  # calls of the remap with the probe's dispatch info
    predicate_reads: int = 0  # of the EPLB predicate or of the server's EPLB settings


@dataclass(frozen=True)
class ProbeResult:
    """What the probe saw. ``ran`` False: it could not run (``why``), decide otherwise."""

    ran: bool
    why: str = ""
    correct: bool = False  # every scenario run without raising came out right (EPLB's all)
    behaviour: str = ""  # the form it behaves as, or unknown ("" when not run)
    findings: tuple[str, ...] = ()
    observations: tuple[Observation, ...] = ()
    upstream_remaps: bool = False  # upstream called the remap with the probe's info
    eplb_steered: bool = False  # the EPLB predicate was read (EPLB-on really was on)
    seconds: float = 0.0
    calls: int = 0  # calls of upstream's function

    def summary(self) -> str:
        if not self.ran:
            return f"probe not run: {self.why}"
        if self.correct:
            return f"probe: right ({self.seconds * 1e3:.0f} ms)"
        return f"probe: {self.behaviour} ({'; '.join(self.findings[:3])})"

    def scenario(self, name: str) -> Observation | None:
        return next((o for o in self.observations if o.scenario == name), None)

    @property
    def usable(self) -> bool:
        """It ran and no EPLB scenario raised (a raise on this CPU says nothing of HIP)."""
        return self.ran and not any(
            o.raised for o in self.observations if o.scenario != "shared-expert"
        )

    @property
    def refills_after_append(self) -> bool | None:
        """Padded weights come out 0 after a shared-expert append (None: not seen)."""
        o = self.scenario("shared-expert")
        return None if o is None or o.raised else o.pad_weights_zero

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ProbeResult:
        """The result :meth:`to_json` wrote; raises (KeyError, TypeError, ValueError) on a
        document of another shape."""
        known = {f.name for f in dataclasses.fields(Observation)}
        obs = tuple(
            Observation(**{**{k: v for k, v in o.items() if k in known},
                           "findings": tuple(o.get("findings", ()))})
            for o in doc.get("observations", ())
        )  # fmt: skip
        fields = {f.name for f in dataclasses.fields(cls)} - {"observations", "findings"}
        kw = {k: v for k, v in doc.items() if k in fields}
        if not isinstance(kw.get("ran"), bool):
            raise ValueError("a probe result without 'ran'")
        return cls(**kw, findings=tuple(doc.get("findings", ())), observations=obs)


@dataclass
class _Record:
    """Counters one scenario's stand-ins write to."""

    eplb: bool
    remaps: int = 0
    remap_read_garbage: bool = False
    predicate_reads: int = 0


class DispatchInfo:
    """The probe's expert-location dispatch info: a static placement rotating experts
    by ``SHIFT`` (the fields of upstream's ``ExpertLocationDispatchInfo``)."""

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
        if name in names.EPLB_SETTINGS:
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
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **k: None


class _ModuleView:
    """A module as an import inside the probed code sees it: some names overridden."""

    def __init__(self, module: Any, overrides: Mapping[str, Any]) -> None:
        self._module, self._overrides = module, overrides

    def __getattr__(self, name: str) -> Any:
        return self._overrides[name] if name in self._overrides else getattr(self._module, name)


def fused_append_shared_experts(ids_in, w_in, shared, scale, N=None, num_token_non_padded=None):
    """Upstream's Triton append (``fused_moe_triton_kernels``), in torch: shared expert
    ``N + s`` with weight ``scale`` after every row's routed ones; with a count, padded
    rows get routed ids 0 and every weight 0."""
    import torch

    m, s = ids_in.shape[0], int(shared)
    if s <= 0:
        return ids_in, w_in
    ids = torch.cat([ids_in, (N + torch.arange(s, dtype=ids_in.dtype)).expand(m, s)], dim=1)
    weights = torch.cat([w_in, torch.full((m, s), float(scale))], dim=1)
    if num_token_non_padded is not None:
        pad = torch.arange(m) >= num_token_non_padded.reshape(-1)[0]
        ids[pad, : ids_in.shape[1]] = 0
        weights[pad] = 0.0
    return ids, weights


@dataclass
class ProbeEnv:
    """The platform, EPLB predicate and remap of a scenario, for a hook composed with the
    probed function (in place of the process's own)."""

    is_hip: Callable[[], bool]
    remap_enabled: Callable[[], bool]
    remap: Callable[..., Any]


def _standins(torch: Any, record: _Record, info: DispatchInfo, namespace: Mapping) -> dict:
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

    out: dict[str, Any] = {names.REMAP: remap, names.CAPTURE: lambda *a, **k: None}
    out.update(dict.fromkeys(names.REMAP_PREDICATES, predicate))
    for name in names.ARGS_ACCESSORS:
        real = namespace.get(name)
        out[name] = lambda real=real: _EplbArgs(record, real if callable(real) else None)
    out.update(dict.fromkeys(names.SILENT, lambda *a, **k: _Silent()))
    out.update(dict.fromkeys(names.NOT_DEEPEP, lambda *a, **k: False))
    return out


def _hip_namespace(namespace: Mapping, standins: Mapping, hip_flags, predicates, shared) -> dict:
    """A copy of ``namespace`` (and of its containers) that says HIP, with the stand-ins,
    and with its own copies of the module's functions bound to it."""
    g = {
        k: copy.copy(v) if isinstance(v, dict | list | set) and not k.startswith("__") else v
        for k, v in namespace.items()
    }
    g.update(dict.fromkeys((names.HIP_FLAG, *hip_flags), True))
    g.update({name: False for name in names.NOT_HIP_FLAGS if name in g})
    g.update(dict.fromkeys(names.HIP_CALLS, lambda *a, **k: True))
    g.update(dict.fromkeys(names.NOT_HIP_CALLS, lambda *a, **k: False))
    if shared:
        g[names.USE_AITER] = True  # aiter's fused shared-expert append
    g.update(standins)
    g.update(dict.fromkeys(predicates, standins[names.REMAP_PREDICATES[0]]))
    overrides = {n: standins[n] for n in names.ARGS_ACCESSORS}
    real_import = builtins.__import__
    package = namespace.get("__package__") or ""

    def probe_import(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        if fromlist and "fused_append_shared_experts" in fromlist:
            return types.SimpleNamespace(fused_append_shared_experts=fused_append_shared_experts)
        module = real_import(name, globals, locals, fromlist, level)
        if fromlist:
            try:
                full = importlib.util.resolve_name("." * level + name, package) if level else name
            except (ImportError, ValueError):
                full = name
            if full in names.ARGS_MODULES:
                return _ModuleView(module, overrides)
        return module

    base = namespace.get("__builtins__", builtins.__dict__)
    g["__builtins__"] = {
        **(base if isinstance(base, dict) else vars(base)),
        "__import__": probe_import,
    }
    return rebind_all(g, namespace, skip={*standins, *predicates})


def rebind_all(g: dict[str, Any], namespace: Mapping[str, Any], skip=()) -> dict[str, Any]:
    """``g`` with its functions of ``namespace`` (but those named in ``skip``) bound to it."""
    for name, value in list(g.items()):
        if isinstance(value, types.FunctionType) and value.__globals__ is namespace:
            if name not in skip:
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


Wrap = Callable[[Callable[..., Any], ProbeEnv], Callable[..., Any]]


def probe(
    fn: Callable[..., Any],
    namespace: Mapping[str, Any] | None = None,
    *,
    hip_flags: Iterable[str] = (),
    predicates: Iterable[str] = (),
    wrap: Wrap | None = None,
) -> ProbeResult:
    """Run ``fn`` (upstream's function, unwrapped) as a HIP process would in every
    scenario and compare with a correct release. Never raises. ``hip_flags``,
    ``predicates``: as ``ledger.read`` found them; ``wrap(upstream, env)``: what to run
    instead, composed with upstream (a hook checking its plan)."""
    t0 = time.perf_counter()
    try:
        return _probe(fn, namespace, tuple(hip_flags), tuple(predicates), wrap, t0)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a probe must never take its caller down
        why = f"probe failed: {type(exc).__name__}: {exc}"
        return ProbeResult(False, why, seconds=time.perf_counter() - t0)


def _probe(fn, namespace, hip_flags, predicates, wrap, t0) -> ProbeResult:
    import torch

    if not isinstance(fn, types.FunctionType):
        kind = type(fn).__name__
        return ProbeResult(False, f"{names.FUNCTION_NAME} is not a plain Python function ({kind})")
    namespace = fn.__globals__ if namespace is None else namespace
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as exc:
        return ProbeResult(False, f"no signature: {exc}")
    missing = [p for p in (*names.REQUIRED_PARAMS, names.INFO) if p not in params]
    if missing:
        return ProbeResult(False, f"the function has no parameter {', '.join(missing)}")
    if namespace.get("TopKConfig") is None:
        return ProbeResult(False, "the module has no TopKConfig")
    gen = torch.Generator().manual_seed(20261130)
    batch = (
        torch.randint(0, EXPERTS, (REAL, TOPK), generator=gen, dtype=torch.int32),
        torch.rand((REAL, TOPK), generator=gen, dtype=torch.float32),
    )
    observations: list[Observation] = []
    info = DispatchInfo(torch)
    for scenario, eplb, with_info, shared in SCENARIOS:
        record = _Record(eplb)
        standins = _standins(torch, record, info, namespace)
        g = _hip_namespace(namespace, standins, hip_flags, predicates, shared)
        target = rebind(fn, g)
        if wrap is not None:
            pred, remap = standins[names.REMAP_PREDICATES[0]], standins[names.REMAP]
            target = wrap(target, ProbeEnv(lambda: True, pred, remap))
        args = (namespace, record, scenario, shared, batch, info if with_info else None)
        observations.append(_run(torch, target, params, *args))
    common = {"seconds": time.perf_counter() - t0, "calls": len(observations)}
    return dataclasses.replace(_judge(observations), **common)


def _config(namespace: Mapping[str, Any], shared: bool) -> Any:
    """The module's own TopKConfig; with one fused shared expert for ``shared``."""
    cls = namespace["TopKConfig"]
    if not shared:
        return cls(top_k=TOPK)
    fields = getattr(cls, "__dataclass_fields__", {})
    if "num_fused_shared_experts" in fields:
        return cls(top_k=TOPK + 1, num_fused_shared_experts=1)
    default = getattr(fields.get("shared_experts"), "default", None)
    if default is None:
        raise LookupError("TopKConfig has no shared-expert field this probe knows")
    return cls(top_k=TOPK + 1, shared_experts=type(default)(num_fused_shared_experts=1))


def _run(torch, target, params, namespace, record, scenario, shared, batch, info) -> Observation:
    """One scenario's call on the batch (real rows, then padded rows of garbage) and what
    came out; what upstream raised is an observation too."""
    kwargs: dict[str, Any] = {
        "topk_ids": torch.cat([batch[0], torch.tensor(PAD_IDS, dtype=torch.int32)]),
        "topk_weights": torch.cat([batch[1], torch.full((ROWS - REAL, TOPK), float("nan"))]),
        names.COUNT: torch.tensor([REAL], dtype=torch.int32),
        names.INFO: info,
    }
    if "router_logits" in params:
        gen = torch.Generator().manual_seed(7)
        kwargs["router_logits"] = torch.randn((ROWS, EXPERTS), generator=gen)
    if "layer_id" in params:
        kwargs["layer_id"] = 0
    try:
        if "topk_config" in params:  # raises where there is no shared-expert config
            kwargs["topk_config"] = _config(namespace, shared)
        out = target(**kwargs)
        return _observe(torch, record, scenario, shared, batch, out[0], out[1])
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - what upstream raised is an observation
        text = f"{type(exc).__name__}: {exc}"
        return Observation(scenario, False, (f"{scenario}: raised {text}",), text)


def _observe(torch, record, scenario, shared, batch, out_ids, out_w) -> Observation:
    # With a shared expert, upstream appends its column (or leaves it to a caller).
    widths = (TOPK, TOPK + 1) if shared else (TOPK,)
    width = out_ids.shape[-1] if out_ids.ndim == 2 else -1
    counts = {"remaps": record.remaps, "predicate_reads": record.predicate_reads}
    if width not in widths or tuple(out_ids.shape) != tuple(out_w.shape):
        why = f"{scenario}: output shapes {tuple(out_ids.shape)}/{tuple(out_w.shape)}"
        return Observation(scenario, False, (f"{why}, not {(ROWS, width)}",), **counts)
    ids, (real_ids, real_w) = out_ids.to(torch.long), batch
    pad = ids[REAL:]
    pad_untouched = bool((pad[:, :TOPK] == torch.tensor(PAD_IDS)).all())
    pad_zero = bool((out_w[REAL:] == 0).all())
    perm = DispatchInfo(torch).partial_logical_to_rank_dispatch_physical_map.to(torch.long)
    given, real = real_ids.to(torch.long), ids[:REAL, :TOPK]
    states = {"as-given": given, "remapped-once": perm[given], "remapped-twice": perm[perm[given]]}
    real_state = next((k for k, v in states.items() if torch.equal(real, v)), "other")
    routed_w = out_w[:REAL, :TOPK].contiguous()
    w_same = bool(torch.equal(routed_w.view(torch.int32), real_w.view(torch.int32)))
    want = "remapped-once" if record.eplb else "as-given"
    findings: list[str] = []
    if not bool(((pad >= 0) & (pad < EXPERTS + width - TOPK)).all()):  # the shared id included
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
        scenario, not findings, tuple(findings), "", pad_untouched, pad_zero, real_state, w_same,
        **counts,
    )  # fmt: skip


def _judge(obs: list[Observation]) -> ProbeResult:
    eplb = obs[:3]  # the three EPLB scenarios; obs[3] is the shared-expert one
    counted = [o for o in obs if o in eplb or not o.raised]
    findings = tuple(f for o in counted for f in o.findings)
    common = {
        "observations": tuple(obs),
        "upstream_remaps": any(o.remaps for o in obs),
        "eplb_steered": eplb[2].predicate_reads > 0,
    }
    if not findings:
        return ProbeResult(True, "", True, "fixed", (), **common)
    plain = [o.pad_ids_untouched and o.real_ids == "as-given" and o.real_weights_same for o in eplb]
    zeroed = {o.pad_weights_zero for o in eplb}
    behaviour = "unknown"
    if any(o.raised for o in eplb):
        pass
    elif all(plain) and not any(o.remaps for o in eplb) and len(zeroed) == 1:
        behaviour = "weights-only" if zeroed == {True} else "no-hip-handling"
    elif eplb[2].ok and all(plain[:2]) and all(o.pad_weights_zero for o in eplb[:2]):
        behaviour = "mask-under-eplb-guard"
    return ProbeResult(True, "", False, behaviour, findings, **common)

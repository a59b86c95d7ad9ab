"""The SGLang hook: guard ``_post_process_topk_ids`` against garbage ids in padded rows.

Why: with CUDA graphs a decode batch is padded to a captured size; rows at and past
``num_token_non_padded`` hold garbage router output. aiter's MoE kernels cannot take
out-of-range or -1 expert ids, and several SGLang releases hand them over unmasked on
HIP (docs/compat.md). This module wraps the installed function with an AROUND hook,
registered through SGLang's own ``HookRegistry`` (so its propagation to
``from ... import`` copies and its logging apply), and does, around each HIP call, what
its plan says:

1. ``pre_mask``: fill padded ids with 0 and zero their weights before upstream runs (one
   launch of ``sglang_amd_moe.kernels.mask_padded_rows_``), whether or not EPLB is on;
2. the logical-to-physical remap, done once, when a real expert-location map exists:
   ``upstream`` keeps doing it (its own remap is right); ``add``: upstream never remaps
   on HIP, so the hook remaps before it; ``own``: upstream's remap is wrong (an inverted
   EPLB guard, a remap whatever EPLB says, one that reads garbage ids), so upstream gets
   no dispatch info (its remap is then the identity) and the hook remaps itself;
3. ``tail_mask``: re-mask after upstream when its shared-expert append built new tensors
   and upstream does not zero padded weights after it.

How it decides, once per process (``install()``): the form the source reads as
(``sglang_forms``), then what the function does (``sglang_probe`` runs it on a CPU batch
as a HIP process would, EPLB off and on); it hooks only what it sees wrong, and keeps a
plan only if the probe of the hooked call comes out right. Where the file reads ``fixed``
and SGLang's topk module is not imported yet, the file decides (importing it only to
look would cost every process seconds). Shape and behaviour may disagree; behaviour
wins and the log line says so. :func:`decide` is the pure part; :func:`install` applies
it and never raises.

One known difference from a fixed release: where the hook remaps (plans ``add`` and
``own``) it does so before upstream's body, so upstream's routed-experts capturer
(``--enable-return-routed-experts``, which records ids at the top of the function) sees
physical ids when EPLB is on; a fixed release records logical ids there. With ``own``,
upstream's other uses of the dispatch info (the physical expert count of DeepEP's
per-rank shared slots) fall back to the logical count.

The wrapper acts only while the topk module's HIP flag (``_is_hip``, or the name the
module binds to ``is_hip()``) is true at call time; otherwise it calls upstream unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_amd_moe.runtime import env as _env
from sglang_amd_moe.runtime import hook_registry_compat as registry
from sglang_amd_moe.runtime.hookstate import MARK, HookStatus, announce
from sglang_amd_moe.runtime.rebind import rebind_copies
from sglang_amd_moe.runtime.sglang_forms import (
    ACTIONS,
    FUNCTION_NAME,
    REMAP_PREDICATES,
    FormReport,
    analyze_function_source,
    analyze_source,
)
from sglang_amd_moe.runtime.sglang_probe import ProbeEnv, ProbeResult, probe

logger = logging.getLogger("sglang_amd_moe")

#: ``HookStatus.target`` of this hook.
NAME = "sglang"
TOPK_MODULE = "sglang.srt.layers.moe.topk"
TARGET = f"{TOPK_MODULE}.{FUNCTION_NAME}"
_REQUIRED_PARAMS = ("topk_ids", "topk_weights", "num_token_non_padded")
_INFO = "expert_location_dispatch_info"
_REMAP = "topk_ids_logical_to_physical"

__all__ = [
    "Inputs",
    "Plan",
    "Refusal",
    "alternatives",
    "decide",
    "install",
    "is_live",
    "Preview",
    "observe",
    "preview",
    "remap_enabled",
    "status",
    "uninstall",
]


# --- the decision (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What the hook does around each HIP call (decided once, at install)."""

    #: Fill padded ids with 0 and zero their weights before upstream.
    pre_mask: bool
    #: Who remaps logical to physical ids: "upstream", "add" (the hook, before upstream,
    #: which keeps the dispatch info) or "own" (the hook; upstream gets no dispatch info).
    remap: str
    #: Re-mask after upstream when it returned new tensors (a shared-expert append).
    tail_mask: bool
    #: Re-mask after upstream on every call (upstream writes bad padded ids itself).
    post_mask: bool = False
    #: ``SGLANG_AMD_MOE_VERIFY=1``: check padded rows after every call (raises).
    verify: bool = False

    def describe(self, form: str) -> str:
        """The action, in the words the audit and the log line use."""
        if not self.pre_mask and self.remap == "upstream":
            return "not hooked for masking: upstream already masks padded ids on HIP"
        plain = dataclasses.replace(self, verify=False)
        if STANDARD_PLANS.get(form) == plain:
            return ACTIONS[form]
        remap = {
            "upstream": "upstream keeps its remap",
            "add": "gated EPLB remap added before upstream",
            "own": "the EPLB remap owned by the hook (upstream gets no dispatch info)",
        }[self.remap]
        if self.post_mask:
            tail = ", mask padded rows again after upstream"
        else:
            tail = ", re-zero after a shared-expert append" if self.tail_mask else ""
        return (
            f"hooked (mask padded ids to 0 and zero their weights before upstream, {remap}{tail})"
        )


#: The plan each broken form gets when the function cannot be run (nothing observed).
STANDARD_PLANS: dict[str, Plan] = {
    "no-hip-handling": Plan(True, "add", True),
    "weights-only": Plan(True, "add", False),
    "mask-under-eplb-guard": Plan(True, "upstream", False),
    "unknown": Plan(True, "upstream", False),
}


@dataclass(frozen=True)
class Refusal:
    """Why nothing is hooked: ``state`` is ``not-needed``, ``refused`` or ``error``."""

    state: str
    reason: str


@dataclass(frozen=True)
class Inputs:
    """Everything :func:`decide` reads."""

    #: The classifier's reading of the function that runs.
    report: FormReport
    #: What the probe saw it do (None: not run).
    observed: ProbeResult | None
    #: The running function's parameter names (None: no signature).
    params: tuple[str, ...] | None
    #: The topk module has a callable ``topk_ids_logical_to_physical``.
    remap_available: bool = True
    verify: bool = False


def form_of(inputs: Inputs) -> str:
    """The form the decision rests on: the observed behaviour where the probe could
    judge it, else the classifier's reading."""
    if _observed(inputs.observed):
        return inputs.observed.behaviour  # type: ignore[union-attr]
    return inputs.report.form


def _observed(obs: ProbeResult | None) -> bool:
    """The probe ran and nothing raised (a raise on this CPU says nothing about HIP)."""
    return obs is not None and obs.ran and not any(o.raised for o in obs.observations)


def decide(inputs: Inputs) -> Plan | Refusal:
    """The plan for what was read and observed, or why there is none. Pure."""
    params = inputs.params
    if params is None:
        return Refusal("error", "the running function has no signature; SGLang left untouched")
    missing = [p for p in _REQUIRED_PARAMS if p not in params]
    if missing:
        return Refusal("refused", f"signature lacks {', '.join(missing)}; SGLang left untouched")
    obs = inputs.observed
    if _observed(obs):
        plan = _plan_from_behaviour(inputs)
    else:
        plan = _plan_from_form(inputs.report)
    if isinstance(plan, Refusal):
        if plan.state == "not-needed" and inputs.verify:
            return Plan(False, "upstream", False, verify=True)
        return plan
    if plan.remap in ("add", "own"):
        lacks = [] if _INFO in params else [_INFO]
        if not inputs.remap_available:
            lacks.append(f"{_REMAP} (module global)")
        if lacks:
            return Refusal("refused", f"signature lacks {', '.join(lacks)}; SGLang left untouched")
    return dataclasses.replace(plan, verify=inputs.verify)


def alternatives(plan: Plan) -> tuple[Plan, ...]:
    """``plan`` and the more intrusive plans to try, in order, when the probe of the
    hooked call shows it still wrong: the hook owning the remap, masking after upstream
    too, both. Pure."""
    out = [plan]
    if not plan.pre_mask:
        return tuple(out)
    own = dataclasses.replace(plan, remap="own")
    for p in (
        own,
        dataclasses.replace(plan, post_mask=True),
        dataclasses.replace(own, post_mask=True),
    ):
        if p not in out:
            out.append(p)
    return tuple(out)


def _plan_from_form(report: FormReport) -> Plan | Refusal:
    form = report.form
    if form == "fixed":
        return Refusal("not-needed", ACTIONS["fixed"])
    if form == "absent":
        return Refusal("not-needed", ACTIONS["absent"])
    plan = STANDARD_PLANS[form]
    if plan.remap == "add" and report.hip_remaps:
        plan = dataclasses.replace(plan, remap="upstream")
    return plan


def _plan_from_behaviour(inputs: Inputs) -> Plan | Refusal:
    obs, report = inputs.observed, inputs.report
    assert obs is not None  # noqa: S101 - checked by the caller (_observed)
    if obs.correct:
        return Refusal("not-needed", ACTIONS["fixed"])
    off, on = obs.observations
    if not (off.real_weights_same and on.real_weights_same) or off.real_ids == "other":
        why = "; ".join(obs.findings[:3])
        return Refusal(
            "refused",
            f"upstream changes real rows in a way no hook can undo ({why}); SGLang left untouched",
        )
    if off.real_ids == "as-given" and on.real_ids == "remapped-once":
        remap = "upstream"  # its remap is right (a garbage read is cured by the pre-mask)
    elif (
        not obs.upstream_remaps
        and off.real_ids == on.real_ids == "as-given"
        and report.form in ("no-hip-handling", "weights-only")
        and not report.hip_remaps
    ):
        # Nothing remaps on HIP, and the source agrees that no path would: add it.
        remap = "add"
    else:
        # Upstream remaps wrongly, or the probe could not make it remap although the source
        # has a remap (an EPLB predicate it could not steer): the hook owns the remap.
        remap = "own"
    return Plan(True, remap, not report.tail_zeroes_weights)


# --- process state ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    """What the wrapper reads on every call (one object, swapped atomically)."""

    plan: Plan
    module: types.ModuleType
    positions: dict[str, int]
    defaults: dict[str, Any]
    mask: Callable[..., None]
    hip_flags: tuple[str, ...]
    predicates: tuple[str, ...]


@dataclass
class _State:
    #: The last status (None: never installed, or uninstalled).
    status: HookStatus | None = None
    #: What the wrapper runs: the call and the process's environment for it.
    active: tuple[_Call, _LiveEnv] | None = None
    #: (wrapper, original) when the hook wrapped the function itself (no registry, or
    #: the registry had already patched the target).
    direct: tuple[Callable[..., Any], Callable[..., Any]] | None = None
    call_error_logged: bool = False


_state = _State()
_lock = threading.RLock()


# --- public API ------------------------------------------------------------------------


def install() -> HookStatus:
    """Decide from the installed code and hook it if it needs it. Never raises.

    Idempotent and thread-safe: while the hook is live (or registered and waiting for
    ``load_plugins()`` to apply it) a second call, from any thread, changes nothing and
    logs nothing. States: ``off`` (disabled, or not a ROCm process without
    ``SGLANG_AMD_MOE_FORCE=1``), ``not-needed`` (fixed or absent), ``pending``, ``live``,
    ``refused`` (a form no plan makes right, an unknown signature), ``error``.
    """
    with _lock:
        current = status()
        if current is not None and current.hooked and (is_live() or _pending()):
            logger.debug("sglang-amd-moe: SGLang hook already installed; nothing to do")
            return current
        try:
            result = _install_locked()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - never take a server down (SystemExit too)
            logger.debug("sglang-amd-moe: install failed", exc_info=True)
            result = _status(
                "error",
                None,
                f"sglang-amd-moe: hooking {TARGET} failed ({type(exc).__name__}: {exc}); "
                "SGLang left untouched",
            )
        _announce(result)
        return result


def status() -> HookStatus | None:
    """The last decision in this process (None: never installed, or uninstalled). A hook
    that was pending and has been applied since reads ``live``."""
    with _lock:
        st = _state.status
        if st is not None and st.state == "pending" and is_live():
            st = dataclasses.replace(
                st, state="live", detail={**st.detail, "applied": "HookRegistry"}
            )
            _state.status = st
        return st


def is_live() -> bool:
    """True when ``sglang.srt.layers.moe.topk._post_process_topk_ids`` is our wrapper now
    (possibly under other plugins' wrappers). Imports nothing."""
    mod = sys.modules.get(TOPK_MODULE)
    fn = getattr(mod, FUNCTION_NAME, None) if mod is not None else None
    if _find_ours(fn, by_closure=False) is not None:
        return True
    ours = _find_ours(fn, by_closure=True) is not None
    applied = registry.hook_applied(TARGET, _around)
    return ours if applied is None else (ours and applied)


def uninstall() -> None:
    """Put the original function back where the hook can, and forget the decision.

    A wrapper another plugin put on top of ours stays (it holds ours); ours then passes
    every call through unchanged."""
    with _lock:
        mod = sys.modules.get(TOPK_MODULE)
        registry.unregister(TARGET, _around)
        if _state.direct is not None and mod is not None:
            wrapper, original = _state.direct
            if getattr(mod, FUNCTION_NAME, None) is wrapper:
                setattr(mod, FUNCTION_NAME, original)
            rebind_copies(wrapper, original)
        elif mod is not None:
            fn = getattr(mod, FUNCTION_NAME, None)
            if fn is not None and _holds(fn, _around) and hasattr(fn, "__wrapped__"):
                setattr(mod, FUNCTION_NAME, fn.__wrapped__)
                rebind_copies(fn, fn.__wrapped__)
        _state.__init__()  # type: ignore[misc]


def observe() -> ProbeResult | None:
    """What ``_post_process_topk_ids`` does in this process now, run on the probe's CPU
    batch: upstream alone when the hook is not live, the hooked call when it is (None:
    SGLang's topk module is not imported). Never raises; imports nothing."""
    mod = sys.modules.get(TOPK_MODULE)
    live = getattr(mod, FUNCTION_NAME, None) if mod is not None else None
    if live is None:
        return None
    upstream = inspect.unwrap(live)
    with _lock:
        call = _state.active[0] if _state.active is not None and is_live() else None
        flags = call.hip_flags if call else ()
        preds = call.predicates if call else ()
    return probe(
        upstream, hip_flags=flags, predicates=preds, wrap=_wrap_for_probe(call) if call else None
    )


@dataclass(frozen=True)
class Preview:
    """What :func:`install` would decide in this process if the platform allowed it.

    ``status`` is the :class:`HookStatus` install() would return, except that a plan it
    would apply reads ``pending`` with ``detail["preview"]`` True (nothing is applied).
    ``upstream`` is the probe of upstream's function alone, as the decision ran it (None:
    not run, e.g. topk not imported while its file reads fixed: the file decides, as in a
    server process). ``hooked`` is the probe of the plan's hooked call (None: no plan).
    """

    status: HookStatus
    upstream: ProbeResult | None = None
    hooked: ProbeResult | None = None

    @property
    def running(self) -> ProbeResult | None:
        """The probe of what would run: the hooked call where a plan is decided, else
        upstream."""
        return self.hooked if self.status.hooked else self.upstream


def preview() -> Preview:
    """What the hook would do here on a ROCm machine: the path :func:`install` takes
    (read, decide, check the plan's hooked call on the probe batch), ignoring the gate
    (ROCm torch, Triton >= 3.3; ``SGLANG_AMD_MOE_DISABLE`` still turns it off), applying
    nothing.

    Why: off ROCm the hook stays off, yet the audit must say whether what it would do
    there comes out right, with the code installed here. Nothing in SGLang's registry or
    the topk module changes, and the decision is neither kept nor logged (a hooked call
    that fails on the probe batch is logged once, as a live hook's failure is); like install(),
    it imports SGLang's topk module where the decision needs it (and this package's
    kernels where a plan is decided). Never raises."""
    try:
        out = _decide(platform_gate=False)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a preview must never take its caller down
        logger.debug("sglang-amd-moe: preview failed", exc_info=True)
        return Preview(
            _status("error", None, f"sglang-amd-moe: previewing {TARGET} failed ({exc!r})")
        )
    facts, call = out.facts, out.call
    upstream = facts.inputs.observed if facts is not None else None
    if call is None or facts is None:
        assert out.status is not None  # noqa: S101 - an outcome without a call has a status
        return Preview(out.status, upstream)
    checked = facts.checked  # the plan's own check, where the decision ran one
    if checked is None:  # the plan stands unchecked (nothing usable observed): run it now
        checked = probe(
            facts.upstream,
            hip_flags=call.hip_flags,
            predicates=facts.predicates,
            wrap=_wrap_for_probe(call),
        )
    status = _final(facts, "pending", out.form, call.plan.describe(out.form), out.notes)
    status = dataclasses.replace(status, detail={**status.detail, "preview": True})
    return Preview(status, upstream, checked)


# --- statuses --------------------------------------------------------------------------


def _status(state: str, form: str | None, message: str, **detail: Any) -> HookStatus:
    return HookStatus(NAME, state, form, message, detail)


def _announce(new: HookStatus) -> None:
    """Keep ``new`` as this process's status; log it when it says something new."""
    previous, _state.status = _state.status, new
    level = logging.WARNING if new.form in ("absent", "unknown") else None
    announce(logger, new, previous, level=level)


# --- install ---------------------------------------------------------------------------


@dataclass
class _Facts:
    """What :func:`_read` found out about this process's SGLang."""

    head: str  # "sglang-amd-moe: sglang <version> _post_process_topk_ids"
    detail: dict[str, Any]  # HookStatus.detail, filled as the decision goes
    file_report: FormReport
    module: types.ModuleType
    live: Callable[..., Any]  # what the module binds now (wrappers included)
    upstream: Callable[..., Any]  # under every wrapper
    inputs: Inputs
    predicates: tuple[str, ...]
    #: The probe of the last hooked call :func:`_checked_call` tried (None: none tried).
    checked: ProbeResult | None = None


@dataclass(frozen=True)
class _Outcome:
    """How a decision ends: a checked plan to apply (``call``), or the status that ends
    it with nothing to apply (``status``), with what was read on the way (``facts``: None
    when it ended before the function was read)."""

    status: HookStatus | None = None
    facts: _Facts | None = None
    call: _Call | None = None
    form: str = ""
    notes: list[str] = field(default_factory=list)


def _decide(*, platform_gate: bool = True) -> _Outcome:
    """Read, decide, and check the plan's hooked call: the path :func:`install` and
    :func:`preview` share. Applies nothing and changes no state of this module."""
    facts = _read(platform_gate=platform_gate)
    if isinstance(facts, HookStatus):
        return _Outcome(facts)
    decision = decide(facts.inputs)
    form = form_of(facts.inputs)
    notes = _notes(facts, form)

    def end(state: str, action: str) -> _Outcome:
        return _Outcome(_final(facts, state, form, action, notes), facts, None, form, notes)

    if isinstance(decision, Refusal):
        facts.detail["plan"] = None
        return end(decision.state, decision.reason)
    try:
        from sglang_amd_moe.kernels import mask_padded_rows_
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        why = f"sglang_amd_moe.kernels.mask_padded_rows_ unavailable ({type(exc).__name__}: {exc})"
        return end("error", f"{why}; SGLang left untouched")
    call = _checked_call(facts, decision, mask_padded_rows_)
    if isinstance(call, str):
        return end("refused", f"refused: no plan makes it right ({call}); SGLang left untouched")
    facts.detail["plan"] = dataclasses.asdict(call.plan)
    return _Outcome(None, facts, call, form, notes)


def _install_locked() -> HookStatus:
    out = _decide()
    if out.call is None or out.facts is None:
        assert out.status is not None  # noqa: S101 - an outcome without a call has a status
        return out.status
    facts, call, notes = out.facts, out.call, out.notes
    _state.active, _state.call_error_logged = (call, _LiveEnv(call)), False
    try:
        how = "already hooked" if is_live() else _apply(facts.module, facts.live)
    except BaseException:
        _state.active = None
        raise
    facts.detail["applied"] = how or "HookRegistry (inside load_plugins)"
    if call.plan.verify:
        notes.append("SGLANG_AMD_MOE_VERIFY=1: padded rows checked after every call")
    if how:
        notes.append(how)
    state = "live" if is_live() else "pending"
    return _final(facts, state, out.form, call.plan.describe(out.form), notes)


def _final(facts: _Facts, state: str, form: str, action: str, notes: list[str]) -> HookStatus:
    return _status(
        state, form, f"{facts.head} form={form} -> {action}{_bracket(notes)}", **facts.detail
    )


def _read(*, platform_gate: bool = True) -> _Facts | HookStatus:
    """Everything the decision rests on, or the status that ends it early (disabled, not
    ROCm unless ``platform_gate`` is False, no SGLang, a file that reads fixed while topk
    is not imported, an import that fails, no function)."""
    if _env.disabled():
        return _status(
            "off", None, "sglang-amd-moe: disabled by SGLANG_AMD_MOE_DISABLE=1; nothing hooked"
        )
    allowed, why = _env.gate()
    if platform_gate and not allowed:
        return _status("off", None, f"sglang-amd-moe: {why}; nothing hooked")
    version, path = _sglang_version(), _topk_path()
    head = f"sglang-amd-moe: sglang {version} {FUNCTION_NAME}"
    detail: dict[str, Any] = {"version": version, "path": str(path) if path else ""}
    if path is None:
        return _status(
            "not-needed",
            "absent",
            f"{head} form=absent -> {TOPK_MODULE} not found; nothing hooked",
            **detail,
        )
    file_text = path.read_text(encoding="utf-8")
    file_report = analyze_source(file_text)
    detail["file"] = _report_detail(file_report)
    verify = _env.verify()
    # Not imported yet: the file decides whether importing it is worth it at all. Already
    # imported: the running function decides, whatever the file says.
    if TOPK_MODULE not in sys.modules and (
        file_report.form == "absent" or (file_report.form == "fixed" and not verify)
    ):
        form = file_report.form
        detail["probe"] = {
            "ran": False,
            "why": "topk is not imported in this process; its file decides",
        }
        where = f" ({path})" if form == "absent" else ""
        return _status(
            "not-needed", form, f"{head} form={form} -> {ACTIONS[form]}{where}", **detail
        )
    try:
        mod = importlib.import_module(TOPK_MODULE)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit from an import included
        form = file_report.form
        text = f"cannot import {TOPK_MODULE} ({type(exc).__name__}: {exc}); SGLang left untouched"
        return _status("error", form, f"{head} form={form} -> {text}", **detail)
    live = getattr(mod, FUNCTION_NAME, None)
    if not callable(live):
        text = (
            f"the imported module has no callable {FUNCTION_NAME} "
            f"(its file {path} has form {file_report.form}); nothing hooked"
        )
        return _status("not-needed", "absent", f"{head} form=absent -> {text}", **detail)
    upstream = inspect.unwrap(live)
    report, live_path = _live_report(upstream, mod, path, file_text, file_report)
    detail["classifier"] = _report_detail(report)
    if live_path and live_path != str(path):
        detail["path"] = live_path
    predicates = tuple(sorted(REMAP_PREDICATES | ({report.remap_predicate} - {""})))
    observed = probe(upstream, hip_flags=report.hip_flags, predicates=predicates)
    detail["probe"] = _probe_detail(observed)
    try:
        params: tuple[str, ...] | None = tuple(inspect.signature(live).parameters)
    except (TypeError, ValueError):
        params = None
    inputs = Inputs(report, observed, params, callable(getattr(mod, _REMAP, None)), verify)
    return _Facts(head, detail, file_report, mod, live, upstream, inputs, predicates)


def _checked_call(facts: _Facts, plan: Plan, mask: Callable[..., None]) -> _Call | str:
    """The call for ``plan``, or for the first of its :func:`alternatives` whose hooked
    call the probe finds right; a string saying what stayed wrong when none is. Without
    a usable observation (the probe could not run it here) the plan stands as decided."""
    flags = facts.inputs.report.hip_flags
    call = _make_call(plan, facts.module, facts.live, mask, flags, facts.predicates)
    if not (_observed(facts.inputs.observed) and plan.pre_mask):
        return call
    tried = []
    for candidate in alternatives(plan):
        call = _make_call(candidate, facts.module, facts.live, mask, flags, facts.predicates)
        checked = probe(
            facts.upstream,
            hip_flags=call.hip_flags,
            predicates=facts.predicates,
            wrap=_wrap_for_probe(call),
        )
        tried.append(_probe_detail(checked))
        facts.detail["probe_hooked"] = tried
        facts.checked = checked
        if checked.correct:
            return call
    return "; ".join(checked.findings[:3]) or checked.why


def _notes(facts: _Facts, form: str) -> list[str]:
    """What the one log line adds in brackets: disagreements and unrecognised code."""
    report, obs = facts.inputs.report, facts.inputs.observed
    live_path, file_report = facts.detail["path"], facts.file_report
    notes = []
    if report.form != file_report.form:
        notes.append(
            f"the running function (from {live_path}) reads as {report.form}, "
            f"its module's file as {file_report.form}"
        )
    if _observed(obs) and obs is not None and obs.behaviour != report.form:
        notes.append(
            f"the source reads as {report.form} ({report.reason}) but running it shows "
            f"{obs.behaviour}: following behaviour"
        )
    elif obs is not None and not _observed(obs):
        notes.append(f"{obs.summary()}; decided from the source")
    if "unknown" in (form, report.form):
        notes.append(
            f"unrecognised function in {live_path} line {report.lineno}, "
            f"sha256 {report.function_sha256}: {report.reason}"
        )
    if _observed(obs) and obs is not None and obs.touched_cuda:
        notes.append("running it initialised CUDA")
    return notes


def _bracket(notes: list[str]) -> str:
    return f" [{'; '.join(notes)}]" if notes else ""


def _report_detail(r: FormReport) -> dict[str, Any]:
    return {
        "form": r.form,
        "reason": r.reason,
        "sha256": r.function_sha256,
        "lineno": r.lineno,
        "binding": r.binding,
    }


def _probe_detail(p: ProbeResult) -> dict[str, Any]:
    """The probe's result without its per-scenario observations."""
    out = {k: v for k, v in dataclasses.asdict(p).items() if k != "observations"}
    out["seconds"] = round(p.seconds, 4)
    return out


def _make_call(
    plan: Plan,
    mod: types.ModuleType,
    live: Callable[..., Any],
    mask: Callable[..., None],
    hip_flags: tuple[str, ...],
    predicates: tuple[str, ...],
) -> _Call:
    positions, defaults = {}, {}
    for i, (name, p) in enumerate(inspect.signature(live).parameters.items()):
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positions[name] = i
        if p.default is not p.empty:
            defaults[name] = p.default
    return _Call(plan, mod, positions, defaults, mask, tuple(hip_flags) or ("_is_hip",), predicates)


def _live_report(
    fn: Callable[..., Any],
    mod: types.ModuleType,
    path: Path,
    file_text: str,
    file_report: FormReport,
) -> tuple[FormReport, str]:
    """The classifier's reading of the function that runs (under any wrappers), with
    its module's flags and helpers; and the file it comes from (``file_text``: the text
    of ``path``, already read)."""
    try:
        lines, first = inspect.getsourcelines(fn)
        where = inspect.getsourcefile(fn) or ""
    except (OSError, TypeError, ValueError):
        return (
            dataclasses.replace(
                file_report, form="unknown", reason="the running function has no source"
            ),
            "",
        )
    # The module context (flags, helpers) is the function's own module's source.
    try:
        module_text = (
            Path(where).read_text(encoding="utf-8") if where and where != str(path) else file_text
        )
    except OSError:
        module_text = ""
    return analyze_function_source("".join(lines), module_text, first), where


def _apply(mod: types.ModuleType, live: Callable[..., Any]) -> str:
    """Put the wrapper in place; return a note for the log line ("" for the normal path)."""
    hook_registry = registry.load()
    if hook_registry is None:
        # SGLang 0.5.10 and earlier: no plugin framework. Do what HookRegistry would do
        # (setattr on the module, then rebind `from ... import` copies).
        _apply_directly(mod, live)
        return "no SGLang plugin framework in this release: patched directly"
    if registry.patched(TARGET, hook_registry) and not registry.registered(
        TARGET, _around, hook_registry
    ):
        # Another plugin's hooks on this target were applied already; the registry would
        # skip ours, so wrap the live function the same way it would.
        _apply_directly(mod, live)
        return "target already patched by another plugin: wrapped on top of it directly"
    registry.register_around(TARGET, _around, hook_registry)
    if registry.inside_load_plugins(hook_registry):
        return ""  # load_plugins() applies every registered hook right after the plugins ran
    registry.apply_hooks(hook_registry)  # called outside load_plugins(): apply now
    fn = getattr(mod, FUNCTION_NAME, None)
    if fn is not None and _holds(fn, _around):
        setattr(fn, MARK, getattr(fn, "__wrapped__", live))
    if not is_live():
        raise RuntimeError(
            "HookRegistry.apply_hooks() did not install the wrapper (see SGLang's log)"
        )
    return "applied through HookRegistry outside load_plugins()"


def _apply_directly(mod: types.ModuleType, original: Callable[..., Any]) -> None:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return _around(original, *args, **kwargs)

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(wrapper, MARK, original)
    setattr(mod, FUNCTION_NAME, wrapper)
    rebind_copies(original, wrapper)  # `from ...topk import` copies, aliases included
    _state.direct = (wrapper, original)


def _pending() -> bool:
    """Our hook is in SGLang's registry but not applied yet (inside ``load_plugins()``)."""
    return registry.pending(TARGET, _around)


def _holds(fn: Any, value: Any) -> bool:
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            if cell.cell_contents is value:
                return True
        except ValueError:
            continue
    return False


def _find_ours(fn: Any, *, by_closure: bool) -> Any | None:
    """Our wrapper in ``fn``'s ``__wrapped__`` chain: one carrying MARK, or (by_closure)
    SGLang's wrapper around ``_around``."""
    for _ in range(32):
        if fn is None:
            return None
        if by_closure and _holds(fn, _around):
            return fn
        if not by_closure and getattr(fn, MARK, None) is not None:
            return fn
        fn = getattr(fn, "__wrapped__", None)
    return None


def _sglang_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def _topk_path() -> Path | None:
    """Where topk.py is, without importing it (the decision for `fixed` needs no import)."""
    mod = sys.modules.get(TOPK_MODULE)
    if mod is not None and getattr(mod, "__file__", None):
        return Path(mod.__file__)
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc) / "srt" / "layers" / "moe" / "topk.py"
        if p.is_file():
            return p
    return None


# --- the call --------------------------------------------------------------------------


def remap_enabled(mod: types.ModuleType | None = None, predicates: tuple[str, ...] = ()) -> bool:
    """Does a real logical-to-physical expert map exist?

    A real map exists when the server enables EPLB, uses a non-trivial initial placement
    or redundant experts. Uses upstream's own predicate when the module has one;
    otherwise reads the server args the way upstream's predicate does. Outside a server
    (no published args) False.
    """
    mod = mod if mod is not None else sys.modules.get(TOPK_MODULE)
    for name in (*predicates, *sorted(REMAP_PREDICATES)):
        fn = getattr(mod, name, None)
        if callable(fn):
            return bool(fn())
    try:
        from sglang.srt.server_args import get_global_server_args
    except ImportError:
        return False
    try:
        args = get_global_server_args()
    except ValueError:  # not set: not inside a server
        return False
    except RuntimeError:  # retired accessor (newer SGLang): read the published bag
        try:
            from sglang.srt.runtime_context import get_exec

            args = get_exec().moe
        except Exception:
            return False
    if args is None:
        return False
    return bool(
        getattr(args, "enable_eplb", False)
        or getattr(args, "init_expert_location", "trivial") != "trivial"
        or (getattr(args, "ep_num_redundant_experts", 0) or 0) > 0
    )


class _LiveEnv:
    """The process's own platform, predicate and remap, read at call time."""

    __slots__ = ("_call",)

    def __init__(self, call: _Call) -> None:
        self._call = call

    def is_hip(self) -> bool:
        mod = self._call.module
        flags = [getattr(mod, name) for name in self._call.hip_flags if hasattr(mod, name)]
        # A module without any of the flags: the plugin only hooks on ROCm, so HIP.
        return any(flags) if flags else True

    def remap_enabled(self) -> bool:
        return remap_enabled(self._call.module, self._call.predicates)

    def remap(self, ids: Any, info: Any) -> Any:
        return getattr(self._call.module, _REMAP)(ids, info)


def _wrap_for_probe(call: _Call) -> Callable[[Callable[..., Any], ProbeEnv], Callable[..., Any]]:
    """How the probe runs the hooked call: this plan around the probe's upstream, with
    the probe's platform, predicate and remap."""

    def wrap(upstream: Callable[..., Any], env: ProbeEnv) -> Callable[..., Any]:
        return lambda *args, **kwargs: _run(call, env, upstream, args, kwargs)

    return wrap


def _get(call: _Call, name: str, args: tuple, kwargs: dict) -> Any:
    if name in kwargs:
        return kwargs[name]
    i = call.positions.get(name)
    if i is not None and i < len(args):
        return args[i]
    return call.defaults.get(name)


def _set(call: _Call, name: str, value: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    i = call.positions.get(name)
    if name not in kwargs and i is not None and i < len(args):
        args = (*args[:i], value, *args[i + 1 :])
    else:
        kwargs = {**kwargs, name: value}
    return args, kwargs


def _around(original_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The AROUND hook (``hook(original_fn, *args, **kwargs)``)."""
    active = _state.active
    if active is None:
        return original_fn(*args, **kwargs)
    return _run(active[0], active[1], original_fn, args, kwargs)


def _run(call: _Call, env: Any, original_fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """One hooked call: the plan around ``original_fn`` (shared by the wrapper and the
    probe of the hooked call)."""
    plan = call.plan
    if not env.is_hip():
        return original_fn(*args, **kwargs)
    n = _get(call, "num_token_non_padded", args, kwargs)
    ids = _get(call, "topk_ids", args, kwargs)
    weights = _get(call, "topk_weights", args, kwargs)
    call_args, call_kwargs = args, kwargs
    try:
        if plan.pre_mask and n is not None:
            call.mask(ids, weights, n, fill_value=0)
        if plan.remap in ("add", "own"):
            info = _get(call, _INFO, args, kwargs)
            if plan.remap == "own":
                call_args, call_kwargs = _set(call, _INFO, None, call_args, call_kwargs)
            if info is not None and env.remap_enabled():
                ids = env.remap(ids, info)
                call_args, call_kwargs = _set(call, "topk_ids", ids, call_args, call_kwargs)
    except Exception:
        _log_call_failure("padded-row guard failed; calling upstream unchanged")
        call_args, call_kwargs = args, kwargs
    out = original_fn(*call_args, **call_kwargs)
    if n is not None and (plan.post_mask or plan.tail_mask):
        try:
            out_ids, out_weights = out[0], out[1]
            # post_mask: on every call. tail_mask: when upstream built new tensors after
            # our pre-mask (a shared-expert append, or a remap).
            if plan.post_mask or out_weights is not weights or out_ids.shape != ids.shape:
                call.mask(out_ids, out_weights, n, fill_value=0)
        except Exception:
            _log_call_failure("padded-row mask after upstream failed; returning upstream's result")
    if plan.verify and n is not None:
        _verify(call, out, n, args, kwargs)  # raises by design: a debugging aid
    return out


def _log_call_failure(text: str) -> None:
    """A failure inside a hooked call: logged with its traceback once per process."""
    if not _state.call_error_logged:
        _state.call_error_logged = True
        logger.exception("sglang-amd-moe: %s", text)


def _verify(call: _Call, out: Any, n: Any, args: tuple, kwargs: dict) -> None:
    """``SGLANG_AMD_MOE_VERIFY=1``: padded rows must have ids in range and zero weights."""
    out_ids, out_weights = out[0], out[1]
    count = int(n.reshape(-1)[0].item()) if hasattr(n, "reshape") else int(n)
    pad_ids, pad_w = out_ids[count:], out_weights[count:]
    if pad_ids.numel() == 0:
        return
    logits = _get(call, "router_logits", args, kwargs)
    info = _get(call, _INFO, args, kwargs)
    cfg = _get(call, "topk_config", args, kwargs)
    num = int(logits.shape[-1]) if logits is not None else 0
    if info is not None:
        num = max(num, int(getattr(info, "num_physical_experts", 0) or 0))
    shared = 0
    for name in ("num_fused_shared_experts", "num_shared_topk_slots"):
        shared = max(shared, int(getattr(cfg, name, 0) or 0))
    bound: int | None = num + shared
    if bound == 0:  # no router logits and no dispatch info: nothing to check ids against
        logger.debug(
            "sglang-amd-moe VERIFY: no expert count known for layer %s; ids not checked",
            _get(call, "layer_id", args, kwargs),
        )
        bound = None
    lo, hi = int(pad_ids.min().item()), int(pad_ids.max().item())
    nonzero = int((pad_w != 0).sum().item())
    if lo < 0 or (bound is not None and hi >= bound) or nonzero:
        layer = _get(call, "layer_id", args, kwargs)
        raise RuntimeError(
            f"sglang-amd-moe VERIFY: layer {layer}: padded rows {count}..{out_ids.shape[0] - 1} "
            f"have ids in [{lo}, {hi}] (allowed [0, {bound})) and {nonzero} nonzero weights"
        )

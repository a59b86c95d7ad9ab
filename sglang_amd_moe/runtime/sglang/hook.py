"""The SGLang hook: padded rows leave ``_post_process_topk_ids`` with id 0 and weight 0.

With CUDA graphs a decode batch is padded to a captured size; rows at and past
``num_token_non_padded`` hold garbage router output, which aiter's MoE kernels cannot
take. Around each HIP call the hook does what its :class:`Plan` says: mask padded rows
before upstream (one launch of ``sglang_amd_moe.kernels.mask_padded_rows_``), do the
EPLB remap itself where upstream's is missing or wrong, and mask again after upstream
where upstream appends a shared expert without re-zeroing padded rows.

It decides once per process from behaviour: the probe runs the installed function on a
CPU batch as a HIP process would (``probe``), the pure :func:`decide` picks the plan, and
the plan is kept only if the probe of the hooked call comes out right. Where SGLang's topk
is not imported and the ledger knows its body as ``fixed``, nothing is imported. The
wrapper is an AROUND hook in SGLang's ``HookRegistry`` (``registry_compat``); it acts only
while the module's HIP flag is true at call time.

Known difference from a fixed release: where the hook remaps (plans ``add`` and ``own``) it
does so before upstream's body, so the routed-experts capturer sees physical ids.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import linecache
import logging
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_amd_moe.runtime import env as _env
from sglang_amd_moe.runtime.sglang import ledger
from sglang_amd_moe.runtime.sglang import registry_compat as registry
from sglang_amd_moe.runtime.sglang.call import (
    Call,
    LiveEnv,
    Plan,
    make_call,
    run,
    wrap_for_probe,
)
from sglang_amd_moe.runtime.sglang.names import (
    ACTIONS,
    FUNCTION_NAME,
    INFO,
    REMAP,
    REQUIRED_PARAMS,
    TARGET,
    TOPK_MODULE,
)
from sglang_amd_moe.runtime.sglang.probe import ProbeResult, probe
from sglang_amd_moe.runtime.target import (
    MARK,
    Gate,
    HookStatus,
    Refusal,
    Target,
    chain,
    closes_over,
    find_marked,
    rebind_copies,
)

logger = logging.getLogger("sglang_amd_moe")

#: ``HookStatus.target`` of this hook.
NAME = "sglang"


# --- the decision (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """Everything :func:`decide` reads."""

    #: The running function's parameter names (None: no signature).
    params: tuple[str, ...] | None
    #: The ledger's entry for the running body (None: the ledger does not know it).
    known: ledger.Entry | None
    #: What the probe saw it do (None: not run).
    observed: ProbeResult | None
    #: A non-CUDA path of the function (or a helper) calls the remap (``ledger.read``).
    remaps_on_hip: bool = True
    #: The topk module has a callable ``topk_ids_logical_to_physical``.
    remap_available: bool = True
    verify: bool = False


def decide(inputs: Inputs) -> Plan | Refusal:
    """The plan for what was observed (else for what the ledger knows), or why there is
    none. Pure."""
    params = inputs.params
    if params is None:
        return Refusal("error", "the running function has no signature; SGLang left untouched")
    missing = [p for p in REQUIRED_PARAMS if p not in params]
    if missing:
        return Refusal("refused", f"signature lacks {', '.join(missing)}; SGLang left untouched")
    obs = inputs.observed
    if obs is not None and obs.usable:
        plan = _plan_from_behaviour(obs, inputs.remaps_on_hip)
    elif inputs.known is not None:
        plan = _plan_from_entry(inputs.known)
    else:
        why = obs.summary() if obs is not None else "not run"
        return Refusal(
            "refused",
            f"the ledger does not know this body and the probe cannot judge it here ({why}); "
            "SGLang left untouched",
        )
    if isinstance(plan, Refusal):
        if plan.state == "not-needed" and inputs.verify:
            return Plan(False, "upstream", False, verify=True)
        return plan
    if plan.remap in ("add", "own"):
        lacks = [] if INFO in params else [INFO]
        if not inputs.remap_available:
            lacks.append(f"{REMAP} (module global)")
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


def _plan_from_entry(entry: ledger.Entry) -> Plan | Refusal:
    if entry.plan is None:
        return Refusal("not-needed", ACTIONS.get(entry.form, ACTIONS["fixed"]))
    return Plan(**entry.plan)


def _plan_from_behaviour(obs: ProbeResult, remaps_on_hip: bool) -> Plan | Refusal:
    if obs.correct:
        return Refusal("not-needed", ACTIONS["fixed"])
    off, off_info, on = obs.observations[:3]
    if not all(o.real_weights_same for o in (off, off_info, on)) or "other" in (
        off.real_ids,
        off_info.real_ids,
    ):
        why = "; ".join(obs.findings[:3])
        return Refusal(
            "refused",
            f"upstream changes real rows in a way no hook can undo ({why}); SGLang left untouched",
        )
    if off.real_ids == off_info.real_ids == "as-given" and on.real_ids == "remapped-once":
        remap = "upstream"  # its remap is right (a garbage read is cured by the pre-mask)
    elif (
        not obs.upstream_remaps
        and all(o.real_ids == "as-given" for o in (off, off_info, on))
        and not remaps_on_hip
    ):
        remap = "add"  # nothing remaps on HIP, and no HIP path of the source could
    else:
        # Upstream remaps wrongly, or the probe could not make it remap although a HIP
        # path calls the remap (a predicate it could not steer): the hook owns the remap.
        remap = "own"
    return Plan(True, remap, obs.refills_after_append is not True)


# --- the wrapper ----------------------------------------------------------------------


def _around(original_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The AROUND hook (``hook(original_fn, *args, **kwargs)``)."""
    active = HOOK.active
    if active is None:
        return original_fn(*args, **kwargs)
    return run(active[0], active[1], original_fn, args, kwargs)


# --- reading and deciding --------------------------------------------------------------


@dataclass
class _Facts:
    """What :meth:`SGLangHook._read` found out about this process's SGLang."""

    head: str  # "sglang-amd-moe: sglang <version> _post_process_topk_ids"
    detail: dict[str, Any]  # HookStatus.detail, filled as the decision goes
    module: types.ModuleType
    live: Callable[..., Any]  # what the module binds now (wrappers included)
    upstream: Callable[..., Any]  # under every wrapper
    reading: ledger.Reading  # the running function, read with its module's text
    inputs: Inputs
    #: The probe of the last hooked call tried (None: none tried).
    checked: ProbeResult | None = None

    @property
    def form(self) -> str:
        return self.reading.form


@dataclass(frozen=True)
class _Outcome:
    """How a decision ends: a checked plan to apply (``call``), or the status that ends
    it (``status``), with what was read on the way (``facts``)."""

    status: HookStatus | None = None
    facts: _Facts | None = None
    call: Call | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Preview:
    """What :meth:`SGLangHook.install` would decide here if the gate were open.

    ``status``: the status install() would return (a plan reads ``pending``, with
    ``detail["preview"]`` True). ``upstream``: the probe of upstream alone (None: not
    run). ``hooked``: the probe of the plan's hooked call (None: no plan).
    """

    status: HookStatus
    upstream: ProbeResult | None = None
    hooked: ProbeResult | None = None

    @property
    def running(self) -> ProbeResult | None:
        return self.hooked if self.status.hooked else self.upstream


def _probe_detail(p: ProbeResult) -> dict[str, Any]:
    """The probe's result without its per-scenario observations."""
    out = {k: v for k, v in dataclasses.asdict(p).items() if k != "observations"}
    out["seconds"] = round(p.seconds, 4)
    return out


def _sglang_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def topk_path() -> Path | None:
    """Where topk.py is, without importing it."""
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


def _running_reading(fn: Any, path: Path, text: str, file_reading: ledger.Reading):
    """The ledger's reading of the function that runs (under any wrappers), with its own
    module's text; and the file it comes from."""
    try:
        lines, first = inspect.getsourcelines(fn)
        where = inspect.getsourcefile(fn) or ""
        if where == str(path):
            module_text = text
        elif Path(where).is_file():
            module_text = Path(where).read_text(encoding="utf-8")
        else:  # a rewritten source registered for inspect (linecache)
            module_text = "".join(linecache.getlines(where)) or text
    except (OSError, TypeError, ValueError):
        unread = dataclasses.replace(file_reading, binding="the running function has no source")
        return dataclasses.replace(unread, fingerprint="", known=None, lineno=0, node=None), ""
    return ledger.read(module_text, "".join(lines), first), where


class SGLangHook(Target):
    """The SGLang target (the module-level functions below are its public surface)."""

    name, what, upstream = NAME, TARGET, "SGLang"

    def __init__(self) -> None:
        super().__init__()
        #: What the wrapper runs: the call and the process's environment for it.
        self.active: tuple[Call, LiveEnv] | None = None
        #: (wrapper, original) when the hook wrapped the function itself.
        self.direct: tuple[Callable[..., Any], Callable[..., Any]] | None = None

    # --- Target ----------------------------------------------------------------------

    def _install(self, gate: Gate) -> HookStatus:
        out = self._decide()
        if out.call is None or out.facts is None:
            assert out.status is not None  # noqa: S101 - an outcome without a call has a status
            return self._announce(out.status)
        facts, call, notes = out.facts, out.call, out.notes
        self.active, self._failures = (call, LiveEnv(call)), set()
        try:
            how = "already hooked" if self.is_live() else self._apply(facts.module, facts.live)
        except BaseException:
            self.active = None
            raise
        facts.detail["applied"] = how or "HookRegistry (inside load_plugins)"
        if call.plan.verify:
            notes.append("SGLANG_AMD_MOE_VERIFY=1: padded rows checked after every call")
        if how:
            notes.append(how)
        state = "live" if self.is_live() else "pending"
        return self._announce(self._final(facts, state, call.plan.describe(facts.form), notes))

    def _still_hooked(self) -> bool:
        return self.is_live() or registry.pending(TARGET, _around)

    def status(self) -> HookStatus | None:
        """The last decision; a hook that was pending and has been applied reads ``live``."""
        with self.lock:
            st = self._status
            if st is not None and st.state == "pending" and self.is_live():
                st = dataclasses.replace(
                    st, state="live", detail={**st.detail, "applied": "HookRegistry"}
                )
                self._status = st
            return st

    def is_live(self) -> bool:
        """``_post_process_topk_ids`` is our wrapper now (possibly under others')."""
        mod = sys.modules.get(TOPK_MODULE)
        fn = getattr(mod, FUNCTION_NAME, None) if mod is not None else None
        if find_marked(fn) is not None:
            return True
        ours = any(closes_over(f, _around) for f in chain(fn))
        applied = registry.hook_applied(TARGET, _around)
        return ours if applied is None else (ours and applied)

    def _undo(self) -> None:
        """The original back where the hook can; a wrapper another plugin put on top of
        ours stays (it holds ours, which then passes every call through)."""
        mod = sys.modules.get(TOPK_MODULE)
        registry.unregister(TARGET, _around)
        if self.direct is not None and mod is not None:
            wrapper, original = self.direct
            if getattr(mod, FUNCTION_NAME, None) is wrapper:
                setattr(mod, FUNCTION_NAME, original)
            rebind_copies(wrapper, original)
        elif mod is not None:
            fn = getattr(mod, FUNCTION_NAME, None)
            if fn is not None and closes_over(fn, _around) and hasattr(fn, "__wrapped__"):
                setattr(mod, FUNCTION_NAME, fn.__wrapped__)
                rebind_copies(fn, fn.__wrapped__)
        self.active, self.direct = None, None

    # --- deciding --------------------------------------------------------------------

    def _announce(self, st: HookStatus) -> HookStatus:
        level = logging.WARNING if st.form in ("absent", "unknown") else None
        return self.record(st, level=level)

    def _final(self, facts: _Facts, state: str, action: str, notes: list[str]) -> HookStatus:
        bracket = f" [{'; '.join(notes)}]" if notes else ""
        text = f"{facts.head} form={facts.form} -> {action}{bracket}"
        return self.make_status(state, facts.form, text, **facts.detail)

    def _read(self) -> _Facts | HookStatus:
        """What the decision rests on, or the status that ends it early (no SGLang, a body
        the ledger knows as fixed while topk is not imported, an import that fails)."""
        version, path = _sglang_version(), topk_path()
        head = f"sglang-amd-moe: sglang {version} {FUNCTION_NAME}"
        detail: dict[str, Any] = {"version": version, "path": str(path) if path else ""}
        if path is None:
            text = f"{head} form=absent -> {TOPK_MODULE} not found; nothing hooked"
            return self.make_status("not-needed", "absent", text, **detail)
        text = path.read_text(encoding="utf-8")
        reading = ledger.read(text)
        detail["file"] = {"form": reading.form, "sha256": reading.fingerprint, "why": reading.why}
        verify = _env.verify()
        # Not imported yet: a body the ledger knows as fixed (or none) needs no import.
        if TOPK_MODULE not in sys.modules and (
            reading.form == "absent" or (reading.form == "fixed" and not verify)
        ):
            form = reading.form
            detail["probe"] = {"ran": False, "why": f"topk is not imported; {reading.why}"}
            where = f" ({path})" if form == "absent" else ""
            status_text = f"{head} form={form} -> {ACTIONS[form]}{where}"
            return self.make_status("not-needed", form, status_text, **detail)
        try:
            mod = importlib.import_module(TOPK_MODULE)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit from an import included
            why = (
                f"cannot import {TOPK_MODULE} ({type(exc).__name__}: {exc}); SGLang left untouched"
            )
            return self.make_status(
                "error", reading.form, f"{head} form={reading.form} -> {why}", **detail
            )
        live = getattr(mod, FUNCTION_NAME, None)
        if not callable(live):
            why = (
                f"the imported module has no callable {FUNCTION_NAME} "
                f"(its file {path} has form {reading.form}); nothing hooked"
            )
            return self.make_status(
                "not-needed", "absent", f"{head} form=absent -> {why}", **detail
            )
        upstream = inspect.unwrap(live)
        running, where = _running_reading(upstream, path, text, reading)
        detail["sha256"], detail["lineno"] = running.fingerprint, running.lineno
        if where and where != str(path):
            detail["path"] = where
        observed = probe(upstream, hip_flags=running.hip_flags, predicates=running.predicates)
        detail["probe"] = _probe_detail(observed)
        try:
            params: tuple[str, ...] | None = tuple(inspect.signature(live).parameters)
        except (TypeError, ValueError):
            params = None
        inputs = Inputs(
            params,
            running.known,
            observed,
            running.remaps_on_hip,
            callable(getattr(mod, REMAP, None)),
            verify,
        )
        return _Facts(head, detail, mod, live, upstream, running, inputs)

    def _notes(self, facts: _Facts) -> list[str]:
        """What the one log line adds in brackets."""
        reading, obs, notes = facts.reading, facts.inputs.observed, []
        shown = obs.behaviour if obs is not None and obs.usable else ""
        if reading.known is None:
            where = facts.detail.get("path", "")
            notes.append(
                f"unrecognised function in {where} line {reading.lineno}, "
                f"sha256 {reading.fingerprint or '-'}: {reading.why}"
                + (f"; running it shows {shown}" if shown else "")
            )
        elif shown and shown != reading.known.form:
            notes.append(
                f"the ledger knows this body as {reading.known.form} but running it shows "
                f"{shown}: following behaviour"
            )
        if obs is not None and not obs.usable:
            notes.append(f"{obs.summary()}; decided from the ledger")
        if obs is not None and obs.usable and obs.touched_cuda:
            notes.append("running it initialised CUDA")
        return notes

    def _decide(self) -> _Outcome:
        """Read, decide, and check the plan's hooked call: what install() and preview()
        share. Applies nothing."""
        facts = self._read()
        if isinstance(facts, HookStatus):
            return _Outcome(facts)
        decision = decide(facts.inputs)
        notes = self._notes(facts)

        def end(state: str, action: str) -> _Outcome:
            return _Outcome(self._final(facts, state, action, notes), facts, None, notes)

        if isinstance(decision, Refusal):
            facts.detail["plan"] = None
            return end(decision.state, decision.reason)
        try:
            from sglang_amd_moe.kernels import mask_padded_rows_
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001
            why = f"this package's kernels do not import ({type(exc).__name__}: {exc})"
            return end("error", f"{why}; SGLang left untouched")
        call = self._checked_call(facts, decision, mask_padded_rows_)
        if isinstance(call, str):
            return end(
                "refused", f"refused: no plan makes it right ({call}); SGLang left untouched"
            )
        facts.detail["plan"] = dataclasses.asdict(call.plan)
        return _Outcome(None, facts, call, notes)

    def _checked_call(self, facts: _Facts, plan: Plan, mask: Callable[..., None]) -> Call | str:
        """The call for ``plan``, or for the first of its :func:`alternatives` whose hooked
        call the probe finds right; what stayed wrong when none is. Without a usable
        observation the plan stands as decided."""
        flags, preds = facts.reading.hip_flags, facts.reading.predicates
        fail = self.log_call_failure
        call = make_call(plan, facts.module, facts.live, mask, flags, preds, fail)
        observed = facts.inputs.observed
        if not (observed is not None and observed.usable and plan.pre_mask):
            return call
        tried = []
        for candidate in alternatives(plan):
            call = make_call(
                candidate, facts.module, facts.live, mask, flags, preds, self.log_call_failure
            )
            checked = probe(
                facts.upstream, hip_flags=flags, predicates=preds, wrap=wrap_for_probe(call)
            )
            tried.append(_probe_detail(checked))
            facts.detail["probe_hooked"] = tried
            facts.checked = checked
            if checked.correct:
                return call
        return "; ".join(checked.findings[:3]) or checked.why

    def _apply(self, mod: types.ModuleType, live: Callable[..., Any]) -> str:
        """Put the wrapper in place; a note for the log line ("" for the normal path)."""
        hook_registry = registry.load()
        if hook_registry is None:
            # SGLang 0.5.10: no plugin framework. Do what HookRegistry would do.
            self._apply_directly(mod, live)
            return "no SGLang plugin framework in this release: patched directly"
        if registry.patched(TARGET, hook_registry) and not registry.registered(
            TARGET, _around, hook_registry
        ):
            # The registry skips hooks registered after it patched a target: wrap on top.
            self._apply_directly(mod, live)
            return "target already patched by another plugin: wrapped on top of it directly"
        registry.register_around(TARGET, _around, hook_registry)
        if registry.inside_load_plugins(hook_registry):
            return ""  # load_plugins() applies every registered hook right after the plugins
        registry.apply_hooks(hook_registry)  # outside load_plugins(): apply now
        fn = getattr(mod, FUNCTION_NAME, None)
        if fn is not None and closes_over(fn, _around):
            setattr(fn, MARK, getattr(fn, "__wrapped__", live))
        if not self.is_live():
            raise RuntimeError("HookRegistry.apply_hooks() did not install the wrapper")
        return "applied through HookRegistry outside load_plugins()"

    def _apply_directly(self, mod: types.ModuleType, original: Callable[..., Any]) -> None:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return _around(original, *args, **kwargs)

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(wrapper, MARK, original)
        setattr(mod, FUNCTION_NAME, wrapper)
        rebind_copies(original, wrapper)  # `from ...topk import` copies, aliases included
        self.direct = (wrapper, original)

    # --- for the audit ---------------------------------------------------------------

    def preview(self) -> Preview:
        """What install() would do here on a ROCm machine (the gate ignored,
        ``SGLANG_AMD_MOE_DISABLE`` still honoured), applying, keeping and logging nothing;
        it imports topk where the decision needs it. Never raises."""
        if _env.disabled():
            off = "sglang-amd-moe: disabled by SGLANG_AMD_MOE_DISABLE=1; nothing hooked"
            return Preview(self.make_status("off", None, off))
        try:
            out = self._decide()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a preview must never take its caller down
            return Preview(self.make_status("error", None, f"previewing {TARGET} failed ({exc!r})"))
        facts, call = out.facts, out.call
        upstream = facts.inputs.observed if facts is not None else None
        if call is None or facts is None:
            assert out.status is not None  # noqa: S101
            return Preview(out.status, upstream)
        checked = facts.checked
        if checked is None:  # the plan stands unchecked: run it now
            flags, preds = facts.reading.hip_flags, facts.reading.predicates
            checked = probe(
                facts.upstream, hip_flags=flags, predicates=preds, wrap=wrap_for_probe(call)
            )
        status = self._final(facts, "pending", call.plan.describe(facts.form), out.notes)
        status = dataclasses.replace(status, detail={**status.detail, "preview": True})
        return Preview(status, upstream, checked)

    def observe(self) -> ProbeResult | None:
        """What the function does here now on the probe's batch: the hooked call where
        the hook is live, upstream otherwise (None: topk not imported). Never raises."""
        mod = sys.modules.get(TOPK_MODULE)
        live = getattr(mod, FUNCTION_NAME, None) if mod is not None else None
        if live is None:
            return None
        upstream = inspect.unwrap(live)
        with self.lock:
            call = self.active[0] if self.active is not None and self.is_live() else None
        if call is None:
            try:
                r = ledger.read(Path(inspect.getsourcefile(upstream) or "").read_text("utf-8"))
            except (OSError, TypeError):
                return probe(upstream)
            return probe(upstream, hip_flags=r.hip_flags, predicates=r.predicates)
        wrap = wrap_for_probe(call)
        return probe(upstream, hip_flags=call.hip_flags, predicates=call.predicates, wrap=wrap)


HOOK = SGLangHook()
install = HOOK.install
status = HOOK.status
is_live = HOOK.is_live
uninstall = HOOK.uninstall
preview = HOOK.preview
observe = HOOK.observe

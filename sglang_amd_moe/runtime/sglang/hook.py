"""The SGLang hook: padded rows leave ``_post_process_topk_ids`` with id 0 and weight 0.

With CUDA graphs a decode batch is padded to a captured size; rows at and past
``num_token_non_padded`` hold garbage router output, which aiter's MoE kernels cannot take.

It decides once per process, and never runs upstream's code to do so. The ledger reads
topk.py's text: a body it knows as fixed needs nothing; any other is decided when topk is
imported, so a process that never imports topk pays only the read. A body the ledger knows
gets the ledger's plan. Where behaviour must decide (a body the ledger does not know,
``SGLANG_AMD_MOE_VERIFY=1``, topk imported before the plugin), a child process runs the
function on a CPU batch as a HIP process would, and the hooked call of each plan it may take
(:mod:`.verdict`, cached on disk); :func:`decide` (pure) picks the plan from what it saw, and
the plan is kept only if its hooked call came out right. Decided inside ``load_plugins()``,
the wrapper is an AROUND hook in SGLang's ``HookRegistry``; else it wraps the function
itself. It acts only while the module's HIP flag is true. Where it remaps, it
does so before upstream's body, so the routed-experts capturer sees physical ids (a fixed
release: logical ones).
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
from typing import TYPE_CHECKING, Any

from sglang_amd_moe.runtime import env as _env
from sglang_amd_moe.runtime.sglang import ledger
from sglang_amd_moe.runtime.sglang import registry_compat as registry
from sglang_amd_moe.runtime.sglang.call import Call, LiveEnv, Plan, kernel_mask, run
from sglang_amd_moe.runtime.sglang.names import (
    ACTIONS,
    FUNCTION_NAME,
    INFO,
    REMAP,
    REQUIRED_PARAMS,
    TARGET,
    TOPK_MODULE,
)
from sglang_amd_moe.runtime.sglang.probe import ProbeResult
from sglang_amd_moe.runtime.target import (
    MARK,
    Args,
    Gate,
    HookStatus,
    Refusal,
    Target,
    closes_over,
    find_marked,
    forget,
    holds,
    params_of,
    rebind_copies,
    watching,
    when_imported,
)

if TYPE_CHECKING:
    from sglang_amd_moe.runtime.sglang.verdict import Verdict

NAME = "sglang"  # HookStatus.target
STRICT = "SGLANG_AMD_MOE_STRICT=1"
STRICT_REFUSAL = f"left to upstream: {STRICT} hooks only bodies the ledger knows"
UNTOUCHED = "SGLang left untouched"
LEDGER_VERDICT = "verdict taken from the ledger (nothing run)"


@dataclass(frozen=True)
class Inputs:
    params: tuple[str, ...] | None  # the running function's parameters (None: no signature)
    known: ledger.Entry | None  # the ledger's entry for the running body
    observed: ProbeResult | None  # what the probe saw (None: not run)
    remaps_on_hip: bool = True  # a non-CUDA path calls the remap (``ledger.read``)
    remap_available: bool = True  # the module has a callable topk_ids_logical_to_physical
    verify: bool = False
    strict: bool = False  # SGLANG_AMD_MOE_STRICT=1: the ledger's plan for its bodies only


def decide(inputs: Inputs) -> Plan | Refusal:
    """The plan for what was observed (else for what the ledger knows), or why not. Pure."""
    params, obs, known = inputs.params, inputs.observed, inputs.known
    if params is None:
        return Refusal("error", f"the running function has no signature; {UNTOUCHED}")
    missing = [p for p in REQUIRED_PARAMS if p not in params]
    if missing:
        return Refusal("refused", f"signature lacks {', '.join(missing)}; {UNTOUCHED}")
    usable = obs is not None and obs.usable
    if inputs.strict and known is None:
        return Refusal("refused", STRICT_REFUSAL)
    if inputs.strict and usable and obs.behaviour != known.form:
        why = f"the ledger knows this body as {known.form} but running it shows {obs.behaviour}"
        return Refusal("refused", f"left to upstream: {STRICT} and {why}")
    if usable and not inputs.strict:
        plan = _plan_from_behaviour(obs, inputs.remaps_on_hip)
    elif known is not None:
        plan = Plan(**known.plan) if known.plan else Refusal("not-needed", ACTIONS["fixed"])
    else:
        why = obs.summary() if obs is not None else "not run"
        why = f"the ledger does not know this body and the probe cannot judge it here ({why})"
        return Refusal("refused", f"{why}; {UNTOUCHED}")
    if isinstance(plan, Refusal):
        if plan.state == "not-needed" and inputs.verify:
            return Plan(False, "upstream", False, verify=True)
        return plan
    lacks = [] if INFO in params or plan.remap == "upstream" else [INFO]
    if plan.remap != "upstream" and not inputs.remap_available:
        lacks.append(f"{REMAP} (module global)")
    if lacks:
        return Refusal("refused", f"signature lacks {', '.join(lacks)}; {UNTOUCHED}")
    return dataclasses.replace(plan, verify=inputs.verify)


def alternatives(plan: Plan) -> tuple[Plan, ...]:
    """``plan``, then the more intrusive plans to try when the probe of the hooked call
    shows it still wrong: the hook owning the remap, masking after upstream too, both."""
    if not plan.pre_mask:
        return (plan,)
    own = dataclasses.replace(plan, remap="own")
    post = dataclasses.replace(plan, post_mask=True)
    return tuple(dict.fromkeys((plan, own, post, dataclasses.replace(own, post_mask=True))))


def _plan_from_behaviour(obs: ProbeResult, remaps_on_hip: bool) -> Plan | Refusal:
    if obs.correct:
        return Refusal("not-needed", ACTIONS["fixed"])
    eplb = off, off_info, on = obs.observations[:3]
    if not all(o.real_weights_same for o in eplb) or "other" in (off.real_ids, off_info.real_ids):
        why = (
            f"upstream changes real rows in a way no hook can undo ({'; '.join(obs.findings[:3])})"
        )
        return Refusal("refused", f"{why}; {UNTOUCHED}")
    if off.real_ids == off_info.real_ids == "as-given" and on.real_ids == "remapped-once":
        remap = "upstream"  # its remap is right (a garbage read is cured by the pre-mask)
    elif not (obs.upstream_remaps or remaps_on_hip) and {o.real_ids for o in eplb} == {"as-given"}:
        remap = "add"  # nothing remaps on HIP, and no HIP path of the source could
    else:
        # Upstream remaps wrongly, or the probe could not make it remap although a HIP
        # path calls the remap (a predicate it could not steer): the hook owns the remap.
        remap = "own"
    return Plan(True, remap, obs.refills_after_append is not True)


def _around(original_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The AROUND hook (``hook(original_fn, *args, **kwargs)``)."""
    active = HOOK.active
    if active is None:
        return original_fn(*args, **kwargs)
    return run(active[0], active[1], original_fn, args, kwargs)


@dataclass(frozen=True)
class Preview:
    """What :meth:`SGLangHook.install` would decide here if the gate were open: ``status``
    (a plan reads ``pending``, ``detail["preview"]`` True), the probe of upstream alone
    and of the plan's hooked call (None: not run, no plan)."""

    status: HookStatus
    upstream: ProbeResult | None = None
    hooked: ProbeResult | None = None


@dataclass
class _Facts:
    """One decision: what it read, the verdict it got (None: the ledger's), its notes."""

    head: str  # "sglang-amd-moe: sglang <version> _post_process_topk_ids"
    detail: dict[str, Any]  # HookStatus.detail
    reading: ledger.Reading | None = None  # of the running function (else of the file)
    module: Any = None
    live: Any = None  # what the module binds now (wrappers included)
    upstream: Any = None  # under every wrapper
    inputs: Inputs | None = None
    verdict: Verdict | None = None  # the child's (None: not asked)
    checked: ProbeResult | None = None  # the probe of the hooked call kept
    notes: list[str] = field(default_factory=list)

    def status(self, state: str, action: str, form: str | None = None) -> HookStatus:
        form = form or self.reading.form
        bracket = f" [{'; '.join(self.notes)}]" if self.notes else ""
        message = f"{self.head} form={form} -> {action}{bracket}"
        return HookStatus(NAME, state, form, message, {**self.detail, "action": action})


def _probe_detail(p: ProbeResult) -> dict[str, Any]:
    out = {k: v for k, v in dataclasses.asdict(p).items() if k != "observations"}
    return {**out, "seconds": round(p.seconds, 4)}


def _unknown_note(reading: ledger.Reading, where: str, shown: str = "") -> list[str]:
    if reading.known is not None:
        return []
    seen = f"; running it shows {shown}" if shown else ""
    fingerprint = f"sha256 {reading.fingerprint or '-'}: {reading.why}{seen}"
    newer = ledger.newer_than_ledger()  # words only: the decision never reads a version
    newer = f" ({newer})" if newer else ""
    return [f"unrecognised function in {where} line {reading.lineno}{newer}, {fingerprint}"]


def _by_behaviour(r: ledger.Reading, strict: bool, verify: bool, before_plugin: bool) -> bool:
    """Whether a child must run the function: a body the ledger does not know (unless
    STRICT leaves it to upstream unrun), VERIFY, or topk imported before the plugin."""
    if r.known is None:
        return not strict
    return verify or before_plugin


def _request(facts: _Facts, where: str) -> dict[str, Any]:
    """What the child is asked to run: where the running function lives (its text too,
    when it is not its file's), the scans' names, and the ledger's plan."""
    fn, r = facts.upstream, facts.reading
    module = getattr(fn, "__module__", None) or TOPK_MODULE
    home = sys.modules.get(module)
    file = getattr(home, "__file__", None) or where
    source = ""
    try:
        code_file = fn.__code__.co_filename
        if not (Path(code_file).is_file() and Path(code_file).samefile(file)):
            source = inspect.getsource(fn)  # a rewritten function (linecache has its text)
    except (AttributeError, OSError, TypeError):
        pass
    return {
        "module": module,
        "qualname": getattr(fn, "__qualname__", FUNCTION_NAME),
        "file": str(file or ""),
        "source": source,
        "hip_flags": list(r.hip_flags),
        "predicates": list(r.predicates),
        "remaps_on_hip": r.remaps_on_hip,
        "ledger_plan": r.known.plan if r.known is not None else None,
    }


def topk_path() -> Path | None:
    """Where topk.py is, without importing it."""
    mod = sys.modules.get(TOPK_MODULE)
    if getattr(mod, "__file__", None):
        return Path(mod.__file__)
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / "srt/layers/moe/topk.py").is_file():
            return Path(loc) / "srt/layers/moe/topk.py"
    return None


def _running_reading(fn: Any, path: Path, text: str, file_reading: ledger.Reading):
    """The ledger's reading of the function that runs (under any wrappers), in its own
    module's text, and the file it comes from."""
    try:
        lines, first = inspect.getsourcelines(fn)
        where = inspect.getsourcefile(fn) or ""
    except (OSError, TypeError, ValueError):
        why = "the running function has no source"
        unread = {"fingerprint": "", "known": None, "lineno": 0, "node": None}
        return dataclasses.replace(file_reading, binding=why, **unread), ""
    if where == str(path) and first == file_reading.lineno and not file_reading.binding:
        return file_reading, where
    # Another file, or a rewritten source registered for inspect: linecache has both.
    module_text = text if where == str(path) else "".join(linecache.getlines(where)) or text
    return ledger.read(module_text, "".join(lines), first, modules=path), where


class SGLangHook(Target):
    """The SGLang target (the module-level functions below are its public surface)."""

    name, what, upstream = NAME, TARGET, "SGLang"

    def __init__(self) -> None:
        super().__init__()
        self.active: tuple[Call, LiveEnv] | None = None  # what the wrapper runs
        self.direct: tuple[Any, Any] | None = None  # (wrapper, original) when we wrapped
        self._at_import = False

    def _install(self, gate: Gate) -> HookStatus:
        st, call, facts = self._decide(import_now=False)
        if st.detail.get("deferred"):
            when_imported(TOPK_MODULE, self._on_import)
        if call is None:
            return self._announce(st)
        self.active, self._failures = (call, LiveEnv(call)), set()
        try:
            how = "already hooked" if self.is_live() else self._apply(facts.module, facts.live)
        except BaseException:
            self.active = None
            raise
        facts.detail["applied"] = how or "HookRegistry (inside load_plugins)"
        if call.plan.verify:
            facts.notes.append("SGLANG_AMD_MOE_VERIFY=1: padded rows checked after every call")
        facts.notes += [how] if how else []
        state = "live" if self.is_live() else "pending"
        return self._announce(facts.status(state, call.plan.describe(facts.reading.form)))

    def _on_import(self, module: types.ModuleType) -> None:
        """topk has just executed: decide and apply now, in the process that imports it."""
        forget(TOPK_MODULE, self._on_import)
        with self.lock:
            self._at_import = True
            try:
                self.install()
            finally:
                self._at_import = False

    def _imported(self) -> bool:
        """topk is imported (another thread still executing it does not count: deciding
        then would wait for that import while holding the lock its callback needs)."""
        spec = getattr(sys.modules.get(TOPK_MODULE), "__spec__", None)
        initializing = getattr(spec, "_initializing", False)
        return TOPK_MODULE in sys.modules and (self._at_import or not initializing)

    def _still_hooked(self) -> bool:
        deferred = watching(TOPK_MODULE) and not self._imported()
        return deferred or self.is_live() or registry.pending(TARGET, _around)

    def status(self) -> HookStatus | None:
        """The last decision; a hook that was pending and has been applied reads ``live``."""
        with self.lock:
            st = self._status
            if st is not None and st.state == "pending" and self.is_live():
                detail = {**st.detail, "applied": "HookRegistry"}
                self._status = st = dataclasses.replace(st, state="live", detail=detail)
            return st

    def is_live(self) -> bool:
        """``_post_process_topk_ids`` is our wrapper now (possibly under others')."""
        fn = getattr(sys.modules.get(TOPK_MODULE), FUNCTION_NAME, None)
        if find_marked(fn) is not None:
            return True
        ours = holds(fn, _around)
        applied = registry.hook_applied(TARGET, _around)
        return ours if applied is None else (ours and applied)

    def _undo(self) -> None:
        """The original back where the hook can; a wrapper another plugin put on top of
        ours stays (it holds ours, which then passes every call through)."""
        forget(TOPK_MODULE, self._on_import)
        mod = sys.modules.get(TOPK_MODULE)
        registry.unregister(TARGET, _around)
        fn = getattr(mod, FUNCTION_NAME, None)
        if self.direct is not None and mod is not None:
            wrapper, original = self.direct
        elif fn is not None and closes_over(fn, _around) and hasattr(fn, "__wrapped__"):
            wrapper, original = fn, fn.__wrapped__
        else:
            wrapper = original = None
        if wrapper is not None:
            if fn is wrapper:
                setattr(mod, FUNCTION_NAME, original)
            rebind_copies(wrapper, original)
        self.active, self.direct = None, None

    def _announce(self, st: HookStatus) -> HookStatus:
        """Keep ``st``; log it unless it repeats the decision logged last (a second
        ``load_plugins()`` probing what the ledger answered)."""
        before = self.status()
        said = [(x.state, x.form, x.detail.get("action")) for x in (before, st) if x is not None]
        if len(said) == 2 and said[0] == said[1]:
            with self.lock:
                self._status = st
            return st
        failed = (st.detail.get("verdict") or {}).get("source") == "failed"  # the child's
        level = logging.WARNING if st.form in ("absent", "unknown") or failed else None
        return self.record(st, level=level)

    def _read(self, import_now: bool) -> _Facts | HookStatus:
        """What the decision rests on, or the status that ends it early (no SGLang, a body
        the ledger answers for while topk is not imported, an import that fails)."""
        try:
            version = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            version = "(version unknown)"
        path, strict, verify = topk_path(), _env.strict(), _env.verify()
        facts = _Facts(f"sglang-amd-moe: sglang {version} {FUNCTION_NAME}", {"version": version})
        facts.detail.update(path=str(path or ""), **({"strict": True} if strict else {}))
        if path is None:
            return facts.status("not-needed", f"{TOPK_MODULE} not found; nothing hooked", "absent")
        text = path.read_text(encoding="utf-8")
        facts.reading = reading = ledger.read(text, modules=path)
        form = reading.form
        facts.detail["file"] = {"form": form, "sha256": reading.fingerprint, "why": reading.why}
        if not self._imported() and not import_now:
            facts.detail["probe"] = {"ran": False, "why": f"topk is not imported; {reading.why}"}
            if form == "absent" or (form == "fixed" and not verify):
                where = f" ({path})" if form == "absent" else ""
                return facts.status("not-needed", ACTIONS[form] + where)
            facts.notes = _unknown_note(reading, str(path))
            if strict and reading.known is None:
                return facts.status("refused", STRICT_REFUSAL)
            plan = reading.known.plan if reading.known is not None else None
            facts.detail.update(deferred=True, plan=plan)
            action = Plan(**plan).describe(form) if plan else "decided by running it"
            return facts.status("pending", f"{action} when {TOPK_MODULE} is imported")
        try:
            mod = importlib.import_module(TOPK_MODULE)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit from an import included
            why = f"cannot import {TOPK_MODULE} ({type(exc).__name__}: {exc}); {UNTOUCHED}"
            return facts.status("error", why)
        live = getattr(mod, FUNCTION_NAME, None)
        if not callable(live):
            why = f"the imported module has no callable {FUNCTION_NAME} (its file {path} has "
            return facts.status("not-needed", f"{why}form {form}); nothing hooked", "absent")
        facts.module, facts.live, facts.upstream = mod, live, inspect.unwrap(live)
        facts.reading, where = _running_reading(facts.upstream, path, text, reading)
        facts.detail.update(sha256=facts.reading.fingerprint, lineno=facts.reading.lineno)
        if where and where != str(path):
            facts.detail["path"] = where
        params, remap, r = params_of(live), callable(getattr(mod, REMAP, None)), facts.reading
        observed = None
        if _by_behaviour(r, strict, verify, before_plugin=not self._at_import):
            # Imported here: a process that decides from the ledger never needs it.
            from sglang_amd_moe.runtime.sglang import verdict

            facts.verdict = verdict.obtain(r.fingerprint, _request(facts, where))
            facts.detail["verdict"] = facts.verdict.detail()
            observed = facts.verdict.upstream
            facts.detail["probe"] = _probe_detail(observed)
        else:
            facts.detail["verdict"] = {"source": "ledger", "text": LEDGER_VERDICT}
            facts.detail.setdefault("probe", {"ran": False, "why": "the ledger knows this body"})
        facts.inputs = Inputs(params, r.known, observed, r.remaps_on_hip, remap, verify, strict)
        return facts

    def _notes(self, facts: _Facts) -> None:
        """What the log line adds in brackets."""
        reading, obs = facts.reading, facts.inputs.observed
        shown = obs.behaviour if obs is not None and obs.usable else ""
        notes = _unknown_note(reading, facts.detail.get("path", ""), shown)
        if reading.known is not None and shown and shown != reading.known.form:
            notes.append(
                f"the ledger knows this body as {reading.known.form} but running it shows "
                f"{shown}" + ("" if facts.inputs.strict else ": following behaviour")
            )
        if obs is not None and not obs.usable:
            by_ledger = "; decided from the ledger" if reading.known is not None else ""
            notes.append(obs.summary() + by_ledger)
        if facts.verdict is not None:
            notes.append(facts.verdict.describe())
        elif reading.known is not None:
            notes.append(LEDGER_VERDICT)
        facts.notes = notes

    def _decide(self, import_now: bool) -> tuple[HookStatus, Call | None, _Facts | None]:
        """Read, decide, check the plan's hooked call: what install() and preview() share.
        Applies nothing. With a call, the status is the one to finish (state, notes)."""
        facts = self._read(import_now)
        if isinstance(facts, HookStatus):
            return facts, None, None
        decision = decide(facts.inputs)
        if isinstance(decision, Refusal):
            facts.detail["plan"] = None
            self._notes(facts)
            return facts.status(decision.state, decision.reason), None, facts
        call = self._checked_call(facts, decision)
        self._notes(facts)
        if isinstance(call, str):
            why = f"refused: no plan makes it right ({call}); {UNTOUCHED}"
            return facts.status("refused", why), None, facts
        facts.detail["plan"] = dataclasses.asdict(call.plan)
        return facts.status("pending", call.plan.describe(facts.reading.form)), call, facts

    def _checked_call(self, facts: _Facts, plan: Plan) -> Call | str:
        """The call for ``plan``, or for the first of its :func:`alternatives` whose hooked
        call the probe finds right; what stayed wrong when none is. Where the hooked call
        cannot be run, a plan the ledger gives stands (else none does)."""
        r, mod, args = facts.reading, facts.module, Args(facts.live)
        base = Call(plan, mod, args, kernel_mask, r.hip_flags, r.predicates, self.log_call_failure)
        observed = facts.inputs.observed
        if not (observed is not None and observed.usable and plan.pre_mask):
            return base
        tried = facts.detail["probe_hooked"] = []
        for candidate in (plan,) if facts.inputs.strict else alternatives(plan):
            call = dataclasses.replace(base, plan=candidate)
            checked = facts.verdict.hooked(candidate) if facts.verdict is not None else None
            if checked is None:
                checked = ProbeResult(False, "the probe did not run this plan's hooked call")
            facts.checked = checked
            tried.append(_probe_detail(checked))
            if checked.correct:
                return call
            if not checked.ran:
                if r.known is not None and r.known.plan is not None:
                    known = dataclasses.replace(Plan(**r.known.plan), verify=plan.verify)
                    return dataclasses.replace(base, plan=known)
                return f"the hooked call could not be run: {checked.why}"
        return "; ".join(checked.findings[:3]) or checked.why

    def _apply(self, mod: types.ModuleType, live: Callable[..., Any]) -> str:
        """Put the wrapper in place; a note for the log line ("" for the usual path)."""
        if self._at_import:  # a registry hook applied later (another plugin's) wraps ours
            self._apply_directly(mod, live)
            return f"applied when {TOPK_MODULE} was imported"
        hook_registry = registry.load()
        if hook_registry is None:  # SGLang 0.5.10: no plugin framework
            self._apply_directly(mod, live)
            return "no SGLang plugin framework in this release: patched directly"
        if registry.patched(TARGET) and not registry.registered(TARGET, _around):
            # The registry skips hooks registered after it patched a target: wrap on top.
            self._apply_directly(mod, live)
            return "target already patched by another plugin: wrapped on top of it directly"
        registry.register_around(TARGET, _around, hook_registry)
        if registry.inside_load_plugins():
            return ""  # load_plugins() applies every registered hook right after the plugins
        hook_registry.HookRegistry.apply_hooks()
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

    def preview(self) -> Preview:
        """For the audit: what install() would do here on a ROCm machine (the gate ignored,
        ``SGLANG_AMD_MOE_DISABLE`` honoured), applying, keeping and logging nothing. Never
        raises."""
        if _env.disabled():
            off = "sglang-amd-moe: disabled by SGLANG_AMD_MOE_DISABLE=1; nothing hooked"
            return Preview(self.make_status("off", None, off))
        try:
            st, call, facts = self._decide(import_now=True)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a preview must never take its caller down
            return Preview(self.make_status("error", None, f"previewing {TARGET} failed ({exc!r})"))
        upstream = facts.inputs.observed if facts is not None else None
        if call is None:
            return Preview(st, upstream)
        checked = facts.checked
        if checked is None and facts.verdict is not None:
            checked = facts.verdict.hooked(call.plan)
        st = dataclasses.replace(st, detail={**st.detail, "preview": True})
        return Preview(st, upstream, checked)


HOOK = SGLangHook()
install = HOOK.install
status = HOOK.status
is_live = HOOK.is_live
uninstall = HOOK.uninstall
preview = HOOK.preview

"""The audit's verdict per target: needs attention or not, covered or not, the HOOK cell
and the reason (the rules are in docs/audit.md)."""

from __future__ import annotations

import sys
from typing import NamedTuple

from sglang_amd_moe.diagnostics import aiter_forms, patching
from sglang_amd_moe.diagnostics.audit import plugins, read
from sglang_amd_moe.diagnostics.audit.plugins import PluginView, Route
from sglang_amd_moe.diagnostics.audit.read import GUARD, SGLANG, TargetReport
from sglang_amd_moe.runtime import env
from sglang_amd_moe.runtime.sglang import names
from sglang_amd_moe.runtime.target import HookStatus

STRICT = "SGLANG_AMD_MOE_STRICT=1: the plugin leaves a body it does not know to upstream"
_RUNS_IT = "where the plugin loads, it runs the function on a CPU batch and hooks only what it "
_RUNS_IT += "sees wrong (`sglang-amd-moe audit --load` runs it here)"


class Verdict(NamedTuple):
    attention: bool
    covered: bool
    hook: str
    reason: str


def ok(reason: str, hook: str = "-", covered: bool = True) -> Verdict:
    return Verdict(False, covered, hook, reason)


def needs(reason: str, hook: str = "-") -> Verdict:
    return Verdict(True, False, hook, reason)


def verdict(rep: TargetReport, view: PluginView | None) -> Verdict:
    """The verdict on one target before drift is considered."""
    form, patch = rep.form, rep.patch
    if not rep.installed and rep.target != SGLANG:
        return ok("aiter is not installed here: the aiter part has nothing to do", "-", False)
    if not rep.installed and view is not None and view.vllm_installed and view.aiter_dir:
        why = "SGLang is not installed here (vLLM and aiter are: the aiter part applies)"
        return ok(why, "-", False)
    if not rep.installed:
        why = f"SGLang is not installed in this interpreter ({sys.executable})"
        return needs(f"{why}: run the audit with the python that runs the server")
    if rep.patch_status == patching.ALREADY_APPLIED and (rep.target, form) in read.GOOD_FORMS:
        return ok(f"patched: {patch} is applied to this file")
    if rep.patch_status == patching.ALREADY_APPLIED:
        return needs(f"{patch} is applied, but the result reads as {form} ({rep.reason})", "?")
    if form in read.BROKEN_FORMS:
        return by_routes(rep, view)
    if (rep.target, form) in read.GOOD_FORMS:
        return ok(read.GOOD_FORMS[(rep.target, form)])
    if form == "absent":  # SGLang without the function
        why = "an SGLang older than any this package knows (0.5.9 or earlier?)"
        return needs(f"{rep.reason}: {why}; neither the plugin nor a patch covers it")
    if rep.target != SGLANG:
        why = f"unrecognised form ({rep.reason}): the plugin leaves it alone; check it by hand"
        return needs(why, "?")
    nearest = f"; nearest known body: {rep.nearest['body']}" if rep.nearest else ""
    how = STRICT if env.flag("STRICT") else _RUNS_IT
    return needs(f"unknown: {rep.reason}{nearest}; {how}; check this function by hand", "?")


def by_routes(rep: TargetReport, view: PluginView | None) -> Verdict:
    """Whether the plugin covers ``rep`` (a broken form, or the guard) through any route."""
    what = rep.form if rep.target != GUARD else rep.target
    if view is None:  # a --*-source file
        where = "install sglang-amd-moe there (SGLang >= 0.5.11) or apply the patch"
        return needs(f"{what}: the image's plugin cannot be seen from here: {where}", "?")
    seen = [
        observed(rep, r) if view.loaded and r.host == "SGLang" else predicted(r)
        for r in plugins.routes(rep.target, view)
    ]
    for covered, hook, why in seen:
        if covered:
            return ok(f"{what}: covered: {why}", hook)
    return needs(f"{what}: not covered: {'; '.join(why for _, _, why in seen)}", seen[0][1])


def predicted(route: Route) -> tuple[bool, str, str]:
    """(covered, HOOK cell, why) of a route, from what is installed."""
    problem = plugins.triton_blocks()
    if route.cell or problem:  # blocked; or the plugin loads but its kernels cannot run
        why = route.why or f"the plugin loads with {route.host} but hooks nothing: {problem}"
        return False, route.cell or "Triton", why
    return True, "on load", f"the plugin hooks it when {route.host} loads plugins"


def observed(rep: TargetReport, route: Route) -> tuple[bool, str, str]:
    """The same after ``load_plugins()`` ran here: the hook's status says."""
    st, called = rep.status, "load_plugins() called the plugin, which hooks"
    if st is not None and st.hooked:
        on = {SGLANG: "SGLang to apply its hooks"}.get(rep.target, "aiter.fused_moe to be imported")
        wait = f"hook installed, waiting for {on}"
        return True, st.state, "hook live in this process" if st.state == "live" else wait
    if route.cell:
        return predicted(route)
    if st is None:
        return False, "not called", "load_plugins() ran but did not call the plugin's register()"
    if st.state == "off" and plugins.platform_gate_closed():
        return True, "not ROCm", f"{called} this on a ROCm machine (off here: see the note)"
    if st.state == "off" and plugins.triton_blocks():
        return False, "Triton", f"{called} nothing: {plugins.triton_blocks()}"
    return False, st.state, st.message or f"the hook's state is {st.state}"


def plugin_action(st: HookStatus | None) -> str:
    """What the SGLang hook does (or would do on ROCm), in the audit's words."""
    if st is None:
        return "nothing hooks it here"
    if st.hooked and isinstance(st.detail.get("plan"), dict):
        from sglang_amd_moe.runtime.sglang.call import Plan

        return Plan(**st.detail["plan"]).describe("" if st.form in (None, "unknown") else st.form)
    if st.state != "not-needed":
        return st.message
    action, probe = names.ACTIONS.get(st.form or "", "not hooked"), st.detail.get("probe")
    if not (isinstance(probe, dict) and not probe.get("ran", True)):
        return action
    return f"{action} (decided from the ledger: {probe.get('why') or 'the probe did not run'})"


def behaviour_verdict(rep: TargetReport, base: Verdict) -> Verdict:
    """``--load``: the verdict with what running the function showed (only adds attention)."""
    seen, result = rep.seen, rep.seen.result
    if result is None or not result.ran:
        why = result.why if result is not None else seen.why
        note = f"the probe could not run {seen.of} here ({why}): the verdict rests on the ledger"
        text_only = rep.patch_status == patching.APPLIES and rep.patch_probe is None
        rep.notes.append(note + (f", and {rep.patch} is checked as text only" if text_only else ""))
        return base
    hook, decision = base.hook, seen.decision
    if hook in ("-", "?") and decision is not None and decision.hooked:  # what was decided
        hook = "not ROCm" if seen.previewed else decision.state
    elif hook == "?" and decision is not None:
        hook = "-" if decision.state == "not-needed" else decision.state
    plugin = plugin_action(decision)
    if decision is not None:
        plugin = f"{'on a ROCm machine ' if seen.previewed else ''}the plugin: {plugin}"
    if not result.correct:
        found = "; ".join(result.findings[:3]) or result.behaviour
        wrong = f"running {seen.of} on the probe batch shows it wrong ({found}); {plugin}"
        return needs(f"{base.reason}; {wrong}" if base.attention else f"{rep.form}: {wrong}", hook)
    covered = base.covered or bool(decision and decision.hooked)
    shown = plugins.behaviour_shown(seen.upstream)
    right = f"running {seen.of} on the probe batch shows it right"
    if rep.form == "unknown":
        acts = f"upstream acts as {shown}; " if shown and shown != "unknown" else ""
        why = f"unknown: {rep.reason}, so the plugin decides by running it: {acts}{plugin}"
        return Verdict(True, covered, hook, f"{why}; {right}; check this function by hand")
    if shown and shown != rep.form:
        why = f"the ledger knows this body as {rep.form} but running it shows {shown}; {plugin}"
        by_hand = "The plain audit and the patches go by the ledger: check this function by hand"
        return Verdict(True, covered, hook, f"{why}; {right}. {by_hand}")
    return base._replace(reason=f"{base.reason}; {right}")


def guard_state(aiter: TargetReport, view: PluginView | None) -> dict | None:
    """The count-free guard at aiter's MoE entry, judged like a hook: ``state`` (as the HOOK
    column reads), ``live`` here, ``why``, ``covered``; None where there is no guard."""
    if not aiter.installed or not plugins.has_guard():
        return None
    (entry, problem), live = aiter_forms.guard_entry(aiter.source), plugins.is_live(GUARD)
    rep = read.not_installed(GUARD)
    rep.installed, rep.status = True, plugins.hook_status(GUARD) if view and view.loaded else None
    if problem and rep.status is None:  # the guard refuses an entry it does not know
        why = f"aiter.fused_moe.{entry} {problem}"
        return {"state": "refused", "live": live, "why": why, "covered": False}
    v = by_routes(rep, view)
    why = f"aiter.fused_moe.{entry}: {v.reason.removeprefix('guard: ')}"
    why = rep.status.message if rep.status is not None else why
    return {"state": v.hook, "live": live, "why": why, "covered": v.covered}


def conclude(rep: TargetReport, view: PluginView | None) -> None:
    """Fill the verdict, the action line, and the patch's path and command."""
    if rep.target == read.AITER:
        rep.guard = guard_state(rep, view)
    v, decision = verdict(rep, view), rep.seen.decision if rep.seen is not None else None
    decided = decision is not None and decision.state != "off"
    v = behaviour_verdict(rep, v) if rep.seen is not None else v
    rep.action = plugin_action(decision) if decided else rep.action
    rep.needs_attention, rep.covered, rep.hook, rep.reason = v
    if not rep.installed:
        return
    if rep.patch_status == patching.DRIFT:
        drift = "does not apply to this file (drift): the patch needs updating"
        rep.reason += f"; but {rep.patch} {drift}"
    if rep.patch_status == read.PATCH_FAILS_PROBE:
        pp = rep.patch_probe or {}
        found = "; ".join(pp.get("findings", [])[:3]) or pp.get("why") or "wrong"
        rep.reason += f"; {rep.patch} applies as text, but the function it makes fails on the "
        rep.reason += f"probe batch ({found}): not offered, the patch needs updating"
    rep.needs_attention |= rep.patch_status in (patching.DRIFT, read.PATCH_FAILS_PROBE)
    if rep.patch_status == patching.ALREADY_APPLIED and not (decision and decision.hooked):
        rep.action = f"not hooked: the file is patched ({rep.patch} is applied)"
    elif rep.form == "unknown" and not decided and env.flag("STRICT"):
        rep.action = f"not hooked: {STRICT}"
    elif rep.form in read.BROKEN_FORMS and not rep.covered and not decided:
        rep.action = f"none here; where the plugin loads: {rep.action}"
    if rep.patch and rep.patch_status != read.PATCH_FAILS_PROBE:  # not offered: no path
        rep.patch_file = patching.patch_path(rep.patch)
    if not (rep.patch and rep.patch_status == patching.APPLIES and rep.file):
        return
    rep.apply_command = patching.apply_command(rep.file, rep.patch)
    if rep.patch_probe is not None and rep.patch_probe.get("right"):
        ran = "was run before it is offered: the function it makes is right on the probe batch"
        rep.notes.append(f"{rep.patch} {ran}")
    if rep.target == SGLANG and rep.seen is None:
        rep.notes.append(f"{rep.patch} is checked as text only (it applies): `sglang-amd-moe "
                         "audit --load`, run where this SGLang is installed, also runs the "
                         "patched function on a CPU batch before offering it")  # fmt: skip

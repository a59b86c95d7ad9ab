"""The audit's verdict per target: needs attention or not, covered or not, the HOOK cell
and the reason (the rules are in docs/audit.md)."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

from sglang_amd_moe.diagnostics import patching
from sglang_amd_moe.diagnostics.audit import plugins
from sglang_amd_moe.diagnostics.audit.plugins import PluginView, Route
from sglang_amd_moe.diagnostics.audit.read import (
    AITER,
    BROKEN_FORMS,
    GOOD_FORMS,
    PATCH_FAILS_PROBE,
    SGLANG,
    TargetReport,
)
from sglang_amd_moe.runtime import env
from sglang_amd_moe.runtime.aiter import forms as aiter_forms
from sglang_amd_moe.runtime.sglang import names
from sglang_amd_moe.runtime.target import HookStatus

_PENDING_ON = {SGLANG: "SGLang to apply its hooks", AITER: "aiter.fused_moe to be imported"}


@dataclass(frozen=True)
class Verdict:
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
    if not rep.installed:
        return _missing(rep, view)
    if rep.patch_status == patching.ALREADY_APPLIED:
        if (rep.target, rep.form) in GOOD_FORMS:
            return ok(f"patched: {rep.patch} is applied to this file")
        why = f"{rep.patch} is applied, but the result reads as {rep.form} ({rep.reason})"
        return needs(why, "?")
    if rep.form in BROKEN_FORMS:
        return coverage(rep, view)
    if (rep.target, rep.form) in GOOD_FORMS:
        return ok(GOOD_FORMS[(rep.target, rep.form)])
    if rep.form == "absent":  # SGLang without the function
        return needs(
            f"{rep.reason}: an SGLang older than any this package knows (0.5.9 or earlier?); "
            "neither the plugin nor a patch covers it"
        )
    if rep.target == SGLANG:
        nearest = f"; nearest known body: {rep.nearest['body']}" if rep.nearest else ""
        return needs(
            f"unknown: {rep.reason}{nearest}; where the plugin loads, it runs the function on "
            "a CPU batch and hooks only what it sees wrong (`sglang-amd-moe audit --load` "
            "runs it here); check this function by hand",
            "?",
        )
    why = f"unrecognised form ({rep.reason}): the plugin leaves it alone; check it by hand"
    return needs(why, "?")


def _missing(rep: TargetReport, view: PluginView | None) -> Verdict:
    if rep.target == AITER:
        return ok("aiter is not installed here: the aiter part has nothing to do", covered=False)
    if view is not None and view.vllm_installed and view.aiter_dir is not None:
        why = "SGLang is not installed here (vLLM and aiter are: the aiter part applies)"
        return ok(why, covered=False)
    return needs(
        f"SGLang is not installed in this interpreter ({sys.executable}): "
        "run the audit with the python that runs the server"
    )


def coverage(rep: TargetReport, view: PluginView | None) -> Verdict:
    """Whether the plugin covers the broken form of ``rep``, through any of its routes."""
    if view is None:
        return needs(
            f"{rep.form}: the plugin of the image this file comes from cannot be seen from here: "
            "install sglang-amd-moe there (SGLang >= 0.5.11) or apply the patch",
            "?",
        )
    seen = [
        observed(rep, route) if view.loaded and route.host == "SGLang" else predicted(route)
        for route in plugins.routes(rep.target, view)
    ]
    for covered, hook, why in seen:
        if covered:
            return ok(f"{rep.form}: covered: {why}", hook)
    return needs(f"{rep.form}: not covered: {'; '.join(why for _, _, why in seen)}", seen[0][1])


def predicted(route: Route) -> tuple[bool, str, str]:
    """(covered, HOOK cell, why) of a route, from what is installed."""
    if route.cell:
        return False, route.cell, route.why
    problem = plugins.triton_blocks()
    if problem:  # the plugin loads, but keeps every hook off: its kernels cannot run
        return False, "Triton", f"the plugin loads with {route.host} but hooks nothing: {problem}"
    return True, "on load", f"the plugin hooks it when {route.host} loads plugins"


def observed(rep: TargetReport, route: Route) -> tuple[bool, str, str]:
    """The same for the SGLang route after ``load_plugins()`` ran here: the hook's status."""
    st = rep.status
    if st is not None and st.state == "live":
        return True, "live", "hook live in this process"
    if st is not None and st.state == "pending":
        return True, "pending", f"hook installed, waiting for {_PENDING_ON[rep.target]}"
    if route.cell:
        return predicted(route)
    if st is None:
        return (
            False,
            "not called",
            "load_plugins() ran but did not call sglang-amd-moe's register()",
        )
    if st.state == "off" and plugins.platform_gate_closed():
        why = "load_plugins() called the plugin, which hooks this on a ROCm machine"
        return True, "not ROCm", why + " (off here: see the note)"
    problem = plugins.triton_blocks() if st.state == "off" else ""
    if problem:
        return False, "Triton", f"load_plugins() called the plugin, which hooks nothing: {problem}"
    return False, st.state, st.message or f"the hook's state is {st.state}"


def plugin_action(st: HookStatus | None) -> str:
    """What the SGLang hook does (or would do on ROCm), in the audit's words."""
    if st is None:
        return "nothing hooks it here"
    plan = st.detail.get("plan")
    if st.hooked and isinstance(plan, dict):
        from sglang_amd_moe.runtime.sglang.call import Plan

        return Plan(**plan).describe("" if st.form in (None, "unknown") else st.form)
    if st.state != "not-needed":
        return st.message
    action = names.ACTIONS.get(st.form or "", "not hooked")
    probe = st.detail.get("probe")
    if isinstance(probe, dict) and not probe.get("ran", True):
        action += f" (decided from the ledger: {probe.get('why') or 'the probe did not run'})"
    return action


def behaviour_verdict(rep: TargetReport, base: Verdict) -> Verdict:
    """``--load``: the verdict with what running the function showed. It only ever adds
    attention: what runs must be right, and an unknown body, or a known one that runs
    as another form than the ledger says, needs a look by hand."""
    seen = rep.seen
    result = seen.result
    if result is None or not result.ran:
        why = result.why if result is not None else seen.why
        patch = ""
        if rep.patch_status == patching.APPLIES and rep.patch_probe is None:
            patch = f", and {rep.patch} is checked as text only"
        rep.notes.append(
            f"the probe could not run {seen.of} here ({why}): the verdict rests on the "
            f"ledger{patch}"
        )
        return base
    hook, decision = base.hook, seen.decision
    if hook in ("-", "?") and decision is not None:  # the HOOK cell says what was decided
        if decision.hooked:
            hook = "not ROCm" if seen.previewed else decision.state
        elif hook == "?":
            hook = "-" if decision.state == "not-needed" else decision.state
    plugin = plugin_action(decision)
    if decision is not None:
        plugin = f"{'on a ROCm machine ' if seen.previewed else ''}the plugin: {plugin}"
    if not result.correct:
        found = "; ".join(result.findings[:3]) or result.behaviour
        wrong = f"running {seen.of} on the probe batch shows it wrong ({found}); {plugin}"
        if base.attention:
            return Verdict(True, False, hook, f"{base.reason}; {wrong}")
        return needs(f"{rep.form}: {wrong}", hook)
    covered = base.covered or seen.hooks
    right = f"running {seen.of} on the probe batch shows it right"
    shown = plugins.behaviour_shown(seen.upstream)
    if rep.form == "unknown":
        acts = f"upstream acts as {shown}; " if shown and shown != "unknown" else ""
        return Verdict(
            True,
            covered,
            hook,
            f"unknown: {rep.reason}, so the plugin decides by running it: {acts}{plugin}; "
            f"{right}; check this function by hand",
        )
    if shown and shown != rep.form:
        return Verdict(
            True,
            covered,
            hook,
            f"the ledger knows this body as {rep.form} but running it shows {shown}; "
            f"{plugin}; {right}. The plain audit and the patches go by the ledger: "
            "check this function by hand",
        )
    return dataclasses.replace(base, reason=f"{base.reason}; {right}")


def guard_state(rep: TargetReport, view: PluginView | None) -> dict:
    """The guard at aiter's MoE entry: its state as a HOOK cell reads, whether it is live in
    this process, and why (its status after ``--load``, else what the file and the routes
    say). The guard module is read where loaded, never imported: it imports torch."""
    mod = sys.modules.get("sglang_amd_moe.runtime.aiter.guard")
    live = bool(mod is not None and mod.is_live())
    st = mod.status() if mod is not None and view is not None and view.loaded else None
    if st is not None:
        return {"state": st.state, "live": live, "why": st.message}
    entry, problem = aiter_forms.guard_entry(rep.source)
    if problem:
        return {"state": "refused", "live": live, "why": f"aiter.fused_moe.{entry} {problem}"}
    if env.guard_off():
        return {"state": "off", "live": live, "why": "SGLANG_AMD_MOE_GUARD=0"}
    if view is None:
        return {"state": "?", "live": live, "why": "the image's plugin cannot be seen from here"}
    seen = [predicted(route) for route in plugins.routes(AITER, view)]
    _, cell, why = next((s for s in seen if s[0]), seen[0])
    return {"state": cell, "live": live, "why": f"aiter.fused_moe.{entry}: {why}"}


def conclude(rep: TargetReport, view: PluginView | None) -> None:
    """Fill the verdict, the action line, and the patch's path and command."""
    if rep.target == AITER and rep.installed:
        rep.guard = guard_state(rep, view)
    v = verdict(rep, view)
    decided = False
    if rep.seen is not None:
        v = behaviour_verdict(rep, v)
        decision = rep.seen.decision
        decided = decision is not None and decision.state != "off"
        if decided:  # --load: what the hook decided here (or would on ROCm), in its words
            rep.action = plugin_action(decision)
    rep.needs_attention, rep.covered, rep.hook, rep.reason = (
        v.attention,
        v.covered,
        v.hook,
        v.reason,
    )
    if not rep.installed:
        return
    if rep.patch_status == patching.DRIFT:
        rep.needs_attention = True
        rep.reason += (
            f"; but {rep.patch} does not apply to this file (drift): the patch needs updating"
        )
    if rep.patch_status == PATCH_FAILS_PROBE:
        pp = rep.patch_probe or {}
        found = "; ".join(pp.get("findings", [])[:3]) or pp.get("why") or "wrong"
        rep.needs_attention = True
        rep.reason += (
            f"; {rep.patch} applies as text, but the function it makes fails on the probe "
            f"batch ({found}): not offered, the patch needs updating"
        )
    if rep.form in BROKEN_FORMS and not rep.covered and not decided:
        rep.action = f"none here; where the plugin loads: {rep.action}"
    if rep.patch and rep.patch_status != PATCH_FAILS_PROBE:  # a patch not offered has no path
        rep.patch_file = patching.patch_path(rep.patch)
        if rep.patch_status == patching.APPLIES and rep.file:
            rep.apply_command = patching.apply_command(rep.file, rep.patch)
            if rep.patch_probe is not None and rep.patch_probe.get("right"):
                rep.notes.append(
                    f"{rep.patch} was run before it is offered: the function it makes is "
                    "right on the probe batch"
                )
            if rep.target == SGLANG and rep.seen is None:
                rep.notes.append(
                    f"{rep.patch} is checked as text only (it applies): `sglang-amd-moe audit "
                    "--load`, run where this SGLang is installed, also runs the patched "
                    "function on a CPU batch before offering it"
                )

"""The audit's output: the table with details, the JSON document, and the diffs."""

from __future__ import annotations

import json
import sys
import unicodedata
from typing import Any

from sglang_amd_moe import __version__
from sglang_amd_moe.diagnostics import patching, sources
from sglang_amd_moe.diagnostics.audit import coverage, plugins, read
from sglang_amd_moe.diagnostics.audit.plugins import PluginView
from sglang_amd_moe.diagnostics.audit.read import TargetReport
from sglang_amd_moe.runtime import env, stats
from sglang_amd_moe.runtime.sglang import names

_DIFF_FUNCS = {read.SGLANG: (names.FUNCTION_NAME,)}
_DIFF_FUNCS[read.AITER] = ("_adaptive_moe_sort", "_moe_sorting_impl")


def escape(text: str) -> str:
    """``text`` with its control and format characters (a path may hold any: an escape
    sequence would drive the terminal, a newline would forge a line) written as Python
    escapes; a tab stays."""
    out = []
    for ch in text:
        if ch != "\t" and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


def function_diff(rep: TargetReport) -> str:
    """Unified diff of the target's function(s) against their fixed form (or nearest body)."""
    funcs, say = _DIFF_FUNCS[rep.target], f"# {rep.target}: {', '.join(_DIFF_FUNCS[rep.target])} is"
    if not rep.installed or not rep.source:
        return f"# {rep.target}: not installed\n"
    if rep.patch_status == patching.ALREADY_APPLIED:
        return f"{say} already patched ({rep.patch})\n"
    if (rep.target, rep.form) in read.GOOD_FORMS:
        return f"{say} already in its fixed form ({rep.form})\n"
    if rep.nearest is not None:
        return rep.nearest["diff"] or f"# {rep.target}: the same as {rep.nearest['body']}\n"
    if rep.patch is None or rep.patch_status != patching.APPLIES:
        why = f"{rep.patch} {rep.patch_status}" if rep.patch else f"no patch for form {rep.form!r}"
        return f"# {rep.target}: {why}; no diff\n"
    return patching.functions_diff(rep.source, rep.patch, funcs, str(rep.file))


def platform_notes(reports: list[TargetReport], view: PluginView | None) -> list[str]:
    """Notes on this machine, printed under the details (none for ``--*-source``)."""
    if view is None or not any(r.installed and r.form in read.BROKEN_FORMS for r in reports):
        return []
    if (rocm := sources.torch_is_rocm()) is None:
        return ["torch is not installed in this interpreter: the plugin cannot run here"]
    if rocm or env.forced():
        return []
    why = "(SGLANG_AMD_MOE_FORCE=1 forces it); the verdict is for a ROCm machine with this software"
    return [f"torch here is not a ROCm build: the plugin stays off on this machine {why}"]


def attention(reports: list[TargetReport], view: PluginView | None) -> list[str]:
    """Everything that needs action, one line each (empty exactly when the exit is 0)."""
    problems = [f"environment: {p}" for p in (view.problems if view is not None else [])]
    return [f"{r.target}: {r.reason}" for r in reports if r.needs_attention] + problems


def _details(r: TargetReport, view: PluginView | None) -> list[str]:
    pad = " " * (len(r.target) + 2)
    lines = [f"{r.target}  {'!!' if r.needs_attention else 'ok'} {r.reason}"]
    if not r.installed:
        return lines
    on_rocm = view is not None and plugins.platform_gate_closed() and r.action[:4] != "none"
    lines.append(f"{pad}plugin action{' on a ROCm machine' if on_rocm else ''}: {r.action}")
    if r.guard:
        live = "live here" if r.guard["live"] else r.guard["state"]
        lines.append(f"{pad}guard at its MoE entry: {live} ({r.guard['why']})")
    if r.hook_message:
        lines.append(f"{pad}plugin here: {r.hook_message.removeprefix('sglang-amd-moe: ')}")
    lines.append(f"{pad}file: {r.file}")
    of = read.FINGERPRINT_OF[r.target]
    lines.append(f"{pad}fingerprint: {r.sha256 or '-'} (sha256 of {of}, not of the file)")
    if r.patch_file:
        lines.append(f"{pad}patch: {r.patch_file} ({r.patch_status})")
    if r.apply_command:  # two lines, still one shell command when pasted
        args = patching.apply_args(str(r.file), str(r.patch))
        lines.append(f"{pad}to patch the file instead:")
        lines.append(f"{pad}  patch --dry-run {args} &&")
        lines.append(f"{pad}  patch {args}")
    lines.extend(f"{pad}note: {n}" for n in r.notes)
    if r.nearest is not None and r.nearest["diff"]:
        lines.append(f"{pad}diff against the nearest known body ({r.nearest['body']}):")
        lines.extend(f"{pad}  {d}" for d in r.nearest["diff"].rstrip("\n").splitlines())
    return lines + (coverage.lines(r.coverage, pad) if r.coverage else [])


def render_table(reports: list[TargetReport], exit_status: int, view: PluginView | None) -> str:
    # The first line: which plugin audited which interpreter, what a user quotes in a report.
    head = f"sglang-amd-moe {__version__} audit of {sys.executable}"
    rows = [("TARGET", "INSTALLED", "FORM", "HOOK", "PATCH", "PATCH STATUS")]
    for r in reports:
        form = r.form if r.installed else "-"
        dist = f"{r.distribution or r.target} {r.version or '(no metadata)'}"
        where = dist if view is not None else "(source file)"
        cells = (r.target, where if r.installed else "not installed", form, r.hook, r.patch)
        rows.append(tuple(c or "-" for c in (*cells, r.patch_status)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(map(str.ljust, row, widths)).rstrip() for row in rows]
    lines = [escape(head), "", *map(escape, lines)]
    lines.append("")
    for r in reports:
        if r.installed or r.needs_attention:
            lines += map(escape, _details(r, view))
    problems = view.problems if view is not None else []
    lines.extend(escape(f"!! environment: {p}") for p in problems)
    lines.extend(escape(f"note: {n}") for n in platform_notes(reports, view))
    if view is not None and view.loaded:  # --load: this process's counters
        lines.extend(escape(x) for x in stats.audit_lines())
    cov = next((r.coverage for r in reports if r.coverage), None)
    if cov and cov["unprotected"]:
        lines.append(
            escape(
                f"coverage: nothing masks the padded rows of {'; '.join(cov['unprotected'])} "
                f"(the count-free guard: {cov['guard']})"
            )
        )
    n = sum(r.needs_attention for r in reports)
    if exit_status == 0:
        lines.append("OK: nothing needs action (exit 0)")
    elif not problems:
        lines.append(f"ATTENTION: {n} target(s) need action (exit 1)")
    else:
        what = f"{n} target(s) and " if n else ""
        lines.append(f"ATTENTION: {what}the environment need{'' if n else 's'} action (exit 1)")
    return "\n".join(lines) + "\n"


def render_json(
    reports: list[TargetReport], exit_status: int, view: PluginView | None, diff: bool
) -> str:
    doc: dict[str, Any] = {
        "exit_status": exit_status,
        "plugin_version": __version__,
        "python": sys.executable,
        "targets": [r.to_json() for r in reports],
        "problems": view.problems if view is not None else [],
        "attention": attention(reports, view),
        "notes": platform_notes(reports, view),
    }
    if view is not None and view.loaded:  # --load: this process's counters
        doc["counters"] = stats.audit_view()
    if diff:
        doc["diff"] = {r.target: d for r in reports if (d := function_diff(r))}
    return json.dumps(doc, indent=2) + "\n"


def error_json(message: str, exit_status: int = 2) -> str:
    """The one JSON document of a run that failed (exit status 2) or was interrupted (130)."""
    doc = dict(exit_status=exit_status, error=message, targets=[], problems=[],
               attention=[message], notes=[])  # fmt: skip
    return json.dumps(doc, indent=2) + "\n"

"""The audit's output: the table with details, the JSON document, and the diffs."""

from __future__ import annotations

import ast
import difflib
import json
from typing import Any

from sglang_amd_moe.diagnostics import patching
from sglang_amd_moe.diagnostics.audit import coverage, plugins, read
from sglang_amd_moe.diagnostics.audit.plugins import PluginView
from sglang_amd_moe.diagnostics.audit.read import (
    AITER,
    BROKEN_FORMS,
    FINGERPRINT_OF,
    GOOD_FORMS,
    SGLANG,
    TargetReport,
)
from sglang_amd_moe.runtime import env
from sglang_amd_moe.runtime.sglang import names

_DIFF_FUNCS = {SGLANG: (names.FUNCTION_NAME,), AITER: ("_adaptive_moe_sort", "_moe_sorting_impl")}


def _functions_source(source: str, funcs: tuple[str, ...]) -> str:
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return ""
    kinds = ast.FunctionDef | ast.AsyncFunctionDef
    parts = [
        ast.get_source_segment(source, n) or ""
        for n in body
        if isinstance(n, kinds) and n.name in funcs
    ]
    return "\n\n".join(parts) + ("\n" if parts else "")


def function_diff(rep: TargetReport) -> str:
    """Unified diff of the target function(s) against their fixed form (an unknown SGLang
    body: against the nearest body the ledger knows)."""
    if not rep.installed or not rep.source:
        return f"# {rep.target}: not installed\n"
    funcs = ", ".join(_DIFF_FUNCS[rep.target])
    if rep.patch_status == patching.ALREADY_APPLIED:
        return f"# {rep.target}: {funcs} is already patched ({rep.patch})\n"
    if (rep.target, rep.form) in GOOD_FORMS:
        return f"# {rep.target}: {funcs} is already in its fixed form ({rep.form})\n"
    if rep.nearest is not None:
        return rep.nearest["diff"] or f"# {rep.target}: the same as {rep.nearest['body']}\n"
    if rep.patch is None:
        return f"# {rep.target}: no patch for form {rep.form!r}; nothing to diff against\n"
    if rep.patch_status != patching.APPLIES:
        return f"# {rep.target}: {rep.patch} {rep.patch_status}; no diff\n"
    fixed = patching.apply_text(rep.source, patching.read_patch(rep.patch))
    before, after = (_functions_source(t, _DIFF_FUNCS[rep.target]) for t in (rep.source, fixed))
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"installed: {rep.file} ({funcs})",
            tofile=f"fixed: after {rep.patch}",
        )
    )


def platform_notes(reports: list[TargetReport], view: PluginView | None) -> list[str]:
    """Notes on this machine, printed under the details (none for ``--*-source``)."""
    if view is None or not any(r.installed and r.form in BROKEN_FORMS for r in reports):
        return []
    rocm = read.torch_is_rocm()
    if rocm is None:
        return ["torch is not installed in this interpreter: the plugin cannot run here"]
    if rocm or env.forced():
        return []
    return [
        "torch here is not a ROCm build: the plugin stays off on this machine "
        "(SGLANG_AMD_MOE_FORCE=1 forces it); the verdict is for a ROCm machine with this software"
    ]


def attention(reports: list[TargetReport], view: PluginView | None) -> list[str]:
    """Everything that needs action, one line each (empty exactly when the exit is 0)."""
    problems = view.problems if view is not None else []
    return [f"{r.target}: {r.reason}" for r in reports if r.needs_attention] + [
        f"environment: {p}" for p in problems
    ]


def _installed_cell(r: TargetReport, view: PluginView | None) -> str:
    if not r.installed:
        return "not installed"
    if view is None:
        return "(source file)"
    name = r.distribution or r.target
    return f"{name} {r.version}" if r.version else f"{name} (no metadata)"


def _details(r: TargetReport, view: PluginView | None) -> list[str]:
    pad = " " * (len(r.target) + 2)
    on_rocm = (
        view is not None and plugins.platform_gate_closed() and not r.action.startswith("none")
    )
    lines = [f"{r.target}  {'!!' if r.needs_attention else 'ok'} {r.reason}"]
    if not r.installed:
        return lines
    lines.append(f"{pad}plugin action{' on a ROCm machine' if on_rocm else ''}: {r.action}")
    if r.hook_message:
        lines.append(f"{pad}plugin here: {r.hook_message.removeprefix('sglang-amd-moe: ')}")
    lines.append(f"{pad}file: {r.file}")
    if r.target in FINGERPRINT_OF:
        of = FINGERPRINT_OF[r.target]
        lines.append(f"{pad}fingerprint: {r.sha256 or '-'} (sha256 of {of}, not of the file)")
    if r.patch_file:
        lines.append(f"{pad}patch: {r.patch_file} ({r.patch_status})")
    if r.apply_command:  # two lines, still one shell command when pasted
        args = patching.apply_args(str(r.file), str(r.patch))
        lines += [
            f"{pad}to patch the file instead:",
            f"{pad}  patch --dry-run {args} &&",
            f"{pad}  patch {args}",
        ]
    lines.extend(f"{pad}note: {n}" for n in r.notes)
    if r.nearest is not None and r.nearest["diff"]:
        lines.append(f"{pad}diff against the nearest known body ({r.nearest['body']}):")
        lines.extend(f"{pad}  {d}" for d in r.nearest["diff"].rstrip("\n").splitlines())
    return lines + (coverage.lines(r.coverage, pad) if r.coverage else [])


def render_table(reports: list[TargetReport], exit_status: int, view: PluginView | None) -> str:
    rows = [("TARGET", "INSTALLED", "FORM", "HOOK", "PATCH", "PATCH STATUS")]
    for r in reports:
        form = r.form if r.installed else "-"
        cells = (r.target, _installed_cell(r, view), form, r.hook, r.patch, r.patch_status)
        rows.append(tuple(c or "-" for c in cells))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.append("")
    for r in reports:
        if r.installed or r.needs_attention:
            lines += _details(r, view)
    problems = view.problems if view is not None else []
    lines.extend(f"!! environment: {p}" for p in problems)
    lines.extend(f"note: {n}" for n in platform_notes(reports, view))
    cov = next((r.coverage for r in reports if r.coverage), None)
    if cov and cov["unprotected"]:
        lines.append(
            f"coverage: nothing masks the padded rows of {'; '.join(cov['unprotected'])} "
            f"(no count reaches the hook there; the count-free guard: {cov['guard']})"
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
        "targets": [r.to_json() for r in reports],
        "problems": view.problems if view is not None else [],
        "attention": attention(reports, view),
        "notes": platform_notes(reports, view),
    }
    if diff:
        doc["diff"] = {r.target: function_diff(r) for r in reports if r.target in _DIFF_FUNCS}
    return json.dumps(doc, indent=2) + "\n"


def error_json(message: str) -> str:
    """The one JSON document of a run that failed (exit status 2)."""
    doc = {
        "exit_status": 2,
        "error": message,
        "targets": [],
        "problems": [],
        "attention": [message],
        "notes": [],
    }
    return json.dumps(doc, indent=2) + "\n"

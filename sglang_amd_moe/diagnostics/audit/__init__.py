"""``sglang-amd-moe audit``: what is installed, its form, what the plugin does and which of
SGLang's paths it protects, the matching patch (docs/audit.md). Modules: :mod:`.read`,
:mod:`.plugins` (routes, hooks, ``--load``), :mod:`.verdict`, :mod:`.coverage`, :mod:`.render`."""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback
from pathlib import Path

from sglang_amd_moe.diagnostics import patching
from sglang_amd_moe.diagnostics.audit import coverage, plugins, read, render, verdict
from sglang_amd_moe.diagnostics.audit.plugins import PluginView
from sglang_amd_moe.diagnostics.audit.read import JSON_KEYS, PATCH_FAILS_PROBE, AuditError
from sglang_amd_moe.diagnostics.cli import OutputError, write_stdout
from sglang_amd_moe.diagnostics.sources import SourceError

TargetReport = read.TargetReport
__all__ = ["JSON_KEYS", "PATCH_FAILS_PROBE", "AuditError", "TargetReport", "main", "run"]
_EPILOG = """\
exit status:
  0  the targets were found and nothing needs action (fixed, patched, or covered)
  1  something needs attention (each reason is printed; docs/audit.md lists them)
  2  the audit failed (a file it cannot read or that is not the target's, a failing
     load_plugins(), a report it cannot print); --json still prints one document
  130 interrupted (Ctrl-C); --json still prints one document

HOOK column: live / pending / not-needed / refused / error / not called (--load: the
hook's state), on load (hooked when SGLang loads plugins), not ROCm (--load off ROCm),
no loader (SGLang 0.5.10), Triton (unusable), off, ? (unknown, or a --*-source file), -.

example: sglang-amd-moe audit --sglang-source IMAGE_ROOT/.../sglang/srt/layers/moe/topk.py
"""


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="sglang-amd-moe audit",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="What is installed, what the plugin does, which SGLang paths it protects, "
        "the patch. Run it with the server's python (no torch, ROCm or aiter needed).",
        epilog=_EPILOG,
    )
    add = ap.add_argument
    add("--load", action="store_true", help="run SGLang's real load_plugins() first")
    add("--diff", action="store_true", help="print the unified diff installed -> fixed")
    add("--json", action="store_true", help="print one JSON document instead of the table")
    add("--sglang-source", type=Path, metavar="FILE", help="audit this copy of SGLang's topk.py")
    add("--aiter-source", type=Path, metavar="FILE", help="audit this copy of aiter's fused_moe.py")
    return ap


def run(argv: list[str] | argparse.Namespace) -> tuple[int, list[TargetReport], PluginView | None]:
    """Audit and return (exit status, reports, plugin view); raises AuditError/SystemExit."""
    args = argv if isinstance(argv, argparse.Namespace) else _parser().parse_args(argv)
    given = [(read.SGLANG, args.sglang_source), (read.AITER, args.aiter_source)]
    given = [(target, path) for target, path in given if path]
    if given and args.load:
        raise AuditError("--load audits this environment; it cannot be combined with --*-source")
    view = None if given else plugins.plugin_view()
    if view is None:
        reports = [read.given_file(target, path) for target, path in given]
    else:
        if args.load:
            plugins.run_load_plugins(view)
        reports = [read.installed(read.SGLANG, view.sglang_dir)]
        reports.append(read.installed(read.AITER, view.aiter_dir))
        for rep in (r for r in reports if r.installed):  # each hook: live, and its status
            rep.hook_live, st = plugins.is_live(rep.target), plugins.hook_status(rep.target)
            rep.status = st = st if view.loaded else None
            rep.hook_state, rep.hook_message = (st.state, st.message) if st else (None, None)
        if args.load and reports[0].installed and reports[0].form != "absent":
            plugins.observe_sglang(reports[0], view)
    for rep in reports:
        verdict.conclude(rep, view)
    coverage.attach(reports, view is not None)
    return (1 if render.attention(reports, view) else 0), reports, view


def _error(message: str, as_json: bool, say: bool = True, exit_status: int = 2) -> int:
    with contextlib.suppress(Exception):
        if say:
            print(f"sglang-amd-moe audit: error: {render.escape(message)}", file=sys.stderr)
        if as_json:
            write_stdout(render.error_json(message, exit_status))
    return exit_status


def _escaped(text: str) -> str:
    return "".join(render.escape(ln) + "\n" for ln in text.splitlines())


def main(argv: list[str]) -> int:
    """Entry point of ``sglang-amd-moe audit`` (docs/audit.md)."""
    as_json = any(len(a) > 2 and "--json".startswith(a) for a in argv)  # argparse takes --js
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or bad usage (2, message on stderr)
        return 0 if exc.code in (0, None) else _error("bad usage (above)", as_json, say=False)
    writing: list[bool] = []
    try:
        return _audit(args, as_json, writing)
    except KeyboardInterrupt:  # Ctrl-C: one document for a --json reader, never a second
        return _error("interrupted", as_json and not writing, exit_status=130)


def _audit(args: argparse.Namespace, as_json: bool, writing: list[bool]) -> int:
    try:
        exit_status, reports, view = run(args)
        if args.json:
            text = render.render_json(reports, exit_status, view, args.diff)
        else:
            text = render.render_table(reports, exit_status, view)
            if args.diff:
                diffs = (render.function_diff(r) for r in reports)
                text += "".join(f"\n{_escaped(d)}" for d in diffs if d)
    except (SourceError, patching.PatchError) as exc:
        return _error(str(exc), as_json)
    except Exception:  # a bug of ours must not read as "needs attention" (1)
        traceback.print_exc()
        return _error("internal error (above)", as_json)
    try:
        writing.append(True)
        write_stdout(text)
    except OutputError as exc:
        return _error(f"cannot write to stdout: {exc}", False)
    return exit_status

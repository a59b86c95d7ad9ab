"""``sglang-amd-moe audit``: what is installed, which form it has, what the plugin does.

For SGLang's ``_post_process_topk_ids`` and aiter's MXFP4 aux sort path: the version, the
file and its fingerprint, the form, the plugin's action, the hook's state, and the
matching patch with whether it applies. It reads files without importing SGLang or aiter
(``--load`` runs SGLang's real ``load_plugins()`` and the function). The rules (exit
codes, verdicts, ``--load``, JSON keys) are in ``docs/audit.md``. Modules: :mod:`.read`
(files and forms), :mod:`.plugins` (routes, hook states, ``--load``), :mod:`.verdict`,
:mod:`.render`.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from sglang_amd_moe.diagnostics import patching
from sglang_amd_moe.diagnostics.audit import plugins, read, render, verdict
from sglang_amd_moe.diagnostics.audit.plugins import PluginView
from sglang_amd_moe.diagnostics.audit.read import (
    AITER,
    JSON_KEYS,
    PATCH_FAILS_PROBE,
    SGLANG,
    AuditError,
    TargetReport,
)
from sglang_amd_moe.diagnostics.cli import OutputError, write_stdout

__all__ = ["JSON_KEYS", "PATCH_FAILS_PROBE", "AuditError", "TargetReport", "main", "run"]

_EPILOG = """\
exit status:
  0  the targets were found and nothing needs action (fixed upstream, patched,
     or covered by the plugin)
  1  something needs attention (SGLang not in this interpreter, an unknown form,
     a broken form the plugin cannot cover, patch drift, both triton and
     pytorch-triton-rocm installed; with --load also: SGLang's function running
     wrong on the probe batch, a body the ledger knows running as another form,
     a patch that applies but whose result runs wrong)
  2  the audit failed (a file it cannot read or that is not the target's, a
     failing load_plugins(), a report it cannot print)

HOOK column: live / pending (hooked in this process, or waiting for aiter.fused_moe
to be imported; --load), on load (the plugin hooks it when SGLang loads plugins),
not ROCm (--load on a machine without ROCm torch: off here, hooks on ROCm),
no loader (SGLang 0.5.10: apply the patch), Triton (ROCm torch or FORCE, and a
Triton missing, older than 3.3 or unreadable: the plugin loads but hooks nothing),
off (disabled, or not installed),
not-needed / refused / error (--load: what the hook decided), not called
(--load: load_plugins() never called the plugin), ? (unknown form,
or a --*-source file whose image cannot be seen), - (nothing to hook).

The SGLang form is the ledger's: the fingerprint of the installed function looked up
among every released body and every shipped patch's result. A body the ledger does
not know is unknown: the audit shows its diff against the nearest known body.

--load runs SGLang's function on a small CPU batch as the plugin runs it here
(or would on a ROCm machine), and runs the patched function before offering a
patch: PATCH STATUS "not offered (fails the probe)" when the patch applies but
its result runs wrong. The plain audit checks patches as text only.

examples:
  sglang-amd-moe audit                  this environment, nothing imported
  sglang-amd-moe audit --load           run SGLang's load_plugins() first
  sglang-amd-moe audit --sglang-source IMAGE_ROOT/.../sglang/srt/layers/moe/topk.py
"""


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="sglang-amd-moe audit",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Report, for SGLang's _post_process_topk_ids and aiter's MXFP4 aux sort: what is\n"
            "installed, its form, what the plugin does about it, the hook's state, and the\n"
            "matching patch with the command that applies it. Run it with the python that\n"
            "runs the server. Needs neither torch nor ROCm nor aiter (except --load)."
        ),
        epilog=_EPILOG,
    )
    ap.add_argument(
        "--load",
        action="store_true",
        help="run SGLang's real load_plugins() first, then read the hooks' state",
    )
    ap.add_argument(
        "--diff",
        action="store_true",
        help="print the unified diff installed -> fixed of each target",
    )
    ap.add_argument(
        "--json", action="store_true", help="print one JSON document instead of the table"
    )
    ap.add_argument(
        "--sglang-source",
        type=Path,
        metavar="FILE",
        help="audit this copy of SGLang's sglang/srt/layers/moe/topk.py instead (imports nothing)",
    )
    ap.add_argument(
        "--aiter-source",
        type=Path,
        metavar="FILE",
        help="audit this copy of aiter's aiter/fused_moe.py instead (imports nothing)",
    )
    return ap


def run(argv: list[str] | argparse.Namespace) -> tuple[int, list[TargetReport], PluginView | None]:
    """Audit and return (exit status, reports, plugin view); raises AuditError/SystemExit."""
    args = argv if isinstance(argv, argparse.Namespace) else _parser().parse_args(argv)
    given = [
        (t, p)
        for t, p in ((SGLANG, args.sglang_source), (AITER, args.aiter_source))
        if p is not None
    ]
    if given and args.load:
        raise AuditError(
            "--load audits this environment; "
            "it cannot be combined with --sglang-source/--aiter-source"
        )
    view: PluginView | None = None
    if given:
        reports = [read.given_file(target, path) for target, path in given]
    else:
        view = plugins.plugin_view()
        if args.load:
            plugins.run_load_plugins(view)
        dirs = {SGLANG: view.sglang_dir, AITER: view.aiter_dir}
        reports = [read.installed(target, dirs[target]) for target in (SGLANG, AITER)]
        for rep in reports:
            if rep.source:  # a file was read: the hook's view of it
                rep.hook_live = plugins.is_live(rep.target)
                if view.loaded:
                    rep.status = plugins.hook_status(rep.target)
                    rep.hook_state = rep.status.state if rep.status else None
        if args.load and reports[0].installed and reports[0].form != "absent":
            plugins.observe_sglang(reports[0], view)
    for rep in reports:
        verdict.conclude(rep, view)
    problems = view.problems if view is not None else []
    exit_status = 1 if problems or any(r.needs_attention for r in reports) else 0
    return exit_status, reports, view


def _error(message: str) -> int:
    try:
        print(f"sglang-amd-moe audit: error: {message}", file=sys.stderr)
    except Exception:
        pass
    return 2


def main(argv: list[str]) -> int:
    """Entry point of ``sglang-amd-moe audit`` (docs/audit.md)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or bad usage (2, message on stderr)
        return 0 if exc.code in (0, None) else 2
    try:
        exit_status, reports, view = run(args)
        if args.json:
            text = render.render_json(reports, exit_status, view, args.diff)
        else:
            text = render.render_table(reports, exit_status, view)
            if args.diff:
                text += "".join("\n" + render.function_diff(r) for r in reports)
    except (AuditError, patching.PatchError) as exc:
        return _error(str(exc))
    except Exception:  # a bug of ours must not read as "needs attention" (1)
        traceback.print_exc()
        return _error("internal error (above)")
    try:
        write_stdout(text)
    except OutputError as exc:
        return _error(f"cannot write to stdout: {exc}")
    return exit_status

"""``sglang-amd-moe audit``: what is installed, which form it has, what the plugin does.

Users must be able to see, before they trust the plugin, what it finds and what it
would change. For each target (SGLang's ``_post_process_topk_ids``; aiter's MXFP4 aux
sort path) the audit reports the distribution and version, the file and the sha256 of
the target's source, the form (``sglang_forms`` / ``aiter_forms``), the action the
plugin takes for it, whether the hook is live in this process, and the matching patch
from ``sglang_amd_moe.patches`` with whether it applies, is already applied, or does
not apply (drift).

It reads source files and never imports SGLang or aiter to classify them (files are
found with ``importlib.util.find_spec`` on the top-level package, which does not run
it), so it works without ROCm and without aiter. Only ``--load`` imports SGLang, to run
its real ``sglang.srt.plugins.load_plugins()`` and ask the hooks whether they are live.

Exit status: 0 when nothing needs action, 1 when something needs attention, 2 on
error. A broken form (one the plugin hooks) needs no action when it is *covered*:

* with ``--load``: the hook is live in this process after ``load_plugins()``;
* without it: the plugin would hook it when SGLang (or vLLM, for aiter) loads plugins:
  the release has a plugin loader, this package's entry point is registered, and
  neither ``SGLANG_AMD_MOE_DISABLE=1`` nor an ``SGLANG_PLUGINS`` list without it turns
  it off. The platform is not part of this: the plugin hooks only on ROCm (or with
  ``SGLANG_AMD_MOE_FORCE=1``), and the HIP path it fixes only runs there, so the
  verdict is what the installed software does on the AMD machine it is for (a note
  says when this machine is not one).

Needs attention: an ``unknown`` form, a broken form that is not covered (no plugin
loader, as in SGLang 0.5.10; plugin disabled; ``--load`` found no live hook), a
matching patch that no longer applies (drift), or a file given with ``--*-source``
that has a broken form (the audit cannot see that image's plugin). A file that one of
our patches was applied to needs nothing, whatever the classifier calls it.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib.metadata as md
import importlib.util
import json
import os
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sglang_amd_moe.diagnostics import patching
from sglang_amd_moe.runtime import aiter_forms, sglang_forms
from sglang_amd_moe.runtime import env as _env

#: Keys every target has in ``--json`` output (more may follow them).
JSON_KEYS = (
    "target",
    "distribution",
    "version",
    "file",
    "sha256",
    "form",
    "action",
    "hook_live",
    "patch",
    "patch_status",
)

SGLANG = "sglang"
AITER = "aiter"
_HOOK_MODULES = {SGLANG: "sglang_amd_moe.runtime.sglang_hook", AITER: "sglang_amd_moe.runtime.aiter_hook"}
SGLANG_REL = Path("srt/layers/moe/topk.py")
AITER_REL = Path("fused_moe.py")
OUR_SGLANG_EP = "sglang_amd_moe.runtime.plugin:register"
OUR_VLLM_EP = "sglang_amd_moe.runtime.plugin:register_vllm"
#: Forms that need nothing from anyone.
GOOD_FORMS = {"fixed", "count-honored", "absent"}
#: Forms the plugin hooks to fix (``unknown`` only gets a guard and always needs attention).
BROKEN_FORMS = {
    "no-hip-handling",
    "weights-only",
    "mask-under-eplb-guard",
    "count-dropped",
    "count-rejected",
}


class AuditError(Exception):
    """Something the audit cannot work around (unreadable file, failed import for --load)."""


@dataclass
class TargetReport:
    target: str
    distribution: str | None
    version: str | None
    file: str | None
    sha256: str | None
    form: str
    action: str
    hook_live: bool | None
    patch: str | None
    patch_status: str | None
    # Beyond the stable keys: the verdict and why.
    covered: bool = False
    needs_attention: bool = False
    reason: str = ""
    hook: str = "-"  # short hook state for the table
    notes: list[str] = field(default_factory=list)
    installed: bool = True
    source: str = field(default="", repr=False)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("source")
        return {**{k: d.pop(k) for k in JSON_KEYS}, **d}


# ------------------------------------------------------------------------ locating


def _find_package_dir(name: str) -> Path | None:
    """Directory of top-level package ``name`` without importing it (None if absent)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locs = list(spec.submodule_search_locations or [])
    if locs:
        return Path(locs[0])
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        return Path(spec.origin).parent
    return None


def _distribution(top: str) -> tuple[str | None, str | None]:
    """(distribution name, version) providing top-level package ``top``."""
    try:
        dists = md.packages_distributions().get(top) or [top]
    except Exception:
        dists = [top]
    for dist in dists:
        try:
            return dist, md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None, None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AuditError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise AuditError(f"{path} is not UTF-8 Python source ({exc.reason})") from exc


# ------------------------------------------------------------------------ plugin state


def _our_entry_point(group: str, value: str) -> md.EntryPoint | None:
    try:
        eps = md.entry_points(group=group)
    except Exception:
        return None
    for ep in eps:
        if ep.value.replace(" ", "") == value:
            return ep
    return None


def _disabled_by_env(ep_name: str) -> str:
    """Why the environment keeps the plugin from running ("" when it does not)."""
    if _env.disabled():
        return "SGLANG_AMD_MOE_DISABLE is set"
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    names = {x.strip() for x in allowed.split(",") if x.strip()}
    if names and ep_name not in names:
        return f"SGLANG_PLUGINS={allowed} does not list {ep_name}"
    return ""


def _sglang_has_loader(sglang_dir: Path | None) -> bool:
    """SGLang 0.5.11+ ships ``sglang/srt/plugins`` with ``load_plugins``; 0.5.10 does not."""
    if sglang_dir is None:
        return False
    init = sglang_dir / "srt" / "plugins" / "__init__.py"
    try:
        return "def load_plugins" in init.read_text(encoding="utf-8")
    except OSError:
        return False


def _on_rocm() -> bool | None:
    """Whether torch here is a ROCm build, without importing torch (None: no torch)."""
    torch_dir = _find_package_dir("torch")
    if torch_dir is None:
        return None
    try:
        text = (torch_dir / "version.py").read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("hip") and "=" in line:
            return line.split("=", 1)[1].strip() not in ("None", "''", '""')
    return False


@dataclass
class PluginView:
    """What this environment's plugin machinery would do (decided without importing SGLang)."""

    sglang_dir: Path | None
    sglang_loader: bool
    sglang_ep: md.EntryPoint | None
    vllm_installed: bool
    vllm_ep: md.EntryPoint | None
    loaded: bool = False  # --load ran load_plugins() in this process
    load_error: str = ""


def _plugin_view(sglang_dir: Path | None) -> PluginView:
    return PluginView(
        sglang_dir=sglang_dir,
        sglang_loader=_sglang_has_loader(sglang_dir),
        sglang_ep=_our_entry_point("sglang.srt.plugins", OUR_SGLANG_EP),
        vllm_installed=_find_package_dir("vllm") is not None,
        vllm_ep=_our_entry_point("vllm.general_plugins", OUR_VLLM_EP),
    )


def _hook_live(target: str) -> bool:
    """Ask the hook module whether its hook is in place in this process (False if absent)."""
    try:
        mod = importlib.import_module(_HOOK_MODULES[target])
        return bool(mod.is_live())
    except Exception:
        return False


def _hook_message(target: str) -> str:
    mod = sys.modules.get(_HOOK_MODULES[target])
    status = getattr(mod, "status", None) if mod is not None else None
    try:
        st = status() if callable(status) else None
    except Exception:
        st = None
    return str(getattr(st, "message", "") or "")


def _run_load_plugins(view: PluginView) -> None:
    """``--load``: import SGLang's plugin framework and run its real ``load_plugins()``."""
    if not view.sglang_loader:
        view.load_error = "this SGLang has no plugin loader (sglang.srt.plugins.load_plugins)"
        return
    try:
        plugins = importlib.import_module("sglang.srt.plugins")
        plugins.load_plugins()
        view.loaded = True
    except Exception as exc:
        raise AuditError(f"load_plugins() failed: {type(exc).__name__}: {exc}") from exc


# ------------------------------------------------------------------------ per target


def _patch_check(target: str, form: str, source: str) -> tuple[str | None, str | None]:
    """(patch name, status) for ``source``: a shipped patch already applied wins, else the
    patch for this form, else none."""
    statuses = {
        name: patching.status(source, patching.read_patch(name))
        for name in patching.patch_names(target)
    }
    for name, status in statuses.items():
        # An upstream-fixed file can contain exactly what a patch adds (0.5.14 holds
        # PR 28378): only report it when the form would otherwise need that patch or
        # the classifier does not recognise the result.
        if status == patching.ALREADY_APPLIED and form not in GOOD_FORMS:
            return name, patching.ALREADY_APPLIED
    name = patching.patch_for(target, form)
    if name is None:
        return None, None
    return name, statuses[name]


def _classify(target: str, source: str) -> tuple[str, str, str]:
    """(form, sha256 of the target's source, classifier's reason)."""
    if target == SGLANG:
        r = sglang_forms.analyze_source(source)
        return r.form, r.function_sha256, r.reason
    r = aiter_forms.analyze_source(source)
    return r.form, r.source_sha256, r.reason


def _actions(target: str) -> dict[str, str]:
    return sglang_forms.ACTIONS if target == SGLANG else aiter_forms.ACTIONS


def _audit_source(target: str, path: Path, source_mode: bool, dist: str | None, version: str | None) -> TargetReport:
    source = _read(path)
    form, sha, why = _classify(target, source)
    patch, pstatus = _patch_check(target, form, source)
    return TargetReport(
        target=target,
        distribution=dist,
        version=version,
        file=str(path),
        sha256=sha or None,
        form=form,
        action=_actions(target).get(form, ""),
        hook_live=None if source_mode else False,
        patch=patch,
        patch_status=pstatus,
        reason=why,
        source=source,
    )


def _not_installed(target: str) -> TargetReport:
    return TargetReport(
        target=target,
        distribution=None,
        version=None,
        file=None,
        sha256=None,
        form="not installed",
        action="nothing to do",
        hook_live=False,
        patch=None,
        patch_status=None,
        installed=False,
        reason=f"{target} is not installed in this environment",
    )


def _verdict(rep: TargetReport, view: PluginView | None) -> None:
    """Fill covered / needs_attention / reason / hook for one target."""
    if not rep.installed:
        rep.hook = "-"
        return
    if rep.patch_status == patching.DRIFT:
        rep.notes.append(f"{rep.patch} does not apply to this file (drift): the patch needs updating")
    if rep.patch_status == patching.ALREADY_APPLIED:
        rep.covered = True
        rep.hook = "-"
        rep.reason = f"{rep.patch} is applied to this file"
        rep.needs_attention = False
        return
    if rep.form in GOOD_FORMS:
        rep.hook = "-"
        rep.covered = True
        rep.reason = {
            "fixed": "fixed upstream",
            "count-honored": "aiter already honours num_local_tokens",
            "absent": "nothing of this kind in this version",
        }[rep.form]
        rep.needs_attention = rep.patch_status == patching.DRIFT
        return
    if rep.form == "unknown":
        rep.hook = "?"
        rep.needs_attention = True
        rep.reason = f"unrecognised form ({rep.reason}); the plugin only guards it and warns"
        return
    # A broken form: is the plugin going to fix it?
    apply_cmd = ""
    if rep.patch and rep.patch_status == patching.APPLIES and rep.file:
        apply_cmd = f"patch --forward {rep.file} {patching.patch_path(rep.patch)}"
    if view is None:  # --*-source: the image's plugin is not visible from here
        rep.hook = "?"
        rep.needs_attention = True
        rep.reason = (
            f"{rep.form}: install sglang-amd-moe in that environment (SGLang >= 0.5.11) "
            f"or apply {rep.patch or 'a fix'}"
        )
        return
    if rep.target == SGLANG:
        routes = [("SGLang", view.sglang_loader, view.sglang_ep)]
    else:
        routes = [("SGLang", view.sglang_loader, view.sglang_ep), ("vLLM", view.vllm_installed, view.vllm_ep)]
    blockers: list[str] = []
    would = False
    for host, has_loader, ep in routes:
        if not has_loader:
            if host == "SGLang":
                ver = _distribution("sglang")[1] if view.sglang_dir is not None else None
                blockers.append(
                    f"{'SGLang ' + ver if ver else 'this SGLang'} has no plugin loader "
                    "(sglang.srt.plugins): the plugin cannot load here"
                )
            continue
        if ep is None:
            blockers.append(f"sglang-amd-moe's {host} entry point is not registered (is it installed here?)")
            continue
        off = _disabled_by_env(ep.name)
        if off:
            blockers.append(f"plugin disabled: {off}")
            continue
        would = True
    if view.loaded or (view.load_error and rep.target == SGLANG):
        rep.hook = "live" if rep.hook_live else ("no loader" if not view.sglang_loader else "not live")
        rep.covered = bool(rep.hook_live)
        if rep.covered:
            rep.reason = f"{rep.form}: hook live in this process"
        else:
            msg = _hook_message(rep.target)
            why = "; ".join(blockers) or (msg or "load_plugins() ran but the hook is not in place")
            hint = f"; apply the patch instead: {apply_cmd}" if apply_cmd else ""
            rep.reason = f"{rep.form}: not covered: {why}{hint}"
        rep.needs_attention = not rep.covered
        return
    if would:
        rep.covered = True
        rep.hook = "on load"
        hosts = " or ".join(h for h, ok, ep in routes if ok and ep is not None and not _disabled_by_env(ep.name))
        rep.reason = f"{rep.form}: covered: the plugin hooks it when {hosts} loads plugins"
        rep.needs_attention = rep.patch_status == patching.DRIFT
        return
    no_loader = any("no plugin loader" in b for b in blockers)
    rep.hook = "no loader" if no_loader else "off"
    rep.needs_attention = True
    hint = f"; {'apply the patch instead' if no_loader else 'or apply the patch'}: {apply_cmd}" if apply_cmd else ""
    rep.reason = f"{rep.form}: not covered: {'; '.join(blockers)}{hint}"


# ------------------------------------------------------------------------ diff


_DIFF_FUNCS = {SGLANG: (sglang_forms.FUNCTION_NAME,), AITER: ("_adaptive_moe_sort", "_moe_sorting_impl")}


def _functions_source(source: str, names: tuple[str, ...]) -> str:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    parts = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in names:
            parts.append(ast.get_source_segment(source, node) or "")
    return "\n\n".join(parts) + ("\n" if parts else "")


def function_diff(rep: TargetReport) -> str:
    """Unified diff of the installed target function(s) against their fixed form."""
    if not rep.installed or not rep.source:
        return f"# {rep.target}: not installed\n"
    names = _DIFF_FUNCS[rep.target]
    if rep.patch_status == patching.ALREADY_APPLIED or rep.form in GOOD_FORMS:
        return f"# {rep.target}: {', '.join(names)} is already in its fixed form ({rep.form})\n"
    if rep.patch is None:
        return f"# {rep.target}: no patch for form {rep.form!r}; nothing to diff against\n"
    if rep.patch_status != patching.APPLIES:
        return f"# {rep.target}: {rep.patch} {rep.patch_status}; no diff\n"
    fixed = patching.apply_text(rep.source, patching.read_patch(rep.patch))
    before = _functions_source(rep.source, names).splitlines(keepends=True)
    after = _functions_source(fixed, names).splitlines(keepends=True)
    return "".join(
        difflib.unified_diff(
            before,
            after,
            fromfile=f"installed: {rep.file} ({', '.join(names)})",
            tofile=f"fixed: after {rep.patch}",
        )
    )


# ------------------------------------------------------------------------ output


def _table(reports: list[TargetReport], exit_status: int, view: PluginView | None) -> str:
    rows = [("TARGET", "INSTALLED", "FORM", "HOOK", "PATCH", "PATCH STATUS")]
    for r in reports:
        if not r.installed:
            inst = "not installed"
        elif view is None:
            inst = "(source file)"
        elif r.version:
            inst = f"{r.distribution or r.target} {r.version}"
        else:
            inst = f"{r.distribution or r.target} (no metadata)"
        rows.append((r.target, inst, r.form if r.installed else "-", r.hook, r.patch or "-", r.patch_status or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.append("")
    for r in reports:
        if not r.installed:
            continue
        pad = " " * (len(r.target) + 2)
        mark = "!!" if r.needs_attention else "ok"
        lines.append(f"{r.target}  {mark} {r.reason}")
        lines.append(f"{pad}plugin action: {r.action}")
        lines.append(f"{pad}file: {r.file}")
        lines.append(f"{pad}sha256: {r.sha256 or '-'}")
        for n in r.notes:
            lines.append(f"{pad}note: {n}")
    if view is not None and any(r.installed and r.form in BROKEN_FORMS for r in reports) and _on_rocm() is False:
        lines.append(
            "note: torch here is not a ROCm build: the plugin stays off on this machine "
            "(SGLANG_AMD_MOE_FORCE=1 forces it); the verdict is for a ROCm machine with this software"
        )
    n = sum(r.needs_attention for r in reports)
    lines.append(
        "OK: nothing needs action (exit 0)" if exit_status == 0 else f"ATTENTION: {n} target(s) need action (exit 1)"
    )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ main


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="sglang-amd-moe audit",
        description=(
            "Report, for SGLang's _post_process_topk_ids and aiter's MXFP4 aux sort: what is "
            "installed, its form, what the plugin does about it, whether the hook is live, and "
            "the matching patch. Exit 0: nothing needs action; 1: something needs attention; 2: error."
        ),
    )
    ap.add_argument("--load", action="store_true", help="run SGLang's real load_plugins() first, then check the hooks")
    ap.add_argument("--diff", action="store_true", help="print the unified diff installed -> fixed of each target")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--sglang-source", type=Path, metavar="FILE", help="classify this topk.py instead (imports nothing)")
    ap.add_argument("--aiter-source", type=Path, metavar="FILE", help="classify this fused_moe.py instead (imports nothing)")
    return ap


def run(argv: list[str] | argparse.Namespace) -> tuple[int, list[TargetReport], PluginView | None]:
    """Audit and return (exit status, reports, plugin view); raises AuditError/SystemExit."""
    args = argv if isinstance(argv, argparse.Namespace) else _parser().parse_args(argv)
    source_mode = args.sglang_source is not None or args.aiter_source is not None
    if source_mode and args.load:
        raise AuditError("--load audits this environment; it cannot be combined with --sglang-source/--aiter-source")
    reports: list[TargetReport] = []
    view: PluginView | None = None
    if source_mode:
        if args.sglang_source is not None:
            reports.append(_audit_source(SGLANG, args.sglang_source, True, None, None))
        if args.aiter_source is not None:
            reports.append(_audit_source(AITER, args.aiter_source, True, None, None))
    else:
        sglang_dir = _find_package_dir("sglang")
        view = _plugin_view(sglang_dir)
        if args.load:
            _run_load_plugins(view)
        for target, top, rel in ((SGLANG, "sglang", SGLANG_REL), (AITER, "aiter", AITER_REL)):
            pkg = sglang_dir if target == SGLANG else _find_package_dir(top)
            if pkg is None:
                reports.append(_not_installed(target))
                continue
            dist, version = _distribution(top)
            path = pkg / rel
            if not path.is_file():
                rep = _not_installed(target)
                rep.installed = True
                rep.distribution, rep.version, rep.file, rep.form = dist, version, str(path), "absent"
                rep.action = _actions(target).get("absent", "")
                rep.reason = f"no {rel} in this {top}"
                reports.append(rep)
                continue
            rep = _audit_source(target, path, False, dist, version)
            rep.hook_live = _hook_live(target)
            reports.append(rep)
    for rep in reports:
        _verdict(rep, view)
    exit_status = 1 if any(r.needs_attention for r in reports) else 0
    return exit_status, reports, view


def main(argv: list[str]) -> int:
    """Entry point of ``sglang-amd-moe audit`` (see the module docstring)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or bad usage (2)
        return 0 if exc.code in (0, None) else 2
    try:
        exit_status, reports, view = run(args)
    except (AuditError, patching.PatchError) as exc:
        print(f"sglang-amd-moe audit: error: {exc}", file=sys.stderr)
        return 2
    except Exception:  # a bug of ours must not read as "needs attention" (1)
        traceback.print_exc()
        print("sglang-amd-moe audit: internal error (above)", file=sys.stderr)
        return 2
    try:
        if args.json:
            doc = {"exit_status": exit_status, "targets": [r.to_json() for r in reports]}
            if args.diff:
                doc["diff"] = {r.target: function_diff(r) for r in reports}
            print(json.dumps(doc, indent=2))
        else:
            sys.stdout.write(_table(reports, exit_status, view))
            if args.diff:
                for r in reports:
                    sys.stdout.write("\n" + function_diff(r))
    except (AuditError, patching.PatchError) as exc:
        print(f"sglang-amd-moe audit: error: {exc}", file=sys.stderr)
        return 2
    return exit_status

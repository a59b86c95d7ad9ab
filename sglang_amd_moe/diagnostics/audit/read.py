"""The audit's reading: each target's file, found without importing it, its form (the
ledger for SGLang, ``forms`` for aiter) and its patch."""

from __future__ import annotations

import ast
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_amd_moe.diagnostics import patching, topk_source
from sglang_amd_moe.diagnostics.sources import SourceError, distribution, read_source
from sglang_amd_moe.runtime.aiter import forms as aiter_forms
from sglang_amd_moe.runtime.sglang import ledger, names
from sglang_amd_moe.runtime.target import HookStatus

#: Keys every target has in ``--json`` output, first and in this order (more follow).
JSON_KEYS = tuple("target distribution version file sha256 form action hook_live".split())
JSON_KEYS += ("patch", "patch_status")
SGLANG, AITER, GUARD = "sglang", "aiter", "guard"
SGLANG_REL, AITER_REL = Path("srt/layers/moe/topk.py"), Path("fused_moe.py")
PATCH_FAILS_PROBE = "not offered (fails the probe)"  # --load: applies as text, runs wrong
GOOD_FORMS = {  # forms that need nothing from anyone, and why
    (SGLANG, "fixed"): "fixed upstream: the HIP branch masks padded ids",
    (AITER, "count-honored"): "aiter already honours num_local_tokens",
    (AITER, "absent"): "this aiter has no MXFP4 aux sort",
}
BROKEN_FORMS = frozenset(  # forms the plugin hooks to fix
    "no-hip-handling weights-only mask-under-eplb-guard count-dropped count-rejected".split()
)
#: What each fingerprint (``sha256``) is taken over: never the whole file.
FINGERPRINT_OF = {SGLANG: f"{names.FUNCTION_NAME} and the module code it uses"}
FINGERPRINT_OF[AITER] = "the sort path's functions"
#: A file given with ``--*-source`` is the target's own when it defines one of these.
_OWN = {SGLANG: "fused_topk select_experts TopK _post_process_topk_ids"}
_OWN[AITER] = "fused_moe moe_sorting"
_FILE = {SGLANG: "SGLang's sglang/srt/layers/moe/topk.py", AITER: "aiter's aiter/fused_moe.py"}


class AuditError(SourceError):
    """Something the audit cannot work around (unreadable file, failed ``load_plugins()``)."""


@dataclass
class TargetReport:
    target: str
    distribution: str | None
    version: str | None
    file: str | None
    sha256: str | None
    form: str | None
    action: str
    hook_live: bool | None
    patch: str | None
    patch_status: str | None
    covered: bool = False  # beyond the stable keys: the verdict and why
    needs_attention: bool = False
    reason: str = ""
    hook: str = "-"  # the HOOK cell of the table
    hook_state: str | None = None  # HookStatus.state after --load (None: not asked)
    patch_file: str | None = None
    apply_command: str | None = None
    notes: list[str] = field(default_factory=list)
    installed: bool = True
    probe: dict | None = None  # --load, SGLang: the function run on the probe batch
    patch_probe: dict | None = None  # --load, SGLang: the patched function, run
    nearest: dict | None = None  # an unknown SGLang body: the nearest known one, the diff
    hook_message: str | None = None  # --load: the plugin's own log line for this target
    guard: dict | None = None  # aiter: the count-free guard at its MoE entry (state, live, why)
    coverage: dict | None = None  # SGLang: which paths pass a count, what protects them
    source: str = field(default="", repr=False)  # this and below: not in the JSON
    status: HookStatus | None = field(default=None, repr=False)
    seen: Any = field(default=None, repr=False)

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr}
        return d | {"notes": list(self.notes)}  # a copy: the report may take more notes


def build_report(
    target: str, path: Path, source: str, dist: str | None, version: str | None, *, given: bool
) -> TargetReport:
    nearest = None
    if target == SGLANG:
        r = ledger.read(source, modules=path)
        form, sha, why, actions = r.form, r.fingerprint, r.why, names.ACTIONS
        if form == "unknown":
            nearest = topk_source.nearest(topk_source.function_text(r.node))
            newer = ledger.newer_than_ledger(version)  # words only
            why += f"; {newer}" if newer else ""
    else:
        a = aiter_forms.analyze_source(source)
        form, sha, why, actions = a.form, a.source_sha256, a.reason, aiter_forms.ACTIONS
    shipped = patching.patch_names(target)  # one that is applied wins; else the form's patch
    status = {n: patching.status(source, patching.read_patch(n)) for n in shipped}
    applied = [n for n, s in status.items() if s == patching.ALREADY_APPLIED]
    patch = applied[0] if applied else patching.patch_for(target, form)
    rep = TargetReport(
        target, dist, version, str(path), sha or None, form, actions.get(form, ""),
        None if given else False, patch, status.get(patch or ""), reason=why, source=source,
        nearest=nearest,
    )  # fmt: skip
    if nearest is not None and not nearest["diff"]:
        rep.reason += f"; its function is {nearest['body']}'s, the module code it uses differs"
    return rep


def given_file(target: str, path: Path) -> TargetReport:
    """``--sglang-source`` / ``--aiter-source``: the file must be the target's own."""
    source = read_source(path)
    own, defining = _FILE[target], set(_OWN[target].split())
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        why = f"it does not parse as Python ({exc.msg}, line {exc.lineno})"
        raise AuditError(f"{path} is not {own}: {why}") from exc
    kinds = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    if not {n.name for n in tree.body if isinstance(n, kinds)} & defining:
        raise AuditError(f"{path} is not {own}: it defines none of {', '.join(sorted(defining))}")
    return build_report(target, path, source, None, None, given=True)


def installed(target: str, package_dir: Path | None) -> TargetReport:
    if package_dir is None:
        return not_installed(target)
    rel = SGLANG_REL if target == SGLANG else AITER_REL
    (dist, version), path = distribution(target), package_dir / rel
    if os.path.lexists(path):
        return build_report(target, path, read_source(path), dist, version, given=False)
    rep = not_installed(target)
    rep.installed, rep.distribution, rep.version = True, dist, version
    rep.file, rep.form, rep.reason = str(path), "absent", f"no {rel} in this {target}"
    rep.action = (names.ACTIONS if target == SGLANG else aiter_forms.ACTIONS).get("absent", "")
    return rep


def not_installed(target: str) -> TargetReport:
    none = (None,) * 4
    return TargetReport(
        target, *none, "not installed", "nothing to do", False, None, None, installed=False
    )

"""The audit's reading: each target's file, found without importing it, its form (the
ledger for SGLang, ``forms`` for aiter) and its patch."""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata as md
import importlib.util
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_amd_moe.diagnostics import patching
from sglang_amd_moe.runtime.aiter import forms as aiter_forms
from sglang_amd_moe.runtime.sglang import ledger, names
from sglang_amd_moe.runtime.target import HookStatus

#: Keys every target has in ``--json`` output, first and in this order (more follow).
JSON_KEYS = tuple("target distribution version file sha256 form action hook_live".split())
JSON_KEYS += ("patch", "patch_status")
SGLANG, AITER, GUARD = "sglang", "aiter", "guard"
SGLANG_REL, AITER_REL = Path("srt/layers/moe/topk.py"), Path("fused_moe.py")
MAX_SOURCE_BYTES = 4 * 1024 * 1024  # SGLang's topk.py is about 130 kB
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
_OWN = {
    SGLANG: (
        "SGLang's sglang/srt/layers/moe/topk.py",
        f"fused_topk select_experts TopK {names.FUNCTION_NAME}",
    ),
    AITER: ("aiter's aiter/fused_moe.py", "fused_moe moe_sorting"),
}
GUARD_ACTION = (
    "guard aiter's MoE entry: ids outside [0, E) (and rows past a count) -> expert 0, weight 0"
)
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device"}
_KINDS |= {stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO or pipe"}


class AuditError(Exception):
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
    coverage: dict | None = None  # SGLang: which paths pass a count, what protects them
    source: str = field(default="", repr=False)  # this and below: not in the JSON
    status: HookStatus | None = field(default=None, repr=False)
    seen: Any = field(default=None, repr=False)

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr}
        return {**{k: d.pop(k) for k in JSON_KEYS}, **d, "notes": list(self.notes)}


def read_source(path: Path) -> str:
    """Text of the regular file ``path`` (at most MAX_SOURCE_BYTES), else AuditError. It is
    opened non-blocking and checked first: a FIFO cannot hang it, nor /dev/zero fill memory."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st, data = os.fstat(fd), b""
            if not stat.S_ISREG(st.st_mode):
                kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a plain file")
                raise AuditError(f"{path} is not a regular file ({kind}): give the source file")
            if st.st_size > MAX_SOURCE_BYTES:
                too_big = f"{st.st_size} bytes, more than a source file (limit {MAX_SOURCE_BYTES})"
                raise AuditError(f"{path} is {too_big}")
            while len(data) <= MAX_SOURCE_BYTES and (
                chunk := os.read(fd, MAX_SOURCE_BYTES + 1 - len(data))
            ):
                data += chunk
        finally:
            os.close(fd)
    except OSError as exc:
        raise AuditError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_SOURCE_BYTES:
        raise AuditError(f"{path} grew past {MAX_SOURCE_BYTES} bytes while being read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AuditError(f"{path} is not UTF-8 Python source ({exc.reason})") from exc


def text_or_none(path: Path) -> str | None:
    try:
        return read_source(path)
    except AuditError:
        return None


def find_package_dir(name: str) -> Path | None:
    """Directory of top-level package ``name`` without importing it (None if absent)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locs = list(spec.submodule_search_locations or []) if spec else []
    if spec is None or (spec.origin in (None, "namespace") and locs):
        return None  # absent, or a bare directory on sys.path
    if locs or not spec.origin or spec.origin in ("built-in", "frozen"):
        return Path(locs[0]) if locs else None
    return Path(spec.origin).parent


def distribution(top: str) -> tuple[str | None, str | None]:
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


def torch_is_rocm() -> bool | None:
    """Whether torch here is a ROCm build (None: no torch), importing nothing."""
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "version", None) is not None:
        return bool(getattr(torch.version, "hip", None))
    torch_dir = find_package_dir("torch")
    text = text_or_none(torch_dir / "version.py") if torch_dir is not None else None
    hip = [
        ln.split("=", 1)[1]
        for ln in (text or "").splitlines()
        if ln.startswith("hip") and "=" in ln
    ]
    return None if text is None else bool(hip) and hip[0].strip() not in ("None", "''", '""')


def build_report(
    target: str, path: Path, source: str, dist: str | None, version: str | None, *, given: bool
) -> TargetReport:
    nearest = None
    if target == SGLANG:
        r = ledger.read(source)
        form, sha, why, actions = r.form, r.fingerprint, r.why, names.ACTIONS
        nearest = ledger.nearest(r.body) if form == "unknown" else None
    else:
        a = aiter_forms.analyze_source(source)
        form, sha, why, actions = a.form, a.source_sha256, a.reason, aiter_forms.ACTIONS
    # A shipped patch that is applied wins; else the form's patch.
    status = {
        n: patching.status(source, patching.read_patch(n)) for n in patching.patch_names(target)
    }
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
    own, defining = _OWN[target][0], set(_OWN[target][1].split())
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
    return TargetReport(
        target, None, None, None, None, "not installed", "nothing to do", False, None, None,
        installed=False,
    )  # fmt: skip


def guard_report(aiter: TargetReport) -> TargetReport:
    """The count-free guard's row: installed where aiter is, on aiter's MoE entry."""
    rep = not_installed(GUARD)
    if aiter.installed:
        rep.installed, rep.form, rep.hook_live, rep.action = True, None, False, GUARD_ACTION
        rep.distribution, rep.version, rep.file = aiter.distribution, aiter.version, aiter.file
    return rep

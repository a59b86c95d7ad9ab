"""The audit's reading: find each target's file without importing it, read it safely,
and name its form (the ledger for SGLang, ``forms`` for aiter) and its patch."""

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
SGLANG, AITER = "sglang", "aiter"
SGLANG_REL = Path("srt/layers/moe/topk.py")
AITER_REL = Path("fused_moe.py")
#: The largest source file the audit reads (SGLang's topk.py is about 130 kB).
MAX_SOURCE_BYTES = 4 * 1024 * 1024
#: ``patch_status`` (``--load``) of a patch that applies as text but whose patched
#: function the probe finds wrong: it is not offered (no path, no command).
PATCH_FAILS_PROBE = "not offered (fails the probe)"
#: Forms that need nothing from anyone, and why.
GOOD_FORMS: dict[tuple[str, str], str] = {
    (SGLANG, "fixed"): "fixed upstream: the HIP branch masks padded ids",
    (AITER, "count-honored"): "aiter already honours num_local_tokens",
    (AITER, "absent"): "this aiter has no MXFP4 aux sort",
}
#: Forms the plugin hooks to fix.
BROKEN_FORMS = set("no-hip-handling weights-only mask-under-eplb-guard".split()) | {
    "count-dropped",
    "count-rejected",
}
#: A file given with ``--*-source`` is the target's own when it defines one of these.
_OWN_NAMES = {
    SGLANG: frozenset({"fused_topk", "select_experts", "TopK", names.FUNCTION_NAME}),
    AITER: frozenset({"fused_moe", "moe_sorting"}),
}
_OWN_FILE = {SGLANG: "SGLang's sglang/srt/layers/moe/topk.py", AITER: "aiter's aiter/fused_moe.py"}


class AuditError(Exception):
    """Something the audit cannot work around (unreadable file, failed ``load_plugins()``)."""


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
    guard: dict | None = None  # aiter: the guard at its MoE entry (state, live, why)
    source: str = field(default="", repr=False)  # this and below: not in the JSON
    status: HookStatus | None = field(default=None, repr=False)
    seen: Any = field(default=None, repr=False)

    def to_json(self) -> dict:
        hidden = ("source", "status", "seen")
        d = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in hidden
        }
        d["notes"] = list(self.notes)
        return {**{k: d.pop(k) for k in JSON_KEYS}, **d}


def read_source(path: Path) -> str:
    """Text of the regular file ``path`` (at most :data:`MAX_SOURCE_BYTES`); raises
    :class:`AuditError` for anything else. Opened non-blocking and checked before
    anything is read, so a FIFO cannot hang the audit nor /dev/zero fill its memory."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise AuditError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _file_kind(st.st_mode)
            raise AuditError(f"{path} is not a regular file ({kind}): give the source file itself")
        if st.st_size > MAX_SOURCE_BYTES:
            raise AuditError(
                f"{path} is {st.st_size} bytes, more than a source file of this kind "
                f"(limit {MAX_SOURCE_BYTES})"
            )
        chunks, size = [], 0
        while size <= MAX_SOURCE_BYTES:
            chunk = os.read(fd, MAX_SOURCE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise AuditError(f"cannot read {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(data) > MAX_SOURCE_BYTES:
        raise AuditError(f"{path} grew past {MAX_SOURCE_BYTES} bytes while being read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AuditError(f"{path} is not UTF-8 Python source ({exc.reason})") from exc


def _file_kind(mode: int) -> str:
    kinds = zip(
        (stat.S_ISDIR, stat.S_ISCHR, stat.S_ISBLK, stat.S_ISFIFO, stat.S_ISSOCK),
        ("a directory", "a character device", "a block device", "a FIFO or pipe", "a socket"),
        strict=True,
    )
    return next((kind for test, kind in kinds if test(mode)), "not a plain file")


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
    if spec is None:
        return None
    locs = list(spec.submodule_search_locations or [])
    if spec.origin in (None, "namespace") and locs:
        return None  # a bare directory on sys.path, not an installed package
    if locs:
        return Path(locs[0])
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        return Path(spec.origin).parent
    return None


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
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("hip") and "=" in line:
            return line.split("=", 1)[1].strip() not in ("None", "''", '""')
    return False


def _patch_check(target: str, form: str, source: str) -> tuple[str | None, str | None]:
    """(patch, status): a shipped patch that is applied wins, else the form's patch."""
    statuses = {
        name: patching.status(source, patching.read_patch(name))
        for name in patching.patch_names(target)
    }
    for name, status in statuses.items():
        if status == patching.ALREADY_APPLIED:
            return name, status
    name = patching.patch_for(target, form)
    return (name, statuses[name]) if name else (None, None)


def build_report(
    target: str, path: Path, source: str, dist: str | None, version: str | None, *, given: bool
) -> TargetReport:
    nearest = None
    if target == SGLANG:
        r = ledger.read(source)
        form, sha, why = r.form, r.fingerprint, r.why
        actions: dict[str, str] = names.ACTIONS
        nearest = ledger.nearest(r.body) if form == "unknown" else None
    else:
        a = aiter_forms.analyze_source(source)
        form, sha, why, actions = a.form, a.source_sha256, a.reason, aiter_forms.ACTIONS
    patch, pstatus = _patch_check(target, form, source)
    rep = TargetReport(
        target, dist, version, str(path), sha or None, form, actions.get(form, ""),
        None if given else False, patch, pstatus, reason=why, source=source,
    )  # fmt: skip
    if nearest is not None and not nearest["diff"]:
        rep.reason += f"; its function is {nearest['body']}'s, the module code it uses differs"
    rep.nearest = nearest
    return rep


def given_file(target: str, path: Path) -> TargetReport:
    """``--sglang-source`` / ``--aiter-source``: the file must be the target's own."""
    source = read_source(path)
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise AuditError(
            f"{path} is not {_OWN_FILE[target]}: it does not parse as Python "
            f"({exc.msg}, line {exc.lineno})"
        ) from exc
    defined = {
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    if not defined & _OWN_NAMES[target]:
        none_of = ", ".join(sorted(_OWN_NAMES[target]))
        raise AuditError(f"{path} is not {_OWN_FILE[target]}: it defines none of {none_of}")
    return build_report(target, path, source, None, None, given=True)


def installed(target: str, package_dir: Path | None) -> TargetReport:
    if package_dir is None:
        return not_installed(target)
    rel = SGLANG_REL if target == SGLANG else AITER_REL
    dist, version = distribution(target)
    path = package_dir / rel
    if not os.path.lexists(path):
        rep = not_installed(target)
        rep.installed, rep.distribution, rep.version = True, dist, version
        rep.file, rep.form, rep.reason = str(path), "absent", f"no {rel} in this {target}"
        rep.action = (names.ACTIONS if target == SGLANG else aiter_forms.ACTIONS).get("absent", "")
        return rep
    return build_report(target, path, read_source(path), dist, version, given=False)


def not_installed(target: str) -> TargetReport:
    return TargetReport(
        target, None, None, None, None, "not installed", "nothing to do", False, None, None,
        installed=False,
    )  # fmt: skip

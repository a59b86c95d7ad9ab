"""Read, check and apply the unified diffs shipped in ``sglang_amd_moe.patches``.

The audit must say whether a patch applies to the installed file, is already applied,
or no longer matches it (drift), on machines that may have no ``patch`` or ``git``
binary (slim serving images). So this module applies unified diffs itself, with the
same rules as ``patch -p1`` without fuzz: each hunk's old lines must match exactly,
at the line the header names or shifted by any offset (nearest first), and hunks
apply in order. A hunk with less leading than trailing context (the no-hip-handling
patch uses one to insert before ``return``) is matched the same way, which is what GNU
patch and ``git apply`` do too.

Only the standard library is used.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import shlex
from dataclasses import dataclass, field
from importlib import resources

#: (target, form) -> patch file name in ``sglang_amd_moe.patches``.
PATCHES: dict[tuple[str, str], str] = {
    ("sglang", "no-hip-handling"): "sglang-no-hip-handling.diff",
    ("sglang", "weights-only"): "sglang-weights-only.diff",
    ("sglang", "mask-under-eplb-guard"): "sglang-mask-under-eplb-guard.diff",
    ("aiter", "count-dropped"): "aiter-count-dropped.diff",
}

APPLIES = "applies"
ALREADY_APPLIED = "already applied"
DRIFT = "does not apply (drift)"

#: GNU patch options of every command this package prints or documents: refuse fuzz
#: (GNU patch accepts fuzz 2 by default; this module matches hunks exactly, so a hunk
#: it calls drift must not apply), make no ``.orig`` backup when a hunk lands at an
#: offset, and discard rejects instead of leaving ``.rej`` files beside the target.
PATCH_OPTIONS = "--forward --fuzz=0 --no-backup-if-mismatch --reject-file=-"

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """The patch text is malformed, or a hunk does not match the file."""


@dataclass(frozen=True)
class Hunk:
    old_start: int  # 1-based, as in the header
    old: tuple[str, ...]  # context and removed lines
    new: tuple[str, ...]  # context and added lines


@dataclass(frozen=True)
class FilePatch:
    old_path: str
    new_path: str
    hunks: tuple[Hunk, ...] = field(default_factory=tuple)


def patch_names(target: str | None = None) -> list[str]:
    """Names of the shipped patches (all, or those of ``target``: "sglang"/"aiter")."""
    return [name for (t, _), name in PATCHES.items() if target is None or t == target]


def patch_for(target: str, form: str) -> str | None:
    """The patch that fixes ``form`` of ``target``, or None when the form needs none."""
    return PATCHES.get((target, form))


def read_patch(name: str) -> str:
    """Text of a shipped patch (from the installed package, wheel or editable)."""
    if "/" in name or "\\" in name or not name.endswith(".diff"):
        raise ValueError(f"not a patch name: {name!r}")
    return resources.files("sglang_amd_moe.patches").joinpath(name).read_text()


def patch_path(name: str) -> str:
    """Filesystem path of a shipped patch (for the commands the audit prints)."""
    return str(resources.files("sglang_amd_moe.patches").joinpath(name))


def apply_args(target_file: str, name: str) -> str:
    """GNU patch's arguments for shipped patch ``name`` on ``target_file``: a symlink is
    given as the file it points to (patch refuses links), and a name starting with ``-``
    as ``./-...`` (patch would read it as options)."""
    if os.path.islink(target_file):
        target_file = os.path.realpath(target_file)
    if target_file.startswith("-"):
        target_file = "./" + target_file
    return f"{PATCH_OPTIONS} {shlex.quote(target_file)} {shlex.quote(patch_path(name))}"


def apply_command(target_file: str, name: str) -> str:
    """The shell command that applies ``name`` to ``target_file``, all or nothing: GNU
    patch writes the hunks that match even when another fails, so a dry run goes first."""
    args = apply_args(target_file, name)
    return f"patch --dry-run {args} && patch {args}"


def parse(text: str) -> list[FilePatch]:
    """Parse a unified diff; text before the first ``--- `` line is commentary."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out: list[FilePatch] = []
    i = 0
    while i < len(lines):
        if not (
            lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
        ):
            i += 1
            continue
        old_path = lines[i][4:].split("\t")[0].strip()
        new_path = lines[i + 1][4:].split("\t")[0].strip()
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK_RE.match(lines[i])
            if not m:
                raise PatchError(f"bad hunk header: {lines[i]!r}")
            old_start = int(m.group(1))
            old_len = int(m.group(2)) if m.group(2) is not None else 1
            new_len = int(m.group(4)) if m.group(4) is not None else 1
            i += 1
            old: list[str] = []
            new: list[str] = []
            while len(old) < old_len or len(new) < new_len:
                if i >= len(lines):
                    raise PatchError(f"hunk at -{old_start} ends early")
                line = lines[i]
                i += 1
                if line.startswith("\\"):  # "\ No newline at end of file"
                    continue
                tag, body = (line[:1], line[1:]) if line else (" ", "")
                if tag == " ":
                    old.append(body)
                    new.append(body)
                elif tag == "-":
                    old.append(body)
                elif tag == "+":
                    new.append(body)
                else:
                    raise PatchError(f"bad line in hunk at -{old_start}: {line!r}")
            if len(old) != old_len or len(new) != new_len:
                raise PatchError(f"hunk at -{old_start}: line counts do not match its header")
            while i < len(lines) and lines[i].startswith("\\"):
                i += 1
            hunks.append(Hunk(old_start, tuple(old), tuple(new)))
        if not hunks:
            raise PatchError(f"no hunks for {old_path}")
        out.append(FilePatch(old_path, new_path, tuple(hunks)))
    if not out:
        raise PatchError("no file patch found")
    return out


def _single(text: str) -> FilePatch:
    files = parse(text)
    if len(files) != 1:
        raise PatchError(f"expected a patch of one file, got {len(files)}")
    return files[0]


def _locate(lines: list[str], block: tuple[str, ...], expected: int, lower: int) -> int:
    """Index where ``block`` matches ``lines``, nearest to ``expected``, not before ``lower``."""
    n = len(block)
    last = len(lines) - n
    if last < lower:
        return -1
    expected = min(max(expected, lower), last)
    for delta in range(0, max(expected - lower, last - expected) + 1):
        for pos in (expected - delta, expected + delta) if delta else (expected,):
            if lower <= pos <= last and tuple(lines[pos : pos + n]) == block:
                return pos
    return -1


def apply_text(source: str, patch_text: str, *, reverse: bool = False) -> str:
    """Return ``source`` with the one-file ``patch_text`` applied (or reversed).

    Raises :class:`PatchError` naming the first hunk that does not match.
    """
    fp = _single(patch_text)
    lines = source.split("\n")
    out: list[str] = []
    cursor = 0
    offset = 0
    for k, h in enumerate(fp.hunks, 1):
        old, new = (h.new, h.old) if reverse else (h.old, h.new)
        pos = _locate(lines, old, h.old_start - 1 + offset, cursor)
        if pos < 0:
            raise PatchError(f"hunk #{k} (at line {h.old_start}) does not match")
        out.extend(lines[cursor:pos])
        out.extend(new)
        cursor = pos + len(old)
        offset = pos - (h.old_start - 1)
    out.extend(lines[cursor:])
    return "\n".join(out)


def status(source: str, patch_text: str) -> str:
    """``applies``, ``already applied`` or ``does not apply (drift)`` for ``source``.

    Decided as ``patch --forward`` decides: forward first, then reversed. A patch that
    only inserts lines at a file's edge could apply twice and cannot be told apart from
    an applied one; the shipped patches are made so that every one of them fails
    forward on a file it was applied to (tests check it).
    """
    try:
        apply_text(source, patch_text)
        return APPLIES
    except PatchError:
        pass
    try:
        apply_text(source, patch_text, reverse=True)
        return ALREADY_APPLIED
    except PatchError:
        return DRIFT


def functions_diff(source: str, name: str, funcs: tuple[str, ...], where: str) -> str:
    """Unified diff of the top-level functions ``funcs`` of ``source`` (the file ``where``)
    before and after shipped patch ``name``."""

    def segments(text: str) -> list[str]:
        kinds = ast.FunctionDef | ast.AsyncFunctionDef
        nodes = [n for n in ast.parse(text).body if isinstance(n, kinds) and n.name in funcs]
        text = "\n\n".join(ast.get_source_segment(text, n) or "" for n in nodes)
        return (text + "\n" * bool(nodes)).splitlines(keepends=True)

    before, after = segments(source), segments(apply_text(source, read_patch(name)))
    what = f"installed: {where} ({', '.join(funcs)})"
    return "".join(difflib.unified_diff(before, after, what, f"fixed: after {name}"))

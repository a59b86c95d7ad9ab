"""Read, check and apply the unified diffs shipped in ``sglang_amd_moe.patches``, with the
standard library only (slim serving images may have no ``patch`` or ``git``) and the rules
of ``patch -p1`` without fuzz: each hunk's old lines match exactly, at the line its header
names or shifted by any offset (nearest first), hunks in order."""

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

#: GNU patch options of every command printed: no fuzz (a hunk called drift here must not
#: apply), no ``.orig`` backup at an offset, no ``.rej`` files beside the target.
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


def patch_names(target: str | None = None) -> list[str]:  # all, or those of ``target``
    return [name for (t, _), name in PATCHES.items() if target is None or t == target]


def patch_for(target: str, form: str) -> str | None:  # None: the form needs none
    return PATCHES.get((target, form))


def read_patch(name: str) -> str:
    """Text of a shipped patch (from the installed package, wheel or editable)."""
    if "/" in name or "\\" in name or not name.endswith(".diff"):
        raise ValueError(f"not a patch name: {name!r}")
    return resources.files("sglang_amd_moe.patches").joinpath(name).read_text()


def patch_path(name: str) -> str:  # for the commands the audit prints
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
    lines, out, i = text.removesuffix("\n").split("\n"), [], 0
    while i < len(lines):
        if not (lines[i].startswith("--- ") and "".join(lines[i + 1 : i + 2])[:4] == "+++ "):
            i += 1
            continue
        paths, i, hunks = [ln[4:].split("\t")[0].strip() for ln in lines[i : i + 2]], i + 2, []
        while i < len(lines) and lines[i].startswith("@@"):
            if not (m := _HUNK_RE.match(lines[i])):
                raise PatchError(f"bad hunk header: {lines[i]!r}")
            start, sizes, i, old, new = int(m[1]), (int(m[2] or 1), int(m[4] or 1)), i + 1, [], []
            while len(old) < sizes[0] or len(new) < sizes[1]:
                if i >= len(lines):
                    raise PatchError(f"hunk at -{start} ends early")
                line, i = lines[i] or " ", i + 1  # an empty line: context
                if line[0] not in " -+\\":  # "\\ No newline at end of file" is skipped
                    raise PatchError(f"bad line in hunk at -{start}: {line!r}")
                old += [line[1:]] if line[0] in " -" else []
                new += [line[1:]] if line[0] in " +" else []
            if (len(old), len(new)) != sizes:
                raise PatchError(f"hunk at -{start}: line counts do not match its header")
            while i < len(lines) and lines[i].startswith("\\"):
                i += 1
            hunks.append(Hunk(start, tuple(old), tuple(new)))
        if not hunks:
            raise PatchError(f"no hunks for {paths[0]}")
        out.append(FilePatch(*paths, tuple(hunks)))
    if not out:
        raise PatchError("no file patch found")
    return out


def apply_text(source: str, patch_text: str, *, reverse: bool = False) -> str:
    """``source`` with the one-file ``patch_text`` applied (or reversed); PatchError names
    the first hunk that does not match. Each hunk is found nearest to where its header
    says (after the previous hunk's offset), not before the previous hunk's end."""
    files = parse(patch_text)
    if len(files) != 1:
        raise PatchError(f"expected a patch of one file, got {len(files)}")
    lines, out, cursor, offset = source.split("\n"), [], 0, 0
    for k, h in enumerate(files[0].hunks, 1):
        old, new = (h.new, h.old) if reverse else (h.old, h.new)
        last = len(lines) - len(old)
        at = min(max(h.old_start - 1 + offset, cursor), last)
        near = sorted(range(cursor, last + 1), key=lambda p: (abs(p - at), p > at))
        pos = next((p for p in near if tuple(lines[p : p + len(old)]) == old), -1)
        if pos < 0:
            raise PatchError(f"hunk #{k} (at line {h.old_start}) does not match")
        out += [*lines[cursor:pos], *new]
        cursor, offset = pos + len(old), pos - (h.old_start - 1)
    return "\n".join(out + lines[cursor:])


def status(source: str, patch_text: str) -> str:
    """``applies``, ``already applied`` or ``does not apply (drift)``, decided as ``patch
    --forward`` decides: forward first, then reversed (every shipped patch fails forward on
    a file it was applied to; tests check it)."""
    for reverse, answer in ((False, APPLIES), (True, ALREADY_APPLIED)):
        try:
            apply_text(source, patch_text, reverse=reverse)
            return answer
        except PatchError:
            continue
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

"""The shipped SGLang patches apply to the real topk.py of every release of their form,
turn it into the `fixed` form, and make the real release behave fixed.

Files come from the releases' own environments (``.compat/<label>``) or, for releases
whose environment ``make test`` does not build, from the release wheel
(``releases.topk_source``). GNU ``patch`` and ``git apply`` are checked too where they
are installed, because those are what users run; the package's own applier
(``sglang_amd_moe.diagnostics.patching``, used by the audit) must agree with them byte for byte.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import ledger as ledger_tool  # tools/compat
import pytest
import releases
from sglang_release_support import driven, release_group

from sglang_amd_moe.diagnostics import patching
from sglang_amd_moe.runtime.sglang import ledger

REPO = releases.REPO
UPSTREAM_PATH = "python/sglang/srt/layers/moe/topk.py"
PATCHED_FORMS = ("no-hip-handling", "weights-only", "mask-under-eplb-guard")

CASES = [
    pytest.param(form, rel.label, id=f"{form}-{rel.label}")
    for form in PATCHED_FORMS
    for rel in releases.RELEASES
    if rel.expected_form == form
]


def test_every_broken_form_has_a_release_and_a_patch() -> None:
    forms = {rel.expected_form for rel in releases.RELEASES}
    for form in PATCHED_FORMS:
        assert form in forms
        assert patching.patch_for("sglang", form) is not None
    assert patching.patch_for("sglang", "fixed") is None


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return {
        rel.label: releases.topk_source(rel)
        for rel in releases.RELEASES
        if rel.expected_form in PATCHED_FORMS
    }


@pytest.mark.parametrize(("form", "label"), CASES)
def test_patch_fixes_release_file(form: str, label: str, sources: dict[str, str]) -> None:
    src = sources[label]
    modules = ledger_tool.release_modules(releases.BY_LABEL[label])  # the helpers it calls
    assert ledger.read(src, modules=modules).form == form, "the release's own file changed form"
    text = patching.read_patch(patching.patch_for("sglang", form))
    assert patching.status(src, text) == patching.APPLIES
    fixed = patching.apply_text(src, text)
    compile(fixed, UPSTREAM_PATH, "exec")
    assert ledger.read(fixed, modules=modules).form == "fixed"
    assert patching.status(fixed, text) == patching.ALREADY_APPLIED
    assert patching.apply_text(fixed, text, reverse=True) == src
    # Every other SGLang patch is drift on this file (no patch fits two forms).
    for other in patching.patch_names("sglang"):
        if other != patching.patch_for("sglang", form):
            assert patching.status(src, patching.read_patch(other)) == patching.DRIFT, other


def _tree(tmp: Path, src: str) -> Path:
    target = tmp / UPSTREAM_PATH
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(src)
    return target


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed")
@pytest.mark.parametrize(("form", "label"), CASES)
def test_gnu_patch_applies_without_fuzz(
    form: str, label: str, sources: dict[str, str], tmp_path: Path
) -> None:
    src = sources[label]
    target = _tree(tmp_path, src)
    diff = patching.patch_path(patching.patch_for("sglang", form))
    proc = subprocess.run(
        ["patch", "-p1", "--forward", "--batch", "-i", diff],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fuzz" not in proc.stdout, proc.stdout
    assert target.read_text() == patching.apply_text(
        src, patching.read_patch(patching.patch_for("sglang", form))
    )
    # Applying twice is refused, as users expect from `patch --forward`.
    again = subprocess.run(
        ["patch", "-p1", "--forward", "--batch", "--dry-run", "-i", diff],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert again.returncode != 0


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize(("form", "label"), CASES)
def test_git_apply_check(form: str, label: str, sources: dict[str, str], tmp_path: Path) -> None:
    _tree(tmp_path, sources[label])
    diff = patching.patch_path(patching.patch_for("sglang", form))
    proc = subprocess.run(
        ["git", "apply", "--check", "-v", diff], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_patch_headers_say_what_users_need() -> None:
    for name in patching.patch_names():
        text = patching.read_patch(name)
        header = text[: text.index("\n--- a/")]
        assert "What it fixes" in header and "plugin does at run time" in header, name
        numbers = ("7083",) if name.startswith("aiter") else ("28188", "28378")
        for n in numbers:
            assert n in header, (name, n)
        assert len(patching.parse(text)) == 1
        # The documented command is the one the audit prints.
        file = "TOPK_PY" if name.startswith("sglang-") else "FUSED_MOE_PY"
        assert f"patch --dry-run {patching.PATCH_OPTIONS} {file} {name} &&" in header, name
        assert f"  patch {patching.PATCH_OPTIONS} {file} {name}\n" in header, name
        for internal in ("BRIEF", "seed 0", "tools/compat"):
            assert internal not in header, (name, internal)
        if name.startswith("sglang-"):
            # The line that tells a patched file from a fixed release.
            assert f"+        # Patched by sglang-amd-moe ({name})" in text, name


# The release with its shipped patch applied, as a phase of its bare driver run
# (tests/sglang/driver.py, ``patched_phase``): the patched file is served as the real
# release's topk module, so every import of it (the package's own included) gets it;
# then the HIP branch is driven on the CPU, EPLB off and on, and with aiter's
# shared-expert append (a Triton kernel, interpreted). One release of each broken form
# that `make test` builds (ci=True), and any other broken-form environment that happens
# to be built.
BEHAVIOUR = [
    pytest.param(rel.label, id=rel.label, marks=release_group(rel.label))
    for rel in releases.RELEASES
    if rel.expected_form in PATCHED_FORMS
]


@pytest.mark.sglang
@pytest.mark.parametrize("label", BEHAVIOUR)
def test_patched_release_behaves_fixed(
    label: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    rel = releases.BY_LABEL[label]
    if not rel.is_built():
        if rel.ci:
            pytest.fail(
                f"{label} is a CI release but its environment is not built (make test builds it)"
            )
        pytest.skip(f"{label}: environment not built (make compat builds it)")
    run = driven(rel, tmp_path_factory)["bare"]["patched"]
    assert run["errors"] == [], run["errors"]
    err = run.get("import_error")
    if err is not None:
        # Only acceptable where the plugin has no loader anyway (0.5.10); the same patch
        # text is exercised on the other releases of its form.
        if rel.has_plugin_loader:
            pytest.fail(f"{label}: topk does not import: {err}")
        pytest.skip(f"{label}: sglang.srt.layers.moe.topk does not import on this machine: {err}")
    res = run
    real_ids, real_w, perm = res["real_ids"], res["real_w"], res["perm"]
    n = len(real_ids)
    e = len(perm)

    def check(out: dict, expect_real_ids: list[list[int]], k: int) -> None:
        ids, w = out["ids"], out["w"]
        assert [row[:k] for row in ids[:n]] == expect_real_ids
        assert all(
            abs(a - b) < 1e-6
            for r1, r2 in zip(w[:n], real_w, strict=True)
            for a, b in zip(r1[:k], r2, strict=True)
        )
        for row in ids[n:]:
            assert all(0 <= x <= e for x in row), f"padded ids still out of range: {row}"
        for row in w[n:]:
            assert row == [0.0] * len(row), f"padded weights not zero: {row}"

    # EPLB off: no remap; padded ids are 0.
    check(res["off"], real_ids, 4)
    assert all(x == 0 for row in res["off"]["ids"][n:] for x in row)
    # EPLB on: real ids go through the release's own logical -> physical map, once.
    check(res["on"], [[perm[x] for x in row] for row in real_ids], 4)
    # Shared-expert append: the appended column's weights for padded rows are zeroed.
    append = res["append"]
    assert all(len(row) == 5 for row in append["ids"])
    assert all(row[4] == e for row in append["ids"][:n])
    check(append, real_ids, 4)


# The command the audit prints and the headers document, run with the real GNU patch.


def _run_shell(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=120)


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name != "topk.py")


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed")
@pytest.mark.parametrize(("form", "label"), CASES)
def test_documented_command_applies_cleanly(
    form: str, label: str, sources: dict[str, str], tmp_path: Path
) -> None:
    """Applies without fuzz and leaves no .orig, also where hunks land at an offset
    (0.5.10, 0.5.11); a second run is refused, changes nothing and leaves no .rej."""
    name = patching.patch_for("sglang", form)
    src = sources[label]
    target = tmp_path / "topk.py"
    target.write_text(src)
    cmd = patching.apply_command(str(target), name)
    first = _run_shell(cmd, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "fuzz" not in first.stdout, first.stdout
    patched = patching.apply_text(src, patching.read_patch(name))
    assert target.read_text() == patched
    assert _leftovers(tmp_path) == []
    again = _run_shell(cmd, tmp_path)
    assert again.returncode != 0 and "previously applied" in again.stdout, again.stdout
    assert target.read_text() == patched and _leftovers(tmp_path) == []


def _edit_hunk_line(src: str, name: str, hunk: int, line: int) -> str:
    """``src`` with one old line of a hunk of ``name`` changed where that hunk matches."""
    old = patching.parse(patching.read_patch(name))[0].hunks[hunk].old
    block = "\n".join(old)
    assert src.count(block) == 1
    edited = list(old)
    edited[line] += "  # a local edit"
    return src.replace(block, "\n".join(edited))


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed")
def test_documented_command_refuses_fuzz_and_partial_application(
    sources: dict[str, str], tmp_path: Path
) -> None:
    name = "sglang-no-hip-handling.diff"
    src = sources["0.5.12.post1"]
    diff = patching.patch_path(name)
    # 1. The last context line of the second hunk edited: GNU patch's default (fuzz 2)
    #    applies the hunk anyway; the audit calls it drift, and so must the command.
    fuzzy = _edit_hunk_line(src, name, 1, -1)
    assert patching.status(fuzzy, patching.read_patch(name)) == patching.DRIFT
    default = tmp_path / "default"
    default.mkdir()
    (default / "topk.py").write_text(fuzzy)
    proc = _run_shell(f"patch --forward topk.py {diff}", default)
    assert proc.returncode == 0 and "with fuzz" in proc.stdout, (
        proc.stdout
    )  # what the command must not do
    # 2. A line fuzz cannot skip edited in the second hunk: GNU patch without a dry run
    #    writes the first hunk and drops the second (a half-patched file).
    partial = _edit_hunk_line(src, name, 1, 3)
    half = tmp_path / "half"
    half.mkdir()
    (half / "topk.py").write_text(partial)
    proc = _run_shell(f"patch {patching.PATCH_OPTIONS} topk.py {diff}", half)
    assert proc.returncode != 0 and (half / "topk.py").read_text() != partial
    for k, text in enumerate((fuzzy, partial)):
        d = tmp_path / f"refused{k}"
        d.mkdir()
        target = d / "topk.py"
        target.write_text(text)
        proc = _run_shell(patching.apply_command(str(target), name), d)
        assert proc.returncode != 0, proc.stdout
        assert target.read_text() == text and _leftovers(d) == [], proc.stdout

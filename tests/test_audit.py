"""The audit command and the patch applier behind it, in this interpreter (fast).

Real files only: SGLang's topk.py of the CI releases (their environments, or the release
wheel), this package's own patches, and the aiter stand-in (the project's one stand-in
for aiter, which cannot be imported without ROCm). The per-release audits, in each
release's own interpreter, are in ``tests/compat/test_audit_releases.py``.
"""

from __future__ import annotations

import difflib
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import releases
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version
from sglang_release_support import outside_tree, require_built, switches_off

from sglang_amd_moe.diagnostics import audit, patching, sources
from sglang_amd_moe.diagnostics.audit import coverage, paths, plugins, read, render, verdict
from sglang_amd_moe.runtime import env
from sglang_amd_moe.runtime.sglang import names
from sglang_amd_moe.runtime.sglang.probe import Observation, ProbeResult
from sglang_amd_moe.runtime.target import HookStatus

REPO = Path(__file__).resolve().parents[1]

STANDIN = REPO / "tests" / "aiter_standin"
STANDIN_DROPPED = STANDIN / "aiter" / "_shapes" / "count_dropped" / "fused_moe.py"
STANDIN_REJECTED = STANDIN / "aiter" / "_shapes" / "count_rejected" / "fused_moe.py"
PY = sys.executable


def run_cli(
    *args: str, env: dict[str, str] | None = None, python: str | Path = PY, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-m", "sglang_amd_moe", "audit", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def package_view(label: str, text: str, where: Path) -> Path:
    """``topk.py`` with ``text`` inside a view of the release's installed ``sglang`` package
    at ``where`` (every other file a link to the real one), as in an image's tree: the
    ledger reads the helpers a body calls from the package beside it."""
    rel = releases.BY_LABEL[label]
    require_built(rel)
    src, dst = rel.topk_path().parents[3], where / "sglang"
    for part in ("", "srt", "layers", "moe"):
        src, dst = src / part, dst / part
        dst.mkdir(parents=True, exist_ok=True)
        for entry in src.iterdir():
            if not (dst / entry.name).exists() and entry.name not in ("srt", "layers", "moe"):
                (dst / entry.name).symlink_to(entry)
    topk = dst / "topk.py"
    topk.unlink(missing_ok=True)
    topk.write_text(text)
    return topk


@pytest.fixture(scope="module")
def release_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """topk.py of every built CI release, each in a view of its package (copied, so tests
    may edit them)."""
    d = tmp_path_factory.mktemp("topk")
    out = {}
    for rel in releases.RELEASES:
        if rel.ci and rel.is_built():
            out[rel.label] = package_view(rel.label, releases.topk_source(rel), d / rel.label)
    return out


# --------------------------------------------------------------------------- patching


def _numbered(n: int, tag: str = "line") -> list[str]:
    return [f"{tag} {i}" for i in range(n)]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=5, max_value=60),
    edits=st.lists(
        st.tuples(st.integers(0, 59), st.sampled_from(["ins", "del", "rep"])),
        min_size=1,
        max_size=6,
    ),
    context=st.integers(min_value=1, max_value=3),
    shift=st.integers(min_value=0, max_value=7),
)
def test_apply_roundtrip_and_offsets(n: int, edits: list, context: int, shift: int) -> None:
    old = _numbered(n)
    new = list(old)
    for k, (pos, kind) in enumerate(sorted(set(edits), reverse=True)):
        pos = pos % len(new) if new else 0
        if kind == "ins":
            new.insert(pos, f"inserted {k}")
        elif kind == "del" and len(new) > 1:
            del new[pos]
        else:
            new[pos] = f"replaced {k}"
    if new == old:
        return
    diff = "".join(
        f"{ln}\n" if not ln.endswith("\n") else ln
        for ln in difflib.unified_diff(old, new, "a/f", "b/f", n=context, lineterm="")
    )
    old_text, new_text = "\n".join(old) + "\n", "\n".join(new) + "\n"
    assert patching.apply_text(old_text, diff) == new_text
    assert patching.apply_text(new_text, diff, reverse=True) == old_text
    assert patching.status(old_text, diff) == patching.APPLIES
    try:  # a patch that can apply twice (inserts at a file edge) reads as "applies"
        patching.apply_text(new_text, diff)
        twice = True
    except patching.PatchError:
        twice = False
    assert patching.status(new_text, diff) == (
        patching.APPLIES if twice else patching.ALREADY_APPLIED
    )
    # Lines added above the hunks: found at an offset, as `patch` does.
    pre = "\n".join(_numbered(shift, "header")) + "\n" if shift else ""
    assert patching.apply_text(pre + old_text, diff) == pre + new_text


def test_drift_and_malformed() -> None:
    old = "\n".join(_numbered(20)) + "\n"
    diff = "comment\n--- a/f\n+++ b/f\n@@ -5,3 +5,3 @@\n line 4\n-line 5\n+LINE 5\n line 6\n"
    assert patching.status(old, diff) == patching.APPLIES
    assert patching.status(old.replace("line 6\n", "line six\n"), diff) == patching.DRIFT
    with pytest.raises(patching.PatchError):
        patching.apply_text(old.replace("line 5\n", "x\n"), diff)
    with pytest.raises(patching.PatchError):
        patching.parse("no diff here\n")
    with pytest.raises(patching.PatchError):  # header says 4 old lines, body has 3
        patching.parse("--- a/f\n+++ b/f\n@@ -5,4 +5,3 @@\n line 4\n-line 5\n+LINE 5\n line 6\n")
    with pytest.raises(ValueError):
        patching.read_patch("../pyproject.toml")


def test_shipped_patches_parse_and_are_package_data() -> None:
    names = patching.patch_names()
    assert sorted(names) == sorted(p.name for p in (REPO / "patches").glob("*.diff"))
    for name in names:
        (fp,) = patching.parse(patching.read_patch(name))
        assert fp.old_path.startswith("a/") and fp.new_path.startswith("b/")
        assert Path(patching.patch_path(name)).is_file()


# --------------------------------------------------------------------------- source mode


@pytest.mark.parametrize("label", [r.label for r in releases.RELEASES if r.ci])
def test_source_mode_per_release(label: str, release_files: dict[str, Path]) -> None:
    rel = releases.BY_LABEL[label]
    proc = run_cli("--json", "--sglang-source", str(release_files[label]))
    doc = json.loads(proc.stdout)
    (t,) = doc["targets"]
    assert list(t)[: len(audit.JSON_KEYS)] == list(audit.JSON_KEYS)
    assert t["target"] == "sglang" and t["form"] == rel.expected_form
    assert (
        t["hook_live"] is None and t["version"] is None and t["file"] == str(release_files[label])
    )
    if rel.expected_form == "fixed":
        assert proc.returncode == 0 and t["patch"] is None
    else:
        # The image's plugin is not visible from outside: a broken form needs action.
        assert proc.returncode == 1
        assert t["patch"] == patching.patch_for("sglang", rel.expected_form)
        assert t["patch_status"] == patching.APPLIES
        # What an image patcher needs: the patch's path and the command that applies it.
        assert (
            t["patch_file"] == patching.patch_path(t["patch"]) and Path(t["patch_file"]).is_file()
        )
        assert t["apply_command"] == patching.apply_command(str(release_files[label]), t["patch"])
        lines = run_cli("--sglang-source", str(release_files[label])).stdout.splitlines()
        assert any(ln.endswith(f"patch: {t['patch_file']} (applies)") for ln in lines)
        # The sha256 is the function's fingerprint, never labelled as the file's.
        fp = f"fingerprint: {t['sha256']} (sha256 of _post_process_topk_ids and the module code"
        assert any(ln.strip().startswith(fp) for ln in lines), lines
        assert not any(ln.strip().startswith("sha256:") for ln in lines)
        # The table prints the command on two lines that paste as one shell command.
        at = lines.index("        to patch the file instead:")
        assert " ".join(ln.strip() for ln in lines[at + 1 : at + 3]) == t["apply_command"]
        # Nothing is run here: the patch was checked as text, and the output says so.
        assert t["patch_probe"] is None
        assert any(f"{t['patch']} is checked as text only" in n for n in t["notes"])
        assert any("checked as text only" in ln for ln in lines)


@pytest.mark.parametrize(
    "label", [r.label for r in releases.RELEASES if r.ci and r.expected_form != "fixed"]
)
def test_patched_file_is_named_as_patched(
    label: str, release_files: dict[str, Path], tmp_path: Path
) -> None:
    rel = releases.BY_LABEL[label]
    name = patching.patch_for("sglang", rel.expected_form)
    patched = patching.apply_text(release_files[label].read_text(), patching.read_patch(name))
    fixed = package_view(label, patched, tmp_path)
    proc = run_cli("--json", "--sglang-source", str(fixed))
    (t,) = json.loads(proc.stdout)["targets"]
    assert proc.returncode == 0 and t["form"] == "fixed" and not t["needs_attention"]
    # A patched image is told apart from a fixed release, and the patch is named.
    assert t["patch"] == name and t["patch_status"] == patching.ALREADY_APPLIED
    assert t["reason"] == f"patched: {name} is applied to this file" and t["apply_command"] is None
    # ...and its action says so, not "upstream already masks".
    assert t["action"] == f"not hooked: the file is patched ({name} is applied)", t["action"]
    diff = run_cli("--diff", "--sglang-source", str(fixed))
    assert f"already patched ({name})" in diff.stdout
    # The coverage the patch implies: each path as the patched body's releases have it,
    # and the count-carrying path masked by the patched function.
    ep = next(p for p in t["coverage"]["paths"] if p["path"] == "ep")
    assert ep["count"] == "yes" and ep["protected_by"] == [f"SGLang, patched ({name})"], ep
    tp = next(p for p in t["coverage"]["paths"] if p["path"] == "tp")
    assert tp["protected_by"] == [coverage.NOTHING_NEEDED] and "?" not in t["coverage"]["source"]


def test_fixed_releases_are_not_read_as_patched(
    release_files: dict[str, Path], tmp_path: Path
) -> None:
    """0.5.14 holds exactly the code the mask-under-eplb-guard patch adds (upstream PR
    28378), and the patches add the rest of 0.5.14's HIP branch: only the line each patch
    adds to name itself tells a patched file from a fixed release."""
    guard = releases.BY_LABEL["0.5.14-mask-under-eplb-guard"]
    reverse = (REPO / guard.patch).read_text()
    text = patching.apply_text(release_files[guard.label].read_text(), reverse, reverse=True)
    v0514 = package_view(guard.label, text, tmp_path)
    for path in (v0514, release_files[releases.MAIN_RELEASE]):
        proc = run_cli("--json", "--sglang-source", str(path))
        (t,) = json.loads(proc.stdout)["targets"]
        assert proc.returncode == 0 and t["form"] == "fixed", path
        assert t["patch"] is None and t["patch_status"] is None
        assert t["reason"].startswith("fixed upstream"), t["reason"]


def test_diff_shows_the_fix(release_files: dict[str, Path]) -> None:
    proc = run_cli("--diff", "--sglang-source", str(release_files["0.5.12.post1"]))
    assert proc.returncode == 1
    diff = proc.stdout[proc.stdout.index("--- installed:") :]
    assert "+++ fixed: after sglang-no-hip-handling.diff" in diff
    assert (
        "+        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)"
        in diff
    )
    assert "+        if _eplb_remap_enabled():" in diff
    # Only the function is diffed (the helpers the patch adds elsewhere are not).
    assert "def _eplb_remap_enabled" not in diff
    label = "0.5.14-mask-under-eplb-guard"
    guard = run_cli("--diff", "--json", "--sglang-source", str(release_files[label]))
    d = json.loads(guard.stdout)["diff"]["sglang"]
    assert (
        "+        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)" in d
    )
    assert (
        "-            _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)"
        in d
    )


def test_drifted_file_needs_attention(release_files: dict[str, Path], tmp_path: Path) -> None:
    src = release_files["0.5.12.post1"].read_text()
    # A local edit where the patch anchors (the shared-expert append) but not in the HIP
    # logic: still the no-hip-handling form, and the patch no longer fits.
    edited = src.replace(
        "        M, N = router_logits.shape\n", "        M, N = router_logits.shape  # local\n", 1
    )
    assert edited != src
    p = package_view("0.5.12.post1", edited, tmp_path)
    proc = run_cli("--json", "--sglang-source", str(p))
    (t,) = json.loads(proc.stdout)["targets"]
    assert (
        t["form"] == "no-hip-handling"
        and t["patch_status"] == patching.DRIFT
        and proc.returncode == 1
    )
    text = run_cli("--sglang-source", str(p))
    assert "does not apply (drift)" in text.stdout


def test_unknown_form_needs_attention(release_files: dict[str, Path], tmp_path: Path) -> None:
    src = release_files["0.5.23"].read_text()
    # Fill padded ids with -1 on HIP: a shape the classifier cannot call fixed.
    edited = src.replace(
        "_mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)",
        "_mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=-1)",
    )
    p = tmp_path / "topk.py"
    p.write_text(edited)
    proc = run_cli("--json", "--sglang-source", str(p))
    (t,) = json.loads(proc.stdout)["targets"]
    assert t["form"] == "unknown" and proc.returncode == 1 and t["needs_attention"]
    # What the plugin does with it: it decides by running the function (it does not
    # just guard it), and the plain audit, which runs nothing, points at --load.
    assert t["action"] == names.ACTIONS["unknown"] and "by running it" in t["action"]
    assert "hooks only what it sees wrong" in t["reason"], t["reason"]
    assert "sglang-amd-moe audit --load" in t["reason"] and "by hand" in t["reason"]
    assert t["hook"] == "?" and t["probe"] is None


def test_aiter_source_mode() -> None:
    proc = run_cli("--json", "--aiter-source", str(STANDIN_DROPPED))
    (t,) = json.loads(proc.stdout)["targets"]
    assert t["target"] == "aiter" and t["form"] == "count-dropped" and proc.returncode == 1
    assert t["patch"] == "aiter-count-dropped.diff"
    # The stand-in mirrors aiter's names and control flow, not its text.
    assert t["patch_status"] == patching.DRIFT
    rej = run_cli("--json", "--aiter-source", str(STANDIN_REJECTED))
    (t,) = json.loads(rej.stdout)["targets"]
    assert t["form"] == "count-rejected" and t["patch"] is None and rej.returncode == 1


def test_errors_exit_2(tmp_path: Path) -> None:
    missing = run_cli("--sglang-source", str(tmp_path / "nope.py"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    # --json prints one JSON document even then: an error object.
    doc = json.loads(run_cli("--json", "--sglang-source", str(tmp_path / "nope.py")).stdout)
    assert doc["exit_status"] == 2 and "cannot read" in doc["error"] and doc["targets"] == []
    # ...also where --json is given as argparse's abbreviation of it.
    doc = json.loads(run_cli("--js", "--sglang-source", str(tmp_path / "nope.py")).stdout)
    assert doc["exit_status"] == 2 and "cannot read" in doc["error"] and doc["targets"] == []
    binary = tmp_path / "topk.py"
    binary.write_bytes(b"\x7fELF\xff\xfe\x00\x80 not source")
    not_text = run_cli("--sglang-source", str(binary))
    assert not_text.returncode == 2 and "not UTF-8" in not_text.stderr, not_text.stderr
    assert run_cli("--load", "--sglang-source", str(STANDIN_DROPPED)).returncode == 2
    assert run_cli("--no-such-option").returncode == 2
    helped = run_cli("--help")
    assert helped.returncode == 0 and "--sglang-source" in helped.stdout


def _refused(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("sglang-amd-moe audit: error: "), proc.stderr
    for w in words:
        assert w in proc.stderr, (w, proc.stderr)


def test_given_file_must_be_the_targets_own(release_files: dict[str, Path], tmp_path: Path) -> None:
    """A wrong path must never read as OK: the file must be the target's own."""
    topk = str(release_files["0.5.12.post1"])
    _refused(run_cli("--aiter-source", topk), "is not aiter's aiter/fused_moe.py")
    _refused(
        run_cli("--sglang-source", str(STANDIN_DROPPED)),
        "is not SGLang's sglang/srt/layers/moe/topk.py",
    )
    _refused(run_cli("--sglang-source", str(REPO / "README.md")), "does not parse as Python")
    init = tmp_path / "__init__.py"
    init.write_text("from .topk import *\n")
    _refused(run_cli("--sglang-source", str(init)), "defines none of")
    empty = tmp_path / "empty.py"
    empty.write_text("")
    _refused(run_cli("--sglang-source", str(empty)), "defines none of")
    # The same with both targets at once: one wrong file is an error for the whole run.
    _refused(run_cli("--sglang-source", topk, "--aiter-source", topk), "is not aiter's")


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    """Devices, pipes and directories are refused before anything is read (a FIFO must
    not hang the audit, /dev/zero must not be read until memory runs out)."""
    fifo = tmp_path / "topk.py"
    os.mkfifo(fifo)
    for path, kind in (
        ("/dev/null", "a character device"),
        ("/dev/zero", "a character device"),
        (str(fifo), "a FIFO or pipe"),
        (str(tmp_path), "a directory"),
    ):
        _refused(run_cli("--sglang-source", path), "is not a regular file", kind)
        _refused(run_cli("--aiter-source", path), "is not a regular file", kind)
    with open(os.devnull) as devnull:  # /dev/stdin of a process whose stdin is /dev/null
        proc = subprocess.run(
            [PY, "-m", "sglang_amd_moe", "audit", "--sglang-source", "/dev/stdin"],
            stdin=devnull,
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )
    _refused(proc, "is not a regular file")
    big = tmp_path / "big.py"
    with open(big, "wb") as f:
        f.truncate(sources.MAX_SOURCE_BYTES + 1)  # sparse: nothing written
    _refused(run_cli("--sglang-source", str(big)), f"limit {sources.MAX_SOURCE_BYTES}")
    doc = json.loads(run_cli("--json", "--sglang-source", str(big)).stdout)  # one document
    assert doc["exit_status"] == 2 and f"limit {sources.MAX_SOURCE_BYTES}" in doc["error"]


def _audit_proc(args: list[str], **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "sglang_amd_moe", "audit", *args],
        capture_output=False,
        text=True,
        cwd=REPO,
        timeout=300,
        **kw,
    )


@pytest.mark.parametrize("args", [[], ["--json"]])
def test_unwritable_report_exits_2(
    args: list[str], release_files: dict[str, Path], tmp_path: Path
) -> None:
    """A report that cannot be written is the audit's failure (2), never the verdict (0/1)."""
    source = ["--sglang-source", str(release_files[releases.MAIN_RELEASE])]  # a verdict of 0
    # A reader that went away (`audit --json | head -c0`): EPIPE on the first write.
    r, w = os.pipe()
    os.close(r)
    try:
        broken = _audit_proc([*args, *source], stdout=w, stderr=subprocess.PIPE)
    finally:
        os.close(w)
    # stdout closed (`audit >&-`) and stdout not writable (`audit 1</dev/null`).
    closed = _audit_proc(
        [*args, *source],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: os.close(1),
    )
    with open(os.devnull) as read_only:
        unwritable = _audit_proc([*args, *source], stdout=read_only, stderr=subprocess.PIPE)
    for proc in (broken, closed, unwritable):
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, (
            proc.stderr
        )
        assert "error: cannot write to stdout: " in proc.stderr, proc.stderr


def test_ascii_locale_keeps_the_report(release_files: dict[str, Path], tmp_path: Path) -> None:
    """A non-ASCII path on an ASCII-only stdout is printed escaped; the status is the verdict."""
    d = tmp_path / "t\u00f8pk"
    d.mkdir()
    path = d / "topk.py"
    path.write_text(release_files["0.5.13.post1"].read_text())
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    proc = run_cli("--sglang-source", str(path), env=env)
    assert proc.returncode == 1, proc.stderr
    assert (
        "t\\xf8pk" in proc.stdout and "ATTENTION: 1 target(s) need action (exit 1)" in proc.stdout
    )
    doc = run_cli("--json", "--sglang-source", str(path), env=env)
    assert doc.returncode == 1 and json.loads(doc.stdout)["targets"][0]["file"] == str(path)


def test_control_characters_in_paths_are_escaped(
    release_files: dict[str, Path], tmp_path: Path
) -> None:
    """A path holding an escape sequence or a newline is printed escaped, in the table and
    in an error (stderr): it can neither drive the terminal nor forge a line. The JSON
    document keeps the path as it is (JSON escapes it)."""
    odd = "x\x1b[31m\ny\u2028"
    path = package_view("0.5.13.post1", release_files["0.5.13.post1"].read_text(), tmp_path / odd)
    proc = run_cli("--sglang-source", str(path))
    assert "\x1b" not in proc.stdout and "\u2028" not in proc.stdout, proc.stdout
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("file: ")]
    assert line.strip() == f"file: {render.escape(str(path))}" and "\\x1b[31m\\ny" in line
    doc = json.loads(run_cli("--json", "--sglang-source", str(path)).stdout)
    assert doc["targets"][0]["file"] == str(path)
    missing = run_cli("--sglang-source", str(tmp_path / f"{odd}.py"))
    assert missing.returncode == 2 and "\x1b" not in missing.stderr and "\\x1b" in missing.stderr


def test_json_is_one_document_when_interrupted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C (KeyboardInterrupt) during the audit: exit 130, and with --json still one
    document; interrupted while printing, no second one."""

    def interrupted(args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(audit, "run", interrupted)
    assert audit.main(["--json"]) == 130
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_status"] == 130 and doc["error"] == "interrupted" and doc["targets"] == []
    assert audit.main([]) == 130 and capsys.readouterr().out == ""
    monkeypatch.undo()

    def write_interrupted(text: str) -> None:
        print(text[:10], end="")
        raise KeyboardInterrupt

    monkeypatch.setattr(audit, "write_stdout", write_interrupted)
    monkeypatch.setattr(audit, "run", lambda args: (0, [], None))
    assert audit.main(["--json"]) == 130
    assert capsys.readouterr().out == '{\n  "exit_'  # the part printed, and nothing more


def test_cli_conventions() -> None:
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PY, "-m", "sglang_amd_moe", *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )

    from sglang_amd_moe import __version__

    version = cli("--version")
    assert version.returncode == 0 and version.stdout == f"sglang-amd-moe {__version__}\n"
    helped = cli("--help")
    assert (
        helped.returncode == 0
        and "sglang-amd-moe COMMAND --help" in helped.stdout
        and not helped.stderr
    )
    assert all(name in helped.stdout for name in ("audit", "check", "demo", "SGLANG_AMD_MOE_FORCE"))
    # The exit statuses, per command.
    assert "exit status:" in helped.stdout and "2 the audit failed" in helped.stdout
    assert "1 a row does not match" in helped.stdout and "130 on Ctrl-C" in helped.stdout
    for args in ((), ("bogus",), ("audit", "--bogus")):
        proc = cli(*args)
        assert proc.returncode == 2 and proc.stdout == "" and "usage:" in proc.stderr, args
        assert "Traceback" not in proc.stderr
    audit_help = cli("audit", "--help")
    assert (
        audit_help.returncode == 0
        and "exit status:" in audit_help.stdout
        and "HOOK column" in audit_help.stdout
    )


# --------------------------------------------------------------------------- this environment


def test_plain_audit_imports_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from sglang_amd_moe.diagnostics import audit\n"
        "rc = audit.main([])\n"
        "heavy = [m for m in ('torch', 'sglang', 'aiter', 'triton') if m in sys.modules]\n"
        "print('HEAVY', heavy, 'RC', rc)\n"
    )
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert "HEAVY [] RC 0" in proc.stdout, proc.stdout + proc.stderr
    assert "OK: nothing needs action (exit 0)" in proc.stdout


def test_main_env_is_fixed_release() -> None:
    proc = run_cli("--json")
    doc = json.loads(proc.stdout)
    sg = next(t for t in doc["targets"] if t["target"] == "sglang")
    assert sg["form"] == "fixed" and sg["version"] == releases.MAIN_RELEASE and proc.returncode == 0
    assert next(t for t in doc["targets"] if t["target"] == "aiter")["form"] == "not installed"


def _with_standin(
    tmp: Path, extra_env: dict[str, str] | None = None, args: tuple[str, ...] = ("--json",)
) -> subprocess.CompletedProcess:
    """The audit with aiter on the path: the stand-in's files laid out as the real package
    lays them out (``aiter/__init__.py`` next to ``aiter/fused_moe.py``), with the stand-in
    set to fail on import the way real aiter does off ROCm, so any import would show."""
    pkg = tmp / "site" / "aiter"
    if not pkg.exists():
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").symlink_to(STANDIN / "aiter" / "__init__.py")
        (pkg / "fused_moe.py").symlink_to(STANDIN_DROPPED)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SGLANG_AMD_MOE_DISABLE", "SGLANG_AMD_MOE_FORCE", "SGLANG_PLUGINS")
    }
    env.update(
        PYTHONPATH=str(pkg.parent),
        SGLANG_AMD_MOE_TEST_AITER_STANDIN_SHAPE="no-rocm",
        **(extra_env or {}),
    )
    code = (
        "import json, sys\n"
        "from sglang_amd_moe.diagnostics import audit\n"
        f"rc, reps, view = audit.run({list(args)!r})\n"
        "print(json.dumps({'rc': rc, 'aiter_imported': 'aiter' in sys.modules,\n"
        "  'attention': audit.render.attention(reps, view),\n"
        "  't': [r.to_json() for r in reps]}))\n"
    )
    return subprocess.run(
        [PY, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
    )


def test_aiter_found_without_importing_it(tmp_path: Path) -> None:
    proc = _with_standin(tmp_path)
    out = json.loads(proc.stdout)
    assert out["aiter_imported"] is False
    t = next(t for t in out["t"] if t["target"] == "aiter")
    assert t["file"] == str(tmp_path / "site" / "aiter" / "fused_moe.py")
    assert t["form"] == "count-dropped" and t["hook_live"] is False
    # Covered by the plugin (SGLang 0.5.23 has the loader, the entry point is installed)...
    assert t["hook"] == "on load" and t["covered"] is True
    # ...but the shipped patch does not fit the stand-in's text: drift needs attention.
    assert t["patch_status"] == patching.DRIFT and out["rc"] == 1


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"SGLANG_AMD_MOE_DISABLE": "1"}, "SGLANG_AMD_MOE_DISABLE"),
        ({"SGLANG_PLUGINS": "someone_else"}, "SGLANG_PLUGINS"),
    ],
)
def test_plugin_disabled_on_broken_form_needs_attention(
    env: dict[str, str], why: str, tmp_path: Path
) -> None:
    out = json.loads(_with_standin(tmp_path, env).stdout)
    t = next(t for t in out["t"] if t["target"] == "aiter")
    assert t["covered"] is False and t["needs_attention"] is True and why in t["reason"]
    assert out["rc"] == 1
    # Exit 1 always comes with what needs action, in one list.
    assert out["attention"] == [f"aiter: {t['reason']}"], out["attention"]


@pytest.mark.sglang  # --load imports SGLang 0.5.23 and runs its load_plugins()
def test_load_agrees_with_plain_audit_while_the_aiter_hook_is_pending(tmp_path: Path) -> None:
    """After the real load_plugins() the aiter hook waits for aiter.fused_moe to be
    imported (the normal state in a server until the first MoE layer is built): that
    covers the form, and the patch drift plain mode reports is reported the same way.
    The hook waits only where the plugin's gate is open (ROCm, or SGLANG_AMD_MOE_FORCE=1
    on this machine)."""
    force = {"SGLANG_AMD_MOE_FORCE": "1"}
    plain = json.loads(_with_standin(tmp_path, force).stdout)
    loaded = json.loads(_with_standin(tmp_path, force, args=("--json", "--load")).stdout)
    assert loaded["aiter_imported"] is False
    a_plain, a_load = (
        next(t for t in out["t"] if t["target"] == "aiter") for out in (plain, loaded)
    )
    assert (
        a_load["hook"] == "pending"
        and a_load["hook_state"] == "pending"
        and a_load["covered"] is True
    )
    assert "waiting for aiter.fused_moe to be imported" in a_load["reason"]
    for key in ("form", "covered", "needs_attention", "patch", "patch_status"):
        assert a_plain[key] == a_load[key], key
    assert a_load["patch_status"] == patching.DRIFT and "drift" in a_load["reason"]
    assert plain["rc"] == loaded["rc"] == 1


@pytest.mark.parametrize(
    ("state", "env", "covered", "hook"),
    [
        ("live", {}, True, "live"),
        ("pending", {}, True, "pending"),
        ("off", {}, True, "not ROCm"),  # off only because torch here is not ROCm
        ("off", {"SGLANG_AMD_MOE_FORCE": "1"}, False, "off"),  # off for another reason
        ("off", {"SGLANG_AMD_MOE_DISABLE": "1"}, False, "off"),
        ("refused", {}, False, "refused"),
        ("error", {}, False, "error"),
        ("not-needed", {}, False, "not-needed"),
        (None, {}, False, "not called"),
    ],
)
def test_verdict_from_hook_status_after_load(
    state: str | None,
    env: dict[str, str],
    covered: bool,
    hook: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What --load concludes from each HookStatus a hook can report, for a broken form in
    this environment (SGLang 0.5.23 has the loader; this package's entry point is here)."""
    from sglang_amd_moe.runtime.target import HookStatus

    for var in ("SGLANG_AMD_MOE_FORCE", "SGLANG_AMD_MOE_DISABLE", "SGLANG_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    view = plugins.plugin_view()
    assert view.sglang_loader and view.sglang_ep is not None and sources.torch_is_rocm() is False
    view.loaded = True
    rep = read.not_installed(read.SGLANG)
    rep.installed, rep.form, rep.file = True, "weights-only", "topk.py"
    rep.status = (
        None if state is None else HookStatus("sglang", state, "weights-only", f"hook says {state}")
    )
    v = verdict.verdict(rep, view)
    assert (v.covered, v.hook, v.attention) == (covered, hook, not covered), v.reason
    if state in ("refused", "error", "not-needed") or env.get("SGLANG_AMD_MOE_FORCE"):
        assert v.reason.endswith(f"hook says {state}")
    if env.get("SGLANG_AMD_MOE_DISABLE"):
        assert "plugin disabled: SGLANG_AMD_MOE_DISABLE is set" in v.reason


# --------------------------------------------------------------------------- behaviour


def _probe(behaviour: str, right: bool, *findings: str, raised: str = "") -> ProbeResult:
    obs = (Observation("eplb-off", right, findings, raised), Observation("eplb-on", right))
    return ProbeResult(True, "", right, behaviour, findings, obs)


_RIGHT = _probe("fixed", True)
_WRONG = _probe("unknown", False, "eplb-off: padded ids out of range (16)")
_LIVE = HookStatus("sglang", "live", "weights-only", "hooked", {"plan": None})
_PREVIEW = HookStatus("sglang", "pending", "fixed", "hooked", {"preview": True})
_LEFT = HookStatus("sglang", "not-needed", "fixed", "not hooked")


@pytest.mark.parametrize(
    ("form", "base", "seen", "attention", "hook", "words"),
    [
        # What runs is right and the ledger agrees: the verdict stands, and says so.
        pytest.param(
            "weights-only",
            verdict.ok("weights-only: covered: hook live", "live"),
            plugins.Seen("the hooked call", _RIGHT, _probe("weights-only", False), _LIVE),
            False,
            "live",
            ("covered: hook live; running the hooked call on the probe batch shows it right",),
            id="agree",
        ),
        # Right, but the ledger knows the body as another form: a person must look.
        pytest.param(
            "weights-only",
            verdict.ok("weights-only: covered: hook live", "live"),
            plugins.Seen("the hooked call", _RIGHT, _probe("no-hip-handling", False), _LIVE),
            True,
            "live",
            (
                "the ledger knows this body as weights-only",
                "running it shows no-hip-handling",
                "by hand",
            ),
            id="disagree",
        ),
        # The source reads fixed, and upstream runs wrong: never OK.
        pytest.param(
            "fixed",
            verdict.ok("fixed upstream"),
            plugins.Seen("upstream's function", _WRONG, _WRONG, _LEFT),
            True,
            "-",
            ("fixed: running upstream's function", "shows it wrong", "padded ids out of range"),
            id="fixed-runs-wrong",
        ),
        # Reads fixed, but on ROCm the plugin would hook it (behaviour wins): the cell
        # says so, and the disagreement needs a look.
        pytest.param(
            "fixed",
            verdict.ok("fixed upstream"),
            plugins.Seen(
                "the hooked call",
                _RIGHT,
                _probe("mask-under-eplb-guard", False),
                _PREVIEW,
                previewed=True,
            ),
            True,
            "not ROCm",
            ("the ledger knows this body as fixed", "running it shows mask-under-eplb-guard"),
            id="fixed-hooked-on-rocm",
        ),
        # Unknown: the plugin decided by running it; still a look by hand.
        pytest.param(
            "unknown",
            verdict.needs("unknown: ...", "?"),
            plugins.Seen("the hooked call", _RIGHT, _probe("unknown", False), _LIVE),
            True,
            "live",
            ("so the plugin decides by running it", "shows it right", "by hand"),
            id="unknown-hooked",
        ),
        # A scenario that raised on the probe batch is not right.
        pytest.param(
            "fixed",
            verdict.ok("fixed upstream"),
            plugins.Seen(
                "upstream's function",
                _probe("unknown", False, "eplb-off: raised NameError: x", raised="NameError: x"),
                None,
                _LEFT,
            ),
            True,
            "-",
            ("raised NameError",),
            id="raised",
        ),
        # Already needing attention (not covered): the run adds what it saw.
        pytest.param(
            "weights-only",
            verdict.needs("weights-only: not covered: plugin disabled", "off"),
            plugins.Seen("upstream's function", _WRONG, _WRONG, None),
            True,
            "off",
            ("plugin disabled; running upstream's function", "nothing hooks it here"),
            id="not-covered",
        ),
    ],
)
def test_behaviour_decides_after_load(
    form: str, base: verdict.Verdict, seen: plugins.Seen, attention: bool, hook: str, words: tuple
) -> None:
    """What running the function showed (``--load``) only ever adds attention: what runs
    must be right, and a source reading other than what running it shows needs a look."""
    rep = read.not_installed(read.SGLANG)
    rep.installed, rep.form, rep.reason, rep.seen = True, form, "the reader's reason", seen
    v = verdict.behaviour_verdict(rep, base)
    assert (v.attention, v.hook) == (attention, hook), v
    for w in words:
        assert w in v.reason, (w, v.reason)


def test_behaviour_not_run_keeps_the_source_verdict() -> None:
    """Where the probe cannot run the function, the verdict is the ledger's, and a note
    says why (the patch, if one applies, then stays checked as text)."""
    for result, why in ((ProbeResult(False, "no TopKConfig"), "no TopKConfig"), (None, "no topk")):
        rep = read.not_installed(read.SGLANG)
        rep.installed, rep.form = True, "weights-only"
        rep.patch, rep.patch_status = "sglang-weights-only.diff", patching.APPLIES
        rep.seen = plugins.Seen("the function", result, None, None, why=why)
        base = verdict.ok("weights-only: covered", "live")
        assert verdict.behaviour_verdict(rep, base) == base
        (note,) = rep.notes
        assert why in note and "rests on the ledger" in note
        assert "sglang-weights-only.diff is checked as text only" in note


def test_patch_that_fails_the_probe_is_not_offered() -> None:
    """A patch that applies as text but whose patched function the probe finds wrong:
    no path, no command, attention, and the probe's findings."""
    rep = read.not_installed(read.SGLANG)
    rep.installed, rep.form, rep.file = True, "weights-only", "/x/topk.py"
    rep.patch, rep.patch_status = "sglang-weights-only.diff", audit.PATCH_FAILS_PROBE
    rep.patch_probe = {"ran": True, "right": False, "findings": ["eplb-on: raised NameError"]}
    rep.status = HookStatus("sglang", "live", "weights-only", "hooked")
    view = plugins.plugin_view()
    view.loaded = True
    verdict.conclude(rep, view)
    assert rep.needs_attention and rep.patch_file is None and rep.apply_command is None
    assert "not offered, the patch needs updating" in rep.reason
    assert "eplb-on: raised NameError" in rep.reason
    text = render.render_table([rep], 1, view)
    assert "not offered (fails the probe)" in text and "to patch the file instead" not in text


@pytest.mark.parametrize(
    ("version", "words"),
    [("3.2.0", "older than 3.3"), (None, "not installed"), ("nightly", "cannot be read")],
)
def test_triton_the_kernels_cannot_use_blocks_the_predicted_hook(
    monkeypatch: pytest.MonkeyPatch, version: str | None, words: str
) -> None:
    # The plugin loads, but its gate keeps every hook off below Triton 3.3: a broken
    # form is then not covered, and the audit says why.
    monkeypatch.setenv("SGLANG_AMD_MOE_FORCE", "1")  # the gate open here, as on ROCm
    monkeypatch.setattr(env, "triton_version", lambda: version)
    covered, cell, why = verdict.predicted(plugins.Route("SGLang"))
    assert (covered, cell) == (False, "Triton")
    assert words in why and "hooks nothing" in why


def test_supported_triton_keeps_the_predicted_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_AMD_MOE_FORCE", "1")
    monkeypatch.setattr(env, "triton_version", lambda: "3.3.1+rocm6.4.1.git")
    assert verdict.predicted(plugins.Route("SGLang"))[:2] == (True, "on load")


def test_triton_here_is_not_judged_off_rocm(monkeypatch: pytest.MonkeyPatch) -> None:
    # Off ROCm the verdict is the one for a ROCm machine, whose torch brings its own Triton.
    monkeypatch.delenv("SGLANG_AMD_MOE_FORCE", raising=False)
    monkeypatch.setattr(sources, "torch_is_rocm", lambda: False)
    monkeypatch.setattr(env, "triton_version", lambda: None)
    assert verdict.predicted(plugins.Route("SGLang"))[:2] == (True, "on load")


def _off(message: str) -> HookStatus:
    return HookStatus(read.SGLANG, "off", None, message)


def _sglang_report(status: HookStatus) -> audit.TargetReport:
    rep = audit.TargetReport(
        read.SGLANG, "sglang", "0.5.13.post1", None, None, "weights-only", "", False, None, None
    )
    rep.status = status
    return rep


def test_load_with_an_old_triton_reads_triton_like_the_plain_audit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SGLANG_AMD_MOE_FORCE", "1")
    monkeypatch.setattr(env, "triton_version", lambda: "3.2.0")
    rep = _sglang_report(_off("sglang-amd-moe: Triton 3.2.0 is older than 3.3; nothing hooked"))
    covered, cell, why = verdict.observed(rep, plugins.Route("SGLang"))
    assert (covered, cell) == (False, "Triton") and "older than 3.3" in why
    assert verdict.predicted(plugins.Route("SGLang"))[:2] == (False, "Triton")


def test_load_off_rocm_is_covered_whatever_triton_is_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SGLANG_AMD_MOE_FORCE", raising=False)
    monkeypatch.setattr(sources, "torch_is_rocm", lambda: False)
    monkeypatch.setattr(env, "triton_version", lambda: "3.2.0")
    rep = _sglang_report(_off("sglang-amd-moe: not ROCm; nothing hooked"))
    assert verdict.observed(rep, plugins.Route("SGLang"))[:2] == (True, "not ROCm")


def test_a_status_that_is_not_a_hookstatus_reads_as_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Hook:
        @staticmethod
        def status() -> dict:
            return {"live": True}

    monkeypatch.setitem(sys.modules, plugins.HOOK_MODULES[read.SGLANG], Hook)
    st = plugins.hook_status(read.SGLANG)
    assert st is not None and st.state == "error" and "not HookStatus" in st.message


@pytest.mark.parametrize(
    ("env_vars", "triton", "previewed"),
    [
        ({}, "3.6.0", True),  # off only because torch is not a ROCm build
        ({"SGLANG_AMD_MOE_DISABLE": "1"}, "3.6.0", False),
        ({}, "3.2.0", False),  # the preview would build kernels this Triton cannot
    ],
)
def test_load_previews_only_where_the_plugin_is_off_for_the_platform_alone(
    monkeypatch: pytest.MonkeyPatch, env_vars: dict, triton: str, previewed: bool
) -> None:
    from sglang_amd_moe.runtime.sglang import hook as sglang_hook

    monkeypatch.delenv("SGLANG_AMD_MOE_FORCE", raising=False)
    monkeypatch.delenv("SGLANG_AMD_MOE_DISABLE", raising=False)
    for k, v in env_vars.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(sources, "torch_is_rocm", lambda: False)
    monkeypatch.setattr(env, "triton_version", lambda: triton)
    calls = []

    def preview() -> sglang_hook.Preview:
        calls.append(1)
        return sglang_hook.Preview(_off("what a ROCm machine would decide"))

    monkeypatch.setattr(sglang_hook, "preview", preview)
    monkeypatch.setattr(plugins, "import_topk", lambda: (None, "not imported in this test"))
    view = plugins.PluginView(None, None, True, None, False, None)
    view.loaded = True
    rep = _sglang_report(_off("sglang-amd-moe: not ROCm; nothing hooked"))
    plugins.observe_sglang(rep, view)
    assert bool(calls) is previewed
    assert rep.seen is not None and rep.seen.previewed is previewed


# --------------------------------------------------------------------------- coverage, guard


def _facts(rows: list[dict]) -> list[dict]:
    """A path's facts as SGLang's files give them (the table adds who masks, per form)."""
    return [{k: v for k, v in r.items() if k != "masked_by"} for r in rows]


@pytest.mark.parametrize("label", [r.label for r in releases.RELEASES if r.ci])
def test_coverage_of_the_installed_release_is_the_table_s(label: str) -> None:
    """What the audit reads from an installed release's files is what the table, generated
    from its wheel, says (the 0.5.14 rebuild's other files are 0.5.14's)."""
    rel = releases.BY_LABEL[label]
    require_built(rel)
    root = rel.topk_path().parents[3]
    got = [r.to_json() for r in paths.rows(paths.dir_tree(root))]
    assert got == _facts(coverage.table()[rel.version]["rows"])


def _table_row(release: str, path: str, family: str = paths.ALL) -> dict:
    """The row of ``path`` for ``family``; with ``all``, the one row every family shares
    (the cells that matter equal where the table keeps families apart for their reasons)."""
    rows = [r for r in coverage.table()[release]["rows"] if r["path"] == path]
    found = [r for r in rows if r["family"] in (family, paths.ALL)] or rows
    cells = {(r["count"], r["rows"], r["masked_by"], r["flag"], r["stale"]) for r in found}
    assert len(cells) == 1, (release, path, family, found)
    return found[0]


def test_the_table_says_what_the_wheels_say() -> None:
    """The committed table, against what was read by hand off the wheels (file:line in
    docs/coverage.md): every release 0.5.10rc0 - 0.5.23 has rows, none of 0.5.21 - 0.5.23's
    known paths reads ``?``, and the cells the audit used to get wrong."""
    import coverage_table

    t = coverage.table()
    assert list(t) == list(coverage_table.VERSIONS)
    assert list(t)[0] == "0.5.10rc0" and list(t)[-1] == "0.5.23"
    for v, rec in t.items():
        assert rec["form"] != "?", v
        tp = _table_row(v, "tp")  # TP: no count, valid forward passes: nothing to mask
        assert (tp["count"], tp["rows"], tp["masked_by"]) == (
            "no", paths.VALID, coverage_table.NOTHING_NEEDED), v  # fmt: skip
        assert _table_row(v, "ep")["count"] == "yes", v
        assert _table_row(v, "eagle")["count"] == "no", v
        stale = Version(v) <= Version("0.5.20")  # a capture-time count in TP decode graphs
        assert bool(tp["stale"]) is stale, v
        mori = Version(v) >= Version("0.5.15")
        assert ("SGLANG_MORI_NO_PAD_MASK" in _table_row(v, "ep")["flag"]) is mori, v
        for fam in rec["families"]:
            dp = _table_row(v, "dp", fam)
            zeroed = fam == "deepseek-v4" and Version(v) >= Version("0.5.22")
            assert dp["count"] == "no", (v, fam)
            assert dp["rows"] == (paths.ZEROED if zeroed else paths.GATHER), (v, fam)
            assert ("SGLANG_DP_MASK_PAD_ROWS" in dp["flag"]) is zeroed, (v, fam)
            assert dp["masked_by"] == (
                "upstream (zeroed before the gather)" if zeroed
                else coverage_table.GUARD if rec["plugin_loader"]
                else "nothing: the plugin cannot load"
            ), (v, fam)  # fmt: skip
    for v in ("0.5.21", "0.5.22", "0.5.23"):
        for r in t[v]["rows"]:
            assert "?" not in (r["count"],), (v, r)
        for fam in t[v]["families"]:  # FULL prefill graphs: a count where the TP call asks
            asks = fam.startswith("deepseek") or v == "0.5.23"
            assert _table_row(v, "prefill-full", fam)["count"] == ("yes" if asks else "no")
    assert _table_row("0.5.20", "prefill-full")["count"] == "no"
    assert _table_row("0.5.16", "dspark")["count"] == "no"  # DSpark's count: 0.5.17 on
    assert _table_row("0.5.17", "dspark")["count"] == "yes (EP)"
    assert "world-dp-gather" not in json.dumps(t["0.5.20"])  # 0.5.21's new gate term, read
    assert "enable_num_token_non_padded() has a condition" not in json.dumps(t)


def _tree(files: dict[str, str]) -> paths.Tree:
    return paths.Tree(files.get, "test")


_FBI = "srt/model_executor/forward_batch_info.py"
_MODEL = "srt/models/deepseek_v2.py"
_RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"


def test_coverage_of_code_it_does_not_know_is_not_guessed() -> None:
    """A gate condition the reader does not know makes every path ``?`` with the reason;
    one it knows (an Elastic EP gather, a custom all-to-all, HIP DP zeroing) is read."""
    model = "def forward_deepep(self, fb):\n    self.topk(x, num_token_non_padded=fb.n)\n"
    files = {_FBI: "def enable_num_token_non_padded():\n    return True\n", _MODEL: model}
    rows = paths.rows(_tree(files))
    assert {r.count for r in rows} == {"?"} and "not know: True" in rows[0].count_why
    files[_FBI] = (
        "def enable_num_token_non_padded():\n"
        "    if get_parallel().moe_ep_size > 1 or world_dp_gather_enabled() or "
        "get_moe_a2a_backend().is_customized():\n        return True\n"
        "    return _dp_tp_moe_masks_pad_rows()\n"
        "def _dp_tp_moe_masks_pad_rows():\n"
        "    return _is_hip and get_bool_env_var('SGLANG_DP_MASK_PAD_ROWS', default='true') "
        "and get_parallel().attn_dp_size > 1 and get_moe_a2a_backend().is_none()\n"
    )
    gate = paths.read_gate(_tree(files))
    assert gate is not None and not gate.unknown
    assert gate.terms == ["ep", "world-dp-gather", "custom-a2a", "hip-dp-tp"]
    assert (gate.dp_env, gate.dp_env_default) == ("SGLANG_DP_MASK_PAD_ROWS", "true")
    assert gate.on("ep") and gate.on("dp") and not gate.on("tp")
    got = {r.path: r for r in paths.rows(_tree(files))}
    assert got["ep"].count == "yes" and got["tp"].count == "no"  # its TP call passes none
    assert got["tp"].rows == paths.UNKNOWN and got["dp"].rows == paths.UNKNOWN  # not read


def test_a_tp_call_that_passes_the_batch_count_is_not_trusted() -> None:
    """A graph runner that keeps the capture-time count on every path, with a TP call
    that passes the batch's count: the count that reaches topk would be stale, so it reads
    ``?``, not "no"; with the call passing none, the stale count is named."""
    runner = (
        "def capture(self, buffers):\n"
        "    fb = ForwardBatch(num_token_non_padded=buffers.num_token_non_padded)\n"
    )
    files = {
        _FBI: "def enable_num_token_non_padded():\n    return get_parallel().moe_ep_size > 1\n",
        _RUNNER: runner,
        _MODEL: "def forward_normal(self, fb):\n"
        "    self.topk(x, num_token_non_padded=fb.num_token_non_padded)\n",
    }
    tp = next(r for r in paths.rows(_tree(files)) if r.path == "tp")
    assert tp.count == "?" and "capture-time" in tp.count_why
    files[_MODEL] = "def forward_normal(self, fb):\n    self.topk(x)\n"
    tp = next(r for r in paths.rows(_tree(files)) if r.path == "tp")
    assert tp.count == "no" and "capture-time value" in tp.stale
    assert _RUNNER in tp.stale


def _view(aiter: Path | None) -> plugins.PluginView:
    ep = md.EntryPoint("sglang_amd_moe", plugins.OUR_SGLANG_EP, "sglang.srt.plugins")
    return plugins.PluginView(Path("sglang"), aiter, True, ep, False, None)


def _on_rocm(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as the ROCm one the verdict is for (no switch of the plugin set)."""
    for var in ("FORCE", "DISABLE", "GUARD", "STRICT"):
        monkeypatch.delenv(f"SGLANG_AMD_MOE_{var}", raising=False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    monkeypatch.setattr(sources, "torch_is_rocm", lambda: True)
    monkeypatch.setattr(env, "triton_version", lambda: "3.4.0")


def _guard(monkeypatch: pytest.MonkeyPatch, status: HookStatus | None) -> None:
    """This sglang-amd-moe's count-free guard, as a loaded runtime target whose status is
    ``status`` (None: a package without the guard)."""

    class Guard:
        name = "guard"

        @staticmethod
        def status() -> HookStatus | None:
            return status

        @staticmethod
        def is_live() -> bool:
            return status is not None and status.state == "live"

    monkeypatch.setattr(plugins, "has_guard", lambda: status is not None)
    module = type(sys)("guard")  # in place of the real guard module, loaded or not
    module.HOOK, module.status, module.is_live = Guard, Guard.status, Guard.is_live
    monkeypatch.setitem(sys.modules, plugins.HOOK_MODULES[read.GUARD], module)


def _aiter_report() -> audit.TargetReport:
    src = STANDIN_DROPPED.read_text()
    return read.build_report(read.AITER, STANDIN_DROPPED, src, "aiter", "0.1", given=False)


def _tp8_report(aiter: bool) -> tuple[int, str, dict]:
    """A server's audit after load_plugins() on SGLang 0.5.13.post1 (its real files), the
    SGLang hook live, aiter installed or not."""
    rel = releases.BY_LABEL["0.5.13.post1"]
    require_built(rel)
    path = rel.topk_path()
    view = _view(STANDIN if aiter else None)
    view.loaded = True
    sglang = read.build_report(
        read.SGLANG, path, path.read_text(), "sglang", rel.version, given=False
    )
    sglang.status = HookStatus("sglang", "live", "weights-only", "sglang-amd-moe: ... -> hooked")
    reports = [sglang, _aiter_report() if aiter else read.not_installed(read.AITER)]
    for rep in reports:
        verdict.conclude(rep, view)
    coverage.attach(reports, True)
    exit_status = 1 if render.attention(reports, view) else 0
    return exit_status, render.render_table(reports, exit_status, view), sglang.to_json()


def _path(cov: dict, key: str) -> dict:
    (p,) = [p for p in cov["paths"] if p["path"] == key]
    return p


def test_tp_needs_nothing_and_the_guard_covers_dp_only_where_the_moe_reaches_aiter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TP decode graphs: valid forward passes, nothing to mask, never a hazard. DP attention
    (uninitialised gather rows): the guard, with SGLANG_USE_AITER=1; with it unset (aiter
    importable) no path is credited to the guard and the audit says why."""
    _on_rocm(monkeypatch)
    _guard(monkeypatch, HookStatus("guard", "live", None, "sglang-amd-moe: guard live at ..."))
    monkeypatch.setenv("SGLANG_USE_AITER", "1")
    code, text, t = _tp8_report(aiter=True)
    cov = t["coverage"]
    assert not t["needs_attention"] and "read from" in cov["source"]
    assert cov["reach"]["reaches"] is True and "SGLANG_USE_AITER=1" in cov["reach"]["why"]
    assert _path(cov, "tp")["protected_by"] == [coverage.NOTHING_NEEDED]
    assert _path(cov, "tp")["rows"] == paths.VALID and _path(cov, "tp")["stale"]
    assert _path(cov, "ep")["protected_by"] == ["the SGLang hook (live)", "the guard (live)"]
    assert _path(cov, "dp")["protected_by"] == ["the guard (live)"]
    assert _path(cov, "dp")["rows"] == paths.GATHER
    assert cov["unprotected"] == [] and "coverage: nothing masks" not in text
    tp = next(ln for ln in text.splitlines() if ln.strip().startswith(paths.PATHS["tp"]))
    assert tp.endswith(coverage.NOTHING_NEEDED), tp
    for off in ("0", None):
        if off is None:
            monkeypatch.delenv("SGLANG_USE_AITER")
        else:
            monkeypatch.setenv("SGLANG_USE_AITER", off)
        code, text, t = _tp8_report(aiter=True)
        cov = t["coverage"]
        assert cov["reach"]["reaches"] is False, cov["reach"]
        assert not any("guard" in by for p in cov["paths"] for by in p["protected_by"]), cov
        assert "SGLANG_USE_AITER is not set" in cov["guard"], cov["guard"]
        assert _path(cov, "ep")["protected_by"] == ["the SGLang hook (live)"]
        assert (
            paths.PATHS["dp"] in cov["unprotected"] and paths.PATHS["tp"] not in cov["unprotected"]
        )


@pytest.mark.parametrize(
    ("guard", "aiter", "why"),
    [
        (None, True, "not in this sglang-amd-moe"),
        (HookStatus("guard", "off", None, "sglang-amd-moe: guard off"), True, "off: "),
        (HookStatus("guard", "live", None, "guarded"), False, "off: aiter is not installed"),
    ],
    ids=["no-guard", "guard-off", "no-aiter"],
)
def test_dp_without_the_guard_is_not_protected_and_the_audit_says_so(
    monkeypatch: pytest.MonkeyPatch, guard: HookStatus | None, aiter: bool, why: str
) -> None:
    """Exit 0 (what the plugin can fix is fixed), and the table says plainly that DP
    attention's gathered pad rows are masked by nothing; TP is not listed (nothing to mask)."""
    _on_rocm(monkeypatch)
    _guard(monkeypatch, guard)
    monkeypatch.setenv("SGLANG_USE_AITER", "1")
    code, text, t = _tp8_report(aiter)
    cov = t["coverage"]
    assert not t["needs_attention"] and cov["guard"].startswith(why), cov["guard"]
    assert cov["unprotected"] == [paths.PATHS["dp"]]
    assert _path(cov, "ep")["protected_by"] == ["the SGLang hook (live)"]
    summary = next(ln for ln in text.splitlines() if ln.startswith("coverage: nothing masks"))
    assert paths.PATHS["dp"] in summary and why in summary and "decode" not in summary, summary
    if not aiter:  # the caveat stands beside an exit 0
        assert code == 0 and text.rstrip().endswith("OK: nothing needs action (exit 0)")


def test_sglang_s_own_switches_are_reported_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLANG_MORI_NO_PAD_MASK (0.5.15 on) is named when set; SGLANG_DP_MASK_PAD_ROWS=0
    takes DeepSeek-V4's own DP zeroing away, and the guard is what is left (0.5.23)."""
    rel = releases.BY_LABEL[releases.MAIN_RELEASE]
    require_built(rel)
    _on_rocm(monkeypatch)
    _guard(monkeypatch, HookStatus("guard", "live", None, "sglang-amd-moe: guard live at ..."))
    monkeypatch.setenv("SGLANG_USE_AITER", "1")
    path = rel.topk_path()

    def cov() -> dict:
        rep = read.build_report(read.SGLANG, path, path.read_text(), "sglang", rel.version,
                                given=False)  # fmt: skip
        reports = [rep, _aiter_report()]
        for r in reports:
            verdict.conclude(r, _view(STANDIN))
        coverage.attach(reports, True)
        return rep.coverage

    c = cov()
    v4 = next(p for p in c["paths"] if p["path"] == "dp" and p["family"] == "deepseek-v4")
    assert v4["protected_by"] == [coverage.ZEROED] and c["notes"] == []
    monkeypatch.setenv("SGLANG_MORI_NO_PAD_MASK", "1")
    monkeypatch.setenv("SGLANG_DP_MASK_PAD_ROWS", "0")
    c = cov()
    v4 = next(p for p in c["paths"] if p["path"] == "dp" and p["family"] == "deepseek-v4")
    assert v4["protected_by"] == ["the guard (on load)"], v4
    assert coverage.MORI_SET in c["notes"]
    assert any("SGLANG_DP_MASK_PAD_ROWS=0" in n for n in c["notes"]), c["notes"]


def test_guard_state_is_read_like_the_aiter_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded runtime target named "guard" is found wherever it lives; its status decides
    the guard's state on the aiter target as the aiter hook's decides aiter's (pending
    covers, off does not), and the guard never makes the audit need attention."""
    _on_rocm(monkeypatch)
    view = _view(STANDIN)
    view.loaded = True
    for state, covered in (("pending", True), ("live", True), ("off", False)):
        message = f"sglang-amd-moe: guard {state}"
        _guard(monkeypatch, HookStatus("guard", state, None, message))
        assert plugins.hook_status(read.GUARD).state == state
        rep = _aiter_report()
        verdict.conclude(rep, view)
        assert rep.guard == {
            "state": state, "live": state == "live", "why": message, "covered": covered
        }, rep.guard  # fmt: skip
        assert rep.to_json()["guard"] == rep.guard
        text = render.render_table([rep], 1, view)
        shown = "live here" if state == "live" else state
        assert f"guard at its MoE entry: {shown} ({message})" in text
    view.loaded = False  # the plain audit: the routes say
    rep = _aiter_report()
    verdict.conclude(rep, view)
    assert (rep.guard["state"], rep.guard["covered"]) == ("on load", True), rep.guard
    assert "aiter.fused_moe._fused_moe_impl" in rep.guard["why"]
    monkeypatch.setenv("SGLANG_AMD_MOE_GUARD", "0")
    verdict.conclude(rep, view)
    assert (rep.guard["state"], rep.guard["covered"]) == ("off", False), rep.guard


def test_guard_switch_is_read_before_load(monkeypatch: pytest.MonkeyPatch) -> None:
    _on_rocm(monkeypatch)
    assert verdict.predicted(plugins.routes(read.GUARD, _view(STANDIN))[0])[:2] == (True, "on load")
    monkeypatch.setenv("SGLANG_AMD_MOE_GUARD", "0")
    (route,) = plugins.routes(read.GUARD, _view(STANDIN))[:1]
    assert (route.cell, route.why) == ("off", "the guard alone is off (SGLANG_AMD_MOE_GUARD=0)")
    assert plugins.routes(read.SGLANG, _view(STANDIN))[0].cell == ""  # the hook stays


# --------------------------------------------------------------------------- strict, smaller items


def test_strict_leaves_an_unknown_body_to_upstream_and_says_why(
    release_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = release_files["0.5.13.post1"]
    src = path.read_text().replace("topk_weights[indices >= num", "topk_weights[indices > num")
    monkeypatch.setenv("SGLANG_AMD_MOE_STRICT", "1")
    rep = read.build_report(read.SGLANG, path, src, "sglang", "0.5.13.post1", given=False)
    assert rep.form == "unknown"
    verdict.conclude(rep, _view(None))
    assert rep.needs_attention and verdict.STRICT in rep.reason
    assert rep.action == f"not hooked: {verdict.STRICT}"
    # --load: the hook's own refusal (its log line) is the reason shown.
    refused = HookStatus("sglang", "refused", "unknown", "sglang-amd-moe: unknown body left "
                         "to upstream (SGLANG_AMD_MOE_STRICT=1)")  # fmt: skip
    rep.seen = plugins.Seen("upstream's function", _RIGHT, _probe("unknown", True), refused)
    v = verdict.behaviour_verdict(rep, verdict.verdict(rep, _view(None)))
    assert v.attention and "left to upstream (SGLANG_AMD_MOE_STRICT=1)" in v.reason, v.reason


def test_exit_1_always_lists_what_needs_action() -> None:
    rep = read.not_installed(read.SGLANG)
    rep.needs_attention, rep.reason = True, "weights-only: not covered: plugin disabled"
    view = _view(None)
    doc = json.loads(render.render_json([rep], 1, view, diff=False))
    assert doc["problems"] == [] and doc["attention"] == [f"sglang: {rep.reason}"]
    view.problems = ["both triton and pytorch-triton-rocm"]
    rep.needs_attention = False
    text = render.render_table([rep], 1, view)
    assert text.rstrip().endswith("ATTENTION: the environment needs action (exit 1)")
    assert render.attention([rep], view) == ["environment: both triton and pytorch-triton-rocm"]


def test_load_off_rocm_gives_the_plugins_own_reason(
    release_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang 0.5.23 off ROCm after load_plugins(): the plugin logs "not ROCm ...; nothing
    hooked"; the audit prints that line as the plugin's, and labels the action it would
    take as the one on a ROCm machine (one state, one reason)."""
    monkeypatch.delenv("SGLANG_AMD_MOE_FORCE", raising=False)
    monkeypatch.setattr(sources, "torch_is_rocm", lambda: False)
    path = release_files[releases.MAIN_RELEASE]
    rep = read.build_report(read.SGLANG, path, path.read_text(), "sglang", "0.5.23", given=False)
    line = "sglang-amd-moe: not ROCm (torch.version.hip is unset; ...); nothing hooked"
    rep.status, rep.hook_message = _off(line), line
    preview = HookStatus("sglang", "not-needed", "fixed", "not hooked",
                         {"probe": {"ran": False, "why": "topk is not imported"}})  # fmt: skip
    rep.seen = plugins.Seen("upstream's function", _RIGHT, _RIGHT, preview, previewed=True)
    view = _view(None)
    view.loaded = True
    verdict.conclude(rep, view)
    text = render.render_table([rep], 0, view)
    assert "        plugin here: not ROCm (torch.version.hip is unset; ...); nothing hooked" in text
    assert "        plugin action on a ROCm machine: not hooked: upstream already masks" in text


def test_patch_command_for_a_dash_name_and_a_symlink(
    release_files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--sglang-source -img/.../topk.py`: the command must not read the name as options
    (it once wrote an unrelated pk.py); a symlink is patched where it points (GNU patch
    refuses a link). Both inside a view of the release's package, as in an image."""
    monkeypatch.chdir(tmp_path)
    src = release_files["0.5.13.post1"].read_text()
    dash = package_view("0.5.13.post1", src, tmp_path / "-img").relative_to(tmp_path)
    link = package_view("0.5.13.post1", src, tmp_path / "img")
    real = tmp_path / "real.py"
    real.write_text(src)
    link.unlink()
    link.symlink_to(real)
    name = patching.patch_for("sglang", "weights-only")
    for arg, patched in ((str(dash), dash), (str(link), real)):
        proc = run_cli("--json", f"--sglang-source={arg}", cwd=tmp_path)
        (t,) = json.loads(proc.stdout)["targets"]
        assert t["form"] == "weights-only", t["reason"]
        assert t["apply_command"] == patching.apply_command(t["file"], name)
        target = f"./{dash}" if patched == dash else str(real)
        assert f" {target} " in t["apply_command"], t["apply_command"]
        if shutil.which("patch") is not None:
            proc = subprocess.run(
                ["bash", "-c", t["apply_command"]], capture_output=True, text=True
            )
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert Path(patched).read_text() == patching.apply_text(src, patching.read_patch(name))
    assert link.is_symlink() and sorted(os.listdir()) == ["-img", "img", "real.py"]


# --------------------------------------------------------------------------- the patch probe, run

#: Runs in SGLang 0.5.13.post1's own interpreter (its topk.py imports
#: ``sglang.jit_kernel``, which the SGLang 0.5.23 of this interpreter does not have, so the
#: real module cannot be imported here). Per case: the installed topk.py's text with the
#: case's edits is what the audit read (``read.build_report``: form, patch, patch status),
#: upstream is probed as ``--load`` probes it where nothing hooks it
#: (``sglang_probe.probe``), then ``plugins.check_patch`` runs with the real module
#: (or a copy of its namespace without the names in ``without``, its functions rebound to
#: the copy, as the probe rebinds them), then ``verdict.conclude`` and ``render_table``.
_PATCH_PROBE_SCRIPT = r"""
import inspect, json, sys, types
from pathlib import Path

import sglang.srt.layers.moe.topk as topk

from sglang_amd_moe.diagnostics import audit
from sglang_amd_moe.diagnostics.audit import plugins, read, render, verdict
from sglang_amd_moe.runtime.sglang import probe as sglang_probe

path = Path(topk.__file__)
installed = path.read_text()
out = {"audit_file": audit.__file__}
for name, case in json.loads(Path(sys.argv[1]).read_text()).items():
    source = installed
    for old, new in case["edits"]:
        assert source.count(old) == 1, (name, old)
        source = source.replace(old, new)
    module = topk
    if case["without"]:
        module = types.ModuleType(topk.__name__)
        ns = vars(module)
        ns.update((k, v) for k, v in vars(topk).items() if k not in case["without"])
        for k, v in list(ns.items()):
            if isinstance(v, types.FunctionType) and v.__globals__ is vars(topk):
                ns[k] = sglang_probe.rebind(v, ns)
    rep = read.build_report(read.SGLANG, path, source, "sglang", "0.5.13.post1", given=False)
    if case.get("patch"):  # an edited body the ledger does not know: the form's patch
        rep.patch = case["patch"]
        rep.patch_status = audit.patching.status(source, audit.patching.read_patch(rep.patch))
    before = [rep.form, rep.patch, rep.patch_status]
    upstream = sglang_probe.probe(inspect.unwrap(module._post_process_topk_ids))
    plugins.check_patch(rep, module, upstream)
    checked = rep.to_json()
    rep.seen = plugins.Seen("upstream's function", upstream, upstream, None)
    view = plugins.plugin_view()
    view.loaded = True
    verdict.conclude(rep, view)
    out[name] = {
        "before": before,
        "upstream": {"ran": upstream.ran, "why": upstream.why, "behaviour": upstream.behaviour},
        "checked": checked,
        "concluded": rep.to_json(),
        "table": render.render_table([rep], 1, view),
    }
print(json.dumps(out))
"""

_WEIGHTS = "sglang-weights-only.diff"
#: 0.5.13.post1's padded-weight zeroing starting one row late (as in
#: tests/compat/test_audit_behaviour.py): the patch still applies, and keeps the bug.
_WEIGHTS_OFF_BY_ONE = (
    "    topk_weights[indices >= num_token_non_padded, :] = 0.0\n",
    "    topk_weights[indices > num_token_non_padded, :] = 0.0\n",
)
#: A decorator that the loaded module does not define: the text the audit read is not
#: the text the module was loaded from (the file changed after the import).
_UNDEFINED_DECORATOR = (
    "\ndef _post_process_topk_ids(",
    "\n@_traced_by_the_site\ndef _post_process_topk_ids(",
)
_PATCH_PROBE_CASES = {
    "right": {"edits": [], "without": []},
    "cannot-run": {"edits": [], "without": ["TopKConfig"]},
    "runs-wrong": {"edits": [_WEIGHTS_OFF_BY_ONE], "without": [], "patch": _WEIGHTS},
    "does-not-load": {"edits": [_UNDEFINED_DECORATOR], "without": [], "patch": _WEIGHTS},
}


@pytest.fixture(scope="module")
def patch_probe_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """case -> what ``_check_patch`` left on the report, and the report concluded."""
    rel = releases.BY_LABEL["0.5.13.post1"]
    require_built(rel)
    cases = tmp_path_factory.mktemp("patch-probe") / "cases.json"
    cases.write_text(json.dumps(_PATCH_PROBE_CASES))
    proc = subprocess.run(
        [str(rel.python), "-c", _PATCH_PROBE_SCRIPT, str(cases)],
        capture_output=True,
        text=True,
        cwd=outside_tree(),
        env=switches_off("TRITON_INTERPRET"),
        timeout=600,
    )
    assert proc.returncode == 0 and proc.stdout, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert Path(out.pop("audit_file")).is_relative_to(REPO)  # this checkout's audit ran
    for case, run in out.items():  # each case reached _check_patch: the patch applies
        form = "unknown" if _PATCH_PROBE_CASES[case].get("patch") else "weights-only"
        assert run["before"] == [form, _WEIGHTS, patching.APPLIES], case
    return out


def _same_patch(done: dict) -> None:
    """The release's interpreter names its own copy of the patch (the installed wheel's)."""
    theirs, ours = Path(done["patch_file"]), Path(patching.patch_path(_WEIGHTS))
    assert theirs.name == _WEIGHTS and theirs.read_text() == ours.read_text(), theirs
    command = patching.apply_command(done["file"], _WEIGHTS).replace(str(ours), str(theirs))
    assert done["apply_command"] == command


@pytest.mark.sglang
def test_patch_probe_right_on_a_real_release_offers_the_patch(patch_probe_runs: dict) -> None:
    """The real 0.5.13.post1 module and its real patch: the installed function is wrong
    (weights-only), the function the patch makes is right, so the patch is offered and
    the output says it was run."""
    run = patch_probe_runs["right"]
    assert run["upstream"] == {"ran": True, "why": "", "behaviour": "weights-only"}
    checked = run["checked"]
    assert checked["patch_status"] == patching.APPLIES and checked["notes"] == []
    assert checked["patch_probe"] == {"ran": True, "right": True, "findings": [], "why": ""}
    done = run["concluded"]
    _same_patch(done)
    ran = f"{_WEIGHTS} was run before it is offered: the function it makes is right"
    assert any(n.startswith(ran) for n in done["notes"]), done["notes"]
    assert "checked as text only" not in run["table"] and f"note: {ran}" in run["table"]


@pytest.mark.sglang
def test_patch_that_cannot_be_run_here_stays_checked_as_text(patch_probe_runs: dict) -> None:
    """The real 0.5.13.post1 module's namespace without ``TopKConfig`` (the probe builds
    the function's ``topk_config`` from it; this stands in for any module the probe cannot
    run here): neither the installed function nor the patched one runs, so ``_check_patch``
    keeps the patch's text status (still offered), records the probe that did not run, and
    a note says the patch is checked as text only."""
    run = patch_probe_runs["cannot-run"]
    why = "the module has no TopKConfig"
    assert run["upstream"] == {"ran": False, "why": why, "behaviour": ""}
    checked = run["checked"]
    assert checked["patch_status"] == patching.APPLIES
    assert checked["patch_probe"] == {"ran": False, "right": False, "findings": [], "why": why}
    text_only = f"{_WEIGHTS} could not be run here ({why}): it is checked as text only"
    assert checked["notes"] == [text_only]
    done = run["concluded"]
    assert done["patch_status"] == patching.APPLIES and text_only in done["notes"]
    _same_patch(done)
    assert not any("was run before it is offered" in n for n in done["notes"])
    table = run["table"]
    assert f"patch: {done['patch_file']} (applies)" in table and f"note: {text_only}" in table
    assert audit.PATCH_FAILS_PROBE not in table


@pytest.mark.sglang
@pytest.mark.parametrize(
    ("case", "found"),
    [
        # Applies as text, runs, and leaves a padded row's weight.
        ("runs-wrong", "eplb-off: padded weights not zero (nan)"),
        # The installed function runs here, the patched text does not load: not offered
        # (not "checked as text", which is only for a module the probe cannot run at all).
        (
            "does-not-load",
            "the rewritten source does not load: NameError: "
            "name '_traced_by_the_site' is not defined",
        ),
    ],
    ids=["runs-wrong", "does-not-load"],
)
def test_patch_that_fails_the_probe_on_a_real_release_is_not_offered(
    patch_probe_runs: dict, case: str, found: str
) -> None:
    """The real 0.5.13.post1 module and its real patch, applied to a text the patched
    function of which is wrong (``runs-wrong``) or cannot be defined over the module's
    globals (``does-not-load``: the text read carries a decorator the loaded module does
    not define). Neither edited body is in the ledger, so the case hands the check the
    form's patch as the audit does for a known body. ``check_patch`` marks the patch not
    offered and keeps what the probe said; ``conclude`` then gives no path or command,
    and says why."""
    run = patch_probe_runs[case]
    assert run["upstream"]["ran"] is True  # the installed function runs here
    checked = run["checked"]
    assert checked["patch_status"] == audit.PATCH_FAILS_PROBE and checked["notes"] == []
    probe = checked["patch_probe"]
    assert probe["right"] is False and probe["ran"] is (case == "runs-wrong")
    assert (found in probe["findings"]) if probe["ran"] else (probe["why"] == found), probe
    done = run["concluded"]
    assert done["needs_attention"] is True
    assert done["patch_file"] is None and done["apply_command"] is None
    assert (
        f"{_WEIGHTS} applies as text, but the function it makes fails on the probe batch ({found}"
    ) in done["reason"]
    assert "not offered, the patch needs updating" in done["reason"]
    assert not any("text only" in n or "was run before" in n for n in done["notes"])
    row = next(ln for ln in run["table"].splitlines() if ln.startswith("sglang  sglang"))
    assert row.endswith(f"{_WEIGHTS}  {audit.PATCH_FAILS_PROBE}"), row
    assert "to patch the file instead" not in run["table"]


# --------------------------------------------------------------------------- the guard's reach


@pytest.mark.parametrize(
    ("environ", "argv", "aiter", "reaches", "words"),
    [
        ({}, ["x"], True, False, "SGLANG_USE_AITER is not set and no --moe-runner-backend"),
        ({"SGLANG_USE_AITER": "0"}, ["x"], True, False, "SGLANG_USE_AITER is not set"),
        ({"SGLANG_USE_AITER": "False"}, None, True, False, "a server given --moe-runner-backend"),
        ({"SGLANG_USE_AITER": "1"}, ["x"], True, True, "SGLANG_USE_AITER=1 and no --moe-runner"),
        ({"SGLANG_USE_AITER": "TRUE"}, None, True, True, "does not reach it"),
        ({"SGLANG_INT4_WEIGHT": "1"}, ["x"], True, True, "SGLANG_INT4_WEIGHT=1"),
        ({"SGLANG_USE_AITER": "1"}, ["x", "--moe-runner-backend", "triton"], True, False, "triton"),
        ({}, ["x", "--moe-runner-backend=aiter"], True, True, "--moe-runner-backend aiter"),
        ({"SGLANG_USE_AITER": "1"}, ["x"], False, False, "aiter is not installed"),
    ],
)
def test_reach_reads_the_environment_and_the_command_line(
    environ: dict[str, str], argv: list[str] | None, aiter: bool, reaches: bool, words: str
) -> None:
    from sglang_amd_moe.runtime.aiter import reach

    got = reach.sglang_moe(environ, argv, aiter_installed=aiter, paths=())
    assert got.reaches is reaches and words in got.describe(), got


def test_reach_names_the_paths_past_the_guard(tmp_path: Path) -> None:
    """The bypasses are named from the installed files (0.5.23's SGLang has both), and
    outside SGLang (vLLM) the guard's log line says nothing of SGLang's MoE."""
    from sglang_amd_moe.runtime.aiter import reach

    sglang, aiter = tmp_path / "sglang", tmp_path / "aiter"
    assert reach.bypasses(sglang, aiter) == ()
    for rel in reach.SGLANG_BYPASSES:
        (sglang / rel).parent.mkdir(parents=True, exist_ok=True)
        (sglang / rel).write_text("")
    (aiter / "fhmoe").mkdir(parents=True)
    found = reach.bypasses(sglang, aiter)
    assert [w.split()[0] for w in found] == ["FlyDSL", "the", "aiter's"], found
    assert "MegaMoEV2" in found[0] and "W4A8" in found[1] and "FHMoE" in found[2]
    main = releases.BY_LABEL[releases.MAIN_RELEASE]
    require_built(main)
    assert len(reach.bypasses(main.topk_path().parents[3], None)) == 2
    hidden = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    try:
        for k in hidden:
            del sys.modules[k]
        assert reach.this_process() == ""
    finally:
        sys.modules.update(hidden)


def test_a_loose_patched_file_gets_the_coverage_the_patch_implies(
    release_files: dict[str, Path], tmp_path: Path
) -> None:
    """A patched topk.py with no SGLang package beside it: the rows of the releases the
    ledger says its patched body is from, the count-carrying path masked by the patched
    function. Where the ledger cannot tell the release, each path reads as every release
    has it, and what differs between releases reads ``?`` with the reason."""
    name = patching.patch_for("sglang", "weights-only")
    text = release_files["0.5.13.post1"].read_text()
    loose = tmp_path / "topk.py"
    loose.write_text(patching.apply_text(text, patching.read_patch(name)))
    proc = run_cli("--json", "--sglang-source", str(loose))
    (t,) = json.loads(proc.stdout)["targets"]
    assert t["patch_status"] == patching.ALREADY_APPLIED
    cov = t["coverage"]
    assert cov["source"].startswith("as SGLang 0.5.13, 0.5.13.post1 (this patched body"), cov
    by = {p["path"]: (p["count"], p["protected_by"]) for p in cov["paths"]}
    assert by["ep"] == ("yes", [f"SGLang, patched ({name})"])
    assert by["tp"] == ("no", [coverage.NOTHING_NEEDED]) and by["eagle"] == by["tp"]
    assert by["dp"] == ("no", []) and by["dspark"] == ("-", ["-"])
    rows, why = coverage._every_release("not in the ledger")
    cells = {r["path"]: (r["count"], r["rows"]) for r in rows}
    assert cells["tp"] == ("no", paths.VALID) and cells["ep"][0] == "yes"
    assert cells["dp"] == ("?", "?") and cells["prefill-full"] == ("?", "?")
    assert why == "not known (not in the ledger); as every release 0.5.10rc0 - 0.5.23 has it"


@pytest.mark.sglang  # --load runs the real load_plugins() of SGLang 0.5.23
@pytest.mark.parametrize("use_aiter", ["0", "1"])
def test_a_live_guard_is_credited_only_where_sglang_s_moe_reaches_it(
    tmp_path: Path, use_aiter: str
) -> None:
    """aiter importable (the stand-in, laid out as aiter is) and the guard live after the
    real load_plugins(): with SGLANG_USE_AITER=0 its log line says SGLang's MoE does not
    reach it and no path is credited to it; with 1, the DP paths are."""
    from test_aiter_guard import _aiter_target
    from test_aiter_guard import _audit as guard_audit

    (doc,) = guard_audit(tmp_path, "--load --json", imported=True, SGLANG_USE_AITER=use_aiter)
    guard = _aiter_target(doc)["guard"]
    assert guard["state"] == "live" and "guard live at" in guard["why"], guard
    cov = next(t for t in doc["targets"] if t["target"] == "sglang")["coverage"]
    credited = {p["path"] for p in cov["paths"] if any("guard" in b for b in p["protected_by"])}
    if use_aiter == "0":
        assert "SGLang's MoE does not reach it (SGLANG_USE_AITER is not set" in guard["why"]
        assert credited == set() and cov["reach"]["reaches"] is False
    else:
        assert "SGLang's MoE reaches it (SGLANG_USE_AITER=1" in guard["why"]
        assert "dp" in credited and "tp" not in credited
    assert "not guarded: FlyDSL MegaMoEV2" in guard["why"]

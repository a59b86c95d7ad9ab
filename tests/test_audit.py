"""The audit command and the patch applier behind it, in this interpreter (fast).

Real files only: SGLang's topk.py of the CI releases (their environments, or the release
wheel), this package's own patches, and the aiter stand-in (the project's one stand-in
for aiter, which cannot be imported without ROCm). The per-release audits, in each
release's own interpreter, are in ``tests/compat/test_audit_releases.py``.
"""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import releases
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_amd_moe.diagnostics import audit, patching

REPO = Path(__file__).resolve().parents[1]

STANDIN = REPO / "tests" / "aiter_standin"
STANDIN_DROPPED = STANDIN / "aiter" / "_shapes" / "count_dropped" / "fused_moe.py"
STANDIN_REJECTED = STANDIN / "aiter" / "_shapes" / "count_rejected" / "fused_moe.py"
PY = sys.executable


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "sglang_amd_moe", "audit", *args], capture_output=True, text=True, env=env, cwd=REPO,
        timeout=300,
    )


@pytest.fixture(scope="module")
def release_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """topk.py of every CI release, as files (copied, so tests may edit them)."""
    d = tmp_path_factory.mktemp("topk")
    out = {}
    for rel in releases.RELEASES:
        if rel.ci:
            p = d / f"{rel.label}.py"
            p.write_text(releases.topk_source(rel))
            out[rel.label] = p
    return out


# --------------------------------------------------------------------------- patching


def _numbered(n: int, tag: str = "line") -> list[str]:
    return [f"{tag} {i}" for i in range(n)]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=5, max_value=60),
    edits=st.lists(st.tuples(st.integers(0, 59), st.sampled_from(["ins", "del", "rep"])), min_size=1, max_size=6),
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
    assert patching.status(new_text, diff) == (patching.APPLIES if twice else patching.ALREADY_APPLIED)
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
    assert t["hook_live"] is None and t["version"] is None and t["file"] == str(release_files[label])
    if rel.expected_form == "fixed":
        assert proc.returncode == 0 and t["patch"] is None
    else:
        # The image's plugin is not visible from outside: a broken form needs action.
        assert proc.returncode == 1
        assert t["patch"] == patching.patch_for("sglang", rel.expected_form)
        assert t["patch_status"] == patching.APPLIES


@pytest.mark.parametrize("label", [r.label for r in releases.RELEASES if r.ci and r.expected_form != "fixed"])
def test_patched_file_audits_clean(label: str, release_files: dict[str, Path], tmp_path: Path) -> None:
    rel = releases.BY_LABEL[label]
    name = patching.patch_for("sglang", rel.expected_form)
    fixed = tmp_path / "topk.py"
    fixed.write_text(patching.apply_text(release_files[label].read_text(), patching.read_patch(name)))
    proc = run_cli("--json", "--sglang-source", str(fixed))
    (t,) = json.loads(proc.stdout)["targets"]
    assert proc.returncode == 0 and t["form"] == "fixed"
    diff = run_cli("--diff", "--sglang-source", str(fixed))
    assert "already in its fixed form" in diff.stdout


def test_diff_shows_the_fix(release_files: dict[str, Path]) -> None:
    proc = run_cli("--diff", "--sglang-source", str(release_files["0.5.12.post1"]))
    assert proc.returncode == 1
    diff = proc.stdout[proc.stdout.index("--- installed:") :]
    assert "+++ fixed: after sglang-no-hip-handling.diff" in diff
    assert "+        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)" in diff
    assert "+        if _eplb_remap_enabled():" in diff
    # Only the function is diffed (the helpers the patch adds elsewhere are not).
    assert "def _eplb_remap_enabled" not in diff
    guard = run_cli("--diff", "--json", "--sglang-source", str(release_files["0.5.14-mask-under-eplb-guard"]))
    d = json.loads(guard.stdout)["diff"]["sglang"]
    assert "+        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)" in d
    assert "-            _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)" in d


def test_drifted_file_needs_attention(release_files: dict[str, Path], tmp_path: Path) -> None:
    src = release_files["0.5.12.post1"].read_text()
    # A local edit where the patch anchors (the shared-expert append) but not in the HIP
    # logic: still the no-hip-handling form, and the patch no longer fits.
    edited = src.replace("        M, N = router_logits.shape\n", "        M, N = router_logits.shape  # local\n", 1)
    assert edited != src
    p = tmp_path / "topk.py"
    p.write_text(edited)
    proc = run_cli("--json", "--sglang-source", str(p))
    (t,) = json.loads(proc.stdout)["targets"]
    assert t["form"] == "no-hip-handling" and t["patch_status"] == patching.DRIFT and proc.returncode == 1
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
    binary = tmp_path / "topk.py"
    binary.write_bytes(b"\x7fELF\xff\xfe\x00\x80 not source")
    not_text = run_cli("--sglang-source", str(binary))
    assert not_text.returncode == 2 and "not UTF-8" in not_text.stderr, not_text.stderr
    assert run_cli("--load", "--sglang-source", str(STANDIN_DROPPED)).returncode == 2
    assert run_cli("--no-such-option").returncode == 2
    helped = run_cli("--help")
    assert helped.returncode == 0 and "--sglang-source" in helped.stdout


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


def _with_standin(tmp: Path, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The audit with aiter on the path: the stand-in's files laid out as the real package
    lays them out (``aiter/__init__.py`` next to ``aiter/fused_moe.py``), with the stand-in
    set to fail on import the way real aiter does off ROCm, so any import would show."""
    import os

    pkg = tmp / "site" / "aiter"
    if not pkg.exists():
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").symlink_to(STANDIN / "aiter" / "__init__.py")
        (pkg / "fused_moe.py").symlink_to(STANDIN_DROPPED)
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_AMD_MOE_DISABLE", "SGLANG_PLUGINS")}
    env.update(PYTHONPATH=str(pkg.parent), SGLANG_AMD_MOE_TEST_AITER_STANDIN_SHAPE="no-rocm", **(extra_env or {}))
    code = (
        "import json, sys\n"
        "from sglang_amd_moe.diagnostics import audit\n"
        "rc, reps, view = audit.run(['--json'])\n"
        "print(json.dumps({'rc': rc, 'aiter_imported': 'aiter' in sys.modules,\n"
        "  't': [r.to_json() for r in reps]}))\n"
    )
    return subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


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
    [({"SGLANG_AMD_MOE_DISABLE": "1"}, "SGLANG_AMD_MOE_DISABLE"), ({"SGLANG_PLUGINS": "someone_else"}, "SGLANG_PLUGINS")],
)
def test_plugin_disabled_on_broken_form_needs_attention(env: dict[str, str], why: str, tmp_path: Path) -> None:
    out = json.loads(_with_standin(tmp_path, env).stdout)
    t = next(t for t in out["t"] if t["target"] == "aiter")
    assert t["covered"] is False and t["needs_attention"] is True and why in t["reason"]
    assert out["rc"] == 1

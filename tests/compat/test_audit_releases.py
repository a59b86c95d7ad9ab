"""`sglang-amd-moe audit` in the interpreter of each CI release (one per form), checked
against the release table (``tools/compat/releases.py``): the form, the exit status, the
matching patch, and the hook.

This is the CI part of the compatibility matrix (`make compat` runs every release, see
``releases.py matrix``). The plain audit imports neither SGLang nor torch (fast); the
``--load`` audit runs the release's real ``load_plugins()`` with this package's real
entry point, with ``SGLANG_AMD_MOE_FORCE=1`` because this is not a ROCm machine.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import releases
from sglang_release_support import outside_tree, require_built, switches_off

from sglang_amd_moe.diagnostics import patching
from sglang_amd_moe.diagnostics.audit import coverage

CI = [pytest.param(rel.label, id=rel.label) for rel in releases.RELEASES if rel.ci]


def _release(label: str) -> releases.Release:
    rel = releases.BY_LABEL[label]
    require_built(rel)
    return rel


def _audit(
    rel: releases.Release, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    # No TRITON_INTERPRET: set for this suite's kernel tests, not in a user's environment.
    return subprocess.run(
        [str(rel.python), "-m", "sglang_amd_moe", "audit", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**switches_off("TRITON_INTERPRET"), **(env or {})},
        cwd=outside_tree(),
    )


def _sglang(doc: dict) -> dict:
    return next(t for t in doc["targets"] if t["target"] == "sglang")


@pytest.mark.parametrize("label", CI)
def test_audit_matches_expected_form(label: str) -> None:
    rel = _release(label)
    proc = _audit(rel, "--json")
    doc = json.loads(proc.stdout)
    sg = _sglang(doc)
    assert sg["form"] == rel.expected_form
    assert proc.returncode == doc["exit_status"] == rel.expected_audit_exit, sg["reason"]
    assert sg["version"] == rel.version
    assert sg["file"] == str(rel.topk_path())
    assert sg["hook_live"] is False  # nothing loads plugins in a plain audit
    assert len(sg["sha256"]) == 64
    expected_patch = patching.patch_for("sglang", rel.expected_form)
    assert sg["patch"] == expected_patch
    if expected_patch is None:
        assert sg["patch_status"] is None and sg["hook"] == "-"
    else:
        assert sg["patch_status"] == patching.APPLIES
        # The plain audit runs nothing: it says the patch was checked as text only.
        assert any("checked as text only" in n for n in sg["notes"]), sg["notes"]
    assert sg["probe"] is None and sg["patch_probe"] is None
    if not rel.has_plugin_loader:
        # 0.5.10: the plugin cannot load; the audit says so and gives the command to patch.
        assert sg["hook"] == "no loader"
        assert "no plugin loader" in sg["reason"] and "cannot load" in sg["reason"]
        assert sg["action"].startswith("none here; "), sg["action"]
        # The patch the release's own (installed) copy of this package ships.
        here = patching.apply_command(sg["file"], expected_patch)
        shipped = here.replace(patching.patch_path(expected_patch), sg["patch_file"])
        assert sg["patch_file"].endswith(f"/sglang_amd_moe/patches/{expected_patch}")
        assert sg["apply_command"] == shipped
    elif expected_patch is not None:
        assert sg["hook"] == "on load" and sg["covered"] is True
        assert sg["action"].startswith("hooked"), sg["action"]
    if expected_patch is not None:
        # Off ROCm the note says the verdict is for a ROCm machine.
        assert any("not a ROCm build" in n for n in doc["notes"]), doc["notes"]
    aiter = next(t for t in doc["targets"] if t["target"] == "aiter")
    assert aiter["form"] == "not installed" and not aiter["needs_attention"]
    # Coverage, read from the release's own files, is what the table (generated from the
    # release's wheel) says, path by path and family by family; TP needs nothing, and
    # without aiter (no guard) nothing masks the gathered pad rows of DP attention.
    cov = sg["coverage"]
    assert cov["source"] == "read from this SGLang's files", cov["source"]
    table = coverage.table()[rel.version]["rows"]
    got = [{k: p[k] for k in ("path", "family", "count", "rows", "flag", "stale")}
           for p in cov["paths"]]  # fmt: skip
    assert got == [{k: r[k] for k in ("path", "family", "count", "rows", "flag", "stale")}
                   for r in table]  # fmt: skip
    tp = next(p for p in cov["paths"] if p["path"] == "tp")
    assert tp["protected_by"] == [coverage.NOTHING_NEEDED], tp
    assert "TP MoE, decode graphs" not in cov["unprotected"]
    assert any(name.startswith("DP attention, TP MoE") for name in cov["unprotected"])
    assert cov["reach"]["reaches"] is False and cov["reach"]["why"] == "aiter is not installed"
    assert bool(doc["attention"]) is (rel.expected_audit_exit == 1), doc["attention"]
    # The table says the same in five seconds.
    text = _audit(rel)
    assert text.returncode == rel.expected_audit_exit
    head, blank, first, row = text.stdout.splitlines()[:4]
    assert head.startswith("sglang-amd-moe ") and head.endswith(f" audit of {rel.python}"), head
    assert blank == ""
    assert first.split() == ["TARGET", "INSTALLED", "FORM", "HOOK", "PATCH", "PATCH", "STATUS"]
    assert row.split()[:4] == ["sglang", "sglang", rel.version, rel.expected_form]
    assert text.stdout.rstrip().endswith(f"(exit {rel.expected_audit_exit})")
    (summary,) = [ln for ln in text.stdout.splitlines() if ln.startswith("coverage: nothing")]
    assert "DP attention, TP MoE" in summary and "decode graphs" not in summary, summary


_LOADS: dict[tuple[str, bool], tuple[int, dict]] = {}


def _load_keys() -> list[tuple[str, bool]]:
    """Every (release, FORCE) the tests below ask for: FORCE for each CI release, and
    without it for the releases of AGREE (FORCE changes nothing without a loader)."""
    keys = [(r.label, r.has_plugin_loader) for r in releases.RELEASES if r.ci]
    keys += [(p.values[0], False) for p in AGREE]
    return list(dict.fromkeys(keys))


def _load_run(key: tuple[str, bool]) -> tuple[int, dict]:
    rel = _release(key[0])
    env = {"SGLANG_AMD_MOE_FORCE": "1"} if key[1] else {}
    proc = _audit(rel, "--json", "--load", env=env)
    assert proc.stdout, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert proc.returncode == doc["exit_status"]
    return proc.returncode, doc


def _load(rel: releases.Release, *, force: bool) -> tuple[int, dict]:
    """(exit status, JSON document) of ``audit --json --load`` in the release's
    interpreter, with ``SGLANG_AMD_MOE_FORCE=1`` or without. The first call runs every one
    the tests need, two at a time (each imports SGLang: 10-40 s on a loaded 2-core
    machine); each is run once and shared."""
    key = (rel.label, force and rel.has_plugin_loader)
    if key not in _LOADS:
        keys = [k for k in dict.fromkeys([*_load_keys(), key]) if k not in _LOADS]
        with ThreadPoolExecutor(max_workers=2) as pool:
            _LOADS.update(zip(keys, pool.map(_load_run, keys), strict=True))
    return _LOADS[key]


@pytest.mark.sglang
@pytest.mark.parametrize("label", CI)
def test_audit_after_real_load_plugins(label: str) -> None:
    rel = _release(label)
    code, doc = _load(rel, force=True)
    sg = _sglang(doc)
    assert sg["form"] == rel.expected_form
    probe = sg["probe"]
    if not rel.has_plugin_loader:
        assert code == 1 and sg["hook"] == "no loader" and sg["hook_live"] is False
        # Nothing hooks it: upstream's function is what runs. Where its module imports
        # here it runs wrong; where it does not, the audit says so and keeps to the source.
        if probe["ran"]:
            assert not probe["right"] and probe["behaviour"] == rel.expected_form, probe
            assert sg["patch_probe"]["right"] and sg["patch_status"] == patching.APPLIES
        else:
            assert any("the probe could not run" in n for n in sg["notes"]), sg["notes"]
            assert sg["patch_status"] == patching.APPLIES and sg["patch_probe"] is None
    elif rel.expected_form == "fixed":
        assert code == 0 and sg["hook_live"] is False
        # Its file reads fixed, so the plugin decides without importing topk; the audit
        # imports it and runs upstream's function: it must come out right.
        assert probe["of"] == "upstream's function" and probe["plugin"] == "not-needed"
        assert probe["ran"] and probe["right"] and probe["behaviour"] == "fixed", probe
        assert "on the probe batch shows it right" in sg["reason"]
    else:
        assert sg["hook_live"] is True and sg["hook"] == "live" and sg["hook_state"] == "live", sg[
            "reason"
        ]
        assert code == 0
        # The hooked call, run on the probe batch, is right; upstream alone acts as its form.
        assert probe["of"] == "the hooked call" and probe["ran"] and probe["right"], probe
        assert probe["behaviour"] == rel.expected_form and not probe["previewed"]
        # The patch was run before it was offered.
        assert sg["patch_probe"] == {"ran": True, "right": True, "findings": [], "why": ""}
        assert sg["patch_status"] == patching.APPLIES and sg["apply_command"]
    # FORCE=1 made the hook live: no note may say the plugin stays off here.
    if rel.has_plugin_loader:
        assert not any("stays off" in n for n in doc["notes"]), doc["notes"]
    # Disabled on a broken form: needs attention, and the audit says why.
    if rel.has_plugin_loader and rel.expected_form != "fixed":
        off = _audit(rel, "--json", env={"SGLANG_AMD_MOE_DISABLE": "1"})
        off_doc = json.loads(off.stdout)
        sg_off = _sglang(off_doc)
        assert (
            off.returncode == 1
            and sg_off["hook"] == "off"
            and "SGLANG_AMD_MOE_DISABLE" in sg_off["reason"]
        )
        # Exit 1 with what needs action listed (not an empty list beside it).
        assert off_doc["attention"] == [f"sglang: {sg_off['reason']}"], off_doc["attention"]


# One release without a plugin loader and one broken release with it: the verdict
# logic is the same for every release (test_audit.py checks it for every hook state),
# and each `--load` imports SGLang (40 s on a loaded 2-core machine).
AGREE = [
    pytest.param(rel.label, id=rel.label)
    for rel in (
        next(r for r in releases.RELEASES if r.ci and not r.has_plugin_loader),
        next(
            r
            for r in releases.RELEASES
            if r.ci and r.has_plugin_loader and r.expected_form != "fixed"
        ),
    )
]


@pytest.mark.sglang
@pytest.mark.parametrize("label", AGREE)
def test_load_and_plain_audit_agree_off_rocm(label: str) -> None:
    """On a machine without ROCm torch and without FORCE, load_plugins() calls the plugin
    and its hook stays off: `--load` gives the same verdict as the plain audit (what the
    software does on ROCm), drift and patch included, with a HOOK cell that says why
    nothing is hooked here; and it runs what the plugin would run on ROCm."""
    rel = _release(label)
    plain = _audit(rel, "--json")
    code, l_doc = _load(rel, force=False)
    p_doc = json.loads(plain.stdout)
    assert plain.returncode == code == rel.expected_audit_exit
    p, lo = _sglang(p_doc), _sglang(l_doc)
    for key in (
        "form",
        "covered",
        "needs_attention",
        "patch",
        "patch_status",
        "action",
        "apply_command",
    ):
        assert p[key] == lo[key], (key, p[key], lo[key])
    assert p_doc["notes"] == l_doc["notes"]
    assert p["probe"] is None and p["patch_probe"] is None  # the plain audit runs nothing
    if rel.has_plugin_loader and rel.expected_form != "fixed":
        assert lo["hook"] == "not ROCm" and lo["hook_state"] == "off" and lo["hook_live"] is False
        assert "load_plugins() called the plugin" in lo["reason"]
        # The plugin's own line is shown, with its reason for this process.
        assert lo["hook_message"].startswith("sglang-amd-moe: not ROCm"), lo["hook_message"]
        # What the plugin does on a ROCm machine, previewed here and run on the probe batch.
        probe = lo["probe"]
        assert probe["previewed"] and probe["plugin"] == "pending" and probe["right"], probe
        assert probe["of"].startswith("the hooked call") and probe["behaviour"] == rel.expected_form
        assert lo["patch_probe"]["right"]

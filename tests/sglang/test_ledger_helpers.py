"""The ledger's fingerprint beyond the function (``runtime/sglang/ledger.py``): the helpers
it reaches in topk.py and in the SGLang modules it imports from, names the body uses that
its module writes by other means, every release's form kept through the regeneration, and
the ledger tool's commands for releases it does not have yet (``tools/compat/ledger.py``).
Real release sources throughout; the registry is a list the tests give."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import shutil
import textwrap
from pathlib import Path

import ledger as ledger_tool  # tools/compat
import pytest
from packaging.version import Version
from sglang_release_support import releases

from sglang_amd_moe.diagnostics import topk_source
from sglang_amd_moe.runtime.sglang import hook, ledger

MAIN = releases.MAIN_RELEASE
#: Every source the ledger had before the fingerprint covered the helpers: each must still
#: be there, with the form its release (or patch) has.
SOURCES_BEFORE = [
    *(f"sglang {v}" for v in ledger_tool.VERSIONS if v != "0.5.10rc0"),
    *(f"sglang {v} + sglang-no-hip-handling.diff" for v in
      ("0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1")),
    "sglang 0.5.13 + sglang-weights-only.diff",
    "sglang 0.5.13.post1 + sglang-weights-only.diff",
    *(f"sglang {v} + guard_form/from_0.5.14.diff" for v in
      ("0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18")),
    *(f"sglang {v} + guard_form/from_0.5.14.diff + sglang-mask-under-eplb-guard.diff" for v in
      ("0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18")),
    "sglang 0.5.22 + guard_form/from_0.5.23.diff",
    "sglang 0.5.23 + guard_form/from_0.5.23.diff",
]  # fmt: skip


def expected_form(source: str) -> str:
    """A release's form (the README's release table), the guard form rebuilt from it, or
    a shipped patch's result (fixed)."""
    release, *patches = source.split(" + ")
    if patches and not patches[-1].startswith("guard_form/"):
        return "fixed"
    if patches:
        return "mask-under-eplb-guard"
    v = Version(release.split()[1])
    return (
        "no-hip-handling"
        if v < Version("0.5.13")
        else "weights-only"
        if v < Version("0.5.14")
        else "fixed"
    )


def _read(version: str, text: str | None = None, modules=None) -> ledger.Reading:
    if text is None and modules is None:
        return _release(version)
    text = ledger_tool.wheel_topk(version) if text is None else text
    return ledger.read(text, modules=modules or ledger_tool.wheel_modules(version))


@functools.cache
def _release(version: str) -> ledger.Reading:
    """The release's own topk.py, read with its own modules (once per test process)."""
    return ledger.read(ledger_tool.wheel_topk(version), modules=ledger_tool.wheel_modules(version))


# --------------------------------------------------------------------- forms kept


def test_every_release_keeps_its_form() -> None:
    """The regenerated ledger gives every source it had before, and the pre-release
    0.5.10rc0, the form that release, guard body or patch has."""
    doc = json.loads(ledger.LEDGER_FILE.read_text())
    forms = {s: e["form"] for e in doc["entries"].values() for s in e["sources"]}
    assert set(SOURCES_BEFORE) <= set(forms)
    assert {"sglang 0.5.10rc0", "sglang 0.5.10rc0 + sglang-no-hip-handling.diff"} <= set(forms)
    wrong = {s: (f, expected_form(s)) for s, f in forms.items() if f != expected_form(s)}
    assert wrong == {}
    assert set(ledger_tool.VERSIONS) <= set(ledger.releases())
    assert ledger.built() == doc["built"] and len(doc["built"]) == 10  # an ISO date


# --------------------------------------------------------------------- helpers


def test_the_fingerprint_names_the_helpers_in_other_modules() -> None:
    r = _read(MAIN)
    assert r.form == "fixed"
    for helper in (
        "sglang.srt.eplb.expert_location_dispatch.topk_ids_logical_to_physical",
        "sglang.srt.layers.moe.utils.has_per_rank_fused_shared_slots",
        "sglang.srt.layers.moe.utils.get_moe_a2a_backend",  # through the package's re-export
        "sglang.srt.utils.common.is_hip",  # through `_is_hip = is_hip()` and a star import
    ):
        assert helper in r.helpers, helper


def _edited(modules: ledger.Modules, module: str, edit) -> ledger.Modules:
    """``modules`` with ``module``'s text passed through ``edit``."""

    def find(name: str):
        found = modules(name)
        if name != module or found is None:
            return found
        return edit(found[0]), found[1]

    return find


def _append_to_def(text: str, name: str, line: str) -> str:
    """``text`` with ``line`` added as the last statement of top-level def ``name``."""
    fn = next(n for n in ast.parse(text).body if getattr(n, "name", None) == name)
    lines = text.splitlines(keepends=True)
    return "".join(lines[: fn.end_lineno] + [f"    {line}\n"] + lines[fn.end_lineno :])


def test_a_helper_changed_in_another_module_changes_the_fingerprint() -> None:
    """topk.py as released, one helper in ``expert_location_dispatch`` changed: another
    body. A function of that module the body never reaches changed: the same body."""
    modules = ledger_tool.wheel_modules(MAIN)
    base = _read(MAIN)
    dispatch = "sglang.srt.eplb.expert_location_dispatch"
    head = "def topk_ids_logical_to_physical("
    reached = _edited(modules, dispatch, lambda t: t.replace(head, head + "\n    _x=0,", 1))
    changed = _read(MAIN, modules=reached)
    assert changed.fingerprint != base.fingerprint and changed.form == "unknown"
    deeper = _edited(modules, dispatch, lambda t: _append_to_def(
        t, "_topk_ids_logical_to_physical_static", "topk_ids = topk_ids"))  # fmt: skip
    assert _read(MAIN, modules=deeper).form == "unknown"  # reached through the helper
    other = _edited(modules, dispatch, lambda t: _append_to_def(
        t, "transform_select_experts_inputs", "pass"))  # fmt: skip
    assert _read(MAIN, modules=other).fingerprint == base.fingerprint
    missing = _read(MAIN, modules=lambda name: None if name == dispatch else modules(name))
    assert missing.form == "unknown"  # a module it imports from that cannot be read


# --------------------------------------------------------------------- rebinding

APPENDED = "\n_mask_topk_ids_padded_region = lambda *a, **k: None\n"


def test_the_appended_line_that_disables_the_mask_is_unknown() -> None:
    """0.5.23's topk.py with one line appended that turns its padded-row mask into a
    no-op: not 0.5.23's body (it read as `fixed` when only the first binding counted)."""
    base, appended = _read(MAIN), _read(MAIN, ledger_tool.wheel_topk(MAIN) + APPENDED)
    assert base.form == "fixed"
    assert appended.form == "unknown" and appended.fingerprint != base.fingerprint
    assert "_mask_topk_ids_padded_region is bound 2 times" in appended.why


@pytest.mark.parametrize(
    ("tail", "why"),
    [
        ("import sys\nsetattr(sys.modules[__name__], '_mask_topk_ids_padded_region', len)",
         "_mask_topk_ids_padded_region of topk.py is rebound"),
        ("globals()['_mask_topk_ids_padded_region'] = len",
         "_mask_topk_ids_padded_region of topk.py is rebound"),
        ("globals().update(_is_hip=False)", "writes names of topk.py it computes"),
        ("for _n in ('_is_hip',):\n    globals()[_n] = False", "writes names of topk.py"),
        ("import sys\nsys.modules[__name__]._is_hip = False", "_is_hip of topk.py is rebound"),
        ("import sys\n_me = sys.modules[__name__]\n_me._use_aiter = False",
         "_use_aiter of topk.py is rebound"),
        ("def _later():\n    global _mask_topk_ids_padded_region\n"
         "    _mask_topk_ids_padded_region = len", "declared global"),
        ("_mask_topk_ids_padded_region.__code__ = len.__code__", ".__code__ is written"),
        ("import sys\nsetattr(sys.modules[__name__], '_post_process_topk_ids', len)",
         "_post_process_topk_ids of topk.py is rebound"),
        ("_post_process_topk_ids.__code__ = len.__code__", "_post_process_topk_ids.__code__"),
    ],
)  # fmt: skip
def test_a_name_the_body_uses_written_by_other_means_is_unknown(tail: str, why: str) -> None:
    """These writes are not statements binding the name: the reading refuses the body
    whatever its fingerprint, and the statement that writes is in the fingerprint (two
    bodies rebinding differently never share a fingerprint, nor a verdict kept for it)."""
    base = _read(MAIN)
    r = _read(MAIN, ledger_tool.wheel_topk(MAIN) + "\n" + tail + "\n")
    assert base.form == "fixed" and r.fingerprint != base.fingerprint
    assert r.form == "unknown" and r.known is None
    assert why in r.rebound and why in r.why
    other = _read(MAIN, ledger_tool.wheel_topk(MAIN) + "\n" + tail.replace("len", "abs") + "\n")
    assert other.rebound and (other.fingerprint != r.fingerprint) == ("len" in tail)


def test_an_import_over_a_helper_is_unknown() -> None:
    r = _read(MAIN, ledger_tool.wheel_topk(MAIN) + "\nfrom os import sep as _is_hip\n")
    assert r.form == "unknown" and "_is_hip is bound 2 times" in r.bound_again


def test_another_module_writing_topk_is_unknown() -> None:
    """A module the body imports from that rebinds one of topk's names."""
    modules = ledger_tool.wheel_modules(MAIN)
    utils = "sglang.srt.layers.moe.utils"
    patched = _edited(modules, utils, lambda t: t + textwrap.dedent("""
        def _patch_topk():
            from sglang.srt.layers.moe import topk
            topk._mask_topk_ids_padded_region = lambda *a, **k: None
        """))  # fmt: skip
    r = _read(MAIN, modules=patched)
    assert r.form == "unknown" and "of topk.py is rebound at sglang.srt.layers.moe.utils" in r.why


def test_the_shipped_patches_wrapping_a_helper_are_known() -> None:
    """The no-hip-handling patch binds ``_mask_topk_ids_padded_region`` a second time (it
    wraps upstream's): each binding is in the fingerprint, and the ledger ran that body."""
    from sglang_amd_moe.diagnostics import patching

    text = ledger_tool.wheel_topk("0.5.12.post1")
    fixed = patching.apply_text(text, patching.read_patch("sglang-no-hip-handling.diff"))
    r = _read("0.5.12.post1", fixed)
    assert r.bound_again and r.form == "fixed"


# --------------------------------------------------------------------- installed files

TOPK = """
from sglang.srt.helpers import mask, scale

_is_hip = True


def _post_process_topk_ids(topk_ids, topk_weights, num_token_non_padded=None):
    mask(topk_ids, num_token_non_padded)
    return topk_ids, scale(topk_weights)
"""
HELPERS = """
from sglang.srt.deeper import fill


def mask(ids, count):
    fill(ids, count)


def scale(w):
    return w


def unrelated():
    return 1
"""
DEEPER = """
def fill(ids, count):
    return None
"""


def _package(root: Path) -> Path:
    """A small SGLang tree: topk.py and two helper modules, as an installed package."""
    moe = root / "sglang" / "srt" / "layers" / "moe"
    moe.mkdir(parents=True)
    for d in (root / "sglang", root / "sglang" / "srt"):
        (d / "__init__.py").write_text("")
    (root / "sglang" / "srt" / "helpers.py").write_text(HELPERS)
    (root / "sglang" / "srt" / "deeper.py").write_text(DEEPER)
    (moe / "topk.py").write_text(TOPK)
    return moe / "topk.py"


def test_installed_helpers_are_read_as_files_and_kept_on_disk(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_AMD_MOE_CACHE_DIR", str(tmp_path / "cache"))
    topk = _package(tmp_path / "site")
    base = ledger.read(TOPK, modules=topk)
    assert set(base.helpers) >= {"sglang.srt.helpers.mask", "sglang.srt.deeper.fill"}
    kept = list((tmp_path / "cache" / "fingerprints").glob("*.json"))
    assert len(kept) == 1
    assert ledger.read(TOPK, modules=topk).fingerprint == base.fingerprint  # read back
    deeper = tmp_path / "site" / "sglang" / "srt" / "deeper.py"
    deeper.write_text(DEEPER.replace("return None", "return ids.fill_(0)"))
    changed = ledger.read(TOPK, modules=topk)
    assert changed.fingerprint != base.fingerprint  # the file changed: not the kept result
    deeper.write_text(DEEPER)
    helpers = tmp_path / "site" / "sglang" / "srt" / "helpers.py"
    helpers.write_text(HELPERS.replace("return 1", "return 2"))
    assert ledger.read(TOPK, modules=topk).fingerprint == base.fingerprint  # not reached
    kept[0].write_text("{not json")
    assert ledger.read(TOPK, modules=topk).fingerprint == base.fingerprint
    assert json.loads(kept[0].read_text())["fingerprint"] == base.fingerprint  # rewritten
    loose = tmp_path / "topk.py"  # a copy outside any package: topk.py's part only
    shutil.copy(topk, loose)
    alone = ledger.read(TOPK, modules=loose)
    assert not alone.helpers_read and alone.helpers == () and alone.fingerprint == base.local
    assert alone.fingerprint == ledger.read(TOPK).fingerprint  # as for the text alone


def test_a_text_alone_is_read_by_its_topk_part(tmp_path) -> None:
    """Without a package to read the helpers from, the ledger answers by the topk.py part
    (every release's own text still reads as its form), and says the helpers were not read."""
    for version, form in (("0.5.12.post1", "no-hip-handling"), (MAIN, "fixed")):
        r = ledger.read(ledger_tool.wheel_topk(version))
        assert r.form == form and not r.helpers_read and ledger.NOT_READ in r.why
        assert r.fingerprint == _read(version).local != _read(version).fingerprint
    r = ledger.read(ledger_tool.wheel_topk(MAIN) + APPENDED)
    assert r.form == "unknown" and ledger.NOT_READ in r.why


# --------------------------------------------------------------------- new releases


def test_missing_lists_registry_releases_the_ledger_lacks() -> None:
    index = ["0.6.0rc1", "0.5.24", "0.5.23", "0.5.10rc0", "0.5.9", "0.4.10.post2", "bogus"]
    assert ledger_tool.missing(index, ledger.releases()) == ["0.5.24", "0.6.0rc1"]
    assert ledger_tool.missing(index, [*ledger.releases(), "0.5.24", "0.6.0rc1"]) == []


def test_the_missing_command_exits_1_and_names_them(monkeypatch, capsys) -> None:
    monkeypatch.setattr(ledger_tool, "registry_versions", lambda: ["0.5.24", *ledger.releases()])
    assert ledger_tool.main(["missing"]) == 1
    assert "not in the ledger: 0.5.24" in capsys.readouterr().out
    monkeypatch.setattr(ledger_tool, "registry_versions", lambda: list(ledger.releases()))
    assert ledger_tool.main(["missing"]) == 0


@pytest.fixture
def ledger_copy(tmp_path, monkeypatch) -> Path:
    """The ledger and its bodies copied where the tool writes them in this test."""
    for mod, attr, src in (
        (ledger, "LEDGER_FILE", ledger.LEDGER_FILE),
        (topk_source, "BODIES_FILE", topk_source.BODIES_FILE),
    ):
        copy = tmp_path / src.name
        shutil.copy(src, copy)
        monkeypatch.setattr(mod, attr, copy)
    ledger._document.cache_clear()
    ledger.entries.cache_clear()
    yield tmp_path / ledger.LEDGER_FILE.name
    ledger._document.cache_clear()
    ledger.entries.cache_clear()


def test_add_puts_a_new_release_in_one_step(ledger_copy: Path) -> None:
    """A release the registry has and the ledger lacks (here 0.5.23's own files under a
    new number, and one without the function): its bodies are fingerprinted and run, its
    coverage rows asked for, the release listed and the build date set."""
    before = json.loads(ledger_copy.read_text())
    asked: list[str] = []
    texts = {"0.5.99": ledger_tool.wheel_topk(MAIN), "0.5.98": None}
    doc = ledger_tool.add(["0.5.98", "0.5.99"], topk=texts.get, coverage_hook=asked.append,
                          modules_of=lambda v: ledger_tool.wheel_modules(MAIN))  # fmt: skip
    assert asked == ["0.5.98", "0.5.99"]
    assert doc["releases"][-2:] == ["0.5.98", "0.5.99"] and doc["built"]
    main_fp = _read(MAIN).fingerprint
    assert doc["entries"][main_fp]["sources"] == ["sglang 0.5.23", "sglang 0.5.99"]
    guard = [e for e in doc["entries"].values() if "sglang 0.5.99 + guard_form" in str(e)]
    assert [e["form"] for e in guard] == ["mask-under-eplb-guard"]
    assert len(doc["entries"]) == len(before["entries"])  # the same bodies, more sources
    assert ledger_tool.missing(["0.5.98", "0.5.99"], ledger.releases()) == []


def test_add_asks_the_coverage_tool_for_the_rows(monkeypatch) -> None:
    import coverage_table  # tools/compat

    asked: list[str] = []
    monkeypatch.setattr(
        coverage_table, "add_release", lambda v: asked.append(v) or {"form": "fixed"}
    )
    ledger_tool.add_coverage("0.5.99")
    assert asked == ["0.5.99"]


# --------------------------------------------------------------------- newer than the ledger


def test_a_release_newer_than_the_ledger_is_said_so() -> None:
    built = ledger.built()
    newest = max(ledger.releases(), key=Version)
    assert ledger.newer_than_ledger("0.5.99") == (
        f"sglang 0.5.99 is newer than this plugin's ledger (built {built})"
    )
    assert ledger.newer_than_ledger(newest) == ""
    assert ledger.newer_than_ledger("0.5.10rc0") == ""
    assert ledger.newer_than_ledger("not a version") == ""


def test_the_hooks_unknown_note_says_newer(monkeypatch) -> None:
    reading = _read(MAIN, ledger_tool.wheel_topk(MAIN) + APPENDED)
    monkeypatch.setattr(importlib.metadata, "version", lambda dist: "0.5.99")
    (note,) = hook._unknown_note(reading, "topk.py")
    assert f"newer than this plugin's ledger (built {ledger.built()})" in note
    assert f"sha256 {reading.fingerprint}" in note
    monkeypatch.setattr(importlib.metadata, "version", lambda dist: MAIN)
    (note,) = hook._unknown_note(reading, "topk.py")
    assert "newer than" not in note


def test_the_audit_says_newer(tmp_path, monkeypatch) -> None:
    from sglang_amd_moe.diagnostics.audit import read as audit_read

    monkeypatch.setenv("SGLANG_AMD_MOE_CACHE_DIR", str(tmp_path))
    path = releases.BY_LABEL[MAIN].topk_path()
    if path is None:
        pytest.skip(f"{MAIN} is not built")
    text = path.read_text() + APPENDED
    rep = audit_read.build_report(audit_read.SGLANG, path, text, "sglang", "0.5.99", given=False)
    assert rep.form == "unknown"
    assert f"sglang 0.5.99 is newer than this plugin's ledger (built {ledger.built()})" in (
        rep.reason
    )
    rep = audit_read.build_report(audit_read.SGLANG, path, text, "sglang", MAIN, given=False)
    assert "newer than" not in rep.reason

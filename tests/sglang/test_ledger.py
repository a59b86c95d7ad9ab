"""The ledger (``runtime/sglang/ledger.py``): the committed table against what
``tools/compat/ledger.py`` writes, the fingerprint's normalisation, the binding rules and
the name scans, on real release sources (no SGLang import except where the tool runs)."""

from __future__ import annotations

import json

import ledger as ledger_tool  # tools/compat
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_release_support import releases

from sglang_amd_moe.runtime.sglang import ledger
from sglang_amd_moe.runtime.sglang.names import FORMS

CI = [r for r in releases.RELEASES if r.ci]


def _wheel_text(version: str) -> str:
    return ledger_tool.wheel_topk(version)


def _read(version: str, text: str | None = None) -> ledger.Reading:
    """The reading of ``text`` (default: the release's own topk.py), with the helpers it
    calls read from the release's wheel."""
    text = _wheel_text(version) if text is None else text
    return ledger.read(text, modules=ledger_tool.wheel_modules(version))


def test_the_committed_ledger_is_what_the_tool_writes_for_the_ci_releases() -> None:
    """Regenerate the entries of every release CI builds (and the patches' results and
    the guard form on them) from the real wheels, by running each body: the committed
    ledger must hold exactly these."""
    versions = sorted({r.version for r in CI})
    entries, _ = ledger_tool.generate([(f"sglang {v}", _wheel_text(v)) for v in versions])
    committed = json.loads(ledger.LEDGER_FILE.read_text())["entries"]
    for fp, entry in entries.items():
        assert fp in committed, (fp, entry["sources"])
        got = committed[fp]
        assert (got["form"], got["plan"]) == (entry["form"], entry["plan"]), entry["sources"]
        assert set(entry["sources"]) <= set(got["sources"])


def test_every_release_reads_as_its_known_form(tmp_path, monkeypatch) -> None:
    """The forms the matrix expects (docs/compat.md) are what the ledger says."""
    monkeypatch.setenv("SGLANG_AMD_MOE_CACHE_DIR", str(tmp_path))  # not the user's cache
    for rel in releases.RELEASES:
        reading = ledger.read(releases.topk_source(rel), modules=ledger_tool.release_modules(rel))
        assert reading.form == rel.expected_form, rel.label


def test_the_ledger_covers_every_release_the_tool_lists() -> None:
    sources = {s for e in ledger.entries().values() for s in e.sources}
    assert {f"sglang {v}" for v in ledger_tool.VERSIONS} <= sources
    assert all(e.form in FORMS and e.form != "unknown" for e in ledger.entries().values())


def _main() -> str:
    return _wheel_text(releases.MAIN_RELEASE)


def _main_read(text: str) -> ledger.Reading:
    return _read(releases.MAIN_RELEASE, text)


def _edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_comments_docstrings_and_layout_do_not_change_the_fingerprint() -> None:
    text = _main()
    base = _main_read(text)
    assert base.form == "fixed"
    commented = _edit(
        text,
        "        eplb_remap_enabled = is_expert_remapping_enabled()\n",
        "        # a new comment\n        eplb_remap_enabled = (\n"
        "            is_expert_remapping_enabled()  # wrapped differently\n        )\n",
    )
    documented = _edit(
        text,
        ") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:\n    num_shared_topk_slots",
        ') -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:\n    """A docstring."""\n'
        "    num_shared_topk_slots",
    )
    for changed in (commented, documented):
        assert _main_read(changed).fingerprint == base.fingerprint
    code = _edit(text, "fill_value=0)\n        if (", "fill_value=-1)\n        if (")
    assert _main_read(code).form == "unknown"


def test_a_changed_helper_is_another_body() -> None:
    """The fingerprint covers the module code the function uses, not only its text."""
    text = _main()
    helper = _edit(
        text,
        "    fill_value: int = -1,\n) -> None:\n    if num_token_non_padded is None:\n",
        "    fill_value: int = -1,\n) -> None:\n    if num_token_non_padded is None or _is_hip:\n",
    )
    assert _main_read(helper).form == "unknown"


@pytest.mark.parametrize(
    ("tail", "binding"),
    [
        ("\n_post_process_topk_ids = len\n", "bound 2 times"),
        ("\nif _is_hip:\n    _post_process_topk_ids = len\n", "bound 2 times"),
        ("\ndel _post_process_topk_ids\n", "bound 2 times"),
    ],
)
def test_a_function_bound_more_than_once_is_unknown(tail: str, binding: str) -> None:
    reading = _main_read(_main() + tail)
    assert reading.form == "unknown" and binding in reading.binding


def test_absent_and_unparsable() -> None:
    assert _main_read("x = 1\n").form == "absent"
    gone = _edit(_main(), "def _post_process_topk_ids(", "def _post_process_topk_ids_v2(")
    assert _main_read(gone).form == "absent"
    broken = _main_read(_main() + "\ndef broken(:\n")
    assert broken.form == "unknown" and "does not parse" in broken.binding


def test_the_scans() -> None:
    weights = _read("0.5.13.post1")
    assert weights.form == "weights-only" and not weights.remaps_on_hip
    guard = _read("0.5.14")
    assert guard.remaps_on_hip and "_eplb_remap_enabled" in guard.predicates
    renamed = _read("0.5.13.post1", _wheel_text("0.5.13.post1").replace("_is_hip", "_on_rocm"))
    assert renamed.hip_flags == ("_on_rocm",) and renamed.form == "unknown"
    pred = _read("0.5.14", _wheel_text("0.5.14").replace("_eplb_remap_enabled", "_remap_on"))
    assert "_remap_on" in pred.predicates  # it reads the server's EPLB settings


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_any_cut_of_the_module_reads_without_raising(data: st.DataObject) -> None:
    lines = _main().splitlines(keepends=True)
    a = data.draw(st.integers(0, len(lines) - 1))
    b = data.draw(st.integers(a, min(a + 60, len(lines))))
    assert _main_read("".join(lines[:a] + lines[b:])).form in FORMS

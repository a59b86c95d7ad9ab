"""The form classifier on edits of real SGLang sources (no SGLang import; fast).

Every edit below is made on the installed text of a real release and must match
exactly once, so a test cannot pass on a source that no longer has the shape it edits.
The per-release classification of the unedited sources is in ``test_releases.py``.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_release_support import releases, require_built, topk_source_path

from sglang_amd_moe.runtime.sglang_forms import ACTIONS, FORMS, analyze_source, classify_source

MAIN = releases.BY_LABEL[releases.MAIN_RELEASE]  # 0.5.23, form fixed
GUARD = releases.BY_LABEL["0.5.14-mask-under-eplb-guard"]
WEIGHTS = releases.BY_LABEL["0.5.13.post1"]

HIP_FILL_0 = "_mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)"
TAIL_ZERO = """        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)

    return topk_ids, topk_weights, recorder_topk_ids"""


def _source(rel) -> str:
    require_built(rel)
    return topk_source_path(rel).read_text()


def _edit(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise AssertionError(f"expected exactly one {old!r} in the source, found {text.count(old)}")
    return text.replace(old, new)


def test_actions_cover_every_form() -> None:
    assert set(ACTIONS) == set(FORMS)
    assert len(FORMS) == 6


def test_absent_when_the_function_is_gone() -> None:
    text = _edit(_source(MAIN), "def _post_process_topk_ids(", "def _post_process_topk_ids_v2(")
    assert classify_source(text) == "absent"


def test_unparsable_source_is_unknown() -> None:
    report = analyze_source(_source(MAIN) + "\ndef broken(:\n")
    assert report.form == "unknown"
    assert "does not parse" in report.reason


def test_fill_with_minus_one_on_hip_is_unknown() -> None:
    text = _edit(_source(MAIN), HIP_FILL_0, HIP_FILL_0.replace("fill_value=0", "fill_value=-1"))
    report = analyze_source(text)
    assert report.form == "unknown"
    assert "-1" in report.reason


def test_default_fill_on_hip_is_unknown() -> None:
    """Upstream's default fill is -1: a HIP mask that omits fill_value is not a fix."""
    text = _edit(
        _source(MAIN), HIP_FILL_0, "_mask_topk_ids_padded_region(topk_ids, num_token_non_padded)"
    )
    assert classify_source(text) == "unknown"


def test_ids_masked_but_weights_never_zeroed_is_unknown() -> None:
    text = _edit(
        _source(MAIN),
        TAIL_ZERO,
        TAIL_ZERO.replace("_zero_topk_weights_padded_region(", "pass  # (", 1),
    )
    report = analyze_source(text)
    assert report.form == "unknown"
    assert "never zeroes" in report.reason


def test_fixed_form_details() -> None:
    report = analyze_source(_source(MAIN))
    assert report.form == "fixed"
    assert report.remap_predicate == "is_expert_remapping_enabled"
    assert report.hip_remaps and report.tail_zeroes_weights
    assert "padded_rows_masked" in report.params  # 0.5.23's extra parameter
    assert len(report.function_sha256) == 64


def test_guard_form_details() -> None:
    report = analyze_source(_source(GUARD))
    assert report.form == "mask-under-eplb-guard"
    assert report.remap_predicate == "_eplb_remap_enabled"
    assert report.hip_remaps


def test_guard_through_a_variable_is_still_the_guard_form() -> None:
    text = _edit(
        _source(GUARD),
        "        if _eplb_remap_enabled():\n",
        "        remap_on = _eplb_remap_enabled()\n        if remap_on:\n",
    )
    assert classify_source(text) == "mask-under-eplb-guard"


def test_negated_guard_is_unknown() -> None:
    text = _edit(
        _source(GUARD),
        "        if _eplb_remap_enabled():\n",
        "        if not _eplb_remap_enabled():\n",
    )
    assert classify_source(text) == "unknown"


def test_moving_the_mask_out_of_the_guard_gives_fixed() -> None:
    """Re-applying upstream PR 28378 by hand to the reconstructed guard form."""
    guard = _source(GUARD)
    inner = (
        "            # On AMD HIP the aiter MoE kernels do not handle topk_ids=-1 safely;\n"
        "            # fill the padded region with 0 before the remap reads it.\n"
        f"            {HIP_FILL_0}\n"
    )
    text = _edit(guard, inner, "")
    text = _edit(
        text,
        "        if _eplb_remap_enabled():\n",
        f"        {HIP_FILL_0}\n        if _eplb_remap_enabled():\n",
    )
    assert classify_source(text) == "fixed"


def test_weights_only_details() -> None:
    report = analyze_source(_source(WEIGHTS))
    assert report.form == "weights-only"
    assert not report.hip_remaps
    assert report.remap_predicate == ""
    assert report.tail_zeroes_weights


def test_dropping_the_hip_branch_gives_no_hip_handling() -> None:
    """Both HIP branches handed to another platform's flag: nothing is left for HIP."""
    text = _source(WEIGHTS).replace("    elif _is_hip:\n", "    elif _is_npu:\n")
    text = _edit(
        text, "    if _is_hip:\n        # Shared-expert", "    if _is_npu:\n        # Shared-expert"
    )
    assert text != _source(WEIGHTS)
    assert classify_source(text) == "no-hip-handling"


def test_a_renamed_hip_flag_is_still_the_hip_branch() -> None:
    """The module's `_is_hip` renamed (still bound to `is_hip()`): the branches it guards
    are what a HIP process runs, so the form does not change."""
    text = _source(WEIGHTS).replace("_is_hip", "_on_rocm")
    assert "_is_hip" not in text
    report = analyze_source(text)
    assert report.form == "weights-only", report.reason
    assert report.hip_flags == ("_on_rocm",)


@functools.cache
def _main_source_and_line() -> tuple[str, int]:
    text = _source(MAIN)
    return text, analyze_source(text).lineno


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_cut_of_the_function_classifies_without_raising(data: st.DataObject) -> None:
    """Remove an arbitrary run of lines from the real function: always one of the six."""
    text, lineno = _main_source_and_line()
    lines = text.splitlines(keepends=True)
    start = lineno - 1
    end = start + 400
    a = data.draw(st.integers(start, end))
    b = data.draw(st.integers(a, min(a + 40, end)))
    cut = "".join(lines[:a] + lines[b:])
    assert classify_source(cut) in FORMS


@pytest.mark.parametrize("text", ["", "x = 1\n", "def _post_process_topk_ids():\n    pass\n"])
def test_tiny_sources(text: str) -> None:
    expected = "no-hip-handling" if "def _post_process_topk_ids" in text else "absent"
    assert classify_source(text) == expected

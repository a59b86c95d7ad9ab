"""The form classifier on edits of real SGLang sources (no SGLang import; fast).

Every edit below is made on the installed text of a real release and must match
exactly once, so a test cannot pass on a source that no longer has the shape it edits.
The per-release classification of the unedited sources is in ``test_releases.py``.
"""

from __future__ import annotations

import functools
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_amd_moe.runtime.sglang_forms import ACTIONS, FORMS, analyze_source, classify_source
from sglang_release_support import releases, require_built, topk_source_path

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


# --- bindings and control flow, on the synthetic module (see synthetic_topk.py) ------


def _syn(form: str, body: str | None = None) -> str:
    import synthetic_topk

    return synthetic_topk.source(form, body)


def _split(text: str) -> tuple[str, str]:
    """(module text before the def, the def to the end of the text)."""
    head, fn = text.split("\ndef _post_process_topk_ids(", 1)
    return head + "\n", "def _post_process_topk_ids(" + fn


def _bound(kind: str, text: str) -> str:
    """``text`` with its function bound to the name another way."""
    head, fn = _split(text)
    if kind == "alias":
        renamed = fn.replace("def _post_process_topk_ids(", "def _impl(", 1)
        return head + renamed + "\n_post_process_topk_ids = _impl\n"
    if kind == "static method":
        inner = textwrap.indent("@staticmethod\n" + fn, "    ")
        return (
            head
            + "class _Post:\n"
            + inner
            + "\n_post_process_topk_ids = _Post._post_process_topk_ids\n"
        )
    if kind == "def inside try":
        return head + "try:\n" + textwrap.indent(fn, "    ") + "except ImportError:\n    raise\n"
    if kind == "override under if _is_hip":
        _, fixed_fn = _split(_syn("fixed"))
        return head + fixed_fn + "\nif _is_hip:\n" + textwrap.indent(fn, "    ")
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "how", ["alias", "static method", "def inside try", "override under if _is_hip"]
)
def test_the_function_is_found_wherever_the_module_binds_it(how: str) -> None:
    report = analyze_source(_bound(how, _syn("weights-only")))
    assert report.form == "weights-only", (how, report.reason)
    assert report.binding


def test_a_binding_under_an_unknown_condition_is_unknown() -> None:
    over = (
        _syn("fixed") + '\nif get_bool_env_var("SOME_SWITCH"):\n    _post_process_topk_ids = len\n'
    )
    report = analyze_source(over)
    assert report.form == "unknown" and "differently on different paths" in report.reason


def test_an_imported_definition_is_unknown_unless_resolved() -> None:
    text = _syn("fixed").split("\ndef _post_process_topk_ids(")[0] + (
        "\nfrom sglang.srt.layers.moe.impl import _post_process_topk_ids\n"
    )
    report = analyze_source(text)
    assert report.form == "unknown" and "imported from sglang.srt.layers.moe.impl" in report.reason
    resolved = analyze_source(text, resolve=lambda name: _syn("mask-under-eplb-guard"))
    assert resolved.form == "mask-under-eplb-guard"


def test_deleted_is_absent() -> None:
    assert classify_source(_syn("fixed") + "\ndel _post_process_topk_ids\n") == "absent"


# Statements of a HIP branch, by what they do (the synthetic module's names).
MASK = "_mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)"
REMAP = "topk_ids = topk_ids_logical_to_physical(topk_ids, expert_location_dispatch_info)"
ZERO = "_zero_topk_weights_padded_region(topk_weights, num_token_non_padded)"


def _branch(header: str, *lines: str) -> str:
    """A HIP branch: ``header`` (``elif ...:``) and its ``lines``, each ``>`` in front of
    a line one more level of indentation."""
    out = ["    " + header]
    for line in lines:
        text = line.lstrip(">")
        out.append("    " * (2 + len(line) - len(text)) + text)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize(
    ("name", "body", "form"),
    [
        (
            "guard clause returning before the mask",
            _branch(
                "elif _is_hip:",
                ZERO,
                "if not _eplb_remap_enabled():",
                ">return topk_ids, topk_weights",
                MASK,
                REMAP,
            ),
            "mask-under-eplb-guard",
        ),
        (
            "elif _is_hip and not _is_gfx95",
            _branch(
                "elif _is_hip and not _is_gfx95:",
                MASK,
                "if _eplb_remap_enabled():",
                ">" + REMAP,
                ZERO,
            ),
            "unknown",
        ),
        (
            "is_hip() spelling",
            _branch("elif is_hip():", MASK, "if _eplb_remap_enabled():", ">" + REMAP, ZERO),
            "fixed",
        ),
        (
            "annotated predicate variable",
            _branch(
                "elif _is_hip:",
                "remap_on: bool = _eplb_remap_enabled()",
                "if remap_on:",
                ">" + MASK,
                ">" + REMAP,
                ZERO,
            ),
            "mask-under-eplb-guard",
        ),
        (
            "predicate inlined on a settings object",
            _branch(
                "elif _is_hip:",
                "args = get_global_server_args()",
                "if args.enable_eplb or args.ep_num_redundant_experts > 0:",
                ">" + MASK,
                ">" + REMAP,
                ZERO,
            ),
            "mask-under-eplb-guard",
        ),
        ("remap whatever EPLB says", _branch("elif _is_hip:", MASK, REMAP, ZERO), "unknown"),
        (
            "remap before the fill",
            _branch("elif _is_hip:", "if _eplb_remap_enabled():", ">" + REMAP, MASK, ZERO),
            "unknown",
        ),
    ],
)
def test_the_hip_path_is_read_by_control_flow(name: str, body: str, form: str) -> None:
    report = analyze_source(_syn("fixed", body))
    assert report.form == form, (name, report.reason)


def test_a_helper_the_body_moved_into_is_followed() -> None:
    helper = (
        "\n\ndef _hip_rows(ids, weights, n, info):\n"
        "    _mask_topk_ids_padded_region(ids, n, fill_value=0)\n"
        "    if _eplb_remap_enabled():\n        ids = topk_ids_logical_to_physical(ids, info)\n"
        "    _zero_topk_weights_padded_region(weights, n)\n    return ids\n"
    )
    body = (
        "    elif _is_hip:\n        topk_ids = _hip_rows(\n"
        "            topk_ids, topk_weights, num_token_non_padded, expert_location_dispatch_info\n"
        "        )\n"
    )
    assert classify_source(_syn("fixed", body) + helper) == "fixed"
    broken = helper.replace("_mask_topk_ids_padded_region(ids, n, fill_value=0)", "pass")
    assert classify_source(_syn("fixed", body) + broken) == "unknown"


def test_a_mask_helper_that_skips_hip_is_not_fixed() -> None:
    text = _edit(
        _syn("fixed"),
        "    if num_token_non_padded is None:\n        return\n    rows = torch.arange(topk_ids",
        "    if num_token_non_padded is None or not _is_cuda:\n"
        "        return\n    rows = torch.arange(topk_ids",
    )
    assert classify_source(text) != "fixed"


def test_the_classifier_imports_only_the_standard_library() -> None:
    import ast as _ast
    import sys

    from sglang_amd_moe.runtime import astutil, sglang_forms

    for mod in (sglang_forms, astutil):
        tree = _ast.parse(open(mod.__file__).read())
        for node in _ast.walk(tree):
            if isinstance(node, _ast.Import | _ast.ImportFrom):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, _ast.Import)
                    else [node.module or ""]
                )
                for name in names:
                    top = name.split(".")[0]
                    assert top in sys.stdlib_module_names or top in (
                        "sglang_amd_moe",
                        "__future__",
                    ), name

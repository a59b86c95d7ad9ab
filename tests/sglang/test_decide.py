"""``sglang_hook.decide`` (pure): what is read and observed -> a plan or a refusal.

The observations are the probe's real ones on the synthetic topk module, so each case
is what the probe says about that code; the real releases and the variant library
check the same decisions end to end."""

from __future__ import annotations

import dataclasses

import pytest
import synthetic_topk as syn
from sglang_amd_moe.runtime.sglang_forms import analyze_source
from sglang_amd_moe.runtime.sglang_hook import (
    STANDARD_PLANS,
    Inputs,
    Plan,
    Refusal,
    alternatives,
    decide,
    form_of,
)
from sglang_amd_moe.runtime.sglang.probe import ProbeResult, probe_module

PARAMS = (
    "topk_ids",
    "topk_weights",
    "topk_config",
    "router_logits",
    "layer_id",
    "num_token_non_padded",
    "expert_location_dispatch_info",
)


@pytest.fixture
def inputs(tmp_path):
    def build(form: str, **kw) -> Inputs:
        text = syn.source(form)
        mod = syn.load(text, tmp_path)
        return Inputs(analyze_source(text), probe_module(mod), kw.pop("params", PARAMS), **kw)

    return build


@pytest.mark.parametrize(
    ("form", "remap", "tail"),
    [
        ("weights-only", "add", False),
        ("no-hip-handling", "add", True),
        ("mask-under-eplb-guard", "upstream", False),
        ("inverted-guard", "own", False),
        ("double-remap", "own", False),
        ("fill-minus-one", "upstream", False),
    ],
)
def test_broken_behaviour_gets_a_plan(inputs, form: str, remap: str, tail: bool) -> None:
    plan = decide(inputs(form))
    assert plan == Plan(pre_mask=True, remap=remap, tail_mask=tail)


def test_right_behaviour_is_left_alone(inputs) -> None:
    assert decide(inputs("fixed")) == Refusal(
        "not-needed", "not hooked: upstream already masks padded ids on HIP"
    )
    assert decide(inputs("fixed", verify=True)) == Plan(False, "upstream", False, verify=True)


def test_behaviour_wins_over_the_source(inputs) -> None:
    """The source reads as weights-only; what runs is right: nothing to hook."""
    right = inputs("fixed")
    shaped = dataclasses.replace(right, report=analyze_source(syn.source("weights-only")))
    assert shaped.report.form == "weights-only"
    assert form_of(shaped) == "fixed"
    assert isinstance(decide(shaped), Refusal)


def test_no_remap_seen_but_one_in_the_source_owns_the_remap(inputs) -> None:
    """The probe saw no remap (it could not steer the predicate, say) while the source
    shows one on HIP: adding a remap could remap twice, so the hook owns it."""
    seen_none = inputs("weights-only")
    shaped = dataclasses.replace(
        seen_none, report=analyze_source(syn.source("mask-under-eplb-guard"))
    )
    assert decide(shaped).remap == "own"
    unsure = dataclasses.replace(seen_none, report=analyze_source(syn.source("fill-minus-one")))
    assert unsure.report.form == "unknown"
    assert decide(unsure).remap == "own"


def test_real_rows_changed_is_refused(inputs) -> None:
    got = decide(inputs("real-rows-scaled"))
    assert isinstance(got, Refusal) and got.state == "refused"
    assert "real rows' weights changed" in got.reason


def test_signature_problems(inputs) -> None:
    assert decide(inputs("weights-only", params=None)).state == "error"
    no_count = decide(inputs("weights-only", params=("topk_ids", "topk_weights")))
    assert isinstance(no_count, Refusal) and "num_token_non_padded" in no_count.reason
    no_info = tuple(p for p in PARAMS if p != "expert_location_dispatch_info")
    lacks = decide(inputs("weights-only", params=no_info))
    assert isinstance(lacks, Refusal) and "expert_location_dispatch_info" in lacks.reason
    # The guard form needs no dispatch info from the hook (upstream remaps).
    assert isinstance(decide(inputs("mask-under-eplb-guard", params=no_info)), Plan)
    no_remap = decide(inputs("weights-only", remap_available=False))
    assert isinstance(no_remap, Refusal) and "topk_ids_logical_to_physical" in no_remap.reason


@pytest.mark.parametrize(
    "form", ["no-hip-handling", "weights-only", "mask-under-eplb-guard", "unknown"]
)
def test_without_an_observation_the_form_decides(inputs, form: str) -> None:
    source_form = "fill-minus-one" if form == "unknown" else form
    base = inputs(source_form)
    assert base.report.form == form
    for observed in (None, ProbeResult(False, "could not run")):
        got = decide(dataclasses.replace(base, observed=observed))
        assert got == STANDARD_PLANS[form] or (form == "unknown" and got.remap == "upstream")


def test_a_raise_on_this_cpu_is_no_observation(inputs) -> None:
    raised = inputs("raises-systemexit")
    assert raised.observed.ran and all(o.raised for o in raised.observed.observations)
    assert form_of(raised) == raised.report.form
    assert isinstance(decide(raised), Plan)


def test_alternatives_escalate_in_order() -> None:
    plan = Plan(True, "upstream", False)
    assert alternatives(plan) == (
        plan,
        Plan(True, "own", False),
        Plan(True, "upstream", False, post_mask=True),
        Plan(True, "own", False, post_mask=True),
    )
    assert alternatives(Plan(False, "upstream", False, verify=True)) == (
        Plan(False, "upstream", False, verify=True),
    )


def test_plan_descriptions_match_the_forms_actions() -> None:
    from sglang_amd_moe.runtime.sglang_forms import ACTIONS

    for form in ("no-hip-handling", "weights-only", "mask-under-eplb-guard"):
        assert STANDARD_PLANS[form].describe(form) == ACTIONS[form]
    own = Plan(True, "own", False, post_mask=True).describe("unknown")
    assert "owned by the hook" in own and "again after upstream" in own

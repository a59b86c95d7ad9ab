"""``decide`` (pure): what is observed (else what the ledger knows) -> a plan or a refusal.

The observations are the probe's real ones on the synthetic topk module, so each case
is what the probe says about that code; the real releases and the variant library
check the same decisions end to end."""

from __future__ import annotations

import dataclasses

import pytest
import synthetic_topk as syn

from sglang_amd_moe.runtime.sglang import ledger
from sglang_amd_moe.runtime.sglang.call import STANDARD_PLANS, Plan
from sglang_amd_moe.runtime.sglang.hook import Inputs, alternatives, decide
from sglang_amd_moe.runtime.sglang.names import ACTIONS
from sglang_amd_moe.runtime.sglang.probe import ProbeResult
from sglang_amd_moe.runtime.target import Refusal

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
        reading = ledger.read(text)
        params = kw.pop("params", PARAMS)
        return Inputs(params, None, syn.probe_module(mod), reading.remaps_on_hip, **kw)

    return build


def _entry(form: str) -> ledger.Entry:
    plan = STANDARD_PLANS.get(form)
    as_dict = dataclasses.asdict(plan) if plan is not None else None
    return ledger.Entry(form, as_dict, ("a release",))


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


def test_behaviour_wins_over_the_ledger(inputs) -> None:
    """The ledger knows the body as weights-only; what runs is right: nothing to hook."""
    right = dataclasses.replace(inputs("fixed"), known=_entry("weights-only"))
    assert isinstance(decide(right), Refusal)


def test_no_remap_seen_but_one_on_a_hip_path_owns_the_remap(inputs) -> None:
    """The probe saw no remap (it could not steer the predicate, say) while a non-CUDA
    path of the source calls one: adding a remap could remap twice, so the hook owns it."""
    seen_none = inputs("weights-only")
    assert not seen_none.remaps_on_hip and decide(seen_none).remap == "add"
    assert decide(dataclasses.replace(seen_none, remaps_on_hip=True)).remap == "own"


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


@pytest.mark.parametrize("form", ["no-hip-handling", "weights-only", "mask-under-eplb-guard"])
def test_without_an_observation_the_ledger_decides(inputs, form: str) -> None:
    base = dataclasses.replace(inputs(form), known=_entry(form))
    for observed in (None, ProbeResult(False, "could not run")):
        assert decide(dataclasses.replace(base, observed=observed)) == STANDARD_PLANS[form]
    fixed = dataclasses.replace(base, observed=None, known=_entry("fixed"))
    assert decide(fixed) == Refusal("not-needed", ACTIONS["fixed"])


def test_an_unknown_body_that_cannot_be_judged_is_refused(inputs) -> None:
    """A raise on this CPU is no observation; the ledger does not know the body: never a
    guessed plan."""
    raised = inputs("raises-systemexit")
    assert raised.observed.ran and not raised.observed.usable
    got = decide(raised)
    assert isinstance(got, Refusal) and got.state == "refused"
    assert "the ledger does not know this body" in got.reason
    assert decide(dataclasses.replace(raised, known=_entry("weights-only"))) == Plan(
        True, "add", False
    )


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
    for form in ("no-hip-handling", "weights-only", "mask-under-eplb-guard"):
        assert STANDARD_PLANS[form].describe(form) == ACTIONS[form]
    own = Plan(True, "own", False, post_mask=True).describe("unknown")
    assert "owned by the hook" in own and "again after upstream" in own

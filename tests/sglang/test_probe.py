"""The probe's scenarios (``runtime/sglang/probe.py``) on the synthetic topk module, run
in-process as the child process runs them: what it observes, and that it never changes the
module or raises. Fast: no SGLang. The child process itself: ``test_probe_child.py``."""

from __future__ import annotations

import threading
import time

import pytest
import synthetic_topk as syn
import torch

from sglang_amd_moe.diagnostics.topk_source import probe_source
from sglang_amd_moe.runtime.sglang import probe as sglang_probe
from sglang_amd_moe.runtime.sglang.probe import ProbeEnv, probe


@pytest.fixture
def make(tmp_path):
    def build(form: str, body: str | None = None):
        return syn.load(syn.source(form, body), tmp_path)

    return build


def _snapshot(mod) -> dict:
    return {k: v for k, v in vars(mod).items()}


@pytest.mark.parametrize(
    ("form", "behaviour"),
    [
        ("fixed", "fixed"),
        ("weights-only", "weights-only"),
        ("no-hip-handling", "no-hip-handling"),
        ("mask-under-eplb-guard", "mask-under-eplb-guard"),
        ("inverted-guard", "unknown"),
        ("double-remap", "unknown"),
        ("fill-minus-one", "unknown"),
    ],
)
def test_behaviour_per_form_and_the_module_is_untouched(make, form: str, behaviour: str) -> None:
    mod = make(form)
    before = _snapshot(mod)
    result = syn.probe_module(mod)
    assert result.ran, result.why
    assert result.behaviour == behaviour, result.findings
    assert result.correct is (behaviour == "fixed")
    after = _snapshot(mod)
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert mod._is_hip is False and mod._is_cuda is True


def test_what_each_scenario_saw(make) -> None:
    off, off_info, on, shared = syn.probe_module(make("inverted-guard")).observations
    names = [o.scenario for o in (off, off_info, on, shared)]
    assert names == ["eplb-off", "eplb-off+info", "eplb-on", "shared-expert"]
    # EPLB off with a dispatch info passed: the inverted guard remaps, it must not.
    assert off_info.real_ids == "remapped-once" and off_info.remaps == 1
    assert off.real_ids == "as-given" and off.remaps == 0  # no dispatch info: no remap
    assert on.real_ids == "as-given" and on.remaps == 0
    assert off.predicate_reads == on.predicate_reads == 1
    assert off.pad_weights_zero and not any("out of range" in f for f in off.findings)
    twice = syn.probe_module(make("double-remap")).scenario("eplb-on")
    assert twice.real_ids == "remapped-twice" and twice.remaps == 2


def test_a_mask_only_with_dispatch_info_is_caught_without_one(tmp_path) -> None:
    """The default server passes no dispatch info: a body that masks only when it gets
    one is wrong there, and only the EPLB-off-without-info scenario shows it."""
    body = syn.BODIES["fixed"].replace(
        "        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)\n",
        "        if expert_location_dispatch_info is not None:\n"
        "            _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)\n",
    )
    result = syn.probe_module(syn.load(syn.source("fixed", body), tmp_path))
    assert not result.correct
    wrong = [o.scenario for o in result.observations if not o.ok]
    assert wrong == ["eplb-off", "shared-expert"]  # the two without dispatch info


def test_the_shared_expert_append_shows_whether_padded_weights_are_refilled(tmp_path) -> None:
    """Upstream's append gives padded rows the shared expert's weight: a body that zeroes
    padded weights only before it leaves them live; one that zeroes after it does not."""
    append = (
        "    if topk_config.num_fused_shared_experts > 0 and _use_aiter:\n"
        "        from sglang.srt.layers.moe.fused_moe_triton import fused_append_shared_experts\n"
        "        topk_ids, topk_weights = fused_append_shared_experts(\n"
        "            topk_ids, topk_weights, 1, 1.0, router_logits.shape[1]\n"
        "        )\n"
    )
    rezero = "    _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)\n"
    before = syn.source("fixed").replace(syn.RETURN, append + syn.RETURN)
    after = syn.source("fixed").replace(syn.RETURN, append + rezero + syn.RETURN)
    prelude = "_use_aiter = False\n"
    before_mod = syn.load(prelude + before, tmp_path)
    after_mod = syn.load(prelude + after, tmp_path)
    assert syn.probe_module(before_mod).refills_after_append is False
    assert not syn.probe_module(before_mod).correct
    assert syn.probe_module(after_mod).refills_after_append is True
    assert syn.probe_module(after_mod).correct
    assert before_mod._use_aiter is False  # the module itself is untouched


def test_upstream_raising_is_an_observation_not_a_crash(make) -> None:
    mod = make("raises-systemexit")
    before = _snapshot(mod)
    result = syn.probe_module(mod)
    assert result.ran and not result.correct and result.behaviour == "unknown"
    assert all(o.raised.startswith("SystemExit") for o in result.observations)
    assert _snapshot(mod) == before


def test_real_rows_changed_are_reported(make) -> None:
    result = syn.probe_module(make("real-rows-scaled"))
    assert "eplb-off: real rows' weights changed" in result.findings


@pytest.mark.parametrize(
    "fn",
    [len, lambda: None, lambda topk_ids, topk_weights: None, "not a function"],
    ids=["builtin", "no-params", "missing-params", "a-string"],
)
def test_never_raises_on_odd_inputs(fn) -> None:
    result = probe(fn)
    assert not result.ran and result.why


def test_no_topkconfig_is_not_a_crash(make) -> None:
    mod = make("fixed")
    ns = dict(vars(mod))
    del ns["TopKConfig"]
    result = probe(mod._post_process_topk_ids, ns)
    assert not result.ran and "TopKConfig" in result.why


def test_other_threads_never_see_the_hip_flags(make) -> None:
    mod = make("fixed")
    seen: set = set()
    samples = [0]
    stop = threading.Event()

    def watch() -> None:
        # sleep(0) gives the GIL back after each read, so the probe runs between reads.
        while not stop.is_set():
            seen.add((mod._is_hip, mod._is_cuda, mod._eplb_remap_enabled()))
            samples[0] += 1
            time.sleep(0)

    t = threading.Thread(target=watch)
    t.start()
    try:
        for _ in range(20):
            assert syn.probe_module(mod).correct
    finally:
        stop.set()
        t.join()
    assert seen == {(False, True, False)} and samples[0] > 100


def test_a_wrap_composes_with_upstream(make) -> None:
    """How a hook checks its plan: padded rows masked and the remap added around the
    weights-only form make it right; the remap twice does not."""
    mod = make("weights-only")

    def hooked(times: int):
        def wrap(upstream, env: ProbeEnv):
            def call(**kw):
                n = kw["num_token_non_padded"]
                rows = torch.arange(kw["topk_ids"].shape[0])
                kw["topk_ids"].masked_fill_((rows >= n)[:, None], 0)
                kw["topk_weights"].masked_fill_((rows >= n)[:, None], 0.0)
                if env.remap_enabled():
                    for _ in range(times):
                        kw["topk_ids"] = env.remap(
                            kw["topk_ids"], kw["expert_location_dispatch_info"]
                        )
                return upstream(**kw)

            return call

        return wrap

    assert syn.probe_module(mod, wrap=hooked(1)).correct
    twice = syn.probe_module(mod, wrap=hooked(2))
    assert (
        not twice.correct
        and "eplb-on: real rows' ids remapped twice, want remapped once" in twice.findings
    )


def test_a_renamed_predicate_is_steered_when_named(tmp_path) -> None:
    body = syn.BODIES["mask-under-eplb-guard"].replace("_eplb_remap_enabled", "_remap_on")
    mod = syn.load(syn.source("fixed", body) + "\n\ndef _remap_on():\n    return False\n", tmp_path)
    # Unnamed, a predicate the probe cannot steer looks like no remap at all: the hook's
    # decision then leans on the source (which shows the remap) and owns the remap.
    blind = syn.probe_module(mod)
    assert not blind.eplb_steered and blind.behaviour == "weights-only"
    named = syn.probe_module(mod, predicates=("_remap_on",))
    assert named.eplb_steered and named.behaviour == "mask-under-eplb-guard"


def test_a_predicate_reading_server_args_through_an_import_is_steered(tmp_path) -> None:
    """A renamed predicate that imports the server-args accessor inside (as upstream's
    does): the import inside the probed code sees the probe's accessor."""
    body = syn.BODIES["mask-under-eplb-guard"].replace("_eplb_remap_enabled()", "_remap_on()")
    pred = (
        "\n\ndef _remap_on():\n"
        "    from sglang.srt.server_args import get_global_server_args\n"
        "    return get_global_server_args().enable_eplb\n"
    )
    mod = syn.load(syn.source("fixed", body) + pred, tmp_path)
    import sys
    import types

    fake = types.ModuleType("sglang.srt.server_args")
    fake.get_global_server_args = lambda: (_ for _ in ()).throw(ValueError("not in a server"))
    saved = {k: sys.modules.get(k) for k in ("sglang", "sglang.srt", "sglang.srt.server_args")}
    for k in ("sglang", "sglang.srt"):
        sys.modules.setdefault(k, types.ModuleType(k))
    sys.modules["sglang.srt.server_args"] = fake
    try:
        result = syn.probe_module(mod, predicates=("_remap_on",))
        direct = syn.probe_module(mod)  # not named: still steered through the import
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    assert result.behaviour == direct.behaviour == "mask-under-eplb-guard", direct.findings
    assert direct.eplb_steered


def test_a_patched_source_is_checked_before_it_is_offered(make) -> None:
    mod = make("weights-only")
    good = syn.source("fixed")
    assert probe_source(mod, good).correct
    # A patch that applies but names a parameter the function does not have.
    bad = syn.source("fixed").replace(
        "_zero_topk_weights_padded_region(topk_weights, num_token_non_padded)",
        "_zero_topk_weights_padded_region(topk_weights, num_tokens_padded)",
    )
    result = probe_source(mod, bad)
    assert result.ran and not result.correct
    assert any("NameError" in f for f in result.findings)
    assert not probe_source(mod, "def broken(:\n").ran
    # The module itself still runs its own function.
    assert syn.probe_module(mod).behaviour == "weights-only"


def test_summary_line(make) -> None:
    assert syn.probe_module(make("fixed")).summary().startswith("probe: right (")
    text = syn.probe_module(make("weights-only")).summary()
    assert text.startswith("probe: weights-only (eplb-off: padded ids out of range")


def test_dispatch_info_is_what_the_real_remap_reads() -> None:
    info = sglang_probe.DispatchInfo(torch)
    perm = info.partial_logical_to_rank_dispatch_physical_map
    assert all(
        int(perm[e]) != e and int(perm[int(perm[e])]) != int(perm[e])
        for e in range(sglang_probe.EXPERTS)
    )

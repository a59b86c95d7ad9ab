"""The guard at aiter's MoE entry against the stand-in, in this process (CPU; Triton
through the interpreter).

Each call goes through the stand-in's ``fused_moe`` -> ``fused_moe_`` -> ``_fused_moe_impl``
(the function the guard wraps); ``moe_sorting``, which ``_fused_moe_impl`` calls next, is
replaced by a spy that keeps exactly what aiter's sort was handed, so any routing (any
weight dtype, any id) can be checked without running a sort.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import torch

from sglang_amd_moe.runtime.aiter import guard
from sglang_amd_moe.runtime.target import MARK

M, K, E, DIM = 16, 4, 8, 256
I32, I64 = torch.iinfo(torch.int32), torch.iinfo(torch.int64)


class Spy:
    """Stands in for aiter.fused_moe.moe_sorting: keeps its arguments, returns a dummy sort."""

    def __init__(self, raises: Exception | None = None) -> None:
        self.calls: list[dict] = []
        self.raises = raises

    def __call__(self, topk_ids, topk_weights, num_experts, model_dim, dtype, block_size,
                 expert_mask=None, num_local_tokens=None, *rest, **kw):  # fmt: skip
        self.calls.append({"ids": topk_ids, "weights": topk_weights, "E": num_experts,
                           "mask": expert_mask, "count": num_local_tokens})  # fmt: skip
        if self.raises is not None:
            raise self.raises
        return (None,) * 4 + (torch.zeros(topk_ids.shape[0], model_dim),)


@pytest.fixture(autouse=True)
def fresh_counters():
    """Counters and their lines start from nothing in each test."""
    from sglang_amd_moe.runtime import stats

    stats.reset()
    yield
    stats.reset()


@pytest.fixture
def guarded(load_aiter, monkeypatch):
    """The count-dropped stand-in with the guard (only) live; returns (module, spy)."""
    fm = load_aiter("count-dropped", hook_first=None)
    st = guard.install()
    assert (st.state, st.form, st.target) == ("live", "_fused_moe_impl", "guard")
    assert st.detail["patched"] == ["aiter.fused_moe._fused_moe_impl"]
    spy = Spy()
    monkeypatch.setattr(fm, "moe_sorting", spy)
    return fm, spy


def call(fm, ids, weights, *, experts=E, mask=None, count=None):
    hidden = torch.zeros(ids.shape[0] if ids.dim() else 1, DIM, dtype=torch.bfloat16)
    w1 = torch.empty(1, 1, 1).expand(experts, 2 * 128, DIM)
    w2 = torch.empty(1, 1, 1).expand(experts, DIM, 128)
    return fm.fused_moe(hidden, w1, w2, weights, ids, expert_mask=mask, num_local_tokens=count)


def bits(w: torch.Tensor) -> torch.Tensor:
    return w.view({4: torch.int32, 2: torch.int16}[w.element_size()])


def garbage_routing(id_dtype: torch.dtype, w_dtype: torch.dtype, experts: int = E):
    """Real-looking rows with NaN/Inf weights, and ids no MoE can take."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, experts, (M, K), generator=g).to(id_dtype)
    bad = [-1, experts, experts + 3, I32.max, I32.min]
    if id_dtype == torch.int64:
        bad += [I64.max, I64.min, 2**32, -(2**32) + 1]
    for i, v in enumerate(bad):
        ids[i % M, i % K] = v
    ids[M - 4 :] = -1  # vLLM's padded rows
    weights = torch.rand((M, K), generator=g).to(w_dtype)
    weights[0, 1], weights[1, 2], weights[2, 3] = float("nan"), float("inf"), -float("inf")
    return ids, weights


def assert_guarded(got_ids, got_w, ids, weights, experts, n=None):
    valid = (ids >= 0) & (ids < experts)
    if n is not None:
        valid[n:] = False
    assert got_ids is not ids and got_w is not weights  # new tensors
    assert got_ids.dtype == ids.dtype and got_w.dtype == weights.dtype
    assert torch.equal(got_ids[valid], ids[valid])  # ids in range: never changed
    assert torch.equal(bits(got_w)[valid], bits(weights)[valid])  # real weights: same bits
    assert bool((got_ids[~valid] == 0).all()) and bool((got_w[~valid] == 0).all())
    assert bool(((got_ids >= 0) & (got_ids < experts)).all())


@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n", [None, 0, 5, M])
def test_every_id_reaches_aiter_in_range(guarded, id_dtype, w_dtype, n) -> None:
    fm, spy = guarded
    ids, weights = garbage_routing(id_dtype, w_dtype)
    before = (ids.clone(), bits(weights).clone())
    count = None if n is None else torch.tensor([n], dtype=torch.int32)
    call(fm, ids, weights, count=count)
    (got,) = spy.calls
    assert got["E"] == E and got["count"] is count  # the count itself is passed on
    assert_guarded(got["ids"], got["weights"], ids, weights, E, n)
    assert torch.equal(ids, before[0]) and torch.equal(bits(weights), before[1])  # untouched


def test_an_expert_mask_sets_e_and_the_sink_slot_passes(guarded) -> None:
    """SGLang 0.5.23's DeepEP path: -1 rewritten to the sink slot num_local_experts, with
    an expert mask of num_local_experts + 1 entries whose last one is 0."""
    fm, spy = guarded
    ids, weights = garbage_routing(torch.int32, torch.float32)
    ids[3, :] = E  # the sink slot: in range for E + 1 mask entries
    mask = torch.ones(E + 1, dtype=torch.int32)
    mask[E] = 0
    call(fm, ids, weights, mask=mask, count=torch.tensor([M - 2]))
    (got,) = spy.calls
    assert got["E"] == E + 1 and got["mask"] is mask
    assert bool((got["ids"][3] == E).all()) and torch.equal(got["weights"][3], weights[3])
    assert_guarded(got["ids"], got["weights"], ids, weights, E + 1, M - 2)


def test_off_by_its_own_switch(load_aiter, monkeypatch, caplog) -> None:
    monkeypatch.setenv("SGLANG_AMD_MOE_GUARD", "0")
    caplog.set_level(logging.INFO, logger="sglang_amd_moe")
    fm = load_aiter("count-dropped", hook_first=None)
    st = guard.install()
    assert st.state == "off" and "SGLANG_AMD_MOE_GUARD=0" in st.message
    assert st.message in caplog.text and not guard.is_live()
    assert not hasattr(fm._fused_moe_impl, MARK)
    # The sort hook is not affected by the switch.
    from sglang_amd_moe.runtime.aiter import hook as aiter_hook

    assert aiter_hook.install().state == "live"


@pytest.mark.parametrize(
    ("params", "why"),
    [
        ("x, w1, w2, topk_weight, topk_ids, expert_mask=None, num_local_tokens=None", "first"),
        ("hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None", "no num_local"),
        ("hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None, "
         "num_local_tokens=None, shared_w1=None", "shared expert"),
        ("*args, **kwargs", "first"),
    ],
)  # fmt: skip
def test_an_entry_it_does_not_recognise_is_refused(load_aiter, caplog, params, why) -> None:
    fm = load_aiter("count-dropped", hook_first=None)
    scope: dict = {}
    exec(f"def _fused_moe_impl({params}):\n    return None\n", scope)
    fm._fused_moe_impl = odd = scope["_fused_moe_impl"]
    with caplog.at_level(logging.WARNING, logger="sglang_amd_moe"):
        st = guard.install()
    assert (
        st.state == "refused"
        and why in st.message
        and "aiter.fused_moe._fused_moe_impl" in st.message
    )
    assert st.message in caplog.text and fm._fused_moe_impl is odd and not guard.is_live()


def test_the_guard_does_not_depend_on_the_sort_form(load_aiter, tmp_path, monkeypatch) -> None:
    """A sort path the sort hook does not recognise (refused) is still guarded."""
    from aiter_testlib import edited_standin

    from sglang_amd_moe.runtime.aiter import hook as aiter_hook

    load_aiter  # noqa: B018  (cleanup only)
    old = "def _adaptive_moe_sort("
    monkeypatch.syspath_prepend(str(edited_standin(tmp_path, old, "def _adaptive_sort_v2(")))
    monkeypatch.setenv("SGLANG_AMD_MOE_TEST_AITER_STANDIN_SHAPE", "count-dropped")
    assert (aiter_hook.install().state, guard.install().state) == ("pending", "pending")
    import aiter.fused_moe as fm

    assert str(tmp_path) in fm.__file__
    assert (aiter_hook.status().state, aiter_hook.status().form) == ("refused", "unknown")
    assert guard.status().state == "live" and guard.is_live()


def test_without_fused_moe_impl_fused_moe_is_guarded(load_aiter, monkeypatch) -> None:
    fm = load_aiter("count-dropped", hook_first=None)
    monkeypatch.delattr(fm, "_fused_moe_impl")
    original = fm.fused_moe
    st = guard.install()
    assert (st.state, st.form) == ("live", "fused_moe") and getattr(fm.fused_moe, MARK) is original
    guard.uninstall()
    assert fm.fused_moe is original


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        ({"ids": lambda i: i.float()}, "topk_ids is float32 (16, 4) on cpu, not int32"),
        ({"ids": lambda i: i.reshape(-1)}, "not [rows, topk]"),
        ({"weights": lambda w: w[:, :2]}, "topk_weight is float32 (16, 2) on cpu"),
        ({"mask": lambda _: torch.ones(E + 1, device="meta")}, "expert_mask is float32 (9,) on"),
    ],
)  # fmt: skip
def test_bad_input_goes_to_aiter_untouched_and_is_logged_once(
    guarded, caplog, change, kind
) -> None:
    fm, spy = guarded
    spy.raises = RuntimeError("aiter's own error")
    ids, weights = garbage_routing(torch.int32, torch.float32)
    ids = change.get("ids", lambda i: i)(ids)
    weights = change.get("weights", lambda w: w)(weights)
    mask = change.get("mask", lambda _: None)(None)
    with caplog.at_level(logging.WARNING, logger="sglang_amd_moe"):
        for _ in range(2):
            with pytest.raises((RuntimeError, ValueError)):  # aiter's own error, not ours
                call(fm, ids, weights, mask=mask)
    # Untouched: aiter raised before its sort (1-D ids), or its sort got the caller's tensors.
    assert all(c["ids"] is ids and c["weights"] is weights for c in spy.calls)
    lines = [r for r in caplog.records if r.name == "sglang_amd_moe"]
    assert len(lines) == 1 and kind in lines[0].getMessage(), [r.getMessage() for r in lines]
    assert "goes to aiter untouched" in lines[0].getMessage()


@pytest.mark.parametrize("count_dtype", [torch.int32, torch.int16])
def test_a_failing_kernel_hands_aiter_the_plain_torch_guard(
    load_aiter, monkeypatch, caplog, count_dtype
) -> None:
    """A kernel failure (here: raised on purpose; int16 counts: the kernel's own refusal)
    must not let garbage through: the plain-torch guard on the call's device takes over."""
    import sglang_amd_moe.kernels as kernels

    if count_dtype == torch.int32:

        def broken(*args, **kwargs):
            raise RuntimeError("HIP out of memory")

        monkeypatch.setattr(kernels, "guard_routing", broken)
    fm = load_aiter("count-dropped", hook_first=None)
    assert guard.install().state == "live"
    spy = Spy()
    monkeypatch.setattr(fm, "moe_sorting", spy)
    ids, weights = garbage_routing(torch.int64, torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="sglang_amd_moe"):
        for n in (5, 9):
            call(fm, ids, weights, count=torch.tensor([n], dtype=count_dtype))
    for c, n in zip(spy.calls, (5, 9), strict=True):
        assert_guarded(c["ids"], c["weights"], ids, weights, E, n)
    lines = [r.getMessage() for r in caplog.records if r.name == "sglang_amd_moe"]
    assert len(lines) == 1 and "the plain-torch guard ran" in lines[0], lines
    assert ("RuntimeError" if count_dtype == torch.int32 else "TypeError") in lines[0]


@pytest.mark.parametrize("id_dtype", [torch.int16, torch.int8])
def test_narrow_integer_ids_take_the_plain_torch_guard(guarded, id_dtype) -> None:
    """Ids of an integer dtype the kernel does not take never reach aiter out of range:
    the plain-torch guard hands aiter's sort the same guarded routing, and counts it."""
    from sglang_amd_moe.runtime import stats

    fm, spy = guarded
    ids, weights = garbage_routing(torch.int32, torch.float32)
    ids = ids.clamp(-100, 100).to(id_dtype)  # -1, E, E + 3 and +-100 out of range
    call(fm, ids, weights, count=torch.tensor([9], dtype=torch.int32))
    (got,) = spy.calls
    assert got["ids"].dtype == id_dtype
    assert_guarded(got["ids"], got["weights"], ids, weights, E, 9)
    n_bad = int(((ids[:9] < 0) | (ids[:9] >= E)).sum())
    in_range = (ids >= 0) & (ids < E)
    n_past = int((((ids[9:] != 0) & in_range[9:]) | ~in_range[9:] | (weights[9:] != 0)).sum())
    assert stats.counts()["guard"] == {
        "calls": 1, "out_of_range": n_bad, "past_count": n_past, "real_out_of_range": n_bad
    }  # fmt: skip


@pytest.mark.parametrize(
    "count",
    [torch.tensor([], dtype=torch.int32), torch.tensor([5.0]), torch.tensor([True]), 5],
    ids=["empty", "float", "bool", "int"],
)
def test_an_unusable_count_still_guards_ids_out_of_range(guarded, caplog, count) -> None:
    """A count the guard cannot read is left out (logged once); the ids out of range still
    reach aiter as expert 0, weight 0, and aiter gets the count as passed."""
    fm, spy = guarded
    ids, weights = garbage_routing(torch.int32, torch.float32)
    with caplog.at_level(logging.WARNING, logger="sglang_amd_moe"):
        for _ in range(2):
            call(fm, ids, weights, count=count)
    for got in spy.calls:
        assert got["count"] is count
        assert_guarded(got["ids"], got["weights"], ids, weights, E, None)
    lines = [r.getMessage() for r in caplog.records if r.name == "sglang_amd_moe"]
    assert len(lines) == 1 and "not a count" in lines[0] and "still guarded" in lines[0], lines


def test_the_guard_counts_what_it_changes(guarded) -> None:
    """The counters (on the routing's device, added to inside the launch) say how many
    calls ran and how many entries changed, by reason; they match the torch reference."""
    from sglang_amd_moe.kernels.reference import guard_stats_reference

    from sglang_amd_moe.runtime import stats

    fm, _ = guarded
    ids, weights = garbage_routing(torch.int64, torch.bfloat16)
    count = torch.tensor([11], dtype=torch.int32)
    expected = guard_stats_reference(ids, weights, E, None) + 2 * guard_stats_reference(
        ids, weights, E, count
    )
    call(fm, ids, weights)
    for _ in range(2):
        call(fm, ids, weights, count=count)
    got = stats.counts()["guard"]
    assert [got[k] for k in stats.SLOTS] == expected.tolist()
    assert got["calls"] == 3 and got["out_of_range"] > 0 and got["past_count"] > 0
    assert stats.line("guard", got).startswith("sglang-amd-moe stats: target=guard calls=3 ")


def test_counters_off_by_their_switch(guarded, monkeypatch) -> None:
    from sglang_amd_moe.runtime import stats

    monkeypatch.setenv("SGLANG_AMD_MOE_STATS", "0")
    stats.reset()
    fm, spy = guarded
    ids, weights = garbage_routing(torch.int32, torch.float32)
    call(fm, ids, weights)
    assert_guarded(spy.calls[0]["ids"], spy.calls[0]["weights"], ids, weights, E)
    assert stats.counts() == {} and stats.buffer("guard", ids.device) is None
    monkeypatch.delenv("SGLANG_AMD_MOE_STATS")
    stats.reset()


def test_torch_compile_sees_the_guard(guarded) -> None:
    """Dynamo traces the stand-in's Python (it registers no custom op) and the guard's
    wrapper: the compiled call hands aiter's sort the guarded routing too."""
    fm, spy = guarded
    ids, weights = garbage_routing(torch.int32, torch.float32)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(lambda i, w: call(fm, i, w), backend="aot_eager")
        compiled(ids, weights)
    finally:
        torch._dynamo.reset()
    assert_guarded(spy.calls[-1]["ids"], spy.calls[-1]["weights"], ids, weights, E)


def test_the_guard_and_the_sort_hook_together(load_aiter) -> None:
    """The guard before the sort hook: the sort of the leading rows sees no garbage, and
    the count the sort hook reads from _fused_moe_impl's frame is still found."""
    from aiter_testlib import as_dict, assert_sort_of_leading_rows

    fm = load_aiter("count-dropped")
    assert guard.install().state == "live"
    fm.standin_metadata = fm.standin_inline_sort_metadata(block_m=16, atomic=True)
    ids, weights = garbage_routing(torch.int32, torch.float32)
    weights = torch.nan_to_num(weights)  # the sort's outputs are compared with torch.equal
    call(fm, ids, weights, count=torch.tensor([10], dtype=torch.int32))
    clean = torch.where((ids >= 0) & (ids < E), ids, 0)
    clean_w = torch.where((ids >= 0) & (ids < E), weights, 0)
    assert_sort_of_leading_rows(as_dict(fm.standin_sorts[-1]), clean, clean_w, 10, E, 16, DIM)
    assert sys.modules["aiter.ops.moe_mxfp4_aux"].standin_calls == []


# --- the audit says whether the guard is live ------------------------------------------

AUDIT = """
import json, sys
if sys.argv[1] == "imported":
    import aiter.fused_moe  # as a server process does once its first MoE layer is built
from sglang_amd_moe.diagnostics import audit
for args in sys.argv[2:]:
    audit.main(args.split())
"""


def _audit(tmp_path, *runs: str, imported: bool = False, **env_vars: str) -> list:
    """``audit`` runs in one child with the stand-in laid out as real aiter lays it out
    (``aiter/fused_moe.py`` beside ``aiter/__init__.py``); their outputs, JSON parsed."""
    from aiter_testlib import STANDIN, subprocess_env

    pkg = tmp_path / "site" / "aiter"
    if not pkg.exists():
        pkg.mkdir(parents=True)
        for entry in (STANDIN / "aiter").iterdir():
            (pkg / entry.name).symlink_to(entry)
        (pkg / "fused_moe.py").symlink_to(STANDIN / "aiter/_shapes/count_dropped/fused_moe.py")
    env = {**subprocess_env("count-dropped"), "PYTHONPATH": str(pkg.parent), **env_vars}
    env["SGLANG_PLUGINS"] = "sglang_amd_moe"
    sep = "\n=====\n"
    code = AUDIT.replace("audit.main(args.split())", f"audit.main(args.split()); print({sep!r})")
    proc = subprocess.run(
        [sys.executable, "-c", code, "imported" if imported else "-", *runs],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    outs = proc.stdout.split(sep)[: len(runs)]
    assert len(outs) == len(runs), proc.stdout[-2000:] + proc.stderr[-3000:]
    return [json.loads(o) if "--json" in r else o for r, o in zip(runs, outs, strict=True)]


def _aiter_target(doc: dict) -> dict:
    return next(t for t in doc["targets"] if t["target"] == "aiter")


def test_the_plain_audit_says_what_the_guard_will_do(tmp_path) -> None:
    doc, text = _audit(tmp_path, "--json", "")
    g = _aiter_target(doc)["guard"]
    assert g["state"] == "on load" and g["live"] is False
    assert "aiter.fused_moe._fused_moe_impl" in g["why"]
    assert "guard at its MoE entry: on load (aiter.fused_moe._fused_moe_impl:" in text
    (off,) = _audit(tmp_path, "--json", SGLANG_AMD_MOE_GUARD="0")
    assert _aiter_target(off)["guard"]["state"] == "off"


@pytest.mark.sglang  # --load runs the real load_plugins() of SGLang 0.5.23
@pytest.mark.parametrize("imported", [False, True])
def test_the_loaded_audit_says_whether_the_guard_is_live(tmp_path, imported) -> None:
    doc, text = _audit(tmp_path, "--load --json", "--load", imported=imported)
    g = _aiter_target(doc)["guard"]
    if imported:  # aiter.fused_moe was there when the plugin loaded: guarded at once
        assert (g["state"], g["live"]) == ("live", True) and "guard live at" in g["why"]
        assert "guard at its MoE entry: live here (sglang-amd-moe: guard live at" in text
    else:  # the guard waits for aiter.fused_moe to be imported
        assert (g["state"], g["live"]) == ("pending", False) and "guard pending" in g["why"]
        assert "guard at its MoE entry: pending (sglang-amd-moe: guard pending" in text

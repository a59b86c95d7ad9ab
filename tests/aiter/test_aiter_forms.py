"""``runtime/aiter/forms.py``: the stand-in's two trees, and edits of them into the other forms.

The edits are small text replacements of the stand-in's ``aiter/fused_moe.py``; each
asserts that its target text is there, so a stand-in change cannot silently turn a test
into a no-op.
"""

from __future__ import annotations

import pytest
from aiter_testlib import STANDIN

from sglang_amd_moe.runtime.aiter import forms as aiter_forms
from sglang_amd_moe.runtime.aiter.forms import analyze_source

SHAPES = STANDIN / "aiter" / "_shapes"
DROPPED = (SHAPES / "count_dropped" / "fused_moe.py").read_text()
REJECTED = (SHAPES / "count_rejected" / "fused_moe.py").read_text()

# aiter before the MXFP4 aux sort (e.g. the 2025 tree: one CK sort, no output_aux).
OLD_AITER = """
import aiter
BLOCK_SIZE_M = 32

def moe_sorting(topk_ids, topk_weights, num_experts, model_dim, moebuf_dtype,
                block_size=BLOCK_SIZE_M, expert_mask=None, num_local_tokens=None):
    aiter.moe_sorting_fwd(topk_ids, topk_weights, num_experts, block_size,
                          expert_mask, num_local_tokens)
"""

IMPL_CALL_END = "            moebuf_dtype=moebuf_dtype,\n        )\n\n    # CK / Opus"
AUX_CALL_END = "        prologue=0 if BM == 16 else 1,\n    )"
FUSED_AUX_CALL = (
    "            block_size_M,\n            accumulate=_atomic,\n            output_aux=True,"
)


def edit(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"stand-in text not found once: {old!r}"
    return source.replace(old, new)


def honored(source: str) -> str:
    """aiter PR 7083's threading: impl -> adaptive -> mxfp4_moe_sort pass the count."""
    s = edit(
        source,
        "    moebuf_dtype=dtypes.bf16,\n):",
        "    moebuf_dtype=dtypes.bf16,\n    num_local_tokens=None,\n):",
    )
    s = edit(
        s,
        IMPL_CALL_END,
        IMPL_CALL_END.replace(
            "moebuf_dtype,\n", "moebuf_dtype,\n            num_local_tokens=num_local_tokens,\n", 1
        ),
    )
    return edit(
        s,
        AUX_CALL_END,
        AUX_CALL_END.replace("1,\n", "1,\n        num_local_tokens=num_local_tokens,\n"),
    )


def test_standin_count_dropped_tree() -> None:
    r = analyze_source(DROPPED)
    assert r.form == "count-dropped"
    assert r.backend_var == "_MOE_SORT_BACKEND"
    assert r.branch_test == "output_aux and _MOE_SORT_BACKEND not in ('opus', 'ck')"
    assert not r.impl_passes_count and not r.adaptive_passes_count
    # aiter main's _fused_moe_impl (the body of the custom op fused_moe_) drops the
    # count before the sort is even reached.
    assert r.count_dropping_callers == ("_fused_moe_impl",)
    assert set(aiter_forms.IMPL_PARAMS_READ) <= set(r.impl_params)
    assert len(r.source_sha256) == 64


def test_standin_count_rejected_tree() -> None:
    r = analyze_source(REJECTED)
    assert r.form == "count-rejected"
    assert "rejects calls that carry num_local_tokens" in r.reason
    assert (
        "3 * M * topk < 4 * num_experts" in r.branch_test
    )  # aiter PR 7083's base: the Opus crossover
    assert r.count_dropping_callers == ()  # this tree's inline-sort path passes the count


def test_count_honored_when_the_count_is_threaded_all_the_way() -> None:
    threaded = "block_size_M,\n            num_local_tokens=num_local_tokens,\n"
    both = edit(
        honored(DROPPED), FUSED_AUX_CALL, FUSED_AUX_CALL.replace("block_size_M,\n", threaded)
    )
    assert analyze_source(both).form == "count-honored"
    # The sort honours it but _fused_moe_impl still drops it: still count-dropped.
    r = analyze_source(honored(DROPPED))
    assert (r.form, r.count_dropping_callers) == ("count-dropped", ("_fused_moe_impl",))
    assert "_fused_moe_impl" in r.reason


def test_patched_route_through_our_adaptive_sort_counts_as_honoring() -> None:
    # patches/aiter-count-dropped.diff sends counted calls to our adaptive_moe_sort.
    routed = (
        "    moebuf_dtype=dtypes.bf16,\n    num_local_tokens=None,\n):\n"
        "    if num_local_tokens is not None:\n"
        "        from sglang_amd_moe.kernels import adaptive_moe_sort\n\n"
        "        return adaptive_moe_sort(topk_ids, topk_weights, num_experts, topk,\n"
        "                                 block_size, model_dim,\n"
        "                                 num_local_tokens=num_local_tokens)"
    )
    s = edit(DROPPED, "    moebuf_dtype=dtypes.bf16,\n):", routed)
    s = edit(
        s,
        IMPL_CALL_END,
        IMPL_CALL_END.replace(
            "moebuf_dtype,\n", "moebuf_dtype,\n            num_local_tokens=num_local_tokens,\n", 1
        ),
    )
    s = edit(
        s,
        FUSED_AUX_CALL,
        FUSED_AUX_CALL.replace(
            "block_size_M,\n", "block_size_M,\n            None,\n            num_local_tokens,\n"
        ),
    )
    assert analyze_source(s).form == "count-honored"


def test_rejected_tree_after_pr_7083_is_honored() -> None:
    s = edit(
        honored(REJECTED),
        '    if num_local_tokens is not None:\n        return "num_local_tokens"\n',
        "",
    )
    assert analyze_source(s).form == "count-honored"
    # Rejection gone but the sort still drops the count: count-dropped.
    s = edit(
        REJECTED, '    if num_local_tokens is not None:\n        return "num_local_tokens"\n', ""
    )
    assert analyze_source(s).form == "count-dropped"


def test_absent_without_an_aux_sort() -> None:
    assert analyze_source(OLD_AITER).form == "absent"
    assert analyze_source("").form == "absent"


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        (
            '    if output_aux and _MOE_SORT_BACKEND not in ("opus", "ck"):\n',
            '    if output_aux and _MOE_SORT_BACKEND not in ("opus", "ck") and _pick(M):\n',
            "branch",
        ),
        (
            "        # Upstream: the adaptive (fused) aux sort; "
            "num_local_tokens is not passed on.\n",
            "        topk_ids = topk_ids.contiguous()\n",
            "branch",
        ),
        (
            "    emit_aux=False,\n    moebuf_dtype",
            "    emit_aux=False,\n    workspace=None,\n    moebuf_dtype",
            "keyword-only",
        ),
        (
            "            atomic=accumulate,\n            emit_aux=True,\n",
            "            atomic=True,\n            emit_aux=True,\n",
            "keywords",
        ),
        (
            "    accumulate=True,\n    output_aux=False,\n):\n    device",
            "    accumulate=True,\n    aux=False,\n):\n    device",
            "parameters",
        ),
    ],
)
def test_unknown_when_the_branch_is_not_exactly_understood(old: str, new: str, why: str) -> None:
    r = analyze_source(edit(DROPPED, old, new))
    assert r.form == "unknown"
    assert why in r.reason


def test_unknown_for_unparsable_or_partial_sources() -> None:
    assert analyze_source("def (").form == "unknown"
    no_impl = edit(DROPPED, "def _moe_sorting_impl(", "def _moe_sorting_impl_v2(")
    assert analyze_source(no_impl).form == "unknown"
    # The count threaded into _adaptive_moe_sort but not on to the kernel.
    s = edit(
        DROPPED,
        "    moebuf_dtype=dtypes.bf16,\n):",
        "    moebuf_dtype=dtypes.bf16,\n    num_local_tokens=None,\n):",
    )
    s = edit(
        s,
        IMPL_CALL_END,
        IMPL_CALL_END.replace(
            "moebuf_dtype,\n", "moebuf_dtype,\n            num_local_tokens=num_local_tokens,\n", 1
        ),
    )
    assert analyze_source(s).form == "unknown"


def test_rejection_read_through_an_attribute_is_unknown() -> None:
    # A call-record style check (call.num_local_tokens) cannot be re-asked without the count.
    s = edit(
        REJECTED,
        "    if num_local_tokens is not None:",
        "    if metadata.num_local_tokens is not None:",
    )
    s = edit(
        s,
        "    expert_mask=None,\n    num_local_tokens=None,\n    hidden_pad=0,",
        "    expert_mask=None,\n    hidden_pad=0,",
    )
    r = analyze_source(s)
    assert r.form == "unknown" and "not as a parameter" in r.reason


# --- the hook evaluates upstream's branch only where it means what it means upstream ----

BRANCH = '    if output_aux and _MOE_SORT_BACKEND not in ("opus", "ck"):\n'
UNPACK = "    device = topk_ids.device\n    M, topk = topk_ids.shape\n"


@pytest.mark.parametrize(
    ("source", "old", "new", "why"),
    [
        # nested under another condition: upstream takes it only when that one holds too
        (DROPPED, BRANCH, "    if dispatch_policy == 0:\n  " + BRANCH, "no `if output_aux"),
        # a parameter the test reads, rebound before it
        (DROPPED, UNPACK, UNPACK + "    output_aux = output_aux and M > 4\n", "reads output_aux"),
        # M rebound after the unpack (the crossover would read another M)
        (REJECTED, UNPACK, UNPACK + "    M = M * topk\n", "reads M"),
        # a function-local backend: the module's variable is not what upstream reads
        (DROPPED, UNPACK, UNPACK + '    _MOE_SORT_BACKEND = os.environ.get("B", "ck")\n',
         "reads _MOE_SORT_BACKEND"),
        # an early return before it: some calls never reach the branch upstream
        (DROPPED, UNPACK, UNPACK + "    if expert_mask is not None:\n        return None\n",
         "can return or raise"),
    ],
)  # fmt: skip
def test_a_branch_read_out_of_context_is_unknown(source, old, new, why) -> None:
    s = edit(source, old, new)
    r = analyze_source(s)
    assert r.form == "unknown" and why in r.reason, r.reason


def test_a_caller_that_rebinds_the_count_is_not_read() -> None:
    s = edit(
        DROPPED,
        "    M, topk = topk_ids.shape\n    E, model_dim",
        "    M, topk = topk_ids.shape\n    if num_local_tokens is not None:\n"
        "        num_local_tokens = num_local_tokens * topk\n    E, model_dim",
    )
    r = analyze_source(s)
    assert r.form == "count-dropped" and r.count_dropping_callers == ("_fused_moe_impl",)
    assert r.rebinding_callers == ("_fused_moe_impl",)
    assert analyze_source(DROPPED).rebinding_callers == ()

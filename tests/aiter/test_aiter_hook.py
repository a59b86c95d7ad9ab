"""The aiter hook against the stand-in, in this process (CPU; Triton via the interpreter).

Shapes: ``count-dropped`` with E=33 experts, topk 5 (BM16 and BM32); ``count-rejected``
with aiter PR 7083's Qwen3.8-Flash-Next shape E=513, topk 11, 2560/640, which its stand-in
lists as supported and whose adaptive branch (``3 * M * topk < 4 * E``) holds up to
M=62.
"""

from __future__ import annotations

import functools
import logging
import sys
import types

import pytest
import torch
from aiter_testlib import (
    as_dict,
    assert_sort_of_leading_rows,
    aux_sort,
    edited_standin,
    padded_routing,
    reference_sort,
)

from sglang_amd_moe.runtime.aiter import hook as aiter_hook
from sglang_amd_moe.runtime.target import MARK, logged

M, K, E, DIM = 48, 5, 33, 256
# aiter PR 7083's shape for the count-rejected tree
RM, RK, RE, RDIM, RINTER = 48, 11, 513, 2560, 640


def count(n: int) -> torch.Tensor:
    return torch.tensor([n], dtype=torch.int32)


def aux_calls() -> list[dict]:
    return sys.modules["aiter.ops.moe_mxfp4_aux"].standin_calls


def ck_opus_calls() -> list[tuple[str, bool]]:
    return sys.modules["aiter.ops.moe_sorting"].standin_calls


def fused(fm, ids, w, n=None) -> None:
    """aiter's fused_moe on the count-dropped test shape (E experts, model_dim DIM)."""
    hidden = torch.zeros(ids.shape[0], DIM, dtype=torch.bfloat16)
    w1 = torch.empty(1, 1, 1).expand(E, 2 * 128, DIM)
    w2 = torch.empty(1, 1, 1).expand(E, DIM, 128)
    fm.fused_moe(hidden, w1, w2, w, ids, num_local_tokens=None if n is None else count(n))


def sort_impl(fm, ids, w, *, n=None, BM=16, aux=True, accumulate=True, E=E, dim=DIM):
    return fm._moe_sorting_impl(
        ids, w, E, dim, torch.bfloat16, BM, None, None if n is None else count(n), 0, True,
        accumulate=accumulate, output_aux=aux,
    )  # fmt: skip


# --- count-dropped ---------------------------------------------------------------------


def test_without_the_plugin_a_counted_call_sorts_the_padded_rows(load_aiter) -> None:
    fm = load_aiter("count-dropped", hook_first=None)
    ids, w = padded_routing(M, K, E)
    n = 30
    got = as_dict(sort_impl(fm, ids, w, n=n))
    # aiter's kernel ran over all M rows: its -1 ids reached it (the HIP kernel counts
    # them into count[-1]) and num_valid_ids[1] is M, not the count.
    assert [c["M_logical"] for c in aux_calls()] == [M]
    assert {t for t, _, e in aux_calls()[0]["out_of_range"] if e == -1} == set(range(M // 2, M, 2))
    assert int(got["num_valid_ids"][1]) == M
    # Padded rows' in-range ids were sorted as real pairs: tokens >= n in the sorted list.
    total = int(got["num_valid_ids"][0])
    st = got["sorted_token_ids"][:total]
    assert bool(((st & 0xFFFFFF) >= n)[st != M].any())
    # ... exactly as the reference sorts all M rows.
    ref = reference_sort(ids, w, E, 16, DIM, None)
    assert torch.equal(st, ref["sorted_token_ids"][:total])
    assert not aiter_hook.is_live()


@pytest.mark.parametrize("BM", [16, 32])
@pytest.mark.parametrize("hook_first", [True, False])
def test_with_the_plugin_the_sort_covers_only_the_leading_rows(load_aiter, BM, hook_first) -> None:
    fm = load_aiter("count-dropped", hook_first=hook_first)
    st = aiter_hook.status()
    assert (st.state, st.form) == ("live", "count-dropped") and aiter_hook.is_live()
    ids, w = padded_routing(M, K, E, seed=BM)
    got = as_dict(sort_impl(fm, ids, w, n=30, BM=BM))
    assert_sort_of_leading_rows(got, ids, w, 30, E, BM, DIM)
    assert aux_calls() == []  # aiter's count-blind kernel was not used


def test_replayed_counts_on_the_same_buffers(load_aiter) -> None:
    """The same routing tensors and the same count tensor, refilled: 1, 5, 47, 48 (and 0)."""
    fm = load_aiter("count-dropped")
    ids, w = padded_routing(M, K, E, seed=3)
    n_dev = count(M)
    for n in (1, 5, 47, 48, 0):
        n_dev.fill_(n)
        got = fm._moe_sorting_impl(
            ids,
            w,
            E,
            DIM,
            torch.bfloat16,
            16,
            None,
            n_dev,
            0,
            True,
            accumulate=True,
            output_aux=True,
        )
        assert_sort_of_leading_rows(as_dict(got), ids, w, n, E, 16, DIM)


def test_other_calls_go_to_aiter_unchanged(load_aiter, monkeypatch) -> None:
    fm = load_aiter("count-dropped")
    ids, w = padded_routing(M, K, E, seed=5)
    # output_aux without a count: aiter's own adaptive sort, over all rows.
    got = as_dict(sort_impl(fm, ids, w))
    assert [c["M_logical"] for c in aux_calls()] == [M] and int(got["num_valid_ids"][1]) == M
    # Not output_aux, with a count: aiter's Opus sort, count passed on.
    got = sort_impl(fm, ids, w, n=7, aux=False)
    assert ck_opus_calls() == [("opus", True)] and len(got) == 5
    assert int(got[3][1]) == 7
    # output_aux with a count, but AITER_MOE_SORT_BACKEND=opus: upstream's Opus aux path.
    monkeypatch.setattr(fm, "_MOE_SORT_BACKEND", "opus")
    got = sort_impl(fm, ids, w, n=7)
    assert ck_opus_calls()[-1] == ("opus", True) and len(got) == 7
    assert len(aux_calls()) == 1  # still only the first call reached aiter's aux kernel


def test_fused_moe_drops_the_count_and_the_hook_recovers_it(load_aiter) -> None:
    fm = load_aiter("count-dropped", hook_first=None)
    fm.standin_metadata = fm.standin_inline_sort_metadata(block_m=16, atomic=True)
    ids, w = padded_routing(M, K, E, seed=7)
    fused(fm, ids, w, 20)
    assert int(fm.standin_sorts[-1][3][1]) == M  # upstream: count dropped in _fused_moe_impl
    assert aiter_hook.install().state == "live"
    fused(fm, ids, w, 20)
    assert_sort_of_leading_rows(as_dict(fm.standin_sorts[-1]), ids, w, 20, E, 16, DIM)
    fused(fm, ids, w)  # no count: aiter's sort of all rows
    assert int(fm.standin_sorts[-1][3][1]) == M


def test_the_count_is_read_only_from_aiter_callers_of_the_same_tensor(load_aiter) -> None:
    fm = load_aiter("count-dropped")
    ids, w = padded_routing(M, K, E, seed=9)

    def _fused_moe_impl(topk_ids, num_local_tokens):  # same name as aiter's, other file
        return fm.moe_sorting(topk_ids, w, E, DIM, torch.bfloat16, 16, output_aux=True)

    assert int(_fused_moe_impl(ids, count(3))[3][1]) == M
    # aiter's _fused_moe_impl sorting a different tensor than its own topk_ids: not used.
    frame_code = compile(
        "def _fused_moe_impl(topk_ids, num_local_tokens):\n    return sort(other)\n",
        fm.__file__,
        "exec",
    )
    scope = {"sort": lambda t: fm.moe_sorting(t, w, E, DIM, torch.bfloat16, 16, output_aux=True),
             "other": ids.clone()}  # fmt: skip
    exec(frame_code, scope)
    assert int(scope["_fused_moe_impl"](ids, count(3))[3][1]) == M


def test_install_is_idempotent_and_rebinds_copies(load_aiter) -> None:
    fm = load_aiter("count-dropped", hook_first=None)
    original = fm._moe_sorting_impl
    copy_holder = types.ModuleType("copy_holder_for_test")
    copy_holder._moe_sorting_impl = original  # as `from aiter.fused_moe import _moe_sorting_impl`
    sys.modules[copy_holder.__name__] = copy_holder
    try:
        first = aiter_hook.install()
        for _ in range(2):
            assert aiter_hook.install() is first  # no new decision, no new line
        assert (first.state, first.form) == ("live", "count-dropped")
        wrapped = fm._moe_sorting_impl
        assert getattr(wrapped, MARK) is original
        assert copy_holder._moe_sorting_impl is wrapped
        assert sum(getattr(f, "_sglang_amd_moe_finder", False) for f in sys.meta_path) == 1
        assert first.detail["patched"] == [
            "aiter.fused_moe._moe_sorting_impl",
            "copy_holder_for_test._moe_sorting_impl",
        ]
        aiter_hook.uninstall()
        assert fm._moe_sorting_impl is original and copy_holder._moe_sorting_impl is original
        assert not aiter_hook.is_live() and aiter_hook.status() is None
    finally:
        del sys.modules[copy_holder.__name__]


def test_one_info_line_when_patched(load_aiter, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="sglang_amd_moe")
    load_aiter("count-dropped")
    lines = [r for r in caplog.records if r.name == "sglang_amd_moe"]
    # One line per state: pending (DEBUG: normal until aiter is imported), then live.
    assert [r.levelname for r in lines] == ["DEBUG", "INFO"]
    assert "pending" in lines[0].getMessage()
    assert "form=count-dropped" in lines[1].getMessage()
    assert lines[1].getMessage() == logged(aiter_hook.status().message)


# --- count-rejected --------------------------------------------------------------------


def rejected_call(fm, ids, w, n=None, **kw):
    hidden = torch.zeros(ids.shape[0], RDIM, dtype=torch.bfloat16)
    w1 = torch.empty(1, 1, 1).expand(RE, 2 * RINTER, RDIM)
    w2 = torch.empty(1, 1, 1).expand(RE, RDIM, RINTER)
    fm.fused_moe(hidden, w1, w2, w, ids, num_local_tokens=None if n is None else count(n), **kw)
    return fm.standin_sorts[-1]


def test_count_rejected_without_the_plugin(load_aiter, caplog) -> None:
    fm = load_aiter("count-rejected", hook_first=None)
    fm.standin_metadata = fm.standin_inline_sort_metadata(block_m=16, atomic=True)
    ids, w = padded_routing(RM, RK, RE, seed=11)
    with caplog.at_level(logging.WARNING, logger="aiter"):
        sort = rejected_call(fm, ids, w, n=20)
    # The tuned inline-sort row was discarded: default heuristics, CK/Opus sort.
    assert "inline-sort config unsupported (num_local_tokens)" in caplog.text
    assert len(sort) == 5 and ck_opus_calls() == [("opus", True)]
    # Without a count the tuned row is used: aiter's aux kernel over all rows.
    sort = rejected_call(fm, ids, w)
    assert len(sort) == 7 and [c["M_logical"] for c in aux_calls()] == [RM]


def test_count_rejected_with_the_plugin(load_aiter, caplog) -> None:
    fm = load_aiter("count-rejected")
    assert aiter_hook.status().state == "live" and aiter_hook.status().form == "count-rejected"
    fm.standin_metadata = fm.standin_inline_sort_metadata(block_m=16, atomic=True)
    ids, w = padded_routing(RM, RK, RE, seed=13)
    with caplog.at_level(logging.WARNING, logger="aiter"):
        sort = rejected_call(fm, ids, w, n=20)
    assert not [r for r in caplog.records if r.name == "aiter"]  # aiter's warning is gone
    assert len(sort) == 7  # the tuned inline-sort path
    assert_sort_of_leading_rows(as_dict(sort), ids, w, 20, RE, 16, RDIM)
    assert aux_calls() == [] and ck_opus_calls() == []
    # Past the crossover (3*M*topk >= 4*E from M=63) upstream's Opus aux sort runs, unchanged.
    big_ids, big_w = padded_routing(64, RK, RE, seed=14)
    sort = rejected_call(fm, big_ids, big_w, n=40)
    assert len(sort) == 7 and ck_opus_calls() == [("opus", True)]
    assert int(sort[3][1]) == 40


def test_other_rejections_still_reject(load_aiter) -> None:
    fm = load_aiter("count-rejected")
    md = fm.standin_inline_sort_metadata()
    ask = fm._mxfp4_inline_sort_unsupported
    shape = {"model_dim": RDIM, "inter_dim": RINTER, "expert": RE, "topk": RK}
    n = count(5)
    assert ask(md, **shape, num_local_tokens=n) is None
    assert ask(md, **shape) is None
    assert ask(md, **shape, num_local_tokens=n, expert_mask=torch.ones(RE)) == "expert_mask"
    assert ask(md, **shape, num_local_tokens=n, hidden_pad=128) == "hidden_pad/intermediate_pad"
    odd = {**shape, "expert": 512}
    assert "MXFP4_MOE_SUPPORTED_SHAPES" in ask(md, **odd, num_local_tokens=n)
    # The original still rejects the count alone.
    original = getattr(ask, MARK)
    assert original(md, **shape, num_local_tokens=n) == "num_local_tokens"


def test_mxfp4_moe_sort_takes_a_count_where_aiter_has_none(load_aiter) -> None:
    import inspect

    fm = load_aiter("count-rejected")
    aiter = sys.modules["aiter"]
    aux_module = sys.modules["aiter.ops.moe_mxfp4_aux"]
    assert aiter.mxfp4_moe_sort is aux_module.mxfp4_moe_sort
    assert "num_local_tokens" in inspect.signature(aiter.mxfp4_moe_sort).parameters
    assert (
        "num_local_tokens" not in inspect.signature(getattr(aiter.mxfp4_moe_sort, MARK)).parameters
    )
    ids, w = padded_routing(M, K, E, seed=17)
    for n in (None, 9):
        out = fm._adaptive_moe_sort(ids, w, E, K, 16, DIM, atomic=True, emit_aux=True)
        assert int(out[3][1]) == M  # _adaptive_moe_sort itself never passes a count
        buffers = aux_sort(aiter, ids, w, E, 16, DIM, n)
        assert_sort_of_leading_rows(buffers, ids, w, M if n is None else n, E, 16, DIM)
    # With None: aiter's own kernel (twice through _adaptive_moe_sort, once directly).
    assert [c["M_logical"] for c in aux_calls()] == [M, M, M]


# --- forms the hook leaves alone -------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "form"),
    [
        # an extra statement in the adaptive branch: not understood exactly
        ("        # Upstream: the adaptive (fused) aux sort; num_local_tokens is not passed on.\n",
         "        topk_ids = topk_ids.contiguous()\n", "unknown"),
        # no aux sort at all
        ("def _adaptive_moe_sort(", "def _adaptive_moe_sort_gone(", "unknown"),
    ],
)  # fmt: skip
def test_unknown_trees_are_left_alone_with_one_warning(
    load_aiter, tmp_path, monkeypatch, caplog, old, new, form
) -> None:
    load_aiter  # noqa: B018  (cleanup only)
    monkeypatch.syspath_prepend(str(edited_standin(tmp_path, old, new)))
    monkeypatch.setenv("SGLANG_AMD_MOE_TEST_AITER_STANDIN_SHAPE", "count-dropped")
    caplog.set_level(logging.DEBUG, logger="sglang_amd_moe")
    assert aiter_hook.install().state == "pending"
    import aiter.fused_moe as fm

    assert str(tmp_path) in fm.__file__
    st = aiter_hook.status()
    assert (st.state, st.form) == ("refused", form) and not aiter_hook.is_live()
    assert not hasattr(fm._moe_sorting_impl, MARK)
    mine = [r for r in caplog.records if r.name == "sglang_amd_moe"]
    assert [r.levelname for r in mine] == ["DEBUG", "WARNING"]
    assert "unknown" in mine[1].getMessage() and mine[1].getMessage() == logged(st.message)


def test_without_our_kernels_aiter_is_left_alone(load_aiter, monkeypatch, caplog) -> None:
    import sglang_amd_moe.kernels as kernels

    monkeypatch.delattr(kernels, "adaptive_moe_sort")
    caplog.set_level(logging.DEBUG, logger="sglang_amd_moe")
    fm = load_aiter("count-dropped")
    st = aiter_hook.status()
    assert (st.state, st.form) == ("error", "count-dropped") and not aiter_hook.is_live()
    assert not hasattr(fm._moe_sorting_impl, MARK)
    assert "lacks adaptive_moe_sort" in caplog.text and "lacks adaptive_moe_sort" in st.message


def test_a_bare_directory_named_aiter_is_not_aiter(tmp_path, monkeypatch) -> None:
    from aiter_testlib import forget_aiter

    aiter_hook.uninstall()
    forget_aiter()
    (tmp_path / "aiter").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SGLANG_AMD_MOE_FORCE", "1")
    st = aiter_hook.install()
    assert (st.state, st.form) == ("not-needed", None) and "not installed" in st.message
    assert not any(getattr(f, "_sglang_amd_moe_finder", False) for f in sys.meta_path)
    assert "aiter" not in sys.modules


# --- routing exactly as aiter would ------------------------------------------------------


def test_a_call_with_an_expert_mask_stays_with_aiter(load_aiter) -> None:
    """Our sort has no expert mask: a masked call goes where aiter sends it, count or not."""
    fm = load_aiter("count-dropped")
    ids, w = padded_routing(M, K, E, seed=19)
    mask = torch.ones(E, dtype=torch.int32)
    got = fm._moe_sorting_impl(
        ids, w, E, DIM, torch.bfloat16, 16, mask, count(20), 0, True,
        accumulate=True, output_aux=True,
    )  # fmt: skip
    assert [c["M_logical"] for c in aux_calls()] == [M]  # aiter's own adaptive sort
    assert int(got[3][1]) == M


def test_a_caller_that_rebinds_its_count_is_not_read(load_aiter, tmp_path, monkeypatch) -> None:
    """A count rebound before the sort (here a per-pair count) is not the row count."""
    load_aiter  # noqa: B018  (cleanup only)
    root = edited_standin(
        tmp_path,
        "    M, topk = topk_ids.shape\n    E, model_dim",
        "    M, topk = topk_ids.shape\n    if num_local_tokens is not None:\n"
        "        num_local_tokens = num_local_tokens * topk\n    E, model_dim",
    )
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("SGLANG_AMD_MOE_TEST_AITER_STANDIN_SHAPE", "count-dropped")
    import aiter.fused_moe as fm

    assert str(tmp_path) in fm.__file__ and aiter_hook.install().state == "live"
    fm.standin_metadata = fm.standin_inline_sort_metadata(block_m=16, atomic=True)
    ids, w = padded_routing(M, K, E, seed=21)
    fused(fm, ids, w, 5)
    # Not 25 rows (5 * topk): aiter's own sort, over every row.
    assert int(fm.standin_sorts[-1][3][1]) == M
    assert [c["M_logical"] for c in aux_calls()] == [M]


def test_a_frame_search_that_gives_up_says_so_once(load_aiter, caplog) -> None:
    fm = load_aiter("count-dropped")
    ids, w = padded_routing(M, K, E, seed=23)

    def deep(levels: int):
        if levels:
            return deep(levels - 1)
        return fm.moe_sorting(ids, w, E, DIM, torch.bfloat16, 16, output_aux=True)

    with caplog.at_level(logging.WARNING, logger="sglang_amd_moe"):
        for _ in range(2):
            assert int(deep(10)[3][1]) == M  # no count anywhere: aiter's own sort
    lines = [r.getMessage() for r in caplog.records if r.name == "sglang_amd_moe"]
    assert len(lines) == 1 and "no aiter caller within 8 frames" in lines[0], lines


# --- a failure of ours never hands aiter the padded rows ---------------------------------


def test_when_our_sort_fails_aiter_sorts_the_padded_rows_zeroed(load_aiter, monkeypatch, caplog):
    import sglang_amd_moe.kernels as kernels

    fm = load_aiter("count-dropped")

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel image for this architecture")

    monkeypatch.setattr(kernels, "adaptive_moe_sort", broken)
    ids, w = padded_routing(M, K, E, seed=25)
    with caplog.at_level(logging.WARNING, logger="sglang_amd_moe"):
        for _ in range(2):
            got = as_dict(sort_impl(fm, ids, w, n=30))
    # aiter's count-blind sort ran, on rows >= 30 (and every -1) turned into expert 0 with
    # weight 0: nothing out of range reached its kernel, and no weight of a padded row.
    assert [c["out_of_range"] for c in aux_calls()] == [[], []]
    total = int(got["num_valid_ids"][0])
    tokens = got["sorted_token_ids"][:total] & 0xFFFFFF
    late = (tokens >= 30) & (got["sorted_token_ids"][:total] != M)
    assert bool((got["sorted_weights"][:total][late] == 0).all())
    lines = [r.getMessage() for r in caplog.records if r.name == "sglang_amd_moe"]
    assert len(lines) == 1 and "RuntimeError" in lines[0] and "zeroed" in lines[0], lines


def test_when_our_aux_kernel_fails_aiter_gets_the_padded_rows_zeroed(load_aiter, monkeypatch):
    import sglang_amd_moe.kernels as kernels

    @functools.wraps(kernels.mxfp4_moe_sort)  # the hook binds calls to its signature
    def broken(*args, **kwargs):
        raise RuntimeError("compile error")

    monkeypatch.setattr(kernels, "mxfp4_moe_sort", broken)
    load_aiter("count-rejected", hook_first=None)
    assert aiter_hook.install().state == "live"
    aiter = sys.modules["aiter"]
    ids, w = padded_routing(M, K, E, seed=27)
    aux_sort(aiter, ids, w, E, 16, DIM, 9)
    assert [c["out_of_range"] for c in aux_calls()] == [[]]

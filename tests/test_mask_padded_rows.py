"""``mask_padded_rows_``: the Triton kernel against its plain-torch reference, bit for bit.

Without a GPU the kernel runs through Triton's interpreter (``tests/conftest.py`` sets
``TRITON_INTERPRET=1`` before Triton is imported); the reference fallback is disabled
in these tests, so a pass means the Triton kernel itself wrote the outputs. With a
GPU (and the variable unset) the same tests run the compiled kernel on it.
"""

from __future__ import annotations

import pytest
import sglang_amd_moe.kernels.mask_padded_rows as mask_mod
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import (
    ROWS_COUNTS,
    assert_runs_through_triton,
    bits,
    forbid_reference,
    kernel_device,
)
from sglang_amd_moe.kernels import mask_padded_rows_, mask_padded_rows_reference_
from sglang_amd_moe.kernels.reference import mask_stats_reference

DEV = kernel_device()
ID_DTYPES = [torch.int32, torch.int64]
W_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def _kernel_only(monkeypatch: pytest.MonkeyPatch) -> None:
    forbid_reference(monkeypatch, mask_mod, "mask_padded_rows_reference_")


def test_kernel_runs_through_triton() -> None:
    assert_runs_through_triton(DEV)


def _inputs(M: int, K: int, id_dtype: torch.dtype, w_dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 513, (M, K), generator=g, dtype=torch.int64).to(id_dtype)
    w = torch.rand(M, K, generator=g).to(w_dtype)
    return ids.to(DEV), w.to(DEV)


def _count(n: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.tensor([n], dtype=dtype, device=DEV)


def _check(ids: torch.Tensor, w: torch.Tensor, count, fill_value: int = 0) -> None:
    ref_ids, ref_w = ids.clone(), w.clone()
    mask_padded_rows_reference_(ref_ids, ref_w, count, fill_value)
    # The same call with counters, on copies: the same writes, and the counters of the
    # torch reference and of a count from first principles (the call, the padded entries
    # that change).
    ids2, w2 = ids.clone(), w.clone()
    if count is not None:
        want_stats = mask_stats_reference(ids, w, count, fill_value).tolist()
        n = min(max(int(count.item()), 0), ids.shape[0])
        pad_ids, pad_w = ids[n:].to(torch.int64), w[n:]
        changed = int(((pad_ids != fill_value) | (pad_w != 0)).sum())
        assert want_stats == [1, 0, changed, 0]
    mask_padded_rows_(ids, w, count, fill_value)
    assert torch.equal(ids, ref_ids)
    assert torch.equal(bits(w), bits(ref_w))
    stats = torch.zeros(8, dtype=torch.int64, device=DEV)
    mask_padded_rows_(ids2, w2, count, fill_value, stats)
    assert torch.equal(ids2, ref_ids)
    assert torch.equal(bits(w2), bits(ref_w))
    if count is not None:
        assert stats.tolist() == [*want_stats, 0, 0, 0, 0]
        mask_padded_rows_(ids2, w2, count, fill_value, stats)  # nothing left to change
        assert stats.tolist() == [2, 0, want_stats[2], 0, 0, 0, 0, 0]


@pytest.mark.parametrize("K", [11, 16])
@pytest.mark.parametrize(("M", "n"), ROWS_COUNTS)
def test_fixed_cases_with_garbage_padding(M: int, n: int, K: int) -> None:
    for id_dtype in ID_DTYPES:
        for w_dtype in W_DTYPES:
            ids, w = _inputs(M, K, id_dtype, w_dtype, seed=M * 100 + n)
            ids[n:] = -1
            w[n:] = float("nan")
            ref_ids, ref_w = ids.clone(), w.clone()
            mask_padded_rows_(ids, w, _count(n))
            assert torch.equal(ids[:n], ref_ids[:n])
            assert torch.equal(bits(w[:n]), bits(ref_w[:n]))
            assert bool((ids[n:] == 0).all())
            assert torch.equal(bits(w[n:]), bits(torch.zeros_like(w[n:])))
            ids2, w2 = _inputs(M, K, id_dtype, w_dtype, seed=M * 100 + n)
            ids2[n:], w2[n:] = -1, float("nan")
            _check(ids2, w2, _count(n))


def test_no_count_is_a_no_op() -> None:
    ids, w = _inputs(8, 9, torch.int32, torch.float32)
    ids[3:], w[3:] = -1, float("nan")
    before_ids, before_w = ids.clone(), w.clone()
    mask_padded_rows_(ids, w, None)
    assert torch.equal(ids, before_ids)
    assert torch.equal(bits(w), bits(before_w))


@pytest.mark.parametrize("n", [49, 1000, 2**31 - 1])
def test_count_larger_than_rows_masks_nothing(n: int) -> None:
    ids, w = _inputs(48, 11, torch.int32, torch.float32)
    before_ids, before_w = ids.clone(), w.clone()
    mask_padded_rows_(ids, w, _count(n))
    assert torch.equal(ids, before_ids)
    assert torch.equal(bits(w), bits(before_w))


@pytest.mark.parametrize("n", [-1, -5, -(2**31)])
def test_negative_count_masks_every_row(n: int) -> None:
    ids, w = _inputs(16, 11, torch.int64, torch.bfloat16)
    mask_padded_rows_(ids, w, _count(n), fill_value=3)
    assert bool((ids == 3).all())
    assert torch.equal(bits(w), bits(torch.zeros_like(w)))


def test_int64_count_beyond_int32() -> None:
    ids, w = _inputs(16, 8, torch.int32, torch.float32)
    _check(ids, w, _count(2**40, torch.int64))
    ids, w = _inputs(16, 8, torch.int32, torch.float32)
    _check(ids, w, _count(-(2**40), torch.int64))


@pytest.mark.parametrize("n", [0, 5, 2**40, -(2**40)])
def test_wide_offsets_path_matches_reference(n: int) -> None:
    """Tensors of 2**31 elements or more take int64 offsets (``INT64_OFFSETS``), too large
    to allocate in a test: launch that path on a small tensor, as ``_launch_mask`` would
    for a huge one."""
    M, K = 37, 11
    ids, w = _inputs(M, K, torch.int64, torch.bfloat16, seed=4)
    ref_ids, ref_w = ids.clone(), w.clone()
    count = _count(n, torch.int64)
    mask_padded_rows_reference_(ref_ids, ref_w, count, 2)
    grid, block_m, block_k = mask_mod.mask_launch_config(M, K, flat=True)
    want_stats = mask_stats_reference(ids, w, count, 2).tolist()
    stats = torch.zeros(8, dtype=torch.int64, device=DEV)
    mask_mod._mask_padded_rows_kernel[(grid,)](
        ids, w, count, stats, M, K, K, K, 2,
        BLOCK_M=block_m, BLOCK_K=block_k, CONTIGUOUS=True, INT64_OFFSETS=True, STATS=True,
    )  # fmt: skip
    assert torch.equal(ids, ref_ids)
    assert torch.equal(bits(w), bits(ref_w))
    assert stats[:4].tolist() == want_stats


def test_column_slice_with_row_stride() -> None:
    """Routing tensors that are column slices of wider buffers: only the slice changes."""
    ids_buf, w_buf = _inputs(40, 13, torch.int32, torch.float16, seed=3)
    ids, w = ids_buf[:, 1:12], w_buf[:, 2:13]
    assert ids.stride() == (13, 1) and w.stride() == (13, 1)
    ref_ids_buf, ref_w_buf = ids_buf.clone(), w_buf.clone()
    mask_padded_rows_reference_(ref_ids_buf[:, 1:12], ref_w_buf[:, 2:13], _count(17), 0)
    mask_padded_rows_(ids, w, _count(17))
    assert torch.equal(ids_buf, ref_ids_buf)
    assert torch.equal(bits(w_buf), bits(ref_w_buf))
    assert bool((ids_buf[17:, 0] != 0).any())  # the column left of the slice kept its ids


@pytest.mark.parametrize("flat", [True, False])
def test_large_batch_many_programs(flat: bool) -> None:
    """M = 4096 spans many programs; counts on program boundaries and inside one."""
    M, K = 4096, 11
    grid, block_m, block_k = mask_mod.mask_launch_config(M, K, flat)
    assert grid > 1
    rows_per_program = block_m * block_k / K if flat else block_m
    edge = int(rows_per_program)
    for n in [0, 1, edge - 1, edge, edge + 1, 3 * edge + 2, M - 1, M, 3000]:
        ids_buf, w_buf = _inputs(M, K + (0 if flat else 1), torch.int32, torch.float32, seed=n)
        ids, w = ids_buf[:, :K], w_buf[:, :K]
        assert ids.is_contiguous() == flat
        ref_ids_buf, ref_w_buf = ids_buf.clone(), w_buf.clone()
        mask_padded_rows_reference_(ref_ids_buf[:, :K], ref_w_buf[:, :K], _count(n), 0)
        mask_padded_rows_(ids, w, _count(n))
        assert torch.equal(ids_buf, ref_ids_buf)
        assert torch.equal(bits(w_buf), bits(ref_w_buf))


def test_empty_tensors() -> None:
    ids = torch.empty(0, 8, dtype=torch.int32, device=DEV)
    w = torch.empty(0, 8, dtype=torch.float32, device=DEV)
    mask_padded_rows_(ids, w, _count(0))


@settings(max_examples=60, deadline=None)
@given(
    M=st.integers(1, 300),
    K=st.integers(1, 20),
    n=st.one_of(st.none(), st.integers(-5, 320)),
    id_dtype=st.sampled_from(ID_DTYPES),
    w_dtype=st.sampled_from(W_DTYPES),
    count_dtype=st.sampled_from([torch.int32, torch.int64]),
    fill_value=st.sampled_from([0, -1, 7]),
    extra_cols=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_matches_reference_randomized(
    M, K, n, id_dtype, w_dtype, count_dtype, fill_value, extra_cols, seed
) -> None:
    ids_buf, w_buf = _inputs(M, K + extra_cols, id_dtype, w_dtype, seed)
    ids, w = ids_buf[:, :K], w_buf[:, extra_cols:]
    count = None if n is None else _count(n, count_dtype)
    ref_ids_buf, ref_w_buf = ids_buf.clone(), w_buf.clone()
    mask_padded_rows_reference_(ref_ids_buf[:, :K], ref_w_buf[:, extra_cols:], count, fill_value)
    mask_padded_rows_(ids, w, count, fill_value)
    assert torch.equal(ids_buf, ref_ids_buf)
    assert torch.equal(bits(w_buf), bits(ref_w_buf))


def test_inside_torch_compile() -> None:
    """Traced by dynamo + AOTAutograd (functionalized custom op with its fake impl).

    The ``aot_eager`` backend is used on the CPU: inductor adds minutes of C++ compile
    time on a 2-core machine and exercises nothing more of this op.
    """

    @torch.compile(backend="aot_eager", fullgraph=True)
    def route(ids: torch.Tensor, w: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        mask_padded_rows_(ids, w, count, 0)
        return w.sum(dim=1)

    for n in [3, 0, 12, 7]:
        ids, w = _inputs(12, 9, torch.int32, torch.float32, seed=n)
        ref_ids, ref_w = ids.clone(), w.clone()
        mask_padded_rows_reference_(ref_ids, ref_w, _count(n), 0)
        row_sums = route(ids, w, _count(n))
        assert torch.equal(ids, ref_ids)
        assert torch.equal(w, ref_w)
        assert torch.equal(row_sums, ref_w.sum(dim=1))


def test_custom_op_registration() -> None:
    ids, w = _inputs(10, 4, torch.int32, torch.float32)
    torch.library.opcheck(
        torch.ops.sglang_amd_moe.mask_padded_rows.default, (ids, w, _count(6), 0, None)
    )


# ----------------------------------------------------------------------- bad inputs
def _good():
    ids = torch.full((6, 4), 9999, dtype=torch.int32, device=DEV)
    w = torch.full((6, 4), 5.0, dtype=torch.float32, device=DEV)
    return ids, w, _count(0)


def _bad_cases():
    """(label, build) where build(ids, w, count) -> (args, expected exception)."""
    meta_count = torch.zeros(1, dtype=torch.int32, device="meta")
    return [
        ("ids not a tensor", lambda i, w, c: ((i.tolist(), w, c), TypeError)),
        ("weights not a tensor", lambda i, w, c: ((i, 1.0, c), TypeError)),
        ("count not a tensor", lambda i, w, c: ((i, w, 0), TypeError)),
        ("1-D ids", lambda i, w, c: ((i.view(-1), w.view(-1), c), ValueError)),
        ("3-D ids", lambda i, w, c: ((i.view(6, 2, 2), w.view(6, 2, 2), c), ValueError)),
        ("float count", lambda i, w, c: ((i, w, c.float()), TypeError)),
        ("bool count", lambda i, w, c: ((i, w, c.bool()), TypeError)),
        ("int16 count", lambda i, w, c: ((i, w, c.short()), TypeError)),
        (
            "two-element count",
            lambda i, w, c: ((i, w, torch.zeros(2, dtype=torch.int32, device=DEV)), ValueError),
        ),
        (
            "empty count",
            lambda i, w, c: ((i, w, torch.zeros(0, dtype=torch.int32, device=DEV)), ValueError),
        ),
        ("count on another device", lambda i, w, c: ((i, w, meta_count), ValueError)),
        ("mismatched rows", lambda i, w, c: ((i, w[:5], c), ValueError)),
        ("mismatched cols", lambda i, w, c: ((i, w[:, :3], c), ValueError)),
        ("float ids", lambda i, w, c: ((w, w, c), TypeError)),
        ("int16 ids", lambda i, w, c: ((i.short(), w, c), TypeError)),
        ("int weights", lambda i, w, c: ((i, i, c), TypeError)),
        ("float64 weights", lambda i, w, c: ((i, w.double(), c), TypeError)),
        ("non-unit column stride", lambda i, w, c: ((i[:, ::2], w[:, ::2], c), ValueError)),
        ("transposed", lambda i, w, c: ((i.t(), w.t(), c), ValueError)),
        ("fill_value float", lambda i, w, c: ((i, w, c, 0.5), TypeError)),
        ("fill_value out of int32 range", lambda i, w, c: ((i, w, c, 2**31), ValueError)),
        ("expanded ids (stride 0)", lambda i, w, c: ((i[:1].expand(6, 4), w, c), ValueError)),
        ("expanded weights", lambda i, w, c: ((i, w[2:3].expand(6, 4), c), ValueError)),
        (
            "ids rows overlap",
            lambda i, w, c: ((torch.as_strided(i, (6, 4), (2, 1)), w, c), ValueError),
        ),
        (
            "weights rows overlap",
            lambda i, w, c: ((i, torch.as_strided(w, (6, 4), (3, 1)), c), ValueError),
        ),
        ("weights alias ids", lambda i, w, c: ((i, i.view(torch.float32), c), ValueError)),
        ("count aliases ids", lambda i, w, c: ((i, w, i.view(-1)[22:23]), ValueError)),
        (
            "count aliases weights",
            lambda i, w, c: ((i, w, w.view(torch.int32).view(-1)[5:6]), ValueError),
        ),
    ]


@pytest.mark.parametrize(("label", "build"), _bad_cases(), ids=[c[0] for c in _bad_cases()])
@pytest.mark.parametrize("fn", [mask_padded_rows_, mask_padded_rows_reference_])
def test_bad_input_raises_and_writes_nothing(label, build, fn) -> None:
    ids, w, count = _good()
    args, exc = build(ids, w, count)
    with pytest.raises(exc):
        fn(*args)
    assert bool((ids == 9999).all()), label
    assert bool((w == 5.0).all()), label


def test_weights_on_another_device_raises() -> None:
    ids, w, count = _good()
    with pytest.raises(ValueError, match="topk_weights is on"):
        mask_padded_rows_(ids, torch.zeros(6, 4, device="meta"), count)
    assert bool((ids == 9999).all())


# ------------------------------------------------- tensors that interleave but share nothing
def test_ids_and_weights_as_two_column_ranges_of_one_buffer() -> None:
    """Ids and weights side by side in one row-major buffer share no element: accepted,
    and only their own columns change. One column more and they share one: refused."""
    M, K, n = 12, 4, 5
    buf = torch.randint(1, 100, (M, 2 * K + 1), dtype=torch.int32, device=DEV)
    buf[:, K:] = torch.rand(M, K + 1, device=DEV).view(torch.int32)
    ref = buf.clone()
    mask_padded_rows_reference_(ref[:, :K], ref.view(torch.float32)[:, K : 2 * K], _count(n), 0)
    mask_padded_rows_(buf[:, :K], buf.view(torch.float32)[:, K : 2 * K], _count(n))
    assert torch.equal(buf, ref)
    assert bool((buf[n:, :K] == 0).all()) and bool((buf[n:, 2 * K] != 0).all())
    with pytest.raises(ValueError, match="overlap in memory"):
        mask_padded_rows_(buf[:, : K + 1], buf.view(torch.float32)[:, K : 2 * K + 1], _count(n))


def test_interleaved_rows_of_one_buffer() -> None:
    """Rows of ids and rows of weights alternating in one buffer (``[M, 2, K + 1]``
    viewed as two strided ``[M, K]`` tensors), and the count in a gap between rows."""
    M, K, n = 9, 11, 4
    buf = torch.zeros(M, 2, K + 1, dtype=torch.int32, device=DEV)
    buf[:, 0, :K] = torch.randint(1, 50, (M, K), dtype=torch.int32, device=DEV)
    buf[:, 1, :K] = torch.rand(M, K, device=DEV).view(torch.int32)
    buf[:, :, K] = 77
    buf[2, 0, K] = n
    ids, w, count = buf[:, 0, :K], buf.view(torch.float32)[:, 1, :K], buf[2, 0, K:]
    ref = buf.clone()
    ref[n:, :, :K] = 0
    mask_padded_rows_(ids, w, count)
    assert torch.equal(buf, ref)
    # The count inside a row of ids is refused (the mask writes that row).
    with pytest.raises(ValueError, match="overlap in memory"):
        mask_padded_rows_(ids, w, buf[2, 0, 3:4])


# ----------------------------------------------- the hook's mask (runtime/sglang/call.py)
def _upstream_mask(ids, w, count):
    """What upstream's eager mask writes: rows where ``arange(M) >= count``."""
    pad = torch.arange(ids.shape[0], device=ids.device) >= count.reshape(-1)[0]
    ids, w = ids.clone(), w.clone()
    ids[pad] = 0
    w[pad] = 0
    return ids, w


@pytest.mark.parametrize(
    "count",
    [4.7, 4.0, -0.5, float("nan"), float("inf"), -float("inf"), 1e30, 3, -2, 99],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int16])
def test_plain_torch_mask_decides_rows_as_upstream(count, dtype) -> None:
    """``arange(M) >= count``, exactly: a count of 4.7 keeps row 4, NaN masks nothing."""
    from sglang_amd_moe.runtime.sglang.call import mask_fallback_

    exact = count == count and abs(count) < 2**15 and count == int(count)
    if not dtype.is_floating_point and not exact:
        pytest.skip("not an integer of this dtype")
    ids, w = _inputs(9, 4, torch.int32, torch.float32, seed=5)
    t = torch.tensor([count], dtype=dtype, device=DEV)
    want_ids, want_w = _upstream_mask(ids, w, t)
    stats = torch.zeros(8, dtype=torch.int64, device=DEV)
    before_ids, before_w = ids.clone(), w.clone()
    mask_fallback_(ids, w, t, stats=stats)
    assert torch.equal(ids, want_ids) and torch.equal(bits(w), bits(want_w))
    changed = int(((before_ids != ids) | (bits(before_w) != bits(w))).sum())
    assert stats.tolist() == [1, 0, changed, 0, 0, 0, 0, 0]
    if count == 4.7:
        assert bool((ids[4] == before_ids[4]).all()) and bool((ids[5:] == 0).all())
    if count != count:
        assert torch.equal(ids, before_ids)


def _hook_call(on_failure):
    from sglang_amd_moe.runtime.sglang.call import STANDARD_PLANS, Call, kernel_mask
    from sglang_amd_moe.runtime.target import Args

    def upstream(topk_ids, topk_weights, num_token_non_padded=None):
        return topk_ids, topk_weights

    return Call(
        STANDARD_PLANS["weights-only"], torch, Args(upstream), kernel_mask, (), (), on_failure
    )


def test_a_layout_the_kernel_does_not_take_goes_to_the_plain_mask_quietly() -> None:
    """Columns that are not unit-stride (a view SGLang's own tests pass eagerly): the
    plain-torch mask, no failure reported, the same rows masked, the counters added to."""
    from sglang_amd_moe.runtime import stats
    from sglang_amd_moe.runtime.sglang.call import _mask

    stats.reset()
    failures = []
    call = _hook_call(lambda what, text: failures.append((what, text)))
    buf_ids, buf_w = _inputs(11, 8, torch.int64, torch.float32, seed=6)
    ids, w = buf_ids[:, ::2], buf_w.t().contiguous().t()[:, :4]  # strided columns
    assert ids.stride(1) != 1 and w.stride(1) != 1
    count = _count(6)
    want_ids, want_w = _upstream_mask(ids, w, count)
    changed = int(((ids[6:] != 0) | (w[6:] != 0)).sum())
    for _ in range(3):
        _mask(call, ids, w, count)
    assert torch.equal(ids, want_ids) and torch.equal(bits(w), bits(want_w))
    assert failures == []
    assert stats.counts()["mask"] == {
        "calls": 3, "out_of_range": 0, "past_count": changed, "real_out_of_range": 0
    }  # fmt: skip
    stats.reset()


def test_the_hook_mask_counts_through_the_kernel() -> None:
    from sglang_amd_moe.runtime import stats
    from sglang_amd_moe.runtime.sglang.call import _mask

    stats.reset()
    call = _hook_call(lambda what, text: pytest.fail(text))
    ids, w = _inputs(20, 9, torch.int32, torch.bfloat16, seed=7)
    count = _count(13)
    want = mask_stats_reference(ids, w, count).tolist()
    _mask(call, ids, w, count)
    _mask(call, ids, w, count)
    assert stats.counts()["mask"] == {
        "calls": 2, "out_of_range": 0, "past_count": want[2], "real_out_of_range": 0
    }  # fmt: skip
    stats.reset()

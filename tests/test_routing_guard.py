"""``guard_routing``: the Triton kernel against its plain-torch reference, bit for bit.

Without a GPU the kernel runs through Triton's interpreter (``tests/conftest.py`` sets
``TRITON_INTERPRET=1`` before Triton is imported); the reference fallback is disabled
in these tests, so a pass means the Triton kernel itself wrote the outputs. With a GPU
(and the variable unset) the same tests run the compiled kernel on it.
"""

from __future__ import annotations

import pytest
import sglang_amd_moe.kernels.routing_guard as guard_mod
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import assert_runs_through_triton, bits, forbid_reference, kernel_device
from sglang_amd_moe.kernels import (
    guard_routing,
    guard_routing_reference,
    mask_padded_rows_reference_,
)
from sglang_amd_moe.kernels.reference import guard_stats_reference
from sglang_amd_moe.kernels.utils import capture_launches

DEV = kernel_device()
ID_DTYPES = [torch.int32, torch.int64]
W_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
E = 257
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
# Ids no expert count admits, per id dtype: the usual sentinels and the extremes that a
# comparison in a narrower type would wrap into range.
BAD_IDS = {
    torch.int32: [-1, E, E + 3, I32_MAX, I32_MIN, -E],
    torch.int64: [-1, E, E + 3, I32_MAX, I32_MIN, 2**31, 2**32, 2**32 + 5, -(2**32) + 3,
                  I64_MAX, I64_MIN, I64_MIN + 1],
}  # fmt: skip


@pytest.fixture(autouse=True)
def _kernel_only(monkeypatch: pytest.MonkeyPatch) -> None:
    forbid_reference(monkeypatch, guard_mod, "guard_routing_reference")


def test_kernel_runs_through_triton() -> None:
    assert_runs_through_triton(DEV)


def _routing(M: int, K: int, id_dtype, w_dtype, seed: int = 0, bad: float = 0.3):
    """Ids in ``[0, E)`` with a share ``bad`` of them replaced by out-of-range ones, and
    weights with NaN and Inf among them."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, E, (M, K), generator=g, dtype=torch.int64)
    pool = torch.tensor(BAD_IDS[id_dtype], dtype=torch.int64)
    pick = torch.randint(0, len(pool), (M, K), generator=g)
    ids = torch.where(torch.rand(M, K, generator=g) < bad, pool[pick], ids).to(id_dtype)
    w = torch.randn(M, K, generator=g)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    which = torch.randint(0, 4, (M, K), generator=g)
    w = torch.where(torch.rand(M, K, generator=g) < 0.2, special[which], w).to(w_dtype)
    return ids.to(DEV), w.to(DEV)


def _count(n: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.tensor([n], dtype=dtype, device=DEV)


def _expected(ids: torch.Tensor, w: torch.Tensor, n: int | None):
    """What the guard must return, from first principles (host-side, element by element
    in vectorised form): valid = in range and, with a count, in a real row."""
    ids64 = ids.to(torch.int64)
    valid = (ids64 >= 0) & (ids64 < E)
    if n is not None:
        real = min(max(n, 0), ids.shape[0])
        valid &= (torch.arange(ids.shape[0], device=ids.device) < real)[:, None]
    want_ids = torch.where(valid, ids, torch.zeros_like(ids))
    want_w = torch.where(valid, w, torch.zeros_like(w))
    return want_ids, want_w


def _check(ids: torch.Tensor, w: torch.Tensor, n: int | None, count_dtype=torch.int32) -> None:
    ids_before, w_before = ids.clone(), w.clone()
    count = None if n is None else _count(n, count_dtype)
    got_ids, got_w = guard_routing(ids, w, E, count)
    ref_ids, ref_w = guard_routing_reference(ids, w, E, count)
    want_ids, want_w = _expected(ids, w, n)
    for got, ref, want in ((got_ids, ref_ids, want_ids), (got_w, ref_w, want_w)):
        assert got.is_contiguous() and got.shape == ids.shape and got.dtype == want.dtype
        assert torch.equal(bits(got), bits(ref))
        assert torch.equal(bits(got), bits(want))
    # The caller's tensors are never written, and the outputs are new memory.
    assert torch.equal(ids, ids_before)
    assert torch.equal(bits(w), bits(w_before))
    assert got_ids.data_ptr() != ids.data_ptr() and got_w.data_ptr() != w.data_ptr()
    # Every id handed on is in range; weight 0 wherever the id was replaced.
    assert bool(((got_ids >= 0) & (got_ids < E)).all())
    _check_counters(ids, w, n, count, got_ids, got_w)


def _check_counters(ids, w, n, count, got_ids, got_w) -> None:
    """The same call with counters: the same outputs, and counters equal to the torch
    reference's and to a count from first principles (twice: they add up)."""
    stats = torch.zeros(8, dtype=torch.int64, device=DEV)
    for _ in range(2):
        again_ids, again_w = guard_routing(ids, w, E, count, stats)
        assert torch.equal(again_ids, got_ids) and torch.equal(bits(again_w), bits(got_w))
    ref = guard_stats_reference(ids, w, E, count)
    ids64 = ids.to(torch.int64)
    bad = (ids64 < 0) | (ids64 >= E)
    real = min(max(n, 0), ids.shape[0]) if n is not None else ids.shape[0]
    rows = torch.arange(ids.shape[0], device=ids.device)[:, None] < real
    changed_past = ~rows & ((ids64 != 0) | (w != 0))  # NaN != 0: changed
    n_bad = int((bad & rows).sum())
    want = [1, n_bad, int(changed_past.sum()), n_bad if n is not None else 0]
    assert ref.tolist() == want
    assert stats.tolist() == [2 * x for x in want] + [0, 0, 0, 0]


@pytest.mark.parametrize("id_dtype", ID_DTYPES)
@pytest.mark.parametrize("w_dtype", W_DTYPES)
@pytest.mark.parametrize("n", [None, 0, 5, 47, 48, 49, 1000, -1, -(2**31)])
def test_garbage_ids_and_counts(id_dtype, w_dtype, n) -> None:
    ids, w = _routing(48, 9, id_dtype, w_dtype, seed=hash((str(id_dtype), str(w_dtype))) % 997)
    _check(ids, w, n)


@pytest.mark.parametrize("id_dtype", ID_DTYPES)
def test_every_extreme_id_becomes_expert_zero_with_weight_zero(id_dtype) -> None:
    bad = BAD_IDS[id_dtype]
    ids = torch.tensor([bad, [0] * len(bad), [E - 1] * len(bad)], dtype=id_dtype, device=DEV)
    w = torch.full(ids.shape, 0.5, device=DEV)
    w[1, 0], w[1, 1], w[2, 0] = float("nan"), float("inf"), -float("inf")
    got_ids, got_w = guard_routing(ids, w, E)
    assert bool((got_ids[0] == 0).all()) and bool((bits(got_w[0]) == 0).all())
    # In-range ids (0 and E - 1) and their weights, NaN and Inf included, pass bit for bit.
    assert torch.equal(got_ids[1:], ids[1:])
    assert torch.equal(bits(got_w[1:]), bits(w[1:]))
    _check(ids, w, None)
    _check(ids, w, 2)


@pytest.mark.parametrize(
    ("count_dtype", "n"),
    [(torch.int32, n) for n in (I32_MAX, I32_MIN)]
    + [(torch.int64, n) for n in (I32_MAX, I32_MIN, 2**40, -(2**40), I64_MAX, I64_MIN)],
)
def test_extreme_counts_clamp(count_dtype, n) -> None:
    ids, w = _routing(16, 8, torch.int64, torch.float32, seed=3)
    _check(ids, w, n, count_dtype)


def test_sink_slot_passes_through() -> None:
    """SGLang rewrites expert-parallel -1 ids to a sink slot, ``num_local_experts``, and
    passes an expert mask of ``num_local_experts + 1`` entries: the guard's E is then
    the mask's size, and the sink id is in range, so it passes with its weight."""
    local = 8
    ids = torch.tensor([[local, 1, local], [3, local, 7]], dtype=torch.int32, device=DEV)
    w = torch.tensor([[0.25, 0.5, 0.0], [1.0, 0.125, 2.0]], device=DEV)
    got_ids, got_w = guard_routing(ids, w, local + 1)
    assert torch.equal(got_ids, ids)
    assert torch.equal(bits(got_w), bits(w))
    # Without the sink slot in E, the same ids are replaced.
    got_ids, got_w = guard_routing(ids, w, local)
    assert got_ids.tolist() == [[0, 1, 0], [3, 0, 7]]
    assert got_w.tolist() == [[0.0, 0.5, 0.0], [1.0, 0.0, 2.0]]


def test_real_rows_are_identical_padded_rows_are_zero() -> None:
    M, K, n = 40, 11, 23
    ids, w = _routing(M, K, torch.int32, torch.bfloat16, seed=5, bad=0.0)
    ids[n:] = -1  # vLLM's sentinel for skipped padded rows
    got_ids, got_w = guard_routing(ids, w, E, _count(n))
    assert torch.equal(got_ids[:n], ids[:n])
    assert torch.equal(bits(got_w[:n]), bits(w[:n]))
    assert bool((got_ids[n:] == 0).all())
    assert bool((bits(got_w[n:]) == 0).all())


@pytest.mark.parametrize(
    "layout", ["column slice", "transposed", "expanded rows", "offset by one element"]
)
@pytest.mark.parametrize("n", [None, 7])
def test_strided_inputs(layout: str, n: int | None) -> None:
    """Inputs are only read, so any strides work; the outputs are contiguous."""
    M, K = 21, 9
    ids_buf, w_buf = _routing(M + 1, K + 3, torch.int64, torch.float16, seed=11)
    if layout == "column slice":
        ids, w = ids_buf[:M, 1 : K + 1], w_buf[:M, 3 : K + 3]
    elif layout == "transposed":
        t_ids, t_w = _routing(K, M + 2, torch.int64, torch.float16, seed=12)
        ids, w = t_ids[:, :M].t(), t_w[:, 1 : M + 1].t()
    elif layout == "expanded rows":
        ids, w = ids_buf[:1, :K].expand(M, K), w_buf[2:3, :K].expand(M, K)
    else:
        ids = ids_buf.view(-1)[1 : 1 + M * K].view(M, K)
        w = w_buf.view(-1)[1 : 1 + M * K].view(M, K)
    assert ids.shape == (M, K)
    _check(ids, w, n)


def test_ids_and_weights_may_share_a_buffer() -> None:
    """Read-only inputs may overlap: ids and weights as views of one buffer."""
    buf = torch.randint(-3, E + 3, (10, 8), dtype=torch.int32, device=DEV)
    ids, w = buf[:, :4], buf[:, 4:].view(torch.float32)
    _check(ids, w, 6)
    _check(buf[:, :4], buf.view(torch.float32)[:, :4], 6)


@pytest.mark.parametrize("flat", [True, False])
def test_many_programs(flat: bool) -> None:
    """M = 4096 spans many programs; counts on program boundaries and inside one."""
    M, K = 4096, 11
    grid, block_m, block_k = guard_mod.guard_launch_config(M, K, flat)
    assert grid > 1
    edge = block_m * block_k // K if flat else block_m
    ids_buf, w_buf = _routing(M, K + (0 if flat else 1), torch.int32, torch.float32, seed=2)
    ids, w = ids_buf[:, :K], w_buf[:, :K]
    assert ids.is_contiguous() == flat
    for n in [None, 0, edge - 1, edge, edge + 1, M - 1, M, 3001]:
        _check(ids, w, n)


@pytest.mark.parametrize("n", [None, 0, 5, 2**40, -(2**40)])
def test_wide_offsets_path_matches_reference(n: int | None) -> None:
    """Tensors of 2**31 elements or more take int64 offsets (``INT64_OFFSETS``), too large
    to allocate in a test: launch that path on a small tensor, as ``_launch_guard`` would
    for a huge one."""
    M, K = 37, 11
    ids, w = _routing(M, K, torch.int64, torch.bfloat16, seed=4)
    count = None if n is None else _count(n, torch.int64)
    out_ids, out_w = torch.empty_like(ids), torch.empty_like(w)
    stats = torch.zeros(8, dtype=torch.int64, device=DEV)
    grid, block_m, block_k = guard_mod.guard_launch_config(M, K, flat=True)
    guard_mod._guard_routing_kernel[(grid,)](
        ids, w, ids if count is None else count, out_ids, out_w, stats, M, K, K, 1, K, 1, E,
        BLOCK_M=block_m, BLOCK_K=block_k, FLAT=True, HAS_COUNT=count is not None,
        INT64_OFFSETS=True, STATS=True,
    )  # fmt: skip
    ref_ids, ref_w = guard_routing_reference(ids, w, E, count)
    assert torch.equal(out_ids, ref_ids)
    assert torch.equal(bits(out_w), bits(ref_w))
    assert stats[:4].tolist() == guard_stats_reference(ids, w, E, count).tolist()


def test_empty_tensors() -> None:
    for M, K in ((0, 8), (5, 0)):
        ids = torch.empty(M, K, dtype=torch.int32, device=DEV)
        w = torch.empty(M, K, dtype=torch.float32, device=DEV)
        got_ids, got_w = guard_routing(ids, w, E, _count(0))
        assert got_ids.shape == (M, K) and got_w.shape == (M, K)


def test_one_launch() -> None:
    ids = torch.empty(4096, 9, dtype=torch.int64, device="meta")
    w = torch.empty(4096, 9, dtype=torch.bfloat16, device="meta")
    count = torch.empty(1, dtype=torch.int32, device="meta")
    with capture_launches() as launches:
        out_ids, out_w = guard_routing(ids, w, E, count)
    assert len(launches) == 1 and launches[0].kernel is guard_mod._guard_routing_kernel
    assert launches[0].args[3] is out_ids and launches[0].args[4] is out_w


@settings(max_examples=60, deadline=None)
@given(
    M=st.integers(1, 300),
    K=st.integers(1, 20),
    n=st.one_of(st.none(), st.integers(-5, 320)),
    id_dtype=st.sampled_from(ID_DTYPES),
    w_dtype=st.sampled_from(W_DTYPES),
    count_dtype=st.sampled_from([torch.int32, torch.int64]),
    extra_cols=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_matches_reference_randomized(
    M, K, n, id_dtype, w_dtype, count_dtype, extra_cols, seed
) -> None:
    ids_buf, w_buf = _routing(M, K + extra_cols, id_dtype, w_dtype, seed)
    _check(ids_buf[:, :K], w_buf[:, extra_cols:], n, count_dtype)


def test_inside_torch_compile() -> None:
    """Traced by dynamo + AOTAutograd through the custom op and its fake implementation
    (``aot_eager``: inductor adds minutes of C++ compile time on a 2-core machine)."""

    @torch.compile(backend="aot_eager", fullgraph=True)
    def route(ids: torch.Tensor, w: torch.Tensor, count: torch.Tensor):
        gids, gw = guard_routing(ids, w, E, count)
        return gids, gw * 2.0

    for n in [3, 0, 12, 7]:
        ids, w = _routing(12, 9, torch.int32, torch.float32, seed=n)
        got_ids, got_w = route(ids, w, _count(n))
        ref_ids, ref_w = guard_routing_reference(ids, w, E, _count(n))
        assert torch.equal(got_ids, ref_ids)
        assert torch.equal(bits(got_w), bits(ref_w * 2.0))


def test_custom_op_registration() -> None:
    ids, _ = _routing(10, 4, torch.int32, torch.float32)
    w = torch.rand(10, 4, device=DEV)  # no NaN: opcheck compares with assert_close
    op = torch.ops.sglang_amd_moe.guard_routing.default
    torch.library.opcheck(op, (ids, w, E, _count(6), None))
    torch.library.opcheck(op, (ids, w, E, None, None))


# ---------------------------------------------------------- the references, no host sync
def test_references_read_the_count_on_the_device() -> None:
    """On ``meta`` tensors (no data) any host read of the count (``.item()``, ``int()``,
    a Python branch on a value) raises: the guard and mask references read none, so they
    can be captured in a CUDA graph and replayed with new counts."""
    ids = torch.empty(16, 8, dtype=torch.int64, device="meta")
    w = torch.empty(16, 8, dtype=torch.bfloat16, device="meta")
    count = torch.empty(1, dtype=torch.int32, device="meta")
    out_ids, out_w = guard_routing_reference(ids, w, E, count)
    assert out_ids.shape == (16, 8) and out_w.dtype == torch.bfloat16
    guard_routing_reference(ids, w, E, None)
    mask_padded_rows_reference_(ids, w, count, 0)


# ----------------------------------------------------------------------- bad inputs
def _good():
    ids = torch.full((6, 4), 9999, dtype=torch.int32, device=DEV)
    w = torch.full((6, 4), 5.0, dtype=torch.float32, device=DEV)
    return ids, w, _count(3)


def _bad_cases():
    """(label, build) where build(ids, w, count) -> (args, expected exception, message)."""
    meta_count = torch.zeros(1, dtype=torch.int32, device="meta")
    meta_w = torch.zeros(6, 4, device="meta")
    return [
        ("ids not a tensor", lambda i, w, c: ((i.tolist(), w, E, c), TypeError, "topk_ids must")),
        ("weights not a tensor", lambda i, w, c: ((i, 1.0, E, c), TypeError, "topk_weights")),
        ("count not a tensor", lambda i, w, c: ((i, w, E, 3), TypeError, "num_local_tokens")),
        ("1-D ids", lambda i, w, c: ((i.view(-1), w, E, c), ValueError, "2-D")),
        ("3-D weights", lambda i, w, c: ((i, w.view(6, 2, 2), E, c), ValueError, "2-D")),
        ("mismatched rows", lambda i, w, c: ((i, w[:5], E, c), ValueError, "same shape")),
        ("mismatched cols", lambda i, w, c: ((i, w[:, :3], E, c), ValueError, "same shape")),
        ("float ids", lambda i, w, c: ((w, w, E, c), TypeError, "topk_ids must have dtype")),
        ("int16 ids", lambda i, w, c: ((i.short(), w, E, c), TypeError, "dtype")),
        ("int weights", lambda i, w, c: ((i, i, E, c), TypeError, "topk_weights must have")),
        ("float64 weights", lambda i, w, c: ((i, w.double(), E, c), TypeError, "dtype")),
        ("float count", lambda i, w, c: ((i, w, E, c.float()), TypeError, "integer tensor")),
        ("two-element count", lambda i, w, c: ((i, w, E, c.repeat(2)), ValueError, "one element")),
        ("count on another device", lambda i, w, c: ((i, w, E, meta_count), ValueError, "is on")),
        ("weights on another device", lambda i, w, c: ((i, meta_w, E, c), ValueError, "is on")),
        ("zero experts", lambda i, w, c: ((i, w, 0, c), ValueError, "num_experts must be >= 1")),
        ("float experts", lambda i, w, c: ((i, w, 8.0, c), TypeError, "num_experts must be")),
        ("tensor experts", lambda i, w, c: ((i, w, c, c), TypeError, "num_experts must be")),
        ("too many experts", lambda i, w, c: ((i, w, 2**31, c), ValueError, "num_experts")),
    ]  # fmt: skip


@pytest.mark.parametrize(("label", "build"), _bad_cases(), ids=[c[0] for c in _bad_cases()])
@pytest.mark.parametrize("fn", [guard_routing, guard_routing_reference])
def test_bad_input_raises_and_writes_nothing(label, build, fn) -> None:
    ids, w, count = _good()
    args, exc, message = build(ids, w, count)
    with pytest.raises(exc, match=message):
        fn(*args)
    assert bool((ids == 9999).all()), label
    assert bool((w == 5.0).all()), label

"""The kernels' launch path: what a call launches, and how a launch reaches Triton.

- With tensors on the ``meta`` device inside ``capture_launches()``, every launch of a
  call is recorded (kernel, grid, arguments, constants) and nothing runs: the contract
  the AMD compile gate builds on, for both kernels and every launch plan.
- :class:`KernelLauncher` takes Triton's own path (``kernel[grid](...)``) the first time
  it sees a specialization and launches the compiled kernel directly after that; it
  falls back to Triton's path for anything it cannot key. Exercised here with a stand-in
  kernel, since a CPU has no compiled kernels; ``tests/gpu/test_kernels_gpu.py`` runs
  both paths on a GPU.
"""

from __future__ import annotations

import collections
from types import SimpleNamespace
from typing import NamedTuple

import pytest
import sglang_amd_moe.kernels.utils as utils
import torch
from kernel_helpers import kernel_device
from sglang_amd_moe.kernels import adaptive_moe_sort, mask_padded_rows_, mxfp4_moe_sort
from sglang_amd_moe.kernels.mask_padded_rows import _mask_padded_rows_kernel, mask_launch_config
from sglang_amd_moe.kernels.moe_sort import (
    DETERMINISTIC,
    _sort_atomic_count_kernel,
    _sort_atomic_place_kernel,
    _sort_count_kernel,
    _sort_offsets_kernel,
    _sort_place_kernel,
    _sort_tiny_kernel,
    sort_plan,
)
from sglang_amd_moe.kernels.utils import KernelLauncher, capture_launches, max_sorted_size
from test_mask_padded_rows import _bad_cases, _good
from test_mxfp4_moe_sort import _BAD, _count, _outputs, _routing
from test_routing_guard import _bad_cases as guard_bad_cases
from test_routing_guard import _good as guard_good

META = torch.device("meta")
# Where the direct-program tests run the real kernels on their first calls: the CPU
# (Triton's interpreter) here, the GPU on a GPU machine.
DEV = kernel_device()
STREAM = 4242 if DEV == "cpu" else None  # the stand-in stream handle on the CPU


# ------------------------------------------------------------------ capture, meta tensors
def _meta_sort_args(M: int, NE: int, K: int, MB: int, hidden: int, count: bool) -> dict:
    size = max_sorted_size(M, K, NE, MB)
    i32 = dict(dtype=torch.int32, device=META)
    return dict(
        topk_ids=torch.empty(M, K, **i32),
        topk_weight=torch.empty(M, K, dtype=torch.float32, device=META),
        sorted_token_ids=torch.empty(size, **i32),
        sorted_expert_ids=torch.empty(size // MB, **i32),
        cumsum_tensor=torch.empty(2, **i32),
        reverse_sorted=torch.empty(M * K, **i32),
        sorted_weights=torch.empty(size, dtype=torch.float32, device=META),
        m_indices=torch.empty(size, **i32),
        bf16_zero_out=torch.empty(M * hidden, dtype=torch.bfloat16, device=META),
        bf16_zero_workspace=torch.empty(0, dtype=torch.bfloat16, device=META),
        M_logical=M, NE=NE, TOPK=K, D_HIDDEN=hidden, D_INTER=1, MB=MB, prologue=0,
        num_local_tokens=torch.empty(1, **i32) if count else None,
    )  # fmt: skip


def _expected_sort_launches(M: int, NE: int, K: int, MB: int, zero_numel: int):
    plan = sort_plan(M, NE, K, zero_numel, MB, DETERMINISTIC)
    if plan.single:
        return plan, [(_sort_tiny_kernel, (1 + plan.zero_programs,))]
    if plan.atomic:
        place = plan.chunks + plan.gap_programs + plan.zero_programs
        return plan, [
            (_sort_atomic_count_kernel, (plan.count_programs,)),
            (_sort_atomic_place_kernel, (place,)),
        ]
    expected = [(_sort_count_kernel, (plan.chunks,))]
    if plan.offset_programs:
        expected.append((_sort_offsets_kernel, (plan.offset_programs,)))
    place_programs = plan.chunks + plan.gap_programs + plan.zero_programs
    expected.append((_sort_place_kernel, (place_programs,)))
    return plan, expected


@pytest.mark.parametrize(
    ("M", "NE", "K", "MB"),
    [
        (1, 513, 11, 16),
        (4, 257, 9, 32),
        (200, 896, 16, 64),
        (4096, 513, 11, 128),
        (65536, 257, 9, 16),
    ],
)
@pytest.mark.parametrize("count", [True, False])
def test_sort_launches_are_captured_with_meta_tensors(M, NE, K, MB, count) -> None:
    hidden = 64
    plan, expected = _expected_sort_launches(M, NE, K, MB, M * hidden)
    with capture_launches() as launches:
        mxfp4_moe_sort(**_meta_sort_args(M, NE, K, MB, hidden, count))
    assert [(launch.kernel, launch.grid) for launch in launches] == expected
    assert len(launches) == plan.launches
    for launch in launches:
        tensors = [a for a in launch.args if isinstance(a, torch.Tensor)]
        assert tensors and all(t.device == META for t in tensors)
        # Every runtime parameter is passed, every constant is in meta.
        names = launch.kernel.arg_names
        assert len(launch.args) + len([n for n in names if n in launch.meta]) == len(names)
        assert launch.meta["num_warps"] in (4, 8, 16)
        place_or_count = launch.kernel in (
            _sort_place_kernel,
            _sort_count_kernel,
            _sort_tiny_kernel,
            _sort_atomic_count_kernel,
            _sort_atomic_place_kernel,
        )
        assert launch.meta.get("HAS_COUNT", count) is count or not place_or_count


@pytest.mark.parametrize(("M", "MB", "atomic"), [(1, 16, True), (300, 32, False), (4096, 16, True)])
def test_adaptive_sort_launches_are_captured_with_meta_tensors(M, MB, atomic) -> None:
    NE, K, hidden = 257, 9, 32
    ids = torch.empty(M, K, dtype=torch.int64, device=META)
    w = torch.empty(M, K, dtype=torch.bfloat16, device=META)
    count = torch.empty(1, dtype=torch.int32, device=META)
    zero_numel = M * hidden if (atomic and MB == 16) else 0
    _, expected = _expected_sort_launches(M, NE, K, MB, zero_numel)
    with capture_launches() as launches:
        out = adaptive_moe_sort(ids, w, NE, K, MB, hidden, atomic=atomic, num_local_tokens=count)
    assert [(launch.kernel, launch.grid) for launch in launches] == expected
    assert all(t.device == META for t in out)


@pytest.mark.parametrize(("M", "K"), [(1, 8), (4096, 11), (65536, 16)])
@pytest.mark.parametrize("strided", [False, True])
def test_mask_launch_is_captured_with_meta_tensors(M: int, K: int, strided: bool) -> None:
    width = K + 1 if strided else K
    ids = torch.empty(M, width, dtype=torch.int32, device=META)[:, :K]
    w = torch.empty(M, width, dtype=torch.float32, device=META)[:, :K]
    count = torch.empty(1, dtype=torch.int32, device=META)
    with capture_launches() as launches:
        mask_padded_rows_(ids, w, count)
    grid, block_m, block_k = mask_launch_config(M, K, not strided)
    assert len(launches) == 1
    (launch,) = launches
    assert launch.kernel is _mask_padded_rows_kernel and launch.grid == (grid,)
    assert launch.args[:3] == (ids, w, count)
    assert launch.meta["BLOCK_M"] == block_m and launch.meta["BLOCK_K"] == block_k
    assert launch.meta["CONTIGUOUS"] is (not strided)


def test_capture_records_in_order_and_nests() -> None:
    ids = torch.empty(8, 4, dtype=torch.int32, device=META)
    w = torch.empty(8, 4, dtype=torch.float32, device=META)
    count = torch.empty(1, dtype=torch.int32, device=META)
    with capture_launches() as outer:
        mask_padded_rows_(ids, w, count)
        with capture_launches() as inner:
            mask_padded_rows_(ids, w, count)
        mask_padded_rows_(ids, w, count)
    assert len(outer) == 2 and len(inner) == 1


# -------------------------------------------------------------- the direct launch path
class _Compiled:
    """Stands in for Triton's CompiledKernel: records direct launches."""

    def __init__(self, attrs: dict) -> None:
        self.function = "function-handle"
        self.packed_metadata = ("packed",)
        self.src = SimpleNamespace(attrs=attrs)
        self.direct: list[tuple] = []

    def run(self, *args: object) -> None:
        self.direct.append(args)


class _Kernel:
    """Stands in for a ``@triton.jit`` function with parameters (x_ptr, n, BLOCK)."""

    arg_names = ["x_ptr", "n", "BLOCK"]

    def __init__(self, attrs: dict | None = None) -> None:
        self.attrs = {(0,): [["tt.divisibility", 16]]} if attrs is None else attrs
        self.plain: list[tuple] = []
        self.compiled: list[_Compiled] = []

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.plain.append((grid, args, meta))
            self.compiled.append(_Compiled(self.attrs))
            return self.compiled[-1]

        return run


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct path as on a GPU: compiled kernels, device 0, a fixed stream."""
    monkeypatch.setattr(utils, "_INTERPRETING", False)
    monkeypatch.setattr(utils, "FAST_LAUNCH", True)
    monkeypatch.setattr(utils, "_current_device", lambda: 0)
    monkeypatch.setattr(utils, "_current_raw_stream", lambda index: 4242)


def test_first_call_takes_tritons_path_then_the_compiled_kernel(fast) -> None:
    kernel = _Kernel()
    launcher = KernelLauncher(kernel, BLOCK=8, num_warps=4)
    x = torch.zeros(64, dtype=torch.int32)
    launcher((3,), x, 100)
    assert kernel.plain == [((3,), (x, 100), {"BLOCK": 8, "num_warps": 4})]
    launcher((5, 2), x, 100)
    launcher((7,), x, 100)
    assert len(kernel.plain) == 1 and launcher.compiled_count() == 1
    compiled = kernel.compiled[0]
    # Triton's launcher: grid, stream, function, metadata, no hooks, every parameter.
    assert compiled.direct[0] == (
        5,
        2,
        1,
        4242,
        "function-handle",
        ("packed",),
        None,
        None,
        None,
        x,
        100,
        8,
    )
    assert compiled.direct[1][:3] == (7, 1, 1)


def test_a_new_specialization_goes_through_triton_again(fast) -> None:
    kernel = _Kernel()
    launcher = KernelLauncher(kernel, BLOCK=8, num_warps=4)
    buf = torch.zeros(64, dtype=torch.int32)
    launcher((1,), buf, 32)
    launcher((1,), buf, 48)  # also divisible by 16: same kernel
    assert len(kernel.plain) == 1
    launcher((1,), buf[1:], 32)  # 4 bytes off a 16-byte boundary
    launcher((1,), buf, 1)  # an int equal to 1 is a constant to Triton
    launcher((1,), buf, 33)  # not divisible by 16
    launcher((1,), buf, 2**40)  # int64, not int32
    launcher((1,), buf.float(), 32)  # another dtype
    assert len(kernel.plain) == 6
    for args in ((buf[1:], 32), (buf, 1), (buf, 33), (buf, 2**40), (buf.float(), 32)):
        launcher((1,), *args)
    assert len(kernel.plain) == 6 and launcher.compiled_count() == 6


def test_a_position_that_changes_kind_is_keyed_generically(fast) -> None:
    kernel = _Kernel()
    launcher = KernelLauncher(kernel, BLOCK=8, num_warps=4)
    x = torch.zeros(16, dtype=torch.int32)
    launcher((1,), x, 16)
    launcher((1,), x, x)  # a tensor where an int was
    launcher((1,), 16, x)  # an int where a tensor was
    launcher((1,), x, None)
    assert len(kernel.plain) == 4
    for args in ((x, 16), (x, x), (16, x), (x, None)):
        launcher((1,), *args)
    assert len(kernel.plain) == 4 + 1  # (x, 16) is keyed anew once, generically
    assert sum(len(c.direct) for c in kernel.compiled) == 3


def test_unknown_specialization_attributes_keep_tritons_path(fast) -> None:
    kernel = _Kernel(attrs={(0,): [["tt.divisibility", 16]], (1,): [["tt.new_attribute", 1]]})
    launcher = KernelLauncher(kernel, BLOCK=8, num_warps=4)
    x = torch.zeros(16, dtype=torch.int32)
    for _ in range(3):
        launcher((1,), x, 100)
    assert len(kernel.plain) == 3 and launcher.compiled_count() == 0
    assert all(not c.direct for c in kernel.compiled)


def test_launch_hooks_and_the_switch_keep_tritons_path(fast, monkeypatch) -> None:
    kernel = _Kernel()
    launcher = KernelLauncher(kernel, BLOCK=8, num_warps=4)
    x = torch.zeros(16, dtype=torch.int32)
    launcher((1,), x, 100)
    monkeypatch.setattr(utils, "_launch_hooks_active", lambda: True)  # e.g. a profiler
    launcher((1,), x, 100)
    monkeypatch.setattr(utils, "_launch_hooks_active", lambda: False)
    monkeypatch.setattr(utils, "FAST_LAUNCH", False)  # SGLANG_AMD_MOE_PLAIN_LAUNCH=1
    launcher((1,), x, 100)
    assert len(kernel.plain) == 3 and not kernel.compiled[0].direct


def test_capture_records_instead_of_launching(fast) -> None:
    kernel = _Kernel()
    launcher = KernelLauncher(kernel, BLOCK=8, num_warps=4)
    x = torch.zeros(16, dtype=torch.int32)
    with capture_launches() as launches:
        launcher((2,), x, 5)
    assert not kernel.plain
    assert launches == [utils.Launch(kernel, (2,), (x, 5), {"BLOCK": 8, "num_warps": 4})]


def test_launch_shares_one_launcher_per_kernel_and_constants(fast) -> None:
    kernel = _Kernel()
    x = torch.zeros(16, dtype=torch.int32)
    utils.launch(kernel, (1,), x, 100, BLOCK=8, num_warps=4)
    utils.launch(kernel, (1,), x, 100, num_warps=4, BLOCK=8)
    utils.launch(kernel, (1,), x, 100, BLOCK=16, num_warps=4)
    assert len(kernel.plain) == 2
    assert utils.launcher(kernel, BLOCK=8, num_warps=4) is utils.launcher(
        kernel, num_warps=4, BLOCK=8
    )


def test_arg_key_follows_tritons_specialization() -> None:
    buf = torch.zeros(64, dtype=torch.int32)
    key = utils._arg_key
    assert key((buf, 16)) == key((buf[4:], 32))  # both 16-byte aligned, both % 16 == 0
    assert key((buf, 16)) != key((buf[2:], 16))  # 8 bytes off
    assert key((buf, 1)) != key((buf, 17)) != key((buf, 16))
    assert key((buf, 2**31 - 1)) != key((buf, 2**31 + 15))  # i32 vs i64
    assert key((buf, 2**63 + 16)) != key((buf, 2**62 + 16))  # u64 vs i64
    assert key((buf, True)) != key((buf, 1))


# ------------------------------------------------------------------ guard and scratch
def test_no_device_guard_off_the_gpu() -> None:
    for device in (torch.device("cpu"), META):
        assert utils.device_guard(device) is utils._NO_GUARD


def test_scratch_off_the_gpu_is_a_fresh_buffer() -> None:
    a = utils.scratch("t", 10, torch.int32, META)
    b = utils.scratch("t", 10, torch.int32, META)
    assert a is not b and a.numel() >= 10 and a.dtype == torch.int32


@pytest.mark.parametrize("straight_line", [False, True])
def test_amd_key_separates_buffers_past_two_gib(monkeypatch, straight_line: bool) -> None:
    # On AMD, Triton specializes a pointer on whether its buffer spans at most 2 GiB
    # (32-bit buffer offsets): both key functions must tell the two apart, or a launch
    # could reuse a kernel compiled for the other case. Meta tensors allocate nothing.
    monkeypatch.setattr(utils, "_IS_HIP", True)
    key = utils._key_function("ti") if straight_line else utils._generic_key
    small = torch.empty(1024, dtype=torch.int32, device="meta")
    also_small = torch.empty(2048, dtype=torch.int32, device="meta")
    big = torch.empty(2**29 + 16, dtype=torch.int32, device="meta")  # 2 GiB + 64 bytes
    assert key(small, 16) == key(also_small, 16)
    assert key(small, 16) != key(big, 16)


# --------------------------------------------------------------- direct programs (lean path)
class _Spec(NamedTuple):
    """The stand-in for a compiled kernel's function handle: which kernel, which constants."""

    kernel: object
    meta: dict


class _Recorder:
    """Stands in for compiled kernels' launchers: records every direct launch."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def run(self, *args: object) -> None:
        self.calls.append(args)


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    """Direct programs as on a GPU, on the CPU: launches through Triton's path run the
    real kernels in the interpreter (so first calls write real outputs) and every
    specialization gets a stand-in handle, whose launches are recorded."""
    import sglang_amd_moe.kernels.mask_padded_rows as mask_mod
    import sglang_amd_moe.kernels.moe_sort as sort_mod
    import sglang_amd_moe.kernels.routing_guard as guard_mod

    recorder = _Recorder()
    monkeypatch.setattr(utils, "_INTERPRETING", False)
    monkeypatch.setattr(utils, "FAST_LAUNCH", True)
    if DEV == "cpu":  # on a GPU the real device and stream (launches that do run use them)
        monkeypatch.setattr(utils, "_current_device", lambda: 0)
        monkeypatch.setattr(utils, "_current_raw_stream", lambda index: STREAM)
        monkeypatch.setattr(utils, "_capturing", lambda: False)
    monkeypatch.setattr(
        utils.KernelLauncher,
        "handle",
        lambda self, args: (recorder.run, _Spec(self.kernel, self.meta), "packed"),
    )
    monkeypatch.setattr(
        utils,
        "scratch_on",
        lambda index, stream, name, numel: torch.empty(numel, dtype=torch.int32),
    )
    for mod in (mask_mod, guard_mod, sort_mod):
        # CPU tensors take the Triton kernels (in the interpreter), not the references.
        monkeypatch.setattr(mod, "triton_backend", lambda device: "triton")
    for mod in (mask_mod, guard_mod):
        monkeypatch.setattr(mod, "_DIRECT", {})
    monkeypatch.setattr(utils, "_POOLED", collections.OrderedDict())
    monkeypatch.setattr(sort_mod, "_DIRECT", {})
    monkeypatch.setattr(sort_mod, "_ADAPTIVE_DIRECT", {})
    return recorder


# A direct program is keyed by CUDA device (its index, and whether it is CUDA): every
# non-CUDA tensor keys alike, and real programs exist only on a GPU. The stand-in above
# builds them for CPU tensors, so there a tensor moved to the meta device would hit the
# program of its CPU signature; on a GPU (the device run takes this file there) it
# misses and the full path refuses it, which these cases then check.
_KEYED_ALIKE_ON_CPU = (
    {"count on another device", "output on another device"} if DEV == "cpu" else set()
)


def _refuses_alike(label: str, attempt) -> None:
    """``attempt()`` builds a bad call: ``(call, exception, unchanged)``. Made twice,
    with direct programs off, then on: both raise the exception with one message, and
    ``unchanged()`` (when given) holds after each."""
    messages = []
    for allowed in (False, True):
        call, exc, unchanged = attempt()
        utils.FAST_LAUNCH = allowed
        try:
            with pytest.raises(exc) as info:
                call()
        finally:
            utils.FAST_LAUNCH = True
        messages.append(str(info.value))
        assert unchanged is None or unchanged(), label
    assert messages[0] == messages[1], label


def _counting(monkeypatch: pytest.MonkeyPatch, module, name: str) -> list:
    """Wrap ``module.name`` to count its calls."""
    calls: list = []
    original = getattr(module, name)

    def wrapped(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)
    return calls


def test_mask_second_call_launches_directly_with_integer_pointers(direct, monkeypatch) -> None:
    import sglang_amd_moe.kernels.mask_padded_rows as mask_mod

    checks = _counting(monkeypatch, mask_mod, "check_mask_call")
    ids = torch.randint(0, 9, (40, 11), dtype=torch.int32, device=DEV)
    w = torch.rand(40, 11, device=DEV)
    count = torch.tensor([30], dtype=torch.int32, device=DEV)
    mask_padded_rows_(ids, w, count)  # first call: full checks, real kernel
    assert len(checks) == 1 and not direct.calls
    assert bool((ids[30:] == 0).all()) and bool((w[30:] == 0).all())
    ids2, w2, count2 = ids.clone(), w.clone(), count.clone()
    mask_padded_rows_(ids2, w2, count2)
    assert len(checks) == 1  # no checks on a hit
    (call,) = direct.calls
    grid, block_m, block_k = mask_launch_config(40, 11, True)
    stream = STREAM if DEV == "cpu" else torch.cuda.current_stream().cuda_stream
    assert call[:4] == (grid, 1, 1, stream) and call[5:9] == ("packed", None, None, None)
    assert call[4].kernel is _mask_padded_rows_kernel
    # ids, weights, count, then the counters' slot (the count again: no counters here)
    assert call[9:13] == (ids2.data_ptr(), w2.data_ptr(), count2.data_ptr(), count2.data_ptr())
    assert call[13:18] == (40, 11, 11, 11, 0)  # rows, cols, row strides, fill value
    assert call[18:20] == (block_m, block_k)


def _mask_bad_cases_refused_alike() -> None:
    """Every bad call of the mask's suite raises what it raises without direct programs,
    with the same message, and writes nothing."""
    for label, build in _bad_cases():
        if label in _KEYED_ALIKE_ON_CPU:
            continue

        def attempt(build=build):
            ids, w, count = _good()
            args, exc = build(ids, w, count)

            def unchanged() -> bool:
                return bool((ids == 9999).all()) and bool((w == 5.0).all())

            return lambda: mask_padded_rows_(*args), exc, unchanged

        _refuses_alike(label, attempt)


def test_mask_hits_still_refuse_what_the_full_checks_refuse(direct) -> None:
    """Warm a signature, then every bad call of the mask's suite raises what it raises
    without direct programs, with the same message, and writes nothing."""
    mask_padded_rows_(*_good())  # registers the good signature
    _mask_bad_cases_refused_alike()
    # Same signature, pointers that overlap: the hit goes to the full path and refuses.
    ids, w, _ = _good()
    with pytest.raises(ValueError, match="overlap in memory"):
        mask_padded_rows_(ids, w, ids.view(-1)[5:6])
    assert not direct.calls


def test_mask_misaligned_pointers_take_the_full_path(direct) -> None:
    buf = torch.randint(0, 9, (41 * 8,), dtype=torch.int32, device=DEV)
    w = torch.rand(40, 8, device=DEV)
    count = torch.tensor([20], dtype=torch.int32, device=DEV)
    mask_padded_rows_(buf[:320].view(40, 8), w.clone(), count)
    ids = buf[1:321].view(40, 8)  # 4 bytes past a 16-byte boundary, same signature
    expect = ids.clone()
    expect[20:] = 0
    mask_padded_rows_(ids, w, count)
    assert torch.equal(ids, expect) and not direct.calls


def test_launch_hooks_keep_every_call_on_tritons_path(direct, monkeypatch) -> None:
    ids = torch.randint(0, 9, (8, 4), dtype=torch.int32, device=DEV)
    w = torch.rand(8, 4, device=DEV)
    count = torch.tensor([3], dtype=torch.int32, device=DEV)
    mask_padded_rows_(ids, w, count)
    monkeypatch.setattr(utils, "_launch_hooks_active", lambda: True)
    mask_padded_rows_(ids, w, count)
    with capture_launches() as launches:
        mask_padded_rows_(ids, w, count)
    assert not direct.calls and len(launches) == 1


@pytest.mark.parametrize("with_count", [False, True])
def test_guard_second_call_allocates_and_launches_directly(direct, monkeypatch, with_count) -> None:
    import sglang_amd_moe.kernels.routing_guard as guard_mod
    from sglang_amd_moe.kernels import guard_routing

    checks = _counting(monkeypatch, guard_mod, "check_guard_call")
    ids = torch.tensor([[-1, 3], [7, 300]], dtype=torch.int64, device=DEV)
    w = torch.rand(2, 2, device=DEV)
    count = torch.tensor([1], dtype=torch.int32, device=DEV) if with_count else None
    first = guard_routing(ids, w, 257, count)
    assert first[0].tolist() == ([[0, 3], [0, 0]] if with_count else [[0, 3], [7, 0]])
    out_ids, out_w = guard_routing(ids, w, 257, count)
    assert len(checks) == 1 and len(direct.calls) == 1
    assert out_ids.shape == (2, 2) and out_ids.dtype == torch.int64 and out_w.dtype == w.dtype
    pointers = direct.calls[0][9:14]
    want = [ids.data_ptr(), w.data_ptr(), (count if with_count else ids).data_ptr()]
    assert list(pointers) == want + [out_ids.data_ptr(), out_w.data_ptr()]
    guard_routing(ids, w, 256, count)  # another expert count: another signature
    assert len(checks) == 2


def _guard_bad_cases_refused_alike(keyed_alike: set[str]) -> None:
    """Every bad call of the guard's suite raises what it raises without direct programs,
    with the same message."""
    from sglang_amd_moe.kernels import guard_routing

    for label, build in guard_bad_cases():
        if label in keyed_alike:
            continue

        def attempt(build=build):
            args, exc, _ = build(*guard_good())
            return lambda: guard_routing(*args), exc, None

        _refuses_alike(label, attempt)


def test_guard_hits_still_refuse_what_the_full_checks_refuse(direct) -> None:
    """Warm a signature, then every bad call of the guard's suite raises what it raises
    without direct programs, with the same message, and launches nothing."""
    from sglang_amd_moe.kernels import guard_routing

    keyed_alike = {"weights on another device"} | _KEYED_ALIKE_ON_CPU if DEV == "cpu" else set()
    guard_routing(*guard_good()[:2], 257, guard_good()[2])  # registers the good signature
    _guard_bad_cases_refused_alike(keyed_alike)
    assert not direct.calls


def _spans_disjoint(tensors: list[torch.Tensor]) -> bool:
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors)
    return all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def _stream_pool(program: utils.PairProgram) -> list:
    """The program's pool on the one stream the direct tests use."""
    (pool,) = program.pools.values()
    return pool


@pytest.mark.parametrize(("rows", "cols", "id_dtype"), [(1, 9, torch.int32), (5, 3, torch.int64)])
def test_guard_hits_hand_out_fresh_aligned_outputs(direct, rows, cols, id_dtype) -> None:
    """Outputs of hits: the first hit at a row count allocates its pair, later ones come
    from slabs; each pair fresh memory (no two live outputs share a byte), contiguous,
    16-byte aligned even where a row of the slab is not a multiple of 16 bytes, at the
    addresses the launch was given; slabs grow 2, 4, 8, 16 pairs."""
    import sglang_amd_moe.kernels.routing_guard as guard_mod
    from sglang_amd_moe.kernels import guard_routing

    ids = torch.randint(0, 9, (rows, cols), dtype=id_dtype, device=DEV)
    w = torch.rand(rows, cols, dtype=torch.bfloat16, device=DEV)
    guard_routing(ids, w, 257)
    (program,) = guard_mod._DIRECT.values()
    outs, batches = [], []
    for _ in range(40):
        outs.append(guard_routing(ids, w, 257))
        batches.append(_stream_pool(program)[2])
    assert batches[:2] == [2, 4] and max(batches) == utils.SLAB_PAIRS_MAX
    assert outs[0][0]._base is None and all(o[0]._base is not None for o in outs[1:])
    assert len(direct.calls) == 40
    for call, (out_ids, out_w) in zip(direct.calls, outs, strict=True):
        for out, like in ((out_ids, ids), (out_w, w)):
            assert out.shape == (rows, cols) and out.dtype == like.dtype and out.is_contiguous()
            assert out.data_ptr() % 16 == 0
        assert call[9:15] == (ids.data_ptr(), w.data_ptr(), ids.data_ptr(), out_ids.data_ptr(),
                              out_w.data_ptr(), ids.data_ptr())  # fmt: skip
    assert _spans_disjoint([t for pair in outs for t in pair] + [ids, w])


def test_guard_outputs_under_capture_and_large_ones_are_allocated_each(direct, monkeypatch):
    """While the stream is being captured a hit allocates its outputs (from the graph's
    pool) and leaves the slabs alone; outputs past half a slab are allocated each call."""
    import sglang_amd_moe.kernels.routing_guard as guard_mod
    from sglang_amd_moe.kernels import guard_routing

    ids = torch.randint(0, 9, (4, 8), dtype=torch.int32, device=DEV)
    w = torch.rand(4, 8, device=DEV)
    guard_routing(ids, w, 257)
    (program,) = guard_mod._DIRECT.values()
    guard_routing(ids, w, 257)  # the first hit at 4 rows: allocated
    guard_routing(ids, w, 257)  # makes a slab of 2 pairs, hands out one
    monkeypatch.setattr(utils, "_capturing", lambda: True)
    captured = [guard_routing(ids, w, 257) for _ in range(3)]
    assert all(t._base is None for pair in captured for t in pair)
    assert [(pool[0], len(pool[1])) for pool in program.pools.values()] == [(4, 1)]
    monkeypatch.setattr(utils, "_capturing", lambda: False)
    monkeypatch.setattr(utils, "SLAB_BYTES", 2 * 3 * 8 * 4 - 1)  # under 2 rows of [3, 8]
    big = [guard_routing(ids[:3], w[:3], 257) for _ in range(4)]  # a hit at 3 rows
    assert all(t._base is None for pair in big for t in pair)
    assert [(pool[0], len(pool[1])) for pool in program.pools.values()] == [(3, 0)]
    assert len(guard_mod._DIRECT) == 1 and len(direct.calls) == 2 + 3 + 4


def test_guard_slabs_are_kept_for_the_last_signatures_only(direct) -> None:
    import sglang_amd_moe.kernels.routing_guard as guard_mod
    from sglang_amd_moe.kernels import guard_routing

    for cols in range(1, utils.POOLED_PROGRAMS + 4):
        ids = torch.randint(0, 9, (3, cols), dtype=torch.int32, device=DEV)
        w = torch.rand(3, cols, device=DEV)
        for _ in range(3):  # the full path, an allocating hit, a hit from a slab
            guard_routing(ids, w, 257)
    holding = [p for p in guard_mod._DIRECT.values() if p.pools]
    assert len(holding) == utils.POOLED_PROGRAMS == len(utils._POOLED)
    assert [p.cols for p in holding] == list(range(4, utils.POOLED_PROGRAMS + 4))


def test_sort_second_call_launches_directly_and_hits_still_refuse(direct, monkeypatch) -> None:
    import sglang_amd_moe.kernels.moe_sort as sort_mod

    checks = _counting(monkeypatch, sort_mod, "check_sort_args")
    M, NE, K, MB = 8, 513, 11, 16

    def kwargs():
        ids, w = _routing(M, NE, K, None, seed=16)
        return dict(
            topk_ids=ids, topk_weight=w, **_outputs(M, NE, K, MB, zero_cols=16), M_logical=M,
            NE=NE, TOPK=K, D_HIDDEN=16, D_INTER=1, MB=MB, prologue=0, num_local_tokens=_count(4),
        )  # fmt: skip

    mxfp4_moe_sort(**kwargs())
    assert len(checks) == 1 and not direct.calls
    mxfp4_moe_sort(**kwargs())
    plan = sort_plan(M, NE, K, M * 16, MB)
    assert len(checks) == 1 and len(direct.calls) == plan.launches
    for label, mutate, exc in _BAD:
        if label in _KEYED_ALIKE_ON_CPU:
            continue

        def attempt(mutate=mutate, exc=exc):
            kw = kwargs()
            mutate(kw)
            return lambda: mxfp4_moe_sort(**kw), exc, None

        _refuses_alike(label, attempt)
    assert len(direct.calls) == plan.launches  # no bad call launched


def test_adaptive_second_call_allocates_one_arena(direct) -> None:
    ids = torch.randint(0, 257, (64, 9), dtype=torch.int32, device=DEV)
    w = torch.rand(64, 9, device=DEV)
    count = torch.tensor([40], dtype=torch.int32, device=DEV)
    first = adaptive_moe_sort(
        ids, w, 257, 9, 16, 32, atomic=True, emit_aux=True, num_local_tokens=count
    )
    second = adaptive_moe_sort(
        ids, w, 257, 9, 16, 32, atomic=True, emit_aux=True, num_local_tokens=count
    )
    assert [(t.shape, t.dtype) for t in first] == [(t.shape, t.dtype) for t in second]
    plan = sort_plan(64, 257, 9, 64 * 32, 16)
    assert len(direct.calls) == plan.launches
    sti, sw, sei, nvi, moe_buf, m_idx, rev = second
    # The int32/float32 outputs share one allocation, each 16-byte aligned.
    base = sti.untyped_storage().data_ptr()
    for t in (sw, sei, nvi, m_idx, rev):
        assert t.untyped_storage().data_ptr() == base and t.data_ptr() % 16 == 0
    place = direct.calls[-1]
    assert place[9:12] == (ids.data_ptr(), w.data_ptr(), count.data_ptr())
    assert place[13:20] == (
        sti.data_ptr(), sei.data_ptr(), nvi.data_ptr(), rev.data_ptr(), sw.data_ptr(),
        m_idx.data_ptr(), moe_buf.data_ptr(),
    )  # fmt: skip


# ------------------------------------------------------- one program for every row count
def _launch_args(call: tuple) -> tuple:
    """A recorded direct launch: ``(grid, kernel spec, arguments)``."""
    g0, g1, g2, _stream, spec, _packed, _meta, _enter, _exit, *args = call
    return (g0, g1, g2), spec, args


def _assert_launches_alike(call: tuple, launch: utils.Launch, pointers: int) -> None:
    """The direct launch ``call`` launches what Triton's path was asked to launch
    (``launch``, recorded by capture_launches): the same kernel, constants, grid and
    integer arguments, and the first ``pointers`` pointers."""
    grid, spec, args = _launch_args(call)
    assert spec.kernel is launch.kernel and spec.meta == launch.meta
    assert grid == (*launch.grid, *(1,) * (3 - len(launch.grid)))
    names = launch.kernel.arg_names
    want = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in launch.args]
    want += [launch.meta[n] for n in names if n in launch.meta]
    tensors = sum(isinstance(a, torch.Tensor) for a in launch.args)
    assert args[:pointers] == want[:pointers] and args[tensors:] == want[tensors:]


def _replay(call: tuple, tensors: list[torch.Tensor]) -> None:
    """Run a recorded direct launch for real (Triton's interpreter on the CPU), each
    pointer mapped back to the tensor of ``tensors`` it is the address of."""
    grid, spec, args = _launch_args(call)
    params = [n for n in spec.kernel.arg_names if n not in spec.meta]
    by_address = {t.data_ptr(): t for t in tensors}
    real = [by_address[a] if n.endswith("_ptr") else a for n, a in zip(params, args, strict=False)]
    spec.kernel[grid](*real, **spec.meta)


def _tile(M: int, K: int, flat: bool) -> tuple:
    """What a mask/guard program keys its compiled handles on for ``M`` rows: whether
    there is more than one row (another program) and the launch's constants."""
    _, block_m, block_k = mask_launch_config(M, K, flat)
    return M > 1, block_m, block_k


def test_rows_program_entry_matches_the_launch_config() -> None:
    """Every row count takes the grid and the handle of its own constants, on the fast
    path (a full tile, below the int64 switch) as on the slow one; from 2**31 rows (an
    int64 M) none."""
    for flat, int64_strided in ((True, False), (False, False), (False, True)):
        for cols in (1, 2, 3, 8, 9, 11, 16, 33, 64, 257, 600, 1025):
            program = utils.RowsProgram(0, cols, flat, 512, 512, int64_strided)
            edge = -(-(2**31) // cols)  # the fewest rows of 2**31 elements
            counts = [*range(1, 1100), edge - 1, edge, edge + 1, 2**31 - 1, 2**31, 2**40]
            for rows in counts:
                grid, config = program.config(rows)
                handle = program.handles.setdefault(config, ("run", "function", "packed", config))
                if config == program.steady_config:
                    program.steady = handle
            for rows in counts:
                entry = program.entry(rows)
                if rows >= 2**31:
                    assert entry is None
                    continue
                grid, block_m, block_k = utils.rows_launch_config(rows, cols, flat, 512, 512)
                int64 = (flat or int64_strided) and rows * cols >= 2**31
                assert entry == (grid, ("run", "function", "packed", (block_m, block_k, int64)))


def _mask_case(M: int, K: int, strided: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    width = K + 3 if strided else K
    ids = torch.randint(-2, 300, (M, width), generator=g, dtype=torch.int32).to(DEV)[:, :K]
    w = torch.rand(M, width, generator=g).to(DEV)[:, :K]
    count = torch.tensor([(7 * seed) % (M + 2)], dtype=torch.int32, device=DEV)
    return ids, w, count


# Row counts in the order the tests call them: new ones after hits, alternations, and
# tiles below a full one (each taking the full path once).
ROW_COUNTS = [40, 41, 300, 40, 7, 1000, 2, 5, 300, 6, 1, 1, 33, 64, 4, 3, 41, 1000]


@pytest.mark.parametrize("strided", [False, True])
def test_mask_new_row_counts_hit_and_are_exact(direct, monkeypatch, strided) -> None:
    """After one call, a call with another row count takes the same direct program
    (no checks) unless its tile is new; each hit launches exactly what Triton's path
    would, and run for real it writes what the reference writes."""
    import sglang_amd_moe.kernels.mask_padded_rows as mask_mod
    from sglang_amd_moe.kernels import mask_padded_rows_reference_

    checks = _counting(monkeypatch, mask_mod, "check_mask_call")
    K, tiles, hits = 8, set(), 0
    for i, M in enumerate(ROW_COUNTS):
        ids, w, count = _mask_case(M, K, strided, seed=i)
        want_ids, want_w = ids.clone(), w.clone()
        mask_padded_rows_reference_(want_ids, want_w, count, 0)
        done, checked = len(direct.calls), len(checks)
        mask_padded_rows_(ids, w, count)
        tile = _tile(M, K, not strided)
        if tile in tiles:  # a hit: the stand-in recorded the launch; compare, then run it
            assert len(checks) == checked and len(direct.calls) == done + 1, M
            with capture_launches() as launches:
                mask_padded_rows_(ids, w, count)
            _assert_launches_alike(direct.calls[-1], launches[0], 3)
            _replay(direct.calls[-1], [ids, w, count])
            hits += 1
        else:  # the full path ran the kernel
            assert len(checks) == checked + 1 and len(direct.calls) == done, M
            tiles.add(tile)
        assert torch.equal(ids, want_ids) and torch.equal(w, want_w), M
    assert len(mask_mod._DIRECT) == 2  # one program for one row, one for more
    assert hits == len(ROW_COUNTS) - len(tiles) >= 8


@pytest.mark.parametrize(("with_count", "strided"), [(True, False), (False, False), (True, True)])
def test_guard_new_row_counts_hit_and_are_exact(direct, monkeypatch, with_count, strided) -> None:
    """The guard's program serves every row count: hits at new and alternating row
    counts launch what Triton's path would, their outputs (allocated, or from a slab
    while the row count repeats) are fresh, and run for real they hold the reference's."""
    import sglang_amd_moe.kernels.routing_guard as guard_mod
    from sglang_amd_moe.kernels import guard_routing, guard_routing_reference

    checks = _counting(monkeypatch, guard_mod, "check_guard_call")
    K, tiles, kept = 8, set(), []
    counts = [40, 40, 40, 7, 300, 300, 300, 40, 2, 1, 1, 5, 64, 64, 64, 64, 5, 1000]
    for i, M in enumerate(counts):
        ids, w, count = _mask_case(M, K, strided, seed=i)
        count = count if with_count else None
        done, checked = len(direct.calls), len(checks)
        out_ids, out_w = guard_routing(ids, w, 257, count)
        tile = _tile(M, K, not strided)
        if tile in tiles:
            assert len(checks) == checked and len(direct.calls) == done + 1, M
            with capture_launches() as launches:
                guard_routing(ids, w, 257, count)
            _assert_launches_alike(direct.calls[-1], launches[0], 3)
            _replay(direct.calls[-1], [ids, w, *([count] if with_count else []), out_ids, out_w])
        else:
            assert len(checks) == checked + 1 and len(direct.calls) == done, M
            tiles.add(tile)
        want_ids, want_w = guard_routing_reference(ids, w, 257, count)
        assert torch.equal(out_ids, want_ids) and torch.equal(out_w, want_w), M
        assert out_ids.is_contiguous() and out_w.is_contiguous()
        kept += [out_ids, out_w]
    assert len(guard_mod._DIRECT) == 2
    assert _spans_disjoint(kept)
    assert any(t._base is not None for t in kept)  # repeated row counts took slabs


def test_guard_one_row_and_more_rows_take_their_own_programs(direct) -> None:
    """One row of a wider buffer is contiguous (the flat launch), more rows with the
    same row stride are not: each takes its own program, and both are exact. (300
    columns: a single row fills a flat tile, the tile of every larger count.)"""
    from sglang_amd_moe.kernels import guard_routing, guard_routing_reference

    ids = torch.randint(-3, 300, (10, 310), dtype=torch.int32, device=DEV)
    w = torch.rand(10, 310, device=DEV)
    for rows in (1, 1, 5):
        out_ids, out_w = guard_routing(ids[:rows, :300], w[:rows, :300], 257)
        if rows == 1 and direct.calls:
            _replay(direct.calls[-1], [ids, w, out_ids, out_w])
        want_ids, want_w = guard_routing_reference(ids[:rows, :300], w[:rows, :300], 257)
        assert torch.equal(out_ids, want_ids) and torch.equal(out_w, want_w), rows
    assert len(direct.calls) == 1


def _good_rows(M: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A good call's tensors with ``M`` rows, of the same signature as the suites'
    ``_good()`` (6 rows)."""
    ids = torch.full((M, 4), 9999, dtype=torch.int32, device=DEV)
    w = torch.full((M, 4), 5.0, dtype=torch.float32, device=DEV)
    return ids, w, torch.tensor([0], dtype=torch.int32, device=DEV)


def test_mask_hits_at_a_new_row_count_still_refuse(direct) -> None:
    """With the program made at 5, 8 and 64 rows (the first two of the tile of 6 rows),
    every bad call of the suite (6 rows) raises what it raises without direct programs,
    with the same message; and the same addresses that were apart at fewer rows are
    refused where more rows overlap."""
    import sglang_amd_moe.kernels.mask_padded_rows as mask_mod

    for M in (5, 8, 64):
        mask_padded_rows_(*_good_rows(M))
    assert len(mask_mod._DIRECT) == 1 and len(direct.calls) == 1  # 8 rows: a hit
    _mask_bad_cases_refused_alike()
    assert len(direct.calls) == 1
    # Both row counts take the one handle of full tiles (8 columns: from 33 rows).
    buf = torch.zeros(200 * 8, dtype=torch.int32, device=DEV)
    w = torch.zeros(200, 8, device=DEV)
    count = buf[600:601]  # 2400 bytes in: past 50 rows of ids, inside 150
    for _ in range(2):  # the full path, then a hit
        mask_padded_rows_(buf[: 50 * 8].view(50, 8), w[:50], count)
    assert len(direct.calls) == 2
    with pytest.raises(ValueError, match="topk_ids and num_token_non_padded overlap in memory"):
        mask_padded_rows_(buf[: 150 * 8].view(150, 8), w[:150], count)
    # A single row may have any row stride, 0 too; more rows with it share memory. (512
    # columns: one row a program, so every row count takes one handle.)
    row = torch.zeros(512, dtype=torch.int32, device=DEV)
    w = torch.zeros(6, 512, device=DEV)
    for _ in range(2):
        mask_padded_rows_(row.as_strided((1, 512), (0, 1)), w[:1], _good()[2])
    assert len(direct.calls) == 3
    with pytest.raises(ValueError, match="topk_ids has rows that share memory"):
        mask_padded_rows_(row.as_strided((6, 512), (0, 1)), w, _good()[2])
    assert len(direct.calls) == 3


def test_guard_hits_at_a_new_row_count_still_refuse(direct) -> None:
    from sglang_amd_moe.kernels import guard_routing

    keyed_alike = {"weights on another device"} | _KEYED_ALIKE_ON_CPU if DEV == "cpu" else set()
    for M in (5, 8, 64):  # 5 and 8: the tile of the suite's 6 rows
        ids, w, _ = _good_rows(M)
        guard_routing(ids, w, 257, guard_good()[2])
    assert len(direct.calls) == 1  # 8 rows: a hit
    _guard_bad_cases_refused_alike(keyed_alike)
    assert len(direct.calls) == 1


def _record_tritons_path(monkeypatch: pytest.MonkeyPatch) -> list:
    """From here, launches through Triton's path are recorded, not run (for tensors on
    the meta device, which have no memory): ``(grid, constants)`` each."""
    recorded: list = []
    original = utils.KernelLauncher.__call__

    def record(self: utils.KernelLauncher, grid: tuple, *args: object) -> None:
        if utils._CAPTURED.get() is not None:  # inside capture_launches: recorded there
            original(self, grid, *args)
        else:
            recorded.append((grid, self.meta))

    monkeypatch.setattr(utils.KernelLauncher, "__call__", record)
    return recorded


def test_int64_offsets_are_not_served_by_an_int32_program(direct, monkeypatch) -> None:
    """At 2**31 elements the kernels switch to int64 offsets (other constants, another
    compiled kernel): a hit there never takes the handle made for fewer elements, nor
    the reverse; from 2**31 rows (an int64 M to Triton) every call takes Triton's path.
    Tensors on the meta device stand for the large ones."""
    from sglang_amd_moe.kernels import guard_routing

    recorded = _record_tritons_path(monkeypatch)
    K = 8
    edge = 2**31 // K  # rows * K == 2**31

    def guard(rows: int) -> None:
        ids = torch.empty(rows, K, dtype=torch.int32, device=META)
        guard_routing(ids, torch.empty(rows, K, device=META), 257)

    def int64_of_last_hit() -> bool:
        return direct.calls[-1][4].meta["INT64_OFFSETS"]

    guard(64)  # the full path: the program and its handle for a full tile
    assert [meta["INT64_OFFSETS"] for _, meta in recorded] == [False] and not direct.calls
    guard(edge - 1)
    assert len(recorded) == 1 and int64_of_last_hit() is False
    guard(edge)  # the first call past the switch: Triton's path
    assert [meta["INT64_OFFSETS"] for _, meta in recorded] == [False, True]
    assert recorded[-1][0] == (edge * K // 512,) and len(direct.calls) == 1
    for rows in (edge, edge + 5, edge - 1, edge + 1):
        guard(rows)
        assert int64_of_last_hit() is (rows >= edge)
    assert len(recorded) == 2
    guard(2**31)  # M itself past int32: never a hit
    guard(2**31)
    assert len(recorded) == 4 and len(direct.calls) == 5

    # The mask (whose strided path switches too): a hit needs real addresses to tell
    # its spans apart, so its program is asked directly.
    import sglang_amd_moe.kernels.mask_padded_rows as mask_mod

    for strided in (False, True):
        mask_mod._DIRECT.clear()
        recorded.clear()

        def mask(rows: int, strided: bool = strided) -> None:
            width = K + 3 if strided else K
            ids = torch.empty(rows, width, dtype=torch.int32, device=META)[:, :K]
            w = torch.empty(rows, width, device=META)[:, :K]
            mask_padded_rows_(ids, w, torch.empty(1, dtype=torch.int32, device=META))

        mask(1000)
        (program,) = mask_mod._DIRECT.values()
        assert program.entry(edge - 1)[1][1].meta["INT64_OFFSETS"] is False
        assert program.entry(edge) is None
        mask(edge)
        assert [meta["INT64_OFFSETS"] for _, meta in recorded] == [False, True]
        assert program.entry(edge)[1][1].meta["INT64_OFFSETS"] is True
        assert program.entry(edge - 1)[1][1].meta["INT64_OFFSETS"] is False
        assert program.entry(2**31) is None


def test_sort_programs_are_kept_least_recently_used_first(direct, monkeypatch) -> None:
    """The sort keeps one program per row count, at most SORT_PROGRAMS: when full, the
    half used longest ago go, and a row count dropped takes the full path again."""
    import sglang_amd_moe.kernels.moe_sort as sort_mod

    monkeypatch.setattr(sort_mod, "SORT_PROGRAMS", 4)
    checks = _counting(monkeypatch, sort_mod, "check_sort_args")
    NE, K, MB = 257, 9, 16

    def sort(M: int) -> None:
        ids, w = _routing(M, NE, K, None, seed=M)
        mxfp4_moe_sort(
            topk_ids=ids, topk_weight=w, **_outputs(M, NE, K, MB), M_logical=M, NE=NE, TOPK=K,
            D_HIDDEN=0, D_INTER=1, MB=MB, prologue=0, num_local_tokens=_count(M - 1),
        )  # fmt: skip

    for M in (1, 2, 3, 4, 1):  # the last call is a hit: 1 is used last
        sort(M)
    assert len(checks) == 4 and len(direct.calls) == sort_plan(1, NE, K, 0, MB).launches
    sort(5)  # the cache is full: 2 and 3, used longest ago, go
    assert sorted(key[0] for key in sort_mod._DIRECT) == [1, 4, 5]
    sort(4)
    sort(2)
    assert len(checks) == 6 and sorted(key[0] for key in sort_mod._DIRECT) == [1, 2, 4, 5]

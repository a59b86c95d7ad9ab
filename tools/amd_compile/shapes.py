"""Representative calls of the package's public kernels, and the launches they make.

Nothing here lists a kernel, a constexpr or a launch configuration: each case calls a
public function of ``sglang_amd_moe.kernels`` with tensors on the ``meta`` device (they
have shapes, dtypes, strides and even data-pointer offsets, but no storage and never
run), inside ``capture_launches()``, so what gets compiled is exactly what the package's
own launch planning asks for at that shape. When the kernels or their planning change,
the captured launches change with them.

The cases span what callers pass: the mask and the guard over M = 1..65536 rows,
int32/int64 ids, float32/bfloat16 weights (and float16 weights or an int64 count at a
few row counts), contiguous tensors and row-strided ones (a column slice of a wider
buffer; the guard also transposed ones), the guard with and without a count; the sort over
(NE, TOPK) in {(257, 9), (513, 11), (896, 16)}, MB in {16, 32, 64, 128}, the same M range,
prologue 0 and 1, with and without a device count, with and without ``bf16_zero_out``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from sglang_amd_moe.kernels import guard_routing, mask_padded_rows_, mxfp4_moe_sort
from sglang_amd_moe.kernels.utils import Launch, capture_launches, max_sorted_size

META = torch.device("meta")

# Row counts: 1 (Triton turns an int argument equal to 1 into a constant), powers of
# two and their neighbours (block sizes follow next_pow2), multiples of 16 and not
# (Triton specializes ints divisible by 16), up to 65536.
M_VALUES = (1, 2, 3, 7, 16, 33, 100, 128, 255, 512, 1000, 1024, 4096, 8192, 16384, 65536)
MASK_TOPK = (8, 9, 11, 16)
SORT_SHAPES = ((257, 9), (513, 11), (896, 16))  # (NE, TOPK)
SORT_BLOCKS = (16, 32, 64, 128)  # MB
HIDDEN = 7168  # D_HIDDEN of the models served (bf16_zero_out is M * D_HIDDEN)

_DTYPE_NAMES = {
    torch.int32: "i32",
    torch.int64: "i64",
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
}


@dataclass(frozen=True)
class Case:
    """One call of a public kernel function, described by its parameters."""

    function: str  # the public function called
    params: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        return self.function + " " + " ".join(f"{k}={_fmt(v)}" for k, v in self.params)

    def param(self, name: str) -> Any:
        return dict(self.params)[name]


def _fmt(value: Any) -> str:
    if isinstance(value, torch.dtype):
        return _DTYPE_NAMES.get(value, str(value).removeprefix("torch."))
    return str(value)


def _routing_case(
    function: str, m: int, topk: int, ids, weights, count, layout: str, stats: bool = True
) -> Case:
    return Case(
        function,
        (
            ("M", m),
            ("topk", topk),
            ("ids", ids),
            ("weights", weights),
            ("count", count),
            ("layout", layout),
            ("stats", stats),
        ),
    )


def _routing_cases(function: str, counts: tuple, other_count) -> Iterator[Case]:
    """Every M, topk and layout with int32/int64 ids, float32/bfloat16 weights and each
    of ``counts``; then the other accepted dtypes (float16 weights with ``counts[0]``,
    an int64 count as ``other_count``) at a few row counts, since they change only a
    load or a store."""
    layouts = ("contiguous", "row-strided")
    for m in M_VALUES:
        for topk in MASK_TOPK:
            for ids in (torch.int32, torch.int64):
                for weights in (torch.float32, torch.bfloat16):
                    for count in counts:
                        for layout in layouts:
                            yield _routing_case(function, m, topk, ids, weights, count, layout)
    for m in (1, 100, 4096):
        for layout in layouts:
            yield _routing_case(function, m, 9, torch.int32, torch.float16, counts[0], layout)
            yield _routing_case(function, m, 9, torch.int32, torch.float32, other_count, layout)
            # Counters off (SGLANG_AMD_MOE_STATS=0): the launch without them.
            for count in counts:
                yield _routing_case(
                    function, m, 9, torch.int32, torch.float32, count, layout, stats=False
                )


def mask_cases() -> Iterator[Case]:
    """The mask with an int32 count, as SGLang passes it (an int64 one at a few rows)."""
    yield from _routing_cases("mask_padded_rows_", (torch.int32,), torch.int64)


def guard_cases() -> Iterator[Case]:
    """As the mask's, with and without a count (aiter's calls mostly pass none), plus
    transposed inputs at a few row counts (the strided path at a column stride)."""
    yield from _routing_cases("guard_routing", (None, torch.int32), torch.int64)
    for m in (1, 100, 4096):
        yield _routing_case(
            "guard_routing", m, 8, torch.int64, torch.bfloat16, torch.int32, "transposed"
        )


def sort_cases() -> Iterator[Case]:
    for ne, topk in SORT_SHAPES:
        for mb in SORT_BLOCKS:
            for m in M_VALUES:
                for prologue in (0, 1):
                    for has_count in (True, False):
                        for zero_out in (True, False):
                            yield Case(
                                "mxfp4_moe_sort",
                                (
                                    ("NE", ne),
                                    ("TOPK", topk),
                                    ("MB", mb),
                                    ("M", m),
                                    ("prologue", prologue),
                                    ("count", has_count),
                                    ("zero_out", zero_out),
                                ),
                            )


def all_cases() -> list[Case]:
    return [*mask_cases(), *guard_cases(), *sort_cases()]


def _routing(m: int, topk: int, ids: torch.dtype, weights: torch.dtype, strided: bool):
    """``[m, topk]`` ids and weights; row-strided ones are column slices of a buffer one
    column wider (as when a caller keeps an extra slot per row)."""
    width = topk + 1 if strided else topk
    topk_ids = torch.empty(m, width, dtype=ids, device=META)[:, :topk]
    topk_weights = torch.empty(m, width, dtype=weights, device=META)[:, :topk]
    return topk_ids, topk_weights


def _call_mask(case: Case) -> None:
    ids, weights = _routing(
        case.param("M"),
        case.param("topk"),
        case.param("ids"),
        case.param("weights"),
        case.param("layout") == "row-strided",
    )
    count = torch.empty(1, dtype=case.param("count"), device=META)
    mask_padded_rows_(ids, weights, count, 0, _stats(case))


def _stats(case: Case) -> torch.Tensor | None:
    """The counters the plugin passes (on by default), or none."""
    return torch.empty(8, dtype=torch.int64, device=META) if case.param("stats") else None


def _call_guard(case: Case) -> None:
    m, topk = case.param("M"), case.param("topk")
    layout = case.param("layout")
    if layout == "transposed":
        ids = torch.empty(topk, m, dtype=case.param("ids"), device=META).t()
        weights = torch.empty(topk, m, dtype=case.param("weights"), device=META).t()
    else:
        ids, weights = _routing(
            m, topk, case.param("ids"), case.param("weights"), layout == "row-strided"
        )
    count_dtype = case.param("count")
    count = None if count_dtype is None else torch.empty(1, dtype=count_dtype, device=META)
    guard_routing(ids, weights, 257, count, _stats(case))


def _call_sort(case: Case) -> None:
    m, ne, topk, mb = case.param("M"), case.param("NE"), case.param("TOPK"), case.param("MB")
    ids, weights = _routing(m, topk, torch.int32, torch.float32, strided=False)
    # Output buffers exactly as aiter's _adaptive_moe_sort allocates them.
    size = max_sorted_size(m, topk, ne, mb)
    i32 = torch.int32
    zero_out = torch.empty(
        m * HIDDEN if case.param("zero_out") else 0, dtype=torch.bfloat16, device=META
    )
    mxfp4_moe_sort(
        topk_ids=ids,
        topk_weight=weights,
        sorted_token_ids=torch.empty(size, dtype=i32, device=META),
        sorted_expert_ids=torch.empty(size // mb, dtype=i32, device=META),
        cumsum_tensor=torch.empty(2, dtype=i32, device=META),
        reverse_sorted=torch.empty(m * topk, dtype=i32, device=META),
        sorted_weights=torch.empty(size, dtype=torch.float32, device=META),
        m_indices=torch.empty(size, dtype=i32, device=META),
        bf16_zero_out=zero_out,
        bf16_zero_workspace=torch.empty(0, dtype=torch.bfloat16, device=META),
        M_logical=m,
        NE=ne,
        TOPK=topk,
        D_HIDDEN=HIDDEN,
        D_INTER=1,
        MB=mb,
        prologue=case.param("prologue"),
        num_local_tokens=torch.empty(1, dtype=i32, device=META) if case.param("count") else None,
    )


_CALLS = {
    "mask_padded_rows_": _call_mask,
    "guard_routing": _call_guard,
    "mxfp4_moe_sort": _call_sort,
}


def capture(case: Case) -> list[Launch]:
    """The launches the package's own code makes for ``case`` (nothing runs)."""
    with capture_launches() as launches:
        _CALLS[case.function](case)
    if not launches:
        raise RuntimeError(
            f"{case.label} launched nothing: the kernels did not take their Triton path "
            "(was Triton imported with TRITON_INTERPRET=1?)"
        )
    return list(launches)

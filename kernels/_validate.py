"""Input checks shared by the kernels and their plain-torch references.

Every check reads only tensor metadata (dtype, shape, strides, device, address), never
tensor contents, so it costs no device synchronization and is safe inside CUDA/HIP
graph capture and ``torch.compile`` tracing; each is a fixed number of attribute reads
per tensor (they run on every eager call). The checks use explicit ``raise`` statements
(not ``assert``) so they survive ``python -O``: a bad call must fail loudly *before* any
kernel writes anything, instead of turning into an opaque Triton error or, worse, an
out-of-bounds or racing write on the GPU.

Memory overlap is checked byte-exactly: every tensor a kernel writes must share no byte
with any other tensor of the call (one it reads or one it writes), while tensors that
only interleave (two column ranges of one buffer, say) are accepted; and a routing
tensor's rows must not share memory with each other (an expanded, stride-0 tensor, say),
since each row is written or read as a distinct token.
"""

from __future__ import annotations

import operator

import torch

from .utils import max_sorted_size

__all__ = [
    "COUNT_DTYPES",
    "ID_DTYPES",
    "MAX_GUARD_EXPERTS",
    "MAX_SORT_EXPERTS",
    "MAX_SORT_TOKENS",
    "MAX_SORT_TOPK",
    "SORT_BLOCK_SIZES",
    "SORT_PROLOGUES",
    "WEIGHT_DTYPES",
    "check_count",
    "check_guard_call",
    "check_int",
    "check_mask_args",
    "check_mask_call",
    "check_mask_disjoint",
    "check_routing_pair",
    "check_sort_args",
    "check_sort_inputs",
    "check_tensor",
    "max_sorted_size",
]

ID_DTYPES = (torch.int32, torch.int64)
_ID_RANGE = {d: (torch.iinfo(d).min, torch.iinfo(d).max) for d in ID_DTYPES}
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
COUNT_DTYPES = (torch.int32, torch.int64)
SORT_BLOCK_SIZES = (16, 32, 64, 128)
SORT_PROLOGUES = (0, 1)
# sorted_token_ids packs ``t | (s << 24)`` into an int32: the token takes 24 bits and the
# slot the 7 below the sign bit, so slots 0..127 (TOPK <= 128) and tokens < 2**24.
MAX_SORT_TOKENS = 1 << 24
MAX_SORT_TOPK = 128
# Keeps the kernels' int32 sort keys ((NE + 1) * chunk) far from overflow.
MAX_SORT_EXPERTS = 1 << 16


def _dtype_names(dtypes: tuple[torch.dtype, ...]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_int(name: str, value: object, lo: int | None = None, hi: int | None = None) -> int:
    """Return ``value`` as a Python int, rejecting bools, floats and tensors."""
    if type(value) is int:  # the common case, without the slower checks below
        v = value
    else:
        if isinstance(value, bool) or isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        try:
            v = operator.index(value)
        except TypeError:
            raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValueError(f"{name} must be <= {hi}, got {v}")
    return v


def check_count(name: str, count: object, device: torch.device) -> torch.Tensor | None:
    """A device-side row count: ``None`` or a 1-element int32/int64 tensor on ``device``."""
    if count is None:
        return None
    count = check_tensor(name, count)
    if count.dtype not in COUNT_DTYPES:
        raise TypeError(
            f"{name} must be an integer tensor ({_dtype_names(COUNT_DTYPES)}), got {count.dtype}"
        )
    if count.numel() != 1:
        raise ValueError(f"{name} must hold exactly one element, got shape {tuple(count.shape)}")
    if count.device != device:
        raise ValueError(
            f"{name} is on {count.device} but the routing tensors are on {device}; "
            "the count is read on the device, so it must live there"
        )
    return count


def check_stats(name: str, stats: object, device: torch.device) -> torch.Tensor | None:
    """Counters a kernel adds to: ``None`` or a contiguous int64 tensor of at least 4
    elements on ``device``."""
    if stats is None:
        return None
    stats = check_tensor(name, stats)
    if stats.dtype != torch.int64 or stats.numel() < 4 or not stats.is_contiguous():
        raise TypeError(
            f"{name} must be a contiguous int64 tensor of at least 4 elements, got "
            f"{stats.dtype} {tuple(stats.shape)}"
        )
    if stats.device != device:
        raise ValueError(f"{name} is on {stats.device} but the routing tensors are on {device}")
    return stats


def check_routing_2d(
    name: str, x: torch.Tensor, dtypes: tuple[torch.dtype, ...]
) -> tuple[int, int, int]:
    """A ``[rows, topk]`` routing tensor: allowed dtype, unit column stride, and rows
    that do not share memory (the row stride covers a whole row). Returns ``(rows,
    topk, row stride)``."""
    if x.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in ({_dtype_names(dtypes)}), got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D [rows, topk], got shape {tuple(x.shape)}")
    rows, cols = x.shape
    row_stride, col_stride = x.stride()
    if cols > 1 and col_stride != 1:
        raise ValueError(
            f"{name} must have unit column stride (rows may be strided), got strides "
            f"{(row_stride, col_stride)}"
        )
    if rows > 1 and cols > 0 and row_stride < cols:
        raise ValueError(
            f"{name} has rows that share memory (row stride {row_stride} < {cols} columns, "
            "e.g. an expanded tensor): every row must be its own memory; pass "
            f"{name}.contiguous()"
        )
    return rows, cols, row_stride


def check_routing_pair(
    weights_name: str, topk_ids: object, weights: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk_ids`` and its weights (named ``weights_name``, as each API names them): both
    2-D routing tensors of the allowed dtypes, of one shape, on one device."""
    topk_ids = check_tensor("topk_ids", topk_ids)
    weights = check_tensor(weights_name, weights)
    check_routing_2d("topk_ids", topk_ids, ID_DTYPES)
    check_routing_2d(weights_name, weights, WEIGHT_DTYPES)
    if topk_ids.shape != weights.shape:
        raise ValueError(
            f"topk_ids and {weights_name} must have the same shape, got "
            f"{tuple(topk_ids.shape)} and {tuple(weights.shape)}"
        )
    if topk_ids.device != weights.device:
        raise ValueError(
            f"topk_ids is on {topk_ids.device} but {weights_name} is on {weights.device}"
        )
    return topk_ids, weights


# ------------------------------------------------------------------------------ overlap
# A tensor's memory as a set of byte ranges: ``rows`` ranges of ``width`` bytes, ``pitch``
# bytes apart, the first at ``start`` (``end``: where the last one ends). A contiguous
# tensor is one range; a routing tensor (unit column stride) is one range per row, so
# two tensors that interleave without sharing a byte (two column ranges of one buffer,
# rows of one interleaved with rows of the other) are told apart from tensors that share
# an element. Tuples, in this field order: (start, end, written, name, pitch, width, rows).
Region = tuple[int, int, bool, str, int, int, int]

# Rows compared at once by the exact check of two row sets whose pitches differ.
_ROWS_PER_STEP = 1 << 16


def _region(x: torch.Tensor, name: str, written: bool) -> Region | None:
    """The byte ranges ``x`` addresses, or None when it addresses nothing (no elements,
    or no storage: the ``meta`` device). A 2-D tensor of unit column stride whose rows do
    not overlap is one range per row; anything else is its whole span, one range."""
    numel = x.numel()
    if numel == 0:
        return None
    start = x.data_ptr()
    if start == 0:  # meta tensors have no storage
        return None
    size = x.element_size()
    if x.is_contiguous():
        end = start + numel * size
        return start, end, written, name, end - start, end - start, 1
    if x.dim() == 2:
        rows, cols = x.shape
        row_stride, col_stride = x.stride()
        if (cols == 1 or col_stride == 1) and row_stride >= cols > 0:
            pitch, width = row_stride * size, cols * size
            return start, start + (rows - 1) * pitch + width, written, name, pitch, width, rows
    last = 0
    for n, stride in zip(x.shape, x.stride(), strict=True):
        last += (n - 1) * stride
    end = start + (last + 1) * size
    return start, end, written, name, end - start, end - start, 1


def _rows_after(s: torch.Tensor | int, b: Region) -> torch.Tensor | int:
    """Index of the first row of ``b`` that ends after byte ``s`` (may be ``b``'s row
    count: none does)."""
    first = (s - b[0] - b[5]) // b[4] + 1
    if isinstance(first, int):
        return max(first, 0)
    return first.clamp_(min=0)


def _share_bytes(a: Region, b: Region) -> bool:
    """Whether two regions whose spans overlap share a byte."""
    a_start, _, _, _, pa, wa, ra = a
    b_start, _, _, _, pb, wb, rb = b
    if ra == 1 and rb == 1:
        return True
    if ra == 1 or rb == 1:
        one, rows = (a, b) if ra == 1 else (b, a)
        j = _rows_after(one[0], rows)
        return j < rows[6] and rows[0] + j * rows[4] < one[0] + one[5]
    if pa == pb:
        # Row i of a and row j of b meet iff d = b_start - a_start + (j - i) * pitch lies in
        # (-wb, wa): at most two values of k = j - i, each possible iff it is within
        # [-(ra - 1), rb - 1].
        d = b_start - a_start
        k_lo = (-wb - d) // pa + 1
        k_hi = -((d - wa) // pa) - 1
        return max(k_lo, -(ra - 1)) <= min(k_hi, rb - 1)
    # Different pitches (rare): test each row of a against the first row of b ending
    # after its start, a step of rows at a time.
    for i0 in range(0, ra, _ROWS_PER_STEP):
        s = a_start + torch.arange(i0, min(ra, i0 + _ROWS_PER_STEP), dtype=torch.int64) * pa
        j = _rows_after(s, b)
        if bool(((j < rb) & (b_start + j * pb < s + wa)).any()):
            return True
    return False


def check_disjoint(written: dict[str, torch.Tensor], read: dict[str, torch.Tensor]) -> None:
    """Raise ``ValueError`` when a tensor in ``written`` shares memory with any other
    tensor of the call (written or read). Tensors that are only read may overlap.
    Skipped while ``torch.compile`` traces (its fake tensors have no memory); the mask's
    custom op checks again when it runs."""
    if torch.compiler.is_compiling():
        return
    regions = []
    for names, is_written in ((written, True), (read, False)):
        for name, x in names.items():
            region = _region(x, name, is_written)
            if region is not None:
                regions.append(region)
    _check_spans(regions)


def _check_spans(spans: list[Region]) -> None:
    """Raise ``ValueError`` when a written region shares a byte with another region.
    One sort by start, then each region is compared with the earlier ones whose span
    it starts inside; a pair whose spans overlap is checked byte-exactly."""
    if len(spans) < 2:
        return
    spans.sort()
    end_any = -1  # where the region that ends last so far ends
    for i, later in enumerate(spans):
        if later[0] < end_any:  # rare: its span starts inside an earlier one's
            for earlier in spans[:i]:
                if later[0] < earlier[1] and (later[2] or earlier[2]):
                    if _share_bytes(earlier, later):
                        raise ValueError(f"{earlier[3]} and {later[3]} overlap in memory")
        end_any = max(end_any, later[1])


# --------------------------------------------------------------------------------- mask
def check_mask_args(
    topk_ids: object,
    topk_weights: object,
    num_token_non_padded: object,
    fill_value: object,
) -> torch.Tensor | None:
    """Validate ``mask_padded_rows_`` arguments; return the count tensor (or None)."""
    return check_mask_call(topk_ids, topk_weights, num_token_non_padded, fill_value)[0]


def check_mask_call(
    topk_ids: object,
    topk_weights: object,
    num_token_non_padded: object,
    fill_value: object,
) -> tuple[torch.Tensor | None, int, int, int, int]:
    """:func:`check_mask_args` for the mask's own call: ``(count, rows, topk, row stride
    of topk_ids, row stride of topk_weights)``, each tensor's metadata read once."""
    topk_ids = check_tensor("topk_ids", topk_ids)
    topk_weights = check_tensor("topk_weights", topk_weights)
    rows, cols, stride_ids = check_routing_2d("topk_ids", topk_ids, ID_DTYPES)
    w_rows, w_cols, stride_w = check_routing_2d("topk_weights", topk_weights, WEIGHT_DTYPES)
    if rows != w_rows or cols != w_cols:
        raise ValueError(
            "topk_ids and topk_weights must have the same shape, got "
            f"{(rows, cols)} and {(w_rows, w_cols)}"
        )
    device = topk_ids.device
    if topk_weights.device != device:
        raise ValueError(f"topk_ids is on {device} but topk_weights is on {topk_weights.device}")
    check_int("fill_value", fill_value, *_ID_RANGE[topk_ids.dtype])
    count = check_count("num_token_non_padded", num_token_non_padded, device)
    if count is not None and rows and cols and not torch.compiler.is_compiling():
        # Both routing tensors are written and the count is read: no two may overlap.
        spans = []
        for x, name, stride in (
            (topk_ids, "topk_ids", stride_ids),
            (topk_weights, "topk_weights", stride_w),
        ):
            start = x.data_ptr()
            if start:  # meta tensors have no storage
                size = x.element_size()
                pitch, width = stride * size, cols * size
                end = start + (rows - 1) * pitch + width
                spans.append((start, end, True, name, pitch, width, rows))
        start = count.data_ptr()
        if start:
            size = count.element_size()
            spans.append((start, start + size, False, "num_token_non_padded", size, size, 1))
        _check_spans(spans)
    return count, rows, cols, stride_ids, stride_w


def check_mask_disjoint(
    topk_ids: torch.Tensor, topk_weights: torch.Tensor, count: torch.Tensor | None
) -> None:
    """The mask writes both routing tensors and reads the count: no two may overlap."""
    written = {"topk_ids": topk_ids, "topk_weights": topk_weights}
    check_disjoint(written, {} if count is None else {"num_token_non_padded": count})


# -------------------------------------------------------------------------------- guard
# The guard compares ids with the expert count in int64; the count is an expert count,
# far below this bound.
MAX_GUARD_EXPERTS = 2**31 - 1


def check_guard_call(
    topk_ids: object, topk_weights: object, num_experts: object, num_local_tokens: object
) -> tuple[torch.Tensor | None, int]:
    """Validate ``guard_routing`` arguments; return ``(count or None, num_experts)``.

    The routing tensors are only read (the guard writes new tensors), so any strides
    are accepted, expanded rows and tensors that share memory included."""
    topk_ids = check_tensor("topk_ids", topk_ids)
    topk_weights = check_tensor("topk_weights", topk_weights)
    for name, x, dtypes in (
        ("topk_ids", topk_ids, ID_DTYPES),
        ("topk_weights", topk_weights, WEIGHT_DTYPES),
    ):
        if x.dtype not in dtypes:
            raise TypeError(f"{name} must have dtype in ({_dtype_names(dtypes)}), got {x.dtype}")
        if x.dim() != 2:
            raise ValueError(f"{name} must be 2-D [rows, topk], got shape {tuple(x.shape)}")
    if topk_ids.shape != topk_weights.shape:
        raise ValueError(
            "topk_ids and topk_weights must have the same shape, got "
            f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}"
        )
    device = topk_ids.device
    if topk_weights.device != device:
        raise ValueError(f"topk_ids is on {device} but topk_weights is on {topk_weights.device}")
    num_experts = check_int("num_experts", num_experts, 1, MAX_GUARD_EXPERTS)
    count = check_count("num_local_tokens", num_local_tokens, device)
    return count, num_experts


# --------------------------------------------------------------------------------- sort
def check_sort_inputs(
    topk_ids: object,
    topk_weight: object,
    M_logical: object,
    NE: object,
    TOPK: object,
    MB: object,
    num_local_tokens: object,
    weights_name: str = "topk_weight",
    names: tuple[str, str, str] = ("NE", "TOPK", "MB"),
) -> tuple[torch.Tensor, torch.Tensor, int, int, int, int, torch.Tensor | None]:
    """The sort's inputs and sizes: ``(topk_ids, weights, M, NE, TOPK, MB, count)``
    (``names``: what the caller's API calls NE, TOPK and MB)."""
    m = check_int("M_logical", M_logical, 0, MAX_SORT_TOKENS - 1)
    ne = check_int(names[0], NE, 1, MAX_SORT_EXPERTS)
    k = check_int(names[1], TOPK, 1, MAX_SORT_TOPK)
    mb = check_int(names[2], MB)
    if mb not in SORT_BLOCK_SIZES:
        raise ValueError(f"{names[2]} must be one of {SORT_BLOCK_SIZES}, got {mb}")
    topk_ids, weights = check_routing_pair(weights_name, topk_ids, topk_weight)
    rows, cols = topk_ids.shape
    if cols != k:
        raise ValueError(f"topk_ids has {cols} columns but {names[1]}={k}")
    if rows < m:
        raise ValueError(f"topk_ids has {rows} rows but M_logical={m}")
    count = check_count("num_local_tokens", num_local_tokens, topk_ids.device)
    return topk_ids, weights, m, ne, k, mb, count


def _check_out(
    spans: list,
    name: str,
    x: object,
    dtype: torch.dtype,
    min_numel: int,
    device: torch.device,
) -> torch.Tensor:
    """An output buffer: a contiguous tensor of ``dtype`` (4 bytes an element) on
    ``device`` with at least ``min_numel`` elements; its byte range goes to ``spans``."""
    x = check_tensor(name, x)
    if x.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {x.dtype}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device}, expected {device}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    numel = x.numel()
    if numel < min_numel:
        raise ValueError(f"{name} needs at least {min_numel} elements, got {numel}")
    start = x.data_ptr()
    if numel and start:  # meta tensors have no storage
        spans.append((start, start + 4 * numel, True, name, 4 * numel, 4 * numel, 1))
    return x


def _check_zeroed(spans: list, name: str, x: object, device: torch.device) -> torch.Tensor:
    """A buffer the sort zeroes when it is not empty: then on ``device`` and contiguous;
    its byte range goes to ``spans``."""
    x = check_tensor(name, x)
    numel = x.numel()
    if numel > 0:
        if x.device != device:
            raise ValueError(f"{name} is on {x.device}, expected {device}")
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        start = x.data_ptr()
        if start:
            nbytes = numel * x.element_size()
            spans.append((start, start + nbytes, True, name, nbytes, nbytes, 1))
    return x


def check_sort_args(
    topk_ids: object,
    topk_weight: object,
    sorted_token_ids: object,
    sorted_expert_ids: object,
    cumsum_tensor: object,
    reverse_sorted: object,
    sorted_weights: object,
    m_indices: object,
    bf16_zero_out: object,
    bf16_zero_workspace: object,
    M_logical: object,
    NE: object,
    TOPK: object,
    D_HIDDEN: object,
    D_INTER: object,
    MB: object,
    prologue: object,
    num_local_tokens: object,
) -> tuple[int, int, int, int, torch.Tensor | None]:
    """Validate ``mxfp4_moe_sort`` arguments; return ``(M, NE, TOPK, MB, count)``.

    Output buffers must be large enough for the worst case, which is what aiter's
    ``_adaptive_moe_sort`` allocates (:func:`max_sorted_size`): then no id pattern and
    no count can make the kernel write out of bounds. Every buffer the sort writes must
    be disjoint from every other tensor of the call.
    """
    d_hidden = check_int("D_HIDDEN", D_HIDDEN, 0)
    check_int("D_INTER", D_INTER)
    p = check_int("prologue", prologue)
    if p not in SORT_PROLOGUES:
        raise ValueError(f"prologue must be one of {SORT_PROLOGUES}, got {p}")
    topk_ids, topk_weight, m, ne, k, mb, count = check_sort_inputs(
        topk_ids, topk_weight, M_logical, NE, TOPK, MB, num_local_tokens
    )
    device = topk_ids.device
    bound = max_sorted_size(m, k, ne, mb)
    spans: list[Region] = []
    i32, f32 = torch.int32, torch.float32
    _check_out(spans, "sorted_token_ids", sorted_token_ids, i32, bound, device)
    _check_out(spans, "sorted_expert_ids", sorted_expert_ids, i32, bound // mb, device)
    _check_out(spans, "cumsum_tensor", cumsum_tensor, i32, 2, device)
    _check_out(spans, "reverse_sorted", reverse_sorted, i32, m * k, device)
    _check_out(spans, "sorted_weights", sorted_weights, f32, bound, device)
    _check_out(spans, "m_indices", m_indices, i32, bound, device)
    zero_out = _check_zeroed(spans, "bf16_zero_out", bf16_zero_out, device)
    _check_zeroed(spans, "bf16_zero_workspace", bf16_zero_workspace, device)
    if zero_out.numel() > 0 and zero_out.numel() != m * d_hidden:
        raise ValueError(
            f"bf16_zero_out must hold M_logical * D_HIDDEN = {m} * {d_hidden} elements "
            f"(all M rows are zeroed), got shape {tuple(zero_out.shape)}"
        )
    if not torch.compiler.is_compiling():
        read = (topk_ids, "topk_ids"), (topk_weight, "topk_weight"), (count, "num_local_tokens")
        for x, name in read:
            region = None if x is None else _region(x, name, False)
            if region is not None:
                spans.append(region)
        _check_spans(spans)
    return m, ne, k, mb, count

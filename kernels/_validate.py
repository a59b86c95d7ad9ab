"""Input checks shared by the kernels and their plain-torch references.

Every check reads only tensor metadata (dtype, shape, strides, device), never
tensor contents, so it costs no device synchronization and is safe inside CUDA/HIP
graph capture and ``torch.compile`` tracing. The checks use explicit ``raise``
statements (not ``assert``) so they survive ``python -O``: a bad call must fail
loudly *before* any kernel writes anything, instead of turning into an opaque
Triton error or, worse, an out-of-bounds write on the GPU.
"""

from __future__ import annotations

import operator

import torch

from .utils import max_sorted_size

ID_DTYPES = (torch.int32, torch.int64)
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
COUNT_DTYPES = (torch.int32, torch.int64)
SORT_BLOCK_SIZES = (16, 32, 64, 128)
SORT_PROLOGUES = (0, 1)
# sorted_token_ids packs ``t | (s << 24)``: the token needs 24 bits, the slot 8.
MAX_SORT_TOKENS = 1 << 24
MAX_SORT_TOPK = 256
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
        raise ValueError(
            f"{name} must hold exactly one element, got shape {tuple(count.shape)}"
        )
    if count.device != device:
        raise ValueError(
            f"{name} is on {count.device} but the routing tensors are on {device}; "
            "the count is read on the device, so it must live there"
        )
    return count


def check_routing_2d(name: str, x: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> None:
    if x.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in ({_dtype_names(dtypes)}), got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D [rows, topk], got shape {tuple(x.shape)}")
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(
            f"{name} must have unit column stride (rows may be strided), got strides "
            f"{tuple(x.stride())}"
        )


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
        raise ValueError(f"topk_ids is on {topk_ids.device} but {weights_name} is on {weights.device}")
    return topk_ids, weights


def check_mask_args(
    topk_ids: object,
    topk_weights: object,
    num_token_non_padded: object,
    fill_value: object,
) -> torch.Tensor | None:
    """Validate ``mask_padded_rows_`` arguments; return the count tensor (or None)."""
    topk_ids, topk_weights = check_routing_pair("topk_weights", topk_ids, topk_weights)
    info = torch.iinfo(topk_ids.dtype)
    check_int("fill_value", fill_value, info.min, info.max)
    return check_count("num_token_non_padded", num_token_non_padded, topk_ids.device)


def _check_out(
    name: str,
    x: object,
    dtype: torch.dtype,
    min_numel: int,
    device: torch.device,
) -> torch.Tensor:
    x = check_tensor(name, x)
    if x.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {x.dtype}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device}, expected {device}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if x.numel() < min_numel:
        raise ValueError(f"{name} needs at least {min_numel} elements, got {x.numel()}")
    return x


def _check_zeroed(name: str, x: object, device: torch.device) -> torch.Tensor:
    """A buffer the sort zeroes when it is not empty: then on ``device`` and contiguous."""
    x = check_tensor(name, x)
    if x.numel() > 0:
        if x.device != device:
            raise ValueError(f"{name} is on {x.device}, expected {device}")
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
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
    no count can make the kernel write out of bounds.
    """
    m = check_int("M_logical", M_logical, 0, MAX_SORT_TOKENS - 1)
    ne = check_int("NE", NE, 1, MAX_SORT_EXPERTS)
    k = check_int("TOPK", TOPK, 1, MAX_SORT_TOPK)
    d_hidden = check_int("D_HIDDEN", D_HIDDEN, 0)
    check_int("D_INTER", D_INTER)
    mb = check_int("MB", MB)
    if mb not in SORT_BLOCK_SIZES:
        raise ValueError(f"MB must be one of {SORT_BLOCK_SIZES}, got {mb}")
    p = check_int("prologue", prologue)
    if p not in SORT_PROLOGUES:
        raise ValueError(f"prologue must be one of {SORT_PROLOGUES}, got {p}")

    topk_ids, topk_weight = check_routing_pair("topk_weight", topk_ids, topk_weight)
    if topk_ids.shape[1] != k:
        raise ValueError(f"topk_ids has {topk_ids.shape[1]} columns but TOPK={k}")
    if topk_ids.shape[0] < m:
        raise ValueError(f"topk_ids has {topk_ids.shape[0]} rows but M_logical={m}")
    device = topk_ids.device

    bound = max_sorted_size(m, k, ne, mb)
    _check_out("sorted_token_ids", sorted_token_ids, torch.int32, bound, device)
    _check_out("sorted_expert_ids", sorted_expert_ids, torch.int32, bound // mb, device)
    _check_out("cumsum_tensor", cumsum_tensor, torch.int32, 2, device)
    _check_out("reverse_sorted", reverse_sorted, torch.int32, m * k, device)
    _check_out("sorted_weights", sorted_weights, torch.float32, bound, device)
    _check_out("m_indices", m_indices, torch.int32, bound, device)

    zero_out = _check_zeroed("bf16_zero_out", bf16_zero_out, device)
    if zero_out.numel() > 0 and zero_out.numel() != m * d_hidden:
        raise ValueError(
            f"bf16_zero_out must hold M_logical * D_HIDDEN = {m} * {d_hidden} elements "
            f"(all M rows are zeroed), got shape {tuple(zero_out.shape)}"
        )
    _check_zeroed("bf16_zero_workspace", bf16_zero_workspace, device)

    outs = {
        "sorted_token_ids": sorted_token_ids,
        "sorted_expert_ids": sorted_expert_ids,
        "cumsum_tensor": cumsum_tensor,
        "reverse_sorted": reverse_sorted,
        "sorted_weights": sorted_weights,
        "m_indices": m_indices,
    }
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if _overlap(outs[a], outs[b]):
                raise ValueError(f"{a} and {b} overlap in memory")

    count = check_count("num_local_tokens", num_local_tokens, device)
    return m, ne, k, mb, count


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    # Tensors on the meta device have no storage (every data_ptr is 0): they never overlap.
    if a.numel() == 0 or b.numel() == 0 or a.device.type == "meta":
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()

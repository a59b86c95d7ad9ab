"""Stand-in for ``aiter/ops/moe_mxfp4_aux.py``: the fused MXFP4 aux sort binding.

Upstream, ``mxfp4_moe_sort`` is a ``@compile_ops("module_moe_mxfp4_aux")`` stub bound to
the HIP kernel in ``csrc/kernels/mxfp4_moe/moe_aux/moe_sort_quant.cuh``. Its signature
is copied here exactly as it stands before aiter PR 7083: seventeen
keyword-callable parameters and no ``num_local_tokens``, so the kernel always sorts
all ``M_logical`` rows.

The body writes the output contract (``sglang_amd_moe.kernels.mxfp4_moe_sort``'s
docstring) through this project's plain-torch reference with no count. Where the HIP
kernel would count an out-of-range id (a padded row's ``-1``) into ``count[e]`` out of
bounds, the reference drops the pair instead; this stand-in records each such route in
:data:`standin_calls` so tests can show that padded rows reached aiter's kernel.
"""

from __future__ import annotations

from torch import Tensor

#: Stand-in only: one dict per ``mxfp4_moe_sort`` call (``M_logical``, ``MB``,
#: ``prologue``, ``out_of_range``: the (token, slot, id) routes the HIP kernel would
#: have counted out of bounds). Not part of upstream.
standin_calls: list[dict] = []

# Stand-in subset of upstream's MXFP4_MOE_SUPPORTED_SHAPES (expert, model_dim,
# inter_dim padded to 256, topk): two shapes from upstream's list, aiter PR 7083's
# Qwen3.8-Flash-Next TP1 shape (E=513, 2560/640 -> 768, topk 11), and the small test
# shape of tests/aiter.
MXFP4_MOE_SUPPORTED_SHAPES = frozenset(
    {
        (257, 7168, 256, 9),
        (896, 3584, 512, 16),
        (513, 2560, 768, 11),
        (33, 256, 256, 5),
    }
)


def is_mxfp4_moe_shape_supported(expert: int, model_dim: int, inter_dim: int, topk: int) -> bool:
    """Whether the generated aux kernels cover this shape (inter_dim rounded up to 256)."""
    padded_inter = ((int(inter_dim) + 255) // 256) * 256
    return (int(expert), int(model_dim), padded_inter, int(topk)) in MXFP4_MOE_SUPPORTED_SHAPES


def mxfp4_moe_sort(
    topk_ids: Tensor,
    topk_weight: Tensor,
    sorted_token_ids: Tensor,
    sorted_expert_ids: Tensor,
    cumsum_tensor: Tensor,
    reverse_sorted: Tensor,
    sorted_weights: Tensor,
    m_indices: Tensor,
    bf16_zero_out: Tensor,
    bf16_zero_workspace: Tensor,
    M_logical: int,
    NE: int,
    TOPK: int,
    D_HIDDEN: int,
    D_INTER: int,
    MB: int,
    prologue: int,
) -> None:
    from sglang_amd_moe.kernels import mxfp4_moe_sort_reference

    ids = topk_ids[:M_logical].tolist()
    out_of_range = [
        (t, s, e) for t, row in enumerate(ids) for s, e in enumerate(row) if not 0 <= e < NE
    ]
    standin_calls.append(
        {"M_logical": M_logical, "MB": MB, "prologue": prologue, "out_of_range": out_of_range}
    )
    mxfp4_moe_sort_reference(
        topk_ids,
        topk_weight,
        sorted_token_ids,
        sorted_expert_ids,
        cumsum_tensor,
        reverse_sorted,
        sorted_weights,
        m_indices,
        bf16_zero_out,
        bf16_zero_workspace,
        M_logical,
        NE,
        TOPK,
        D_HIDDEN,
        D_INTER,
        MB,
        prologue,
    )

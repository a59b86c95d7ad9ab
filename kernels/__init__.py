"""Triton kernels (and their plain-torch references) imported as sglang_amd_moe.kernels.

- :func:`mask_padded_rows_`: padded rows of MoE routing get a valid id and weight 0.
- :func:`mxfp4_moe_sort` / :func:`adaptive_moe_sort`: aiter's MXFP4 aux sort and its
  allocating wrapper, honoring ``num_local_tokens``.
- ``*_reference``: plain-torch references the tests compare against.
"""

from .mask_padded_rows import mask_padded_rows_, triton_backend
from .mxfp4_moe_sort import SortPlan, adaptive_moe_sort, mxfp4_moe_sort, sort_plan
from .reference import mask_padded_rows_reference_, mxfp4_moe_sort_reference

__all__ = [
    "SortPlan",
    "adaptive_moe_sort",
    "mask_padded_rows_",
    "mask_padded_rows_reference_",
    "mxfp4_moe_sort",
    "mxfp4_moe_sort_reference",
    "sort_plan",
    "triton_backend",
]

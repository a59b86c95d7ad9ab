"""Triton kernels (and their plain-torch references) imported as sglang_amd_moe.kernels."""

from .mask_padded_rows import mask_padded_rows_, triton_backend
from .reference import mask_padded_rows_reference_, mxfp4_moe_sort_reference

__all__ = [
    "mask_padded_rows_",
    "mask_padded_rows_reference_",
    "mxfp4_moe_sort_reference",
    "triton_backend",
]

"""Triton kernels (and their plain-torch references) imported as sglang_amd_moe.kernels.

- :func:`mask_padded_rows_` (module ``mask_padded_rows``): padded rows of MoE routing
  get a valid id and weight 0.
- :func:`guard_routing` (module ``routing_guard``): new ids and weights for aiter's MoE,
  every id outside ``[0, E)`` (and every row past an optional count) turned into expert 0
  with weight 0; the caller's tensors are never written.
- :func:`mxfp4_moe_sort` / :func:`adaptive_moe_sort` (module ``moe_sort``): aiter's
  MXFP4 aux sort and its allocating wrapper, honoring ``num_local_tokens``.
- ``*_reference`` (module ``reference``): plain-torch references the tests compare against.

Helpers every kernel shares (backend choice, device guard, the one launch call) live in
``utils``; argument checks in ``_validate``.
"""

from .mask_padded_rows import mask_padded_rows_
from .moe_sort import adaptive_moe_sort, mxfp4_moe_sort
from .reference import (
    guard_routing_reference,
    mask_padded_rows_reference_,
    mxfp4_moe_sort_reference,
)
from .routing_guard import guard_routing

__all__ = [
    "adaptive_moe_sort",
    "guard_routing",
    "guard_routing_reference",
    "mask_padded_rows_",
    "mask_padded_rows_reference_",
    "mxfp4_moe_sort",
    "mxfp4_moe_sort_reference",
]

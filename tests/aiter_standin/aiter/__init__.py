"""Stand-in for ROCm's ``aiter`` package: the MXFP4 MoE sort path only (tests only).

Why it exists: real aiter cannot be imported without ROCm (its JIT asks ``hipconfig``
for the ROCm version at import), yet the plugin's aiter hook must be tested on a CPU machine
against aiter's exact API. This package reproduces, name for name, the parts of aiter
that ``sglang_amd_moe.runtime.aiter.hook`` reads, wraps or calls, and nothing more:

- ``aiter.fused_moe``: ``_adaptive_moe_sort``, ``_moe_sorting_impl``, ``moe_sorting``,
  ``fused_moe`` -> ``fused_moe_`` (the custom op) -> ``_fused_moe_impl`` (the plain
  function that sorts) and (``count-rejected`` tree) ``_is_mxfp4_inline_sort`` and
  ``_mxfp4_inline_sort_unsupported``, with upstream's parameters, defaults and
  keyword-only markers, and ``_MOE_SORT_BACKEND`` read from ``AITER_MOE_SORT_BACKEND``;
- ``aiter.mxfp4_moe_sort`` (``aiter/ops/moe_mxfp4_aux.py``): upstream's signature,
  which has no ``num_local_tokens`` before aiter PR 7083;
- ``aiter.moe_sorting_fwd``/``moe_sorting_opus_fwd``/``moe_sorting_opus_get_workspace_size``:
  the CK/Opus sorts that ``_moe_sorting_impl``'s non-adaptive path calls.

Every sort writes aiter's output contract (see ``sglang_amd_moe.kernels.mxfp4_moe_sort``)
through this project's plain-torch reference
``sglang_amd_moe.kernels.mxfp4_moe_sort_reference``. The MoE GEMM stages,
quantisation, tuned-config CSVs and the JIT are not reproduced (see ``fused_moe``).

``SGLANG_AMD_MOE_TEST_AITER_STANDIN_SHAPE`` (read here, at import) selects which upstream tree
``aiter.fused_moe`` stands for; each tree is a separate file under ``_shapes/`` so that
its text classifies as that tree would (``sglang_amd_moe.runtime.aiter.forms``):

``count-dropped`` (default)
    aiter main as read in Aug 2026 (``aiter/fused_moe.py`` with ``output_aux`` and
    ``_adaptive_moe_sort``; ``mxfp4_moe_sort`` without a count).
``count-rejected``
    the tree aiter PR 7083 was written against, reconstructed from its description: the
    stored upstream history has no version of ``_mxfp4_inline_sort_unsupported``.
``no-rocm``
    ``import aiter`` raises what the real package raises on a machine without ROCm:
    ``RuntimeError("ROCm version file not found")``, from
    ``aiter.jit.utils.cpp_extension.get_hip_version()`` (run at import through
    ``aiter.jit.core``), whose ``hipconfig --version`` fails there.
"""

from __future__ import annotations

import logging
import os

SHAPES = ("count-dropped", "count-rejected", "no-rocm")
STANDIN_SHAPE = os.environ.get("SGLANG_AMD_MOE_TEST_AITER_STANDIN_SHAPE", "count-dropped")
if STANDIN_SHAPE not in SHAPES:
    raise ValueError(
        f"SGLANG_AMD_MOE_TEST_AITER_STANDIN_SHAPE must be one of {SHAPES}, got {STANDIN_SHAPE!r}"
    )
if STANDIN_SHAPE == "no-rocm":
    # What the real package raises off ROCm: aiter/jit/utils/cpp_extension.py runs
    # `HIP_VERSION = get_hip_version()` at import, which turns the failing
    # `hipconfig --version` into this exact error.
    raise RuntimeError("ROCm version file not found")

# aiter.fused_moe comes from the selected tree: search that directory first.
__path__.insert(
    0, os.path.join(os.path.dirname(__file__), "_shapes", STANDIN_SHAPE.replace("-", "_"))
)

#: Marks this package as the stand-in (tests assert they never run against real aiter).
IS_STANDIN = True

logger = logging.getLogger("aiter")

from .ops.enum import ActivationType, QuantType  # noqa: E402
from .ops.moe_mxfp4_aux import (  # noqa: E402
    is_mxfp4_moe_shape_supported,
    mxfp4_moe_sort,
)
from .ops.moe_sorting import (  # noqa: E402
    moe_sorting_fwd,
    moe_sorting_opus_fwd,
    moe_sorting_opus_get_workspace_size,
)
from .utility import dtypes as dtypes  # noqa: E402

__all__ = [
    "ActivationType",
    "QuantType",
    "dtypes",
    "is_mxfp4_moe_shape_supported",
    "logger",
    "moe_sorting_fwd",
    "moe_sorting_opus_fwd",
    "moe_sorting_opus_get_workspace_size",
    "mxfp4_moe_sort",
]

"""What the kernel tests share: the device they run on, row/count cases, bit views.

Imported as a plain module (``tests`` is on pytest's ``pythonpath``) by the CPU kernel
tests (``tests/test_mask_padded_rows.py``, ``tests/test_mxfp4_moe_sort.py``,
``tests/test_kernel_launch.py``) and the GPU suite (``tests/gpu/``).
"""

from __future__ import annotations

import pytest
import torch
from sglang_amd_moe.kernels.utils import triton_backend

# (rows, real rows): one row, no real row, a padded tail, chunk and block edges.
ROWS_COUNTS = [(1, 1), (4, 0), (4, 3), (16, 5), (48, 47), (48, 48), (256, 200)]


def bits(x: torch.Tensor) -> torch.Tensor:
    """Same-width integer view, so NaNs and -0.0 compare bit for bit."""
    return x.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def kernel_device() -> str:
    """Where the CPU kernel tests run the Triton kernels: on the CPU through Triton's
    interpreter (``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` before Triton is
    imported on a machine without a GPU), else on the GPU. Fails the importing test
    module when neither is possible."""
    if triton_backend(torch.device("cpu")) == "triton-interpreter":
        return "cpu"
    if not torch.cuda.is_available():
        pytest.fail(
            "no GPU and Triton is not interpreting: TRITON_INTERPRET=1 must be set before "
            "triton is imported (tests/conftest.py does this unless the variable is set)",
            pytrace=False,
        )
    return "cuda"

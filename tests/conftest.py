"""Shared pytest setup.

On a machine without a GPU, the kernel tests run the real Triton kernels through
Triton's interpreter. Triton decides interpretation when it decorates a kernel
(including its own library functions such as ``tl.sort``), so ``TRITON_INTERPRET=1``
must be in the environment before the first ``import triton`` of the test process:
this file is loaded before any test module. An explicit setting in the environment
wins, and a machine with a GPU is left alone (``tests/gpu`` runs compiled kernels).
Subprocesses started by tests inherit the variable.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

"""Shared pytest setup: Triton's interpreter on machines without a GPU, and the markers
of whole test folders.

On a machine without a GPU, the kernel tests run the real Triton kernels through
Triton's interpreter. Triton decides interpretation when it decorates a kernel
(including its own library functions such as ``tl.sort``), so ``TRITON_INTERPRET=1``
must be in the environment before the first ``import triton`` of the test process:
this file is loaded before any test module. An explicit setting in the environment
wins, and a machine with a GPU is left alone (``tests/gpu`` runs compiled kernels).
Subprocesses started by tests inherit the variable.

Markers (declared in ``pyproject.toml``): every test under ``tests/sglang`` drives real
SGLang releases and is marked ``sglang``, every test under ``tests/gpu`` is marked
``gpu``, here, by folder (a ``pytestmark`` in a conftest file marks nothing); tests
elsewhere that need SGLang carry ``@pytest.mark.sglang`` themselves.
"""

import os
from pathlib import Path

import pytest
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

TESTS = Path(__file__).resolve().parent
FOLDER_MARKS = {"sglang": "sglang", "gpu": "gpu"}  # tests/<folder>/... -> marker


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            folder = item.path.relative_to(TESTS).parts[0]
        except ValueError:  # a test outside tests/
            continue
        mark = FOLDER_MARKS.get(folder)
        if mark is not None:
            item.add_marker(mark)

"""The end-to-end padded-batch check behind ``sglang-amd-moe check`` and ``demo``, with a real
SGLang in the interpreter that runs it. Its submodules import torch and Triton: call
:func:`use_triton_interpreter` first."""

import os


def use_triton_interpreter(device: str) -> None:
    """On the CPU, run the kernels through Triton's interpreter unless ``TRITON_INTERPRET``
    is set; only takes effect before ``import triton``."""
    if not device.startswith("cuda"):
        os.environ.setdefault("TRITON_INTERPRET", "1")

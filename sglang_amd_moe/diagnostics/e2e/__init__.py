"""The end-to-end padded-batch check behind ``sglang-amd-moe check`` (and ``demo``), in the
order data flows: :mod:`.run` (every form and batch, without and with the plugin),
:mod:`.model` (a small DeepSeek-style MoE), :mod:`.sglang_calls` (the installed SGLang's
real routing and plugin loader; the unreleased ``mask-under-eplb-guard`` form rebuilt),
:mod:`.amd_emulation` (the AMD device code that cannot run here), :mod:`.consumer` (the
aiter-like MoE), :mod:`.worker` (the rebuilt form with the plugin, in a subprocess),
:mod:`.results` and :mod:`.table`. It needs a real SGLang in the interpreter that runs it.
Its submodules import torch and Triton: call :func:`use_triton_interpreter` first."""

import os


def use_triton_interpreter(device: str) -> None:
    """On the CPU, run the kernels through Triton's interpreter (the same source as on a
    GPU) unless ``TRITON_INTERPRET`` is set; only takes effect before ``import triton``."""
    if not device.startswith("cuda"):
        os.environ.setdefault("TRITON_INTERPRET", "1")

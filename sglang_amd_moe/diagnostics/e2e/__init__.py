"""The end-to-end padded-batch check behind ``sglang-amd-moe check`` (and ``demo``).

It needs a real SGLang release in the interpreter that runs it, the one the server runs
with (the check says so, and exits 2, where there is none; it never installs one: the
registry's SGLang pins CUDA torch); the plugin and the audit never import this package.
Modules, one job each, in the order data flows through them:

- :mod:`.run`: the orchestration (every form and batch, without and with the plugin);
- :mod:`.model`: the small DeepSeek-style MoE model, built in memory;
- :mod:`.sglang_calls`: the installed SGLang's real routing and plugin loader, and the
  unreleased ``mask-under-eplb-guard`` form rebuilt from it (``guard_form/*.diff``);
- :mod:`.amd_emulation`: the two pieces of AMD device code that cannot run here;
- :mod:`.consumer`: the aiter-like MoE consumer (this package's sort);
- :mod:`.worker`: the rebuilt form with the plugin, in a subprocess;
- :mod:`.results` and :mod:`.table`: what is reported, and the printed table.

Importing this package is cheap; its submodules import torch and (through the kernels)
Triton, so call :func:`use_triton_interpreter` before importing them.
"""

from __future__ import annotations

import os


def use_triton_interpreter(device: str) -> None:
    """On the CPU, run this package's Triton kernels through Triton's interpreter (the same
    kernel source as on a GPU; it adds about 2 s here) unless ``TRITON_INTERPRET`` is set
    already (``TRITON_INTERPRET=0`` selects the kernels' torch-reference fallback). It only
    takes effect before the first ``import triton``; the table says which ran."""
    if not device.startswith("cuda"):
        os.environ.setdefault("TRITON_INTERPRET", "1")

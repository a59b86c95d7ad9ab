"""A CUDA stand-in for the aiter modules SGLang 0.5.13.post1 imports on its aiter MoE path
(test-only, for the real-server run; never shipped).

On ROCm with ``SGLANG_USE_AITER=1``, SGLang's unquantized MoE layer shuffles its weights
with ``aiter.ops.shuffle.shuffle_weight`` and runs each MoE call through
``aiter.fused_moe.fused_moe``; its linear layers call ``aiter.tuned_gemm.tgemm.mm``. aiter
needs ROCm, so this package gives those names with aiter's Python signatures and plain
torch bodies that run on CUDA. What matters for the run is the one behaviour of aiter's
kernels this stands for: an expert id outside ``[0, E)`` is a device fault (here a
device-side assert from an index lookup, the way an out-of-bounds table read ends an AMD
kernel), never a silent clamp. The MoE itself is computed densely (every expert on every
row, each row combined with its own weights only), so a row's output depends on nothing
but that row: padded rows cannot change real ones, whatever they hold.

``sitecustomize`` puts the folder holding this package first on ``sys.path`` only with
``SGLANG_AMD_MOE_TEST_AITER=1``.
"""

from enum import Enum

IS_SERVER_STANDIN = True


class ActivationType(Enum):
    No = -1
    Silu = 0
    Gelu = 1
    Swiglu = 2


class QuantType(Enum):
    No = 0
    per_Tensor = 1
    per_Token = 2
    per_1x32 = 3
    per_1x128 = 4
    per_128x128 = 5


__all__ = ["ActivationType", "IS_SERVER_STANDIN", "QuantType"]

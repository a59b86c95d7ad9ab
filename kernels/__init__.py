"""Triton kernels (and their plain-torch references) imported as sglang_amd_moe.kernels."""

"""Device helpers shared by every kernel of this package: one place, no kernel of its own.

- :func:`triton_backend`: how kernels run on a device (compiled Triton, Triton's
  interpreter, or the plain-torch reference on a CPU without the interpreter).
- :func:`device_guard`: make a tensor's GPU current for a launch (Triton launches on
  the current device).
- :func:`launch`: the one call through which every kernel of this package is launched.
  :func:`capture_launches` records the launches instead of running them, so tools can
  see exactly what the package's own launch planning asks for (e.g. with tensors on
  the ``meta`` device, which never run) and compile it for other targets.
- :func:`max_sorted_size`: the sort's worst-case output length, as aiter sizes it.
- :func:`real_rows`: a host-side row count, clamped as the kernels clamp it on the device.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _interpreter_probe_kernel():
    pass


def triton_backend(device: torch.device) -> str:
    """How the kernels of this package run on ``device``.

    ``"triton"`` on a GPU, ``"triton-interpreter"`` when Triton was imported with
    ``TRITON_INTERPRET=1`` (any device), ``"torch-reference"`` on the CPU otherwise.
    Triton decides interpretation once, when a kernel is decorated, so setting the
    variable after ``import triton`` has no effect.
    """
    if isinstance(_interpreter_probe_kernel, InterpretedFunction):
        return "triton-interpreter"
    if device.type == "cpu":
        return "torch-reference"
    return "triton"


def device_guard(device: torch.device) -> contextlib.AbstractContextManager:
    """Make ``device`` current for a Triton launch (Triton launches on the current GPU)."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


@dataclass(frozen=True)
class Launch:
    """One kernel launch as the package's launch code asked for it."""

    kernel: Any  # the @triton.jit function
    grid: tuple[int, ...]
    args: tuple  # runtime arguments, in the kernel's parameter order
    meta: dict[str, Any] = field(default_factory=dict)  # constexprs and num_warps


_CAPTURED: contextvars.ContextVar[list[Launch] | None] = contextvars.ContextVar(
    "sglang_amd_moe_captured_launches", default=None
)


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
    """Launch ``kernel`` over ``grid`` with ``args`` and ``meta`` (constexprs, num_warps).

    Inside :func:`capture_launches` the launch is recorded, not run.
    """
    captured = _CAPTURED.get()
    if captured is not None:
        captured.append(Launch(kernel, tuple(grid), args, meta))
        return
    kernel[grid](*args, **meta)


@contextlib.contextmanager
def capture_launches() -> Iterator[list[Launch]]:
    """Record every :func:`launch` made inside the block (in order) instead of running it."""
    captured: list[Launch] = []
    token = _CAPTURED.set(captured)
    try:
        yield captured
    finally:
        _CAPTURED.reset(token)


def max_sorted_size(num_rows: int, topk: int, num_experts: int, block_size: int) -> int:
    """Worst-case sorted length, exactly as aiter's ``_adaptive_moe_sort`` allocates it.

    Every routed expert rounds its pair count up to a multiple of ``block_size``, so at
    most ``min(num_experts, pairs)`` experts each add at most ``block_size - 1`` slots.
    """
    pairs = num_rows * topk
    active = min(num_experts, pairs)
    return ((pairs + active * (block_size - 1) + block_size - 1) // block_size) * block_size


def real_rows(count: torch.Tensor | None, num_rows: int) -> int:
    """The real row count on the host: ``count`` clamped to ``[0, num_rows]`` (a host
    sync), or ``num_rows`` without one. For references and tests, never a hot path."""
    if count is None:
        return num_rows
    return min(max(int(count.item()), 0), num_rows)

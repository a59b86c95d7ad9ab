"""Stand-in for ``aiter.jit.utils.torch_guard.torch_compile_guard``.

Upstream registers the decorated function as a torch custom op ``torch.ops.aiter.<name>``
and returns ``wrapper_custom(*args, **kwargs)``, which calls that op; the op's eager
implementation then calls the original Python function. What matters to the plugin is
kept: the module attribute (``aiter.fused_moe.fused_moe_``) becomes an opaque
``(*args, **kwargs)`` wrapper (no ``__wrapped__``, no signature), and the original body
still runs as a normal Python frame. The op registration itself is not reproduced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def torch_compile_guard(
    mutates_args: list[str] | str = "unknown",
    device: str = "cpu",
    calling_func_: Callable[..., Any] | None = None,
    gen_fake: Callable[..., Any] | None = None,
):
    def decorator(func):
        def wrapper_custom(*args, **kwargs):
            return func(*args, **kwargs)

        return wrapper_custom

    return decorator

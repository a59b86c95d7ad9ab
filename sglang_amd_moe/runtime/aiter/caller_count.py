"""What the aiter hook needs and aiter's call does not hand it, read around the call.

aiter main's ``_fused_moe_impl`` runs ``moe_sorting(..., output_aux=True)`` without the
count it was given, and ``_moe_sorting_impl`` takes its adaptive branch on a condition of
its own. So the hook (1) reads the count from that caller's frame, and (2) evaluates
upstream's branch condition itself, to take exactly the decision upstream takes. Both are
guarded: the frame must be one of the callers ``forms`` names, in aiter's own
``fused_moe.py``, sorting the very same ``topk_ids``; the condition is one ``forms`` found
pure (names, constants, arithmetic, comparisons; no calls, no attributes).
"""

from __future__ import annotations

import sys
from typing import Any

from sglang_amd_moe.runtime.aiter.forms import COUNT

#: How many frames above the hook the caller may be.
_DEPTH = 8


def count_from_caller(topk_ids: Any, callers: frozenset[str], origin: str) -> Any:
    """The count of the nearest enclosing named aiter caller sorting this ``topk_ids``.

    On aiter main: ``fused_moe`` -> ``fused_moe_`` (torch custom op) ->
    ``_fused_moe_impl`` -> ``moe_sorting`` -> ``_moe_sorting_impl`` (the hook).
    """
    frame = sys._getframe(2)  # skip this function and the hook
    for _ in range(_DEPTH):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name in callers and code.co_filename == origin:
            local = frame.f_locals
            return local.get(COUNT) if local.get("topk_ids") is topk_ids else None
        frame = frame.f_back
    return None


class BranchCondition:
    """Upstream's adaptive-branch condition (``FormReport.branch_test``), evaluated over
    a bound call of ``_moe_sorting_impl`` (its arguments, ``M``, ``topk`` and the
    module's backend variable)."""

    def __init__(self, source: str, module: Any, backend_var: str) -> None:
        self._code = compile(source, "<aiter adaptive branch>", "eval")
        self._module, self._backend_var = module, backend_var

    def holds(self, arguments: dict[str, Any], rows: int, topk: int) -> bool:
        env = {**arguments, "M": rows, "topk": topk}
        env[self._backend_var] = getattr(self._module, self._backend_var)
        return bool(eval(self._code, {"__builtins__": {}}, env))  # noqa: S307 - pure, checked

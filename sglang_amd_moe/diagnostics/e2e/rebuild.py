"""The ``mask-under-eplb-guard`` form, rebuilt from whatever release is installed.

That form is what upstream main had between SGLang PRs 28188 and 28378 (the HIP branch
fills padded ids only under the EPLB remap guard); it was never released, so the check
makes it: an AST transform of the installed ``_post_process_topk_ids`` that moves the
HIP branch's padded-region mask to the top of the EPLB guard's body, compiled in the
topk module's globals. The classifier's own readers
(:mod:`sglang_amd_moe.runtime.sglang_forms`) find the branch, the guard and the mask,
so the rebuild and the plugin agree on what they look at.
"""

from __future__ import annotations
import __future__

import ast
import inspect
import linecache
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sglang_amd_moe.runtime.astutil import call_name
from sglang_amd_moe.runtime.sglang_forms import (
    FUNCTION_NAME,
    hip_branches,
    predicate_vars,
    refs_predicate,
)
from sglang_amd_moe.runtime.sglang_hook import TOPK_MODULE

#: The form the rebuild produces (a name from ``sglang_forms.FORMS``).
REBUILT = "mask-under-eplb-guard"


class RebuildError(RuntimeError):
    """The installed function cannot be turned into the mask-under-eplb-guard form."""


def _calls(node: ast.AST, name: str) -> bool:
    return any(isinstance(sub, ast.Call) and call_name(sub) == name for sub in ast.walk(node))


def rebuild_source(source: str) -> str:
    """Return ``_post_process_topk_ids`` from ``source`` (text of topk.py) with the HIP
    branch's padded-region mask moved to the top of the EPLB remap guard's body.

    This is a reconstruction of upstream main between PRs 28188 and 28378 (never
    released), made on whatever release is installed; tests use the real 0.5.14 source
    with the upstream fix reversed (``tools/compat/reverse_28378_mask_under_eplb_guard.diff``).
    Raises :class:`RebuildError` when the function has no mask outside the guard to move
    (forms ``no-hip-handling``, ``weights-only``, or already ``mask-under-eplb-guard``).
    """
    tree = ast.parse(source)
    fdef = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == FUNCTION_NAME),
        None,
    )
    if fdef is None:
        raise RebuildError(f"no {FUNCTION_NAME} in topk.py")
    # The main HIP branch, as the classifier reads it.
    hips = hip_branches(fdef)
    if not hips:
        raise RebuildError("the installed function has no `_is_hip` branch: nothing to move")
    hip = hips[0]
    pvars = predicate_vars(fdef)
    guards = [
        s
        for s in hip.body
        if isinstance(s, ast.If)
        and refs_predicate(s.test, pvars)
        and _calls(s, "topk_ids_logical_to_physical")
    ]
    masks = [
        i
        for i, s in enumerate(hip.body)
        if s not in guards and _calls(s, "_mask_topk_ids_padded_region")
    ]
    if not masks:
        if any(_calls(g, "_mask_topk_ids_padded_region") for g in guards):
            raise RebuildError(
                "the installed HIP branch already fills padded ids only under the EPLB guard"
            )
        raise RebuildError("the installed HIP branch never fills padded ids: no mask to move")
    if not guards:
        raise RebuildError(
            "the installed HIP branch has no EPLB-guarded remap to move the mask under"
        )
    guard = guards[0]
    stmts = [hip.body[i] for i in masks]
    for i in reversed(masks):
        del hip.body[i]
    guard.body[:0] = stmts
    return ast.unparse(fdef) + "\n"


def rebuild_function(mod: ModuleType) -> tuple[Callable, str]:
    """Compile :func:`rebuild_source` of the installed topk.py in the module's globals.

    The function is defined in a separate namespace (the module keeps its own), its
    globals are the live module's, and its source is registered in ``linecache`` under
    a ``<...>`` name so ``inspect.getsource`` (which the plugin uses to classify the
    running function) reads the rebuilt text."""
    text = inspect.getsource(mod)
    new_src = rebuild_source(text)
    filename = f"<sglang-amd-moe check: {TOPK_MODULE}.{FUNCTION_NAME} rebuilt as {REBUILT}>"
    code = compile(
        new_src, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True
    )
    ns: dict[str, Any] = {}
    exec(code, mod.__dict__, ns)  # noqa: S102 - a transform of the installed function
    linecache.cache[filename] = (len(new_src), None, new_src.splitlines(True), filename)
    return ns[FUNCTION_NAME], new_src

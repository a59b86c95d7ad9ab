"""What the audit reads off ``aiter/fused_moe.py`` beyond the sort's form: the entry the
guard would wrap. The running guard asks the same question of the live function
(:func:`sglang_amd_moe.runtime.aiter.forms.guard_entry_problem`); the audit asks it of the
file, since aiter cannot be imported without ROCm."""

from __future__ import annotations

import ast

from sglang_amd_moe.runtime.aiter.forms import (
    GUARD_ENTRIES,
    guard_entry_problem,
    param_names,
    positional_params,
)


def guard_entry(source: str) -> tuple[str, str]:
    """(the entry the guard would wrap, why it cannot: "" when it can) in ``source``."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return GUARD_ENTRIES[-1], f"cannot be read: fused_moe.py does not parse ({exc.msg})"
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    entry = next((e for e in GUARD_ENTRIES if e in funcs), GUARD_ENTRIES[-1])
    if entry not in funcs:
        return entry, "is missing"
    return entry, guard_entry_problem(positional_params(funcs[entry]), param_names(funcs[entry]))

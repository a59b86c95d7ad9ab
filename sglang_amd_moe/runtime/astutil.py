"""AST helpers shared by the form classifiers (``sglang_forms``, ``aiter_forms``) and the
check's rebuild of SGLang's function: standard library only, nothing imported."""

from __future__ import annotations

import ast


def call_name(call: ast.Call) -> str:
    """The called name: ``f`` for ``f(...)`` and ``m.f(...)``, "" otherwise."""
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return ""


def param_names(func: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    """Parameter names in order: positional-only, positional-or-keyword, keyword-only."""
    a = func.args
    return tuple(x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs])

"""Classify aiter's MXFP4 aux sort path by the shape of ``aiter/fused_moe.py``.

aiter's a4w4 (MXFP4) inline-sort MoE path sorts with ``aiter.mxfp4_moe_sort`` through
``_moe_sorting_impl`` -> ``_adaptive_moe_sort``. Whether it honours ``num_local_tokens``
differs between aiter trees, and aiter cannot be imported without ROCm, so the plugin and
the audit decide from the source's AST (never a version string). The forms (public names):

``count-dropped``: the adaptive branch, or a caller above it (aiter main's
``_fused_moe_impl``, ``FormReport.count_dropping_callers``), drops the count.
``count-rejected``: ``_mxfp4_inline_sort_unsupported`` rejects calls for carrying a
count (the tree aiter PR 7083 was written against). ``count-honored``: the count is
threaded to the sort (PR 7083's fix). ``absent``: no MXFP4 aux sort. ``unknown``:
anything else, including a recognised path the hook cannot wrap exactly.

Besides the form, :func:`analyze_source` reports what the hook needs to wrap exactly.
Standard library only.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass, field

FORMS: tuple[str, ...] = ("count-dropped", "count-rejected", "count-honored", "absent", "unknown")

#: Form -> the one-line action the plugin takes for it (printed by the audit too).
ACTIONS: dict[str, str] = {
    "count-dropped": (
        "hooked: adaptive-branch calls of _moe_sorting_impl that carry num_local_tokens go to "
        "sglang_amd_moe.kernels.adaptive_moe_sort with the count; all other calls unchanged"
    ),
    "count-rejected": (
        "hooked: _mxfp4_inline_sort_unsupported stops rejecting calls only for carrying "
        "num_local_tokens, and the sort they reach honours the count (this package's kernel)"
    ),
    "count-honored": "not hooked: aiter's MXFP4 aux sort already honours num_local_tokens",
    "absent": "not hooked: this aiter has no MXFP4 aux sort",
    "unknown": "not hooked: unrecognised MXFP4 aux sort path (WARNING with the source hash)",
}

SORT_IMPL = "_moe_sorting_impl"
ADAPTIVE = "_adaptive_moe_sort"
INLINE_UNSUPPORTED = "_mxfp4_inline_sort_unsupported"
AUX_KERNEL = "mxfp4_moe_sort"
COUNT = "num_local_tokens"
PUBLIC_SORT = "moe_sorting"
OUR_ADAPTIVE = "adaptive_moe_sort"

#: Parameters of ``_moe_sorting_impl`` the hook reads by name (the rest pass through).
IMPL_PARAMS_READ: tuple[str, ...] = tuple(
    "topk_ids topk_weights num_experts model_dim moebuf_dtype block_size expert_mask "
    "num_local_tokens accumulate output_aux".split()
)
#: ``_adaptive_moe_sort``'s signature as the hook replaces it: positional, then keyword-only.
ADAPTIVE_POSITIONAL: tuple[str, ...] = tuple(
    "topk_ids topk_weights num_experts topk block_size model_dim".split()
)
ADAPTIVE_KWONLY: tuple[str, ...] = ("atomic", "emit_aux", "moebuf_dtype")
# How _moe_sorting_impl calls _adaptive_moe_sort in the known trees: the positional
# arguments are named as ADAPTIVE_POSITIONAL; keyword -> the value expression (as source).
_ADAPTIVE_CALL_KEYWORDS = {
    "atomic": "accumulate",
    "emit_aux": "True",
    "moebuf_dtype": "moebuf_dtype",
}
# Position of num_local_tokens among moe_sorting's positional parameters (upstream order:
# topk_ids, topk_weights, num_experts, model_dim, moebuf_dtype, block_size, expert_mask,
# num_local_tokens, ...); used to tell whether a caller passes the count positionally.
_MOE_SORTING_COUNT_INDEX = 7


@dataclass(frozen=True)
class FormReport:
    """What the classifier read off ``aiter/fused_moe.py`` (details for the hook/audit)."""

    form: str
    #: Why this form (one line; shown by the audit and in warnings).
    reason: str
    #: sha256 of the relevant function segments joined in file order ("" when none).
    source_sha256: str = ""
    #: Parameters of ``_moe_sorting_impl`` in order (empty when absent).
    impl_params: tuple[str, ...] = field(default_factory=tuple)
    #: Name of the module-level backend variable in the adaptive branch's condition.
    backend_var: str = ""
    #: Backends (lower-case) that the adaptive branch excludes, e.g. ("opus", "ck").
    excluded_backends: tuple[str, ...] = field(default_factory=tuple)
    #: The adaptive branch's condition as source (pure: names, constants, arithmetic,
    #: comparisons); the hook evaluates it over the bound call to decide exactly as
    #: upstream does. Names: the function's parameters, ``M``, ``topk``, ``backend_var``.
    branch_test: str = ""
    #: ``_adaptive_moe_sort`` is called with the count (positionally or by keyword).
    impl_passes_count: bool = False
    #: ``_adaptive_moe_sort`` passes the count on to ``mxfp4_moe_sort``.
    adaptive_passes_count: bool = False
    #: Functions that call ``moe_sorting(..., output_aux=True)`` without the count even
    #: though they have one (aiter main's ``_fused_moe_impl`` does): the hook threads it.
    count_dropping_callers: tuple[str, ...] = field(default_factory=tuple)
    #: Those of them that rebind ``num_local_tokens``: their frame does not hold the
    #: count they were given, so the hook never reads it there.
    rebinding_callers: tuple[str, ...] = field(default_factory=tuple)
    #: Parameters of ``_mxfp4_inline_sort_unsupported`` (empty when absent).
    unsupported_params: tuple[str, ...] = field(default_factory=tuple)
    #: ``_mxfp4_inline_sort_unsupported`` rejects calls because they carry a count.
    rejects_count: bool = False


def classify_source(source: str) -> str:
    """Return the form name of the MXFP4 aux sort path in ``source`` (text of fused_moe.py)."""
    return analyze_source(source).form


def analyze_source(source: str) -> FormReport:
    """Classify ``source`` (text of ``aiter/fused_moe.py``) and say why."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return FormReport("unknown", f"fused_moe.py does not parse: {exc.msg} (line {exc.lineno})")
    funcs: dict[str, ast.FunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name not in funcs:
            funcs[node.name] = node
    relevant = [funcs[n] for n in (SORT_IMPL, ADAPTIVE, INLINE_UNSUPPORTED) if n in funcs]
    relevant.sort(key=lambda f: f.lineno)
    sha = (
        hashlib.sha256(
            "\n".join(ast.get_source_segment(source, f) or "" for f in relevant).encode()
        ).hexdigest()
        if relevant
        else ""
    )
    impl = funcs.get(SORT_IMPL)
    adaptive = funcs.get(ADAPTIVE)
    unsupported = funcs.get(INLINE_UNSUPPORTED)
    mentions_aux = any(
        call_name(n) == AUX_KERNEL for n in ast.walk(tree) if isinstance(n, ast.Call)
    )
    if adaptive is None and not mentions_aux:
        if unsupported is not None:
            return FormReport(
                "unknown", f"{INLINE_UNSUPPORTED} exists but no MXFP4 aux sort", source_sha256=sha
            )
        return FormReport("absent", f"no {ADAPTIVE} and no call to {AUX_KERNEL}", source_sha256=sha)
    if impl is None or adaptive is None:
        missing = SORT_IMPL if impl is None else ADAPTIVE
        return FormReport(
            "unknown", f"{AUX_KERNEL} is called but {missing} is missing", source_sha256=sha
        )

    impl_params = param_names(impl)
    common: dict = {"source_sha256": sha, "impl_params": impl_params}
    missing_params = [p for p in IMPL_PARAMS_READ if p not in impl_params]
    if missing_params or impl.args.vararg or impl.args.kwarg:
        return FormReport(
            "unknown",
            f"{SORT_IMPL} parameters differ from the known ones ({missing_params})",
            **common,
        )

    adaptive_ok, why = _adaptive_signature_ok(adaptive)
    if not adaptive_ok:
        return FormReport("unknown", why, **common)
    adaptive_passes = _adaptive_passes_count(adaptive)

    branch = _adaptive_branch(impl)
    if isinstance(branch, str):
        return FormReport("unknown", f"{SORT_IMPL}: {branch}", **common)
    backend_var, excluded, call, test_source = branch
    common.update(branch_test=test_source)
    common.update(
        backend_var=backend_var, excluded_backends=excluded, adaptive_passes_count=adaptive_passes
    )
    call_ok, impl_passes, why = _adaptive_call_shape(call)
    common["impl_passes_count"] = impl_passes
    if not call_ok:
        return FormReport("unknown", why, **common)
    dropping = _count_dropping_callers(tree)
    common["count_dropping_callers"] = tuple(f.name for f in dropping)
    common["rebinding_callers"] = tuple(f.name for f in dropping if COUNT in _bound(f.body))

    if unsupported is not None:
        rejects, why = _rejects_count(unsupported)
        common.update(unsupported_params=param_names(unsupported), rejects_count=rejects)
        if rejects:
            return FormReport(
                "count-rejected", f"{INLINE_UNSUPPORTED} rejects calls that carry {COUNT}", **common
            )
        if why:
            return FormReport("unknown", why, **common)
    if impl_passes and adaptive_passes and not common["count_dropping_callers"]:
        return FormReport(
            "count-honored", f"{SORT_IMPL} -> {ADAPTIVE} -> {AUX_KERNEL} pass {COUNT}", **common
        )
    if impl_passes != adaptive_passes:
        where = ADAPTIVE if impl_passes else SORT_IMPL
        return FormReport(
            "unknown", f"{COUNT} is threaded only part way (not by {where})", **common
        )
    if impl_passes and adaptive_passes:
        callers = ", ".join(common["count_dropping_callers"])
        why = f"{callers} call {PUBLIC_SORT}(output_aux=True) without {COUNT}"
    else:
        why = f"{SORT_IMPL} calls {ADAPTIVE} for output_aux without {COUNT}"
    return FormReport("count-dropped", why, **common)


# --- helpers -------------------------------------------------------------------------


def call_name(call: ast.Call) -> str:
    """The called name: ``f`` for ``f(...)`` and ``m.f(...)``, "" otherwise."""
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def param_names(func: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    """Parameter names in order: positional-only, positional-or-keyword, keyword-only."""
    a = func.args
    return tuple(x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs])


def _passes(call: ast.Call, name: str, index: int | None = None) -> bool:
    """Does ``call`` pass the variable ``name`` (by keyword, or positionally at ``index``)?"""
    if any(kw.arg == name for kw in call.keywords):
        return True
    if index is not None and len(call.args) > index:
        return True
    return any(isinstance(a, ast.Name) and a.id == name for a in call.args)


def _adaptive_signature_ok(func: ast.FunctionDef) -> tuple[bool, str]:
    a = func.args
    positional = tuple(x.arg for x in [*a.posonlyargs, *a.args])
    kwonly = tuple(x.arg for x in a.kwonlyargs)
    if positional != ADAPTIVE_POSITIONAL:
        return (
            False,
            f"{ADAPTIVE} positional parameters {positional} differ from {ADAPTIVE_POSITIONAL}",
        )
    if [k for k in kwonly if k != COUNT] != list(ADAPTIVE_KWONLY) or a.vararg or a.kwarg:
        return False, f"{ADAPTIVE} keyword-only parameters {kwonly} differ from {ADAPTIVE_KWONLY}"
    return True, ""


def _adaptive_passes_count(func: ast.FunctionDef) -> bool:
    """Does ``_adaptive_moe_sort`` hand the count to a sort that honours it: aiter's
    ``mxfp4_moe_sort`` (aiter PR 7083) or this package's ``adaptive_moe_sort`` (the
    ``patches/aiter-count-dropped.diff`` route)?"""
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and call_name(node) in (AUX_KERNEL, OUR_ADAPTIVE):
            if _passes(node, COUNT):
                return True
    return False


# Names, constants, arithmetic, comparisons and boolean logic: nothing that calls code.
_PURE_NODES = tuple(
    getattr(ast, n)
    for n in (
        "Expression BoolOp And Or UnaryOp Not USub BinOp Add Sub Mult FloorDiv Mod Compare "
        "Eq NotEq Lt LtE Gt GtE In NotIn Is IsNot Name Load Constant Tuple List Set"
    ).split()
)


def _is_pure(expr: ast.expr, allowed: set[str]) -> bool:
    """Only names in ``allowed``, constants, arithmetic, comparisons and boolean logic:
    something the hook can evaluate itself, with no calls and no attribute access."""
    for node in ast.walk(expr):
        if not isinstance(node, _PURE_NODES):
            return False
        if isinstance(node, ast.Name) and node.id not in allowed:
            return False
    return True


def _bound(stmts: list[ast.stmt]) -> list[str]:
    """Every name ``stmts`` bind (assign, delete, import, def, ``except ... as``), repeated
    as often as bound; nested scopes included, which errs on the side of refusing."""
    out: list[str] = []
    for node in ast.walk(ast.Module(body=stmts, type_ignores=[])):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            out.append(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out += [(a.asname or a.name).split(".")[0] for a in node.names]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.append(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.append(node.name)
    return out


def _adaptive_branch(
    impl: ast.FunctionDef,
) -> tuple[str, tuple[str, ...], ast.Call, str] | str:
    """Find ``if output_aux and VAR not in (...) [and PURE]: return _adaptive_moe_sort(...)``.

    Returns (backend variable, excluded backends, the call, the test as source), or why
    not. The hook evaluates the test itself, so it must mean at the call what it means in
    upstream's function: a top-level statement, after statements that neither return nor
    raise; reading only parameters not rebound before it, ``M``/``topk`` bound once before
    it by ``M, topk = topk_ids.shape``, and a module-level backend variable (a name the
    function binds is local). Extra conjuncts (aiter PR 7083's base adds a size crossover
    such as ``3 * M * topk < 4 * num_experts``) must be pure over those names.
    """
    why = f"no `if output_aux and BACKEND not in (...): return {ADAPTIVE}(...)` branch"
    for i, node in enumerate(impl.body):
        if not isinstance(node, ast.If) or not node.body:
            continue
        ret = node.body[-1].value if isinstance(node.body[-1], ast.Return) else None
        if not (isinstance(ret, ast.Call) and call_name(ret) == ADAPTIVE):
            continue
        test = node.test
        if len(node.body) != 1:
            # Extra statements before the return would run upstream but not in the hook.
            return "the adaptive branch runs more than its return"
        if not (isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And)):
            return why
        has_aux = any(isinstance(v, ast.Name) and v.id == "output_aux" for v in test.values)
        backend = [
            v
            for v in test.values
            if isinstance(v, ast.Compare)
            and isinstance(v.left, ast.Name)
            and len(v.ops) == 1
            and isinstance(v.ops[0], ast.NotIn)
            and isinstance(v.comparators[0], ast.Tuple | ast.List | ast.Set)
            and all(
                isinstance(c, ast.Constant) and isinstance(c.value, str)
                for c in v.comparators[0].elts  # type: ignore[attr-defined]
            )
        ]
        if not has_aux or len(backend) != 1:
            return why
        var = backend[0].left.id  # type: ignore[attr-defined]
        before = impl.body[:i]
        if any(isinstance(n, ast.Return | ast.Raise) for n in ast.walk(ast.Module(before, []))):
            return "a statement before the adaptive branch can return or raise"
        bound = _bound(before)
        params = set(param_names(impl))
        allowed = {p for p in params if p not in bound}
        unpack = any(
            isinstance(s, ast.Assign) and ast.unparse(s) == "M, topk = topk_ids.shape"
            for s in before
        )
        if unpack and bound.count("M") == bound.count("topk") == 1:
            allowed |= {"M", "topk"}
        if var not in params and var not in _bound(impl.body):
            allowed.add(var)
        read = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
        if not _is_pure(test, read):
            return "the adaptive branch's test is not pure (a call or an attribute)"
        if read - allowed:
            names = ", ".join(sorted(read - allowed))
            return f"the adaptive branch reads {names}, bound in {SORT_IMPL} before it or locally"
        excluded = tuple(
            str(c.value).lower()  # type: ignore[attr-defined]
            for c in backend[0].comparators[0].elts  # type: ignore[attr-defined]
        )
        return var, excluded, ret, ast.unparse(test)
    return why


def _adaptive_call_shape(call: ast.Call) -> tuple[bool, bool, str]:
    """Check the adaptive call's arguments: (matches the known shape, passes count, why not)."""
    names = [a.id if isinstance(a, ast.Name) else None for a in call.args]
    if tuple(names) != ADAPTIVE_POSITIONAL:
        return False, False, f"{ADAPTIVE} is called with positional arguments {names}"
    passes = False
    seen: dict[str, str] = {}
    for kw in call.keywords:
        if kw.arg is None:
            return False, False, f"{ADAPTIVE} is called with **kwargs"
        if kw.arg == COUNT:
            passes = True
            continue
        seen[kw.arg] = ast.unparse(kw.value)
    if seen != _ADAPTIVE_CALL_KEYWORDS:
        return (
            False,
            passes,
            f"{ADAPTIVE} is called with keywords {seen}, expected {_ADAPTIVE_CALL_KEYWORDS}",
        )
    return True, passes, ""


def _count_dropping_callers(tree: ast.Module) -> list[ast.FunctionDef]:
    """Top-level functions that have a ``num_local_tokens`` parameter but call
    ``moe_sorting(..., output_aux=True)`` without passing it (aiter main's
    ``_fused_moe_impl``)."""
    out: list[ast.FunctionDef] = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or COUNT not in param_names(node):
            continue
        for sub in ast.walk(node):
            if not (isinstance(sub, ast.Call) and call_name(sub) == PUBLIC_SORT):
                continue
            aux = any(
                kw.arg == "output_aux"
                and isinstance(kw.value, ast.Constant)
                and kw.value.value is True
                for kw in sub.keywords
            )
            if aux and not _passes(sub, COUNT, _MOE_SORTING_COUNT_INDEX):
                out.append(node)
                break
    return out


def _rejects_count(func: ast.FunctionDef) -> tuple[bool, str]:
    """Does ``_mxfp4_inline_sort_unsupported`` return a reason because of the count?

    The hook re-asks it with the count cleared, so it must take ``num_local_tokens`` as a
    parameter and report "unsupported" by returning a reason (a string) or a true value,
    and "supported" by returning None/False/"". Returns (rejects, why-unknown).
    """
    if COUNT not in param_names(func):
        mentions = any(
            (isinstance(n, ast.Name) and n.id == COUNT)
            or (isinstance(n, ast.Attribute) and n.attr == COUNT)
            for n in ast.walk(func)
        )
        if mentions:
            return False, f"{INLINE_UNSUPPORTED} reads {COUNT} but not as a parameter"
        return False, ""
    for node in ast.walk(func):
        if not isinstance(node, ast.If):
            continue
        if not any(isinstance(n, ast.Name) and n.id == COUNT for n in ast.walk(node.test)):
            continue
        for stmt in ast.walk(ast.Module(body=node.body, type_ignores=[])):
            if isinstance(stmt, ast.Return) and _is_reason(stmt.value):
                return True, ""
    return False, ""


def _is_reason(value: ast.expr | None) -> bool:
    if value is None:
        return False
    if isinstance(value, ast.Constant):
        return bool(value.value) and isinstance(value.value, str | bool)
    return isinstance(value, ast.JoinedStr | ast.BinOp)

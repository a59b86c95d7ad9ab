"""Classify aiter's MXFP4 aux sort path (``_moe_sorting_impl`` -> ``_adaptive_moe_sort`` ->
``aiter.mxfp4_moe_sort``) by the AST of ``aiter/fused_moe.py``: aiter cannot be imported
without ROCm, and a version string says nothing.

``count-dropped``: the adaptive branch, or an aiter caller above it (aiter main's
``_fused_moe_impl``), drops ``num_local_tokens``. ``count-rejected``:
``_mxfp4_inline_sort_unsupported`` rejects calls for carrying one. ``count-honored``: the
count reaches the sort. ``absent``: no MXFP4 aux sort. ``unknown``: anything else, including
a path the hook cannot wrap exactly.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass

from sglang_amd_moe.runtime.target import call_name

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

#: Parameters of ``_moe_sorting_impl`` the hook reads by name (the rest pass through).
IMPL_PARAMS_READ = tuple(
    "topk_ids topk_weights num_experts model_dim moebuf_dtype block_size expert_mask "
    "num_local_tokens accumulate output_aux".split()
)
#: ``_adaptive_moe_sort``'s signature as the hook replaces it: positional, then keyword-only.
ADAPTIVE_POSITIONAL = tuple("topk_ids topk_weights num_experts topk block_size model_dim".split())
ADAPTIVE_KWONLY = ("atomic", "emit_aux", "moebuf_dtype")
# How _moe_sorting_impl calls _adaptive_moe_sort: keyword -> its value (as source).
_ADAPTIVE_CALL_KEYWORDS = {
    "atomic": "accumulate",
    "emit_aux": "True",
    "moebuf_dtype": "moebuf_dtype",
}
_MOE_SORTING_COUNT_INDEX = 7  # of num_local_tokens among moe_sorting's positional parameters
# Names, constants, arithmetic, comparisons and boolean logic: nothing that calls code.
_PURE_NODES = tuple(
    getattr(ast, n)
    for n in """Expression BoolOp And Or UnaryOp Not USub
    BinOp Add Sub Mult FloorDiv Mod Compare Eq NotEq Lt LtE Gt GtE In NotIn Is IsNot Name Load
    Constant Tuple List Set""".split()
)


@dataclass(frozen=True)
class FormReport:
    """What the classifier read off ``aiter/fused_moe.py`` (for the hook and the audit)."""

    form: str
    reason: str  # one line, shown by the audit and in warnings
    source_sha256: str = ""  # of the sort functions' source, in file order
    impl_params: tuple[str, ...] = ()  # of _moe_sorting_impl
    backend_var: str = ""  # the module variable the adaptive branch tests
    #: The adaptive branch's test, pure over the parameters, ``M``, ``topk`` and
    #: ``backend_var``: the hook evaluates it to decide as upstream does.
    branch_test: str = ""
    impl_passes_count: bool = False  # _moe_sorting_impl -> _adaptive_moe_sort
    adaptive_passes_count: bool = False  # _adaptive_moe_sort -> the sort kernel
    #: Functions that call ``moe_sorting(..., output_aux=True)`` without the count they
    #: were given (aiter main's ``_fused_moe_impl``): the hook reads it from their frame,
    count_dropping_callers: tuple[str, ...] = ()
    #: except in those that rebind ``num_local_tokens``: it is not the count there.
    rebinding_callers: tuple[str, ...] = ()


def analyze_source(source: str) -> FormReport:
    """Classify ``source`` (text of ``aiter/fused_moe.py``) and say why."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return FormReport("unknown", f"fused_moe.py does not parse: {exc.msg} (line {exc.lineno})")
    funcs: dict[str, ast.FunctionDef] = {}
    for node in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        funcs.setdefault(node.name, node)
    relevant = [funcs[n] for n in (SORT_IMPL, ADAPTIVE, INLINE_UNSUPPORTED) if n in funcs]
    relevant.sort(key=lambda f: f.lineno)
    text = "\n".join(ast.get_source_segment(source, f) or "" for f in relevant)
    common: dict = {"source_sha256": hashlib.sha256(text.encode()).hexdigest() if relevant else ""}
    impl, adaptive = funcs.get(SORT_IMPL), funcs.get(ADAPTIVE)
    unsupported = funcs.get(INLINE_UNSUPPORTED)

    def unknown(why: str) -> FormReport:
        return FormReport("unknown", why, **common)

    if adaptive is None and not any(call_name(n) == AUX_KERNEL for n in _calls(tree)):
        if unsupported is not None:
            return unknown(f"{INLINE_UNSUPPORTED} exists but no MXFP4 aux sort")
        return FormReport("absent", f"no {ADAPTIVE} and no call to {AUX_KERNEL}", **common)
    if impl is None or adaptive is None:
        gone = SORT_IMPL if impl is None else ADAPTIVE
        return unknown(f"{AUX_KERNEL} is called but {gone} is missing")
    common["impl_params"] = param_names(impl)
    missing = [p for p in IMPL_PARAMS_READ if p not in common["impl_params"]]
    if missing or impl.args.vararg or impl.args.kwarg:
        return unknown(f"{SORT_IMPL} parameters differ from the known ones ({missing})")
    a = adaptive.args
    positional, kwonly = positional_params(adaptive), tuple(x.arg for x in a.kwonlyargs)
    if positional != ADAPTIVE_POSITIONAL:
        why = f"positional parameters {positional} differ from {ADAPTIVE_POSITIONAL}"
        return unknown(f"{ADAPTIVE} {why}")
    if [k for k in kwonly if k != COUNT] != list(ADAPTIVE_KWONLY) or a.vararg or a.kwarg:
        return unknown(f"{ADAPTIVE} keyword-only parameters {kwonly} differ from {ADAPTIVE_KWONLY}")
    # Our adaptive_moe_sort counts too: the patches/aiter-count-dropped.diff route.
    sorts = [n for n in _calls(adaptive) if call_name(n) in (AUX_KERNEL, "adaptive_moe_sort")]
    adaptive_passes = any(_passes(n, COUNT) for n in sorts)
    branch = _adaptive_branch(impl)
    if isinstance(branch, str):
        return unknown(f"{SORT_IMPL}: {branch}")
    common["backend_var"], call, common["branch_test"] = branch
    common["adaptive_passes_count"] = adaptive_passes
    names = [x.id if isinstance(x, ast.Name) else None for x in call.args]
    kws = {kw.arg: ast.unparse(kw.value) for kw in call.keywords}
    impl_passes = common["impl_passes_count"] = COUNT in kws
    if tuple(names) != ADAPTIVE_POSITIONAL:
        return unknown(f"{ADAPTIVE} is called with positional arguments {names}")
    kws.pop(COUNT, None)
    if kws != _ADAPTIVE_CALL_KEYWORDS:
        return unknown(
            f"{ADAPTIVE} is called with keywords {kws}, expected {_ADAPTIVE_CALL_KEYWORDS}"
        )
    dropping = _count_dropping_callers(tree)
    common["count_dropping_callers"] = tuple(f.name for f in dropping)
    common["rebinding_callers"] = tuple(f.name for f in dropping if COUNT in _bound(f.body))
    if unsupported is not None:
        if COUNT not in param_names(unsupported):
            read = {getattr(n, "id", None) for n in ast.walk(unsupported)}
            if COUNT in read | {getattr(n, "attr", None) for n in ast.walk(unsupported)}:
                return unknown(f"{INLINE_UNSUPPORTED} reads {COUNT} but not as a parameter")
        elif _rejects_count(unsupported):
            why = f"{INLINE_UNSUPPORTED} rejects calls that carry {COUNT}"
            return FormReport("count-rejected", why, **common)
    if impl_passes and adaptive_passes and not dropping:
        why = f"{SORT_IMPL} -> {ADAPTIVE} -> {AUX_KERNEL} pass {COUNT}"
        return FormReport("count-honored", why, **common)
    if impl_passes != adaptive_passes:
        gone = ADAPTIVE if impl_passes else SORT_IMPL
        return unknown(f"{COUNT} is threaded only part way (not by {gone})")
    if impl_passes:
        callers = ", ".join(common["count_dropping_callers"])
        why = f"{callers} call {PUBLIC_SORT}(output_aux=True) without {COUNT}"
    else:
        why = f"{SORT_IMPL} calls {ADAPTIVE} for output_aux without {COUNT}"
    return FormReport("count-dropped", why, **common)


#: The guard wraps the first of these that ``aiter/fused_moe.py`` defines.
GUARD_ENTRIES = ("_fused_moe_impl", "fused_moe")
#: The leading positional parameters of an entry the guard recognises (aiter's order).
GUARD_POSITIONAL = ("hidden_states", "w1", "w2", "topk_weight", "topk_ids", "expert_mask")


def guard_entry_problem(positional: tuple[str, ...], names: tuple[str, ...]) -> str:
    """Why the guard cannot wrap an entry with these (positional, all) parameters ("" when
    it can): the hook asks about the running function, the audit about the file."""
    if positional[: len(GUARD_POSITIONAL)] != GUARD_POSITIONAL:
        return f"takes {positional[: len(GUARD_POSITIONAL)]} first, not {GUARD_POSITIONAL}"
    if COUNT not in names:
        return f"has no {COUNT} parameter"
    shared = [n for n in names if n.startswith("shared_")]  # an id past w1's experts
    return f"takes a fused shared expert ({', '.join(shared)})" if shared else ""


def positional_params(func: ast.FunctionDef) -> tuple[str, ...]:
    """Positional parameter names in order."""
    return tuple(x.arg for x in [*func.args.posonlyargs, *func.args.args])


def param_names(func: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    """Parameter names in order: positional-only, positional-or-keyword, keyword-only."""
    return (*positional_params(func), *(x.arg for x in func.args.kwonlyargs))


def _calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def _passes(call: ast.Call, name: str, index: int | None = None) -> bool:
    """Does ``call`` pass the variable ``name`` (by keyword, or positionally at ``index``)?"""
    by_position = index is not None and len(call.args) > index
    if by_position or any(kw.arg == name for kw in call.keywords):
        return True
    return any(isinstance(a, ast.Name) and a.id == name for a in call.args)


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


def _adaptive_branch(impl: ast.FunctionDef) -> tuple[str, ast.Call, str] | str:
    """``if output_aux and VAR not in (...) [and PURE]: return _adaptive_moe_sort(...)`` as
    (backend variable, the call, the test as source), or why not.

    The hook evaluates the test itself, so it must mean at the call what it means upstream:
    a top-level statement after statements that neither return nor raise, reading only
    parameters not rebound before it, ``M``/``topk`` bound once before it by ``M, topk =
    topk_ids.shape``, and a module-level backend variable (one the function binds is
    local). Extra conjuncts (aiter PR 7083's base adds ``3 * M * topk < 4 * num_experts``)
    must be pure over those names.
    """
    why = f"no `if output_aux and BACKEND not in (...): return {ADAPTIVE}(...)` branch"
    for i, node in enumerate(impl.body):
        ret = node.body[-1] if isinstance(node, ast.If) and node.body else None
        call = ret.value if isinstance(ret, ast.Return) else None
        if not (isinstance(call, ast.Call) and call_name(call) == ADAPTIVE):
            continue
        if len(node.body) != 1:  # it would run upstream but not in the hook
            return "the adaptive branch runs more than its return"
        test = node.test
        if not (isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And)):
            return why
        backend = [v for v in test.values if _not_in_strings(v)]
        if len(backend) != 1 or "output_aux" not in {getattr(v, "id", None) for v in test.values}:
            return why
        var = backend[0].left.id  # type: ignore[attr-defined]
        before = impl.body[:i]
        if any(isinstance(n, ast.Return | ast.Raise) for n in ast.walk(ast.Module(before, []))):
            return "a statement before the adaptive branch can return or raise"
        bound, params = _bound(before), set(param_names(impl))
        allowed = {p for p in params if p not in bound}
        if "M, topk = topk_ids.shape" in (ast.unparse(s) for s in before):
            allowed |= {n for n in ("M", "topk") if bound.count(n) == 1}
        if var not in params and var not in _bound(impl.body):
            allowed.add(var)
        read = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
        if any(not isinstance(n, _PURE_NODES) for n in ast.walk(test)):
            return "the adaptive branch's test is not pure (a call or an attribute)"
        if read - allowed:
            names = ", ".join(sorted(read - allowed))
            return f"the adaptive branch reads {names}, bound in {SORT_IMPL} before it or locally"
        return var, call, ast.unparse(test)
    return why


def _not_in_strings(v: ast.AST) -> bool:
    """``NAME not in ("a", "b")`` (a tuple, list or set of strings)."""
    if not (isinstance(v, ast.Compare) and isinstance(v.left, ast.Name) and len(v.ops) == 1):
        return False
    seq = v.comparators[0]
    if not (isinstance(v.ops[0], ast.NotIn) and isinstance(seq, ast.Tuple | ast.List | ast.Set)):
        return False
    return all(isinstance(c, ast.Constant) and isinstance(c.value, str) for c in seq.elts)


def _count_dropping_callers(tree: ast.Module) -> list[ast.FunctionDef]:
    """Top-level functions with a ``num_local_tokens`` parameter that call
    ``moe_sorting(..., output_aux=True)`` without passing it."""

    def drops(c: ast.Call) -> bool:
        aux = [getattr(k.value, "value", None) for k in c.keywords if k.arg == "output_aux"]
        sorts = call_name(c) == PUBLIC_SORT and any(v is True for v in aux)
        return sorts and not _passes(c, COUNT, _MOE_SORTING_COUNT_INDEX)

    return [
        f
        for f in tree.body
        if isinstance(f, ast.FunctionDef) and COUNT in param_names(f) and any(map(drops, _calls(f)))
    ]


def _rejects_count(func: ast.FunctionDef) -> bool:
    """Does ``_mxfp4_inline_sort_unsupported`` return a reason (a non-empty string or
    True, which the hook can re-ask without the count) under an ``if`` on the count?"""
    ifs = [n for n in ast.walk(func) if isinstance(n, ast.If)]
    for node in (n for n in ifs if COUNT in {getattr(x, "id", None) for x in ast.walk(n.test)}):
        for ret in ast.walk(ast.Module(body=node.body, type_ignores=[])):
            value = getattr(ret, "value", None) if isinstance(ret, ast.Return) else None
            const = value.value if isinstance(value, ast.Constant) else None
            if isinstance(value, ast.JoinedStr | ast.BinOp) or (
                const and isinstance(const, str | bool)
            ):
                return True
    return False

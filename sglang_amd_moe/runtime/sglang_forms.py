"""Classify SGLang's ``_post_process_topk_ids`` by the shape of its source.

SGLang releases differ in how the HIP branch of
``sglang.srt.layers.moe.topk._post_process_topk_ids`` treats padded CUDA-graph rows
(BRIEF section 1). The plugin must never patch blind, so it decides what to do from the
installed code itself (its AST), not from the version string. The same classifier is
used by the audit command, so the form names here are a public interface:

``absent``
    No ``_post_process_topk_ids`` in the module (SGLang 0.5.9 and earlier).
``no-hip-handling``
    The function has no HIP branch that touches padded rows: ids and weights of padded
    rows come out as the router left them, and nothing remaps on HIP (0.5.10-0.5.12).
``weights-only``
    The HIP branch zeroes padded rows' weights but leaves their ids (0.5.13).
``mask-under-eplb-guard``
    The HIP branch fills padded ids only inside the EPLB-remap guard, so without EPLB
    the garbage ids survive (upstream main between PRs 28188 and 28378).
``fixed``
    The HIP branch fills padded ids with 0 outside any EPLB guard and zeroes padded
    weights (0.5.14 and later).
``unknown``
    The function exists but matches none of the above: the plugin applies only its
    pre-mask guard and warns.

Only the standard library is used: the audit runs this on a source text without
importing SGLang or torch.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass, field

from sglang_amd_moe.runtime.astutil import call_name, param_names

FUNCTION_NAME = "_post_process_topk_ids"

FORMS: tuple[str, ...] = (
    "absent",
    "no-hip-handling",
    "weights-only",
    "mask-under-eplb-guard",
    "fixed",
    "unknown",
)

#: Form -> the one-line action the plugin takes for it (printed by the audit too).
ACTIONS: dict[str, str] = {
    "absent": "nothing to hook: no _post_process_topk_ids in this SGLang (WARNING logged)",
    "no-hip-handling": (
        "hooked (mask padded ids to 0 and zero their weights, gated EPLB remap, "
        "re-zero after a shared-expert append)"
    ),
    "weights-only": "hooked (mask padded ids to 0, gated EPLB remap)",
    "mask-under-eplb-guard": (
        "hooked (mask padded ids to 0 outside the EPLB guard; upstream keeps its gated remap)"
    ),
    "fixed": "not hooked: upstream already masks padded ids on HIP",
    "unknown": (
        "guard only (mask padded ids to 0 before upstream, no remap added; "
        "WARNING with the function's source hash)"
    ),
}

# Names upstream has used for the "a real expert-location map exists" predicate.
REMAP_PREDICATES: frozenset[str] = frozenset({"_eplb_remap_enabled", "is_expert_remapping_enabled"})
# Calls that fill padded rows' ids.
_ID_MASKERS: frozenset[str] = frozenset({"_mask_topk_ids_padded_region"})
# Calls that zero padded rows' weights.
_WEIGHT_ZEROERS: frozenset[str] = frozenset({"_zero_topk_weights_padded_region"})
_REMAP = "topk_ids_logical_to_physical"


@dataclass(frozen=True)
class FormReport:
    """What the classifier read off ``_post_process_topk_ids`` (details for the hook/audit)."""

    form: str
    #: Why this form (one line; shown by the audit and in warnings).
    reason: str
    #: sha256 of the function's source segment ("" when absent or unparsable).
    function_sha256: str = ""
    #: 1-based line of the ``def`` in the file (0 when absent).
    lineno: int = 0
    #: Parameter names in order (positional-or-keyword first, then keyword-only).
    params: tuple[str, ...] = field(default_factory=tuple)
    #: The HIP branch calls ``topk_ids_logical_to_physical`` (under the predicate or not).
    hip_remaps: bool = False
    #: Which remap predicate the module defines ("" when neither exists).
    remap_predicate: str = ""
    #: Padded weights are zeroed on HIP after any shared-expert append (a trailing
    #: ``if _is_hip: _zero_topk_weights_padded_region(...)`` after the main branch).
    tail_zeroes_weights: bool = False


def classify_source(source: str) -> str:
    """Return the form name of ``_post_process_topk_ids`` in ``source`` (text of topk.py)."""
    return analyze_source(source).form


def analyze_source(source: str) -> FormReport:
    """Classify ``source`` (text of ``sglang/srt/layers/moe/topk.py``) and say why."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return FormReport("unknown", f"topk.py does not parse: {exc.msg} (line {exc.lineno})")
    func = None
    predicate = ""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name == FUNCTION_NAME:
                func = node
            elif node.name in REMAP_PREDICATES and not predicate:
                predicate = node.name
    if func is None:
        return FormReport("absent", f"no top-level {FUNCTION_NAME} in topk.py", remap_predicate=predicate)
    segment = ast.get_source_segment(source, func) or ""
    sha = hashlib.sha256(segment.encode()).hexdigest()
    common = {"function_sha256": sha, "lineno": func.lineno, "params": param_names(func),
              "remap_predicate": predicate}
    return _classify_function(func, common)


def hip_branches(func: ast.AST) -> list[ast.If]:
    """The ``If`` nodes that require ``_is_hip``, in source order. The first is the main
    HIP branch (``elif _is_hip:`` after the CUDA branch); any later ones are tail passes
    after the shared-expert append."""
    hip_ifs = [n for n in ast.walk(func) if isinstance(n, ast.If) and _mentions_hip(n.test)]
    return sorted(hip_ifs, key=lambda n: (n.lineno, n.col_offset))


def _classify_function(func: ast.FunctionDef | ast.AsyncFunctionDef, common: dict) -> FormReport:
    hip_ifs = hip_branches(func)
    if not hip_ifs:
        return FormReport("no-hip-handling", "no `_is_hip` branch in the function", **common)
    pvars = predicate_vars(func)
    main, tail = hip_ifs[0], hip_ifs[1:]
    id_masks = list(_calls_in(main.body, _ID_MASKERS))
    zeroes_weights = any(True for _ in _calls_in(main.body, _WEIGHT_ZEROERS)) or any(
        any(True for _ in _calls_in(t.body, _WEIGHT_ZEROERS)) for t in tail
    )
    hip_remaps = any(True for _ in _calls_in(main.body, {_REMAP}))
    tail_zero = any(any(True for _ in _calls_in(t.body, _WEIGHT_ZEROERS)) for t in tail)
    common = {**common, "hip_remaps": hip_remaps, "tail_zeroes_weights": tail_zero}
    if not id_masks:
        if zeroes_weights:
            return FormReport(
                "weights-only", "HIP branch zeroes padded weights but never fills padded ids", **common
            )
        return FormReport(
            "no-hip-handling", "`_is_hip` branch neither fills padded ids nor zeroes weights", **common
        )
    guarded, unguarded, odd = [], [], []
    for call, ancestors in id_masks:
        fill = _fill_value(call)
        if fill != 0:
            odd.append(f"padded ids filled with {fill!r}, not 0, on HIP (line {call.lineno})")
            continue
        where = _guard_position(call, ancestors, pvars)
        if where == "body":
            guarded.append(call)
        elif where == "other":
            odd.append(f"padded-id fill conditioned on the remap predicate in an unusual way (line {call.lineno})")
        else:
            unguarded.append(call)
    if odd:
        return FormReport("unknown", "; ".join(odd), **common)
    if unguarded:
        if not zeroes_weights:
            return FormReport("unknown", "HIP fills padded ids with 0 but never zeroes their weights", **common)
        return FormReport("fixed", "HIP fills padded ids with 0 outside any EPLB guard and zeroes weights", **common)
    if guarded:
        return FormReport(
            "mask-under-eplb-guard",
            "HIP fills padded ids only inside the EPLB remap guard",
            **common,
        )
    return FormReport("unknown", "HIP branch does not match any known form", **common)


def _mentions_hip(test: ast.expr) -> bool:
    """True when ``test`` requires ``_is_hip`` to be true (``_is_hip``, ``_is_hip and ...``)."""
    if isinstance(test, ast.Name):
        return test.id == "_is_hip"
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_mentions_hip(v) for v in test.values)
    return False



def _calls_in(stmts: list[ast.stmt], names: set[str] | frozenset[str]):
    """Yield ``(call, ancestors)`` for calls to ``names`` under ``stmts`` (ancestors: If nodes
    with the branch, ``body`` or ``orelse``, the call sits in)."""

    def visit(node: ast.AST, ancestors: tuple):
        if isinstance(node, ast.Call) and call_name(node) in names:
            yield node, ancestors
        if isinstance(node, ast.If):
            yield from visit(node.test, ancestors)
            for s in node.body:
                yield from visit(s, (*ancestors, (node, "body")))
            for s in node.orelse:
                yield from visit(s, (*ancestors, (node, "orelse")))
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, ancestors)

    for s in stmts:
        yield from visit(s, ())


def predicate_vars(func: ast.AST) -> set[str]:
    """Names bound directly to a remap-predicate call
    (``eplb_remap_enabled = is_expert_remapping_enabled()``)."""
    out: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            if call_name(node.value) in REMAP_PREDICATES:
                out.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return out


def refs_predicate(test: ast.expr, pvars: set[str]) -> str:
    """``"pos"`` when ``test`` is the predicate (or ``pred() and ...``), ``"other"`` when it
    mentions it otherwise (negated, or-ed), ``""`` when it does not mention it."""

    def is_pred(e: ast.expr) -> bool:
        if isinstance(e, ast.Call):
            return call_name(e) in REMAP_PREDICATES
        return isinstance(e, ast.Name) and e.id in pvars

    if is_pred(test):
        return "pos"
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and any(is_pred(v) for v in test.values):
        return "pos"
    for n in ast.walk(test):
        if isinstance(n, ast.expr) and is_pred(n):
            return "other"
    return ""


def _guard_position(call: ast.Call, ancestors: tuple, pvars: set[str]) -> str:
    """``"body"``: the fill only runs when the remap predicate holds; ``"other"``: it is
    conditioned on the predicate some other way; ``""``: not conditioned on it."""
    for if_node, branch in ancestors:
        kind = refs_predicate(if_node.test, pvars)
        if kind == "pos" and branch == "body":
            return "body"
        if kind:
            return "other"
    return ""


def _fill_value(call: ast.Call) -> object:
    """The ``fill_value`` a ``_mask_topk_ids_padded_region`` call uses (upstream default -1)."""
    for kw in call.keywords:
        if kw.arg == "fill_value":
            return kw.value.value if isinstance(kw.value, ast.Constant) else ast.unparse(kw.value)
    if len(call.args) >= 3:
        a = call.args[2]
        return a.value if isinstance(a, ast.Constant) else ast.unparse(a)
    return -1

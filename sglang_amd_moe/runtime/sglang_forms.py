"""Classify SGLang's ``_post_process_topk_ids`` by reading its source.

SGLang releases differ in how the HIP branch of
``sglang.srt.layers.moe.topk._post_process_topk_ids`` treats padded CUDA-graph rows
(docs/compat.md has the table). The audit reads an image's ``topk.py`` without running
it, and the plugin reads the installed file before it decides whether importing SGLang
is worth it, so the form names here are a public interface:

``absent``
    No ``_post_process_topk_ids`` bound in the module (SGLang 0.5.9 and earlier).
``no-hip-handling``
    On HIP nothing touches padded rows: ids and weights come out as the router left
    them, and nothing remaps (0.5.10-0.5.12).
``weights-only``
    On HIP padded rows' weights are zeroed but their ids are left (0.5.13).
``mask-under-eplb-guard``
    On HIP padded ids are filled only when the EPLB remap runs, so without EPLB the
    garbage ids survive (upstream main between PRs 28188 and 28378).
``fixed``
    On every HIP path padded ids are filled with 0 before any remap, padded weights are
    zero at return, and the logical-to-physical remap runs exactly when a real
    expert-location map exists (0.5.14 and later).
``unknown``
    Anything the reader is not sure of. Never ``fixed`` or ``absent`` by guesswork.

How it reads the code: it finds what the module binds to the name (a ``def`` anywhere in
module-level ``if``/``try``/``with`` blocks, an alias, a class's static method, an
import), then walks the function body as a HIP process would run it: platform flags are
evaluated (``_is_hip`` and any module name bound to ``is_hip()`` are true; the CUDA,
NPU, XPU, CPU and MUSA flags false), every other condition may go either way, and a
condition met twice on one path takes the same value both times (conditions are kept as
formulas over their atoms, so ``x = a and not b; if x: ...`` is followed). Calls of
module-level helpers are followed into their bodies; upstream's padded-row kernels and
the remap are known by name. The EPLB predicate is recognised under upstream's names,
under any module function that reads the server's EPLB settings, inline, and through
local variables. The form is decided from every path that returns: a form holds only if
it holds on all of them.

Only the standard library is used.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import textwrap
from collections.abc import Callable, Iterable
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
        "decided by running it (the plugin probes the installed function on a CPU batch "
        "and hooks only what it sees wrong); WARNING with the function's source hash"
    ),
}

# Names upstream has used for the "a real expert-location map exists" predicate.
REMAP_PREDICATES: frozenset[str] = frozenset({"_eplb_remap_enabled", "is_expert_remapping_enabled"})
# Server settings that make the remap real; a function or expression reading one of them
# is the EPLB predicate, whatever its name.
EPLB_SETTINGS: frozenset[str] = frozenset(
    {"enable_eplb", "init_expert_location", "ep_num_redundant_experts"}
)
# Upstream's switches that are off unless a user turns them on for an experiment: the
# reader assumes their default (``SGLANG_MORI_NO_PAD_MASK`` skips the padded-weight
# zeroing on purpose; the ``SGLANG_AITER_MEGA_*`` trio selects a fused EPLB map-and-record).
DEFAULT_OFF_SWITCHES: frozenset[str] = frozenset(
    {
        "SGLANG_MORI_NO_PAD_MASK",
        "SGLANG_AITER_MEGA_EPLB_PREFILL_ONLY",
        "SGLANG_AITER_MEGA_EPLB_FUSED_MAP_RECORD",
        "SGLANG_AITER_MEGA_RANK_SYNC",
    }
)
_REMAP = "topk_ids_logical_to_physical"
_MASK = "_mask_topk_ids_padded_region"
_ZERO = "_zero_topk_weights_padded_region"
# Platform probes of ``sglang.srt.utils`` and the module flags conventionally bound to them.
_HIP_CALLS = frozenset({"is_hip", "is_cuda_alike"})
_NOT_HIP_CALLS = frozenset({"is_cuda", "is_npu", "is_xpu", "is_cpu", "is_musa", "is_hpu"})
_HIP_FLAGS = frozenset({"_is_hip"})
_NOT_HIP_FLAGS = frozenset({"_is_cuda", "_is_npu", "_is_xpu", "_is_cpu", "_is_musa", "_is_hpu"})
_EPLB = "EPLB"  # the one atom every spelling of the predicate maps to
_MAX_PATHS = 512
_MAX_ATOMS = 64
_MAX_INLINE_DEPTH = 4


@dataclass(frozen=True)
class FormReport:
    """What the classifier read off ``_post_process_topk_ids`` (details for the hook/audit)."""

    form: str
    #: Why this form (one line; shown by the audit and in warnings).
    reason: str
    #: sha256 of the function's source segment ("" when absent or unparsable).
    function_sha256: str = ""
    #: 1-based line of the ``def`` in the file (0 when absent or not in this file).
    lineno: int = 0
    #: Parameter names in order (positional-or-keyword first, then keyword-only).
    params: tuple[str, ...] = field(default_factory=tuple)
    #: Some HIP path calls ``topk_ids_logical_to_physical`` (under the predicate or not).
    hip_remaps: bool = False
    #: The module's EPLB predicate function ("" when it has none).
    remap_predicate: str = ""
    #: Padded weights are zero at return on every HIP path, shared-expert appends
    #: included (upstream zeroes them again after the append).
    tail_zeroes_weights: bool = False
    #: How the module binds the name ("def", "def inside try", "alias of X",
    #: "static method C.m", "imported from M", ...).
    binding: str = ""
    #: Module names the reader took as the HIP platform flag (``_is_hip`` and aliases).
    hip_flags: tuple[str, ...] = field(default_factory=tuple)
    #: Upstream switches assumed at their default (see ``DEFAULT_OFF_SWITCHES``).
    assumed_defaults: tuple[str, ...] = field(default_factory=tuple)


def classify_source(source: str) -> str:
    """Return the form name of ``_post_process_topk_ids`` in ``source`` (text of topk.py)."""
    return analyze_source(source).form


def analyze_source(source: str, resolve: Callable[[str], str | None] | None = None) -> FormReport:
    """Classify ``source`` (text of ``sglang/srt/layers/moe/topk.py``) and say why.

    ``resolve(module_name) -> source text or None`` lets the reader follow a function
    the module imports from elsewhere; without it such a function is ``unknown``.
    Never raises.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return FormReport("unknown", f"topk.py does not parse: {exc.msg} (line {exc.lineno})")
    try:
        return _analyze_tree(tree, source, resolve, depth=0)
    except Exception as exc:  # the reader must never take its caller down
        return FormReport("unknown", f"the classifier could not read the function ({exc!r})")


def analyze_function_source(
    function_source: str, module_source: str = "", first_line: int = 1
) -> FormReport:
    """Classify one function's source (as ``inspect.getsource`` gives it) in the context
    of its module's source (flags, predicates, helpers), with line numbers counted from
    ``first_line``. Used for the function that is running, which may not be the one the
    module's file binds. Never raises."""
    try:
        dedented = textwrap.dedent(function_source)
        ftree = ast.parse(dedented)
        fdef = next(
            (n for n in ftree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)), None
        )
        if fdef is None:
            return FormReport("unknown", "the running object's source is not a function definition")
        try:
            mtree = (
                ast.parse(module_source) if module_source else ast.Module(body=[], type_ignores=[])
            )
        except SyntaxError:
            mtree = ast.Module(body=[], type_ignores=[])
        info = _ModuleInfo(mtree)
        segment = ast.get_source_segment(dedented, fdef) or ""
        report = _classify_def(fdef, info, segment, "running function")
        if report.lineno:
            report = dataclasses.replace(report, lineno=first_line + fdef.lineno - 1)
        return report
    except Exception as exc:
        return FormReport("unknown", f"the classifier could not read the function ({exc!r})")


def _analyze_tree(tree: ast.Module, source: str, resolve, depth: int) -> FormReport:
    info = _ModuleInfo(tree)
    cands = info.candidates(FUNCTION_NAME)
    predicate = info.predicate_name()
    if not cands or all(c.kind == "absent" for c in cands):
        return FormReport(
            "absent", f"no {FUNCTION_NAME} bound in topk.py", remap_predicate=predicate
        )
    reports: list[FormReport] = []
    for cand in cands:
        if cand.kind == "absent":
            reports.append(
                FormReport("unknown", f"{FUNCTION_NAME} is bound only on some paths of the module")
            )
        elif cand.kind == "def":
            segment = _segment(source, cand.node)
            reports.append(_classify_def(cand.node, info, segment, cand.how))
        elif cand.kind == "imported" and resolve is not None and depth < 2:
            other = resolve(cand.module)
            if other is None:
                reports.append(FormReport("unknown", f"{cand.how}: its source was not found"))
                continue
            try:
                sub = _analyze_tree(ast.parse(other), other, resolve, depth + 1)
            except SyntaxError:
                sub = FormReport("unknown", f"{cand.how}: its module does not parse")
            reports.append(dataclasses.replace(sub, binding=cand.how, lineno=0))
        else:
            reports.append(
                FormReport(
                    "unknown", f"{cand.how}: its source is not in this file", binding=cand.how
                )
            )
    first = reports[0]
    if len({r.form for r in reports}) > 1 or (len(reports) > 1 and first.form == "unknown"):
        forms = ", ".join(f"{r.binding or 'binding'}: {r.form}" for r in reports)
        return dataclasses.replace(
            first,
            form="unknown",
            reason=f"the module binds {FUNCTION_NAME} differently on different paths ({forms})",
        )
    return first


def _classify_def(
    fdef: ast.FunctionDef | ast.AsyncFunctionDef, info: _ModuleInfo, segment: str, how: str
) -> FormReport:
    sha = hashlib.sha256(segment.encode()).hexdigest() if segment else ""
    common = {
        "function_sha256": sha,
        "lineno": fdef.lineno,
        "params": param_names(fdef),
        "remap_predicate": info.predicate_name(),
        "binding": how,
        "hip_flags": tuple(sorted(info.hip_flag_names())),
    }
    verdict = _Reader(info).read(fdef)
    return FormReport(
        verdict.form,
        verdict.reason,
        hip_remaps=verdict.hip_remaps,
        tail_zeroes_weights=verdict.tail_zero,
        assumed_defaults=tuple(sorted(info.assumed)),
        **common,
    )


# ------------------------------------------------------------------ public AST helpers
# (also used to rebuild upstream's mask-under-eplb-guard form for the end-to-end check)


def hip_branches(func: ast.AST) -> list[ast.If]:
    """The ``If`` nodes of ``func`` whose test requires HIP (``_is_hip``, ``is_hip()``,
    ``_is_hip and ...``), in source order. The first is normally the main HIP branch
    (``elif _is_hip:`` after the CUDA branch); later ones are tail passes after the
    shared-expert append."""
    hip_ifs = [n for n in ast.walk(func) if isinstance(n, ast.If) and _mentions_hip(n.test)]
    return sorted(hip_ifs, key=lambda n: (n.lineno, n.col_offset))


def _mentions_hip(test: ast.expr) -> bool:
    """True when ``test`` requires the HIP flag to be true."""
    if isinstance(test, ast.Name):
        return test.id in _HIP_FLAGS
    if isinstance(test, ast.Call):
        return call_name(test) == "is_hip" and not test.args
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_mentions_hip(v) for v in test.values)
    return False


def predicate_vars(func: ast.AST) -> set[str]:
    """Names bound directly to a remap-predicate call
    (``eplb_remap_enabled = is_expert_remapping_enabled()``, annotated or not)."""
    out: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Call):
            if call_name(node.value) in REMAP_PREDICATES:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                out.update(t.id for t in targets if isinstance(t, ast.Name))
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
    if (
        isinstance(test, ast.BoolOp)
        and isinstance(test.op, ast.And)
        and any(is_pred(v) for v in test.values)
    ):
        return "pos"
    for n in ast.walk(test):
        if isinstance(n, ast.expr) and is_pred(n):
            return "other"
    return ""


# ------------------------------------------------------------------------ formulas
# A formula is a tuple: ("T",), ("F",), ("atom", key), ("not", f), ("and", f, ...),
# ("or", f, ...). Atoms are conditions the reader cannot decide (keyed by their text).

TRUE: tuple = ("T",)
FALSE: tuple = ("F",)


def _atom(key: str) -> tuple:
    return ("atom", key)


def _not(f: tuple) -> tuple:
    if f == TRUE:
        return FALSE
    if f == FALSE:
        return TRUE
    if f[0] == "not":
        return f[1]
    return ("not", f)


def _join(tag: str, fs: tuple[tuple, ...]) -> tuple:
    """``and``/``or`` of ``fs``, flattened, constants folded, repeats dropped."""
    stop, skip = (FALSE, TRUE) if tag == "and" else (TRUE, FALSE)
    out: list[tuple] = []
    for f in fs:
        if f == stop:
            return stop
        if f != skip:
            out.extend(f[1:] if f[0] == tag else [f])
    uniq = tuple(dict.fromkeys(out))
    if not uniq:
        return skip
    return uniq[0] if len(uniq) == 1 else (tag, *uniq)


def _and(*fs: tuple) -> tuple:
    return _join("and", fs)


def _or(*fs: tuple) -> tuple:
    return _join("or", fs)


def _atoms(f: tuple, into: set[str]) -> set[str]:
    if f[0] == "atom":
        into.add(f[1])
    elif f[0] in ("not", "and", "or"):
        for sub in f[1:]:
            _atoms(sub, into)
    return into


_SAT_CACHE: dict[tuple, bool] = {}


def _eval3(f: tuple, env: dict[str, bool]) -> bool | None:
    """``f`` under a partial assignment: True, False, or None (not decided yet)."""
    tag = f[0]
    if tag == "T":
        return True
    if tag == "F":
        return False
    if tag == "atom":
        return env.get(f[1])
    if tag == "not":
        v = _eval3(f[1], env)
        return None if v is None else not v
    seen_none = False
    stop = tag == "or"  # an or stops at True, an and at False
    for sub in f[1:]:
        v = _eval3(sub, env)
        if v is None:
            seen_none = True
        elif v is stop:
            return stop
    return None if seen_none else not stop


def _satisfiable(cons: tuple[tuple, ...]) -> bool:
    """Can all of ``cons`` hold at once? (A backtracking search over their atoms; with
    too many atoms it answers yes, which only makes the reader consider more paths.)"""
    if FALSE in cons:
        return False
    key = tuple(sorted(set(cons), key=repr))
    hit = _SAT_CACHE.get(key)
    if hit is not None:
        return hit
    names: set[str] = set()
    for c in key:
        _atoms(c, names)

    def search(env: dict[str, bool]) -> bool:
        open_ = None
        for c in key:
            v = _eval3(c, env)
            if v is False:
                return False
            if v is None and open_ is None:
                open_ = c
        if open_ is None:
            return True
        atom = next(a for a in sorted(_atoms(open_, set())) if a not in env)
        for choice in (True, False):
            env[atom] = choice
            if search(env):
                return True
        del env[atom]
        return False

    ok = True if len(names) > _MAX_ATOMS else search({})
    if len(_SAT_CACHE) > 50_000:
        _SAT_CACHE.clear()
    _SAT_CACHE[key] = ok
    return ok


# ------------------------------------------------------------------ module bindings


@dataclass(frozen=True)
class _Candidate:
    kind: str  # "def" | "imported" | "opaque" | "absent"
    how: str
    node: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    module: str = ""


class _ModuleInfo:
    """Module-level facts: what each name may be bound to on HIP, the platform flags
    and switches as formulas, the EPLB predicate functions."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.bindings: dict[str, tuple[_Candidate, ...]] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.values: dict[str, tuple] = {}  # name -> formula of its truth value
        self.assumed: set[str] = set()
        self._ambiguous: set[str] = set()
        self._predicates: dict[str, bool] = {}
        self._walk(tree.body, ())

    # -- flags and switches

    def flag(self, name: str) -> tuple | None:
        """The formula of a module-level name in a condition (None: not a known value)."""
        if name in self._ambiguous:
            return _atom(name)
        if name in self.values:
            return self.values[name]
        if name in _HIP_FLAGS:
            return TRUE
        if name in _NOT_HIP_FLAGS:
            return FALSE
        return None

    def hip_flag_names(self) -> set[str]:
        """Module names a HIP process has true because they are bound to a HIP probe
        (``_is_hip`` by convention when the module binds none)."""
        names = {
            n
            for n in _flag_like(self.tree)
            if self.values.get(n) == TRUE and n not in self._ambiguous
        }
        return names or set(_HIP_FLAGS)

    def env_switch(self, call: ast.Call) -> tuple | None:
        """The formula of an environment read (``get_bool_env_var("X")``,
        ``envs.X.get()``, ``os.environ.get("X")``, ``os.getenv("X")``), else None."""
        name = call_name(call)
        var = ""
        if name in ("get_bool_env_var", "getenv", "get_int_env_var") and call.args:
            a = call.args[0]
            var = a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else ""
        elif name == "get" and isinstance(call.func, ast.Attribute):
            owner = call.func.value
            if (
                isinstance(owner, ast.Attribute)
                and isinstance(owner.value, ast.Name)
                and owner.value.id == "envs"
            ):
                var = owner.attr
            elif (
                isinstance(owner, ast.Attribute)
                and owner.attr == "environ"
                and call.args
                and isinstance(call.args[0], ast.Constant)
            ):
                var = str(call.args[0].value)
        if not var:
            return None
        if var in DEFAULT_OFF_SWITCHES:
            self.assumed.add(var)
            return FALSE
        return _atom(f"env:{var}")

    def module_value(self, expr: ast.expr) -> tuple:
        """Formula of a module-level expression (flags are known, everything else an atom)."""
        return _Evaluator(self, None).truth(expr)

    # -- bindings

    def candidates(self, name: str) -> tuple[_Candidate, ...]:
        return self.bindings.get(name, ())

    def helper(self, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The one ``def`` a module name is bound to (None when unknown or ambiguous)."""
        cands = self.bindings.get(name, ())
        if len(cands) == 1 and cands[0].kind == "def":
            return cands[0].node
        return None

    def predicate_name(self) -> str:
        for name in sorted(REMAP_PREDICATES):
            if name in self.bindings:
                return name
        return min((n for n, yes in self._predicates.items() if yes), default="")

    def is_predicate(self, name: str) -> bool:
        """Upstream's predicate names, and any module function reading the EPLB settings."""
        if name in REMAP_PREDICATES:
            return True
        if name not in self._predicates:
            node = self.helper(name)
            self._predicates[name] = node is not None and _reads_eplb_settings(node)
        return self._predicates[name]

    def _bind(self, name: str, cands: tuple[_Candidate, ...]) -> None:
        self.bindings[name] = cands

    def _walk(self, stmts: list[ast.stmt], where: tuple[str, ...]) -> None:
        for stmt in stmts:
            self._stmt(stmt, where)

    def _stmt(self, stmt: ast.stmt, where: tuple[str, ...]) -> None:
        ctx = " inside " + " inside ".join(where) if where else ""
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            how = f"def at line {stmt.lineno}{ctx}"
            self._bind(stmt.name, (_Candidate("def", how, stmt),))
        elif isinstance(stmt, ast.ClassDef):
            self.classes[stmt.name] = stmt
            self._bind(stmt.name, (_Candidate("opaque", f"class {stmt.name}"),))
        elif isinstance(stmt, ast.Import | ast.ImportFrom):
            for alias in stmt.names:
                local = alias.asname or alias.name.split(".")[0]
                if isinstance(stmt, ast.ImportFrom):
                    mod = "." * stmt.level + (stmt.module or "")
                    how = f"imported from {mod} ({alias.name}) at line {stmt.lineno}{ctx}"
                    self._bind(local, (_Candidate("imported", how, module=_absolute(mod)),))
                else:
                    self._bind(local, (_Candidate("opaque", f"module {alias.name}"),))
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            value = stmt.value
            if value is None:
                return
            for t in targets:
                if isinstance(t, ast.Name):
                    self._bind(t.id, self._resolve_value(value, stmt.lineno, ctx))
                    self._set_value(t.id, value, conditional=bool(where))
                elif isinstance(t, ast.Tuple | ast.List):
                    for elt in t.elts:
                        if isinstance(elt, ast.Name):
                            self._bind(
                                elt.id, (_Candidate("opaque", f"unpacked at line {stmt.lineno}"),)
                            )
                            self._ambiguous.add(elt.id)
        elif isinstance(stmt, ast.Delete):
            for t in stmt.targets:
                if isinstance(t, ast.Name):
                    self._bind(t.id, (_Candidate("absent", f"deleted at line {stmt.lineno}"),))
        elif isinstance(stmt, ast.If):
            truth = self.module_value(stmt.test)
            label = f"`if {_short(stmt.test)}` (line {stmt.lineno})"
            if truth == TRUE:
                self._walk(stmt.body, (*where, label))
            elif truth == FALSE:
                self._walk(stmt.orelse, (*where, f"else of {label}"))
            else:
                self._fork([(stmt.body, label), (stmt.orelse, f"else of {label}")], where)
        elif isinstance(stmt, ast.Try | getattr(ast, "TryStar", ast.Try)):
            label = f"try (line {stmt.lineno})"
            # The body normally completes; a handler that binds a name is an alternative.
            before = dict(self.bindings)
            self._walk(stmt.body + stmt.orelse, (*where, label))
            after_body = dict(self.bindings)
            alternatives: dict[str, set[_Candidate]] = {}
            for handler in stmt.handlers:
                self.bindings = dict(before)
                self._walk(handler.body, (*where, f"except of {label}"))
                for name, cands in self.bindings.items():
                    if before.get(name) != cands:
                        alternatives.setdefault(name, set()).update(cands)
            self.bindings = after_body
            for name, cands in alternatives.items():
                merged = tuple(
                    dict.fromkeys(
                        (*after_body.get(name, (_Candidate("absent", "unbound"),)), *cands)
                    )
                )
                self.bindings[name] = merged
                self._ambiguous.add(name)
            self._walk(stmt.finalbody, where)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            self._walk(stmt.body, where)
        elif isinstance(stmt, ast.For | ast.While | ast.AsyncFor):
            self._fork(
                [(stmt.body + stmt.orelse, f"loop (line {stmt.lineno})"), (stmt.orelse, "")], where
            )

    def _fork(self, branches: list[tuple[list[ast.stmt], str]], where: tuple[str, ...]) -> None:
        before = dict(self.bindings)
        results = []
        for body, label in branches:
            self.bindings = dict(before)
            self._walk(body, (*where, label) if label else where)
            results.append(self.bindings)
        merged: dict[str, tuple[_Candidate, ...]] = {}
        for name in set().union(*results):
            cands: list[_Candidate] = []
            for r in results:
                cands.extend(r.get(name, (_Candidate("absent", "unbound"),)))
            merged[name] = tuple(dict.fromkeys(cands))
            if len(merged[name]) > 1:
                self._ambiguous.add(name)
        self.bindings = merged

    def _resolve_value(self, value: ast.expr, lineno: int, ctx: str) -> tuple[_Candidate, ...]:
        """What a module-level ``NAME = value`` binds, as function candidates."""
        if (
            isinstance(value, ast.Call)
            and call_name(value) in ("staticmethod", "classmethod")
            and value.args
        ):
            value = value.args[0]
        if isinstance(value, ast.Name):
            found = self.bindings.get(value.id, ())
            return tuple(
                dataclasses.replace(c, how=f"alias of {value.id} (line {lineno}{ctx}; {c.how})")
                for c in found
            ) or (_Candidate("opaque", f"alias of unbound {value.id} at line {lineno}"),)
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
            owner = value.value.id
            cls = self.classes.get(owner)
            if cls is not None:
                for item in cls.body:
                    if (
                        isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                        and item.name == value.attr
                    ):
                        how = (
                            f"{owner}.{value.attr} (method at line {item.lineno}), "
                            f"bound at line {lineno}{ctx}"
                        )
                        return (_Candidate("def", how, item),)
            for c in self.bindings.get(owner, ()):
                if c.kind == "imported" or c.kind == "opaque":
                    how = f"attribute {owner}.{value.attr} at line {lineno}{ctx}"
                    return (
                        _Candidate(
                            "imported", how, module=f"{c.module}.{value.attr}" if c.module else ""
                        ),
                    )
        return (_Candidate("opaque", f"bound to `{_short(value)}` at line {lineno}{ctx}"),)

    def _set_value(self, name: str, value: ast.expr, conditional: bool) -> None:
        formula = self.module_value(value)
        if name in self.values and self.values[name] != formula and conditional:
            self._ambiguous.add(name)
        self.values[name] = formula


def _module_statements(stmts: list[ast.stmt]) -> Iterable[ast.stmt]:
    """Statements that run at import: module level and inside its compound statements."""
    for s in stmts:
        yield s
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for name in ("body", "orelse", "finalbody"):
            yield from _module_statements(getattr(s, name, []) or [])
        for h in getattr(s, "handlers", []) or []:
            yield from _module_statements(h.body)


def _flag_like(tree: ast.Module) -> set[str]:
    """Module names bound to a HIP probe call (``X = is_hip()``, ``X: bool = is_hip()``)."""
    out: set[str] = set()
    for node in _module_statements(tree.body):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            calls = [
                c
                for c in ast.walk(node.value)
                if isinstance(c, ast.Call) and call_name(c) in _HIP_CALLS
            ]
            hip_attr = any(
                isinstance(a, ast.Attribute) and a.attr == "hip" for a in ast.walk(node.value)
            )
            if calls or hip_attr:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                out.update(t.id for t in targets if isinstance(t, ast.Name))
    return out


def _absolute(mod: str) -> str:
    """A module name relative to ``sglang.srt.layers.moe`` (where topk.py lives) made absolute."""
    if not mod.startswith("."):
        return mod
    level = len(mod) - len(mod.lstrip("."))
    base = "sglang.srt.layers.moe".split(".")
    base = base[: len(base) - (level - 1)] if level > 1 else base
    rest = mod.lstrip(".")
    return ".".join([*base, rest] if rest else base)


def _segment(source: str, node: ast.AST) -> str:
    """The source text of ``node`` (what ``ast.get_source_segment`` gives, without
    splitting the whole file for each call)."""
    end = getattr(node, "end_lineno", None)
    if end is None:
        return ""
    lines = source.splitlines(keepends=True)[node.lineno - 1 : end]
    if not lines:
        return ""
    lines[-1] = lines[-1].encode()[: node.end_col_offset].decode(errors="replace")
    lines[0] = lines[0].encode()[node.col_offset :].decode(errors="replace")
    return "".join(lines)


def _reads_eplb_settings(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in EPLB_SETTINGS for n in ast.walk(node))


def _short(node: ast.AST, limit: int = 60) -> str:
    try:
        text = " ".join(ast.unparse(node).split())
    except Exception:
        return type(node).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------- the reader


@dataclass(frozen=True)
class _Tensor:
    """What one tensor object's padded rows hold on a path."""

    kind: str  # "ids" | "weights"
    pad: str  # ids: garbage | clean | fill:<v> | unknown; weights: garbage | zero | unknown
    remaps: int = 0
    remap_on_garbage: bool = False


@dataclass
class _Scope:
    names: dict[str, int] = field(default_factory=dict)  # variable -> tensor object id
    values: dict[str, tuple] = field(default_factory=dict)  # variable -> truth formula
    counts: dict[str, tuple] = field(default_factory=dict)  # variable -> "holds the count" formula
    consts: dict[str, object] = field(default_factory=dict)  # variable -> Python constant
    derived: set[str] = field(default_factory=set)  # variables computed from the count

    def copy(self) -> _Scope:
        return _Scope(
            dict(self.names),
            dict(self.values),
            dict(self.counts),
            dict(self.consts),
            set(self.derived),
        )

    def key(self) -> tuple:
        return (
            tuple(sorted(self.names.items())),
            tuple(sorted(self.values.items(), key=repr)),
            tuple(sorted(self.counts.items(), key=repr)),
            tuple(sorted(((k, repr(v)) for k, v in self.consts.items()))),
            tuple(sorted(self.derived)),
        )


@dataclass
class _Path:
    """One way through the function: its conditions, variables and tensors."""

    cons: tuple[tuple, ...]
    scope: _Scope
    objs: dict[int, _Tensor]
    unsure: tuple[str, ...] = ()
    touched: bool = False
    end: str = ""  # "" running, "return", "raise"
    ret: tuple | None = None  # returned values: tensor object ids (None: untracked)
    produced: dict[int, tuple] = field(default_factory=dict)  # id(call node) -> tensors it returned
    callers: tuple[_Scope, ...] = ()

    def fork(self) -> _Path:
        return _Path(
            self.cons,
            self.scope.copy(),
            dict(self.objs),
            self.unsure,
            self.touched,
            self.end,
            self.ret,
            dict(self.produced),
            self.callers,
        )

    def key(self) -> tuple:
        return (
            self.scope.key(),
            tuple(sorted(self.objs.items())),
            self.unsure,
            self.touched,
            self.end,
            self.ret,
            tuple(sorted(self.produced.items())),
            tuple(s.key() for s in self.callers),
        )

    def new_obj(self, t: _Tensor) -> int:
        oid = max(self.objs, default=0) + 1
        self.objs[oid] = t
        return oid

    def doubt(self, why: str) -> None:
        if why not in self.unsure:
            self.unsure = (*self.unsure, why)

    def tensor(self, expr: ast.expr | None) -> int | None:
        """The tracked tensor an expression denotes (a name, a slice or a view of one)."""
        while expr is not None:
            if isinstance(expr, ast.Name):
                return self.scope.names.get(expr.id)
            if isinstance(expr, ast.Subscript):
                expr = expr.value
            elif isinstance(expr, ast.Call) and id(expr) in self.produced:
                got = self.produced[id(expr)]
                return got[0] if len(got) == 1 else None
            elif (
                isinstance(expr, ast.Call)
                and isinstance(expr.func, ast.Attribute)
                and expr.func.attr in _VIEWS
            ):
                expr = expr.func.value
            else:
                return None
        return None


def _merge(paths: list[_Path]) -> list[_Path]:
    """Paths that ended in the same state become one (their conditions or-ed), so a
    function with many independent branches does not multiply paths."""
    groups: dict[tuple, list[_Path]] = {}
    for p in paths:
        groups.setdefault(p.key(), []).append(p)
    out = []
    for group in groups.values():
        first = group[0]
        if len(group) > 1:
            prefix = _common_prefix([g.cons for g in group])
            rest = _or(*(_and(*g.cons[len(prefix) :]) for g in group))
            first.cons = (*prefix, rest) if rest != TRUE else prefix
        out.append(first)
    return out


def _common_prefix(seqs: list[tuple]) -> tuple:
    out = []
    for items in zip(*seqs, strict=False):
        if all(x == items[0] for x in items):
            out.append(items[0])
        else:
            break
    return tuple(out)


class _Evaluator:
    """Truth formulas and padded-count formulas of expressions, in a module and a path."""

    def __init__(self, info: _ModuleInfo, path: _Path | None) -> None:
        self.info, self.path = info, path

    def _local(self, name: str) -> tuple | None:
        if self.path is None:
            return None
        sc = self.path.scope
        if name in sc.values:
            return sc.values[name]
        if name in sc.counts:
            return sc.counts[name]
        if name in sc.consts:
            return TRUE if sc.consts[name] else FALSE
        if name in sc.names:
            return TRUE  # a tensor
        return None

    def truth(self, e: ast.expr) -> tuple:
        if isinstance(e, ast.Constant):
            return TRUE if e.value else FALSE
        if isinstance(e, ast.BoolOp):
            parts = [self.truth(v) for v in e.values]
            return _and(*parts) if isinstance(e.op, ast.And) else _or(*parts)
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            return _not(self.truth(e.operand))
        if isinstance(e, ast.IfExp):
            c = self.truth(e.test)
            return _or(_and(c, self.truth(e.body)), _and(_not(c), self.truth(e.orelse)))
        if isinstance(e, ast.NamedExpr):
            return self.truth(e.value)
        if isinstance(e, ast.Name):
            local = self._local(e.id)
            if local is not None:
                return local
            flag = self.info.flag(e.id)
            return flag if flag is not None else _atom(e.id)
        if (
            isinstance(e, ast.Compare)
            and len(e.ops) == 1
            and isinstance(e.ops[0], ast.Is | ast.IsNot)
        ):
            right = e.comparators[0]
            if isinstance(right, ast.Constant) and right.value is None:
                present = self.count_of(e.left)
                if present != FALSE:
                    return present if isinstance(e.ops[0], ast.IsNot) else _not(present)
                if isinstance(e.left, ast.Attribute) and e.left.attr == "hip":
                    return TRUE if isinstance(e.ops[0], ast.IsNot) else FALSE
        if isinstance(e, ast.Attribute) and e.attr == "hip":
            return TRUE
        if isinstance(e, ast.Compare) and len(e.ops) == 1:
            folded = self._fold(e)
            if folded is not None:
                return TRUE if folded else FALSE
        if isinstance(e, ast.Call):
            name = call_name(e)
            if name in _HIP_CALLS and not e.args:
                return TRUE
            if name in _NOT_HIP_CALLS and not e.args:
                return FALSE
            if self.info.is_predicate(name):
                return _atom(_EPLB)
            env = self.info.env_switch(e)
            if env is not None:
                return env
        if any(isinstance(n, ast.Attribute) and n.attr in EPLB_SETTINGS for n in ast.walk(e)):
            return _atom(_EPLB)
        return _atom(_short(e, 200))

    def _fold(self, e: ast.Compare) -> bool | None:
        """A comparison of two known constants (``fill_value == -1`` with the fill
        known), else None."""
        left = self.const(e.left, _NO_CONST)
        right = self.const(e.comparators[0], _NO_CONST)
        if left is _NO_CONST or right is _NO_CONST:
            return None
        ops = {
            ast.Eq: lambda a, b: a == b,
            ast.NotEq: lambda a, b: a != b,
            ast.Lt: lambda a, b: a < b,
            ast.LtE: lambda a, b: a <= b,
            ast.Gt: lambda a, b: a > b,
            ast.GtE: lambda a, b: a >= b,
            ast.Is: lambda a, b: a is b,
            ast.IsNot: lambda a, b: a is not b,
        }
        op = ops.get(type(e.ops[0]))
        try:
            return None if op is None else bool(op(left, right))
        except TypeError:
            return None

    def count_of(self, e: ast.expr | None) -> tuple:
        """Formula under which ``e`` is the padded-row count (a tensor, not None)."""
        if e is None or self.path is None:
            return FALSE
        if isinstance(e, ast.Name):
            return self.path.scope.counts.get(e.id, FALSE)
        if isinstance(e, ast.IfExp):
            c = self.truth(e.test)
            return _or(_and(c, self.count_of(e.body)), _and(_not(c), self.count_of(e.orelse)))
        return FALSE

    def const(self, e: ast.expr | None, default: object = None) -> object:
        """A constant value (``0``, ``-1``, ``0.0``), through local constants; else ``default``."""
        if e is None:
            return default
        if isinstance(e, ast.Constant):
            return e.value
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            v = self.const(e.operand, None)
            return -v if isinstance(v, int | float) and not isinstance(v, bool) else default
        if isinstance(e, ast.Name) and self.path is not None and e.id in self.path.scope.consts:
            return self.path.scope.consts[e.id]
        return default

    def mentions_count(self, e: ast.expr) -> bool:
        if self.path is None:
            return False
        sc = self.path.scope
        return any(
            isinstance(n, ast.Name) and (n.id in sc.derived or sc.counts.get(n.id, FALSE) != FALSE)
            for n in ast.walk(e)
        )


@dataclass(frozen=True)
class _Verdict:
    form: str
    reason: str
    hip_remaps: bool = False
    tail_zero: bool = False


# Upstream kernels known by name: the shared-expert appends (with a count they fill
# padded routed ids with 0, the plain one also zeroes every padded weight), the per-rank
# shared-slot remaps (ids stay in range, the shared column's weight is live), the padded
# fill kernel (tensor, count, value).
_APPENDS = frozenset({"fused_append_shared_experts", "fused_append_shared_experts_with_weights"})
_APPEND_REMAPS = frozenset({"fused_append_remap_shared_experts_deepep"})
_SHARED_REMAPS = frozenset({"_remap_topk_for_deepep", "remap_topk_for_per_rank_shared_slots"})
_FILL_KERNELS = frozenset({"_fill_padded_rows"})
_INPLACE = frozenset(
    {"masked_fill_", "index_fill_", "fill_", "zero_", "copy_", "masked_scatter_", "index_put_"}
)
_NO_CONST = object()
# Methods giving the same tensor (a view) or a copy with the same padded rows.
_VIEWS = frozenset({"view", "reshape", "view_as", "contiguous"})
_COPIES = frozenset({"clone", "to", "int", "long", "type", "detach"})


class _TooManyPaths(Exception):
    pass


class _Reader:
    """Walks a function the way a HIP process runs it, path by path."""

    def __init__(self, info: _ModuleInfo) -> None:
        self.info = info
        self.stack: list[str] = []

    def read(self, fdef: ast.FunctionDef | ast.AsyncFunctionDef) -> _Verdict:
        params = param_names(fdef)
        ids_p = "topk_ids" if "topk_ids" in params else (params[0] if params else "")
        w_p = "topk_weights" if "topk_weights" in params else (params[1] if len(params) > 1 else "")
        path = _Path((), _Scope(), {})
        if ids_p:
            path.scope.names[ids_p] = path.new_obj(_Tensor("ids", "garbage"))
        if w_p:
            path.scope.names[w_p] = path.new_obj(_Tensor("weights", "garbage"))
        if "num_token_non_padded" in params:
            path.scope.counts["num_token_non_padded"] = TRUE
        self.stack = [fdef.name]
        try:
            paths = self.block(fdef.body, [path])
        except _TooManyPaths:
            return _Verdict("unknown", f"more than {_MAX_PATHS} distinct HIP paths; not read")
        for p in paths:
            if not p.end:
                p.end, p.ret = "return", (None,)
        return _judge(paths, has_count="num_token_non_padded" in params)

    # -- statements

    def block(self, stmts: list[ast.stmt], paths: list[_Path]) -> list[_Path]:
        for stmt in stmts:
            nxt: list[_Path] = []
            for p in paths:
                if p.end:
                    nxt.append(p)
                else:
                    p.produced = {}
                    nxt.extend(self.stmt(stmt, p))
            paths = _merge(nxt) if len(nxt) > 1 else nxt
            if len(paths) > _MAX_PATHS:
                raise _TooManyPaths
        return paths

    def split(self, p: _Path, f: tuple) -> tuple[_Path | None, _Path | None]:
        """(path where ``f`` holds, path where it does not); None for an impossible one."""
        if f == TRUE:
            return p, None
        if f == FALSE:
            return None, p
        yes = no = None
        if _satisfiable((*p.cons, f)):
            yes = p.fork()
            yes.cons = (*p.cons, f)
        if _satisfiable((*p.cons, _not(f))):
            no = p.fork()
            no.cons = (*p.cons, _not(f))
        return yes, no

    def stmt(self, s: ast.stmt, p: _Path) -> list[_Path]:
        ev = _Evaluator(self.info, p)
        if isinstance(s, ast.If):
            out: list[_Path] = []
            for q in self.expr(s.test, p):
                yes, no = self.split(q, _Evaluator(self.info, q).truth(s.test))
                if yes is not None:
                    out += self.block(s.body, [yes])
                if no is not None:
                    out += self.block(s.orelse, [no])
            return out
        if isinstance(s, ast.Return):
            return [self.ret(s.value, q) for q in self.expr(s.value, p)]
        if isinstance(s, ast.Raise):
            p.end = "raise"
            return [p]
        if isinstance(s, ast.Assert):
            yes, _ = self.split(p, ev.truth(s.test))
            return [yes] if yes is not None else []
        if isinstance(s, ast.Expr):
            return self.expr(s.value, p)
        if isinstance(s, ast.Assign | ast.AnnAssign | ast.AugAssign):
            return self.assign(s, p)
        if isinstance(s, ast.For | ast.AsyncFor | ast.While):
            # Zero or one pass (what a loop does to padded rows does not grow with passes).
            return [p.fork(), *self.block(s.body, [p.fork()])]
        if isinstance(s, ast.Try | getattr(ast, "TryStar", ast.Try)):
            return self.block(s.body + s.orelse + s.finalbody, [p])
        if isinstance(s, ast.With | ast.AsyncWith):
            return self.block(s.body, [p])
        if isinstance(s, ast.Match):
            p.doubt(f"a `match` statement at line {s.lineno}")
        return [p]  # pass, import, global, def, class, delete, break, continue

    def ret(self, value: ast.expr | None, p: _Path) -> _Path:
        if p.end:
            return p
        p.end = "return"
        if value is None:
            p.ret = (None,)
        elif isinstance(value, ast.Tuple | ast.List):
            p.ret = tuple(p.tensor(e) for e in value.elts)
        elif isinstance(value, ast.Call) and id(value) in p.produced:
            p.ret = p.produced[id(value)]
        else:
            p.ret = (p.tensor(value),)
        return p

    def assign(self, s: ast.Assign | ast.AnnAssign | ast.AugAssign, p: _Path) -> list[_Path]:
        if s.value is None:
            return [p]
        if isinstance(s, ast.AugAssign):
            # `w[:, -n:] *= f` keeps what padded rows hold (0 * f is 0, garbage stays garbage).
            return self.expr(s.value, p)
        targets = s.targets if isinstance(s, ast.Assign) else [s.target]
        out = []
        for q in self.expr(s.value, p):
            if not q.end:
                result = self.value_of(s.value, q)
                for t in targets:
                    self.bind(t, s.value, result, q)
            out.append(q)
        return out

    def value_of(self, value: ast.expr, p: _Path) -> tuple:
        """Tensors a value yields, one entry per element (None: not tracked)."""
        if isinstance(value, ast.Call) and id(value) in p.produced:
            return p.produced[id(value)]
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in _COPIES
        ):
            src = p.tensor(value.func.value)
            return (p.new_obj(p.objs[src]) if src is not None else None,)
        if isinstance(value, ast.Tuple | ast.List):
            return tuple(p.tensor(e) for e in value.elts)
        if isinstance(value, ast.IfExp):
            a, b = p.tensor(value.body), p.tensor(value.orelse)
            return (a if a == b else None,)
        return (p.tensor(value),)

    def bind(self, target: ast.expr, value: ast.expr, result: tuple, p: _Path) -> None:
        sc = p.scope
        ev = _Evaluator(self.info, p)
        if isinstance(target, ast.Name):
            oid = result[0] if len(result) == 1 else None
            # A call that produced a tensor we do not follow binds nothing we know.
            unknown = oid is None and isinstance(value, ast.Call) and id(value) in p.produced
            _bind_value(sc, target.id, value, ev, oid, unknown)
            return
        if isinstance(target, ast.Tuple | ast.List):
            n = len(target.elts)
            vals = result if len(result) == n else (None,) * n
            same = isinstance(value, ast.Tuple | ast.List) and len(value.elts) == n
            for i, elt in enumerate(target.elts):
                self.bind(elt, value.elts[i] if same else value, (vals[i],), p)
            return
        if isinstance(target, ast.Subscript):
            oid = p.tensor(target.value)
            if oid is None:
                return
            fill = ev.const(value, _NO_CONST)
            if ev.mentions_count(target.slice):
                if fill is _NO_CONST:
                    self.spoil(
                        p, oid, f"a padded-row store of a computed value at line {target.lineno}"
                    )
                else:
                    self.fill(p, oid, fill, f"line {target.lineno}")
            elif p.objs[oid].kind == "weights" and fill != 0:
                # Columns of every row rewritten (a shared expert's weight): padded rows too.
                p.objs[oid] = dataclasses.replace(p.objs[oid], pad="garbage")
            # Ids written in every row from the ids themselves or from shared-expert slots
            # keep what padded rows held: an in-range id stays in range, garbage stays garbage.

    # -- calls

    def expr(self, e: ast.expr | None, p: _Path) -> list[_Path]:
        """Apply the effects of the calls in ``e``, innermost first."""
        if e is None:
            return [p]
        paths = [p]
        for call in (n for n in _postorder(e) if isinstance(n, ast.Call)):
            nxt: list[_Path] = []
            for q in paths:
                nxt.extend([q] if q.end else self.call(call, q))
            paths = nxt
        return paths

    def call(self, c: ast.Call, p: _Path) -> list[_Path]:
        name = call_name(c)
        ev = _Evaluator(self.info, p)
        args = _bind_args(c)
        known = name in _APPENDS | _APPEND_REMAPS | _SHARED_REMAPS | _FILL_KERNELS or name == _REMAP
        helper = self.info.helper(name) if isinstance(c.func, ast.Name) and not known else None
        if helper is not None and name not in self.stack and len(self.stack) <= _MAX_INLINE_DEPTH:
            if name in (_MASK, _ZERO) or self._worth_inlining(c, p):
                return self.inline(c, helper, p)
        if name in (_MASK, *_FILL_KERNELS):
            target = p.tensor(_arg(args, 0, "topk_ids", "tensor"))
            cnt = ev.count_of(_arg(args, 1, "num_token_non_padded"))
            fill = ev.const(
                _arg(args, 2, "fill_value", "value"), -1 if name == _MASK else _NO_CONST
            )
            return self.when(
                p, cnt, lambda q: self.fill(q, target, fill, f"{name} at line {c.lineno}")
            )
        if name == _ZERO:
            target = p.tensor(_arg(args, 0, "topk_weights"))
            cnt = ev.count_of(_arg(args, 1, "num_token_non_padded"))
            return self.when(
                p, cnt, lambda q: self.fill(q, target, 0, f"{name} at line {c.lineno}")
            )
        if name == _REMAP:
            p.produced[id(c)] = (self.remapped(p, p.tensor(_arg(args, 0, "topk_ids")), c.lineno),)
            return [p]
        if name in _APPENDS | _APPEND_REMAPS:
            return self.append(c, name, args, p)
        if name in _SHARED_REMAPS:
            ids, w = p.tensor(_arg(args, 0, "topk_ids")), p.tensor(_arg(args, 1, "topk_weights"))
            new_ids = p.new_obj(p.objs[ids]) if ids is not None else None
            new_w = p.new_obj(_Tensor("weights", "garbage")) if w is not None else None
            p.produced[id(c)] = (new_ids, new_w)
            p.touched = True
            return [p]
        if isinstance(c.func, ast.Attribute) and c.func.attr in _INPLACE:
            oid = p.tensor(c.func.value)
            if oid is not None:
                self.inplace(c, oid, p)
            return [p]
        return [p]

    def inplace(self, c: ast.Call, oid: int, p: _Path) -> None:
        ev = _Evaluator(self.info, p)
        attr = c.func.attr  # type: ignore[union-attr]
        if (
            attr in ("masked_fill_", "index_fill_")
            and len(c.args) >= 2
            and ev.mentions_count(c.args[0])
        ):
            fill = ev.const(c.args[-1], _NO_CONST)
            if fill is not _NO_CONST:
                self.fill(p, oid, fill, f".{attr} at line {c.lineno}")
                return
        self.spoil(p, oid, f".{attr}() on a routing tensor at line {c.lineno}")

    def _worth_inlining(self, c: ast.Call, p: _Path) -> bool:
        """Follow a helper when it gets a tracked tensor or the count (otherwise it cannot
        change what padded rows hold)."""
        ev = _Evaluator(self.info, p)
        return any(
            p.tensor(a) is not None or ev.count_of(a) != FALSE
            for a in [*c.args, *(k.value for k in c.keywords)]
        )

    def inline(
        self, c: ast.Call, helper: ast.FunctionDef | ast.AsyncFunctionDef, p: _Path
    ) -> list[_Path]:
        ev = _Evaluator(self.info, p)
        scope = _Scope()
        params = [a.arg for a in [*helper.args.posonlyargs, *helper.args.args]]
        first_default = len(params) - len(helper.args.defaults)
        for i, d in enumerate(helper.args.defaults):
            v = ev.const(d, _NO_CONST)
            if v is not _NO_CONST:
                scope.consts[params[first_default + i]] = v
        for kw, d in zip(helper.args.kwonlyargs, helper.args.kw_defaults, strict=True):
            v = ev.const(d, _NO_CONST)
            if v is not _NO_CONST:
                scope.consts[kw.arg] = v

        def put(pname: str, a: ast.expr) -> None:
            _bind_value(scope, pname, a, ev, p.tensor(a), False)

        for i, a in enumerate(c.args):
            if isinstance(a, ast.Starred):
                p.doubt(f"a starred call of {helper.name} at line {c.lineno}")
                return [p]
            if i < len(params):
                put(params[i], a)
        for k in c.keywords:
            if k.arg is None:
                p.doubt(f"a ** call of {helper.name} at line {c.lineno}")
                return [p]
            put(k.arg, k.value)
        produced = dict(p.produced)
        start = p.fork()
        start.callers = (*p.callers, p.scope)
        start.scope, start.produced = scope, {}
        self.stack.append(helper.name)
        try:
            ends = self.block(helper.body, [start])
        finally:
            self.stack.pop()
        out = []
        for q in ends:
            if q.end == "raise":
                out.append(q)
                continue
            r = q.ret if q.end == "return" else (None,)
            q.end, q.ret = "", None
            q.scope, q.callers = q.callers[-1].copy(), q.callers[:-1]
            q.produced = {**produced, id(c): r}
            out.append(q)
        return _merge(out) if len(out) > 1 else out

    def append(self, c: ast.Call, name: str, args: dict, p: _Path) -> list[_Path]:
        ev = _Evaluator(self.info, p)
        ids, w = p.tensor(_arg(args, 0, "topk_ids")), p.tensor(_arg(args, 1, "topk_weights"))
        cnt = ev.count_of(_arg(args, -1, "num_token_non_padded"))
        pad_fill = ev.const(_arg(args, -1, "pad_fill_id"), 0)
        out = []
        yes, no = self.split(p, cnt)
        for q, counted in ((yes, True), (no, False)):
            if q is None:
                continue
            src = q.objs.get(ids) if ids is not None else None
            remaps = (src.remaps, src.remap_on_garbage) if src is not None else (0, False)
            if counted:
                ids_pad = "clean" if pad_fill == 0 else f"fill:{pad_fill!r}"
                # The plain append zeroes every padded weight; the DeepEP one leaves them.
                w_pad = (
                    "zero" if name in _APPENDS else (q.objs[w].pad if w is not None else "garbage")
                )
            else:
                ids_pad = src.pad if src is not None else "unknown"
                w_pad = "garbage"  # the appended shared column's weight is live in padded rows
            new_ids = q.new_obj(_Tensor("ids", ids_pad, *remaps)) if ids is not None else None
            new_w = q.new_obj(_Tensor("weights", w_pad)) if w is not None else None
            q.touched = True
            q.produced[id(c)] = (new_ids, new_w)
            out.append(q)
        return out

    # -- effects on tensors

    def when(self, p: _Path, cond: tuple, effect: Callable[[_Path], None]) -> list[_Path]:
        yes, no = self.split(p, cond)
        if yes is not None:
            effect(yes)
        return [q for q in (yes, no) if q is not None]

    def fill(self, p: _Path, oid: int | None, value: object, where: str) -> None:
        p.touched = True
        if oid is None:
            p.doubt(f"a padded-row fill of a tensor the reader does not follow ({where})")
            return
        t = p.objs[oid]
        if value is _NO_CONST:
            pad = "unknown"
        elif t.kind == "weights":
            pad = "zero" if value == 0 else "garbage"
        else:
            pad = "clean" if value == 0 else f"fill:{value!r}"
        p.objs[oid] = dataclasses.replace(t, pad=pad)

    def spoil(self, p: _Path, oid: int, why: str) -> None:
        p.objs[oid] = dataclasses.replace(p.objs[oid], pad="unknown")
        p.doubt(why)

    def remapped(self, p: _Path, src: int | None, lineno: int) -> int | None:
        p.touched = True
        if src is None:
            p.doubt(f"the remap at line {lineno} reads a tensor the reader does not follow")
            return None
        t = p.objs[src]
        garbage = t.remap_on_garbage or t.pad != "clean"
        return p.new_obj(dataclasses.replace(t, remaps=t.remaps + 1, remap_on_garbage=garbage))


def _bind_value(
    scope: _Scope, name: str, value: ast.expr, ev: _Evaluator, oid: int | None, unknown: bool
) -> None:
    """Bind ``name`` in ``scope`` to what ``value`` is (evaluated in the caller's path):
    a tracked tensor, the count (under a formula), a constant or a truth formula, and
    whether it is computed from the count. ``unknown``: forget the name only."""
    for d in (scope.names, scope.values, scope.counts, scope.consts):
        d.pop(name, None)
    scope.derived.discard(name)
    if oid is not None:
        scope.names[name] = oid
        return
    if unknown:
        return
    cnt = ev.count_of(value)
    if cnt != FALSE:
        scope.counts[name] = cnt
    const = ev.const(value, _NO_CONST)
    if const is not _NO_CONST:
        scope.consts[name] = const
    else:
        scope.values[name] = ev.truth(value)
    if ev.mentions_count(value):
        scope.derived.add(name)


def _judge(paths: list[_Path], has_count: bool) -> _Verdict:
    """The form, from every path that returns."""
    done = [p for p in paths if p.end == "return"]
    hip_remaps = any(t.remaps for p in done for t in p.objs.values())
    if not done:
        return _Verdict("unknown", "every HIP path raises", hip_remaps)
    unsure = sorted({u for p in done for u in p.unsure})
    if unsure:
        return _Verdict("unknown", f"not sure what the HIP path does: {unsure[0]}", hip_remaps)
    if not any(p.touched for p in done):
        return _Verdict(
            "no-hip-handling", "on HIP nothing fills padded ids, zeroes their weights or remaps"
        )
    if not has_count:
        return _Verdict("unknown", "the function has no num_token_non_padded parameter", hip_remaps)
    rows = []
    for p in done:
        ret = p.ret or (None,)
        ids = p.objs.get(ret[0]) if ret[0] is not None else None
        w = p.objs.get(ret[1]) if len(ret) > 1 and ret[1] is not None else None
        if ids is None or w is None:
            why = "a HIP path returns something other than the routing ids and weights"
            return _Verdict("unknown", why + _where(p), hip_remaps)
        on = _satisfiable((*p.cons, _atom(_EPLB)))
        off = _satisfiable((*p.cons, _not(_atom(_EPLB))))
        rows.append((p, ids, w, on, off))
    tail_zero = all(w.pad == "zero" for _, _, w, _, _ in rows)

    def first(pred) -> _Path | None:
        return next((r[0] for r in rows if pred(*r[1:])), None)

    odd = first(lambda i, w, on, off: i.pad.startswith("fill:"))
    if odd is not None:
        value = next(r[1].pad for r in rows if r[0] is odd).split(":", 1)[1]
        return _Verdict(
            "unknown",
            f"on HIP padded ids are filled with {value}, not 0{_where(odd)}",
            hip_remaps,
            tail_zero,
        )
    bad = first(lambda i, w, on, off: i.pad == "unknown" or w.pad == "unknown")
    if bad is not None:
        return _Verdict(
            "unknown",
            f"on HIP padded rows end in a state the reader cannot tell{_where(bad)}",
            hip_remaps,
        )
    ids_clean = all(r[1].pad == "clean" for r in rows)
    ids_garbage = all(r[1].pad == "garbage" for r in rows)
    if not hip_remaps:
        if ids_garbage and tail_zero:
            return _Verdict(
                "weights-only",
                "on HIP padded weights are zeroed but padded ids never filled",
                False,
                True,
            )
        if ids_garbage and all(r[2].pad != "zero" for r in rows):
            return _Verdict(
                "no-hip-handling", "on HIP padded ids are never filled nor their weights zeroed"
            )
    for p, ids, _, on, off in rows:
        if ids.remaps and ids.remap_on_garbage:
            return _Verdict(
                "unknown",
                f"on HIP the remap reads unfilled padded ids{_where(p)}",
                hip_remaps,
                tail_zero,
            )
        if ids.remaps > 1:
            return _Verdict(
                "unknown",
                f"on HIP ids are remapped {ids.remaps} times{_where(p)}",
                hip_remaps,
                tail_zero,
            )
        if ids.remaps and off:
            return _Verdict(
                "unknown",
                f"on HIP the remap runs when EPLB is off{_where(p)}",
                hip_remaps,
                tail_zero,
            )
        if not ids.remaps and on and hip_remaps:
            return _Verdict(
                "unknown",
                f"on HIP the remap is skipped when EPLB is on{_where(p)}",
                hip_remaps,
                tail_zero,
            )
    if not tail_zero:
        p = first(lambda i, w, on, off: w.pad != "zero")
        if ids_clean:
            return _Verdict(
                "unknown",
                f"HIP fills padded ids with 0 but never zeroes their weights{_where(p)}",
                hip_remaps,
            )
        return _Verdict(
            "unknown", f"on HIP padded weights are not zero at return{_where(p)}", hip_remaps
        )
    if ids_clean:
        if not hip_remaps:
            return _Verdict(
                "unknown",
                "on HIP padded rows are masked but nothing remaps, even with EPLB on",
                False,
                True,
            )
        return _Verdict(
            "fixed",
            "on every HIP path padded ids are filled with 0 before the EPLB-gated remap, "
            "weights zeroed",
            True,
            True,
        )
    if hip_remaps and all((r[1].pad == "clean") == (r[1].remaps == 1) for r in rows):
        return _Verdict(
            "mask-under-eplb-guard",
            "on HIP padded ids are filled only when the EPLB remap runs",
            True,
            True,
        )
    p = first(lambda i, w, on, off: i.pad != "clean")
    return _Verdict(
        "unknown", f"on HIP padded ids are left unfilled{_where(p)}", hip_remaps, tail_zero
    )


def _where(p: _Path | None) -> str:
    """The path's conditions that say something in a reason: EPLB on or off, and up
    to two plain conditions (merged alternatives are left out)."""
    if p is None:
        return ""
    words = []
    on = _satisfiable((*p.cons, _atom(_EPLB)))
    off = _satisfiable((*p.cons, _not(_atom(_EPLB))))
    if on != off:
        words.append("EPLB on" if on else "EPLB off")
    plain = [c for c in p.cons if c[0] == "atom" or (c[0] == "not" and c[1][0] == "atom")]
    words += [_show(c) for c in plain if _EPLB not in _atoms(c, set())][:2]
    return f" (when {' and '.join(words)})" if words else ""


def _show(f: tuple) -> str:
    """A condition in words (atoms by their text), for reasons."""
    tag = f[0]
    if tag == "atom":
        return "EPLB on" if f[1] == _EPLB else f"`{f[1]}`"
    if tag == "not":
        inner = f[1]
        if inner[0] == "atom":
            return "EPLB off" if inner[1] == _EPLB else f"not `{inner[1]}`"
        return f"not ({_show(inner)})"
    if tag in ("and", "or"):
        return f" {tag} ".join(_show(s) for s in f[1:])
    return ""


def _postorder(node: ast.AST) -> Iterable[ast.AST]:
    """Nodes of an expression, children before parents, nested scopes skipped."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        yield from _postorder(child)
    yield node


def _bind_args(c: ast.Call) -> dict:
    """A call's arguments: positional by index, keywords by name."""
    out: dict = {i: a for i, a in enumerate(c.args) if not isinstance(a, ast.Starred)}
    out.update({k.arg: k.value for k in c.keywords if k.arg is not None})
    return out


def _arg(args: dict, pos: int, *names: str) -> ast.expr | None:
    if pos >= 0 and pos in args:
        return args[pos]
    for n in names:
        if n in args:
            return args[n]
    return None

"""What ``topk.py``'s text says without running it, from one parse per process.

The fingerprint of ``_post_process_topk_ids``: its definition and the module-level code it
uses, as an AST without comments, docstrings, annotations or layout, hashed. The ledger
(``ledger.json``, generated from the real wheels) maps the fingerprint of every released body
and of every shipped patch's result to its form and the hook's plan. Besides, the scans the
probe needs: the module's HIP flags, its EPLB predicates, whether a HIP path calls the remap.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_amd_moe.runtime.sglang import names
from sglang_amd_moe.runtime.target import call_name

LEDGER_FILE = Path(__file__).with_name("ledger.json")
# Fields that do not change what code does: left out of the fingerprint.
_IGNORED_FIELDS = frozenset({"ctx", "type_comment", "type_params", "kind", "annotation", "returns"})


@dataclass(frozen=True)
class Entry:
    form: str
    plan: dict[str, Any] | None  # the hook's plan (``Plan`` fields; None: nothing to hook)
    sources: tuple[str, ...]  # ``sglang 0.5.13``, ``sglang 0.5.12 + <patch>``


@dataclass(frozen=True)
class Reading:
    """One parse of topk.py (or of a running function with its module's text)."""

    fingerprint: str = ""  # sha256 of the normalised body ("": no plain def bound)
    binding: str = "absent"  # "" (one plain top-level def), "absent", or what it is instead
    lineno: int = 0
    known: Entry | None = None
    hip_flags: tuple[str, ...] = (names.HIP_FLAG,)
    predicates: tuple[str, ...] = names.REMAP_PREDICATES
    remaps_on_hip: bool = False  # a non-CUDA path (or a helper it calls) calls the remap
    node: ast.AST | None = field(default=None, repr=False, compare=False)  # the function (audit)

    @property
    def form(self) -> str:
        if self.binding == "absent":
            return "absent"
        return self.known.form if self.known is not None else "unknown"

    @property
    def why(self) -> str:
        if self.binding == "absent":
            return f"no {names.FUNCTION_NAME} bound in topk.py"
        if self.known is not None:
            return f"the ledger knows this body ({', '.join(self.known.sources[:3])})"
        return f"the ledger does not know this body ({self.binding or 'a changed body'})"


@functools.cache
def entries() -> dict[str, Entry]:
    """The ledger: fingerprint -> entry."""
    doc = json.loads(LEDGER_FILE.read_text(encoding="utf-8"))["entries"]
    return {fp: Entry(e["form"], e["plan"], tuple(e["sources"])) for fp, e in doc.items()}


def read(module_text: str, function_source: str | None = None, first_line: int = 1) -> Reading:
    """Read ``module_text`` (topk.py); with ``function_source`` (``inspect.getsource`` of
    the running function), that function in its module's context instead of the one the
    module binds. Never raises: a text that does not parse reads as an unknown body."""
    try:
        tree = _parse(module_text)
        fn_tree = ast.parse(textwrap.dedent(function_source)) if function_source else None
    except (SyntaxError, ValueError) as exc:
        return Reading(binding=f"it does not parse ({exc})")
    top = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    common: dict[str, Any] = {"hip_flags": hip_flags(tree)}
    if function_source is not None:
        fn = fn_tree.body[0] if fn_tree is not None and fn_tree.body else None
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            return Reading(binding="the running object is not a function", **common)
        binding, lineno = "", first_line
    else:
        binding, fn = _binding(tree, module_text)
        if fn is None:
            return Reading(binding=binding, **common)
        lineno = fn.lineno
    used = _used_statements(tree, fn)
    fingerprint = hashlib.sha256("\n".join(_canon(s) for s in [fn, *used]).encode()).hexdigest()
    known = entries().get(fingerprint) if not binding else None
    remaps = _remaps(fn, top, set())
    return Reading(fingerprint, binding, lineno, known, predicates=predicates(used),
                   remaps_on_hip=remaps, node=fn, **common)  # fmt: skip


@functools.lru_cache(maxsize=4)
def _parse(text: str) -> ast.Module:
    return ast.parse(text)  # one parse per text and process: the tree is only read


def _canon(node: Any) -> str:
    """A text of the AST that is the same on every Python version this runs on, without
    docstrings or other bare strings (no code)."""
    if isinstance(node, ast.AST):
        fields = [
            f"{f}={_canon(getattr(node, f, None))}"
            for f in node._fields
            if f not in _IGNORED_FIELDS
        ]
        return f"({type(node).__name__} {' '.join(fields)})"
    if isinstance(node, list):
        return "[" + " ".join(_canon(x) for x in node if not bare_string(x)) + "]"
    return repr(node)


def bare_string(node: Any) -> bool:
    """A statement that is only a string (a docstring): no code."""
    return isinstance(node, ast.Expr) and isinstance(getattr(node.value, "value", None), str)


def _module_statements(stmts: list[ast.stmt]):
    """Statements that run at import: module level and inside its compound statements."""
    for s in stmts:
        yield s
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for name in ("body", "orelse", "finalbody"):
            yield from _module_statements(getattr(s, name, []) or [])
        for h in getattr(s, "handlers", []) or []:
            yield from _module_statements(h.body)


def _bound(stmt: ast.stmt) -> set[str]:
    """Names a module-level statement binds (its own, not those of nested statements)."""
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {stmt.name}
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    targets: list[ast.AST] = []
    if isinstance(stmt, ast.Assign | ast.Delete):
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor):
        targets = [stmt.target]
    elif isinstance(stmt, ast.With | ast.AsyncWith):
        targets = [i.optional_vars for i in stmt.items if i.optional_vars is not None]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _binding(tree: ast.Module, text: str) -> tuple[str, ast.FunctionDef | None]:
    """("", the def) when the module binds the function by one plain top-level def."""
    binders = [s for s in _module_statements(tree.body) if names.FUNCTION_NAME in _bound(s)]
    rebinds = re.search(rf"^\s*global\b[^\n]*\b{names.FUNCTION_NAME}\b", text, re.M)
    if not binders:
        return "absent", None
    only = binders[0]
    if len(binders) > 1 or rebinds:
        return f"{names.FUNCTION_NAME} is bound {len(binders)} times or rebound", None
    if not isinstance(only, ast.FunctionDef) or only not in tree.body:
        return f"{names.FUNCTION_NAME} is not a plain top-level def", None
    return "", only


def _loads(node: ast.AST) -> set[str]:
    """Names ``node`` reads, annotations left out."""
    out: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            out.add(n.id)
        for f, v in ast.iter_fields(n):
            if f in ("annotation", "returns"):
                continue
            stack.extend(x for x in (v if isinstance(v, list) else [v]) if isinstance(x, ast.AST))
    return out


def _used_statements(tree: ast.Module, fn: ast.AST) -> list[ast.stmt]:
    """Module-level statements (imports aside) binding a name the function uses,
    transitively, in file order."""
    candidates = [
        s for s in tree.body if s is not fn and not isinstance(s, ast.Import | ast.ImportFrom)
    ]
    needed, chosen = _loads(fn), set()
    changed = True
    while changed:
        changed = False
        for i, s in enumerate(candidates):
            if i in chosen:
                continue
            if set().union(*(_bound(x) for x in _module_statements([s]))) & needed:
                chosen.add(i)
                needed |= _loads(s)
                changed = True
    return [candidates[i] for i in sorted(chosen)]


def hip_flags(tree: ast.Module) -> tuple[str, ...]:
    """Module names bound to a HIP probe (``X = is_hip()``, ``torch.version.hip``)."""
    out = set()
    for s in _module_statements(tree.body):
        if isinstance(s, ast.Assign | ast.AnnAssign) and s.value is not None:
            hip = any(
                (isinstance(c, ast.Call) and call_name(c) in names.HIP_CALLS)
                or (isinstance(c, ast.Attribute) and c.attr == "hip")
                for c in ast.walk(s.value)
            )
            if hip:
                out |= _bound(s)
    return tuple(sorted(out)) or (names.HIP_FLAG,)


def predicates(used: list[ast.stmt]) -> tuple[str, ...]:
    """Upstream's predicate names, and module functions the function uses that read the
    server's EPLB settings (a renamed predicate)."""
    out = set(names.REMAP_PREDICATES)
    for s in used:
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and any(
            isinstance(n, ast.Attribute) and n.attr in names.EPLB_SETTINGS for n in ast.walk(s)
        ):
            out.add(s.name)
    return tuple(sorted(out))


def _remaps(fn: ast.AST, top: dict[str, ast.AST], seen: set[str]) -> bool:
    """A call of the remap outside ``if <not-HIP flag>:`` bodies, here or in a module
    function called from here (conservative: any such path counts)."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        n = stack.pop()
        if isinstance(n, ast.If) and getattr(n.test, "id", None) in names.NOT_HIP_FLAGS:
            stack.extend(n.orelse)
            continue
        if isinstance(n, ast.Call):
            name = call_name(n)
            if name == names.REMAP:
                return True
            if name in top and name not in seen:
                seen.add(name)
                if _remaps(top[name], top, seen):
                    return True
        stack.extend(ast.iter_child_nodes(n))
    return False

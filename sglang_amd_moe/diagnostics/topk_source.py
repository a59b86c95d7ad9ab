"""Upstream's ``_post_process_topk_ids`` as text and as rewritten code, for the
diagnostics (the audit, ``check``'s end-to-end run, the ledger tool): the function's
text as the ledger keeps it, the known body nearest to an unknown one, the function a
rewritten ``topk.py`` defines, built over the live module and run by the probe, and the
probe's run of the function as it runs in this process. The
runtime never needs these: it decides from fingerprints and runs the installed function.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import json
import linecache
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglang_amd_moe.runtime.sglang import ledger, names

#: The function of every body in the ledger, by fingerprint (written by the ledger tool).
BODIES_FILE = ledger.LEDGER_FILE.with_name("ledger_bodies.json")


def function_text(node: ast.AST | None) -> str:
    """A function without its docstrings, as text (what the ledger keeps and the audit diffs)."""
    if node is None:
        return ""
    node = ast.parse(ast.unparse(node)).body[0]
    for n in ast.walk(node):
        body = getattr(n, "body", None)
        scope = isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        if scope and body and ledger.bare_string(body[0]):
            n.body = body[1:] or [ast.Pass()]
    return ast.unparse(node) + "\n"


def nearest(body: str) -> dict | None:
    """The ledger's body nearest to ``body`` (a :func:`function_text`), and the diff to it."""
    known = {fp: t.splitlines(True) for fp, t in json.loads(BODIES_FILE.read_text()).items()}
    if not body or not known:
        return None
    lines = body.splitlines(keepends=True)
    fp = max(known, key=lambda fp: difflib.SequenceMatcher(None, known[fp], lines).ratio())
    entry = ledger.entries().get(fp)
    label = entry.sources[0] if entry is not None else fp[:12]
    diff = difflib.unified_diff(known[fp], lines, fromfile=f"known: {label}", tofile="installed")
    return {"body": label, "form": entry.form if entry else None, "diff": "".join(diff)}


def probe_source(module: Any, source: str, **kw: Any) -> Any:
    """The probe's ``ProbeResult`` of the function a rewritten topk.py text defines, against
    the live module's globals. Never raises."""
    from sglang_amd_moe.runtime.sglang import probe

    try:
        fn, ns = function_from_source(module, source)
    except (Exception, SystemExit) as exc:
        why = f"the rewritten source does not load: {type(exc).__name__}: {exc}"
        return probe.ProbeResult(False, why)
    return probe.probe(fn, ns, **kw)


def function_from_source(
    module: Any, source: str, statements: list[ast.stmt] | None = None
) -> tuple[Callable[..., Any], dict[str, Any]]:
    """``_post_process_topk_ids`` as ``source`` (a full topk.py text) defines it, over a copy
    of the live ``module``'s globals in which ``statements`` of ``source`` ran (by default
    the module-level ones that differ from the installed file's), the copy's functions
    rebound to the copy. ``source`` is registered for ``inspect``. Raises when it binds none."""
    import __future__

    from sglang_amd_moe.runtime.sglang.probe import rebind_all

    if statements is None:
        have = {ast.dump(s) for s in ast.parse(inspect.getsource(module)).body}
        new = ast.parse(source).body
        statements = [s for s in new if ast.dump(s) not in have and not isinstance(s, ast.Expr)]
    filename = f"<{getattr(module, '__file__', module.__name__)} as rewritten {hash(source)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree, flags = ast.Module(statements, type_ignores=[]), __future__.annotations.compiler_flag
    ns = dict(vars(module))
    exec(compile(tree, filename, "exec", flags=flags, dont_inherit=True), ns)  # noqa: S102
    fn = rebind_all(ns, vars(module)).get(names.FUNCTION_NAME)
    if not isinstance(fn, types.FunctionType):
        raise LookupError(f"the source binds no function {names.FUNCTION_NAME}")
    return fn, ns


def probe_live() -> Any:
    """The probe's ``ProbeResult`` of the function as it runs here now: the hooked call where
    the SGLang hook is live, upstream otherwise (None: topk not imported). Never raises."""
    from sglang_amd_moe.runtime.sglang.call import wrap_for_probe
    from sglang_amd_moe.runtime.sglang.hook import HOOK
    from sglang_amd_moe.runtime.sglang.probe import probe

    live = getattr(sys.modules.get(names.TOPK_MODULE), names.FUNCTION_NAME, None)
    if live is None:
        return None
    upstream = inspect.unwrap(live)
    with HOOK.lock:
        call = HOOK.active[0] if HOOK.active is not None and HOOK.is_live() else None
    if call is not None:
        flags, preds = call.hip_flags, call.predicates
        return probe(upstream, hip_flags=flags, predicates=preds, wrap=wrap_for_probe(call))
    try:
        r = ledger.read(Path(inspect.getsourcefile(upstream) or "").read_text("utf-8"))
    except (OSError, TypeError):
        return probe(upstream)
    return probe(upstream, hip_flags=r.hip_flags, predicates=r.predicates)

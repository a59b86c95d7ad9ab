"""The probe's own process: ``python -m sglang_amd_moe.runtime.sglang.child``.

A server never runs upstream's ``_post_process_topk_ids`` to decide about it: it starts this
module with its own interpreter and ``sys.path``, GPUs hidden, and reads the answer. Here,
the request (JSON on stdin) names the function; this process imports its module, runs the
probe (:mod:`.probe`) on upstream's function alone and on the hooked call of each plan the
server may pick, writes one JSON document (the verdict) on its stdout and exits at once.
Whatever the imported code prints goes to stderr; whatever it leaves behind (threads, files
it holds, settings) ends with this process.

Request fields: ``module``, ``qualname``, ``file`` (where the server's function lives; the
file is loaded under ``module`` when that name imports something else), ``source`` (the
function's text, when it is not its file's), ``hip_flags``, ``predicates``,
``remaps_on_hip``, ``ledger_plan`` (the ledger's plan for the body, or null), ``sys_path``.
"""

from __future__ import annotations
import __future__

import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import sys
import textwrap
import time
import types
from typing import Any

#: The verdict's layout: a cached verdict of another layout is probed again.
SCHEMA = 1


def _same_file(a: str | None, b: str | None) -> bool:
    try:
        return bool(a and b) and os.path.samefile(a, b)
    except OSError:
        return False


def _load(request: dict[str, Any]) -> types.ModuleType:
    """The module the server's function lives in, as it imports here (else from its file)."""
    name, file = request["module"], request.get("file") or ""
    try:
        mod = importlib.import_module(name)
    except Exception as exc:  # not importable by that name here: its file, under that name
        if not file:
            raise
        error: Exception | None = exc
    else:
        if not file or _same_file(getattr(mod, "__file__", None), file):
            return mod
        error = None
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file} as {name}") from error
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _function(mod: types.ModuleType, request: dict[str, Any]) -> tuple[Any, dict]:
    """(upstream's function, the namespace it runs in)."""
    from sglang_amd_moe.runtime.sglang.probe import rebind_all

    if request.get("source"):
        # The server runs a function whose text is not its file's (rewritten in place):
        # define that text over a copy of the module's namespace.
        ns = dict(vars(mod))
        where = f"<{request.get('file') or request['module']} as the server runs it>"
        flags = __future__.annotations.compiler_flag
        code = compile(textwrap.dedent(request["source"]), where, "exec", flags=flags)
        exec(code, ns)  # noqa: S102 - upstream's own text, in this throwaway process
        fn = rebind_all(ns, vars(mod)).get(request["qualname"])
        return fn, ns
    fn: Any = mod
    for part in request["qualname"].split("."):
        fn = getattr(fn, part)
    fn = inspect.unwrap(fn)
    return fn, getattr(fn, "__globals__", vars(mod))


def _plans(upstream: Any, request: dict[str, Any]) -> list[list[Any]]:
    """The plans the server may pick, in groups checked in order until one comes out right:
    behaviour's plan and its escalations, then the ledger's plan."""
    from sglang_amd_moe.runtime.sglang.call import Plan
    from sglang_amd_moe.runtime.sglang.hook import _plan_from_behaviour, alternatives

    groups: list[list[Any]] = []
    if upstream.usable and not upstream.correct:
        plan = _plan_from_behaviour(upstream, bool(request.get("remaps_on_hip", True)))
        if isinstance(plan, Plan) and plan.pre_mask:
            groups.append(list(alternatives(plan)))
    if upstream.usable and request.get("ledger_plan"):
        plan = Plan(**request["ledger_plan"])
        if plan.pre_mask:
            groups.append([plan])
    return groups


def verdict(request: dict[str, Any]) -> dict[str, Any]:
    """Probe what ``request`` names: the verdict document. Raises when the module does not
    load (the server reads the failure from the exit status and stderr)."""
    from sglang_amd_moe.runtime.sglang.call import Call, kernel_mask, wrap_for_probe
    from sglang_amd_moe.runtime.sglang.probe import probe
    from sglang_amd_moe.runtime.target import Args

    t0 = time.perf_counter()
    mod = _load(request)
    imported = time.perf_counter() - t0
    fn, ns = _function(mod, request)
    flags, preds = tuple(request.get("hip_flags", ())), tuple(request.get("predicates", ()))
    upstream = probe(fn, ns, hip_flags=flags, predicates=preds)
    checked: list[dict[str, Any]] = []
    if isinstance(fn, types.FunctionType):
        args = Args(fn)
        for group in _plans(upstream, request):
            for plan in group:
                call = Call(plan, mod, args, kernel_mask, flags, preds, lambda *a: None)
                result = probe(fn, ns, hip_flags=flags, predicates=preds, wrap=wrap_for_probe(call))
                checked.append({"plan": dataclasses.asdict(plan), "result": result.to_json()})
                if result.correct or not result.ran:
                    break
    return {
        "schema": SCHEMA,
        "upstream": upstream.to_json(),
        "checked": checked,
        "import_s": round(imported, 3),
        "probe_s": round(time.perf_counter() - t0 - imported, 4),
        "python": sys.version.split()[0],
        "pid": os.getpid(),
    }


def main() -> None:
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # what upstream prints (Python or C) goes to stderr, not into the verdict
    try:
        request = json.loads(sys.stdin.read())
        sys.path[:] = [p for p in request.get("sys_path", sys.path) if isinstance(p, str)]
        doc = verdict(request)
    except BaseException as exc:  # noqa: BLE001 - reported to the server, which decides
        print(f"sglang-amd-moe probe child: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(3)
    out.write(json.dumps(doc))
    out.flush()
    sys.stderr.flush()
    # No interpreter shutdown: threads or atexit handlers upstream's import left must not
    # hold the server's decision up.
    os._exit(0)


if __name__ == "__main__":
    main()

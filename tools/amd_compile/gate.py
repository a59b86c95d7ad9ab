"""The compile gate: capture, deduplicate, compile (or reuse), check.

- :func:`collect` captures every representative case's launches and turns each, for
  each target, into the compilation Triton would do; identical compilations (same
  key) are merged, counting the cases that need them.
- :func:`sweep` compiles all of them (``make amd-compile``).
- :func:`check` (``make test``) reuses the committed numbers for every key the
  results file holds, compiles the keys it does not hold, recompiles a few committed
  entries that must come out identical, and applies the policy to everything.

Compilation runs in worker processes forked from this one (``jobs``), each compiling
a share of the specs the parent already holds.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import triton

from . import policy, shapes
from .build import Spec, compile_spec, specialize
from .targets import TARGETS, Target


@dataclass
class Compilation:
    """One unique compilation and the cases that need it."""

    spec: Spec
    cases: int
    example: str  # the first case (in case order) that needs it
    max_grid: int = 0  # the largest grid (programs) a case launches it with

    def entry(self, resources: dict[str, Any]) -> dict[str, Any]:
        d = self.spec.describe()
        return {
            "key": self.spec.key,
            "kernel": d["kernel"],
            "target": self.spec.target.name,
            "config": self.spec.config(),
            "specialization": self.spec.specialization(),
            "cases": self.cases,
            "example": self.example,
            "max_grid": self.max_grid,
            "resources": resources,
        }


def collect(
    targets: tuple[Target, ...] = TARGETS,
    cases: list[shapes.Case] | None = None,
) -> dict[str, Compilation]:
    """Every unique compilation the representative cases need, by key."""
    found: dict[str, Compilation] = {}
    for case in shapes.all_cases() if cases is None else cases:
        for launch in shapes.capture(case):
            programs = 1
            for g in launch.grid:
                programs *= g
            for target in targets:
                spec = specialize(launch.kernel, launch.args, launch.meta, target)
                c = found.get(spec.key)
                if c is None:
                    found[spec.key] = Compilation(spec, 1, case.label, programs)
                else:
                    c.cases += 1
                    c.max_grid = max(c.max_grid, programs)
    return found


_WORK: list[Spec] = []


def _compile_one(i: int) -> tuple[int, dict[str, Any]]:
    try:
        return i, compile_spec(_WORK[i])
    except Exception as e:  # a kernel that does not compile is a finding, not a crash
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        return i, {"error": last[:500]}


def compile_many(
    specs: list[Spec], jobs: int = 1, progress: Callable[[int, int], None] | None = None
) -> list[dict[str, Any]]:
    """Resources of each spec, in order; ``jobs`` worker processes (forked)."""
    global _WORK
    _WORK = list(specs)
    out: list[dict[str, Any] | None] = [None] * len(specs)
    try:
        if jobs <= 1 or len(specs) <= 1:
            for i in range(len(specs)):
                out[i] = _compile_one(i)[1]
                if progress:
                    progress(i + 1, len(specs))
        else:
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(jobs) as pool:
                for n, (i, res) in enumerate(
                    pool.imap_unordered(_compile_one, range(len(specs))), start=1
                ):
                    out[i] = res
                    if progress:
                        progress(n, len(specs))
    finally:
        _WORK = []
    return out  # type: ignore[return-value]


def evaluate(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries that break the policy, each with its problems."""
    failing = []
    for e in entries:
        found = policy.problems(
            e["kernel"], e["target"], e["config"], e["resources"], max_grid=e.get("max_grid")
        )
        if found:
            failing.append(
                {**{k: e[k] for k in ("key", "kernel", "target", "example")}, "problems": found}
            )
    return failing


def sweep(
    jobs: int = 1,
    progress: Callable[[int, int], None] | None = None,
    reuse: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Compile every unique compilation; return the entries and timings.

    ``reuse``: committed results (of this Triton version) whose numbers are kept for the
    keys they hold, so only the compilations they lack are compiled. A key hashes
    everything that determines a compilation's code, so a held key's numbers are what
    compiling it gives (``check`` recompiles some of them and requires identical ones).
    """
    t0 = time.monotonic()
    found = collect()
    t1 = time.monotonic()
    held = {}
    if reuse is not None and reuse.get("triton") == triton.__version__:
        held = reuse["entries"]
    keys = sorted(found)
    todo = [k for k in keys if k not in held]
    fresh = dict(
        zip(todo, compile_many([found[k].spec for k in todo], jobs, progress), strict=True)
    )
    t2 = time.monotonic()
    entries = [found[k].entry(fresh[k] if k in fresh else held[k]["resources"]) for k in keys]
    return {
        "triton": triton.__version__,
        "entries": entries,
        "compiled": len(todo),
        "seconds": {"collect": round(t1 - t0, 1), "compile": round(t2 - t1, 1)},
    }


def spot_check_keys(entries: list[dict[str, Any]]) -> list[str]:
    """The committed entries recompiled on every run: for each kernel and target, the
    one using the most registers (the likeliest to move when Triton or LLVM change
    their allocation), ties broken by key."""

    def pressure(e: dict[str, Any]) -> int:
        r = e["resources"]
        return r.get("vgpr_total", r.get("regs", -1))

    best: dict[tuple[str, str], dict[str, Any]] = {}
    for e in sorted(entries, key=lambda e: e["key"]):
        if "error" in e["resources"]:
            continue
        k = (e["kernel"], e["target"])
        if k not in best or pressure(e) > pressure(best[k]):
            best[k] = e
    return sorted(e["key"] for e in best.values())


def check(committed: dict[str, Any], jobs: int = 1) -> dict[str, Any]:
    """Apply the gate to the current kernels, reusing ``committed`` results.

    Returns a report: ``missing`` (keys compiled because the results file lacks them),
    ``stale`` (committed keys no current case needs), ``changed`` (keys whose case count
    or example changed), ``spot`` (recompiled committed entries and whether they came out
    identical), ``violations`` (entries that break the policy), ``unused_exceptions``,
    and ``entries`` (all current entries, committed numbers where present).
    """
    t0 = time.monotonic()
    found = collect()
    t1 = time.monotonic()
    held = committed["entries"] if committed.get("triton") == triton.__version__ else {}
    missing = sorted(k for k in found if k not in held)
    stale = sorted(k for k in committed["entries"] if k not in found)
    current = {k: found[k].entry(held[k]["resources"]) for k in found if k in held}
    changed = sorted(
        k
        for k, e in current.items()
        if (e["cases"], e["example"], e["max_grid"])
        != (held[k]["cases"], held[k]["example"], held[k].get("max_grid"))
    )
    spot = spot_check_keys(list(current.values()))
    fresh = compile_many([found[k].spec for k in missing + spot], jobs)
    t2 = time.monotonic()
    for k, r in zip(missing, fresh[: len(missing)], strict=True):
        current[k] = found[k].entry(r)
    spot_report = [
        {
            "key": k,
            "kernel": held[k]["kernel"],
            "target": held[k]["target"],
            "committed": held[k]["resources"],
            "compiled": r,
            "identical": r == held[k]["resources"],
        }
        for k, r in zip(spot, fresh[len(missing) :], strict=True)
    ]
    entries = [current[k] for k in sorted(current)]
    unused = policy.unused_exceptions((e["kernel"], e["target"], e["config"]) for e in entries)
    return {
        "triton": triton.__version__,
        "committed_triton": committed.get("triton"),
        "compilations": len(found),
        "missing": missing,
        "stale": stale,
        "changed": changed,
        "spot": spot_report,
        "violations": evaluate(entries),
        "unused_exceptions": [f"{e.kernel} {dict(e.where)} on {e.targets}" for e in unused],
        "entries": entries,
        "seconds": {"collect": round(t1 - t0, 1), "compile": round(t2 - t1, 1)},
    }

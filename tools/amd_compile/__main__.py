"""Command line of the compile gate (run from the repository root).

    python -m tools.amd_compile sweep [--jobs N] [--reuse]
                                                  compile everything, rewrite
                                                  tools/amd_compile/results.json and
                                                  docs/amd.md (make amd-compile);
                                                  --reuse: keep the committed numbers
                                                  of the keys the results hold and
                                                  compile only the others
    python -m tools.amd_compile check [--json F] [--render-docs F]
                                                  the gate of make test: reuse the
                                                  committed results, compile what they
                                                  lack, recompile a few, check all
    python -m tools.amd_compile docs              rewrite docs/amd.md from the results

Kernels must be compiled, not interpreted, and every compilation must really happen:
Triton decides both when it is imported, so this sets ``TRITON_INTERPRET=0`` and a
fresh, temporary ``TRITON_CACHE_DIR`` before importing it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS_PATH = REPO / "docs" / "amd.md"


def _progress(done: int, total: int) -> None:
    if done == total or done % 50 == 0:
        print(f"  compiled {done}/{total}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.amd_compile", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("sweep", "check", "docs"):
        p = sub.add_parser(name)
        p.add_argument("--results", type=Path, default=None, help="results file")
        if name != "docs":
            p.add_argument("--jobs", type=int, default=2, help="compiler processes")
        if name != "check":
            p.add_argument("--docs", type=Path, default=DOCS_PATH, help="docs/amd.md to write")
        if name == "sweep":
            p.add_argument(
                "--reuse",
                action="store_true",
                help="compile only the keys the results file lacks (keep its other numbers)",
            )
    check_p = sub.choices["check"]
    check_p.add_argument("--json", type=Path, help="write the full report here")
    check_p.add_argument(
        "--render-docs", type=Path, help="write what the committed results generate here"
    )
    args = parser.parse_args(argv)

    from . import report, results

    results_path = args.results or results.RESULTS_PATH
    if args.command == "docs":
        committed = results.load(results_path)
        args.docs.write_text(
            report.render(committed["triton"], list(committed["entries"].values()))
        )
        return 0

    if "triton" in sys.modules:
        raise SystemExit("tools.amd_compile must import Triton itself (run it as a process)")
    os.environ["TRITON_INTERPRET"] = "0"
    cache = tempfile.mkdtemp(prefix="amd-compile-triton-cache-")
    os.environ["TRITON_CACHE_DIR"] = cache
    try:
        from . import gate

        if args.command == "sweep":
            reuse = results.load(results_path) if args.reuse else None
            out = gate.sweep(args.jobs, _progress, reuse)
            results.save(out["triton"], out["entries"], results_path)
            args.docs.write_text(report.render(out["triton"], out["entries"]))
            failing = gate.evaluate(out["entries"])
            print(
                f"{len(out['entries'])} compilations with Triton {out['triton']}, "
                f"{out['compiled']} compiled now ({out['seconds']}); "
                f"{len(failing)} break the policy"
            )
            for f in failing:
                print(f"  {f['target']} {f['kernel']} [{f['key']}]: {'; '.join(f['problems'])}")
                print(f"      e.g. {f['example']}")
            return 1 if failing else 0

        committed = results.load(results_path)
        out = gate.check(committed, args.jobs)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1, sort_keys=True))
        if args.render_docs:
            args.render_docs.write_text(
                report.render(committed["triton"], list(committed["entries"].values()))
            )
        bad_spot = [s for s in out["spot"] if not s["identical"]]
        print(
            f"{out['compilations']} compilations with Triton {out['triton']}: "
            f"{len(out['missing'])} not in the results file (compiled), "
            f"{len(out['stale'])} stale, {len(out['spot'])} recompiled "
            f"({len(bad_spot)} differ), {len(out['violations'])} break the policy "
            f"({out['seconds']})"
        )
        for v in out["violations"]:
            print(f"  {v['target']} {v['kernel']} [{v['key']}]: {'; '.join(v['problems'])}")
        ok = not (out["missing"] or out["stale"] or out["changed"] or bad_spot)
        ok = ok and not (out["violations"] or out["unused_exceptions"])
        return 0 if ok else 1
    finally:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

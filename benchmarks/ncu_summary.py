"""Print a Markdown table, one row per profiled kernel launch, from an Nsight Compute CSV.

The CSV is what ``benchmarks/device.sh profile`` writes (``ncu --csv --page details`` over
``benchmarks/tune.py --profile``): the lines the program printed (``profiled: ...``, one
per target, each target called twice) come before ncu's table, so the targets are
listed first. docs/profile.md quotes these tables.

    python benchmarks/ncu_summary.py benchmarks/results/ncu-run4.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

COLUMNS = [
    ("Duration", "ns"),
    ("Registers Per Thread", "regs"),
    ("Theoretical Occupancy", "occ. theor. %"),
    ("Achieved Occupancy", "occ. achieved %"),
    ("Compute (SM) Throughput", "SM %"),
    ("Memory Throughput", "memory %"),
    ("Warp Cycles Per Issued Instruction", "cycles/issue"),
]


def summarize(path: Path) -> list[str]:
    text = path.read_text()
    rows = list(csv.reader(text.splitlines()))
    targets = [
        line.removeprefix("profiled: ").split(" SortPlan")[0].split(" (")[0]
        for line in text.splitlines()
        if line.startswith("profiled: ")
    ]
    header = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    kernels: dict[str, dict[str, str]] = {}
    for r in rows[header + 1 :]:
        if len(r) < 15:
            continue
        k = kernels.setdefault(r[0], {"name": r[4], "grid": r[8]})
        k[r[12]] = r[14]
    out = [f"Targets in launch order, each called twice: {'; '.join(targets)}.", ""]
    out.append("| # | kernel | grid | " + " | ".join(label for _, label in COLUMNS) + " |")
    out.append("|" + " --- |" * (3 + len(COLUMNS)))
    for i, k in kernels.items():
        grid = k["grid"].strip("()").split(",")[0]
        out.append(
            f"| {i} | {k['name']} | {grid} | "
            + " | ".join(k.get(m, "-") for m, _ in COLUMNS)
            + " |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    a = ap.parse_args(argv)
    print("\n".join(summarize(a.csv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

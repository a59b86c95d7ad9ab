"""The committed benchmark documents are what the committed results generate.

docs/benchmarks.md must come from benchmarks/results/h200.json (and its notes file) by
benchmarks/report.py, and the profile tables from the committed Nsight Compute CSVs by
benchmarks/ncu_summary.py, so that no number in the docs is typed in by hand.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import ncu_summary  # benchmarks/, on pytest's pythonpath
import pytest
import report  # benchmarks/, on pytest's pythonpath

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"


def test_benchmarks_md_is_generated_from_the_committed_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Plots are drawn on the GPU machine; here reuse the committed ones, as `make
    # bench-docs` does where matplotlib is missing.
    monkeypatch.setattr(report, "plot", lambda results, out_dir: [])
    for png in (REPO / "docs").glob("bench_*.png"):
        shutil.copy(png, tmp_path / png.name)
    out = tmp_path / "benchmarks.md"
    report.main(
        [
            "--results",
            str(BENCH / "results" / "h200.json"),
            "--notes-file",
            str(BENCH / "results" / "h200-notes.md"),
            "--out",
            str(out),
            "--plots-dir",
            str(tmp_path),
        ]
    )
    assert out.read_text() == (REPO / "docs" / "benchmarks.md").read_text(), (
        "docs/benchmarks.md differs from what `make bench-docs` generates"
    )


@pytest.mark.parametrize("csv_name", ["ncu-run1.csv", "ncu-run4.csv"])
def test_profile_md_quotes_the_committed_ncu_tables(csv_name: str) -> None:
    table = ncu_summary.summarize(BENCH / "results" / csv_name)
    assert len(table) > 10 and table[2].startswith("| # | kernel |")
    profile = (REPO / "docs" / "profile.md").read_text()
    assert "\n".join(table) in profile, f"docs/profile.md does not hold the table of {csv_name}"

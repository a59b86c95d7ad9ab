#!/usr/bin/env python3
"""Re-read the plugin's log lines of a committed record from its committed server logs.

The harness parses each server's log once, after the checks, into ``runs.<x>.log``. A
record made while its line pattern missed lines (the guard's start-up line follows a
graph-capture progress bar on the same line) can be brought up to date from the logs it
was made from, without another GPU run: this replaces ``runs.<x>.log.plugin_lines`` with
what ``harness.parse_log`` finds in ``<prefix>-<x>.log`` now, leaves every other field as
the harness wrote it, and notes the change in the record (``reparsed``).

    python benchmarks/server/reparse.py benchmarks/results/server-h100-guard.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness import parse_log  # the same folder: found as the script's own


def reparse(record: Path) -> list[str]:
    """Update ``record`` in place; returns the runs whose plugin lines changed."""
    doc = json.loads(record.read_text())
    changed = []
    for label, run in doc["runs"].items():
        log = record.with_name(f"{record.stem}-{label}.log")
        if not log.is_file() or "log" not in run:
            continue
        lines = parse_log(log.read_text(errors="replace"))["plugin_lines"]
        if lines != run["log"].get("plugin_lines"):
            run["log"]["plugin_lines"] = lines
            changed.append(label)
    if changed:
        doc["reparsed"] = {
            "by": "benchmarks/server/reparse.py",
            "fields": [f"runs.{x}.log.plugin_lines" for x in changed],
            "why": "the harness's line pattern missed plugin lines that follow a progress "
            "bar on the same line",
        }
        record.write_text(json.dumps(doc, indent=1, sort_keys=False, default=str))
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", type=Path, nargs="+")
    args = ap.parse_args(argv)
    for record in args.records:
        print(f"{record}: plugin lines re-read for runs {reparse(record) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

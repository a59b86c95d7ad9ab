"""The committed results file: one record per unique compilation, keyed by what
determines its code.

Why a committed file: compiling every configuration for three targets takes minutes,
and CI starts from a fresh clone with no cache. With the file, a CI run recompiles only
what changed (a key it does not hold) plus a few entries that must reproduce their
committed numbers exactly, so the file cannot drift from what Triton produces.

Format: JSON, one entry per line (sorted by kernel, target, key) so that a change of
kernel shows as a readable diff. Pure data: no Triton import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS_PATH = Path(__file__).resolve().parent / "results.json"

# Fields of an entry, in the order they are written.
ENTRY_FIELDS = (
    "key", "kernel", "target", "config", "specialization", "cases", "example", "max_grid",
)  # fmt: skip


def entry_sort_key(entry: dict[str, Any]) -> tuple:
    return (entry["kernel"], entry["target"], entry["key"])


def dumps(triton_version: str, entries: list[dict[str, Any]]) -> str:
    """The file's text: a header line, then one entry per line."""
    lines = [
        "{",
        f'"triton": {json.dumps(triton_version)},',
        '"generated_by": "make amd-compile",',
        '"entries": [',
    ]
    ordered = sorted(entries, key=entry_sort_key)
    for i, entry in enumerate(ordered):
        record = {k: entry[k] for k in (*ENTRY_FIELDS, "resources")}
        sep = "," if i < len(ordered) - 1 else ""
        lines.append(json.dumps(record, sort_keys=False, separators=(",", ":")) + sep)
    lines += ["]", "}", ""]
    return "\n".join(lines)


def load(path: Path = RESULTS_PATH) -> dict[str, Any]:
    """``{"triton": version, "entries": {key: entry}}``; empty when there is no file."""
    if not path.exists():
        return {"triton": None, "entries": {}}
    data = json.loads(path.read_text())
    return {"triton": data["triton"], "entries": {e["key"]: e for e in data["entries"]}}


def save(triton_version: str, entries: list[dict[str, Any]], path: Path = RESULTS_PATH) -> None:
    path.write_text(dumps(triton_version, entries))

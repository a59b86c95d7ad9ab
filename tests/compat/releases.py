"""The SGLang releases we test against, and how to build their environments.

Each entry is one environment under ``.compat/<label>/`` layered on ``.venv`` (see
``build_env.py``), except the main release, which lives in ``.venv`` itself.
``expected_form`` is what BRIEF's table says the release's ``_post_process_topk_ids``
is; the tests check the classifier against it on the real installed source.

Usage::

    python tests/compat/releases.py build LABEL     # one environment
    python tests/compat/releases.py build-ci        # one release of each form (make test)
    python tests/compat/releases.py build-all       # every release (make compat)
    python tests/compat/releases.py list            # labels and their state, as JSON
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv"
COMPAT = REPO / ".compat"
MAIN_RELEASE = "0.5.23"


@dataclass(frozen=True)
class Release:
    label: str
    version: str
    expected_form: str
    has_plugin_loader: bool
    ci: bool
    patch: str | None = None  # relative to the repository root

    @property
    def venv(self) -> Path:
        return VENV if self.version == MAIN_RELEASE and self.patch is None else COMPAT / self.label

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def is_built(self) -> bool:
        return (self.venv / "sglang_release.json").exists()


RELEASES = [
    Release("0.5.10", "0.5.10", "no-hip-handling", False, ci=True),
    Release("0.5.11", "0.5.11", "no-hip-handling", True, ci=False),
    Release("0.5.12.post1", "0.5.12.post1", "no-hip-handling", True, ci=True),
    Release("0.5.13", "0.5.13", "weights-only", True, ci=False),
    Release("0.5.13.post1", "0.5.13.post1", "weights-only", True, ci=True),
    Release("0.5.14", "0.5.14", "fixed", True, ci=False),
    Release(
        "0.5.14-mask-under-eplb-guard",
        "0.5.14",
        "mask-under-eplb-guard",
        True,
        ci=True,
        patch="tests/compat/reverse_28378_mask_under_eplb_guard.diff",
    ),
    Release("0.5.17", "0.5.17", "fixed", True, ci=False),
    Release("0.5.19", "0.5.19", "fixed", True, ci=False),
    Release(MAIN_RELEASE, MAIN_RELEASE, "fixed", True, ci=True),
]
BY_LABEL = {r.label: r for r in RELEASES}


def build(rel: Release) -> None:
    if rel.venv == VENV:
        if not rel.is_built():
            raise SystemExit(f"{rel.label} lives in .venv: run `make venv` first")
        return
    cmd = [
        str(VENV / "bin" / "python"),
        str(REPO / "tests" / "compat" / "build_env.py"),
        "--version",
        rel.version,
        "--dest",
        str(rel.venv),
        "--shared",
        str(VENV),
        "--label",
        rel.label,
    ]
    if rel.patch:
        cmd += ["--patch", str(REPO / rel.patch)]
    subprocess.run(cmd, check=True)


def ensure(rels: list[Release]) -> None:
    for rel in rels:
        if rel.is_built():
            print(f"[releases] {rel.label}: ready at {rel.venv}", flush=True)
        else:
            build(rel)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, *rest = argv
    if cmd == "build":
        ensure([BY_LABEL[label] for label in rest])
    elif cmd == "build-ci":
        ensure([r for r in RELEASES if r.ci])
    elif cmd == "build-all":
        ensure(RELEASES)
    elif cmd == "list":
        print(json.dumps([dict(asdict(r), built=r.is_built(), venv=str(r.venv)) for r in RELEASES], indent=2))
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

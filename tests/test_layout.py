"""The repository's layout rules that code review would otherwise have to catch.

- Tests and tools import through configured paths (pytest's ``pythonpath`` in
  pyproject.toml; a script's own folder), never by editing ``sys.path`` or loading a
  file a second time under another name.
- The tools in ``tools/`` still run as scripts, as the Makefile runs them.
- ``-m "not sglang"`` leaves out every test under ``tests/sglang``, which conftest.py
  marks by folder.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# benchmarks/run.py and tune.py load peer kernels and baselines by path on the GPU
# machine; every other Python file of tests/, tools/ and benchmarks/ is held to the rule.
PATH_EDITS_ALLOWED = {
    "benchmarks/run.py",
    "benchmarks/tune.py",
    # Runs in the GPU machine's server processes, not under pytest: it loads the
    # sitecustomize it shadows by file, so the image's own one still runs.
    "benchmarks/server/site/sitecustomize.py",
    # Loads topk modules the tests generate into a temporary folder: not an import of a
    # helper, the module under test is written by the test itself.
    "tests/sglang/synthetic_topk.py",
    # Serves a patched topk.py, written by the test itself, as a release's topk module.
    "tests/sglang/driver.py",
}


def _path_edits(tree: ast.AST) -> list[str]:
    """``sys.path.insert/append/extend(...)`` and ``spec_from_file_location(...)`` calls
    (code only: text inside strings, such as a script a test runs elsewhere, is not code)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = ast.unparse(func)
        if name.endswith("spec_from_file_location") or (
            isinstance(func, ast.Attribute)
            and func.attr in ("insert", "append", "extend")
            and ast.unparse(func.value) == "sys.path"
        ):
            found.append(f"line {node.lineno}: {name}(...)")
    return found


def test_no_sys_path_edits_in_tests_tools_and_benchmarks() -> None:
    # The committed files only (extracted peer code under benchmarks/ is git-ignored).
    listed = subprocess.run(
        ["git", "ls-files", "--", "tests/*.py", "tools/*.py", "benchmarks/*.py"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout.split()
    assert "tests/test_layout.py" in listed
    offenders = {}
    for rel in listed:
        if rel in PATH_EDITS_ALLOWED or not (REPO / rel).exists():
            continue
        edits = _path_edits(ast.parse((REPO / rel).read_text(), filename=rel))
        if edits:
            offenders[rel] = edits
    assert not offenders, f"import through pytest's pythonpath instead: {offenders}"


def test_releases_tool_runs_as_a_script() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "compat" / "releases.py"), "list"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO / "tests",  # not the repository root: nothing may rely on the cwd
    )
    assert proc.returncode == 0, proc.stderr
    labels = {r["label"] for r in json.loads(proc.stdout)}
    assert "0.5.23" in labels and "0.5.14-mask-under-eplb-guard" in labels


def test_not_sglang_deselects_every_test_under_tests_sglang() -> None:
    """One collection of tests/sglang with ``-m "not sglang"``: every test is deselected."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["-m", "not sglang", "tests/sglang"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode in (0, 5), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not [line for line in proc.stdout.splitlines() if "::" in line]
    found = re.search(r"(\d+)/(\d+) tests? deselected|(\d+) deselected", proc.stdout)
    assert found, proc.stdout[-1000:]
    deselected = int(found.group(2) or found.group(3))
    assert deselected > 20  # every release of the suite, so the check above means it

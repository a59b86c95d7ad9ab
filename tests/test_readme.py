"""What the README and the user docs claim, checked against what they rest on.

- The "am I affected?" table is the one ``tools/compat/coverage_table.py`` renders from the
  committed coverage table (read from every release's wheel), and docs/coverage.md too.
- That table names SGLang releases and their forms: every release of the compatibility
  matrix (docs/compat.md, generated from real installs) falls in exactly one of its rows,
  with the same form and the same plugin action (cannot load, hooked, or left to upstream).
- No command in them installs SGLang from the package registry, and no extra of this
  package pulls it in: in a ROCm image that would replace the ROCm torch with the
  registry's CUDA one.
- Their relative links and anchors resolve.
- The top-level ``--help`` lists the exit codes, as the reference says it does.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from sglang_amd_moe.diagnostics import cli

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
#: The user docs this project writes for people installing and running it.
USER_DOCS = [
    README,
    *(REPO / "docs" / n for n in ("install.md", "reference.md", "validate-on-amd.md")),
]
FORM = re.compile(r"`([a-z-]+)`")


def _table(text: str, first_header: str) -> list[list[str]]:
    """The rows (cells stripped, bold marks dropped) of the markdown table whose header
    starts with ``| first_header |``."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_header} |"))
    rows = []
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip().replace("**", "") for c in ln.strip().strip("|").split("|")])
    return rows


def _range(cell: str) -> tuple[Version | None, Version | None]:
    """``<= 0.5.9``, ``0.5.10 - 0.5.10.post1``, ``0.5.16`` or ``0.5.14+`` as (low, high),
    inclusive."""
    if cell.startswith("<="):
        return None, Version(cell[2:].strip())
    if cell.endswith("+"):
        return Version(cell[:-1].strip()), None
    low, _, high = cell.partition(" - ")
    return Version(low.strip()), Version((high or low).strip())


def _contains(bounds: tuple[Version | None, Version | None], v: Version) -> bool:
    low, high = bounds
    return (low is None or v >= low) and (high is None or v <= high)


def affected_table(readme: str) -> list[dict]:
    out = []
    for cells in _table(readme, "SGLang"):
        form = FORM.search(cells[1])
        out.append(
            {
                "range": _range(cells[0]),
                "label": cells[0],
                "form": form.group(1) if form else None,
                "cells": cells,
                "expert_parallel": cells[4],
            }
        )
    return out


def compat_releases(compat: str) -> list[dict]:
    """The matrix's released versions (the rebuilt, never-released form is left out)."""
    out = []
    for cells in _table(compat, "release"):
        try:
            version = Version(cells[0])
        except ValueError:
            continue
        out.append({"version": version, "form": cells[1].strip("*"), "action": cells[2]})
    return out


def table_problems(readme: str, compat: str) -> list[str]:
    """Where the README's "am I affected?" table disagrees with docs/compat.md."""
    table, matrix = affected_table(readme), compat_releases(compat)
    problems = []
    if len(table) < 8 or len(matrix) < 8:
        return [f"tables too small to check: {len(table)} README rows, {len(matrix)} releases"]
    for a, b in zip(table, table[1:], strict=False):
        if a["range"][1] is None or b["range"][0] is None or a["range"][1] >= b["range"][0]:
            problems.append(f"rows out of order or overlapping: {a['label']}, {b['label']}")
    for rel in matrix:
        v = rel["version"]
        rows = [row for row in table if _contains(row["range"], v)]
        if len(rows) != 1:
            problems.append(f"{v} is in {len(rows)} rows of the README's table")
            continue
        row = rows[0]
        if row["form"] != rel["form"]:
            problems.append(f"{v}: README says {row['form']}, docs/compat.md {rel['form']}")
        cannot_load = "plugin cannot load" in rel["action"]
        if cannot_load != ("cannot load" in " ".join(row["cells"])):
            problems.append(f"{v}: 'cannot load' is {cannot_load} in docs/compat.md")
        if rel["action"].startswith("hooked") and "hook masks" not in row["expert_parallel"]:
            problems.append(f"{v}: hooked, but the README's count-carrying cell has no hook")
        if rel["form"] == "fixed" and (
            "upstream masks" not in row["expert_parallel"] or "hook" in row["expert_parallel"]
        ):
            problems.append(f"{v}: fixed, but the README's count-carrying cell disagrees")
    for row in table:
        if row["form"] == "absent":
            if row["range"][0] is not None or "cannot load" not in row["cells"][2]:
                problems.append(f"{row['label']}: the `absent` row must be the oldest, unloadable")
    return problems


def coverage_problems(readme: str) -> list[str]:
    """Where the README's table disagrees with the coverage table (every release): each
    release in exactly one row, of its form; every row holds a release."""
    import coverage_table

    table, problems = affected_table(readme), []
    held = {row["label"]: 0 for row in table}
    for rec in coverage_table.committed():
        rows = [row for row in table if _contains(row["range"], Version(rec["release"]))]
        if len(rows) != 1:
            problems.append(f"{rec['release']} is in {len(rows)} rows of the README's table")
            continue
        held[rows[0]["label"]] += 1
        if rows[0]["form"] != rec["form"]:
            problems.append(f"{rec['release']}: README {rows[0]['form']}, table {rec['form']}")
    problems += [f"no release in {label}" for label, n in held.items() if not n and
                 not label.startswith("<=")]  # fmt: skip
    return problems


def test_affected_table_agrees_with_the_compatibility_matrix() -> None:
    readme, compat = README.read_text(), (REPO / "docs" / "compat.md").read_text()
    assert table_problems(readme, compat) == []
    assert coverage_problems(readme) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("| 0.5.13 - 0.5.13.post1 | `weights-only` |", "| 0.5.13 - 0.5.13.post1 | `fixed` |"),
        ("| 0.5.14 - 0.5.15.post1 | `fixed` |", "| 0.5.15 - 0.5.15.post1 | `fixed` |"),
        ("| 0.5.11 - 0.5.12.post1 |", "| 0.5.10 - 0.5.12.post1 |"),  # 0.5.10 in two rows
        ("count: **hook** masks", "count: upstream masks"),
    ],
)
def test_affected_table_check_can_fail(old: str, new: str) -> None:
    """The check above catches a README whose table went wrong."""
    readme, compat = README.read_text(), (REPO / "docs" / "compat.md").read_text()
    assert old in readme
    changed = readme.replace(old, new)
    assert table_problems(changed, compat) + coverage_problems(changed) != []


def test_affected_table_and_coverage_doc_are_the_generated_ones() -> None:
    """The README's table and docs/coverage.md are what the coverage tool renders from the
    committed table (``python tools/compat/coverage_table.py write`` regenerates all three)."""
    import coverage_table

    recs = coverage_table.committed()
    readme = README.read_text()
    assert coverage_table.readme_with(readme, coverage_table.readme_table(recs)) == readme
    assert coverage_table.DOC.read_text() == coverage_table.doc_text(recs)
    assert [r["release"] for r in recs] == list(coverage_table.VERSIONS)


def test_readme_says_what_tp_rows_hold_and_the_gsm8k_story_as_upstream_told_it() -> None:
    """TP: what the padded rows hold and how we know (the server run, its number), with the
    one flag that changes it; the GSM8K drop told as upstream reported it next to what
    the code shows, never as what protects a TP user."""
    readme = " ".join(README.read_text().split())
    assert "0 of 73,728 padded routed entries out of range" in readme
    assert "--cuda-graph-backend-prefill full" in readme
    assert "as upstream reported it" in readme and "What the code shows" in readme
    assert "It is no reason a TP user is protected" in readme
    for bypass in ("MegaMoEV2", "W4A8", "FHMoE"):
        assert bypass in readme, bypass
    assert "0.138" in readme and "0.950" in readme
    server = " ".join((REPO / "docs" / "server.md").read_text().split())
    assert "| d | 73728 entries, ids 5..209, 0 out of range" in server


def _install_commands(text: str) -> list[str]:
    """Every ``pip install ...`` command in the text (code blocks and inline code), with
    continuation lines joined."""
    text = text.replace("\\\n", " ")
    return [m.group(0) for m in re.finditer(r"pip\s+install\b[^\n`]*", text)]


def _installs_sglang(command: str) -> bool:
    for word in command.split()[2:]:
        word = word.strip("'\"")
        if word.startswith("-") or "/" in word or word.endswith(".whl"):
            continue  # options, paths and wheel files: nothing from the registry
        try:
            req = Requirement(word)
        except ValueError:
            continue
        if req.name.lower().replace("_", "-") == "sglang" or "e2e" in req.extras:
            return True
    return False


def test_no_doc_installs_sglang_from_the_registry() -> None:
    assert _installs_sglang("python -m pip install sglang==0.5.13.post1")
    assert _installs_sglang("pip install 'sglang-amd-moe[e2e]'")
    assert not _installs_sglang(
        "python -m pip install ./dist/sglang_amd_moe-0.1.0-py3-none-any.whl"
    )
    docs = [README, *sorted((REPO / "docs").glob("*.md"))]
    found = {
        str(doc.relative_to(REPO)): cmd
        for doc in docs
        for cmd in _install_commands(doc.read_text())
        if _installs_sglang(cmd)
    }
    assert not found, found


def test_no_extra_pulls_sglang() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for extra, reqs in project.get("optional-dependencies", {}).items():
        for req in reqs:
            assert Requirement(req).name.lower() != "sglang", (extra, req)
    assert "e2e" not in project.get("optional-dependencies", {})


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {
        _slug(ln.lstrip("#")) for ln in path.read_text().splitlines() if re.match(r"#{1,6} ", ln)
    }


def test_links_and_anchors_resolve() -> None:
    broken = []
    for doc in USER_DOCS:
        prose = re.sub(r"```.*?```|`[^`\n]*`", "", doc.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, broken


def test_readme_is_one_screenful_of_sections() -> None:
    """Short enough to read at once (the coverage table, per release, path and model, is
    most of it)."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 170, len(lines)
    headings = [ln for ln in lines if ln.startswith("## ")]
    for needed in ("Am I affected", "Install", "Verify", "Turn it off", "What it costs"):
        assert any(needed in h for h in headings), needed


def test_top_level_help_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/reference.md says `sglang-amd-moe --help` lists the exit codes too."""
    assert (
        "`sglang-amd-moe --help` and `sglang-amd-moe audit --help` say the same"
        in (REPO / "docs" / "reference.md").read_text()
    )
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "exit status:" in text
    assert re.search(r"audit\s+0 nothing needs action, 1 something needs attention, 2", text)
    assert re.search(r"check, demo\s+0 every row with the plugin matches, 1 a row", text)

"""The docs agree with the code and with each other: every ``SGLANG_AMD_MOE_*`` variable
the package reads is in ``--help``, the README and docs/reference.md (and nothing stale is);
the README and docs/reference.md give one measured ``make test`` time; docs/architecture.md
names every kernel module."""

from __future__ import annotations

import re
from pathlib import Path

from sglang_amd_moe.diagnostics import cli

REPO = Path(__file__).resolve().parents[1]
VARIABLE = re.compile(r"SGLANG_AMD_MOE_[A-Z0-9_]*[A-Z0-9]")
TEST_ONLY = re.compile(r"SGLANG_AMD_MOE_TEST_")
MAKE_TEST_TIME = re.compile(r"`make test` from a fresh clone took ([^(;.]+?) on a\s+2-core machine")


def _variables(text: str) -> set[str]:
    return {v for v in VARIABLE.findall(text) if not TEST_ONLY.match(v)}


def read_by_code() -> set[str]:
    """Every variable named in the package's source, the environment module's ``PREFIX +
    NAME`` reads included."""
    found: set[str] = set()
    for path in [*(REPO / "sglang_amd_moe").rglob("*.py"), *(REPO / "kernels").glob("*.py")]:
        text = path.read_text()
        found |= _variables(text)
        found |= {f"SGLANG_AMD_MOE_{n}" for n in re.findall(r'PREFIX \+ "([A-Z0-9_]+)"', text)}
    return found


def in_reference() -> set[str]:
    text = (REPO / "docs" / "reference.md").read_text()
    section = text.split("## Settings: environment variables", 1)[1].split("\n## ", 1)[0]
    return _variables(section)


def test_every_variable_is_documented_everywhere() -> None:
    code = read_by_code()
    assert {"SGLANG_AMD_MOE_GUARD", "SGLANG_AMD_MOE_STRICT"} <= code
    help_ = _variables(" ".join(cli.VARIABLES))
    readme = _variables((REPO / "README.md").read_text())
    reference = in_reference()
    assert _variables(cli.usage()) == help_
    for where, names in (("--help", help_), ("README.md", readme), ("reference", reference)):
        assert code - names == set(), f"{where} lacks {sorted(code - names)}"
        assert names - code == set(), f"{where} names {sorted(names - code)}, read by no code"


def test_one_measured_make_test_time() -> None:
    readme = MAKE_TEST_TIME.findall((REPO / "README.md").read_text())
    reference = MAKE_TEST_TIME.findall((REPO / "docs" / "reference.md").read_text())
    assert len(readme) == len(reference) == 1, (readme, reference)
    assert readme == reference
    assert re.fullmatch(r"\d+ min \d+ s( to \d+ min \d+ s)?", readme[0]), readme


def test_architecture_names_every_kernel_module() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    missing = [p.name for p in sorted((REPO / "kernels").glob("*.py")) if p.name != "__init__.py"]
    missing = [name for name in missing if name not in text]
    assert not missing, f"docs/architecture.md does not name kernels/{missing}"


def test_install_commands_name_this_version() -> None:
    """The wheel file the README and docs/install.md tell users to install is this
    version's (0.1.0's wheel lacked the audit: a stale name sends users to it)."""
    import sglang_amd_moe

    for doc in ("README.md", "docs/install.md"):
        names = set(
            re.findall(r"sglang_amd_moe-([\w.]+)-py3-none-any\.whl", (REPO / doc).read_text())
        )
        assert names == {sglang_amd_moe.__version__}, (doc, names)

"""The built wheel carries the kernels and patches inside the package, and nothing else
at the top level (a top-level ``kernels`` would clash with the unrelated registry
package of that name that SGLang depends on)."""

from __future__ import annotations

import ast
import subprocess
import zipfile
from pathlib import Path

import installed_env
import pytest

REPO = Path(__file__).resolve().parents[1]


def built_wheel(tmp_path: Path) -> Path:
    """This package's wheel, built into ``tmp_path`` as users build it from a fresh clone
    (``installed_env.build_wheel``: ``pip wheel`` over a copy of the tracked files)."""
    return installed_env.build_wheel(tmp_path)


def shipped_path(tracked: str) -> str:
    """Where a tracked file under ``sglang_amd_moe/``, ``kernels/`` or ``patches/`` lies
    inside the wheel."""
    top, _, rest = tracked.partition("/")
    return tracked if top == "sglang_amd_moe" else f"sglang_amd_moe/{top}/{rest}"


def must_ship() -> list[str]:
    """Every tracked file of the three folders that install as the package: its modules
    and every data file the code opens (the ledger, the diffs)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "sglang_amd_moe", "kernels", "patches"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted(filter(None, out.split("\0")))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    return zipfile.ZipFile(built_wheel(tmp_path_factory.mktemp("wheel")))


def test_wheel_ships_every_tracked_file(wheel: zipfile.ZipFile) -> None:
    """Packages are discovered and data declared by pattern (setup.py, pyproject.toml): a
    module or data file added to the tree ships without anyone listing it. A list kept by
    hand once left ``diagnostics/audit/`` out of the wheel, and ``audit`` failed for every
    user while the suite, running the source tree, stayed green."""
    names = set(wheel.namelist())
    tracked = must_ship()
    assert any(t.startswith("sglang_amd_moe/diagnostics/audit/") for t in tracked)
    missing = [t for t in tracked if shipped_path(t) not in names]
    assert not missing, f"the wheel lacks {missing}"
    # And nothing ships that is not tracked (a stale build/ folder, bytecode).
    extra = {
        n
        for n in names
        if not n.startswith("sglang_amd_moe-") and n not in {shipped_path(t) for t in tracked}
    }
    assert not extra, f"the wheel ships untracked files {sorted(extra)}"


def test_wheel_metadata_names_version_and_tracker(wheel: zipfile.ZipFile) -> None:
    import sglang_amd_moe

    names = wheel.namelist()
    metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert f"Version: {sglang_amd_moe.__version__}" in metadata.splitlines()
    urls = dict(
        ln.split(":", 1)[1].strip().split(", ", 1)
        for ln in metadata.splitlines()
        if ln.startswith("Project-URL:")
    )
    assert urls["Issues"].startswith("https://") and urls["Issues"].endswith("/issues"), urls
    assert urls["Homepage"].startswith("https://"), urls


def test_wheel_layout(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    top_levels = {n.split("/", 1)[0] for n in names}
    assert {t for t in top_levels if not t.endswith(".dist-info")} == {"sglang_amd_moe"}
    # No test tooling inside the package either: nothing shipped imports what only the
    # tests and tools need (the real-server checkpoint writer lives in tests/server).
    test_only = {"pytest", "hypothesis", "safetensors", "tokenizers", "transformers", "releases"}
    for name in (n for n in names if n.endswith(".py")):
        tree = ast.parse(wheel.read(name))
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
        assert not imported & test_only, f"{name} imports {sorted(imported & test_only)}"

    kernel_sources = sorted(p.name for p in (REPO / "kernels").glob("*.py"))
    for name in kernel_sources:
        assert f"sglang_amd_moe/kernels/{name}" in names
    diffs = sorted(p.name for p in (REPO / "patches").glob("*.diff"))
    for name in diffs:
        assert f"sglang_amd_moe/patches/{name}" in names

    entry_points = wheel.read(
        next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    ).decode()
    assert "[sglang.srt.plugins]" in entry_points
    assert "sglang_amd_moe = sglang_amd_moe.runtime.plugin:register" in entry_points
    assert "[vllm.general_plugins]" in entry_points

    # Only torch is declared (see pyproject.toml and tests/test_install.py), and the
    # license pyproject declares ships with it.
    metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    requires = [
        ln.split(":", 1)[1].strip()
        for ln in metadata.splitlines()
        if ln.startswith("Requires-Dist:")
    ]
    assert [r for r in requires if "extra ==" not in r] == ["torch"], requires
    # No extra pulls SGLang either: the registry's SGLang pins CUDA torch.
    assert not [r for r in requires if r.split()[0].lower().startswith("sglang")], requires
    assert "License-Expression: Apache-2.0" in metadata
    license_file = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
    assert wheel.read(license_file) == (REPO / "LICENSE").read_bytes()
    assert b"Apache License\n                           Version 2.0, January 2004" in wheel.read(
        license_file
    )


def test_editable_install_maps_kernels_and_patches() -> None:
    import importlib.resources

    import sglang_amd_moe.kernels
    import sglang_amd_moe.patches

    assert Path(sglang_amd_moe.kernels.__file__).resolve().parent == REPO / "kernels"
    shipped = {p.name for p in importlib.resources.files("sglang_amd_moe.patches").iterdir()}
    assert {p.name for p in (REPO / "patches").glob("*.diff")} <= shipped

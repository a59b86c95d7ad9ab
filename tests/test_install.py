"""Installing the wheel into the environment that runs a server adds this package and
nothing else, a ROCm image included.

A ROCm torch image has torch's ROCm build and ``pytorch-triton-rocm``, a distribution
that provides the ``triton`` module. If this package declared ``triton``, pip would
install the registry's CUDA ``triton`` wheel over those files, without a warning. So pip
itself is asked (``pip install --dry-run --report``), with this package's real wheel, in
fresh virtual environments that imitate such images: tiny local wheels stand in for
torch and Triton (their names, versions and dependencies as the real ones declare them),
and pip reads nothing but a local directory (``--no-index --find-links``) that also
holds what the registry would offer (the CUDA ``triton``, a newer CUDA torch,
``packaging``), so a wrong dependency shows as something pip would install.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_packaging import built_wheel

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
TRITON_INIT = 'BACKEND = "{backend}"\n__version__ = "{version}"\n'


@dataclass(frozen=True)
class Dist:
    name: str
    version: str
    files: dict[str, str] = field(default_factory=dict)
    requires: tuple[str, ...] = ()

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


def _torch(version: str, requires: str, hip: str | None) -> Dist:
    files = {
        "torch/__init__.py": "from torch import version\n",
        "torch/version.py": f"hip = {hip!r}\n",
    }
    return Dist("torch", version, files, (requires,))


def _triton(name: str, version: str, backend: str) -> Dist:
    files = {"triton/__init__.py": TRITON_INIT.format(backend=backend, version=version)}
    return Dist(name, version, files)


# The environments a server runs in, as pip sees them.
ENVIRONMENTS = {
    "rocm": [
        _torch(
            "2.8.0+rocm6.4", 'pytorch-triton-rocm==3.4.0; platform_system == "Linux"', "6.4.43482"
        ),
        _triton("pytorch-triton-rocm", "3.4.0", "rocm"),
    ],
    # An older ROCm image: a lower bound on torch would make pip "upgrade" it to CUDA.
    "rocm-older-torch": [
        _torch(
            "2.6.0+rocm6.2", 'pytorch-triton-rocm==3.2.0; platform_system == "Linux"', "6.2.41133"
        ),
        _triton("pytorch-triton-rocm", "3.2.0", "rocm"),
    ],
    "cuda": [
        _torch("2.8.0", 'triton==3.4.0; platform_system == "Linux"', None),
        _triton("triton", "3.4.0", "cuda"),
    ],
}
# What the registry offers beside them: what a wrong dependency would pull in.
REGISTRY = [
    _triton("triton", "3.9.0", "cuda"),
    _torch("2.9.0", 'triton==3.9.0; platform_system == "Linux"', None),
    Dist("packaging", "26.4", {"packaging/__init__.py": ""}),
]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _build(dist: Dist, out: Path) -> Path:
    """A minimal valid wheel for ``dist`` (METADATA, WHEEL, RECORD and its files)."""
    stem = f"{dist.name.replace('-', '_')}-{dist.version}"
    info = f"{stem}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {dist.name}\nVersion: {dist.version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in dist.requires)
    entries = {
        **dist.files,
        f"{info}/METADATA": meta,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests/test_install.py\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{p},{_record_hash(t.encode())},{len(t.encode())}" for p, t in entries.items()]
    entries[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = out / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, text in entries.items():
            zf.writestr(p, text)
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory with every stand-in wheel: what pip may read (``--find-links``)."""
    out = tmp_path_factory.mktemp("index")
    for dist in {
        d.pin: d for d in [*REGISTRY, *(d for env in ENVIRONMENTS.values() for d in env)]
    }.values():
        _build(dist, out)
    return out


def _pip(env: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*PIP, "--python", str(env / "bin" / "python"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _server_env(tmp_path: Path, index: Path, name: str) -> Path:
    env = tmp_path / name
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=300
    )
    # By file: `torch==2.8.0` would also match the index's 2.8.0+rocm6.4.
    files = [str(_build(d, tmp_path)) for d in ENVIRONMENTS[name]]
    _pip(env, "install", "--no-index", "--no-deps", *files)
    return env


@pytest.mark.parametrize("name", list(ENVIRONMENTS))
def test_pip_would_install_only_this_package(
    name: str, wheel: Path, index: Path, tmp_path: Path
) -> None:
    env = _server_env(tmp_path, index, name)
    report = tmp_path / "report.json"
    _pip(
        env,
        "install",
        "--dry-run",
        "--report",
        str(report),
        "--no-index",
        "--find-links",
        str(index),
        str(wheel),
    )
    would = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert would == ["sglang-amd-moe"], f"pip would install {would} into the {name} environment"


def test_install_into_rocm_image_keeps_its_triton(wheel: Path, index: Path, tmp_path: Path) -> None:
    """The real install: ROCm's triton files stay, `pip check` is clean (no `--no-deps`
    needed), and the installed audit runs there (no SGLang: it says so, exit 1)."""
    env = _server_env(tmp_path, index, "rocm")
    _pip(env, "install", "--no-index", "--find-links", str(index), str(wheel))
    py = str(env / "bin" / "python")
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert (Path(site) / "triton" / "__init__.py").read_text() == TRITON_INIT.format(
        backend="rocm", version="3.4.0"
    )
    assert "No broken requirements found" in _pip(env, "check").stdout
    version = subprocess.run(
        [py, "-m", "sglang_amd_moe", "--version"], capture_output=True, text=True, timeout=300
    )
    assert version.returncode == 0 and version.stdout.startswith("sglang-amd-moe "), version.stderr
    audit = subprocess.run(
        [py, "-m", "sglang_amd_moe", "audit"], capture_output=True, text=True, timeout=300
    )
    assert audit.returncode == 1, audit.stdout + audit.stderr
    assert f"SGLang is not installed in this interpreter ({py})" in audit.stdout
    assert "ATTENTION: 1 target(s) need action (exit 1)" in audit.stdout


def test_audit_reports_a_clobbered_rocm_triton(wheel: Path, index: Path, tmp_path: Path) -> None:
    """A ROCm image where something installed the CUDA `triton` wheel over ROCm's (what
    this package's earlier `triton` requirement did): the audit says so and how to
    recover, exit 1."""
    env = _server_env(tmp_path, index, "rocm")
    _pip(
        env,
        "install",
        "--no-index",
        "--find-links",
        str(index),
        "--no-deps",
        "triton==3.9.0",
        str(wheel),
    )
    py = str(env / "bin" / "python")
    audit = subprocess.run(
        [py, "-m", "sglang_amd_moe", "audit", "--json"], capture_output=True, text=True, timeout=300
    )
    assert audit.returncode == 1, audit.stdout + audit.stderr
    (problem,) = json.loads(audit.stdout)["problems"]
    assert problem.startswith("both triton 3.9.0 and pytorch-triton-rocm 3.4.0 are installed"), (
        problem
    )
    assert "pytorch-triton-rocm==3.4.0" in problem

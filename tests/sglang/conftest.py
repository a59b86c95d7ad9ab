"""Parametrize tests/sglang over the real SGLang releases, and run the driver once per release.

The driver (``driver.py``) runs in the release's own interpreter, twice per release
(without the plugin, and with it loaded by the real ``load_plugins()``), the two runs
side by side; their JSON results are cached for the session. Release selection rules
are in ``sglang_release_support.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from sglang_release_support import DRIVER, require_built, selected_releases


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "release" in metafunc.fixturenames:
        rels, _ = selected_releases()
        metafunc.parametrize("release", rels, ids=[r.label for r in rels], scope="session")


def _driver_env(mode: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_AMD_MOE_")}
    env.pop("SGLANG_PLUGINS", None)  # the real discovery, unrestricted
    # The tensors are on the CPU: the package's Triton kernel runs in the interpreter.
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if mode == "plugin":
        env["SGLANG_AMD_MOE_FORCE"] = "1"  # this machine is not ROCm
    return env


_CACHE: dict[str, dict] = {}


@pytest.fixture(scope="session")
def driven(release, tmp_path_factory) -> dict:
    """``{"bare": {...}, "plugin": {...}, "wall_s": ...}`` for ``release``."""
    require_built(release)
    if release.label in _CACHE:
        return _CACHE[release.label]
    out_dir = tmp_path_factory.mktemp(f"driver-{release.label}")
    procs = {}
    t0 = time.perf_counter()
    for mode in ("bare", "plugin"):
        out = out_dir / f"{mode}.json"
        log = open(out_dir / f"{mode}.log", "w")  # noqa: SIM115 (closed below)
        procs[mode] = (
            subprocess.Popen(
                [str(release.python), str(DRIVER), mode, str(out)],
                cwd=str(out_dir),
                env=_driver_env(mode),
                stdout=log,
                stderr=subprocess.STDOUT,
            ),
            out,
            log,
        )
    results: dict = {}
    for mode, (proc, out, log) in procs.items():
        try:
            rc = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timeout"
        log.close()
        tail = (out_dir / f"{mode}.log").read_text(errors="replace")[-4000:]
        if rc != 0 or not out.exists():
            pytest.fail(f"{release.label} driver {mode} exited {rc}:\n{tail}")
        data = json.loads(out.read_text())
        if data["errors"]:
            pytest.fail(f"{release.label} driver {mode} failed:\n" + "\n".join(data["errors"]) + f"\n--- output\n{tail}")
        results[mode] = data
    results["wall_s"] = round(time.perf_counter() - t0, 2)
    _CACHE[release.label] = results
    return results

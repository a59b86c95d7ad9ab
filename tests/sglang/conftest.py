"""Parametrize tests/sglang over the real SGLang releases, and run the driver once per release.

The driver (``driver.py``) runs in the release's own interpreter, twice per release
(without the plugin, and with it loaded by the real ``load_plugins()``), the two runs
side by side; their JSON results are cached for the session. Release selection rules
are in ``sglang_release_support.py``.
"""

from __future__ import annotations

import time

import pytest
from sglang_release_support import DriverRun, require_built, selected_releases


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "release" in metafunc.fixturenames:
        rels, _ = selected_releases()
        metafunc.parametrize("release", rels, ids=[r.label for r in rels], scope="session")


_CACHE: dict[str, dict] = {}


@pytest.fixture(scope="session")
def driven(release, tmp_path_factory) -> dict:
    """``{"bare": DriverResult, "plugin": DriverResult, "wall_s": ...}`` for ``release``."""
    require_built(release)
    if release.label in _CACHE:
        return _CACHE[release.label]
    out_dir = tmp_path_factory.mktemp(f"driver-{release.label}")
    t0 = time.perf_counter()
    runs = [DriverRun(release, mode, out_dir) for mode in ("bare", "plugin")]  # side by side
    results: dict = {run.mode: run.wait() for run in runs}
    results["wall_s"] = round(time.perf_counter() - t0, 2)
    _CACHE[release.label] = results
    return results

"""Parametrize tests/sglang over the real SGLang releases, and run the driver once per release.

The driver (``driver.py``) runs in the release's own interpreter, twice per release
(without the plugin, and with it loaded by the real ``load_plugins()``), the two runs
side by side; their JSON results are cached for the test process
(``sglang_release_support.driven``). A release's tests share one ``xdist_group``, so
they run on one worker and the runs are made once. Release selection rules are in
``sglang_release_support.py``.
"""

from __future__ import annotations

import pytest
import sglang_release_support
from sglang_release_support import release_group, selected_releases


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "release" in metafunc.fixturenames:
        rels, _ = selected_releases()
        params = [pytest.param(r, id=r.label, marks=release_group(r.label)) for r in rels]
        metafunc.parametrize("release", params, scope="session")


@pytest.fixture(scope="session")
def driven(release, tmp_path_factory) -> dict:
    """``{"bare": DriverResult, "plugin": DriverResult, "wall_s": ...}`` for ``release``."""
    return sglang_release_support.driven(release, tmp_path_factory)

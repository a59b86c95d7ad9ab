"""Release selection for the tests in tests/sglang (imported by conftest and tests).

Every release in ``tests/compat/releases.py`` is a parameter (test ids carry its label,
so ``pytest tests/sglang -k 0.5.13.post1`` selects one). Releases with ``ci=True`` must
be built (``make test`` builds them first): a missing one fails rather than skips.
Others run when built and skip otherwise. ``SGLANG_AMD_MOE_RELEASES=a,b`` restricts the
run to those labels and requires them built (``make compat`` uses it).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DRIVER = HERE / "driver.py"
_spec = importlib.util.spec_from_file_location("_compat_releases", REPO / "tests" / "compat" / "releases.py")
releases = importlib.util.module_from_spec(_spec)
sys.modules["_compat_releases"] = releases
_spec.loader.exec_module(releases)

ENV_VAR = "SGLANG_AMD_MOE_RELEASES"


def selected_releases() -> tuple[list, bool]:
    """(releases to parametrize over, whether the selection was forced by ENV_VAR)."""
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return list(releases.RELEASES), False
    labels = [x.strip() for x in raw.split(",") if x.strip()]
    unknown = [x for x in labels if x not in releases.BY_LABEL]
    if unknown:
        raise pytest.UsageError(f"{ENV_VAR}: unknown release label(s) {unknown}; known: {sorted(releases.BY_LABEL)}")
    return [releases.BY_LABEL[x] for x in labels], True


def require_built(rel) -> None:
    """Fail for a required release that is not built; skip an optional one."""
    if rel.is_built():
        return
    _, forced = selected_releases()
    how = f"`{sys.executable} tests/compat/releases.py build {rel.label}`"
    if rel.ci or forced:
        pytest.fail(f"SGLang {rel.label} is required here but not built at {rel.venv}: run {how}")
    pytest.skip(f"SGLang {rel.label} not built (optional; {how})")


def topk_source_path(rel) -> Path:
    found = sorted(rel.venv.glob("lib/python*/site-packages/sglang/srt/layers/moe/topk.py"))
    if not found:
        pytest.fail(f"{rel.label}: no sglang/srt/layers/moe/topk.py under {rel.venv}")
    return found[0]

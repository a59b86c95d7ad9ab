"""Shared pytest setup: Triton's interpreter on machines without a GPU, and the markers
of whole test folders.

On a machine without a GPU, the kernel tests run the real Triton kernels through
Triton's interpreter. Triton decides interpretation when it decorates a kernel
(including its own library functions such as ``tl.sort``), so ``TRITON_INTERPRET=1``
must be in the environment before the first ``import triton`` of the test process:
this file is loaded before any test module. An explicit setting in the environment
wins, and a machine with a GPU is left alone (``tests/gpu`` runs compiled kernels).
Subprocesses started by tests inherit the variable.

Markers (declared in ``pyproject.toml``): every test under ``tests/sglang`` drives real
SGLang releases and is marked ``sglang``, every test under ``tests/gpu`` is marked
``gpu``, here, by folder (a ``pytestmark`` in a conftest file marks nothing); tests
elsewhere that need SGLang carry ``@pytest.mark.sglang`` themselves.

On several workers (pytest-xdist, ``-n``; ``make test`` uses every core): tests are
handed out by ``xdist_group``, so that what a module- or session-scoped fixture or a
cached run builds is built once. A test's group is its file unless it names one itself
(a release's tests share the release's driver runs: ``release-<label>``; the variant
library runs per base release: ``variants-<label>``). Groups are started longest first
(:data:`LONGEST_FIRST`), so that the run does not end with one worker busy on a long
group while the others are done.
"""

import os
from pathlib import Path

import pytest
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

TESTS = Path(__file__).resolve().parent
FOLDER_MARKS = {"sglang": "sglang", "gpu": "gpu"}  # tests/<folder>/... -> marker

#: Groups (or the start of their names) in the order they start on several workers,
#: from ``pytest --durations`` on a 2-core machine; the others follow in collection
#: order. Only the order depends on it: a stale entry costs time, never a result.
LONGEST_FIRST = (
    "tests/test_mxfp4_moe_sort.py",
    "tests/test_check.py",
    "tests/server/test_launch_server.py",
    "release-0.5.23",
    "tests/compat/test_audit_releases.py",
    "tests/test_server_switches.py",
    "tests/compat/test_audit_behaviour.py",
    "tests/test_audit.py",
    "variants-",
    "release-",
    "tests/sglang/test_plugin_gating.py",
    "tests/aiter/",
    "tests/test_routing_guard.py",
    "tests/test_install.py",
)


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
        if config.getoption("dist") == "load":  # what -n alone asks for
            config.option.dist = "loadgroup"
        config.option.loadscopereorder = False  # keep the order set below


def _group(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    return item.nodeid.split("::", 1)[0]


def _rank(group: str) -> int:
    return next((i for i, p in enumerate(LONGEST_FIRST) if group.startswith(p)), len(LONGEST_FIRST))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker, and before xdist reads groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            folder = item.path.relative_to(TESTS).parts[0]
        except ValueError:  # a test outside tests/
            continue
        mark = FOLDER_MARKS.get(folder)
        if mark is not None:
            item.add_marker(mark)
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_group(item)))
    order = {item.nodeid: k for k, item in enumerate(items)}
    items.sort(key=lambda item: (_rank(_group(item)), order[item.nodeid]))

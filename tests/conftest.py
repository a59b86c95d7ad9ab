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
handed out by group (the scheduler below), so that what a module- or session-scoped
fixture or a cached run builds is built once. A test's group is its file unless it
names one with ``xdist_group`` (a release's tests share the release's driver runs:
``release-<label>``; the variant library runs per base release: ``variants-<label>``).
Groups are started longest first (:data:`LONGEST_FIRST`), so that the run does not end
with one worker busy on a long group while the others are done.
"""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

# The plugin's verdict cache (runtime/sglang/verdict.py): a fresh directory per test
# session, inherited by the processes tests start; never the user's ~/.cache.
if "SGLANG_AMD_MOE_CACHE_DIR" not in os.environ:
    os.environ["SGLANG_AMD_MOE_CACHE_DIR"] = tempfile.mkdtemp(prefix="sglang-amd-moe-verdicts-")

TESTS = Path(__file__).resolve().parent
FOLDER_MARKS = {"sglang": "sglang", "gpu": "gpu"}  # tests/<folder>/... -> marker

#: Groups (or the start of their names) in the order they start on several workers,
#: from ``pytest --durations`` on a 2-core machine; the others follow in collection
#: order. Only the order depends on it: a stale entry costs time, never a result.
LONGEST_FIRST = (
    "installed-wheel",
    "tests/compat/test_audit_releases.py",
    "release-0.5.23",
    "tests/test_check.py",
    "tests/server/test_launch_server.py",
    "tests/compat/test_audit_behaviour.py",
    "tests/test_mxfp4_moe_sort.py",
    "tests/test_server_switches.py",
    "tests/test_audit.py",
    "release-",
    "tests/aiter/",
    "tests/sglang/test_plugin_gating.py",
    "tests/test_amd_compile.py",
    "tests/test_routing_guard.py",
    "tests/test_install.py",
)


#: Where the workers leave each test's group for the controller's scheduler (a folder per
#: run). xdist's own loadgroup cannot be used: it renames node ids with the group through
#: an attribute that pytest 9 no longer reads, so every test would be a group of one.
GROUPS_DIR = "SGLANG_AMD_MOE_TEST_GROUPS_DIR"


def pytest_configure(config: pytest.Config) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        # The release environments run this package from its wheel, never from the tree:
        # rebuild and install it when the tree changed (once per content; a no-op else).
        import releases

        if releases.plugin_environments():
            releases.install_plugin_wheel()
    if config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
        if config.getoption("dist") == "load":  # what -n alone asks for
            config.option.dist = "loadgroup"
        if config.getoption("dist") == "loadgroup":
            os.environ[GROUPS_DIR] = tempfile.mkdtemp(prefix="pytest-groups-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ and GROUPS_DIR in os.environ:
        shutil.rmtree(os.environ.pop(GROUPS_DIR), ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Hand out whole groups, in the order the workers collected them (longest first)."""
    if config.getoption("dist") != "loadgroup" or GROUPS_DIR not in os.environ:
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # every worker has written its file before this
                self.groups = {}
                for path in sorted(Path(os.environ[GROUPS_DIR]).glob("*.json")):
                    self.groups.update(json.loads(path.read_text()))
            return self.groups.get(nodeid, nodeid)

    config.option.loadscopereorder = False  # keep the collected order
    return GroupScheduling(config, log)


def _group(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    return item.nodeid.split("::", 1)[0]


def _rank(group: str) -> int:
    return next((i for i, p in enumerate(LONGEST_FIRST) if group.startswith(p)), len(LONGEST_FIRST))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
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
    order = {item.nodeid: k for k, item in enumerate(items)}
    items.sort(key=lambda item: (_rank(_group(item)), order[item.nodeid]))
    folder = os.environ.get(GROUPS_DIR)
    if folder:
        out = Path(folder) / f"{os.environ['PYTEST_XDIST_WORKER']}.json"
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps({item.nodeid: _group(item) for item in items}))
        os.replace(tmp, out)

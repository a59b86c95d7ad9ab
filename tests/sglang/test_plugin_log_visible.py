"""The plugin's one log line reaches the log of every SGLang process, exactly once.

SGLang calls ``load_plugins()`` in each process before it configures logging, and what
logging looks like at that moment depends on the release and the process: in 0.5.12 to
0.5.14 the root logger has no handler yet; in 0.5.23 importing the scheduler (or the
launcher) has already run ``logging.basicConfig()`` (``configure_hf_hub_logger``), which
leaves the root at WARNING and drops an INFO record of a logger without its own level.

The first tests build those situations in a bare interpreter; the last one runs, for
every process of the newest release that calls ``load_plugins()`` (launcher, scheduler,
detokenizer, DP controller) and the scheduler of every other release, the real module import and
its real ``load_plugins()`` first thing in a fresh interpreter (``driver.log_phase``; for
the scheduler, the first phase of the release's bare driver run), then configures
logging the way SGLang does afterwards, and counts the lines on stderr. Users' path: no
``SGLANG_AMD_MOE_*`` variable, so on this machine (not ROCm) the line says why nothing
is hooked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import releases
import sglang_release_support
from driver import AFTER
from sglang_release_support import (
    PROCESSES,
    SERVER_LAYER,
    DriverRun,
    loads_plugins,
    log_env,
    require_built,
    switches_off,
)

LINE = (
    "sglang-amd-moe: not ROCm (torch.version.hip is unset; SGLANG_AMD_MOE_FORCE=1 forces it); "
    "nothing hooked"
)


def _env(extra_path: list[Path]) -> dict[str, str]:
    env = switches_off()
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in extra_path)
    env["PYTHONWARNINGS"] = "ignore"
    return env


def _count(text: str, needle: str) -> int:
    return sum(needle in line for line in text.splitlines())


# --- without SGLang: the situations, one by one ----------------------------------------

BARE = textwrap.dedent(
    """
    import logging, sys
    setup = sys.argv[1]
    if setup == "root-warning":  # SGLang 0.5.23's module imports: basicConfig()
        logging.basicConfig(format="ROOT %(message)s")
    elif setup == "root-handler-above-info":
        h = logging.StreamHandler()
        h.setLevel(logging.WARNING)
        h.setFormatter(logging.Formatter("ROOT %(message)s"))
        logging.getLogger().addHandler(h)
    elif setup == "package-level-set":  # someone asked this package to be quiet
        logging.getLogger("sglang_amd_moe").setLevel(logging.WARNING)
    from sglang_amd_moe.runtime import plugin
    plugin.register()
    plugin.register()  # idempotent: no second line
    plugin.register_vllm()  # the same state: no new line either
    logging.basicConfig(level=logging.INFO, format="LATER %(message)s", force=True)
    logging.getLogger("sglang_amd_moe").info("after basicConfig")
    """
)


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("none", 1),
        ("root-warning", 1),
        ("root-handler-above-info", 1),
        ("package-level-set", 0),
    ],
)
def test_one_line_whatever_logging_looks_like(setup: str, expected: int) -> None:
    env = _env([])
    env["SGLANG_AMD_MOE_DISABLE"] = "1"  # the same entry, without importing SGLang or torch
    out = subprocess.run(
        [sys.executable, "-c", BARE, setup], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    disabled = "sglang-amd-moe: disabled by SGLANG_AMD_MOE_DISABLE=1; nothing hooked"
    assert _count(out.stderr, disabled) == expected, out.stderr
    if setup == "root-warning":  # through the handler the process configured, not ours
        assert _count(out.stderr, "ROOT " + disabled) == 1, out.stderr
    after = 0 if setup == "package-level-set" else 1
    assert _count(out.stderr, "after basicConfig") == after, out.stderr


# --- the real processes of every tested release ----------------------------------------

_RUNS: dict[str, dict[str, DriverRun]] = {}


def _processes_of(release) -> tuple[str, ...]:
    """Every process of the newest release (its launcher and scheduler configure logging
    differently); the scheduler, where the hooks act, of the others (no process of
    theirs has a root handler when plugins load)."""
    return tuple(PROCESSES) if release.label == releases.MAIN_RELEASE else ("scheduler",)


def _release_processes(release, tmp_path_factory) -> dict[str, DriverRun]:
    """Start (once per release, all at once) one driver run per process besides the
    scheduler (the bare driver run's first phase) that loads plugins."""
    if release.label in _RUNS:
        return _RUNS[release.label]
    out_dir = tmp_path_factory.mktemp(f"log-{release.label}")
    runs = {}
    for name, module in PROCESSES.items():
        if name != "scheduler" and name in _processes_of(release) and loads_plugins(release, name):
            options = ("--log-module", module)
            runs[name] = DriverRun(release, "log", out_dir, options, log_env(), name=name)
    _RUNS[release.label] = runs
    return runs


@pytest.mark.sglang
@pytest.mark.parametrize("process", list(PROCESSES))
def test_line_in_every_process_of_every_release(release, process: str, tmp_path_factory) -> None:
    require_built(release)
    if not release.has_plugin_loader:
        pytest.skip(f"SGLang {release.label} has no plugin loader (the patch is the fix there)")
    if not SERVER_LAYER:
        pytest.fail("the server layer (.compat/server) is missing: `make test` builds it")
    if process not in _processes_of(release):
        pytest.skip(f"one process per release; every process of {releases.MAIN_RELEASE}")
    if not loads_plugins(release, process):
        pytest.skip(f"no {process} process calls load_plugins() in SGLang {release.label}")
    if process == "scheduler":
        data = sglang_release_support.driven(release, tmp_path_factory)["bare"]
    else:
        data = _release_processes(release, tmp_path_factory)[process].wait()
    if "log_not_importable" in data:
        # Not a logging question: this process cannot start on a CPU-only machine.
        pytest.skip(f"{PROCESSES[process]} does not import here: {data['log_not_importable']}")
    stderr = data["log_phase_stderr"]
    assert _count(stderr, LINE) == 1, f"{data['log_root']}\n{stderr[-3000:]}"
    assert _count(stderr, AFTER) == 1, f"{data['log_root']}\n{stderr[-3000:]}"

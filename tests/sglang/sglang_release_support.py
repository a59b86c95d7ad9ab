"""Release selection for the tests in tests/sglang (imported by conftest and tests), and
the driver runs every test of a release reads (:func:`driven`).

Every release in ``tools/compat/releases.py`` is a parameter (test ids carry its label,
so ``pytest tests/sglang -k 0.5.13.post1`` selects one). Releases with ``ci=True`` must
be built (``make test`` builds them first): a missing one fails rather than skips.
Others run when built and skip otherwise. ``SGLANG_AMD_MOE_TEST_RELEASES=a,b`` restricts the
run to those labels and requires them built (``make compat`` uses it).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import releases  # tools/compat, on pytest's pythonpath
from driver import LOG_BEGIN, LOG_END

from sglang_amd_moe.diagnostics import patching

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "driver.py"
# The server's extra packages (setproctitle, uvicorn, ...) that SGLang's process modules
# import; added with PYTHONPATH, which does not run the layer's .pth (so no other SGLang).
SERVER_LAYER = sorted((releases.REPO / ".compat" / "server").glob("lib/python*/site-packages"))
# Process -> the module whose import precedes load_plugins() in that process.
PROCESSES = {
    "launcher": "sglang.launch_server",
    "scheduler": "sglang.srt.managers.scheduler",
    "detokenizer": "sglang.srt.managers.detokenizer_manager",
    "dp-controller": "sglang.srt.managers.data_parallel_controller",
}

ENV_VAR = "SGLANG_AMD_MOE_TEST_RELEASES"


def selected_releases() -> tuple[list, bool]:
    """(releases to parametrize over, whether the selection was forced by ENV_VAR)."""
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return list(releases.RELEASES), False
    labels = [x.strip() for x in raw.split(",") if x.strip()]
    unknown = [x for x in labels if x not in releases.BY_LABEL]
    if unknown:
        raise pytest.UsageError(
            f"{ENV_VAR}: unknown release label(s) {unknown}; known: {sorted(releases.BY_LABEL)}"
        )
    return [releases.BY_LABEL[x] for x in labels], True


def release_group(label: str) -> pytest.MarkDecorator:
    """The ``xdist_group`` of every test that reads ``label``'s driver runs: they run on
    one worker, so the runs are made once."""
    return pytest.mark.xdist_group(f"release-{label}")


def require_built(rel) -> None:
    """Fail for a required release that is not built; skip an optional one."""
    if rel.is_built():
        return
    _, forced = selected_releases()
    how = f"`{sys.executable} tools/compat/releases.py build {rel.label}`"
    if rel.ci or forced:
        pytest.fail(f"SGLang {rel.label} is required here but not built at {rel.venv}: run {how}")
    pytest.skip(f"SGLang {rel.label} not built (optional; {how})")


def topk_source_path(rel) -> Path:
    path = rel.topk_path()
    if path is None:
        pytest.fail(f"{rel.label}: no sglang/srt/layers/moe/topk.py under {rel.venv}")
    return path


@functools.cache
def outside_tree() -> str:
    """An empty working directory outside the repository, for a release's interpreter:
    ``python -m`` and ``python -c`` put the working directory first on ``sys.path``, and
    from the repository root they would import the source tree instead of the wheel the
    release environment runs (``releases.py install-wheel``)."""
    return tempfile.mkdtemp(prefix="sglang-amd-moe-cwd-")


def switches_off(*also: str) -> dict[str, str]:
    """Our environment without the plugin's switches (any SGLANG_AMD_MOE_*), SGLang's
    plugin list (the real discovery, unrestricted) and the variables named in ``also``:
    what a child process that must not inherit this suite's settings starts from."""
    drop = {"SGLANG_PLUGINS", *also}
    keep = {"SGLANG_AMD_MOE_CACHE_DIR"}  # where verdicts go (tests/conftest.py), not a switch
    return {
        k: v
        for k, v in os.environ.items()
        if (k in keep or not k.startswith("SGLANG_AMD_MOE_")) and k not in drop
    }


def driver_env(mode: str) -> dict[str, str]:
    """The driver's environment: ours minus any SGLANG_AMD_MOE_* and SGLANG_PLUGINS."""
    env = switches_off()
    # The tensors are on the CPU: the package's Triton kernel runs in the interpreter.
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if mode == "plugin":
        env["SGLANG_AMD_MOE_FORCE"] = "1"  # this machine is not ROCm
    return env


def log_env() -> dict[str, str]:
    """A process of SGLang's as users start it: no SGLANG_AMD_MOE_* variable, and the
    server's extra packages importable."""
    env = switches_off()
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in SERVER_LAYER)
    env["PYTHONWARNINGS"] = "ignore"
    return env


def loads_plugins(rel, process: str) -> bool:
    """Whether ``process``'s module calls ``load_plugins()`` in this release."""
    site = sorted(rel.venv.glob("lib/python*/site-packages"))[0]
    path = site / (PROCESSES[process].replace(".", "/") + ".py")
    return path.exists() and "load_plugins()" in path.read_text(encoding="utf-8")


class DriverRun:
    """One driver subprocess (``driver.py MODE OUT.json OPTION...``) in a release's
    interpreter; its stdout and stderr go to files next to OUT.json."""

    def __init__(
        self,
        rel,
        mode: str,
        out_dir: Path,
        options: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        name: str | None = None,
    ) -> None:
        self.rel, self.mode, name = rel, mode, name or mode
        self.out = out_dir / f"{name}.json"
        self.log_path, self.err_path = out_dir / f"{name}.log", out_dir / f"{name}.err"
        self._log = open(self.log_path, "w")  # noqa: SIM115 (closed in wait())
        self._err = open(self.err_path, "w")  # noqa: SIM115 (closed in wait())
        self.proc = subprocess.Popen(
            [str(rel.python), str(DRIVER), mode, str(self.out), *options],
            cwd=str(out_dir),
            env=env or driver_env(mode),
            stdout=self._log,
            stderr=self._err,
        )

    def wait(self, timeout: float = 600) -> dict:
        """The run's JSON (failing the test if it crashed or recorded errors), with
        ``log_phase_stderr``: what it wrote to stderr during its log phase, if any."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = "timeout"
        self._log.close()
        self._err.close()
        stderr = self.err_path.read_text(errors="replace")
        tail = self.log_path.read_text(errors="replace")[-2000:] + "\n" + stderr[-3000:]
        if rc != 0 or not self.out.exists():
            pytest.fail(f"{self.rel.label} driver {self.mode} exited {rc}:\n{tail}")
        data = json.loads(self.out.read_text())
        if data["errors"]:
            pytest.fail(
                f"{self.rel.label} driver {self.mode} failed:\n"
                + "\n".join(data["errors"])
                + f"\n--- output\n{tail}"
            )
        if LOG_BEGIN in stderr:
            data["log_phase_stderr"] = stderr.split(LOG_BEGIN, 1)[1].split(LOG_END, 1)[0]
        return data


def run_driver(rel, mode: str, out_dir: Path) -> dict:
    return DriverRun(rel, mode, out_dir).wait()


_DRIVEN: dict[str, dict] = {}


def driven(rel, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``{"bare": ..., "plugin": ..., "wall_s": ...}``: the release's two driver runs, side
    by side, once per test process (tests/conftest.py keeps a release's tests on one
    worker). The bare run also holds the phases that need no process of their own
    (driver.py's docstring): the scheduler's log line where the scheduler loads plugins
    (and the server layer is built), the ``unknown`` form on the newest release, and the
    release with its shipped patch applied, for a broken form."""
    require_built(rel)
    if rel.label in _DRIVEN:
        return _DRIVEN[rel.label]
    out_dir = tmp_path_factory.mktemp(f"driver-{rel.label}")
    options: list[str] = []
    env = driver_env("bare")
    if rel.has_plugin_loader and SERVER_LAYER and loads_plugins(rel, "scheduler"):
        options += ["--log-module", PROCESSES["scheduler"]]
        env.update({k: log_env()[k] for k in ("PYTHONPATH", "PYTHONWARNINGS")})
    if rel.label == releases.MAIN_RELEASE:
        options.append("--unknown")
    name = patching.patch_for("sglang", rel.expected_form)
    if name is not None:
        patched = out_dir / "topk_patched.py"
        patched.write_text(
            patching.apply_text(releases.topk_source(rel), patching.read_patch(name))
        )
        options += ["--patched", str(patched)]
    t0 = time.perf_counter()
    runs = [
        DriverRun(rel, "bare", out_dir, tuple(options), env),
        DriverRun(rel, "plugin", out_dir),
    ]
    results: dict = {run.mode: run.wait() for run in runs}
    results["wall_s"] = round(time.perf_counter() - t0, 2)
    _DRIVEN[rel.label] = results
    return results

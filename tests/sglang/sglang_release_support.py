"""Release selection for the tests in tests/sglang (imported by conftest and tests).

Every release in ``tools/compat/releases.py`` is a parameter (test ids carry its label,
so ``pytest tests/sglang -k 0.5.13.post1`` selects one). Releases with ``ci=True`` must
be built (``make test`` builds them first): a missing one fails rather than skips.
Others run when built and skip otherwise. ``SGLANG_AMD_MOE_TEST_RELEASES=a,b`` restricts the
run to those labels and requires them built (``make compat`` uses it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import releases  # tools/compat, on pytest's pythonpath

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "driver.py"

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


def switches_off(*also: str) -> dict[str, str]:
    """Our environment without the plugin's switches (any SGLANG_AMD_MOE_*), SGLang's
    plugin list (the real discovery, unrestricted) and the variables named in ``also``:
    what a child process that must not inherit this suite's settings starts from."""
    drop = {"SGLANG_PLUGINS", *also}
    return {
        k: v for k, v in os.environ.items() if not k.startswith("SGLANG_AMD_MOE_") and k not in drop
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


class DriverRun:
    """One driver subprocess (``driver.py MODE``) in a release's interpreter."""

    def __init__(self, rel, mode: str, out_dir: Path) -> None:
        self.rel, self.mode = rel, mode
        self.out = out_dir / f"{mode}.json"
        self.log_path = out_dir / f"{mode}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 (closed in wait())
        self.proc = subprocess.Popen(
            [str(rel.python), str(DRIVER), mode, str(self.out)],
            cwd=str(out_dir),
            env=driver_env(mode),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait(self, timeout: float = 600) -> dict:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = "timeout"
        self._log.close()
        tail = self.log_path.read_text(errors="replace")[-4000:]
        if rc != 0 or not self.out.exists():
            pytest.fail(f"{self.rel.label} driver {self.mode} exited {rc}:\n{tail}")
        data = json.loads(self.out.read_text())
        if data["errors"]:
            pytest.fail(
                f"{self.rel.label} driver {self.mode} failed:\n"
                + "\n".join(data["errors"])
                + f"\n--- output\n{tail}"
            )
        return data


def run_driver(rel, mode: str, out_dir: Path) -> dict:
    return DriverRun(rel, mode, out_dir).wait()

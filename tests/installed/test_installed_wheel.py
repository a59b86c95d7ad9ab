"""What a user installs is what runs here: the wheel, built once as the README says, installed
with ``--no-deps`` into environments that cannot see the source tree, and run from a
working directory outside the repository.

The environments (``tools/compat/installed_env.py``) reuse what ``.venv`` and the
per-release environments hold, through views that hide this package's editable install:

* ``bare``: torch and Triton, no SGLang;
* ``0.5.13.post1``: a hooked release (form ``weights-only``), where ``demo`` runs ``audit``
  and ``check`` (the full ``check``, with the rebuilt form, runs in tests/test_check.py);
* ``0.5.23``: a fixed release.

Every command runs as a user runs it (the ``sglang-amd-moe`` script, or ``python -m``
from a folder outside the tree, so ``-m`` cannot import the tree), and every environment
first proves that ``sglang_amd_moe`` and its kernels are imported from its own
``site-packages``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import docs_samples
import installed_env
import pytest
import releases
from test_check import check_demo
from test_packaging import built_wheel

import sglang_amd_moe

REPO = Path(__file__).resolve().parents[2]
VENV_SITE = installed_env.purelib(Path(sys.executable))
pytestmark = [pytest.mark.sglang, pytest.mark.xdist_group(name="installed-wheel")]


def _layers(name: str) -> list[tuple[Path, tuple[str, ...]]]:
    if name == "bare":
        return [(VENV_SITE, installed_env.SGLANG)]
    if name == releases.MAIN_RELEASE:
        return [(VENV_SITE, ())]
    rel = releases.BY_LABEL[name]
    if not rel.is_built():  # a CI release: make test builds it, so missing is a failure
        pytest.fail(f"{rel.venv} not built (python tools/compat/releases.py build {rel.label})")
    own = installed_env.purelib(rel.python)
    return [(own, ()), (VENV_SITE, installed_env.SGLANG)]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory outside the repository (``-m`` puts it first on sys.path)."""
    cwd = tmp_path_factory.mktemp("cwd")
    assert REPO not in cwd.parents
    return cwd


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory, wheel: Path):
    root = tmp_path_factory.mktemp("envs")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = installed_env.make(root / name, wheel, _layers(name))
        return made[name]

    return get


def _env(**extra: str) -> dict[str, str]:
    """A user's environment: none of this suite's settings, nothing pointing at the tree."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "TRITON_INTERPRET", "SGLANG_PLUGINS")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in drop and not k.startswith("SGLANG_AMD_MOE_") and k != "PYTEST_XDIST_WORKER"
    }
    return {**env, "PYTHONDONTWRITEBYTECODE": "1", **extra}


def _run(cmd: list[str], cwd: Path, timeout: int = 600, **extra: str):
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=_env(**extra)
    )


def _no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]


WHERE = """\
import importlib.metadata as md, importlib.util as u, json, sys, sysconfig
import sglang_amd_moe, sglang_amd_moe.diagnostics.audit
dist = md.distribution("sglang-amd-moe")
# Where the kernels would load from, without importing torch for them.
print(json.dumps({
    "purelib": sysconfig.get_paths()["purelib"],
    "files": [sglang_amd_moe.__file__, u.find_spec("sglang_amd_moe.kernels").origin,
              sglang_amd_moe.diagnostics.audit.__file__],
    "dist": str(dist.locate_file("")), "version": dist.version,
    "sys_path": sys.path,
}))
"""


@pytest.mark.parametrize("name", ["bare", "0.5.13.post1", releases.MAIN_RELEASE])
def test_package_comes_from_the_installed_wheel(envs, outside: Path, name: str) -> None:
    python = envs(name)
    proc = _run([str(python), "-c", WHERE], outside)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    purelib = Path(got["purelib"])
    assert purelib.is_relative_to(python.parents[1])
    for f in got["files"]:
        assert Path(f).is_relative_to(purelib), (f, purelib)
    assert Path(got["dist"]) == purelib and got["version"] == sglang_amd_moe.__version__
    assert not any(str(REPO) in p for p in got["sys_path"]), got["sys_path"]


def test_version_and_help_from_the_script(envs, outside: Path) -> None:
    script = envs("bare").parent / "sglang-amd-moe"
    version = _run([str(script), "--version"], outside)
    assert (version.returncode, version.stdout) == (
        0,
        f"sglang-amd-moe {sglang_amd_moe.__version__}\n",
    )
    help_ = _run([str(script), "--help"], outside)
    assert help_.returncode == 0 and help_.stderr == ""
    for word in ("audit", "check", "demo", "SGLANG_AMD_MOE_DISABLE", "/issues"):
        assert word in help_.stdout


def test_audit_without_sglang_says_why(envs, outside: Path) -> None:
    python = envs("bare")
    text = _run([str(python), "-m", "sglang_amd_moe", "audit"], outside)
    _no_traceback(text)
    assert text.returncode == 1, text.stderr[-3000:]
    assert "SGLang is not installed in this interpreter" in text.stdout
    assert text.stdout.startswith(f"sglang-amd-moe {sglang_amd_moe.__version__} audit of ")
    doc_run = _run([str(python), "-m", "sglang_amd_moe", "audit", "--json"], outside)
    _no_traceback(doc_run)
    doc = json.loads(doc_run.stdout)
    assert doc_run.returncode == doc["exit_status"] == 1
    assert doc["plugin_version"] == sglang_amd_moe.__version__
    sg = next(t for t in doc["targets"] if t["target"] == "sglang")
    assert sg["installed"] is False and "SGLang is not installed" in sg["reason"]


@pytest.mark.parametrize(
    "name, form, hooked",
    [("0.5.13.post1", "weights-only", True), (releases.MAIN_RELEASE, "fixed", False)],
)
def test_audit_load_runs_the_installed_plugin(
    envs, outside: Path, name: str, form: str, hooked: bool
) -> None:
    """The real ``load_plugins()`` loads the wheel's entry point; the audit reports the
    release's form and what the plugin does there (hooked, or left alone)."""
    python = envs(name)
    proc = _run(
        [str(python), "-m", "sglang_amd_moe", "audit", "--load", "--json"],
        outside,
        SGLANG_AMD_MOE_FORCE="1",
    )
    _no_traceback(proc)
    doc = json.loads(proc.stdout)
    assert proc.returncode == doc["exit_status"] == 0, doc["attention"]
    sg = next(t for t in doc["targets"] if t["target"] == "sglang")
    assert sg["version"] == name and sg["form"] == form
    assert sg["hook_state"] in (("live", "pending") if hooked else ("not-needed",)), sg


def test_demo_and_check_on_a_hooked_release(envs, outside: Path, tmp_path: Path) -> None:
    """``demo`` (what ``make demo`` runs: ``audit``, then ``check --no-rebuilt``) with the
    wheel installed in 0.5.13.post1's environment: the bug without the plugin, exact real
    rows with it (test_check.check_demo says what is checked)."""
    check_demo(envs("0.5.13.post1"), outside, tmp_path / "demo")


LOAD_PLUGINS = """\
import importlib.metadata as md, json, sysconfig
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.layers.moe.topk as topk
from sglang_amd_moe.runtime import plugin
from sglang_amd_moe.runtime.target import MARK
eps = [ep for ep in md.entry_points(group="sglang.srt.plugins") if ep.name == "sglang_amd_moe"]
print(json.dumps({
    "entry_points": [ep.value for ep in eps],
    "dist": str(eps[0].dist.locate_file("")) if eps else None,
    "plugin": plugin.__file__,
    "purelib": sysconfig.get_paths()["purelib"],
    "wrapped": hasattr(topk._post_process_topk_ids, MARK),
}))
"""


def test_sglang_load_plugins_finds_the_wheels_entry_point(envs, outside: Path) -> None:
    python = envs("0.5.13.post1")
    proc = _run([str(python), "-c", LOAD_PLUGINS], outside, SGLANG_AMD_MOE_FORCE="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["entry_points"] == ["sglang_amd_moe.runtime.plugin:register"]
    assert Path(got["dist"]) == Path(got["purelib"])
    assert Path(got["plugin"]).is_relative_to(got["purelib"])
    assert got["wrapped"] is True  # the hooked release's function is the plugin's wrapper
    assert f"(sglang-amd-moe {sglang_amd_moe.__version__})" in proc.stderr


def test_a_broken_install_fails_in_one_line(tmp_path: Path, wheel: Path, outside: Path) -> None:
    """A module missing from the install (as the 0.1.0 wheel lacked the audit): one line
    that names the failure and where to report it, exit 2 ("could not run"), never a
    traceback or 1 ("needs attention")."""
    python = installed_env.make(tmp_path / "broken", wheel, _layers("bare"))
    purelib = installed_env.purelib(python)
    (purelib / "sglang_amd_moe" / "diagnostics" / "audit" / "verdict.py").unlink()
    proc = _run([str(python), "-m", "sglang_amd_moe", "audit"], outside)
    _no_traceback(proc)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    # ModuleNotFoundError, or ImportError where the missing module is reached through a
    # package's own import of its parts.
    assert re.match(
        r"sglang-amd-moe audit: could not run: (ModuleNotFound|Import)Error: ", lines[0]
    )
    assert "report it at https://" in lines[0] and sglang_amd_moe.__version__ in lines[0]


def run_sample(sample: docs_samples.Sample, python: Path, cwd: Path) -> str:
    """The output a docs sample shows, from a run in an installed-wheel environment."""
    proc = _run([str(python), *sample.argv], cwd, **dict(sample.extra_env))
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return docs_samples.select(sample, proc.stdout, proc.stderr)


@pytest.mark.parametrize("name", sorted(docs_samples.SAMPLES))
def test_docs_samples_are_what_the_code_prints(envs, outside: Path, name: str) -> None:
    """Each sample output in the docs matches a real run of the installed wheel (paths,
    times and process ids aside): wording that drifts from the code fails here.
    With ``SGLANG_AMD_MOE_TEST_WRITE_SAMPLES=1`` (test-only) it rewrites them first."""
    sample = docs_samples.SAMPLES[name]
    got = run_sample(sample, envs(sample.env), outside)
    assert got.strip(), f"{name}: the run printed nothing to show"
    if os.environ.get("SGLANG_AMD_MOE_TEST_WRITE_SAMPLES") == "1":
        docs_samples.write(name, got)
    assert docs_samples.normalize(docs_samples.shown(name)) == docs_samples.normalize(got), (
        f"{sample.doc}'s sample {name} differs from what the code prints now; "
        "rewrite it: SGLANG_AMD_MOE_TEST_WRITE_SAMPLES=1 pytest tests/installed -k docs_samples"
    )

"""The plugin's gate: what ``register()`` / ``register_vllm()`` do before any hook.

Disabled, not ROCm without ``SGLANG_AMD_MOE_FORCE=1``, or a Triton the kernels cannot
run on: one line per process, no hook installed, no kernel imported. Gate decisions are
driven in fresh interpreters (nothing else in them has touched the hooks); the SGLang
hook's own direct-install checks run here on SGLang 0.5.23 in ``.venv``, importing
nothing from SGLang beyond locating its ``topk.py``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
from sglang_release_support import driver_env, releases, require_built

from sglang_amd_moe.runtime import env, plugin
from sglang_amd_moe.runtime.sglang import hook as sglang_hook
from sglang_amd_moe.runtime.target import logged

MAIN = releases.BY_LABEL[releases.MAIN_RELEASE]
NOT_ROCM = "not ROCm (torch.version.hip is unset; SGLANG_AMD_MOE_FORCE=1 forces it)"

# Runs an entry point in a fresh interpreter and reports what it left behind.
CHILD = textwrap.dedent(
    """
    import json, logging, sys
    lines = []
    class Keep(logging.Handler):
        def emit(self, record):
            if record.name == "sglang_amd_moe":
                lines.append(record.getMessage())
    logging.getLogger().addHandler(Keep())
    logging.getLogger().setLevel(logging.DEBUG)
    setup = sys.argv[1]
    from sglang_amd_moe.runtime import env, plugin
    if setup.startswith("triton="):
        version = setup.split("=", 1)[1]
        if version == "absent":
            sys.modules["triton"] = None  # `import triton` fails, as without Triton
        else:
            env.triton_version = lambda: version
    plugin.register()
    plugin.register()
    plugin.register_vllm()
    from sglang_amd_moe.runtime.aiter import hook as aiter_hook
    from sglang_amd_moe.runtime.sglang import hook as sglang_hook
    sg, ai = sglang_hook.status(), aiter_hook.status()
    print("RESULT " + json.dumps({
        "lines": lines,
        "sglang": None if sg is None else {"hooked": sg.hooked, "message": sg.message},
        "aiter": None if ai is None else {"state": ai.state, "message": ai.message},
        "finders": sum(getattr(f, "_sglang_amd_moe_finder", False) for f in sys.meta_path),
        "imported": sorted(m for m in ("sglang_amd_moe.kernels", "sglang.srt.layers.moe.topk",
                                       "triton") if sys.modules.get(m) is not None),
    }))
    """
)


def run_child(setup: str, **env_vars: str) -> dict:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_AMD_MOE_")}
    child_env.update(env_vars)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, setup],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    found = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert out.returncode == 0 and found, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(found[-1][len("RESULT ") :])


def assert_nothing_hooked(r: dict, line: str) -> None:
    assert r["lines"] == [line], r["lines"]  # one line for two hooks and three calls
    # Both hooks ran, decided "off" for the same reason (what the audit reads), and hooked
    # nothing: no import hook for aiter, no kernel or SGLang module imported.
    assert r["sglang"] == {"hooked": False, "message": line}
    assert r["aiter"] == {"state": "off", "message": line}
    assert r["finders"] == 0
    assert "sglang_amd_moe.kernels" not in r["imported"]
    assert "sglang.srt.layers.moe.topk" not in r["imported"]


def test_disable_turns_everything_off() -> None:
    r = run_child("plain", SGLANG_AMD_MOE_DISABLE="1", SGLANG_AMD_MOE_FORCE="1")
    assert_nothing_hooked(r, "sglang-amd-moe: disabled by SGLANG_AMD_MOE_DISABLE=1; nothing hooked")


def test_not_rocm_without_force_hooks_nothing() -> None:
    if env.on_rocm():
        pytest.skip("this torch is a ROCm build")
    r = run_child("plain")
    assert_nothing_hooked(r, f"sglang-amd-moe: {NOT_ROCM}; nothing hooked")


@pytest.mark.parametrize("version", ["3.2.0", "3.0.0+rocm6.2.4.git1234", "absent"])
def test_a_triton_too_old_or_absent_hooks_nothing(version: str) -> None:
    r = run_child(f"triton={version}", SGLANG_AMD_MOE_FORCE="1")
    (line,) = r["lines"]
    assert line.startswith("sglang-amd-moe: Triton ") and line.endswith("; nothing hooked")
    assert "3.3" in line and ("not installed" if version == "absent" else version) in line
    assert_nothing_hooked(r, line)
    assert "triton" not in r["imported"]  # judged without importing it


def test_triton_version_is_read_without_importing_triton() -> None:
    code = (
        "import sys; from sglang_amd_moe.runtime import env; v = env.triton_version(); "
        "assert 'triton' not in sys.modules; import triton; print(v, triton.__version__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    read, real = out.stdout.split()
    assert read == real and env.parse_version(real) >= env.MIN_TRITON
    assert env.triton_problem() == ""


@pytest.mark.parametrize(
    ("version", "parsed"),
    [
        ("3.3.0", (3, 3)),
        ("3.10.1", (3, 10)),
        ("3.4.0+rocm6.4.1.git7e7f0bd1", (3, 4)),
        ("3.2.0", (3, 2)),
        ("", None),
        ("main", None),
    ],
)
def test_triton_versions(version: str, parsed: tuple[int, int] | None) -> None:
    assert env.parse_version(version) == parsed
    problem = env.triton_problem(version)
    assert (problem == "") is (parsed is not None and parsed >= (3, 3))


def test_a_failing_hook_does_not_stop_the_other(monkeypatch, caplog) -> None:
    """Whatever the SGLang hook raises (SystemExit included), register() logs it and goes
    on to the aiter hook; KeyboardInterrupt is the one exception it lets through."""
    monkeypatch.setenv("SGLANG_AMD_MOE_FORCE", "1")
    monkeypatch.delenv("SGLANG_AMD_MOE_DISABLE", raising=False)
    ran = []

    class Aiter:
        def status(self):
            return None

        def install(self, gate):
            ran.append("aiter")
            return aiter_status

    from sglang_amd_moe.runtime.target import HookStatus

    aiter_status = HookStatus("aiter", "not-needed", None, "fake")
    monkeypatch.setattr(plugin, "_aiter", Aiter)
    for exc in (RuntimeError("boom"), SystemExit(3), GeneratorExit()):

        def boom(exc=exc):
            raise exc

        monkeypatch.setattr(plugin, "_sglang", boom)
        with caplog.at_level(logging.INFO, logger="sglang_amd_moe"):
            plugin.register()  # returns
        assert ran.pop() == "aiter"
        assert (
            f"the SGLang hook could not be installed; SGLang left untouched ({type(exc).__name__}"
            in caplog.text
        )

    def interrupt():
        raise KeyboardInterrupt

    monkeypatch.setattr(plugin, "_sglang", interrupt)
    with pytest.raises(KeyboardInterrupt):
        plugin.register()
    assert ran == []


# --- the SGLang hook called directly (SGLang 0.5.23 in .venv) ----------------------------


@pytest.fixture(autouse=True)
def _package_logger_restored():
    """In-process register() calls configure this package's logger; undo it afterwards."""
    lg = logging.getLogger("sglang_amd_moe")
    level, handlers = lg.level, list(lg.handlers)
    yield
    lg.setLevel(level)
    lg.handlers[:] = handlers


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch):
    """A process state in which the SGLang hook has never been installed."""
    sglang_hook.uninstall()
    for var in ("SGLANG_AMD_MOE_DISABLE", "SGLANG_AMD_MOE_FORCE", "SGLANG_AMD_MOE_VERIFY"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _summaries(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "sglang_amd_moe" and r.getMessage().startswith("sglang-amd-moe: ")
    ]


def test_not_rocm_without_force_the_sglang_hook_stays_off(fresh, caplog) -> None:
    if env.on_rocm():
        pytest.skip("this torch is a ROCm build")
    with caplog.at_level(logging.INFO, logger="sglang_amd_moe"):
        result = sglang_hook.install()  # a closed gate: recorded, logged by the plugin
        plugin.register()
        plugin.register()
        again = sglang_hook.status()
    assert not result.hooked and not again.hooked
    assert result.message == f"sglang-amd-moe: {NOT_ROCM}; nothing hooked" == again.message
    assert len(_summaries(caplog)) == 1  # one line per process, not per call


def test_fixed_release_is_left_alone_without_importing_topk(fresh, caplog) -> None:
    require_built(MAIN)
    fresh.setenv("SGLANG_AMD_MOE_FORCE", "1")
    imported_before = "sglang.srt.layers.moe.topk" in sys.modules
    with caplog.at_level(logging.INFO, logger="sglang_amd_moe"):
        result = sglang_hook.install()
        sglang_hook.install()
    assert result.form == "fixed" and not result.hooked
    assert result.message.startswith(
        f"sglang-amd-moe: sglang {MAIN.version} _post_process_topk_ids form=fixed -> "
    )
    if not imported_before:
        assert "sglang.srt.layers.moe.topk" not in sys.modules
    assert not sglang_hook.is_live()
    lines = _summaries(caplog)
    assert len(lines) == 1 and lines[0].levelno == logging.INFO


def test_install_never_raises(fresh, caplog) -> None:
    def boom():
        raise RuntimeError("simulated failure while locating topk.py")

    fresh.setenv("SGLANG_AMD_MOE_FORCE", "1")
    fresh.setattr(sglang_hook, "topk_path", boom)
    with caplog.at_level(logging.INFO, logger="sglang_amd_moe"):
        result = sglang_hook.install()
        plugin.register()
    assert not result.hooked
    assert "simulated failure" in result.message and "SGLang left untouched" in result.message
    assert any(
        r.levelno == logging.WARNING and "simulated failure" in r.getMessage()
        for r in caplog.records
    )


# --- a real release through the real entry point ----------------------------------------

BROKEN = "0.5.13.post1"  # form weights-only: the plugin imports topk.py and hooks it

THREADS = textwrap.dedent(
    """
    import json, logging, sys, threading
    from importlib.metadata import entry_points
    N = 8
    (ep,) = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "sglang_amd_moe"]
    register = ep.load()
    lines = []
    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.INFO and "_post_process_topk_ids" in record.getMessage():
                lines.append(record.getMessage())
    logging.getLogger("sglang_amd_moe").addHandler(Keep())

    # The interleaving that makes the race certain: every call that gets as far as
    # registering its hook with SGLang waits there until all N have arrived (or 2 s have
    # passed), so unserialised calls have all decided "not hooked yet" before any
    # registers. Serialised calls reach this point once; the others find the hook live.
    from sglang.srt.plugins.hook_registry import HookRegistry
    real_register = HookRegistry.register
    arrived = threading.Barrier(N, timeout=2)
    def register_when_all_arrived(*args, **kwargs):
        try:
            arrived.wait()
        except threading.BrokenBarrierError:
            pass
        return real_register(*args, **kwargs)
    HookRegistry.register = register_when_all_arrived

    start = threading.Barrier(N)
    errors = []
    def run():
        start.wait()
        try:
            register()
        except BaseException as exc:
            errors.append(repr(exc))
    threads = [threading.Thread(target=run) for _ in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    import sglang.srt.layers.moe.topk as tk
    fn, layers = tk._post_process_topk_ids, 0
    while hasattr(fn, "__wrapped__"):
        fn, layers = fn.__wrapped__, layers + 1
    print("RESULT " + json.dumps({"errors": errors, "layers": layers, "lines": lines,
                                  "innermost": fn.__code__.co_filename}))
    """
)

IMPORT_RAISES = textwrap.dedent(
    """
    import importlib.abc, importlib.machinery, logging, sys
    raising = {"SystemExit": SystemExit(3), "KeyboardInterrupt": KeyboardInterrupt()}[sys.argv[1]]

    class Raises(importlib.abc.Loader):  # topk.py's body raising, e.g. through sys.exit()
        def create_module(self, spec):
            return None
        def exec_module(self, module):
            raise raising

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "sglang.srt.layers.moe.topk":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            spec.loader = Raises()
            return spec

    sys.meta_path.insert(0, Finder())
    logging.basicConfig(level=logging.INFO, format="LOG %(name)s: %(message)s")
    from sglang.srt.plugins import load_plugins
    load_plugins()  # topk not imported: the plugin defers, imports nothing
    from sglang_amd_moe.runtime.sglang import hook
    print(hook.preview().status.message, file=sys.stderr)  # the audit's question imports topk
    print("SURVIVED", "sglang.srt.layers.moe.topk" in sys.modules, flush=True)
    """
)


def _release_child(code: str, *args: str) -> subprocess.CompletedProcess:
    rel = releases.BY_LABEL[BROKEN]
    require_built(rel)
    return subprocess.run(
        [str(rel.python), "-c", code, *args],
        env=driver_env("plugin"),  # no switch but FORCE, SGLang's full plugin discovery
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.sglang
def test_threads_registering_at_once_wrap_once() -> None:
    """Eight threads call the real entry point at once in a fresh process."""
    out = _release_child(THREADS)
    found = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert out.returncode == 0 and found, out.stdout[-2000:] + out.stderr[-3000:]
    r = json.loads(found[-1][len("RESULT ") :])
    assert r["errors"] == []
    # One wrapper (ours, put in place when topk was imported) and one line per decision:
    # deferred at load (topk not imported), applied at the import.
    assert r["layers"] == 1, f"{r['layers']} wrappers around _post_process_topk_ids"
    assert r["innermost"].endswith("sglang/srt/layers/moe/topk.py")
    assert len(r["lines"]) == 2, r["lines"]
    assert r["lines"][0].endswith(logged("when sglang.srt.layers.moe.topk is imported")), r["lines"]
    assert "applied when sglang.srt.layers.moe.topk was imported" in r["lines"][1], r["lines"]


@pytest.mark.sglang
def test_system_exit_while_importing_topk_is_caught() -> None:
    out = _release_child(IMPORT_RAISES, "SystemExit")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "SURVIVED False" in out.stdout  # load_plugins() returned; topk stays unimported
    assert "Executed general plugin: sglang_amd_moe" in out.stderr  # SGLang went on
    assert "SystemExit" in out.stderr and "SGLang left untouched" in out.stderr
    assert "when sglang.srt.layers.moe.topk is imported" in out.stderr  # deferred at load


@pytest.mark.sglang
def test_keyboard_interrupt_while_importing_topk_is_not_swallowed() -> None:
    out = _release_child(IMPORT_RAISES, "KeyboardInterrupt")
    assert out.returncode != 0 and "SURVIVED" not in out.stdout
    assert "KeyboardInterrupt" in out.stderr

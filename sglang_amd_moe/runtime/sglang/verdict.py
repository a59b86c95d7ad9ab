"""The probe's verdict for a body, from a child process or from the disk cache.

A server process never runs upstream's code to decide about it. :func:`obtain` asks a
child (:mod:`.child`: the server's interpreter and ``sys.path``, GPUs hidden, killed at
:func:`timeout`) and keeps its answer in a per-user cache, keyed by the body's fingerprint,
the interpreter and the probe's own code, so a body is probed once per machine and user:

- the cache directory is ``SGLANG_AMD_MOE_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/sglang-amd-moe``, else ``~/.cache/sglang-amd-moe``; deleting it clears
  every verdict (the next start probes again);
- of several processes that start together, one probes under a file lock and the others
  wait for its verdict (at most the child's time limit and a few seconds more, then they
  probe themselves);
- an entry that does not read back (corrupt, another layout) is ignored and rewritten; each
  write is a new file put in place with ``os.replace``;
- a child that fails or runs out of time is logged by the caller and decides nothing; its
  failure is written too, for the processes waiting on that probe only (a later start
  probes again).

Nothing here raises but ``BaseException`` that is not an ``Exception`` (a host's signal
handler raising SystemExit, KeyboardInterrupt): the child is killed before it propagates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_amd_moe.runtime import env
from sglang_amd_moe.runtime.sglang.child import SCHEMA
from sglang_amd_moe.runtime.sglang.probe import ProbeResult

CHILD_MODULE = "sglang_amd_moe.runtime.sglang.child"
# The child's first lines: the server's sys.path before anything is imported from it.
_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    f"from {CHILD_MODULE} import main; main()"
)
#: The child's time limit (``SGLANG_AMD_MOE_PROBE_TIMEOUT``): importing SGLang's topk in
#: a fresh interpreter takes 6-10 s on a quiet 2-core machine, and several times that
#: while other processes start beside it.
DEFAULT_TIMEOUT = 120.0
#: What a process waiting for another's probe adds to the child's time limit.
WAIT_GRACE = 10.0
#: Environment of the child: no GPU is visible (it must not start CUDA or HIP, nor take a
#: device a scheduler is about to choose), and the plugin is off in it.
CHILD_ENV = {
    "CUDA_VISIBLE_DEVICES": "",
    "HIP_VISIBLE_DEVICES": "",
    "ROCR_VISIBLE_DEVICES": "",
    env.PREFIX + "DISABLE": "1",
}
# The probe's own code: a verdict written by another version of it is not reused.
_OWN_CODE = ("child.py", "probe.py", "call.py", "hook.py")


def cache_dir() -> Path:
    """Where verdicts are kept (see the module docstring)."""
    where = os.environ.get(env.PREFIX + "CACHE_DIR", "").strip()
    if where:
        return Path(where).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "sglang-amd-moe"


def timeout() -> float:
    """The child's time limit in seconds (``SGLANG_AMD_MOE_PROBE_TIMEOUT``, else 120)."""
    try:
        value = float(os.environ.get(env.PREFIX + "PROBE_TIMEOUT", ""))
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if value > 0 else DEFAULT_TIMEOUT


def plan_key(plan: Any) -> tuple:
    """What identifies a plan's hooked call (``verify`` does not change it)."""
    d = plan if isinstance(plan, dict) else dataclasses.asdict(plan)
    return (d["pre_mask"], d["remap"], d["tail_mask"], d.get("post_mask", False))


@dataclass(frozen=True)
class Verdict:
    """What the child saw, and where this process got it from."""

    upstream: ProbeResult  # upstream alone; ``ran`` False: no verdict (``why``)
    checked: dict[tuple, ProbeResult] = field(default_factory=dict)  # by :func:`plan_key`
    source: str = "probed"  # probed (now, by this process), cache, or failed
    child_s: float = 0.0  # the child's wall time (when it probed, for a cached one)
    waited_s: float = 0.0  # time spent waiting for another process's probe
    path: str = ""  # the cache entry ("": none)
    note: str = ""  # what went wrong with the cache, if anything

    def hooked(self, plan: Any) -> ProbeResult | None:
        return self.checked.get(plan_key(plan))

    def describe(self) -> str:
        """For the log line: where the verdict comes from."""
        took = f"the child took {self.child_s:.1f} s"
        if self.source == "probed":
            text = f"verdict probed now in a child process ({took})"
        elif self.source == "cache":
            text = f"verdict read from the cache ({self.path}; when probed, {took})"
        else:  # the failure itself is the probe's ``why``, which the log line gives
            text = f"no verdict from the child ({self.child_s:.1f} s)"
        if self.waited_s >= 0.05:
            text += f"; waited {self.waited_s:.1f} s for another process's probe"
        return text + (f"; {self.note}" if self.note else "")

    def detail(self) -> dict[str, Any]:
        return {
            "text": self.describe(),
            "source": self.source,
            "child_s": round(self.child_s, 3),
            "waited_s": round(self.waited_s, 3),
            "path": self.path,
            **({"note": self.note} if self.note else {}),
        }


def _own_code_hash() -> str:
    h = hashlib.sha256()
    for name in _OWN_CODE:
        with contextlib.suppress(OSError):
            h.update((Path(__file__).with_name(name)).read_bytes())
    return h.hexdigest()


def cache_key(fingerprint: str, request: dict[str, Any]) -> str:
    """The entry's name: the body, the interpreter, the probe's code and what the child is
    asked (the plans to check come from the ledger)."""
    from sglang_amd_moe import __version__

    doc = {
        "fingerprint": fingerprint,
        "executable": sys.executable,
        "python": sys.version,
        "package": __version__,
        "code": _own_code_hash(),
        "schema": SCHEMA,
        "ask": {k: v for k, v in request.items() if k not in ("sys_path", "file")},
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _from_doc(doc: dict[str, Any], **kw: Any) -> Verdict:
    """The verdict a child's document says (raises on a document of another shape)."""
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"a verdict of layout {doc.get('schema')!r}")
    upstream = ProbeResult.from_json(doc["upstream"])
    checked = {plan_key(c["plan"]): ProbeResult.from_json(c["result"]) for c in doc["checked"]}
    return Verdict(upstream, checked, child_s=_number(doc.get("child_s")), **kw)


def _failed(why: str, child_s: float = 0.0, **kw: Any) -> Verdict:
    return Verdict(ProbeResult(False, why), source="failed", child_s=child_s, **kw)


def run_child(
    request: dict[str, Any], limit: float | None = None
) -> tuple[dict | None, str, float]:
    """Start the child, give it ``request``, wait at most ``limit`` seconds (then kill it
    and everything it started): ``(document, "", seconds)`` or ``(None, why, seconds)``."""
    limit = timeout() if limit is None else limit
    try:
        cwd = os.getcwd()
    except OSError:  # the server's working directory was removed
        cwd = tempfile.gettempdir()
    # The server's path exactly, its working directory spelled out ("" means it).
    path = [p or cwd for p in sys.path if isinstance(p, str)]
    child_env = {**os.environ, **CHILD_ENV, "PYTHONPATH": os.pathsep.join(path)}
    request = {**request, "sys_path": path}
    t0 = time.monotonic()
    if not sys.executable:
        return None, "this interpreter does not know its own executable", 0.0
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, json.dumps(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env,
            cwd=cwd,
            close_fds=True,
            start_new_session=True,  # its own process group: killed with what it starts
        )
    except OSError as exc:
        return None, f"the child process did not start ({exc})", time.monotonic() - t0
    try:
        out, err = proc.communicate(json.dumps(request).encode(), timeout=limit)
    except subprocess.TimeoutExpired:
        _kill(proc)
        seconds = time.monotonic() - t0
        return None, f"the child process ran past its {limit:g} s limit and was killed", seconds
    except BaseException:
        _kill(proc)
        raise
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        lines = err.decode("utf-8", "replace").strip().splitlines()
        last = next((x for x in reversed(lines) if "probe child" in x), lines[-1] if lines else "")
        return None, f"the child process exited with {proc.returncode} ({last[-300:]})", seconds
    try:
        doc = json.loads(out.decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        return None, f"the child process's answer does not read ({exc})", seconds
    return doc, "", seconds


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(Exception):
        proc.communicate(timeout=5)


def _probe(request: dict[str, Any], **kw: Any) -> tuple[Verdict, dict | None]:
    """Run the child: the verdict, and the document to cache (None: nothing to cache)."""
    doc, why, seconds = run_child(request)
    if doc is None:
        return _failed(f"the probe could not run: {why}", seconds, **kw), None
    doc["child_s"] = round(seconds, 3)
    try:
        return _from_doc(doc, source="probed", **kw), doc
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        return _failed(f"the probe's answer does not read ({exc})", seconds, **kw), None


def _read(path: Path) -> dict | None:
    """The entry at ``path`` (None: missing, unreadable or not a verdict)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None


def _write(path: Path, doc: dict) -> str:
    """Put ``doc`` at ``path`` atomically; "" or why not."""
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
        return ""
    except OSError as exc:
        with contextlib.suppress(OSError):
            if tmp:
                os.unlink(tmp)
        return f"the verdict was not cached ({exc})"


def _number(value: Any) -> float:
    """A number an entry holds (0.0 where it holds something else)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _cached(doc: dict, path: Path, waited: float) -> Verdict | None:
    try:
        return _from_doc(doc, source="cache", path=str(path), waited_s=waited)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


@contextlib.contextmanager
def _locked(path: Path, wait: float) -> Iterator[bool]:
    """``fcntl.flock`` on ``path`` (created), waiting at most ``wait`` seconds: True when
    held. Without fcntl (not POSIX): False at once."""
    try:
        import fcntl
    except ImportError:
        yield False
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        end, held = time.monotonic() + wait, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    break
                time.sleep(0.05)
        yield held
    finally:
        os.close(fd)  # releases the lock


def obtain(fingerprint: str, request: dict[str, Any]) -> Verdict:
    """The verdict for the body ``fingerprint`` names: from the cache, else from a child
    (run by this process, or by another one starting at the same time). Never raises an
    ``Exception``."""
    t0, started = time.monotonic(), time.time()
    try:
        directory = cache_dir()
        key = cache_key(fingerprint, request)
        path = directory / f"{key}.json"
    except Exception as exc:  # a home directory that cannot be found, say
        verdict, _ = _probe(request, note=f"no cache ({type(exc).__name__}: {exc})")
        return verdict
    doc = _read(path)
    if doc is not None and not doc.get("failed"):
        found = _cached(doc, path, 0.0)
        if found is not None:
            return found
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = _locked(directory / f"{key}.lock", timeout() + WAIT_GRACE)
        held = lock.__enter__()
    except OSError as exc:
        verdict, _ = _probe(request, note=f"the cache {directory} is not usable ({exc})")
        return verdict
    try:
        waited = time.monotonic() - t0
        if not held:
            note = f"another process's probe did not finish in {waited:.0f} s"
            verdict, _ = _probe(request, waited_s=waited, note=note)
            return verdict
        doc = _read(path)
        if doc is not None:  # written while this process waited (or between the two reads)
            if doc.get("failed") and _number(doc.get("written_at")) >= started - 1:
                return _failed(str(doc.get("why", "")), _number(doc.get("child_s")),
                               waited_s=waited, path=str(path))  # fmt: skip
            found = None if doc.get("failed") else _cached(doc, path, waited)
            if found is not None:
                return found
        verdict, keep = _probe(request, path=str(path), waited_s=waited)
        if keep is None:  # for the processes waiting on this probe only
            keep = {"schema": SCHEMA, "failed": True, "why": verdict.upstream.why}
            keep |= {"child_s": round(verdict.child_s, 3)}
        keep["written_at"] = time.time()
        note = _write(path, keep)
        return dataclasses.replace(verdict, note=note) if note else verdict
    finally:
        lock.__exit__(None, None, None)

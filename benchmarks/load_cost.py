"""The plugin's own share of plugin load, per process kind: run in a release's interpreter.

``python benchmarks/load_cost.py [REPEATS [CASE,...]]`` prints one JSON line per case: fresh
interpreters that import what that SGLang process imports before ``load_plugins()``, then
time ``load_plugins()`` with ``SGLANG_PLUGINS`` naming this plugin (on) or another name
only (off: SGLang discovers and skips it); the share is the difference of the medians.
Where the release has no loader, on calls ``register()`` and off nothing.
``SGLANG_AMD_MOE_FORCE=1`` stands for a ROCm torch; a first, uncounted run writes the
bytecode an installed package has (and, for a warm cache, the verdict).
``python benchmarks/load_cost.py table FILE COMMIT`` prints the markdown table of FILE's
rows (JSON lines, each with ``release_env`` and ``commit`` added) measured at COMMIT.
``python benchmarks/load_cost.py eight [N]``: N (8) schedulers start at once with a body
the ledger does not know and an empty verdict cache; one JSON line (each process's time
in the plugin at topk's import, where its verdict came from, how many probed).
Cases:

- ``launcher``: ``sglang.launch_server`` imported (torch imported, topk not);
- ``scheduler``: ``sglang.srt.managers.scheduler`` imported (topk not yet: a scheduler
  imports it later, with the model);
- ``topk-imported``: the launcher's modules and topk imported before the plugin loads (the
  plugin asks a child process for the verdict: the cache is warm, the warm-up run wrote it;
  ``topk-imported-cold``: an empty cache each run);
- ``bare``: nothing imported; ``register()`` called directly (is torch imported for it?);
- ``topk-later``: the launcher's modules imported, ``load_plugins()``, then the time of
  topk's own import is what is measured (a body the plugin decides there is decided
  then, as in a scheduler that imports the model); ``plugin_at_import_s`` is the time of
  the plugin's own callbacks inside that import (topk's import alone is seconds, so the
  difference of the two arms is noise, and the off arm is not run);
- ``unknown-*``: the same with a topk.py the ledger does not know (the release's own with one
  statement added to ``_post_process_topk_ids``, in a mirror of the installed ``sglang``
  first on the path): ``unknown-launcher`` (the plugin defers the decision to topk's
  import; ``unknown-launcher-warm``: the cache already holds the ledger's helper readings),
  ``unknown-later-cold`` (at topk's import the plugin runs the probe's child: an
  empty cache each run), ``unknown-later-warm`` (the verdict is in the cache),
  ``unknown-imported-cold`` and ``unknown-imported-warm`` (topk imported before the plugin).

Every row with the plugin on records where its verdicts came from (``verdicts``: the
``source`` of each run, ``child_s``: the child's time as the log line gives it), and the
process's CPU time in the window next to the wall time (``*_cpu_s``): on a machine other
jobs load, the wall time stretches with the load, the CPU time much less.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import importlib, json, sys, time
case = sys.argv[1]
pre = {"launcher": ["sglang.launch_server"],
       "scheduler": ["sglang.srt.managers.scheduler"],
       "topk-imported": ["sglang.launch_server", "sglang.srt.layers.moe.topk"],
       "bare": [], "topk-later": ["sglang.launch_server"]}[case]
for m in pre:
    importlib.import_module(m)
torch_before = "torch" in sys.modules
load_plugins = None
if case != "bare":  # bare: import nothing of SGLang's (its plugins module imports torch)
    try:
        from sglang.srt.plugins import load_plugins
    except ImportError:
        pass
import gc
gc_s, gc_full, gc_t = [0.0], [0], [0.0]
def _collection(phase, info):  # time spent collecting inside the measured window
    if phase == "start":
        gc_t[0] = time.perf_counter()
    else:
        gc_s[0] += time.perf_counter() - gc_t[0]
        gc_full[0] += info["generation"] == 2
at_import = [0.0, 0.0]  # topk-later: the plugin's callbacks at topk's import (wall, CPU)
if case == "topk-later" and load_plugins is not None:  # no loader: register() is timed
    load_plugins()
    try:
        from sglang_amd_moe.runtime import target as _target
    except ImportError:
        _target = None
    def _timed(cb):
        def run(module):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                cb(module)
            finally:
                at_import[0] += time.perf_counter() - t0
                at_import[1] += time.process_time() - c0
        return run
    for _name, _cbs in (_target._WATCHED.items() if _target else ()):
        _cbs[:] = [_timed(cb) for cb in _cbs]
gc.callbacks.append(_collection)
t, c = time.perf_counter(), time.process_time()
if case == "bare" or load_plugins is None:
    if sys.argv[2] == "on":
        from sglang_amd_moe.runtime.plugin import register
        register()
elif case == "topk-later":
    importlib.import_module("sglang.srt.layers.moe.topk")
else:
    load_plugins()
s, cpu = time.perf_counter() - t, time.process_time() - c
gc.callbacks.remove(_collection)
verdict = {}
hook = sys.modules.get("sglang_amd_moe.runtime.sglang.hook")
status = hook.status() if hook is not None else None
if status is not None:
    verdict = dict(status.detail.get("verdict") or {}, state=status.state, form=status.form)
    verdict.pop("text", None)  # the log line's words: the fields say the same
print("COST", s, gc_s[0], gc_full[0], at_import[0], torch_before, "torch" in sys.modules,
      "sglang.srt.layers.moe.topk" in sys.modules, json.dumps(verdict).replace(" ", ""),
      cpu, at_import[1])
"""


#: case -> (what the process imports first, a body the ledger does not know, cache).
CASES = {
    "launcher": ("launcher", False, "warm"),
    "scheduler": ("scheduler", False, "warm"),
    "topk-imported": ("topk-imported", False, "warm"),
    "topk-imported-cold": ("topk-imported", False, "cold"),
    "topk-later": ("topk-later", False, "warm"),
    "bare": ("bare", False, "warm"),
    "unknown-launcher": ("launcher", True, "cold"),
    "unknown-launcher-warm": ("launcher", True, "warm"),
    "unknown-later-cold": ("topk-later", True, "cold"),
    "unknown-later-warm": ("topk-later", True, "warm"),
    "unknown-imported-cold": ("topk-imported", True, "cold"),
    "unknown-imported-warm": ("topk-imported", True, "warm"),
}
DEFAULT_CASES = ("launcher", "topk-later", "unknown-later-cold", "unknown-later-warm")
_WORK = Path(tempfile.gettempdir()) / f"sglang-amd-moe-load-cost-{os.getpid()}"


def _mirror(sglang_dir: Path, dest: Path) -> Path:
    """A mirror of the installed ``sglang`` (symbolic links) whose topk.py is a real file:
    first on the path, it is what the processes import and what the plugin reads."""
    chain = ("srt", "layers", "moe")
    out = dest / "sglang"
    if out.exists():
        shutil.rmtree(out)
    for depth in range(len(chain) + 1):
        here_src, here_out = sglang_dir.joinpath(*chain[:depth]), out.joinpath(*chain[:depth])
        here_out.mkdir(parents=True, exist_ok=True)
        for entry in here_src.iterdir():
            if depth < len(chain) and entry.name == chain[depth]:
                continue
            if depth == len(chain) and entry.name == "topk.py":
                shutil.copyfile(entry, here_out / entry.name)
                continue
            (here_out / entry.name).symlink_to(entry)
    return out.joinpath(*chain, "topk.py")


def unknown_body() -> Path:
    """The mirror's directory; its topk.py is the release's with one statement added at the
    top of ``_post_process_topk_ids`` (a body the ledger does not know, the same behaviour)."""
    import importlib.util

    dest = _WORK / "unknown"
    if (dest / "sglang").exists():
        return dest
    spec = importlib.util.find_spec("sglang")
    topk = _mirror(Path(spec.submodule_search_locations[0]), dest)
    text = topk.read_text(encoding="utf-8")
    tree = ast.parse(text)
    fn = next(n for n in tree.body if getattr(n, "name", "") == "_post_process_topk_ids")
    first = fn.body[0]
    lines = text.splitlines(keepends=True)
    indent = " " * first.col_offset
    lines.insert(first.lineno - 1, f"{indent}_unknown_to_the_ledger = None\n")
    topk.write_text("".join(lines), encoding="utf-8")
    return dest


def _env(case: str, on: bool, cache: Path | None) -> dict[str, str]:
    # Bytecode cached, as an installed package has it (the first run writes it).
    drop = ("SGLANG_AMD_MOE_", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(SGLANG_AMD_MOE_FORCE="1", SGLANG_PLUGINS="sglang_amd_moe" if on else "none")
    if CASES[case][1]:
        path = [str(unknown_body()), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    if cache is not None:
        env["SGLANG_AMD_MOE_CACHE_DIR"] = str(cache)
    return env


def _cache(case: str, run: int) -> Path:
    """Warm: one directory for every run of the case (the warm-up run fills it); cold: a
    new empty one per run."""
    mode = CASES[case][2]
    return _WORK / "cache" / (f"{case}-warm" if mode == "warm" else f"{case}-cold-{run}")


def _parse(stdout: str, stderr: str) -> tuple:
    line = [x for x in stdout.splitlines() if x.startswith("COST ")]
    if not line:
        raise RuntimeError((stderr.strip().splitlines() or ["no output"])[-1])
    _, s, gc_s, gc_full, at_import, before, after, topk, verdict, cpu, cpu_at = line[-1].split()
    flags = before == "True", after == "True", topk == "True"
    times = float(s), *flags, float(gc_s), int(gc_full), float(at_import), json.loads(verdict)
    return *times, float(cpu), float(cpu_at)


def measure(case: str, on: bool, run: int = 0) -> tuple:
    base = CASES[case][0]
    if (base == "bare" or base == "topk-later") and not on:
        return 0.0, False, False, False, 0.0, 0, 0.0, {}, 0.0, 0.0
    out = subprocess.run(
        [sys.executable, "-c", CHILD, base, "on" if on else "off"],
        env=_env(case, on, _cache(case, run)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    return _parse(out.stdout, out.stderr)


def eight(n: int = 8) -> dict:
    """``n`` processes of ``unknown-later-cold`` started at once, one empty cache."""
    cache = _WORK / "cache" / f"eight-{time.time_ns()}"
    env = _env("unknown-later-cold", True, cache)
    row: dict = {"case": f"eight-unknown-later-cold-{n}", "load_before": _load()}
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, "topk-later", "on"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    results = [_parse(*p.communicate(timeout=1800)) for p in procs]
    row["wall_s"] = round(time.perf_counter() - t0, 2)
    row["plugin_at_import_s"] = [round(r[6], 3) for r in results]
    row["plugin_at_import_cpu_s"] = [round(r[9], 3) for r in results]
    row["verdicts"] = [r[7] for r in results]
    row["probes"] = sum(r[7].get("source") == "probed" for r in results)
    row["load_after"] = _load()
    return row


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _cell(r: dict) -> str:
    if "error" in r:
        return "does not import here"
    if "plugin_at_import_s" in r and not r.get("on_topk_after"):
        return "topk does not import here"
    if "plugin_at_import_s" in r:  # the plugin's own part of topk's import
        cell = f"{r['plugin_at_import_s']:.3f} in the plugin"
        if "plugin_at_import_cpu_s" in r:
            cell += f" (CPU {r['plugin_at_import_cpu_s']:.3f})"
    else:
        cell = f"{r['share_s']:.3f} ({r['on_s']:.3f} vs {r['off_s']:.3f})"
        if "share_cpu_s" in r:
            cell += f" (CPU {r['share_cpu_s']:.3f})"
    sources = [v.get("source") for v in r.get("verdicts", []) if v.get("source")]
    if "probed" in sources:  # the child's time, as the log line gives it
        child = statistics.median(v["child_s"] for v in r["verdicts"] if v["source"] == "probed")
        cell += f"; child {child:.1f} s in the log line"
    elif sources and set(sources) == {"cache"}:
        cell += "; from the cache"
    return cell  # full collections in the window: in the rows (*_full_collections)


def table(path: str, commit: str) -> str:
    """Markdown: one row per release environment, the share of each case in seconds
    (with and without the plugin in brackets, or the plugin's part of topk's import), and
    the load average it ran under; then the rows of ``eight``."""
    rows = [json.loads(x) for x in open(path) if x.startswith("{")]
    rows = [r for r in rows if r.get("commit") == commit]
    cases = [c for c in CASES if any(r["case"] == c for r in rows)]
    out = ["| release | " + " | ".join(cases) + " | load average |"]
    out.append("| --- " * (len(cases) + 2) + "|")
    envs = list(dict.fromkeys(r["release_env"] for r in rows if r["case"] in CASES))
    for env in envs:
        cells, loads = [], []
        for case in cases:
            r = next((r for r in rows if r["release_env"] == env and r["case"] == case), None)
            if r is None:
                cells.append("-")
                continue
            loads += [r["load_before"], r["load_after"]]
            cells.append(_cell(r))
        load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"
        out.append(f"| {env} | " + " | ".join(cells) + f" | {load} |")
    for r in (r for r in rows if r["case"].startswith("eight-")):
        times = r["plugin_at_import_s"]
        waited = [v.get("waited_s", 0.0) for v in r["verdicts"] if v.get("source") == "cache"]
        child = [v["child_s"] for v in r["verdicts"] if v.get("source") == "probed"]
        out.append("")
        out.append(
            f"{len(times)} processes at once ({r['release_env']}, {r['case']}): "
            f"{r['probes']} probed (child {', '.join(f'{c:.1f}' for c in child)} s), "
            f"{len(waited)} read the cache after waiting {min(waited or [0]):.1f}-"
            f"{max(waited or [0]):.1f} s; the plugin's part of topk's import "
            f"{min(times):.1f}-{max(times):.1f} s; all done in {r['wall_s']:.1f} s; "
            f"load average {r['load_before']:.1f}-{r['load_after']:.1f}"
        )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "table":
        print(table(argv[1], argv[2]))
        return 0
    import importlib.metadata

    version = importlib.metadata.version("sglang")
    try:
        if argv and argv[0] == "eight":
            row = eight(int(argv[1]) if len(argv) > 1 else 8)
            print(json.dumps({"sglang": version, "cpus": os.cpu_count(), **row}), flush=True)
            return 0
        return _cases(argv, version)
    finally:
        shutil.rmtree(_WORK, ignore_errors=True)


def _cases(argv: list[str], version: str) -> int:
    repeats = int(argv[0]) if argv else 3
    cases = argv[1].split(",") if len(argv) > 1 else list(DEFAULT_CASES)
    for case in cases:
        row: dict = {
            "sglang": version,
            "case": case,
            "repeats": repeats,
            "load_before": _load(),
            "cpus": os.cpu_count(),
        }
        for on in (False, True):
            if not on and CASES[case][0] in ("bare", "topk-later"):
                continue  # nothing to time without the plugin (see the module docstring)
            try:  # the first run: warm-up (bytecode, a warm cache's verdict), not counted
                runs = [measure(case, on, i) for i in range(repeats + 1)][1:]
            except RuntimeError as exc:  # this release cannot import what the case needs
                row["error"] = str(exc)
                break
            key = "on" if on else "off"
            row[f"{key}_s"] = round(statistics.median(r[0] for r in runs), 3)
            # CPU time of the process in the window: what other processes' load stretches
            # less than the wall time (the child's own time is in neither).
            row[f"{key}_cpu_s"] = round(statistics.median(r[8] for r in runs), 3)
            row[f"{key}_torch_before"], row[f"{key}_torch_after"] = runs[0][1], runs[0][2]
            row[f"{key}_topk_after"] = runs[0][3]
            # Collections inside the window: their time, and how many were full ones (a
            # full collection walks every object SGLang's imports made: 0.1-0.4 s).
            row[f"{key}_gc_s"] = round(statistics.median(r[4] for r in runs), 3)
            row[f"{key}_full_collections"] = [r[5] for r in runs]
            if CASES[case][0] == "topk-later" and on:  # the plugin's part of topk's import
                row["plugin_at_import_s"] = round(statistics.median(r[6] for r in runs), 3)
                row["plugin_at_import_runs"] = [round(r[6], 3) for r in runs]
                row["plugin_at_import_cpu_s"] = round(statistics.median(r[9] for r in runs), 3)
            if on:
                row["verdicts"] = [r[7] for r in runs]
        row["load_after"] = _load()
        if "error" not in row and "off_s" in row:
            row["share_s"] = round(row["on_s"] - row["off_s"], 3)
        elif "error" not in row:
            row["share_s"] = row.get("plugin_at_import_s", row["on_s"])
        if "error" not in row and "off_cpu_s" in row:
            row["share_cpu_s"] = round(row["on_cpu_s"] - row["off_cpu_s"], 3)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The plugin's own share of plugin load, per process kind: run in a release's interpreter.

``python benchmarks/load_cost.py [REPEATS [CASE,...]]`` prints one JSON line per case: fresh
interpreters that import what that SGLang process imports before ``load_plugins()``, then
time ``load_plugins()`` with ``SGLANG_PLUGINS`` naming this plugin (on) or another name
only (off: SGLang discovers and skips it); the share is the difference of the medians.
Where the release has no loader, on calls ``register()`` and off nothing.
``SGLANG_AMD_MOE_FORCE=1`` stands for a ROCm torch; a first, uncounted run writes the
bytecode an installed package has.
``python benchmarks/load_cost.py table FILE COMMIT`` prints the markdown table of FILE's
rows (JSON lines, each with ``release_env`` and ``commit`` added) measured at COMMIT.
Cases:

- ``launcher``: ``sglang.launch_server`` imported (torch imported, topk not);
- ``scheduler``: ``sglang.srt.managers.scheduler`` imported (topk not yet: a scheduler
  imports it later, with the model);
- ``topk-imported``: the launcher's modules and topk imported before the plugin loads;
- ``bare``: nothing imported; ``register()`` called directly (is torch imported for it?);
- ``topk-later``: the launcher's modules imported, ``load_plugins()``, then the time of
  topk's own import is what is measured (a body the plugin decides there is decided
  then, as in a scheduler that imports the model); ``plugin_at_import_s`` is the time of
  the plugin's own callbacks inside that import (topk's import alone is seconds, so the
  difference of the two arms is noise).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import importlib, sys, time
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
at_import = [0.0]  # topk-later: the plugin's callbacks that run at topk's import
if case == "topk-later" and load_plugins is not None:  # no loader: register() is timed
    load_plugins()
    try:
        from sglang_amd_moe.runtime import target as _target
    except ImportError:
        _target = None
    def _timed(cb):
        def run(module):
            t0 = time.perf_counter()
            try:
                cb(module)
            finally:
                at_import[0] += time.perf_counter() - t0
        return run
    for _name, _cbs in (_target._WATCHED.items() if _target else ()):
        _cbs[:] = [_timed(cb) for cb in _cbs]
gc.callbacks.append(_collection)
t = time.perf_counter()
if case == "bare" or load_plugins is None:
    if sys.argv[2] == "on":
        from sglang_amd_moe.runtime.plugin import register
        register()
elif case == "topk-later":
    importlib.import_module("sglang.srt.layers.moe.topk")
else:
    load_plugins()
s = time.perf_counter() - t
gc.callbacks.remove(_collection)
print("COST", s, gc_s[0], gc_full[0], at_import[0], torch_before, "torch" in sys.modules,
      "sglang.srt.layers.moe.topk" in sys.modules)
"""


CASES = ("launcher", "scheduler", "topk-imported", "topk-later", "bare")


def measure(case: str, on: bool) -> tuple[float, bool, bool, bool, float, int, float]:
    # Bytecode cached, as an installed package has it (the first run writes it).
    drop = ("SGLANG_AMD_MOE_", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(SGLANG_AMD_MOE_FORCE="1", SGLANG_PLUGINS="sglang_amd_moe" if on else "none")
    if case == "bare" and not on:
        return 0.0, False, False, False, 0.0, 0, 0.0
    out = subprocess.run(
        [sys.executable, "-c", CHILD, case, "on" if on else "off"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("COST ")]
    if not line:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    _, s, gc_s, gc_full, at_import, before, after, topk = line[-1].split()
    flags = before == "True", after == "True", topk == "True"
    return float(s), *flags, float(gc_s), int(gc_full), float(at_import)


def table(path: str, commit: str) -> str:
    """Markdown: one row per release environment, the share of each case in seconds
    (with and without the plugin in brackets), and the load average it ran under."""
    rows = [json.loads(x) for x in open(path) if x.startswith("{")]
    rows = [r for r in rows if r.get("commit") == commit]
    cases = [c for c in CASES if any(r["case"] == c for r in rows)]
    out = ["| release | " + " | ".join(cases) + " | load average |"]
    out.append("| --- " * (len(cases) + 2) + "|")
    envs = list(dict.fromkeys(r["release_env"] for r in rows))
    for env in envs:
        cells, loads = [], []
        for case in cases:
            r = next((r for r in rows if r["release_env"] == env and r["case"] == case), None)
            if r is None:
                cells.append("-")
                continue
            loads += [r["load_before"], r["load_after"]]
            if "error" in r:
                cells.append("does not import here")
                continue
            cell = f"{r['share_s']:.3f} ({r['on_s']:.3f} vs {r['off_s']:.3f})"
            if "plugin_at_import_s" in r:  # the difference is noise there: the plugin's part
                cell = f"{r['plugin_at_import_s']:.3f} in the plugin (import {r['on_s']:.3f})"
            full = [sum(r.get(f"{k}_full_collections", [])) for k in ("on", "off")]
            runs = len(r.get("on_full_collections", []))
            if any(full):  # a full collection SGLang's imports made due ran in the window
                cell += f"; full collections in {full[0]}/{runs} runs on, {full[1]}/{runs} off"
            cells.append(cell)
        load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"
        out.append(f"| {env} | " + " | ".join(cells) + f" | {load} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "table":
        print(table(argv[1], argv[2]))
        return 0
    repeats = int(argv[0]) if argv else 3
    cases = argv[1].split(",") if len(argv) > 1 else list(CASES)
    import importlib.metadata

    version = importlib.metadata.version("sglang")
    for case in cases:
        row: dict = {
            "sglang": version,
            "case": case,
            "repeats": repeats,
            "load_before": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(),
        }
        for on in (False, True):
            try:
                runs = [measure(case, on) for _ in range(repeats + 1)][1:]  # first: warm-up
            except RuntimeError as exc:  # this release cannot import what the case needs
                row["error"] = str(exc)
                break
            key = "on" if on else "off"
            row[f"{key}_s"] = round(statistics.median(r[0] for r in runs), 3)
            row[f"{key}_torch_before"], row[f"{key}_torch_after"] = runs[0][1], runs[0][2]
            row[f"{key}_topk_after"] = runs[0][3]
            # Collections inside the window: their time, and how many were full ones (a
            # full collection walks every object SGLang's imports made: 0.1-0.4 s).
            row[f"{key}_gc_s"] = round(statistics.median(r[4] for r in runs), 3)
            row[f"{key}_full_collections"] = [r[5] for r in runs]
            if case == "topk-later" and on:  # the plugin's own part of topk's import
                row["plugin_at_import_s"] = round(statistics.median(r[6] for r in runs), 3)
        row["load_after"] = round(os.getloadavg()[0], 2)
        if "error" not in row:
            row["share_s"] = round(row["on_s"] - row["off_s"], 3)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``sglang-amd-moe demo`` (``make demo``): the padded-batch bug and the fix on one screen.
``audit --json`` and ``check --no-rebuilt`` run in each environment's interpreter (the checks
side by side); what each wrote stays in ``--out-dir``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_amd_moe.diagnostics.check import DEVICE_HELP, device

EPILOG = """exit status:
  0  every row with the plugin matches the unpadded run, in every environment
  1  a row with the plugin does not match
  2  a check or an audit could not run (its log in --out-dir says why); the audit's
     "needs attention" does not change the status: the check's rows are the verdict"""

PYTHON_HELP = "the python of another environment with SGLang and this package (repeatable)"
CHECK_TIMEOUT_S = 900  # one environment's check (well under a minute on 2 cores)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="sglang-amd-moe demo",
        description="Run `sglang-amd-moe audit` and `check --no-rebuilt` with this python and "
        "each --python, and show the real rows of padded batches without and with the plugin.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--python", action="append", default=[], metavar="PYTHON", help=PYTHON_HELP)
    add("--device", type=device, default="cpu", help=f"passed to each check: {DEVICE_HELP}")
    add("--out-dir", metavar="DIR", help="where each command's output is kept (default: a new "
        "temporary directory, printed at the end)")  # fmt: skip
    return p.parse_args(argv)


def shown(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies below it (shorter to read)."""
    relative = os.path.relpath(absolute := os.path.abspath(path))  # a venv's python: a link
    return absolute if relative.startswith("..") else relative


@dataclass
class Env:
    """One SGLang environment: its interpreter and what ran there."""

    python: str
    tag: str
    out_dir: Path
    audit: dict[str, Any] = field(default_factory=dict)
    audit_status: int | None = None
    check: dict[str, Any] = field(default_factory=dict)
    check_status: int | None = None
    check_error: str = ""

    def path(self, kind: str) -> Path:  # "check.json", "check.log", "audit.json"
        name, ext = kind.split(".")
        return self.out_dir / f"{name}-{self.tag}.{ext}"

    @property
    def sglang(self) -> dict[str, Any]:
        return next((t for t in self.audit.get("targets", []) if t.get("target") == "sglang"), {})

    @property
    def version(self) -> str:
        return self.check.get("sglang") or self.sglang.get("version") or "?"

    @property
    def check_failed(self) -> bool:  # the check did not run, or left no result
        return self.check_status == 2 or not self.check


def run_audit(env: Env, taken: set[str]) -> None:
    """``audit --json`` in the environment's interpreter; the SGLang version it reports
    names the environment's files (``audit-<version>.json``, ``check-<version>.*``)."""
    try:
        cmd = [os.path.abspath(env.python), "-m", "sglang_amd_moe", "audit", "--json"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=env.out_dir)
        env.audit_status = proc.returncode
        env.audit = json.loads(proc.stdout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        env.audit_status, env.check_error = 2, f"audit: {exc}"
        return
    except ValueError:
        env.audit = {}
    env.tag = env.sglang.get("version") or env.tag
    while env.tag in taken:
        env.tag += "+"
    taken.add(env.tag)
    env.path("audit.json").write_text(proc.stdout + proc.stderr, encoding="utf-8")


def start_check(env: Env, device_name: str) -> subprocess.Popen | None:
    """Start ``check --no-rebuilt`` in the environment's interpreter; its table goes to a log."""
    cmd = [os.path.abspath(env.python), "-m", "sglang_amd_moe", "check", "--no-rebuilt"]
    cmd += ["--device", device_name]
    cmd += ["--json-file", str(env.path("check.json"))]
    try:
        with open(env.path("check.log"), "w", encoding="utf-8") as log:
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=env.out_dir)
    except OSError as exc:
        env.check_status, env.check_error = 2, f"check: {exc}"
        return None


def finish_check(env: Env, proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    try:
        env.check_status = proc.wait(timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        env.check_status, env.check_error = 2, f"check: no result after {CHECK_TIMEOUT_S} s"
        return
    try:
        env.check = json.loads(env.path("check.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        env.check = {}
        log = env.path("check.log").read_text(encoding="utf-8", errors="replace")
        lines = log.strip().splitlines()
        env.check_error = lines[-1] if lines else f"check exited {env.check_status}"


def plugin_cell(env: Env) -> str:
    """What the plugin did when the check loaded it (its log line after ``->``), or the audit's."""
    message = ((env.check.get("forms") or [{}])[0]).get("hook_message", "")
    if " -> " in message:
        return message.split(" -> ", 1)[1]
    return env.sglang.get("action") or env.sglang.get("reason") or "-"


def _cells(row: dict[str, Any], with_: dict[str, Any] | None) -> str:
    """The cells of one batch: without the plugin, then with it."""
    if row.get("error"):
        left = f"{'error: ' + row['error'][:38]:<44}"
    else:
        cmp, ids = row["compare"], row["out_of_range_ids"]
        bad = f"{cmp['bad_rows']}/{row['real']}"
        left = f"{cmp['nan_count']:>10} {bad:>9} {ids:>8}     "
    if with_ is None or with_.get("error"):
        return f"{left}| {'error: ' + with_['error'][:40] if with_ else 'not run'}"
    match, bad = with_["compare"]["match"], with_["compare"]["bad_rows"]
    right = f"{left}| {match}" + (f" ({bad} rows)" if match == "MISMATCH" else "")
    guard = with_.get("guard")
    if guard:
        right += f"; guard changed {guard.get('out_of_range', 0)} ids"
    return right


def render(envs: list[Env], out_dir: Path, elapsed: float) -> str:
    def version(e: Env) -> tuple:
        return tuple(
            int(p) if p.isdigit() else -1 for p in e.version.replace("post", "").split(".")
        )

    envs = sorted(envs, key=version)
    ran = next((e.check for e in envs if e.check.get("config")), {})
    where = "the CPU" if ran.get("device", "cpu") == "cpu" else ran["device"]
    ne = sum(ran.get("config", {}).get(k, 0) for k in ("routed_experts", "shared_experts")) or "NE"
    lines = [
        "sglang-amd-moe demo: CUDA-graph batches padded with garbage rows (NaN, +-1e30) go",
        "through each SGLang's real select_experts/_post_process_topk_ids, its HIP branch",
        f"forced, then an aiter-like MoE (a tiny DeepSeek-style model, on {where}): the",
        "real rows are compared with the same tokens run unpadded.",
        "",
    ]
    forms = [
        env.sglang.get("form") or (env.check.get("forms") or [{}])[0].get("form", "?")
        for env in envs
    ]
    width = max([15, *(len(f) + 2 for f in forms)])
    lines.append(f"{'SGLang':<14}{'form':<{width}}the plugin, loaded by SGLang's load_plugins()")
    for env, form in zip(envs, forms, strict=True):
        lines.append(f"{env.version:<14}{form:<{width}}{plugin_cell(env)}")
    lines += [
        "",
        f"{'':<14}{'':>11} | {'WITHOUT the plugin':^33} | WITH the plugin",
        f"{'SGLang':<14}{'batch':>11} | {'NaN cells':>10} {'bad rows':>9} {'bad ids':>8}      "
        "| real rows",
    ]
    for env in envs:
        if env.check_failed:
            why = env.check_error.removeprefix("sglang-amd-moe check: ")
            lines.append(f"{env.version:<14}{'':>11} | check could not run: {why}")
            continue
        key = ("source", "real", "padded")
        with_rows = {tuple(r.get(k) for k in key): r for r in env.check.get("with_plugin", [])}
        for row in env.check.get("without_plugin", []):
            batch = f"{row['real']} of {row['padded']}"
            if row.get("source") == "no-count":
                batch = f"{batch} *"
            with_ = with_rows.get(tuple(row.get(k) for k in key))
            lines.append(f"{env.version:<14}{batch:>11} | {_cells(row, with_)}")
    lines += [
        "",
        "NaN cells: non-finite values in the real rows; bad rows: real rows not bit-identical",
        f"to the unpadded run; bad ids: expert ids outside [0, {ne}) that reached the MoE sort",
        "(aiter's pre-fix HIP sort, emulated: on a GPU the behaviour is undefined); exact:",
        "bit-identical. Each batch passes SGLang's padded-row count, as its expert-parallel",
        "paths do, except those marked *: no count (as DP attention with TP MoE, EAGLE/MTP",
        "drafts, ATOM and vLLM hand aiter), the MoE through an aiter-shaped fused_moe entry;",
        "with the plugin its guard wraps that entry, and its counters say how many ids it",
        "changed.",
        "result: " + _verdict(envs) + f"  ({elapsed:.0f} s)",
        "",
        f"What ran (each check's full table, JSON and each audit: {shown(out_dir)}/):",
    ]
    for env in envs:
        lines.append(f"  {shown(env.python)} -m sglang_amd_moe check --no-rebuilt")
    lines.append("  and `-m sglang_amd_moe audit --json` with each of them")
    return "\n".join(lines)


def _verdict(envs: list[Env]) -> str:
    if any(env.check_failed for env in envs):
        return "could not run everywhere (see above)"
    if not all(env.check.get("ok") for env in envs):
        return "FAIL: a row with the plugin does not match"
    rows = {e.version: e.check.get("without_plugin", []) for e in envs}
    broken = [v for v, rs in rows.items() if any(r["compare"]["match"] == "MISMATCH" for r in rs)]
    shows = f" ({', '.join(broken)}: wrong without it)" if broken else ""
    return f"PASS: with the plugin every real row matches{shows}"


def status(envs: list[Env]) -> int:
    if any(env.check_failed or env.audit_status == 2 for env in envs):
        return 2
    return 0 if all(env.check.get("ok") for env in envs) else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    started = time.monotonic()
    bad = [p for p in args.python if not (os.path.isfile(p) and os.access(p, os.X_OK))]
    if bad:
        print(f"sglang-amd-moe demo: --python {bad[0]}: not an executable file", file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="sglang-amd-moe-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    # Each environment's commands run in the (absolute) output folder: `python -m` puts the
    # working directory first on sys.path, and from a source tree it would import the tree
    # instead of the package installed in that environment.
    envs = [
        Env(py, f"env{i}", out_dir.resolve()) for i, py in enumerate([*args.python, sys.executable])
    ]
    taken: set[str] = set()
    for env in envs:
        run_audit(env, taken)
    procs = [start_check(env, args.device) for env in envs]  # side by side
    for env, proc in zip(envs, procs, strict=True):
        finish_check(env, proc)
    print(render(envs, out_dir, time.monotonic() - started), flush=True)
    return status(envs)

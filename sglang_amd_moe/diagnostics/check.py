"""``sglang-amd-moe check``: the padded-batch regression end to end, without and with the
plugin, on a small MoE model built in memory, through the SGLang of the interpreter that
runs it (installing nothing). The check itself is :mod:`.e2e`."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from sglang_amd_moe.diagnostics import sources
from sglang_amd_moe.diagnostics.e2e import use_triton_interpreter
from sglang_amd_moe.runtime import env

DEVICE_HELP = (
    "cpu (default), or cuda (cuda:N for one GPU). ROCm builds of torch call an AMD GPU "
    "`cuda` too, so an MI300/MI355 is --device cuda; there is no rocm or hip device"
)


def device(text: str) -> str:
    """``--device``: ``cpu``, ``cuda`` or ``cuda:N``; else an error naming ROCm's ``cuda``."""
    if text == "cpu" or re.fullmatch(r"cuda(:\d+)?", text):
        return text
    raise argparse.ArgumentTypeError(
        f"invalid device {text!r}: use cpu or cuda (ROCm builds of torch call an AMD GPU "
        "`cuda` too: --device cuda)"
    )


EPILOG = """exit status:
  0  every row with the plugin matches the unpadded run
  1  a row with the plugin does not match
  2  the check cannot run: bad arguments, no GPU for --device cuda, or no SGLang, torch
     or Triton in this interpreter (run it with the python that runs your server)"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="sglang-amd-moe check",
        description="Padded-batch end-to-end check on a small MoE model, without and with "
        "the plugin. It needs SGLang installed in the interpreter that runs it.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--device", type=device, default="cpu", help=DEVICE_HELP)
    p.add_argument("--json", action="store_true", help="print the results as JSON, not a table")
    p.add_argument("--json-file", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--no-rebuilt", action="store_true", help="skip the rebuilt guard form")
    return p.parse_args(argv)


def missing_requirements() -> list[str]:
    """Why this interpreter cannot run the check, one reason a line; nothing is imported."""
    problems = []
    if sources.package_dir("sglang") is None:
        problems.append(
            f"SGLang is not installed in this interpreter ({sys.executable}): the check "
            "routes through the installed SGLang's own code. Run it with the python of the "
            "environment that runs your server. Do not install SGLang from the package "
            "registry into a ROCm image for it: the registry's SGLang pins CUDA torch."
        )
    if sources.package_dir("torch") is None:
        problems.append(f"torch is not installed in this interpreter ({sys.executable})")
    triton = env.triton_problem()
    if triton:
        problems.append(triton[0].upper() + triton[1:] + ": the check runs this package's kernels")
    return problems


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    use_triton_interpreter(args.device)
    problems = missing_requirements()
    for problem in problems:
        print(f"sglang-amd-moe check: cannot run: {problem}", file=sys.stderr)
    if problems:
        return 2
    if args.device.startswith("cuda"):
        import torch  # only here: `check --help` and argument errors stay fast

        if not torch.cuda.is_available():
            print("sglang-amd-moe check: --device cuda but torch sees no GPU", file=sys.stderr)
            return 2
    # After use_triton_interpreter(): Triton, which the kernels import, reads it on import.
    from sglang_amd_moe.diagnostics.e2e import run, table

    try:
        result = run.run_check(args.device, rebuilt=not args.no_rebuilt, started=started)
    except run.SGLangUnavailable as exc:
        print(f"sglang-amd-moe check: {exc}", file=sys.stderr)
        return 2
    doc = result.to_json()
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(doc, indent=2), encoding="utf-8")
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(table.render(result))
    return 0 if result.ok else 1

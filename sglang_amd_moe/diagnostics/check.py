"""``sglang-amd-moe check``: the padded-batch accuracy regression, end to end, before and after.

Why: the users' symptom was end to end (GSM8K 0.94 -> ~0.1 on AMD): garbage expert ids
in padded CUDA-graph rows reached aiter's MoE kernels and corrupted real tokens. This
command shows the whole path on a small MoE model built in memory, on the CPU by
default:

1. Real tokens padded to a CUDA-graph bucket (5 of 8, 47 of 48, 200 of 256); padded rows
   hold garbage activations (NaN rows and rows of +-1e30).
2. Each layer routes through SGLang's real ``select_experts`` and
   ``_post_process_topk_ids`` with the HIP branch forced (``_is_hip=True,
   _is_cuda=False`` on the topk module), ``num_token_non_padded`` set as a CUDA graph
   sets it.
3. An aiter-like consumer sorts (this package's MXFP4 sort), runs the per-expert MLP and
   reduces, called the way SGLang calls aiter's ``fused_moe`` (no ``num_local_tokens``).
4. The real rows are compared with an unpadded run of the same tokens.

One table row per (SGLang form, batch). The forms: the one installed, and a rebuilt
``mask-under-eplb-guard`` form (what upstream main had between PRs 28188 and 28378;
never released), made from the installed topk.py with upstream PR 28378 reversed (the
diffs in ``sglang_amd_moe/diagnostics/e2e/guard_form/``). "Without the
plugin" runs before the plugin loads; "with the plugin" means ``SGLANG_AMD_MOE_FORCE=1``
and SGLang's real ``sglang.srt.plugins.load_plugins()``, which finds this package's
entry point.

This module is the command line only; the check itself is
:mod:`sglang_amd_moe.diagnostics.e2e` (:func:`~sglang_amd_moe.diagnostics.e2e.run.run_check`).

Exit status 0 only when every row with the plugin matches the unpadded run; 1 when one
does not; 2 when the check cannot run (bad arguments, no GPU for ``--device cuda``, no
SGLang, torch or Triton in this interpreter, an SGLang whose topk module does not
import here). The check never installs anything: it runs with the SGLang of the
interpreter that runs it, the one your server runs with.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import time

from sglang_amd_moe.diagnostics.e2e import use_triton_interpreter
from sglang_amd_moe.runtime import env

DEVICE_HELP = (
    "cpu (default), or cuda (cuda:N for one GPU). ROCm builds of torch call an AMD GPU "
    "`cuda` too, so an MI300/MI355 is --device cuda; there is no rocm or hip device"
)


def device(text: str) -> str:
    """``--device``: ``cpu``, ``cuda`` or ``cuda:N``, as torch names them; anything else is
    an argparse error that says what ROCm torch calls its GPU."""
    if text == "cpu" or re.fullmatch(r"cuda(:\d+)?", text):
        return text
    raise argparse.ArgumentTypeError(
        f"invalid device {text!r}: use cpu or cuda (ROCm builds of torch call an AMD GPU "
        "`cuda` too: --device cuda)"
    )


def add_options(p: argparse.ArgumentParser) -> None:
    """The check's options (``demo`` takes the same ones)."""
    p.add_argument("--device", type=device, default="cpu", help=DEVICE_HELP)
    p.add_argument(
        "--json", action="store_true", help="print the results as JSON instead of a table"
    )
    p.add_argument("--json-file", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument(
        "--no-rebuilt", action="store_true", help="skip the rebuilt mask-under-eplb-guard form"
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
    add_options(p)
    return p.parse_args(argv)


def _installed(module: str) -> bool:
    """Whether ``module`` can be found by this interpreter, without importing it."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_requirements() -> list[str]:
    """Why this interpreter cannot run the check, one reason a line ([] when it can).

    Nothing is imported: a missing SGLang, torch or Triton is reported as such instead of
    as a traceback from deep inside the check.
    """
    problems = []
    if not _installed("sglang"):
        problems.append(
            f"SGLang is not installed in this interpreter ({sys.executable}): the check "
            "routes through the installed SGLang's own code. Run it with the python of the "
            "environment that runs your server. Do not install SGLang from the package "
            "registry into a ROCm image for it: the registry's SGLang pins CUDA torch."
        )
    if not _installed("torch"):
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
    if problems:
        for problem in problems:
            print(f"sglang-amd-moe check: cannot run: {problem}", file=sys.stderr)
        return 2
    if args.device.startswith("cuda"):
        import torch  # only here: `check --help` and argument errors stay fast

        if not torch.cuda.is_available():
            print("sglang-amd-moe check: --device cuda but torch sees no GPU", file=sys.stderr)
            return 2
    # Imported after use_triton_interpreter(): the check imports the kernels, and so
    # Triton, which reads TRITON_INTERPRET once, on import.
    from sglang_amd_moe.diagnostics.e2e import run, table

    try:
        result = run.run_check(args.device, rebuilt=not args.no_rebuilt, started=started)
    except run.SGLangUnavailable as exc:
        print(f"sglang-amd-moe check: {exc}", file=sys.stderr)
        return 2
    doc = result.to_json()
    if args.json_file:
        with open(args.json_file, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(table.render(result))
    return 0 if result.ok else 1

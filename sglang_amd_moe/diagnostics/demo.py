"""``sglang-amd-moe demo`` (what ``make demo`` runs): the audit, then the padded-batch check.

The audit says what is installed and what the plugin would change; the check then shows
the end-to-end effect on a small MoE model, without and with the plugin. The exit
status is the check's (0 only when every row with the plugin matches), except that an
audit error (its status 2) makes the demo's status 2: an audit that could not read the
installation means the demo did not show what it claims. The audit's "needs attention"
(1) is informational here: the check's table is the verdict.
"""

from __future__ import annotations

import argparse
import sys

from sglang_amd_moe.diagnostics import check
from sglang_amd_moe.diagnostics.e2e import use_triton_interpreter

DESCRIPTION = """\
Run `sglang-amd-moe audit` (no arguments), then `sglang-amd-moe check` with the
options below: what is installed and what the plugin changes, then the end-to-end
effect on a small MoE model, without and with the plugin."""
EPILOG = """exit status:
  0  every row of the check with the plugin matches the unpadded run
  1  a row with the plugin does not match
  2  the audit or the check could not run (the audit's "needs attention" does not
     change the status: the check's table is the verdict)"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="sglang-amd-moe demo",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_options(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run ``audit`` (no arguments), then ``check`` with ``argv``; see the module docstring."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)  # --help, and bad options, before anything runs
    # Before anything can import triton (see e2e.use_triton_interpreter).
    use_triton_interpreter(args.device)
    print("== sglang-amd-moe audit", flush=True)
    try:  # an audit that fails, even on import, must not hide the check
        from sglang_amd_moe.diagnostics import audit

        audit_status = int(audit.main([]) or 0)
    except Exception as exc:  # the audit must not hide the check; report and go on
        print(
            f"sglang-amd-moe demo: the audit failed: {type(exc).__name__}: {exc}", file=sys.stderr
        )
        audit_status = 2
    sys.stdout.flush()
    print("\n== sglang-amd-moe check", flush=True)
    check_status = int(check.main(argv) or 0)
    if audit_status == 2:
        print("sglang-amd-moe demo: the audit reported an error (status 2)", file=sys.stderr)
        return 2
    return check_status

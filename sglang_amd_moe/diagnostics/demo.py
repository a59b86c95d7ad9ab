"""``sglang-amd-moe demo`` (what ``make demo`` runs): the audit, then the padded-batch check.

The audit says what is installed and what the plugin would change; the check then shows
the end-to-end effect on a small MoE model, without and with the plugin. The exit
status is the check's (0 only when every row with the plugin matches), except that an
audit error (its status 2) makes the demo's status 2: an audit that could not read the
installation means the demo did not show what it claims. The audit's "needs attention"
(1) is informational here: the check's table is the verdict.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``audit`` (no arguments), then ``check`` with ``argv``; see the module docstring."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print("usage: sglang-amd-moe demo [check options]\n\n" + (__doc__ or "").strip())
        return 0
    from sglang_amd_moe.diagnostics import check

    # Before the audit can import triton (see check.use_triton_interpreter).
    device = argv[argv.index("--device") + 1] if "--device" in argv[:-1] else "cpu"
    check.use_triton_interpreter(device)
    print("== sglang-amd-moe audit", flush=True)
    try:
        from sglang_amd_moe.diagnostics import audit

        audit_status = int(audit.main([]) or 0)
    except Exception as exc:  # the audit must not hide the check; report and go on
        print(f"sglang-amd-moe demo: the audit failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        audit_status = 2
    sys.stdout.flush()
    print("\n== sglang-amd-moe check", flush=True)
    check_status = int(check.main(argv) or 0)
    if audit_status == 2:
        print("sglang-amd-moe demo: the audit reported an error (status 2)", file=sys.stderr)
        return 2
    return check_status

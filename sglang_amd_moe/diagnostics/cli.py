"""The ``sglang-amd-moe`` command: ``audit``, ``check`` and ``demo``.

Each subcommand lives in its own module and takes its own ``argv``; this module only
dispatches, so ``sglang-amd-moe audit --help`` is the audit's own help.
"""

from __future__ import annotations

import importlib
import logging
import sys

SUBCOMMANDS = {
    "audit": ("sglang_amd_moe.diagnostics.audit", "what is installed, what is broken, what the plugin changes"),
    "check": ("sglang_amd_moe.diagnostics.check", "padded-batch end-to-end check on a small MoE model"),
    "demo": ("sglang_amd_moe.diagnostics.demo", "audit, then check: what `make demo` runs"),
}


def _usage() -> str:
    lines = ["usage: sglang-amd-moe {" + ",".join(SUBCOMMANDS) + "} [options]", ""]
    lines += [f"  {name:<6} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in {"-h", "--help"}:
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"sglang-amd-moe: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)

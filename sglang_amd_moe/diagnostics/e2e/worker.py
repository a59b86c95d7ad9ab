"""The check's worker: the rebuilt form with the plugin, in a process of its own.

The plugin loads once per process and classifies the function that is running when it
loads, so the rebuilt ``mask-under-eplb-guard`` form can only be checked with the plugin
in a process where the rebuilt function was put in place first. :class:`.run.Worker`
starts this module (``python -m sglang_amd_moe.diagnostics.e2e.worker --device D
--json-file F``); it writes its result to ``F`` and exits 0. It is not a user command.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sglang_amd_moe.diagnostics.e2e import use_triton_interpreter


def rebuilt_with_plugin(device: str) -> dict[str, Any]:
    """Put the rebuilt function in place, load the plugin, run every batch."""
    # Imported here, after main() has chosen whether Triton interprets: these modules
    # import the kernels, and so Triton, which reads TRITON_INTERPRET on import.
    from sglang_amd_moe.diagnostics.e2e.run import build_bench, run_form
    from sglang_amd_moe.diagnostics.e2e.sglang_calls import (
        GUARD_FORM,
        GuardFormError,
        guard_form,
        import_topk,
        load_plugin,
    )
    from sglang_amd_moe.runtime.sglang.names import FUNCTION_NAME

    mod = import_topk()
    try:
        fn, _ = guard_form(mod)
    except GuardFormError as exc:
        return {"reachable": False, "note": str(exc), "rows": []}
    setattr(mod, FUNCTION_NAME, fn)
    # topk is imported and the rebuilt function is the running one: the plugin classifies
    # the running function (not the installed file, whose form is `fixed`).
    live, message = load_plugin()
    bench = build_bench(device)
    rows = run_form(bench, mod, "rebuilt", GUARD_FORM, plugin=True)
    return {
        "reachable": True,
        "hook_live": live,
        "hook_message": message,
        "direct": bench.direct,
        "rows": [asdict(r) for r in rows],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m sglang_amd_moe.diagnostics.e2e.worker",
        description="Internal to `sglang-amd-moe check`: the rebuilt form with the plugin.",
    )
    p.add_argument("--device", required=True)
    p.add_argument("--json-file", required=True, type=Path)
    args = p.parse_args(argv)
    use_triton_interpreter(args.device)
    result = rebuilt_with_plugin(args.device)
    # Written under a temporary name and renamed: the check reads a whole file or none.
    partial = args.json_file.with_name(args.json_file.name + ".partial")
    partial.write_text(json.dumps(result), encoding="utf-8")
    os.replace(partial, args.json_file)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(main())

"""The rebuilt form with the plugin, in a process of its own (started by :mod:`.run`): the
plugin decides from the function running when it loads, so that must be the rebuilt one."""

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
    # Imported once main() has chosen whether Triton interprets (read on its import).
    from sglang_amd_moe.diagnostics.e2e import sglang_calls as calls
    from sglang_amd_moe.diagnostics.e2e.run import build_bench, run_form
    from sglang_amd_moe.runtime.sglang.names import FUNCTION_NAME

    mod = calls.import_topk()
    try:
        fn, _ = calls.guard_form(mod)
    except calls.GuardFormError as exc:
        return {"reachable": False, "note": str(exc), "rows": []}
    setattr(mod, FUNCTION_NAME, fn)  # the running function, which the plugin decides from
    live, message = calls.load_plugin()
    bench = build_bench(device)
    rows = run_form(bench, mod, "rebuilt", calls.GUARD_FORM, plugin=True)
    doc = {"reachable": True, "hook_live": live, "hook_message": message}
    return doc | {"direct": bench.direct, "rows": [asdict(r) for r in rows]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Internal to `sglang-amd-moe check`.")
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

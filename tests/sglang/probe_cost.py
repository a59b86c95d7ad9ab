"""Measure what deciding costs in a process: run in a release's interpreter.

``python tests/sglang/probe_cost.py [N]`` prints JSON: the ledger's reading of the installed
topk.py, importing topk (the plugin imports it only where the file is not ``fixed``),
the probe of the installed function (first call, then the median and max of N more),
and ``sglang_hook.install()`` as a whole (with ``SGLANG_AMD_MOE_FORCE=1``), with the
probe time its status records.
"""

from __future__ import annotations

import inspect
import json
import os
import statistics
import sys
import time


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 20
    os.environ["SGLANG_AMD_MOE_FORCE"] = "1"
    out: dict = {"python": sys.version.split()[0]}
    import importlib.metadata

    out["sglang"] = importlib.metadata.version("sglang")
    from sglang_amd_moe.runtime.sglang import hook as sglang_hook
    from sglang_amd_moe.runtime.sglang import ledger
    from sglang_amd_moe.runtime.sglang import probe as sglang_probe

    path = sglang_hook.topk_path()
    t = time.perf_counter()
    reading = ledger.read(path.read_text())
    out["ledger_s"] = round(time.perf_counter() - t, 4)
    out["form"] = reading.form
    t = time.perf_counter()
    import sglang.srt.layers.moe.topk as tk

    out["import_topk_s"] = round(time.perf_counter() - t, 2)
    upstream = inspect.unwrap(tk._post_process_topk_ids)
    t = time.perf_counter()
    first = sglang_probe.probe(upstream)
    out["probe_first_s"] = round(time.perf_counter() - t, 4)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        sglang_probe.probe(upstream)
        times.append(time.perf_counter() - t)
    out["probe_median_s"] = round(statistics.median(times), 4)
    out["probe_max_s"] = round(max(times), 4)
    out["probe_behaviour"] = first.behaviour
    t = time.perf_counter()
    st = sglang_hook.install()
    out["install_s"] = round(time.perf_counter() - t, 4)
    out["install_state"] = st.state
    out["install_probe_s"] = (st.detail.get("probe") or {}).get("seconds")
    out["install_hooked_probes_s"] = [p["seconds"] for p in st.detail.get("probe_hooked") or []]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

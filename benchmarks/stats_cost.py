#!/usr/bin/env python3
"""What the counters cost: the guard and the mask with and without them, side by side.

Each configuration (kernel, M, topk) is timed in CUDA-graph replay (every variant captured,
the graphs replayed in turn, interleaved: ``run.replay_interleaved``) and eagerly
(``run.time_eager``), in the same process and on the same inputs. Variants:

* guard: ``plain`` (``guard_routing`` with a count), ``stats`` (the same with a counter
  buffer: one launch that also adds to it), ``stats_runtime`` (what the plugin's wrapper
  adds on the host around it: the buffer lookup of ``runtime.stats`` and its ``tick``),
  and the same three without a count (``*_no_count``, what aiter's entry sees on most
  deployments);
* mask: ``plain`` and ``stats`` (``mask_padded_rows_`` with a counter buffer).

Inputs: half the rows padded (the count is ``M // 2``), and every padded row holding
garbage (ids out of range, NaN weights), so each tile has entries to count and the atomic
adds run: the counters' worst case. The mask writes its inputs, so after the first call
its padded rows are clean; its counters then count nothing, as in a server once the rows
are masked (its reads still run).

Writes ``--out`` (JSON); ``--markdown`` prints the tables for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import torch

# Siblings: found as the script's own folder when run as a script.
from report import counters_markdown as markdown
from run import capture_graph, replay_interleaved, time_eager
from sglang_amd_moe.kernels import guard_routing, mask_padded_rows_

from sglang_amd_moe.runtime import stats as stats_mod

M_VALUES = [1, 8, 64, 256, 1024, 4096]
TOPK_VALUES = [8, 9]
EXPERTS = 257


def inputs(M: int, topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(M * 31 + topk)
    ids = torch.randint(0, EXPERTS, (M, topk), dtype=torch.int32, device="cuda", generator=g)
    w = torch.rand(M, topk, dtype=torch.float32, device="cuda", generator=g)
    n = M // 2
    ids[n:] = torch.randint(
        EXPERTS, 2**31 - 1, (M - n, topk), dtype=torch.int32, device="cuda", generator=g
    )
    w[n:] = float("nan")
    return ids, w, torch.tensor([n], dtype=torch.int32, device="cuda")


def variants(M: int, topk: int) -> dict[tuple[str, str], object]:
    ids, w, count = inputs(M, topk)
    buf = torch.zeros(8, dtype=torch.int64, device="cuda")
    dev = ids.device

    def runtime(c):
        def call():
            b = stats_mod.buffer("guard", dev)
            out = guard_routing(ids, w, EXPERTS, c, b)
            stats_mod.tick()
            return out

        return call

    m_ids, m_w = ids.clone(), w.clone()
    m_buf = torch.zeros(8, dtype=torch.int64, device="cuda")
    return {
        ("guard", "plain"): lambda: guard_routing(ids, w, EXPERTS, count),
        ("guard", "stats"): lambda: guard_routing(ids, w, EXPERTS, count, buf),
        ("guard", "stats_runtime"): runtime(count),
        ("guard", "plain_no_count"): lambda: guard_routing(ids, w, EXPERTS),
        ("guard", "stats_no_count"): lambda: guard_routing(ids, w, EXPERTS, None, buf),
        ("guard", "stats_runtime_no_count"): runtime(None),
        ("mask", "plain"): lambda: mask_padded_rows_(m_ids, m_w, count, 0),
        ("mask", "stats"): lambda: mask_padded_rows_(m_ids, m_w, count, 0, m_buf),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--markdown", type=Path, default=None, help="render this JSON and exit")
    args = ap.parse_args(argv)
    if args.markdown is not None:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    stats_mod.reset()
    results = []
    for topk in TOPK_VALUES:
        for M in M_VALUES:
            fns = variants(M, topk)
            graphs = {k: capture_graph(f) for k, f in fns.items()}
            graph_us = replay_interleaved(graphs)
            del graphs
            for (kernel, impl), fn in fns.items():
                for mode, us in (("graph", graph_us[(kernel, impl)]), ("eager", time_eager(fn))):
                    results.append(
                        {
                            "kernel": kernel,
                            "impl": impl,
                            "M": M,
                            "topk": topk,
                            "mode": mode,
                            "us": round(us, 3),
                        }  # fmt: skip
                    )
            print(
                f"topk={topk} M={M}: "
                + ", ".join(
                    f"{r['kernel']}/{r['impl']}/{r['mode']}={r['us']:.2f}"
                    for r in results[-2 * len(fns) :]
                ),
                flush=True,
            )
    props = torch.cuda.get_device_properties(0)
    doc = {
        "schema": 1,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": props.name,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

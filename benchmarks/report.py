"""Turn a committed benchmark JSON into ``docs/benchmarks.md`` and PNG plots.

Every number in the document is read from the JSON given (``--results``); nothing is
typed in by hand. Ratios are peer time over our time for the same configuration and
mode. Plots need matplotlib (present on the GPU machine); without it the document is
still written and says the plots were not regenerated.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

MASK_PEERS = ["sgl_fill_x2", "eager_index_put"]
SORT_PEERS = ["sgl_triton_align", "torch_argsort"]


def index(results: list[dict]) -> dict[tuple, float]:
    return {
        (r["kernel"], r["impl"], r["M"], r["topk"], r["num_experts"], r["block"], r["padded"], r["mode"]): r["us"]
        for r in results
    }


def mask_section(results: list[dict], idx: dict[tuple, float], mode: str) -> list[str]:
    ms = sorted({r["M"] for r in results if r["kernel"] == "mask"})
    topks = sorted({r["topk"] for r in results if r["kernel"] == "mask"})
    lines = [f"### mask, {mode} (us per call; ratio = peer / ours)", "",
             "| topk | M | ours | sgl_fill_x2 | eager_index_put | vs fill x2 | vs eager |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for topk in topks:
        for M in ms:
            def key(impl: str, M: int = M, topk: int = topk) -> tuple:
                return ("mask", impl, M, topk, None, None, "half", mode)

            if key("ours") not in idx:
                continue
            ours = idx[key("ours")]
            peers = [idx.get(key(p)) for p in MASK_PEERS]
            ratios = [f"{p / ours:.1f}x" if p else "-" for p in peers]
            lines.append(f"| {topk} | {M} | {ours:.2f} | " + " | ".join(f"{p:.2f}" if p else "-" for p in peers)
                         + " | " + " | ".join(ratios) + " |")
    return lines + [""]


def sort_section(results: list[dict], idx: dict[tuple, float], mode: str, padded: str) -> list[str]:
    shapes = sorted({(r["num_experts"], r["topk"]) for r in results if r["kernel"] == "sort"})
    blocks = sorted({r["block"] for r in results if r["kernel"] == "sort"})
    ms = sorted({r["M"] for r in results if r["kernel"] == "sort"})
    lines = [f"### sort, {mode}, padded rows: {padded} (us per call; ratio = peer / ours_count)", "",
             "| NE/topk | block | M | ours | ours_count | count cost | sgl_triton_align | torch_argsort"
             " | vs align | vs argsort |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for NE, topk in shapes:
        for B in blocks:
            for M in ms:
                def key(impl: str, M: int = M, topk: int = topk, NE: int = NE, B: int = B) -> tuple:
                    return ("sort", impl, M, topk, NE, B, padded, mode)

                if key("ours_count") not in idx:
                    continue
                ours, oc = idx[key("ours")], idx[key("ours_count")]
                al, ar = idx[key("sgl_triton_align")], idx[key("torch_argsort")]
                lines.append(
                    f"| {NE}/{topk} | {B} | {M} | {ours:.2f} | {oc:.2f} | {oc - ours:+.2f} | {al:.2f} | {ar:.2f} | "
                    f"{al / oc:.1f}x | {ar / oc:.1f}x |"
                )
    return lines + [""]


def targets_section(results: list[dict], idx: dict[tuple, float]) -> list[str]:
    """Each target of the GPU issue, checked against the JSON: met, or where it is missed."""
    lines = ["## Targets (graph replay, per call)", "",
             "| target | result | misses (configuration: value) |", "| --- | --- | --- |"]

    def row(name: str, misses: list[str]) -> None:
        shown = "; ".join(misses[:12]) + (f"; +{len(misses) - 12} more" if len(misses) > 12 else "")
        lines.append(f"| {name} | {'met' if not misses else f'missed in {len(misses)}'} | {shown or '-'} |")

    mask = [r for r in results if r["kernel"] == "mask" and r["impl"] == "ours" and r["mode"] == "graph"]

    def peer(r: dict, impl: str) -> float:
        return idx[(r["kernel"], impl, r["M"], r["topk"], r["num_experts"], r["block"], r["padded"], "graph")]

    row("mask <= 1.5 us for M <= 4096",
        [f"topk {r['topk']} M {r['M']}: {r['us']:.2f}" for r in mask if r["M"] <= 4096 and r["us"] > 1.5])
    row("mask >= 1.8x faster than sgl_fill_x2",
        [f"topk {r['topk']} M {r['M']}: {peer(r, 'sgl_fill_x2') / r['us']:.2f}x" for r in mask
         if peer(r, "sgl_fill_x2") / r["us"] < 1.8])
    row("mask >= 6x faster than eager_index_put",
        [f"topk {r['topk']} M {r['M']}: {peer(r, 'eager_index_put') / r['us']:.2f}x" for r in mask
         if peer(r, "eager_index_put") / r["us"] < 6])
    sort = [r for r in results if r["kernel"] == "sort" and r["impl"] in ("ours", "ours_count") and r["mode"] == "graph"]

    def cfg(r: dict) -> str:
        return f"{r['impl']} {r['num_experts']}/{r['topk']} B{r['block']} {r['padded']} M {r['M']}"

    row("sort <= 10 us for M <= 512", [f"{cfg(r)}: {r['us']:.2f}" for r in sort if r["M"] <= 512 and r["us"] > 10])
    row("sort <= 40 us at M = 4096", [f"{cfg(r)}: {r['us']:.2f}" for r in sort if r["M"] == 4096 and r["us"] > 40])
    row("sort >= 3x faster than sgl_triton_align for M <= 512",
        [f"{cfg(r)}: {peer(r, 'sgl_triton_align') / r['us']:.2f}x" for r in sort
         if r["M"] <= 512 and peer(r, "sgl_triton_align") / r["us"] < 3])
    row("count costs <= 0.6 us (ours_count - ours)",
        [f"{cfg(r)}: {r['us'] - peer(r, 'ours'):+.2f}" for r in sort
         if r["impl"] == "ours_count" and r["us"] - peer(r, "ours") > 0.6])
    return lines + [""]


def plot(results: list[dict], out_dir: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    series: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for r in results:
        if r["mode"] != "graph":
            continue
        if r["kernel"] == "mask" and r["topk"] == 8:
            series[("mask", r["impl"])].append((r["M"], r["us"]))
        if r["kernel"] == "sort" and (r["num_experts"], r["topk"], r["block"], r["padded"]) == (513, 11, 16, "half"):
            series[("sort", r["impl"])].append((r["M"], r["us"]))
    for kernel, title in (("mask", "mask padded rows, topk 8, graph replay"),
                          ("sort", "MoE sort, NE 513, topk 11, block 16, half padded, graph replay")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for (k, impl), pts in sorted(series.items()):
            if k != kernel:
                continue
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("M (rows)")
        ax.set_ylabel("us per call")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        path = out_dir / f"bench_{kernel}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path.name)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=HERE / "results" / "h200.json")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    ap.add_argument("--plots-dir", type=Path, default=REPO / "docs")
    ap.add_argument("--note", action="append", default=[], help="a caveat to print under the header")
    ap.add_argument("--notes-file", type=Path,
                    help="caveats to print under the header, one paragraph each (blank-line separated)")
    a = ap.parse_args(argv)
    if a.notes_file:
        a.note += [" ".join(p.split()) for p in a.notes_file.read_text().split("\n\n") if p.strip()]
    doc = json.loads(a.results.read_text())
    results = doc["results"]
    idx = index(results)
    a.plots_dir.mkdir(parents=True, exist_ok=True)
    plots = plot(results, a.plots_dir)
    rel = a.results.resolve().relative_to(REPO) if a.results.resolve().is_relative_to(REPO) else a.results
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `benchmarks/report.py` from `{rel}` (do not edit by hand).",
        f"Device: {doc['device']}; torch {doc['torch']}; triton {doc['triton']}; measured {doc['date']}.",
        f"Method: {json.dumps(doc['method'])}. `benchmarks/run.py` says how each peer is called.",
        "",
    ]
    for note in a.note:
        lines += [f"> {note}", ""]
    for name in plots:
        lines += [f"![{name}]({name})", ""]
    if not plots:
        # Without matplotlib here, reference the plots made from the same JSON by the
        # device run (benchmarks/device.sh), if they were committed beside this document.
        kept = sorted(p.name for p in a.plots_dir.glob("bench_*.png"))
        lines += [f"![{name}]({name})" for name in kept]
        lines += ["", "(plots drawn by the device run from the same JSON)" if kept
                  else "(no plots: matplotlib missing where this report was made)", ""]
    lines += targets_section(results, idx)
    lines += ["## Mask padded rows", ""]
    for mode in ("graph", "eager"):
        lines += mask_section(results, idx, mode)
    lines += ["## MXFP4 aux sort", ""]
    for mode in ("graph", "eager"):
        for padded in ("half", "none"):
            lines += sort_section(results, idx, mode, padded)
    a.out.write_text("\n".join(lines))
    print(f"wrote {a.out} ({len(results)} records; plots: {plots or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

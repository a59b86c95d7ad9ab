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
# Targets on sgl_kernel's C++ align (sgl_align_cpp): graph replay at these M, eager up to
# EAGER_MAX_M at the blocks of EAGER_BLOCKS; absolute graph-replay ceilings at M = 16384.
CPP_GRAPH_MS = (1, 4, 16, 64, 256, 512, 4096, 16384)
EAGER_MAX_M = 4096
EAGER_BLOCKS = (16, 32)
LARGE_M_CEILINGS = {(257, 9): 25.0, (513, 11): 25.0, (896, 16): 40.0}


def result_key(r: dict, impl: str | None = None) -> tuple:
    """A result's key in ``index``; with ``impl``, that peer's at the same configuration."""
    fields = ("M", "topk", "num_experts", "block", "padded", "mode")
    return (r["kernel"], impl or r["impl"], *(r[f] for f in fields))


def index(results: list[dict]) -> dict[tuple, float]:
    return {result_key(r): r["us"] for r in results}


def mask_section(results: list[dict], idx: dict[tuple, float], mode: str) -> list[str]:
    ms = sorted({r["M"] for r in results if r["kernel"] == "mask"})
    topks = sorted({r["topk"] for r in results if r["kernel"] == "mask"})
    lines = [
        f"### mask, {mode} (us per call; ratio = peer / ours)",
        "",
        "| topk | M | ours | sgl_fill_x2 | eager_index_put | vs fill x2 | vs eager |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for topk in topks:
        for M in ms:

            def key(impl: str, M: int = M, topk: int = topk) -> tuple:
                return ("mask", impl, M, topk, None, None, "half", mode)

            if key("ours") not in idx:
                continue
            ours = idx[key("ours")]
            peers = [idx.get(key(p)) for p in MASK_PEERS]
            ratios = [f"{p / ours:.1f}x" if p else "-" for p in peers]
            lines.append(
                f"| {topk} | {M} | {ours:.2f} | "
                + " | ".join(f"{p:.2f}" if p else "-" for p in peers)
                + " | "
                + " | ".join(ratios)
                + " |"
            )
    return lines + [""]


def sort_section(results: list[dict], idx: dict[tuple, float], mode: str, padded: str) -> list[str]:
    shapes = sorted({(r["num_experts"], r["topk"]) for r in results if r["kernel"] == "sort"})
    blocks = sorted({r["block"] for r in results if r["kernel"] == "sort"})
    ms = sorted({r["M"] for r in results if r["kernel"] == "sort"})
    lines = [
        f"### sort, {mode}, padded rows: {padded} (us per call; ratio = peer / ours_count)",
        "",
        "| NE/topk | block | M | ours | ours_count | count cost | ours_adaptive | sgl_align_cpp"
        " | sgl_triton_align | torch_argsort | vs align_cpp | vs triton align | vs argsort |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    for NE, topk in shapes:
        for B in blocks:
            for M in ms:

                def key(impl: str, M: int = M, topk: int = topk, NE: int = NE, B: int = B) -> tuple:
                    return ("sort", impl, M, topk, NE, B, padded, mode)

                if key("ours_count") not in idx:
                    continue
                ours, oc = idx[key("ours")], idx[key("ours_count")]
                ad, cpp = idx.get(key("ours_adaptive")), idx.get(key("sgl_align_cpp"))
                al, ar = idx[key("sgl_triton_align")], idx[key("torch_argsort")]
                vs_cpp = "-" if cpp is None else f"{cpp / oc:.2f}x"
                lines.append(
                    f"| {NE}/{topk} | {B} | {M} | {ours:.2f} | {oc:.2f} | {oc - ours:+.2f} | "
                    f"{fmt(ad)} | {fmt(cpp)} | {al:.2f} | {ar:.2f} | {vs_cpp} | "
                    f"{al / oc:.1f}x | {ar / oc:.1f}x |"
                )
    return lines + [""]


def launch_section(results: list[dict]) -> list[str]:
    rows = [r for r in results if r["kernel"] == "launch"]
    if not rows:
        return []
    names = {
        "triton_jit": "Triton's own path, `kernel[grid](...)`",
        "direct": "this package's direct launch (`KernelLauncher`)",
        "torch_zero_": "one small torch op (`x.zero_()`), for scale",
    }
    lines = [
        "## Host cost of one launch (eager, us per call)",
        "",
        "An empty one-program Triton kernel called back to back: the GPU waits for the host,",
        "so this is what the host spends per launch.",
        "",
        "| path | us |",
        "| --- | --- |",
    ]
    lines += [f"| {names.get(r['impl'], r['impl'])} | {r['us']:.2f} |" for r in rows]
    return lines + [""]


def targets_section(results: list[dict], idx: dict[tuple, float]) -> list[str]:
    """Each target, checked against the JSON: met, or where it is missed and by how much."""
    lines = [
        "## Targets (per call)",
        "",
        "| target | mode | result | misses (configuration: value) |",
        "| --- | --- | --- | --- |",
    ]

    def row(name: str, mode: str, misses: list[str], checked: int) -> None:
        if not checked:
            lines.append(f"| {name} | {mode} | not measured | - |")
            return
        shown = "; ".join(misses[:12]) + (f"; +{len(misses) - 12} more" if len(misses) > 12 else "")
        result = "met" if not misses else f"missed in {len(misses)} of {checked}"
        lines.append(f"| {name} | {mode} | {result} | {shown or '-'} |")

    def peer(r: dict, impl: str) -> float | None:
        return idx.get(result_key(r, impl))

    def cfg(r: dict) -> str:
        return f"{r['impl']} {r['num_experts']}/{r['topk']} B{r['block']} {r['padded']} M {r['M']}"

    def ours(kernel: str, impls: tuple[str, ...], mode: str) -> list[dict]:
        return [
            r for r in results if r["kernel"] == kernel and r["impl"] in impls and r["mode"] == mode
        ]

    def ratio_row(
        name: str, mode: str, rows: list[dict], impl: str, limit: float, label=cfg
    ) -> None:
        pairs = [(r, peer(r, impl)) for r in rows]
        pairs = [(r, p) for r, p in pairs if p is not None]
        row(
            name,
            mode,
            [
                f"{label(r)}: {r['us'] / p:.2f}x ({r['us']:.2f} vs {p:.2f})"
                for r, p in pairs
                if r["us"] / p > limit
            ],
            len(pairs),
        )

    mask_g = ours("mask", ("ours",), "graph")
    mask_e = ours("mask", ("ours",), "eager")

    def mcfg(r: dict) -> str:
        return f"topk {r['topk']} M {r['M']}"

    row(
        "mask <= 1.5 us for M <= 4096",
        "graph",
        [f"{mcfg(r)}: {r['us']:.2f}" for r in mask_g if r["M"] <= 4096 and r["us"] > 1.5],
        sum(r["M"] <= 4096 for r in mask_g),
    )
    ratio_row("mask <= 1/1.8 of sgl_fill_x2", "graph", mask_g, "sgl_fill_x2", 1 / 1.8, mcfg)
    ratio_row("mask <= 1/6 of eager_index_put", "graph", mask_g, "eager_index_put", 1 / 6, mcfg)
    ratio_row("mask <= 0.6x sgl_fill_x2", "eager", mask_e, "sgl_fill_x2", 0.6, mcfg)

    sort_g = ours("sort", ("ours", "ours_count"), "graph")
    row(
        "sort <= 10 us for M <= 512",
        "graph",
        [f"{cfg(r)}: {r['us']:.2f}" for r in sort_g if r["M"] <= 512 and r["us"] > 10],
        sum(r["M"] <= 512 for r in sort_g),
    )
    row(
        "sort <= 40 us at M = 4096",
        "graph",
        [f"{cfg(r)}: {r['us']:.2f}" for r in sort_g if r["M"] == 4096 and r["us"] > 40],
        sum(r["M"] == 4096 for r in sort_g),
    )
    ratio_row(
        "sort <= 1/3 of sgl_triton_align for M <= 512",
        "graph",
        [r for r in sort_g if r["M"] <= 512],
        "sgl_triton_align",
        1 / 3,
    )
    counted = [r for r in sort_g if r["impl"] == "ours_count" and peer(r, "ours") is not None]
    row(
        "count costs <= 0.6 us (ours_count - ours)",
        "graph",
        [
            f"{cfg(r)}: {r['us'] - peer(r, 'ours'):+.2f}"
            for r in counted
            if r["us"] - peer(r, "ours") > 0.6
        ],
        len(counted),
    )

    count_g = ours("sort", ("ours_count",), "graph")
    ratio_row(
        "sort with a count <= 1.0x sgl_align_cpp",
        "graph",
        [r for r in count_g if r["M"] in CPP_GRAPH_MS],
        "sgl_align_cpp",
        1.0,
    )
    big = [
        r for r in count_g if r["M"] == 16384 and (r["num_experts"], r["topk"]) in LARGE_M_CEILINGS
    ]
    row(
        "sort with a count at M = 16384 <= 25 us (257/9, 513/11), <= 40 us (896/16)",
        "graph",
        [
            f"{cfg(r)}: {r['us']:.2f}"
            for r in big
            if r["us"] > LARGE_M_CEILINGS[(r["num_experts"], r["topk"])]
        ],
        len(big),
    )
    for impl in ("ours_count", "ours_adaptive"):
        rows = [
            r
            for r in ours("sort", (impl,), "eager")
            if r["M"] <= EAGER_MAX_M and r["block"] in EAGER_BLOCKS
        ]
        api = "mxfp4_moe_sort" if impl == "ours_count" else "adaptive_moe_sort"
        ratio_row(
            f"{api} with a count <= 2.0x sgl_align_cpp, M <= {EAGER_MAX_M}",
            "eager",
            rows,
            "sgl_align_cpp",
            2.0,
        )
    return lines + [""]


def plot(results: list[dict], out_dir: Path) -> list[str]:
    """Graph-replay and eager plots of the mask (topk 8) and the sort (513/11, block 16,
    half padded)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    series: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for r in results:
        if r["kernel"] == "mask" and r["topk"] == 8:
            series[("mask", r["mode"], r["impl"])].append((r["M"], r["us"]))
        if r["kernel"] == "sort" and (r["num_experts"], r["topk"], r["block"], r["padded"]) == (
            513,
            11,
            16,
            "half",
        ):
            series[("sort", r["mode"], r["impl"])].append((r["M"], r["us"]))
    charts = (
        ("mask", "graph", "bench_mask.png", "mask padded rows, topk 8, graph replay"),
        (
            "sort",
            "graph",
            "bench_sort.png",
            "MoE sort, NE 513, topk 11, block 16, half padded, graph replay",
        ),
        ("mask", "eager", "bench_mask_eager.png", "mask padded rows, topk 8, eager (host-bound)"),
        (
            "sort",
            "eager",
            "bench_sort_eager.png",
            "MoE sort, NE 513, topk 11, block 16, half padded, eager",
        ),
    )
    for kernel, mode, name, title in charts:
        fig, ax = plt.subplots(figsize=(6, 4))
        for (k, m, impl), pts in sorted(series.items()):
            if k != kernel or m != mode:
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
        path = out_dir / name
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
    ap.add_argument(
        "--note", action="append", default=[], help="a caveat to print under the header"
    )
    ap.add_argument(
        "--notes-file",
        type=Path,
        help="caveats to print under the header, one paragraph each (blank-line separated)",
    )
    a = ap.parse_args(argv)
    if a.notes_file:
        a.note += [" ".join(p.split()) for p in a.notes_file.read_text().split("\n\n") if p.strip()]
    doc = json.loads(a.results.read_text())
    results = doc["results"]
    idx = index(results)
    a.plots_dir.mkdir(parents=True, exist_ok=True)
    plots = plot(results, a.plots_dir)
    rel = (
        a.results.resolve().relative_to(REPO)
        if a.results.resolve().is_relative_to(REPO)
        else a.results
    )
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `benchmarks/report.py` from `{rel}` (do not edit by hand).",
        f"Device: {doc['device']}; torch {doc['torch']}; triton {doc['triton']}; "
        f"measured {doc['date']}.",
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
        lines += [
            "",
            "(plots drawn by the device run from the same JSON)"
            if kept
            else "(no plots: matplotlib missing where this report was made)",
            "",
        ]
    lines += targets_section(results, idx)
    lines += launch_section(results)
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

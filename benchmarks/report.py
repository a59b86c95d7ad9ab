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
GUARD_IMPLS = ["ours", "ours_no_count", "reference"]
# Graph-replay targets of the sort with a count, as ratios to sgl_kernel's C++ align
# (sgl_align_cpp) measured in the same run: (name, first M, last M, ceiling).
SORT_GRAPH_TARGETS = (
    ("M = 1", 1, 1, 0.5),
    ("M = 4", 4, 4, 0.75),
    ("M 16-512", 16, 512, 1.0),
    ("M 1024-4096", 1024, 4096, 0.8),
    ("M 16384", 16384, 16384, 0.45),
)
EAGER_MAX_M = 4096
MASK_GRAPH_CEILING_US = 1.5  # mask: M <= 16384; guard: M <= GUARD_MAX_M
GUARD_MAX_M = 4096
HOST_PYTHON_CEILING_US = 3.0
HOST_PER_LAUNCH_US = 1.5


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


def guard_section(results: list[dict], idx: dict[tuple, float], mode: str) -> list[str]:
    """The guard beside the mask, same configurations, same run."""
    rows = [r for r in results if r["kernel"] == "guard" and r["mode"] == mode]
    if not rows:
        return []
    ms = sorted({r["M"] for r in rows})
    topks = sorted({r["topk"] for r in rows})
    lines = [
        f"### guard, {mode} (us per call; the mask's `ours` from the same replays)",
        "",
        "| topk | M | guard, count | guard, no count | reference (torch) | mask | guard / mask |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for topk in topks:
        for M in ms:
            g = [idx.get(("guard", i, M, topk, 257, None, "half", mode)) for i in GUARD_IMPLS]
            mask = idx.get(("mask", "ours", M, topk, None, None, "half", mode))
            if g[0] is None:
                continue
            cells = " | ".join("-" if v is None else f"{v:.2f}" for v in (*g, mask))
            ratio = "-" if mask is None else f"{g[0] / mask:.2f}x"
            lines.append(f"| {topk} | {M} | {cells} | {ratio} |")
    return lines + [""]


def sort_section(results: list[dict], idx: dict[tuple, float], mode: str, padded: str) -> list[str]:
    shapes = sorted({(r["num_experts"], r["topk"]) for r in results if r["kernel"] == "sort"})
    blocks = sorted({r["block"] for r in results if r["kernel"] == "sort"})
    ms = sorted({r["M"] for r in results if r["kernel"] == "sort"})
    lines = [
        f"### sort, {mode}, padded rows: {padded} (us per call; ratio = peer / ours_count;"
        " - : not measured in this run)",
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
                al, ar = idx.get(key("sgl_triton_align")), idx.get(key("torch_argsort"))

                def vs(peer: float | None, digits: int, oc: float = oc) -> str:
                    return "-" if peer is None else f"{peer / oc:.{digits}f}x"

                lines.append(
                    f"| {NE}/{topk} | {B} | {M} | {ours:.2f} | {oc:.2f} | {oc - ours:+.2f} | "
                    f"{fmt(ad)} | {fmt(cpp)} | {fmt(al)} | {fmt(ar)} | {vs(cpp, 2)} | "
                    f"{vs(al, 1)} | {vs(ar, 1)} |"
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


def targets_section(
    results: list[dict], idx: dict[tuple, float], host: dict | None = None
) -> list[str]:
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
        name: str, mode: str, rows: list[dict], impl: str, limit: float, label=cfg, kernel=None
    ) -> None:
        if kernel is None:
            pairs = [(r, peer(r, impl)) for r in rows]
        else:
            # Another kernel's row of the same configuration (the mask has no expert count).
            pairs = [
                (r, idx.get(result_key({**r, "kernel": kernel, "num_experts": None}, impl)))
                for r in rows
            ]
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

    def mcfg(r: dict) -> str:
        return f"topk {r['topk']} M {r['M']}"

    count_g = ours("sort", ("ours_count",), "graph")
    for name, lo, hi, limit in SORT_GRAPH_TARGETS:
        ratio_row(
            f"sort with a count, {name}: <= {limit}x sgl_align_cpp",
            "graph",
            [r for r in count_g if lo <= r["M"] <= hi],
            "sgl_align_cpp",
            limit,
        )
    for impl, api, limit in (
        ("ours_count", "mxfp4_moe_sort with a count", 1.5),
        ("ours_adaptive", "adaptive_moe_sort with a count", 2.0),
    ):
        rows = [r for r in ours("sort", (impl,), "eager") if r["M"] <= EAGER_MAX_M]
        ratio_row(
            f"{api}, M <= {EAGER_MAX_M}: <= {limit}x sgl_align_cpp",
            "eager",
            rows,
            "sgl_align_cpp",
            limit,
        )
    mask_g = ours("mask", ("ours",), "graph")
    ratio_row(
        "mask <= 0.35x SGLang's fill twice", "eager", ours("mask", ("ours",), "eager"),
        "sgl_fill_x2", 0.35, mcfg,
    )  # fmt: skip
    row(
        f"mask <= {MASK_GRAPH_CEILING_US} us, M <= 16384",
        "graph",
        [f"{mcfg(r)}: {r['us']:.2f}" for r in mask_g if r["us"] > MASK_GRAPH_CEILING_US],
        len(mask_g),
    )
    guard_g = [r for r in ours("guard", ("ours",), "graph") if r["M"] <= GUARD_MAX_M]
    row(
        f"guard (with a count) <= {MASK_GRAPH_CEILING_US} us, M <= {GUARD_MAX_M}",
        "graph",
        [f"{mcfg(r)}: {r['us']:.2f}" for r in guard_g if r["us"] > MASK_GRAPH_CEILING_US],
        len(guard_g),
    )
    ratio_row(
        "guard's eager call no more than the mask's (same configuration)",
        "eager",
        ours("guard", ("ours",), "eager"),
        "ours",
        1.0,
        mcfg,
        kernel="mask",
    )
    if host is not None:
        # guard_alloc is the guard with its slabs turned off, for comparison: no path.
        hrows = [r for r in host["results"] if r["kernel"] != "guard_alloc"]

        def hcfg(r: dict) -> str:
            shape = f"{r['num_experts']}/{r['topk']} " if "num_experts" in r else ""
            return f"{r['kernel']} {shape}M {r['M']}"

        row(
            f"host path: <= {HOST_PYTHON_CEILING_US} us of Python (host_cost.py `python`)",
            "eager",
            [
                f"{hcfg(r)}: {r['python']:.2f}"
                for r in hrows
                if r["python"] > HOST_PYTHON_CEILING_US
            ],
            len(hrows),
        )
        row(
            f"host path: call within {HOST_PER_LAUNCH_US} us per launch of the raw launcher calls",
            "eager",
            [
                f"{hcfg(r)}: {r['call'] - r['raw']:+.2f} over {r['launches']} launch(es)"
                for r in hrows
                if r["call"] - r["raw"] > HOST_PER_LAUNCH_US * r["launches"]
            ],
            len(hrows),
        )
    return lines + [""]


def host_section(host: dict | None) -> list[str]:
    if host is None:
        return []
    lines = [
        "## Host cost of an eager call (`benchmarks/host_cost.py`, host clock, us per call)",
        "",
        f"Device: {host['device']}; torch {host['torch']}; triton {host['triton']}. "
        f"One small torch op (`x.zero_()`): {host['torch_op']:.2f} us. `call`: the whole "
        "call, its direct program built; `python`: the same with the compiled launchers "
        "replaced by a no-op; `raw`: the launches alone, bare calls of Triton's compiled "
        "launcher with prebuilt arguments. `adaptive_*`: `adaptive_moe_sort` (it allocates "
        "its outputs)."
        + (
            " `guard_alloc`: the guard with its output slabs turned off (two allocations a "
            f"call); for scale, one `torch.empty_like` {host['empty_like']:.2f} us, one view "
            f"made in a batch of 16 by `unbind` {host['view_of_16']:.2f} us."
            if "empty_like" in host
            else ""
        ),
        "",
        "| kernel | shape | M | launches | call | python | raw | adaptive call | adaptive "
        "python | adaptive raw | sgl_align_cpp |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    for r in host["results"]:
        shape = f"{r['num_experts']}/{r['topk']}" if "num_experts" in r else f"topk {r['topk']}"
        lines.append(
            f"| {r['kernel']} | {shape} | {r['M']} | {r['launches']} | {f(r['call'])} | "
            f"{f(r['python'])} | {f(r['raw'])} | {f(r.get('adaptive_call'))} | "
            f"{f(r.get('adaptive_python'))} | {f(r.get('adaptive_raw'))} | "
            f"{f(r.get('sgl_align_cpp'))} |"
        )
    return lines + [""]


def vary_section(runs: list[dict]) -> list[str]:
    """The row-count sequences of ``host_cost.py --only vary``: one file per code
    measured (this tree's first), in one table."""
    if not runs:
        return []
    first = runs[0]
    vary = first["vary"]
    lines = [
        "## Host cost when the row count changes (`benchmarks/host_cost.py --only vary`, "
        "host clock, us per call)",
        "",
        f"Device: {first['device']}; torch {first['torch']}; triton {first['triton']}. One "
        "small torch op: "
        + ", ".join(f"{run['torch_op']:.2f} us ({run['vary']['code']})" for run in runs)
        + ". Each kernel is called over "
        f"{len(vary['counts'])} row counts between {min(vary['counts'])} and "
        f"{max(vary['counts'])} (the mask and the guard at topk 8 with a count, the sort "
        "257/9 with a count): `fixed`, each count "
        f"{vary['layers']} calls in a row (the MoE layers of one forward), every count "
        "called once before; `cycle`, the same calls with the count changing on every "
        f"call; `forward`, {len(vary['forward'])} counts never called before, "
        f"{vary['layers']} calls each; `new`, {vary['new']} counts never called before, "
        "one call each. Every tile and plan was compiled before; each value is the median "
        f"of {vary['repeats']} runs of the sequence, the garbage collector off.",
        "",
        "| kernel | shape | code | fixed | cycle | forward | new |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in vary["results"]:
        for run in runs:
            found = [x for x in run["vary"]["results"] if x["kernel"] == r["kernel"]]
            for x in found:
                lines.append(
                    f"| {x['kernel']} | {x['shape']} | {run['vary']['code']} | "
                    f"{x['fixed']:.2f} | {x['cycle']:.2f} | {x['forward']:.2f} | {x['new']:.2f} |"
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
        if r["kernel"] == "guard" and r["topk"] == 8 and r["impl"] == "ours":
            series[("mask", r["mode"], "guard")].append((r["M"], r["us"]))
        if r["kernel"] == "sort" and (r["num_experts"], r["topk"], r["block"], r["padded"]) == (
            513,
            11,
            16,
            "half",
        ):
            series[("sort", r["mode"], r["impl"])].append((r["M"], r["us"]))
    charts = (
        ("mask", "graph", "bench_mask.png", "mask padded rows and guard, topk 8, graph replay"),
        (
            "sort",
            "graph",
            "bench_sort.png",
            "MoE sort, NE 513, topk 11, block 16, half padded, graph replay",
        ),
        (
            "mask",
            "eager",
            "bench_mask_eager.png",
            "mask padded rows and guard, topk 8, eager (host-bound)",
        ),
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


def counters_markdown(doc: dict) -> str:
    """Tables: us per call in graph replay and eagerly, each variant beside its plain one."""
    rows = doc["results"]
    by = {(r["kernel"], r["impl"], r["M"], r["topk"], r["mode"]): r["us"] for r in rows}
    ms = sorted({r["M"] for r in rows})
    out = [
        f"Measured on one {doc['device']} ({doc['date'][:10]}, torch {doc['torch']}, "
        f"Triton {doc['triton']}), `benchmarks/stats_cost.py`: microseconds per call, "
        "median of interleaved CUDA-graph replays and of eager calls; half the rows padded "
        "with garbage (every tile has entries to count).",
        "",
    ]
    pairs = [
        ("guard", "plain", "stats", "guard, with a count"),
        ("guard", "plain", "stats_runtime", "guard, with a count, plus the runtime's host side"),
        ("guard", "plain_no_count", "stats_no_count", "guard, no count"),
        ("guard", "plain_no_count", "stats_runtime_no_count", "guard, no count, plus host side"),
        ("mask", "plain", "stats", "mask"),
    ]
    out += [
        "What the counters add, over every M and topk below (with minus without, us per "
        "call, and as a share of the call without them):",
        "",
        "| | CUDA-graph replay | eager |",
        "| --- | --- | --- |",
    ]
    for kernel, base, counted, label in pairs:
        cells = []
        for mode in ("graph", "eager"):
            added = [
                (b - a, (b - a) / a * 100.0)
                for (k, impl, m, topk, md), a in by.items()
                if (k, impl, md) == (kernel, base, mode)
                and (b := by.get((kernel, counted, m, topk, mode))) is not None
                and a > 0
            ]
            if not added:
                cells.append("")
                continue
            us, pct = [x for x, _ in added], [y for _, y in added]
            cells.append(
                f"{min(us):+.2f} to {max(us):+.2f} us ({min(pct):+.0f}% to {max(pct):+.0f}%)"
            )
        out.append(f"| {label} | {cells[0]} | {cells[1]} |")
    out.append("")
    for topk in sorted({r["topk"] for r in rows}):
        for mode in ("graph", "eager"):
            out.append(f"topk {topk}, {'CUDA-graph replay' if mode == 'graph' else 'eager'}:")
            out.append("")
            out.append("| | " + " | ".join(f"M={m}" for m in ms) + " |")
            out.append("| --- |" + " --- |" * len(ms))
            for kernel, base, counted, label in pairs:
                cells = []
                for m in ms:
                    a = by.get((kernel, base, m, topk, mode))
                    b = by.get((kernel, counted, m, topk, mode))
                    cells.append("" if a is None or b is None else f"{a:.2f} / {b:.2f}")
                out.append(f"| {label}: without / with counters | " + " | ".join(cells) + " |")
            out.append("")
    return "\n".join(out)


def counters_section(path: Path) -> list[str]:
    """The counters' cost (``benchmarks/stats_cost.py``'s JSON), its own run and device."""
    rel = path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) else path
    return [
        '<a id="counters"></a>',
        "## Counters: the guard and the mask with and without them",
        "",
        f"From `{rel}` (`benchmarks/stats_cost.py`, a run of its own: compare within these "
        "tables, not with the tables above). Each cell: without / with counters, us per call.",
        "",
        *counters_markdown(json.loads(path.read_text())).splitlines(),
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=HERE / "results" / "h200.json")
    ap.add_argument(
        "--host-cost",
        type=Path,
        default=HERE / "results" / "h200-host-cost.json",
        help="benchmarks/host_cost.py's JSON, if it exists: its table and targets",
    )
    ap.add_argument(
        "--host-vary",
        type=Path,
        nargs="*",
        default=[
            HERE / "results" / "h200-host-cost-vary.json",
            HERE / "results" / "h200-host-cost-vary-before.json",
        ],
        help="host_cost.py --only vary JSONs, if they exist (this tree's first): their table",
    )
    ap.add_argument(
        "--stats-cost",
        type=Path,
        default=HERE / "results" / "h100-stats-cost.json",
        help="benchmarks/stats_cost.py's JSON, if it exists: the counters' section",
    )
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
    for f in doc.get("filled", []):
        lines += [
            f"Not measured in this run: {f['kernel']}, {f['mode']}: its {f['records']} records, "
            f"in every table and target below, are copied from `{f['file']}`, measured "
            f"{f['date']}.",
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
    host = json.loads(a.host_cost.read_text()) if a.host_cost and a.host_cost.exists() else None
    if host is not None and "python" not in host["results"][0]:
        host = None  # an older host_cost.py's layout: not this report's table
    lines += targets_section(results, idx, host)
    lines += host_section(host)
    lines += vary_section([json.loads(p.read_text()) for p in a.host_vary if p.exists()])
    lines += launch_section(results)
    lines += ["## Mask padded rows and the guard", ""]
    for mode in ("graph", "eager"):
        lines += mask_section(results, idx, mode)
        lines += guard_section(results, idx, mode)
    if a.stats_cost and a.stats_cost.exists():
        lines += counters_section(a.stats_cost)
    lines += ["## MXFP4 aux sort", ""]
    for mode in ("graph", "eager"):
        for padded in ("half", "none"):
            lines += sort_section(results, idx, mode, padded)
    a.out.write_text("\n".join(lines))
    print(f"wrote {a.out} ({len(results)} records; plots: {plots or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

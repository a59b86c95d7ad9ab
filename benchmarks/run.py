"""Benchmark the two kernels side by side with their peers, on a CUDA/HIP GPU.

Per call, in CUDA-graph replay and eagerly, on the same inputs:

* mask: ``ours`` (``mask_padded_rows_``, one launch for ids and weights) vs
  ``sgl_fill_x2`` (SGLang 0.5.23's ``_fill_padded_rows`` called for ids, then weights) vs
  ``eager_index_put`` (older SGLang: ``arange`` + ``>=`` + boolean ``index_put_`` on each
  tensor).
* guard, timed with the mask (interleaved in the same replays): ``ours``
  (``guard_routing`` with a count: new ids and weights, one launch), ``ours_no_count``
  and ``reference`` (``guard_routing_reference``, its plain-torch fallback).
* sort: ``ours`` (``mxfp4_moe_sort`` without a count), ``ours_count`` (with one) and
  ``ours_adaptive`` (``adaptive_moe_sort`` with one: it allocates its outputs, as
  aiter's ``_adaptive_moe_sort`` does, and is what the aiter hook calls) vs
  ``sgl_align_cpp`` (sgl_kernel's C++ ``moe_align_block_size``, called as SGLang's
  ``moe_align_block_size`` calls it, into preallocated buffers) vs ``sgl_triton_align``
  (SGLang's ``moe_align_block_size_triton``, four launches) vs ``torch_argsort`` (a
  graph-capturable sort built from torch ops, ``benchmarks/peers_torch.py``).
* launch: the host cost of one launch of an empty Triton kernel, eagerly, through
  Triton's own ``kernel[grid](...)`` and through this package's direct launch
  (``KernelLauncher``), against one small torch op.

Peers' sources come from ``benchmarks/_peers/`` (``extract_peers.py``; never committed);
``sgl_kernel`` (sglang-kernel 0.4.3, the release SGLang 0.5.13.post1 pins) must be
importable for the C++ peer (``benchmarks/device.sh`` puts a trimmed copy on the path).
Output: one JSON document (device, versions, date, flat ``results`` records
``{kernel, impl, M, topk, num_experts, block, padded, mode, us}``) to ``--out``.

Timing: graph mode captures ``GRAPH_CALLS`` back-to-back calls of each implementation in
its own CUDA graph, replays the graphs of one configuration in turn ``REPLAYS`` times
(interleaved and shuffled, so all see the same clocks, queued behind a sleep kernel so
the GPU never waits for the host) between CUDA events and reports each one's median per
call; eager mode
times ``EAGER_CALLS`` back-to-back calls between events, ``EAGER_REPEATS`` times, median
per call. Inputs stay resident (decode-sized tensors live in L2 in a real server too).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import triton.language as tl  # noqa: E402
from peers_torch import torch_argsort_sort  # noqa: E402
from sglang_amd_moe.kernels import (  # noqa: E402
    adaptive_moe_sort,
    guard_routing,
    guard_routing_reference,
    mask_padded_rows_,
    mxfp4_moe_sort,
)
from sglang_amd_moe.kernels.utils import KernelLauncher, max_sorted_size  # noqa: E402

GRAPH_CALLS = 20
REPLAYS = 40
EAGER_CALLS = 20
EAGER_REPEATS = 3
# Sleep queued before the interleaved replays, per replay to queue (~2 GHz clock: 60 us,
# more than the host takes to queue one), capped at ~0.25 s.
SLEEP_CYCLES_PER_REPLAY = 120_000
MAX_SLEEP_CYCLES = 500_000_000

MASK_M = [1, 8, 64, 256, 1024, 4096, 16384]
MASK_TOPK = [8, 11]
SORT_SHAPES = [(257, 9), (513, 11), (896, 16)]
SORT_BLOCKS = [16, 32]
SORT_M = [1, 4, 16, 64, 256, 512, 1024, 4096, 16384]
# Experts the guard admits on the mask's inputs (ids in [0, 256)).
GUARD_EXPERTS = 257


def _load_sgl_kernel():
    """sgl_kernel's C++ ``moe_align_block_size``, or None (then the peer is skipped)."""
    try:
        from sgl_kernel import moe_align_block_size
    except Exception as exc:  # noqa: BLE001 - any import failure: report and go on
        print(f"sgl_kernel not importable ({exc!r}): the sgl_align_cpp peer is skipped", flush=True)
        return None
    return moe_align_block_size


def _load_peer(name: str):
    path = HERE / "_peers" / f"{name}.py"
    if not path.exists():
        raise SystemExit(f"{path} missing: run `python benchmarks/extract_peers.py` first")
    spec = importlib.util.spec_from_file_location(f"_peer_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def time_eager(fn: Callable[[], None]) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(EAGER_REPEATS):
        start.record()
        for _ in range(EAGER_CALLS):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / EAGER_CALLS)
    return statistics.median(samples)


def capture_graph(fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """Warm ``fn`` up on a side stream (compiles), then capture ``GRAPH_CALLS`` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def replay_interleaved(graphs: dict) -> dict:
    """Median us per call of each graph, the graphs replayed in turn ``REPLAYS`` times.

    Interleaving the replays of every implementation of one configuration means they
    all see the same clocks; timed one after the other, a drift of the GPU's clock
    between them shows up as a difference of a few percent. The order is shuffled each
    round (fixed seed), so no implementation always follows the same one. A sleep kernel
    queued first keeps the GPU busy while the host queues every replay: the GPU then
    runs them back to back, and no time waiting for the host lands between the events.
    """
    names = list(graphs)
    order = random.Random(0)
    events = {name: [] for name in names}
    torch.cuda.synchronize()
    torch.cuda._sleep(min(SLEEP_CYCLES_PER_REPLAY * len(names) * REPLAYS, MAX_SLEEP_CYCLES))
    for _ in range(REPLAYS):
        order.shuffle(names)
        for name in names:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[name].replay()
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    return {
        name: statistics.median(s.elapsed_time(e) * 1000.0 / GRAPH_CALLS for s, e in pairs)
        for name, pairs in events.items()
    }


def time_graphs(fns: dict) -> dict:
    """Graph-replay us per call of each implementation of one configuration."""
    graphs = {name: capture_graph(fn) for name, fn in fns.items()}
    times = replay_interleaved(graphs)
    del graphs
    return times


def mask_impls(
    ids: torch.Tensor, w: torch.Tensor, count: torch.Tensor, fill_mod
) -> dict[str, Callable[[], None]]:
    def ours():
        mask_padded_rows_(ids, w, count, 0)

    def sgl_fill_x2():
        fill_mod._fill_padded_rows(ids, count, 0)
        fill_mod._fill_padded_rows(w, count, 0.0)

    def eager_index_put():
        # Older SGLang's _mask_topk_ids_padded_region / _zero_topk_weights_padded_region.
        idx = torch.arange(0, ids.shape[0], device=ids.device)
        ids[idx >= count, :] = 0
        idx = torch.arange(0, w.shape[0], device=w.device)
        w[idx >= count, :] = 0.0

    return {"ours": ours, "sgl_fill_x2": sgl_fill_x2, "eager_index_put": eager_index_put}


def guard_impls(
    ids: torch.Tensor, w: torch.Tensor, count: torch.Tensor
) -> dict[str, Callable[[], None]]:
    return {
        "ours": lambda: guard_routing(ids, w, GUARD_EXPERTS, count),
        "ours_no_count": lambda: guard_routing(ids, w, GUARD_EXPERTS),
        "reference": lambda: guard_routing_reference(ids, w, GUARD_EXPERTS, count),
    }


def mask_inputs(M: int, topk: int, dev: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Routing ids and weights of ``M`` rows, half of them padded (the count is ``M // 2``)."""
    ids = torch.randint(0, 256, (M, topk), dtype=torch.int32, device=dev)
    w = torch.rand(M, topk, dtype=torch.float32, device=dev)
    return ids, w, torch.tensor([M // 2], dtype=torch.int32, device=dev)


def bench_mask(results: list[dict], fill_mod) -> None:
    """The mask and its peers, and the guard, on the same inputs in the same replays."""
    dev = "cuda"
    for topk in MASK_TOPK:
        for M in MASK_M:
            ids, w, count = mask_inputs(M, topk, dev)
            # The guard reads its own copies (the mask writes its inputs in place).
            gids, gw = ids.clone(), w.clone()
            impls = {("mask", k): f for k, f in mask_impls(ids, w, count, fill_mod).items()}
            impls.update({("guard", k): f for k, f in guard_impls(gids, gw, count).items()})
            graph_us = time_graphs(impls)
            for (kernel, impl), fn in impls.items():
                for mode, us in (("graph", graph_us[(kernel, impl)]), ("eager", time_eager(fn))):
                    results.append(
                        dict(
                            kernel=kernel,
                            impl=impl,
                            M=M,
                            topk=topk,
                            num_experts=GUARD_EXPERTS if kernel == "guard" else None,
                            block=None,
                            padded="half",
                            mode=mode,
                            us=round(us, 3),
                        )
                    )
            print(
                f"mask/guard topk={topk} M={M}: "
                + ", ".join(
                    f"{r['kernel']}/{r['impl']}/{r['mode']}={r['us']:.2f}"
                    for r in results[-2 * len(impls) :]
                ),
                flush=True,
            )


def sort_buffers(M: int, topk: int, NE: int, BM: int, dev: str) -> dict[str, torch.Tensor]:
    """Output buffers sized as aiter's ``_adaptive_moe_sort`` sizes them."""
    max_sorted = max_sorted_size(M, topk, NE, BM)
    return dict(
        sorted_token_ids=torch.empty(max_sorted, dtype=torch.int32, device=dev),
        sorted_expert_ids=torch.empty(max_sorted // BM, dtype=torch.int32, device=dev),
        cumsum_tensor=torch.empty(2, dtype=torch.int32, device=dev),
        reverse_sorted=torch.empty(M * topk, dtype=torch.int32, device=dev),
        sorted_weights=torch.empty(max_sorted, dtype=torch.float32, device=dev),
        m_indices=torch.empty(max_sorted, dtype=torch.int32, device=dev),
        bf16_zero_out=torch.empty(0, 0, dtype=torch.bfloat16, device=dev),
        bf16_zero_workspace=torch.empty(0, dtype=torch.bfloat16, device=dev),
    )


def sort_inputs(M: int, topk: int, NE: int, n: int, dev: str) -> tuple[torch.Tensor, ...]:
    """Routing of ``M`` rows with -1 ids past the ``n`` real ones (as a padded CUDA-graph
    batch has), weights, and the count."""
    ids = torch.randint(0, NE, (M, topk), dtype=torch.int32, device=dev)
    ids[n:] = -1
    w = torch.rand(M, topk, dtype=torch.float32, device=dev)
    return ids, w, torch.tensor([n], dtype=torch.int32, device=dev)


def sort_call(
    fn: Callable,
    ids: torch.Tensor,
    w: torch.Tensor,
    out: dict[str, torch.Tensor],
    NE: int,
    BM: int,
    count: torch.Tensor | None,
) -> Callable[[], None]:
    """``fn`` (an ``mxfp4_moe_sort``) called with aiter's arguments into ``out``."""
    M, topk = ids.shape
    prologue = 0 if BM == 16 else 1
    return lambda: fn(
        ids,
        w,
        out["sorted_token_ids"],
        out["sorted_expert_ids"],
        out["cumsum_tensor"],
        out["reverse_sorted"],
        out["sorted_weights"],
        out["m_indices"],
        out["bf16_zero_out"],
        out["bf16_zero_workspace"],
        M,
        NE,
        topk,
        7168,
        2048,
        BM,
        prologue,
        count,
    )


def sort_impls(
    ids: torch.Tensor,
    w: torch.Tensor,
    count: torch.Tensor,
    NE: int,
    BM: int,
    align_mod,
    cpp_align=None,
    slow_peers: bool = True,
) -> dict[str, Callable[[], None]]:
    """``ids`` holds -1 past the count, as a padded CUDA-graph batch does."""
    M, topk = ids.shape
    dev = ids.device
    out = sort_buffers(M, topk, NE, BM, dev)

    # moe_align has no notion of a count and indexes its tables with the ids: give it
    # in-range ids for every row (what SGLang's CUDA path feeds it).
    ids_valid = torch.where(ids < 0, torch.randint_like(ids, 0, NE), ids)
    max_pad = M * topk + NE * (BM - 1)
    a_sorted = torch.empty(max_pad, dtype=torch.int32, device=dev)
    a_experts = torch.empty(triton.cdiv(max_pad, BM), dtype=torch.int32, device=dev)
    a_post = torch.empty(1, dtype=torch.int32, device=dev)

    def sgl_triton_align():
        align_mod.moe_align_block_size_triton(ids_valid, NE, BM, a_sorted, a_experts, a_post)

    argsort_out = sort_buffers(M, topk, NE, BM, dev)

    def torch_argsort():
        torch_argsort_sort(ids, w, NE, BM, count, argsort_out)

    def ours_adaptive():
        adaptive_moe_sort(ids, w, NE, topk, BM, 7168, num_local_tokens=count)

    impls = {
        "ours": sort_call(mxfp4_moe_sort, ids, w, out, NE, BM, None),
        "ours_count": sort_call(mxfp4_moe_sort, ids, w, out, NE, BM, count),
        "ours_adaptive": ours_adaptive,
    }
    if cpp_align is not None:
        # Buffers as SGLang's moe_align_block_size sizes them, and its call: NE + 1
        # experts (the extra one takes expert-parallel filtered ids), padded ids filled.
        pairs = M * topk
        c_max = pairs * BM if pairs < NE + 1 else pairs + (NE + 1) * (BM - 1)
        c_sorted = torch.empty(c_max, dtype=torch.int32, device=dev)
        c_experts = torch.empty(triton.cdiv(c_max, BM), dtype=torch.int32, device=dev)
        c_post = torch.empty(1, dtype=torch.int32, device=dev)
        c_cumsum = torch.empty(NE + 2, dtype=torch.int32, device=dev)

        def sgl_align_cpp():
            cpp_align(ids_valid, NE + 1, BM, c_sorted, c_experts, c_post, c_cumsum, True)

        impls["sgl_align_cpp"] = sgl_align_cpp
    if slow_peers:
        impls["sgl_triton_align"] = sgl_triton_align
        impls["torch_argsort"] = torch_argsort
    return impls


def bench_sort(
    results: list[dict],
    align_mod,
    shapes,
    blocks,
    ms,
    checkpoint: Callable[[], None],
    cpp_align=None,
    slow_peers: bool = True,
    modes: tuple[str, ...] = ("graph", "eager"),
) -> None:
    dev = "cuda"
    for NE, topk in shapes:
        for BM in blocks:
            for M in ms:
                for padded in ("half", "none"):
                    n = M if padded == "none" else max(M // 2, 1)
                    ids, w, count = sort_inputs(M, topk, NE, n, dev)
                    impls = sort_impls(ids, w, count, NE, BM, align_mod, cpp_align, slow_peers)
                    graph_us = time_graphs(impls) if "graph" in modes else {}
                    for impl, fn in impls.items():
                        timed = []
                        if "graph" in modes:
                            timed.append(("graph", graph_us[impl]))
                        if "eager" in modes:
                            timed.append(("eager", time_eager(fn)))
                        for mode, us in timed:
                            results.append(
                                dict(
                                    kernel="sort",
                                    impl=impl,
                                    M=M,
                                    topk=topk,
                                    num_experts=NE,
                                    block=BM,
                                    padded=padded,
                                    mode=mode,
                                    us=round(us, 3),
                                )
                            )
                    print(
                        f"sort NE={NE} topk={topk} BM={BM} M={M} padded={padded}: "
                        + ", ".join(
                            f"{r['impl']}/{r['mode']}={r['us']:.1f}"
                            for r in results[-len(modes) * len(impls) :]
                        ),
                        flush=True,
                    )
            checkpoint()


@triton.jit
def _empty_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass


def bench_launch(results: list[dict]) -> None:
    """Host time of one launch, eagerly (the GPU idles; back-to-back calls are host-bound)."""
    x = torch.zeros(16, dtype=torch.int32, device="cuda")
    direct = KernelLauncher(_empty_kernel, BLOCK=16, num_warps=4)
    impls = {
        "triton_jit": lambda: _empty_kernel[(1,)](x, 16, BLOCK=16, num_warps=4),
        "direct": lambda: direct((1,), x, 16),
        "torch_zero_": lambda: x.zero_(),
    }
    for impl, fn in impls.items():
        results.append(
            dict(
                kernel="launch",
                impl=impl,
                M=None,
                topk=None,
                num_experts=None,
                block=None,
                padded=None,
                mode="eager",
                us=round(time_eager(fn), 3),
            )
        )
    print(
        "launch: " + ", ".join(f"{r['impl']}={r['us']:.2f}" for r in results[-len(impls) :]),
        flush=True,
    )


def warm(align_mod, fill_mod, cpp_align, shard: int, shards: int, slow_peers: bool = True) -> None:
    """Call every benchmark configuration once, untimed, so that Triton compiles (and
    caches on disk) every kernel specialization the timed run needs; shard ``shard`` of
    ``shards`` takes every ``shards``-th configuration, so several processes share it."""
    configs = [("mask", topk, M, None, None) for topk in MASK_TOPK for M in MASK_M]
    configs += [
        ("sort", topk, M, NE, BM) for NE, topk in SORT_SHAPES for BM in SORT_BLOCKS for M in SORT_M
    ]
    for i, (kernel, topk, M, NE, BM) in enumerate(configs):
        if i % shards != shard:
            continue
        if kernel == "mask":
            ids, w, count = mask_inputs(M, topk, "cuda")
            fns = mask_impls(ids, w, count, fill_mod)
            fns.update({f"guard_{k}": f for k, f in guard_impls(ids, w, count).items()})
        else:
            ids, w, count = sort_inputs(M, topk, NE, max(M // 2, 1), "cuda")
            fns = sort_impls(ids, w, count, NE, BM, align_mod, cpp_align, slow_peers)
            fns.pop("torch_argsort", None)
        for fn in fns.values():
            fn()
    torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "results" / "h200.json")
    ap.add_argument(
        "--only", choices=["launch", "mask", "sort"], help="run one part of the benchmarks"
    )
    ap.add_argument("--quick", action="store_true", help="a small subset (smoke run)")
    ap.add_argument(
        "--warm", metavar="I/N", help="only compile: shard I of N of the configurations"
    )
    ap.add_argument(
        "--sort-modes",
        default="graph,eager",
        help="the sort's modes to time, comma-separated (graph, eager)",
    )
    ap.add_argument(
        "--fill-from",
        type=Path,
        help="an earlier results JSON: its records of every (kernel, mode) this run does not "
        "measure are copied in, each marked with the file, and listed under 'filled'",
    )
    ap.add_argument(
        "--no-slow-peers",
        action="store_true",
        help="leave out SGLang's Triton align and the torch argsort peer (tens to hundreds "
        "of microseconds a call; no target is set against them)",
    )
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks need a CUDA or ROCm GPU")
    cpp_align = _load_sgl_kernel()
    if a.warm:
        shard, shards = (int(v) for v in a.warm.split("/"))
        warm(
            _load_peer("moe_align"), _load_peer("fill_padded_rows"), cpp_align, shard, shards,
            not a.no_slow_peers,
        )  # fmt: skip
        return 0
    modes = tuple(m for m in a.sort_modes.split(",") if m)
    if not modes or set(modes) - {"graph", "eager"}:
        raise SystemExit(f"--sort-modes takes graph and/or eager, got {a.sort_modes!r}")
    fill = Filler(a.fill_from) if a.fill_from else None
    results: list[dict] = []
    if a.only in (None, "launch"):
        bench_launch(results)
    if a.only in (None, "mask"):
        bench_mask(results, _load_peer("fill_padded_rows"))
        write(a.out, results, fill)
    if a.only in (None, "sort"):
        if a.quick:
            shapes, blocks, ms = SORT_SHAPES[1:2], [16], [1, 64, 4096]
        else:
            shapes, blocks, ms = SORT_SHAPES, SORT_BLOCKS, SORT_M
        bench_sort(
            results,
            _load_peer("moe_align"),
            shapes,
            blocks,
            ms,
            lambda: write(a.out, results, fill),
            cpp_align,
            not a.no_slow_peers,
            modes,
        )
    write(a.out, results, fill)
    print(f"wrote {len(results)} records to {a.out}")
    return 0


class Filler:
    """Records of an earlier results file, for the (kernel, mode) pairs a run leaves out."""

    def __init__(self, path: Path) -> None:
        self.name = path.name
        doc = json.loads(path.read_text())
        self.date = doc["date"]
        self.records = doc["results"]

    def fill(self, results: list[dict]) -> tuple[list[dict], list[dict]]:
        """``results`` with the earlier records of every (kernel, mode) it has none of,
        and one ``filled`` entry per such pair (file, its date, how many records)."""
        have = {(r["kernel"], r["mode"]) for r in results}
        added: dict[tuple, list[dict]] = {}
        for r in self.records:
            if (r["kernel"], r["mode"]) not in have:
                added.setdefault((r["kernel"], r["mode"]), []).append({**r, "from": self.name})
        filled = [
            dict(kernel=k, mode=m, file=self.name, date=self.date, records=len(rs))
            for (k, m), rs in added.items()
        ]
        return results + [r for rs in added.values() for r in rs], filled


def write(out: Path, results: list[dict], fill: Filler | None = None) -> None:
    """Write what was measured so far (a crash later keeps the earlier kernels' numbers)."""
    filled: list[dict] = []
    if fill is not None:
        results, filled = fill.fill(results)
    doc = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "hip": torch.version.hip,
        "cuda": torch.version.cuda,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "method": {
            "graph_calls": GRAPH_CALLS,
            "replays": REPLAYS,
            "eager_calls": EAGER_CALLS,
            "eager_repeats": EAGER_REPEATS,
            "graph_replays": "interleaved, shuffled, queued behind a sleep",
            "statistic": "median us per call",
        },
        "results": results,
    }
    if filled:
        doc["filled"] = filled
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())

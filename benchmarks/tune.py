"""Tuning sweeps on a GPU: launch floors, mask warps, sort plan variants.

Not the benchmark of record (``run.py`` is): this measures the choices behind the
kernels' constants, so a change to them rests on numbers. Every variant of one
configuration is captured in its own CUDA graph and the graphs are replayed in turn
(``run.replay_interleaved``), so differences of a few percent are not clock drift.

* ``floor``: an empty Triton kernel, and one that loads the count and stores it: what
  one launch costs in graph replay before any work.
* ``mask``: the flat-path kernel at each num_warps in the sweep, a one-program kernel
  that loads the count and stores it (the floor of a launch that reads the count), the
  public ``mask_padded_rows_`` (current defaults) and SGLang's ``_fill_padded_rows``
  once and twice.
* ``sort``: ``mxfp4_moe_sort`` with a count, with module constants patched per variant
  (captured under the patch; ``SORT_GROUPS`` says which variants at which M), and an
  older ``kernels/`` from ``benchmarks/_baseline/kernels_base`` when that folder exists
  (``git archive``), as ``base``.

``--dry-run`` calls every variant once on the CPU through Triton's interpreter
(``TRITON_INTERPRET=1``), untimed, to check the script before spending device time;
``--warm I/N`` calls shard I of N of the sort variants once, untimed, so that several
processes compile them into Triton's disk cache before the timed run.
Output: JSON records ``{sweep, variant, ..., us}`` to ``--out``, written as it goes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import triton
import triton.language as tl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "_baseline"))

import run  # noqa: E402
from sglang_amd_moe.kernels import mask_padded_rows_  # noqa: E402

mask_mod = importlib.import_module("sglang_amd_moe.kernels.mask_padded_rows")
sort_mod = importlib.import_module("sglang_amd_moe.kernels.moe_sort")

MASK_WARPS = [1, 2, 4, 8]
SORT_VARIANTS: dict[str, dict[str, int]] = {
    "new": {},
    "inline_32k": {"INLINE_OFFSETS_MAX_ELEMS": 32768},
    "inline_tile_4k": {"INLINE_OFFSETS_TILE": 4096},
    "group_1": {"GROUP_CHUNKS": 1},
    "group_8": {"GROUP_CHUNKS": 8},
    "count_warps4": {"COUNT_NUM_WARPS": 4},
    "offset_tile_2k": {"OFFSET_TILE": 2048},
    "offset_rows_128": {"OFFSET_MAX_ROWS": 128},
}
# (M values, variants) timed against each other, every (NE, TOPK) at block 16 with a count:
# where the table is small, the inline limit and tile decide 2 or 3 launches and the
# place kernel's steps; at large M, the offsets kernel's grouping and the count warps.
SORT_GROUPS = [
    ((16, 64, 256), ("base", "new", "inline_32k", "inline_tile_4k")),
    (
        (512, 4096, 16384),
        ("base", "new", "group_1", "group_8", "count_warps4", "offset_tile_2k", "offset_rows_128"),
    ),
]
# --profile: (label, NE, topk, M, real rows, with a count) per sort call under ncu.
PROFILE_SORTS = [
    ("sort 896/16 M16384 half count", 896, 16, 16384, 8192, True),
    ("sort 896/16 M16384 half no-count", 896, 16, 16384, 8192, False),
    ("sort 896/16 M512 unpadded count", 896, 16, 512, 512, True),
    ("sort 896/16 M512 unpadded no-count", 896, 16, 512, 512, False),
    ("sort 896/16 M4 half count", 896, 16, 4, 2, True),
    ("sort 257/9 M16384 half count", 257, 9, 16384, 8192, True),
    ("sort 257/9 M16384 half no-count", 257, 9, 16384, 8192, False),
]


@triton.jit
def _empty_kernel(x_ptr):
    pass


@triton.jit
def _count_store_kernel(count_ptr, out_ptr):
    tl.store(out_ptr, tl.load(count_ptr))


@contextlib.contextmanager
def patched(mod, values: dict[str, int]) -> Iterator[None]:
    """Module constants set to ``values`` inside the block; launch plans, which are
    cached per shape, are rebuilt on the way in and out."""
    old = {k: getattr(mod, k) for k in values}
    for k, v in values.items():
        setattr(mod, k, v)
    if values and hasattr(mod, "sort_program"):
        mod.sort_program.cache_clear()
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(mod, k, v)
        if values and hasattr(mod, "sort_program"):
            mod.sort_program.cache_clear()


class Sweep:
    """Times (or, dry, just calls) groups of variants and keeps the records."""

    def __init__(self, out: Path, dry: bool) -> None:
        self.out, self.dry, self.records = out, dry, []

    def group(self, base: dict, fns: dict[str, tuple[Callable[[], None], dict]]) -> None:
        """``fns``: variant -> (callable, module patches to capture it under)."""
        if self.dry:
            for fn, patch in fns.values():
                with patched(sort_mod, patch):
                    fn()
            times = dict.fromkeys(fns, float("nan"))
        else:
            graphs = {}
            for name, (fn, patch) in fns.items():
                with patched(sort_mod, patch):
                    graphs[name] = run.capture_graph(fn)
            times = run.replay_interleaved(graphs)
            del graphs
        for name, us in times.items():
            self.records.append({**base, "variant": name, "us": round(us, 3)})
        print(base, " ".join(f"{k}={v:.2f}" for k, v in times.items()), flush=True)
        self.out.write_text(
            json.dumps(
                {
                    "device": device_name(),
                    "triton": triton.__version__,
                    "torch": torch.__version__,
                    "results": self.records,
                },
                indent=1,
            )
        )


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def sweep_floor(sw: Sweep, dev: str) -> None:
    x = torch.zeros(4, dtype=torch.int32, device=dev)
    count = torch.tensor([3], dtype=torch.int32, device=dev)
    sw.group(
        {"sweep": "floor"},
        {
            "empty_kernel": (lambda: _empty_kernel[(1,)](x), {}),
            "count_store_kernel": (lambda: _count_store_kernel[(1,)](count, x), {}),
        },
    )


def sweep_mask(sw: Sweep, dev: str, ms: list[int], topks: list[int]) -> None:
    fill_mod = run._load_peer("fill_padded_rows")
    for topk in topks:
        for M in ms:
            mask_group(sw, dev, fill_mod, M, topk)


def mask_group(sw: Sweep, dev: str, fill_mod, M: int, topk: int) -> None:
    ids, w, count = run.mask_inputs(M, topk, dev)
    grid, block, _ = mask_mod.mask_launch_config(M, topk, flat=True)

    def current(warps: int) -> Callable[[], None]:
        return lambda: mask_mod._mask_padded_rows_kernel[(grid,)](
            ids,
            w,
            count,
            M,
            topk,
            topk,
            topk,
            0,
            BLOCK_M=block,
            BLOCK_K=1,
            FLAT=True,
            WIDE=False,
            num_warps=warps,
        )

    peers = run.mask_impls(ids, w, count, fill_mod)
    one = torch.zeros(1, dtype=torch.int32, device=dev)
    fns: dict[str, tuple[Callable[[], None], dict]] = {
        f"flat_w{nw}": (current(nw), {}) for nw in MASK_WARPS
    }
    fns["count_store_floor"] = (lambda: _count_store_kernel[(1,)](count, one), {})
    fns["ours_api"] = (peers["ours"], {})
    fns["sgl_fill_x1"] = (lambda: fill_mod._fill_padded_rows(ids, count, 0), {})
    fns["sgl_fill_x2"] = (peers["sgl_fill_x2"], {})
    sw.group({"sweep": "mask", "M": M, "topk": topk}, fns)


def _baseline_sort():
    try:
        return importlib.import_module("kernels_base.moe_sort").mxfp4_moe_sort
    except ImportError:
        try:
            return importlib.import_module("kernels_base.mxfp4_moe_sort").mxfp4_moe_sort
        except ImportError:
            return None


def sort_configs(shapes: list[tuple[int, int]], groups=SORT_GROUPS, ms: list[int] | None = None):
    """(NE, topk, M, variants) of the sort sweep."""
    for NE, topk in shapes:
        for group_ms, variants in groups:
            for M in group_ms:
                if ms is None or M in ms:
                    yield NE, topk, M, variants


def sort_fns(dev: str, NE: int, topk: int, M: int, variants, BM: int = 16):
    ids, w, count = run.sort_inputs(M, topk, NE, max(M // 2, 1), dev)
    out = run.sort_buffers(M, topk, NE, BM, dev)
    base = _baseline_sort()
    fns: dict[str, tuple[Callable[[], None], dict]] = {}
    for name in variants:
        if name == "base":
            if base is not None:
                fns[name] = (run.sort_call(base, ids, w, out, NE, BM, count), {})
            continue
        fns[name] = (
            run.sort_call(sort_mod.mxfp4_moe_sort, ids, w, out, NE, BM, count),
            SORT_VARIANTS[name],
        )
    return fns


def sweep_sort(sw: Sweep, dev: str, shapes: list[tuple[int, int]], ms: list[int] | None) -> None:
    if _baseline_sort() is None:
        print("no benchmarks/_baseline/kernels_base: baseline variant skipped", flush=True)
    for NE, topk, M, variants in sort_configs(shapes, ms=ms):
        sw.group(
            {"sweep": "sort", "NE": NE, "topk": topk, "M": M, "block": 16, "padded": "half"},
            sort_fns(dev, NE, topk, M, variants),
        )


def warm_sort(shapes: list[tuple[int, int]], ms: list[int] | None, shard: int, shards: int) -> None:
    """Call shard ``shard`` of ``shards`` of the sort variants once (compiles them)."""
    jobs = [(cfg, name) for cfg in sort_configs(shapes, ms=ms) for name in cfg[3]]
    for i, ((NE, topk, M, _), name) in enumerate(jobs):
        if i % shards == shard:
            for fn, patch in sort_fns("cuda", NE, topk, M, (name,)).values():
                with patched(sort_mod, patch):
                    fn()
    torch.cuda.synchronize()


def profile_targets(dev: str) -> None:
    """Each target twice (the first call compiles), synchronized, for ``ncu`` to read."""
    BM = 16
    for label, NE, topk, M, n, with_count in PROFILE_SORTS:
        ids, w, count = run.sort_inputs(M, topk, NE, n, dev)
        out = run.sort_buffers(M, topk, NE, BM, dev)
        call = run.sort_call(
            sort_mod.mxfp4_moe_sort, ids, w, out, NE, BM, count if with_count else None
        )
        for _ in range(2):
            call()
            torch.cuda.synchronize()
        print("profiled:", label, sort_mod.sort_plan(M, NE, topk), flush=True)
    for M, topk in ((4096, 11), (1, 11)):
        ids, w, count = run.mask_inputs(M, topk, dev)
        for _ in range(2):
            mask_padded_rows_(ids, w, count, 0)
            torch.cuda.synchronize()
        print(
            f"profiled: mask M{M} topk{topk} {mask_mod.mask_launch_config(M, topk, True)}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "tune.json")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--only", choices=["floor", "mask", "sort"])
    ap.add_argument("--profile", action="store_true", help="run the ncu targets once each, untimed")
    ap.add_argument(
        "--sort-ms",
        type=lambda v: [int(x) for x in v.split(",")],
        help="comma-separated M for the sort sweep",
    )
    ap.add_argument("--warm", metavar="I/N", help="only compile: shard I of N of the sort variants")
    a = ap.parse_args(argv)
    shapes = [(896, 16), (257, 9), (513, 11)]
    if a.profile:
        profile_targets("cuda")
        return 0
    if a.warm:
        shard, shards = (int(v) for v in a.warm.split("/"))
        warm_sort(shapes, a.sort_ms, shard, shards)
        return 0
    dev = "cpu" if a.dry_run else "cuda"
    if not a.dry_run and not torch.cuda.is_available():
        raise SystemExit("tuning needs a GPU (or --dry-run with TRITON_INTERPRET=1)")
    sw = Sweep(a.out, a.dry_run)
    small = a.dry_run
    if a.only in (None, "floor"):
        sweep_floor(sw, dev)
    if a.only in (None, "mask"):
        sweep_mask(sw, dev, [1, 64] if small else run.MASK_M, [11] if small else run.MASK_TOPK)
    if a.only in (None, "sort"):
        ms = a.sort_ms or ([64] if small else None)
        sweep_sort(sw, dev, shapes[:1] if small else shapes, ms)
    print(f"wrote {len(sw.records)} records to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

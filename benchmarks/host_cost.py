"""Where an eager call's host time goes, on a CUDA/HIP GPU: the lean path measured.

Eagerly (prefill, and decode batches past the largest captured graph) these kernels
cost mostly host time: the GPU finishes each launch before the host has queued the
next. Each call of ``mask_padded_rows_``, ``guard_routing``, ``mxfp4_moe_sort`` (with a
count) and ``adaptive_moe_sort`` is timed back to back with the host clock, after a
first call has built its direct program, and split into:

* ``call``: the whole call;
* ``python``: the same call with the compiled launchers replaced by a no-op, i.e. all
  the Python (key, lookup, addresses, checks, argument building, allocations of
  ``guard_routing`` / ``adaptive_moe_sort``) and nothing of the launches themselves;
* ``raw``: the program's launches alone, each a bare call of Triton's compiled
  launcher with its arguments built beforehand: the floor of any Python caller;
* ``launches``: how many launches the call makes.

``guard_alloc`` is the guard with its slabs turned off (two allocations per call), and
the document also holds one ``torch.empty_like`` and one view (of a batch of 16 made by
``unbind``): what the guard's outputs cost either way.

The issue's targets: ``python`` at most 3 us, and ``call`` within 1.5 us per launch of
``raw``. For scale: one small torch op (``x.zero_()``) and sgl_kernel's C++
``moe_align_block_size`` called as SGLang calls it (when ``sgl_kernel`` imports;
``benchmarks/device.sh`` puts a trimmed copy on the path).

Row counts that change (``vary`` in the document, ``--only vary`` for it alone): prefill
calls these kernels with a row count that changes from forward to forward, each MoE
layer of a forward at the same count. For the mask, the guard and the sort (257/9,
with a count) it times, in host us per call, sequences over 37 row counts between 1 and
4096 (log-uniform) and 407 others never called before in the sequence:

* ``fixed``: each of the 37 counts for ``LAYERS`` (58, DeepSeek-R1's MoE layers) calls
  in a row, every count called once before: what a hit costs at a fixed count;
* ``cycle``: the same calls, the count changing on every call;
* ``forward``: 37 counts not called before, ``LAYERS`` calls each (a prefill forward
  each);
* ``new``: 370 counts not called before, one call each.

Every tile and plan is compiled before (each count called once, then every direct
program dropped), so no sequence compiles. ``--kernels-label`` names the code measured;
the same file run against an earlier build of the package measures its ``before``.

Usage: ``python benchmarks/host_cost.py --out host-cost.json`` (prints a table too).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import statistics
import time
from collections.abc import Callable

import torch
import triton
from run import _load_sgl_kernel, mask_inputs, sort_buffers, sort_call, sort_impls, sort_inputs
from sglang_amd_moe.kernels import (
    adaptive_moe_sort,
    guard_routing,
    mask_padded_rows_,
    mxfp4_moe_sort,
)
from sglang_amd_moe.kernels import mask_padded_rows as mask_module
from sglang_amd_moe.kernels import moe_sort as sort_module
from sglang_amd_moe.kernels import routing_guard as guard_module
from sglang_amd_moe.kernels import utils as kernel_utils
from sglang_amd_moe.kernels.utils import _current_raw_stream

SHAPES = ((257, 9), (513, 11), (896, 16))
ROWS = (1, 4, 64, 512, 4096)
MASK_ROWS = (1, 64, 4096)
BLOCK = 16
CALLS = 2000
REPEATS = 3
DEVICE = "cuda"
# Row counts that change: 37 between 1 and 4096, LAYERS calls a forward.
VARY_COUNTS = 37
VARY_NEW = 370
LAYERS = 58
VARY_SEED = 22
VARY_SHAPE = (257, 9)  # the sort's experts and topk
VARY_TOPK = 8  # the mask's and the guard's columns


def host_us(fn: Callable[[], object]) -> float:
    """Median host microseconds per call over ``REPEATS`` runs of ``CALLS`` calls."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        samples.append((time.perf_counter() - start) / CALLS * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def _program(cache: dict) -> object:
    """The direct program the call just built (the newest in its kernel's cache)."""
    found = list(cache.values())[-1]
    return found[0] if isinstance(found, tuple) else found


def _rows_program(program: object) -> bool:
    """Whether ``program`` is a one-launch program for every row count (the mask's and
    the guard's), whose handles hold the compiled launchers."""
    return hasattr(program, "entry")


def _stub_launches(program: object) -> Callable[[], None]:
    """Replace the compiled launchers ``program`` calls with a no-op; returns the undo."""

    def noop(*args: object) -> None:
        return None

    if _rows_program(program):
        steady, handles = program.steady, program.handles
        program.handles = {c: (noop, *h[1:]) for c, h in handles.items()}
        if steady is not None:
            program.steady = (noop, *steady[1:])

        def undo() -> None:
            program.steady, program.handles = steady, handles

        return undo
    runs = [launch.run for launch in program.launches]
    for launch in program.launches:
        launch.run = noop

    def undo_runs() -> None:
        for launch, run in zip(program.launches, runs, strict=True):
            launch.run = run

    return undo_runs


def _raw_calls(program: object, stream: int, ptrs: tuple, rows: int) -> list[tuple]:
    """``(launcher, arguments)`` of each launch of ``program`` for a call of ``rows``
    rows with ``ptrs`` (the call's addresses, then its buffers')."""
    if _rows_program(program):
        grid, (run, function, packed, tail) = program.entry(rows)
        return [(run, (grid, 1, 1, stream, function, packed, None, None, None, *ptrs, rows, *tail))]
    return [
        (
            launch.run,
            (
                launch.g0,
                launch.g1,
                launch.g2,
                stream,
                launch.function,
                launch.packed,
                None,
                None,
                None,
                *launch.pick(ptrs),
                *launch.tail,
            ),
        )  # fmt: skip
        for launch in program.launches
    ]


def _split(fn: Callable[[], object], cache: dict, ptrs: tuple, rows: int) -> dict:
    """``call``, ``python`` and ``raw`` of a call of ``rows`` rows whose direct program
    is in ``cache``; ``ptrs``: the addresses its launches take (the call's, then its
    buffers')."""
    cache.clear()
    fn()  # builds the direct program
    program = _program(cache)
    call = host_us(fn)
    undo = _stub_launches(program)
    try:
        python = host_us(fn)
    finally:
        undo()
    stream = _current_raw_stream(torch.cuda.current_device())
    raw_calls = _raw_calls(program, stream, ptrs, rows)

    def raw() -> None:
        for run, args in raw_calls:
            run(*args)

    return dict(
        launches=len(raw_calls),
        call=round(call, 2),
        python=round(python, 2),
        raw=round(host_us(raw), 2),
    )


def _own(program: object, ptrs: tuple) -> tuple:
    """``ptrs`` followed by the program's scratch and counter buffers' addresses."""
    index = torch.cuda.current_device()
    stream = _current_raw_stream(index)
    from sglang_amd_moe.kernels.utils import scratch_on, state_on

    extra = tuple(
        (state_on if zeroed else scratch_on)(index, stream, name, numel).data_ptr()
        for name, numel, zeroed in program.buffers
    )
    return (*ptrs, *extra)


def measure_mask(M: int, topk: int) -> list[dict]:
    ids, w, count = mask_inputs(M, topk, DEVICE)
    rows = []
    rows.append(
        dict(
            kernel="mask",
            M=M,
            topk=topk,
            **_split(
                lambda: mask_padded_rows_(ids, w, count, 0),
                mask_module._DIRECT,
                (ids.data_ptr(), w.data_ptr(), count.data_ptr()),
                M,
            ),
        )  # fmt: skip
    )
    # The guard hands out new outputs per call: the raw floor takes one pair of them.
    out_ids, out_w = torch.empty_like(ids), torch.empty_like(w)
    ptrs = (ids.data_ptr(), w.data_ptr(), count.data_ptr(), out_ids.data_ptr(), out_w.data_ptr())
    for kernel in ("guard", "guard_alloc"):
        # guard_alloc: the same calls with every output allocated (torch.empty) per call.
        slab_bytes = kernel_utils.SLAB_BYTES
        if kernel == "guard_alloc":
            kernel_utils.SLAB_BYTES = 0
        try:
            split = _split(lambda: guard_routing(ids, w, 257, count), guard_module._DIRECT, ptrs, M)
        finally:
            kernel_utils.SLAB_BYTES = slab_bytes
        rows.append(dict(kernel=kernel, M=M, topk=topk, **split))
    return rows


def measure_sort(NE: int, topk: int, M: int, align: Callable | None) -> list[dict]:
    ids, w, count = sort_inputs(M, topk, NE, max(M // 2, 1), DEVICE)
    out = sort_buffers(M, topk, NE, BLOCK, DEVICE)
    call = sort_call(mxfp4_moe_sort, ids, w, out, NE, BLOCK, count)
    names = (
        "sorted_token_ids", "sorted_expert_ids", "cumsum_tensor", "reverse_sorted",
        "sorted_weights", "m_indices", "bf16_zero_out", "bf16_zero_workspace",
    )  # fmt: skip
    ptrs = (ids.data_ptr(), w.data_ptr(), *(out[n].data_ptr() for n in names), count.data_ptr())
    sort_module._DIRECT.clear()
    call()
    ptrs = _own(_program(sort_module._DIRECT), ptrs)
    row = dict(kernel="sort", num_experts=NE, topk=topk, M=M, block=BLOCK)
    row.update(_split(call, sort_module._DIRECT, ptrs, M))
    sort_module._ADAPTIVE_DIRECT.clear()

    def adaptive() -> None:
        adaptive_moe_sort(ids, w, NE, topk, BLOCK, 7168, num_local_tokens=count)

    adaptive()
    program, layout, _ = next(iter(sort_module._ADAPTIVE_DIRECT.values()))
    sti = torch.empty(layout.total, dtype=torch.int32, device=DEVICE)
    base = sti.data_ptr()
    moe_buf = torch.empty(layout.moe_shape, dtype=torch.bfloat16, device=DEVICE)
    a_ptrs = (
        ids.data_ptr(), w.data_ptr(), count.data_ptr(),
        *(base + 4 * o for o in layout.offsets), moe_buf.data_ptr(),
    )  # fmt: skip
    a_ptrs = _own(program, a_ptrs)
    adapt = _split(adaptive, sort_module._ADAPTIVE_DIRECT, a_ptrs, M)
    row.update({f"adaptive_{k}": v for k, v in adapt.items() if k != "launches"})
    if align is not None:  # called as run.py calls it, on in-range ids
        row["sgl_align_cpp"] = round(
            host_us(sort_impls(ids, w, count, NE, BLOCK, None, align)["sgl_align_cpp"]), 2
        )
    else:
        row["sgl_align_cpp"] = None
    return [row]


# ------------------------------------------------------------- row counts that change
def vary_counts() -> tuple[list[int], list[int], list[int]]:
    """``(counts, new, forward)``: 37 row counts between 1 and 4096, log-uniform (in
    call order); 370 others and 37 more others, each called once in a sequence."""
    rng = random.Random(VARY_SEED)
    counts: list[int] = []
    while len(counts) < VARY_COUNTS:
        m = max(1, min(4096, round(math.exp(rng.uniform(0.0, math.log(4096))))))
        if m not in counts:
            counts.append(m)
    others = [m for m in range(1, 4097) if m not in counts]
    rng.shuffle(others)
    return counts, others[:VARY_NEW], others[VARY_NEW : VARY_NEW + VARY_COUNTS]


def _vary_call(kernel: str, M: int) -> Callable[[], object]:
    """One call of ``kernel`` at ``M`` rows, its inputs made once."""
    if kernel == "mask":
        ids, w, count = mask_inputs(M, VARY_TOPK, DEVICE)
        return lambda: mask_padded_rows_(ids, w, count, 0)
    if kernel == "guard":
        ids, w, count = mask_inputs(M, VARY_TOPK, DEVICE)
        return lambda: guard_routing(ids, w, 257, count)
    NE, topk = VARY_SHAPE
    ids, w, count = sort_inputs(M, topk, NE, max(M // 2, 1), DEVICE)
    out = sort_buffers(M, topk, NE, BLOCK, DEVICE)
    return sort_call(mxfp4_moe_sort, ids, w, out, NE, BLOCK, count)


def forget_programs() -> None:
    """Drop every direct program and cached launch plan (compiled kernels stay), as if
    no call had been made: works on this package's layout and on earlier ones."""
    for module in (mask_module, guard_module, sort_module):
        for name in ("_DIRECT", "_ADAPTIVE_DIRECT"):
            getattr(module, name, {}).clear()
    pooled = getattr(kernel_utils, "_POOLED", {})
    for program in list(pooled):
        program.pools.clear()
    pooled.clear()
    for module, name in (
        (mask_module, "mask_program"), (guard_module, "guard_program"),
        (sort_module, "sort_program"), (sort_module, "adaptive_layout"),
    ):  # fmt: skip
        cached = getattr(module, name, None)
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()


def _sequence_us(calls: list[Callable[[], object]]) -> float:
    """Host microseconds per call of ``calls`` made in order (the garbage collector
    off while they run, as ``timeit`` does: a collection would land on one sequence)."""
    gc.collect()
    torch.cuda.synchronize()
    gc.disable()
    try:
        start = time.perf_counter()
        for call in calls:
            call()
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
    torch.cuda.synchronize()
    return elapsed / len(calls) * 1e6


def measure_vary(kernel: str, warm_only: bool = False) -> dict:
    """The four sequences of ``kernel`` (see the module's docstring), each the median
    of ``REPEATS``, every direct program dropped before each repeat."""
    counts, new, forward = vary_counts()
    calls = {M: _vary_call(kernel, M) for M in (*counts, *new, *forward)}
    for call in calls.values():  # compiles every tile and plan
        call()
    torch.cuda.synchronize()
    if warm_only:
        return {}
    samples: dict[str, list[float]] = {"fixed": [], "cycle": [], "forward": [], "new": []}
    for _ in range(REPEATS):
        forget_programs()
        for M in counts:  # each count called once before
            calls[M]()
        samples["fixed"].append(_sequence_us([calls[M] for M in counts for _ in range(LAYERS)]))
        samples["cycle"].append(_sequence_us([calls[M] for _ in range(LAYERS) for M in counts]))
        samples["forward"].append(_sequence_us([calls[M] for M in forward for _ in range(LAYERS)]))
        samples["new"].append(_sequence_us([calls[M] for M in new]))
    row = dict(kernel=kernel, shape="257/9" if kernel == "sort" else f"topk {VARY_TOPK}")
    row.update({name: round(statistics.median(v), 2) for name, v in samples.items()})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON file to write (not with --warm)")
    parser.add_argument(
        "--only", choices=("all", "vary"), default="all", help="vary: the row-count sequences only"
    )
    parser.add_argument(
        "--kernels", default="mask,guard,sort", help="kernels of the row-count sequences"
    )
    parser.add_argument("--kernels-label", default="this tree", help="what code is measured")
    parser.add_argument(
        "--warm", action="store_true", help="only compile what the row-count sequences launch"
    )
    opts = parser.parse_args()
    kernels = opts.kernels.split(",")
    if opts.warm:
        for kernel in kernels:
            measure_vary(kernel, warm_only=True)
        return
    if not opts.out:
        parser.error("--out is required")
    x = torch.zeros(16, dtype=torch.int32, device=DEVICE)
    torch_op = round(host_us(lambda: x.zero_()), 2)
    doc = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        unit="host microseconds per call (median)",
        torch_op=torch_op,
    )
    counts, new, forward = vary_counts()
    doc["vary"] = dict(
        code=opts.kernels_label, counts=counts, layers=LAYERS, new=len(new), forward=forward,
        repeats=REPEATS,
        results=[measure_vary(kernel) for kernel in kernels],
    )  # fmt: skip
    if opts.only == "all":
        # What the guard's outputs cost: one allocation, and one view made in a batch of 16.
        y = torch.zeros(64, 8, dtype=torch.int32, device=DEVICE)
        slab = torch.empty(16, 64, 8, dtype=torch.int32, device=DEVICE)
        doc["empty_like"] = round(host_us(lambda: torch.empty_like(y)), 2)
        doc["view_of_16"] = round(host_us(lambda: slab.unbind(0)) / 16, 2)
        align = _load_sgl_kernel()
        rows = [r for M in MASK_ROWS for r in measure_mask(M, 8)]
        rows += [r for NE, topk in SHAPES for M in ROWS for r in measure_sort(NE, topk, M, align)]
        doc["results"] = rows
    with open(opts.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"one torch op: {torch_op} us")
    for r in doc["vary"]["results"] + doc.get("results", []):
        print(json.dumps(r))


if __name__ == "__main__":
    main()

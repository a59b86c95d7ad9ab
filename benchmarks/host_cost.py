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

Usage: ``python benchmarks/host_cost.py --out host-cost.json`` (prints a table too).
"""

from __future__ import annotations

import argparse
import json
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
from sglang_amd_moe.kernels.utils import PairProgram, _current_raw_stream

SHAPES = ((257, 9), (513, 11), (896, 16))
ROWS = (1, 4, 64, 512, 4096)
MASK_ROWS = (1, 64, 4096)
BLOCK = 16
CALLS = 2000
REPEATS = 3


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


def _launches(program: object) -> list:
    """The program's launches: each has the compiled launcher as ``run``."""
    if isinstance(program, PairProgram):
        return [program]
    return program.launches


def _raw_args(launch: object, stream: int, ptrs: tuple) -> tuple:
    """The compiled launcher's arguments of ``launch`` with ``ptrs``."""
    if isinstance(launch, PairProgram):
        head, ptrs = (*launch.grid, stream), ptrs
    else:
        head, ptrs = (launch.g0, launch.g1, launch.g2, stream), launch.pick(ptrs)
    return (*head, launch.function, launch.packed, None, None, None, *ptrs, *launch.tail)


def _split(
    fn: Callable[[], object],
    cache: dict,
    ptrs: tuple,
    prepare: Callable[[object], None] | None = None,
) -> dict:
    """``call``, ``python`` and ``raw`` of a call whose direct program is in ``cache``;
    ``ptrs``: the addresses its launches take (the call's, then its buffers');
    ``prepare``: called with the program once it is built."""
    cache.clear()
    fn()  # builds the direct program
    program = _program(cache)
    if prepare is not None:
        prepare(program)
    call = host_us(fn)
    launches = _launches(program)
    runs = [launch.run for launch in launches]
    for launch in launches:
        launch.run = lambda *args: None
    try:
        python = host_us(fn)
    finally:
        for launch, run in zip(launches, runs, strict=True):
            launch.run = run
    stream = _current_raw_stream(torch.cuda.current_device())
    raw_calls = [(launch.run, _raw_args(launch, stream, ptrs)) for launch in launches]

    def raw() -> None:
        for run, args in raw_calls:
            run(*args)

    return dict(
        launches=len(launches),
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
    ids, w, count = mask_inputs(M, topk, "cuda")
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
            ),
        )  # fmt: skip
    )
    # The guard hands out new outputs per call: the raw floor takes one pair of them.
    out_ids, out_w = torch.empty_like(ids), torch.empty_like(w)
    ptrs = (ids.data_ptr(), w.data_ptr(), count.data_ptr(), out_ids.data_ptr(), out_w.data_ptr())

    def no_slabs(program: object) -> None:
        program.batch_max = 0
        program.pools.clear()

    for kernel, prepare in (("guard", None), ("guard_alloc", no_slabs)):
        # guard_alloc: the same calls with every output allocated (torch.empty) per call.
        split = _split(
            lambda: guard_routing(ids, w, 257, count), guard_module._DIRECT, ptrs, prepare
        )
        rows.append(dict(kernel=kernel, M=M, topk=topk, **split))
    return rows


def measure_sort(NE: int, topk: int, M: int, align: Callable | None) -> list[dict]:
    ids, w, count = sort_inputs(M, topk, NE, max(M // 2, 1), "cuda")
    out = sort_buffers(M, topk, NE, BLOCK, "cuda")
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
    row.update(_split(call, sort_module._DIRECT, ptrs))
    sort_module._ADAPTIVE_DIRECT.clear()

    def adaptive() -> None:
        adaptive_moe_sort(ids, w, NE, topk, BLOCK, 7168, num_local_tokens=count)

    adaptive()
    program, layout, _ = next(iter(sort_module._ADAPTIVE_DIRECT.values()))
    sti = torch.empty(layout.total, dtype=torch.int32, device="cuda")
    base = sti.data_ptr()
    moe_buf = torch.empty(layout.moe_shape, dtype=torch.bfloat16, device="cuda")
    a_ptrs = (
        ids.data_ptr(), w.data_ptr(), count.data_ptr(),
        *(base + 4 * o for o in layout.offsets), moe_buf.data_ptr(),
    )  # fmt: skip
    a_ptrs = _own(program, a_ptrs)
    adapt = _split(adaptive, sort_module._ADAPTIVE_DIRECT, a_ptrs)
    row.update({f"adaptive_{k}": v for k, v in adapt.items() if k != "launches"})
    if align is not None:  # called as run.py calls it, on in-range ids
        row["sgl_align_cpp"] = round(
            host_us(sort_impls(ids, w, count, NE, BLOCK, None, align)["sgl_align_cpp"]), 2
        )
    else:
        row["sgl_align_cpp"] = None
    return [row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    opts = parser.parse_args()
    x = torch.zeros(16, dtype=torch.int32, device="cuda")
    torch_op = round(host_us(lambda: x.zero_()), 2)
    # What the guard's outputs cost: one allocation, and one view made in a batch of 16.
    y = torch.zeros(64, 8, dtype=torch.int32, device="cuda")
    slab = torch.empty(16, 64, 8, dtype=torch.int32, device="cuda")
    empty_like = round(host_us(lambda: torch.empty_like(y)), 2)
    view_of_16 = round(host_us(lambda: slab.unbind(0)) / 16, 2)
    align = _load_sgl_kernel()
    rows = [r for M in MASK_ROWS for r in measure_mask(M, 8)]
    rows += [r for NE, topk in SHAPES for M in ROWS for r in measure_sort(NE, topk, M, align)]
    doc = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        unit="host microseconds per call (median)",
        torch_op=torch_op,
        empty_like=empty_like,
        view_of_16=view_of_16,
        results=rows,
    )
    with open(opts.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"one torch op: {torch_op} us; torch.empty_like {empty_like} us; a view {view_of_16} us")
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()

"""Where an eager sort call's host time goes, on a CUDA/HIP GPU.

Eagerly (prefill, and decode batches past the largest captured graph) the sort costs
mostly host time: the GPU finishes each launch before the host has queued the next.
This splits one ``mxfp4_moe_sort`` call with a count into its host-side parts and times
each alone, back to back, with the host clock (the GPU idles, so host time is what is
measured):

* ``call``: the whole call; ``adaptive``: ``adaptive_moe_sort`` (it allocates its outputs);
* ``checks``: the argument checks alone (``check_sort_args``: metadata of 10 tensors and
  the overlap check between them);
* ``plan``: the cached launch-plan lookup (``sort_program``);
* ``scratch``: the reused scratch buffer's lookup (two- and three-launch plans only);
* ``one_launch``: one direct launch of the plan's count kernel (two- and three-launch
  plans only), the unit the plan's launches multiply;
* ``torch_op``: one small torch op (``x.zero_()``), for scale on this host;
* ``sgl_align_cpp``: sgl_kernel's C++ ``moe_align_block_size`` as SGLang calls it, when
  ``sgl_kernel`` imports (``benchmarks/device.sh`` puts a trimmed copy on the path).

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
from run import _load_sgl_kernel, sort_buffers, sort_call, sort_impls, sort_inputs
from sglang_amd_moe.kernels import adaptive_moe_sort, mxfp4_moe_sort
from sglang_amd_moe.kernels import moe_sort as sort_module
from sglang_amd_moe.kernels._validate import check_sort_args
from sglang_amd_moe.kernels.utils import scratch

SHAPES = ((257, 9), (513, 11), (896, 16))
ROWS = (1, 4, 64, 512, 4096)
BLOCK = 16
CALLS = 2000
REPEATS = 5


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


def measure(NE: int, topk: int, M: int, align: Callable | None) -> dict:
    ids, w, count = sort_inputs(M, topk, NE, max(M // 2, 1), "cuda")
    out = sort_buffers(M, topk, NE, BLOCK, "cuda")
    args = (
        ids, w, out["sorted_token_ids"], out["sorted_expert_ids"], out["cumsum_tensor"],
        out["reverse_sorted"], out["sorted_weights"], out["m_indices"], out["bf16_zero_out"],
        out["bf16_zero_workspace"], M, NE, topk, 7168, 256, BLOCK, 0, count,
    )  # fmt: skip
    prog = sort_module.sort_program(M, NE, topk, BLOCK, 0, True)
    plan = prog.plan
    parts: dict[str, float | None] = {
        "call": host_us(sort_call(mxfp4_moe_sort, ids, w, out, NE, BLOCK, count)),
        "adaptive": host_us(
            lambda: adaptive_moe_sort(ids, w, NE, topk, BLOCK, 7168, num_local_tokens=count)
        ),
        "checks": host_us(lambda: check_sort_args(*args)),
        "plan": host_us(lambda: sort_module.sort_program(M, NE, topk, BLOCK, 0, True)),
        "scratch": None,
        "one_launch": None,
    }
    if not plan.single:
        parts["scratch"] = host_us(
            lambda: scratch("moe_sort", plan.scratch_elems, torch.int32, ids.device)
        )
        buf = scratch("moe_sort", plan.scratch_elems, torch.int32, ids.device)
        parts["one_launch"] = host_us(
            lambda: prog.count((plan.chunks,), ids, count, buf, M, ids.stride(0), plan.ranks_at)
        )
    if align is not None:  # called as run.py calls it, on in-range ids
        parts["sgl_align_cpp"] = host_us(
            sort_impls(ids, w, count, NE, BLOCK, None, align)["sgl_align_cpp"]
        )
    else:
        parts["sgl_align_cpp"] = None
    rounded = {k: (None if v is None else round(v, 2)) for k, v in parts.items()}
    return dict(num_experts=NE, topk=topk, M=M, block=BLOCK, launches=plan.launches, **rounded)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    opts = parser.parse_args()
    x = torch.zeros(16, dtype=torch.int32, device="cuda")
    torch_op = round(host_us(lambda: x.zero_()), 2)
    align = _load_sgl_kernel()
    rows = [measure(NE, topk, M, align) for NE, topk in SHAPES for M in ROWS]
    doc = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        unit="host microseconds per call (median)",
        torch_op=torch_op,
        results=rows,
    )
    with open(opts.out, "w") as f:
        json.dump(doc, f, indent=1)
    keys = [k for k in rows[0] if k not in ("num_experts", "topk", "block")]
    print(f"one torch op: {torch_op} us")
    print("NE/topk " + " ".join(f"{k:>13}" for k in keys))
    for r in rows:
        cells = " ".join(f"{'-' if r[k] is None else r[k]:>13}" for k in keys)
        print(f"{r['num_experts']}/{r['topk']:<4} {cells}")


if __name__ == "__main__":
    main()

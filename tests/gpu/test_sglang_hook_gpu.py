"""The SGLang hook on a GPU: real SGLang's ``_post_process_topk_ids`` on CUDA tensors with
the HIP branch forced, after the real ``load_plugins()``, inside one captured CUDA graph
replayed with new counts.

Runs in a subprocess (the topk module's flags are process state) with the interpreter
of this test run; it needs a real SGLang release importable there, and on a GPU its
compiled kernels (``sgl_kernel``, which SGLang's topk imports): on the GPU machine
``benchmarks/device.sh`` installs the carried 0.5.13.post1 wheel (form ``weights-only``)
and unpacks a trimmed sglang-kernel 0.4.3 (``benchmarks/trim_sgl_kernel.py``). Skipped
without a GPU; without SGLang or sgl_kernel skipped too, unless
``SGLANG_AMD_MOE_TEST_REQUIRE_SGLANG=1`` (device.sh sets it): then it fails, so a GPU run
never passes without having run it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.sglang  # (and `gpu`, as every test under tests/gpu: conftest.py)

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)
_REQUIRED = os.environ.get("SGLANG_AMD_MOE_TEST_REQUIRE_SGLANG") == "1"
for _module, _why in (
    ("sglang", "needs a real SGLang release installed"),
    # On a GPU, SGLang's topk imports its compiled kernels (sgl_kernel / sglang-kernel).
    ("sgl_kernel", "SGLang's topk needs sgl_kernel on a GPU machine; not installed"),
):
    if importlib.util.find_spec(_module) is None:
        if _REQUIRED:
            pytest.fail(f"{_why} (SGLANG_AMD_MOE_TEST_REQUIRE_SGLANG=1)", pytrace=False)
        pytest.skip(_why, allow_module_level=True)

SCRIPT = r"""
import json, sys
import torch
import sglang.srt.layers.moe.topk as topk
from importlib.metadata import version

topk._is_hip, topk._is_cuda = True, False
M, K, E = 256, 8, 64
torch.manual_seed(0)
src_ids = torch.randint(0, E, (M, K), dtype=torch.int32, device="cuda")
src_w = torch.rand(M, K, dtype=torch.float32, device="cuda")
logits = torch.randn(M, E, device="cuda")
cfg = topk.TopKConfig(top_k=K)


def padded_copy(n):
    ids, w = src_ids.clone(), src_w.clone()
    ids[n:, 0::2] = -1
    ids[n:, 1::2] = 9999
    w[n:] = float("nan")
    return ids, w


def call(ids, w, count):
    return topk._post_process_topk_ids(ids, w, cfg, logits, 0, count, None)[:2]


out = {"sglang": version("sglang")}
# Without the plugin: what the installed release leaves in padded rows.
ids, w = padded_copy(100)
bare_ids, bare_w = call(ids, w, torch.tensor([100], dtype=torch.int32, device="cuda"))
torch.cuda.synchronize()
out["bare_padded_ids"] = sorted(set(bare_ids[100:].flatten().tolist()))
out["bare_padded_w_nan"] = int(torch.isnan(bare_w[100:]).sum())

from sglang.srt.plugins import load_plugins
from sglang_amd_moe.runtime.sglang import hook as sglang_hook

load_plugins()
out["hook_live"] = sglang_hook.is_live()

ids, w = padded_copy(M)
count = torch.tensor([M], dtype=torch.int32, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    call(ids, w, count)
torch.cuda.current_stream().wait_stream(s)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    g_ids, g_w = call(ids, w, count)
replays = []
for n in (1, 5, 100, M - 1, M):
    new_ids, new_w = padded_copy(n)
    ids.copy_(new_ids)
    w.copy_(new_w)
    count.fill_(n)
    graph.replay()
    torch.cuda.synchronize()
    replays.append({
        "n": n,
        "real_ids_equal": bool(torch.equal(g_ids[:n], src_ids[:n])),
        "real_w_equal": bool(torch.equal(g_w[:n], src_w[:n])),
        "padded_ids": sorted(set(g_ids[n:].flatten().tolist())),
        "padded_w_all_zero": bool((g_w[n:] == 0).all()),
    })
out["replays"] = replays
print("RESULT " + json.dumps(out))
"""


def test_sglang_hook_in_cuda_graph(tmp_path):
    env = dict(os.environ, SGLANG_AMD_MOE_FORCE="1")
    env.pop("SGLANG_PLUGINS", None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-6000:]
    res = json.loads(line[len("RESULT ") :])
    print(json.dumps(res, indent=1))
    # The broken release passes padded garbage through; with the plugin it never does.
    assert res["hook_live"]
    for r in res["replays"]:
        assert r["real_ids_equal"] and r["real_w_equal"], r
        assert r["padded_ids"] in ([], [0]), r
        assert r["padded_w_all_zero"], r

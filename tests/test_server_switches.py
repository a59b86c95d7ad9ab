"""The real-server run's test-only switches, on the CPU, against real SGLang 0.5.13.post1.

benchmarks/server/site/sitecustomize.py is what makes the GPU servers look like AMD ones
at the padded rows. Its logic is checked here with the same release the GPU run serves
(form ``weights-only``), in that release's environment (``.compat/0.5.13.post1``, built by
``make test``), with the sitecustomize on ``PYTHONPATH`` exactly as the harness puts it:

* importing the topk module sets ``_is_hip=True, _is_cuda=False``;
* a ``TopK`` layer called while SGLang's graph-capture flag is up (its real
  ``model_capture_mode()``) gets the count as ``num_token_non_padded`` and its router
  output gains garbage ids and NaN weights in rows at and beyond the count; outside
  capture nothing changes;
* without the plugin, upstream's HIP branch zeroes the padded weights and passes the
  garbage ids on; with the plugin (the real ``load_plugins()``), padded rows leave with
  id 0 and weight 0, and real rows are the same in every case.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from server.harness import free_port  # below 55535: SGLang adds 10000 for gRPC

REPO = Path(__file__).resolve().parents[1]
SITE = REPO / "benchmarks" / "server" / "site"
PYTHON = REPO / ".compat" / "0.5.13.post1" / "bin" / "python"
M, N, K, E = 8, 5, 4, 16

PROBE = """
import json, os, sys, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo
import sitecustomize as sc
from sglang.srt.layers.moe import topk
import sglang.srt.model_executor.cuda_graph_runner as cgr
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel

init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                             distributed_init_method="tcp://127.0.0.1:" + os.environ["PROBE_PORT"])
initialize_model_parallel(1)
if os.environ.get("PROBE_PLUGIN") == "1":
    from sglang.srt.plugins import load_plugins
    load_plugins()
M, N, K, E = (int(x) for x in sys.argv[2:6])
g = torch.Generator().manual_seed(0)
hidden = torch.randn(M, 32, generator=g)
logits = torch.randn(M, E, generator=g)
layer = topk.TopK(top_k=K, use_grouped_topk=True, num_expert_group=4, topk_group=2,
                  correction_bias=torch.zeros(E), scoring_func="sigmoid", renormalize=True)
# On the GPU the count tensor is made at the first graph capture; here it lives on the CPU.
sc._STATE["count"] = torch.tensor([N], dtype=torch.int32)
out = {"flags": [topk._is_hip, topk._is_cuda]}
with torch._dynamo.config.patch(disable=True):  # SGLang's torch.compile'd router, run eagerly
    r = layer.forward_cuda(hidden, logits)
    out["eager"] = [r.topk_ids.tolist(), r.topk_weights.tolist()]
    with cgr.model_capture_mode():
        r = layer.forward_cuda(hidden, logits)
    weights = [[x if x == x else "nan" for x in row] for row in r.topk_weights.tolist()]
    out["capture"] = [r.topk_ids.tolist(), weights]
out["record"] = sc.RECORD.data
json.dump(out, open(sys.argv[1], "w"))
"""


def _run_both(tmp_path: Path) -> dict[str, dict]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    procs = {}
    for mode in ("bare", "plugin"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_AMD_MOE_")}
        env.pop("SGLANG_PLUGINS", None)
        env.update(
            PYTHONPATH=str(SITE),
            PYTHONDONTWRITEBYTECODE="1",
            TRITON_INTERPRET="1",  # the plugin's mask kernel on CPU tensors
            PROBE_PORT=str(free_port()),
            SGLANG_AMD_MOE_TEST_HIP_BRANCH="1",
            SGLANG_AMD_MOE_TEST_INJECT="1",
            SGLANG_AMD_MOE_TEST_PASS_COUNT="1",
        )
        if mode == "plugin":
            env.update(PROBE_PLUGIN="1", SGLANG_AMD_MOE_FORCE="1")
        out = tmp_path / f"{mode}.json"
        cmd = [str(PYTHON), str(script), str(out), str(M), str(N), str(K), str(E)]
        procs[mode] = (
            subprocess.Popen(cmd, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True),
            out,
        )
    results = {}
    for mode, (proc, out) in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{mode} probe failed:\n{err[-3000:]}"
        assert "SERVER-TEST" in err and "_is_hip=True, _is_cuda=False" in err, err[-2000:]
        results[mode] = json.loads(out.read_text())
    return results


@pytest.mark.sglang
def test_switches_emulate_amd_padded_rows_and_the_plugin_masks_them(tmp_path: Path) -> None:
    if not PYTHON.exists():
        pytest.skip(
            f"SGLang 0.5.13.post1 not built at {PYTHON.parent.parent} (make test builds it)"
        )
    runs = _run_both(tmp_path)
    for mode, r in runs.items():
        assert r["flags"] == [True, False], mode
        eager_ids, eager_w = r["eager"]
        ids, weights = r["capture"]
        # Outside capture: the router's own output, no count, nothing injected.
        assert all(0 <= i < E for row in eager_ids for i in row)
        # Real rows are untouched by everything.
        assert ids[:N] == eager_ids[:N], mode
        assert weights[:N] == eager_w[:N], mode
        assert r["record"]["count_supplied_at_capture"] == 1
        assert r["record"]["injected_at_capture"] == 1
    bare_ids, bare_w = runs["bare"]["capture"]
    # weights-only: upstream zeroes the padded weights (the NaNs too) and keeps the garbage ids.
    assert all(w == 0.0 for row in bare_w[N:] for w in row)
    garbage = [i for row in bare_ids[N:] for i in row]
    assert sum(1 for i in garbage if not 0 <= i < E) >= len(garbage) - 1
    plug_ids, plug_w = runs["plugin"]["capture"]
    assert plug_ids[N:] == [[0] * K] * (M - N)
    assert all(w == 0.0 for row in plug_w[N:] for w in row)

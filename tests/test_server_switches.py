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
  id 0 and weight 0, and real rows are the same in every case;
* with DeepSeek-V3's routing and its shared expert fused (``num_fused_shared_experts=1``:
  the router writes expert 256 into a ninth column), the same holds for that column, and
  the record's ``topk_after_hook`` counts (the Triton kernel of ``site/topk_counts.py``,
  run here by Triton's interpreter) say so: garbage ids in the routed and shared columns
  of padded rows without the plugin, none with it, expert 256 in real rows either way.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from server.harness import MODELS, free_port  # free_port: below 55535 (SGLang adds 10000)

REPO = Path(__file__).resolve().parents[1]
SITE = REPO / "benchmarks" / "server" / "site"
PYTHON = REPO / ".compat" / "0.5.13.post1" / "bin" / "python"
M, N, K, E = 8, 5, 4, 16
# DeepSeek-V3's routing (DeepseekV2MoE's TopK with the shared expert fused).
DS_M, DS_N, DS_K, DS_E = 12, 5, 8, 256

# In each probe script: the release's ServerArgs defaults set for the scheduler (field by
# field: ServerArgs.__post_init__ would look for a model), then the real load_plugins()
# where the run asks for the plugin.
SERVER_ARGS_AND_PLUGINS = """\
args = object.__new__(ServerArgs)
for f in dataclasses.fields(ServerArgs):
    if f.default is not dataclasses.MISSING:
        setattr(args, f.name, f.default)
    elif f.default_factory is not dataclasses.MISSING:
        setattr(args, f.name, f.default_factory())
    else:
        setattr(args, f.name, None)
set_global_server_args_for_scheduler(args)
if os.environ.get("PROBE_PLUGIN") == "1":
    from sglang.srt.plugins import load_plugins
    load_plugins()
"""

PROBE = (
    """
import dataclasses, itertools, json, os, sys, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo
import sitecustomize as sc
from sglang.srt.layers.moe import topk
import sglang.srt.model_executor.cuda_graph_runner as cgr
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                             distributed_init_method="tcp://127.0.0.1:" + os.environ["PROBE_PORT"])
initialize_model_parallel(1)
# TopK reads the server's arguments when a shared expert is fused: the release's defaults
# (set field by field: ServerArgs.__post_init__ would look for a model).
"""
    + SERVER_ARGS_AND_PLUGINS
    + """\


def run(shape, M, N, K, E):
    # What the sitecustomize keeps per process starts afresh for each shape, as in a
    # server process of its own: the record, the counts buffer and the garbage salt.
    sc.RECORD = sc._Record()
    sc._STATE.update(salt=itertools.count(1), topk_counts=None, topk_counts_seen=None)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(M, 32, generator=g)
    logits = torch.randn(M, E, generator=g)
    if shape == "deepseek_v3":
        layer = topk.TopK(top_k=K + 1, use_grouped_topk=True, num_expert_group=8, topk_group=4,
                          num_fused_shared_experts=1,
                          correction_bias=torch.randn(E, generator=g) * 0.1,
                          scoring_func="sigmoid", renormalize=True, routed_scaling_factor=2.5)
    else:
        layer = topk.TopK(top_k=K, use_grouped_topk=True, num_expert_group=4, topk_group=2,
                          correction_bias=torch.zeros(E), scoring_func="sigmoid", renormalize=True)
    # On the GPU the count tensor is made at the first graph capture; here it is on the CPU.
    sc._STATE["count"] = torch.tensor([N], dtype=torch.int32)
    out = {"flags": [topk._is_hip, topk._is_cuda]}
    with torch._dynamo.config.patch(disable=True):  # SGLang's torch.compile'd router, eagerly
        r = layer.forward_cuda(hidden, logits)
        out["eager"] = [r.topk_ids.tolist(), r.topk_weights.tolist()]
        with cgr.model_capture_mode():
            r = layer.forward_cuda(hidden, logits)
        weights = [[x if x == x else "nan" for x in row] for row in r.topk_weights.tolist()]
        out["capture"] = [r.topk_ids.tolist(), weights]
    sc._collect_topk_counts(force=True)  # no graph replays here: read the counts now
    out["record"] = sc.RECORD.data
    return out


json.dump({s[0]: run(*s) for s in json.loads(sys.argv[2])}, open(sys.argv[1], "w"))
"""
)


#: (shape, rows, real rows, top-k, routed experts) of each probe, in the order one
#: process runs them.
SHAPES = (("grouped", M, N, K, E), ("deepseek_v3", DS_M, DS_N, DS_K, DS_E))


@pytest.fixture(scope="module")
def switch_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict]]:
    """shape -> mode -> the probe's output: one process per mode (without and with the
    plugin), each importing SGLang once and running every shape of :data:`SHAPES`."""
    if not PYTHON.exists():
        pytest.skip(
            f"SGLang 0.5.13.post1 not built at {PYTHON.parent.parent} (make test builds it)"
        )
    tmp_path = tmp_path_factory.mktemp("switches")
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
            SGLANG_AMD_MOE_TEST_RECORD_DIR=str(tmp_path / f"records-{mode}"),
        )
        (tmp_path / f"records-{mode}").mkdir()
        if mode == "plugin":
            env.update(PROBE_PLUGIN="1", SGLANG_AMD_MOE_FORCE="1")
        out = tmp_path / f"{mode}.json"
        cmd = [str(PYTHON), str(script), str(out), json.dumps(SHAPES)]
        procs[mode] = (
            subprocess.Popen(cmd, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True),
            out,
        )
    results: dict[str, dict[str, dict]] = {shape: {} for shape, *_ in SHAPES}
    for mode, (proc, out) in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{mode} probe failed:\n{err[-3000:]}"
        assert "SERVER-TEST" in err and "_is_hip=True, _is_cuda=False" in err, err[-2000:]
        for shape, r in json.loads(out.read_text()).items():
            results[shape][mode] = r
    return results


@pytest.mark.sglang
def test_switches_emulate_amd_padded_rows_and_the_plugin_masks_them(switch_runs: dict) -> None:
    runs = switch_runs["grouped"]
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


@pytest.mark.sglang
def test_fused_shared_expert_column_of_padded_rows_is_masked_and_counted(switch_runs: dict) -> None:
    m, n, k, e = DS_M, DS_N, DS_K, DS_E
    pad = m - n
    runs = switch_runs["deepseek_v3"]
    for mode, r in runs.items():
        eager_ids, eager_w = r["eager"]
        ids, weights = r["capture"]
        # The fused shared expert: a ninth column, expert e, in every real row.
        assert all(len(row) == k + 1 and row[k] == e for row in eager_ids), mode
        assert ids[:n] == eager_ids[:n] and weights[:n] == eager_w[:n], mode
        assert r["record"]["topk"] == {
            "top_k": k + 1,
            "columns": k + 1,
            "routed_experts": e,
            "num_fused_shared_experts": 1,
        }, mode
        counts = r["record"]["topk_after_hook"]
        assert counts["padded_routed"]["entries"] == pad * k, mode
        assert counts["padded_shared"]["entries"] == pad, mode
        assert counts["real_shared"] == {
            "entries": n,
            "ids_out_of_range": 0,
            "weights_nonzero": n,
            "id_min": e,
            "id_max": e,
        }, mode
    bare_w = runs["bare"]["capture"][1]
    assert all(w == 0.0 for row in bare_w[n:] for w in row)  # upstream zeroes the weights
    bare = runs["bare"]["record"]["topk_after_hook"]
    # The garbage ids reach the MoE, in the shared column too.
    assert bare["padded_routed"]["ids_out_of_range"] >= pad * k - 1
    assert bare["padded_shared"]["ids_out_of_range"] >= pad - 1
    assert bare["padded_routed"]["weights_nonzero"] == bare["padded_shared"]["weights_nonzero"] == 0
    plug_ids, plug_w = runs["plugin"]["capture"]
    assert plug_ids[n:] == [[0] * (k + 1)] * pad
    assert all(w == 0.0 for row in plug_w[n:] for w in row)
    plug = runs["plugin"]["record"]["topk_after_hook"]
    for group in ("padded_routed", "padded_shared"):
        assert plug[group]["ids_out_of_range"] == plug[group]["weights_nonzero"] == 0, group
        assert plug[group]["id_min"] == plug[group]["id_max"] == 0, group


MLA_PROBE = """
import json, sys, torch
from sglang.srt.layers.attention.triton_ops.decode_attention import decode_attention_fwd

def run(kv_lora, rope, heads, bs=3, seq=40, splits=4):
    lk = kv_lora + rope
    g = torch.Generator().manual_seed(0)
    # float16: Triton's interpreter computes bfloat16 dots wrongly on the CPU.
    q = torch.randn(bs, heads, lk, generator=g).half()
    k_buf = torch.randn(bs * seq, 1, lk, generator=g).half()
    v_buf = k_buf[..., :kv_lora]  # MLA: the value is the latent part of the key
    o = torch.zeros(bs, heads, kv_lora).half()
    indptr = torch.arange(bs + 1, dtype=torch.int32) * seq
    indices = torch.arange(bs * seq, dtype=torch.int64)
    logits = torch.empty(bs, heads, splits, kv_lora)
    lse = torch.empty(bs, heads, splits)
    scale = lk ** -0.5
    try:
        decode_attention_fwd(q, k_buf, v_buf, o, indptr, indices, logits, lse,
                             torch.full((bs,), splits, dtype=torch.int32), splits, scale,
                             1.0, 1.0, has_mla=True)
    except Exception as exc:
        return {"error": repr(exc)}
    ref = torch.stack([
        torch.softmax(q[b].float() @ k_buf[b * seq:(b + 1) * seq, 0].float().T * scale, -1)
        @ v_buf[b * seq:(b + 1) * seq, 0].float()
        for b in range(bs)
    ])
    return {"max_abs_diff": (o.float() - ref).abs().max().item()}

cfg = json.loads(sys.argv[2])
out = {
    "config": run(cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["num_attention_heads"]),
    "earlier": run(128, 32, cfg["num_attention_heads"]),
}
json.dump(out, open(sys.argv[1], "w"))
"""


@pytest.mark.sglang
def test_deepseek_config_fits_sglangs_triton_mla_decode_kernel(tmp_path: Path) -> None:
    """The harness's DeepSeek-V3 MLA dimensions run SGLang's Triton MLA decode kernel (the
    one the servers capture) and match plain attention over the latent; the earlier
    config's 128 + 32 fails there exactly as every server did on the GPU."""
    if not PYTHON.exists():
        pytest.skip(f"SGLang 0.5.13.post1 not built at {PYTHON.parent.parent}")
    script, out = tmp_path / "mla.py", tmp_path / "mla.json"
    script.write_text(MLA_PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_AMD_MOE_")}
    env.update(TRITON_INTERPRET="1", PYTHONDONTWRITEBYTECODE="1")
    cfg = json.dumps(MODELS["deepseek_v3"])
    proc = subprocess.run(
        [str(PYTHON), str(script), str(out), cfg],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["config"].get("max_abs_diff", 1.0) < 2e-3, result
    assert "incompatible dimensions at index 1: 128 and 256" in result["earlier"]["error"]


AITER_PROBE = (
    """
import dataclasses, json, os, sys, warnings
warnings.simplefilter("ignore")
import torch
import sitecustomize as sc
import sglang.srt.layers.quantization.unquant as uq
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

"""
    + SERVER_ARGS_AND_PLUGINS
    + """\
from sglang.srt.layers.moe.moe_runner.aiter import AiterMoeQuantInfo
from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
from sglang.srt.layers.moe.topk import StandardTopKOutput

M, N, K, E, H, I = 10, 6, 4, 16, 32, 16
out = {"use_aiter": uq._use_aiter, "backend": uq.get_moe_runner_backend().value}
method = uq.UnquantizedFusedMoEMethod()
method.create_moe_runner(None, MoeRunnerConfig(
    num_experts=E, num_local_experts=E, hidden_size=H, intermediate_size_per_partition=I,
    top_k=K, activation="silu"))
out["aiter_runner"] = method._aiter_runner is not None
g = torch.Generator().manual_seed(0)
hidden = torch.randn(M, H, generator=g)
w13, w2 = torch.randn(E, 2 * I, H, generator=g), torch.randn(E, H, I, generator=g)
ids = torch.randint(0, E, (M, K), generator=g, dtype=torch.int32)
weights = torch.rand(M, K, generator=g)
clean_ids, clean_w = ids.clone(), weights.clone()
clean_ids[N:], clean_w[N:] = 0, 0
ids[N:] = torch.tensor([-1, E, 9999, -(2**31)], dtype=torch.int32)  # padded rows' garbage
ids[N + 1, 0] = 3  # an id in range among them
weights[N:] = float("nan")

def run(i, w):
    topk = StandardTopKOutput(w, i, torch.zeros(M, E))
    quant = AiterMoeQuantInfo(w13_weight=w13, w2_weight=w2, expert_mask=None)
    return method._aiter_runner.run(StandardDispatchOutput(hidden, None, topk), quant).hidden_states

ref = run(clean_ids, clean_w)
try:
    got = run(ids, weights)
    out["real_rows_equal"] = bool(torch.equal(got[:N], ref[:N]))
    out["error"] = None
except Exception as exc:
    out["error"] = type(exc).__name__ + ": " + str(exc)[:200]
import aiter, aiter.fused_moe as fm
out["standin"] = getattr(aiter, "IS_SERVER_STANDIN", False)
out["calls"] = fm.CALLS[0]
stats = sys.modules.get("sglang_amd_moe.runtime.stats")
out["stats"] = stats.counts() if stats is not None else None
json.dump(out, open(sys.argv[1], "w"))
"""
)


@pytest.mark.sglang
@pytest.mark.parametrize("plugin", [False, True], ids=["bare", "plugin"])
def test_aiter_switch_sends_sglangs_moe_through_the_stand_in(tmp_path: Path, plugin) -> None:
    """``SGLANG_AMD_MOE_TEST_AITER=1`` (the guard-only server runs): SGLang 0.5.13.post1's
    unquantized MoE method builds its aiter runner and calls the stand-in's
    ``aiter.fused_moe.fused_moe``, which refuses ids out of range (on the GPU a device
    fault; on the CPU an IndexError). Without the plugin, garbage in padded rows (no count)
    ends the call; with it, the guard hands aiter ids in range, real rows come out exactly
    as with clean padded rows, and the counters say how many entries it changed."""
    if not PYTHON.exists():
        pytest.skip(f"SGLang 0.5.13.post1 not built at {PYTHON.parent.parent}")
    script = tmp_path / "probe.py"
    script.write_text(AITER_PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_AMD_MOE_")}
    env.pop("SGLANG_PLUGINS", None)
    env.update(
        PYTHONPATH=str(SITE),
        PYTHONDONTWRITEBYTECODE="1",
        TRITON_INTERPRET="1",
        SGLANG_AMD_MOE_TEST_AITER="1",
    )
    if plugin:
        env.update(PROBE_PLUGIN="1", SGLANG_AMD_MOE_FORCE="1")
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [str(PYTHON), str(script), str(out)], env=env, cwd=tmp_path, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "_use_aiter=True, MoE runner backend aiter" in proc.stderr
    r = json.loads(out.read_text())
    assert r["use_aiter"] and r["backend"] == "aiter" and r["aiter_runner"] and r["standin"]
    if not plugin:
        assert r["error"] and r["error"].startswith("IndexError"), r
        assert r["stats"] is None
        return
    assert r["error"] is None and r["real_rows_equal"], r
    assert r["calls"] == 2
    # 4 padded rows of 4 entries: 15 ids out of range; no count, so none counted as real.
    assert r["stats"] == {
        "guard": {"calls": 2, "out_of_range": 15, "past_count": 0, "real_out_of_range": 0}
    }

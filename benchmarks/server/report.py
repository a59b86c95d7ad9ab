"""Write docs/server.md from the real-server results (``harness.py``'s JSON, one per model).

Why a generator: every number and verdict in the doc is read from the committed results,
so the doc cannot drift from what the GPU run saw (a CPU test regenerates it and compares).

    python benchmarks/server/report.py [--out docs/server.md]

The records it reads are ``RECORDS`` (each its own device call); a missing one is left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DOC = REPO / "docs" / "server.md"

#: The records of the doc, in its order: (path from the repository root, section title).
RECORDS: tuple[tuple[str, str], ...] = (
    ("benchmarks/results/server-h200.json", "Qwen3-MoE class (`qwen3_moe`)"),
    ("benchmarks/results/server-h200-deepseek.json", "DeepSeek-V3 class (`deepseek_v3`)"),
)

#: The guard-only records (runs f, g, h: ``--runs f,g,h``), one per model class.
GUARD_RECORDS: tuple[tuple[str, str], ...] = (
    ("benchmarks/results/server-h100-guard.json", "Qwen3-MoE class (`qwen3_moe`)"),
    ("benchmarks/results/server-h100-guard-deepseek.json", "DeepSeek-V3 class (`deepseek_v3`)"),
)

DEVICE_COMMAND = "bash .carry-server/server/device.sh"
CONFIG_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "num_experts",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "n_group",
    "topk_group",
    "topk_method",
    "scoring_func",
    "routed_scaling_factor",
    "moe_intermediate_size",
)


def load_records(
    root: Path = REPO, records: tuple[tuple[str, str], ...] = RECORDS
) -> list[tuple[str, str, dict]]:
    """The committed records that exist: (path, title, results)."""
    out = []
    for rel, title in records:
        path = root / rel
        if path.is_file():
            out.append((rel, title, json.loads(path.read_text())))
    return out


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _scheduler(run: dict) -> dict:
    """The scheduler process's record (the process that captures and replays graphs)."""
    recs = [r for r in run.get("records", []) if r.get("captured_bs")]
    return recs[0] if recs else {}


def _plugin_lines(run: dict) -> str:
    lines = run.get("log", {}).get("plugin_lines", [])
    if not lines:
        return "none"
    by_text: dict[str, list[str]] = {}
    for x in lines:
        by_text.setdefault(x["line"], []).append(x["process"])
    return "<br>".join(f"{', '.join(procs)}: `{text}`" for text, procs in by_text.items())


def _hook_live(run: dict) -> str:
    hook = _scheduler(run).get("hook") or {}
    if not hook.get("loaded"):
        return "no (plugin not loaded)"
    form, state = hook.get("form"), hook.get("state")
    why = f"form `{form}`" if form else f"state `{state}`"
    return f"{_yes(bool(hook.get('is_live')))} ({why})"


def _graphs(run: dict) -> str:
    rec = _scheduler(run)
    caps = run.get("log", {}).get("capture_lines", [])
    end = next((c for c in caps if c.startswith("end.")), "")
    took = end.split("Time elapsed: ")[1].split(" s.")[0] + " s" if "Time elapsed: " in end else "?"
    return f"bs {sorted(rec.get('captured_bs', []))} in {took}" if rec else "none recorded"


def _replays(run: dict) -> str:
    pad = run.get("padding", {})
    sizes = ", ".join(f"{k}: {v}" for k, v in sorted(pad.get("by_real_over_padded", {}).items()))
    return f"{pad.get('replays_with_padded_rows', 0)} of {pad.get('replays', 0)}" + (
        f" ({sizes})" if sizes else ""
    )


def _result_lines(w, eq: dict | None, runs: dict) -> None:
    """The result bullets: which runs gave the same tokens (``eq``; None: no line), then
    each run's requests served, padded replays and damage."""
    if eq is not None:
        w(
            "- Token for token: "
            + ", ".join(f"({k[0]}) {'==' if v else '!='} ({k[3]})" for k, v in sorted(eq.items()))
            + "."
        )
    for label, run in runs.items():
        pad = run.get("padding", {})
        w(
            f"- ({label}) {run['what']}: {_served(run)} requests served, "
            f"{pad.get('replays_with_padded_rows', 0)} of {pad.get('replays', 0)} recorded decode "
            f"replays with padded rows; damage: {_damage(run)}."
        )


def _served(run: dict) -> str:
    cmp = run.get("compare_to_b", {})
    return f"{cmp.get('served', 0)} / {cmp.get('requests', 0)}"


def _same_as_b(run: dict) -> str:
    cmp = run.get("compare_to_b", {})
    if not cmp.get("served"):
        return "nothing to compare (no request served)"
    return f"{cmp['identical']} identical, {cmp['mismatched']} differ"


def _damage(run: dict) -> str:
    dmg = run.get("damage") or []
    if not dmg:
        return "none"
    fault = (run.get("log", {}).get("fault_lines") or [""])[0]
    return ", ".join(dmg) + (f": `{fault}`" if fault else "")


def _spread(values: list[float], fmt: str = ".2f") -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}" if values else "-"


def _topk_configs(doc: dict) -> list[dict]:
    """TopK's configuration as each scheduler recorded it (those that did)."""
    return [c for c in (_scheduler(r).get("topk") for r in doc["runs"].values()) if c]


def _group(counts: dict, group: str) -> str:
    g = counts[group]
    if not g["entries"]:
        return "none"
    span = f"{g['id_min']}" if g["id_min"] == g["id_max"] else f"{g['id_min']}..{g['id_max']}"
    return (
        f"{g['entries']} entries, ids {span}, {g['ids_out_of_range']} out of range, "
        f"{g['weights_nonzero']} weights not 0"
    )


# ------------------------------------------------------------------------------ sections


def intro(records: list[tuple[str, str, dict]]) -> list[str]:
    out: list[str] = []
    w = out.append
    sources = " and ".join(rel for rel, _, _ in records)
    w("# A real SGLang server with the plugin, on a GPU")
    w("")
    w(f"<!-- Generated by benchmarks/server/report.py from {sources}; do not edit. -->")
    w("")
    w(
        "`python -m sglang.launch_server` of SGLang 0.5.13.post1 (form `weights-only`: its HIP "
        "branch zeroes padded weights but leaves padded expert ids as the router wrote them), "
        "with this package installed from its wheel, serving greedy requests on one GPU, for "
        + " and ".join(f"the {title}" for _, title, _ in records)
        + " (one device call and one record each; benchmarks/server/README.md says how to "
        "reproduce them). Five servers run side by side in each call:"
    )
    w("")
    w("| run | plugin | padded rows of the router's output | TopK gets the real token count |")
    w("| --- | --- | --- | --- |")
    runs = records[0][2]["runs"]
    for label, run in runs.items():
        rows = "garbage ids, NaN weights (AMD-like)" if run["inject"] else "as routed"
        w(f"| {label} | {'on' if run['plugin'] else 'off'} | {rows} | {_yes(run['pass_count'])} |")
    w("")
    w(
        "Every server takes SGLang's HIP branch: test-only switches in "
        "`benchmarks/server/site/sitecustomize.py`, on the servers' `PYTHONPATH`, act in each "
        "server process:"
    )
    w("")
    w(
        "- `SGLANG_AMD_MOE_TEST_HIP_BRANCH=1` sets the topk module's `_is_hip=True, "
        "_is_cuda=False` (routing and `_post_process_topk_ids` run as on ROCm without aiter; "
        "attention, MoE kernels and sampling stay CUDA's);"
    )
    w(
        "- `SGLANG_AMD_MOE_TEST_INJECT=1` makes the router write what AMD's router leaves in "
        "padded rows, arbitrary int32 words as expert ids and NaN weights, into rows at and "
        "beyond the real token count of every graph replay (as `sglang-amd-moe check` emulates it);"
    )
    w(
        "- `SGLANG_AMD_MOE_TEST_PASS_COUNT=1` hands `TopK` that count as `num_token_non_padded`. "
        "In SGLang 0.5.13.post1 the MoE models that pass it (bailing_moe, deepseek_v2, "
        "exaone_moe, glm4_moe, glm4_moe_lite, llada2, mimo_v2, minimax_m2, qwen2_moe, qwen3_moe, "
        "sdar_moe, step3p5) do so only in `forward_deepep` (expert-parallel all-to-all) and "
        "`op_select_experts` (two-batch overlap, which needs an all-to-all backend), and the "
        "graph runner keeps its copy current only when the expert-parallel size is above 1. "
        "On one GPU every model's `forward_normal` passes none, so without this switch neither "
        "upstream's padded-row code nor the plugin's has a count to act on: run (e) shows that "
        "case, where the plugin, which acts only on rows at and beyond the count it is given, "
        "leaves the garbage alone;"
    )
    w(
        "- `SGLANG_AMD_MOE_TEST_RECORD_DIR` makes each scheduler write its record: the hook's "
        "state, the graphs captured, every replay's real/padded token counts and (in the "
        "records made since the DeepSeek run) what `TopK` hands the MoE, after "
        "`_post_process_topk_ids` and so after the plugin's hook, counted on the device by one "
        "small Triton kernel per `TopK` call inside the graphs, in every server of the call "
        "(the cost comparison's two included)."
    )
    w("")
    w(
        "The plugin registers on CUDA only with `SGLANG_AMD_MOE_FORCE=1` (set in every run); "
        "`SGLANG_AMD_MOE_DISABLE=1` turns it off."
    )
    w("")
    return out


def section(rel: str, title: str, doc: dict) -> list[str]:
    env = doc["environment"]
    model = doc["model"]
    server = doc["server"]
    runs = doc["runs"]
    bundle = env.get("bundle", {})
    tree = bundle.get("tree", {})
    gpu = env.get("gpu", "?")
    out: list[str] = []
    w = out.append

    w(f"## {title}")
    w("")
    w(
        f"From `{rel}`: SGLang {env.get('sglang')} on one {gpu.split(',')[0]} "
        f"(driver {gpu.split(', ')[1] if ', ' in gpu else '?'}; "
        f"Python {env.get('python')}, torch {env.get('torch')}, Triton {env.get('triton')}, "
        f"sglang-kernel {env.get('sglang_kernel')}, flashinfer {env.get('flashinfer')}, "
        f"transformers {env.get('transformers')}; sglang-amd-moe {env.get('sglang_amd_moe')} "
        f"built from commit `{tree.get('commit', '?')[:12]}`"
        f"{' with uncommitted changes' if tree.get('dirty') else ''})."
    )
    w("")
    w("### Result")
    w("")
    _result_lines(w, doc.get("equal", {}), runs)
    configs = _topk_configs(doc)
    cfg = configs[0] if configs else {}
    same = all(c == cfg for c in configs)
    after = {k: r["topk_after_hook"] for k, r in runs.items() if r.get("topk_after_hook")}
    if cfg.get("num_fused_shared_experts") and same:
        off = [k for k, r in runs.items() if r.get("log", {}).get("fusion_disabled_lines")]
        real = "; ".join(f"({k}) {_group(a['counts'], 'real_shared')}" for k, a in after.items())
        w(
            f"- Shared expert fused into the routed ones: every scheduler's `TopK` "
            f"({len(configs)} of {len(runs)} recorded it) returned "
            f"{cfg['columns']} columns ({cfg['top_k'] - cfg['num_fused_shared_experts']} routed + "
            f"{cfg['num_fused_shared_experts']} fused shared) over {cfg['routed_experts']} routed "
            f"experts; the real rows' shared column over every replay and layer: "
            f"{real}; "
            + (
                "no server logged `Shared experts fusion optimization is disabled`."
                if not off
                else f"runs {', '.join(off)} logged that the fusion was disabled."
            )
        )
    if after:
        clean = [k for k, a in after.items() if a["padded_rows_clean"]]
        dirty = [k for k, a in after.items() if not a["padded_rows_clean"]]
        cols = "routed columns" + (
            " and the appended shared-expert column" if cfg.get("num_fused_shared_experts") else ""
        )
        w(
            f"- Padded rows after the hook, over every replay and MoE layer: ids in range and "
            f"weights 0 in the {cols} in run(s) {', '.join(clean) or 'none'}"
            + (f"; not in {', '.join(dirty)}" if dirty else "")
            + " (details below)."
        )
    ov = doc.get("overhead", {})
    if ov.get("sizes"):
        parts = []
        for size, s in ov["sizes"].items():
            if s.get("tpot_ratio_b_over_d") is not None:
                parts.append(f"bs {size}: {s['tpot_ratio_b_over_d']:.3f}")
        w(
            "- Time per output token of (b) over (d): "
            + "; ".join(parts)
            + " (details and what they do and do not show below)."
        )
    w("")
    w("### How it ran")
    w("")
    w("On the GPU machine, one call (it installs the carried wheels and runs everything):")
    w("")
    w("```")
    hargs = doc.get("harness_args")
    if hargs:
        models = hargs.get("models", "qwen3_moe")
        w(
            'HARNESS_ARGS="'
            + (f"--models {models} " if models != "qwen3_moe" else "")
            + f"--rounds {hargs['rounds']} --max-new-tokens {hargs['max_new_tokens']} "
            f"--overhead-rounds {hargs['overhead_rounds']} "
            f"--overhead-tokens {hargs['overhead_tokens']}"
            + (
                f" --ready-timeout {hargs['ready_timeout']:g}"
                if hargs.get("ready_timeout", 420) != 420
                else ""
            )
            + (f" --time-budget {hargs['time_budget']:g}" if "time_budget" in hargs else "")
            + '" '
            + DEVICE_COMMAND
        )
    else:
        w(DEVICE_COMMAND)
    w("```")
    w("")
    w("Each of the five servers was started as:")
    w("")
    w("```")
    w(" ".join(server["command"]).replace("--port 0", "--port PORT"))
    w("```")
    w("")
    w(
        f"The model is a small `{model['config']['architectures'][0]}` config "
        "(`--load-format dummy`: SGLang's dummy weights, drawn from its fixed seed 1234 per "
        "parameter; `--skip-tokenizer-init`: token ids in and out):"
    )
    w("")
    mcfg = model["config"]
    keys = [k for k in CONFIG_KEYS if mcfg.get(k) is not None]
    w("| " + " | ".join(keys) + " |")
    w("|" + " --- |" * len(keys))
    w("| " + " | ".join(str(mcfg[k]) for k in keys) + " |")
    w("")
    if model["name"] == "deepseek_v3":
        w(
            "The MLA dimensions are DeepSeek-V3's. SGLang's Triton MLA decode kernel "
            "(`_decode_grouped_att_m_fwd`) reads the latent cache as both key (width "
            "kv_lora_rank + qk_rope_head_dim) and value (width kv_lora_rank): a key of 576 or "
            "288 is split into a 512 + 64 or 256 + 32 block, any other is padded to the next "
            "power of two in one block, and with MLA the value is that key block transposed "
            "(`v = tl.trans(k)`), so its width must equal the value block's "
            "(`next_power_of_2(kv_lora_rank)`). The earlier config's 128 + 32 = 160 "
            "padded to 256 against a value block of 128 and failed to compile "
            "(`Cannot make_shape_compatible: incompatible dimensions at index 1: 128 and 256`)."
        )
        w("")
        w(
            "No server argument turns the shared-expert fusion on: SGLang 0.5.13.post1 fuses by "
            "default, and `DeepseekV2ForCausalLM.determine_num_fused_shared_experts` turns it off "
            "unless the architecture is `DeepseekV3ForCausalLM`, `n_routed_experts` is 256 or 384 "
            "(384 only with a Quark checkpoint) and `n_shared_experts` is 1, the device is CUDA "
            "of capability 8.0 or more (or ROCm gfx942 or later), the expert-parallel size is 1 "
            "on CUDA, two-batch and single-batch overlap are off, the MoE all-to-all is not of "
            "DeepEP's class and the checkpoint is not W4AFP8; `--disable-shared-experts-fusion` "
            "turns it off, as do the FlashInfer MoE runners (`flashinfer_cutedsl`, "
            "`flashinfer_trtllm`, `flashinfer_trtllm_routed`) and FlashInfer's all-to-all, and "
            "`--enforce-shared-experts-fusion` skips the checks. With it on, `TopK` asks the "
            "router for the routed experts plus one: on ROCm without aiter (these servers) "
            "`biased_grouped_topk_impl` writes the shared expert, id `n_routed_experts`, into the "
            "last column of every row, before `_post_process_topk_ids`; the append inside "
            "`_post_process_topk_ids` (`fused_append_shared_experts`) runs only with aiter "
            "(`_use_aiter`), which does not run on this GPU."
        )
        w("")
    w(
        f"CUDA graphs were captured at batch sizes {server['capture_bs']}. Each of "
        f"{server['rounds']} rounds sent one batch of concurrent greedy requests "
        f"({server['prompt_len']} prompt tokens, {server['max_new_tokens']} new tokens, "
        f"`ignore_eos`) per batch size {server['check_sizes']} to every server at once, so every "
        "decode step replayed a larger graph with padded rows. The call took "
        f"{doc['phases'].get('total_s')} s on the GPU machine after installing: servers ready "
        f"in {doc['phases'].get(model['name'] + '_startup_s')} s, the rounds "
        f"{doc['phases'].get('checks_s')} s, "
        f"the overhead rounds {doc['phases'].get('overhead_s')} s."
    )
    w("")
    w("### The runs")
    w("")
    w(
        "| run | what | ready after | plugin's line, per process | hook live (scheduler) "
        "| graphs captured | replays with padded rows | requests served | outputs vs (b) "
        "| damage |"
    )
    w("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, run in runs.items():
        w(
            f"| {label} | {run['what']} | {run.get('ready_s')} s | {_plugin_lines(run)} | "
            f"{_hook_live(run)} | {_graphs(run)} | {_replays(run)} | {_served(run)} | "
            f"{_same_as_b(run)} | {_damage(run)} |"
        )
    w("")
    for label, run in runs.items():
        cmp = run.get("compare_to_b", {})
        if cmp.get("first_error"):
            w(f"- ({label}) first failed request: `{cmp['first_error']}`.")
        if cmp.get("first_mismatch"):
            w(f"- ({label}) first differing output: {cmp['first_mismatch']}.")
    w("")
    w(
        "Replays are counted in each scheduler process by the test tooling (`real/padded` "
        "tokens per graph replay); a server that faults loses what it had not yet written "
        "(the records are written at most once a second after the first replays)."
    )
    w("")
    if after or cfg:
        w("### What `TopK` handed the MoE")
        w("")
        w(
            "Counted in each scheduler over every graph replay and every MoE layer, after "
            "`_post_process_topk_ids` (entries: ids, their range, ids outside "
            f"[0, {cfg.get('routed_experts', 0) + cfg.get('num_fused_shared_experts', 0)}), "
            "weights not 0, NaN included):"
        )
        w("")
        w(
            "| run | padded rows, routed columns | padded rows, shared-expert column "
            "| real rows, shared-expert column | padded rows clean |"
        )
        w("| --- | --- | --- | --- | --- |")
        for label, run in runs.items():
            a = run.get("topk_after_hook")
            if not a:
                why = (
                    "not read: the device faulted in the first padded replays, before the "
                    "counts were first read"
                    if run.get("damage")
                    else "not recorded"
                )
                w(f"| {label} | {why} | | | |")
                continue
            c = a["counts"]
            w(
                f"| {label} | {_group(c, 'padded_routed')} | {_group(c, 'padded_shared')} | "
                f"{_group(c, 'real_shared')} | {_yes(a['padded_rows_clean'])} |"
            )
        w("")
    if ov.get("sizes"):
        out.extend(_cost(doc, ov, server, counted=bool(after)))
    elif ov:
        w(f"Overhead not measured: {ov.get('skipped')}.")
        w("")
    w("### Carried to the GPU machine")
    w("")
    trims = bundle.get("trims", {})
    total = bundle.get("bytes_total", 0)
    recompressed = bundle.get("recompressed", {})
    w(
        f"{len(bundle.get('wheels', []))} wheels, {total / 2**20:.1f} MiB with the harness "
        "(benchmarks/server/bundle.py lists them and why each is needed). Trimmed to fit one "
        "transfer:"
    )
    w("")
    for name, t in trims.items():
        w(
            f"- `{name}`: dropped {t['removed_files']} files "
            f"({t['removed_bytes'] / 2**20:.0f} MiB unpacked): {t['why']}."
        )
    if recompressed:
        saved = sum(r["bytes_deflate"] - r["bytes_lzma"] for r in recompressed.values())
        w(
            f"- Stored with LZMA instead of deflate ({saved / 2**20:.1f} MiB less; same files "
            "once unpacked): " + ", ".join(f"`{n}`" for n in recompressed) + "."
        )
    w("")
    w(
        "flashinfer's 448 MB cubin package is not needed. flashinfer itself is: SGLang's "
        "sampler imports it on CUDA, and sgl-kernel 0.4.3's RMSNorm calls flashinfer's, which "
        "compiles its `norm` module with nvcc at first use from the sources kept above; "
        "SGLang's own JIT kernels (rope, activation, q/k norm, position clamp) compile the same "
        f"way. All of that is in the {doc['phases'].get(model['name'] + '_startup_s', '?')} s the "
        "servers took to start."
    )
    w("")
    return out


def _cost(doc: dict, ov: dict, server: dict, counted: bool) -> list[str]:
    out: list[str] = []
    w = out.append
    w("### What the plugin costs")
    w("")
    w(
        f"(b) and (d) alone on the GPU (the other servers stopped), {ov['rounds']} rounds per "
        f"batch size after a warm-up round, the two servers alternating (b d, d b, ...), "
        f"each round one batch of concurrent streamed greedy requests of "
        f"{ov['max_new_tokens']} new tokens. Time per output token: median over requests of "
        "(last token time - first token time) / tokens in between; decode throughput: those "
        "tokens over the span from the first request's first token to the last request's "
        "last token. Medians over rounds, with the range over rounds:"
    )
    w("")
    w(
        "| batch (graph) | TPOT (b) ms | TPOT (d) ms | TPOT (b)/(d) "
        "| decode tok/s (b) | decode tok/s (d) | throughput (b)/(d) |"
    )
    w("| --- | --- | --- | --- | --- | --- | --- |")
    capture = sorted(server["capture_bs"])
    for size, s in ov["sizes"].items():
        b, d = s["b"], s["d"]
        graph = next((c for c in capture if c >= int(size)), "eager")
        w(
            f"| {size} ({graph}) | {b['tpot_ms_median']:.3f} ({_spread(b['tpot_ms'])}) | "
            f"{d['tpot_ms_median']:.3f} ({_spread(d['tpot_ms'])}) | "
            f"{s.get('tpot_ratio_b_over_d', '-')} | "
            f"{b['decode_tok_s_median']:.0f} ({_spread(b['decode_tok_s'], '.0f')}) | "
            f"{d['decode_tok_s_median']:.0f} ({_spread(d['decode_tok_s'], '.0f')}) | "
            f"{s.get('throughput_ratio_b_over_d', '-')} |"
        )
    w("")
    texts, faster, slower = [], [], []
    for size, st in ov["sizes"].items():
        ratio = st.get("tpot_ratio_b_over_d")
        if ratio is None:
            continue
        band = max(
            (max(st[x]["tpot_ms"]) - min(st[x]["tpot_ms"])) / st[x]["tpot_ms_median"]
            for x in ("b", "d")
        )
        texts.append(f"batch {size}: {ratio - 1:+.1%} against a {band:.0%} spread")
        if abs(ratio - 1) > band:
            (faster if ratio < 1 else slower).append(f"batch {size}")
    layers = doc["model"]["config"].get("num_hidden_layers")
    w(
        f"The plugin adds one mask launch per MoE layer ({layers} layers here) inside the "
        "captured graph, and sends padded rows to expert 0 where without it they keep the "
        "router's picks"
        + (" (the table above shows both)" if counted else "")
        + ". Each ratio's distance from 1, against the larger round-to-round spread (max - min "
        "over median) of the two servers' TPOT: " + "; ".join(texts) + ". "
    )
    if not faster and not slower:
        out[-1] += "Every difference is inside the noise: this run resolves no cost of the plugin."
    if faster:
        out[-1] += (
            f"(b) faster than (d) beyond the spread at {', '.join(faster)}: this run does not "
            "say why, and it is no evidence that the plugin speeds decoding up (where padded "
            "rows go changes the MoE's work"
            + (", and the test tooling's counting launch runs in both servers" if counted else "")
            + "). "
        )
    if slower:
        out[-1] += (
            f"(b) slower than (d) beyond the spread at {', '.join(slower)}: up to that much "
            "is the plugin's cost in this run. "
        )
    out[-1] = out[-1].rstrip()
    w("")
    return out


def common_tail(records: list[tuple[str, str, dict]]) -> list[str]:
    out: list[str] = []
    w = out.append
    w("## What this does not cover")
    w("")
    for _, _, doc in records:
        for att in doc.get("attempts", []):
            if not att.get("served"):
                why = att.get("skipped") or "its servers did not come up"
                w(f"- The `{att['model']}` config in that call: not served ({why}).")
    w(
        "- AMD hardware: the MoE kernels here are CUDA's (Triton fused MoE with sgl-kernel's "
        "align), not aiter's; the damage in (c) is what CUDA's kernels do with AMD-like garbage."
    )
    w(
        "- aiter's routing: with aiter, 0.5.13.post1 appends the fused shared expert inside "
        "`_post_process_topk_ids` (`fused_append_shared_experts`, after the plugin's pre-mask, "
        "then zeroes padded weights again); here the router writes that column itself, before "
        "the hook, so the plugin's mask covers it."
    )
    w(
        "- Other releases: this is 0.5.13.post1 (`weights-only`); the compatibility matrix "
        "(docs/compat.md) covers the forms on the CPU."
    )
    w(
        "- The count's plumbing in a real expert-parallel server: it is supplied by the test "
        "tooling (see above), the way SGLang's expert-parallel paths supply it."
    )
    w("")
    return out


def _guard_counts(run: dict) -> str:
    stats = (run.get("plugin_stats") or {}).get("guard")
    if not stats:
        return "none recorded"
    return (
        f"calls={stats['calls']} out_of_range={stats['out_of_range']} "
        f"past_count={stats['past_count']} real_out_of_range={stats['real_out_of_range']}"
    )


def guard_intro(guard: list[tuple[str, str, dict]]) -> list[str]:
    out: list[str] = []
    w = out.append
    w("# The guard alone, in a real server: no count, SGLang's MoE through aiter's entry")
    w("")
    w(
        "Most deployments that pad with garbage hand aiter no count (DP attention with TP MoE, "
        "EAGLE/MTP drafts, ATOM's DP pads, vLLM's -1 rows): the guard at aiter's `fused_moe` "
        "entry is then the only protection. These runs show it in "
        "`python -m sglang.launch_server` of SGLang 0.5.13.post1, for "
        + " and ".join(f"the {title}" for _, title, _ in guard)
        + ' (one device call each, `HARNESS_ARGS="--runs f,g,h ..."`; '
        "benchmarks/server/README.md). Three servers run side by side:"
    )
    w("")
    w("| run | plugin | padded rows of the router's output | count passed |")
    w("| --- | --- | --- | --- |")
    for label, run in guard[0][2]["runs"].items():
        rows = "garbage ids, NaN weights (AMD-like)" if run["inject"] else "as routed"
        w(f"| {label} | {'on' if run['plugin'] else 'off'} | {rows} | {_yes(run['pass_count'])} |")
    w("")
    w(
        "`SGLANG_AMD_MOE_TEST_AITER=1` (benchmarks/server/site/sitecustomize.py) makes SGLang's "
        "own unquantized MoE layer take its aiter path, as on ROCm with `SGLANG_USE_AITER=1`: "
        "`UnquantizedFusedMoEMethod` builds its aiter runner and every MoE call goes to "
        "`aiter.fused_moe.fused_moe`. aiter needs ROCm, so `site/aiter_server/aiter` stands in "
        "for the modules SGLang imports on that path, with aiter's Python signatures "
        "(`fused_moe` -> `fused_moe_` -> `_fused_moe_impl`, the function the guard wraps); its "
        "MoE is plain torch, and an expert id outside `[0, E)` is a device fault there "
        "(CUDA's device-side bounds assert of an index lookup), as it is in aiter's kernels, "
        "never a silent clamp. The router writes garbage into padded rows of every replay "
        "(`SGLANG_AMD_MOE_TEST_INJECT=1`); no count reaches `TopK` or aiter."
    )
    w("")
    w(
        "The guard's own start-up line in (f) (in each scheduler's log) says `SGLang's MoE does "
        "not reach it (--moe-runner-backend triton: ...)`: the plugin reads the runner backend "
        "from the command line, every server of this harness is launched with "
        "`--moe-runner-backend triton`, and the test switch moves the unquantized layer onto "
        "aiter's path inside the process, which the plugin cannot see. The counters below show "
        "the guard saw the calls. On ROCm, `SGLANG_USE_AITER=1` without `--moe-runner-backend` "
        "reads `reaches it`."
    )
    w("")
    return out


def _guard_tally(doc: dict) -> str:
    """What the guard's counters in (f) agree with, from the same record: the ids out of
    range that the test tooling counted in the padded rows ``TopK`` handed the MoE, and the
    calls (the stand-in's calls from Python, plus each replay of every MoE layer)."""
    run = doc["runs"].get("f") or {}
    stats = (run.get("plugin_stats") or {}).get("guard")
    counts = (run.get("topk_after_hook") or {}).get("counts") or {}
    if not stats or not counts:
        return ""
    routed = (counts.get("padded_routed") or {}).get("ids_out_of_range", 0)
    shared = (counts.get("padded_shared") or {}).get("ids_out_of_range", 0)
    same = "the same number as" if stats["out_of_range"] == routed + shared else "against"
    text = (
        f"In (f) the guard counted {stats['out_of_range']} ids out of range, {same} the test "
        f"tooling's count of out-of-range ids in the padded rows `TopK` handed the MoE "
        f"({routed} routed, {shared} in the fused shared expert's column)"
    )
    layers = (doc.get("model") or {}).get("config", {}).get("num_hidden_layers")
    replays = (run.get("padding") or {}).get("replays")
    python_calls = run.get("aiter_calls")
    graphs = max((len(r.get("captured_bs") or []) for r in run.get("records") or []), default=0)
    if layers and graphs and replays is not None and python_calls is not None:
        total = python_calls - graphs * layers + replays * layers
        text += (
            f"; its {stats['calls']} calls "
            + ("are" if total == stats["calls"] else f"against {total},")
            + f" the stand-in's {python_calls} calls made from Python, less the "
            f"{graphs * layers} made while capturing the {graphs} graphs (a captured launch "
            f"counts when it is replayed), plus {replays} recorded replays x {layers} MoE layers"
        )
    return text + "."


def guard_section(rel: str, title: str, doc: dict) -> list[str]:
    env, runs = doc["environment"], doc["runs"]
    tree = env.get("bundle", {}).get("tree", {})
    gpu = env.get("gpu", "?")
    out: list[str] = []
    w = out.append
    w(f"## Guard alone: {title}")
    w("")
    w(
        f"From `{rel}`: SGLang {env.get('sglang')} on one {gpu.split(',')[0]} "
        f"(torch {env.get('torch')}, Triton {env.get('triton')}; sglang-amd-moe "
        f"{env.get('sglang_amd_moe')} built from commit `{tree.get('commit', '?')[:12]}`"
        f"{' with uncommitted changes' if tree.get('dirty') else ''}); compared with run "
        f"({doc.get('reference', '?')})."
    )
    w("")
    _result_lines(w, doc.get("equal") or None, runs)
    w("")
    w("| run | served | same tokens as the reference | damage | aiter `fused_moe` calls "
      "(stand-in) | the guard's counters | the plugin's log lines |")  # fmt: skip
    w("| --- | --- | --- | --- | --- | --- | --- |")
    for label, run in runs.items():
        w(
            f"| {label} | {_served(run)} | {_same_as_b(run)} | {_damage(run)} | "
            f"{run.get('aiter_calls', 0)} | {_guard_counts(run)} | {_plugin_lines(run)} |"
        )
    w("")
    w(
        "The counters are the plugin's own (`sglang_amd_moe.runtime.stats`: added to on the GPU "
        "inside the guard's launch, graph replays included), read by the scheduler's record "
        "thread once a second after the first replay; `calls` counts MoE calls (layers x "
        "forward passes), `out_of_range` the padded rows' ids the guard turned into expert 0 "
        "with weight 0 (docs/reference.md: the counters)."
    )
    w("")
    tally = _guard_tally(doc)
    if tally:
        w(tally)
        w("")
    if doc.get("reparsed"):
        r = doc["reparsed"]
        w(
            f"The log lines column was re-read from the committed server logs by `{r['by']}` "
            f"({', '.join(f'`{x}`' for x in r['fields'])}): {r['why']}. "
            "Every other field is as the harness wrote it on the GPU machine."
        )
        w("")
    return out


def render(
    records: list[tuple[str, str, dict]], guard: list[tuple[str, str, dict]] | None = None
) -> str:
    """The whole doc from the records (as :func:`load_records` returns them) and the
    guard-only records."""
    out = intro(records)
    for rel, title, doc in records:
        out.extend(section(rel, title, doc))
    if guard:
        out.extend(guard_intro(guard))
        for rel, title, doc in guard:
            out.extend(guard_section(rel, title, doc))
    out.extend(common_tail(records))
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DOC)
    args = p.parse_args()
    args.out.write_text(render(load_records(), load_records(records=GUARD_RECORDS)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The check's tiny MoE as a Hugging Face DeepSeek-V3 checkpoint, for the real-server test.

``test_launch_server.py`` launches ``python -m sglang.launch_server`` on this checkpoint:
the weights of :class:`sglang_amd_moe.diagnostics.e2e.model.TinyMoE` (the model the
check runs), attention weights random from the same seed, and a word-level tokenizer
built locally with ``tokenizers`` (nothing downloaded). Test tooling: it needs
``safetensors`` and ``tokenizers`` (the ``test`` extra), which the package does not.

Also a script, to launch a server by hand (docs/reference.md, "Running it")::

    python tests/server/tiny_checkpoint.py DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from sglang_amd_moe.diagnostics.e2e.model import TinyMoE, TinyMoEConfig


def hf_config(cfg: TinyMoEConfig) -> dict[str, Any]:
    """A DeepSeek-V3 ``config.json`` for the checkpoint (MLA attention, tiny sizes)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden,
        "intermediate_size": 4 * cfg.moe_inter,
        "moe_intermediate_size": cfg.moe_inter,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_shared_experts": cfg.shared_experts,
        "n_routed_experts": cfg.routed_experts,
        "num_experts_per_tok": cfg.top_k,
        "n_group": cfg.n_group,
        "topk_group": cfg.topk_group,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "first_k_dense_replace": 0,
        "moe_layer_freq": 1,
        "q_lora_rank": None,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        # YaRN as DeepSeek-V3 ships it (SGLang's CPU rope for MLA requires a rope_scaling)
        "rope_scaling": {
            "type": "yarn",
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 128,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "num_nextn_predict_layers": 0,
    }


_WORDS = (
    "the a an one two three four five six seven eight nine ten red green blue cat dog "
    "bird fish tree river stone cloud sun moon star rain wind fire water earth light dark "
    "day night morning evening is was are were has have had can will shall may might must "
    "and or but if then else when where what who why how this that these those here there "
    "up down left right in out on off over under big small old new hot cold fast slow good "
    "bad yes no"
).split()


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """A word-level tokenizer built locally with ``tokenizers`` (nothing downloaded)."""
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(specials)}
    for w in _WORDS:
        vocab.setdefault(w, len(vocab))
    i = 0
    while len(vocab) < vocab_size:
        vocab.setdefault(f"w{i}", len(vocab))
        i += 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return tok


def write_checkpoint(model: TinyMoE, out_dir: str | Path) -> list[Path]:
    """Write ``model`` as a Hugging Face DeepSeek-V3 checkpoint SGLang can load:
    ``config.json``, ``model.safetensors`` (bf16; the MoE weights are the check's, the
    attention weights random from the same seed), a word-level tokenizer built here, and
    ``tiny_moe.json`` recording the check's config. Returns the files written."""
    cfg = model.cfg
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf = hf_config(cfg)
    g = torch.Generator().manual_seed(cfg.seed + 1)

    def rnd(*shape: int, std: float = 0.02) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    h = cfg.hidden
    heads = hf["num_attention_heads"]
    qk_head = hf["qk_nope_head_dim"] + hf["qk_rope_head_dim"]
    t: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": model.embed.cpu(),
        "model.norm.weight": model.norm.cpu(),
        "lm_head.weight": model.lm_head.cpu(),
    }
    for layer in range(cfg.layers):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = torch.ones(h)
        t[p + "post_attention_layernorm.weight"] = torch.ones(h)
        t[p + "self_attn.q_proj.weight"] = rnd(heads * qk_head, h)
        t[p + "self_attn.kv_a_proj_with_mqa.weight"] = rnd(
            hf["kv_lora_rank"] + hf["qk_rope_head_dim"], h
        )
        t[p + "self_attn.kv_a_layernorm.weight"] = torch.ones(hf["kv_lora_rank"])
        t[p + "self_attn.kv_b_proj.weight"] = rnd(
            heads * (hf["qk_nope_head_dim"] + hf["v_head_dim"]), hf["kv_lora_rank"]
        )
        t[p + "self_attn.o_proj.weight"] = rnd(h, heads * hf["v_head_dim"])
        t[p + "mlp.gate.weight"] = model.gate[layer].cpu()
        t[p + "mlp.gate.e_score_correction_bias"] = model.bias[layer].cpu()
        w13, w2 = model.w13[layer].cpu(), model.w2[layer].cpu()
        i = cfg.moe_inter
        for e in range(cfg.routed_experts):
            q = f"{p}mlp.experts.{e}."
            t[q + "gate_proj.weight"] = w13[e, :i]
            t[q + "up_proj.weight"] = w13[e, i:]
            t[q + "down_proj.weight"] = w2[e]
        e = cfg.routed_experts
        q = f"{p}mlp.shared_experts."
        t[q + "gate_proj.weight"] = w13[e, :i]
        t[q + "up_proj.weight"] = w13[e, i:]
        t[q + "down_proj.weight"] = w2[e]
    t = {k: v.to(torch.bfloat16).contiguous() for k, v in t.items()}
    # the bias stays fp32, as DeepSeek-V3 checkpoints store it
    for layer in range(cfg.layers):
        name = f"model.layers.{layer}.mlp.gate.e_score_correction_bias"
        t[name] = model.bias[layer].cpu().float().contiguous()
    files = []
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    files.append(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    files.append(out / "config.json")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, indent=2) + "\n"
    )
    files.append(out / "generation_config.json")
    tok = build_tokenizer(cfg.vocab_size)
    tok.save(str(out / "tokenizer.json"))
    files.append(out / "tokenizer.json")
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": hf["max_position_embeddings"],
        "add_bos_token": False,
        "chat_template": (
            "{% for m in messages %}{{ m['content'] }}{% if not loop.last %} {% endif %}"
            "{% endfor %}"
        ),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    files.append(out / "tokenizer_config.json")
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"},
            indent=2,
        )
        + "\n"
    )
    files.append(out / "special_tokens_map.json")
    (out / "tiny_moe.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    files.append(out / "tiny_moe.json")
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path, help="directory to write the checkpoint into")
    args = p.parse_args(argv)
    for f in write_checkpoint(TinyMoE(TinyMoEConfig()), args.out_dir):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The real-server test's checkpoint (``tiny_checkpoint.py``) loads with transformers."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from tiny_checkpoint import write_checkpoint
from transformers import AutoConfig, AutoTokenizer

from sglang_amd_moe.diagnostics.e2e.model import TinyMoE, TinyMoEConfig


def test_write_checkpoint_loads_with_transformers(tmp_path: Path) -> None:
    cfg = TinyMoEConfig()
    files = write_checkpoint(TinyMoE(cfg), tmp_path)
    assert {f.name for f in files} >= {"config.json", "model.safetensors", "tokenizer.json"}
    hf = AutoConfig.from_pretrained(tmp_path)
    assert hf.model_type == "deepseek_v3" and hf.n_routed_experts == cfg.routed_experts
    assert hf.num_experts_per_tok == cfg.top_k and hf.n_group == cfg.n_group
    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = tok("the cat is red").input_ids
    assert len(ids) == 4 and tok.decode(ids) == "the cat is red"
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        bias = f.get_tensor("model.layers.0.mlp.gate.e_score_correction_bias")
        assert bias.dtype == torch.float32
    experts = [k for k in keys if ".mlp.experts." in k]
    assert len(experts) == cfg.layers * cfg.routed_experts * 3
    assert "model.layers.3.mlp.shared_experts.down_proj.weight" in keys

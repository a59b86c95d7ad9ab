"""A small DeepSeek-style MoE model and an aiter-like MoE consumer, for ``sglang-amd-moe check``.

Why this exists: the users' symptom was end to end (GSM8K 0.94 -> 0.1 on AMD), so the
check runs the whole path on a model small enough for a CPU: hidden states -> router ->
SGLang's real ``select_experts`` / ``_post_process_topk_ids`` -> an MoE consumer shaped
like aiter's (sort, per-expert MLP over blocks of sorted slots, weighted reduce) -> the
next layer. Everything is built in memory from a fixed seed; nothing is downloaded.

Two pieces are emulations of AMD device code that cannot run here. Each says exactly
what it emulates and what it assumes, and each is used only where the real code cannot be:

* :func:`hip_router_for` - the routing SGLang gets on AMD for a row whose router scores
  are NaN (a padded CUDA-graph row holding garbage activations). Real rows are routed by
  SGLang's own ``biased_grouped_topk_impl`` (the DeepSeek grouped router).
* :func:`legacy_hip_sort` - what aiter's pre-fix MXFP4 sort kernel does with expert ids
  outside ``[0, NE)``. In-range ids are sorted by this package's
  :func:`sglang_amd_moe.kernels.mxfp4_moe_sort` (or its torch reference).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "TinyMoEConfig",
    "TinyMoE",
    "AiterLikeMoE",
    "ConsumerStats",
    "hip_router_for",
    "legacy_hip_sort",
    "rows_matmul",
    "write_checkpoint",
]


@dataclass(frozen=True)
class TinyMoEConfig:
    """Shape of the check's model: DeepSeek-V3-like routing, tiny sizes."""

    vocab_size: int = 512
    hidden: int = 256
    moe_inter: int = 64
    layers: int = 4
    routed_experts: int = 64
    shared_experts: int = 1
    top_k: int = 6
    n_group: int = 8
    topk_group: int = 4
    block_size: int = 16  # MB of aiter's inline MXFP4 sort (prologue 0)
    seed: int = 0

    @property
    def num_experts(self) -> int:
        """NE as aiter counts it: routed plus shared (e.g. 513 = 512 + 1)."""
        return self.routed_experts + self.shared_experts

    @property
    def slots(self) -> int:
        """TOPK as aiter counts it: routed top-k plus one slot per shared expert."""
        return self.top_k + self.shared_experts


class TinyMoE:
    """The model's weights (fp32) and its layer loop; routing and MoE are plugged in.

    A layer is ``h = h + MoE(h)`` with the router reading ``h`` directly (no norm in
    front of it, so garbage in padded rows reaches the router and the experts as it is).
    The shared expert is fused as expert id ``routed_experts`` with weight 1, the way
    SGLang appends it for aiter (``fused_append_shared_experts``).
    """

    def __init__(self, cfg: TinyMoEConfig, device: str | torch.device = "cpu") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        g = torch.Generator().manual_seed(cfg.seed)
        h, i, e = cfg.hidden, cfg.moe_inter, cfg.num_experts

        def randn(*shape: int, std: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) * std).to(self.device)

        self.embed = randn(cfg.vocab_size, h, std=1.0)
        self.gate = [randn(cfg.routed_experts, h, std=1 / math.sqrt(h)) for _ in range(cfg.layers)]
        self.bias = [randn(cfg.routed_experts, std=0.05) for _ in range(cfg.layers)]
        # w13 = [gate_proj; up_proj] as aiter stores it, w2 = down_proj.
        self.w13 = [randn(e, 2 * i, h, std=1 / math.sqrt(h)) for _ in range(cfg.layers)]
        self.w2 = [randn(e, h, i, std=0.5 / math.sqrt(i)) for _ in range(cfg.layers)]
        self.norm = torch.ones(h, device=self.device)
        self.lm_head = randn(cfg.vocab_size, h, std=1 / math.sqrt(h))

    def forward(
        self,
        hidden: torch.Tensor,
        route: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        moe: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """Run all layers. ``route(layer, h, logits) -> (weights, ids)`` of the routed
        experts; ``moe(layer, h, ids, weights) -> delta`` with the shared slot appended."""
        cfg = self.cfg
        h = hidden
        for layer in range(cfg.layers):
            logits = rows_matmul(h, self.gate[layer].t(), cfg.block_size)
            weights, ids = route(layer, h, logits)
            m = h.shape[0]
            shared_ids = torch.arange(
                cfg.routed_experts, cfg.num_experts, dtype=ids.dtype, device=ids.device
            ).expand(m, cfg.shared_experts)
            shared_w = torch.ones(m, cfg.shared_experts, dtype=weights.dtype, device=weights.device)
            ids = torch.cat([ids, shared_ids], dim=1).contiguous()
            weights = torch.cat([weights, shared_w], dim=1).contiguous()
            h = h + moe(layer, h, ids, weights)
        return h


def rows_matmul(x: torch.Tensor, w_t: torch.Tensor, tile: int) -> torch.Tensor:
    """``x @ w_t`` computed in fixed tiles of ``tile`` rows (one batched GEMM).

    A GEMM library picks its kernel by problem shape, so ``x @ w`` for 5 rows and for 8
    rows may round a shared row differently. Fixed tiles keep every row's result
    independent of how many rows the batch has, as a GPU's tiled GEMM does; that is what
    lets the check demand bit-identical real rows.
    """
    m = x.shape[0]
    t = -(-m // tile)
    xp = torch.zeros(t * tile, x.shape[1], dtype=x.dtype, device=x.device)
    xp[:m] = x
    out = torch.bmm(xp.view(t, tile, -1), w_t.unsqueeze(0).expand(t, -1, -1).contiguous())
    return out.reshape(t * tile, -1)[:m]


# ----------------------------------------------------------------------------- router


def stale_lds_words(rows: int, cols: int, seed: int, device: torch.device) -> torch.Tensor:
    """What the check puts where device code would read uninitialized shared memory:
    int32 words from a fixed seed (so every run, and the tests, see the same garbage)."""
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**31), 2**31, (rows, cols), generator=g, dtype=torch.int64)
    return words.to(torch.int32).to(device)


def hip_router_for(
    topk_module: Any, cfg: TinyMoEConfig, bias: torch.Tensor, seed: int
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A ``custom_routing_function`` for SGLang's ``TopKConfig``: DeepSeek grouped routing
    as SGLang runs it on AMD, including what the HIP router does with a NaN row.

    Rows with a finite score are routed by SGLang's own ``biased_grouped_topk_impl`` (the
    module's function, so the release under test decides the math; every release from
    0.5.10 to 0.5.23 has it).

    Rows whose scores are all NaN (garbage activations in padded rows) get what aiter's
    HIP ``biased_grouped_topk_kernel`` (``csrc/kernels/topk_softmax_kernels_group.cu``)
    gives them: it selects with ``if (score > max_val)`` starting from ``-INFINITY`` and
    stores a choice only ``if (max_idx != -1)``. NaN never compares greater, so nothing
    is stored and the row's ``topk_ids``/``topk_weights`` are copied from the kernel's
    uninitialized LDS arrays. The check fills those with :func:`stale_lds_words` (a
    fixed seed; on the device it is whatever the last user of that LDS left there), the
    ids as int32 and the weights as the same kind of words read as float32.
    """
    impl = getattr(topk_module, "biased_grouped_topk_impl", None)
    if impl is None:
        raise RuntimeError(
            f"{getattr(topk_module, '__file__', topk_module)} has no biased_grouped_topk_impl: "
            "the check routes with SGLang's own grouped router and cannot run on this release"
        )
    impl = getattr(impl, "_torchdynamo_orig_callable", impl)
    calls = {"n": 0}

    def route(
        hidden_states: torch.Tensor,
        gating_output: torch.Tensor,
        topk: int,
        renormalize: bool,
        **_: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w, ids = impl(
            hidden_states,
            gating_output,
            bias,
            topk,
            renormalize,
            cfg.n_group,
            cfg.topk_group,
        )
        w, ids = w.float().contiguous(), ids.to(torch.int32).contiguous()
        nan_rows = torch.isnan(gating_output.float()).all(dim=-1)
        if bool(nan_rows.any()):
            k = ids.shape[1]
            rows = int(nan_rows.sum())
            calls["n"] += 1
            stale_ids = stale_lds_words(rows, k, seed * 1000 + calls["n"], ids.device)
            stale_w = stale_lds_words(rows, k, seed * 1000 + 500 + calls["n"], ids.device)
            ids[nan_rows] = stale_ids
            w[nan_rows] = stale_w.view(torch.float32)
        return w, ids

    return route


# --------------------------------------------------------------------------- consumer


@dataclass
class SortBuffers:
    """The sort's outputs, sized as aiter's ``_adaptive_moe_sort`` sizes them."""

    sorted_token_ids: torch.Tensor
    sorted_expert_ids: torch.Tensor
    cumsum: torch.Tensor  # num_valid_ids[2]
    sorted_weights: torch.Tensor
    reverse_sorted: torch.Tensor
    m_indices: torch.Tensor

    @classmethod
    def allocate(cls, m: int, k: int, ne: int, mb: int, device: torch.device) -> SortBuffers:
        """Zero-filled (aiter uses ``torch.empty``; slots nobody writes read as 0 here)."""
        # Imported here: importing the kernels imports Triton, which must come after the
        # check has chosen whether Triton interprets.
        from sglang_amd_moe.kernels.utils import max_sorted_size

        n = max_sorted_size(m, k, ne, mb)
        i32 = {"dtype": torch.int32, "device": device}
        return cls(
            torch.zeros(n, **i32),
            torch.zeros(n // mb, **i32),
            torch.zeros(2, **i32),
            torch.zeros(n, dtype=torch.float32, device=device),
            torch.zeros(m * k, **i32),
            torch.zeros(n, **i32),
        )


@dataclass
class ConsumerStats:
    """What one MoE call saw; summed over layers by the check."""

    out_of_range_ids: int = 0  # ids outside [0, NE) in the rows the sort read
    oob_stores: int = 0  # legacy sort stores that fell outside the output buffers
    oob_reads: int = 0  # reverse_sorted entries outside the computed slots
    sorts: dict[str, int] = field(default_factory=dict)  # which sort ran, how often

    def add(self, other: ConsumerStats) -> None:
        self.out_of_range_ids += other.out_of_range_ids
        self.oob_stores += other.oob_stores
        self.oob_reads += other.oob_reads
        for k, v in other.sorts.items():
            self.sorts[k] = self.sorts.get(k, 0) + v


def legacy_hip_sort(
    topk_ids: torch.Tensor,
    topk_weight: torch.Tensor,
    bufs: SortBuffers,
    m: int,
    ne: int,
    k: int,
    mb: int,
    threads_per_cta: int = 256,
) -> int:
    """Emulate aiter's MXFP4 sort as it was before it learned to drop bad ids.

    What is emulated: ``sort_subkernel`` of ``csrc/kernels/mxfp4_moe/moe_aux/
    moe_sort_quant.cuh`` before aiter added ``is_valid_expert`` (e.g. aiter commit
    f1a213f). It indexes three LDS tables with the raw expert id, with no bounds check:
    ``atomicAdd(&count[eid], 1)``, then ``pos = atomicAdd(&counter[eid], 1)`` and
    ``sp = cumsum[eid] + pos``, and stores the pair at ``sp``; ``fill_padding_gaps`` then
    pads each expert's range from ``count[e]`` up to ``cumsum[e + 1]``.

    What is assumed, because the device behaviour is undefined: the three tables lie in
    one LDS array in declaration order (``count[max(NE, 256)]``, ``cumsum[NE + 1]``,
    ``counter[NE]``); an access outside that array reads 0 and drops the write (AMD LDS
    bounds behaviour); ``count[NE:]`` (never zeroed by the kernel) reads 0; atomics land
    in ascending pair order; a global store outside its buffer is dropped (and counted).

    For ids in ``[0, NE)`` the result equals the output contract of BRIEF with pairs in
    ascending order within an expert, i.e. what this package's reference writes (the
    tests check that). Returns the number of dropped global stores.
    """
    ids = topk_ids[:m].reshape(-1).tolist()
    weights = topk_weight[:m].reshape(-1).tolist()
    n_count = max(ne, threads_per_cta)
    base_count, base_cumsum, base_counter = 0, n_count, n_count + ne + 1
    lds = [0] * (base_counter + ne)

    def load(i: int) -> int:
        return lds[i] if 0 <= i < len(lds) else 0

    def atomic_add(i: int, v: int) -> int:
        old = load(i)
        if 0 <= i < len(lds):
            lds[i] = old + v
        return old

    # count_tokens_per_expert
    for eid in ids:
        atomic_add(base_count + eid, 1)
    # parallel_cumsum
    running = 0
    for e in range(ne):
        running += -(-lds[base_count + e] // mb) * mb
        lds[base_cumsum + e + 1] = running
        lds[base_counter + e] = 0
    # place_tokens
    st, mi, sw = [], [], []  # (index, value) stores, applied below
    rev = []
    dropped = 0
    n_slots = bufs.sorted_token_ids.numel()
    for i, eid in enumerate(ids):
        pos = atomic_add(base_counter + eid, 1)
        sp = load(base_cumsum + eid) + pos
        t, s = divmod(i, k)
        if 0 <= sp < n_slots:
            st.append((sp, (t & 0xFFFFFF) | ((s & 0xFF) << 24)))
            mi.append((sp, t & 0xFFFFFF))
            sw.append((sp, weights[i]))
        else:
            dropped += 3
        rev.append(sp)
    # fill_padding_gaps (runs after place_tokens: it overwrites what lies in a gap)
    sei = []
    for e in range(ne):
        cnt, start, end = lds[base_count + e], lds[base_cumsum + e], lds[base_cumsum + e + 1]
        for j in range(start + cnt, end):
            if 0 <= j < n_slots:
                st.append((j, m & 0xFFFFFF))
                mi.append((j, m & 0xFFFFFF))
                sw.append((j, 0.0))
            else:
                dropped += 3
        for b in range(start // mb, end // mb):
            if 0 <= b < bufs.sorted_expert_ids.numel():
                sei.append((b, e))
            else:
                dropped += 1

    def store(buf: torch.Tensor, pairs: list[tuple[int, float]]) -> None:
        if pairs:
            idx = torch.tensor([p[0] for p in pairs], dtype=torch.long)
            val = torch.tensor([p[1] for p in pairs], dtype=buf.dtype)
            cpu = buf.cpu()
            cpu[idx] = val  # later stores win, as in program order
            buf.copy_(cpu)

    store(bufs.sorted_token_ids, st)
    store(bufs.m_indices, mi)
    store(bufs.sorted_weights, sw)
    store(bufs.sorted_expert_ids, sei)
    bufs.reverse_sorted[: m * k] = torch.tensor(rev, dtype=torch.int64).clamp(
        -(2**31), 2**31 - 1
    ).to(torch.int32).to(bufs.reverse_sorted.device)
    bufs.cumsum[0] = lds[base_cumsum + ne]
    bufs.cumsum[1] = m
    return dropped


def _package_sort(device: torch.device) -> tuple[Callable[..., None], str]:
    """This package's sort and how it runs on ``device``: the Triton kernel on a GPU or
    under ``TRITON_INTERPRET=1`` (exact, slow on the CPU), else its torch reference
    (the kernel's own CPU fallback)."""
    from sglang_amd_moe import kernels
    from sglang_amd_moe.kernels.utils import triton_backend

    return kernels.mxfp4_moe_sort, f"sglang_amd_moe.kernels.mxfp4_moe_sort ({triton_backend(device)})"


class AiterLikeMoE:
    """An MoE consumer with aiter's data flow: sort -> per-block expert MLP -> reduce.

    * Sort: aiter's MXFP4 aux-sort contract (BRIEF), ``MB = 16``, ``NE`` and ``TOPK``
      counting the fused shared expert. It is this package's ``mxfp4_moe_sort`` (count
      honored when one is passed) whenever every id it reads is in ``[0, NE)``. Like the
      HIP kernels, the consumer cannot take other ids: it counts them and, instead of
      handing them to this package's sort (which would drop them, hiding the damage),
      runs :func:`legacy_hip_sort`, the emulation of what aiter's HIP sort did with them.
    * Stage 1: for each block of ``MB`` sorted slots below ``cumsum[0]``, the block's
      expert (``sorted_expert_ids``) runs ``silu(x W1) * (x W3) W2`` on the rows
      ``m_indices`` names; a row ``>= M`` loads nothing (reads 0), as the hardware drops
      loads past the activations.
    * Stage 2: token ``t`` sums ``sorted_weights[sp] * y[sp]`` over its slots in slot
      order, ``sp = reverse_sorted[t * TOPK + s]``; -1 is skipped; an ``sp`` outside the
      computed slots reads 0 and is counted.
    """

    def __init__(self, cfg: TinyMoEConfig, model: TinyMoE) -> None:
        self.cfg = cfg
        self.model = model
        self.sort_fn, self.sort_name = _package_sort(model.device)

    def __call__(
        self,
        layer: int,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        num_local_tokens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ConsumerStats]:
        cfg = self.cfg
        m, k = topk_ids.shape
        ne, mb = cfg.num_experts, cfg.block_size
        stats = ConsumerStats()
        n_read = m if num_local_tokens is None else min(max(int(num_local_tokens.item()), 0), m)
        read = topk_ids[:n_read]
        stats.out_of_range_ids = int(((read < 0) | (read >= ne)).sum())
        bufs = SortBuffers.allocate(m, k, ne, mb, x.device)
        if stats.out_of_range_ids:
            stats.oob_stores = legacy_hip_sort(topk_ids, topk_weights, bufs, m, ne, k, mb)
            stats.sorts["legacy HIP sort (emulated)"] = 1
        else:
            self.sort_fn(
                topk_ids=topk_ids,
                topk_weight=topk_weights,
                sorted_token_ids=bufs.sorted_token_ids,
                sorted_expert_ids=bufs.sorted_expert_ids,
                cumsum_tensor=bufs.cumsum,
                reverse_sorted=bufs.reverse_sorted,
                sorted_weights=bufs.sorted_weights,
                m_indices=bufs.m_indices,
                bf16_zero_out=torch.empty(0, 0, dtype=torch.bfloat16, device=x.device),
                bf16_zero_workspace=torch.empty(0, dtype=torch.uint8, device=x.device),
                M_logical=m,
                NE=ne,
                TOPK=k,
                D_HIDDEN=cfg.hidden,
                D_INTER=cfg.moe_inter,
                MB=mb,
                prologue=0,
                num_local_tokens=num_local_tokens,
            )
            stats.sorts[self.sort_name] = 1
        y = self._stage1(layer, x, bufs)
        out, stats.oob_reads = self._stage2(bufs, y, m, k)
        return out, stats

    def _stage1(self, layer: int, x: torch.Tensor, bufs: SortBuffers) -> torch.Tensor:
        cfg = self.cfg
        mb, i = cfg.block_size, cfg.moe_inter
        m = x.shape[0]
        n_slots = bufs.sorted_token_ids.numel()
        y = torch.zeros(n_slots, cfg.hidden, dtype=x.dtype, device=x.device)
        total = min(max(int(bufs.cumsum[0]), 0), n_slots)
        nb = total // mb
        if nb == 0:
            return y
        rows = bufs.m_indices[: nb * mb].long()
        rows = torch.where((rows >= 0) & (rows < m), rows, m)  # past the end: loads dropped
        x_ext = torch.cat([x, torch.zeros(1, x.shape[1], dtype=x.dtype, device=x.device)])
        a = x_ext[rows].view(nb, mb, -1)
        experts = bufs.sorted_expert_ids[:nb].long().clamp(0, cfg.num_experts - 1)
        w13 = self.model.w13[layer][experts]  # [nb, 2I, H]
        w2 = self.model.w2[layer][experts]  # [nb, H, I]
        gu = torch.bmm(a, w13.transpose(1, 2))
        act = torch.nn.functional.silu(gu[..., :i]) * gu[..., i:]
        y[: nb * mb] = torch.bmm(act, w2.transpose(1, 2)).reshape(nb * mb, -1)
        return y

    @staticmethod
    def _stage2(bufs: SortBuffers, y: torch.Tensor, m: int, k: int) -> tuple[torch.Tensor, int]:
        total = min(max(int(bufs.cumsum[0]), 0), y.shape[0])
        rev = bufs.reverse_sorted[: m * k].long().view(m, k)
        valid = (rev >= 0) & (rev < total)
        oob = int(((rev != -1) & ~valid).sum())
        idx = torch.where(valid, rev, 0)
        w = torch.where(valid, bufs.sorted_weights[idx], 0.0)
        yv = torch.where(valid[..., None], y[idx], 0.0)
        out = torch.zeros(m, y.shape[1], dtype=y.dtype, device=y.device)
        for s in range(k):  # slot order: the same sum for a token however it was padded
            out = out + w[:, s, None] * yv[:, s]
        return out, oob


# ------------------------------------------------------------------------- checkpoint


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


def build_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer built locally with ``tokenizers`` (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

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
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return tok


def write_checkpoint(model: TinyMoE, out_dir: str | Path) -> list[Path]:
    """Write ``model`` as a Hugging Face DeepSeek-V3 checkpoint SGLang can load:
    ``config.json``, ``model.safetensors`` (bf16; the MoE weights are the check's, the
    attention weights random from the same seed), a word-level tokenizer built here, and
    ``tiny_moe.json`` recording the check's config. Returns the files written."""
    from safetensors.torch import save_file

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

"""Stand-in for ``aiter/fused_moe.py`` in the tree aiter PR 7083 fixes (form ``count-rejected``).

aiter PR 7083's description describes this tree; the stored upstream history has no
version of it, so it is reconstructed from that text on top of the ``count-dropped`` stand-in
(``../count_dropped/fused_moe.py``, aiter main of Aug 2026), changing only what that
text says differs:

- ``_mxfp4_inline_sort_unsupported(...)`` exists and returns a reason (a string) for any
  call that carries ``num_local_tokens`` ("rejects every call that carries
  num_local_tokens"; PR 7083 removes ``num_local_tokens`` "from the options that
  _mxfp4_inline_sort_unsupported rejects"). Its other reasons follow the survey of
  upstream's dispatch (hidden/intermediate padding, shape outside
  ``MXFP4_MOE_SUPPORTED_SHAPES``); the padded-scale-stride check is not modelled, and the
  expert-parallel rejection mirrors main's ``NotImplementedError`` for the aux path.
  The exact signature is reconstructed: the parameters are keyword-only, the count is
  the ``num_local_tokens`` parameter, and ``None`` means supported.
- ``_fused_moe_impl`` (called by the custom op ``fused_moe_``, as on aiter main) asks it
  about a tuned inline-sort config (``_is_mxfp4_inline_sort``) and,
  on a reason, logs a warning and falls back to the default heuristics
  (``get_2stage_cfgs(..., _disable_inline_sort=True)``): the tuned rows are discarded.
- The inline-sort path passes ``num_local_tokens`` to ``moe_sorting`` (the description: "the
  rest of the inline-sort path already handles num_local_tokens"; the Opus aux sort
  reads it).
- ``_moe_sorting_impl`` takes the adaptive branch only while ``3 * M * topk < 4 *
  num_experts`` (the description's Opus aux sort takes ``3 * M * topk >= 4 * E``) and still
  drops the count there; ``aiter.mxfp4_moe_sort`` still has no ``num_local_tokens``.

Not reproduced, as in the ``count-dropped`` tree: tuned-config CSVs, quantisation and
the GEMM stages (``_fused_moe_impl`` stops after the sort and records it in
:data:`standin_sorts`).
"""

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import aiter
import torch
from aiter import ActivationType, QuantType, dtypes, logger
from aiter.jit.utils.torch_guard import torch_compile_guard


class GateMode(Enum):
    SEPARATED = "separated"
    INTERLEAVE = "interleave"


def is_flydsl_available():
    return False


BLOCK_SIZE_M = 32

_USE_CK_MOE_SORTING = os.environ.get("AITER_USE_CK_MOE_SORTING", "0") == "1"
_USE_FLYDSL_MOE_SORTING = os.environ.get("AITER_USE_FLYDSL_MOE_SORTING", "0") == "1"
_MOE_SORT_BACKEND = os.environ.get("AITER_MOE_SORT_BACKEND", "auto").lower()

#: Stand-in only: the MOEMetadata ``get_2stage_cfgs`` returns (None: default heuristics).
standin_metadata = None
#: Stand-in only: the outputs of each sort ``_fused_moe_impl`` ran, in call order.
standin_sorts: list = []


def _empty_bf16(device):
    return torch.empty((0,), dtype=dtypes.bf16, device=device)


def _moe_prepare_unsorted_input(topk_ids, topk_weights, model_dim, moebuf_dtype):
    raise NotImplementedError("aiter stand-in: the FLAT pass-through is not modelled")


def _adaptive_moe_sort(
    topk_ids,
    topk_weights,
    num_experts,
    topk,
    block_size,
    model_dim,
    *,
    atomic=False,
    emit_aux=False,
    moebuf_dtype=dtypes.bf16,
):
    device = topk_ids.device
    M = topk_ids.shape[0]
    BM = block_size
    pairs = M * topk
    active = min(num_experts, pairs)
    max_sorted = -(-(pairs + active * (BM - 1)) // BM) * BM

    def i32(n):
        return torch.empty(n, dtype=dtypes.i32, device=device)

    sorted_token_ids = i32(max_sorted)
    sorted_expert_ids = i32(max_sorted // BM)
    num_valid_ids = i32(2)
    sorted_weights = torch.empty(max_sorted, dtype=dtypes.fp32, device=device)
    reverse_sorted = i32(pairs)
    m_indices = i32(max_sorted)
    if atomic:
        moe_buf = torch.empty((M, model_dim), dtype=moebuf_dtype, device=device)
    else:
        moe_buf = torch.empty((0, 0), dtype=moebuf_dtype, device=device)
    empty_bf16 = _empty_bf16(device)

    aiter.mxfp4_moe_sort(
        topk_ids=topk_ids,
        topk_weight=topk_weights,
        sorted_token_ids=sorted_token_ids,
        sorted_expert_ids=sorted_expert_ids,
        cumsum_tensor=num_valid_ids,
        reverse_sorted=reverse_sorted,
        sorted_weights=sorted_weights,
        m_indices=m_indices,
        bf16_zero_out=moe_buf if (atomic and BM == 16) else empty_bf16,
        bf16_zero_workspace=empty_bf16,
        M_logical=M,
        NE=num_experts,
        TOPK=topk,
        D_HIDDEN=model_dim,
        D_INTER=1,
        MB=BM,
        prologue=0 if BM == 16 else 1,
    )
    out = (sorted_token_ids, sorted_weights, sorted_expert_ids, num_valid_ids, moe_buf)
    return (*out, m_indices, reverse_sorted) if emit_aux else out


def _moe_sorting_impl(
    topk_ids,
    topk_weights,
    num_experts,
    model_dim,
    moebuf_dtype,
    block_size,
    expert_mask,
    num_local_tokens,
    dispatch_policy,
    use_opus,
    return_local_topk_ids=False,
    accumulate=True,
    output_aux=False,
):
    device = topk_ids.device
    M, topk = topk_ids.shape

    if output_aux and _MOE_SORT_BACKEND not in ("opus", "ck") and 3 * M * topk < 4 * num_experts:
        # Upstream: the adaptive (fused) aux sort; num_local_tokens is not passed on.
        return _adaptive_moe_sort(
            topk_ids,
            topk_weights,
            num_experts,
            topk,
            block_size,
            model_dim,
            atomic=accumulate,
            emit_aux=True,
            moebuf_dtype=moebuf_dtype,
        )

    # CK / Opus standard path (both honour num_local_tokens).
    max_num_tokens_padded = int(topk_ids.numel() + num_experts * block_size - topk)
    max_num_m_blocks = int((max_num_tokens_padded + block_size - 1) // block_size)
    sorted_ids = torch.empty(max_num_tokens_padded, dtype=dtypes.i32, device=device)
    sorted_weights = torch.empty(max_num_tokens_padded, dtype=dtypes.fp32, device=device)
    sorted_expert_ids = torch.empty(max_num_m_blocks, dtype=dtypes.i32, device=device)
    num_valid_ids = torch.empty(2, dtype=dtypes.i32, device=device)
    if (expert_mask is not None) or accumulate:
        moe_buf = torch.empty((M, model_dim), dtype=moebuf_dtype, device=device)
    else:
        moe_buf = torch.empty((0, 0), dtype=moebuf_dtype, device=device)
    local_topk_ids = torch.empty_like(topk_ids) if return_local_topk_ids else None
    if return_local_topk_ids:
        use_opus = True

    aux_m_indices = None
    aux_reverse_sorted = None
    if output_aux:
        use_opus = True
        dispatch_policy = 1
        aux_m_indices = torch.empty(max_num_tokens_padded, dtype=dtypes.i32, device=device)
        aux_reverse_sorted = torch.empty(M * topk, dtype=dtypes.i32, device=device)

    if use_opus:
        ws_size = aiter.moe_sorting_opus_get_workspace_size(M, num_experts, topk, dispatch_policy)
        workspace = torch.empty(ws_size, dtype=torch.uint8, device=device) if ws_size > 0 else None
        aiter.moe_sorting_opus_fwd(
            topk_ids,
            topk_weights,
            sorted_ids,
            sorted_weights,
            sorted_expert_ids,
            num_valid_ids,
            moe_buf,
            num_experts,
            int(block_size),
            expert_mask,
            num_local_tokens,
            workspace,
            dispatch_policy,
            local_topk_ids,
            aux_m_indices,
            aux_reverse_sorted,
        )
    else:
        aiter.moe_sorting_fwd(
            topk_ids,
            topk_weights,
            sorted_ids,
            sorted_weights,
            sorted_expert_ids,
            num_valid_ids,
            moe_buf,
            num_experts,
            int(block_size),
            expert_mask,
            num_local_tokens,
            dispatch_policy,
        )
    ret = (sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids, moe_buf)
    if output_aux:
        return (*ret, aux_m_indices, aux_reverse_sorted)
    if return_local_topk_ids:
        return (*ret, local_topk_ids)
    return ret


def _flydsl_moe_sorting(*args, **kwargs):
    raise NotImplementedError("aiter stand-in: FlyDSL sorting is not modelled")


def moe_sorting(
    topk_ids,
    topk_weights,
    num_experts,
    model_dim,
    moebuf_dtype,
    block_size=BLOCK_SIZE_M,
    expert_mask=None,
    num_local_tokens=None,
    dispatch_policy=0,
    return_local_topk_ids=False,
    accumulate=True,
    flat=False,
    output_aux=False,
):
    if (
        not _USE_CK_MOE_SORTING
        and _USE_FLYDSL_MOE_SORTING
        and is_flydsl_available()
        and not return_local_topk_ids
        and not flat
        and not output_aux
        and dispatch_policy == 0
    ):
        return _flydsl_moe_sorting(
            topk_ids,
            topk_weights,
            num_experts,
            model_dim,
            moebuf_dtype,
            block_size,
            expert_mask,
            num_local_tokens,
            accumulate=accumulate,
        )
    if flat:
        return _moe_prepare_unsorted_input(topk_ids, topk_weights, model_dim, moebuf_dtype)
    try:
        return _moe_sorting_impl(
            topk_ids,
            topk_weights,
            num_experts,
            model_dim,
            moebuf_dtype,
            block_size,
            expert_mask,
            num_local_tokens,
            dispatch_policy,
            use_opus=not _USE_CK_MOE_SORTING,
            return_local_topk_ids=return_local_topk_ids,
            accumulate=accumulate,
            output_aux=output_aux,
        )
    except Exception as e:
        logger.error(f"Error in moe_sorting: {e}")
        raise e


@functools.lru_cache(maxsize=2048)
def get_inter_dim(w1_shape, w2_shape):
    E, _, model_dim = w1_shape
    E, model_dim, inter_dim = w2_shape
    return E, model_dim, inter_dim


def nextPow2(n):
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def get_padded_M(M):
    return nextPow2(M)


@dataclass
class MOEMetadata:
    stage1: Callable | None
    stage2: Callable | None
    block_m: int
    ksplit: int
    run_1stage: bool = False
    has_bias: bool = False
    use_non_temporal_load: bool = True
    fuse_quant: str = ""
    stage2_has_bias: bool = False
    flat: bool = False
    output_aux: bool = False
    prequant: bool = True


def _standin_stage(*args, kernelName2="", **kwargs):
    raise NotImplementedError("aiter stand-in: MoE GEMM stages are not modelled")


def _parse_mxfp4_g2_kname(kernelName2):
    return {"atomic": "_atomic" in kernelName2}


def standin_inline_sort_metadata(block_m=16, atomic=True):
    """Stand-in only: a tuned BM16 inline-sort (``output_aux``) config like aiter PR 7083's rows."""
    mode = "atomic" if atomic else "reduce"
    kn2 = f"flydsl_moe2_layout_afp4_wfp4_bf16_t{block_m}x128x128_{mode}_sbm{block_m}"
    return MOEMetadata(
        stage1=functools.partial(
            _standin_stage, kernelName1="flydsl_mxmoe_g1_a4w4_16x256x256_f16in"
        ),
        stage2=functools.partial(_standin_stage, kernelName2=kn2),
        block_m=block_m,
        ksplit=0,
        fuse_quant="fp4",
        output_aux=True,
        prequant=False,
    )


def get_2stage_cfgs(
    token,
    model_dim,
    inter_dim,
    expert,
    topk,
    dtype,
    q_dtype_a,
    q_dtype_w,
    q_type,
    use_g1u1,
    activation,
    doweight_stage1,
    hidden_pad,
    intermediate_pad,
    is_shuffled=True,
    gate_mode=GateMode.SEPARATED.value,
    is_ep=False,
    has_stage2_bias=False,
    _disable_inline_sort=False,
):
    if standin_metadata is not None and not (
        _disable_inline_sort and _is_mxfp4_inline_sort(standin_metadata)
    ):
        return standin_metadata
    return MOEMetadata(stage1=_standin_stage, stage2=_standin_stage, block_m=BLOCK_SIZE_M, ksplit=0)


def _is_mxfp4_inline_sort(metadata):
    """A BM16 inline-sort config: two-stage, not FLAT, aux sort outputs, fp4 fused quant."""
    return (
        not metadata.run_1stage
        and not metadata.flat
        and metadata.output_aux
        and metadata.fuse_quant == "fp4"
        and metadata.block_m == 16
    )


def _mxfp4_inline_sort_unsupported(
    metadata,
    *,
    model_dim,
    inter_dim,
    expert,
    topk,
    expert_mask=None,
    num_local_tokens=None,
    hidden_pad=0,
    intermediate_pad=0,
):
    """Why a tuned inline-sort config cannot serve this call (None: it can)."""
    if hidden_pad or intermediate_pad:
        return "hidden_pad/intermediate_pad"
    if not aiter.is_mxfp4_moe_shape_supported(expert, model_dim, inter_dim, topk):
        return f"shape {(expert, model_dim, inter_dim, topk)} not in MXFP4_MOE_SUPPORTED_SHAPES"
    if expert_mask is not None:
        return "expert_mask"
    if num_local_tokens is not None:
        return "num_local_tokens"
    return None


def fused_moe(
    hidden_states,
    w1,  # [expert(local_expert:EP), inter_dim*2, dim] N,K
    w2,  # [expert(local_expert:EP), dim, inter_dim]
    topk_weight,
    topk_ids,
    expert_mask: torch.Tensor | None = None,  # EP
    activation=ActivationType.Silu,
    quant_type=QuantType.No,
    doweight_stage1=False,
    w1_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    a1_scale: torch.Tensor | None = None,
    a2_scale: torch.Tensor | None = None,
    block_size_M=None,
    num_local_tokens: torch.Tensor | None = None,
    moe_sorting_dispatch_policy=0,
    dtype=None,
    hidden_pad=0,
    intermediate_pad=0,
    bias1=None,
    bias2=None,
    splitk=0,
    swiglu_limit=None,
    gate_mode: str | None = GateMode.SEPARATED.value,
):
    if not block_size_M:
        block_size_M = -1
    return fused_moe_(
        hidden_states=hidden_states,
        w1=w1,
        w2=w2,
        topk_weight=topk_weight,
        topk_ids=topk_ids,
        expert_mask=expert_mask,
        activation=activation.value,
        quant_type=quant_type.value,
        doweight_stage1=doweight_stage1,
        w1_scale=w1_scale,
        w2_scale=w2_scale,
        a1_scale=a1_scale,
        a2_scale=a2_scale,
        block_size_M=block_size_M,
        num_local_tokens=num_local_tokens,
        moe_sorting_dispatch_policy=moe_sorting_dispatch_policy,
        dtype=dtype,
        hidden_pad=hidden_pad,
        intermediate_pad=intermediate_pad,
        bias1=bias1,
        bias2=bias2,
        swiglu_limit=swiglu_limit,
        gate_mode=gate_mode,
    )


def fused_moe_fake(hidden_states, w1, w2, topk_weight, topk_ids, *args, dtype=None, **kwargs):
    M = topk_ids.shape[0]
    dtype = hidden_states.dtype if dtype is None else dtype
    return torch.empty((M, w2.shape[1]), dtype=dtype, device=topk_ids.device)


@torch_compile_guard(gen_fake=fused_moe_fake)
def fused_moe_(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weight: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_mask: torch.Tensor | None = None,
    activation: int = ActivationType.Silu.value,
    quant_type: int = QuantType.No.value,
    doweight_stage1: bool = False,
    w1_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    a1_scale: torch.Tensor | None = None,
    a2_scale: torch.Tensor | None = None,
    block_size_M: int = -1,
    num_local_tokens: torch.Tensor | None = None,
    moe_sorting_dispatch_policy: int = 0,
    dtype: torch.dtype | None = None,
    hidden_pad: int = 0,
    intermediate_pad: int = 0,
    bias1: torch.Tensor | None = None,
    bias2: torch.Tensor | None = None,
    swiglu_limit: float | None = None,
    gate_mode: str = GateMode.SEPARATED.value,
) -> torch.Tensor:
    # Upstream forwards every argument to _fused_moe_impl by keyword (and, in later
    # trees, builds an expert-parallel scatter context first, not modelled here).
    return _fused_moe_impl(**locals())


def _fused_moe_impl(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weight: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_mask: torch.Tensor | None = None,
    activation: int = ActivationType.Silu.value,
    quant_type: int = QuantType.No.value,
    doweight_stage1: bool = False,
    w1_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    a1_scale: torch.Tensor | None = None,
    a2_scale: torch.Tensor | None = None,
    block_size_M: int = -1,
    num_local_tokens: torch.Tensor | None = None,
    moe_sorting_dispatch_policy: int = 0,
    dtype: torch.dtype | None = None,
    hidden_pad: int = 0,
    intermediate_pad: int = 0,
    bias1: torch.Tensor | None = None,
    bias2: torch.Tensor | None = None,
    swiglu_limit: float | None = None,
    gate_mode: str = GateMode.SEPARATED.value,
) -> torch.Tensor:
    activation = ActivationType(activation)
    quant_type = QuantType(quant_type)
    if block_size_M == -1:
        block_size_M = None
    M, topk = topk_ids.shape
    E, model_dim, inter_dim = get_inter_dim(w1.shape, w2.shape)
    isG1U1 = inter_dim != w1.shape[1]
    global_E = E if expert_mask is None else expert_mask.numel()
    dtype = hidden_states.dtype if dtype is None else dtype
    metadata = get_2stage_cfgs(
        get_padded_M(M), model_dim, inter_dim, E, topk, dtype, w1.dtype, w1.dtype,
        quant_type, isG1U1, activation, doweight_stage1, hidden_pad, intermediate_pad,
    )  # fmt: skip
    if _is_mxfp4_inline_sort(metadata):
        reason = _mxfp4_inline_sort_unsupported(
            metadata,
            model_dim=model_dim,
            inter_dim=inter_dim,
            expert=E,
            topk=topk,
            expert_mask=expert_mask,
            num_local_tokens=num_local_tokens,
            hidden_pad=hidden_pad,
            intermediate_pad=intermediate_pad,
        )
        if reason is not None:
            logger.warning(
                f"[fused_moe] tuned MXFP4 inline-sort config unsupported ({reason}); "
                "using default heuristics"
            )
            metadata = get_2stage_cfgs(
                get_padded_M(M), model_dim, inter_dim, E, topk, dtype, w1.dtype, w1.dtype,
                quant_type, isG1U1, activation, doweight_stage1, hidden_pad, intermediate_pad,
                _disable_inline_sort=True,
            )  # fmt: skip
    block_size_M = metadata.block_m if block_size_M is None else int(block_size_M)

    if metadata.output_aux:
        if expert_mask is not None:
            raise NotImplementedError(
                "MXFP4 a4w4 FlyDSL port does not support expert-parallel yet "
                "(expert_mask is dropped by the output_aux sort path)."
            )
        _atomic = _parse_mxfp4_g2_kname(metadata.stage2.keywords.get("kernelName2", ""))["atomic"]
        sort = moe_sorting(
            topk_ids,
            topk_weight,
            global_E,
            model_dim,
            dtype,
            block_size_M,
            num_local_tokens=num_local_tokens,
            accumulate=_atomic,
            output_aux=True,
        )
    else:
        sort = moe_sorting(
            topk_ids,
            topk_weight,
            global_E,
            model_dim,
            dtype,
            block_size_M,
            expert_mask,
            num_local_tokens,
            moe_sorting_dispatch_policy,
            accumulate=True,
            flat=metadata.flat,
        )
    standin_sorts.append(sort)
    return sort[4]

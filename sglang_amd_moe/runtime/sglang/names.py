"""SGLang's vocabulary, written once: the function, its module, flags, predicates,
settings, and the names of the forms the plugin tells apart (docs/compat.md)."""

from __future__ import annotations

TOPK_MODULE = "sglang.srt.layers.moe.topk"
FUNCTION_NAME = "_post_process_topk_ids"
TARGET = f"{TOPK_MODULE}.{FUNCTION_NAME}"

#: Parameters the hook reads (the count, the tensors) and the EPLB dispatch info.
COUNT = "num_token_non_padded"
INFO = "expert_location_dispatch_info"
REQUIRED_PARAMS = ("topk_ids", "topk_weights", COUNT)

#: The logical-to-physical remap (a module global of topk).
REMAP = "topk_ids_logical_to_physical"
#: Names upstream has used for "a real expert-location map exists".
REMAP_PREDICATES = ("_eplb_remap_enabled", "is_expert_remapping_enabled")
#: Server settings that make the remap real; a module function reading one is the
#: EPLB predicate, whatever its name.
EPLB_SETTINGS = ("enable_eplb", "init_expert_location", "ep_num_redundant_experts")
#: Where a predicate reads those settings from.
ARGS_ACCESSORS = ("get_global_server_args", "get_server_args", "get_exec")
ARGS_MODULES = ("sglang.srt.server_args", "sglang.srt.runtime_context")

#: The module's platform flags (module names bound to ``sglang.srt.utils`` probes).
HIP_FLAG = "_is_hip"
NOT_HIP_FLAGS = ("_is_cuda", "_is_npu", "_is_xpu", "_is_cpu", "_is_musa", "_is_hpu")
HIP_CALLS = ("is_hip", "is_cuda_alike")
NOT_HIP_CALLS = ("is_cuda", "is_npu", "is_xpu", "is_cpu", "is_musa", "is_hpu")
#: The module flag that selects aiter (and its fused shared-expert append).
USE_AITER = "_use_aiter"

#: Questions about a DeepEP-style MoE backend: the probe's server has none (its shared
#: expert is appended by aiter's kernel, per token, not in per-rank slots).
NOT_DEEPEP = (
    "is_deepep_class_backend",
    "has_per_rank_fused_shared_slots",
    "uses_per_rank_fused_shared_slots",
)
#: Recorders and capturers the probe silences.
SILENT = ("get_global_experts_capturer", "get_global_expert_distribution_recorder")
CAPTURE = "capture_routed_experts_if_allowed"

FORMS: tuple[str, ...] = (
    "absent",  # no _post_process_topk_ids (SGLang 0.5.9 and earlier)
    "no-hip-handling",  # on HIP nothing touches padded rows (0.5.10-0.5.12.post1)
    "weights-only",  # on HIP padded weights zeroed, ids left (0.5.13, 0.5.13.post1)
    "mask-under-eplb-guard",  # padded ids filled only when EPLB remaps (unreleased)
    "fixed",  # padded ids 0 and weights 0 on every HIP path (0.5.14 and later)
    "unknown",  # a body the ledger does not know
)

#: Form -> the one-line action the plugin takes for it (printed by the audit too).
ACTIONS: dict[str, str] = {
    "absent": "nothing to hook: no _post_process_topk_ids in this SGLang (WARNING logged)",
    "no-hip-handling": (
        "hooked (mask padded ids to 0 and zero their weights, gated EPLB remap, "
        "re-zero after a shared-expert append)"
    ),
    "weights-only": "hooked (mask padded ids to 0, gated EPLB remap)",
    "mask-under-eplb-guard": (
        "hooked (mask padded ids to 0 outside the EPLB guard; upstream keeps its gated remap)"
    ),
    "fixed": "not hooked: upstream already masks padded ids on HIP",
    "unknown": (
        "decided by running it in a child process (the plugin probes the installed "
        "function on a CPU batch there and hooks only what it sees wrong); WARNING with the "
        "function's fingerprint"
    ),
}

"""The guard at aiter's MoE entry: whatever a caller routes, aiter's MoE gets expert ids
in ``[0, E)``, with or without a count.

Before aiter sorts, every ``topk_ids`` entry ``< 0`` or ``>= E`` becomes expert 0 with
weight 0 (vLLM's -1 for skipped rows, garbage in padded rows no count marks, the id ``E``
a router emits for an all-NaN row), and with a ``num_local_tokens`` count the rows at and
past it too (:func:`sglang_amd_moe.kernels.guard_routing`, one launch, the count read on
the device). ``E`` is what aiter sorts over: ``expert_mask.numel()`` with an expert mask,
else ``w1.shape[0]``; an id in range is never changed, so SGLang's sink slot (id
``num_local_experts`` under a mask of ``num_local_experts + 1`` entries) passes. aiter
gets new tensors: callers read their ids and weights again after the MoE.

Where: aiter main's ``fused_moe`` calls ``fused_moe_``, a torch custom op (its module
attribute calls ``torch.ops.aiter.fused_moe_``, whose implementation is the original
Python function), which calls ``_fused_moe_impl`` through the module's globals. Wrapping
``_fused_moe_impl`` puts the guard once on every call of aiter's MoE body: eager calls,
calls while a CUDA graph is captured (the op runs its Python implementation, so the
guard's launch is captured with it), ``torch.compile`` (Dynamo keeps the op opaque; the
compiled code runs the op, which runs the guard) and callers of
``torch.ops.aiter.fused_moe_``. Wrapping ``fused_moe`` as well would guard those calls
twice, and its shared-expert path (``aiter.fhmoe``) numbers experts past ``w1``'s. A tree
without ``_fused_moe_impl`` gets ``fused_moe`` wrapped (Dynamo traces the wrapper: the
guard enters the graph as this package's custom op). Any other signature is refused.

Bad input (ids not a 2-D int32/int64 tensor, weights shaped unlike the ids, an expert
mask or weights on another device) leaves the call to aiter untouched, with one WARNING
per kind: aiter raises its own error. When the kernel fails for a call, the plain-torch
guard (``base.plain_guard``) takes over; the first failure of each kind is logged.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

import torch

from sglang_amd_moe.runtime import env
from sglang_amd_moe.runtime.aiter.base import TARGET, ModuleTarget, apply, our_kernels, plain_guard
from sglang_amd_moe.runtime.target import HookStatus, find_marked, mark

NAME = "guard"  # HookStatus.target
ENTRIES = ("_fused_moe_impl", "fused_moe")  # the first present is wrapped
#: The leading positional parameters of a recognised entry (aiter's order since 2025).
POSITIONAL = ("hidden_states", "w1", "w2", "topk_weight", "topk_ids", "expert_mask")
_READ = ("w1", "topk_weight", "topk_ids", "expert_mask", "num_local_tokens")
_IDS = (torch.int32, torch.int64)


def entry_problem(positional: tuple[str, ...], names: tuple[str, ...]) -> str:
    """Why the guard cannot wrap an entry with these parameters ("" when it can):
    ``positional`` (positional ones, in order) and ``names`` (all). Pure: the audit asks
    it with the parameters of the file, the hook with those of the running function."""
    if positional[: len(POSITIONAL)] != POSITIONAL:
        return f"takes {positional[: len(POSITIONAL)]} first, not {POSITIONAL}"
    if "num_local_tokens" not in names:
        return "has no num_local_tokens parameter"
    shared = [n for n in names if n.startswith("shared_")]
    if shared:  # a fused shared expert has an id past w1's experts
        return f"takes a fused shared expert ({', '.join(shared)})"
    return ""


def _signature(fn: Any) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in params if p.kind in kinds), tuple(p.name for p in params)


def bad_input(ids: Any, weights: Any, mask: Any, w1: Any, count: Any) -> tuple[str, str]:
    """(kind, why) of a call the guard leaves to aiter untouched; ("", "") for a good one."""
    if not isinstance(ids, torch.Tensor) or ids.dtype not in _IDS:
        return "ids", f"topk_ids is {getattr(ids, 'dtype', type(ids).__name__)}, not int32/int64"
    if ids.dim() != 2:
        return "ids", f"topk_ids has shape {tuple(ids.shape)}, not [rows, topk]"
    if not isinstance(weights, torch.Tensor) or weights.shape != ids.shape:
        shape = tuple(getattr(weights, "shape", ()))
        return "weights", f"topk_weight has shape {shape}, topk_ids {tuple(ids.shape)}"
    if weights.device != ids.device:
        return "weights", f"topk_weight is on {weights.device}, topk_ids on {ids.device}"
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.device != ids.device):
        return "mask", f"expert_mask is not a tensor on {ids.device}, where topk_ids is"
    if mask is None and (not isinstance(w1, torch.Tensor) or w1.dim() == 0 or w1.shape[0] < 1):
        return "w1", "w1 has no experts to count"
    if mask is not None and mask.numel() < 1:
        return "mask", "expert_mask is empty"
    if count is not None and (not isinstance(count, torch.Tensor) or count.numel() < 1):
        return "count", "num_local_tokens is not a tensor holding a count"
    return "", ""


class GuardHook(ModuleTarget):
    """The guard target (the module-level functions below are its public surface)."""

    name, what, label = NAME, f"the guard at {TARGET}", "guard"

    def _off(self) -> str:
        return "guard off (SGLANG_AMD_MOE_GUARD=0)" if env.guard_off() else ""

    def _on_loaded(self, module: types.ModuleType) -> HookStatus:
        entry = next((e for e in ENTRIES if callable(getattr(module, e, None))), ENTRIES[-1])
        fn = getattr(module, entry, None)
        where = f"{TARGET}.{entry}"
        sig = _signature(fn) if callable(fn) else None
        why = entry_problem(*sig) if sig else "is missing or has no signature"
        if not why and find_marked(fn) is not None:
            why = "is already wrapped by another copy of sglang-amd-moe"
        ours, error = (None, "") if why else our_kernels(("guard_routing",))
        if why or error:
            text = (
                f"guard not installed: {f'{where} {why}' if why else error}; aiter left untouched"
            )
            return self.record(self.make_status("refused" if why else "error", entry, text))
        self.patches = apply([(module, entry, fn, _guard_wrapper(fn, ours.guard_routing, self))])
        patched = sorted({f"{p.module.__name__}.{p.attr}" for p in self.patches})
        text = (
            f"guard live at {where}: ids < 0 or >= E (and rows past num_local_tokens) reach "
            "aiter as expert 0 with weight 0, on new tensors"
        )
        return self.record(self.make_status("live", entry, text, patched=patched))


def _guard_wrapper(entry: Any, guard_routing: Any, hook: GuardHook) -> Any:
    sig = inspect.signature(entry)
    order = list(sig.parameters)
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    # Read by position or keyword without binding: binding costs microseconds per call.
    where = {n: order.index(n) if sig.parameters[n].kind in kinds else None for n in _READ}
    default = {
        n: None
        if sig.parameters[n].default is inspect.Parameter.empty
        else sig.parameters[n].default
        for n in _READ
    }

    def get(args: tuple, kwargs: dict, name: str) -> Any:
        if name in kwargs:
            return kwargs[name]
        i = where[name]
        return args[i] if i is not None and i < len(args) else default[name]

    @functools.wraps(entry)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        w1, weights, ids, mask, count = (get(args, kwargs, n) for n in _READ)
        kind, why = bad_input(ids, weights, mask, w1, count)
        if kind:
            hook.once(f"input {kind}", f"guard: {why}; this call goes to aiter untouched")
            return entry(*args, **kwargs)
        experts = mask.numel() if mask is not None else w1.shape[0]
        try:
            new_ids, new_weights = guard_routing(ids, weights, experts, count)
        except Exception as exc:
            text = (
                f"the guard kernel failed ({type(exc).__name__}: {exc}); the plain-torch guard ran"
            )
            hook.once(f"kernel {type(exc).__name__}", text, exc_info=True)
            new_ids, new_weights = plain_guard(ids, weights, experts, count)
        args, kwargs = list(args), dict(kwargs)
        for name, value in (("topk_ids", new_ids), ("topk_weight", new_weights)):
            i = where[name]
            if i is not None and i < len(args) and name not in kwargs:
                args[i] = value
            else:
                kwargs[name] = value
        return entry(*args, **kwargs)

    return mark(guarded, entry)


HOOK = GuardHook()
install = HOOK.install
status = HOOK.status
is_live = HOOK.is_live
uninstall = HOOK.uninstall

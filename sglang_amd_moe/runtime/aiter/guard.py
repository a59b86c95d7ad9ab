"""The guard at aiter's MoE entry: whatever a caller routes, with or without a count,
aiter's MoE gets expert ids in ``[0, E)``.

Before aiter sorts, every ``topk_ids`` entry ``< 0`` or ``>= E`` (vLLM's -1, garbage in
padded rows no count marks, the ``E`` a router emits for an all-NaN row), and with a
``num_local_tokens`` count every row at and past it, becomes expert 0 with weight 0
(:func:`sglang_amd_moe.kernels.guard_routing`: one launch, the count read on the device).
``E`` is what aiter sorts over: ``expert_mask.numel()`` with a mask, else ``w1.shape[0]``.
Ids in range never change, so SGLang's sink slot (``num_local_experts`` under a mask of
``num_local_experts + 1``) passes. aiter gets new tensors: callers read theirs again.

Where: aiter main's ``fused_moe`` calls ``fused_moe_``, a torch custom op (the module
attribute calls ``torch.ops.aiter.fused_moe_``, whose implementation is the original
function), which calls ``_fused_moe_impl`` through the module's globals. Wrapping
``_fused_moe_impl`` guards every call of aiter's MoE body once: eager calls, calls under
CUDA-graph capture (the op runs its Python implementation, so the guard's launch is
captured), ``torch.compile`` (the op is opaque to Dynamo; at run time it runs the guard)
and direct ``torch.ops.aiter.fused_moe_`` calls. Wrapping ``fused_moe`` too would guard
them twice, and its shared-expert path (``aiter.fhmoe``) numbers experts past ``w1``'s.
Where ``_fused_moe_impl`` is absent, ``fused_moe`` is wrapped (Dynamo traces the wrapper,
and the guard enters the graph as this package's custom op); other signatures are refused.

Bad input (ids not a 2-D int32/int64 tensor, weights shaped or placed unlike them, an
expert mask on another device) goes to aiter untouched, one WARNING per kind: aiter raises
its own error. When the kernel fails for a call, ``base.plain_guard`` takes over.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

from sglang_amd_moe.runtime import env
from sglang_amd_moe.runtime.aiter.base import TARGET, ModuleTarget, apply, our_kernels, plain_guard
from sglang_amd_moe.runtime.aiter.forms import GUARD_ENTRIES, guard_entry_problem
from sglang_amd_moe.runtime.target import HookStatus, find_marked, mark

NAME = "guard"  # HookStatus.target
_READ = ("w1", "topk_weight", "topk_ids", "expert_mask", "num_local_tokens")
_POSITIONAL_KINDS = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _seen(x: Any) -> str:
    import torch  # on a call only: loading the plugin must not import torch

    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).removeprefix('torch.')} {tuple(x.shape)} on {x.device}"
    return type(x).__name__


def bad_input(ids: Any, weights: Any, mask: Any, w1: Any, count: Any) -> tuple[str, str]:
    """(what, why) of a call the guard leaves to aiter untouched; ("", "") for a good one."""
    import torch

    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int32, torch.int64):
        return "topk_ids", f"topk_ids is {_seen(ids)}, not int32/int64"
    if ids.dim() != 2:
        return "topk_ids", f"topk_ids is {_seen(ids)}, not [rows, topk]"
    if not isinstance(weights, torch.Tensor) or (weights.shape, weights.device) != (
        ids.shape,
        ids.device,
    ):
        return "topk_weight", f"topk_weight is {_seen(weights)}, topk_ids {_seen(ids)}"
    if mask is not None and not (isinstance(mask, torch.Tensor) and mask.device == ids.device):
        return "expert_mask", f"expert_mask is {_seen(mask)}, not a tensor on {ids.device}"
    has_w1 = isinstance(w1, torch.Tensor) and w1.dim() > 0
    if (mask.numel() if mask is not None else w1.shape[0] if has_w1 else 0) < 1:
        return "experts", f"no experts to count (expert_mask {_seen(mask)}, w1 {_seen(w1)})"
    if count is not None and not (isinstance(count, torch.Tensor) and count.numel()):
        return "num_local_tokens", f"num_local_tokens is {_seen(count)}, not a count"
    return "", ""


class GuardHook(ModuleTarget):
    """The guard target (the module-level functions below are its public surface)."""

    name, what, label = NAME, f"the guard at {TARGET}", "guard"

    def _off(self) -> str:
        return "guard off (SGLANG_AMD_MOE_GUARD=0)" if env.guard_off() else ""

    def _on_loaded(self, module: types.ModuleType) -> HookStatus:
        entry = next((e for e in GUARD_ENTRIES if callable(getattr(module, e, None))), "fused_moe")
        fn, where = getattr(module, entry, None), f"{TARGET}.{entry}"
        try:
            params = inspect.signature(fn).parameters.values()
            why = guard_entry_problem(
                tuple(p.name for p in params if p.kind in _POSITIONAL_KINDS),
                tuple(p.name for p in params),
            )
        except (TypeError, ValueError):
            why = "is missing or has no signature"
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
    params = inspect.signature(entry).parameters
    order = list(params)
    # Read by position or keyword without binding: binding costs microseconds per call.
    where = {n: order.index(n) if params[n].kind in _POSITIONAL_KINDS else None for n in _READ}
    default = {
        n: None if params[n].default is params[n].empty else params[n].default for n in _READ
    }

    def get(args: tuple, kwargs: dict, name: str) -> Any:
        i = where[name]
        if name in kwargs or i is None or i >= len(args):
            return kwargs.get(name, default[name])
        return args[i]

    @functools.wraps(entry)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        w1, weights, ids, mask, count = (get(args, kwargs, n) for n in _READ)
        what, why = bad_input(ids, weights, mask, w1, count)
        if what:
            hook.once(f"input {what}", f"guard: {why}; this call goes to aiter untouched")
            return entry(*args, **kwargs)
        experts = mask.numel() if mask is not None else w1.shape[0]
        try:
            new = guard_routing(ids, weights, experts, count)
        except Exception as exc:
            text = (
                f"the guard kernel failed ({type(exc).__name__}: {exc}); the plain-torch guard ran"
            )
            hook.once(f"kernel {type(exc).__name__}", text, exc_info=True)
            new = plain_guard(ids, weights, experts, count)
        args = list(args)
        for name, value in zip(("topk_ids", "topk_weight"), new, strict=True):
            i = where[name]
            if name in kwargs or i is None or i >= len(args):
                kwargs[name] = value
            else:
                args[i] = value
        return entry(*args, **kwargs)

    return mark(guarded, entry)


HOOK = GuardHook()
install = HOOK.install
status = HOOK.status
is_live = HOOK.is_live
uninstall = HOOK.uninstall

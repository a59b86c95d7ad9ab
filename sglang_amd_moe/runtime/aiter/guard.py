"""The guard at aiter's MoE entry: whatever a caller routes, with or without a count,
aiter's MoE gets expert ids in ``[0, E)``.

Before aiter sorts, every ``topk_ids`` entry ``< 0`` or ``>= E`` (vLLM's -1, garbage in
padded rows no count marks, the ``E`` a router emits for an all-NaN row), and with a
``num_local_tokens`` count every row at and past it, becomes expert 0 with weight 0, in one
launch (``kernels.guard_routing``, the count read on the device). ``E`` is what aiter sorts
over: ``expert_mask.numel()``, else ``w1.shape[0]``; ids in range never change, so SGLang's
sink slot passes. aiter gets new tensors.

The guard wraps ``_fused_moe_impl``, which every call of aiter's MoE body reaches once
(eager, CUDA-graph capture and ``torch.compile`` through the ``fused_moe_`` custom op, direct
op calls); wrapping ``fused_moe`` too would guard twice, and its shared-expert path numbers
experts past ``w1``'s. Without ``_fused_moe_impl``, ``fused_moe`` is wrapped.

Input the kernel does not take is still guarded where it can be: ids of another integer
dtype (int16, int8, ...) go through the plain-torch guard, and a count that cannot be read
(empty, not an integer tensor) is left out of the guard (ids out of range still become
expert 0, weight 0; aiter gets the count as passed). Other bad input goes to aiter
untouched (one WARNING per kind): aiter raises its own error. Each call adds to the
guard's counters (``runtime.stats``) inside its launch.
"""

from __future__ import annotations

import functools
import types
from typing import Any

from sglang_amd_moe.runtime import env, stats
from sglang_amd_moe.runtime.aiter import reach
from sglang_amd_moe.runtime.aiter.base import TARGET, ModuleTarget, our_kernels, plain_guard
from sglang_amd_moe.runtime.aiter.forms import GUARD_ENTRIES, guard_entry_problem
from sglang_amd_moe.runtime.target import Args, Gate, HookStatus, find_marked, mark, params_of

NAME = "guard"  # HookStatus.target
_READ = ("w1", "topk_weight", "topk_ids", "expert_mask", "num_local_tokens")


def _seen(x: Any) -> str:
    import torch  # on a call only: loading the plugin must not import torch

    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).removeprefix('torch.')} {tuple(x.shape)} on {x.device}"
    return type(x).__name__


def other_int_ids(ids: Any) -> bool:
    """Ids of an integer dtype the kernel does not take (int16, int8, uint8, ...): the
    plain-torch guard takes them."""
    import torch

    return (
        isinstance(ids, torch.Tensor)
        and ids.dtype not in (torch.int32, torch.int64, torch.bool)
        and not ids.dtype.is_floating_point
        and not ids.dtype.is_complex
    )


def usable_count(count: Any) -> bool:
    """A count the guard can read: None, or a non-empty integer tensor."""
    import torch

    return count is None or (
        isinstance(count, torch.Tensor)
        and count.numel() > 0
        and not count.dtype.is_floating_point
        and not count.dtype.is_complex
        and count.dtype != torch.bool
    )


def bad_input(ids: Any, weights: Any, mask: Any, w1: Any, count: Any) -> tuple[str, str]:
    """(what, why) of a call the guard leaves to aiter untouched; ("", "") for a good one,
    or ("num_local_tokens", why) for one the guard takes without its count."""
    import torch

    int_ids = isinstance(ids, torch.Tensor) and ids.dtype in (torch.int32, torch.int64)
    if not int_ids and not other_int_ids(ids):
        return "topk_ids", f"topk_ids is {_seen(ids)}, not int32/int64"
    if ids.dim() != 2:
        return "topk_ids", f"topk_ids is {_seen(ids)}, not [rows, topk]"
    placed = isinstance(weights, torch.Tensor) and weights.device == ids.device
    if not placed or weights.shape != ids.shape:
        return "topk_weight", f"topk_weight is {_seen(weights)}, topk_ids {_seen(ids)}"
    if mask is not None and not (isinstance(mask, torch.Tensor) and mask.device == ids.device):
        return "expert_mask", f"expert_mask is {_seen(mask)}, not a tensor on {ids.device}"
    has_w1 = isinstance(w1, torch.Tensor) and w1.dim() > 0
    if (mask.numel() if mask is not None else w1.shape[0] if has_w1 else 0) < 1:
        return "experts", f"no experts to count (expert_mask {_seen(mask)}, w1 {_seen(w1)})"
    if not usable_count(count):
        return "num_local_tokens", f"num_local_tokens is {_seen(count)}, not a count"
    return "", ""


class GuardHook(ModuleTarget):
    """The guard target (the module-level functions below are its public surface)."""

    name, what, label = NAME, f"the guard at {TARGET}", "guard"

    def _install(self, gate: Gate) -> HookStatus:
        if env.guard_off():
            return self.record(self.make_status("off", None, "guard off (SGLANG_AMD_MOE_GUARD=0)"))
        return super()._install(gate)

    def _on_loaded(self, module: types.ModuleType) -> HookStatus:
        entry = next((e for e in GUARD_ENTRIES if callable(getattr(module, e, None))), "fused_moe")
        fn, where = getattr(module, entry, None), f"{TARGET}.{entry}"
        try:
            why = guard_entry_problem(tuple(Args(fn).positions), params_of(fn))
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
        patched = self.apply([(module, entry, fn, _guard_wrapper(fn, ours.guard_routing, self))])
        text = (
            f"guard live at {where}: ids < 0 or >= E (and rows past num_local_tokens) reach "
            "aiter as expert 0 with weight 0, on new tensors"
        )
        text += f"; {moe}" if (moe := reach.this_process()) else ""  # where SGLang's MoE goes
        return self.record(self.make_status("live", entry, text, patched=patched))


def _guard_wrapper(entry: Any, guard_routing: Any, hook: GuardHook) -> Any:
    read = Args(entry)

    @functools.wraps(entry)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        w1, weights, ids, mask, count = (read.get(n, args, kwargs) for n in _READ)
        what, why = bad_input(ids, weights, mask, w1, count)
        if what == "num_local_tokens":
            text = (
                f"guard: {why}; ids out of range are still guarded, rows past the count are "
                "not, and aiter gets the count as passed"
            )
            hook.once(f"input {what}", text)
            count = None
        elif what:
            hook.once(f"input {what}", f"guard: {why}; this call goes to aiter untouched")
            return entry(*args, **kwargs)
        experts = mask.numel() if mask is not None else w1.shape[0]
        counters = stats.buffer("guard", ids.device)
        if other_int_ids(ids):
            ids, weights = plain_guard(ids, weights, experts, count, counters)
        else:
            try:
                ids, weights = guard_routing(ids, weights, experts, count, counters)
            except Exception as exc:
                text = (
                    f"the guard kernel failed ({type(exc).__name__}: {exc}); "
                    "the plain-torch guard ran"
                )
                hook.once(f"kernel {type(exc).__name__}", text, exc_info=True)
                ids, weights = plain_guard(ids, weights, experts, count, counters)
        stats.tick()
        args, kwargs = read.put("topk_ids", ids, args, kwargs)
        args, kwargs = read.put("topk_weight", weights, args, kwargs)
        return entry(*args, **kwargs)

    return mark(guarded, entry)


HOOK = GuardHook()
install = HOOK.install
status = HOOK.status
is_live = HOOK.is_live
uninstall = HOOK.uninstall

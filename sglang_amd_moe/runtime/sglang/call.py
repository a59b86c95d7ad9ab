"""The hooked call: what the wrapper does around upstream's ``_post_process_topk_ids`` on
each HIP call, as its plan says (the live wrapper and the probe's check of a plan run it).

It fails safe: padded rows leave a hooked call with id 0 and weight 0, or the call raises.
Where the mask kernel cannot run (a count dtype it refuses, tensors sharing memory, a
compile error, Triton's interpreter entered from two threads), :func:`mask_fallback_` does
the same with torch ops (the first fallback per reason logged).
"""

from __future__ import annotations

import dataclasses
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang_amd_moe.runtime.sglang.names import ACTIONS, COUNT, INFO, REMAP, REMAP_PREDICATES
from sglang_amd_moe.runtime.sglang.probe import ProbeEnv
from sglang_amd_moe.runtime.target import Args


@dataclass(frozen=True)
class Plan:
    """What the hook does around each HIP call (decided once, at install)."""

    pre_mask: bool  # padded ids 0 and weights 0 before upstream
    #: Who remaps logical to physical ids: "upstream", "add" (the hook, before upstream,
    #: which keeps the dispatch info) or "own" (the hook; upstream gets no dispatch info).
    remap: str
    tail_mask: bool  # mask again when upstream returned new tensors (a shared-expert append)
    post_mask: bool = False  # mask again after upstream on every call
    verify: bool = False  # SGLANG_AMD_MOE_VERIFY=1: check padded rows after every call

    def describe(self, form: str) -> str:
        """The action, in the words the audit and the log line use."""
        if not self.pre_mask and self.remap == "upstream":
            return "not hooked for masking: upstream already masks padded ids on HIP"
        if STANDARD_PLANS.get(form) == dataclasses.replace(self, verify=False):
            return ACTIONS[form]
        remap = {
            "upstream": "upstream keeps its remap",
            "add": "gated EPLB remap added before upstream",
            "own": "the EPLB remap owned by the hook (upstream gets no dispatch info)",
        }[self.remap]
        tail = ", re-zero after a shared-expert append" if self.tail_mask else ""
        tail = ", mask padded rows again after upstream" if self.post_mask else tail
        return (
            f"hooked (mask padded ids to 0 and zero their weights before upstream, {remap}{tail})"
        )


#: The plan of each broken released form (what the ledger records for its bodies).
STANDARD_PLANS: dict[str, Plan] = {
    "no-hip-handling": Plan(True, "add", True),
    "weights-only": Plan(True, "add", False),
    "mask-under-eplb-guard": Plan(True, "upstream", False),
}


@dataclass(frozen=True)
class Call:
    """What the wrapper reads on every call (one object, swapped atomically)."""

    plan: Plan
    module: types.ModuleType
    args: Args  # of the live function
    mask: Callable[..., None]
    hip_flags: tuple[str, ...]
    predicates: tuple[str, ...]
    on_failure: Callable[[str, str], None]  # (what, text): the hook logs it once per what


def remap_enabled(mod: types.ModuleType, predicates: tuple[str, ...] = ()) -> bool:
    """A real logical-to-physical expert map exists (EPLB, a non-trivial initial placement
    or redundant experts): upstream's predicate, else (a function that reads none) the
    server args read the same way."""
    for name in (*predicates, *REMAP_PREDICATES):
        fn = getattr(mod, name, None)
        if callable(fn):
            return bool(fn())
    try:
        from sglang.srt.server_args import get_global_server_args

        args = get_global_server_args()
    except (ImportError, ValueError):  # no SGLang, or not inside a server
        return False
    except RuntimeError:  # retired accessor (newer SGLang): read the published bag
        try:
            from sglang.srt.runtime_context import get_exec

            args = get_exec().moe
        except Exception:
            return False
    return args is not None and bool(
        getattr(args, "enable_eplb", False)
        or getattr(args, "init_expert_location", "trivial") != "trivial"
        or (getattr(args, "ep_num_redundant_experts", 0) or 0) > 0
    )


class LiveEnv:
    """The process's own platform, predicate and remap, read at call time."""

    __slots__ = ("_call",)

    def __init__(self, call: Call) -> None:
        self._call = call

    def is_hip(self) -> bool:
        mod = self._call.module
        flags = [getattr(mod, name) for name in self._call.hip_flags if hasattr(mod, name)]
        return any(flags) if flags else True  # no flag at all: the plugin only hooks on ROCm

    def remap_enabled(self) -> bool:
        return remap_enabled(self._call.module, self._call.predicates)

    def remap(self, ids: Any, info: Any) -> Any:
        return getattr(self._call.module, REMAP)(ids, info)


def wrap_for_probe(call: Call) -> Callable[[Callable[..., Any], ProbeEnv], Callable[..., Any]]:
    """How the probe runs the hooked call: this plan around the probe's upstream, masking
    with :func:`mask_fallback_` (what the kernel writes; no kernel run at plugin load)."""
    checked = dataclasses.replace(call, mask=mask_fallback_)

    def wrap(upstream: Callable[..., Any], env: ProbeEnv) -> Callable[..., Any]:
        return lambda *args, **kwargs: run(checked, env, upstream, args, kwargs)

    return wrap


def mask_fallback_(
    ids: Any, weights: Any, count: Any, fill_value: int = 0, stats: Any = None
) -> None:
    """In place: rows ``r`` with ``r >= count`` get id ``fill_value`` and weight 0, with torch
    ops on the tensors' device, exactly as upstream's ``arange(M) >= count`` decides (a float
    count of 4.7 keeps row 4, NaN masks nothing, an integer count below 0 or past M masks
    every row or none). Takes what the kernel refuses: any dtype or device of the count (its
    first element), any strides, tensors that share memory (both fills write zero bits).
    ``stats``: counters to add the call and the padded entries it changes to (on the
    device, no host synchronization)."""
    import torch

    n = count.reshape(-1)[0] if isinstance(count, torch.Tensor) else torch.tensor(count)
    pads = []
    for t in (ids, weights):  # both masks first: the count may live in one of the tensors
        rows = t.shape[0]
        pad = torch.arange(rows, device=t.device) >= n.to(device=t.device)
        pads.append(pad.view(rows, *[1] * (t.dim() - 1)))
    if stats is not None:
        changed = pads[0].to(stats.device) & (
            (ids != fill_value).to(stats.device) | (weights != 0).to(stats.device)
        )
        stats[0] += 1
        stats[2] += changed.sum()
    ids.masked_fill_(pads[0], fill_value)
    weights.masked_fill_(pads[1], 0)


_kernel: Callable[..., None] | None = None


def kernel_mask(*args: Any, **kwargs: Any) -> None:
    """``sglang_amd_moe.kernels.mask_padded_rows_``, imported by the first hooked call:
    registering its torch custom op inspects every loaded module (seconds in a process
    with SGLang's thousands), a cost no process should pay at plugin load."""
    global _kernel
    if _kernel is None:
        try:
            from sglang_amd_moe.kernels import mask_padded_rows_ as _kernel
        except Exception as exc:
            why = f"this package's kernels do not import ({type(exc).__name__}: {exc})"

            def _kernel(*args: Any, **kwargs: Any) -> None:
                raise RuntimeError(why)

    _kernel(*args, **kwargs)


def _kernel_takes(ids: Any, weights: Any) -> bool:
    """Whether both tensors have a layout the mask kernel takes: 2-D, columns of unit
    stride and rows apart. Other layouts (a view with strided columns, which SGLang's own
    tests pass as an ordinary eager input) go to the plain-torch mask without a word."""
    for t in (ids, weights):
        shape, stride = getattr(t, "shape", ()), t.stride() if hasattr(t, "stride") else ()
        if len(shape) != 2:
            return True  # not a routing tensor: the kernel says why
        rows, cols = shape
        if (cols > 1 and stride[1] != 1) or (rows > 1 and cols > 0 and stride[0] < cols):
            return False
    return True


def _mask(call: Call, ids: Any, weights: Any, count: Any) -> None:
    """The kernel; where it raises, :func:`mask_fallback_`; where that raises too, raise.
    A live call (not the probe's) adds to the mask's counters."""
    buf = None
    if call.mask is not mask_fallback_ and hasattr(ids, "device"):
        from sglang_amd_moe.runtime import stats

        buf = stats.buffer("mask", ids.device)
        stats.tick()
    if not _kernel_takes(ids, weights):
        mask_fallback_(ids, weights, count, stats=buf)
        return
    try:
        if buf is None:
            call.mask(ids, weights, count, fill_value=0)
        else:
            call.mask(ids, weights, count, fill_value=0, stats=buf)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        reason = f"{type(exc).__name__}: {re.sub(r'0x[0-9a-f]+|[0-9]+', '#', first)[:160]}"
        call.on_failure(
            f"mask {reason}",
            f"the mask kernel failed ({reason}); the plain-torch mask took over",
        )
        try:
            mask_fallback_(ids, weights, count, stats=buf)
        except Exception as second:
            raise RuntimeError(
                "sglang-amd-moe: neither the mask kernel nor the plain-torch mask could mask "
                f"padded rows ({type(second).__name__}: {second}); not passing them on"
            ) from second


def run(call: Call, env: Any, original_fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """One hooked call: the plan around ``original_fn`` (the wrapper's and the probe's)."""
    plan, read = call.plan, call.args
    if not env.is_hip():
        return original_fn(*args, **kwargs)
    n, ids, weights = (read.get(k, args, kwargs) for k in (COUNT, "topk_ids", "topk_weights"))
    if plan.pre_mask and n is not None:
        _mask(call, ids, weights, n)
    call_args, call_kwargs = args, kwargs
    if plan.remap in ("add", "own"):
        info = read.get(INFO, args, kwargs)
        if plan.remap == "own":
            call_args, call_kwargs = read.put(INFO, None, args, kwargs)
        try:
            if info is not None and env.remap_enabled():
                remapped = env.remap(ids, info)
                call_args, call_kwargs = read.put("topk_ids", remapped, call_args, call_kwargs)
        except Exception:
            call.on_failure("remap", "the EPLB remap failed; upstream gets the ids unremapped")
    out = original_fn(*call_args, **call_kwargs)
    if n is not None and (plan.post_mask or plan.tail_mask):
        out_ids, out_weights = out[0], out[1]
        # post_mask: on every call. tail_mask: when upstream built new tensors after our
        # pre-mask (a shared-expert append, or a remap).
        if plan.post_mask or out_weights is not weights or out_ids.shape != ids.shape:
            _mask(call, out_ids, out_weights, n)
    if plan.verify and n is not None:
        _verify(call, out, n, args, kwargs)  # raises by design: a debugging aid
    return out


def _verify(call: Call, out: Any, n: Any, args: tuple, kwargs: dict) -> None:
    """``SGLANG_AMD_MOE_VERIFY=1``: padded rows must have ids in range and zero weights."""
    out_ids, out_weights = out[0], out[1]
    count = int(n.reshape(-1)[0].item()) if hasattr(n, "reshape") else int(n)
    pad_ids, pad_w = out_ids[count:], out_weights[count:]
    if pad_ids.numel() == 0:
        return
    names = ("router_logits", INFO, "topk_config", "layer_id")
    logits, info, cfg, layer = (call.args.get(k, args, kwargs) for k in names)
    num = int(logits.shape[-1]) if logits is not None else 0
    num = max(num, int(getattr(info, "num_physical_experts", 0) or 0))
    slots = ("num_fused_shared_experts", "num_shared_topk_slots")
    bound = (num + max(int(getattr(cfg, k, 0) or 0) for k in slots)) or None  # None: no count
    lo, hi = int(pad_ids.min().item()), int(pad_ids.max().item())
    nonzero = int((pad_w != 0).sum().item())
    if lo < 0 or (bound is not None and hi >= bound) or nonzero:
        raise RuntimeError(
            f"sglang-amd-moe VERIFY: layer {layer}: padded rows {count}..{out_ids.shape[0] - 1} "
            f"have ids in [{lo}, {hi}] (allowed [0, {bound})) and {nonzero} nonzero weights"
        )

"""What the aiter targets (the sort hook, the guard) share: ``aiter.fused_moe`` patched at
once if imported, else right after it executes (``pending`` until then; aiter is never
imported here), copies rebound, and :func:`plain_guard` for a call our kernel fails."""

from __future__ import annotations

import collections
import importlib.util
import logging
import sys
import types
from typing import Any

from sglang_amd_moe.runtime.target import (
    Gate,
    HookStatus,
    Target,
    forget,
    holds,
    rebind_copies,
    watching,
    when_imported,
)

TARGET = "aiter.fused_moe"
Patch = collections.namedtuple("Patch", "module attr original replacement")


def our_kernels(needed: tuple[str, ...]) -> tuple[Any | None, str]:
    """This package's kernels module, or why it cannot serve a hook that calls ``needed``."""
    try:
        from sglang_amd_moe import kernels as module
    except Exception as exc:
        return None, f"sglang_amd_moe.kernels does not import ({type(exc).__name__}: {exc})"
    missing = [n for n in needed if not callable(getattr(module, n, None))]
    return (None, f"sglang_amd_moe.kernels lacks {', '.join(missing)}") if missing else (module, "")


def plain_guard(
    ids: Any, weights: Any, num_experts: int, count: Any, stats: Any = None
) -> tuple[Any, Any]:
    """New ``(ids, weights)``: expert 0 and weight 0 where the id is outside ``[0,
    num_experts)`` or the row is at or past ``count[0]``. Plain torch, no host sync
    (capturable): a call our kernel fails still never hands aiter what the plugin stops.
    ``stats``: the guard's counters, added to as the kernel adds to them."""
    import torch

    in_range = (ids >= 0) & (ids < num_experts)
    valid = in_range
    real = None
    if count is not None:
        n = count.reshape(-1)[:1].to(device=ids.device, dtype=torch.int64)
        real = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1) < n
        valid = in_range & real
    if stats is not None:
        real_all = torch.ones_like(in_range) if real is None else real.expand_as(in_range)
        bad = (~in_range & real_all).sum().to(stats.device)
        stats[0] += 1
        stats[1] += bad
        if real is not None:
            past = ~real_all & ((ids != 0) | (weights != 0))
            stats[2] += past.sum().to(stats.device)
            stats[3] += bad
    return torch.where(valid, ids, 0), torch.where(valid, weights, 0)


class ModuleTarget(Target):
    """A target on ``aiter.fused_moe``: a subclass writes ``_on_loaded(module)``."""

    upstream = "aiter"
    label = ""  # "aiter hook", "guard": the subject of its log lines

    def __init__(self) -> None:
        super().__init__()
        self.patches: list[Patch] = []

    def _install(self, gate: Gate) -> HookStatus:
        module = sys.modules.get(TARGET)
        if module is None:
            try:
                spec = importlib.util.find_spec("aiter")
                # A bare directory named aiter on sys.path is a namespace package (no
                # origin); the real aiter is a regular package, which would win over it.
                real = spec and spec.origin not in (None, "namespace")
                why = "" if real else "aiter is not installed"
            except Exception as exc:  # a broken sys.path entry or a half-imported aiter
                why = f"cannot look up aiter ({type(exc).__name__}: {exc})"
            if why:
                text = f"{why}; {self.label} not needed"
                return self.record(self.make_status("not-needed", None, text), level=logging.DEBUG)
        when_imported(TARGET, self._on_import)
        if module is None:
            text = f"{self.label} pending: {TARGET} is patched when it is imported"
            return self.record(self.make_status("pending", None, text), level=logging.DEBUG)
        return self._on_loaded(module)

    def apply(self, plan: list[tuple[types.ModuleType, str, Any, Any]]) -> list[str]:
        """Set every planned attribute, then rebind ``from ... import`` copies of the
        originals; keep them all to undo, and return their names."""
        self.patches = [Patch(*p) for p in plan]
        for p in self.patches:
            setattr(p.module, p.attr, p.replacement)
        done = {(id(p.module), p.attr) for p in self.patches}
        for _, attr, original, replacement in plan:
            for mod, name in rebind_copies(original, replacement, name=attr, skip=done):
                self.patches.append(Patch(mod, name, original, replacement))
                done.add((id(mod), name))
        return sorted({f"{p.module.__name__}.{p.attr}" for p in self.patches})

    def _still_hooked(self) -> bool:
        st = self._status
        if st is not None and st.state == "pending":
            return watching(TARGET) and TARGET not in sys.modules
        return self.is_live()

    def is_live(self) -> bool:
        """Every wrapper of this target is in place now (possibly under others')."""
        with self.lock:
            return bool(self.patches) and all(
                holds(getattr(p.module, p.attr, None), p.replacement) for p in self.patches
            )

    def _undo(self) -> None:
        for p in reversed(self.patches):
            if getattr(p.module, p.attr, None) is p.replacement:
                setattr(p.module, p.attr, p.original)
        forget(TARGET, self._on_import)
        self.patches = []

    def _on_import(self, module: types.ModuleType) -> None:
        self.guarded(self._on_loaded, module, self.label)  # never fails aiter's import

"""How the check calls the installed SGLang's real code (its HIP branch forced as SGLang's
tests force it); what differs between releases is adapted here and nowhere else."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch._dynamo

from sglang_amd_moe.diagnostics import patching
from sglang_amd_moe.diagnostics.topk_source import function_from_source
from sglang_amd_moe.runtime.sglang import hook as sglang_hook
from sglang_amd_moe.runtime.sglang.names import FUNCTION_NAME, TOPK_MODULE
from sglang_amd_moe.runtime.sglang.probe import rebind

#: The form :func:`guard_form` builds, and the diffs that build it (one per span of releases).
GUARD_FORM = "mask-under-eplb-guard"
GUARD_DIFFS = tuple(sorted((Path(__file__).parent / "guard_form").glob("*.diff")))


class GuardFormError(RuntimeError):
    """No diff of :data:`GUARD_DIFFS` applies to the installed topk.py."""


def import_topk() -> ModuleType:
    """Import SGLang's topk module (the first SGLang import takes seconds)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(TOPK_MODULE)


def guard_source(text: str) -> str:
    """``text`` (a topk.py) with the first diff of :data:`GUARD_DIFFS` that applies."""
    for diff in GUARD_DIFFS:
        if patching.status(text, patch := diff.read_text()) == patching.APPLIES:
            return patching.apply_text(text, patch)
    names = ", ".join(d.name for d in GUARD_DIFFS)
    raise GuardFormError(f"none of the diffs that rebuild it ({names}) applies to this release")


def guard_form(mod: ModuleType) -> tuple[Callable, str]:
    """(function, text): the installed function rebuilt in the never-released guard form."""
    source = guard_source(inspect.getsource(mod))
    fn, _ = function_from_source(mod, source)
    return rebind(fn, vars(mod)), source


@contextlib.contextmanager
def patched(mod: ModuleType, **attrs: Any) -> Iterator[None]:
    """The module's attributes set for a while (``_is_hip=True, _is_cuda=False``: HIP)."""
    saved = {k: getattr(mod, k) for k in attrs if hasattr(mod, k)}
    vars(mod).update(attrs)
    try:
        yield
    finally:
        for k in attrs:
            setattr(mod, k, saved[k]) if k in saved else delattr(mod, k)


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Run what SGLang decorates with ``torch.compile`` eagerly (no 17 s inductor compile)."""
    with torch._dynamo.config.patch(disable=True):
        yield


def make_topk_config(mod: ModuleType, top_k: int, router: Callable) -> Any:
    """``TopKConfig`` for the routed experts, built from the fields this release has."""
    fields = set(getattr(mod.TopKConfig, "__dataclass_fields__", {}))
    kwargs = {"renormalize": True, "custom_routing_function": router}
    return mod.TopKConfig(top_k=top_k, **{k: v for k, v in kwargs.items() if k in fields})


def _call(fn: Callable, **kwargs: Any) -> Any:
    """Call ``fn`` with the keyword arguments its (unwrapped) signature accepts."""
    params = inspect.signature(inspect.unwrap(fn)).parameters
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def route_through_sglang(
    mod: ModuleType,
    router: Callable,
    topk_config: Any,
    h: Any,
    logits: Any,
    layer: int,
    count: Any,
    direct: bool,
) -> tuple[Any, Any, bool]:
    """``(weights, ids, direct)`` of one layer: SGLang's ``select_experts`` with the router
    as its ``custom_routing_function``, and so its ``_post_process_topk_ids``. Releases up
    to 0.5.14 assert that this path gets no ``num_token_non_padded``: there the router's
    output goes to ``_post_process_topk_ids`` directly (looked up at call time, so a hook
    or the rebuilt form runs), and ``direct`` comes back True for the later calls."""
    kw = dict(
        topk_config=topk_config, router_logits=logits, layer_id=layer, num_token_non_padded=count
    )
    if not direct:
        try:
            out = _call(mod.select_experts, hidden_states=h, **kw)
            return out[0], out[1], False
        except AssertionError as exc:
            if "num_token_non_padded" not in str(exc):
                raise
    w, ids = router(hidden_states=h, gating_output=logits, topk=topk_config.top_k, renormalize=True)
    kw |= {"topk_ids": ids, "topk_weights": w, "expert_location_dispatch_info": None}
    out = _call(getattr(mod, FUNCTION_NAME), **kw)
    return out[1], out[0], True  # it returns (topk_ids, topk_weights, ...)


def load_plugin() -> tuple[bool, str]:
    """(hook live, what happened): the plugin loaded by SGLang's ``load_plugins()``, forced."""
    os.environ["SGLANG_AMD_MOE_FORCE"] = "1"
    try:  # here, not at the top: this module imports without SGLang
        from sglang.srt.plugins import load_plugins
    except ImportError:
        from sglang_amd_moe.runtime.plugin import register as load_plugins

        how = "no sglang.srt.plugins here: called sglang_amd_moe.runtime.plugin.register()"
    else:
        how = "sglang.srt.plugins.load_plugins()"
    load_plugins()
    state = sglang_hook.status()
    not_run = "the plugin did not run (not discovered? SGLANG_PLUGINS excludes it?)"
    message = state.message if state else not_run
    return bool(sglang_hook.is_live()), f"{how}: {message}"

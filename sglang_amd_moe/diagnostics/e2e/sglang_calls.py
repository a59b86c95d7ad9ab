"""How the check calls the installed SGLang: always the real code, never a copy.

The topk module is imported for real, its HIP branch is forced the way SGLang's own
tests force it (``_is_hip=True, _is_cuda=False``), rows are routed through its
``select_experts`` (so its ``_post_process_topk_ids`` runs, looked up at call time), and
the plugin is loaded by SGLang's own ``load_plugins()``. What differs between releases
(which ``TopKConfig`` fields exist, whether ``select_experts`` accepts a count with a
custom router, whether a plugin loader exists) is adapted here and nowhere else.
"""

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
from sglang_amd_moe.runtime.sglang import hook as sglang_hook
from sglang_amd_moe.runtime.sglang.names import FUNCTION_NAME, TOPK_MODULE
from sglang_amd_moe.runtime.sglang.probe import function_from_source, rebind

#: The form :func:`guard_form` builds, and the diffs it builds it with (package data):
#: upstream PR 28378 reversed on a release's topk.py, one diff per span of releases.
GUARD_FORM = "mask-under-eplb-guard"
GUARD_DIFFS = tuple(sorted((Path(__file__).parent / "guard_form").glob("*.diff")))


class GuardFormError(RuntimeError):
    """No diff of :data:`GUARD_DIFFS` applies to the installed topk.py."""


def import_topk() -> ModuleType:
    """Import SGLang's topk module (the first SGLang import costs several seconds)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(TOPK_MODULE)


def guard_source(text: str) -> str:
    """``text`` (a topk.py) with upstream PR 28378 reversed by the first diff of
    :data:`GUARD_DIFFS` that applies to it."""
    for diff in GUARD_DIFFS:
        patch = diff.read_text()
        if patching.status(text, patch) == patching.APPLIES:
            return patching.apply_text(text, patch)
    names = ", ".join(d.name for d in GUARD_DIFFS)
    raise GuardFormError(f"none of the diffs that rebuild it ({names}) applies to this release")


def guard_form(mod: ModuleType) -> tuple[Callable, str]:
    """The never-released ``mask-under-eplb-guard`` form of the installed function
    (:func:`guard_source`), compiled over the module's own globals, its source registered
    for ``inspect`` (the plugin reads the running function). Returns (function, text)."""
    source = guard_source(inspect.getsource(mod))
    fn, _ = function_from_source(mod, source)
    return rebind(fn, vars(mod)), source


@contextlib.contextmanager
def hip_branch(mod: ModuleType) -> Iterator[None]:
    """Force the HIP branch on the topk module, as the tests do (``_is_hip=True,
    _is_cuda=False``); restore the flags afterwards."""
    saved = {k: getattr(mod, k) for k in ("_is_hip", "_is_cuda") if hasattr(mod, k)}
    mod._is_hip, mod._is_cuda = True, False
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(mod, k, v)


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Run the routers SGLang decorates with ``torch.compile`` eagerly: the same code,
    without a ~17 s inductor compile on a 2-core CPU."""
    with torch._dynamo.config.patch(disable=True):
        yield


@contextlib.contextmanager
def function_in_place(mod: ModuleType, fn: Callable | None) -> Iterator[None]:
    """Temporarily make ``fn`` the module's ``_post_process_topk_ids`` (``select_experts``
    looks it up in the module globals at call time)."""
    if fn is None:
        yield
        return
    saved = getattr(mod, FUNCTION_NAME)
    setattr(mod, FUNCTION_NAME, fn)
    try:
        yield
    finally:
        setattr(mod, FUNCTION_NAME, saved)


def make_topk_config(mod: ModuleType, top_k: int, router: Callable) -> Any:
    """``TopKConfig`` for the routed experts, built from the fields this release has."""
    fields = set(getattr(mod.TopKConfig, "__dataclass_fields__", {}))
    kwargs: dict[str, Any] = {
        "top_k": top_k,
        "renormalize": True,
        "custom_routing_function": router,
    }
    return mod.TopKConfig(**{k: v for k, v in kwargs.items() if k in fields or k == "top_k"})


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
    """Routed experts for one layer: SGLang's ``select_experts`` (with the router as its
    ``custom_routing_function``) and so its ``_post_process_topk_ids``. Returns
    ``(weights, ids, direct)``.

    Releases up to 0.5.14 refuse ``num_token_non_padded`` on the custom-router path (an
    assert, before anything runs); there the same router's output is passed to the
    release's ``_post_process_topk_ids`` directly, looked up on the module at call time
    (so a plugin's hook, or the rebuilt form, is what runs), and ``direct`` comes back
    True so later calls go that way at once (the table says which way ran)."""
    if not direct:
        try:
            out = _call(
                mod.select_experts,
                hidden_states=h,
                router_logits=logits,
                topk_config=topk_config,
                layer_id=layer,
                num_token_non_padded=count,
            )
            return out[0], out[1], False
        except AssertionError as exc:
            if "num_token_non_padded" not in str(exc):
                raise
    w, ids = router(hidden_states=h, gating_output=logits, topk=topk_config.top_k, renormalize=True)
    out = _call(
        getattr(mod, FUNCTION_NAME),
        topk_ids=ids,
        topk_weights=w,
        topk_config=topk_config,
        router_logits=logits,
        layer_id=layer,
        num_token_non_padded=count,
        expert_location_dispatch_info=None,
    )
    return out[1], out[0], True  # it returns (topk_ids, topk_weights, ...)


def load_plugin() -> tuple[bool, str]:
    """Load this package's plugin the real way: ``SGLANG_AMD_MOE_FORCE=1`` and SGLang's
    ``load_plugins()``. Returns (hook live, what happened)."""
    os.environ["SGLANG_AMD_MOE_FORCE"] = "1"
    # Imported here, not at the top: this module must import without SGLang (the check
    # reports a missing one itself), and SGLang 0.5.10 has no loader at all.
    try:
        from sglang.srt.plugins import load_plugins
    except ImportError:
        # SGLang 0.5.10 and earlier: no plugin loader; call our entry point directly.
        from sglang_amd_moe.runtime import plugin

        plugin.register()
        how = (
            "no sglang.srt.plugins in this release: called sglang_amd_moe.runtime.plugin.register()"
        )
    else:
        load_plugins()
        how = "sglang.srt.plugins.load_plugins()"
    live = bool(sglang_hook.is_live())
    state = sglang_hook.status()
    if state is None:
        message = "the plugin did not run (not discovered? SGLANG_PLUGINS excludes it?)"
    else:
        message = state.message
    return live, f"{how}: {message}"

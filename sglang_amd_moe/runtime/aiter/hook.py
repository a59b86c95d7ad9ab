"""The aiter sort hook: aiter's MXFP4 (a4w4) aux sort honours ``num_local_tokens`` (the
real row count of a padded CUDA-graph batch) where aiter drops or rejects it.

``count-dropped``: ``_moe_sorting_impl`` is wrapped; an adaptive-branch call (upstream's own
condition, evaluated) without an expert mask, with a count of its own or one its aiter caller
dropped (read from that caller's frame), goes to ``kernels.adaptive_moe_sort``; every other
call to aiter, unchanged. ``count-rejected``: besides, ``_mxfp4_inline_sort_unsupported``
stops rejecting a call for its count alone, and ``aiter.mxfp4_moe_sort`` takes one. When our
sort fails for a call, aiter's runs on ``plain_guard``'s routing.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import types
from dataclasses import dataclass
from typing import Any

from sglang_amd_moe.runtime.aiter import forms
from sglang_amd_moe.runtime.aiter.base import TARGET, ModuleTarget, our_kernels, plain_guard
from sglang_amd_moe.runtime.target import Args, HookStatus, Refusal, find_marked, mark, params_of

NAME = "aiter"  # HookStatus.target of this hook
_COUNT = forms.COUNT
_FIXABLE = ("count-dropped", "count-rejected")
_DEPTH = 8  # how many frames above the hook the caller that dropped the count may be


@dataclass(frozen=True)
class Runtime:
    """What the running ``aiter.fused_moe`` (and this package) offer, read without calling
    (parameters: None where the attribute is missing or has no signature)."""

    impl_params: tuple[str, ...] | None = None  # _moe_sorting_impl
    impl_marked: bool = False
    backend_present: bool = False
    unsupported_params: tuple[str, ...] | None = None  # _mxfp4_inline_sort_unsupported
    unsupported_marked: bool = False
    aux_present: bool = False  # aiter.mxfp4_moe_sort
    aux_params: tuple[str, ...] | None = None
    aux_marked: bool = False
    kernels_error: str = ""  # why sglang_amd_moe.kernels cannot serve the hook


@dataclass(frozen=True)
class Plan:
    form: str
    wrap_impl: bool  # _moe_sorting_impl: counted adaptive calls to our sort
    unreject: bool  # _mxfp4_inline_sort_unsupported: no rejection for the count alone
    accept_count: bool  # aiter.mxfp4_moe_sort: takes num_local_tokens


def decide(report: forms.FormReport, rt: Runtime) -> Plan | Refusal:
    """The plan for ``report`` (what the file says) given ``rt`` (what is running). Pure."""
    form = report.form
    if form in ("count-honored", "absent"):
        return Refusal("not-needed", forms.ACTIONS[form])
    if form not in _FIXABLE:
        why = report.reason or "unrecognised"
        sha = report.source_sha256[:16] or "none"
        return Refusal("refused", f"{forms.ACTIONS['unknown']} ({why}; sha256 {sha})")
    if rt.impl_marked or rt.unsupported_marked:
        return Refusal("refused", "already wrapped by another copy of sglang-amd-moe; left as is")
    if rt.kernels_error:
        return Refusal("error", rt.kernels_error)
    impl = f"{TARGET}.{forms.SORT_IMPL}"
    if rt.impl_params is None:
        return Refusal("refused", f"{impl} is missing or has no signature at run time")
    threaded = report.impl_passes_count and report.adaptive_passes_count
    wrap_impl = not threaded or bool(report.count_dropping_callers)
    missing = [p for p in forms.IMPL_PARAMS_READ if p not in rt.impl_params]
    if wrap_impl and missing:
        return Refusal("refused", f"{impl} differs at run time (no {missing})")
    if wrap_impl and not rt.backend_present:
        return Refusal("refused", f"{TARGET}.{report.backend_var} is missing at run time")
    unreject = form == "count-rejected"
    if unreject and _COUNT not in (rt.unsupported_params or ()):
        why = f"{TARGET}.{forms.INLINE_UNSUPPORTED} cannot be wrapped at run time"
        return Refusal("refused", why)
    takes = _COUNT in (rt.aux_params or ())
    accept_count = unreject and rt.aux_present and not rt.aux_marked and not takes
    return Plan(form, wrap_impl=wrap_impl, unreject=unreject, accept_count=accept_count)


def _runtime(module: types.ModuleType, report: forms.FormReport) -> tuple[Runtime, Any]:
    """What the running module offers (and this package's kernels, for fixable forms)."""
    if report.form not in _FIXABLE:
        return Runtime(), None
    impl = getattr(module, forms.SORT_IMPL, None)
    unsupported = getattr(module, forms.INLINE_UNSUPPORTED, None)
    aux = getattr(sys.modules.get("aiter"), forms.AUX_KERNEL, None)
    ours, error = our_kernels(("adaptive_moe_sort", "mxfp4_moe_sort"))
    backend = hasattr(module, report.backend_var)
    rt = Runtime(params_of(impl), find_marked(impl) is not None, backend, params_of(unsupported),
                 find_marked(unsupported) is not None, aux is not None, params_of(aux),
                 find_marked(aux) is not None, error)  # fmt: skip
    return rt, ours


class AiterHook(ModuleTarget):
    """The aiter sort target (the module-level functions below are its public surface)."""

    name, what, label = NAME, TARGET, "aiter hook"

    def _on_loaded(self, module: types.ModuleType) -> HookStatus:
        origin = getattr(module.__spec__, "origin", None) or getattr(module, "__file__", "") or ""
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):
            text = f"cannot read the source of {TARGET} ({origin or 'no file'}); "
            text += "aiter left untouched"
            return self.record(self.make_status("refused", "unknown", text, origin=origin))
        report = forms.analyze_source(source)
        detail = {"origin": origin, "reason": report.reason, "sha256": report.source_sha256}
        head = f"aiter {origin} form={report.form} ->"
        rt, kernels = _runtime(module, report)
        decision = decide(report, rt)
        if isinstance(decision, Refusal):
            if decision.state == "not-needed":  # the SGLang line is the process's
                text, level = f"{head} {decision.reason}", logging.DEBUG
            else:
                text, level = f"{head} not hooked: {decision.reason}; aiter left untouched", None
            return self.record(
                self.make_status(decision.state, report.form, text, **detail), level=level
            )
        plan, m = [], module
        if decision.wrap_impl:
            f = getattr(m, forms.SORT_IMPL)
            plan.append((m, forms.SORT_IMPL, f, _impl_hook(m, f, report, kernels, self)))
        if decision.unreject:
            f = getattr(m, forms.INLINE_UNSUPPORTED)
            plan.append((m, forms.INLINE_UNSUPPORTED, f, _unreject_hook(f, self)))
        if decision.accept_count:
            m = sys.modules["aiter"]
            f = getattr(m, forms.AUX_KERNEL)
            plan.append((m, forms.AUX_KERNEL, f, _count_taking_aux(f, kernels, self)))
        patched = self.apply(plan)
        text = f"{head} {forms.ACTIONS[report.form]} [{', '.join(patched)}]"
        return self.record(self.make_status("live", report.form, text, patched=patched, **detail))


# --- the three wrappers ----------------------------------------------------------------


def _fell_back(hook: ModuleTarget, where: str, exc: Exception) -> None:
    why = f"{type(exc).__name__}: {exc}"
    text = f"this package's sort failed in {where} ({why}); aiter's ran, padded rows zeroed"
    hook.once(f"{where} {type(exc).__name__}", text, exc_info=True)


def _count_from_caller(topk_ids: Any, callers: frozenset[str], origin: str, hook) -> Any:
    """The count of the nearest enclosing aiter caller ``forms`` named (aiter main:
    ``_fused_moe_impl`` -> ``moe_sorting`` -> the hook), in aiter's own ``fused_moe.py``,
    holding the very same ``topk_ids``."""
    frame = sys._getframe(2)  # skip this function and _route
    for _ in range(_DEPTH):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name in callers and code.co_filename == origin:
            local = frame.f_locals
            return local.get(_COUNT) if local.get("topk_ids") is topk_ids else None
        frame = frame.f_back
    if frame is not None:
        text = f"no aiter caller within {_DEPTH} frames of {forms.SORT_IMPL}: "
        text += "such calls without a count are sorted by aiter over every row"
        hook.once("frame search", text)
    return None


def _impl_hook(module: types.ModuleType, impl: Any, report: forms.FormReport, kernels: Any, hook):
    """AROUND hook on ``_moe_sorting_impl`` (see the module docstring)."""
    sig, read = inspect.signature(impl), Args(impl)
    test = compile(report.branch_test, "<aiter adaptive branch>", "eval")
    callers = frozenset(report.count_dropping_callers) - set(report.rebinding_callers)
    origin = getattr(module, "__file__", None) or ""

    def _route(args: tuple, kwargs: dict) -> tuple[inspect.BoundArguments, Any] | None:
        """The bound call and its count when our sort takes it; None: aiter's."""
        # Most calls (CK/Opus, output_aux=False) go straight back to aiter, unbound.
        if not read.get("output_aux", args, kwargs):
            return None
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            return None  # let aiter raise its own error
        bound.apply_defaults()
        a = bound.arguments
        # Our sort has no expert mask: a masked call stays with aiter, whatever it does.
        if a["expert_mask"] is not None:
            return None
        count = a[_COUNT]
        if count is None and callers:
            count = _count_from_caller(a["topk_ids"], callers, origin, hook)
        if count is None:
            return None
        scope = {**a, "M": a["topk_ids"].shape[0], "topk": a["topk_ids"].shape[1]}
        scope[report.backend_var] = getattr(module, report.backend_var)
        if not eval(test, {"__builtins__": {}}, scope):  # noqa: S307 - pure, checked by forms
            return None  # upstream's own branch condition
        return bound, count

    @functools.wraps(impl)
    def _moe_sorting_impl(*args: Any, **kwargs: Any) -> Any:
        try:
            routed = _route(args, kwargs)
        except Exception:  # deciding failed: aiter's own path decides (and raises) instead
            text = f"routing a {forms.SORT_IMPL} call failed; aiter's own path ran"
            hook.log_call_failure(forms.SORT_IMPL, text)
            routed = None
        if routed is None:
            return impl(*args, **kwargs)
        bound, count = routed
        a = bound.arguments
        ids, weights = a["topk_ids"], a["topk_weights"]
        try:
            return kernels.adaptive_moe_sort(
                ids, weights, a["num_experts"], ids.shape[1], a["block_size"], a["model_dim"],
                atomic=a["accumulate"], emit_aux=True, moebuf_dtype=a["moebuf_dtype"],
                num_local_tokens=count,
            )  # fmt: skip
        except Exception as exc:
            _fell_back(hook, forms.SORT_IMPL, exc)
            a["topk_ids"], a["topk_weights"] = plain_guard(ids, weights, a["num_experts"], count)
            return impl(*bound.args, **bound.kwargs)

    return mark(_moe_sorting_impl, impl)


def _unreject_hook(unsupported: Any, hook):
    """Wrap ``_mxfp4_inline_sort_unsupported`` so a count alone no longer rejects a call."""
    sig = inspect.signature(unsupported)

    @functools.wraps(unsupported)
    def _mxfp4_inline_sort_unsupported(*args: Any, **kwargs: Any) -> Any:
        reason = unsupported(*args, **kwargs)
        if not reason:
            return reason
        try:
            bound = sig.bind(*args, **kwargs)
            if bound.arguments.get(_COUNT) is None:
                return reason
            bound.arguments[_COUNT] = None
            without_count = unsupported(*bound.args, **bound.kwargs)
        except Exception:  # keep aiter's verdict: its other path honours the count
            text = "re-asking aiter without the count failed; aiter's verdict kept"
            hook.log_call_failure(forms.INLINE_UNSUPPORTED, text)
            return reason
        return without_count if not without_count else reason

    return mark(_mxfp4_inline_sort_unsupported, unsupported)


def _count_taking_aux(original: Any, kernels: Any, hook):
    """``aiter.mxfp4_moe_sort`` that also takes ``num_local_tokens`` (routed to ours)."""
    ours = kernels.mxfp4_moe_sort
    our_sig = inspect.signature(ours)

    @functools.wraps(original)
    def mxfp4_moe_sort(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = our_sig.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)
        rest = dict(bound.arguments)
        count = rest.pop(_COUNT, None)
        if count is None:
            return original(**rest) if _COUNT in bound.arguments else original(*args, **kwargs)
        try:
            return ours(*args, **kwargs)
        except Exception as exc:  # aiter's kernel, on rows the count marks as padding zeroed
            _fell_back(hook, forms.AUX_KERNEL, exc)
            ids, weights = rest["topk_ids"], rest["topk_weight"]
            rest["topk_ids"], rest["topk_weight"] = plain_guard(ids, weights, rest["NE"], count)
            return original(**rest)

    try:
        sig = inspect.signature(original)
        count = inspect.Parameter(_COUNT, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
        mxfp4_moe_sort.__signature__ = sig.replace(parameters=[*sig.parameters.values(), count])
    except (TypeError, ValueError):
        pass
    # aiter.ops.moe_mxfp4_aux (where aiter defines it) is rebound with the other copies.
    return mark(mxfp4_moe_sort, original)


HOOK = AiterHook()
install = HOOK.install
status = HOOK.status
is_live = HOOK.is_live
uninstall = HOOK.uninstall

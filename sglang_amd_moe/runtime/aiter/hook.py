"""The aiter hook: aiter's MXFP4 (a4w4) aux sort honours ``num_local_tokens`` (the real
row count of a padded CUDA-graph batch, a device tensor) wherever aiter drops or rejects it.

Per form of ``aiter/fused_moe.py`` (``forms`` reads it; never a version string):
``count-dropped``: ``_moe_sorting_impl`` is wrapped; an adaptive-branch call (upstream's
own condition, evaluated) that carries a count, or whose aiter caller dropped it
(``caller_count``), goes to :func:`sglang_amd_moe.kernels.adaptive_moe_sort`; every other
call goes to aiter unchanged. ``count-rejected``: ``_mxfp4_inline_sort_unsupported`` stops
rejecting a call only for its count, and the sort such calls reach honours it (the same
wrapper, and a count-taking ``aiter.mxfp4_moe_sort`` where aiter's takes none).
``count-honored``, ``absent``: nothing; ``unknown``: nothing, and one WARNING.

aiter is imported lazily (SGLang with ``SGLANG_USE_AITER=1``, ATOM), so ``aiter.fused_moe``
is patched at once if imported, else right after it executes (state ``pending`` until
then); the hook never imports aiter itself. ``from aiter.fused_moe import X`` copies are
rebound. A call without a count is left to aiter: nothing in it says which rows are padding.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import sys
import types
from dataclasses import dataclass
from typing import Any

from sglang_amd_moe.runtime.aiter import forms
from sglang_amd_moe.runtime.aiter.caller_count import BranchCondition, count_from_caller
from sglang_amd_moe.runtime.target import (
    Gate,
    HookStatus,
    Refusal,
    Target,
    find_marked,
    forget,
    holds,
    mark,
    rebind_copies,
    watching,
    when_imported,
)

logger = logging.getLogger("sglang_amd_moe")

TARGET = "aiter.fused_moe"
#: ``HookStatus.target`` of this hook.
NAME = "aiter"
_COUNT = forms.COUNT
_FIXABLE = ("count-dropped", "count-rejected")
_KERNELS_NEEDED = ("adaptive_moe_sort", "mxfp4_moe_sort")


# --- the decision (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class Runtime:
    """What the running ``aiter.fused_moe`` (and this package) offer, read without calling.

    Parameter tuples are None when the attribute is missing, not callable or has no
    signature.
    """

    impl_params: tuple[str, ...] | None = None
    impl_marked: bool = False
    backend_present: bool = False
    unsupported_params: tuple[str, ...] | None = None
    unsupported_marked: bool = False
    #: ``aiter.mxfp4_moe_sort``: present, its parameters (None: no signature), marked.
    aux_present: bool = False
    aux_params: tuple[str, ...] | None = None
    aux_marked: bool = False
    #: Why ``sglang_amd_moe.kernels`` cannot serve the hook ("" when it can, or unchecked).
    kernels_error: str = ""


@dataclass(frozen=True)
class Plan:
    """What to wrap for a fixable form."""

    form: str
    #: Wrap ``_moe_sorting_impl`` (route counted adaptive calls to our sort).
    wrap_impl: bool
    #: Wrap ``_mxfp4_inline_sort_unsupported`` (stop rejecting for the count alone).
    unreject: bool
    #: Wrap ``aiter.mxfp4_moe_sort`` so it accepts ``num_local_tokens``.
    accept_count: bool

    def targets(self) -> tuple[str, ...]:
        names = [forms.SORT_IMPL] if self.wrap_impl else []
        names += [forms.INLINE_UNSUPPORTED] if self.unreject else []
        names += [f"aiter.{forms.AUX_KERNEL}"] if self.accept_count else []
        return tuple(names)


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
    impl = forms.SORT_IMPL
    if rt.impl_params is None:
        return Refusal("refused", f"{TARGET}.{impl} is missing or has no signature at run time")
    wrap_impl = not (report.impl_passes_count and report.adaptive_passes_count) or bool(
        report.count_dropping_callers
    )
    if wrap_impl:
        missing = [p for p in forms.IMPL_PARAMS_READ if p not in rt.impl_params]
        if missing:
            return Refusal("refused", f"{TARGET}.{impl} differs at run time (no {missing})")
        if not report.branch_test or not report.backend_var:
            return Refusal("refused", f"{TARGET}.{impl} has no adaptive branch to evaluate")
        if not rt.backend_present:
            return Refusal("refused", f"{TARGET}.{report.backend_var} is missing at run time")
    unreject = form == "count-rejected"
    accept_count = False
    if unreject:
        if rt.unsupported_params is None or _COUNT not in rt.unsupported_params:
            unsupported = forms.INLINE_UNSUPPORTED
            return Refusal("refused", f"{TARGET}.{unsupported} cannot be wrapped at run time")
        accept_count = rt.aux_present and not rt.aux_marked and _COUNT not in (rt.aux_params or ())
    return Plan(form, wrap_impl=wrap_impl, unreject=unreject, accept_count=accept_count)


@dataclass
class _Patch:
    module: types.ModuleType
    attr: str
    original: Any
    replacement: Any


def _read_source(module: types.ModuleType) -> tuple[str | None, str]:
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None) or getattr(module, "__file__", None) or ""
    if origin.endswith(".py"):
        try:
            with open(origin, encoding="utf-8") as fh:
                return fh.read(), origin
        except OSError:
            pass
    try:
        return inspect.getsource(module), origin
    except (OSError, TypeError):
        return None, origin


def _params(fn: Any) -> tuple[str, ...] | None:
    if not callable(fn):
        return None
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _kernels() -> tuple[Any | None, str]:
    """This package's kernels module, or why it cannot serve the hook."""
    try:
        from sglang_amd_moe import kernels
    except Exception as exc:
        return None, f"sglang_amd_moe.kernels does not import ({type(exc).__name__}: {exc})"
    missing = [n for n in _KERNELS_NEEDED if not callable(getattr(kernels, n, None))]
    if missing:
        return None, f"sglang_amd_moe.kernels lacks {', '.join(missing)}"
    return kernels, ""


def _runtime(module: types.ModuleType, report: forms.FormReport) -> tuple[Runtime, Any]:
    """What the running module offers (and this package's kernels, for fixable forms)."""
    if report.form not in _FIXABLE:
        return Runtime(), None
    impl = getattr(module, forms.SORT_IMPL, None)
    unsupported = getattr(module, forms.INLINE_UNSUPPORTED, None)
    pkg = sys.modules.get("aiter")
    aux = getattr(pkg, forms.AUX_KERNEL, None) if pkg is not None else None
    kernels, error = _kernels()
    rt = Runtime(
        impl_params=_params(impl),
        impl_marked=find_marked(impl) is not None,
        backend_present=bool(report.backend_var) and hasattr(module, report.backend_var),
        unsupported_params=_params(unsupported),
        unsupported_marked=find_marked(unsupported) is not None,
        aux_present=aux is not None,
        aux_params=_params(aux),
        aux_marked=find_marked(aux) is not None,
        kernels_error=error,
    )
    return rt, kernels


class AiterHook(Target):
    """The aiter target (the module-level functions below are its public surface)."""

    name, what, upstream = NAME, TARGET, "aiter"

    def __init__(self) -> None:
        super().__init__()
        self.report: forms.FormReport | None = None
        self.patches: list[_Patch] = []

    def _install(self, gate: Gate) -> HookStatus:
        module = sys.modules.get(TARGET)
        if module is None:
            try:
                spec = importlib.util.find_spec("aiter")
            except Exception as exc:  # a broken sys.path entry or a half-imported aiter
                text = f"cannot look up aiter ({type(exc).__name__}: {exc}); aiter hook not needed"
                return self.record(self.make_status("not-needed", None, text), level=logging.DEBUG)
            # A bare directory named aiter on sys.path is a namespace package (no origin);
            # the real aiter is a regular package, which would win over it.
            if spec is None or spec.origin in (None, "namespace"):
                text = "aiter is not installed; aiter hook not needed"
                return self.record(self.make_status("not-needed", None, text), level=logging.DEBUG)
        when_imported(TARGET, self._on_import)
        if module is None:
            text = f"aiter hook pending: {TARGET} is patched when it is imported"
            return self.record(self.make_status("pending", None, text), level=logging.DEBUG)
        return self._on_loaded(module)

    def _still_hooked(self) -> bool:
        st = self._status
        if st is not None and st.state == "pending":
            return watching(TARGET) and TARGET not in sys.modules
        return self.is_live()

    def is_live(self) -> bool:
        """Every wrapper of this hook is in place now (possibly under others')."""
        with self.lock:
            return bool(self.patches) and all(
                holds(getattr(p.module, p.attr, None), p.replacement) for p in self.patches
            )

    def _undo(self) -> None:
        for p in reversed(self.patches):
            if getattr(p.module, p.attr, None) is p.replacement:
                setattr(p.module, p.attr, p.original)
        forget(TARGET, self._on_import)
        self.patches, self.report = [], None

    def _on_import(self, module: types.ModuleType) -> None:
        with self.lock:
            try:
                self._on_loaded(module)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - ours must not fail aiter's import
                text = f"aiter hook failed ({type(exc).__name__}: {exc}); aiter left untouched"
                self.record(self.make_status("error", None, text), exc_info=True)

    def _on_loaded(self, module: types.ModuleType) -> HookStatus:
        """Classify ``module`` (``aiter.fused_moe``), decide, and patch per the plan."""
        source, origin = _read_source(module)
        if source is None:
            text = (
                f"cannot read the source of {TARGET} ({origin or 'no file'}); aiter left untouched"
            )
            return self.record(self.make_status("refused", "unknown", text, origin=origin))
        report = self.report = forms.analyze_source(source)
        detail = {"origin": origin, "reason": report.reason, "sha256": report.source_sha256}
        head = f"aiter {origin} form={report.form} ->"
        rt, kernels = _runtime(module, report)
        decision = decide(report, rt)
        if isinstance(decision, Refusal):
            if decision.state == "not-needed":
                text, level = (
                    f"{head} {decision.reason}",
                    logging.DEBUG,
                )  # the SGLang line is the process's
            else:
                text, level = f"{head} not hooked: {decision.reason}; aiter left untouched", None
            st = self.make_status(decision.state, report.form, text, **detail)
            return self.record(st, level=level)
        self.patches = _apply(self._build(module, report, decision, kernels))
        patched = sorted({f"{p.module.__name__}.{p.attr}" for p in self.patches})
        text = f"{head} {forms.ACTIONS[report.form]} [{', '.join(patched)}]"
        return self.record(self.make_status("live", report.form, text, patched=patched, **detail))

    def _build(self, module, report: forms.FormReport, plan: Plan, kernels: Any) -> list[tuple]:
        """(module, attribute, original, replacement) for every wrapper the plan asks for."""
        out: list[tuple[types.ModuleType, str, Any, Any]] = []
        if plan.wrap_impl:
            impl = getattr(module, forms.SORT_IMPL)
            wrapper = _impl_hook(module, impl, report, kernels, self.log_call_failure)
            out.append((module, forms.SORT_IMPL, impl, wrapper))
        if plan.unreject:
            unsupported = getattr(module, forms.INLINE_UNSUPPORTED)
            wrapper = _unreject_hook(unsupported, self.log_call_failure)
            out.append((module, forms.INLINE_UNSUPPORTED, unsupported, wrapper))
        if plan.accept_count:
            pkg = sys.modules["aiter"]
            original = getattr(pkg, forms.AUX_KERNEL)
            wrapper = _count_taking_aux(original, kernels, self.log_call_failure)
            out.append((pkg, forms.AUX_KERNEL, original, wrapper))
        return out


def _apply(plan: list[tuple[types.ModuleType, str, Any, Any]]) -> list[_Patch]:
    """Set every planned attribute, then rebind ``from ... import`` copies of the originals."""
    applied: list[_Patch] = []
    for module, attr, original, replacement in plan:
        setattr(module, attr, replacement)
        applied.append(_Patch(module, attr, original, replacement))
    done = {(id(p.module), p.attr) for p in applied}
    for _, attr, original, replacement in plan:
        for mod, name in rebind_copies(original, replacement, name=attr, skip=done):
            applied.append(_Patch(mod, name, original, replacement))
            done.add((id(mod), name))
    return applied


# --- the three wrappers ----------------------------------------------------------------


_FAILED = (
    "the {} hook failed; aiter's own path ran instead "
    "(num_local_tokens is not honored for this call)"
)


def _impl_hook(module: types.ModuleType, impl: Any, report: forms.FormReport, kernels: Any, fail):
    """AROUND hook on ``_moe_sorting_impl`` (see the module docstring)."""
    sig = inspect.signature(impl)
    branch = BranchCondition(report.branch_test, module, report.backend_var)
    callers = frozenset(report.count_dropping_callers)
    origin = getattr(module, "__file__", None) or ""
    adaptive = kernels.adaptive_moe_sort
    # output_aux read without binding: most calls (CK/Opus, output_aux=False) go straight
    # back to aiter, and binding costs several microseconds of host time per call.
    aux_param = sig.parameters["output_aux"]
    aux_pos = (
        list(sig.parameters).index("output_aux")
        if aux_param.kind in (aux_param.POSITIONAL_ONLY, aux_param.POSITIONAL_OR_KEYWORD)
        else None
    )
    aux_default = None if aux_param.default is aux_param.empty else aux_param.default

    def _route(args: tuple, kwargs: dict) -> Any:
        """Our sort's result for a count-carrying adaptive call, else ``_UPSTREAM``."""
        if "output_aux" in kwargs:
            output_aux = kwargs["output_aux"]
        elif aux_pos is not None and aux_pos < len(args):
            output_aux = args[aux_pos]
        else:
            output_aux = aux_default
        if not output_aux:
            return _UPSTREAM
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            return _UPSTREAM  # let aiter raise its own error
        bound.apply_defaults()
        a = bound.arguments
        if not a["output_aux"]:
            return _UPSTREAM
        topk_ids = a["topk_ids"]
        count = a[_COUNT]
        if count is None and callers:
            count = count_from_caller(topk_ids, callers, origin)
        if count is None:
            return _UPSTREAM
        rows, topk = topk_ids.shape
        if not branch.holds(a, rows, topk):  # upstream's own branch condition
            return _UPSTREAM
        return adaptive(
            topk_ids,
            a["topk_weights"],
            a["num_experts"],
            topk,
            a["block_size"],
            a["model_dim"],
            atomic=a["accumulate"],
            emit_aux=True,
            moebuf_dtype=a["moebuf_dtype"],
            num_local_tokens=count,
        )

    @functools.wraps(impl)
    def _moe_sorting_impl(*args: Any, **kwargs: Any) -> Any:
        try:
            out = _route(args, kwargs)
        except Exception:  # never take the forward down: aiter's own path instead
            fail(forms.SORT_IMPL, _FAILED.format(forms.SORT_IMPL))
            out = _UPSTREAM
        return impl(*args, **kwargs) if out is _UPSTREAM else out

    return mark(_moe_sorting_impl, impl)


_UPSTREAM = object()  # a wrapper's "call aiter's own function" answer


def _unreject_hook(unsupported: Any, fail):
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
        except Exception:  # keep aiter's own verdict
            fail(forms.INLINE_UNSUPPORTED, _FAILED.format(forms.INLINE_UNSUPPORTED))
            return reason
        return without_count if not without_count else reason

    return mark(_mxfp4_inline_sort_unsupported, unsupported)


def _count_taking_aux(original: Any, kernels: Any, fail):
    """``aiter.mxfp4_moe_sort`` that also takes ``num_local_tokens`` (routed to ours)."""
    try:
        orig_sig: inspect.Signature | None = inspect.signature(original)
    except (TypeError, ValueError):
        orig_sig = None
    ours = kernels.mxfp4_moe_sort
    our_sig = inspect.signature(ours)

    @functools.wraps(original)
    def mxfp4_moe_sort(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = our_sig.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)
        count = bound.arguments.get(_COUNT)
        rest = {k: v for k, v in bound.arguments.items() if k != _COUNT}
        if count is None:
            if _COUNT not in bound.arguments:
                return original(*args, **kwargs)
            return original(**rest)
        try:
            return ours(*args, **kwargs)
        except Exception:  # never take the forward down: aiter's kernel, without the count
            fail(forms.AUX_KERNEL, _FAILED.format(forms.AUX_KERNEL))
            return original(**rest)

    if orig_sig is not None:
        params = list(orig_sig.parameters.values())
        params.append(
            inspect.Parameter(_COUNT, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
        )
        mxfp4_moe_sort.__signature__ = orig_sig.replace(parameters=params)  # type: ignore[attr-defined]
    # aiter.ops.moe_mxfp4_aux (where aiter defines it) is rebound with the other copies.
    return mark(mxfp4_moe_sort, original)


HOOK = AiterHook()
install = HOOK.install
status = HOOK.status
is_live = HOOK.is_live
uninstall = HOOK.uninstall

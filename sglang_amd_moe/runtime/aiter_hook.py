"""The aiter hook: make aiter's MXFP4 (a4w4) aux sort honour ``num_local_tokens`` wherever
aiter drops or rejects it.

``num_local_tokens`` is the real row count of a padded CUDA-graph batch, a 1-element
device tensor a caller passes to ``aiter.fused_moe.fused_moe`` so the MoE sort skips the
padded rows. What the installed aiter does with it is read off the text of
``aiter/fused_moe.py`` by :mod:`sglang_amd_moe.runtime.aiter_forms`, never from a version
string, and this module acts per form:

``count-dropped`` (aiter main since commit b2dd7703df, Jul 2026)
    ``_moe_sorting_impl`` is wrapped (an AROUND hook): a call that takes its adaptive
    branch (``output_aux`` and a sort backend the branch does not exclude, decided by
    evaluating upstream's own condition) and carries a count goes to
    :func:`sglang_amd_moe.kernels.adaptive_moe_sort` with that count; every other call
    goes to aiter unchanged. aiter main drops the count one level earlier too: the
    plain function ``_fused_moe_impl`` (called by the torch custom op ``fused_moe_``,
    which ``fused_moe`` calls) runs ``moe_sorting(..., output_aux=True)`` without it. For
    the callers the classifier names (``FormReport.count_dropping_callers``) the hook
    reads the count from that caller's frame, only from aiter's own ``fused_moe.py``,
    and only when the caller's ``topk_ids`` is the very tensor being sorted.
``count-rejected`` (the aiter tree aiter PR 7083 was written against)
    ``_mxfp4_inline_sort_unsupported`` is wrapped: when it rejects a call that carries a
    count, it is asked again with the count cleared, and only if that answer is
    "supported" is the call let through (every other reason still rejects). The sort
    such calls reach is made to honour the count: the ``_moe_sorting_impl`` hook above,
    and, where ``aiter.mxfp4_moe_sort`` has no ``num_local_tokens`` parameter, a wrapper
    that sends calls passing one to :func:`sglang_amd_moe.kernels.mxfp4_moe_sort` and
    calls without one to aiter's own kernel, unchanged.
``count-honored``, ``absent``
    nothing. ``unknown``: nothing, and one WARNING.

What this can and cannot cover: it honours a count that a caller passes. A call
without one (for ATOM, see the README's aiter section: its non-expert-parallel MoE
calls and its mori v2 path pass none) is left to aiter unchanged: nothing in such a
call says which rows are padding. aiter main also refuses the MXFP4 inline-sort config
when ``expert_mask`` is given (expert parallelism), before any sort runs.

Shape (the same as :mod:`sglang_amd_moe.runtime.sglang_hook`'s, see
:mod:`sglang_amd_moe.runtime.hookstate`): :func:`install` returns a
:class:`~sglang_amd_moe.runtime.hookstate.HookStatus`, :func:`status` the last one,
:func:`uninstall` undoes everything, :func:`is_live` says whether the wrappers are in
place. The decision is :func:`decide`, a pure function of the form report and what the
running module offers (:class:`Runtime`); applying its :class:`Plan` is separate.

aiter is imported lazily by SGLang (``SGLANG_USE_AITER=1``) and by ATOM, so
:func:`install` patches ``aiter.fused_moe`` at once if it is already imported, and
otherwise puts a finder on ``sys.meta_path`` whose loader patches the module right after
it executes, before anything can call it (state ``pending`` until then). It never
imports aiter itself (only ``importlib.util.find_spec("aiter")`` on the top-level name),
never raises, and leaves aiter untouched whenever anything is not as expected. Copies
bound by ``from aiter.fused_moe import X`` (or ``from aiter import mxfp4_moe_sort``) in
loaded modules are rebound too.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import inspect
import logging
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any

from sglang_amd_moe.runtime import aiter_forms
from sglang_amd_moe.runtime import env as _env
from sglang_amd_moe.runtime.hookstate import MARK, HookStatus, announce, find_marked, mark
from sglang_amd_moe.runtime.rebind import rebind_copies

logger = logging.getLogger("sglang_amd_moe")

TARGET = "aiter.fused_moe"
#: ``HookStatus.target`` of this hook.
NAME = "aiter"
_COUNT = aiter_forms.COUNT
_FIXABLE = ("count-dropped", "count-rejected")
_KERNELS_NEEDED = ("adaptive_moe_sort", "mxfp4_moe_sort")

__all__ = [
    "MARK",
    "Plan",
    "Refusal",
    "Runtime",
    "decide",
    "install",
    "is_live",
    "status",
    "uninstall",
]


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
        names = [aiter_forms.SORT_IMPL] if self.wrap_impl else []
        names += [aiter_forms.INLINE_UNSUPPORTED] if self.unreject else []
        names += [f"aiter.{aiter_forms.AUX_KERNEL}"] if self.accept_count else []
        return tuple(names)


@dataclass(frozen=True)
class Refusal:
    """Why nothing is wrapped: ``state`` is ``not-needed``, ``refused`` or ``error``."""

    state: str
    reason: str


def decide(report: aiter_forms.FormReport, rt: Runtime) -> Plan | Refusal:
    """The plan for ``report`` (what the file says) given ``rt`` (what is running). Pure."""
    form = report.form
    if form in ("count-honored", "absent"):
        return Refusal("not-needed", aiter_forms.ACTIONS[form])
    if form not in _FIXABLE:
        why = report.reason or "unrecognised"
        sha = report.source_sha256[:16] or "none"
        return Refusal("refused", f"{aiter_forms.ACTIONS['unknown']} ({why}; sha256 {sha})")
    if rt.impl_marked or rt.unsupported_marked:
        return Refusal("refused", "already wrapped by another copy of sglang-amd-moe; left as is")
    if rt.kernels_error:
        return Refusal("error", rt.kernels_error)
    impl = aiter_forms.SORT_IMPL
    if rt.impl_params is None:
        return Refusal("refused", f"{TARGET}.{impl} is missing or has no signature at run time")
    wrap_impl = not (report.impl_passes_count and report.adaptive_passes_count) or bool(
        report.count_dropping_callers
    )
    if wrap_impl:
        missing = [p for p in aiter_forms.IMPL_PARAMS_READ if p not in rt.impl_params]
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
            unsupported = aiter_forms.INLINE_UNSUPPORTED
            return Refusal("refused", f"{TARGET}.{unsupported} cannot be wrapped at run time")
        accept_count = rt.aux_present and not rt.aux_marked and _COUNT not in (rt.aux_params or ())
    return Plan(form, wrap_impl=wrap_impl, unreject=unreject, accept_count=accept_count)


# --- process state ---------------------------------------------------------------------


@dataclass
class _Patch:
    module: types.ModuleType
    attr: str
    original: Any
    replacement: Any


@dataclass
class _State:
    #: The last status (None: never installed, or uninstalled).
    status: HookStatus | None = None
    report: aiter_forms.FormReport | None = None
    patches: list[_Patch] = field(default_factory=list)


_state = _State()
_lock = threading.RLock()
_busy = threading.local()


# --- public API ------------------------------------------------------------------------


def install() -> HookStatus:
    """Patch aiter now, or when ``aiter.fused_moe`` is imported; never raises.

    Idempotent: while the hook is live or pending, a second call changes nothing and
    logs nothing. States: ``off`` (disabled, or the gate of
    :func:`sglang_amd_moe.runtime.env.gate` is closed), ``not-needed`` (aiter not
    installed, or a form that needs nothing), ``pending`` (finder installed,
    ``aiter.fused_moe`` not imported yet), ``live``, ``refused``, ``error``.
    """
    try:
        with _lock:
            current = _state.status
            if current is not None and current.state == "live" and is_live():
                return current
            if current is not None and current.state == "pending" and _finder_installed():
                if TARGET not in sys.modules:
                    return current
            return _install_locked()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # never take a server down (SystemExit from an import too)
        text = f"aiter hook failed ({type(exc).__name__}: {exc}); aiter left untouched"
        return _record(_status("error", None, text), exc_info=True)


def status() -> HookStatus | None:
    """The last decision in this process (None: never installed, or uninstalled)."""
    with _lock:
        return _state.status


def is_live() -> bool:
    """True when every wrapper of this hook is in place now (possibly under other
    plugins' wrappers, followed through ``__wrapped__``). Imports nothing."""
    with _lock:
        if not _state.patches:
            return False
        return all(_holds(getattr(p.module, p.attr, None), p.replacement) for p in _state.patches)


def _holds(fn: Any, wrapper: Any, depth: int = 32) -> bool:
    for _ in range(depth):
        if fn is None:
            return False
        if fn is wrapper:
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def uninstall() -> None:
    """Restore every patched attribute and remove the import finder."""
    with _lock:
        for p in reversed(_state.patches):
            if getattr(p.module, p.attr, None) is p.replacement:
                setattr(p.module, p.attr, p.original)
        sys.meta_path[:] = [
            f for f in sys.meta_path if not getattr(f, "_sglang_amd_moe_finder", False)
        ]
        _state.__init__()  # type: ignore[misc]


# --- statuses --------------------------------------------------------------------------


def _status(state: str, form: str | None, text: str, **detail: Any) -> HookStatus:
    return HookStatus(NAME, state, form, f"sglang-amd-moe: {text}", detail)


def _record(st: HookStatus, *, level: int | None = None, exc_info: bool = False) -> HookStatus:
    """Keep ``st`` as this process's status and log it if it says something new."""
    with _lock:
        previous, _state.status = _state.status, st
        announce(logger, st, previous, level=level, exc_info=exc_info)
    return st


def _install_locked() -> HookStatus:
    # The same words as the SGLang hook's: register() logs the two as one line.
    if _env.disabled():
        return _record(_status("off", None, "disabled by SGLANG_AMD_MOE_DISABLE=1; nothing hooked"))
    allowed, why = _env.gate()
    if not allowed:
        return _record(_status("off", None, f"{why}; nothing hooked"))
    module = sys.modules.get(TARGET)
    if module is None:
        try:
            spec = importlib.util.find_spec("aiter")
        except Exception as exc:  # a broken sys.path entry or a half-imported aiter
            text = f"cannot look up aiter ({type(exc).__name__}: {exc}); aiter hook not needed"
            return _record(_status("not-needed", None, text), level=logging.DEBUG)
        # A bare directory named aiter on sys.path is a namespace package (no origin);
        # the real aiter is a regular package, which would win over it.
        if spec is None or spec.origin in (None, "namespace"):
            text = "aiter is not installed; aiter hook not needed"
            return _record(_status("not-needed", None, text), level=logging.DEBUG)
    _install_finder()
    if module is None:
        text = f"aiter hook pending: {TARGET} is patched when it is imported"
        return _record(_status("pending", None, text), level=logging.DEBUG)
    return _on_loaded(module)


# --- import-time patching --------------------------------------------------------------


def _finder_installed() -> bool:
    return any(getattr(f, "_sglang_amd_moe_finder", False) for f in sys.meta_path)


def _install_finder() -> None:
    if not _finder_installed():
        sys.meta_path.insert(0, _FusedMoeFinder())


class _FusedMoeFinder(importlib.abc.MetaPathFinder):
    """Finds ``aiter.fused_moe`` through the other finders and wraps its loader."""

    _sglang_amd_moe_finder = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET or getattr(_busy, "active", False):
            return None
        try:
            _busy.active = True
            try:
                spec = None
                for finder in sys.meta_path:
                    if getattr(finder, "_sglang_amd_moe_finder", False):
                        continue
                    find = getattr(finder, "find_spec", None)
                    if find is None:
                        continue
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
            finally:
                _busy.active = False
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return None
            spec.loader = _PatchingLoader(spec.loader)
            return spec
        except Exception:
            logger.exception("sglang-amd-moe: aiter import hook failed; aiter left untouched")
            return None


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then patches the freshly executed module."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)  # aiter's own errors propagate unchanged
        try:
            with _lock:
                _on_loaded(module)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # ours must not fail aiter's import
            text = f"aiter hook failed ({type(exc).__name__}: {exc}); aiter left untouched"
            _record(_status("error", None, text), exc_info=True)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


# --- reading, deciding, applying -------------------------------------------------------


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


def _kernels_error() -> tuple[Any | None, str]:
    """This package's kernels module, or why it cannot serve the hook."""
    try:
        from sglang_amd_moe import kernels
    except Exception as exc:
        return None, f"sglang_amd_moe.kernels does not import ({type(exc).__name__}: {exc})"
    missing = [n for n in _KERNELS_NEEDED if not callable(getattr(kernels, n, None))]
    if missing:
        return None, f"sglang_amd_moe.kernels lacks {', '.join(missing)}"
    return kernels, ""


def _runtime(module: types.ModuleType, report: aiter_forms.FormReport) -> tuple[Runtime, Any]:
    """What the running module offers (and this package's kernels, for fixable forms)."""
    if report.form not in _FIXABLE:
        return Runtime(), None
    impl = getattr(module, aiter_forms.SORT_IMPL, None)
    unsupported = getattr(module, aiter_forms.INLINE_UNSUPPORTED, None)
    pkg = sys.modules.get("aiter")
    aux = getattr(pkg, aiter_forms.AUX_KERNEL, None) if pkg is not None else None
    kernels, error = _kernels_error()
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


def _on_loaded(module: types.ModuleType) -> HookStatus:
    """Classify ``module`` (``aiter.fused_moe``), decide, and patch per the plan."""
    source, origin = _read_source(module)
    if source is None:
        text = f"cannot read the source of {TARGET} ({origin or 'no file'}); aiter left untouched"
        return _record(_status("refused", "unknown", text, origin=origin))
    report = aiter_forms.analyze_source(source)
    _state.report = report
    detail = {"origin": origin, "reason": report.reason, "sha256": report.source_sha256}
    head = f"aiter {origin} form={report.form} ->"
    rt, kernels = _runtime(module, report)
    decision = decide(report, rt)
    if isinstance(decision, Refusal):
        if decision.state == "not-needed":
            text = f"{head} {decision.reason}"
            level = logging.DEBUG  # normal; the SGLang hook's line is the process's line
        else:
            text = f"{head} not hooked: {decision.reason}; aiter left untouched"
            level = None
        return _record(_status(decision.state, report.form, text, **detail), level=level)
    applied = _apply(_build(module, report, decision, kernels))
    _state.patches = applied
    patched = sorted({f"{p.module.__name__}.{p.attr}" for p in applied})
    text = f"{head} {aiter_forms.ACTIONS[report.form]} [{', '.join(patched)}]"
    return _record(_status("live", report.form, text, patched=patched, **detail))


def _build(
    module: types.ModuleType, report: aiter_forms.FormReport, plan: Plan, kernels: Any
) -> list[tuple[types.ModuleType, str, Any, Any]]:
    """(module, attribute, original, replacement) for every wrapper the plan asks for."""
    out: list[tuple[types.ModuleType, str, Any, Any]] = []
    if plan.wrap_impl:
        impl = getattr(module, aiter_forms.SORT_IMPL)
        out.append((module, aiter_forms.SORT_IMPL, impl, _impl_hook(module, impl, report, kernels)))
    if plan.unreject:
        unsupported = getattr(module, aiter_forms.INLINE_UNSUPPORTED)
        out.append(
            (module, aiter_forms.INLINE_UNSUPPORTED, unsupported, _unreject_hook(unsupported))
        )
    if plan.accept_count:
        pkg = sys.modules["aiter"]
        original = getattr(pkg, aiter_forms.AUX_KERNEL)
        out.append((pkg, aiter_forms.AUX_KERNEL, original, _count_taking_aux(original, kernels)))
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


def _impl_hook(module: types.ModuleType, impl: Any, report: aiter_forms.FormReport, kernels: Any):
    """AROUND hook on ``_moe_sorting_impl`` (see the module docstring)."""
    sig = inspect.signature(impl)
    test = compile(report.branch_test, "<aiter adaptive branch>", "eval")
    callers = frozenset(report.count_dropping_callers)
    origin = getattr(module, "__file__", None) or ""
    backend_var = report.backend_var
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
            count = _count_from_caller(topk_ids, callers, origin)
        if count is None:
            return _UPSTREAM
        rows, topk = topk_ids.shape
        env = {**a, "M": rows, "topk": topk, backend_var: getattr(module, backend_var)}
        if not eval(test, {"__builtins__": {}}, env):  # upstream's own branch condition
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
            _log_call_failure(aiter_forms.SORT_IMPL)
            out = _UPSTREAM
        return impl(*args, **kwargs) if out is _UPSTREAM else out

    return mark(_moe_sorting_impl, impl)


_UPSTREAM = object()  # a wrapper's "call aiter's own function" answer
_CALL_FAILURES_LOGGED: set[str] = set()


def _log_call_failure(what: str) -> None:
    """Log (once per wrapped function) that our path failed and aiter's own one ran."""
    if what in _CALL_FAILURES_LOGGED:
        logger.debug(
            "sglang-amd-moe: %s hook failed again; aiter's own path ran", what, exc_info=True
        )
        return
    _CALL_FAILURES_LOGGED.add(what)
    logger.exception(
        "sglang-amd-moe: the %s hook failed; aiter's own path ran instead "
        "(num_local_tokens is not honored for this call)",
        what,
    )


def _count_from_caller(topk_ids: Any, callers: frozenset[str], origin: str) -> Any:
    """The count of the nearest enclosing named aiter caller sorting this ``topk_ids``.

    On aiter main that caller is ``_fused_moe_impl``: ``fused_moe`` -> ``fused_moe_``
    (torch custom op) -> ``_fused_moe_impl`` -> ``moe_sorting`` -> ``_moe_sorting_impl``.
    """
    frame = sys._getframe(2)  # skip this function and the hook
    for _ in range(8):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name in callers and code.co_filename == origin:
            local = frame.f_locals
            if local.get("topk_ids") is topk_ids:
                return local.get(_COUNT)
            return None
        frame = frame.f_back
    return None


def _unreject_hook(unsupported: Any):
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
            _log_call_failure(aiter_forms.INLINE_UNSUPPORTED)
            return reason
        return without_count if not without_count else reason

    return mark(_mxfp4_inline_sort_unsupported, unsupported)


def _count_taking_aux(original: Any, kernels: Any):
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
            _log_call_failure(aiter_forms.AUX_KERNEL)
            return original(**rest)

    if orig_sig is not None:
        params = list(orig_sig.parameters.values())
        params.append(
            inspect.Parameter(_COUNT, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
        )
        mxfp4_moe_sort.__signature__ = orig_sig.replace(parameters=params)  # type: ignore[attr-defined]
    # aiter.ops.moe_mxfp4_aux (where aiter defines it) is rebound with the other copies.
    return mark(mxfp4_moe_sort, original)

"""Make aiter's MXFP4 (a4w4) aux sort honour ``num_local_tokens`` wherever aiter drops or
rejects it (issue 4; BRIEF section 2).

``num_local_tokens`` is the real row count of a padded CUDA-graph batch, a 1-element
device tensor (ATOM passes it on every forward). What the installed aiter does with it is
read off the text of ``aiter/fused_moe.py`` by :mod:`sglang_amd_moe.runtime.aiter_forms`, never
from a version string, and this module acts per form:

``count-dropped`` (aiter main, Aug 2026)
    ``_moe_sorting_impl`` is wrapped (an AROUND hook): a call that takes its adaptive
    branch (``output_aux`` and a sort backend the branch does not exclude, decided by
    evaluating upstream's own condition) and carries a count goes to
    :func:`sglang_amd_moe.kernels.adaptive_moe_sort` with that count; every other call
    goes to aiter unchanged. aiter main drops the count one level earlier too:
    ``fused_moe_`` calls ``moe_sorting(..., output_aux=True)`` without it. For the
    callers the classifier names (``FormReport.count_dropping_callers``) the hook reads
    the count from that caller's frame, and only when the caller's ``topk_ids`` is the
    very tensor being sorted; ``fused_moe_`` is a torch custom op upstream, so wrapping
    it from outside would not reach its body (and would break ``torch.compile`` graphs).
``count-rejected`` (seed 003's tree, before aiter PR 7083)
    ``_mxfp4_inline_sort_unsupported`` is wrapped: when it rejects a call that carries a
    count, it is asked again with the count cleared, and only if that answer is
    "supported" is the call let through (every other reason still rejects). The sort
    such calls reach is made to honour the count: the ``_moe_sorting_impl`` hook above,
    and, where ``aiter.mxfp4_moe_sort`` has no ``num_local_tokens`` parameter, a wrapper
    that sends calls passing one to :func:`sglang_amd_moe.kernels.mxfp4_moe_sort` and
    calls without one to aiter's own kernel, unchanged.
``count-honored``, ``absent``
    nothing. ``unknown``: nothing, and one WARNING.

aiter is imported lazily by SGLang (``SGLANG_USE_AITER=1``) and by ATOM, so
:func:`install` patches ``aiter.fused_moe`` at once if it is already imported, and
otherwise puts a finder on ``sys.meta_path`` whose loader patches the module right after
it executes, before anything can call it. It never imports aiter itself (only
``importlib.util.find_spec("aiter")`` on the top-level name), never raises, and leaves
aiter untouched whenever anything is not as expected. Copies bound by
``from aiter.fused_moe import X`` (or ``from aiter import mxfp4_moe_sort``) in loaded
modules are rebound too.
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
from sglang_amd_moe.runtime.rebind import rebind_copies

logger = logging.getLogger("sglang_amd_moe")

TARGET = "aiter.fused_moe"
#: Attribute set on every wrapper this module installs: the wrapped original.
MARK = "__sglang_amd_moe_original__"
_COUNT = aiter_forms.COUNT


@dataclass
class _Patch:
    module: types.ModuleType
    attr: str
    original: Any
    replacement: Any


@dataclass
class _State:
    #: The form read off the last ``aiter.fused_moe`` seen (None: not seen yet).
    found_form: str | None = None
    report: aiter_forms.FormReport | None = None
    #: The form patched (None: nothing patched).
    form: str | None = None
    patches: list[_Patch] = field(default_factory=list)
    origin: str = ""


_state = _State()
_lock = threading.RLock()
_busy = threading.local()


# --- public API ------------------------------------------------------------------------


def install() -> str:
    """Patch aiter now or when ``aiter.fused_moe`` is imported; never raises.

    Returns what happened: ``"no-aiter"`` (aiter not installed: one DEBUG line, nothing
    else), ``"pending"`` (finder installed, ``aiter.fused_moe`` not imported yet), the
    form found when ``aiter.fused_moe`` was already imported, or ``"error"``.
    """
    try:
        with _lock:
            module = sys.modules.get(TARGET)
            if module is None:
                try:
                    spec = importlib.util.find_spec("aiter")
                except Exception as exc:  # a broken sys.path entry or a half-imported aiter
                    logger.debug(
                        "sglang-amd-moe: cannot look up aiter (%s); aiter hook skipped", exc
                    )
                    return "no-aiter"
                # A bare directory named aiter on sys.path is a namespace package (no
                # origin); the real aiter is a regular package, which would win over it.
                if spec is None or spec.origin in (None, "namespace"):
                    logger.debug("sglang-amd-moe: aiter is not installed; aiter hook not needed")
                    return "no-aiter"
            _install_finder()
            if module is None:
                return "pending"
            return _on_loaded(module)
    except Exception:
        logger.exception("sglang-amd-moe: aiter hook failed; aiter left untouched")
        return "error"


def is_live() -> bool:
    """True when this process's ``aiter.fused_moe`` currently carries this package's patch."""
    with _lock:
        if _state.form is None or not _state.patches:
            return False
        return all(getattr(p.module, p.attr, None) is p.replacement for p in _state.patches)


def installed_form() -> str | None:
    """The form that was found and patched in this process, or None."""
    with _lock:
        return _state.form if is_live() else None


def found_form() -> str | None:
    """The form read off ``aiter.fused_moe`` in this process (patched or not), or None."""
    with _lock:
        return _state.found_form


def status() -> dict[str, Any]:
    """What the hook knows (for the audit): form found, form patched, patched targets."""
    with _lock:
        return {
            "found_form": _state.found_form,
            "installed_form": installed_form(),
            "live": is_live(),
            "pending": _finder_installed() and _state.found_form is None,
            "reason": _state.report.reason if _state.report else "",
            "origin": _state.origin,
            "patched": [f"{p.module.__name__}.{p.attr}" for p in _state.patches],
        }


def uninstall() -> None:
    """Restore every patched attribute and remove the import finder (tests, audits)."""
    with _lock:
        for p in reversed(_state.patches):
            if getattr(p.module, p.attr, None) is p.replacement:
                setattr(p.module, p.attr, p.original)
        sys.meta_path[:] = [
            f for f in sys.meta_path if not getattr(f, "_sglang_amd_moe_finder", False)
        ]
        _state.__init__()  # type: ignore[misc]


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
        except Exception:
            logger.exception("sglang-amd-moe: aiter hook failed; aiter left untouched")

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


# --- deciding and patching -------------------------------------------------------------


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


def _on_loaded(module: types.ModuleType) -> str:
    """Classify ``module`` (``aiter.fused_moe``) and patch it per its form."""
    source, origin = _read_source(module)
    if source is None:
        _state.found_form, _state.report, _state.origin = "unknown", None, origin
        logger.warning(
            "sglang-amd-moe: cannot read the source of %s (%s); aiter left untouched",
            TARGET,
            origin or "no file",
        )
        return "unknown"
    report = aiter_forms.analyze_source(source)
    _state.found_form, _state.report, _state.origin = report.form, report, origin
    form = report.form
    if form in ("count-honored", "absent"):
        logger.debug(
            "sglang-amd-moe: aiter form %s (%s): %s", form, origin, aiter_forms.ACTIONS[form]
        )
        return form
    if form != "count-dropped" and form != "count-rejected":
        logger.warning(
            "sglang-amd-moe: aiter form unknown (%s: %s; sha256 %s): %s",
            origin,
            report.reason,
            report.source_sha256[:16],
            aiter_forms.ACTIONS["unknown"],
        )
        return form
    if _already_patched(module):
        return form
    kernels = _kernels(form)
    if kernels is None:
        return form
    patches = _plan(module, report, kernels)
    if patches is None:
        return form
    applied = _apply(patches)
    _state.form, _state.patches = form, applied
    logger.info(
        "sglang-amd-moe: aiter form %s (%s): %s [%s]",
        form,
        origin,
        aiter_forms.ACTIONS[form],
        ", ".join(sorted({f"{p.module.__name__}.{p.attr}" for p in applied})),
    )
    return form


def _already_patched(module: types.ModuleType) -> bool:
    for name in (aiter_forms.SORT_IMPL, aiter_forms.INLINE_UNSUPPORTED):
        if hasattr(getattr(module, name, None), MARK):
            return True
    return False


def _kernels(form: str) -> Any | None:
    try:
        from sglang_amd_moe import kernels
    except Exception as exc:
        logger.warning(
            "sglang-amd-moe: aiter form %s but sglang_amd_moe.kernels does not import (%s); "
            "aiter left untouched",
            form,
            exc,
        )
        return None
    missing = [n for n in ("adaptive_moe_sort", "mxfp4_moe_sort") if not hasattr(kernels, n)]
    if missing:
        logger.warning(
            "sglang-amd-moe: aiter form %s but sglang_amd_moe.kernels lacks %s; aiter left untouched",
            form,
            ", ".join(missing),
        )
        return None
    import triton.language as tl

    if not hasattr(tl, "gather"):  # the sort kernel needs tl.gather (Triton >= 3.3)
        logger.warning(
            "sglang-amd-moe: aiter form %s but this Triton (%s) lacks tl.gather, which the sort "
            "kernel needs (Triton >= 3.3); aiter left untouched",
            form,
            getattr(sys.modules.get("triton"), "__version__", "?"),
        )
        return None
    return kernels


def _plan(
    module: types.ModuleType, report: aiter_forms.FormReport, kernels: Any
) -> list[tuple[types.ModuleType, str, Any, Any]] | None:
    """(module, attribute, original, replacement) for every patch, or None to do nothing."""
    plan: list[tuple[types.ModuleType, str, Any, Any]] = []
    impl = getattr(module, aiter_forms.SORT_IMPL, None)
    if not callable(impl):
        logger.warning("sglang-amd-moe: %s.%s is missing at run time; aiter left untouched",
                       TARGET, aiter_forms.SORT_IMPL)  # fmt: skip
        return None
    needs_impl_hook = not (report.impl_passes_count and report.adaptive_passes_count) or bool(
        report.count_dropping_callers
    )
    if needs_impl_hook:
        hook = _impl_hook(module, impl, report, kernels)
        if hook is None:
            return None
        plan.append((module, aiter_forms.SORT_IMPL, impl, hook))
    if report.form == "count-rejected":
        unsupported = getattr(module, aiter_forms.INLINE_UNSUPPORTED, None)
        hook = _unreject_hook(unsupported) if callable(unsupported) else None
        if hook is None:
            logger.warning("sglang-amd-moe: %s.%s cannot be wrapped; aiter left untouched",
                           TARGET, aiter_forms.INLINE_UNSUPPORTED)  # fmt: skip
            return None
        plan.append((module, aiter_forms.INLINE_UNSUPPORTED, unsupported, hook))
        plan += _aux_kernel_plan(kernels)
    return plan


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


def _mark(wrapper: Any, original: Any) -> Any:
    setattr(wrapper, MARK, original)
    return wrapper


# --- the three wrappers ----------------------------------------------------------------


def _impl_hook(module: types.ModuleType, impl: Any, report: aiter_forms.FormReport, kernels: Any):
    """AROUND hook on ``_moe_sorting_impl`` (see the module docstring)."""
    try:
        sig = inspect.signature(impl)
    except (TypeError, ValueError):
        logger.warning("sglang-amd-moe: %s.%s has no signature; aiter left untouched",
                       TARGET, aiter_forms.SORT_IMPL)  # fmt: skip
        return None
    missing = [p for p in aiter_forms.IMPL_PARAMS_READ if p not in sig.parameters]
    if missing or not report.branch_test or not report.backend_var:
        logger.warning("sglang-amd-moe: %s.%s differs at run time (%s); aiter left untouched",
                       TARGET, aiter_forms.SORT_IMPL, missing or "no branch")  # fmt: skip
        return None
    if not hasattr(module, report.backend_var):
        logger.warning("sglang-amd-moe: %s.%s is missing; aiter left untouched",
                       TARGET, report.backend_var)  # fmt: skip
        return None
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

    return _mark(_moe_sorting_impl, impl)


_UPSTREAM = object()  # a wrapper's "call aiter's own function" answer
_CALL_FAILURES_LOGGED: set[str] = set()


def _log_call_failure(what: str) -> None:
    """Log (once per wrapped function) that our path failed and aiter's own one ran."""
    if what in _CALL_FAILURES_LOGGED:
        logger.debug("sglang-amd-moe: %s hook failed again; aiter's own path ran", what, exc_info=True)
        return
    _CALL_FAILURES_LOGGED.add(what)
    logger.exception("sglang-amd-moe: the %s hook failed; aiter's own path ran instead "
                     "(num_local_tokens is not honored for this call)", what)  # fmt: skip


def _count_from_caller(topk_ids: Any, callers: frozenset[str], origin: str) -> Any:
    """The count of the nearest enclosing named aiter caller sorting this ``topk_ids``."""
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
    try:
        sig = inspect.signature(unsupported)
    except (TypeError, ValueError):
        return None
    if _COUNT not in sig.parameters:
        return None

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

    return _mark(_mxfp4_inline_sort_unsupported, unsupported)


def _aux_kernel_plan(kernels: Any) -> list[tuple[types.ModuleType, str, Any, Any]]:
    """Where ``aiter.mxfp4_moe_sort`` takes no count, accept one and route it to ours."""
    pkg = sys.modules.get("aiter")
    original = getattr(pkg, aiter_forms.AUX_KERNEL, None) if pkg is not None else None
    if original is None or hasattr(original, MARK):
        return []
    try:
        orig_sig: inspect.Signature | None = inspect.signature(original)
    except (TypeError, ValueError):
        orig_sig = None
    if orig_sig is not None and _COUNT in orig_sig.parameters:
        return []
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
    _mark(mxfp4_moe_sort, original)
    # aiter.ops.moe_mxfp4_aux (where aiter defines it) is rebound with the other copies.
    return [(pkg, aiter_forms.AUX_KERNEL, original, mxfp4_moe_sort)]

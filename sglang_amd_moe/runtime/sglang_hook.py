"""The SGLang hook: guard ``_post_process_topk_ids`` against garbage ids in padded rows.

Why: with CUDA graphs a decode batch is padded to a captured size; rows at and past
``num_token_non_padded`` hold garbage router output. aiter's MoE kernels cannot take
out-of-range or -1 expert ids, and several SGLang releases hand them over unmasked on
HIP (BRIEF section 1, ``sglang_forms``). This module wraps the installed function with
an AROUND hook, registered through SGLang's own ``HookRegistry`` (so its propagation to
``from ... import`` copies and its logging apply), that for the broken forms:

1. fills padded ids with 0 and zeroes their weights before upstream runs (one launch of
   ``sglang_amd_moe.kernels.mask_padded_rows_``), whether or not EPLB is on;
2. adds the logical-to-physical remap when a real expert-location map exists, only for
   forms whose HIP branch lacks it (upstream keeps doing it where it already does), so
   the remap happens exactly once;
3. re-masks after upstream returns when upstream's shared-expert append produced new
   tensors and the form has no trailing weight zeroing of its own.

It acts only while the topk module's own ``_is_hip`` is true at call time; otherwise it
calls upstream unchanged.

One known difference from a fixed release: where the hook adds the remap (forms
``no-hip-handling`` and ``weights-only``) it runs before upstream's body, so upstream's
routed-experts capturer (``--enable-return-routed-experts``, which records ids at the
top of the function) sees physical ids when EPLB is on; a fixed release records logical
ids there. Everything downstream (the expert-distribution recorder, the shared-expert
append, DeepEP's per-rank layout) sees the same ids as in a fixed release. Installation decides from the installed code (AST and
signature), never from the version string, and never raises: any failure is logged and
SGLang is left untouched.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import sys
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_amd_moe.runtime import env as _env
from sglang_amd_moe.runtime.rebind import rebind_copies
from sglang_amd_moe.runtime.sglang_forms import (
    ACTIONS,
    FUNCTION_NAME,
    REMAP_PREDICATES,
    FormReport,
    analyze_source,
)

logger = logging.getLogger("sglang_amd_moe")

TOPK_MODULE = "sglang.srt.layers.moe.topk"
TARGET = f"{TOPK_MODULE}.{FUNCTION_NAME}"
_REQUIRED_PARAMS = ("topk_ids", "topk_weights", "num_token_non_padded")
_HOOK_MARK = "_sglang_amd_moe_hook"
_PREDICATE_ORDER = tuple(sorted(REMAP_PREDICATES))  # remap_enabled runs per hooked call


@dataclass(frozen=True)
class Plan:
    """What the hook does around each call (decided once, at install)."""

    pre_mask: bool
    add_remap: bool
    tail_mask: bool
    verify: bool


@dataclass(frozen=True)
class InstallResult:
    """The outcome of ``install()``: also what the audit reports for this process."""

    #: A form name from ``sglang_forms.FORMS``, or ``disabled``/``skipped``/``error``.
    form: str
    #: Our wrapper is (or, inside ``load_plugins()``, is about to be) in place.
    hooked: bool
    #: The one log line's text.
    message: str
    version: str = ""
    path: str = ""
    report: FormReport | None = None


# Process state: the plan the hook reads, the topk module, and the last result.
_PLAN: Plan | None = None
_TOPK: types.ModuleType | None = None
_POSITIONS: dict[str, int] = {}
_DEFAULTS: dict[str, Any] = {}
_MASK_FN: Callable | None = None
_STATE: InstallResult | None = None
_CALL_ERROR_LOGGED = False


def status() -> InstallResult | None:
    """The result of the last ``install()`` in this process (None if never called)."""
    return _STATE


def install() -> InstallResult:
    """Detect the installed form and hook it if it needs it. Never raises.

    Idempotent: once the hook is live (or registered and waiting for
    ``load_plugins()`` to apply it) a second call changes nothing and logs nothing.
    """
    global _STATE
    if _STATE is not None and _STATE.hooked and (is_live() or _registered_pending()):
        logger.debug("sglang-amd-moe: SGLang hook already installed; nothing to do")
        return _STATE
    try:
        result = _install()
    except Exception as exc:  # never take a server down
        logger.debug("sglang-amd-moe: install failed", exc_info=True)
        result = InstallResult(
            "error",
            False,
            f"sglang-amd-moe: hooking {TARGET} failed ({type(exc).__name__}: {exc}); "
            "SGLang left untouched",
        )
    first = _STATE is None or (_STATE.form, _STATE.hooked) != (result.form, result.hooked)
    _STATE = result
    if first:
        level = logging.WARNING if result.form in ("absent", "unknown", "error") else logging.INFO
        logger.log(level, "%s", result.message)
    return result


def is_live() -> bool:
    """True when ``sglang.srt.layers.moe.topk._post_process_topk_ids`` is our wrapper now
    (possibly under other plugins' wrappers). Imports nothing."""
    mod = sys.modules.get(TOPK_MODULE)
    fn = getattr(mod, FUNCTION_NAME, None) if mod is not None else None
    for _ in range(32):
        if fn is None:
            return False
        if _holds_our_hook(fn):
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


# --------------------------------------------------------------------------- install


def _install() -> InstallResult:
    global _PLAN, _TOPK, _POSITIONS, _DEFAULTS, _MASK_FN
    if _env.disabled():
        return InstallResult("disabled", False, "sglang-amd-moe: disabled by SGLANG_AMD_MOE_DISABLE=1; nothing hooked")
    allowed, why = _env.platform_reason()
    if not allowed:
        return InstallResult("skipped", False, f"sglang-amd-moe: {why}; nothing hooked")
    version = _sglang_version()
    path = _topk_path()
    head = f"sglang-amd-moe: sglang {version} {FUNCTION_NAME}"
    if path is None:
        return InstallResult("absent", False, f"{head} form=absent -> {TOPK_MODULE} not found; nothing hooked", version)
    report = analyze_source(path.read_text(encoding="utf-8"))
    verify = _env.verify()
    # Not imported yet: the file decides whether importing it is worth it at all. Already
    # imported: the running function decides (below), whatever the file says.
    if TOPK_MODULE not in sys.modules:
        if report.form == "absent":
            return InstallResult(
                "absent", False, f"{head} form=absent -> {ACTIONS['absent']} ({path})", version, str(path), report
            )
        if report.form == "fixed" and not verify:
            return InstallResult("fixed", False, f"{head} form=fixed -> {ACTIONS['fixed']}", version, str(path), report)

    # The hook is needed: look at the live function (what will actually run).
    try:
        mod = importlib.import_module(TOPK_MODULE)
    except Exception as exc:
        return InstallResult(
            "error",
            False,
            f"{head} form={report.form} -> cannot import {TOPK_MODULE} "
            f"({type(exc).__name__}: {exc}); SGLang left untouched",
            version,
            str(path),
            report,
        )
    live = getattr(mod, FUNCTION_NAME, None)
    if not callable(live):
        return InstallResult(
            "absent",
            False,
            f"{head} form=absent -> the imported module has no callable {FUNCTION_NAME} "
            f"(its file {path} has form {report.form}); nothing hooked",
            version,
            str(path),
            report,
        )
    live_report, live_path = _live_report(live)
    live_report = live_report or report
    if live_report.form != report.form:
        logger.warning(
            "sglang-amd-moe: the running %s (form %s, from %s) differs from %s (form %s); following the running one",
            FUNCTION_NAME,
            live_report.form,
            live_path or "unknown source",
            path,
            report.form,
        )
    report = live_report
    if live_path and live_path != str(path):
        path = Path(live_path)
    form = report.form
    if form == "fixed" and not verify:
        return InstallResult("fixed", False, f"{head} form=fixed -> {ACTIONS['fixed']}", version, str(path), report)

    try:
        sig = inspect.signature(live)
    except (TypeError, ValueError) as exc:
        return InstallResult(
            "error", False, f"{head} form={form} -> no signature ({exc}); SGLang left untouched", version, str(path), report
        )
    missing = [p for p in _REQUIRED_PARAMS if p not in sig.parameters]
    add_remap = form in ("no-hip-handling", "weights-only") and not report.hip_remaps
    if add_remap and "expert_location_dispatch_info" not in sig.parameters:
        missing.append("expert_location_dispatch_info")
    if add_remap and _remap_fn(mod) is None:
        missing.append("topk_ids_logical_to_physical (module global)")
    if missing:
        return InstallResult(
            "error",
            False,
            f"{head} form={form} -> signature lacks {', '.join(missing)}; SGLang left untouched",
            version,
            str(path),
            report,
        )
    try:
        from sglang_amd_moe.kernels import mask_padded_rows_
    except Exception as exc:
        return InstallResult(
            "error",
            False,
            f"{head} form={form} -> sglang_amd_moe.kernels.mask_padded_rows_ unavailable "
            f"({type(exc).__name__}: {exc}); SGLang left untouched",
            version,
            str(path),
            report,
        )

    masking = form != "fixed"
    plan = Plan(
        pre_mask=masking,
        add_remap=add_remap,
        tail_mask=masking and form != "unknown" and not report.tail_zeroes_weights,
        verify=verify,
    )
    positions, defaults = {}, {}
    for i, (name, p) in enumerate(sig.parameters.items()):
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positions[name] = i
        if p.default is not p.empty:
            defaults[name] = p.default
    _PLAN, _TOPK, _POSITIONS, _DEFAULTS, _MASK_FN = plan, mod, positions, defaults, mask_padded_rows_

    if is_live():
        how = "already hooked"
    else:
        how = _apply(mod, live)
    action = ACTIONS[form] if masking else "not hooked for masking: upstream already masks padded ids on HIP"
    extras = []
    if form == "unknown":
        extras.append(f"unrecognised function in {path} line {report.lineno}, sha256 {report.function_sha256}: {report.reason}")
    if verify:
        extras.append("SGLANG_AMD_MOE_VERIFY=1: padded rows checked after every call")
    if how:
        extras.append(how)
    message = f"{head} form={form} -> {action}" + (f" [{'; '.join(extras)}]" if extras else "")
    return InstallResult(form, True, message, version, str(path), report)


def _apply(mod: types.ModuleType, live: Callable) -> str:
    """Put the wrapper in place; return a note for the log line ("" for the normal path)."""
    try:
        from sglang.srt.plugins import hook_registry
    except ImportError:
        hook_registry = None
    if hook_registry is None:
        # SGLang 0.5.10 and earlier: no plugin framework. Do what HookRegistry would do
        # (setattr on the module, then rebind `from ... import` copies).
        _apply_directly(mod, live)
        return "no SGLang plugin framework in this release: patched directly"
    registry = hook_registry.HookRegistry
    if TARGET in getattr(registry, "_patched", set()):
        # Another plugin's hooks on this target were applied already; the registry would
        # skip ours, so wrap the live function the same way it would.
        _apply_directly(mod, live)
        return "target already patched by another plugin: wrapped on top of it directly"
    hooks = getattr(registry, "_hooks", {}).get(TARGET, [])
    if not any(h is _around for _, h, _ in hooks):
        registry.register(TARGET, _around, hook_registry.HookType.AROUND)
    inside_loader = getattr(hook_registry, "_current_plugin_source", None)
    if inside_loader is not None and inside_loader.get() is not None:
        return ""  # load_plugins() applies every registered hook right after the plugins ran
    registry.apply_hooks()  # called outside load_plugins(): apply now (idempotent per target)
    if not is_live():
        raise RuntimeError("HookRegistry.apply_hooks() did not install the wrapper (see SGLang's log)")
    return "applied through HookRegistry outside load_plugins()"


def _make_wrapper(original: Callable, hook: Callable) -> Callable:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return hook(original, *args, **kwargs)

    wrapper.__wrapped__ = original
    return wrapper


def _apply_directly(mod: types.ModuleType, original: Callable) -> None:
    wrapped = _make_wrapper(original, _around)
    setattr(mod, FUNCTION_NAME, wrapped)
    rebind_copies(original, wrapped)  # `from ...topk import` copies, aliases included


def _registered_pending() -> bool:
    """Our hook is in SGLang's registry but not applied yet (inside ``load_plugins()``)."""
    registry_mod = sys.modules.get("sglang.srt.plugins.hook_registry")
    if registry_mod is None:
        return False
    registry = registry_mod.HookRegistry
    if TARGET in getattr(registry, "_patched", set()):
        return False
    return any(h is _around for _, h, _ in getattr(registry, "_hooks", {}).get(TARGET, []))


def _holds_our_hook(fn: Any) -> bool:
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if getattr(value, _HOOK_MARK, False):
            return True
    return False


def _live_report(live: Callable) -> tuple[FormReport | None, str]:
    """Classify the function that will actually run (under any wrappers); also its file."""
    try:
        fn = inspect.unwrap(live)
        lines, first = inspect.getsourcelines(fn)
        src = textwrap.dedent("".join(lines))
        where = inspect.getsourcefile(fn) or ""
    except (OSError, TypeError, ValueError):
        return None, ""
    report = analyze_source(src)
    if report.lineno:  # make the line number file-relative, as analyze_source of the file gives
        report = dataclasses.replace(report, lineno=first + report.lineno - 1)
    return report, where


def _sglang_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def _topk_path() -> Path | None:
    """Where topk.py is, without importing it (the decision for `fixed` needs no import)."""
    mod = sys.modules.get(TOPK_MODULE)
    if mod is not None and getattr(mod, "__file__", None):
        return Path(mod.__file__)
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc) / "srt" / "layers" / "moe" / "topk.py"
        if p.is_file():
            return p
    return None


# ------------------------------------------------------------------------------ call


def _remap_fn(mod: types.ModuleType) -> Callable | None:
    fn = getattr(mod, "topk_ids_logical_to_physical", None)
    return fn if callable(fn) else None


def remap_enabled(mod: types.ModuleType | None = None) -> bool:
    """Does a real logical-to-physical expert map exist (BRIEF section 1, step 2)?

    Uses upstream's own predicate when the module has one; otherwise reads the server
    args the way upstream's predicate does. Outside a server (no published args) False.
    """
    mod = mod if mod is not None else sys.modules.get(TOPK_MODULE)
    for name in _PREDICATE_ORDER:
        fn = getattr(mod, name, None)
        if callable(fn):
            return bool(fn())
    try:
        from sglang.srt.server_args import get_global_server_args
    except ImportError:
        return False
    try:
        args = get_global_server_args()
    except ValueError:  # not set: not inside a server
        return False
    except RuntimeError:  # retired accessor (newer SGLang): read the published bag
        try:
            from sglang.srt.runtime_context import get_exec

            args = get_exec().moe
        except Exception:
            return False
    if args is None:
        return False
    return bool(
        getattr(args, "enable_eplb", False)
        or getattr(args, "init_expert_location", "trivial") != "trivial"
        or (getattr(args, "ep_num_redundant_experts", 0) or 0) > 0
    )


def _get(name: str, args: tuple, kwargs: dict) -> Any:
    if name in kwargs:
        return kwargs[name]
    i = _POSITIONS.get(name)
    if i is not None and i < len(args):
        return args[i]
    return _DEFAULTS.get(name)


def _set(name: str, value: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    i = _POSITIONS.get(name)
    if name not in kwargs and i is not None and i < len(args):
        args = (*args[:i], value, *args[i + 1 :])
    else:
        kwargs = {**kwargs, name: value}
    return args, kwargs


def _mask(ids: Any, weights: Any, n: Any) -> None:
    """One launch of ``sglang_amd_moe.kernels.mask_padded_rows_`` (resolved at install)."""
    _MASK_FN(ids, weights, n, fill_value=0)


def _around(original_fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """The AROUND hook (``hook(original_fn, *args, **kwargs)``)."""
    global _CALL_ERROR_LOGGED
    plan, mod = _PLAN, _TOPK
    if plan is None or mod is None or not getattr(mod, "_is_hip", False):
        return original_fn(*args, **kwargs)
    n = _get("num_token_non_padded", args, kwargs)
    ids = _get("topk_ids", args, kwargs)
    weights = _get("topk_weights", args, kwargs)
    call_args, call_kwargs = args, kwargs
    try:
        if plan.pre_mask and n is not None:
            _mask(ids, weights, n)
        if plan.add_remap:
            info = _get("expert_location_dispatch_info", args, kwargs)
            if info is not None and remap_enabled(mod):
                ids = _remap_fn(mod)(ids, info)
                call_args, call_kwargs = _set("topk_ids", ids, args, kwargs)
    except Exception:
        if not _CALL_ERROR_LOGGED:
            logger.exception("sglang-amd-moe: padded-row guard failed; calling upstream unchanged")
            _CALL_ERROR_LOGGED = True
        call_args, call_kwargs = args, kwargs
    out = original_fn(*call_args, **call_kwargs)
    if plan.tail_mask and n is not None:
        try:
            out_ids, out_weights = out[0], out[1]
            if out_weights is not weights or out_ids.shape != ids.shape:
                # A shared-expert append (or a remap) built new tensors after our pre-mask.
                _mask(out_ids, out_weights, n)
        except Exception:
            if not _CALL_ERROR_LOGGED:
                logger.exception("sglang-amd-moe: padded-row re-mask after upstream failed; "
                                 "returning upstream's result")  # fmt: skip
                _CALL_ERROR_LOGGED = True
    if plan.verify and n is not None:
        _verify(out, n, args, kwargs)  # raises by design: SGLANG_AMD_MOE_VERIFY is a debugging aid
    return out


_around._sglang_amd_moe_hook = True  # type: ignore[attr-defined]  (found by is_live())


def _verify(out: Any, n: Any, args: tuple, kwargs: dict) -> None:
    """``SGLANG_AMD_MOE_VERIFY=1``: padded rows must have ids in range and zero weights."""
    out_ids, out_weights = out[0], out[1]
    count = int(n.reshape(-1)[0].item()) if hasattr(n, "reshape") else int(n)
    pad_ids, pad_w = out_ids[count:], out_weights[count:]
    if pad_ids.numel() == 0:
        return
    logits = _get("router_logits", args, kwargs)
    info = _get("expert_location_dispatch_info", args, kwargs)
    cfg = _get("topk_config", args, kwargs)
    num = int(logits.shape[-1]) if logits is not None else 0
    if info is not None:
        num = max(num, int(getattr(info, "num_physical_experts", 0) or 0))
    shared = 0
    for field in ("num_fused_shared_experts", "num_shared_topk_slots"):
        shared = max(shared, int(getattr(cfg, field, 0) or 0))
    bound = num + shared
    if bound == 0:  # no router logits and no dispatch info: nothing to check ids against
        logger.debug("sglang-amd-moe VERIFY: no expert count known for layer %s; ids not checked",
                     _get("layer_id", args, kwargs))  # fmt: skip
        bound = None
    lo, hi = int(pad_ids.min().item()), int(pad_ids.max().item())
    nonzero = int((pad_w != 0).sum().item())
    if lo < 0 or (bound is not None and hi >= bound) or nonzero:
        layer = _get("layer_id", args, kwargs)
        raise RuntimeError(
            f"sglang-amd-moe VERIFY: layer {layer}: padded rows {count}..{out_ids.shape[0] - 1} "
            f"have ids in [{lo}, {hi}] (allowed [0, {bound})) and {nonzero} nonzero weights"
        )

"""The audit's view of the plugin: which hosts can load it (SGLang, vLLM for aiter), what
blocks them, and with ``--load`` the hooks' statuses and what the function does when run."""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_amd_moe.diagnostics import patching
from sglang_amd_moe.diagnostics.audit import read
from sglang_amd_moe.diagnostics.audit.read import (
    AITER,
    PATCH_FAILS_PROBE,
    SGLANG,
    AuditError,
    TargetReport,
    distribution,
    find_package_dir,
    text_or_none,
)
from sglang_amd_moe.runtime import env
from sglang_amd_moe.runtime.sglang import ledger, names
from sglang_amd_moe.runtime.target import HookStatus

OUR_SGLANG_EP = "sglang_amd_moe.runtime.plugin:register"
OUR_VLLM_EP = "sglang_amd_moe.runtime.plugin:register_vllm"
HOOK_MODULES = {
    SGLANG: "sglang_amd_moe.runtime.sglang.hook",
    AITER: "sglang_amd_moe.runtime.aiter.hook",
}


@dataclass
class PluginView:
    """This environment's plugin machinery (decided without importing SGLang)."""

    sglang_dir: Path | None
    aiter_dir: Path | None
    sglang_loader: bool
    sglang_ep: md.EntryPoint | None
    vllm_installed: bool
    vllm_ep: md.EntryPoint | None
    loaded: bool = False  # --load ran load_plugins() in this process
    #: Problems of the environment itself (each needs attention).
    problems: list[str] = field(default_factory=list)


def _entry_point(group: str, value: str) -> md.EntryPoint | None:
    try:
        eps = md.entry_points(group=group)
    except Exception:
        return None
    return next((ep for ep in eps if ep.value.replace(" ", "") == value), None)


def _triton_clash() -> str:  # both own the triton/ files: one overwrote the other
    try:
        rocm, cuda = md.version("pytorch-triton-rocm"), md.version("triton")
    except Exception:  # PackageNotFoundError: not both (the usual case)
        return ""
    return (
        f"both triton {cuda} and pytorch-triton-rocm {rocm} are installed: they own the same "
        "triton/ files, so one overwrote the other. Uninstalling triton deletes those files too: "
        "run `python -m pip uninstall -y triton` and then `python -m pip install "
        f"--force-reinstall --no-deps pytorch-triton-rocm=={rocm}` from the PyTorch ROCm index "
        "your torch came from"
    )


def plugin_view() -> PluginView:
    sglang_dir = find_package_dir("sglang")
    init = text_or_none(sglang_dir / "srt" / "plugins" / "__init__.py") if sglang_dir else None
    return PluginView(
        sglang_dir=sglang_dir,
        aiter_dir=find_package_dir("aiter"),
        # SGLang 0.5.11+ ships sglang/srt/plugins with load_plugins; 0.5.10 does not.
        sglang_loader=init is not None and "def load_plugins" in init,
        sglang_ep=_entry_point("sglang.srt.plugins", OUR_SGLANG_EP),
        vllm_installed=find_package_dir("vllm") is not None,
        vllm_ep=_entry_point("vllm.general_plugins", OUR_VLLM_EP),
        problems=[p for p in (_triton_clash(),) if p],
    )


@dataclass(frozen=True)
class Route:
    """One host that can load the plugin, and what blocks it (``cell``: the HOOK cell when
    blocked, "" when the plugin loads through it)."""

    host: str
    cell: str = ""
    why: str = ""


def routes(target: str, view: PluginView) -> list[Route]:
    sglang = view.sglang_dir is not None
    out = [_route("SGLang", sglang, view.sglang_loader, view.sglang_ep, "SGLANG_PLUGINS")]
    if target == AITER:  # vLLM loads general plugins in every release
        out.append(_route("vLLM", view.vllm_installed, True, view.vllm_ep, "VLLM_PLUGINS"))
    return out


def _route(host: str, installed: bool, loader: bool, ep: Any, list_var: str) -> Route:
    if not installed:
        return Route(host, "off", f"{host} is not installed here")
    if not loader:  # SGLang 0.5.10 and 0.5.10.post1
        version = distribution("sglang")[1] or "here"
        why = f"SGLang {version} has no plugin loader (sglang.srt.plugins): the plugin cannot load"
        return Route(host, "no loader", why + " here")
    if ep is None:
        why = f"sglang-amd-moe's {host} entry point is not registered (is it installed here?)"
        return Route(host, "off", why)
    off = ""
    if env.disabled():
        off = "SGLANG_AMD_MOE_DISABLE is set"
    else:
        allowed = os.environ.get(list_var, "")
        listed = {x.strip() for x in allowed.split(",") if x.strip()}
        if listed and ep.name not in listed:
            off = f"{list_var}={allowed} does not list {ep.name}"
    return Route(host, "off", f"plugin disabled: {off}") if off else Route(host)


def run_load_plugins(view: PluginView) -> None:
    """``--load``: SGLang's real ``load_plugins()``."""
    if not view.sglang_loader:
        return  # nothing to run; the SGLang route says why
    try:
        importlib.import_module("sglang.srt.plugins").load_plugins()
    except Exception as exc:
        raise AuditError(f"load_plugins() failed: {type(exc).__name__}: {exc}") from exc
    view.loaded = True


def hook_module(target: str) -> Any:
    return sys.modules.get(HOOK_MODULES[target])  # never imported here: only read


def hook_status(target: str) -> HookStatus | None:
    """The hook's last decision in this process (None: none)."""
    mod = hook_module(target)
    if mod is None:
        return None
    try:
        st = mod.status()
    except Exception as exc:
        why = f"{target} hook status() failed: {type(exc).__name__}: {exc}"
        return HookStatus(target, "error", None, why)
    if st is None or isinstance(st, HookStatus):
        return st
    why = f"{target} hook status() returned {type(st).__name__}, not HookStatus"
    return HookStatus(target, "error", None, why)


def is_live(target: str) -> bool:
    mod = hook_module(target)
    try:
        return bool(mod.is_live()) if mod is not None else False
    except Exception:
        return False


def platform_gate_closed() -> bool:
    """The plugin stays off here only because torch is not a ROCm build (and no FORCE)."""
    return not env.forced() and read.torch_is_rocm() is not True


def triton_blocks() -> str:
    """Why the installed Triton keeps every hook off ("" when it does not); judged only
    where the platform gate is open here (off ROCm, a ROCm machine brings its own)."""
    return "" if platform_gate_closed() else env.triton_problem()


# --- what running the function shows (--load, SGLang) ---------------------------------


@dataclass(frozen=True)
class Seen:
    """``--load``: what SGLang's ``_post_process_topk_ids`` did on the probe's CPU batch."""

    of: str  # what ran, in words
    result: Any  # ProbeResult of what runs (None: nothing could be run, see why)
    upstream: Any  # ProbeResult of upstream's function alone
    decision: HookStatus | None  # the plugin's decision the run reflects
    previewed: bool = False  # a preview: what a ROCm machine does
    why: str = ""

    @property
    def hooks(self) -> bool:
        return self.decision is not None and self.decision.hooked

    def to_json(self) -> dict:
        r = self.result
        return {
            "of": self.of,
            "ran": bool(r is not None and r.ran),
            "right": bool(r is not None and r.correct),
            "behaviour": behaviour_shown(self.upstream),
            "findings": list(r.findings) if r is not None else [],
            "why": (r.why if r is not None and not r.ran else self.why),
            "plugin": self.decision.state if self.decision is not None else None,
            "previewed": self.previewed,
        }


def behaviour_shown(p: Any) -> str:
    """The form upstream acts as ("" when the probe could not tell)."""
    return p.behaviour if p is not None and p.usable else ""


def import_topk() -> tuple[Any, str]:
    """(SGLang's topk module, "") or (None, why it does not import here)."""
    try:
        return importlib.import_module(names.TOPK_MODULE), ""
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit from an import included
        return None, f"{names.TOPK_MODULE} does not import here ({type(exc).__name__}: {exc})"


def observe_sglang(rep: TargetReport, view: PluginView) -> None:
    """``--load``: run the function on the probe batch as what runs here (the hooked call
    where the hook is live, upstream where nothing hooks it) or, where the hook is off
    only because torch is not a ROCm build, as the plugin makes it on ROCm (a preview);
    then run the form's patch before offering it (:func:`check_patch`)."""
    from sglang_amd_moe.runtime.sglang import hook

    st = rep.status
    off_here = (
        st is not None
        and st.state == "off"
        and platform_gate_closed()
        and not env.disabled()
        and not env.triton_problem()
    )
    first = None
    if view.loaded and st is not None and (st.state == "pending" or off_here):
        first = hook.preview()  # before topk is imported: what a server process decides
    module, why = import_topk()
    if module is None or not callable(getattr(module, names.FUNCTION_NAME, None)):
        why = why or f"{names.TOPK_MODULE} has no callable {names.FUNCTION_NAME}"
        decision = first.status if first is not None else st
        rep.seen = Seen("the function", None, None, decision, first is not None, why)
        rep.probe = rep.seen.to_json()
        return
    if st is not None and st.state == "pending" and hook.is_live():
        st = rep.status = hook_status(SGLANG)  # importing topk applied the pending hook
        rep.hook_state, rep.hook_live = (st.state if st else None), True
    if first is not None and first.upstream is not None:
        upstream = first.upstream
    else:
        upstream = None if env.disabled() else hook.preview().upstream
    if upstream is None and not hook.is_live():
        upstream = hook.observe()  # the plugin is disabled: upstream is what runs
    if st is not None and st.state == "live":
        seen = Seen("the hooked call", hook.observe(), upstream, st)
    elif first is not None and first.status.hooked:
        of = "the hooked call (as the plugin makes it on a ROCm machine)"
        if not off_here:
            of = "the hooked call (as the plugin decided it; SGLang has not applied it yet)"
        seen = Seen(of, first.hooked, upstream, first.status, True)
    elif first is not None:
        seen = Seen("upstream's function", upstream, upstream, first.status, True)
    else:
        seen = Seen("upstream's function", upstream, upstream, st)
    rep.seen, rep.probe = seen, seen.to_json()
    if rep.patch and rep.patch_status == patching.APPLIES:
        check_patch(rep, module, upstream)


def check_patch(rep: TargetReport, module: Any, upstream: Any) -> None:
    """Run the function the form's patch makes on the probe batch: one that applies as
    text but runs wrong is not offered; one the probe cannot run stays checked as text."""
    from sglang_amd_moe.runtime.sglang import probe

    assert rep.patch is not None  # noqa: S101 - checked by the caller
    patched = patching.apply_text(rep.source, patching.read_patch(rep.patch))
    reading = ledger.read(patched)
    result = probe.probe_source(
        module, patched, hip_flags=reading.hip_flags, predicates=reading.predicates
    )
    rep.patch_probe = {
        "ran": result.ran,
        "right": result.correct,
        "findings": list(result.findings),
        "why": result.why,
    }
    if result.correct:
        return
    if not result.ran and (upstream is None or not upstream.ran):
        rep.notes.append(
            f"{rep.patch} could not be run here ({result.why}): it is checked as text only"
        )
        return
    rep.patch_status = PATCH_FAILS_PROBE

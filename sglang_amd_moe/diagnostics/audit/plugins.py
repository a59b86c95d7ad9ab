"""The audit's view of the plugin: which hosts can load it (SGLang; vLLM for aiter and the
guard), what blocks them, and with ``--load`` the hooks' statuses and what runs."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata as md
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from sglang_amd_moe.diagnostics import patching, sources, topk_source
from sglang_amd_moe.diagnostics.audit import read
from sglang_amd_moe.diagnostics.audit.read import GUARD, SGLANG, AuditError, TargetReport
from sglang_amd_moe.runtime import env
from sglang_amd_moe.runtime.sglang import ledger, names
from sglang_amd_moe.runtime.target import HookStatus

OUR_SGLANG_EP = "sglang_amd_moe.runtime.plugin:register"
OUR_VLLM_EP = "sglang_amd_moe.runtime.plugin:register_vllm"
#: Where each target's hook lives (once loaded, a runtime ``HOOK`` is also found by name).
HOOK_MODULES = {t: f"sglang_amd_moe.runtime.{m}" for t, m in (
    (SGLANG, "sglang.hook"), (read.AITER, "aiter.hook"), (GUARD, "aiter.guard"))}  # fmt: skip


@dataclass
class PluginView:  # this environment's plugin machinery, read without importing SGLang
    sglang_dir: Path | None
    aiter_dir: Path | None
    sglang_loader: bool
    sglang_ep: md.EntryPoint | None
    vllm_installed: bool
    vllm_ep: md.EntryPoint | None
    loaded: bool = False  # --load ran load_plugins() in this process
    problems: list[str] = field(default_factory=list)  # the environment's own


def plugin_view() -> PluginView:
    sglang = sources.package_dir("sglang")
    init = sources.text_or_none(sglang / "srt/plugins/__init__.py") if sglang else None
    eps = md.entry_points()
    ours = {ep.value.replace(" ", ""): ep for ep in eps.select(group="sglang.srt.plugins")}
    ours |= {ep.value.replace(" ", ""): ep for ep in eps.select(group="vllm.general_plugins")}
    problems = []
    with contextlib.suppress(md.PackageNotFoundError):  # both own triton/: one overwrote the other
        rocm, cuda = md.version("pytorch-triton-rocm"), md.version("triton")
        problems.append(
            f"both triton {cuda} and pytorch-triton-rocm {rocm} are installed: one overwrote "
            "the other's triton/ files, and uninstalling triton deletes them: run `python -m pip "
            "uninstall -y triton`, then `python -m pip install --force-reinstall --no-deps "
            f"pytorch-triton-rocm=={rocm}` from the PyTorch ROCm index your torch came from"
        )
    loader = init is not None and "def load_plugins" in init  # 0.5.11 and later
    vllm, aiter = sources.package_dir("vllm") is not None, sources.package_dir("aiter")
    sglang_ep, vllm_ep = ours.get(OUR_SGLANG_EP), ours.get(OUR_VLLM_EP)
    return PluginView(sglang, aiter, loader, sglang_ep, vllm, vllm_ep, problems=problems)


class Route(NamedTuple):
    """A host that can load the plugin; ``cell`` (the HOOK cell) and ``why`` when blocked."""

    host: str
    cell: str = ""
    why: str = ""


def routes(target: str, view: PluginView) -> list[Route]:
    """SGLang's loader, and vLLM's for aiter and the guard (every vLLM has one)."""
    out = [("SGLang", view.sglang_dir is not None, view.sglang_loader, view.sglang_ep)]
    out += [("vLLM", view.vllm_installed, True, view.vllm_ep)] if target != SGLANG else []
    return [_route(target, *r) for r in out]


def _route(target: str, host: str, installed: bool, loader: bool, ep: Any) -> Route:
    var = f"{host.upper()}_PLUGINS"
    listed = {x.strip() for x in os.environ.get(var, "").split(",") if x.strip()}
    if not installed:
        return Route(host, "off", f"{host} is not installed here")
    if not loader:  # SGLang 0.5.10 and 0.5.10.post1
        version = sources.distribution("sglang")[1] or "here"
        why = f"SGLang {version} has no plugin loader (sglang.srt.plugins): the plugin cannot load"
        return Route(host, "no loader", why + " here")
    if ep is None:
        return Route(host, "off", f"sglang-amd-moe's {host} entry point is not registered here")
    if env.disabled():
        return Route(host, "off", "plugin disabled: SGLANG_AMD_MOE_DISABLE is set")
    if listed and ep.name not in listed:
        why = f"plugin disabled: {var}={os.environ[var]} does not list {ep.name}"
        return Route(host, "off", why)
    if target == GUARD and env.guard_off():
        return Route(host, "off", "the guard alone is off (SGLANG_AMD_MOE_GUARD=0)")
    return Route(host)


def run_load_plugins(view: PluginView) -> None:
    """``--load``: SGLang's real ``load_plugins()`` (nothing to run without a loader)."""
    if view.sglang_loader:
        try:
            importlib.import_module("sglang.srt.plugins").load_plugins()
        except Exception as exc:
            raise AuditError(f"load_plugins() failed: {type(exc).__name__}: {exc}") from exc
        view.loaded = True


def hook_module(target: str) -> Any:
    """What answers ``status()`` for ``target``, only if loaded: never imported here."""
    if HOOK_MODULES[target] in sys.modules:
        return sys.modules[HOOK_MODULES[target]]
    hooks = [getattr(m, "HOOK", None) for k, m in list(sys.modules.items()) if "_moe.runtime." in k]
    return next((h for h in hooks if getattr(h, "name", None) == target), None)


def has_guard() -> bool:
    """This sglang-amd-moe has the count-free guard (loaded, or its module installed)."""
    return hook_module(GUARD) is not None or sources.package_dir(HOOK_MODULES[GUARD]) is not None


def hook_status(target: str) -> HookStatus | None:
    """The hook's last decision in this process (None: none)."""
    try:
        st = getattr(hook_module(target), "status", lambda: None)()
    except Exception as exc:
        st = f"failed: {exc!r}"
    if st is None or isinstance(st, HookStatus):
        return st
    what = st if isinstance(st, str) else f"returned {type(st).__name__}, not HookStatus"
    return HookStatus(target, "error", None, f"{target} hook status() {what}")


def is_live(target: str) -> bool:
    with contextlib.suppress(Exception):
        return bool(getattr(hook_module(target), "is_live", lambda: False)())
    return False


def platform_gate_closed() -> bool:
    """The plugin stays off here only because torch is not a ROCm build (and no FORCE)."""
    return not env.forced() and sources.torch_is_rocm() is not True


def triton_blocks() -> str:
    """Why Triton keeps every hook off here ("" when not; a ROCm machine brings its own)."""
    return "" if platform_gate_closed() else env.triton_problem()


@dataclass(frozen=True)
class Seen:
    """``--load``: what SGLang's ``_post_process_topk_ids`` did on the probe's CPU batch."""

    of: str  # what ran, in words
    result: Any  # ProbeResult of what runs (None: nothing could be run, see why)
    upstream: Any  # ProbeResult of upstream's function alone
    decision: HookStatus | None  # the plugin's decision the run reflects
    previewed: bool = False  # a preview: what a ROCm machine does
    why: str = ""

    def to_json(self) -> dict:
        r, state = self.result, getattr(self.decision, "state", None)
        ran, found = bool(r and r.ran), list(r.findings) if r else []
        doc = {"of": self.of, "ran": ran, "right": bool(r and r.correct)}
        doc |= {"behaviour": behaviour_shown(self.upstream), "findings": found}
        doc |= {"why": r.why if r and not ran else self.why, "plugin": state}
        verdict = getattr(self.decision, "detail", {}).get("verdict")  # probed, cache, ledger
        return doc | {"previewed": self.previewed, "verdict": verdict}


def behaviour_shown(p: Any) -> str:
    """The form upstream acts as ("" when the probe could not tell)."""
    return p.behaviour if p is not None and p.usable else ""


def import_topk() -> tuple[Any, str]:
    """(SGLang's topk module, "") or (None, why it does not import here)."""
    try:
        return importlib.import_module(names.TOPK_MODULE), ""
    except (Exception, SystemExit) as exc:  # SystemExit from an import included
        return None, f"{names.TOPK_MODULE} does not import here ({type(exc).__name__}: {exc})"


def observe_sglang(rep: TargetReport, view: PluginView) -> None:
    """``--load``: run the function on the probe batch as what runs here (as the plugin makes
    it on ROCm where only the platform keeps it off: a preview), then the form's patch."""
    from sglang_amd_moe.runtime.sglang import hook

    st = rep.status
    off_here = st is not None and st.state == "off" and platform_gate_closed()
    off_here = off_here and not env.disabled() and not env.triton_problem()
    first = hook.preview() if st is not None and (st.state == "pending" or off_here) else None
    module, why = import_topk()  # after the preview: a server decides before importing it
    decision = first.status if first is not None else st
    if not callable(getattr(module, names.FUNCTION_NAME, None)):
        why = why or f"{names.TOPK_MODULE} has no callable {names.FUNCTION_NAME}"
        rep.seen = Seen("the function", None, None, decision, first is not None, why)
        rep.probe = rep.seen.to_json()
        return
    if st is not None and st.state == "pending" and hook.is_live():
        st = rep.status = hook_status(SGLANG)  # importing topk applied the pending hook
        rep.hook_state, rep.hook_live = (st.state if st else None), True
    upstream = first.upstream if first is not None else None
    if upstream is None and not env.disabled():
        upstream = hook.preview().upstream
    if upstream is None and not hook.is_live():
        upstream = topk_source.probe_live()  # the plugin is disabled: upstream is what runs
    if st is not None and st.state == "live":
        seen = Seen("the hooked call", topk_source.probe_live(), upstream, st)
    elif first is not None and first.status.hooked:
        of = "on a ROCm machine" if off_here else "decided it; SGLang has not applied it yet"
        of = f"the hooked call (as the plugin {'makes it ' * off_here}{of})"
        seen = Seen(of, first.hooked, upstream, first.status, True)
    else:
        seen = Seen("upstream's function", upstream, upstream, decision, first is not None)
    rep.seen, rep.probe = seen, seen.to_json()
    if rep.probe.get("verdict"):  # where the plugin's verdict came from, as its log line says
        rep.notes.append(f"the plugin: {rep.probe['verdict']['text']}")
    if rep.patch and rep.patch_status == patching.APPLIES:
        check_patch(rep, module, upstream)


def check_patch(rep: TargetReport, module: Any, upstream: Any) -> None:
    """Run the function the form's patch makes: applying but running wrong, it is not offered."""
    patched = patching.apply_text(rep.source, patching.read_patch(str(rep.patch)))
    f = ledger.read(patched)
    r = topk_source.probe_source(module, patched, hip_flags=f.hip_flags, predicates=f.predicates)
    rep.patch_probe = {"ran": r.ran, "right": r.correct, "findings": list(r.findings), "why": r.why}
    if not r.correct and not r.ran and (upstream is None or not upstream.ran):
        rep.notes.append(f"{rep.patch} could not be run here ({r.why}): it is checked as text only")
    elif not r.correct:
        rep.patch_status = read.PATCH_FAILS_PROBE

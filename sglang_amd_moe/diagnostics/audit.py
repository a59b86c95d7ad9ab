"""``sglang-amd-moe audit``: what is installed, which form it has, what the plugin does.

Users must be able to see, before they trust the plugin, what it finds and what it
would change. For each target (SGLang's ``_post_process_topk_ids``; aiter's MXFP4 aux
sort path) the audit reports the distribution and version, the file and the sha256 of
the target's source, the form (``sglang_forms`` / ``aiter_forms``), the action the
plugin takes for it here, the hook's state, and the matching patch from
``sglang_amd_moe.patches`` with whether it applies, is applied, or does not apply
(drift), and the command that applies it.

It reads source files (regular files only, at most :data:`MAX_SOURCE_BYTES`) and never
imports SGLang or aiter to classify them (files are found with
``importlib.util.find_spec`` on the top-level package, which does not run it), so it
works without ROCm, without aiter and without torch. Only ``--load`` imports SGLang, to
run its real ``sglang.srt.plugins.load_plugins()``, read each hook's ``status()`` (a
:class:`~sglang_amd_moe.runtime.hookstate.HookStatus`) and run SGLang's function.

Exit status: 0 when the audit found its targets and nothing needs action, 1 when
something needs attention, 2 when the audit itself failed (a file it cannot read or
that is not the target's file, ``load_plugins()`` raising, a report it cannot print).

Per target, in this order (:func:`_verdict`):

* not installed: SGLang missing from this interpreter needs attention (the audit ran in
  the wrong environment), unless vLLM and aiter are here (ATOM under vLLM); aiter
  missing needs nothing.
* a shipped patch is applied to the file: nothing needed (it says which patch).
* a broken form (one the plugin hooks): covered, or not (:func:`_coverage`). Without
  ``--load`` it is covered when the plugin would hook it when SGLang (or vLLM, for
  aiter) loads plugins: a plugin loader, this package's entry point, and neither
  ``SGLANG_AMD_MOE_DISABLE=1`` nor a plugin list without it. With ``--load`` the
  SGLang route is what the hook's status says (``live`` and ``pending`` cover). The
  platform is not part of the verdict in either mode: the plugin hooks only on ROCm
  (or with ``SGLANG_AMD_MOE_FORCE=1``), and the HIP path it fixes only runs there, so
  the verdict is what this software does on the AMD machine it is for (a note says
  when this machine is not one). A file given with ``--*-source`` is never covered:
  that image's plugin cannot be seen from here.
* any other form: upstream-fixed forms need nothing; SGLang's ``absent`` needs
  attention; so does ``unknown`` (for SGLang the plugin decides it by running the
  function and hooks only what it sees wrong; a person should still read it).

The plain audit runs no code, so its verdict rests on the source reader. With
``--load`` the SGLang verdict also rests on what the code does (:func:`_observe_sglang`,
:func:`_behaviour_verdict`): ``_post_process_topk_ids`` runs on ``sglang_probe``'s CPU
batch (padded rows holding garbage, EPLB off and on, the HIP branch taken for the probe
only) as what runs here (the hooked call where the hook is live; upstream where nothing
hooks it, topk imported for it where plugins did not) or, where the hook is off only
because torch is not a ROCm build, as what the plugin does on a ROCm machine
(``sglang_hook.preview()``). What runs must be right; where the source reads as another
form than running it shows, that needs attention too, said plainly; where the probe
cannot run it, a note says so and the source's verdict stands. Running it never makes
a verdict OK that the source alone would not.

Drift (the form's patch no longer applies) needs attention whatever the above says, in
both modes alike. The plain audit checks a patch as text (and says so); with ``--load``
the SGLang patch is also applied in memory and run on the probe batch before it is
offered: one that applies but comes out wrong reads :data:`PATCH_FAILS_PROBE`, with no
path or command, and needs attention (the patch needs updating).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import importlib.metadata as md
import importlib.util
import json
import os
import stat
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglang_amd_moe.diagnostics import patching
from sglang_amd_moe.diagnostics.cli import OutputError, write_stdout
from sglang_amd_moe.runtime import aiter_forms, sglang_forms
from sglang_amd_moe.runtime import env as _env
from sglang_amd_moe.runtime.hookstate import HookStatus

if TYPE_CHECKING:  # the plain audit imports no runtime beyond the readers
    from sglang_amd_moe.runtime.sglang_probe import ProbeResult

#: Keys every target has in ``--json`` output, first and in this order (more follow).
JSON_KEYS = (
    "target",
    "distribution",
    "version",
    "file",
    "sha256",
    "form",
    "action",
    "hook_live",
    "patch",
    "patch_status",
)

SGLANG = "sglang"
AITER = "aiter"
_HOOK_MODULES = {
    SGLANG: "sglang_amd_moe.runtime.sglang_hook",
    AITER: "sglang_amd_moe.runtime.aiter_hook",
}
SGLANG_REL = Path("srt/layers/moe/topk.py")
AITER_REL = Path("fused_moe.py")
OUR_SGLANG_EP = "sglang_amd_moe.runtime.plugin:register"
OUR_VLLM_EP = "sglang_amd_moe.runtime.plugin:register_vllm"
#: The largest source file the audit reads (SGLang's topk.py is about 130 kB).
MAX_SOURCE_BYTES = 4 * 1024 * 1024

#: Forms that need nothing from anyone, and why.
GOOD_FORMS: dict[tuple[str, str], str] = {
    (SGLANG, "fixed"): "fixed upstream: the HIP branch masks padded ids",
    (AITER, "count-honored"): "aiter already honours num_local_tokens",
    (AITER, "absent"): "this aiter has no MXFP4 aux sort",
}
#: ``patch_status`` (``--load``) of a patch that applies as text but whose patched
#: function the probe finds wrong: it is not offered (no path, no command).
PATCH_FAILS_PROBE = "not offered (fails the probe)"
#: Forms the plugin hooks to fix. (``unknown`` is not one: the plugin decides it by
#: running the function, and the audit asks for a look by hand.)
BROKEN_FORMS = {
    "no-hip-handling",
    "weights-only",
    "mask-under-eplb-guard",
    "count-dropped",
    "count-rejected",
}
#: What makes a file the target's own, for files given with ``--*-source``: it defines
#: at least one of these at module level (every release does).
_OWN_NAMES = {
    SGLANG: frozenset({"fused_topk", "select_experts", "TopK", sglang_forms.FUNCTION_NAME}),
    AITER: frozenset({"fused_moe", "moe_sorting"}),
}
_OWN_FILE = {SGLANG: "SGLang's sglang/srt/layers/moe/topk.py", AITER: "aiter's aiter/fused_moe.py"}


class AuditError(Exception):
    """Something the audit cannot work around (unreadable file, failed ``load_plugins()``)."""


@dataclass
class TargetReport:
    target: str
    distribution: str | None
    version: str | None
    file: str | None
    sha256: str | None
    form: str
    action: str
    hook_live: bool | None
    patch: str | None
    patch_status: str | None
    # Beyond the stable keys: the verdict and why.
    covered: bool = False
    needs_attention: bool = False
    reason: str = ""
    hook: str = "-"  # the HOOK cell of the table
    hook_state: str | None = None  # HookStatus.state after --load (None: not asked)
    patch_file: str | None = None
    apply_command: str | None = None
    notes: list[str] = field(default_factory=list)
    installed: bool = True
    #: ``--load``, SGLang: what running the function on the probe batch showed
    #: (:meth:`Seen.to_json`; None: nothing was run).
    probe: dict | None = None
    #: ``--load``, SGLang: the probe of the patched function, where a patch applies.
    patch_probe: dict | None = None
    # Not in the JSON document.
    source: str = field(default="", repr=False)
    status: HookStatus | None = field(default=None, repr=False)
    seen: Seen | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        d = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("source", "status", "seen")
        }
        d["notes"] = list(self.notes)
        return {**{k: d.pop(k) for k in JSON_KEYS}, **d}


# ------------------------------------------------------------------------ reading


def read_source(path: Path) -> str:
    """Text of the regular file ``path``; raises :class:`AuditError` for anything else.

    Opened non-blocking (a FIFO must not hang the audit) and checked to be a regular file
    of at most :data:`MAX_SOURCE_BYTES` before anything is read (``/dev/zero`` must not be
    read until memory runs out).
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise AuditError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _file_kind(st.st_mode)
            raise AuditError(f"{path} is not a regular file ({kind}): give the source file itself")
        if st.st_size > MAX_SOURCE_BYTES:
            raise AuditError(
                f"{path} is {st.st_size} bytes, more than a source file of this kind "
                f"(limit {MAX_SOURCE_BYTES})"
            )
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SOURCE_BYTES:
            chunk = os.read(fd, MAX_SOURCE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise AuditError(f"cannot read {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(data) > MAX_SOURCE_BYTES:
        raise AuditError(f"{path} grew past {MAX_SOURCE_BYTES} bytes while being read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AuditError(f"{path} is not UTF-8 Python source ({exc.reason})") from exc


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO or pipe"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a plain file"


def _not_own_file(target: str, source: str) -> str:
    """Why ``source`` is not the target's file ("" when its top-level names say it is)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return f"it does not parse as Python ({exc.msg}, line {exc.lineno})"
    defined = {
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    if defined & _OWN_NAMES[target]:
        return ""
    return f"it defines none of {', '.join(sorted(_OWN_NAMES[target]))}"


def _text_or_none(path: Path) -> str | None:
    try:
        return read_source(path)
    except AuditError:
        return None


# ------------------------------------------------------------------------ locating


def _find_package_dir(name: str) -> Path | None:
    """Directory of top-level package ``name`` without importing it (None if absent)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locs = list(spec.submodule_search_locations or [])
    if spec.origin in (None, "namespace") and locs:
        return None  # a bare directory on sys.path, not an installed package
    if locs:
        return Path(locs[0])
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        return Path(spec.origin).parent
    return None


def _distribution(top: str) -> tuple[str | None, str | None]:
    """(distribution name, version) providing top-level package ``top``."""
    try:
        dists = md.packages_distributions().get(top) or [top]
    except Exception:
        dists = [top]
    for dist in dists:
        try:
            return dist, md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None, None


def _our_entry_point(group: str, value: str) -> md.EntryPoint | None:
    try:
        eps = md.entry_points(group=group)
    except Exception:
        return None
    for ep in eps:
        if ep.value.replace(" ", "") == value:
            return ep
    return None


def _torch_is_rocm() -> bool | None:
    """Whether torch here is a ROCm build (None: no torch). Imports nothing: an imported
    torch is asked, otherwise its ``version.py`` is read."""
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "version", None) is not None:
        return bool(getattr(torch.version, "hip", None))
    torch_dir = _find_package_dir("torch")
    text = _text_or_none(torch_dir / "version.py") if torch_dir is not None else None
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("hip") and "=" in line:
            return line.split("=", 1)[1].strip() not in ("None", "''", '""')
    return False


# ------------------------------------------------------------------------ plugin routes


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


def _triton_clash() -> str:
    """Both ``triton`` and ``pytorch-triton-rocm`` installed: two distributions own the
    same ``triton/`` files, so one overwrote the other (what installing a package that
    requires ``triton`` into a ROCm image does)."""
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


def _plugin_view() -> PluginView:
    sglang_dir = _find_package_dir("sglang")
    init = _text_or_none(sglang_dir / "srt" / "plugins" / "__init__.py") if sglang_dir else None
    return PluginView(
        sglang_dir=sglang_dir,
        aiter_dir=_find_package_dir("aiter"),
        # SGLang 0.5.11+ ships sglang/srt/plugins with load_plugins; 0.5.10 does not.
        sglang_loader=init is not None and "def load_plugins" in init,
        sglang_ep=_our_entry_point("sglang.srt.plugins", OUR_SGLANG_EP),
        vllm_installed=_find_package_dir("vllm") is not None,
        vllm_ep=_our_entry_point("vllm.general_plugins", OUR_VLLM_EP),
        problems=[p for p in (_triton_clash(),) if p],
    )


@dataclass(frozen=True)
class Route:
    """One host that can load the plugin (SGLang, or vLLM for aiter), and what blocks it."""

    host: str
    #: The HOOK cell when blocked ("" when the plugin loads through this host).
    cell: str = ""
    why: str = ""


def _disabled_by_env(list_var: str, ep_name: str) -> str:
    """Why the environment keeps the plugin from running ("" when it does not)."""
    if _env.disabled():
        return "SGLANG_AMD_MOE_DISABLE is set"
    allowed = os.environ.get(list_var, "")
    names = {x.strip() for x in allowed.split(",") if x.strip()}
    if names and ep_name not in names:
        return f"{list_var}={allowed} does not list {ep_name}"
    return ""


def _routes(target: str, view: PluginView) -> list[Route]:
    sglang = view.sglang_dir is not None
    routes = [_route("SGLang", sglang, view.sglang_loader, view.sglang_ep, "SGLANG_PLUGINS")]
    if target == AITER:  # vLLM loads general plugins in every release
        routes.append(_route("vLLM", view.vllm_installed, True, view.vllm_ep, "VLLM_PLUGINS"))
    return routes


def _route(
    host: str, installed: bool, loader: bool, ep: md.EntryPoint | None, list_var: str
) -> Route:
    if not installed:
        return Route(host, "off", f"{host} is not installed here")
    if not loader:  # SGLang 0.5.10 and 0.5.10.post1
        version = _distribution("sglang")[1] or "here"
        why = f"SGLang {version} has no plugin loader (sglang.srt.plugins): the plugin cannot load"
        why += " here"
        return Route(host, "no loader", why)
    if ep is None:
        why = f"sglang-amd-moe's {host} entry point is not registered (is it installed here?)"
        return Route(host, "off", why)
    off = _disabled_by_env(list_var, ep.name)
    return Route(host, "off", f"plugin disabled: {off}") if off else Route(host)


def _run_load_plugins(view: PluginView) -> None:
    """``--load``: import SGLang's plugin framework and run its real ``load_plugins()``."""
    if not view.sglang_loader:
        return  # nothing to run; the SGLang route says why
    try:
        plugins = importlib.import_module("sglang.srt.plugins")
        plugins.load_plugins()
    except Exception as exc:
        raise AuditError(f"load_plugins() failed: {type(exc).__name__}: {exc}") from exc
    view.loaded = True


# ------------------------------------------------------------------------ hook state


def _hook_module(target: str) -> Any:
    return sys.modules.get(_HOOK_MODULES[target])  # never imported here: only read


def _hook_status(target: str) -> HookStatus | None:
    """The hook's last decision in this process, as a :class:`HookStatus` (None: none)."""
    mod = _hook_module(target)
    if mod is None:
        return None
    try:
        st = mod.status()
    except Exception as exc:
        return HookStatus(
            target, "error", None, f"{target} hook status() failed: {type(exc).__name__}: {exc}"
        )
    if st is None or isinstance(st, HookStatus):
        return st
    return HookStatus(
        target,
        "error",
        None,
        f"{target} hook status() returned {type(st).__name__}, not HookStatus",
    )


def _is_live(mod: Any) -> bool:
    try:
        return bool(mod.is_live())
    except Exception:
        return False


def _platform_gate_closed() -> bool:
    """The plugin stays off here only because torch is not a ROCm build (and no FORCE)."""
    return not _env.forced() and _torch_is_rocm() is not True


def _triton_blocks() -> str:
    """Why the installed Triton keeps every hook off ("" when it does not). Judged only
    where the plugin's platform gate is open here (ROCm torch, or FORCE): off ROCm the
    verdict is the one for a ROCm machine, whose torch brings its own Triton."""
    return "" if _platform_gate_closed() else _env.triton_problem()


# ------------------------------------------------------------------------ behaviour (--load)


@dataclass(frozen=True)
class Seen:
    """``--load``: what SGLang's ``_post_process_topk_ids`` did on the probe's CPU batch
    (``sglang_probe``: padded rows holding garbage, EPLB off and on, the HIP branch taken
    for the probe only).

    The source reader cannot be sure of everything a release may write; where the audit
    can run the code, what it does decides, as it does for the hook."""

    #: What ran, in words.
    of: str
    #: The probe of what runs (None: nothing could be run, see ``why``).
    result: ProbeResult | None
    #: The probe of upstream's function alone: its ``behaviour`` names the form it acts as.
    upstream: ProbeResult | None
    #: The plugin's decision the run reflects (None: nothing decides here).
    decision: HookStatus | None
    #: The decision is a preview (``sglang_hook.preview()``): what a ROCm machine does.
    previewed: bool = False
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
            "behaviour": _behaviour_shown(self.upstream),
            "findings": list(r.findings) if r is not None else [],
            "why": (r.why if r is not None and not r.ran else self.why),
            "plugin": self.decision.state if self.decision is not None else None,
            "previewed": self.previewed,
        }


def _behaviour_shown(p: ProbeResult | None) -> str:
    """The form upstream acts as ("" when the probe could not tell: not run, or a
    scenario raised, so no form describes what it does)."""
    if p is None or not p.ran or any(o.raised for o in p.observations):
        return ""
    return p.behaviour


def _probe_json(p: ProbeResult) -> dict:
    return {"ran": p.ran, "right": p.correct, "findings": list(p.findings), "why": p.why}


def _import_topk() -> tuple[Any, str]:
    """(SGLang's topk module, "") or (None, why it does not import here)."""
    from sglang_amd_moe.runtime.sglang_hook import TOPK_MODULE

    try:
        return importlib.import_module(TOPK_MODULE), ""
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit from an import included
        return None, f"{TOPK_MODULE} does not import here ({type(exc).__name__}: {exc})"


def _observe_sglang(rep: TargetReport, view: PluginView) -> None:
    """``--load``: run ``_post_process_topk_ids`` on the probe batch as what runs here
    (the hooked call where the hook is live, upstream where nothing is hooked) or, where
    the hook is off only because torch is not a ROCm build, as what the plugin does on a
    ROCm machine (``sglang_hook.preview()``); then check the form's patch by running the
    patched function before offering it (:func:`_check_patch`)."""
    from sglang_amd_moe.runtime import sglang_hook

    st = rep.status
    # Off only because torch is not a ROCm build: what the plugin does on a ROCm machine
    # is previewed (not where it is disabled, nor where this Triton cannot build its
    # kernels: the preview runs them).
    off_here = (
        st is not None
        and st.state == "off"
        and _platform_gate_closed()
        and not _env.disabled()
        and not _env.triton_problem()
    )
    first = None
    if view.loaded and st is not None and (st.state == "pending" or off_here):
        # Before the audit imports topk: what a server process decides when it loads
        # plugins (where topk's file reads fixed, the file decides without importing it).
        first = sglang_hook.preview()
    module, why = _import_topk()
    if module is None or not callable(getattr(module, sglang_forms.FUNCTION_NAME, None)):
        why = why or f"{sglang_hook.TOPK_MODULE} has no callable {sglang_forms.FUNCTION_NAME}"
        decision = first.status if first is not None else st
        rep.seen = Seen("the function", None, None, decision, first is not None, why)
        rep.probe = rep.seen.to_json()
        return
    if st is not None and st.state == "pending" and sglang_hook.is_live():
        # Importing topk applied the pending hook: report it as it is now.
        st = rep.status = _hook_status(SGLANG)
        rep.hook_state, rep.hook_live = (st.state if st else None), True
    if first is not None and first.upstream is not None:
        upstream = first.upstream  # the first preview imported topk and probed upstream
    else:  # topk imported now: a preview probes upstream
        now = None if _env.disabled() else sglang_hook.preview()
        upstream = now.upstream if now is not None else None
    if upstream is None and not sglang_hook.is_live():
        upstream = sglang_hook.observe()  # the plugin is disabled: upstream is what runs
    if st is not None and st.state == "live":
        seen = Seen("the hooked call", sglang_hook.observe(), upstream, st)
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
        _check_patch(rep, module, upstream)


def _check_patch(rep: TargetReport, module: Any, upstream: ProbeResult | None) -> None:
    """Run the function the form's patch produces (applied in memory to the installed
    text, over a copy of the live module's globals) on the probe batch: a patch that
    applies as text but comes out wrong is not offered. Where the probe cannot run the
    installed function here either, the patch stays checked as text, and a note says so."""
    from sglang_amd_moe.runtime import sglang_probe

    assert rep.patch is not None  # noqa: S101 - checked by the caller
    patched = patching.apply_text(rep.source, patching.read_patch(rep.patch))
    report = sglang_forms.analyze_source(patched)
    predicates = tuple(sorted(sglang_forms.REMAP_PREDICATES | ({report.remap_predicate} - {""})))
    result = sglang_probe.probe_source(
        module, patched, hip_flags=report.hip_flags, predicates=predicates
    )
    rep.patch_probe = _probe_json(result)
    if result.correct:
        return
    if not result.ran and (upstream is None or not upstream.ran):
        rep.notes.append(
            f"{rep.patch} could not be run here ({result.why}): it is checked as text only"
        )
        return
    rep.patch_status = PATCH_FAILS_PROBE


def _plugin_action(st: HookStatus | None) -> str:
    """What the SGLang hook does (or would do on ROCm), in the audit's words."""
    if st is None:
        return "nothing hooks it here"
    plan = st.detail.get("plan")
    if st.hooked and isinstance(plan, dict):
        from sglang_amd_moe.runtime.sglang_hook import Plan

        # An unknown form's plan in its own words (the form's standard text says only
        # that the plugin decides by running it).
        return Plan(**plan).describe("" if st.form in (None, "unknown") else st.form)
    if st.state != "not-needed":
        return st.message
    action = sglang_forms.ACTIONS.get(st.form or "", "not hooked")
    probe = st.detail.get("probe")
    if isinstance(probe, dict) and not probe.get("ran", True):
        action += f" (decided from the source: {probe.get('why') or 'the probe did not run'})"
    return action


def _behaviour_verdict(rep: TargetReport, base: Verdict) -> Verdict:
    """``--load``: the verdict with what running the function showed. It only ever adds
    attention: what runs must be right, and where the source reads as something other
    than what running it shows (or reads as ``unknown``), a person must look, because
    the plain audit, ``--sglang-source`` and the patches go by the source."""
    seen = rep.seen
    assert seen is not None  # noqa: S101 - checked by the caller
    result = seen.result
    if result is None or not result.ran:
        why = result.why if result is not None else seen.why
        patch = ""
        if rep.patch_status == patching.APPLIES and rep.patch_probe is None:
            patch = f", and {rep.patch} is checked as text only"
        rep.notes.append(
            f"the probe could not run {seen.of} here ({why}): the verdict rests on the "
            f"source{patch}"
        )
        return base
    hook, decision = base.hook, seen.decision
    if hook in ("-", "?") and decision is not None:  # the HOOK cell says what was decided
        if decision.hooked:
            hook = "not ROCm" if seen.previewed else decision.state
        elif hook == "?":
            hook = "-" if decision.state == "not-needed" else decision.state
    plugin = _plugin_action(seen.decision)
    if seen.decision is not None:
        plugin = f"{'on a ROCm machine ' if seen.previewed else ''}the plugin: {plugin}"
    if not result.correct:
        found = "; ".join(result.findings[:3]) or result.behaviour
        wrong = f"running {seen.of} on the probe batch shows it wrong ({found}); {plugin}"
        if base.attention:
            return Verdict(True, False, hook, f"{base.reason}; {wrong}")
        return _needs(f"{rep.form}: {wrong}", hook)
    covered = base.covered or seen.hooks
    right = f"running {seen.of} on the probe batch shows it right"
    shown = _behaviour_shown(seen.upstream)
    if rep.form == "unknown":
        acts = f"upstream acts as {shown}; " if shown and shown != "unknown" else ""
        return Verdict(
            True,
            covered,
            hook,
            f"unknown: the source reads as none of the known forms ({rep.reason}), so the "
            f"plugin decides by running it: {acts}{plugin}; {right}; check this function by hand",
        )
    if shown and shown != rep.form:
        return Verdict(
            True,
            covered,
            hook,
            f"the source reads as {rep.form} ({rep.reason}) but running it shows {shown}; "
            f"{plugin}; {right}. The plain audit, --sglang-source and the patches go by the "
            "source: check this function by hand",
        )
    return dataclasses.replace(base, reason=f"{base.reason}; {right}")


# ------------------------------------------------------------------------ per target


def _patch_check(target: str, form: str, source: str) -> tuple[str | None, str | None]:
    """(patch name, status) for ``source``: a shipped patch that is applied wins (each
    adds a line naming itself, so an upstream-fixed file never reads as patched), else
    the patch for this form, else none."""
    statuses = {
        name: patching.status(source, patching.read_patch(name))
        for name in patching.patch_names(target)
    }
    for name, status in statuses.items():
        if status == patching.ALREADY_APPLIED:
            return name, status
    name = patching.patch_for(target, form)
    return (name, statuses[name]) if name else (None, None)


def _classify(target: str, source: str) -> tuple[str, str, str]:
    """(form, sha256 of the target's source, classifier's reason)."""
    if target == SGLANG:
        r = sglang_forms.analyze_source(source)
        return r.form, r.function_sha256, r.reason
    r = aiter_forms.analyze_source(source)
    return r.form, r.source_sha256, r.reason


def _actions(target: str) -> dict[str, str]:
    return sglang_forms.ACTIONS if target == SGLANG else aiter_forms.ACTIONS


def _report(
    target: str, path: Path, source: str, dist: str | None, version: str | None, *, given: bool
) -> TargetReport:
    form, sha, why = _classify(target, source)
    patch, pstatus = _patch_check(target, form, source)
    return TargetReport(
        target=target,
        distribution=dist,
        version=version,
        file=str(path),
        sha256=sha or None,
        form=form,
        action=_actions(target).get(form, ""),
        hook_live=None if given else False,
        patch=patch,
        patch_status=pstatus,
        reason=why,
        source=source,
    )


def _audit_given_file(target: str, path: Path) -> TargetReport:
    """``--sglang-source`` / ``--aiter-source``: the file must be the target's own."""
    source = read_source(path)
    why_not = _not_own_file(target, source)
    if why_not:
        raise AuditError(f"{path} is not {_OWN_FILE[target]}: {why_not}")
    return _report(target, path, source, None, None, given=True)


def _audit_installed(target: str, view: PluginView) -> TargetReport:
    pkg, rel = (view.sglang_dir, SGLANG_REL) if target == SGLANG else (view.aiter_dir, AITER_REL)
    if pkg is None:
        return _not_installed(target)
    dist, version = _distribution(target)
    path = pkg / rel
    if not os.path.lexists(path):
        rep = _not_installed(target)
        rep.installed = True
        rep.distribution, rep.version, rep.file, rep.form = dist, version, str(path), "absent"
        rep.action = _actions(target).get("absent", "")
        rep.reason = f"no {rel} in this {target}"
        return rep
    rep = _report(target, path, read_source(path), dist, version, given=False)
    mod = _hook_module(target)
    rep.hook_live = _is_live(mod) if mod is not None else False
    if view.loaded:
        rep.status = _hook_status(target)
        rep.hook_state = rep.status.state if rep.status else None
    return rep


def _not_installed(target: str) -> TargetReport:
    return TargetReport(
        target=target,
        distribution=None,
        version=None,
        file=None,
        sha256=None,
        form="not installed",
        action="nothing to do",
        hook_live=False,
        patch=None,
        patch_status=None,
        installed=False,
    )


# ------------------------------------------------------------------------ verdict


@dataclass(frozen=True)
class Verdict:
    attention: bool
    covered: bool
    hook: str
    reason: str


def _ok(reason: str, hook: str = "-", covered: bool = True) -> Verdict:
    return Verdict(False, covered, hook, reason)


def _needs(reason: str, hook: str = "-") -> Verdict:
    return Verdict(True, False, hook, reason)


def _verdict(rep: TargetReport, view: PluginView | None) -> Verdict:
    """The verdict on one target before drift is considered (see the module docstring)."""
    if not rep.installed:
        return _missing(rep, view)
    if rep.patch_status == patching.ALREADY_APPLIED:
        if (rep.target, rep.form) in GOOD_FORMS:
            return _ok(f"patched: {rep.patch} is applied to this file")
        return _needs(
            f"{rep.patch} is applied, but the result reads as {rep.form} ({rep.reason})", "?"
        )
    if rep.form in BROKEN_FORMS:
        return _coverage(rep, view)
    if (rep.target, rep.form) in GOOD_FORMS:
        return _ok(GOOD_FORMS[(rep.target, rep.form)])
    if rep.form == "absent":  # SGLang without the function
        return _needs(
            f"{rep.reason}: an SGLang older than any this package knows (0.5.9 or earlier?); "
            "neither the plugin nor a patch covers it"
        )
    if rep.target == SGLANG:
        return _needs(
            f"unknown: the source reads as none of the known forms ({rep.reason}); where the "
            "plugin loads, it runs the function on a CPU batch and hooks only what it sees "
            "wrong (`sglang-amd-moe audit --load` runs it here); check this function by hand",
            "?",
        )
    return _needs(
        f"unrecognised form ({rep.reason}): the plugin leaves it alone; check it by hand", "?"
    )


def _missing(rep: TargetReport, view: PluginView | None) -> Verdict:
    if rep.target == AITER:
        return _ok("aiter is not installed here: the aiter part has nothing to do", covered=False)
    if view is not None and view.vllm_installed and view.aiter_dir is not None:
        return _ok(
            "SGLang is not installed here (vLLM and aiter are: the aiter part applies)",
            covered=False,
        )
    return _needs(
        f"SGLang is not installed in this interpreter ({sys.executable}): "
        "run the audit with the python that runs the server"
    )


def _coverage(rep: TargetReport, view: PluginView | None) -> Verdict:
    """Whether the plugin covers the broken form of ``rep``, through any of its routes."""
    if view is None:
        return _needs(
            f"{rep.form}: the plugin of the image this file comes from cannot be seen from here: "
            "install sglang-amd-moe there (SGLang >= 0.5.11) or apply the patch",
            "?",
        )
    seen = [
        _observed(rep, route) if view.loaded and route.host == "SGLang" else _predicted(route)
        for route in _routes(rep.target, view)
    ]
    for covered, hook, why in seen:
        if covered:
            return _ok(f"{rep.form}: covered: {why}", hook)
    return _needs(f"{rep.form}: not covered: {'; '.join(why for _, _, why in seen)}", seen[0][1])


def _predicted(route: Route) -> tuple[bool, str, str]:
    """(covered, HOOK cell, why) of a route, from what is installed."""
    if route.cell:
        return False, route.cell, route.why
    problem = _triton_blocks()
    if problem:  # the plugin loads, but keeps every hook off: its kernels cannot run
        return False, "Triton", f"the plugin loads with {route.host} but hooks nothing: {problem}"
    return True, "on load", f"the plugin hooks it when {route.host} loads plugins"


_PENDING_ON = {SGLANG: "SGLang to apply its hooks", AITER: "aiter.fused_moe to be imported"}


def _observed(rep: TargetReport, route: Route) -> tuple[bool, str, str]:
    """The same for the SGLang route after ``load_plugins()`` ran here: the hook's status."""
    st = rep.status
    if st is not None and st.state == "live":
        return True, "live", "hook live in this process"
    if st is not None and st.state == "pending":
        return True, "pending", f"hook installed, waiting for {_PENDING_ON[rep.target]}"
    if route.cell:
        return _predicted(route)
    if st is None:
        return (
            False,
            "not called",
            "load_plugins() ran but did not call sglang-amd-moe's register()",
        )
    if st.state == "off" and _platform_gate_closed():
        why = "load_plugins() called the plugin, which hooks this on a ROCm machine"
        why += " (off here: see the note)"
        return True, "not ROCm", why
    problem = _triton_blocks() if st.state == "off" else ""
    if problem:
        return False, "Triton", f"load_plugins() called the plugin, which hooks nothing: {problem}"
    return False, st.state, st.message or f"the hook's state is {st.state}"


def _conclude(rep: TargetReport, view: PluginView | None) -> None:
    """Fill the verdict, the action line, and the patch's path and command."""
    v = _verdict(rep, view)
    decided = False
    if rep.seen is not None:
        v = _behaviour_verdict(rep, v)
        decision = rep.seen.decision
        decided = decision is not None and decision.state != "off"
        if decided:  # --load: what the hook decided here (or would on ROCm), in its words
            rep.action = _plugin_action(decision)
    rep.needs_attention, rep.covered, rep.hook, rep.reason = (
        v.attention,
        v.covered,
        v.hook,
        v.reason,
    )
    if not rep.installed:
        return
    if rep.patch_status == patching.DRIFT:
        rep.needs_attention = True
        rep.reason += (
            f"; but {rep.patch} does not apply to this file (drift): the patch needs updating"
        )
    if rep.patch_status == PATCH_FAILS_PROBE:
        found = "; ".join((rep.patch_probe or {}).get("findings", [])[:3]) or (
            (rep.patch_probe or {}).get("why") or "wrong"
        )
        rep.needs_attention = True
        rep.reason += (
            f"; {rep.patch} applies as text, but the function it makes fails on the probe "
            f"batch ({found}): not offered, the patch needs updating"
        )
    if rep.form in BROKEN_FORMS and not rep.covered and not decided:
        rep.action = f"none here; where the plugin loads: {rep.action}"
    if rep.patch and rep.patch_status != PATCH_FAILS_PROBE:  # a patch not offered has no path
        rep.patch_file = patching.patch_path(rep.patch)
        if rep.patch_status == patching.APPLIES and rep.file:
            rep.apply_command = patching.apply_command(rep.file, rep.patch)
            if rep.patch_probe is not None and rep.patch_probe.get("right"):
                rep.notes.append(
                    f"{rep.patch} was run before it is offered: the function it makes is "
                    "right on the probe batch"
                )
            if rep.target == SGLANG and rep.seen is None:
                rep.notes.append(
                    f"{rep.patch} is checked as text only (it applies): `sglang-amd-moe audit "
                    "--load`, run where this SGLang is installed, also runs the patched "
                    "function on a CPU batch before offering it"
                )


# ------------------------------------------------------------------------ diff


_DIFF_FUNCS = {
    SGLANG: (sglang_forms.FUNCTION_NAME,),
    AITER: ("_adaptive_moe_sort", "_moe_sorting_impl"),
}


def _functions_source(source: str, names: tuple[str, ...]) -> str:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    parts = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in names:
            parts.append(ast.get_source_segment(source, node) or "")
    return "\n\n".join(parts) + ("\n" if parts else "")


def function_diff(rep: TargetReport) -> str:
    """Unified diff of the installed target function(s) against their fixed form."""
    if not rep.installed or not rep.source:
        return f"# {rep.target}: not installed\n"
    names = _DIFF_FUNCS[rep.target]
    if rep.patch_status == patching.ALREADY_APPLIED:
        return f"# {rep.target}: {', '.join(names)} is already patched ({rep.patch})\n"
    if (rep.target, rep.form) in GOOD_FORMS:
        return f"# {rep.target}: {', '.join(names)} is already in its fixed form ({rep.form})\n"
    if rep.patch is None:
        return f"# {rep.target}: no patch for form {rep.form!r}; nothing to diff against\n"
    if rep.patch_status != patching.APPLIES:
        return f"# {rep.target}: {rep.patch} {rep.patch_status}; no diff\n"
    fixed = patching.apply_text(rep.source, patching.read_patch(rep.patch))
    before = _functions_source(rep.source, names).splitlines(keepends=True)
    after = _functions_source(fixed, names).splitlines(keepends=True)
    return "".join(
        difflib.unified_diff(
            before,
            after,
            fromfile=f"installed: {rep.file} ({', '.join(names)})",
            tofile=f"fixed: after {rep.patch}",
        )
    )


# ------------------------------------------------------------------------ output


def platform_notes(reports: list[TargetReport], view: PluginView | None) -> list[str]:
    """Notes on this machine, printed under the details (empty for ``--*-source``)."""
    if view is None or not any(r.installed and r.form in BROKEN_FORMS for r in reports):
        return []
    rocm = _torch_is_rocm()
    if rocm is None:
        return ["torch is not installed in this interpreter: the plugin cannot run here"]
    if rocm or _env.forced():
        return []
    return [
        "torch here is not a ROCm build: the plugin stays off on this machine "
        "(SGLANG_AMD_MOE_FORCE=1 forces it); the verdict is for a ROCm machine with this software"
    ]


def _installed_cell(r: TargetReport, view: PluginView | None) -> str:
    if not r.installed:
        return "not installed"
    if view is None:
        return "(source file)"
    return (
        f"{r.distribution or r.target} {r.version}"
        if r.version
        else f"{r.distribution or r.target} (no metadata)"
    )


def render_table(reports: list[TargetReport], exit_status: int, view: PluginView | None) -> str:
    rows = [("TARGET", "INSTALLED", "FORM", "HOOK", "PATCH", "PATCH STATUS")]
    for r in reports:
        form = r.form if r.installed else "-"
        rows.append(
            (
                r.target,
                _installed_cell(r, view),
                form,
                r.hook,
                r.patch or "-",
                r.patch_status or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.append("")
    for r in reports:
        if not r.installed and not r.needs_attention:
            continue
        pad = " " * (len(r.target) + 2)
        lines.append(f"{r.target}  {'!!' if r.needs_attention else 'ok'} {r.reason}")
        if not r.installed:
            continue
        lines.append(f"{pad}plugin action: {r.action}")
        lines.append(f"{pad}file: {r.file}")
        lines.append(f"{pad}sha256: {r.sha256 or '-'}")
        if r.patch_file:
            lines.append(f"{pad}patch: {r.patch_file} ({r.patch_status})")
        if r.apply_command:  # two lines, still one shell command when pasted
            dry_run, apply = r.apply_command.split(" && ")
            lines += [f"{pad}to patch the file instead:", f"{pad}  {dry_run} &&", f"{pad}  {apply}"]
        lines.extend(f"{pad}note: {n}" for n in r.notes)
    problems = view.problems if view is not None else []
    lines.extend(f"!! environment: {p}" for p in problems)
    lines.extend(f"note: {n}" for n in platform_notes(reports, view))
    n = sum(r.needs_attention for r in reports)
    if exit_status == 0:
        lines.append("OK: nothing needs action (exit 0)")
    elif not problems:
        lines.append(f"ATTENTION: {n} target(s) need action (exit 1)")
    else:
        lines.append(
            f"ATTENTION: {f'{n} target(s) and ' if n else ''}the environment need action (exit 1)"
        )
    return "\n".join(lines) + "\n"


def render_json(
    reports: list[TargetReport], exit_status: int, view: PluginView | None, diff: bool
) -> str:
    doc: dict[str, Any] = {
        "exit_status": exit_status,
        "targets": [r.to_json() for r in reports],
        "problems": view.problems if view is not None else [],
        "notes": platform_notes(reports, view),
    }
    if diff:
        doc["diff"] = {r.target: function_diff(r) for r in reports}
    return json.dumps(doc, indent=2) + "\n"


# ------------------------------------------------------------------------ main


_EPILOG = """\
exit status:
  0  the targets were found and nothing needs action (fixed upstream, patched,
     or covered by the plugin)
  1  something needs attention (SGLang not in this interpreter, an unknown form,
     a broken form the plugin cannot cover, patch drift, both triton and
     pytorch-triton-rocm installed; with --load also: SGLang's function running
     wrong on the probe batch, the source reading as another form than running it
     shows, a patch that applies but whose result runs wrong)
  2  the audit failed (a file it cannot read or that is not the target's, a
     failing load_plugins(), a report it cannot print)

HOOK column: live / pending (hooked in this process, or waiting for aiter.fused_moe
to be imported; --load), on load (the plugin hooks it when SGLang loads plugins),
not ROCm (--load on a machine without ROCm torch: off here, hooks on ROCm),
no loader (SGLang 0.5.10: apply the patch), Triton (ROCm torch or FORCE, and a
Triton missing, older than 3.3 or unreadable: the plugin loads but hooks nothing),
off (disabled, or not installed),
not-needed / refused / error (--load: what the hook decided), not called
(--load: load_plugins() never called the plugin), ? (unknown form,
or a --*-source file whose image cannot be seen), - (nothing to hook).

--load runs SGLang's function on a small CPU batch as the plugin runs it here
(or would on a ROCm machine), and runs the patched function before offering a
patch: PATCH STATUS "not offered (fails the probe)" when the patch applies but
its result runs wrong. The plain audit checks patches as text only.

examples:
  sglang-amd-moe audit                  this environment, nothing imported
  sglang-amd-moe audit --load           run SGLang's load_plugins() first
  sglang-amd-moe audit --sglang-source IMAGE_ROOT/.../sglang/srt/layers/moe/topk.py
"""


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="sglang-amd-moe audit",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Report, for SGLang's _post_process_topk_ids and aiter's MXFP4 aux sort: what is\n"
            "installed, its form, what the plugin does about it, the hook's state, and the\n"
            "matching patch with the command that applies it. Run it with the python that\n"
            "runs the server. Needs neither torch nor ROCm nor aiter (except --load)."
        ),
        epilog=_EPILOG,
    )
    ap.add_argument(
        "--load",
        action="store_true",
        help="run SGLang's real load_plugins() first, then read the hooks' state",
    )
    ap.add_argument(
        "--diff",
        action="store_true",
        help="print the unified diff installed -> fixed of each target",
    )
    ap.add_argument(
        "--json", action="store_true", help="print one JSON document instead of the table"
    )
    ap.add_argument(
        "--sglang-source",
        type=Path,
        metavar="FILE",
        help="audit this copy of SGLang's sglang/srt/layers/moe/topk.py instead (imports nothing)",
    )
    ap.add_argument(
        "--aiter-source",
        type=Path,
        metavar="FILE",
        help="audit this copy of aiter's aiter/fused_moe.py instead (imports nothing)",
    )
    return ap


def run(argv: list[str] | argparse.Namespace) -> tuple[int, list[TargetReport], PluginView | None]:
    """Audit and return (exit status, reports, plugin view); raises AuditError/SystemExit."""
    args = argv if isinstance(argv, argparse.Namespace) else _parser().parse_args(argv)
    given = [
        (t, p)
        for t, p in ((SGLANG, args.sglang_source), (AITER, args.aiter_source))
        if p is not None
    ]
    if given and args.load:
        raise AuditError(
            "--load audits this environment; "
            "it cannot be combined with --sglang-source/--aiter-source"
        )
    view: PluginView | None = None
    if given:
        reports = [_audit_given_file(target, path) for target, path in given]
    else:
        view = _plugin_view()
        if args.load:
            _run_load_plugins(view)
        reports = [_audit_installed(target, view) for target in (SGLANG, AITER)]
        if args.load and reports[0].installed and reports[0].form != "absent":
            _observe_sglang(reports[0], view)
    for rep in reports:
        _conclude(rep, view)
    problems = view.problems if view is not None else []
    exit_status = 1 if problems or any(r.needs_attention for r in reports) else 0
    return exit_status, reports, view


def _error(message: str) -> int:
    try:
        print(f"sglang-amd-moe audit: error: {message}", file=sys.stderr)
    except Exception:
        pass
    return 2


def main(argv: list[str]) -> int:
    """Entry point of ``sglang-amd-moe audit`` (see the module docstring)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or bad usage (2, message on stderr)
        return 0 if exc.code in (0, None) else 2
    try:
        exit_status, reports, view = run(args)
        if args.json:
            text = render_json(reports, exit_status, view, args.diff)
        else:
            text = render_table(reports, exit_status, view)
            if args.diff:
                text += "".join("\n" + function_diff(r) for r in reports)
    except (AuditError, patching.PatchError) as exc:
        return _error(str(exc))
    except Exception:  # a bug of ours must not read as "needs attention" (1)
        traceback.print_exc()
        return _error("internal error (above)")
    try:
        write_stdout(text)
    except OutputError as exc:
        return _error(f"cannot write to stdout: {exc}")
    return exit_status

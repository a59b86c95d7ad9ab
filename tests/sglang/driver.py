"""Drive one real SGLang release's ``_post_process_topk_ids``; run in that release's venv.

Usage: ``python driver.py MODE OUT.json [OPTION ...]`` with MODE one of

* ``bare``: the release as installed (no plugin loaded): padded-row garbage per form,
  EPLB on and off; then a broken upstream (the function deleted) while the real
  ``load_plugins()`` (or ``register()`` where there is no loader) runs, which must log
  and not raise; then, with the function restored, ``SGLANG_AMD_MOE_VERIFY=1`` checks.
  Its options add phases to the same process, so that one process per release does what
  would otherwise take one each (importing SGLang costs seconds of CPU per process):
  ``--log-module M`` first, a process of SGLang's starting (:func:`log_phase`);
  ``--unknown`` next, the ``unknown`` mode below; ``--patched FILE`` last, the release
  with a shipped patch applied (:func:`patched_phase`). Between phases
  :func:`fresh_topk` puts the process back to one that has imported neither topk nor
  this package's hook; each phase's results and log records are its own.
* ``plugin``: a fresh process whose first act is the real ``load_plugins()`` (this
  package's real entry point, discovered from its installed metadata; the caller sets
  ``SGLANG_AMD_MOE_FORCE=1``), then the same calls, then loading again.
* ``unknown``: the release's own function with its padded-weight zeroing removed.
* ``log``: only :func:`log_phase` (``--log-module M``), for processes of SGLang's
  other than the scheduler.

Nothing is faked: the topk module's own ``_is_hip``/``_is_cuda`` flags are set to take
the HIP branch on this CPU, server args are published with the release's own
``set_global_server_args_for_scheduler``, and the EPLB dispatch info comes from the
release's ``ExpertLocationDispatchInfo.init_new`` over a real ``ExpertLocationMetadata``
holding a non-identity placement. Results go to OUT.json (tensors as lists; the keys are
:class:`DriverResult`); the pytest side (``test_releases.py``) makes the assertions.
The helpers here are shared with the variant runner (``variants/runner.py``).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.util
import inspect
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, TypedDict

M, N_REAL, K, E, LAYER = 8, 5, 4, 16, 3
# Garbage a router can leave in padded rows: out of range both ways and -1.
PAD_IDS = [[9999, -1, 16, 123456], [-1, -1, -1, -1], [16, 17, 9999, -5]]
SHIFT = 5  # the placement: logical e lives at physical (e + SHIFT) % E
TOPK_MODULE = "sglang.srt.layers.moe.topk"


# --------------------------------------------------------------------- the schema


class CallResult(TypedDict):
    """One call's output."""

    ids: list[list[int]]
    w: list[list[float | str]]  # "nan" for NaN
    w_bits: list[list[int]]
    ids_dtype: str
    n_out: int


class StatusResult(TypedDict):
    """``sglang_hook.status()`` as plain data."""

    form: str | None
    state: str
    hooked: bool
    message: str


class DriverResult(TypedDict, total=False):
    """What ``driver.py`` writes (keys present depend on the mode)."""

    mode: str
    timings: dict[str, float]
    errors: list[str]
    logs: list[dict[str, str]]
    loader: str
    topk_file: str
    topk_import_error: str
    status: StatusResult | None
    function_is_wrapped: bool
    is_live: bool
    real_ids: list[list[int]]
    perm: list[int]
    pad_ids: list[list[int]]
    predicate: str | None
    remap_enabled_off: bool
    remap_enabled_on: bool
    eplb_info_map: list[int]
    scenarios: dict[str, CallResult]
    append: dict[str, Any]
    not_hip_identical: bool
    not_hip_pad_ids: list[list[int]]
    same_function_after_reload: bool
    is_live_after_reload: bool
    off_noargs_after_reload: CallResult
    register_again_raised: str | None
    broken_is_live: bool
    broken_status: StatusResult | None
    observer_applied: bool
    observer_calls: int
    verify_register_raised: str | None
    verify_status: StatusResult | None
    verify_is_live: bool
    verify_call: CallResult
    verify_call_raised: str | None
    verify_skip_mask_raised: str | None
    whitelist_status: str | None
    tail_zero_found: int
    unknown_file: str
    bare: CallResult
    bare_unpadded: CallResult
    register_raised: str | None
    hooked: CallResult
    hooked_unpadded: CallResult
    # plus "<label>_raised" (str | None) for each load: load_plugins_1..3, broken_load, ...


# --------------------------------------------------------------------- the process


class Collect(logging.Handler):
    """Every record of this package's and SGLang's plugin loggers, as plain data."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[dict[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(
            {"logger": record.name, "level": record.levelname, "msg": record.getMessage()}
        )


def collect_logs() -> Collect:
    logs = Collect()
    for name in ("sglang_amd_moe", "sglang.srt.plugins"):
        lg = logging.getLogger(name)
        lg.addHandler(logs)
        lg.setLevel(logging.DEBUG)
    return logs


def plugin_loader() -> Any | None:
    try:
        from sglang.srt import plugins
    except ImportError:
        return None
    return plugins


def status_dict(st: Any) -> StatusResult | None:
    if st is None:
        return None
    return {"form": st.form, "state": st.state, "hooked": st.hooked, "message": st.message}


def load(result: dict, label: str) -> None:
    """The real loader where the release has one, else the entry point called directly;
    records ``<label>_raised`` (must stay None) and the loader used."""
    t = time.perf_counter()
    plugins = plugin_loader()
    try:
        if plugins is not None:
            plugins.load_plugins()
            result.setdefault("loader", "sglang.srt.plugins.load_plugins")
        else:
            from sglang_amd_moe.runtime.plugin import register

            register()
            result.setdefault(
                "loader", "sglang_amd_moe.runtime.plugin.register (no loader in this release)"
            )
        result[f"{label}_raised"] = None
    except BaseException as exc:  # the assertion is that this never happens
        result[f"{label}_raised"] = f"{type(exc).__name__}: {exc}"
    result["timings"][label] = round(time.perf_counter() - t, 2)


def register_again(result: dict, key: str) -> None:
    from sglang_amd_moe.runtime.plugin import register

    try:
        register()
        result[key] = None
    except BaseException as exc:
        result[key] = repr(exc)


def take_hip_branch(
    tk: Any, fn: Callable[..., Any] | None = None, flags: tuple[str, ...] = ("_is_hip",)
) -> None:
    """Make this CPU process take the HIP branch: the module's HIP flags true, its CUDA
    flag false (also in the module that defines the running function, when another)."""
    mods = [tk]
    if fn is not None:
        g = getattr(inspect.unwrap(fn), "__globals__", None)
        if g is not None and g is not vars(tk):
            mods.append(_ModuleDict(g))
    for mod in mods:
        for flag in flags:
            setattr(mod, flag, True)
        if hasattr(mod, "_is_cuda"):
            mod._is_cuda = False


class _ModuleDict:
    """Attribute access on a module's globals dict."""

    def __init__(self, d: dict) -> None:
        object.__setattr__(self, "_d", d)

    def __setattr__(self, name: str, value: Any) -> None:
        self._d[name] = value

    def __getattr__(self, name: str) -> Any:
        try:
            return self._d[name]
        except KeyError:
            raise AttributeError(name) from None


# --------------------------------------------------------------------- the batch


@dataclasses.dataclass
class Batch:
    """The padded batch and the EPLB placement, and calls of the function on them."""

    tk: Any
    torch: Any
    real_ids: Any
    real_w: Any
    logits: Any
    perm: Any
    count_param: str = "num_token_non_padded"
    #: The function to call (None: the module's, as it is now).
    fn: Callable[..., Any] | None = None

    @classmethod
    def make(cls, tk: Any) -> Batch:
        import torch

        gen = torch.Generator().manual_seed(1234)
        real_ids = torch.randint(0, E, (N_REAL, K), generator=gen, dtype=torch.int32)
        real_w = torch.rand((N_REAL, K), generator=gen, dtype=torch.float32)
        logits = torch.randn((M, E), generator=gen, dtype=torch.float32)
        perm = (torch.arange(E, dtype=torch.int32) + SHIFT) % E
        return cls(tk, torch, real_ids, real_w, logits, perm)

    def config(self, **kw: Any) -> Any:
        names = {f.name for f in dataclasses.fields(self.tk.TopKConfig)}
        return self.tk.TopKConfig(top_k=K, **{k: v for k, v in kw.items() if k in names})

    def padded(self) -> tuple[Any, Any]:
        torch = self.torch
        ids = torch.cat([self.real_ids, torch.tensor(PAD_IDS, dtype=torch.int32)])
        w = torch.cat([self.real_w, torch.full((M - N_REAL, K), float("nan"))])
        return ids, w

    def call(
        self, info: Any, padded: bool = True, fn: Callable[..., Any] | None = None
    ) -> CallResult:
        torch = self.torch
        fn = fn or self.fn or self.tk._post_process_topk_ids
        if padded:
            ids, w = self.padded()
            n, lg = torch.tensor([N_REAL], dtype=torch.int32), self.logits
        else:
            ids, w, n, lg = self.real_ids.clone(), self.real_w.clone(), None, self.logits[:N_REAL]
        out = fn(
            topk_ids=ids,
            topk_weights=w,
            topk_config=self.config(),
            router_logits=lg,
            layer_id=LAYER,
            expert_location_dispatch_info=info,
            **{self.count_param: n},
        )
        return to_result(out)


def to_result(out: Any) -> CallResult:
    import torch

    out_ids, out_w = out[0], out[1]
    return {
        "ids": out_ids.tolist(),
        "w": [[("nan" if x != x else x) for x in row] for row in out_w.tolist()],
        "w_bits": out_w.contiguous().view(torch.int32).tolist(),
        "ids_dtype": str(out_ids.dtype),
        "n_out": len(out),
    }


class Eplb:
    """Server args and dispatch info, published and built with the release's own code."""

    def __init__(self, batch: Batch) -> None:
        from sglang.srt.eplb import expert_location as el
        from sglang.srt.eplb.expert_location_dispatch import ExpertLocationDispatchInfo
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        self.batch, self.el, self.Info = batch, el, ExpertLocationDispatchInfo
        self.ServerArgs, self.set_args = ServerArgs, set_global_server_args_for_scheduler

    def publish(self, **kw: Any) -> Any:
        sa = self.ServerArgs(model_path="dummy", **kw)
        self.set_args(sa)
        return sa

    def direct_info(self) -> Any:
        """A non-trivial static dispatch info built directly (as `--ep-dispatch-algorithm
        static` without EPLB gives)."""
        torch, perm = self.batch.torch, self.batch.perm
        fields = {f.name for f in dataclasses.fields(self.Info)}
        kw = dict(
            ep_dispatch_algorithm="static",
            partial_logical_to_rank_dispatch_physical_map=perm.clone(),
            partial_logical_to_all_physical_map=perm.clone()[:, None],
            partial_logical_to_all_physical_map_num_valid=torch.ones(E, dtype=torch.int64),
            num_physical_experts=E,
        )
        return self.Info(**{k: v for k, v in kw.items() if k in fields})

    def info(self) -> Any:
        """Dispatch info the way a model layer gets it: init_new over global metadata."""
        torch, perm, el = self.batch.torch, self.batch.perm, self.el
        inv = torch.argsort(perm).to(torch.int32)  # physical p holds logical inv[p]
        # One replica per logical expert, padded with -1 to the physical width (as
        # ExpertLocationMetadata._init_raw pads it).
        all_phys = torch.full((1, E, E), -1, dtype=torch.int32)
        all_phys[0, :, 0] = perm
        fields = {f.name for f in dataclasses.fields(el.ExpertLocationMetadata)}
        kw = dict(
            physical_to_logical_map=inv[None, :].clone(),
            physical_to_logical_map_cpu=inv[None, :].clone(),
            logical_to_all_physical_map=all_phys.clone(),
            logical_to_all_physical_map_cpu=all_phys.clone(),
            logical_to_all_physical_map_num_valid=torch.ones((1, E), dtype=torch.int64),
            ep_size=1,
            logical_to_rank_dispatch_physical_map=perm[None, :].clone(),
        )
        meta = el.ExpertLocationMetadata(**{k: v for k, v in kw.items() if k in fields})
        try:
            el.set_global_expert_location_metadata(meta, allow_overwrite=True)
        except TypeError:  # releases that set it once per process
            if el.get_global_expert_location_metadata() is None:
                el.set_global_expert_location_metadata(meta)
        return self.Info.init_new(layer_id=0)


def eplb_scenarios(
    batch: Batch, eplb: Eplb, result: dict, remap_enabled: Callable[[], bool] | None = None
) -> dict:
    """EPLB off (outside a server, then published off with a dispatch info passed) and
    on (published, with the real dispatch info); padded and unpadded calls."""
    scen: dict[str, CallResult] = {}
    scen["off_noargs"] = batch.call(None)
    scen["off_noargs_unpadded"] = batch.call(None, padded=False)
    eplb.publish()
    if remap_enabled is not None:
        result["remap_enabled_off"] = remap_enabled()
    scen["off_info"] = batch.call(eplb.direct_info())
    scen["off_info_unpadded"] = batch.call(eplb.direct_info(), padded=False)
    eplb.publish(enable_eplb=True, ep_dispatch_algorithm="static")
    if remap_enabled is not None:
        result["remap_enabled_on"] = remap_enabled()
    info = eplb.info()
    result["eplb_info_map"] = info.partial_logical_to_rank_dispatch_physical_map.tolist()
    scen["on"] = batch.call(info)
    scen["on_unpadded"] = batch.call(info, padded=False)
    eplb.publish()  # back to EPLB off
    return scen


def shared_append(batch: Batch) -> dict:
    """aiter's fused shared-expert append (a Triton kernel; interpreted on the CPU)."""
    tk, torch = batch.tk, batch.torch
    names = {f.name for f in dataclasses.fields(tk.TopKConfig)}
    if "num_fused_shared_experts" in names:
        cfg = tk.TopKConfig(top_k=K + 1, num_fused_shared_experts=1)
    else:
        from sglang.srt.configs.shared_experts import SharedExpertsConfig

        cfg = tk.TopKConfig(
            top_k=K + 1, shared_experts=SharedExpertsConfig(num_fused_shared_experts=1)
        )
    ids, w = batch.padded()
    saved = tk._use_aiter
    tk._use_aiter = True
    try:
        out = tk._post_process_topk_ids(
            topk_ids=ids,
            topk_weights=w,
            topk_config=cfg,
            router_logits=batch.logits,
            layer_id=LAYER,
            num_token_non_padded=torch.tensor([N_REAL], dtype=torch.int32),
            expert_location_dispatch_info=None,
        )
    finally:
        tk._use_aiter = saved
    return {
        "ids": out[0].tolist(),
        "w": [[("nan" if x != x else x) for x in row] for row in out[1].tolist()],
    }


# --------------------------------------------------------------------- scenarios


def import_topk(result: dict) -> Any | None:
    t = time.perf_counter()
    try:
        tk = importlib.import_module(TOPK_MODULE)
    except Exception as exc:  # e.g. 0.5.10 needs sgl_kernel's CUDA 12 libraries
        result["topk_import_error"] = f"{type(exc).__name__}: {exc}"
        from sglang_amd_moe.runtime.sglang import hook as sglang_hook

        result["status"] = status_dict(sglang_hook.status())
        return None
    result["timings"]["import_topk"] = round(time.perf_counter() - t, 2)
    return tk


def whitelist_excludes_us(result: dict) -> None:
    """SGLang's own whitelist applies: another plugin named, ours does not run."""
    os.environ["SGLANG_PLUGINS"] = "some_other_plugin"
    os.environ["SGLANG_AMD_MOE_FORCE"] = "1"
    load(result, "whitelist_load")
    from sglang_amd_moe.runtime.sglang import hook as sglang_hook

    st = sglang_hook.status()
    result["whitelist_status"] = None if st is None else st.form
    del os.environ["SGLANG_PLUGINS"], os.environ["SGLANG_AMD_MOE_FORCE"]


def behaviour(tk: Any, batch: Batch, result: dict) -> None:
    """The function as it runs now: EPLB off and on, and the shared-expert append."""

    t = time.perf_counter()
    predicate = next(
        (p for p in ("_eplb_remap_enabled", "is_expert_remapping_enabled") if hasattr(tk, p)), None
    )
    result["predicate"] = predicate
    from sglang_amd_moe.runtime.sglang.call import remap_enabled

    result["scenarios"] = eplb_scenarios(batch, Eplb(batch), result, lambda: remap_enabled(tk))
    result["timings"]["scenarios"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    if os.environ.get("TRITON_INTERPRET") == "1":
        try:
            result["append"] = shared_append(batch)
        except Exception as exc:
            result["append"] = {
                "error": f"{type(exc).__name__}: {exc}",
                "tb": traceback.format_exc()[-2000:],
            }
    result["timings"]["append"] = round(time.perf_counter() - t, 2)


def not_hip_and_reload(tk: Any, batch: Batch, result: dict) -> None:
    """Plugin mode: not HIP at call time gives upstream's result bit for bit; loading
    again changes nothing."""
    from sglang_amd_moe.runtime.sglang import hook

    tk._is_hip = False
    try:
        mine = batch.call(None)
        theirs = batch.call(None, fn=inspect.unwrap(tk._post_process_topk_ids))
        result["not_hip_identical"] = mine == theirs
        result["not_hip_pad_ids"] = mine["ids"][N_REAL:]
    finally:
        tk._is_hip = True
    before = tk._post_process_topk_ids
    load(result, "load_plugins_2")  # the loader's own once-per-process guard
    plugins = plugin_loader()
    if plugins is not None and hasattr(plugins, "_plugins_loaded"):
        plugins._plugins_loaded = False  # really run every plugin a second time
        load(result, "load_plugins_3")
    register_again(result, "register_again_raised")
    result["same_function_after_reload"] = tk._post_process_topk_ids is before
    result["is_live_after_reload"] = hook.is_live()
    result["off_noargs_after_reload"] = batch.call(None)
    result["status"] = status_dict(hook.status())


def broken_upstream_and_verify(tk: Any, batch: Batch, result: dict) -> None:
    """Bare mode: a missing function logs and does not raise; then another plugin's
    AROUND hook first, ours on top of it with ``SGLANG_AMD_MOE_VERIFY=1``."""
    from sglang_amd_moe.runtime.sglang import hook

    original = tk._post_process_topk_ids
    os.environ["SGLANG_AMD_MOE_FORCE"] = "1"
    del tk._post_process_topk_ids
    load(result, "broken_load")
    result["broken_is_live"] = hook.is_live()
    result["broken_status"] = status_dict(hook.status())
    tk._post_process_topk_ids = original
    # Another plugin's AROUND hook applied first: the registry would now skip ours
    # (the target counts as patched), so the plugin must wrap on top of it itself.
    seen: list[int] = []
    if plugin_loader() is not None:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        def observer(original_fn, *args, **kwargs):
            seen.append(1)
            return original_fn(*args, **kwargs)

        HookRegistry.register(f"{TOPK_MODULE}._post_process_topk_ids", observer, HookType.AROUND)
        HookRegistry.apply_hooks()
        result["observer_applied"] = tk._post_process_topk_ids is not original
    os.environ["SGLANG_AMD_MOE_VERIFY"] = "1"
    register_again(result, "verify_register_raised")
    result["verify_status"] = status_dict(hook.status())
    result["verify_is_live"] = hook.is_live()
    try:
        result["verify_call"] = batch.call(None)
        result["verify_call_raised"] = None
    except Exception as exc:
        result["verify_call_raised"] = f"{type(exc).__name__}: {exc}"
    result["observer_calls"] = len(seen)
    if hasattr(tk, "_skip_hip_pad_mask"):
        # Upstream's own switch (SGLANG_MORI_NO_PAD_MASK) skips its padded-weight
        # zeroing: VERIFY must catch the NaN weights and name the layer.
        tk._skip_hip_pad_mask = True
        try:
            batch.call(None)
            result["verify_skip_mask_raised"] = None
        except Exception as exc:
            result["verify_skip_mask_raised"] = f"{type(exc).__name__}: {exc}"
        finally:
            tk._skip_hip_pad_mask = False


# The trailing padded-weight zeroing of SGLang 0.5.19+ (form `fixed`); without it the
# function fills padded ids but never zeroes their weights, which no release does.
TAIL_ZERO = """        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)

    return topk_ids, topk_weights, recorder_topk_ids"""


def unknown_form(tk: Any, batch: Batch, result: dict, workdir: str) -> None:
    """An `unknown` form: the release's own function with its weight zeroing removed,
    compiled from a file (so its source and hash are real) into the module's globals."""
    import ast
    from pathlib import Path

    text = Path(tk.__file__).read_text()
    result["tail_zero_found"] = text.count(TAIL_ZERO)
    if text.count(TAIL_ZERO) != 1:
        return
    new_text = text.replace(
        TAIL_ZERO, TAIL_ZERO.replace("_zero_topk_weights_padded_region(", "pass  # (", 1)
    )
    path = Path(workdir) / "topk_unknown_form.py"
    path.write_text(new_text)
    result["unknown_file"] = str(path)
    func = next(
        n
        for n in ast.parse(new_text).body
        if isinstance(n, ast.FunctionDef) and n.name == "_post_process_topk_ids"
    )
    segment = "\n" * (func.lineno - 1) + ast.get_source_segment(new_text, func)
    exec(compile(segment, str(path), "exec"), tk.__dict__)  # replaces the module's function
    result["bare"] = batch.call(None)
    result["bare_unpadded"] = batch.call(None, padded=False)
    os.environ["SGLANG_AMD_MOE_FORCE"] = "1"
    from sglang_amd_moe.runtime.sglang import hook as sglang_hook

    register_again(result, "register_raised")
    result["is_live"] = sglang_hook.is_live()
    result["status"] = status_dict(sglang_hook.status())
    result["hooked"] = batch.call(None)
    result["hooked_unpadded"] = batch.call(None, padded=False)


# --------------------------------------------------------------------- more phases

LOG_BEGIN = "=== driver: log phase begins ==="
LOG_END = "=== driver: log phase ends ==="
AFTER = "after SGLang configured logging"


def log_phase(module: str, result: dict) -> None:
    """A process of SGLang's as it starts, for the plugin's one log line: the module that
    process runs imported first, then the real ``load_plugins()`` twice (SGLang's loader
    is idempotent; so must the line be), with no ``SGLANG_AMD_MOE_*`` variable; then
    logging configured the way SGLang's ``configure_logger()`` does next, and one more
    record. First in a fresh process: it is about the logging state SGLang leaves, which
    nothing before it may touch. What it writes to stderr lies between ``LOG_BEGIN`` and
    ``LOG_END`` (the test counts the lines there)."""
    print(LOG_BEGIN, file=sys.stderr, flush=True)
    try:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            result["log_not_importable"] = f"{type(exc).__name__}: {exc}"
            return
        root = logging.getLogger()
        result["log_root"] = (
            f"{len(root.handlers)} handler(s) at {logging.getLevelName(root.level)}"
        )
        from sglang.srt.plugins import load_plugins

        load_plugins()
        load_plugins()
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", force=True)
        logging.getLogger("sglang_amd_moe").info(AFTER)
    finally:
        print(LOG_END, file=sys.stderr, flush=True)


def loader_again() -> None:
    """Let SGLang's once-per-process ``load_plugins()`` run the plugins again."""
    plugins = plugin_loader()
    if plugins is not None and hasattr(plugins, "_plugins_loaded"):
        plugins._plugins_loaded = False


def fresh_topk() -> None:
    """Back to a process that has imported neither the topk module nor this package's
    SGLang hook: the hook uninstalled, topk forgotten (the next import executes it anew),
    SGLang's hook registry emptied and its loader ready to run again, no switch set."""
    from sglang_amd_moe.runtime.sglang import hook

    hook.uninstall()
    sys.modules.pop(TOPK_MODULE, None)
    if plugin_loader() is not None:
        from sglang.srt.plugins.hook_registry import HookRegistry

        HookRegistry.reset()
    loader_again()
    for var in ("SGLANG_AMD_MOE_FORCE", "SGLANG_AMD_MOE_VERIFY", "SGLANG_PLUGINS"):
        os.environ.pop(var, None)


class _ServeFile(importlib.abc.MetaPathFinder):
    """Serves one file as the topk module: every import of it gets that file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TOPK_MODULE:
            return None
        return importlib.util.spec_from_file_location(name, self.path)


def patched_phase(path: str) -> dict:
    """The release with a shipped patch applied (``path``: its patched topk.py, served as
    the release's topk module), without the plugin: the HIP branch EPLB off (no server
    arguments published, as before a server starts) and on (the release's own metadata
    and dispatch info), and aiter's shared-expert append (a Triton kernel, interpreted).
    Weights come back with ``None`` for NaN."""
    from sglang.srt import server_args

    if hasattr(server_args, "_global_server_args"):  # None until a server publishes them
        server_args.set_global_server_args_for_scheduler(None)
    finder = _ServeFile(path)
    sys.meta_path.insert(0, finder)
    try:
        try:
            tk = importlib.import_module(TOPK_MODULE)
        except Exception as exc:  # 0.5.10 needs sgl_kernel's CUDA libraries to import topk
            return {"import_error": f"{type(exc).__name__}: {exc}"}
        if tk.__file__ != path:
            raise AssertionError(f"topk came from {tk.__file__}, not {path}")
        take_hip_branch(tk)
        batch = Batch.make(tk)

        def plain(out: CallResult | dict) -> dict:
            w = [[None if x == "nan" else x for x in row] for row in out["w"]]
            return {"ids": out["ids"], "w": w}

        res: dict = {
            "real_ids": batch.real_ids.tolist(),
            "real_w": batch.real_w.tolist(),
            "perm": batch.perm.tolist(),
        }
        res["off"] = plain(batch.call(None))
        eplb = Eplb(batch)
        eplb.publish(enable_eplb=True, ep_dispatch_algorithm="static")
        res["on"] = plain(batch.call(eplb.info()))
        eplb.publish()
        res["append"] = plain(shared_append(batch))
        return res
    finally:
        sys.meta_path.remove(finder)


def phase(logs: Collect, body: Callable[[dict], None]) -> dict:
    """Run ``body`` on a result of its own: its timings, errors and log records."""
    t0 = time.perf_counter()
    first = len(logs.records)
    result: dict = {"timings": {}, "errors": []}
    try:
        body(result)
    except BaseException as exc:
        result["errors"].append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    result["logs"] = logs.records[first:]
    result["timings"]["total"] = round(time.perf_counter() - t0, 2)
    return result


def drive(mode: str, result: dict, workdir: str) -> None:
    """The calls of one mode (see the module docstring) on the topk module as it is now."""
    if mode == "unknown" and plugin_loader() is not None:
        whitelist_excludes_us(result)
    if mode == "plugin":
        load(result, "load_plugins_1")  # first thing in a fresh process, as a server does
    tk = import_topk(result)
    if tk is None:
        return
    take_hip_branch(tk)  # take the HIP branch on this CPU
    from sglang_amd_moe.runtime.sglang import hook

    result["topk_file"] = tk.__file__
    result["function_is_wrapped"] = hasattr(tk._post_process_topk_ids, "__wrapped__")
    result["is_live"] = hook.is_live()
    batch = Batch.make(tk)
    result["real_ids"] = batch.real_ids.tolist()
    result["perm"] = batch.perm.tolist()
    result["pad_ids"] = PAD_IDS
    if mode == "unknown":
        unknown_form(tk, batch, result, workdir)
        return
    behaviour(tk, batch, result)
    if mode == "plugin":
        not_hip_and_reload(tk, batch, result)
    if mode == "bare":
        broken_upstream_and_verify(tk, batch, result)


def run(mode: str, workdir: str, options: list[str] | None = None) -> DriverResult:
    """One driver run (see the module docstring); never raises (errors are recorded)."""
    opts = list(options or [])
    log_module = opts[opts.index("--log-module") + 1] if "--log-module" in opts else None
    patched = opts[opts.index("--patched") + 1] if "--patched" in opts else None
    t0 = time.perf_counter()
    result: dict = {"mode": mode, "timings": {}, "errors": []}
    if log_module is not None:
        try:
            log_phase(log_module, result)
        except BaseException as exc:
            result["errors"].append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        if mode == "log":
            return result  # type: ignore[return-value]
        from sglang_amd_moe.runtime.sglang import hook

        hook.uninstall()  # as if this package had never been loaded
        loader_again()
    logs = collect_logs()
    if "--unknown" in opts:
        fresh_topk()
        result["unknown"] = phase(logs, lambda r: drive("unknown", r, workdir))
        fresh_topk()
    first = len(logs.records)
    try:
        drive(mode, result, workdir)
    except BaseException as exc:
        result["errors"].append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    result["logs"] = logs.records[first:]
    if patched is not None:
        fresh_topk()
        result["patched"] = phase(logs, lambda r: r.update(patched_phase(patched)))
    result["timings"]["total"] = round(time.perf_counter() - t0, 2)
    return result  # type: ignore[return-value]


def main(argv: list[str]) -> int:
    mode, out = argv[0], argv[1]
    result = run(mode, os.getcwd(), argv[2:])
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Drive one real SGLang release's ``_post_process_topk_ids``; run in that release's venv.

Usage: ``python driver.py MODE OUT.json`` with MODE one of

* ``bare``: the release as installed (no plugin loaded): padded-row garbage per form,
  EPLB on and off; then a broken upstream (the function deleted) while the real
  ``load_plugins()`` (or ``register()`` where there is no loader) runs, which must log
  and not raise; then, with the function restored, ``SGLANG_AMD_MOE_VERIFY=1`` checks.
* ``plugin``: a fresh process whose first act is the real ``load_plugins()`` (this
  package's real entry point, discovered from its installed metadata; the caller sets
  ``SGLANG_AMD_MOE_FORCE=1``), then the same calls, then loading again.

Nothing is faked: the topk module's own ``_is_hip``/``_is_cuda`` flags are set to take
the HIP branch on this CPU, server args are published with the release's own
``set_global_server_args_for_scheduler``, and the EPLB dispatch info comes from the
release's ``ExpertLocationDispatchInfo.init_new`` over a real ``ExpertLocationMetadata``
holding a non-identity placement. Results go to OUT.json (tensors as lists); the pytest
side (``test_releases.py``) makes the assertions.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import sys
import time
import traceback

T0 = time.perf_counter()
MODE, OUT = sys.argv[1], sys.argv[2]

M, N_REAL, K, E, LAYER = 8, 5, 4, 16, 3
# Garbage a router can leave in padded rows: out of range both ways and -1.
PAD_IDS = [[9999, -1, 16, 123456], [-1, -1, -1, -1], [16, 17, 9999, -5]]
SHIFT = 5  # the placement: logical e lives at physical (e + SHIFT) % E


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append({"logger": record.name, "level": record.levelname, "msg": record.getMessage()})


LOGS = Collect()
for name in ("sglang_amd_moe", "sglang.srt.plugins"):
    lg = logging.getLogger(name)
    lg.addHandler(LOGS)
    lg.setLevel(logging.DEBUG)

result: dict = {"mode": MODE, "timings": {}, "errors": []}


def tick(name: str, t: float) -> None:
    result["timings"][name] = round(time.perf_counter() - t, 2)


def dump() -> None:
    result["logs"] = LOGS.records
    result["timings"]["total"] = round(time.perf_counter() - T0, 2)
    with open(OUT, "w") as f:
        json.dump(result, f, indent=1)


def plugin_loader():
    try:
        from sglang.srt import plugins
    except ImportError:
        return None
    return plugins


def load(label: str) -> None:
    """The real loader where the release has one, else the entry point called directly."""
    t = time.perf_counter()
    plugins = plugin_loader()
    try:
        if plugins is not None:
            plugins.load_plugins()
            result.setdefault("loader", "sglang.srt.plugins.load_plugins")
        else:
            from sglang_amd_moe.runtime.plugin import register

            register()
            result.setdefault("loader", "sglang_amd_moe.runtime.plugin.register (no loader in this release)")
        result[f"{label}_raised"] = None
    except BaseException as exc:  # the assertion is that this never happens
        result[f"{label}_raised"] = f"{type(exc).__name__}: {exc}"
    tick(label, t)


def main() -> None:
    if MODE == "unknown" and plugin_loader() is not None:
        # SGLang's own whitelist applies: another plugin named, ours does not run.
        os.environ["SGLANG_PLUGINS"] = "some_other_plugin"
        os.environ["SGLANG_AMD_MOE_FORCE"] = "1"
        load("whitelist_load")
        import sglang_amd_moe.runtime.sglang_hook as hook

        result["whitelist_status"] = None if hook.status() is None else hook.status().form
        del os.environ["SGLANG_PLUGINS"], os.environ["SGLANG_AMD_MOE_FORCE"]
    if MODE == "plugin":
        load("load_plugins_1")  # first thing in a fresh process, as a server does

    t = time.perf_counter()
    import torch

    try:
        tk = importlib.import_module("sglang.srt.layers.moe.topk")
    except Exception as exc:  # e.g. 0.5.10 needs sgl_kernel's CUDA 12 libraries
        result["topk_import_error"] = f"{type(exc).__name__}: {exc}"
        from sglang_amd_moe.runtime import sglang_hook

        st = sglang_hook.status()
        result["status"] = None if st is None else {"form": st.form, "hooked": st.hooked, "message": st.message}
        return
    tick("import_topk", t)
    tk._is_hip, tk._is_cuda = True, False  # take the HIP branch on this CPU
    import sglang_amd_moe.runtime.sglang_hook as hook

    result["topk_file"] = tk.__file__
    original = getattr(tk, "_post_process_topk_ids", None)
    result["function_is_wrapped"] = hasattr(original, "__wrapped__")
    result["is_live"] = hook.is_live()

    gen = torch.Generator().manual_seed(1234)
    real_ids = torch.randint(0, E, (N_REAL, K), generator=gen, dtype=torch.int32)
    real_w = torch.rand((N_REAL, K), generator=gen, dtype=torch.float32)
    logits = torch.randn((M, E), generator=gen, dtype=torch.float32)
    perm = (torch.arange(E, dtype=torch.int32) + SHIFT) % E
    result["real_ids"] = real_ids.tolist()
    result["perm"] = perm.tolist()
    result["pad_ids"] = PAD_IDS

    def config(**kw):
        names = {f.name for f in dataclasses.fields(tk.TopKConfig)}
        return tk.TopKConfig(top_k=K, **{k: v for k, v in kw.items() if k in names})

    def call(info, padded: bool = True, fn=None):
        fn = fn or tk._post_process_topk_ids
        if padded:
            ids = torch.cat([real_ids, torch.tensor(PAD_IDS, dtype=torch.int32)])
            w = torch.cat([real_w, torch.full((M - N_REAL, K), float("nan"))])
            n, lg = torch.tensor([N_REAL], dtype=torch.int32), logits
        else:
            ids, w, n, lg = real_ids.clone(), real_w.clone(), None, logits[:N_REAL]
        out = fn(
            topk_ids=ids,
            topk_weights=w,
            topk_config=config(),
            router_logits=lg,
            layer_id=LAYER,
            num_token_non_padded=n,
            expert_location_dispatch_info=info,
        )
        out_ids, out_w = out[0], out[1]
        return {
            "ids": out_ids.tolist(),
            "w": [[("nan" if x != x else x) for x in row] for row in out_w.tolist()],
            "w_bits": out_w.view(torch.int32).tolist(),
            "ids_dtype": str(out_ids.dtype),
            "n_out": len(out),
        }

    if MODE == "unknown":
        unknown_form(tk, call)
        return

    from sglang.srt.eplb import expert_location as el
    from sglang.srt.eplb.expert_location_dispatch import ExpertLocationDispatchInfo
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    def direct_info():
        fields = {f.name for f in dataclasses.fields(ExpertLocationDispatchInfo)}
        kw = dict(
            ep_dispatch_algorithm="static",
            partial_logical_to_rank_dispatch_physical_map=perm.clone(),
            partial_logical_to_all_physical_map=perm.clone()[:, None],
            partial_logical_to_all_physical_map_num_valid=torch.ones(E, dtype=torch.int64),
            num_physical_experts=E,
        )
        return ExpertLocationDispatchInfo(**{k: v for k, v in kw.items() if k in fields})

    def publish(**kw):
        sa = ServerArgs(model_path="dummy", **kw)
        set_global_server_args_for_scheduler(sa)
        return sa

    def eplb_info():
        """Dispatch info the way a model layer gets it: init_new over global metadata."""
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
        except TypeError:
            el.set_global_expert_location_metadata(meta)
        return ExpertLocationDispatchInfo.init_new(layer_id=0)

    # EPLB off, outside a server (nothing published): the predicate is False.
    t = time.perf_counter()
    scen: dict = {}
    predicate = next((p for p in ("_eplb_remap_enabled", "is_expert_remapping_enabled") if hasattr(tk, p)), None)
    result["predicate"] = predicate
    scen["off_noargs"] = call(None)
    scen["off_noargs_unpadded"] = call(None, padded=False)
    # EPLB off in a published server config, with a non-trivial dispatch info passed
    # (as `--ep-dispatch-algorithm static` without EPLB gives): no remap may happen.
    publish()
    result["remap_enabled_off"] = hook.remap_enabled(tk)
    scen["off_info"] = call(direct_info())
    scen["off_info_unpadded"] = call(direct_info(), padded=False)
    # EPLB on, published as a server publishes it; info from the real metadata path.
    publish(enable_eplb=True, ep_dispatch_algorithm="static")
    result["remap_enabled_on"] = hook.remap_enabled(tk)
    info = eplb_info()
    result["eplb_info_map"] = info.partial_logical_to_rank_dispatch_physical_map.tolist()
    scen["on"] = call(info)
    scen["on_unpadded"] = call(info, padded=False)
    result["scenarios"] = scen
    tick("scenarios", t)
    publish()  # back to EPLB off

    def shared_append() -> dict:
        """aiter's fused shared-expert append (a Triton kernel; interpreted on the CPU)."""
        names = {f.name for f in dataclasses.fields(tk.TopKConfig)}
        if "num_fused_shared_experts" in names:
            cfg = tk.TopKConfig(top_k=K + 1, num_fused_shared_experts=1)
        else:
            from sglang.srt.configs.shared_experts import SharedExpertsConfig

            cfg = tk.TopKConfig(top_k=K + 1, shared_experts=SharedExpertsConfig(num_fused_shared_experts=1))
        ids = torch.cat([real_ids, torch.tensor(PAD_IDS, dtype=torch.int32)])
        w = torch.cat([real_w, torch.full((M - N_REAL, K), float("nan"))])
        saved = tk._use_aiter
        tk._use_aiter = True
        try:
            out = tk._post_process_topk_ids(
                topk_ids=ids,
                topk_weights=w,
                topk_config=cfg,
                router_logits=logits,
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

    t = time.perf_counter()
    if os.environ.get("TRITON_INTERPRET") == "1":
        try:
            result["append"] = shared_append()
        except Exception as exc:
            result["append"] = {"error": f"{type(exc).__name__}: {exc}", "tb": traceback.format_exc()[-2000:]}
    tick("append", t)

    if MODE == "plugin":
        # Not HIP at call time (the CUDA/other branches): exactly what upstream returns.
        import inspect

        tk._is_hip = False
        try:
            mine = call(None)
            theirs = call(None, fn=inspect.unwrap(tk._post_process_topk_ids))
            result["not_hip_identical"] = mine == theirs
            result["not_hip_pad_ids"] = mine["ids"][N_REAL:]
        finally:
            tk._is_hip = True
        before = tk._post_process_topk_ids
        load("load_plugins_2")  # the loader's own once-per-process guard
        plugins = plugin_loader()
        if plugins is not None and hasattr(plugins, "_plugins_loaded"):
            plugins._plugins_loaded = False  # really run every plugin a second time
            load("load_plugins_3")
        from sglang_amd_moe.runtime.plugin import register

        try:
            register()
            result["register_again_raised"] = None
        except BaseException as exc:
            result["register_again_raised"] = repr(exc)
        result["same_function_after_reload"] = tk._post_process_topk_ids is before
        result["is_live_after_reload"] = hook.is_live()
        result["off_noargs_after_reload"] = call(None)
        st = hook.status()
        result["status"] = None if st is None else {"form": st.form, "hooked": st.hooked, "message": st.message}

    if MODE == "bare":
        # A broken upstream: the function is missing. The plugin must log and not raise.
        os.environ["SGLANG_AMD_MOE_FORCE"] = "1"
        del tk._post_process_topk_ids
        load("broken_load")
        result["broken_is_live"] = hook.is_live()
        st = hook.status()
        result["broken_status"] = None if st is None else {"form": st.form, "hooked": st.hooked, "message": st.message}
        tk._post_process_topk_ids = original
        # Another plugin's AROUND hook applied first: the registry would now skip ours
        # (the target counts as patched), so the plugin must wrap on top of it itself.
        seen: list[int] = []
        if plugin_loader() is not None:
            from sglang.srt.plugins.hook_registry import HookRegistry, HookType

            def observer(original_fn, *args, **kwargs):
                seen.append(1)
                return original_fn(*args, **kwargs)

            HookRegistry.register("sglang.srt.layers.moe.topk._post_process_topk_ids", observer, HookType.AROUND)
            HookRegistry.apply_hooks()
            result["observer_applied"] = tk._post_process_topk_ids is not original
        # SGLANG_AMD_MOE_VERIFY=1: the entry point called again, now with the check on.
        os.environ["SGLANG_AMD_MOE_VERIFY"] = "1"
        from sglang_amd_moe.runtime.plugin import register

        try:
            register()
            result["verify_register_raised"] = None
        except BaseException as exc:
            result["verify_register_raised"] = repr(exc)
        st = hook.status()
        result["verify_status"] = None if st is None else {"form": st.form, "hooked": st.hooked, "message": st.message}
        result["verify_is_live"] = hook.is_live()
        try:
            result["verify_call"] = call(None)
            result["verify_call_raised"] = None
        except Exception as exc:
            result["verify_call_raised"] = f"{type(exc).__name__}: {exc}"
        result["observer_calls"] = len(seen)
        if hasattr(tk, "_skip_hip_pad_mask"):
            # Upstream's own switch (SGLANG_MORI_NO_PAD_MASK) skips its padded-weight
            # zeroing: VERIFY must catch the NaN weights and name the layer.
            tk._skip_hip_pad_mask = True
            try:
                call(None)
                result["verify_skip_mask_raised"] = None
            except Exception as exc:
                result["verify_skip_mask_raised"] = f"{type(exc).__name__}: {exc}"
            finally:
                tk._skip_hip_pad_mask = False


# The trailing padded-weight zeroing of SGLang 0.5.19+ (form `fixed`); without it the
# function fills padded ids but never zeroes their weights, which no release does.
TAIL_ZERO = """        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)

    return topk_ids, topk_weights, recorder_topk_ids"""


def unknown_form(tk, call) -> None:
    """An `unknown` form: the release's own function with its weight zeroing removed,
    compiled from a file (so its source and hash are real) into the module's globals."""
    import ast
    from pathlib import Path

    text = Path(tk.__file__).read_text()
    result["tail_zero_found"] = text.count(TAIL_ZERO)
    if text.count(TAIL_ZERO) != 1:
        return
    new_text = text.replace(TAIL_ZERO, TAIL_ZERO.replace("_zero_topk_weights_padded_region(", "pass  # (", 1))
    path = Path.cwd() / "topk_unknown_form.py"
    path.write_text(new_text)
    result["unknown_file"] = str(path)
    func = next(n for n in ast.parse(new_text).body if isinstance(n, ast.FunctionDef) and n.name == "_post_process_topk_ids")
    segment = "\n" * (func.lineno - 1) + ast.get_source_segment(new_text, func)
    exec(compile(segment, str(path), "exec"), tk.__dict__)  # replaces the module's function
    result["bare"] = call(None)
    result["bare_unpadded"] = call(None, padded=False)
    os.environ["SGLANG_AMD_MOE_FORCE"] = "1"
    from sglang_amd_moe.runtime import sglang_hook
    from sglang_amd_moe.runtime.plugin import register

    try:
        register()
        result["register_raised"] = None
    except BaseException as exc:
        result["register_raised"] = repr(exc)
    result["is_live"] = sglang_hook.is_live()
    st = sglang_hook.status()
    result["status"] = None if st is None else {"form": st.form, "hooked": st.hooked, "message": st.message}
    result["hooked"] = call(None)
    result["hooked_unpadded"] = call(None, padded=False)


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:
        result["errors"].append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    dump()

"""Entry points and import orders, each in a fresh interpreter (the sort hook and the guard).

SGLang imports aiter lazily (``SGLANG_USE_AITER=1``), ATOM under vLLM imports it when
its MoE layers are built: the hook must end up in place whether aiter was imported
before or after the plugin ran, and must stay silent (one DEBUG line) and import
nothing where aiter is not installed. Children run with ``cwd`` in a temporary
directory and only the stand-in (or nothing) on ``PYTHONPATH``.
"""

from __future__ import annotations

import textwrap
from importlib.metadata import entry_points

import pytest
from aiter_testlib import STANDIN, run_result, subprocess_env

from sglang_amd_moe.runtime.target import logged

CHILD = textwrap.dedent(
    """
    import json, logging, sys
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append({"level": record.levelname, "logger": record.name,
                            "msg": record.getMessage()})
    logging.getLogger().addHandler(Keep())
    logging.getLogger().setLevel(logging.DEBUG)
    order, entry = sys.argv[1], sys.argv[2]
    result = {}

    def run_entry():
        if entry == "sglang-load_plugins":
            from sglang.srt.plugins import load_plugins
            load_plugins()
            return
        from importlib.metadata import entry_points
        group = {"vllm": "vllm.general_plugins", "sglang": "sglang.srt.plugins"}[entry]
        (ep,) = [e for e in entry_points(group=group) if e.name == "sglang_amd_moe"]
        result["entry_point"] = ep.value
        ep.load()()

    def use_aiter():
        try:
            import aiter.fused_moe as fm
        except Exception as exc:
            result["aiter_import_error"] = f"{type(exc).__name__}: {exc}"
            return
        import torch
        M, K, E = 48, 11, 513
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, E, (M, K), generator=g, dtype=torch.int32)
        ids[24::2] = -1
        w = torch.rand((M, K), generator=g)
        n = torch.tensor([20], dtype=torch.int32)
        out = fm._moe_sorting_impl(ids, w, E, 2560, torch.bfloat16, 16, None, n, 0, True,
                                   accumulate=True, output_aux=True)
        result["num_valid_ids"] = [int(x) for x in out[3]]

    if order == "aiter-first":
        use_aiter()
        run_entry()
    else:
        run_entry()
        use_aiter()
    from sglang_amd_moe.runtime.aiter import guard
    from sglang_amd_moe.runtime.aiter import hook as aiter_hook
    st, gst = aiter_hook.status(), guard.status()
    result.update(live=aiter_hook.is_live(), aiter_imported="aiter" in sys.modules,
                  status=None if st is None else {"state": st.state, "form": st.form,
                                                  "message": st.message},
                  guard=None if gst is None else {"state": gst.state, "live": guard.is_live(),
                                                  "message": gst.message},
                  records=records)
    print("RESULT " + json.dumps(result))
    """
)


def run_child(tmp_path, order: str, entry: str, shape: str | None, extra_env=None) -> dict:
    env = subprocess_env(shape)
    env.update(extra_env or {})
    return run_result(["-c", CHILD, order, entry], env, tmp_path)


def hook_records(result: dict, guard: bool = False) -> list[dict]:
    """Log records of this package about aiter: the sort hook's lines and the plugin's
    about it, or (``guard``) the guard's."""
    return [
        r
        for r in result["records"]
        if r["logger"] == "sglang_amd_moe"
        and "aiter" in r["msg"]
        and ("guard" in r["msg"]) == guard
    ]


def test_declared_entry_points() -> None:
    vllm = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    sglang = {e.name: e.value for e in entry_points(group="sglang.srt.plugins")}
    assert vllm.get("sglang_amd_moe") == "sglang_amd_moe.runtime.plugin:register_vllm"
    assert sglang.get("sglang_amd_moe") == "sglang_amd_moe.runtime.plugin:register"


@pytest.mark.parametrize(
    ("shape", "order"),
    [
        ("count-dropped", "plugin-first"),
        ("count-dropped", "aiter-first"),
        ("count-rejected", "plugin-first"),
        ("count-rejected", "aiter-first"),
    ],
)
def test_vllm_entry_point_patches_aiter_in_either_order(tmp_path, shape, order) -> None:
    r = run_child(tmp_path, order, "vllm", shape)
    assert r["entry_point"] == "sglang_amd_moe.runtime.plugin:register_vllm"
    assert (r["status"]["state"], r["status"]["form"]) == ("live", shape) and r["live"]
    # plugin first: the sort ran after the patch and honours the count;
    # aiter first: the sort ran before the plugin, so aiter sorted all 48 rows.
    assert r["num_valid_ids"][1] == (20 if order == "plugin-first" else 48)
    infos = [x for x in hook_records(r) if x["level"] == "INFO"]
    assert len(infos) == 1 and shape in infos[0]["msg"]
    assert not [x for x in hook_records(r) if x["level"] in ("WARNING", "ERROR", "CRITICAL")]
    # The guard, from the same entry point and in either order: live, one INFO line.
    assert r["guard"]["state"] == "live" and r["guard"]["live"]
    assert [x["level"] for x in hook_records(r, guard=True)][-1:] == ["INFO"]
    assert logged(r["guard"]["message"]) == hook_records(r, guard=True)[-1]["msg"]


@pytest.mark.sglang
def test_sglang_load_plugins_patches_aiter_imported_later(tmp_path) -> None:
    """ATOM inside SGLang: SGLang's real load_plugins() runs our sglang.srt.plugins entry."""
    r = run_child(
        tmp_path,
        "plugin-first",
        "sglang-load_plugins",
        "count-dropped",
        {"SGLANG_PLUGINS": "sglang_amd_moe"},
    )
    assert (r["status"]["state"], r["status"]["form"]) == ("live", "count-dropped") and r["live"]
    assert r["num_valid_ids"][1] == 20
    assert r["guard"]["state"] == "live" and r["guard"]["live"]


def test_without_aiter_register_is_silent_and_imports_nothing(tmp_path) -> None:
    for entry in ("sglang", "vllm"):
        r = run_child(tmp_path, "plugin-first", entry, None)
        assert r["aiter_import_error"].startswith("ModuleNotFoundError")
        assert not r["aiter_imported"] and not r["live"]
        assert (r["status"]["state"], r["status"]["form"]) == ("not-needed", None)
        for mine in (hook_records(r), hook_records(r, guard=True)):
            assert [x["level"] for x in mine] == ["DEBUG"], mine
            assert "not installed" in mine[0]["msg"]
        assert r["guard"]["state"] == "not-needed"


def test_broken_aiter_does_not_fail_the_process(tmp_path) -> None:
    r = run_child(tmp_path, "plugin-first", "vllm", "no-rocm")
    # aiter's own import error reaches its importer unchanged; the plugin stays quiet.
    assert r["aiter_import_error"] == "RuntimeError: ROCm version file not found"
    assert not r["live"] and (r["status"]["state"], r["status"]["form"]) == ("pending", None)
    assert r["guard"]["state"] == "pending" and not r["guard"]["live"]
    for guard in (False, True):
        loud = [x for x in hook_records(r, guard) if x["level"] in ("WARNING", "ERROR", "CRITICAL")]
        assert not loud
    assert (STANDIN / "aiter" / "__init__.py").is_file()

"""The aiter hook's decision and its gate, apart from applying anything.

``aiter_hook.decide(report, runtime)`` is a pure function: the form report of the
stand-in's real trees (and edits of them) and a description of what the running module
offers go in, a plan or a refusal comes out. The gate tests check that the aiter hook
sits behind the same gate as the SGLang hook (ROCm or ``SGLANG_AMD_MOE_FORCE=1``, and a
Triton the kernels run on) and reports ``off`` with the gate's reason.
"""

from __future__ import annotations

import dataclasses
import logging
import sys

import pytest
from aiter_testlib import STANDIN, forget_aiter

from sglang_amd_moe.runtime import env
from sglang_amd_moe.runtime.aiter import forms as aiter_forms
from sglang_amd_moe.runtime.aiter import hook as aiter_hook
from sglang_amd_moe.runtime.aiter.hook import Plan, Runtime, decide
from sglang_amd_moe.runtime.target import MARK, STATES, HookStatus, Refusal

SHAPES = STANDIN / "aiter" / "_shapes"
DROPPED = aiter_forms.analyze_source((SHAPES / "count_dropped" / "fused_moe.py").read_text())
REJECTED = aiter_forms.analyze_source((SHAPES / "count_rejected" / "fused_moe.py").read_text())
IMPL = (
    "topk_ids", "topk_weights", "num_experts", "model_dim", "moebuf_dtype", "block_size",
    "expert_mask", "num_local_tokens", "dispatch_policy", "use_opus", "return_local_topk_ids",
    "accumulate", "output_aux",
)  # fmt: skip
UNSUPPORTED = ("metadata", "model_dim", "inter_dim", "expert", "topk", "num_local_tokens")
AUX = ("topk_ids", "topk_weight", "M_logical", "NE", "TOPK")
RUNNING = Runtime(
    impl_params=IMPL,
    backend_present=True,
    unsupported_params=UNSUPPORTED,
    aux_present=True,
    aux_params=AUX,
)


def test_the_standin_trees_get_their_plans() -> None:
    assert decide(DROPPED, RUNNING) == Plan(
        "count-dropped", wrap_impl=True, unreject=False, accept_count=False
    )
    plan = decide(REJECTED, RUNNING)
    assert plan == Plan("count-rejected", wrap_impl=True, unreject=True, accept_count=True)
    # aiter.mxfp4_moe_sort that takes the count already (aiter PR 7083): left alone.
    takes = dataclasses.replace(RUNNING, aux_params=(*AUX, "num_local_tokens"))
    assert decide(REJECTED, takes).accept_count is False


@pytest.mark.parametrize(
    ("form", "state"),
    [("count-honored", "not-needed"), ("absent", "not-needed"), ("unknown", "refused")],
)
def test_forms_that_need_nothing_or_are_not_understood(form: str, state: str) -> None:
    report = dataclasses.replace(DROPPED, form=form)
    got = decide(report, Runtime())  # nothing read from the module: not needed for these
    assert isinstance(got, Refusal) and got.state == state
    assert aiter_forms.ACTIONS[form] in got.reason


@pytest.mark.parametrize(
    ("change", "state", "why"),
    [
        ({"kernels_error": "sglang_amd_moe.kernels lacks x"}, "error", "lacks x"),
        ({"impl_params": None}, "refused", "missing or has no signature"),
        ({"impl_params": IMPL[:-1]}, "refused", "output_aux"),
        ({"backend_present": False}, "refused", "_MOE_SORT_BACKEND is missing"),
        ({"impl_marked": True}, "refused", "another copy"),
    ],
)
def test_running_code_that_differs_is_refused(change: dict, state: str, why: str) -> None:
    got = decide(DROPPED, dataclasses.replace(RUNNING, **change))
    assert isinstance(got, Refusal) and got.state == state and why in got.reason


def test_a_rejecting_function_without_the_count_parameter_is_refused() -> None:
    got = decide(REJECTED, dataclasses.replace(RUNNING, unsupported_params=UNSUPPORTED[:-1]))
    assert isinstance(got, Refusal) and got.state == "refused"
    assert "_mxfp4_inline_sort_unsupported cannot be wrapped" in got.reason


def test_decide_reads_nothing_but_its_arguments() -> None:
    """Same inputs, same answer, and no module is imported or touched while deciding."""
    before = set(sys.modules)
    answers = {decide(DROPPED, RUNNING) for _ in range(3)}
    assert len(answers) == 1 and set(sys.modules) == before


# --- the gate ----------------------------------------------------------------------------


@pytest.fixture
def standin_on_path(monkeypatch: pytest.MonkeyPatch):
    aiter_hook.uninstall()
    forget_aiter()
    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.setenv("SGLANG_AMD_MOE_TEST_AITER_STANDIN_SHAPE", "count-dropped")
    for var in ("SGLANG_AMD_MOE_FORCE", "SGLANG_AMD_MOE_DISABLE"):
        monkeypatch.delenv(var, raising=False)
    yield monkeypatch
    aiter_hook.uninstall()
    forget_aiter()


def _finders() -> int:
    return sum(getattr(f, "_sglang_amd_moe_finder", False) for f in sys.meta_path)


def test_off_rocm_without_force_nothing_is_hooked(standin_on_path, caplog) -> None:
    if env.on_rocm():
        pytest.skip("this torch is a ROCm build")
    from sglang_amd_moe.runtime import plugin

    with caplog.at_level(logging.DEBUG, logger="sglang_amd_moe"):
        plugin.register_vllm()
        st = aiter_hook.status()
        again = aiter_hook.install()
        plugin.register_vllm()
    assert isinstance(st, HookStatus) and st.state == "off" and st.target == "aiter"
    assert "not ROCm" in st.message and "SGLANG_AMD_MOE_FORCE=1" in st.message
    assert again == st and aiter_hook.status() == st
    assert _finders() == 0  # no import hook waiting for aiter
    import aiter.fused_moe as fm

    assert not hasattr(fm._moe_sorting_impl, MARK) and not aiter_hook.is_live()
    mine = [r for r in caplog.records if r.name == "sglang_amd_moe"]
    assert [r.getMessage() for r in mine] == [st.message]  # one line, not one per call


def test_disabled_wins_over_force(standin_on_path) -> None:
    standin_on_path.setenv("SGLANG_AMD_MOE_FORCE", "1")
    standin_on_path.setenv("SGLANG_AMD_MOE_DISABLE", "1")
    st = aiter_hook.install()
    assert st.state == "off" and "SGLANG_AMD_MOE_DISABLE=1" in st.message
    assert _finders() == 0


@pytest.mark.parametrize("version", [None, "3.2.0", "3.0.0+rocm6.2", "dev"])
def test_a_triton_the_kernels_cannot_run_on_turns_the_hook_off(
    standin_on_path, version: str | None
) -> None:
    standin_on_path.setenv("SGLANG_AMD_MOE_FORCE", "1")
    standin_on_path.setattr(env, "triton_version", lambda: version)
    st = aiter_hook.install()
    assert st.state == "off" and "Triton" in st.message and "3.3" in st.message
    assert _finders() == 0


def test_every_status_is_a_hookstatus(standin_on_path) -> None:
    standin_on_path.setenv("SGLANG_AMD_MOE_FORCE", "1")
    st = aiter_hook.install()
    assert isinstance(st, HookStatus) and st.state == "pending" and st.state in STATES
    import aiter.fused_moe  # noqa: F401  (the finder patches it)

    st = aiter_hook.status()
    assert isinstance(st, HookStatus) and (st.state, st.form) == ("live", "count-dropped")
    assert st.hooked and st.message.startswith("sglang-amd-moe: aiter ")
    assert st.detail["patched"] == ["aiter.fused_moe._moe_sorting_impl"]
    assert st.detail["sha256"] == DROPPED.source_sha256


@pytest.mark.parametrize("raised", [RuntimeError("boom"), SystemExit(3)])
def test_install_never_raises(standin_on_path, raised: BaseException, caplog) -> None:
    standin_on_path.setenv("SGLANG_AMD_MOE_FORCE", "1")

    def boom(needed):
        raise raised

    standin_on_path.setattr(aiter_hook, "our_kernels", boom)
    import aiter.fused_moe as fm

    with caplog.at_level(logging.WARNING, logger="sglang_amd_moe"):
        st = aiter_hook.install()
    assert st.state == "error" and type(raised).__name__ in st.message
    assert "aiter left untouched" in st.message and st.message in caplog.text
    assert not hasattr(fm._moe_sorting_impl, MARK) and not aiter_hook.is_live()


def test_keyboard_interrupt_is_not_swallowed(standin_on_path) -> None:
    standin_on_path.setenv("SGLANG_AMD_MOE_FORCE", "1")

    def interrupt(needed):
        raise KeyboardInterrupt

    standin_on_path.setattr(aiter_hook, "our_kernels", interrupt)
    import aiter.fused_moe  # noqa: F401

    with pytest.raises(KeyboardInterrupt):
        aiter_hook.install()

"""register()/install() gating in this process (SGLang 0.5.23 in .venv; nothing imported
from SGLang beyond locating its topk.py, which is what the `fixed` decision needs)."""

from __future__ import annotations

import logging
import sys

import pytest
from sglang_release_support import releases, require_built

from sglang_amd_moe.runtime import plugin, sglang_hook

MAIN = releases.BY_LABEL[releases.MAIN_RELEASE]


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch):
    """A process state in which install() has never run."""
    for name, value in (("_STATE", None), ("_PLAN", None), ("_TOPK", None)):
        monkeypatch.setattr(sglang_hook, name, value)
    for var in ("SGLANG_AMD_MOE_DISABLE", "SGLANG_AMD_MOE_FORCE", "SGLANG_AMD_MOE_VERIFY"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _summaries(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "sglang_amd_moe" and r.getMessage().startswith("sglang-amd-moe: ")]


def test_disable_turns_everything_off(fresh, caplog) -> None:
    fresh.setenv("SGLANG_AMD_MOE_DISABLE", "1")
    fresh.setenv("SGLANG_AMD_MOE_FORCE", "1")
    with caplog.at_level(logging.INFO, logger="sglang_amd_moe"):
        plugin.register()
        plugin.register_vllm()
    assert sglang_hook.status() is None  # install() never ran
    msgs = [r.getMessage() for r in _summaries(caplog)]
    assert msgs and all("disabled by SGLANG_AMD_MOE_DISABLE=1" in m for m in msgs)


def test_not_rocm_without_force_registers_nothing(fresh, caplog) -> None:
    import torch

    if torch.version.hip:
        pytest.skip("this torch is a ROCm build")
    with caplog.at_level(logging.INFO, logger="sglang_amd_moe"):
        result = sglang_hook.install()
        again = sglang_hook.install()
    assert result.form == "skipped" and not result.hooked
    assert "not ROCm" in result.message and "SGLANG_AMD_MOE_FORCE=1" in result.message
    assert again.form == "skipped"
    assert len(_summaries(caplog)) == 1  # one line per process, not per call


def test_fixed_release_is_left_alone_without_importing_topk(fresh, caplog) -> None:
    require_built(MAIN)
    fresh.setenv("SGLANG_AMD_MOE_FORCE", "1")
    imported_before = "sglang.srt.layers.moe.topk" in sys.modules
    with caplog.at_level(logging.INFO, logger="sglang_amd_moe"):
        result = sglang_hook.install()
        sglang_hook.install()
    assert result.form == "fixed" and not result.hooked
    assert result.message == (
        f"sglang-amd-moe: sglang {MAIN.version} _post_process_topk_ids form=fixed -> "
        "not hooked: upstream already masks padded ids on HIP"
    )
    if not imported_before:
        assert "sglang.srt.layers.moe.topk" not in sys.modules
    assert not sglang_hook.is_live()
    lines = _summaries(caplog)
    assert len(lines) == 1 and lines[0].levelno == logging.INFO


def test_install_never_raises(fresh, caplog) -> None:
    def boom():
        raise RuntimeError("simulated failure while locating topk.py")

    fresh.setenv("SGLANG_AMD_MOE_FORCE", "1")
    fresh.setattr(sglang_hook, "_topk_path", boom)
    with caplog.at_level(logging.INFO, logger="sglang_amd_moe"):
        result = sglang_hook.install()
        plugin.register()
    assert result.form == "error" and not result.hooked
    assert "simulated failure" in result.message and "SGLang left untouched" in result.message
    assert any(r.levelno == logging.WARNING and "simulated failure" in r.getMessage() for r in caplog.records)

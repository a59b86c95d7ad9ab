"""Fixtures for the aiter hook tests: load the one aiter stand-in in a chosen shape.

The stand-in (``tests/aiter_standin``) is put on ``sys.path`` only here and in the
subprocesses these tests start; it is never installed. Switching shapes in one process
means forgetting every ``aiter`` module (the stand-in reads
``SGLANG_AMD_MOE_TEST_AITER_STANDIN_SHAPE`` at import) and undoing the hook
(:func:`sglang_amd_moe.runtime.aiter.hook.uninstall`, and the guard's).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
from aiter_testlib import STANDIN, forget_aiter


@pytest.fixture
def load_aiter(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., ModuleType]]:
    """``load_aiter(shape, hook_first=True)`` -> the stand-in's ``aiter.fused_moe``.

    ``hook_first``: ``aiter_hook.install()`` runs before the import (the finder patches
    the module as it loads), else after it (patched in place); ``None``: no hook. This
    machine is not ROCm, so ``SGLANG_AMD_MOE_FORCE=1`` opens the hooks' gate.
    """
    from sglang_amd_moe.runtime.aiter import guard
    from sglang_amd_moe.runtime.aiter import hook as aiter_hook

    aiter_hook.uninstall()
    guard.uninstall()
    forget_aiter()
    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.setenv("SGLANG_AMD_MOE_FORCE", "1")
    monkeypatch.delenv("SGLANG_AMD_MOE_DISABLE", raising=False)

    def load(shape: str, hook_first: bool | None = True) -> ModuleType:
        monkeypatch.setenv("SGLANG_AMD_MOE_TEST_AITER_STANDIN_SHAPE", shape)
        if hook_first:
            assert aiter_hook.install().state == "pending"
        import aiter.fused_moe as fm

        if hook_first is False:
            assert aiter_hook.install().form == shape
        assert getattr(sys.modules["aiter"], "IS_STANDIN", False)
        assert sys.modules["aiter"].STANDIN_SHAPE == shape
        if hook_first is not None:
            assert aiter_hook.status().form == shape
        fm.standin_sorts.clear()
        sys.modules["aiter.ops.moe_mxfp4_aux"].standin_calls.clear()
        sys.modules["aiter.ops.moe_sorting"].standin_calls.clear()
        sys.modules["aiter.ops.moe_sorting"].standin_inputs.clear()
        return fm

    yield load
    aiter_hook.uninstall()
    guard.uninstall()
    forget_aiter()

"""``runtime/target.py``, the skeleton both hooks stand on, in-process on synthetic
modules and a minimal target (each test starts from a fresh one)."""

from __future__ import annotations

import functools
import logging
import sys
import types

import pytest

from sglang_amd_moe.runtime import target
from sglang_amd_moe.runtime.target import HookStatus, Target, find_marked, holds, logged, mark

OPEN = (True, "test")


class Toy(Target):
    """Wraps ``f`` of one synthetic module, or fails as told."""

    name, what, upstream = "toy", "toymod.f", "toy"

    def __init__(self, mod: types.ModuleType, raises: BaseException | None = None) -> None:
        super().__init__()
        self.mod, self.raises, self.calls, self.original = mod, raises, 0, mod.f

    def _install(self, gate):
        self.calls += 1
        if self.raises is not None:
            raise self.raises

        @functools.wraps(self.original)
        def f(*a):
            return -self.original(*a)

        self.mod.f = mark(f, self.original)
        return self.record(self.make_status("live", "toy-form", "toy hooked"))

    def is_live(self) -> bool:
        return holds(self.mod.f, self.mod.f) and find_marked(self.mod.f) is not None

    def _undo(self) -> None:
        self.mod.f = self.original


@pytest.fixture
def mod():
    m = types.ModuleType("toymod")
    m.f = lambda x: x
    sys.modules["toymod"] = m
    yield m
    del sys.modules["toymod"]


def _lines(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "sglang_amd_moe"]


def test_install_is_idempotent_and_logs_one_line(mod, caplog) -> None:
    toy = Toy(mod)
    with caplog.at_level(logging.DEBUG, logger="sglang_amd_moe"):
        st = toy.install(OPEN)
        assert toy.install(OPEN) is st and toy.calls == 1
    assert st == HookStatus("toy", "live", "toy-form", "sglang-amd-moe: toy hooked")
    assert mod.f(3) == -3 and toy.is_live()
    assert _lines(caplog) == [(logging.INFO, logged("sglang-amd-moe: toy hooked"))]
    toy.uninstall()
    assert mod.f(3) == 3 and toy.status() is None and not toy.is_live()


def test_a_closed_gate_records_off_and_logs_nothing(mod, caplog) -> None:
    toy = Toy(mod)
    with caplog.at_level(logging.DEBUG, logger="sglang_amd_moe"):
        st = toy.install((False, "not ROCm"))
    assert (st.state, st.message) == ("off", "sglang-amd-moe: not ROCm; nothing hooked")
    assert toy.calls == 0 and mod.f(3) == 3 and _lines(caplog) == []


@pytest.mark.parametrize("raised", [RuntimeError("boom"), SystemExit(3), GeneratorExit()])
def test_any_failure_is_an_error_status(mod, caplog, raised: BaseException) -> None:
    toy = Toy(mod, raises=raised)
    with caplog.at_level(logging.DEBUG, logger="sglang_amd_moe"):
        st = toy.install(OPEN)
    assert st.state == "error" and type(raised).__name__ in st.message
    assert st.message.endswith("toy left untouched") and "hooking toymod.f failed" in st.message
    assert [lvl for lvl, _ in _lines(caplog)] == [logging.WARNING]


def test_keyboard_interrupt_passes(mod) -> None:
    with pytest.raises(KeyboardInterrupt):
        Toy(mod, raises=KeyboardInterrupt()).install(OPEN)


def test_a_state_must_be_known() -> None:
    with pytest.raises(ValueError, match="state must be one of"):
        HookStatus("aiter", "hooked", None, "x")
    assert HookStatus("aiter", "pending", None, "x").hooked
    assert not HookStatus("aiter", "refused", "unknown", "x").hooked


def test_call_failures_log_their_traceback_once(mod, caplog) -> None:
    toy = Toy(mod)
    with caplog.at_level(logging.DEBUG, logger="sglang_amd_moe"):
        for _ in range(3):
            try:
                raise ValueError("in a hooked call")
            except ValueError:
                toy.log_call_failure("guard", "the guard failed")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None


def test_marks_are_found_under_other_wrappers() -> None:
    def original():
        return 1

    def ours():
        return original()

    mark(ours, original)

    @functools.wraps(ours)
    def someone_elses():  # another plugin's wrapper on top (copies our mark, too)
        return ours()

    assert getattr(ours, target.MARK) is original
    assert find_marked(someone_elses) is ours
    assert find_marked(original) is None and find_marked(None) is None
    assert holds(someone_elses, ours) and not holds(original, ours)


def test_copies_made_by_from_import_are_rebound(mod) -> None:
    other = types.ModuleType("toy_consumer")
    other.f, other.alias = mod.f, mod.f
    sys.modules["toy_consumer"] = other
    try:
        new = lambda x: 0  # noqa: E731
        rebound = target.rebind_copies(mod.f, new, name="f", skip={(id(mod), "f")})
        assert (other, "f") in rebound and other.f is new and other.alias is not new
    finally:
        del sys.modules["toy_consumer"]


def test_a_callback_runs_right_after_a_watched_module_executes(tmp_path, monkeypatch) -> None:
    (tmp_path / "toy_watched.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def patch(module):
        seen.append(module.VALUE)
        module.VALUE = 2

    target.when_imported("toy_watched", patch)
    try:
        assert target.watching("toy_watched")
        import toy_watched

        assert seen == [1] and toy_watched.VALUE == 2
    finally:
        target.forget("toy_watched", patch)
        sys.modules.pop("toy_watched", None)
    assert not target.watching("toy_watched")
    assert not any(isinstance(f, target._Finder) for f in sys.meta_path)

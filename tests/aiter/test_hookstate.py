"""``hookstate``: the status type, its one-line-per-change logging and the wrapper marks
that both hooks share (it lives beside the aiter tests because it needs nothing else)."""

from __future__ import annotations

import functools
import logging

import pytest

from sglang_amd_moe.runtime import hookstate
from sglang_amd_moe.runtime.hookstate import HookStatus, announce, find_marked, mark


def test_a_status_state_must_be_known() -> None:
    with pytest.raises(ValueError, match="state must be one of"):
        HookStatus("aiter", "hooked", None, "x")
    assert set(hookstate.LEVELS) == set(hookstate.STATES)
    assert HookStatus("aiter", "pending", None, "x").hooked
    assert not HookStatus("aiter", "refused", "unknown", "x").hooked


def test_announce_logs_once_per_change(caplog) -> None:
    lg = logging.getLogger("test_hookstate_announce")
    caplog.set_level(logging.DEBUG, logger=lg.name)
    off = HookStatus("aiter", "off", None, "sglang-amd-moe: off")
    live = HookStatus("aiter", "live", "count-dropped", "sglang-amd-moe: live")
    bad = HookStatus("aiter", "refused", "unknown", "sglang-amd-moe: refused")
    assert announce(lg, off, None)
    assert not announce(lg, off, off)  # the same again: nothing
    assert not announce(lg, HookStatus("aiter", "off", None, "sglang-amd-moe: off"), off)
    assert announce(lg, live, off)
    assert announce(lg, bad, live)
    assert announce(lg, off, bad, level=logging.DEBUG)
    got = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == lg.name]
    assert got == [
        (logging.INFO, off.message),
        (logging.INFO, live.message),
        (logging.WARNING, bad.message),
        (logging.DEBUG, off.message),
    ]


def test_marks_are_found_under_other_wrappers() -> None:
    def original():
        return 1

    def ours():
        return original()

    mark(ours, original)

    @functools.wraps(ours)
    def someone_elses():  # another plugin's wrapper on top (sets __wrapped__)
        return ours()

    assert getattr(ours, hookstate.MARK) is original
    assert find_marked(someone_elses) is ours
    assert find_marked(original) is None and find_marked(None) is None

"""When the counters' line is written (``runtime/stats.py``): a few seconds after counting
starts, then after gaps that double up to a minute, and only while the counts grow. On
the CPU the buffer is a CPU tensor, so each copy is done at once and the line is written
by the next eager call's tick; the clock is this test's."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from sglang_amd_moe.runtime import stats


@pytest.fixture
def clock(monkeypatch):
    monkeypatch.delenv("SGLANG_AMD_MOE_STATS", raising=False)
    now = [1000.0]
    monkeypatch.setattr(stats, "time", SimpleNamespace(monotonic=lambda: now[0]))
    stats.reset()
    yield now
    stats.reset()


def _run(clock, caplog, seconds: range, grow: bool = True) -> list[tuple[int, str]]:
    """One eager call a second (the kernels' adds, then the call's tick): (second, line)."""
    buf = stats.buffer("guard", torch.device("cpu"))
    assert buf is not None
    out = []
    for t in seconds:
        clock[0] = 1000.0 + t
        if grow:
            buf[0] += 1  # calls
            buf[1] += 3  # out_of_range
        caplog.clear()
        stats.tick()
        out += [
            (t, r.getMessage()) for r in caplog.records if "stats: target=guard" in r.getMessage()
        ]
    return out


def test_the_first_lines_come_within_seconds_then_once_a_minute(clock, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="sglang_amd_moe"):
        lines = _run(clock, caplog, range(0, 260))
    # Copies start 5, 15, 35, 75, 135, 195, 255 s after the first count (gaps 5, 10, 20,
    # 40, then 60 s); each line is written by the tick after its copy.
    assert [t for t, _ in lines] == [6, 16, 36, 76, 136, 196, 256], lines
    # A line holds the counts as copied: calls made in seconds 0..5 for the first.
    assert " calls=6 out_of_range=18 " in lines[0][1], lines[0]
    assert " calls=256 out_of_range=768 " in lines[-1][1], lines[-1]


def test_no_line_while_the_counts_stand_still(clock, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="sglang_amd_moe"):
        first = _run(clock, caplog, range(0, 20))
        still = _run(clock, caplog, range(20, 400), grow=False)
    assert [t for t, _ in first] == [6, 16]
    assert [t for t, _ in still] == [36], still  # what grew until second 19, once

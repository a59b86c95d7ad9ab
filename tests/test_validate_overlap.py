"""The overlap check on its own: byte-exact, against a brute-force byte set.

Every kernel call refuses tensors it writes that share a byte with another tensor of
the call; tensors that only interleave (two column ranges of one buffer, rows of one
between rows of another) share nothing and are accepted. The check describes each
tensor as a set of byte ranges (one per row, or one for a contiguous tensor) and
decides each pair in closed form or row by row; this compares it with the set of bytes
each tensor covers, on random layouts over one buffer.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_amd_moe.kernels import _validate

BASE = 1 << 20  # a fake address: only differences matter


def _bytes(region) -> set[int]:
    start, _, _, _, pitch, width, rows = region
    return {start + r * pitch + b for r in range(rows) for b in range(width)}


def _region(offset: int, pitch: int, width: int, rows: int, name: str, written: bool = True):
    start = BASE + offset
    return (start, start + (rows - 1) * pitch + width, written, name, pitch, width, rows)


layouts = st.tuples(
    st.integers(0, 64),  # offset
    st.integers(1, 24),  # width
    st.integers(0, 24),  # pitch beyond width (rows never overlap themselves)
    st.integers(1, 9),  # rows
)


@settings(max_examples=400, deadline=None)
@given(a=layouts, b=layouts, same_pitch=st.booleans())
def test_pairs_match_the_byte_sets(a, b, same_pitch: bool) -> None:
    ra = _region(a[0], a[1] + a[2], a[1], a[3], "a")
    pitch_b = ra[4] if same_pitch and b[1] <= ra[4] else b[1] + b[2]
    rb = _region(b[0], pitch_b, b[1], b[3], "b")
    shared = bool(_bytes(ra) & _bytes(rb))
    if shared:
        with pytest.raises(ValueError, match="overlap in memory"):
            _validate._check_spans([ra, rb])
    else:
        _validate._check_spans([ra, rb])


def test_read_only_tensors_may_overlap() -> None:
    _validate._check_spans([_region(0, 8, 8, 4, "a", False), _region(0, 8, 8, 4, "b", False)])


def test_many_rows_with_different_pitches() -> None:
    """Row-by-row comparison in steps: bytes shared only in the last rows are found."""
    rows = 3 * _validate._ROWS_PER_STEP
    a = _region(0, 16, 4, rows, "a")
    last_a_row = (rows - 1) * 16
    b = _region(last_a_row + 3 - 17 * (rows - 1), 17, 1, rows, "b")
    assert b[0] + (rows - 1) * 17 == BASE + last_a_row + 3  # b's last byte: in a's last row
    with pytest.raises(ValueError, match="overlap in memory"):
        _validate._check_spans([a, b])
    b_clear = _region(8, 32, 1, rows // 2, "b")  # byte 8 of every other row of a: a gap
    _validate._check_spans([a, b_clear])


def test_regions_of_real_tensors() -> None:
    buf = torch.zeros(10, 7, dtype=torch.int32)
    left, right = buf[:, :3], buf[:, 3:]
    got = [_validate._region(x, n, True) for x, n in ((left, "l"), (right, "r"))]
    assert got[0][4:] == (28, 12, 10) and got[1][4:] == (28, 16, 10)
    _validate._check_spans(got)
    assert _validate._region(buf, "all", False)[4:] == (280, 280, 1)
    assert _validate._region(buf[:0], "none", False) is None
    # Not a row set (a transposed slice): its whole span, one range.
    span = _validate._region(buf[:, :3].t(), "t", True)
    assert span[6] == 1 and span[1] - span[0] == (9 * 7 + 2 + 1) * 4

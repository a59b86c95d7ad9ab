"""What the kernel tests share: the device they run on, row/count cases, bit views.

Imported as a plain module (``tests`` is on pytest's ``pythonpath``) by the CPU kernel
tests (``tests/test_mask_padded_rows.py``, ``tests/test_mxfp4_moe_sort.py``,
``tests/test_kernel_launch.py``) and the GPU suite (``tests/gpu/``).
"""

from __future__ import annotations

import pytest
import torch
from sglang_amd_moe.kernels.utils import triton_backend

# (rows, real rows): one row, no real row, a padded tail, chunk and block edges.
ROWS_COUNTS = [(1, 1), (4, 0), (4, 3), (16, 5), (48, 47), (48, 48), (256, 200)]


def bits(x: torch.Tensor) -> torch.Tensor:
    """Same-width integer view, so NaNs and -0.0 compare bit for bit."""
    return x.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def kernel_device() -> str:
    """Where the CPU kernel tests run the Triton kernels: on the CPU through Triton's
    interpreter (``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` before Triton is
    imported on a machine without a GPU), else on the GPU. Fails the importing test
    module when neither is possible."""
    if triton_backend(torch.device("cpu")) == "triton-interpreter":
        return "cpu"
    if not torch.cuda.is_available():
        pytest.fail(
            "no GPU and Triton is not interpreting: TRITON_INTERPRET=1 must be set before "
            "triton is imported (tests/conftest.py does this unless the variable is set)",
            pytrace=False,
        )
    return "cuda"


def assert_same_sort(got: dict, want: dict, M: int, MB: int, exact: bool = True) -> None:
    """The sort's outputs ``got`` against the reference's ``want`` (dicts by aiter's
    names). ``exact``: bit for bit. Otherwise (the atomic path, whose order within an
    expert depends on timing) everything but that order: totals, block experts, gap
    slots and which pairs are dropped are identical, and every kept pair sits in a slot
    of its own expert holding its token, row and weight, its reverse entry pointing there.
    """
    total = int(want["cumsum_tensor"][0])
    assert torch.equal(got["cumsum_tensor"][:2], want["cumsum_tensor"][:2])
    assert torch.equal(
        got["sorted_expert_ids"][: total // MB], want["sorted_expert_ids"][: total // MB]
    )
    rev_got, rev_want = got["reverse_sorted"], want["reverse_sorted"]
    if exact:
        for name in ("sorted_token_ids", "m_indices", "sorted_weights"):
            assert torch.equal(bits(got[name][:total]), bits(want[name][:total])), name
        assert torch.equal(rev_got, rev_want)
        return
    assert torch.equal(rev_got < 0, rev_want < 0)
    gaps = want["sorted_token_ids"][:total] == M
    assert torch.equal(
        got["sorted_token_ids"][:total][gaps], want["sorted_token_ids"][:total][gaps]
    )
    assert bool((got["m_indices"][:total][gaps] == M).all())
    assert bool((bits(got["sorted_weights"][:total][gaps]) == 0).all())
    kept = rev_want >= 0
    slot_got, slot_want = rev_got[kept].long(), rev_want[kept].long()
    assert slot_got.unique().numel() == slot_got.numel()  # one slot per pair
    for name in ("sorted_token_ids", "m_indices", "sorted_weights"):
        assert torch.equal(bits(got[name][slot_got]), bits(want[name][slot_want])), name
    experts = want["sorted_expert_ids"]
    assert torch.equal(experts[slot_got // MB], experts[slot_want // MB])


def forbid_reference(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> None:
    """Make ``module.name`` (a kernel module's plain-torch fallback) raise, so every call
    of the kernel must go through Triton."""

    def _no_fallback(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{module.__name__} fell back to {name}")

    monkeypatch.setattr(module, name, _no_fallback)


def assert_runs_through_triton(device: str) -> None:
    """The kernels run compiled on a GPU and in Triton's interpreter on the CPU."""
    expected = "triton-interpreter" if device == "cpu" else "triton"
    assert triton_backend(torch.device(device)) == expected

"""The kernels' custom ops take their mutated optional ``stats`` without a default.

torch 2.10 and 2.11 drop an argument that equals its schema default before bumping the
version counter of each mutated argument, then index the missing argument and raise
``IndexError: tuple index out of range`` (pytorch/pytorch#176078). The mask and the guard
reach their ops under ``torch.compile``; with ``stats=None`` (``SGLANG_AMD_MOE_STATS=0``, or
any direct call without counters) the trace failed there on the GPU machine's torch 2.11.
Newer torch fills the defaults back in, so on this machine only the schema can show it.
"""

from __future__ import annotations

import pytest
import sglang_amd_moe.kernels  # noqa: F401 - registers the ops
import torch

OPS = ("mask_padded_rows", "guard_routing")


@pytest.mark.parametrize("name", OPS)
def test_mutated_optional_arguments_have_no_default(name: str) -> None:
    schema = getattr(torch.ops.sglang_amd_moe, name).default._schema
    mutated = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert "stats" in [a.name for a in mutated], str(schema)
    with_default = [a.name for a in mutated if a.has_default_value()]
    assert with_default == [], f"{schema}: torch 2.10-2.11 drop these when they equal it"


@pytest.mark.parametrize("name", OPS)
def test_the_ops_run_with_stats_none_through_the_dispatcher(name: str) -> None:
    """Through the dispatcher (the path ``torch.compile`` traces), no counters asked for."""
    ids = torch.tensor([[1, 300], [2, 5], [-1, 7]], dtype=torch.int32)
    w = torch.ones(3, 2)
    count = torch.tensor([2], dtype=torch.int32)
    op = getattr(torch.ops.sglang_amd_moe, name).default
    if name == "mask_padded_rows":
        op(ids, w, count, 0, None)
        assert ids[2].tolist() == [0, 0] and w[2].tolist() == [0.0, 0.0]
    else:
        out_ids, out_w = op(ids, w, 257, count, None)
        assert out_ids.tolist() == [[1, 0], [2, 5], [0, 0]]
        assert out_w.tolist() == [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]

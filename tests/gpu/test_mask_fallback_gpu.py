"""The SGLang hook's plain-torch mask (what masks padded rows where the kernel cannot run)
on a GPU: captured in a CUDA graph and replayed with new counts, with a count dtype the
kernel refuses, it writes what the kernel's reference writes. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from sglang_amd_moe.kernels import mask_padded_rows_reference_

from sglang_amd_moe.runtime.sglang.call import mask_fallback_

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)


@pytest.mark.parametrize("count_dtype", [torch.int32, torch.int16])
def test_the_torch_mask_replays_in_a_graph_with_new_counts(count_dtype) -> None:
    rows, k = 64, 8
    src_ids = torch.randint(0, 32, (rows, k), dtype=torch.int32, device="cuda")
    src_w = torch.rand(rows, k, device="cuda")
    ids, w = src_ids.clone(), src_w.clone()
    count = torch.tensor([rows], dtype=count_dtype, device="cuda")
    mask_fallback_(ids, w, count)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mask_fallback_(ids, w, count)
    for n in (0, 1, 17, rows, rows + 5):
        ids.copy_(src_ids)
        w.copy_(src_w)
        count.fill_(n)
        graph.replay()
        want_ids, want_w = src_ids.clone(), src_w.clone()
        mask_padded_rows_reference_(want_ids, want_w, count.to(torch.int32))
        torch.cuda.synchronize()
        assert torch.equal(ids, want_ids) and torch.equal(w, want_w), n

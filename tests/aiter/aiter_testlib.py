"""Helpers shared by the aiter hook tests (imported as a plain module: tests/aiter is
on sys.path under pytest's default import mode, and has no __init__.py so that nothing
here is ever importable as the package ``aiter``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

STANDIN = Path(__file__).resolve().parents[1] / "aiter_standin"
REPO = Path(__file__).resolve().parents[2]


def forget_aiter() -> None:
    for name in [n for n in sys.modules if n == "aiter" or n.startswith("aiter.")]:
        del sys.modules[name]


def subprocess_env(shape: str | None = None) -> dict[str, str]:
    """Environment for a child that sees the stand-in (shape given) or no aiter (None)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AITER_", "SGLANG_AMD_MOE_"))}
    env.pop("PYTHONPATH", None)
    if shape is not None:
        env["PYTHONPATH"] = str(STANDIN)
        env["SGLANG_AMD_MOE_TEST_AITER_STANDIN_SHAPE"] = shape
    env["SGLANG_AMD_MOE_FORCE"] = "1"
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    return env


def edited_standin(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of the stand-in whose count-dropped ``fused_moe.py`` has ``old`` (found
    once) replaced by ``new``; put the returned root on ``sys.path``."""
    import shutil

    root = tmp_path / "standin"
    shutil.copytree(STANDIN, root)
    target = root / "aiter" / "_shapes" / "count_dropped" / "fused_moe.py"
    text = target.read_text()
    assert text.count(old) == 1
    target.write_text(text.replace(old, new))
    return root


def run_result(args: list[str], env: dict[str, str], cwd: Path) -> dict:
    """Run a child Python (``args`` after the interpreter) and return the JSON of its last
    ``RESULT `` line; fail with its output when it has none or exits non-zero."""
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def aux_sort(aiter, ids, weights, E: int, BM: int, dim: int, n: int | None) -> dict:
    """Call ``aiter.mxfp4_moe_sort`` by keyword (with ``num_local_tokens`` when ``n`` is
    given) into fresh buffers shaped as the reference's; return the buffers."""
    import torch

    M, K = ids.shape
    b = {k: torch.empty_like(v) for k, v in reference_sort(ids, weights, E, BM, dim, n).items()}
    extra = {} if n is None else {"num_local_tokens": torch.tensor([n], dtype=torch.int32)}
    aiter.mxfp4_moe_sort(
        topk_ids=ids, topk_weight=weights, sorted_token_ids=b["sorted_token_ids"],
        sorted_expert_ids=b["sorted_expert_ids"], cumsum_tensor=b["num_valid_ids"],
        reverse_sorted=b["reverse_sorted"], sorted_weights=b["sorted_weights"],
        m_indices=b["m_indices"], bf16_zero_out=b["moe_buf"],
        bf16_zero_workspace=torch.empty(0, dtype=torch.bfloat16), M_logical=M, NE=E, TOPK=K,
        D_HIDDEN=dim, D_INTER=1, MB=BM, prologue=0 if BM == 16 else 1, **extra,
    )  # fmt: skip
    return b


# --- routing data and the expected sort ------------------------------------------------

SORT_OUTPUTS = (
    "sorted_token_ids",
    "sorted_weights",
    "sorted_expert_ids",
    "num_valid_ids",
    "moe_buf",
    "m_indices",
    "reverse_sorted",
)


def padded_routing(
    M: int, K: int, E: int, seed: int = 0, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing for ``M`` rows whose every row may later be padding: real-looking ids and
    weights, except that odd rows from the middle on carry ``-1`` ids (ATOM's padding).
    Which rows count as padding is decided by the count, so every row must look valid
    or garbage on its own: the in-range ids of "padded" rows are what a stale router
    output looks like."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, E, (M, K), generator=g, dtype=torch.int32)
    ids[M // 2 :: 2] = -1
    weights = torch.rand((M, K), generator=g, dtype=torch.float32)
    return ids.to(device), weights.to(device)


def reference_sort(
    ids: torch.Tensor,
    weights: torch.Tensor,
    E: int,
    BM: int,
    model_dim: int,
    count: int | None,
    rows: int | None = None,
) -> dict[str, torch.Tensor]:
    """The plain-torch reference sort of ``ids[:rows]`` (all rows by default)."""
    from sglang_amd_moe.kernels import mxfp4_moe_sort_reference
    from sglang_amd_moe.kernels.utils import max_sorted_size

    ids, weights = ids[:rows].cpu(), weights[:rows].cpu()
    M, K = ids.shape
    size = max_sorted_size(M, K, E, BM)
    out = {
        "sorted_token_ids": torch.full((size,), -7, dtype=torch.int32),
        "sorted_weights": torch.full((size,), -7.0),
        "sorted_expert_ids": torch.full((size // BM,), -7, dtype=torch.int32),
        "num_valid_ids": torch.full((2,), -7, dtype=torch.int32),
        "moe_buf": torch.full((M, model_dim), 7.0, dtype=torch.bfloat16),
        "m_indices": torch.full((size,), -7, dtype=torch.int32),
        "reverse_sorted": torch.full((M * K,), -7, dtype=torch.int32),
    }
    mxfp4_moe_sort_reference(
        ids, weights, out["sorted_token_ids"], out["sorted_expert_ids"], out["num_valid_ids"],
        out["reverse_sorted"], out["sorted_weights"], out["m_indices"], out["moe_buf"],
        torch.empty(0, dtype=torch.bfloat16), M, E, K, model_dim, 1, BM, 0 if BM == 16 else 1,
        None if count is None else torch.tensor([count], dtype=torch.int32),
    )  # fmt: skip
    return out


def as_dict(result: tuple) -> dict[str, torch.Tensor]:
    if len(result) != len(SORT_OUTPUTS):
        raise AssertionError(f"expected the 7 aux-sort outputs, got {len(result)}")
    return {k: v.cpu() for k, v in zip(SORT_OUTPUTS, result, strict=True)}


def assert_sort_of_leading_rows(
    got: dict[str, torch.Tensor],
    ids: torch.Tensor,
    weights: torch.Tensor,
    n: int,
    E: int,
    BM: int,
    model_dim: int,
    atomic: bool = True,
) -> None:
    """``got`` is the aux sort of rows ``[0, n)`` of ``ids`` laid out for ``M`` rows.

    Checked three ways: equal to the reference with the count; equal (up to the gap
    value, which is the row count) to the reference over only the leading ``n`` rows;
    and the contract's visible properties (padding slots, the -1 tail of
    ``reverse_sorted``, ``num_valid_ids[1] == n``, the zeroed ``moe_buf``).
    """
    ids, weights = ids.cpu(), weights.cpu()
    M, K = ids.shape
    total = int(got["num_valid_ids"][0])
    assert int(got["num_valid_ids"][1]) == n
    ref = reference_sort(ids, weights, E, BM, model_dim, n)
    assert int(ref["num_valid_ids"][0]) == total
    for name in ("sorted_token_ids", "sorted_weights", "m_indices"):
        assert torch.equal(got[name][:total], ref[name][:total]), name
    assert torch.equal(
        got["sorted_expert_ids"][: total // BM], ref["sorted_expert_ids"][: total // BM]
    )
    assert torch.equal(got["reverse_sorted"], ref["reverse_sorted"])

    lead = reference_sort(ids, weights, E, BM, model_dim, None, rows=n)
    assert int(lead["num_valid_ids"][0]) == total
    gap = got["sorted_token_ids"][:total] == M
    assert torch.equal(
        torch.where(gap, n, got["sorted_token_ids"][:total]), lead["sorted_token_ids"][:total]
    )
    assert torch.equal(
        got["sorted_expert_ids"][: total // BM], lead["sorted_expert_ids"][: total // BM]
    )
    assert torch.equal(got["sorted_weights"][:total], lead["sorted_weights"][:total])
    assert torch.equal(got["reverse_sorted"][: n * K], lead["reverse_sorted"])

    real = (ids[:n] >= 0) & (ids[:n] < E)
    counts = torch.bincount(ids[:n][real].long(), minlength=E)
    assert total == int(((counts + BM - 1) // BM * BM).sum())
    assert bool((got["reverse_sorted"][n * K :] == -1).all())
    assert bool(((got["sorted_token_ids"][:total] & 0xFFFFFF)[~gap] < n).all())
    assert bool((got["m_indices"][:total][gap] == M).all())
    assert bool((got["sorted_weights"][:total][gap] == 0).all())
    if atomic:
        assert tuple(got["moe_buf"].shape) == (M, model_dim)
        if BM == 16:
            assert bool((got["moe_buf"] == 0).all())
    else:
        assert got["moe_buf"].numel() == 0

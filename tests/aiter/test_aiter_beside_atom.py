"""Beside ATOM: a stand-in of ATOM's SGLang plugin (``tests/atom_standin``) and this
package, loaded by SGLang's real ``load_plugins()`` (the SGLang in ``.venv``) in both
orders, each in a fresh interpreter with the aiter stand-in on the path.

ATOM imports ``aiter.fused_moe`` when its plugin runs, so with this package first the
aiter hooks are pending until then, and with ATOM first aiter is already imported when
they install. Either way both aiter targets must be live, ATOM's ``setattr`` patches of
SGLang must be intact, and ATOM's padded DP batch (garbage rows, no count) must reach
aiter's sort with every expert id in range.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from aiter_testlib import run_result, subprocess_env

ATOM = Path(__file__).resolve().parents[1] / "atom_standin"
CHILD = textwrap.dedent(
    """
    import json, sys
    order, site = sys.argv[1], sys.argv[2]
    # Entry points are found in sys.path order: that decides which plugin runs first.
    if order == "atom-first":
        sys.path.insert(0, site)
    else:
        sys.path.append(site)
    from importlib.metadata import entry_points
    from sglang.srt.plugins import load_plugins
    load_plugins()
    import torch
    import atom_standin_sglang as atom
    from sglang.srt.layers.moe import topk
    from sglang_amd_moe.runtime.aiter import guard, hook
    E, K, DIM = 16, 4, 256
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, E, (24, K), generator=g, dtype=torch.int32)
    weights = torch.rand((24, K), generator=g)
    atom.moe_forward_dp_padded(ids, weights, 40, E, DIM)
    seen = sys.modules["aiter.ops.moe_sorting"].standin_inputs[-1]
    print("RESULT " + json.dumps({
        "order": [e.name for e in entry_points(group="sglang.srt.plugins")],
        "guard": [guard.status().state, guard.is_live()],
        "sort_hook": [hook.status().state, hook.status().form, hook.is_live()],
        "atom_patches": [topk.select_experts is atom.select_experts,
                         topk.TopK.forward_native is atom.forward_native],
        "sorted_rows": seen["ids"].shape[0],
        "ids_in_range": bool(((seen["ids"] >= 0) & (seen["ids"] < seen["E"])).all()),
        "real_rows": [torch.equal(seen["ids"][:24], ids),
                      torch.equal(seen["weights"][:24], weights)],
    }))
    """
)


@pytest.mark.sglang
@pytest.mark.parametrize("order", ["plugin-first", "atom-first"])
def test_beside_atom_in_either_load_order(tmp_path, order) -> None:
    site = tmp_path / "site"  # not the child's cwd, which is on its sys.path first
    dist = site / "atom_standin-0.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: atom-standin\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\natom_sglang = atom_standin_sglang:register\n"
    )
    env = subprocess_env("count-dropped")
    env["PYTHONPATH"] += f":{ATOM}"
    env["SGLANG_PLUGINS"] = "sglang_amd_moe,atom_sglang"
    r = run_result(["-c", CHILD, order, str(site)], env, tmp_path)
    first = "atom_sglang" if order == "atom-first" else "sglang_amd_moe"
    assert r["order"][0] == first and set(r["order"]) >= {"atom_sglang", "sglang_amd_moe"}
    assert r["guard"] == ["live", True]
    assert r["sort_hook"] == ["live", "count-dropped", True]
    assert r["atom_patches"] == [True, True]
    assert r["sorted_rows"] == 64 and r["ids_in_range"] and r["real_rows"] == [True, True]

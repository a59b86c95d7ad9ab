"""What plugin load costs a process, structurally, on real releases (one subprocess each):
``register()`` in a process that has not imported torch imports neither torch nor topk (the
ledger answers from topk.py's text; a broken body waits for topk's import), and topk.py is
parsed once in the process, whatever follows. The times themselves are measured by
``benchmarks/load_cost.py`` (no timed assertions in tests)."""

from __future__ import annotations

import json
import subprocess

import pytest
from sglang_release_support import (
    driver_env,
    outside_tree,
    releases,
    require_built,
    selected_releases,
)

SCRIPT = r"""
import ast, json, sys
from pathlib import Path
import importlib.util

TOPK = "sglang.srt.layers.moe.topk"
spec = importlib.util.find_spec("sglang")
text = (Path(spec.submodule_search_locations[0]) / "srt/layers/moe/topk.py").read_text()
parses = []
real_parse = ast.parse
def counting_parse(source, *args, **kwargs):
    if source == text:
        parses.append(1)
    return real_parse(source, *args, **kwargs)
ast.parse = counting_parse

from sglang_amd_moe.runtime.plugin import register
from sglang_amd_moe.runtime.sglang import hook
register()
out = {"torch_after_load": "torch" in sys.modules, "topk_after_load": TOPK in sys.modules,
       "at_load": hook.status().state}
import sglang.srt.layers.moe.topk
register()  # a second load_plugins() in the same process
st = hook.status()
out.update(after_import=st.state, message=st.message, parses=len(parses))
print("RESULT " + json.dumps(out))
"""

CASES = {"0.5.13.post1": ("pending", "live"), "0.5.23": ("not-needed", "not-needed")}


@pytest.mark.parametrize("label", list(CASES))
def test_load_imports_nothing_heavy_and_parses_topk_once(label: str) -> None:
    rel = releases.BY_LABEL[label]
    if rel not in selected_releases()[0]:
        pytest.skip(f"{label} not selected")
    require_built(rel)
    proc = subprocess.run(
        [str(rel.python), "-c", SCRIPT],
        cwd=outside_tree(),
        env=driver_env("plugin"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    found = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and found, proc.stderr[-3000:]
    r = json.loads(found[-1][len("RESULT ") :])
    at_load, after = CASES[label]
    # On main: torch imported by the gate, topk by the plugin (0.5.13.post1), 2+ parses.
    assert r["torch_after_load"] is False, r
    assert r["topk_after_load"] is False, r
    assert (r["at_load"], r["after_import"]) == (at_load, after), r
    assert r["parses"] == 1, r

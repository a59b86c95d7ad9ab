"""`sglang-amd-moe audit --load` decides from what the code does, on real releases.

Each case is a real release's environment whose ``topk.py`` is rewritten in an overlay
(``tests/sglang/variants/overlay.py``: a mirror of the installed ``sglang`` package,
first on ``PYTHONPATH``, so the audit reads, and SGLang imports, the rewritten file while
the release's own files stay untouched). The audit runs in the release's interpreter,
plain and with ``--load`` (one ``--load`` run per case; several assertions share it):

* ``mask-off-by-one``: 0.5.14's fixed HIP branch, with the padded-id fill of
  ``_mask_topk_ids_padded_region`` starting one row late. The function's text is a
  release's, the helper it uses is not: the ledger does not know the body (never OK
  in the plain audit); running it leaves garbage ids in a padded row, and the plugin
  (previewed here) hooks it, and its hooked call comes out right.
* ``weights-off-by-one``: 0.5.13.post1 whose padded-weight zeroing starts one row late:
  unknown too; the hook is live with ``--load`` and its call comes out right.
* ``drift``: 0.5.12.post1 with a comment where its patch anchors: the ledger still
  knows the body, and plain and ``--load`` report the same drift.

Also here: ``sglang_hook.preview()`` in a release's interpreter changes nothing in the
process and decides what ``install()`` then decides.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import releases
from sglang_release_support import outside_tree, require_built, switches_off
from variants import edit, overlay
from variants.catalog import GUARD, NOHIP, WEIGHTS, fixed14

from sglang_amd_moe.diagnostics import patching

pytestmark = pytest.mark.sglang  # --load imports SGLang in the release's interpreter


def mask_off_by_one(text: str) -> str:
    return edit(
        fixed14(text),
        "        topk_ids[indices >= num_token_non_padded, :] = fill_value\n",
        "        topk_ids[indices > num_token_non_padded, :] = fill_value\n",
    )


def weights_off_by_one(text: str) -> str:
    return edit(
        text,
        "    topk_weights[indices >= num_token_non_padded, :] = 0.0\n",
        "    topk_weights[indices > num_token_non_padded, :] = 0.0\n",
    )


def local_edit(text: str) -> str:
    return edit(
        text,
        "        M, N = router_logits.shape\n",
        "        M, N = router_logits.shape  # a local comment\n",
    )


#: case -> (base release, rewrite of its topk.py, environment of the --load run)
CASES = {
    "mask-off-by-one": (GUARD, mask_off_by_one, {}),
    "weights-off-by-one": (WEIGHTS, weights_off_by_one, {"SGLANG_AMD_MOE_FORCE": "1"}),
    "drift": (NOHIP, local_edit, {}),
}


def _env(extra: dict[str, str], pythonpath: Path | None = None) -> dict[str, str]:
    """This process's environment without the plugin's switches, SGLang's plugin list and
    the Triton interpreter (a user's environment has none of them), plus ``extra``."""
    env = switches_off("TRITON_INTERPRET")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return {**env, **extra}


def _audit(rel: releases.Release, ov: Path, args: tuple[str, ...], extra: dict) -> tuple:
    proc = subprocess.run(
        [str(rel.python), "-m", "sglang_amd_moe", "audit", "--json", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(extra, ov),
        cwd=outside_tree(),
    )
    assert proc.stdout, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert proc.returncode == doc["exit_status"]
    return doc, next(t for t in doc["targets"] if t["target"] == "sglang")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """case -> {"plain": (doc, sglang target), "load": (...), "file": overlay topk.py}."""
    jobs = []
    for case, (label, rewrite, extra) in CASES.items():
        rel = releases.BY_LABEL[label]
        require_built(rel)
        ov = overlay.make(rel.topk_path().parents[3], tmp_path_factory.mktemp(case))
        topk = ov / "sglang" / "srt" / "layers" / "moe" / "topk.py"
        topk.write_text(rewrite(topk.read_text()))
        jobs.append((case, rel, ov, topk, extra))
    with ThreadPoolExecutor(max_workers=2) as pool:  # a 2-core machine
        futures = {
            case: (
                topk,
                pool.submit(_audit, rel, ov, (), {}),
                pool.submit(_audit, rel, ov, ("--load",), extra),
            )
            for case, rel, ov, topk, extra in jobs
        }
        return {
            case: {"file": topk, "plain": plain.result(), "load": load.result()}
            for case, (topk, plain, load) in futures.items()
        }


def test_a_changed_helper_is_unknown_and_the_plugin_runs_it(runs: dict) -> None:
    (p_doc, plain), (l_doc, load) = (runs["mask-off-by-one"][k] for k in ("plain", "load"))
    # The plain audit runs nothing: a body the ledger does not know needs a look.
    assert plain["form"] == load["form"] == "unknown"
    assert p_doc["exit_status"] == 1 and plain["needs_attention"] and plain["probe"] is None
    assert plain["nearest"]["body"].startswith("sglang 0.5.14")
    assert "the module code it uses differs" in plain["reason"], plain["reason"]
    assert "sglang-amd-moe audit --load" in plain["reason"]
    # --load runs it: upstream leaves garbage ids, the plugin (on ROCm, previewed here)
    # hooks it, and the hooked call comes out right; still a look by hand.
    probe = load["probe"]
    assert probe["ran"] and probe["right"] and probe["previewed"] and probe["plugin"] == "pending"
    assert load["hook"] == "not ROCm" and load["needs_attention"] and l_doc["exit_status"] == 1
    assert "so the plugin decides by running it" in load["reason"], load["reason"]


def test_an_unknown_body_with_a_live_hook_runs_right(runs: dict) -> None:
    (p_doc, plain), (l_doc, load) = (runs["weights-off-by-one"][k] for k in ("plain", "load"))
    assert plain["form"] == load["form"] == "unknown" and plain["patch"] is None
    assert plain["nearest"]["body"] == "sglang 0.5.13"
    probe = load["probe"]
    assert load["hook"] == "live" and probe["of"] == "the hooked call"
    assert probe["ran"] and probe["right"] and probe["behaviour"] == "no-hip-handling"
    assert load["needs_attention"] and l_doc["exit_status"] == 1


def test_load_and_plain_report_the_same_drift(runs: dict) -> None:
    (p_doc, plain), (l_doc, load) = (runs["drift"][k] for k in ("plain", "load"))
    for key in ("form", "patch", "patch_status", "needs_attention", "apply_command"):
        assert plain[key] == load[key], (key, plain[key], load[key])
    assert load["patch_status"] == patching.DRIFT and load["needs_attention"]
    assert "drift" in plain["reason"] and "drift" in load["reason"]
    assert p_doc["exit_status"] == l_doc["exit_status"] == 1
    # --load ran it: what the plugin does on ROCm comes out right; the drift stays.
    assert load["probe"]["right"] and load["probe"]["previewed"] and load["hook"] == "not ROCm"
    assert load["patch_probe"] is None  # nothing to run: the patch does not apply


_PREVIEW_SCRIPT = r"""
import json, logging, sys
from sglang_amd_moe.runtime.sglang import hook as sglang_hook
from sglang_amd_moe.runtime.target import HookStatus

records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("sglang_amd_moe").addHandler(Keep(level=logging.DEBUG))
logging.getLogger("sglang_amd_moe").setLevel(logging.DEBUG)

pv = sglang_hook.preview()  # topk not imported, torch not ROCm, no FORCE
tk = sys.modules["sglang.srt.layers.moe.topk"]
original = tk._post_process_topk_ids
after = {
    "status": sglang_hook.status(), "live": sglang_hook.is_live(),
    "pending": sglang_hook.HOOK._still_hooked(), "active": sglang_hook.HOOK.active,
    "same_function": tk._post_process_topk_ids is original,
    "wrapped": hasattr(tk._post_process_topk_ids, "__wrapped__"),
}
logged = list(records)
import os
os.environ["SGLANG_AMD_MOE_FORCE"] = "1"
st = sglang_hook.install()
print(json.dumps({
    "preview": {"state": pv.status.state, "form": pv.status.form, "message": pv.status.message,
                "plan": pv.status.detail.get("plan"), "preview": pv.status.detail.get("preview"),
                "upstream": pv.upstream.behaviour if pv.upstream else None,
                "hooked_right": pv.hooked.correct if pv.hooked else None},
    "after": {k: (v if isinstance(v, bool) else repr(v)) for k, v in after.items()},
    "logged": logged,
    "install": {"state": st.state, "form": st.form, "message": st.message,
                "plan": st.detail.get("plan")},
}))
"""


def test_preview_changes_nothing_and_decides_what_install_decides() -> None:
    rel = releases.BY_LABEL[WEIGHTS]
    require_built(rel)
    proc = subprocess.run(
        [str(rel.python), "-c", _PREVIEW_SCRIPT],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env({}),
        cwd=outside_tree(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    pv, after, inst = out["preview"], out["after"], out["install"]
    # Off ROCm, the preview goes past the platform gate: what a ROCm process decides.
    assert pv["state"] == "pending" and pv["preview"] is True and pv["form"] == "weights-only"
    assert pv["upstream"] == "weights-only" and pv["hooked_right"] is True
    # Nothing applied, nothing kept, nothing logged.
    assert after == {
        "status": "None",
        "live": False,
        "pending": False,
        "active": "None",
        "same_function": True,
        "wrapped": False,
    }, after
    assert out["logged"] == [], out["logged"]
    # install() (forced here) takes the same path and decides the same plan and line.
    assert inst["state"] == "live" and inst["plan"] == pv["plan"], (inst, pv)
    assert inst["message"].split(" [")[0] == pv["message"].split(" [")[0]

"""The real-server run's committed results, its doc, and the harness's own logic.

docs/server.md must be what benchmarks/server/report.py makes of the committed records
(benchmarks/results/server-h200.json for qwen3_moe, server-h200-deepseek.json for
deepseek_v3), so no number in it is typed by hand. The harness
(benchmarks/server/harness.py) runs only on a GPU machine, but how it judges a run
(comparison, damage, padding, timing, log parsing) and how the bundle trims wheels are
plain functions, checked here on small inputs and on the committed server logs.
"""

from __future__ import annotations

import csv
import io
import json
import zipfile
from pathlib import Path

import pytest

# benchmarks/ is on pytest's pythonpath: benchmarks/server is the namespace package `server`.
from server import bundle, harness, report

REPO = Path(__file__).resolve().parents[1]
SERVER = REPO / "benchmarks" / "server"
RESULTS = REPO / "benchmarks" / "results"


def test_server_md_is_generated_from_the_committed_json() -> None:
    records = report.load_records()
    assert [rel for rel, _, _ in records] == [rel for rel, _ in report.RECORDS]
    expected = report.render(records, report.load_records(records=report.GUARD_RECORDS))
    actual = (REPO / "docs" / "server.md").read_text()
    assert actual == expected, "docs/server.md is stale: run `python benchmarks/server/report.py`"


def test_the_deepseek_record_served_the_harness_config_with_the_shared_expert_fused() -> None:
    """The record is of the config harness.py holds, and every scheduler's TopK saw the
    shared expert fused (one extra column, id n_routed_experts in real rows)."""
    doc = json.loads((RESULTS / "server-h200-deepseek.json").read_text())
    assert doc["model"] == {"name": "deepseek_v3", "config": harness.MODELS["deepseek_v3"]}
    cfg = harness.MODELS["deepseek_v3"]
    for label, run in doc["runs"].items():
        topk = next(r["topk"] for r in run["records"] if r.get("captured_bs"))
        assert topk == {
            "top_k": cfg["num_experts_per_tok"] + 1,
            "columns": cfg["num_experts_per_tok"] + 1,
            "routed_experts": cfg["n_routed_experts"],
            "num_fused_shared_experts": 1,
        }, label
        assert run["log"]["fusion_disabled_lines"] == [], label
        after = run["topk_after_hook"]
        if after is not None:
            real = after["counts"]["real_shared"]
            assert real["id_min"] == real["id_max"] == cfg["n_routed_experts"], label


def _counts(**groups: dict) -> dict:
    empty = {
        "entries": 0,
        "ids_out_of_range": 0,
        "weights_nonzero": 0,
        "id_min": None,
        "id_max": None,
    }
    return {
        g: {**empty, **groups.get(g, {})} for g in ("padded_routed", "padded_shared", "real_shared")
    }


def test_topk_summary_judges_the_shared_column_only_when_one_is_fused() -> None:
    clean = {"entries": 8, "ids_out_of_range": 0, "weights_nonzero": 0, "id_min": 0, "id_max": 0}
    bad_w = {**clean, "weights_nonzero": 1}
    fused = {"top_k": 9, "columns": 9, "routed_experts": 256, "num_fused_shared_experts": 1}
    plain = {**fused, "top_k": 8, "columns": 8, "num_fused_shared_experts": 0}

    def summary(config: dict, **groups: dict) -> dict | None:
        rec = {"captured_bs": [2], "topk": config, "topk_after_hook": _counts(**groups)}
        return harness.topk_summary([{"replays": {}}, rec])

    assert summary(fused, padded_routed=clean, padded_shared=clean)["padded_rows_clean"]
    assert not summary(fused, padded_routed=clean, padded_shared=bad_w)["padded_rows_clean"]
    out_of_range = {**clean, "ids_out_of_range": 1}
    assert not summary(fused, padded_routed=out_of_range, padded_shared=clean)["padded_rows_clean"]
    assert summary(plain, padded_routed=clean)["padded_rows_clean"]
    # Nothing padded was seen: no verdict of clean.
    assert not summary(fused)["padded_rows_clean"]
    assert harness.topk_summary([{"replays": {}, "topk_after_hook": None}]) is None


def test_select_runs() -> None:
    assert [r.label for r in harness.select_runs("")] == ["a", "b", "c", "d", "e"]
    assert [r.label for r in harness.select_runs("d, a")] == ["a", "d"]
    with pytest.raises(SystemExit, match="unknown run label"):
        harness.select_runs("a,x")


def test_cost_text_says_what_a_ratio_beyond_the_spread_shows() -> None:
    def size(b: list[float], d: list[float]) -> dict:
        med = {x: sorted(v)[len(v) // 2] for x, v in (("b", b), ("d", d))}
        return {
            "b": {
                "tpot_ms": b,
                "tpot_ms_median": med["b"],
                "decode_tok_s": [1.0],
                "decode_tok_s_median": 1.0,
            },
            "d": {
                "tpot_ms": d,
                "tpot_ms_median": med["d"],
                "decode_tok_s": [1.0],
                "decode_tok_s_median": 1.0,
            },
            "tpot_ratio_b_over_d": round(med["b"] / med["d"], 4),
            "throughput_ratio_b_over_d": 1.0,
        }

    doc = {"model": {"config": {"num_hidden_layers": 4}}}
    ov = {
        "rounds": 3,
        "max_new_tokens": 8,
        "sizes": {"1": size([1.0, 1.01, 1.02], [1.0, 1.01, 1.02])},
    }
    text = "\n".join(report._cost(doc, ov, {"capture_bs": [2]}, counted=False))
    assert "Every difference is inside the noise" in text
    ov["sizes"]["1"] = size([1.0, 1.01, 1.02], [2.0, 2.01, 2.02])
    text = "\n".join(report._cost(doc, ov, {"capture_bs": [2]}, counted=True))
    assert "(b) faster than (d) beyond the spread at batch 1" in text
    assert "no evidence that the plugin speeds decoding up" in text
    ov["sizes"]["1"] = size([2.0, 2.01, 2.02], [1.0, 1.01, 1.02])
    text = "\n".join(report._cost(doc, ov, {"capture_bs": [2]}, counted=True))
    assert "(b) slower than (d) beyond the spread at batch 1" in text


def test_prompts_are_fixed_distinct_and_in_the_vocabulary() -> None:
    a = harness.prompts(0, 10, 1024)
    assert a == harness.prompts(0, 10, 1024)
    assert a != harness.prompts(1, 10, 1024)
    assert len({tuple(p) for p in a}) == 10
    assert all(len(p) == harness.PROMPT_LEN for p in a)
    assert all(harness.FIRST_TOKEN_ID <= t < 1024 for p in a for t in p)


def test_run_environments_differ_only_in_their_switches(tmp_path: Path) -> None:
    base = {
        "PATH": "/bin",
        "PYTHONPATH": "/site",
        "SGLANG_AMD_MOE_DISABLE": "1",
        "SGLANG_PLUGINS": "x",
    }
    envs = {
        r.label: harness.server_env(r, base, tmp_path / "site", tmp_path / "rec")
        for r in harness.RUNS
    }
    for run in harness.RUNS:
        env = envs[run.label]
        assert env["PYTHONPATH"] == f"{tmp_path / 'site'}:/site"
        assert "SGLANG_PLUGINS" not in env
        assert env["SGLANG_AMD_MOE_FORCE"] == "1" and env["SGLANG_AMD_MOE_TEST_HIP_BRANCH"] == "1"
        assert ("SGLANG_AMD_MOE_DISABLE" in env) == (not run.plugin)
        assert ("SGLANG_AMD_MOE_TEST_INJECT" in env) == run.inject
        assert ("SGLANG_AMD_MOE_TEST_PASS_COUNT" in env) == run.pass_count
        assert ("SGLANG_AMD_MOE_TEST_AITER" in env) == run.aiter
    assert [r.label for r in harness.RUNS] == ["a", "b", "c", "d", "e", "f", "g", "h"]
    # The default is today's five; the guard-only runs are asked for by name, and compare
    # with (h), the same aiter path without injection or plugin.
    assert [r.label for r in harness.select_runs("")] == ["a", "b", "c", "d", "e"]
    guard_runs = harness.select_runs("f,g,h")
    assert [(r.plugin, r.inject, r.pass_count, r.aiter) for r in guard_runs] == [
        (True, True, False, True),
        (False, True, False, True),
        (False, False, False, True),
    ]
    assert harness.reference_of(guard_runs) == "h"
    assert harness.reference_of(harness.select_runs("")) == "b"


def test_compare_and_damage() -> None:
    ref = [
        {"ids": [1, 2, 3], "logprobs": [-1.0, -2.0, -3.0]},
        {"ids": [4, 5], "logprobs": [-1.0, -1.0]},
    ]
    same = harness.compare(ref, ref)
    assert (same["served"], same["identical"], same["mismatched"], same["errors"]) == (2, 2, 0, 0)
    assert harness.damage(same, harness.parse_log(""), died=False) == []

    got = [{"ids": [1, 9, 3], "logprobs": [-1.0, None, -3.0]}, {"error": "HTTP 500: boom"}]
    cmp = harness.compare(got, ref)
    assert (cmp["served"], cmp["identical"], cmp["mismatched"], cmp["errors"]) == (1, 0, 1, 1)
    assert cmp["nan_logprob_requests"] == 1
    assert cmp["first_mismatch"] == {
        "request": 0,
        "position": 1,
        "got": [9, 3],
        "reference": [2, 3],
    }
    assert harness.damage(cmp, harness.parse_log(""), died=False) == ["NaN", "wrong tokens"]
    fault = harness.parse_log(
        "x\ntorch.AcceleratorError: CUDA error: an illegal instruction was encountered\n"
    )
    assert harness.damage(cmp, fault, died=True)[0] == "device fault"
    failed = harness.compare([{"error": "refused"}, {"error": "refused"}], ref)
    assert harness.damage(failed, harness.parse_log(""), died=False) == ["requests failed"]


def test_padding_summary_counts_replays_with_padded_rows() -> None:
    recs = [{"replays": {"3/12": 5, "12/12": 2}}, {"replays": {"33/40": 1}}, {"replays": {}}]
    assert harness.padding_summary(recs) == {
        "replays": 8,
        "replays_with_padded_rows": 6,
        "by_real_over_padded": {"3/12": 5, "12/12": 2, "33/40": 1},
    }


def test_decode_timing_excludes_the_first_token() -> None:
    rounds = [
        {"marks": [(10.0, 1), (10.5, 2), (11.0, 11)]},
        {"marks": [(10.2, 1), (11.2, 11)]},
        {"error": "x"},
    ]
    t = harness.decode_timing(rounds)
    assert t["ok"] == 2
    assert abs(t["tpot_ms"] - 100.0) < 1e-9  # both: 1.0 s over 10 tokens
    assert abs(t["decode_tok_s"] - 20 / 1.2) < 1e-9
    assert harness.decode_timing([{"marks": [(1.0, 1)]}]) == {"ok": 0}


def test_parse_log_reads_the_committed_server_logs() -> None:
    a = harness.parse_log((RESULTS / "server-h200-a.log").read_text())
    processes = {x["process"] for x in a["plugin_lines"]}
    assert "run_scheduler_process" in processes
    assert all("form=weights-only -> hooked" in x["line"] for x in a["plugin_lines"])
    assert {x["process"] for x in a["hook_applied"]} >= {"run_scheduler_process"}
    assert any(c.startswith("bs [2, 12, 40]") for c in a["capture_lines"])
    assert a["fault_lines"] == []
    c = harness.parse_log((RESULTS / "server-h200-c.log").read_text())
    assert all("disabled by SGLANG_AMD_MOE_DISABLE=1" in x["line"] for x in c["plugin_lines"])
    assert any("illegal instruction" in line for line in c["fault_lines"])


def test_parse_log_finds_a_disabled_shared_expert_fusion() -> None:
    line = (
        "[2026-12-02 01:17:14] Config does not support fused shared expert(s). "
        "Shared experts fusion optimization is disabled."
    )
    assert harness.parse_log(f"x\n{line}\ny\n")["fusion_disabled_lines"] == [line]
    d = harness.parse_log((RESULTS / "server-h200-deepseek-d.log").read_text())
    assert d["fusion_disabled_lines"] == []
    assert {x["process"] for x in d["plugin_lines"]} >= {"run_scheduler_process"}


def _wheel(path: Path, files: dict[str, bytes]) -> None:
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name in files:
        writer.writerow([name, "sha256=x", "1"])
    writer.writerow(["demo-1.0.dist-info/RECORD", "", ""])
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("demo-1.0.dist-info/RECORD", record.getvalue())


def test_recompress_wheel_keeps_every_member_and_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "demo-1.0-py3-none-any.whl"
    files = {"demo/__init__.py": b"x = 1\n", "demo/data.bin": bytes(range(256)) * 64}
    _wheel(path, files)
    with zipfile.ZipFile(path) as zf:
        before = [(i.filename, i.date_time, i.external_attr, zf.read(i)) for i in zf.infolist()]
    sizes = bundle.recompress_wheel(path)
    assert sizes["bytes_lzma"] == path.stat().st_size
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None
        assert all(i.compress_type == zipfile.ZIP_LZMA for i in zf.infolist())
        after = [(i.filename, i.date_time, i.external_attr, zf.read(i)) for i in zf.infolist()]
    assert after == before


def test_bundle_carries_every_file_the_servers_load() -> None:
    for rel in bundle.SERVER_FILES:
        assert (SERVER / rel).is_file(), rel
    site = SERVER / "site"
    on_disk = {
        str(p.relative_to(SERVER)) for p in site.rglob("*.py") if "__pycache__" not in p.parts
    }
    assert on_disk == {rel for rel in bundle.SERVER_FILES if rel.startswith("site/")}


def test_trim_wheel_drops_members_and_their_record_rows(tmp_path: Path) -> None:
    src, dest = (
        tmp_path / "demo-1.0-py3-none-any.whl",
        tmp_path / "out" / "demo-1.0-py3-none-any.whl",
    )
    dest.parent.mkdir()
    _wheel(
        src,
        {"demo/__init__.py": b"x = 1\n", "demo/big/blob.so": b"0" * 1000, "demo/data/a.h": b"h"},
    )
    info = bundle.trim_wheel(src, dest, ("demo/big/", "demo/data/"))
    assert info == {"removed_files": 2, "removed_bytes": 1001}
    with zipfile.ZipFile(dest) as zf:
        assert sorted(zf.namelist()) == ["demo-1.0.dist-info/RECORD", "demo/__init__.py"]
        rows = [
            r[0]
            for r in csv.reader(io.StringIO(zf.read("demo-1.0.dist-info/RECORD").decode()))
            if r
        ]
        assert rows == ["demo/__init__.py", "demo-1.0.dist-info/RECORD"]
        assert zf.read("demo/__init__.py") == b"x = 1\n"


@pytest.mark.parametrize("rel", [rel for rel, _ in report.GUARD_RECORDS])
def test_the_guard_record_served_with_token_identity_and_faulted_without_it(rel: str) -> None:
    """The guard-only record of each model class (runs f, g, h; no count anywhere, SGLang's
    MoE through aiter's entry): with the plugin every request served, token for token as
    the stand-in server without injection, the guard's counters above 0; without it, the
    device fault."""
    if not (REPO / rel).is_file():
        pytest.skip(f"{rel}: the guard-only GPU run has not been recorded yet (README: runs f-h)")
    doc = json.loads((REPO / rel).read_text())
    runs = doc["runs"]
    assert set(runs) == {"f", "g", "h"} and doc["reference"] == "h"
    assert all(r["aiter"] and not r["pass_count"] for r in runs.values())
    f, g, h = runs["f"], runs["g"], runs["h"]
    assert doc["equal"] == {"f==h": True}
    assert f["compare_to_b"]["served"] == f["compare_to_b"]["requests"] > 0
    assert f["compare_to_b"]["identical"] == f["compare_to_b"]["requests"]
    assert f["damage"] == [] and h["damage"] == []
    assert f["padding"]["replays_with_padded_rows"] > 0
    assert f["aiter_calls"] > 0 and h["aiter_calls"] > 0
    stats = f["plugin_stats"]["guard"]
    assert stats["calls"] > 0 and stats["out_of_range"] > 0 and stats["real_out_of_range"] == 0
    assert h["plugin_stats"] is None  # plugin off: no counters
    assert "device fault" in g["damage"]
    assert any("device-side assert" in x for x in g["log"]["fault_lines"]), g["log"]["fault_lines"]
    guard_lines = [x["line"] for x in f["log"]["plugin_lines"] if "guard live" in x["line"]]
    assert guard_lines, f["log"]["plugin_lines"]

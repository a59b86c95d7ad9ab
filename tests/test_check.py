"""``sglang-amd-moe check``: the end-to-end padded-batch check, and the pieces it is built on.

The first tests run the real command in a subprocess (real SGLang, real ``load_plugins()``)
and read both its table and its JSON, and run ``demo`` in a real 0.5.13.post1
environment. The others pin down the pieces (``sglang_amd_moe.diagnostics.e2e``): the
legacy-sort emulation agrees with this package's reference on in-range ids and does what
its docstring says on out-of-range ones, the consumer is exact under padding, the HIP
router emulation, the rebuild of the mask-under-eplb-guard form (the body the ledger
knows as that form), the table, the command lines of ``check`` and ``demo``, and
``check`` where SGLang, torch or Triton is missing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import ledger as ledger_tool  # tools/compat
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_amd_moe.kernels import mxfp4_moe_sort_reference

from sglang_amd_moe.diagnostics import check, demo
from sglang_amd_moe.diagnostics.e2e import run, sglang_calls, table
from sglang_amd_moe.diagnostics.e2e.amd_emulation import hip_router_for, legacy_hip_sort
from sglang_amd_moe.diagnostics.e2e.consumer import AiterLikeMoE, SortBuffers
from sglang_amd_moe.diagnostics.e2e.model import TinyMoE, TinyMoEConfig
from sglang_amd_moe.diagnostics.e2e.results import CheckResult, Compare, FormInfo, RowResult
from sglang_amd_moe.runtime.sglang import ledger

REPO = Path(__file__).resolve().parents[1]

ROW = re.compile(
    r"^(?P<source>installed|rebuilt|no-count): (?P<form>\S+(?: \S+)*?)\s+(?P<n>\d+) of (?P<m>\d+) "
    r"\|\s+(?P<err>\S+)\s+"
    r"(?P<nan>\d+)\s+(?P<bad>\d+)/\d+\s+(?P<oor>\d+) \| (?P<with>.*)$"
)


def _run_check(
    python: Path | str, tmp_path: Path, *extra: str
) -> tuple[subprocess.CompletedProcess, dict, list]:
    out_json = tmp_path / "check.json"
    proc = subprocess.run(
        [str(python), "-m", "sglang_amd_moe", "check", "--json-file", str(out_json), *extra],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    doc = json.loads(out_json.read_text()) if out_json.exists() else {}
    rows = [m.groupdict() for line in proc.stdout.splitlines() if (m := ROW.match(line))]
    return proc, doc, rows


@pytest.mark.sglang
def test_check_cli_installed_release(tmp_path: Path) -> None:
    """``python -m sglang_amd_moe check`` in .venv (SGLang 0.5.23, form `fixed`): exit 0;
    the rebuilt mask-under-eplb-guard form shows garbage without the plugin (out-of-range
    ids reach the consumer, NaN in real rows) and bit-identical real rows with it."""
    proc, doc, rows = _run_check(sys.executable, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "result: PASS" in proc.stdout
    assert doc["ok"] is True
    # 2 forms x 3 batches, and the no-count rows, all in the printed table
    assert len(rows) == 6 + len(run.NO_COUNT_BATCHES), proc.stdout
    _assert_no_count_rows(rows, doc)

    installed = [r for r in rows if r["source"] == "installed"]
    rebuilt = [r for r in rows if r["source"] == "rebuilt"]
    assert {(int(r["n"]), int(r["m"])) for r in rebuilt} == set(run.BATCHES)
    for r in rebuilt:
        assert r["form"] == "mask-under-eplb-guard"
        assert int(r["oor"]) > 0 and int(r["nan"]) > 0 and int(r["bad"]) > 0, r
        assert r["err"] == "n/a", r  # never "0" next to NaN entries
        assert r["with"].startswith("exact"), r
    for r in installed:
        if r["form"] == "fixed":  # already fixed upstream: matches without the plugin too
            assert int(r["oor"]) == 0 and int(r["nan"]) == 0 and int(r["bad"]) == 0, r
            assert r["err"] == "0", r
        assert r["with"].startswith("exact"), r

    # The JSON says the same, with the details the table leaves out.
    for row in doc["with_plugin"]:
        assert row["compare"]["match"] == "exact" and row["out_of_range_ids"] == 0, row
    broken = [r for r in doc["without_plugin"] if r["form"] != "fixed"]
    assert broken and all(r["compare"]["nan_count"] > 0 for r in broken)
    assert any("legacy HIP sort" in s for r in broken for s in r["sorts"])
    rebuilt_form = next(f for f in doc["forms"] if f["source"] == "rebuilt")
    assert rebuilt_form["hook_live"] is True  # the plugin hooked the rebuilt function


def _assert_no_count_rows(rows: list[dict], doc: dict) -> None:
    """The no-count rows: without the plugin, garbage reaches the sort and real rows come
    out wrong; with it the guard turns the ids out of range into expert 0 (its counters
    say how many, over the model's 4 MoE calls) and the real rows match exactly."""
    table = [r for r in rows if r["source"] == "no-count"]
    assert {(int(r["n"]), int(r["m"])) for r in table} == set(run.NO_COUNT_BATCHES)
    for r in table:
        assert int(r["oor"]) > 0 and int(r["nan"]) > 0 and int(r["bad"]) > 0, r
        assert r["with"].startswith("exact; guard: "), r
    with_ = [r for r in doc["with_plugin"] if r["source"] == "no-count"]
    assert len(with_) == len(run.NO_COUNT_BATCHES)
    for r in with_:
        assert r["compare"]["match"] == "exact" and r["out_of_range_ids"] == 0, r
        assert r["guard"]["calls"] == 4 and r["guard"]["out_of_range"] > 0, r
        assert r["guard"]["past_count"] == 0 and r["guard"]["real_out_of_range"] == 0, r
        assert f"guard: {r['guard']['out_of_range']} ids out of range" in " ".join(
            t["with"] for t in rows if (int(t["n"]), t["source"]) == (r["real"], "no-count")
        )
    without = [r for r in doc["without_plugin"] if r["source"] == "no-count"]
    assert all(r["guard"] is None and r["compare"]["match"] == "MISMATCH" for r in without)
    form = next(f for f in doc["forms"] if f["source"] == "no-count")
    assert form["hook_live"] is True and "guard live" in form["hook_message"]


DEMO_ROW = re.compile(
    r"^(?P<version>\S+)\s+(?P<n>\d+) of (?P<m>\d+)(?P<no_count> \*)? \|\s+(?P<nan>\d+)\s+"
    r"(?P<bad>\d+)/\d+\s+"
    r"(?P<ids>\d+)\s+\| (?P<with>.*)$"
)


def check_demo(python: Path, cwd: Path, out: Path) -> None:
    """``demo`` run by a real 0.5.13.post1 environment's python (form `weights-only`, what
    ``make demo`` adds next to .venv's release): without the plugin the real rows hold NaN
    and out-of-range ids reach the consumer, with it they match exactly; the screen fits in
    40 lines, holds no pip or Python error, and names the command that ran; the check's
    full JSON stays in --out-dir and says the same. The installed-wheel stage runs it
    (tests/installed), in an environment with the wheel installed."""
    proc = subprocess.run(
        [str(python), "-m", "sglang_amd_moe", "demo", "--out-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    screen = proc.stdout.splitlines()
    assert len(screen) <= 40, proc.stdout
    assert not any("ERROR" in ln or "Traceback" in ln for ln in screen), proc.stdout
    assert proc.stderr == "", proc.stderr
    rows = [m.groupdict() for ln in screen if (m := DEMO_ROW.match(ln))]
    assert len(rows) == len(run.BATCHES) + len(run.NO_COUNT_BATCHES), proc.stdout
    for r in rows:
        assert r["version"] == "0.5.13.post1", r
        assert int(r["nan"]) > 0 and int(r["bad"]) > 0 and int(r["ids"]) > 0, r
        if r["no_count"]:
            assert re.fullmatch(r"exact; guard changed [1-9]\d* ids", r["with"]), r
        else:
            assert r["with"] == "exact", r
    assert any(
        ln.startswith("0.5.13.post1  weights-only   hooked (mask padded ids to 0") for ln in screen
    ), proc.stdout
    assert any("-m sglang_amd_moe check --no-rebuilt" in ln for ln in screen), proc.stdout
    assert "result: PASS" in proc.stdout and "0.5.13.post1: wrong without it" in proc.stdout

    doc = json.loads((out / "check-0.5.13.post1.json").read_text())
    assert doc["sglang"] == "0.5.13.post1" and doc["ok"] is True
    assert [f["form"] for f in doc["forms"]] == ["weights-only", "aiter fused_moe entry"]
    for row in doc["without_plugin"]:
        assert row["compare"]["nan_count"] > 0 and row["out_of_range_ids"] > 0, row
    for row in doc["with_plugin"]:
        assert row["compare"]["match"] == "exact" and row["out_of_range_ids"] == 0, row
    assert "result: PASS" in (out / "check-0.5.13.post1.log").read_text()
    audit = json.loads((out / "audit-0.5.13.post1.json").read_text())
    assert audit["targets"][0]["form"] == "weights-only"


# ------------------------------------------------------------------- legacy sort model


def _sort_both(
    ids: torch.Tensor, w: torch.Tensor, ne: int, mb: int
) -> tuple[SortBuffers, SortBuffers]:
    m, k = ids.shape
    legacy = SortBuffers.allocate(m, k, ne, mb, torch.device("cpu"))
    ref = SortBuffers.allocate(m, k, ne, mb, torch.device("cpu"))
    legacy_hip_sort(ids, w, legacy, m, ne, k, mb)
    no_bf16_out = torch.empty(0, 0, dtype=torch.bfloat16)
    no_workspace = torch.empty(0, dtype=torch.uint8)
    mxfp4_moe_sort_reference(
        ids,
        w,
        ref.sorted_token_ids,
        ref.sorted_expert_ids,
        ref.cumsum,
        ref.reverse_sorted,
        ref.sorted_weights,
        ref.m_indices,
        no_bf16_out,
        no_workspace,
        m,
        ne,
        k,
        64,
        64,
        mb,
        0,
    )
    return legacy, ref


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 8),
    ne=st.integers(1, 70),
    mb=st.sampled_from([16, 32]),
    seed=st.integers(0, 2**16),
)
def test_legacy_sort_matches_reference_on_in_range_ids(
    m: int, k: int, ne: int, mb: int, seed: int
) -> None:
    """For ids in [0, NE) the emulated pre-fix HIP sort writes what this package's
    reference writes (the contract, ascending pair order within an expert)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, ne, (m, k), generator=g, dtype=torch.int32)
    w = torch.rand(m, k, generator=g)
    legacy, ref = _sort_both(ids, w, ne, mb)
    total = int(ref.cumsum[0])
    assert int(legacy.cumsum[0]) == total and int(legacy.cumsum[1]) == m
    for name in ("sorted_token_ids", "m_indices", "sorted_weights"):
        assert torch.equal(getattr(legacy, name)[:total], getattr(ref, name)[:total]), name
    assert torch.equal(
        legacy.sorted_expert_ids[: total // mb], ref.sorted_expert_ids[: total // mb]
    )
    assert torch.equal(legacy.reverse_sorted, ref.reverse_sorted)


def test_legacy_sort_far_out_of_range_id_overwrites_slot_zero() -> None:
    """An id far outside the LDS tables: its count is dropped, it reads cumsum 0 and
    counter 0, so the pair is stored at slot 0, over a real pair (the docstring's model)."""
    ne, mb = 8, 16
    ids = torch.tensor([[0, 1], [2, 3], [123456789, 5]], dtype=torch.int32)
    w = torch.tensor([[0.5, 0.5], [0.5, 0.5], [float("nan"), 1.0]])
    legacy, ref = _sort_both(ids, w, ne, mb)
    assert int(legacy.reverse_sorted[4]) == 0  # pair (2, 0) landed at slot 0
    assert int(legacy.m_indices[0]) == 2 and torch.isnan(legacy.sorted_weights[0])
    assert int(legacy.reverse_sorted[0]) == 0  # real pair (0, 0) still points at slot 0
    assert int(ref.reverse_sorted[4]) == -1  # this package's sort drops it instead
    assert int(legacy.cumsum[0]) == int(ref.cumsum[0])


def test_legacy_sort_minus_one_inflates_the_total_but_spares_real_pairs() -> None:
    """-1: count[-1] falls before the LDS array (dropped), counter[-1] is cumsum[NE] (the
    total grows by one per -1 pair), and fill_padding_gaps pads those slots again."""
    ne, mb = 8, 16
    ids = torch.tensor([[0, 1], [2, 3], [-1, -1]], dtype=torch.int32)
    w = torch.ones(3, 2)
    legacy, ref = _sort_both(ids, w, ne, mb)
    assert int(legacy.cumsum[0]) == int(ref.cumsum[0]) + 2
    assert torch.equal(legacy.reverse_sorted[:4], ref.reverse_sorted[:4])
    total = int(ref.cumsum[0])
    assert torch.equal(legacy.m_indices[total : total + 2], torch.tensor([3, 3], dtype=torch.int32))


# ------------------------------------------------------------------- consumer, router


def test_consumer_real_rows_bit_identical_under_padding() -> None:
    """Padded rows masked as the plugin masks them (id 0, weight 0) and holding NaN
    activations leave the consumer's real rows bit-identical to an unpadded call."""
    cfg = TinyMoEConfig()
    model = TinyMoE(cfg)
    moe = AiterLikeMoE(cfg, model)
    g = torch.Generator().manual_seed(3)
    n, m = 11, 16
    x = torch.randn(n, cfg.hidden, generator=g)
    ids = torch.stack(
        [torch.randperm(cfg.routed_experts, generator=g)[: cfg.top_k] for _ in range(n)]
    )
    ids = torch.cat([ids, torch.full((n, 1), cfg.routed_experts)], 1).to(torch.int32)
    w = torch.rand(n, cfg.slots, generator=g)
    ref, s_ref = moe(0, x, ids, w)
    xp = torch.cat([x, torch.full((m - n, cfg.hidden), float("nan"))])
    idp = torch.cat([ids, torch.zeros(m - n, cfg.slots, dtype=torch.int32)])
    wp = torch.cat([w, torch.zeros(m - n, cfg.slots)])
    out, s = moe(0, xp, idp, wp)
    assert s.out_of_range_ids == 0 and s_ref.out_of_range_ids == 0
    assert torch.equal(out[:n], ref)
    # Given the count, the sort skips the padded rows entirely: same real rows again.
    out2, _ = moe(0, xp, idp, wp, num_local_tokens=torch.tensor([n], dtype=torch.int32))
    assert torch.equal(out2[:n], ref)


@pytest.mark.sglang
def test_hip_router_nan_rows_get_stale_words_finite_rows_are_routed() -> None:
    cfg = TinyMoEConfig()
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(6, cfg.routed_experts, generator=g)
    logits[4:] = float("nan")
    import sglang.srt.layers.moe.topk as topk_module  # the real release in this interpreter

    route = hip_router_for(topk_module, cfg, torch.zeros(cfg.routed_experts), seed=9)
    w, ids = route(hidden_states=logits, gating_output=logits, topk=cfg.top_k, renormalize=True)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert bool(((ids[:4] >= 0) & (ids[:4] < cfg.routed_experts)).all())
    assert torch.allclose(w[:4].sum(-1), torch.ones(4))
    assert bool(((ids[4:] < 0) | (ids[4:] >= cfg.routed_experts)).any())  # stale LDS words
    route2 = hip_router_for(topk_module, cfg, torch.zeros(cfg.routed_experts), seed=9)
    w2, ids2 = route2(hidden_states=logits, gating_output=logits, topk=cfg.top_k, renormalize=True)
    assert torch.equal(ids, ids2)  # fixed seed: the same garbage every run


# ------------------------------------------------------------------------ guard form


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_the_guard_diffs_rebuild_the_form_the_ledger_knows(version: str) -> None:
    """The check's ``mask-under-eplb-guard`` form: upstream PR 28378 reversed on a real
    release's topk.py is the body the ledger knows as that form (by running it)."""
    text, modules = ledger_tool.wheel_topk(version), ledger_tool.wheel_modules(version)
    assert ledger.read(text, modules=modules).form == "fixed"
    guard = ledger.read(sglang_calls.guard_source(text), modules=modules)
    assert guard.form == "mask-under-eplb-guard"
    with pytest.raises(sglang_calls.GuardFormError, match="applies to this release"):
        sglang_calls.guard_source(ledger_tool.wheel_topk("0.5.13.post1"))


# ----------------------------------------------------------------------------- demo


def _env(tmp_path: Path, version: str, **kw: object) -> demo.Env:
    env = demo.Env(sys.executable, version, tmp_path)
    env.audit = {"targets": [{"target": "sglang", "version": version, "form": "weights-only"}]}
    env.audit_status = 0
    for key, value in kw.items():
        setattr(env, key, value)
    return env


def test_demo_status_and_screen_when_an_environment_fails(tmp_path: Path) -> None:
    """Status 2 when a check could not run (the screen says so), 1 when a row with the
    plugin does not match, 0 only when every environment's check passed; an audit that
    failed (its 2) is a 2, its "needs attention" (1) is not."""
    exact = {"match": "exact", "nan_count": 0, "bad_rows": 0}
    row = {"real": 5, "padded": 8, "compare": exact, "out_of_range_ids": 0, "error": ""}
    passed = {"sglang": "0.5.23", "ok": True, "without_plugin": [row], "with_plugin": [row]}
    ok = _env(tmp_path, "0.5.23", check=passed, check_status=0)
    assert demo.status([ok]) == 0
    assert demo.status([ok, _env(tmp_path, "0.5.13", check={**passed, "ok": False})]) == 1
    broken = _env(tmp_path, "0.5.10", check={}, check_status=2, check_error="no sgl_kernel")
    assert demo.status([ok, broken]) == 2
    assert demo.status([_env(tmp_path, "0.5.23", check=passed, audit_status=1)]) == 0
    assert demo.status([_env(tmp_path, "0.5.23", check=passed, audit_status=2)]) == 2
    screen = demo.render([ok, broken], tmp_path, 1.0)
    assert "0.5.10" in screen and "check could not run: no sgl_kernel" in screen
    assert "result: could not run everywhere" in screen


def test_demo_refuses_a_python_that_is_not_there(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--python", "/nonexistent/bin/python"]) == 2
    assert "--python /nonexistent/bin/python: not an executable file" in capsys.readouterr().err


# ---------------------------------------------------------------------- command lines


@pytest.mark.parametrize("command", ["check", "demo"])
@pytest.mark.parametrize("name", ["rocm", "hip", "gpu"])
def test_device_other_than_cpu_or_cuda_is_a_clear_error(
    command: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """AMD users type rocm or hip: argparse's error (exit 2, no traceback) says that ROCm
    torch calls its GPU cuda, before anything is imported or run."""
    main = check.main if command == "check" else demo.main
    with pytest.raises(SystemExit) as exc:
        main(["--device", name])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"invalid device '{name}'" in err and "ROCm builds of torch call an AMD GPU `cuda`" in err
    )
    assert "Traceback" not in err


def test_device_names_torch_accepts_still_parse() -> None:
    for name in ("cpu", "cuda", "cuda:1"):
        assert check.parse_args(["--device", name]).device == name
        assert demo.parse_args(["--device", name]).device == name


def test_check_and_demo_help_are_help_texts() -> None:
    """``--help`` is argparse's help (usage, every option, the ROCm note), not a raw
    docstring with reStructuredText markup."""
    for command in ("check", "demo"):
        proc = subprocess.run(
            [sys.executable, "-m", "sglang_amd_moe", command, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert proc.returncode == 0, proc.stderr
        text = proc.stdout
        assert text.startswith(f"usage: sglang-amd-moe {command} "), text
        options = {
            "check": ("--device", "--json", "--json-file", "--no-rebuilt"),
            "demo": ("--device", "--python", "--out-dir"),
        }[command]
        for option in options:
            assert option in text, (command, option)
        assert "call an AMD GPU `cuda`" in " ".join(text.split())
        assert "``" not in text and ":mod:" not in text, text
        assert "exit status:" in text  # each says how its status is decided


def _check_in(code: str, *, bare: bool = False) -> subprocess.CompletedProcess:
    """``sglang-amd-moe check`` in a fresh interpreter after ``code`` ran; ``bare``: without
    site-packages (``-S``: only the standard library and this repository)."""
    cmd = [
        sys.executable,
        *(["-S"] if bare else []),
        "-c",
        code + "\n"
        "from sglang_amd_moe.diagnostics.cli import main\n"
        "raise SystemExit(main(['check']))",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)} if bare else None
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)


def test_check_without_sglang_says_so_with_exit_2() -> None:
    """No SGLang in the interpreter (``import sglang`` fails, as where it is not installed):
    exit 2 and one line that says what is missing and where to run the check instead, never
    a traceback and never advice to install SGLang from the registry."""
    proc = _check_in("import sys; sys.modules['sglang'] = None")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "cannot run: SGLang is not installed in this interpreter" in proc.stderr
    assert "the python of the environment that runs your server" in proc.stderr
    assert "Triton" not in proc.stderr and "torch is not installed" not in proc.stderr
    assert proc.stdout == ""


def test_check_without_triton_says_so_with_exit_2() -> None:
    proc = _check_in("import sys; sys.modules['triton'] = None")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "cannot run: Triton is not installed (the kernels need Triton >= 3.3" in proc.stderr
    assert "SGLang is not installed" not in proc.stderr


def test_check_in_a_bare_interpreter_names_everything_missing() -> None:
    """Only the standard library: SGLang, torch and Triton are each named, exit 2."""
    proc = _check_in("", bare=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3, proc.stderr
    assert "SGLang is not installed" in lines[0] and "torch is not installed" in lines[1]
    assert "Triton is not installed" in lines[2]


# ----------------------------------------------------------------------------- table


def _row(source: str, n: int, m: int, cmp: Compare, plugin: bool, oor: int = 0) -> RowResult:
    form = "mask-under-eplb-guard" if source == "rebuilt" else "weights-only"
    return RowResult(form, source, n, m, plugin, compare=cmp, out_of_range_ids=oor)


def test_table_never_shows_zero_error_next_to_nan() -> None:
    """A real row full of NaN has "max abs err" 0 over its finite entries: the table shows
    n/a there (the NaN column counts them), and the number where every entry is finite."""
    exact = Compare("exact", 0.0, 0.0, 0, 0)
    nan_rows = Compare("MISMATCH", 0.0, 0.0, 1024, 4)
    finite_wrong = Compare("MISMATCH", 0.25, 0.01, 0, 2)
    result = CheckResult(
        "0.5.13.post1",
        [FormInfo("installed", "weights-only")],
        without=[
            _row("installed", 5, 8, nan_rows, False, oor=102),
            _row("installed", 47, 48, finite_wrong, False),
            _row("installed", 200, 256, exact, False),
        ],
        with_=[
            _row("installed", 5, 8, exact, True),
            _row("installed", 47, 48, nan_rows, True),
            _row("installed", 200, 256, exact, True),
        ],
        ok=False,
        meta={
            "config": dataclasses.asdict(TinyMoEConfig()),
            "device": "cpu",
            "sorts": "",
            "direct": False,
            "verdict": "FAIL: a row with the plugin does not match",
            "elapsed_s": 1.0,
        },
    )
    text = table.render(result)
    rows = {int(m["n"]): m for line in text.splitlines() if (m := ROW.match(line))}
    assert (rows[5]["err"], rows[5]["nan"]) == ("n/a", "1024")
    assert (rows[47]["err"], rows[47]["nan"]) == ("0.25", "0")
    assert (rows[200]["err"], rows[200]["nan"]) == ("0", "0")
    assert rows[47]["with"] == "MISMATCH (max abs n/a, NaN 1024, ids seen 0)"
    assert "n/a when some entries are non-finite" in text


def test_demo_runs_each_environment_outside_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make demo`` runs from the repository root: an environment's ``python -m
    sglang_amd_moe`` started there would import the source tree (the working directory
    comes first on sys.path) instead of the package installed in that environment, so
    each command runs in the absolute output folder, with the interpreter's absolute path."""
    from sglang_amd_moe.diagnostics import demo

    seen = []

    def fake_run(cmd, **kwargs):
        seen.append((cmd, kwargs.get("cwd")))
        return subprocess.CompletedProcess(cmd, 1, stdout="{}", stderr="")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(demo.subprocess, "run", fake_run)
    env = demo.Env("rel/bin/python", "env0", Path("out").resolve())
    (tmp_path / "out").mkdir()
    demo.run_audit(env, set())
    cmd, cwd = seen[0]
    assert cmd[0] == str(tmp_path / "rel" / "bin" / "python") and cmd[1:3] == [
        "-m",
        "sglang_amd_moe",
    ]
    assert cwd == tmp_path / "out" and Path(cwd).is_absolute()

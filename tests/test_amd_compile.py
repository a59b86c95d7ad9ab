"""The AMD compile gate: every kernel launch the package makes compiles for MI300
(gfx942), MI355 (gfx950) and H100/H200 (sm_90) without spills, within the memory
limits, and on AMD at 8 waves per SIMD.

The gate itself (``python -m tools.amd_compile check``) runs once, in its own process:
it must import Triton with ``TRITON_INTERPRET=0``, which this test process (see
conftest.py) has already imported with the interpreter on. It captures the launches
of the public kernels on ``meta`` tensors, reuses the committed numbers of
``tools/amd_compile/results.json`` for the compilations it holds, compiles the ones it
lacks, and recompiles a few committed ones, which must come out identical. Each test
below asserts one part of its report, so a failure says which.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# tools/ is on pytest's pythonpath: the gate's package imports as amd_compile.
from amd_compile import policy
from amd_compile.targets import TARGETS

REPO = Path(__file__).resolve().parents[1]

REGENERATE = "run `make amd-compile` and commit tools/amd_compile/results.json and docs/amd.md"


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("amd_compile")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.amd_compile",
            "check",
            "--json",
            str(out / "report.json"),
            "--render-docs",
            str(out / "amd.md"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if not (out / "report.json").exists():
        pytest.fail(f"the gate did not run (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    report = json.loads((out / "report.json").read_text())
    report["rendered_docs"] = (out / "amd.md").read_text()
    report["exit_code"] = proc.returncode
    report["stdout"] = proc.stdout
    return report


def test_every_target_and_kernel_is_compiled(gate: dict[str, Any]) -> None:
    kernels = {e["kernel"] for e in gate["entries"]}
    # Every public kernel's module launches something (names are not listed by hand).
    assert any(".mask_padded_rows." in k for k in kernels), kernels
    assert any(".routing_guard." in k for k in kernels), kernels
    assert any(".moe_sort." in k for k in kernels), kernels
    for target in TARGETS:
        compiled = {e["kernel"] for e in gate["entries"] if e["target"] == target.name}
        assert compiled == kernels, f"{target.name} lacks {kernels - compiled}"


def test_every_compilation_passes_the_gate(gate: dict[str, Any]) -> None:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for v in gate["violations"]:
        groups.setdefault((v["target"], v["kernel"].rsplit(".", 1)[-1]), []).append(v)
    lines = []
    for (target, kernel), failing in sorted(groups.items()):
        lines.append(f"{target} {kernel}: {len(failing)} compilations, e.g.")
        for v in failing[:3]:
            lines.append(f"    [{v['key']}] {'; '.join(v['problems'])} ({v['example']})")
    assert not lines, (
        f"{len(gate['violations'])} compilations break the gate (all of them: "
        "python -m tools.amd_compile check):\n" + "\n".join(lines)
    )


def test_committed_results_reproduce_exactly(gate: dict[str, Any]) -> None:
    spot = gate["spot"]
    pairs = {(e["kernel"], e["target"]) for e in gate["entries"]}
    checked = {(s["kernel"], s["target"]) for s in spot}
    # Every kernel and target has one committed entry recompiled (unless none is committed).
    held = {
        (e["kernel"], e["target"])
        for e in gate["entries"]
        if e["key"] not in gate["missing"] and "error" not in e["resources"]
    }
    assert checked == held and held <= pairs
    differ = [
        f"{s['target']} {s['kernel']} [{s['key']}]: committed {s['committed']}, "
        f"compiled {s['compiled']}"
        for s in spot
        if not s["identical"]
    ]
    assert not differ, "recompiled entries differ from the results file:\n" + "\n".join(differ)


def test_committed_results_match_the_current_kernels(gate: dict[str, Any]) -> None:
    assert gate["committed_triton"] == gate["triton"], (
        f"results were made with Triton {gate['committed_triton']}, this is "
        f"{gate['triton']}: {REGENERATE}"
    )
    assert not gate["missing"], (
        f"{len(gate['missing'])} compilations the kernels need are not in the results file "
        f"(they were compiled and checked above): {REGENERATE}"
    )
    assert not gate["stale"], (
        f"{len(gate['stale'])} entries of the results file are needed by no case: {REGENERATE}"
    )
    assert not gate["changed"], (
        f"{len(gate['changed'])} entries are needed by other cases than recorded: {REGENERATE}"
    )


def test_occupancy_exceptions_all_apply(gate: dict[str, Any]) -> None:
    assert not gate["unused_exceptions"], (
        "these occupancy exceptions match no compiled configuration; remove or fix them "
        f"in tools/amd_compile/policy.py: {gate['unused_exceptions']}"
    )


def test_docs_are_what_the_committed_results_generate(gate: dict[str, Any]) -> None:
    assert gate["rendered_docs"] == (REPO / "docs" / "amd.md").read_text(), (
        "docs/amd.md differs from what the committed results generate "
        "(`python -m tools.amd_compile docs` rewrites it)"
    )


# The policy on its own, on resource records shaped like the compiler's: it flags what
# the gate promises to flag, so a regression cannot slip through a lenient rule.

AMD_CLEAN = {
    "agpr": 0,
    "lds": 2048,
    "lds_static": 0,
    "occupancy": 8,
    "scratch": 0,
    "sgpr": 40,
    "sgpr_spill": 0,
    "vgpr": 60,
    "vgpr_spill": 0,
    "vgpr_total": 60,
    "waves_per_simd": 8,
}
NV_CLEAN = {
    "local": 0,
    "regs": 40,
    "shared": 2048,
    "shared_static": 1024,
    "spill_loads": 0,
    "spill_stores": 0,
    "stack_frame": 0,
}


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({}, []),
        ({"vgpr_spill": 3}, ["spills 3 VGPRs"]),
        ({"sgpr_spill": 22}, ["spills 22 SGPRs"]),
        ({"scratch": 16}, ["uses 16 bytes of scratch per lane"]),
        ({"waves_per_simd": 4, "vgpr_total": 105}, ["runs 4 waves per SIMD"]),
        ({"lds": 200 * 1024}, ["bytes of LDS"]),
        ({"error": "LLVM ERROR"}, ["does not compile"]),
    ],
)
def test_amd_policy(target: str, change: dict[str, Any], expected: list[str]) -> None:
    found = policy.problems("m.k", target, {}, {**AMD_CLEAN, **change}, exceptions=())
    assert len(found) == len(expected)
    for got, want in zip(found, expected, strict=True):
        assert want in got


def test_amd_lds_limit_differs_per_target() -> None:
    lds = {**AMD_CLEAN, "lds": 100 * 1024}
    assert policy.problems("m.k", "gfx942", {}, lds, exceptions=())
    assert not policy.problems("m.k", "gfx950", {}, lds, exceptions=())


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({}, 0),
        ({"spill_stores": 32, "spill_loads": 32, "stack_frame": 32}, 1),
        ({"local": 8}, 1),
        ({"shared": 228 * 1024}, 1),
    ],
)
def test_sm90_policy(change: dict[str, Any], expected: int) -> None:
    assert (
        len(policy.problems("m.k", "sm90", {}, {**NV_CLEAN, **change}, exceptions=())) == expected
    )


def test_occupancy_exception_sets_a_floor_not_a_pass() -> None:
    exc = policy.OccupancyException(
        kernel="k", where={"B": 128}, targets=("gfx942",), min_waves=4, reason="test"
    )
    four = {**AMD_CLEAN, "waves_per_simd": 4}
    two = {**AMD_CLEAN, "waves_per_simd": 2}
    assert not policy.problems("m.k", "gfx942", {"B": 128}, four, exceptions=(exc,))
    assert policy.problems("m.k", "gfx942", {"B": 128}, two, exceptions=(exc,))
    assert policy.problems("m.k", "gfx942", {"B": 64}, four, exceptions=(exc,))
    assert policy.problems("m.k", "gfx950", {"B": 128}, four, exceptions=(exc,))
    assert policy.unused_exceptions([("m.k", "gfx950", {"B": 128})], (exc,)) == [exc]


@pytest.mark.parametrize(
    ("target", "num_warps", "waves", "max_grid", "passes"),
    [
        ("gfx942", 4, 5, 100, True),  # latency-bound: needs 2 waves
        ("gfx942", 4, 5, 300, True),  # 300 < 304 compute units on MI300X
        ("gfx950", 4, 5, 300, False),  # but not below MI355X's 256
        ("gfx950", 4, 5, 255, True),
        ("gfx942", 4, 1, 100, False),  # below the floor of 2
        ("gfx942", 8, 3, 100, False),  # 8 warps: 2 of its own per SIMD, floor 4
        ("gfx942", 8, 4, 100, True),
        ("gfx942", 16, 6, 10, False),  # 16 warps: its own 4 twice is 8, no relief
        ("gfx942", 4, 5, None, False),  # grid unknown
    ],
)
def test_grid_aware_rule(target, num_warps, waves, max_grid, passes) -> None:
    res = {**AMD_CLEAN, "waves_per_simd": waves}
    found = policy.problems(
        "m.k", target, {"num_warps": num_warps}, res, exceptions=(), max_grid=max_grid
    )
    assert (not found) is passes, found


def test_grid_aware_rule_never_relaxes_nvidia() -> None:
    assert policy.latency_bound_floor("sm90", {"num_warps": 4}, 1) is None

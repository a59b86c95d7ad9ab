"""Render docs/amd.md from the results: every number in it comes from the results file.

Pure: no Triton import, so the docs test can run it in the test process.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from . import policy
from .targets import MIN_WAVES_PER_SIMD, TARGETS, TARGETS_BY_NAME

AMD_TARGETS = [t.name for t in TARGETS if t.is_amd]
NV_TARGETS = [t.name for t in TARGETS if not t.is_amd]


def _short(kernel: str) -> str:
    return kernel.rsplit(".", 1)[-1]


def _range(values: Iterable[int]) -> str:
    values = list(values)
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _config_text(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def _config_order(config: dict[str, Any]) -> tuple:
    """Sort key: numbers numerically, everything else as text (hashable)."""
    return tuple(
        (k, (0, v) if isinstance(v, int | float) and not isinstance(v, bool) else (1, str(v)))
        for k, v in config.items()
    )


def _problems(e: dict[str, Any], target: str | None = None) -> list[str]:
    return policy.problems(
        e["kernel"], target or e["target"], e["config"], e["resources"],
        max_grid=e.get("max_grid"),
    )  # fmt: skip


def _ok(entries: list[dict[str, Any]]) -> str:
    bad = sum(1 for e in entries if _problems(e))
    return "pass" if bad == 0 else f"**{bad} fail**"


def _summary(entries: list[dict[str, Any]]) -> list[str]:
    by = defaultdict(list)
    for e in entries:
        by[(_short(e["kernel"]), e["target"])].append(e)
    amd = [
        "| kernel | target | compilations | VGPRs | AGPRs | SGPRs | VGPR / SGPR spills "
        "| scratch (B) | LDS (B) | waves / SIMD | gate |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    nv = [
        "| kernel | target | compilations | registers | spill stores / loads (B) "
        "| stack frame (B) | shared (B) | gate |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for (kernel, target), es in sorted(by.items()):
        ok = [e["resources"] for e in es if "error" not in e["resources"]]
        errors = len(es) - len(ok)
        if not ok:
            row = f"| `{kernel}` | {target} | {len(es)} | {errors} do not compile |"
            (amd if TARGETS_BY_NAME[target].is_amd else nv).append(row)
            continue
        if TARGETS_BY_NAME[target].is_amd:
            amd.append(
                f"| `{kernel}` | {target} | {len(es)} | {_range(r['vgpr_total'] for r in ok)} "
                f"| {max(r['agpr'] for r in ok)} | {_range(r['sgpr'] for r in ok)} "
                f"| {max(r['vgpr_spill'] for r in ok)} / {max(r['sgpr_spill'] for r in ok)} "
                f"| {max(r['scratch'] for r in ok)} | {_range(r['lds'] for r in ok)} "
                f"| {_range(r['waves_per_simd'] for r in ok)} | {_ok(es)} |"
            )
        else:
            nv.append(
                f"| `{kernel}` | {target} | {len(es)} | {_range(r['regs'] for r in ok)} "
                f"| {max(r['spill_stores'] for r in ok)} / {max(r['spill_loads'] for r in ok)} "
                f"| {max(r['stack_frame'] for r in ok)} | {_range(r['shared'] for r in ok)} "
                f"| {_ok(es)} |"
            )
    return [*amd, "", *nv]


def _details(entries: list[dict[str, Any]]) -> list[str]:
    """One row per kernel configuration (its constants and launch options), the worst
    case over the runtime specializations that share it, side by side per target."""
    rows: dict[tuple[str, tuple], dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for e in entries:
        rows[(_short(e["kernel"]), _config_order(e["config"]))][e["target"]].append(e)
    head = "| kernel | configuration | " + " | ".join(
        [f"{t} VGPRs / SGPR spills / waves" for t in AMD_TARGETS]
        + [f"{t} regs / spill B" for t in NV_TARGETS]
    )
    out = [head + " |", "| --- | --- |" + " ---: |" * (len(AMD_TARGETS) + len(NV_TARGETS))]
    for (kernel, order), per_target in sorted(rows.items()):
        config = _config_text(dict((k, v) for k, (_, v) in order))
        cells = []
        for t in AMD_TARGETS + NV_TARGETS:
            es = per_target.get(t, [])
            rs = [e["resources"] for e in es if "error" not in e["resources"]]
            if not es:
                cells.append("")
            elif len(rs) < len(es):
                cells.append("does not compile")
            else:
                if TARGETS_BY_NAME[t].is_amd:
                    text = (
                        f"{max(r['vgpr_total'] for r in rs)} / {max(r['sgpr_spill'] for r in rs)}"
                        f" / {min(r['waves_per_simd'] for r in rs)}"
                    )
                else:
                    text = (
                        f"{max(r['regs'] for r in rs)} / "
                        f"{max(r['spill_stores'] + r['spill_loads'] for r in rs)}"
                    )
                bad = any(_problems(e, t) for e in es)
                cells.append(f"**{text}**" if bad else text)
        out.append(f"| `{kernel}` | {config} | " + " | ".join(cells) + " |")
    return out


def _failures(entries: list[dict[str, Any]]) -> list[str]:
    """Failing compilations, grouped by kernel, target and configuration (the runtime
    specializations of one configuration usually fail alike)."""
    groups: dict[tuple[str, str, str], list[tuple[dict[str, Any], list[str]]]] = defaultdict(list)
    for e in entries:
        found = _problems(e)
        if found:
            groups[(_short(e["kernel"]), e["target"], _config_text(e["config"]))].append((e, found))
    out = []
    for (kernel, target, config), failing in sorted(groups.items()):
        problems = sorted({p for _, found in failing for p in found})
        first = min(failing, key=lambda f: f[0]["key"])[0]
        cases = sum(e["cases"] for e, _ in failing)
        out.append(
            f"- `{kernel}` on {target}, {config}: {len(failing)} compilation(s) needed by "
            f"{cases} case(s), e.g. `{first['example']}`: " + "; ".join(problems) + "."
        )
    return out or ["None: every compilation passes."]


def _latency_bound(entries: list[dict[str, Any]]) -> list[str]:
    """Configurations below 8 waves per SIMD that pass by the grid-aware rule."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in entries:
        r = e["resources"]
        if "error" in r or not TARGETS_BY_NAME[e["target"]].is_amd:
            continue
        if r["waves_per_simd"] < MIN_WAVES_PER_SIMD and not _problems(e):
            groups[(_short(e["kernel"]), e["target"], _config_text(e["config"]))].append(e)
    out = []
    for (kernel, target, config), es in sorted(groups.items()):
        t = TARGETS_BY_NAME[target]
        waves = min(e["resources"]["waves_per_simd"] for e in es)
        out.append(
            f"- `{kernel}` on {target}, {config}: {waves} waves per SIMD, grids of at most "
            f"{max(e['max_grid'] for e in es)} programs (< {t.compute_units} compute units)."
        )
    return out or ["None."]


def _exceptions() -> list[str]:
    if not policy.OCCUPANCY_EXCEPTIONS:
        return [
            f"None. Every kernel configuration is held to {MIN_WAVES_PER_SIMD} waves per SIMD,"
            " or to the grid-aware rule's floor (above)."
        ]
    out = []
    for exc in policy.OCCUPANCY_EXCEPTIONS:
        where = " ".join(f"{k}={v}" for k, v in exc.where.items())
        out.append(
            f"- `{exc.kernel}` with {where} on {', '.join(exc.targets)}: at least "
            f"{exc.min_waves} waves per SIMD. {exc.reason}"
        )
    return out


def render(triton_version: str | None, entries: list[dict[str, Any]]) -> str:
    entries = list(entries)
    cases = sum(e["cases"] for e in entries)
    lines = [
        "# AMD compile gate: resources of every kernel, per target",
        "",
        "Generated by `make amd-compile` (`python -m tools.amd_compile sweep`) from",
        "`tools/amd_compile/results.json`; do not edit by hand (a test checks that this file",
        "is exactly what the results generate).",
        "",
        "## What the gate does",
        "",
        "`make test` runs it (`tests/test_amd_compile.py`). It calls the package's public",
        "kernels (`mask_padded_rows_`, `guard_routing`, `mxfp4_moe_sort`) with tensors on",
        "PyTorch's `meta`",
        "device inside `capture_launches()`, so the package's own launch planning decides",
        "every launch and nothing runs. Each captured launch is specialized the way the",
        "installed Triton would specialize it on a GPU (its own argument binder), for",
        '`GPUTarget("hip", "gfx942", 64)` (MI300), `("hip", "gfx950", 64)` (MI355) and',
        '`("cuda", 90, 32)` (H100/H200), and identical compilations are merged. Triton\'s AMD',
        "backend and its linker ship inside the Triton wheel, so this needs no ROCm and no",
        "GPU.",
        "",
        "The results file holds one entry per compilation, keyed by everything that",
        "determines its code (Triton's `cache_key` of the kernel: a hash of its source, its",
        "line in the file and every function and global it uses; the argument types and",
        "specialization, the constants, `num_warps`, the target and the Triton version).",
        "`make test` compiles only the keys the file lacks, recompiles",
        "for each kernel and target the committed entry with the most registers and requires",
        "identical numbers, and fails when the file holds keys no case needs or lacks keys a",
        "case needs (run `make amd-compile` after changing a kernel or its launch planning).",
        "",
        "Asserted for every compilation:",
        "",
        "- gfx942 and gfx950: it compiles; no VGPR, SGPR or AGPR spills and no scratch; LDS",
        "  within the workgroup limit (gfx942 64 KiB, gfx950 160 KiB, from Triton's AMD",
        "  backend); at least "
        f"{MIN_WAVES_PER_SIMD} waves per SIMD (the compiler's occupancy, bounded by the",
        "  LDS each workgroup takes), except by the grid-aware rule below or an exception",
        "  listed below.",
        "- sm_90: it compiles; no local memory (spill stores or loads, stack frame); shared",
        "  memory within 227 KiB per block.",
        "",
        f"This run: Triton {triton_version}, {len(entries)} compilations needed by "
        f"{cases} (case, launch, target) combinations.",
        "",
        "## Per kernel and target",
        "",
        "Ranges are over all compilations of the kernel for the target; spills, scratch and",
        "local memory are maxima.",
        "",
        *_summary(entries),
        "",
        "## Compilations that break the gate",
        "",
        *_failures(entries),
        "",
        "## The grid-aware rule: latency-bound launches",
        "",
        "A compilation whose every launch (over the cases that need it) has a grid of",
        "fewer programs than the target has compute units (304 on MI300X, gfx942; 256 on",
        "MI355X, gfx950) is latency-bound: at most one workgroup lands on a compute unit,",
        "so it can use only its own waves per SIMD (`num_warps / 4`), and 8 buys nothing.",
        "It needs twice its own waves per SIMD (room for a second workgroup where the",
        f"dispatcher doubles one up), at least {policy.LATENCY_BOUND_MIN_WAVES}. The sort's"
        " launch planning uses",
        "this where its place kernel's grid is below 256 programs: each place program then",
        "sums 4096 count-table values per step instead of 2048 (the per-configuration table",
        "below gives its registers; where they still fit 8 waves, the rule is not needed).",
        "Configurations that pass by this rule with fewer than 8 waves per SIMD:",
        "",
        *_latency_bound(entries),
        "",
        "## Kernels allowed fewer than 8 waves per SIMD by exception",
        "",
        *_exceptions(),
        "",
        "## Per configuration",
        "",
        "One row per kernel configuration (compile-time constants and `num_warps`); each",
        "cell is the worst case over the runtime specializations that share it (bold:",
        "breaks the gate). AMD cells: VGPRs (including AGPRs) / SGPR spills / waves per",
        "SIMD; sm_90 cells: registers / spill bytes.",
        "",
        *_details(entries),
        "",
    ]
    return "\n".join(lines)

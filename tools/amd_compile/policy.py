"""What the gate asserts about every compiled kernel, and the one list of exceptions.

On AMD (gfx942, gfx950): no VGPR, SGPR or AGPR spills, no scratch, LDS within the
workgroup limit, and at least ``MIN_WAVES_PER_SIMD`` waves per SIMD. On sm_90: no
local-memory traffic (spill stores/loads, stack frame, local memory) and shared memory
within the block limit.

Why these: the kernels are short and memory-latency bound. A spill turns a register
access into a scratch (or, for SGPRs, a VGPR-lane) round trip inside the hot loop, and
fewer waves per SIMD leave fewer loads in flight to hide latency.

The grid-aware rule: a compilation whose every launch has a grid smaller than the
target's compute units (304 on MI300X, 256 on MI355X) is latency-bound: at most one
workgroup lands on a compute unit, so the waves per SIMD it can use are its own
(``num_warps / 4``), and 8 buys nothing. Such a compilation needs only twice its own
waves per SIMD (room for a second workgroup where the dispatcher doubles one up), at
least ``LATENCY_BOUND_MIN_WAVES``; the gate reads each compilation's largest grid over
the cases that need it. A kernel that cannot reach 8 waves on a larger grid because of
what its tile must hold at once is listed in ``OCCUPANCY_EXCEPTIONS`` with the reason
and the floor it must still meet, so the exception is a reviewed decision rather than
a silent pass; an exception that matches no compiled configuration is itself reported,
so the list cannot rot.

Pure data and arithmetic: no Triton import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .targets import MIN_WAVES_PER_SIMD, TARGETS_BY_NAME


@dataclass(frozen=True)
class OccupancyException:
    """Configurations of one kernel allowed fewer than ``MIN_WAVES_PER_SIMD`` waves."""

    kernel: str  # the kernel function's name
    where: Mapping[str, Any]  # constexpr values (and num_warps) that select them
    targets: tuple[str, ...]
    min_waves: int  # what they must still reach
    reason: str

    def matches(self, kernel: str, target: str, config: Mapping[str, Any]) -> bool:
        return (
            kernel.rsplit(".", 1)[-1] == self.kernel
            and target in self.targets
            and all(config.get(k) == v for k, v in self.where.items())
        )


# The configurations that cannot reach 8 waves per SIMD, and why. Empty: every kernel
# of the package is held to 8, or to the grid-aware rule's floor.
OCCUPANCY_EXCEPTIONS: tuple[OccupancyException, ...] = ()

LATENCY_BOUND_MIN_WAVES = 2


def latency_bound_floor(target: str, config: Mapping[str, Any], max_grid: int | None) -> int | None:
    """The waves per SIMD a compilation needs under the grid-aware rule, or None when
    the rule does not apply (not AMD, grid unknown or not below the compute units)."""
    t = TARGETS_BY_NAME[target]
    if not t.is_amd or max_grid is None or max_grid >= t.compute_units:
        return None
    own = -(-int(config.get("num_warps", 4)) // t.simds_per_cu)
    return min(MIN_WAVES_PER_SIMD, max(LATENCY_BOUND_MIN_WAVES, 2 * own))


def unused_exceptions(
    compiled: Iterable[tuple[str, str, Mapping[str, Any]]],
    exceptions: Iterable[OccupancyException] = OCCUPANCY_EXCEPTIONS,
) -> list[OccupancyException]:
    """Exceptions that match none of the ``(kernel, target, config)`` compiled."""
    compiled = list(compiled)
    return [e for e in exceptions if not any(e.matches(*c) for c in compiled)]


def exception_for(
    kernel: str,
    target: str,
    config: Mapping[str, Any],
    exceptions: Iterable[OccupancyException] = OCCUPANCY_EXCEPTIONS,
) -> OccupancyException | None:
    for exc in exceptions:
        if exc.matches(kernel, target, config):
            return exc
    return None


def problems(
    kernel: str,
    target: str,
    config: Mapping[str, Any],
    resources: Mapping[str, Any],
    exceptions: Iterable[OccupancyException] = OCCUPANCY_EXCEPTIONS,
    max_grid: int | None = None,
) -> list[str]:
    """Everything wrong with one compilation's resources (empty: it passes);
    ``max_grid``: the largest grid (programs) any case launches it with."""
    if "error" in resources:
        return [f"does not compile: {resources['error']}"]
    t = TARGETS_BY_NAME[target]
    out: list[str] = []
    if t.is_amd:
        if resources["vgpr_spill"]:
            out.append(f"spills {resources['vgpr_spill']} VGPRs")
        if resources["sgpr_spill"]:
            out.append(f"spills {resources['sgpr_spill']} SGPRs")
        if resources["scratch"]:
            out.append(f"uses {resources['scratch']} bytes of scratch per lane")
        if resources["lds"] > t.shared_limit:
            out.append(f"uses {resources['lds']} bytes of LDS (> {t.shared_limit})")
        waves = resources["waves_per_simd"]
        exc = exception_for(kernel, target, config, exceptions)
        floor = exc.min_waves if exc is not None else MIN_WAVES_PER_SIMD
        bound = latency_bound_floor(target, config, max_grid)
        if bound is not None:
            floor = min(floor, bound)
        if waves < floor:
            grid = "" if max_grid is None else f", grid up to {max_grid}"
            out.append(
                f"runs {waves} waves per SIMD (< {floor}; {resources['vgpr_total']} VGPRs, "
                f"{resources['sgpr']} SGPRs{grid})"
            )
    else:
        spilled = resources["spill_stores"] + resources["spill_loads"]
        if spilled or resources["stack_frame"] or resources["local"]:
            out.append(
                f"uses local memory: {resources['spill_stores']} bytes spill stores, "
                f"{resources['spill_loads']} bytes spill loads, "
                f"{resources['stack_frame']} bytes stack frame ({resources['regs']} registers)"
            )
        if resources["shared"] > t.shared_limit:
            out.append(f"uses {resources['shared']} bytes of shared memory (> {t.shared_limit})")
    return out

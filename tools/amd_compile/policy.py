"""What the gate asserts about every compiled kernel, and the one list of exceptions.

On AMD (gfx942, gfx950): no VGPR, SGPR or AGPR spills, no scratch, LDS within the
workgroup limit, and at least ``MIN_WAVES_PER_SIMD`` waves per SIMD. On sm_90: no
local-memory traffic (spill stores/loads, stack frame, local memory) and shared memory
within the block limit.

Why these: the kernels are short and memory-latency bound. A spill turns a register
access into a scratch (or, for SGPRs, a VGPR-lane) round trip inside the hot loop, and
fewer waves per SIMD leave fewer loads in flight to hide latency. A kernel that cannot
reach 8 waves because of what its tile must hold at once is listed in
``OCCUPANCY_EXCEPTIONS`` with the reason and the floor it must still meet, so the
exception is a reviewed decision rather than a silent pass; an exception that matches
no compiled configuration is itself reported, so the list cannot rot.

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
# of the package is held to 8.
OCCUPANCY_EXCEPTIONS: tuple[OccupancyException, ...] = ()


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
) -> list[str]:
    """Everything wrong with one compilation's resources (empty: it passes)."""
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
        if waves < floor:
            out.append(
                f"runs {waves} waves per SIMD (< {floor}; {resources['vgpr_total']} VGPRs, "
                f"{resources['sgpr']} SGPRs)"
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

"""The GPU targets the compile gate builds for, and the hardware limits it checks against.

Each limit says where it comes from, so a reader can check it rather than trust it:

- LDS per workgroup: Triton's own AMD backend caps a kernel's shared memory at
  ``TargetFeatures::getSharedMemorySize()`` (``third_party/amd/lib/Dialect/TritonAMDGPU/
  IR/TargetFeatures.cpp``): 160 KiB for CDNA4 (gfx950), 64 KiB otherwise (CDNA3,
  gfx942). On CDNA a workgroup may use all of its compute unit's LDS, so the same
  number is the LDS of one compute unit.
- LDS allocation granule: LLVM's AMDGPU user guide (``COMPUTE_PGM_RSRC2.LDS_SIZE``):
  128 dwords (512 bytes) on GFX7-GFX9 including gfx942, 320 dwords (1280 bytes) on
  gfx950. A workgroup occupies its LDS rounded up to the granule.
- Waves per SIMD: CDNA3/CDNA4 compute units have 4 SIMDs of at most 8 waves each;
  the compiler's ``; Occupancy:`` figure is waves per SIMD (VGPR, SGPR and workgroup
  size limits, but not the LDS Triton asks for at launch, which the gate adds).
- Compute units: 304 on MI300X (gfx942), 256 on MI355X (gfx950), AMD's product
  specifications (the Instinct MI300X and MI355X data sheets). A grid of fewer
  workgroups than that puts at most one workgroup on a compute unit.
- sm_90 shared memory per block: 228 KiB per SM, of which CUDA reserves 1 KiB per
  block for system use (CUDA C++ Programming Guide, compute capability 9.x; that
  1 KiB is the ``SHARED`` which ``cuobjdump -res-usage`` reports for these kernels,
  which declare none), so a block can address at most 227 KiB = 232448 bytes. Triton
  compares a kernel's ``shared`` bytes with the device's opt-in per-block maximum
  when it loads the kernel, and refuses it past that.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class Target:
    """One compilation target: Triton's ``GPUTarget(backend, arch, warp_size)`` plus limits."""

    name: str  # short label used in results and docs
    backend: str  # "hip" or "cuda"
    arch: str | int  # "gfx942", "gfx950" or 90
    warp_size: int
    shared_limit: int  # bytes of LDS / shared memory one workgroup / block may use
    lds_per_cu: int = 0  # AMD: LDS bytes of one compute unit (occupancy bound)
    lds_granule: int = 0  # AMD: LDS allocation granule in bytes
    simds_per_cu: int = 0  # AMD
    max_waves_per_simd: int = 0  # AMD
    compute_units: int = 0  # AMD: of the largest part of this architecture

    @property
    def is_amd(self) -> bool:
        return self.backend == "hip"

    @property
    def label(self) -> str:
        """What identifies the target in a cache key (backend, arch and wave size)."""
        return f"{self.backend}:{self.arch}:{self.warp_size}"

    def gpu_target(self):  # -> triton.backends.compiler.GPUTarget
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


GFX942 = Target(
    name="gfx942",
    backend="hip",
    arch="gfx942",
    warp_size=64,
    shared_limit=64 * KIB,
    lds_per_cu=64 * KIB,
    lds_granule=128 * 4,
    simds_per_cu=4,
    max_waves_per_simd=8,
    compute_units=304,
)
GFX950 = Target(
    name="gfx950",
    backend="hip",
    arch="gfx950",
    warp_size=64,
    shared_limit=160 * KIB,
    lds_per_cu=160 * KIB,
    lds_granule=320 * 4,
    simds_per_cu=4,
    max_waves_per_simd=8,
    compute_units=256,
)
SM90 = Target(name="sm90", backend="cuda", arch=90, warp_size=32, shared_limit=227 * KIB)

TARGETS: tuple[Target, ...] = (GFX942, GFX950, SM90)
TARGETS_BY_NAME = {t.name: t for t in TARGETS}

# Waves per SIMD the gate asks of every AMD kernel (the hardware maximum on CDNA3/4):
# these kernels are memory-latency bound, and waves in flight are what hides latency.
MIN_WAVES_PER_SIMD = 8

"""The AMD compile gate: every kernel launch of the package, compiled for MI300 (gfx942),
MI355 (gfx950) and H100/H200 (sm_90) on the CPU, with its resources checked.

Why: the kernels run on AMD GPUs, but CI has none. Triton's wheel carries its AMD
backend (the linker is inside libtriton), so real gfx942/gfx950 code can be built here,
and the compiler's own report of registers, spills, scratch, LDS and occupancy is what
would decide how the kernels run there.

Modules: ``shapes`` (representative calls and their captured launches), ``build``
(Triton's specialization of a launch for a target, the compile, the cache key),
``resources`` (parsing the compilers' reports), ``targets`` (targets and their limits),
``policy`` (what is asserted, and the occupancy exceptions), ``results`` (the committed
results file), ``report`` (docs/amd.md), ``gate`` (sweep and check), ``__main__`` (the
command line: ``python -m tools.amd_compile sweep|check|docs``).

Importing this package imports nothing heavy: ``policy``, ``results`` and ``report`` are
pure, so the tests can use them in a process whose Triton runs interpreted.
"""

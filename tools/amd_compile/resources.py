"""Read a compiled kernel's resource use from what the compilers print.

Pure text parsing, no Triton import, so tests can feed it any assembly.

AMD (``amdgcn`` assembly from LLVM): the ``amdhsa.kernels`` metadata carries the
register counts and spills the loader uses (``.vgpr_count``, ``.sgpr_count``,
``.agpr_count``, ``.vgpr_spill_count``, ``.sgpr_spill_count``), the scratch
(``.private_segment_fixed_size``) and the static LDS (``.group_segment_fixed_size``);
the ``; Kernel info:`` comments add the compiler's occupancy (``; Occupancy:``, waves
per SIMD) and ``; ScratchSize:``. The metadata has no separate AGPR spill count: on
CDNA3/CDNA4 AGPRs and VGPRs are one register file, and any spill to memory needs
scratch, which is read here.

NVIDIA: ``ptxas -v`` prints the registers, stack frame and spill stores/loads of each
entry function; ``cuobjdump -res-usage`` prints REG, STACK, SHARED and LOCAL.
"""

from __future__ import annotations

import re

_AMD_METADATA_FIELDS = {
    "vgpr": ".vgpr_count",
    "sgpr": ".sgpr_count",
    "agpr": ".agpr_count",
    "vgpr_spill": ".vgpr_spill_count",
    "sgpr_spill": ".sgpr_spill_count",
    "scratch": ".private_segment_fixed_size",
    "lds_static": ".group_segment_fixed_size",
}
_AMD_COMMENT_FIELDS = {
    "vgpr_total": "TotalNumVgprs",
    "occupancy": "Occupancy",
    "scratch_size": "ScratchSize",
}


class ParseError(ValueError):
    """The compiler's output did not have the fields the gate reads."""


def _one_int(pattern: str, text: str, what: str) -> int:
    found = re.findall(pattern, text, flags=re.MULTILINE)
    if len(found) != 1:
        raise ParseError(f"expected exactly one {what}, found {len(found)}")
    return int(found[0])


def parse_amdgcn(asm: str) -> dict[str, int]:
    """Resource use of the one kernel in an ``amdgcn`` assembly listing.

    Returns vgpr, agpr, vgpr_total, sgpr, vgpr_spill, sgpr_spill, scratch (bytes per
    lane of private segment; the larger of the metadata's and the comment's, which
    agree), lds_static (bytes) and occupancy (waves per SIMD, as the compiler computes
    it from registers and workgroup size).
    """
    meta = asm.split("amdhsa.kernels:", 1)
    if len(meta) != 2:
        raise ParseError("no amdhsa.kernels metadata in the assembly")
    kernels_meta = meta[1].split("amdhsa.target", 1)[0]
    if len(re.findall(r"^\s+\.name:\s+\S+\s*$", kernels_meta, flags=re.MULTILINE)) < 1:
        raise ParseError("no kernel in the amdhsa.kernels metadata")
    out: dict[str, int] = {}
    for key, field in _AMD_METADATA_FIELDS.items():
        out[key] = _one_int(rf"^\s*(?:- )?{re.escape(field)}:\s+(\d+)\s*$", kernels_meta, field)
    info = asm.split("; Kernel info:", 1)
    if len(info) != 2:
        raise ParseError("no '; Kernel info:' block in the assembly")
    for key, field in _AMD_COMMENT_FIELDS.items():
        out[key] = _one_int(rf"^; {field}: (\d+)\s*$", info[1], f"'; {field}:'")
    out["scratch"] = max(out["scratch"], out.pop("scratch_size"))
    return out


_PTXAS_FUNCTION = re.compile(r"Function properties for (\S+)")
_PTXAS_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas_log(log: str, kernel: str) -> dict[str, int]:
    """Registers, stack frame and spill bytes of ``kernel`` from a ``ptxas -v`` log."""
    blocks = _PTXAS_FUNCTION.split(log)
    # split() alternates text, name, text, name, text ...
    for name, body in zip(blocks[1::2], blocks[2::2], strict=True):
        if name != kernel:
            continue
        frame = _PTXAS_FRAME.search(body)
        regs = _PTXAS_REGS.search(body)
        if frame is None or regs is None:
            raise ParseError(f"ptxas log has no frame/register line for {kernel}")
        return {
            "regs": int(regs.group(1)),
            "stack_frame": int(frame.group(1)),
            "spill_stores": int(frame.group(2)),
            "spill_loads": int(frame.group(3)),
        }
    raise ParseError(f"ptxas log does not mention {kernel}")


_RES_USAGE = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def parse_res_usage(text: str, kernel: str) -> dict[str, int]:
    """REG, STACK, SHARED (static) and LOCAL of ``kernel`` from ``cuobjdump -res-usage``."""
    for name, reg, stack, shared, local in _RES_USAGE.findall(text):
        if name == kernel:
            return {
                "regs": int(reg),
                "stack": int(stack),
                "shared_static": int(shared),
                "local": int(local),
            }
    raise ParseError(f"cuobjdump -res-usage does not list {kernel}")


def lds_waves_per_simd(
    lds_bytes: int, waves_per_workgroup: int, lds_per_cu: int, granule: int, simds: int
) -> int | None:
    """Waves per SIMD that the LDS of a compute unit allows (``None``: no LDS, no bound).

    A workgroup holds its LDS rounded up to the allocation granule; as many workgroups
    fit on a compute unit as its LDS holds, and their waves spread over its SIMDs.
    """
    if lds_bytes <= 0:
        return None
    held = -(-lds_bytes // granule) * granule
    return (lds_per_cu // held) * waves_per_workgroup // simds

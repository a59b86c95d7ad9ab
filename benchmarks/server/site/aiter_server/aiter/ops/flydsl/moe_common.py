"""Stand-in for ``aiter.ops.flydsl.moe_common``: the gate layout names SGLang imports."""

from enum import Enum


class GateMode(Enum):
    SEPARATED = "separated"
    INTERLEAVE = "interleave"

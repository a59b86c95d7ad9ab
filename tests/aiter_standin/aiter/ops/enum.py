"""Stand-in for ``aiter.ops.enum``: upstream binds these enums from C++; the member
names used on the MoE path are kept, their values are arbitrary here."""

from enum import Enum


class ActivationType(Enum):
    No = -1
    Silu = 0
    Gelu = 1
    Swiglu = 2


class QuantType(Enum):
    No = 0
    per_Tensor = 1
    per_Token = 2
    per_1x32 = 3
    per_1x128 = 4
    per_128x128 = 5

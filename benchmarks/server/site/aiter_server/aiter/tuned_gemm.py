"""Stand-in for ``aiter.tuned_gemm``: ``tgemm.mm`` as ``torch.nn.functional.linear``."""

import torch.nn.functional as F


class _TunedGemm:
    def mm(self, inp, weights, bias=None, otype=None, scale_a=None, scale_b=None, scale_c=None):
        out = F.linear(inp, weights, bias)
        return out if otype is None else out.to(otype)


tgemm = _TunedGemm()

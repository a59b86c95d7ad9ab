"""Stand-in for ``aiter.ops.shuffle``: aiter reorders weights into the tile layout of its CK
kernels; the stand-in's MoE reads them in SGLang's own layout, so nothing moves."""


def shuffle_weight(x, layout=(16, 16), use_int4=False):
    return x

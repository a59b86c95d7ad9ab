"""The aiter target: the MXFP4 aux sort path of ``aiter.fused_moe``."""

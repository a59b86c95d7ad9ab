"""Stand-in for ``aiter.utility.dtypes``: the dtype aliases the MoE sort path uses."""

import torch

i32 = torch.int32
fp32 = torch.float32
bf16 = torch.bfloat16
fp16 = torch.float16

"""OPT406 on vision_bdh's attention shape, on CUDA: written out against SDPA.

    python benchmarks/sdpa_head_broadcast.py      # needs a CUDA device

vision_bdh's `RotaryAttention` at its `gpu` size: batch 256, 4 heads, T=64, queries and keys
with head dim 768 (they are the same tensor), values with head dim 192 and ONE head,
broadcast over the four. Forward and backward of `softmax(q @ k^T * s) @ v` written out,
against `F.scaled_dot_product_attention(q, k, v, scale=s)` with the default backend choice
and with each backend forced, and against SDPA with the values expanded to four heads; float32
and bfloat16, TF32 off and on. Prints milliseconds per forward+backward (mean of 30, after 3),
peak memory, and the first warnings SDPA gives when it refuses a backend. Results:
benchmarks/results/sdpa-head-broadcast-cuda.md.
"""

import math
import time
import warnings
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

B, H, T, Dq, Dv = 256, 4, 64, 768, 192
scale = 1 / math.sqrt(Dq)


def explicit(q, v):
    return F.softmax(q @ q.transpose(-2, -1) * scale, dim=-1) @ v


def sdpa(q, v):
    return F.scaled_dot_product_attention(q, q, v, scale=scale)


def sdpa_expanded(q, v):
    return F.scaled_dot_product_attention(q, q, v.expand(-1, q.size(1), -1, -1), scale=scale)


def bench(fn, q, v, n=30):
    for _ in range(3):
        fn(q, v).sum().backward()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    for _ in range(n):
        fn(q, v).sum().backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3, torch.cuda.max_memory_allocated() / 2**20


print(torch.__version__, torch.cuda.get_device_name())
for tf32 in (False, True):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(B, H, T, Dq, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(B, 1, T, Dv, device="cuda", dtype=dtype, requires_grad=True)
        for name, fn in (
            ("explicit", explicit),
            ("sdpa", sdpa),
            ("sdpa_expanded_v", sdpa_expanded),
        ):
            for backend in (
                None,
                SDPBackend.FLASH_ATTENTION,
                SDPBackend.EFFICIENT_ATTENTION,
                SDPBackend.CUDNN_ATTENTION,
                SDPBackend.MATH,
            ):
                if name == "explicit" and backend is not None:
                    continue
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        if backend is None:
                            ms, mib = bench(fn, q, v)
                        else:
                            with sdpa_kernel([backend]):
                                ms, mib = bench(fn, q, v)
                        result = f"{ms:7.2f} ms fwd+bwd, peak {mib:7.0f} MiB"
                    except Exception as e:
                        result = f"refused: {str(e).splitlines()[0][:100]}"
                why = "; ".join(str(w.message).splitlines()[0][:120] for w in caught[:3])
                print(
                    f"tf32={tf32} {str(dtype)[6:]:8} {name:16} {str(backend).split('.')[-1]:20} {result}  {why}"
                )

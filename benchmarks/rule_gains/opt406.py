"""OPT406: hand-written causal attention vs `F.scaled_dot_product_attention`, forward+backward.

nanoGPT's attention core at small GPT size: scores, causal fill, softmax, product with v,
then the backward pass of all of it (the projections around it are the same in both variants
and left out).
"""

from __future__ import annotations

CODE = "OPT406"
WHAT = "causal attention forward+backward, batch 8, 6 heads of 64, T=256, float32, CPU"


def measure(repeats: int, device: str = "cpu") -> dict:
    import math
    import statistics

    import torch
    import torch.nn.functional as F

    from _timing import median_time

    torch.manual_seed(0)
    B, H, T, D = 8, 6, 256, 64
    q, k, v = (torch.randn(B, H, T, D, device=device, requires_grad=True) for _ in range(3))
    bias = torch.tril(torch.ones(T, T, device=device)).view(1, 1, T, T)
    grad = torch.randn(B, H, T, D, device=device)

    def written_out():
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        (att @ v).backward(grad)

    def fused():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(D))
        y.backward(grad)

    # Alternate short runs of each so that drifting machine load hits both alike.
    before, after = [], []
    for _ in range(max(1, repeats // 5)):
        before.append(median_time(written_out, 5, device, warmup=2))
        after.append(median_time(fused, 5, device, warmup=2))
    return {"before_s": statistics.median(before), "after_s": statistics.median(after)}

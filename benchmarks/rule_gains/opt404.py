"""OPT404: creating a causal mask and positions on every step vs once before the loop.

The step around them is a masked_fill of 8x128x128 attention scores plus a position
embedding lookup, so the figure is the creation cost relative to a small attention step.
"""

from __future__ import annotations

CODE = "OPT404"
WHAT = "torch.ones(128,128,bool)+torch.arange(128) per step vs hoisted, small attention step, CPU"


def measure(repeats: int, device: str = "cpu") -> dict:
    import statistics

    import torch

    from _timing import median_time

    torch.manual_seed(0)
    block = 128
    scores = torch.randn(8, block, block, device=device)
    embedding = torch.nn.Embedding(block, 64).to(device)

    def step(mask, positions):
        masked = scores.masked_fill(~mask.tril(), float("-inf"))
        return masked.softmax(-1).sum() + embedding(positions).sum()

    def created():
        positions = torch.arange(block, device=device)
        mask = torch.ones(block, block, dtype=torch.bool, device=device)
        step(mask, positions)

    positions_hoisted = torch.arange(block, device=device)
    ones_hoisted = torch.ones(block, block, dtype=torch.bool, device=device)

    def hoisted():
        step(ones_hoisted, positions_hoisted)

    # Alternate short runs of each so that drifting machine load hits both alike.
    before, after = [], []
    with torch.no_grad():
        for _ in range(max(1, repeats // 5)):
            before.append(median_time(created, 50, device, warmup=5))
            after.append(median_time(hoisted, 50, device, warmup=5))
    return {"before_s": statistics.median(before), "after_s": statistics.median(after)}

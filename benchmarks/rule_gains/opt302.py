"""OPT302: a transformer training step in float32 vs under bfloat16 autocast.

Four encoder layers at the width of the CPU-size GPT (256 wide, 4 heads, context 128,
batch 8): forward, loss and backward, as OPT302 wraps them (backward outside autocast).
"""

from __future__ import annotations

CODE = "OPT302"
WHAT = "4 transformer layers, width 256, T=128, batch 8, forward+backward, bf16 autocast, CPU"


def measure(repeats: int, device: str = "cpu") -> dict:
    import statistics

    import torch
    import torch.nn as nn

    from _timing import median_time

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).to(device)
    x = torch.randn(8, 128, 256, device=device)

    def float32():
        model(x).square().mean().backward()

    def autocast():
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            loss = model(x).square().mean()
        loss.backward()

    before, after = [], []
    for _ in range(max(1, repeats // 5)):
        before.append(median_time(float32, 5, device, warmup=2))
        after.append(median_time(autocast, 5, device, warmup=2))
    return {"before_s": statistics.median(before), "after_s": statistics.median(after)}

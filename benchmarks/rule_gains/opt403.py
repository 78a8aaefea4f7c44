"""OPT403: an evaluation forward under `torch.no_grad()` vs `torch.inference_mode()`.

The saving is per operator on the host (no version counters, no view tracking), so a small
model with many small operations shows it best.
"""

from __future__ import annotations

CODE = "OPT403"
WHAT = "eval forward of a 6-layer 64-wide MLP (LayerNorm, GELU), batch 1, CPU"


def measure(repeats: int, device: str = "cpu") -> dict:
    import statistics

    import torch

    from _timing import median_time

    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(device).eval()
    x = torch.randn(1, 64, device=device)

    def evaluate(mode):
        def run():
            with mode():
                model(x).argmax(1).sum().item()

        return run

    no_grad, inference = evaluate(torch.no_grad), evaluate(torch.inference_mode)
    # Alternate short runs of each so that drifting machine load hits both alike.
    before, after = [], []
    for _ in range(max(1, repeats // 5)):
        before.append(median_time(no_grad, 50, device, warmup=5))
        after.append(median_time(inference, 50, device, warmup=5))
    return {"before_s": statistics.median(before), "after_s": statistics.median(after)}

"""OPT501: one AdamW step over a model's parameters, default (foreach) vs fused=True."""

from __future__ import annotations

CODE = "OPT501"
WHAT = "AdamW.step() over an MLP with 8.4M parameters (8 tensors), CPU"


def measure(repeats: int, device: str = "cpu") -> dict:
    import torch

    from _timing import median_time

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).to(device)
    for p in model.parameters():
        p.grad = torch.randn_like(p)

    def stepper(**options):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **options)
        return optimizer.step

    before = median_time(stepper(), repeats, device)
    after = median_time(stepper(fused=True), repeats, device)
    return {"before_s": before, "after_s": after}

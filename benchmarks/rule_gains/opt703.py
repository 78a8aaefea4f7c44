"""OPT703: a small MLP's training step with `gc.collect()` on every step vs without.

A full collection walks every object the Python process holds; a script that has imported
torch holds a few hundred thousand, so the figure is the price of the call in a real
training script rather than in an empty interpreter. The object count is recorded too.
"""

from __future__ import annotations

CODE = "OPT703"
WHAT = "MLP training step (256-512-10, SGD, batch 64) + gc.collect() per step vs without, CPU, 1 thread"


def measure(repeats: int, device: str = "cpu") -> dict:
    import gc
    import statistics

    from _timing import median_time, one_thread

    step = training_step(device)

    def collected():
        step()
        gc.collect()

    before, after = [], []
    with one_thread():
        for _ in range(max(1, repeats // 5)):
            before.append(median_time(collected, 20, device, warmup=2))
            after.append(median_time(step, 20, device, warmup=2))
    return {
        "before_s": statistics.median(before),
        "after_s": statistics.median(after),
        "python_objects": len(gc.get_objects()),
    }


def training_step(device: str):
    """One SGD step of a 256-512-10 MLP on a fixed batch of 64."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=device)
    y = torch.randint(0, 10, (64,), device=device)

    def step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return step

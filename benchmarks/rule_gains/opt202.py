"""OPT202: a training step that accumulates `loss.item()` vs `loss.detach().float()`.

On CPU every kernel runs synchronously, so `.item()` waits for nothing: the figure shows only
the cost of the extra accumulation kernel against the Python addition. The gain of the rule
is the host-device wait it removes, which needs a CUDA device to appear.
"""

from __future__ import annotations

CODE = "OPT202"
WHAT = "MLP training step (SGD, batch 64) + running loss via .item() vs detach(), CPU"


def measure(repeats: int, device: str = "cpu") -> dict:
    import statistics

    import torch

    from _timing import median_time

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    totals = {"item": 0.0, "detach": 0.0}

    def step(accumulate):
        def run():
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            accumulate(loss)

        return run

    def with_item(loss):
        totals["item"] += loss.item()

    def detached(loss):
        totals["detach"] += loss.detach().float()

    synchronising, asynchronous = step(with_item), step(detached)
    # Alternate short runs of each so that drifting machine load hits both alike.
    before, after = [], []
    for _ in range(max(1, repeats // 5)):
        before.append(median_time(synchronising, 20, device, warmup=2))
        after.append(median_time(asynchronous, 20, device, warmup=2))
    return {"before_s": statistics.median(before), "after_s": statistics.median(after)}

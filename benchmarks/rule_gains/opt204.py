"""OPT204: a training step that counts correct predictions with `.item()` vs on the device.

`correct += (out.argmax(1) == y).sum().item()` against `correct += (out.argmax(1) ==
y).sum()`. On a CPU every kernel has run before the host goes on, so `.item()` waits for
nothing: the figure shows only what the device-side sum costs against a Python addition.
The rule's gain is the wait it removes, which needs a CUDA device to appear.
"""

from __future__ import annotations

CODE = "OPT204"
WHAT = "MLP training step (SGD, batch 64) + correct count via .item() vs on device, CPU, 1 thread"


def measure(repeats: int, device: str = "cpu") -> dict:
    import statistics

    import torch

    from _timing import median_time, one_thread

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    totals = {"item": 0, "device": 0}

    def step(count):
        def run():
            optimizer.zero_grad()
            out = model(x)
            torch.nn.functional.cross_entropy(out, y).backward()
            optimizer.step()
            count(out)

        return run

    def with_item(out):
        totals["item"] += (out.argmax(1) == y).sum().item()

    def on_device(out):
        totals["device"] += (out.argmax(1) == y).sum()

    synchronising, asynchronous = step(with_item), step(on_device)
    before, after = [], []
    with one_thread():
        for _ in range(max(1, repeats // 5)):
            before.append(median_time(synchronising, 20, device, warmup=2))
            after.append(median_time(asynchronous, 20, device, warmup=2))
    return {"before_s": statistics.median(before), "after_s": statistics.median(after)}

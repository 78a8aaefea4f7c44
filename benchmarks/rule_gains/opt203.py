"""OPT203: a batch of noise drawn on the host and moved (`torch.randn(...).to(device)`) vs
drawn on the device (`torch.randn(..., device=device)`), and a zero initial state the same
two ways.

On a CPU the two forms do the same work: `.to("cpu")` returns the tensor itself. The figure
is there to show that nothing is lost on a CPU target; the gain (one host allocation, fill
and blocking copy per call) needs a CUDA device.
"""

from __future__ import annotations

CODE = "OPT203"
WHAT = "randn(64,3,32,32) + zeros(2,64,256) created then .to(device) vs device=, CPU, 1 thread"


def measure(repeats: int, device: str = "cpu") -> dict:
    import statistics

    import torch

    from _timing import median_time, one_thread

    torch.manual_seed(0)

    def moved():
        torch.randn(64, 3, 32, 32).to(device)
        torch.zeros(2, 64, 256).to(device)

    def direct():
        torch.randn(64, 3, 32, 32, device=device)
        torch.zeros(2, 64, 256, device=device)

    before, after = [], []
    with one_thread():
        for _ in range(max(1, repeats // 5)):
            before.append(median_time(moved, 50, device, warmup=5))
            after.append(median_time(direct, 50, device, warmup=5))
    return {"before_s": statistics.median(before), "after_s": statistics.median(after)}

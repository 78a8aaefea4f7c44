"""OPT405: attention scores filled out of place vs in place (`masked_fill_`).

Both variants compute the scores `q @ k^T` first; the difference is the extra allocation
and full copy that the out-of-place fill makes.
"""

from __future__ import annotations

CODE = "OPT405"
WHAT = (
    "(q @ k^T).masked_fill(causal, -inf) vs masked_fill_, scores 2x4x128x128 float32, CPU, 1 thread"
)


def measure(repeats: int, device: str = "cpu") -> dict:
    import statistics

    import torch

    from _timing import median_time

    torch.manual_seed(0)
    q = torch.randn(2, 4, 128, 32, device=device)
    k = torch.randn(2, 4, 128, 32, device=device)
    causal = torch.ones(128, 128, dtype=torch.bool, device=device).tril().logical_not()

    def out_of_place():
        return (q @ k.transpose(-2, -1)).masked_fill(causal, float("-inf"))

    def in_place():
        return (q @ k.transpose(-2, -1)).masked_fill_(causal, float("-inf"))

    # One thread: on a shared 2-core machine, a parallel region waits for a descheduled
    # worker and the times jump by whole scheduler ticks (4 ms), hiding the difference.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # Alternate short runs of each so that drifting machine load hits both alike.
    before, after = [], []
    try:
        with torch.no_grad():
            for _ in range(max(1, repeats // 5)):
                before.append(median_time(out_of_place, 20, device, warmup=3))
                after.append(median_time(in_place, 20, device, warmup=3))
    finally:
        torch.set_num_threads(threads)
    return {"before_s": statistics.median(before), "after_s": statistics.median(after)}

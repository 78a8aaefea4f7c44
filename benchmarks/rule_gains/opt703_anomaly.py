"""OPT703: the same MLP training step under `torch.autograd.detect_anomaly()` vs without.

Anomaly mode records each forward op's traceback and checks every gradient that backward
produces for NaN; the figure is what that costs a small step, where per-op overheads weigh
most.
"""

from __future__ import annotations

CODE = "OPT703:anomaly"
WHAT = (
    "MLP training step (256-512-10, SGD, batch 64) under detect_anomaly() vs without, CPU, 1 thread"
)


def measure(repeats: int, device: str = "cpu") -> dict:
    import statistics
    import warnings

    import torch

    from _timing import median_time, one_thread
    from rule_gains.opt703 import training_step

    step = training_step(device)

    def watched():
        with torch.autograd.detect_anomaly():
            step()

    before, after = [], []
    with warnings.catch_warnings(), one_thread():
        # detect_anomaly warns on every entry that it is for debugging only.
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(max(1, repeats // 5)):
            before.append(median_time(watched, 20, device, warmup=2))
            after.append(median_time(step, 20, device, warmup=2))
    return {"before_s": statistics.median(before), "after_s": statistics.median(after)}

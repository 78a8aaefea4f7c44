"""Timing helpers shared by the benchmarks: medians, synchronising the device at the edges."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def median_time(
    function: Callable[[], object], repeats: int, device: str = "cpu", warmup: int = 3
) -> float:
    for _ in range(warmup):
        function()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        synchronize(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)

"""Timing helpers shared by the benchmarks: medians, synchronising the device at the edges."""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Callable, Iterator


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


@contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread for the block: on a shared 2-core machine, a parallel region waits
    for a descheduled worker and a step's time jumps by whole scheduler ticks (measured on
    the MLP step of rule_gains/opt703.py: 1.4 ms to 160 ms from one step to the next)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)

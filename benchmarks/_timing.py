"""Timing helpers shared by the benchmarks: medians, synchronising the device at the edges."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from contextlib import contextmanager
from typing import Callable, Iterator, List, Tuple


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


def interleaved(
    before: Callable[[], object], after: Callable[[], object], steps: int, warmup: int
) -> Tuple[List[float], List[float]]:
    """Step times of two settings, interleaved one by one, so that a noisy neighbour slows both
    alike."""
    for _ in range(warmup):
        before()
        after()
    times: Tuple[List[float], List[float]] = ([], [])
    for _ in range(steps):
        for samples, step in zip(times, (before, after)):
            start = time.perf_counter()
            step()
            samples.append(time.perf_counter() - start)
    return times


def paired_entry(what: str, before: List[float], after: List[float], threads: int) -> dict:
    """A results entry for two interleaved settings: medians, speedup, quartiles, the machine."""
    import torch

    first, second = statistics.median(before), statistics.median(after)
    low_high = [statistics.quantiles(samples, n=4)[::2] for samples in (before, after)]
    return {
        "what": what,
        "before_s": first,
        "after_s": second,
        "speedup": first / second,
        "steps": len(before),
        "quartiles_before_s": low_high[0],
        "quartiles_after_s": low_high[1],
        "machine": {
            "device": "cpu",
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": threads,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "date": datetime.date.today().isoformat(),
        },
    }

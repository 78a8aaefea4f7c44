"""OPT102: one epoch of a DataLoader over a per-item-work dataset, in-process vs workers.

The dataset's `__getitem__` runs a small augmentation pipeline (about 1.5 ms of
single-threaded CPU work per item, like a typical PIL/torchvision transform). "before"
iterates with `num_workers=0`; "after" with the options OPT102 emits, `num_workers=min(4,
os.cpu_count() or 1)` and `persistent_workers=True`, in steady state (the workers start in
the warm-up epoch; `first_epoch_after_s` is an epoch that includes their start). Only the
loader is timed: no training step competes with the workers for the cores. Epochs of the two
loaders alternate, so that load from other processes affects both alike.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, List, Sequence

CODE = "OPT102"
WHAT = "DataLoader epoch, 128 items x ~1.5 ms __getitem__, num_workers=0 vs min(4, cpu_count), CPU"

ITEMS = 128
BATCH = 16


class Augmenting:
    """A map-style dataset: blurs, flips, normalises and crops a 3x96x96 image per index.

    Defined at module level (not inside `measure`) so that spawned workers can unpickle it.
    """

    def __len__(self):
        return ITEMS

    def __getitem__(self, index):
        import torch

        generator = torch.Generator().manual_seed(index)
        image = torch.rand(3, 96, 96, generator=generator)
        for _ in range(6):
            image = torch.nn.functional.avg_pool2d(image[None], 3, stride=1, padding=1)[0]
            image = image.flip(-1) if torch.rand((), generator=generator) < 0.5 else image
            image = (image - image.mean()) / (image.std() + 1e-6)
        return image[:, 8:88, 8:88].contiguous(), index % 10


def epoch(loader) -> Callable[[], None]:
    def run() -> None:
        for _ in loader:
            pass

    return run


def alternating_medians(functions: Sequence[Callable[[], None]], repeats: int) -> List[float]:
    """Median time of each function, timed in turn so that they share the machine's load."""
    for function in functions:  # warm-up: starts persistent workers, fills caches
        function()
    samples: List[List[float]] = [[] for _ in functions]
    for _ in range(repeats):
        for index, function in enumerate(functions):
            start = time.perf_counter()
            function()
            samples[index].append(time.perf_counter() - start)
    return [statistics.median(s) for s in samples]


def measure(repeats: int, device: str = "cpu") -> dict:
    import os

    import torch
    from torch.utils.data import DataLoader

    # Workers run single-threaded (DataLoader sets it); so does the in-process baseline, as
    # per-item transforms on small images do not use intra-op threads anyway.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dataset = Augmenting()
        workers = min(4, os.cpu_count() or 1)
        in_process = DataLoader(dataset, batch_size=BATCH)
        loader = DataLoader(dataset, batch_size=BATCH, num_workers=workers, persistent_workers=True)
        start = time.perf_counter()
        epoch(loader)()
        first = time.perf_counter() - start
        before, after = alternating_medians(
            [epoch(in_process), epoch(loader)], max(3, repeats // 2)
        )
        del loader
    finally:
        torch.set_num_threads(threads)
    return {
        "before_s": before,
        "after_s": after,
        "first_epoch_after_s": first,
        "num_workers": workers,
        "load_average_1min": os.getloadavg()[0],
    }

"""OPT103: a short epoch of a DataLoader with workers, restarted each epoch vs persistent.

Same per-item-work dataset as the OPT102 benchmark, fewer items: a short epoch (a validation
pass, a small dataset) shows the start-up cost most. "before" uses `num_workers=2` as
written, so each epoch starts and stops its workers; "after" adds `persistent_workers=True`.
Workers start with the platform's default method, recorded as `start_method` (`fork` on
Linux before Python 3.14); `spawn_before_s`/`spawn_after_s` repeat the measurement with
`spawn` (macOS, Windows), whose workers import torch again each time they start.
"""

from __future__ import annotations

from rule_gains.opt102 import Augmenting, alternating_medians, epoch

CODE = "OPT103"
WHAT = "DataLoader epoch, 32 items x ~1.5 ms, num_workers=2, restarted vs persistent, CPU"

ITEMS = 32
BATCH = 8
WORKERS = 2


class Short(Augmenting):
    """At module level so that spawned workers can unpickle it."""

    def __len__(self):
        return ITEMS


def measure(repeats: int, device: str = "cpu") -> dict:
    import multiprocessing
    import os

    import torch
    from torch.utils.data import DataLoader

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dataset = Short()
        restarted = DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
        persistent = DataLoader(
            dataset, batch_size=BATCH, num_workers=WORKERS, persistent_workers=True
        )
        before, after = alternating_medians([epoch(restarted), epoch(persistent)], repeats)
        del persistent
        # The start method of macOS, Windows and (forkserver) Python 3.14 on Linux.
        spawned = dict(num_workers=WORKERS, multiprocessing_context="spawn")
        spawn_before, spawn_after = alternating_medians(
            [
                epoch(DataLoader(dataset, batch_size=BATCH, **spawned)),
                epoch(DataLoader(dataset, batch_size=BATCH, persistent_workers=True, **spawned)),
            ],
            max(3, repeats // 4),
        )
    finally:
        torch.set_num_threads(threads)
    return {
        "before_s": before,
        "after_s": after,
        "start_method": multiprocessing.get_start_method(),
        "spawn_before_s": spawn_before,
        "spawn_after_s": spawn_after,
        "load_average_1min": os.getloadavg()[0],
    }

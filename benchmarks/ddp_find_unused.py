"""OPT603's figure: a DistributedDataParallel training step with and without
`find_unused_parameters=True` for a model that uses every parameter, one process over gloo
(the search of the autograd graph happens on every rank, whatever the world size).

    python benchmarks/ddp_find_unused.py [--steps 200]

Model: 48 blocks of Linear(64, 64) + LayerNorm + GELU (192 parameter tensors, 206K
parameters): many small autograd nodes, where the traversal weighs most; batch 16, SGD, torch
on one thread. Steps of the two settings are interleaved one by one from the same weights.

Writes benchmarks/results/ddp-find-unused-cpu.json (key `OPT603`, read by the rule page's
Measured table) with machine, torch and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200, help="timed steps of each setting")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from _timing import one_thread

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)

    def build():
        blocks = []
        for _ in range(48):
            blocks += [torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU()]
        return torch.nn.Sequential(*blocks)

    base = build()
    x, y = torch.randn(16, 64), torch.randn(16, 64)

    def stepper(find_unused: bool):
        module = build()
        module.load_state_dict(base.state_dict())
        model = DistributedDataParallel(module, find_unused_parameters=find_unused)
        optimizer = torch.optim.SGD(
            model.parameters(), lr=1e-4
        )  # noqa: OPT501 (as written in both arms)

        def step():
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()

        return step

    times = {True: [], False: []}
    with one_thread(), warnings.catch_warnings():
        # torch warns, once, that the flag found nothing unused: the point of the rule.
        warnings.simplefilter("ignore")
        threads = torch.get_num_threads()
        steps = {flag: stepper(flag) for flag in (True, False)}
        for _ in range(10):
            for step in steps.values():
                step()
        for _ in range(args.steps):
            for flag, step in steps.items():
                start = time.perf_counter()
                step()
                times[flag].append(time.perf_counter() - start)
    dist.destroy_process_group()
    before, after = statistics.median(times[True]), statistics.median(times[False])
    quartiles = {flag: statistics.quantiles(times[flag], n=4) for flag in times}
    entry = {
        "what": (
            "DDP step (1 gloo process, 48 Linear(64, 64)+LayerNorm blocks, 192 tensors, "
            "batch 16, 1 thread) with vs without `find_unused_parameters=True`, every "
            "parameter used; median of steps interleaved one by one"
        ),
        "before_s": before,
        "after_s": after,
        "speedup": before / after,
        "steps": len(times[True]),
        "quartiles_before_s": [quartiles[True][0], quartiles[True][2]],
        "quartiles_after_s": [quartiles[False][0], quartiles[False][2]],
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
    output = Path(args.output or HERE / "results" / "ddp-find-unused-cpu.json")
    output.write_text(json.dumps({"results": {"OPT603": entry}}, indent=2, sort_keys=True) + "\n")
    print(
        f"with the flag {before * 1e3:.3f} ms  without {after * 1e3:.3f} ms  "
        f"x{before / after:.3f}  quartiles {[round(t * 1e3, 3) for t in quartiles[True]]} / "
        f"{[round(t * 1e3, 3) for t in quartiles[False]]}"
    )
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

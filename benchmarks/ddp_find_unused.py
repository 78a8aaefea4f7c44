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
import json
import sys
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

    from _timing import interleaved, one_thread, paired_entry

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
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)  # noqa: OPT501

        def step():
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()

        return step

    with one_thread(), warnings.catch_warnings():
        # torch warns, once, that the flag found nothing unused: the point of the rule.
        warnings.simplefilter("ignore")
        threads = torch.get_num_threads()
        with_flag, without = interleaved(stepper(True), stepper(False), args.steps, warmup=10)
    dist.destroy_process_group()
    entry = paired_entry(
        "DDP step (1 gloo process, 48 Linear(64, 64)+LayerNorm blocks, 192 tensors, "
        "batch 16, 1 thread) with vs without `find_unused_parameters=True`, every "
        "parameter used; median of steps interleaved one by one",
        with_flag,
        without,
        threads,
    )
    output = Path(args.output or HERE / "results" / "ddp-find-unused-cpu.json")
    output.write_text(json.dumps({"results": {"OPT603": entry}}, indent=2, sort_keys=True) + "\n")
    print(
        f"with the flag {entry['before_s'] * 1e3:.3f} ms  without {entry['after_s'] * 1e3:.3f} ms"
        f"  x{entry['speedup']:.3f}"
    )
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

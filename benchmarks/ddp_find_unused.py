"""OPT603's figures: a DistributedDataParallel training step with and without
`find_unused_parameters=True` for a model that uses every parameter, and (`--static-graph`)
with `find_unused_parameters=True` against `static_graph=True` for the same model plus a head
that forward never uses; one process over gloo (the search of the autograd graph happens on
every rank, whatever the world size).

    python benchmarks/ddp_find_unused.py [--steps 200] [--static-graph]

Model: 48 blocks of Linear(64, 64) + LayerNorm + GELU (192 parameter tensors, 206K
parameters): many small autograd nodes, where the traversal weighs most; batch 16, SGD, torch
on one thread. Steps of the two settings are interleaved one by one from the same weights.

Writes its entry into benchmarks/results/ddp-find-unused-cpu.json (key `OPT603`, or
`OPT603:static-graph`; read by the rule page's Measured table) with machine, torch and date,
keeping the other entry.
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
    parser.add_argument(
        "--static-graph",
        action="store_true",
        help="time `static_graph=True` against the flag, for a model with an unused head",
    )
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from _timing import interleaved, one_thread, paired_entry

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)

    class WithUnusedHead(torch.nn.Module):
        def __init__(self, body):
            super().__init__()
            self.body = body
            self.aux = torch.nn.Linear(64, 2)  # registered, never called by forward

        def forward(self, x):
            return self.body(x)

    def build():
        blocks = []
        for _ in range(48):
            blocks += [torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU()]
        body = torch.nn.Sequential(*blocks)
        return WithUnusedHead(body) if args.static_graph else body

    base = build()
    x, y = torch.randn(16, 64), torch.randn(16, 64)

    def stepper(searching: bool):
        module = build()
        module.load_state_dict(base.state_dict())
        if searching:
            model = DistributedDataParallel(module, find_unused_parameters=True)
        elif args.static_graph:
            model = DistributedDataParallel(module, static_graph=True)
        else:
            model = DistributedDataParallel(module)
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
    if args.static_graph:
        key, compared = "OPT603:static-graph", (
            "with `find_unused_parameters=True` vs `static_graph=True`, plus a Linear(64, 2) "
            "head forward never uses"
        )
    else:
        key, compared = "OPT603", (
            "with vs without `find_unused_parameters=True`, every parameter used"
        )
    entry = paired_entry(
        "DDP step (1 gloo process, 48 Linear(64, 64)+LayerNorm blocks, 192 tensors, "
        f"batch 16, 1 thread) {compared}; median of steps interleaved one by one",
        with_flag,
        without,
        threads,
    )
    output = Path(args.output or HERE / "results" / "ddp-find-unused-cpu.json")
    results = json.loads(output.read_text())["results"] if output.exists() else {}
    results[key] = entry
    output.write_text(json.dumps({"results": results}, indent=2, sort_keys=True) + "\n")
    print(
        f"with the flag {entry['before_s'] * 1e3:.3f} ms  "
        f"{'static graph' if args.static_graph else 'without'} {entry['after_s'] * 1e3:.3f} ms"
        f"  x{entry['speedup']:.3f}"
    )
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

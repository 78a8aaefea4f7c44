"""OPT605's figure: a DistributedDataParallel training step with and without
`gradient_as_bucket_view=True`, one process over gloo (the copies between gradients and
all-reduce buckets happen at any world size; the all-reduce of one rank is nearly free).

    python benchmarks/ddp_bucket_view.py [--steps 120]

Model: eight Linear(1024, 1024) layers (8.4M parameters, 33.6 MB of float32 gradients), batch
32, SGD, `zero_grad()` (gradients set to None), torch on one thread. The two settings are
timed step by step, interleaved (one step of each in turn), from the same weights.

Writes benchmarks/results/ddp-bucket-view-cpu.json (key `OPT605`, read by the rule page's
Measured table) with machine, torch and date.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=120, help="timed steps of each setting")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from _timing import interleaved, one_thread, paired_entry

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    base = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])
    x, y = torch.randn(32, 1024), torch.randn(32, 1024)

    def stepper(view: bool):
        model = DistributedDataParallel(
            torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]),
            gradient_as_bucket_view=view,
        )
        model.module.load_state_dict(base.state_dict())
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)  # noqa: OPT501

        def step():
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()

        return step

    with one_thread():
        threads = torch.get_num_threads()
        without, with_view = interleaved(stepper(False), stepper(True), args.steps, warmup=5)
    dist.destroy_process_group()
    entry = paired_entry(
        "DDP step (1 gloo process, 8.4M parameters, batch 32, 1 thread) without vs with "
        "`gradient_as_bucket_view=True`; median of steps interleaved one by one",
        without,
        with_view,
        threads,
    )
    output = Path(args.output or HERE / "results" / "ddp-bucket-view-cpu.json")
    output.write_text(json.dumps({"results": {"OPT605": entry}}, indent=2, sort_keys=True) + "\n")
    print(
        f"without {entry['before_s'] * 1e3:.2f} ms  with {entry['after_s'] * 1e3:.2f} ms  "
        f"x{entry['speedup']:.2f}"
    )
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""OPT503's figures: a hand-written per-parameter update loop against its `torch._foreach_*`
equivalent (and, with --compile, the same loop under `torch.compile`).

    python benchmarks/foreach_update.py [--device cpu] [--repeats 200] [--compile]

Two updates, each over two models' parameters (gradients set once, random):
- `momentum`: SGD with momentum written by hand, `buf.mul_(m).add_(g); p.add_(buf, alpha=-lr)`
  per parameter, against `_foreach_mul_`, `_foreach_add_` and `_foreach_add_` over the lists;
- `sgld`: the update of reference_models/sgld_mnist's SGLD optimizer,
  `p.add_(g, alpha=-lr); p.add_(torch.randn_like(p), alpha=std)` per parameter, against
  `_foreach_add_` for both additions (the noise still drawn by one `randn_like` per parameter:
  there is no `_foreach_` random draw).
Models: `small`, an MLP of eight Linear(64, 64) layers (16 tensors, 33K parameters: launch and
dispatch overhead dominates), and `sgld`, the MLP of sgld_mnist at CPU size (784-1200-1200-10:
6 tensors, 2.4M parameters: memory traffic dominates).

Writes benchmarks/results/foreach-update-<device>.json (keys `OPT503:<update>-<model>`, read by
the rule page's Measured table) and a .md table beside it, with machine, torch and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

LR = 1e-3
MOMENTUM = 0.9
NOISE_STD = math.sqrt(2 * LR / 4096)


def models(torch):
    small = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
    sgld = torch.nn.Sequential(
        torch.nn.Linear(784, 1200), torch.nn.Linear(1200, 1200), torch.nn.Linear(1200, 10)
    )
    return {"small": small, "sgld": sgld}


def updates(torch, params):
    grads = [torch.randn_like(p) for p in params]
    bufs = [torch.zeros_like(p) for p in params]

    def momentum_loop():
        for p, g, buf in zip(params, grads, bufs):
            buf.mul_(MOMENTUM).add_(g)
            p.add_(buf, alpha=-LR)

    def momentum_foreach():
        torch._foreach_mul_(bufs, MOMENTUM)
        torch._foreach_add_(bufs, grads)
        torch._foreach_add_(params, bufs, alpha=-LR)

    def sgld_loop():
        for p, g in zip(params, grads):
            p.add_(g, alpha=-LR)
            p.add_(torch.randn_like(p), alpha=NOISE_STD)

    def sgld_foreach():
        torch._foreach_add_(params, grads, alpha=-LR)
        torch._foreach_add_(params, [torch.randn_like(p) for p in params], alpha=NOISE_STD)

    return {
        "momentum": (momentum_loop, momentum_foreach),
        "sgld": (sgld_loop, sgld_foreach),
    }


def machine(torch, device: str) -> dict:
    info = {
        "device": device,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }
    if device.startswith("cuda"):
        info["device_name"] = torch.cuda.get_device_name(0)
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--compile", action="store_true", help="also time the compiled loop")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    import torch

    from _timing import median_time, one_thread

    torch.manual_seed(0)
    results = {}
    rows = []
    with torch.no_grad(), one_thread():
        info = machine(torch, args.device)
        for model_name, model in models(torch).items():
            params = [p.detach().to(args.device) for p in model.parameters()]
            count = sum(p.numel() for p in params)
            for update_name, (loop, foreach) in updates(torch, params).items():
                before = median_time(loop, args.repeats, args.device, warmup=10)
                after = median_time(foreach, args.repeats, args.device, warmup=10)
                entry = {
                    "what": (
                        f"`{update_name}` update by hand: per-parameter loop vs `torch._foreach_*`"
                        f", {len(params)} tensors ({count:,} parameters), {args.device.upper()}"
                    ),
                    "before_s": before,
                    "after_s": after,
                    "speedup": before / after,
                    "machine": info,
                }
                if args.compile:
                    compiled = torch.compile(loop)
                    start = time.perf_counter()
                    compiled()
                    entry["compile_s"] = time.perf_counter() - start
                    entry["compiled_s"] = median_time(
                        compiled, args.repeats, args.device, warmup=10
                    )
                results[f"OPT503:{update_name}-{model_name}"] = entry
                rows.append((update_name, model_name, len(params), count, entry))
                line = (
                    f"{update_name:8} {model_name:6} loop {before * 1e6:9.1f} us  "
                    f"foreach {after * 1e6:9.1f} us  x{before / after:.2f}"
                )
                if "compiled_s" in entry:
                    line += f"  compiled {entry['compiled_s'] * 1e6:9.1f} us"
                print(line, flush=True)
    output = Path(args.output or HERE / "results" / f"foreach-update-{args.device}.json")
    output.write_text(json.dumps({"results": results}, indent=2, sort_keys=True) + "\n")
    output.with_suffix(".md").write_text(render(rows, info, args), encoding="utf-8")
    print(f"wrote {output} and {output.with_suffix('.md').name}")
    return 0


def render(rows, info: dict, args) -> str:
    lines = [
        "# Per-parameter update loop vs `torch._foreach_*` (OPT503)",
        "",
        f"Written by `python benchmarks/foreach_update.py --device {args.device} --repeats "
        f"{args.repeats}{' --compile' if args.compile else ''}`: median of {args.repeats} calls "
        f"after 10 warm-up calls, torch on one thread, under `torch.no_grad()`.",
        "",
        f"Machine: {info['cpu_count']}-core {info['cpu']}, torch {info['torch']}, "
        f"Python {info['python']}, {info['date']}.",
        "",
    ]
    compiled = any("compiled_s" in row[4] for row in rows)
    header = "| Update | Model | Tensors | Parameters | Loop | `_foreach_` | Speedup |"
    rule = "|---|---|---|---|---|---|---|"
    if compiled:
        header += " Compiled loop | Compile time |"
        rule += "---|---|"
    lines += [header, rule]
    for update, model, tensors, count, entry in rows:
        line = (
            f"| {update} | {model} | {tensors} | {count:,} | {entry['before_s'] * 1e6:.1f} us "
            f"| {entry['after_s'] * 1e6:.1f} us | x{entry['speedup']:.2f} |"
        )
        if compiled:
            line += f" {entry['compiled_s'] * 1e6:.1f} us | {entry['compile_s']:.1f} s |"
        lines.append(line)
    if compiled:
        lines += [
            "",
            "Compile time: the first call of the compiled loop, rows in the order above; later "
            "rows reuse what inductor compiled and cached for earlier ones.",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

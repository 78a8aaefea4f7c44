"""OPT104 on CPU: a DataLoader over in-memory tensors, per-item against batched fetching.

    python benchmarks/batched_loader.py [--quick]

For each case, one epoch through the loader as written (`batch_size=B, shuffle=True`: one
`ds[i]` per item, then `default_collate` stacks them) and through OPT104's rewrite
(`batch_size=None, sampler=BatchSampler(RandomSampler(ds), B, drop_last=...)`: one `ds[list]`
per batch), in the main process (the only setting a TensorDataset gets from the other loader
rules), torch on one thread. The reference workloads' own dataset classes (sgld_mnist,
char_transformer) are measured as written and as OPT104 rewrites them (the class gets a
branch of `__getitem__` for a list of indices). Both loaders are checked to give identical batches first. Each
time is the median of several epochs, taken alternately. Writes
benchmarks/results/batched-loader-cpu.json and .md with the machine, torch version and date.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _timing import one_thread  # noqa: E402

RESULTS = HERE / "results"
# name, what it mirrors, tensors (shape, dtype) per dataset, batch size, drop_last
CASES = [
    (
        "sudoku-cpu",
        "sudoku_diffusion at --size cpu: 2,048 grids of 81 cells, batch 32",
        [((2048, 81), "int64")],
        32,
        True,
    ),
    (
        "sudoku-gpu-shape",
        "sudoku_diffusion's GPU shape: 200,000 grids, batch 256 (first 100,000 here)",
        [((100000, 81), "int64")],
        256,
        True,
    ),
    (
        "mnist-batch-100",
        "MNIST-shaped tensors in memory (60,000 x 784 float32 + labels), batch 100",
        [((60000, 784), "float32"), ((60000,), "int64")],
        100,
        False,
    ),
    (
        "features-batch-64",
        "tabular features (20,000 x 16 float32 + targets), batch 64",
        [((20000, 16), "float32"), ((20000, 1), "float32")],
        64,
        False,
    ),
    (
        "features-batch-1024",
        "tabular features (200,000 x 32 float32 + targets), batch 1024",
        [((200000, 32), "float32"), ((200000, 1), "float32")],
        1024,
        False,
    ),
]


# Dataset classes of the reference workloads, as written and as OPT104 rewrites them (a
# branch of `__getitem__` for a list of indices): name, what, workload, class, its
# arguments (built by `arguments(torch)`), batch size.
CLASS_CASES = [
    (
        "sgld-cpu",
        "sgld_mnist's SyntheticDigits at --size cpu: 4,096 images, normalised and flattened, "
        "batch 100",
        "sgld_mnist",
        "SyntheticDigits",
        lambda torch: (4096,),
        100,
    ),
    (
        "sgld-gpu-shape",
        "sgld_mnist's SyntheticDigits at --size gpu: 60,000 images, batch 100",
        "sgld_mnist",
        "SyntheticDigits",
        lambda torch: (60000,),
        100,
    ),
    (
        "char-cpu",
        "char_transformer's CharWindows at --size cpu: 90,000 tokens, windows of 65, batch 16",
        "char_transformer",
        "CharWindows",
        lambda torch: (torch.randint(0, 40, (90000,)), 64),
        16,
    ),
    (
        "char-gpu-shape",
        "char_transformer's CharWindows at --size gpu: 1,800,000 tokens, windows of 257, "
        "batch 256",
        "char_transformer",
        "CharWindows",
        lambda torch: (torch.randint(0, 40, (1800000,)), 256),
        256,
    ),
]


def workload_classes(workload: str, class_name: str):
    """The class from the workload's train.py, and from OPT104's rewrite of it."""
    import importlib.util

    sys.path.insert(0, str(HERE.parent))
    from optimizer_codemod import rewrite

    source = (HERE.parent / "reference_models" / workload / "train.py").read_text()
    rewritten = rewrite(source, select=["OPT104"]).source
    assert "isinstance(index, list)" in rewritten, f"OPT104 left {workload} alone"
    found = []
    for tag, text in (("as_written", source), ("rewritten", rewritten)):
        spec = importlib.util.spec_from_loader(f"{workload}_{tag}", loader=None)
        module = importlib.util.module_from_spec(spec)
        exec(compile(text, f"{workload}/train.py ({tag})", "exec"), module.__dict__)
        found.append(getattr(module, class_name))
    return found


def machine() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": 1,
    }


def loaders(tensors, batch: int, drop_last: bool):
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

    data = TensorDataset(*tensors)
    per_item = DataLoader(data, batch_size=batch, shuffle=True, drop_last=drop_last)
    batched = DataLoader(
        data,
        batch_size=None,
        sampler=BatchSampler(RandomSampler(data), batch, drop_last=drop_last),
    )
    return per_item, batched, torch


def epoch(loader) -> float:
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def same_batches(per_item, batched, torch) -> bool:
    torch.manual_seed(0)
    first = [b for b in per_item]
    torch.manual_seed(0)
    second = [b for b in batched]
    return len(first) == len(second) and all(
        all(torch.equal(p, q) for p, q in zip(a, b)) for a, b in zip(first, second)
    )


def measure(case, repeats: int) -> dict:
    import torch

    name, what, specs, batch, drop_last = case
    generator = torch.Generator().manual_seed(0)
    tensors = []
    for shape, dtype in specs:
        if dtype == "int64":
            tensors.append(torch.randint(0, 10, shape, generator=generator))
        else:
            tensors.append(torch.randn(shape, generator=generator))
    per_item, batched, torch = loaders(tensors, batch, drop_last)
    result = timed(per_item, batched, torch, repeats)
    result.update(name=name, what=what, batch_size=batch, drop_last=drop_last)
    result["tensors"] = [{"shape": list(shape), "dtype": dtype} for shape, dtype in specs]
    return result


def measure_class(case, repeats: int) -> dict:
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    name, what, workload, class_name, arguments, batch = case
    as_written, rewritten = workload_classes(workload, class_name)
    torch.manual_seed(0)
    args = arguments(torch)
    data, batched_data = as_written(*args), rewritten(*args)
    per_item = DataLoader(data, batch_size=batch, shuffle=True)
    batched = DataLoader(
        batched_data,
        batch_size=None,
        sampler=BatchSampler(RandomSampler(batched_data), batch, drop_last=False),
    )
    result = timed(per_item, batched, torch, repeats)
    result.update(name=name, what=what, batch_size=batch, drop_last=False)
    result["dataset_class"] = f"reference_models/{workload}/train.py: {class_name}"
    return result


def timed(per_item, batched, torch, repeats: int) -> dict:
    """Identical batches first, then alternating epochs of each loader."""
    identical = same_batches(per_item, batched, torch)
    times = {"per_item": [], "batched": []}
    epoch(per_item), epoch(batched)  # warm-up
    for _ in range(repeats):
        times["per_item"].append(epoch(per_item))
        times["batched"].append(epoch(batched))
    before = statistics.median(times["per_item"])
    after = statistics.median(times["batched"])
    return {
        "batches_per_epoch": len(per_item),
        "identical_batches": identical,
        "per_item_epoch_s": before,
        "batched_epoch_s": after,
        "per_item_per_batch_us": before / len(per_item) * 1e6,
        "batched_per_batch_us": after / len(per_item) * 1e6,
        "speedup": before / after,
        "epoch_times_s": times,
    }


def write(results: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "batched-loader-cpu.json").write_text(json.dumps(results, indent=1) + "\n")
    m = results["machine"]
    lines = [
        "# OPT104: per-item against batched fetching from in-memory tensors (CPU)",
        "",
        f"{results['date']}, torch {m['torch']}, {m['cpu']} ({m['cpu_count']} cores), "
        f"{m['platform']}, Python {m['python']}, torch on 1 thread. "
        f"Command: `{results['command']}`.",
        "",
        "One epoch through `DataLoader(ds, batch_size=B, shuffle=True)` (per item: `ds[i]` for "
        "each index, then `default_collate`) against OPT104's rewrite `DataLoader(ds, "
        "batch_size=None, sampler=BatchSampler(RandomSampler(ds), B, drop_last=...))` (one "
        "`ds[list]` per batch), main process; the reference workloads' dataset classes as "
        "written against OPT104's rewrite of the class and loader; median of "
        f"{results['repeats']} epochs each, taken alternately. Every case was first checked "
        "to give identical batches from the same seed.",
        "",
        "| case | batches | per item: epoch | batched: epoch | per batch (per item / batched) "
        "| speedup | identical |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in results["cases"]:
        lines.append(
            f"| {case['what']} | {case['batches_per_epoch']} "
            f"| {case['per_item_epoch_s'] * 1e3:.1f} ms | {case['batched_epoch_s'] * 1e3:.1f} ms "
            f"| {case['per_item_per_batch_us']:.0f} / {case['batched_per_batch_us']:.0f} us "
            f"| x{case['speedup']:.1f} | {'yes' if case['identical_batches'] else 'NO'} |"
        )
    lines.append("")
    (RESULTS / "batched-loader-cpu.md").write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first two cases, 3 epochs")
    args = parser.parse_args()
    repeats = 3 if args.quick else 5
    cases = [(measure, c) for c in (CASES[:2] if args.quick else CASES)]
    cases += [(measure_class, c) for c in (CLASS_CASES[:1] if args.quick else CLASS_CASES)]
    measured = []
    with one_thread():
        for run, case in cases:
            result = run(case, repeats)
            print(
                f"{result['name']}: {result['per_item_epoch_s'] * 1e3:.1f} ms -> "
                f"{result['batched_epoch_s'] * 1e3:.1f} ms (x{result['speedup']:.1f}), "
                f"identical={result['identical_batches']}",
                flush=True,
            )
            measured.append(result)
    results = {
        "tool": "benchmarks/batched_loader.py",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": "cpu",
        "machine": machine(),
        "command": "python benchmarks/batched_loader.py" + (" --quick" if args.quick else ""),
        "repeats": repeats,
        "cases": measured,
    }
    write(results)
    return 0 if all(c["identical_batches"] for c in measured) else 1


if __name__ == "__main__":
    sys.exit(main())

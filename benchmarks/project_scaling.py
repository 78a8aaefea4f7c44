"""How a run over a project grows with its number of modules: generated projects, timed.

    python benchmarks/project_scaling.py [--sizes 50 100 200 400]

Each project has `n` model modules, each importing the previous one's block class (a chain
of bases n deep) and a helper module, a data module whose function returns a DataLoader, and
a train.py that imports every module and calls each module's training function with that
loader. Every module has fixes (a fused optimizer; the loader is pinned in data.py, after
which the copies in every module can be non-blocking), so the run builds the project index,
rewrites every file, builds the index again from the rewrites and looks again at the files
whose facts changed (runner._settle_project): the whole cost of a project run.

Prints, per size, the wall time of `optcodemod apply --check --no-cache` (a subprocess, as a
user runs it; start-up included) and its peak memory, and the ratio of each time to the
previous size's: about 2 for twice the modules means linear.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Sequence, Tuple

HELPERS = """import torch


def seed():
    torch.manual_seed(0)
"""
DATA = """import torch
from torch.utils.data import DataLoader, TensorDataset
from helpers import seed


def get_loader(batch_size):
    seed()
    dataset = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    return DataLoader(dataset, batch_size=batch_size, shuffle=True)
"""
MODULE = """import torch
from torch import nn
{base_import}from helpers import seed


class Block{i}({base}):
    def __init__(self):
        super().__init__()
        self.l{i} = nn.Linear(8, 8)

    def forward(self, x):
        return self.l{i}(x).relu()


def train_block{i}(model, loader, device):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x = x.to(device)
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
TRAIN = """import torch
from data import get_loader
{imports}
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def main():
    loader = get_loader(16)
    for x, y in loader:
        print(x.to(device).sum(), y.to(device).sum())
{calls}

if __name__ == "__main__":
    main()
"""


def write_project(folder: Path, modules: int) -> None:
    folder.mkdir(parents=True)
    (folder / "helpers.py").write_text(HELPERS)
    (folder / "data.py").write_text(DATA)
    for i in range(modules):
        previous = f"from m{i - 1} import Block{i - 1}\n" if i else ""
        base = f"Block{i - 1}" if i else "nn.Module"
        (folder / f"m{i}.py").write_text(MODULE.format(i=i, base_import=previous, base=base))
    imports = "".join(f"from m{i} import Block{i}, train_block{i}\n" for i in range(modules))
    calls = "".join(
        f"    train_block{i}(Block{i}().to(device), loader, device)\n" for i in range(modules)
    )
    (folder / "train.py").write_text(TRAIN.format(imports=imports, calls=calls))


def time_run(folder: Path) -> Tuple[float, int]:
    """Seconds and peak memory (KiB) of one `apply --check --no-cache` over `folder`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    command = [sys.executable, "-m", "optimizer_codemod", "apply", "--check", "--no-cache", "-q"]
    result = subprocess.run([*command, str(folder)], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode not in (0, 1):
        raise SystemExit(f"apply failed on {folder}:\n{result.stderr}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return seconds, max(peak, before)


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200, 400])
    args = parser.parse_args(list(argv) or None)
    rows: List[Tuple[int, float, int]] = []
    with tempfile.TemporaryDirectory(prefix="optcodemod-projects-") as root:
        for size in args.sizes:
            folder = Path(root) / f"project_{size}"
            write_project(folder, size)
            seconds, peak = time_run(folder)
            rows.append((size, seconds, peak))
    print(f"{'modules':>8} {'seconds':>8} {'peak MiB':>9} {'x previous':>11}")
    for index, (size, seconds, peak) in enumerate(rows):
        ratio = f"{seconds / rows[index - 1][1]:.2f}" if index else "-"
        print(f"{size:>8} {seconds:>8.2f} {peak / 1024:>9.0f} {ratio:>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Generated training scripts of any length, to measure how the tool's cost grows with size.

    python benchmarks/generate_training_file.py --lines 2000 > big_train.py
    python benchmarks/generate_training_file.py --lines 50000 --loops 1 > huge_train.py

Two shapes, both made of repeated blocks that reuse the same local names (as real files do:
every function has its `loader`, `x`, `loss`), since name reuse is what made file-wide
name-following analyses superlinear:

- `training_loops(n)`: n functions that each build a TensorDataset and a DataLoader, move
  batches with `.to(device)` and run a training step (the shape where every rule has work);
- `one_loop_file(lines)`: one training loop, the rest model code (nn.Module classes and
  helpers): a large library-like file with a single training loop in it.

Both print valid Python that LibCST can round-trip; `generate(lines, loops)` picks the block
count that comes closest to `lines`.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

HEADER = '''"""Generated training script (benchmarks/generate_training_file.py)."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

'''

FOOTER = """

if __name__ == "__main__":
    main()
"""


def _training_function(index: int) -> str:
    return f"""
def train_{index}(model, optimizer, device):
    data = torch.randn(256, 16)
    target = torch.randn(256, 1)
    dataset = TensorDataset(data, target)
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    losses = []
    for x, y in loader:
        x = x.to(device)
        y = y.to(device)
        optimizer.zero_grad(set_to_none=False)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
"""


def _model_block(index: int) -> str:
    return f"""
class Block{index}(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, width)
        self.gate = nn.Linear(width, width)

    def forward(self, x):
        h = self.norm(x)
        h = self.proj(h) * torch.sigmoid(self.gate(h))
        return x + F.dropout(h, p=0.1, training=self.training)


def helper_{index}(x, scale=1.0):
    y = x * scale
    y = y - y.mean(dim=-1, keepdim=True)
    return y / (y.std(dim=-1, keepdim=True) + 1e-5)
"""


def _main(functions: List[str]) -> str:
    calls = "".join(f"    {name}(model, optimizer, device)\n" for name in functions)
    return f"""

def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Linear(16, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
{calls}"""


def training_loops(count: int) -> str:
    """A script of `count` training functions and a `main` that calls each."""
    body = "".join(_training_function(i) for i in range(count))
    return HEADER + body + _main([f"train_{i}" for i in range(count)]) + FOOTER


def one_loop_file(blocks: int) -> str:
    """One training function after `blocks` blocks of model code."""
    body = "".join(_model_block(i) for i in range(blocks)) + _training_function(0)
    return HEADER + body + _main(["train_0"]) + FOOTER


def _lines(text: str) -> int:
    return text.count("\n")


def generate(lines: int, loops: Optional[int] = None) -> str:
    """A script of about `lines` lines: all training loops, or `loops` of them and model code."""
    if loops is None:
        per_block = _lines(training_loops(2)) - _lines(training_loops(1))
        count = max(1, round((lines - _lines(training_loops(0))) / per_block))
        return training_loops(count)
    per_block = _lines(one_loop_file(2)) - _lines(one_loop_file(1))
    blocks = max(0, round((lines - _lines(one_loop_file(0))) / per_block))
    text = one_loop_file(blocks)
    for index in range(1, loops):
        text = text.replace(FOOTER, _training_function(index) + FOOTER)
    return text


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=200, help="about this many lines")
    parser.add_argument(
        "--loops", type=int, default=None, help="training loops (default: the whole file)"
    )
    args = parser.parse_args(argv)
    sys.stdout.write(generate(args.lines, args.loops))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

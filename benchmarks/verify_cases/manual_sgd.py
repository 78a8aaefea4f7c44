"""A small classifier trained with hand-written SGD updates: no torch.optim at all.

A mutant-benchmark case for `optcodemod verify` (benchmarks/verify_mutants.py): a step is one
training iteration (one backward) even when no optimizer is called. The data (two interleaved
spirals) is generated from a seed, nothing is downloaded; an iteration takes a few milliseconds
on a CPU.

    python manual_sgd.py --steps 100
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

SAMPLES, BATCH, HIDDEN = 2048, 64, 128


def spirals(count, generator):
    """Two interleaved spirals in the plane, labels 0 and 1, with a little noise."""
    labels = torch.randint(0, 2, (count,), generator=generator)
    radius = torch.rand(count, generator=generator)
    angle = 2 * math.pi * radius + math.pi * labels.float()
    points = radius[:, None] * torch.stack((angle.cos(), angle.sin()), dim=1)
    return points + 0.02 * torch.randn(count, 2, generator=generator), labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000, help="stop after this many iterations")
    args = parser.parse_args()

    torch.set_num_threads(1)  # a model this small is fastest on one thread
    torch.manual_seed(0)
    points, labels = spirals(SAMPLES, torch.Generator().manual_seed(1))
    model = nn.Sequential(
        nn.Linear(2, HIDDEN),
        nn.Tanh(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.Tanh(),
        nn.Linear(HIDDEN, 2),
    )
    lr = 0.3

    for step in range(1, args.steps + 1):
        batch = torch.randint(0, SAMPLES, (BATCH,))
        loss = F.cross_entropy(model(points[batch]), labels[batch])
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-lr)
                p.grad = None
        if step % 100 == 0:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

"""Masked (absorbing-state) discrete diffusion over Sudoku grids, with a small transformer denoiser.

A solved grid is a sequence of 81 cells. The forward process blanks each cell independently with
probability t; the denoiser, a bidirectional transformer, predicts the digits of the blanked
cells, and the loss is their cross-entropy weighted by 1/t (the continuous-time masked diffusion
bound, as in MDLM). Sampling starts from a puzzle's givens and unmasks the remaining cells a few
at a time.

The grids are generated: digit, row, column, band and stack permutations (and transposition) of
one base solution, seeded; nothing is downloaded. The whole dataset is moved to the device once
and batches are drawn from it there.

    python train.py --size cpu --steps 50
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import BatchSampler, RandomSampler, DataLoader, TensorDataset

torch.set_float32_matmul_precision("high")

CELLS = 81
DIGITS = 9
BLANK = DIGITS  # classes 0-8 are the digits 1-9; class 9 is the absorbing (blank) state
SIZES = {
    "cpu": {"grids": 2048, "width": 96, "layers": 3, "heads": 4, "batch_size": 32, "lr": 3e-3},
    "gpu": {"grids": 200000, "width": 384, "layers": 8, "heads": 6, "batch_size": 256, "lr": 1e-3},
}


def generate_grids(count, seed=0):
    """`count` valid solved Sudoku grids (count x 81, digits 1-9), seeded."""
    generator = torch.Generator().manual_seed(seed)
    r = torch.arange(9)
    base = (3 * (r[:, None] % 3) + r[:, None] // 3 + r[None, :]) % 9  # a valid solution, 0-8

    def lines():
        # Permuting the three bands, and the three lines inside each band, keeps a grid valid.
        bands = torch.rand(count, 3, generator=generator).argsort(dim=1)
        inside = torch.rand(count, 3, 3, generator=generator).argsort(dim=2)
        return (bands[:, :, None] * 3 + inside).view(count, 9)

    rows, columns = lines(), lines()
    grids = base[rows[:, :, None], columns[:, None, :]]
    transpose = torch.rand(count, generator=generator) < 0.5
    grids = torch.where(transpose[:, None, None], grids.transpose(1, 2), grids)
    relabel = torch.rand(count, 9, generator=generator).argsort(dim=1)
    grids = relabel.gather(1, grids.reshape(count, CELLS)) + 1
    return grids


def is_solved(grids):
    """Whether each grid (batch x 81, digits 1-9) has every digit once per row, column, box."""
    g = grids.view(-1, 9, 9)
    boxes = g.view(-1, 3, 3, 3, 3).transpose(2, 3).reshape(-1, 9, 9)
    ok = torch.ones(g.size(0), dtype=torch.bool, device=grids.device)
    for groups in (g, g.transpose(1, 2), boxes):
        ok &= (groups.sort(dim=-1).values == torch.arange(1, 10, device=grids.device)).all((1, 2))
    return ok


class SelfAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        y = (
            F.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(q.size(-1)))
            .transpose(1, 2)
            .reshape(B, T, C)
        )
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Denoiser(nn.Module):
    """Predicts the digit of every cell from a partly blanked grid."""

    def __init__(self, width, layers, heads):
        super().__init__()
        self.tokens = nn.Embedding(DIGITS + 1, width)
        # Each cell learns where it is through its row, column and box, the units of the rules.
        self.rows = nn.Embedding(9, width)
        self.columns = nn.Embedding(9, width)
        self.boxes = nn.Embedding(9, width)
        cell = torch.arange(CELLS)
        self.register_buffer("row", cell // 9)
        self.register_buffer("column", cell % 9)
        self.register_buffer("box", (cell // 27) * 3 + (cell % 9) // 3)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, DIGITS)

    def forward(self, cells):
        x = self.tokens(cells) + self.rows(self.row) + self.columns(self.column)
        x = x + self.boxes(self.box)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def compute_loss(model, grids, levels):
    """Masked-diffusion loss of a batch of solved grids, averaged over `levels` noise levels.

    At each level every grid gets its own t, stratified over the batch (one t in each of
    `batch` equal slices of (0, 1), shifted by one shared uniform) so that a batch always covers
    the whole range of noise.
    """
    batch = grids.size(0)
    x0 = grids - 1  # digits 1-9 are the classes 0-8
    total = 0.0
    for level in range(levels):
        slices = torch.arange(batch, device=grids.device)
        u = (slices + torch.rand(1, device=grids.device)) / batch
        t = 1e-3 + (1 - 1e-3) * u[torch.randperm(batch, device=grids.device)]
        blank = torch.rand(batch, CELLS, device=grids.device) < t[:, None]
        noisy = x0.clone()
        noisy[blank] = BLANK
        target = x0
        logits = model(noisy)
        nll = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
        # Only blanked cells carry a loss: the others are given to the model as they are.
        weighted = (nll / t[:, None]).masked_fill(~blank, 0.0)
        total = total + weighted.mean()
    return total / levels


@torch.no_grad()
def solve(model, puzzles, steps=9):
    """Fill the blank cells (0) of `puzzles` (batch x 81) in `steps` rounds, the most confident
    predictions first; returns completed grids with digits 1-9."""
    model.eval()
    cells = torch.where(puzzles == 0, BLANK, puzzles - 1)
    for step in range(steps):
        blank = cells == BLANK
        remaining = blank.sum(dim=1, keepdim=True)
        if not remaining.any():
            break
        probs = F.softmax(model(cells), dim=-1)
        confidence, digit = probs.max(dim=-1)
        confidence = confidence.masked_fill(~blank, -1.0)
        reveal = remaining.div(steps - step, rounding_mode="floor").clamp(min=1)
        rank = confidence.argsort(dim=1, descending=True).argsort(dim=1)
        cells = torch.where(blank & (rank < reveal), digit, cells)
    model.train()
    return cells + 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps")
    args = parser.parse_args()
    size = SIZES[args.size]

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    grids = generate_grids(size["grids"]).to(device)
    loader = DataLoader(
        TensorDataset(grids),
        batch_size=None,
        sampler=BatchSampler(
            RandomSampler(TensorDataset(grids)), size["batch_size"], drop_last=True
        ),
    )
    model = Denoiser(size["width"], size["layers"], size["heads"]).to(device)
    if device.type == "cuda":
        model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=size["lr"], weight_decay=0.01, fused=True)

    step = 0
    for epoch in range(args.epochs):
        running = 0.0
        for (batch,) in loader:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = compute_loss(model, batch, levels=2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running += loss.detach().float()
            step += 1
            if args.steps and step >= args.steps:
                return
        # Puzzles from held-out grids: 30 givens each.
        test = generate_grids(256, seed=epoch + 1).to(device)
        givens = torch.rand(test.shape, device=device).argsort(dim=1) < 30
        solved = is_solved(solve(model, torch.where(givens, test, 0)))
        print(
            f"epoch {epoch}: loss {float(running) / len(loader):.4f}, "
            f"solved {solved.float().mean().item():.1%}"
        )


if __name__ == "__main__":
    main()

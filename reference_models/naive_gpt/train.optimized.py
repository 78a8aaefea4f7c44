"""A GPT language model written plainly: float32, hand-written attention, a plain DataLoader.

The hand-optimized twin of this script is ../expert_gpt/train.py: the same model, data and
hyperparameters as an expert writes them. `optcodemod bench` measures the rewritten version of
this script against it.

GPT-2-small shape at `--size gpu` (12 layers, 12 heads, width 768, context 1024, vocabulary
50304); tiny at `--size cpu`. The tokens are generated (a random order-1 Markov chain),
nothing is downloaded.

    python train.py --size cpu --steps 50
"""

# bench: twin ../expert_gpt/train.py

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

torch.set_float32_matmul_precision("high")

SIZES = {
    "cpu": {
        "vocab": 2048,
        "context": 128,
        "width": 256,
        "layers": 4,
        "heads": 4,
        "batch_size": 8,
    },
    "gpu": {
        "vocab": 50304,
        "context": 1024,
        "width": 768,
        "layers": 12,
        "heads": 12,
        "batch_size": 8,
    },
}


def generate_tokens(count, vocab, seed=0):
    """A random order-1 Markov chain: each token has 8 likely successors."""
    generator = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, vocab, (vocab, 8), generator=generator)
    choices = torch.randint(0, 8, (count,), generator=generator)
    table, picks = successors.tolist(), choices.tolist()
    tokens = [0]
    for i in range(1, count):
        tokens.append(table[tokens[-1]][picks[i]])
    return torch.tensor(tokens, dtype=torch.long)


class TokenWindows(Dataset):
    def __init__(self, tokens, context):
        self.tokens = tokens
        self.context = context

    def __len__(self):
        return (len(self.tokens) - 1) // self.context

    def __getitem__(self, index):
        start = index * self.context
        chunk = self.tokens[start : start + self.context + 1]
        return chunk[:-1], chunk[1:]


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        mask = torch.tril(torch.ones(context, context)).view(1, 1, context, context)
        self.register_buffer("mask", mask)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        y = (
            F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=1.0 / math.sqrt(k.size(-1))
            )
            .transpose(1, 2)
            .contiguous()
            .view(B, T, C)
        )
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, context)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width)
        )

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, context, width, layers, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList([Block(width, heads, context) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets):
        positions = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps")
    args = parser.parse_args()
    size = SIZES[args.size]

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    windows = 200 * size["batch_size"]
    tokens = generate_tokens(windows * size["context"] + 1, size["vocab"])
    loader = DataLoader(
        TokenWindows(tokens, size["context"]), batch_size=size["batch_size"], shuffle=True
    )
    model = GPT(size["vocab"], size["context"], size["width"], size["layers"], size["heads"])
    model = model.to(device)
    if device.type == "cuda":
        model.compile()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True
    )

    step = 0
    for epoch in range(args.epochs):
        running_loss = 0.0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(x, y)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            running_loss += loss.detach().float()
            step += 1
            if args.steps and step >= args.steps:
                return
            if step % 50 == 0:
                print(f"step {step}: loss {float(running_loss) / 50:.4f}")
                running_loss = 0.0


if __name__ == "__main__":
    main()

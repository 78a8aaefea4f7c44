"""A character-level transformer language model on generated text.

Written the way it was first written: float32 without TF32, AdamW without its fused kernel, a
plain DataLoader over random windows of the text, and the validation and checkpoint block after
the epoch loop. The text is generated from a small grammar, nothing is downloaded.

    python train.py --size cpu --steps 50
"""

import argparse
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, DataLoader, Dataset

torch.set_float32_matmul_precision("high")

SIZES = {
    "cpu": {
        "chars": 100000,
        "context": 64,
        "width": 256,
        "layers": 2,
        "heads": 4,
        "batch_size": 16,
    },
    "gpu": {
        "chars": 2000000,
        "context": 256,
        "width": 384,
        "layers": 6,
        "heads": 6,
        "batch_size": 256,
    },
}

SUBJECTS = ["the cat", "a dog", "my friend", "the old man", "every child", "the robot"]
VERBS = ["sees", "likes", "follows", "paints", "finds", "remembers"]
OBJECTS = ["the moon", "a red ball", "the river", "an open door", "the last train", "music"]


def generate_text(chars, seed=0):
    rng = random.Random(seed)
    sentences, length = [], 0
    while length < chars:
        sentence = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}. "
        if rng.random() < 0.3:
            sentence = sentence.capitalize()
        sentences.append(sentence)
        length += len(sentence)
    return "".join(sentences)[:chars]


class CharWindows(Dataset):
    def __init__(self, tokens, context):
        self.tokens = tokens
        self.context = context

    def __len__(self):
        return len(self.tokens) - self.context - 1

    def __getitem__(self, index):
        if isinstance(index, list):  # a batch of indices, from the BatchSampler
            starts = torch.tensor(index)[:, None]
            chunk = self.tokens[starts + torch.arange(self.context + 1)]
            return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()
        chunk = self.tokens[index : index + self.context + 1]
        return chunk[:-1], chunk[1:]


class CharTransformer(nn.Module):
    def __init__(self, vocab, context, width, layers, heads):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.1, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, idx):
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.embed(idx) + self.position(positions)
        x = self.blocks(x, mask=self.mask[: idx.shape[1], : idx.shape[1]])
        return self.head(self.norm(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps")
    parser.add_argument("--checkpoint", default=None)
    args = parser.parse_args()
    size = SIZES[args.size]

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    text = generate_text(size["chars"])
    vocab = sorted(set(text))
    tokens = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    split = int(0.9 * len(tokens))
    train_set = CharWindows(tokens[:split], size["context"])
    val_set = CharWindows(tokens[split:], size["context"])
    loader = DataLoader(
        train_set,
        batch_size=None,
        sampler=BatchSampler(RandomSampler(train_set), size["batch_size"], drop_last=False),
    )
    model = CharTransformer(
        len(vocab), size["context"], size["width"], size["layers"], size["heads"]
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)

    step = 0
    for epoch in range(args.epochs):
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if args.steps and step >= args.steps:
                break
        print(f"epoch {epoch}: loss {loss.item():.4f}")

    model.eval()
    val_loader = DataLoader(
        val_set,
        batch_size=None,
        sampler=BatchSampler(SequentialSampler(val_set), size["batch_size"], drop_last=False),
    )
    total, batches = 0.0, 0
    with torch.inference_mode():
        for x, y in val_loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = model(x)
            total += F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1)).item()
            batches += 1
            if batches >= 10:
                break
    print(f"validation loss {total / batches:.4f}")
    if args.checkpoint:
        torch.save(model.state_dict(), args.checkpoint)


if __name__ == "__main__":
    main()

"""Vision-BDH: the Baby Dragon Hatchling core (Kosowski et al., 2025) as an image classifier.

A ViT's body with BDH's recurrent core, after the Vision-BDH experiments on CIFAR-10: a
convolutional patch embedding turns a 32x32 image into a sequence of patches, then one BDH layer
is applied `depth` times with the same weights. The layer lifts each patch into a wide space of
sparse, non-negative "neurons" (ReLU), attends with queries equal to keys and rotary position
phases, gates the attended signal multiplicatively with the neurons, and decodes back. Written
for reproducibility first: seeded, deterministic cuDNN, a DataLoader with two workers.

The images are generated (oriented colour gratings whose angle, frequency and palette depend on
the class, plus noise), nothing is downloaded.

    python train.py --size cpu --steps 50
"""

import argparse
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

SIZES = {
    "cpu": {
        "samples": 1024,
        "width": 128,
        "heads": 4,
        "multiplier": 4,
        "depth": 2,
        "patch": 4,
        "batch_size": 32,
    },
    "gpu": {
        "samples": 50000,
        "width": 192,
        "heads": 4,
        "multiplier": 16,
        "depth": 6,
        "patch": 4,
        "batch_size": 256,
    },
}


def set_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


class SyntheticCIFAR(Dataset):
    """32x32 colour images, stored as bytes like CIFAR: a grating whose orientation and
    frequency depend on the class (the colours, phase and a little of the angle do not), plus
    noise; training items are random 32x32 crops of the image padded by 4 pixels."""

    def __init__(self, samples, seed=0, train=True):
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 10, (samples,), generator=generator)
        angle = self.labels * (math.pi / 10) + 0.1 * torch.randn(samples, generator=generator)
        frequency = (2 + self.labels % 3).float() * (2 * math.pi / 32)
        phase = 2 * math.pi * torch.rand(samples, generator=generator)
        ys, xs = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
        along = xs * angle.cos().view(-1, 1, 1) + ys * angle.sin().view(-1, 1, 1)
        wave = 0.5 + 0.5 * torch.sin(frequency.view(-1, 1, 1) * along + phase.view(-1, 1, 1))
        low, high = torch.rand(2, samples, 3, 1, 1, generator=generator)
        images = low + (high - low) * wave.unsqueeze(1)
        images = images + 0.3 * torch.randn(samples, 3, 32, 32, generator=generator)
        images = F.pad(images.clamp(0, 1), (4, 4, 4, 4), mode="reflect")
        self.images = (images * 255).to(torch.uint8)
        self.train = train

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        top, left = torch.randint(0, 9, (2,)).tolist() if self.train else (4, 4)
        image = self.images[index, :, top : top + 32, left : left + 32].float() / 255
        return (image - 0.5) / 0.25, self.labels[index]


class RotaryAttention(nn.Module):
    """Softmax attention with queries equal to keys, rotated by their position's phase."""

    def __init__(self, dim, theta=2**16):
        super().__init__()
        self.register_buffer("freqs", 1.0 / theta ** (torch.arange(0, dim, 2).float() / dim))
        self.scale = 1.0 / math.sqrt(dim)

    def rotate(self, x, cos, sin):
        even, odd = x[..., ::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    def forward(self, q, v):
        T = q.size(-2)
        positions = torch.arange(T, device=q.device, dtype=self.freqs.dtype)
        phases = positions[:, None] * self.freqs[None, :]
        cos, sin = phases.cos(), phases.sin()
        qr = self.rotate(q, cos, sin)
        kr = qr
        return F.scaled_dot_product_attention(qr, kr, v, scale=self.scale)


class VisionBDH(nn.Module):
    def __init__(self, width, heads, multiplier, depth, patch, classes=10, dropout=0.1):
        super().__init__()
        self.depth = depth
        neurons = multiplier * width // heads
        self.patch_embed = nn.Conv2d(3, width, kernel_size=patch, stride=patch)
        # One layer, shared by every step of the recurrence.
        self.encoder = nn.Parameter(0.02 * torch.randn(heads, width, neurons))
        self.encoder_v = nn.Parameter(0.02 * torch.randn(heads, width, neurons))
        self.decoder = nn.Parameter(0.02 * torch.randn(heads * neurons, width))
        self.attn = RotaryAttention(neurons)
        self.ln = nn.LayerNorm(width, elementwise_affine=False, bias=False)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(width, classes)

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = self.ln(x).unsqueeze(1)  # B x 1 x T x D: one stream shared by the heads
        B, _, T, D = x.shape
        for _ in range(self.depth):
            x_sparse = F.relu(x @ self.encoder)  # B x heads x T x neurons
            y = self.ln(self.attn(x_sparse, x))
            y_sparse = F.relu(y @ self.encoder_v)
            xy = self.drop(x_sparse * y_sparse)  # multiplicative gating
            y = xy.transpose(1, 2).reshape(B, 1, T, -1) @ self.decoder
            x = self.ln(x + self.ln(y))
        return self.head(self.ln(x.squeeze(1).mean(dim=1)))


def evaluate(model, loader, device):
    model.eval()
    correct = total = 0
    with torch.inference_mode():
        for images, labels in loader:
            images, labels = images.to(device, non_blocking=True), labels.to(
                device, non_blocking=True
            )
            correct += (model(images).argmax(dim=1) == labels).sum().item()
            total += labels.size(0)
    model.train()
    return correct / total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps")
    args = parser.parse_args()
    size = SIZES[args.size]

    set_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_set = SyntheticCIFAR(size["samples"], seed=0)
    test_set = SyntheticCIFAR(size["samples"] // 5, seed=1, train=False)
    train_loader = DataLoader(
        train_set,
        batch_size=size["batch_size"],
        shuffle=True,
        num_workers=2,
        drop_last=True,
        pin_memory=torch.cuda.is_available(),
    )
    test_loader = DataLoader(
        test_set, batch_size=size["batch_size"], num_workers=2, pin_memory=torch.cuda.is_available()
    )
    model = VisionBDH(
        size["width"], size["heads"], size["multiplier"], size["depth"], size["patch"]
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05, fused=True)

    step = 0
    for epoch in range(args.epochs):
        for images, labels in train_loader:
            images, labels = images.to(device, non_blocking=True), labels.to(
                device, non_blocking=True
            )
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if args.steps and step >= args.steps:
                return
            if step % 50 == 0:
                print(f"step {step}: loss {loss.item():.4f}")
        print(f"epoch {epoch}: test accuracy {evaluate(model, test_loader, device):.1%}")


if __name__ == "__main__":
    main()

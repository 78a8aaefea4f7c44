"""A small image classifier trained the way it is often first written: correct, but slow.

`optcodemod apply examples/train.py --diff` shows what the tool changes and why.
Runs on CPU or CUDA; data is generated, nothing is downloaded.

    python examples/train.py --epochs 1 --steps 20
"""

import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    """CIFAR-shaped images whose label depends on their colour balance."""

    def __init__(self, size, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randn(size, 3, 32, 32, generator=generator)
        self.labels = self.images.mean(dim=(2, 3)).argmax(dim=1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.images[index], self.labels[index]


class SmallConvNet(nn.Module):
    def __init__(self, classes=3):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.head = nn.Linear(64 * 8 * 8, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--losses", help="write the per-step losses to this JSON file")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = SmallConvNet().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.cuda.amp.GradScaler(enabled=device.type == "cuda")
    loader = DataLoader(SyntheticImages(2048), batch_size=args.batch_size, shuffle=True)

    losses = []
    for epoch in range(args.epochs):
        for images, labels in loader:
            images = images.to(device)
            labels = labels.to(device)
            optimizer.zero_grad(set_to_none=False)
            with torch.cuda.amp.autocast(enabled=device.type == "cuda"):
                loss = F.cross_entropy(model(images), labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            losses.append(loss.item())
            if args.steps and len(losses) >= args.steps:
                break
        print(f"epoch {epoch}: last loss {losses[-1]:.4f}")
    if args.losses:
        with open(args.losses, "w") as handle:
            json.dump(losses, handle)


if __name__ == "__main__":
    main()

"""A small ResNet with BatchNorm on CIFAR-shaped images, trained with mixed precision on CUDA.

Written the way it was first written: the `torch.cuda.amp` API of its time (enabled only on
CUDA), `zero_grad(set_to_none=False)`, SGD with momentum, a plain DataLoader over a Dataset that
crops and flips each image, no cuDNN autotuner. The images are generated, nothing is downloaded.

    python train.py --size cpu --steps 50
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

torch.backends.cudnn.benchmark = True

SIZES = {
    "cpu": {"samples": 2048, "widths": (16, 32, 64), "blocks": 1, "batch_size": 64},
    "gpu": {"samples": 50000, "widths": (64, 128, 256), "blocks": 2, "batch_size": 256},
}


class SyntheticCIFAR(Dataset):
    """32x32 colour images: a class-dependent colour gradient plus noise; padded random crops."""

    def __init__(self, samples, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 10, (samples,), generator=generator)
        colours = torch.rand(10, 3, 1, 1, generator=generator)
        ramp = torch.linspace(0, 1, 32).view(1, 1, 32)
        base = colours[self.labels] * ramp.unsqueeze(0)
        images = base + 0.2 * torch.randn(samples, 3, 32, 32, generator=generator)
        self.images = F.pad(images, (4, 4, 4, 4), mode="reflect")
        self.mean = torch.tensor([0.4914, 0.4822, 0.4465]).view(3, 1, 1)
        self.std = torch.tensor([0.2470, 0.2435, 0.2616]).view(3, 1, 1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        top, left = torch.randint(0, 9, (2,)).tolist()
        image = self.images[index, :, top : top + 32, left : left + 32]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        return (image - self.mean) / self.std, self.labels[index]


class BasicBlock(nn.Module):
    def __init__(self, inputs, outputs, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, widths, blocks, classes=10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        layers, inputs = [], widths[0]
        for stage, width in enumerate(widths):
            for block in range(blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(inputs, width, stride))
                inputs = width
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(inputs, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps")
    args = parser.parse_args()
    size = SIZES[args.size]

    torch.manual_seed(0)
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda" if use_cuda else "cpu")
    loader = DataLoader(
        SyntheticCIFAR(size["samples"]), batch_size=size["batch_size"], shuffle=True
    )
    model = ResNet(size["widths"], size["blocks"]).to(device)
    if device.type == "cuda":
        model.compile()
    model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, fused=True
    )
    scaler = torch.amp.GradScaler("cuda", enabled=use_cuda)

    step = 0
    for epoch in range(args.epochs):
        model.train()
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad(set_to_none=False)
            with torch.amp.autocast("cuda", enabled=use_cuda, dtype=torch.float16):
                loss = F.cross_entropy(model(images), labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            step += 1
            if args.steps and step >= args.steps:
                return
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

"""Bayesian MLP on MNIST-shaped digits, sampled with stochastic gradient Langevin dynamics.

Written the way it was first written: a hand-rolled SGLD optimizer (no fused kernel exists for
it), small batches, a DataLoader over a per-item Dataset, no pinned memory. The data is
generated (class prototypes plus noise, 28x28), nothing is downloaded.

    python train.py --size cpu --steps 50
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import BatchSampler, RandomSampler, DataLoader, Dataset

torch.set_float32_matmul_precision("high")

SIZES = {
    "cpu": {"samples": 4096, "hidden": 1200, "batch_size": 100},
    "gpu": {"samples": 60000, "hidden": 1200, "batch_size": 100},
}


class SyntheticDigits(Dataset):
    """28x28 grey images: one random prototype per class, plus pixel noise."""

    def __init__(self, samples, seed=0):
        generator = torch.Generator().manual_seed(seed)
        prototypes = torch.rand(10, 28, 28, generator=generator)
        self.labels = torch.randint(0, 10, (samples,), generator=generator)
        noise = 0.3 * torch.randn(samples, 28, 28, generator=generator)
        self.images = (prototypes[self.labels] + noise).clamp(0, 1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        if isinstance(index, list):  # a batch of indices, from the BatchSampler
            image = (self.images[index] - 0.1307) / 0.3081
            return image.reshape(len(index), -1), self.labels[index]
        image = (self.images[index] - 0.1307) / 0.3081
        return image.flatten(), self.labels[index]


class MLP(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return F.log_softmax(self.fc3(x), dim=1)


class SGLD(torch.optim.Optimizer):
    """Welling & Teh (2011): a gradient step plus Gaussian noise of variance 2 * lr * temperature."""

    def __init__(self, params, lr=1e-3, temperature=1.0, weight_decay=0.0):
        defaults = dict(lr=lr, temperature=temperature, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            noise_std = math.sqrt(2 * group["lr"] * group["temperature"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if group["weight_decay"]:
                    grad = grad.add(p, alpha=group["weight_decay"])
                p.add_(grad, alpha=-group["lr"])
                p.add_(torch.randn_like(p), alpha=noise_std)
        return loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps")
    args = parser.parse_args()
    size = SIZES[args.size]

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_set = SyntheticDigits(size["samples"])
    loader = DataLoader(
        train_set,
        batch_size=None,
        sampler=BatchSampler(RandomSampler(train_set), size["batch_size"], drop_last=False),
    )
    model = MLP(size["hidden"]).to(device)
    if device.type == "cuda":
        model.compile()
    # Temperature 1/N: the posterior of the whole training set, sampled one batch at a time.
    optimizer = SGLD(model.parameters(), lr=1e-3, temperature=1.0 / len(train_set))

    step = 0
    for epoch in range(args.epochs):
        model.train()
        for data, target in loader:
            data = data.to(device)
            target = target.to(device)
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            step += 1
            if args.steps and step >= args.steps:
                return
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

"""A small GAN on a 2-D mixture of eight Gaussians: two optimizers, chaotic like real GANs.

A mutant-benchmark case for `optcodemod verify` (benchmarks/verify_mutants.py). Each iteration
trains the discriminator (`d_loss.backward(); opt_d.step()`) and then the generator
(`g_loss.backward(); opt_g.step()`), and updates an exponential moving average of the
generator's weights, as GAN code usually keeps one for sampling. The data is generated from a
seed, nothing is downloaded; an iteration takes a few milliseconds on a CPU.

The dynamics amplify last-bit differences: fused Adam alone (a correct rewrite, different
rounding) leaves the losses bit-identical for about 20 iterations, then 1e-6 apart at 40, 1e-2
at 60 and wholly different from 80 on (2-core AMD EPYC, torch 2.13.0+cpu).

    python gan.py --steps 160
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

LATENT, HIDDEN, BATCH, MODES = 8, 64, 128, 8


def sample_real(count, generator):
    """Points from eight Gaussians (std 0.05) on the unit circle."""
    mode = torch.randint(0, MODES, (count,), generator=generator)
    angle = mode.float() * (2 * math.pi / MODES)
    centres = torch.stack((angle.cos(), angle.sin()), dim=1)
    return centres + 0.05 * torch.randn(count, 2, generator=generator)


def mlp(inputs, outputs):
    return nn.Sequential(
        nn.Linear(inputs, HIDDEN),
        nn.LeakyReLU(0.2),
        nn.Linear(HIDDEN, HIDDEN),
        nn.LeakyReLU(0.2),
        nn.Linear(HIDDEN, outputs),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000, help="stop after this many iterations")
    args = parser.parse_args()

    torch.set_num_threads(1)  # a model this small is fastest on one thread
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1)
    generator = mlp(LATENT, 2)
    discriminator = mlp(2, 1)
    ema = [p.detach().clone() for p in generator.parameters()]
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=2e-2, betas=(0.0, 0.99))
    opt_g = torch.optim.Adam(generator.parameters(), lr=2e-2, betas=(0.0, 0.99))
    ones, zeros = torch.ones(BATCH, 1), torch.zeros(BATCH, 1)

    for step in range(1, args.steps + 1):
        real = sample_real(BATCH, data)
        fake = generator(torch.randn(BATCH, LATENT))

        d_loss = F.binary_cross_entropy_with_logits(
            discriminator(real), ones
        ) + F.binary_cross_entropy_with_logits(discriminator(fake.detach()), zeros)
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()

        g_loss = F.binary_cross_entropy_with_logits(discriminator(fake), ones)
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()

        with torch.no_grad():
            for average, p in zip(ema, generator.parameters()):
                average.mul_(0.99).add_(p, alpha=0.01)

        if step % 100 == 0:
            print(f"step {step}: d_loss {d_loss.item():.4f}, g_loss {g_loss.item():.4f}")


if __name__ == "__main__":
    main()

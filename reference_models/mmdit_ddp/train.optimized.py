"""A multimodal diffusion transformer (MMDiT) trained with DistributedDataParallel, as first written.

Image-patch tokens and caption tokens have their own projections, norms and MLPs and meet in one
joint attention per block (the MMDiT of Stable Diffusion 3); the timestep and the pooled caption
condition every block through adaLN modulation (shift, scale, gate). The loss is rectified-flow
matching: predict the velocity from noise to image at a random time t.

How its author first wrote the training loop:
- gradient accumulation over 4 micro-batches without `model.no_sync()`: DDP all-reduces the
  gradients after every micro-batch's backward instead of once per optimizer step;
- the deprecated `torch.cuda.amp.autocast()` (float16) and `torch.cuda.amp.GradScaler()`, the
  scaler enabled only on CUDA, so the script also runs on a CPU (where autocast does nothing);
- a synchronous `torch.save` checkpoint on rank 0 every `--checkpoint-every` steps, which the
  other ranks wait for at their next all-reduce.

Launched with torchrun (gloo on CPU; on CUDA nccl, or gloo when there are fewer GPUs than
processes, as on a one-GPU machine), the process group set up from torchrun's environment:

    torchrun --nproc-per-node 2 train.py --size cpu --steps 20

Run as a plain `python train.py --size cpu`, it trains as a world of one: a process group of one
process on an in-process store, so the DDP code path is the same either way.

The data is generated from a seed, nothing is downloaded: images are per-class patterns at one
of four brightness levels plus noise, and each caption names the class and the brightness among
random filler words, so the model learns to denoise from the caption and the loss falls.
32x32 RGB images, width 128 and 2 blocks at `--size cpu`; 32x32x4 latents, patch 2, width 768 and
12 blocks at `--size gpu`. Checkpoints go to `--checkpoint-dir`, by default a temporary folder
removed when the script ends.
"""

# bench: torchrun --nproc-per-node 2

import argparse
import math
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
import contextlib

SIZES = {
    "cpu": {
        "image": 32,
        "channels": 3,
        "patch": 4,
        "caption": 8,
        "vocab": 64,
        "classes": 10,
        "width": 128,
        "layers": 2,
        "heads": 4,
        "micro_batch": 8,
        "pairs": 2048,
        "checkpoint_every": 5,
    },
    "gpu": {
        "image": 32,
        "channels": 4,
        "patch": 2,
        "caption": 32,
        "vocab": 4096,
        "classes": 100,
        "width": 768,
        "layers": 12,
        "heads": 12,
        "micro_batch": 16,
        "pairs": 8192,
        "checkpoint_every": 10,
    },
}
ACCUMULATION = 4
BOS, FIRST_WORD = 1, 2


def generate_pairs(size, seed=0):
    """Images from per-class smooth patterns; captions name class and brightness among filler."""
    generator = torch.Generator().manual_seed(seed)
    count, res, channels = size["pairs"], size["image"], size["channels"]
    classes, vocab, length = size["classes"], size["vocab"], size["caption"]
    coarse = torch.randn(classes, channels, 4, 4, generator=generator)
    templates = F.interpolate(coarse, size=(res, res), mode="bilinear", align_corners=False)
    labels = torch.randint(0, classes, (count,), generator=generator)
    levels = torch.randint(0, 4, (count,), generator=generator)
    brightness = (0.5 + 0.25 * levels.float()).view(-1, 1, 1, 1)
    noise = torch.randn(count, channels, res, res, generator=generator)
    images = templates[labels] * brightness + 0.1 * noise
    first_filler = FIRST_WORD + classes + 4
    captions = torch.randint(first_filler, vocab, (count, length), generator=generator)
    captions[:, 0] = BOS
    captions[:, 1] = FIRST_WORD + labels
    captions[:, 2] = FIRST_WORD + classes + levels
    return images, captions


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class TimestepEmbedding(nn.Module):
    def __init__(self, width, frequencies=128):
        super().__init__()
        self.frequencies = frequencies
        self.mlp = nn.Sequential(nn.Linear(frequencies, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, t):
        half = self.frequencies // 2
        exponents = torch.arange(half, dtype=torch.float32, device=t.device) / half
        angles = 1000 * t[:, None].float() * torch.exp(-math.log(10000) * exponents)[None]
        return self.mlp(torch.cat([angles.cos(), angles.sin()], dim=-1))


class Stream(nn.Module):
    """One modality's half of a joint block: its own modulation, norms, qkv, projection, MLP.

    In the last block the caption stream only feeds the attention (`pre_only`): its output is
    never read, and parameters without gradients would stall DDP's reduction.
    """

    def __init__(self, width, pre_only=False):
        super().__init__()
        self.pre_only = pre_only
        self.modulation = nn.Linear(width, (2 if pre_only else 6) * width)
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(width, 3 * width)
        if not pre_only:
            self.proj = nn.Linear(width, width)
            self.norm2 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
            self.mlp = nn.Sequential(
                nn.Linear(width, 4 * width),
                nn.GELU(approximate="tanh"),
                nn.Linear(4 * width, width),
            )

    def pre_attention(self, x, c):
        modulation = self.modulation(F.silu(c)).chunk(2 if self.pre_only else 6, dim=-1)
        return self.qkv(modulate(self.norm1(x), modulation[0], modulation[1])), modulation

    def post_attention(self, x, attended, modulation):
        _, _, gate_attn, shift_mlp, scale_mlp, gate_mlp = modulation
        x = x + gate_attn.unsqueeze(1) * self.proj(attended)
        mlp = self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x + gate_mlp.unsqueeze(1) * mlp


class JointBlock(nn.Module):
    def __init__(self, width, heads, last=False):
        super().__init__()
        self.heads = heads
        self.image = Stream(width)
        self.text = Stream(width, pre_only=last)

    def forward(self, x, context, c):
        qkv_x, mod_x = self.image.pre_attention(x, c)
        qkv_c, mod_c = self.text.pre_attention(context, c)
        qkv = torch.cat([qkv_c, qkv_x], dim=1)  # one sequence: caption tokens, then image tokens
        B, T, C3 = qkv.shape
        C = C3 // 3
        q, k, v = qkv.view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        length = context.size(1)
        x = self.image.post_attention(x, attended[:, length:], mod_x)
        if not self.text.pre_only:
            context = self.text.post_attention(context, attended[:, :length], mod_c)
        return x, context


class MMDiT(nn.Module):
    def __init__(self, image, channels, patch, caption, vocab, width, layers, heads):
        super().__init__()
        self.patch = patch
        patch_dim = channels * patch * patch
        self.patch_embed = nn.Linear(patch_dim, width)
        self.image_pos = nn.Parameter(torch.randn(1, (image // patch) ** 2, width) * 0.02)
        self.token_embed = nn.Embedding(vocab, width)
        self.caption_pos = nn.Parameter(torch.randn(1, caption, width) * 0.02)
        self.time_embed = TimestepEmbedding(width)
        self.caption_pool = nn.Sequential(
            nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width)
        )
        self.blocks = nn.ModuleList(
            [JointBlock(width, heads, last=i == layers - 1) for i in range(layers)]
        )
        self.final_modulation = nn.Linear(width, 2 * width)
        self.final_norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.final = nn.Linear(width, patch_dim)
        # adaLN-Zero: every block starts as the identity, the output as zero.
        for block in self.blocks:
            for stream in (block.image, block.text):
                nn.init.zeros_(stream.modulation.weight)
                nn.init.zeros_(stream.modulation.bias)
        for layer in (self.final_modulation, self.final):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, noisy, t, captions):
        B, C, H, W = noisy.shape
        p = self.patch
        patches = noisy.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5)
        x = self.patch_embed(patches.reshape(B, (H // p) * (W // p), C * p * p)) + self.image_pos
        context = self.token_embed(captions) + self.caption_pos
        c = self.time_embed(t) + self.caption_pool(context.mean(dim=1))
        for block in self.blocks:
            x, context = block(x, context, c)
        shift, scale = self.final_modulation(F.silu(c)).chunk(2, dim=-1)
        out = self.final(modulate(self.final_norm(x), shift, scale))
        out = out.view(B, H // p, W // p, C, p, p).permute(0, 3, 1, 4, 2, 5)
        return out.reshape(B, C, H, W)


def flow_matching_loss(model, images, captions):
    """Rectified flow: from noise (t=0) to image (t=1); the model predicts the velocity."""
    noise = torch.randn_like(images)
    t = torch.sigmoid(torch.randn(images.size(0), device=images.device))  # logit-normal times
    mix = t.view(-1, 1, 1, 1)
    noisy = (1 - mix) * noise + mix * images
    return F.mse_loss(model(noisy, t, captions), images - noise)


def setup_distributed():
    """Under torchrun: the process group from its environment. Alone: a group of one."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        # nccl needs a GPU per process; more processes than GPUs share them over gloo.
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        backend = "nccl" if torch.cuda.device_count() >= local_world else "gloo"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size(), device


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="default: by size")
    parser.add_argument("--checkpoint-dir", help="default: a temporary folder, removed at the end")
    args = parser.parse_args()
    size = SIZES[args.size]
    checkpoint_every = args.checkpoint_every or size["checkpoint_every"]

    rank, world_size, device = setup_distributed()
    torch.manual_seed(0)
    images, captions = generate_pairs(size)
    dataset = TensorDataset(images, captions)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=size["micro_batch"], sampler=sampler, drop_last=True)
    model = MMDiT(
        size["image"],
        size["channels"],
        size["patch"],
        size["caption"],
        size["vocab"],
        size["width"],
        size["layers"],
        size["heads"],
    ).to(device)
    if torch.device(device).type == "cuda":
        model.compile()
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)
    scaler = torch.amp.GradScaler("cuda", enabled=torch.cuda.is_available())
    torch.manual_seed(1 + rank)  # each rank draws its own noise and times

    with tempfile.TemporaryDirectory(prefix="mmdit-checkpoints-") as scratch:
        checkpoint_dir = args.checkpoint_dir or scratch
        step = 0
        micro_step = 0
        done = False
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for batch_images, batch_captions in loader:
                batch_images = batch_images.to(device)
                batch_captions = batch_captions.to(device)
                micro_step += 1
                sync = micro_step % ACCUMULATION == 0
                with contextlib.nullcontext() if sync else model.no_sync():
                    with torch.amp.autocast("cuda", dtype=torch.float16):
                        loss = flow_matching_loss(model, batch_images, batch_captions)
                    scaler.scale(loss / ACCUMULATION).backward()
                if not sync:
                    continue
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                step += 1
                if rank == 0 and step % checkpoint_every == 0:
                    torch.save(
                        {
                            "step": step,
                            "model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "scaler": scaler.state_dict(),
                        },
                        os.path.join(checkpoint_dir, "checkpoint.pt"),
                    )
                if rank == 0 and step % 10 == 0:
                    print(f"step {step}: loss {loss.item():.4f}")
                if args.steps and step >= args.steps:
                    done = True
                    break
            if done:
                break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""OPT407's InstanceNorm decline: a convolutional network normalised with InstanceNorm2d
trained in channels_last against NCHW, and the same network with BatchNorm2d for contrast.

    python benchmarks/channels_last_instance_norm.py [--steps 20] [--json OUT]

The network is a style-transfer encoder (conv 9x9, two stride-2 convs, two 3x3 convs, each
followed by the norm and ReLU; 4 images of 3x128x128, Adam). Instance norm returns NCHW
tensors whatever its input, so in channels_last every convolution after it converts its input
back. Steps of the two layouts are interleaved (_timing.interleaved). Prints the medians and,
with --json, writes them with the machine, torch version and date.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _timing import interleaved, paired_entry  # noqa: E402


def network(norm):
    import torch.nn as nn

    def block(c_in, c_out, kernel, stride=1):
        conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2)
        return [conv, norm(c_out), nn.ReLU()]

    return nn.Sequential(
        *block(3, 32, 9),
        *block(32, 64, 3, 2),
        *block(64, 128, 3, 2),
        *block(128, 128, 3),
        *block(128, 128, 3),
        nn.Conv2d(128, 3, 3, padding=1),
    )


def training_step(norm, channels_last: bool):
    import torch

    torch.manual_seed(0)
    model = network(norm)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    # Both layouts with the same plain Adam: only the memory format differs.
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)  # noqa: OPT501
    images = torch.randn(4, 3, 128, 128)

    def step():
        loss = model(images).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def main() -> int:
    import torch
    import torch.nn as nn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    norms = {
        "instance_norm": lambda c: nn.InstanceNorm2d(c, affine=True),
        "batch_norm": nn.BatchNorm2d,
    }
    entries = {}
    for name, norm in norms.items():
        before, after = interleaved(
            training_step(norm, False), training_step(norm, True), args.steps, warmup=3
        )
        entry = paired_entry(
            f"{name}: NCHW (before) vs channels_last (after)",
            before,
            after,
            torch.get_num_threads(),
        )
        entries[f"OPT407:{name}"] = entry
        print(
            f"{name:14} NCHW {entry['before_s'] * 1e3:6.1f} ms  channels_last "
            f"{entry['after_s'] * 1e3:6.1f} ms  speedup {entry['speedup']:.2f}x"
        )
    if args.json:
        args.json.write_text(json.dumps(entries, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

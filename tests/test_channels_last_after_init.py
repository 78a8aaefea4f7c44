"""OPT407 converts a model after its in-place weight init, and not at all under Opacus."""

from __future__ import annotations

import pytest

from optimizer_codemod import rewrite

torch = pytest.importorskip("torch")

SCRIPT = """\
import torch
import torch.nn as nn


def weights_init(m):
    if isinstance(m, nn.Conv2d):
        nn.init.normal_(m.weight, 0.0, 0.02)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return self.conv(x).mean()


device = "cuda" if torch.cuda.is_available() else "cpu"
{imports}net = Net().to(device)
net.apply(weights_init)
optimizer = torch.optim.Adam(net.parameters())
for step in range(100):
    loss = net(torch.randn(4, 3, 16, 16, device=device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_seeded_in_place_init_fills_a_channels_last_weight_in_another_order() -> None:
    # Why the conversion goes after `net.apply(weights_init)` (DCGAN's pattern).
    weights = []
    for memory_format in (torch.contiguous_format, torch.channels_last):
        torch.manual_seed(0)
        weight = torch.empty(8, 3, 3, 3).to(memory_format=memory_format)
        torch.nn.init.normal_(weight)
        weights.append(weight)
    assert not torch.equal(*weights)


def test_the_conversion_comes_after_the_in_place_init() -> None:
    result = rewrite(SCRIPT.format(imports=""), select=["OPT407"]).source
    lines = result.splitlines()
    converted = lines.index("net = net.to(memory_format=torch.channels_last)")
    assert lines[converted - 1] == "net.apply(weights_init)"


def test_a_script_computing_per_sample_gradients_with_opacus_is_left_alone() -> None:
    source = SCRIPT.format(imports="from opacus import PrivacyEngine\n")
    result = rewrite(source, select=["OPT407"], why_not=True)
    assert result.source == source
    assert any("Opacus" in d.message for d in result.diagnostics)

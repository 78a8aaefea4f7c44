"""A script that trains on the CPU as far as its text tells gets none of the settings that act
on CUDA alone (OPT301's TF32, OPT401's cuDNN autotuner): nothing places or names an accelerator.
A device the script pins to the CPU (jcjohnson/pytorch-examples: `device = torch.device('cpu')`,
the GPU line commented out) names none; a device that may be a GPU on some path does."""

from __future__ import annotations

import pytest

from optimizer_codemod import rewrite

SCRIPT = """\
import torch

{device}
x = torch.randn(64, 1000, device=device)
y = torch.randn(64, 10, device=device)
model = torch.nn.Sequential(
    torch.nn.Linear(1000, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10)
).to(device)
for t in range(500):
    loss = torch.nn.functional.mse_loss(model(x), y)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for param in model.parameters():
            param -= 1e-4 * param.grad
"""

ON_THE_CPU = [
    "device = torch.device('cpu')\n# device = torch.device('cuda') # Uncomment this to run on GPU",
    'device = "cpu"',
    "device = torch.device(type='cpu')",
]
MAYBE_ON_A_GPU = [
    "device = torch.device('cuda')",
    "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')",
    "import sys\ndevice = torch.device(sys.argv[1])",
    "import sys\ndevice = torch.device('cpu')\nif sys.argv[1:]:\n    device = 'cuda:0'",
]


def _opt301(device: str):
    source = SCRIPT.format(device=device)
    result = rewrite(source, path="train.py", select=["OPT301"], why_not=True)
    [finding] = [d for d in result.diagnostics if d.code == "OPT301"]
    return finding


@pytest.mark.parametrize("device", ON_THE_CPU)
def test_a_device_pinned_to_the_cpu_gets_no_tf32_setting(device: str) -> None:
    finding = _opt301(device)
    assert finding.status.value == "declined"
    assert "trains on the CPU" in finding.message


@pytest.mark.parametrize("device", MAYBE_ON_A_GPU)
def test_a_device_that_may_be_a_gpu_gets_it(device: str) -> None:
    assert _opt301(device).status.value == "fixed"


CONVOLUTIONS = """\
import torch

device = {device}
model = torch.nn.Conv2d(3, 8, 3).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    loss = model(torch.randn(4, 3, 32, 32, device=device)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("device, status", [("torch.device('cpu')", None), ("'cuda'", "fixed")])
def test_the_cudnn_autotuner_follows_the_same_device(device: str, status) -> None:
    result = rewrite(CONVOLUTIONS.format(device=device), path="train.py", select=["OPT401"])
    assert [d.status.value for d in result.diagnostics if d.code == "OPT401"] == (
        [status] if status else []
    )

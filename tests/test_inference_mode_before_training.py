"""OPT403 and a forward that runs before training: a model that keeps a tensor its forward
makes (a lazily built cache) must not make it under `inference_mode` when a training step
follows, or that step raises ("Inference tensors cannot be saved for backward")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import messages_by_code
from optimizer_codemod import runner
from optimizer_codemod.api import rewrite_source
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import Status

MODEL = """\
import torch
import torch.nn as nn


class Cached(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.cache = None

    def forward(self, x):
        if self.cache is None:
            self.cache = torch.ones(4, device=x.device)
        return self.lin(x) * self.cache


def evaluate(model, x):
    with torch.no_grad():
        return float(model(x).sum())


model = Cached()
x = torch.randn(2, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""
TRAIN = """\
for step in range(3):
    loss = model(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def rewrite(source: str):
    settings = Settings(select=("OPT403",), why_not=True)
    return rewrite_source(source.encode(), "train.py", settings.options_for("train.py"))


@pytest.mark.parametrize(
    "source, fixed",
    [
        (MODEL + "print(evaluate(model, x))\n" + TRAIN, False),  # the first forward: no
        (MODEL + TRAIN + "print(evaluate(model, x))\n", True),  # after training: yes
        (  # pytorch/examples' imagenet: an evaluation-only run returns before training
            MODEL
            + "def main(evaluate_only):\n"
            + "    if evaluate_only:\n"
            + "        print(evaluate(model, x))\n"
            + "        return\n"
            + "".join("    " + line + "\n" for line in TRAIN.splitlines())
            + "main(False)\n",
            True,
        ),
    ],
)
def test_an_evaluation_before_training_keeps_no_grad(tmp_path: Path, source, fixed) -> None:
    result = rewrite(source)
    assert (b"inference_mode" in result.new) is fixed
    script = tmp_path / "train.py"
    script.write_bytes(result.new)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    if not fixed:
        [why] = [d.message for d in result.diagnostics if d.status is Status.DECLINED]
        assert "run before a training step" in why and "`self.cache`" in why


def test_the_rewrite_the_check_prevents_raises(tmp_path: Path) -> None:
    """What the decline keeps from happening: the same script with inference_mode."""
    script = tmp_path / "train.py"
    source = MODEL + "print(evaluate(model, x))\n" + TRAIN
    script.write_text(source.replace("torch.no_grad()", "torch.inference_mode()"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode != 0
    assert "Inference tensors cannot be saved for backward" in done.stderr


def test_a_block_in_a_script_training_through_another_module_says_why(tmp_path: Path) -> None:
    (tmp_path / "loops.py").write_text(
        "def train(model, x, opt):\n"
        "    for step in range(3):\n"
        "        loss = model(x).sum()\n"
        "        opt.zero_grad()\n"
        "        loss.backward()\n"
        "        opt.step()\n"
    )
    (tmp_path / "main.py").write_text(
        "import torch\n"
        "from loops import train\n"
        "model = torch.nn.Linear(4, 4)\n"
        "x = torch.randn(2, 4)\n"
        "with torch.no_grad():\n"
        "    print(float(model(x).sum()))\n"
        "train(model, x, torch.optim.SGD(model.parameters(), lr=0.1))\n"
    )
    outcomes = runner.run(
        [str(tmp_path / "main.py"), str(tmp_path / "loops.py")],
        Settings(root=str(tmp_path), why_not=True, select=("OPT403",)),
        runner.Mode(write=False),
    )
    main = {Path(o.path).name: o for o in outcomes}["main.py"]
    [why] = messages_by_code(main, Status.DECLINED)["OPT403"]
    assert "through a loop of loops.py" in why


def test_an_evaluation_loop_before_training_is_not_wrapped(tmp_path: Path) -> None:
    """The `behavior` wrap of a loop after `.eval()` (autograd on) gets the same check."""
    source = (
        MODEL
        + "model.eval()\n"
        + "for batch in [x, x]:\n"
        + "    print(float(model(batch).sum()))\n"
        + "model.train()\n"
        + TRAIN
    )
    settings = Settings(select=("OPT403",), why_not=True, unsafe_fixes=True)
    result = rewrite_source(source.encode(), "train.py", settings.options_for("train.py"))
    assert b"inference_mode():\n    for batch" not in result.new
    [why] = [d.message for d in result.diagnostics if d.status is Status.DECLINED]
    assert "it runs before a training step" in why and "`self.cache`" in why
    after = (
        MODEL + TRAIN + "model.eval()\nfor batch in [x, x]:\n    print(float(model(batch).sum()))\n"
    )
    fixed = rewrite_source(after.encode(), "train.py", settings.options_for("train.py"))
    assert b"with torch.inference_mode():\n    for batch in" in fixed.new

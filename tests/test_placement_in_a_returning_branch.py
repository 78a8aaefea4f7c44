"""OPT402 compiles a model after the placement its training reaches, not after one in a branch
that evaluates and returns first (torchvision's quantization script places the model again
under `if args.test_only:`, whose compile would have left the training eager); and a loss
module handed to another module's loop beside the model is no model to compile."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from optimizer_codemod import runner
from optimizer_codemod.config import Settings

MAIN = """\
import sys

import torch
import torch.nn as nn

from engine import evaluate, train_one_epoch


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(8, 32)
        self.out = nn.Linear(32, 10)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


def main(test_only):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = MLP()
    model.to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if test_only:
        model.to(device)
        evaluate(model, criterion, device)
        return
    for epoch in range(2):
        train_one_epoch(model, criterion, optimizer, device)


if __name__ == "__main__":
    main("--test-only" in sys.argv)
"""
ENGINE = """\
import torch


def train_one_epoch(model, criterion, optimizer, device):
    model.train()
    for step in range(10):
        x = torch.randn(16, 8, device=device)
        y = torch.randint(0, 10, (16,), device=device)
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def evaluate(model, criterion, device):
    model.eval()
    with torch.no_grad():
        x = torch.randn(16, 8, device=device)
        return criterion(model(x), torch.zeros(16, dtype=torch.long, device=device))
"""


def _apply(tmp_path: Path):
    (tmp_path / "main.py").write_text(MAIN)
    (tmp_path / "engine.py").write_text(ENGINE)
    settings = Settings(root=str(tmp_path), select=("OPT402",), why_not=True)
    texts: Dict[str, str] = {}
    found: List[str] = []
    paths = [str(tmp_path / "main.py"), str(tmp_path / "engine.py")]
    for outcome in runner.run(paths, settings, runner.Mode(write=True), jobs=1):
        assert outcome.error is None, outcome.error
        found += [f"{Path(outcome.path).name}: {d.message}" for d in outcome.diagnostics]
    for path in paths:
        texts[Path(path).name] = Path(path).read_text()
    return texts, found


def test_the_compile_follows_the_placement_the_training_reaches(tmp_path: Path) -> None:
    texts, _ = _apply(tmp_path)
    main = texts["main.py"]
    assert main.count("model.compile()") == 1
    assert (
        "    model.to(device)\n"
        '    if device.type == "cuda":\n'
        "        model.compile()\n"
        "    criterion = nn.CrossEntropyLoss()\n"
    ) in main
    branch = main[main.index("    if test_only:") : main.index("        return\n")]
    assert "compile" not in branch
    assert texts["engine.py"] == ENGINE


def test_a_loss_module_beside_the_model_is_not_taken_for_one(tmp_path: Path) -> None:
    _, found = _apply(tmp_path)
    assert not any("`criterion`" in message for message in found), found
    assert any(m.startswith("main.py: `model` is trained in eager mode") for m in found), found

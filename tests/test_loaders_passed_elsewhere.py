"""A loop over a DataLoader another module of the run passes in (UNet's evaluate.py, called
from train.py with its pinned `val_loader`): OPT201 knows whether it pins, through the
project index's summary of the argument (project.Argument.loader)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Dict

import pytest

from conftest import messages_by_code
from optimizer_codemod import runner
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import FileOutcome, Status

TRAIN = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

from evaluate import evaluate


def loader_options():
    return {"num_workers": 0}


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train_loader = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4, pin_memory=True)
val_loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4{options})

if __name__ == "__main__":
    for epoch in range(2):
        for (x,) in train_loader:
            model(x.to(device, non_blocking=True)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        print(evaluate(model, val_loader, device))
"""
EVALUATE = """\
import torch


@torch.inference_mode()
def evaluate(net, dataloader, device):
    total = 0.0
    for (x,) in dataloader:
        x = x.to(device)
        total += float(net(x).sum())
    return total
"""


def run(tmp_path: Path, options: str, files=("train.py", "evaluate.py")) -> Dict[str, FileOutcome]:
    (tmp_path / "train.py").write_text(TRAIN.replace("{options}", options))
    (tmp_path / "evaluate.py").write_text(textwrap.dedent(EVALUATE))
    outcomes = runner.run(
        [str(tmp_path / name) for name in files],
        Settings(root=str(tmp_path), why_not=True, select=("OPT201",)),
        runner.Mode(write=False),
    )
    return {Path(o.path).name: o for o in outcomes}


def test_a_copy_of_a_pinned_loader_passed_in_is_found(tmp_path: Path) -> None:
    outcome = run(tmp_path, ", pin_memory=True")["evaluate.py"]
    # the device is a parameter train.py binds to `torch.device("cuda" if ... else "cpu")`
    # (project.Argument.devices): the copy is fixed
    [message] = messages_by_code(outcome, Status.FIXED)["OPT201"]
    assert message.startswith("`x` comes from a pinned DataLoader")


def test_a_copy_to_a_device_the_caller_does_not_show_is_reported(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        TRAIN.replace("{options}", ", pin_memory=True").replace(
            'torch.device("cuda" if torch.cuda.is_available() else "cpu")', "pick_device()"
        )
    )
    (tmp_path / "evaluate.py").write_text(textwrap.dedent(EVALUATE))
    [_, outcome] = runner.run(
        [str(tmp_path / "train.py"), str(tmp_path / "evaluate.py")],
        Settings(root=str(tmp_path), why_not=True, select=("OPT201",)),
        runner.Mode(write=False),
    )
    [message] = messages_by_code(outcome, Status.REPORTED)["OPT201"]
    assert "the device is chosen where the analysis cannot see it" in message


@pytest.mark.parametrize(
    "options, reason",
    [
        ("", "the DataLoader is not built with `pin_memory=True`"),
        # options made by a call: whether it pins cannot be read
        (", **loader_options()", "unknown"),
    ],
)
def test_a_loader_passed_in_unpinned_or_unknown_is_declined_with_why(
    tmp_path: Path, options: str, reason: str
) -> None:
    outcome = run(tmp_path, options)["evaluate.py"]
    [message] = messages_by_code(outcome, Status.DECLINED)["OPT201"]
    assert reason in message


def test_the_module_alone_knows_no_caller_and_says_nothing(tmp_path: Path) -> None:
    outcome = run(tmp_path, ", pin_memory=True", files=("evaluate.py",))["evaluate.py"]
    assert not outcome.diagnostics


EVALUATE_THROUGH_A_HELPER = """\
import torch


def _run(net, loader, device):
    total = 0.0
    for (x,) in loader:
        total += float(net(x.to(device)).sum())
    return total


@torch.inference_mode()
def evaluate(net, dataloader, device):
    return _run(net, dataloader, device)
"""


@pytest.mark.parametrize(
    "options, status", [(", pin_memory=True", Status.FIXED), ("", Status.DECLINED)]
)
def test_a_loader_handed_on_to_a_helper_of_the_module_is_followed(
    tmp_path: Path, options: str, status: Status
) -> None:
    """mrdbourke's engine.py: `train(...)`, called from train.py, passes its loader parameter
    on to `train_step(model, dataloader=...)`, whose loop copies the batches."""
    (tmp_path / "train.py").write_text(TRAIN.replace("{options}", options))
    (tmp_path / "evaluate.py").write_text(EVALUATE_THROUGH_A_HELPER)
    [outcome] = runner.run(
        [str(tmp_path / "train.py"), str(tmp_path / "evaluate.py")],
        Settings(root=str(tmp_path), why_not=True, select=("OPT201",)),
        runner.Mode(write=False),
    )[1:]
    [message] = messages_by_code(outcome, status)["OPT201"]
    expected = "comes from a pinned DataLoader" if options else "not built with `pin_memory"
    assert expected in message

"""The device a module of the run passes to a training function of another (mrdbourke's
going_modular: train.py's `device = "cuda" if torch.cuda.is_available() else "cpu"` handed
to `engine.train(..., device=device)`, which hands it to `train_step(..., device)`): OPT201
knows it is CUDA or the CPU (project.Argument.devices) and makes the copies non-blocking;
where some caller's device may be MPS, or is not known, the copy stays as it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

import pytest

from conftest import messages_by_code
from optimizer_codemod import runner
from optimizer_codemod.analysis.project import from_json, project_facts, to_json
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import FileOutcome, Status

ENGINE = """\
import torch


def train_step(model, dataloader, optimizer, device):
    for X, y in dataloader:
        X, y = X.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(X), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def train(model, dataloader, optimizer, epochs, device):
    for epoch in range(epochs):
        train_step(model, dataloader, optimizer, device)
"""
TRAIN = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

import engine

{device}
data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
loader = DataLoader(data, batch_size=16, shuffle=True, pin_memory=True)
model = torch.nn.Linear(8, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
engine.train(model, loader, optimizer, 3, device={passed})
"""
CUDA_OR_CPU = 'device = "cuda" if torch.cuda.is_available() else "cpu"'


def run(tmp_path: Path, device: str, passed: str = "device", extra: str = "") -> FileOutcome:
    (tmp_path / "engine.py").write_text(ENGINE)
    (tmp_path / "train.py").write_text(TRAIN.format(device=device, passed=passed) + extra)
    paths = [str(tmp_path / "engine.py"), str(tmp_path / "train.py")]
    settings = Settings(root=str(tmp_path), select=("OPT201",), why_not=True)
    outcomes = runner.run(paths, settings, runner.Mode(write=False, keep_text=True))
    return outcomes[0]


def statuses(outcome: FileOutcome) -> Dict[str, int]:
    return {
        status.value: len(messages_by_code(outcome, status).get("OPT201", []))
        for status in (Status.FIXED, Status.REPORTED, Status.DECLINED)
    }


def test_copies_to_a_device_another_module_passes_through_two_calls_are_fixed(
    tmp_path: Path,
) -> None:
    engine = run(tmp_path, CUDA_OR_CPU)
    assert statuses(engine) == {"fixed": 2, "reported": 0, "declined": 0}
    assert engine.new_text.decode().count("non_blocking=True") == 2
    index = project_facts([str(tmp_path / "engine.py"), str(tmp_path / "train.py")])
    [call] = index[str(tmp_path / "engine.py")].calls
    assert call.argument("device", 4).devices == ("cpu", "cuda")
    assert from_json(json.loads(json.dumps(to_json(index)))) == index


@pytest.mark.parametrize(
    "device, passed, extra, why",
    [
        # MPS is possible: an asynchronous copy there corrupts data
        ('device = "mps" if torch.backends.mps.is_available() else "cpu"', "device", "", "MPS"),
        # a device the caller reads from elsewhere
        ("device = torch.device(input())", "device", "", "cannot see"),
        # two callers that pass different devices
        (CUDA_OR_CPU, "device", 'engine.train(model, loader, optimizer, 1, device="mps")\n', ""),
    ],
)
def test_copies_to_a_device_some_caller_may_not_make_cuda_stay_blocking(
    tmp_path: Path, device: str, passed: str, extra: str, why: str
) -> None:
    engine = run(tmp_path, device, passed, extra)
    assert statuses(engine)["fixed"] == 0
    assert "non_blocking" not in (engine.new_text or b"").decode()
    reasons = [*messages_by_code(engine, Status.REPORTED).get("OPT201", [])]
    reasons += messages_by_code(engine, Status.DECLINED).get("OPT201", [])
    assert len(reasons) == 2 and all(why in reason for reason in reasons)

"""Issue 15 (facebookresearch/detr main.py): a script that builds its DataLoaders and hands
them to loops of another module (`train_one_epoch` and `evaluate` from engine.py). OPT101
cannot see there whether the batches are copied to an accelerator, nor whether the batch type
a custom `collate_fn` returns can be pinned, so it declines with that reason instead of
saying nothing."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Dict

from optimizer_codemod import runner
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import FileOutcome

ENGINE = """\
import torch


def train_one_epoch(model, criterion, data_loader, optimizer, device):
    model.train()
    for samples, targets in data_loader:
        samples = samples.to(device)
        loss = criterion(model(samples), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def evaluate(model, data_loader, device):
    for samples, targets in data_loader:
        model(samples.to(device))
"""

MAIN = """\
import torch
from torch.utils.data import DataLoader

from engine import evaluate, train_one_epoch
import misc


def main(model, criterion, optimizer, dataset_train, dataset_val, device):
    data_loader_train = DataLoader(dataset_train, batch_size=2, collate_fn=misc.collate_fn{pin})
    data_loader_val = DataLoader(dataset_val, batch_size=2, collate_fn=misc.collate_fn)
    for epoch in range(3):
        train_one_epoch(model, criterion, data_loader_train, optimizer, device)
        evaluate(model, data_loader_val, device)


if __name__ == "__main__":
    main(None, None, None, [], [], "cuda")
"""

MISC = """\
def collate_fn(batch):
    return tuple(zip(*batch))
"""


def _run(folder: Path, main: str) -> Dict[str, FileOutcome]:
    (folder / "engine.py").write_text(ENGINE)
    (folder / "misc.py").write_text(MISC)
    (folder / "main.py").write_text(main)
    files = sorted(str(p) for p in folder.glob("*.py"))
    settings = Settings(unsafe_fixes=True, root=str(folder), select=("OPT101",), why_not=True)
    outcomes = runner.run(files, settings, runner.Mode(write=False, diff=True), jobs=1)
    return {Path(o.path).name: o for o in outcomes}


def _opt101(outcome: FileOutcome):
    return [(d.line, d.message) for d in outcome.diagnostics if d.code == "OPT101"]


def test_loaders_handed_to_loops_of_another_module_are_declined_with_why(tmp_path: Path) -> None:
    outcomes = _run(tmp_path, MAIN.format(pin=""))
    found = dict(_opt101(outcomes["main.py"]))
    assert set(found) == {9, 10}
    assert found[9].startswith("its batches go to `train_one_epoch`, a training loop in engine.py")
    assert found[10].startswith("its batches go to `evaluate`, an imported function")
    assert all("`pin_memory()` method" in message for message in found.values())
    assert not outcomes["main.py"].changed  # declined: nothing changes


def test_a_loader_that_chooses_pin_memory_is_not_declined(tmp_path: Path) -> None:
    outcomes = _run(tmp_path, MAIN.format(pin=", pin_memory=True"))
    assert [line for line, _ in _opt101(outcomes["main.py"])] == [10]


def test_without_the_other_module_nothing_is_said(tmp_path: Path) -> None:
    # A lone script (no project index answer) that trains nowhere: nothing to explain.
    (tmp_path / "main.py").write_text(textwrap.dedent(MAIN.format(pin="")))
    settings = Settings(unsafe_fixes=True, root=str(tmp_path), select=("OPT101",), why_not=True)
    (outcome,) = runner.run(
        [str(tmp_path / "main.py")], settings, runner.Mode(write=False, diff=True), jobs=1
    )
    assert _opt101(outcome) == []

"""Issue 4, must show: validation and checkpointing stranded after the epoch loop run every
epoch once OPT701 moves them (a convolutional script, 3 epochs on CPU, checkpoints counted)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "OPT701"

SCRIPT = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    train_set = TensorDataset(torch.randn(64, 1, 8, 8), torch.randint(0, 4, (64,)))
    val_set = TensorDataset(torch.randn(32, 1, 8, 8), torch.randint(0, 4, (32,)))
    train_loader = DataLoader(train_set, batch_size=16, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=16)

    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 4)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    for epoch in range(3):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

    # validate and checkpoint every epoch (an indentation slip put this here)
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in val_loader:
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(1) == y).sum().item()
    print(f"epoch {epoch}: val acc {correct / len(val_set):.3f}")
    torch.save(model.state_dict(), f"checkpoint_epoch{epoch}.pt")
    """)


def _run(source: str, folder: Path) -> list:
    folder.mkdir()
    (folder / "train.py").write_text(source)
    subprocess.run(
        [sys.executable, "train.py"], cwd=folder, check=True, capture_output=True, timeout=300
    )
    return sorted(p.name for p in folder.glob("checkpoint_epoch*.pt"))


def test_stranded_block_runs_every_epoch_after_the_fix(tmp_path: Path) -> None:
    result = rewrite(SCRIPT, path="train.py", select=["OPT701"], unsafe_fixes=True)
    assert [d.code for d in result.diagnostics] == ["OPT701"]
    assert "\n    torch.save(model.state_dict()" in result.source
    assert "\n    # validate and checkpoint every epoch" in result.source

    assert _run(SCRIPT, tmp_path / "before") == ["checkpoint_epoch2.pt"]
    assert _run(result.source, tmp_path / "after") == [
        "checkpoint_epoch0.pt",
        "checkpoint_epoch1.pt",
        "checkpoint_epoch2.pt",
    ]


def test_without_unsafe_fixes_the_block_is_only_reported() -> None:
    result = rewrite(SCRIPT, path="train.py", select=["OPT701"])
    assert result.source == SCRIPT
    assert [d.code for d in result.diagnostics] == ["OPT701"]


@pytest.mark.parametrize(
    "fixture, outer, evidence",
    [
        (
            "keep_block_after_the_step_loop_reading_the_outer_epoch",
            "`for epoch in range(1, 21)`",
            "the block reads `epoch`, the outer loop's variable",
        ),
        (
            "keep_evaluation_of_each_fold_after_the_epoch_loop",
            "`for fold in range(len(batches))`",
            "the block reads `val_batches`, which the outer loop computes from its variable",
        ),
        (
            "keep_block_after_the_step_loop_of_an_epoch_loop",
            "`for epoch_index in range(3)`",
            "the outer loop's `epoch_index` names it the epoch loop",
        ),
        (
            "keep_block_after_a_loop_over_batches_in_another_loop",
            "`while steps < 100`",
            "the inner loop, over batches (`loader`), is the outer loop's step loop",
        ),
    ],
)
def test_a_block_already_in_an_outer_loop_is_declined_naming_that_loop(
    fixture: str, outer: str, evidence: str
) -> None:
    source = (FIXTURES / f"{fixture}.py").read_text(encoding="utf-8")
    result = rewrite(source, select=["OPT701"], unsafe_fixes=True, why_not=True)
    assert result.source == source
    [finding] = [d for d in result.diagnostics if d.code == "OPT701"]
    assert finding.status is Status.DECLINED
    assert f"nested in {outer}" in finding.message and evidence in finding.message

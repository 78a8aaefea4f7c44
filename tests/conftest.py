"""Shared test helpers: writing sources, running the command line in-process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

import pytest
from click.testing import CliRunner, Result

from optimizer_codemod.cli import main

TRAINING_SCRIPT = b"""import torch

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    loss = model(torch.randn(8, 4)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
FUSED_LINE = b"optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)"


def run_cli(
    args: Sequence[str], stdin: Optional[bytes] = None, cwd: Optional[Path] = None
) -> Result:
    runner = CliRunner()
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return runner.invoke(main, list(args), input=stdin, catch_exceptions=False)
    finally:
        os.chdir(old)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_bytes(TRAINING_SCRIPT)
    return path

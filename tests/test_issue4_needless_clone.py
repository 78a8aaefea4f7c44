"""Issue 4, must show: of two clones, OPT702 removes only the needless one, and the rewritten
script's per-step losses equal the original's exactly on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from optimizer_codemod import rewrite

SCRIPT = textwrap.dedent("""\
    import json
    import sys

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []

    for step in range(20):
        x = torch.randn(32, 16)
        y = x.sum(dim=1, keepdim=True).sin()
        target = y.clone()  # needless: neither is ever written
        noisy = x.clone()  # required: augmented in place below, `x` is used as it was
        noisy += 0.1 * torch.randn_like(noisy)
        loss = F.mse_loss(model(noisy), target) + 0.5 * F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    json.dump(losses, sys.stdout)
    """)


def _losses(source: str, folder: Path) -> list:
    folder.mkdir()
    (folder / "train.py").write_text(source)
    done = subprocess.run(
        [sys.executable, "train.py"],
        cwd=folder,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return json.loads(done.stdout)


def test_only_the_needless_clone_goes_and_losses_match_exactly(tmp_path: Path) -> None:
    result = rewrite(SCRIPT, path="train.py", select=["OPT702"])
    assert "target = y  # needless" in result.source
    assert "noisy = x.clone()" in result.source
    assert result.source.count(".clone()") == 1
    assert [(d.code, d.status.value) for d in result.diagnostics] == [("OPT702", "fixed")]

    before = _losses(SCRIPT, tmp_path / "before")
    after = _losses(result.source, tmp_path / "after")
    assert len(before) == 20
    assert after == before


def test_the_required_clone_is_not_even_reported() -> None:
    source = SCRIPT.replace("target = y.clone()", "target = y")
    result = rewrite(source, path="train.py", select=["OPT702"])
    assert result.source == source
    assert not result.diagnostics

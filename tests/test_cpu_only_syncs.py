"""OPT202 leaves a loss accumulation alone in a script that never places anything on an
accelerator (d2l's CPU-only `train_ch3`): there `.item()` waits for no device queue."""

from __future__ import annotations

import pytest

from optimizer_codemod import rewrite

SOURCE = """\
import torch

model = torch.nn.Linear(8, 1){placed}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    total = 0.0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x{placed}), y{placed})
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
    print(epoch, total)
"""


@pytest.mark.parametrize("placed, rewritten", [("", False), (".cuda()", True)])
def test_a_loss_accumulation_is_moved_to_the_device_only_where_there_is_one(
    placed: str, rewritten: bool
) -> None:
    source = SOURCE.format(placed=placed)
    result = rewrite(source, select=["OPT202"], why_not=True)
    assert ("total += loss.detach().float()" in result.source) is rewritten
    if not rewritten:
        assert any(
            "on the CPU `.item()` waits for nothing" in d.message for d in result.diagnostics
        )

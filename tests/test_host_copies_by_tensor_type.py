"""`x.type(torch.LongTensor)` of a device value copies it to the host: a per-step sync that a
loss total moved to the device would not remove (d2l's `y_hat.argmax(1).type(...)`)."""

from __future__ import annotations

import pytest

from optimizer_codemod import rewrite

SOURCE = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"


def train(net, loader, opt, crit):
    net.to(device)
    for epoch in range(3):
        total, preds = 0.0, []
        for X, y in loader:
            X, y = X.to(device), y.to(device)
            y_hat = net(X)
            loss = crit(y_hat, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
            preds.append(y_hat.argmax(1).type({tensor_type}))
        print(total / len(loader), torch.cat(preds).bincount())
"""


@pytest.mark.parametrize(
    "tensor_type, moved", [("torch.LongTensor", False), ("torch.cuda.LongTensor", True)]
)
def test_a_conversion_to_a_cpu_tensor_type_is_a_sync_that_stays(
    tensor_type: str, moved: bool
) -> None:
    result = rewrite(SOURCE.format(tensor_type=tensor_type), select=["OPT202"])
    assert ("total += loss.detach().float()" in result.source) is moved
    if not moved:
        messages = [d.message for d in result.diagnostics if d.code == "OPT202"]
        assert any(".type(torch.LongTensor)` still waits" in m for m in messages)

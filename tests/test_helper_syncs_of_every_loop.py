"""A helper that syncs on every step counts for every training loop that calls it, not only
the first (d2l's `grad_clipping`, called by two training functions of its utils.py)."""

from __future__ import annotations

from optimizer_codemod import rewrite

SOURCE = """\
import torch


def grad_clipping(params, theta, device):
    norm = torch.tensor([0.0], device=device)
    for param in params:
        norm += (param.grad.data ** 2).sum()
    norm = norm.sqrt().item()
    if norm > theta:
        for param in params:
            param.grad.data *= theta / norm


def train_scratch(params, net, loader, device):
    for x, y in loader:
        torch.nn.functional.mse_loss(net(x.to(device), params), y.to(device)).backward()
        grad_clipping(params, 1.0, device)


def train(model, loader, opt, device):
    total = 0.0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        grad_clipping(model.parameters(), 1.0, device)
        opt.step()
        total += loss.item()
    print(total / len(loader))
"""


def test_the_second_loop_calling_a_syncing_helper_keeps_its_loss_item() -> None:
    result = rewrite(SOURCE, select=["OPT202"])
    assert result.source == SOURCE
    reported = [d.message for d in result.diagnostics if d.code == "OPT202"]
    assert any("norm.sqrt().item()" in message for message in reported)


def test_without_the_helper_the_loss_item_is_accumulated_on_the_device() -> None:
    source = SOURCE.replace("        grad_clipping(model.parameters(), 1.0, device)\n", "")
    assert "total += loss.detach().float()" in rewrite(source, select=["OPT202"]).source

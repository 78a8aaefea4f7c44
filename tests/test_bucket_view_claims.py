"""What OPT605 relies on about `gradient_as_bucket_view=True`, run on the installed torch
with DistributedDataParallel over gloo (one process): reading a gradient, updating it in
place and resetting it to None train as without the option; `detach_()` raises on the view,
and a gradient kept across a backward changes under its holder (analysis/gradients.py)."""

from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


@pytest.fixture(autouse=True)
def _process_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _train(touch, bucket_view: bool):
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 2), gradient_as_bucket_view=bucket_view)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        optimizer.zero_grad()
        model(torch.ones(8, 4) * (step + 1)).pow(2).mean().backward()
        touch(model)
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def _norms(model):
    for p in model.parameters():
        if p.grad is not None:
            p.grad.data.norm(2).item()


def _scaled_in_place(model):
    for p in model.parameters():
        p.grad.data.mul_(0.5)


def _reset_by_hand(model):
    for p in model.parameters():
        p.grad = None


@pytest.mark.parametrize("touch", [_norms, _scaled_in_place, _reset_by_hand])
def test_reads_updates_in_place_and_resets_train_as_without_the_option(touch) -> None:
    with_views = _train(touch, bucket_view=True)
    without = _train(touch, bucket_view=False)
    assert all(a.equal(b) for a, b in zip(with_views, without))


def test_detach_in_place_raises_on_a_bucket_view() -> None:
    def detach(model):
        for p in model.parameters():
            p.grad.detach_()

    _train(detach, bucket_view=False)  # fine on an ordinary gradient
    with pytest.raises(RuntimeError, match="Can't detach views in-place"):
        _train(detach, bucket_view=True)


@pytest.mark.parametrize("bucket_view", [True, False])
def test_a_gradient_kept_past_the_next_backward_changes_only_as_a_bucket_view(
    bucket_view: bool,
) -> None:
    model = DDP(torch.nn.Linear(4, 2), gradient_as_bucket_view=bucket_view)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = None
    for step in range(3):
        optimizer.zero_grad()  # to None: an ordinary gradient is allocated anew
        model(torch.ones(8, 4) * (step + 1)).sum().backward()
        if step == 1:
            kept = next(model.parameters()).grad
            before = kept.clone()
    assert kept.equal(before) is not bucket_view

"""Legacy tensor types (`Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`, as in
eriklindernoren/PyTorch-GAN): `x.type(Tensor)` is a copy to the GPU and `Tensor(np.ones(s))` a
host array copied there. The rewrites are run here on the CPU branch of such an alias, with
torch, and must give the same tensors as the original code."""

from __future__ import annotations

import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status

torch = pytest.importorskip("torch")

TARGETS = """import numpy as np
import torch

Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else {cpu_type}


def targets(x, shape):
    for step in range(2):
        valid = Tensor(np.ones((x.size(0), *shape)))
        fake = Tensor(np.zeros((x.shape[0], 2, *shape)))
        single = Tensor(np.ones(3))
    return valid, fake, single
"""


def _run(source: str, select: str):
    result = rewrite(source, path="train.py", select=[select], why_not=True)
    declined = [d.message for d in result.diagnostics if d.status is Status.DECLINED]
    return result, declined


@pytest.mark.parametrize("cpu_type", ["torch.FloatTensor", "torch.Tensor", "torch.DoubleTensor"])
def test_targets_made_by_the_type_equal_the_converted_host_arrays(cpu_type: str) -> None:
    source = TARGETS.format(cpu_type=cpu_type)
    result, _ = _run(source, "OPT203")
    assert ".fill_(1.0)" in result.source and "np.ones(" not in result.source
    before, after = {}, {}
    exec(compile(source, "before.py", "exec"), before)
    exec(compile(result.source, "after.py", "exec"), after)
    x = torch.zeros(5, 7)
    for old, new in zip(before["targets"](x, (4, 3)), after["targets"](x, (4, 3))):
        assert (new.dtype, new.device, new.shape, new.stride()) == (
            old.dtype,
            old.device,
            old.shape,
            old.stride(),
        )
        assert torch.equal(new, old) and not new.requires_grad


def test_integer_type_is_filled_with_an_integer() -> None:
    source = TARGETS.format(cpu_type="torch.LongTensor").replace(
        "torch.cuda.FloatTensor", "torch.cuda.LongTensor"
    )
    result, _ = _run(source, "OPT203")
    assert ".fill_(1)" in result.source and ".fill_(1.0)" not in result.source
    scope: dict = {}
    exec(compile(result.source, "after.py", "exec"), scope)
    valid = scope["targets"](torch.zeros(2, 1), (3,))[0]
    assert valid.dtype == torch.int64 and torch.equal(valid, torch.ones(2, 3, dtype=torch.long))


def test_a_shape_that_may_be_data_is_declined_with_its_reason() -> None:
    source = TARGETS.format(cpu_type="torch.FloatTensor").replace("np.ones(3)", "np.ones(shape)")
    result, declined = _run(source, "OPT203")
    assert "Tensor(np.ones(shape))" in result.source
    assert any("the shape `shape` may be a sequence or a tensor" in m for m in declined)


BATCH = """import torch
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(
    TensorDataset(torch.arange(24.0).view(6, 4).double(), torch.arange(6)),
    batch_size=2,
    num_workers=2,
)
Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else torch.FloatTensor
LongTensor = torch.cuda.LongTensor if torch.cuda.is_available() else torch.LongTensor
model = torch.nn.Linear(4, 1)
seen = []
for x, y in loader:
    x = x.type(Tensor)
    y = y.type(LongTensor)
    seen.append((x, y))
    model(x).sum().backward()
"""


def test_pinned_and_non_blocking_copies_by_type_give_the_same_batches() -> None:
    first = rewrite(BATCH, path="train.py", select=["OPT101", "OPT201"])
    assert "pin_memory=torch.cuda.is_available()" in first.source
    second = rewrite(first.source, path="train.py", select=["OPT101", "OPT201"])
    assert "x.type(Tensor, non_blocking=True)" in second.source
    assert "y.type(LongTensor, non_blocking=True)" in second.source
    before, after = {}, {}
    torch.manual_seed(0)
    exec(compile(BATCH, "before.py", "exec"), before)
    torch.manual_seed(0)
    exec(compile(second.source, "after.py", "exec"), after)
    for (x0, y0), (x1, y1) in zip(before["seen"], after["seen"]):
        assert x1.dtype == x0.dtype == torch.float32 and torch.equal(x1, x0)
        assert y1.dtype == y0.dtype == torch.int64 and torch.equal(y1, y0)

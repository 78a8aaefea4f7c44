"""OPT103 on DataLoader options from a dict chosen by a condition (`{...} if use_cuda else {}`)
or filled by `.update(...)` (pytorch/examples vae, mnist_rnn, siamese_network): the entry goes
only where workers start, once, and never where another loader or another change could meet it."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status

CONDITIONAL = """import torchvision
from torch.utils.data import DataLoader

kwargs = OPTIONS
data = torchvision.datasets.FakeData(transform=torchvision.transforms.ToTensor())
train_loader = DataLoader(data, batch_size=64, **kwargs)
test_loader = DataLoader(data, batch_size=64, **kwargs)
for epoch in range(3):
    for images, labels in train_loader:
        print(images.shape)
    for images, labels in test_loader:
        print(images.mean())
"""

MERGED = """import torchvision
from torch.utils.data import DataLoader

train_kwargs = {"batch_size": 64}
test_kwargs = {"batch_size": 500}
if use_accel:
    accel_kwargs = {"num_workers": 1, "pin_memory": True}
    train_kwargs.update(accel_kwargs)
    test_kwargs.update(accel_kwargs)
EXTRA
data = torchvision.datasets.FakeData(transform=torchvision.transforms.ToTensor())
train_loader = DataLoader(data, **train_kwargs)
test_loader = DataLoader(data, **test_kwargs)
for epoch in range(3):
    for images, labels in train_loader:
        print(images.shape)
    for images, labels in test_loader:
        print(images.mean())
"""


def run(source: str):
    result = rewrite(source, path="train.py", select=["OPT103"], unsafe_fixes=True, why_not=True)
    declined = {d.line: d.message for d in result.diagnostics if d.status is Status.DECLINED}
    return result, declined


def assigned_options(source: str, use_accel: bool) -> dict:
    """The options dict the rewritten script's first line starting with `kwargs =` builds."""
    line = next(line for line in source.splitlines() if line.startswith("kwargs = "))
    scope = {"use_cuda": use_accel}
    exec(line, scope)
    return scope["kwargs"]


@pytest.mark.parametrize(
    "options, fixed",
    [
        (
            '{"num_workers": 2, "pin_memory": True} if use_cuda else {}',
            '{"num_workers": 2, "pin_memory": True, "persistent_workers": True} if use_cuda '
            "else {}",
        ),
        (
            '{"num_workers": 2} if use_cuda else {"num_workers": 0}',
            '{"num_workers": 2, "persistent_workers": True} if use_cuda else {"num_workers": 0}',
        ),
        (
            "dict(num_workers=workers) if use_cuda else dict()",
            "dict(num_workers=workers, persistent_workers=workers > 0) if use_cuda else dict()",
        ),
    ],
)
def test_only_the_branch_that_starts_workers_gets_persistent_workers(options, fixed) -> None:
    result, _ = run(CONDITIONAL.replace("OPTIONS", options))
    assert f"kwargs = {fixed}\n" in result.source
    assert result.source.count("persistent_workers") == 1  # in the dict, not on the calls


@pytest.mark.parametrize("use_accel", [True, False])
def test_the_rewritten_options_build_a_loader_on_either_path(use_accel: bool) -> None:
    # `persistent_workers=True` with `num_workers=0` raises ValueError in DataLoader.__init__.
    options = '{"num_workers": 2, "pin_memory": False} if use_cuda else {}'
    result, _ = run(CONDITIONAL.replace("OPTIONS", options))
    kwargs = assigned_options(result.source, use_accel)
    loader = DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2, **kwargs)
    assert loader.persistent_workers is use_accel
    assert loader.num_workers == (2 if use_accel else 0)


def test_a_merged_dict_gets_the_entry_once_for_every_loader_it_reaches() -> None:
    result, declined = run(MERGED.replace("EXTRA\n", ""))
    assert (
        'accel_kwargs = {"num_workers": 1, "pin_memory": True, "persistent_workers": True}\n'
        in result.source
    )
    assert result.source.count("persistent_workers") == 1
    assert not declined
    fixed = {d.line for d in result.diagnostics if d.status is Status.FIXED}
    assert fixed == {11, 12}  # one edit, and each loader it fixes says so


def test_workers_in_two_merged_dicts_are_declined() -> None:
    # The base could start workers and the merge set 0: an entry in one could meet the other.
    source = MERGED.replace("EXTRA\n", "").replace(
        'train_kwargs = {"batch_size": 64}', 'train_kwargs = {"batch_size": 64, "num_workers": 4}'
    )
    result, declined = run(source)
    assert not result.changed
    assert "`num_workers` is set by more than one of the dicts" in declined[11]


def test_a_merged_dict_that_reaches_more_than_loader_options_is_declined() -> None:
    source = MERGED.replace(
        "EXTRA\n", "    log_kwargs = {}\n    log_kwargs.update(accel_kwargs)\n    log(log_kwargs)\n"
    )
    result, declined = run(source)
    assert not result.changed
    assert "`accel_kwargs` is also merged into `log_kwargs.update`" in declined[15]


def test_an_update_after_the_loader_is_built_is_named() -> None:
    source = MERGED.replace("EXTRA\n", "").replace(
        "for epoch in range(3):", 'test_kwargs.update({"num_workers": 0})\nfor epoch in range(3):'
    )
    result, declined = run(source)
    assert not result.changed
    assert (
        '`test_kwargs.update({"num_workers": 0})` comes after the loader is built' in declined[12]
    )

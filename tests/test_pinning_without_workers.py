"""OPT101 pins only loaders with worker processes: without them DataLoader pins each batch in the
training process itself, right before the loop gets it, which is pinning by hand again (PyTorch's
pin_memory tutorial: usually slower than the plain copy). The torch behaviour behind the decline
is checked here on the CPU by standing in for the accelerator's pinning."""

from __future__ import annotations

import threading
from typing import List

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data._utils import pin_memory as pinning

from optimizer_codemod import rewrite

PIN = "pin_memory=torch.cuda.is_available()"


@pytest.fixture
def pinning_threads(monkeypatch) -> List[threading.Thread]:
    """The threads DataLoader pins batches in, on a CPU made to look like it has an accelerator."""
    threads: List[threading.Thread] = []

    def record(data, device=None):
        threads.append(threading.current_thread())
        return data

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda index: None)
    # The pinning thread lowers torch's thread count; keep this process's as it is.
    monkeypatch.setattr(torch, "set_num_threads", lambda count: None)
    monkeypatch.setattr(pinning, "pin_memory", record)
    return threads


def _loader(workers: int) -> DataLoader:
    data = TensorDataset(torch.arange(8.0))
    return DataLoader(data, batch_size=2, num_workers=workers, pin_memory=True)


def test_without_workers_each_batch_is_pinned_in_the_training_thread(pinning_threads) -> None:
    batches = list(_loader(0))
    assert len(batches) == 4
    assert pinning_threads == [threading.main_thread()] * 4


def test_with_workers_a_separate_thread_pins_the_batches(pinning_threads) -> None:
    batches = list(_loader(1))
    assert len(batches) == 4 and len(pinning_threads) == 4
    assert threading.main_thread() not in pinning_threads


SCRIPT = """\
import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

{setup}loader = DataLoader(
    datasets.MNIST("data", transform=transforms.ToTensor()), batch_size=64{options}
)
for x, y in loader:
    loss = loss_fn(model(x.to(device)), y.to(device))
    loss.backward()
"""


def _opt101(setup: str, options: str):
    source = SCRIPT.format(setup=setup, options=options)
    result = rewrite(source, path="train.py", select=["OPT101"], why_not=True)
    return result, [d for d in result.diagnostics if d.code == "OPT101"]


@pytest.mark.parametrize(
    "setup, options",
    [
        ("", ""),
        ("", ", num_workers=0"),
        ("workers = 0\n", ", num_workers=workers"),
        ('options = {"num_workers": 0}\n', ", **options"),
    ],
)
def test_a_loader_without_workers_is_declined_with_the_reason(setup: str, options: str) -> None:
    result, [finding] = _opt101(setup, options)
    assert PIN not in result.source
    assert finding.status.value == "declined"
    assert "prepares its batches in the training process" in finding.message
    assert "set `num_workers` first" in finding.message


@pytest.mark.parametrize(
    "setup, options",
    [
        ("", ", num_workers=4"),
        ("import os\n", ", num_workers=os.cpu_count()"),
        ("workers = int(input())\n", ", num_workers=workers"),
        # workers on some path: the author chose them there, and pinning pays off there
        ("workers = 4 if torch.cuda.is_available() else 0\n", ", num_workers=workers"),
    ],
)
def test_a_loader_that_may_have_workers_is_pinned(setup: str, options: str) -> None:
    result, [finding] = _opt101(setup, options)
    assert PIN in result.source, result.diagnostics
    assert finding.status.value == "fixed"


def test_workers_added_by_opt102_let_opt101_pin_in_the_same_run() -> None:
    source = (
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "from torchvision import datasets, transforms\n\n\n"
        "def main():\n"
        '    data = datasets.MNIST("data", transform=transforms.ToTensor())\n'
        "    loader = DataLoader(data, batch_size=64)\n"
        "    for x, y in loader:\n"
        "        loss = loss_fn(model(x.to(device)), y.to(device))\n"
        "        loss.backward()\n\n\n"
        'if __name__ == "__main__":\n'
        "    main()\n"
    )
    alone = rewrite(source, path="train.py", select=["OPT101"], unsafe_fixes=True)
    assert PIN not in alone.source
    both = rewrite(source, path="train.py", select=["OPT101", "OPT102"], unsafe_fixes=True)
    assert "num_workers=min(4, os.cpu_count() or 1)" in both.source and PIN in both.source
    fixed = {d.code for d in both.diagnostics if d.status.value == "fixed"}
    assert fixed == {"OPT101", "OPT102"}
    # the first pass's decline is not shown for a loader a later pass pinned
    assert not [d for d in both.diagnostics if d.status.value == "declined"]

"""`num_workers=num_workers` with the name bound to 0 (udacity's notebooks set
`num_workers = 0` in an early cell): the loader runs in the main process all the same. In a
notebook OPT102 declines with its notebook reason; in a script the setting is the author's
and is left as chosen, with a reason when asked (it was silent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import messages_by_code
from optimizer_codemod import runner
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import Status

SCRIPT = """\
import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

{binding}
device = "cuda"


def main():
    data = datasets.MNIST("data", train=True, transform=transforms.ToTensor())
    loader = DataLoader(data, batch_size=64, num_workers=num_workers)
    model = torch.nn.Linear(784, 10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x.view(-1, 784).to(device)), y.to(device))
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""


def _run(tmp_path: Path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    [outcome] = runner.run(
        [str(path)],
        Settings(root=str(tmp_path), why_not=True, select=("OPT102",)),
        runner.Mode(write=False, keep_text=True),
    )
    return outcome


@pytest.mark.parametrize(
    "binding, reason",
    [
        ("num_workers = 0", "`num_workers` is `num_workers`, which the script sets to 0"),
        ("num_workers = 2", None),  # workers chosen: nothing to say
        ("num_workers = 0\nnum_workers = 4", None),  # not 0 on every path
        # bound by a loop as well: what it holds is not only what the assignment shows
        ("num_workers = 0\nfor num_workers in range(2):\n    pass", None),
    ],
)
def test_a_script_binding_num_workers_to_zero_is_told_where_to_raise_it(
    tmp_path: Path, binding: str, reason
) -> None:
    outcome = _run(tmp_path, "train.py", SCRIPT.replace("{binding}", binding))
    assert outcome.new_text == SCRIPT.replace("{binding}", binding).encode()
    declined = messages_by_code(outcome, Status.DECLINED).get("OPT102", [])
    assert [m for m in declined if reason and reason in m] if reason else not declined


def test_a_parameter_named_like_the_zero_setting_is_not_taken_for_it(tmp_path: Path) -> None:
    text = SCRIPT.replace("{binding}", "num_workers = 0").replace(
        "def main():", "def main(num_workers=4):"
    )
    outcome = _run(tmp_path, "train.py", text)
    declined = messages_by_code(outcome, Status.DECLINED).get("OPT102", [])
    assert not [m for m in declined if "sets to 0" in m]


def test_a_notebook_binding_num_workers_to_zero_gets_the_notebook_reason(tmp_path: Path) -> None:
    cells = [
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "from torchvision import datasets, transforms",
        "num_workers = 0\nbatch_size = 20",
        "data = datasets.MNIST('data', train=True, transform=transforms.ToTensor())\n"
        "loader = DataLoader(data, batch_size=batch_size, num_workers=num_workers)",
        "model = torch.nn.Linear(784, 10).cuda()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in loader:\n"
        "    loss = torch.nn.functional.cross_entropy(model(x.view(-1, 784).cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()",
    ]
    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "source": c,
                "outputs": [],
                "execution_count": None,
            }
            for c in cells
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    outcome = _run(tmp_path, "train.ipynb", json.dumps(notebook))
    [why] = messages_by_code(outcome, Status.DECLINED)["OPT102"]
    assert why.startswith("a notebook: worker processes started with spawn")

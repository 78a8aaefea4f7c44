"""A DataLoader built and returned by a function of another module of the run (yunjey's
`data_loader = get_loader(...)` from data_loader.py; mrdbourke's `train_dl, test_dl, names =
data_setup.create_dataloaders(...)`): the caller's OPT201 knows whether it pins (project.
ImportedLoader), and the builder's OPT101 knows the caller copies its batches to the device
(project.IncomingCall.returned)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Sequence

import pytest

from conftest import messages_by_code
from optimizer_codemod import runner
from optimizer_codemod.analysis.project import project_facts
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import FileOutcome, Status

DATA = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def get_loader(n, batch_size):
    data = TensorDataset(torch.randn(n, 4), torch.randint(0, 2, (n,)))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True{options})
    return loader


def create_dataloaders(n):
    train = DataLoader(TensorDataset(torch.randn(n, 4)), batch_size=4{options})
    test = DataLoader(TensorDataset(torch.randn(n, 4)), batch_size=4{options})
    return train, test, ["a", "b"]
"""
TRAIN = """\
import torch
import torch.nn.functional as F

import data
from data import get_loader

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def main():
    loader = get_loader(64, 16)
    train_dl, test_dl, names = data.create_dataloaders(64)
    for epoch in range(2):
        for x, y in loader:
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        for (x,) in train_dl:
            model(x.to(device)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        for (x,) in test_dl:
            print(model(x).sum())


if __name__ == "__main__":
    main()
"""


def run(
    tmp_path: Path,
    options: str,
    files: Sequence[str] = ("train.py", "data.py"),
    code: str = "OPT201",
    train: str = TRAIN,
) -> Dict[str, FileOutcome]:
    (tmp_path / "train.py").write_text(train)
    (tmp_path / "data.py").write_text(DATA.replace("{options}", options))
    outcomes = runner.run(
        [str(tmp_path / name) for name in files],
        Settings(root=str(tmp_path), why_not=True, select=(code,)),
        runner.Mode(write=False, keep_text=True),
    )
    return {Path(o.path).name: o for o in outcomes}


def test_the_index_summarises_each_returned_loader(tmp_path: Path) -> None:
    run(tmp_path, ", pin_memory=True")
    facts = project_facts([str(tmp_path / "train.py"), str(tmp_path / "data.py")])
    train = facts[str(tmp_path / "train.py")]
    assert [(l.name, l.index, l.loader) for l in train.imported_loaders] == [
        ("data.create_dataloaders", 0, "pinned"),
        ("data.create_dataloaders", 1, "pinned"),
        ("data.get_loader", -1, "pinned"),
        ("get_loader", -1, "pinned"),
    ]
    uses = {c.target: c.returned for c in facts[str(tmp_path / "data.py")].calls}
    # test_dl's batches stay on the host: iterated, never copied
    assert uses == {
        "get_loader": ((-1, "copied", True),),
        "create_dataloaders": ((0, "copied", True), (1, "iterated", True)),
    }


def test_copies_of_a_pinned_loader_built_elsewhere_are_made_asynchronous(tmp_path: Path) -> None:
    outcome = run(tmp_path, ", pin_memory=True")["train.py"]
    fixed = messages_by_code(outcome, Status.FIXED)["OPT201"]
    assert len(fixed) == 3  # x and y of `loader`, x of `train_dl`
    assert outcome.new_text.decode().count("non_blocking=True") == 3


def test_copies_of_an_unpinned_loader_built_elsewhere_are_declined_with_why(tmp_path: Path) -> None:
    outcome = run(tmp_path, "")["train.py"]
    declined = messages_by_code(outcome, Status.DECLINED)["OPT201"]
    assert len(declined) == 3
    assert all("not built with `pin_memory=True`" in message for message in declined)


def test_the_builder_pins_the_loaders_whose_batches_the_caller_copies(tmp_path: Path) -> None:
    outcome = run(tmp_path, ", num_workers=2", code="OPT101")["data.py"]
    fixed = messages_by_code(outcome, Status.FIXED)["OPT101"]
    # get_loader's loader and create_dataloaders' train loader; the test loader is never copied
    assert len(fixed) == 2
    assert not messages_by_code(outcome, Status.DECLINED).get("OPT101")


@pytest.mark.parametrize(
    "files, train",
    [
        (("data.py",), TRAIN),  # given alone: no caller is known
        (("train.py", "data.py"), TRAIN.replace(".to(device)", "")),  # batches stay on the host
    ],
)
def test_without_a_copying_caller_the_builder_is_left_alone(tmp_path: Path, files, train) -> None:
    outcome = run(tmp_path, "", files=files, code="OPT101", train=train)["data.py"]
    assert not outcome.diagnostics


WORKERS_DATA = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def get_loader(n, num_workers):
    data = TensorDataset(torch.randn(n, 4))
    return DataLoader(data, batch_size=4, num_workers=num_workers)
"""
WORKERS_TRAIN = """\
from data import get_loader


def main(epochs):
    loader = get_loader(64, num_workers=2)
    {extra}
    for epoch in range(epochs):
        for (x,) in loader:
            print(x.sum())


if __name__ == "__main__":
    main(3)
"""


@pytest.mark.parametrize(
    "extra, fixed",
    [
        ("pass", True),  # iterated every epoch: the builder keeps its workers
        ("loader.dataset.tensors = ()", False),  # the caller changes the dataset
    ],
)
def test_the_builder_keeps_workers_of_a_loader_a_caller_iterates_every_epoch(
    tmp_path: Path, extra: str, fixed: bool
) -> None:
    (tmp_path / "train.py").write_text(WORKERS_TRAIN.replace("{extra}", extra))
    (tmp_path / "data.py").write_text(WORKERS_DATA)
    outcomes = runner.run(
        [str(tmp_path / "train.py"), str(tmp_path / "data.py")],
        Settings(root=str(tmp_path), why_not=True, select=("OPT103",), unsafe_fixes=True),
        runner.Mode(write=False, keep_text=True),
    )
    data = {Path(o.path).name: o for o in outcomes}["data.py"]
    assert bool(messages_by_code(data, Status.FIXED).get("OPT103")) is fixed
    if fixed:
        assert "persistent_workers=num_workers > 0" in data.new_text.decode()
    else:
        [why] = messages_by_code(data, Status.DECLINED)["OPT103"]
        assert "returned by `get_loader()`" in why


HANDED_TRAIN = """\
import torch
import torch.nn.functional as F

from data import get_loader

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def loss_of(x, y, model):
    {copy}
    return F.cross_entropy(model(x), y)


def fit(model, optimizer, train_loader, epochs):
    for epoch in range(epochs):
        for x, y in train_loader:
            loss = loss_of(x, y, model)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        {extra}


def main():
    model = torch.nn.Linear(4, 2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = get_loader(64, 16)
    fit(model, optimizer, loader, 3)


if __name__ == "__main__":
    main()
"""


def _handed(copy: str = "x, y = x.to(device), y.to(device)", extra: str = "pass") -> str:
    return HANDED_TRAIN.replace("{copy}", copy).replace("{extra}", extra)


@pytest.mark.parametrize(
    "train, use",
    [
        # rasbt's ch05: the loader goes to `train_model_simple`, whose loop hands each batch
        # to `calc_loss_batch`, which copies it: copied, once per epoch.
        (_handed(), (-1, "copied", True)),
        (_handed("x = x.cuda()"), (-1, "copied", True)),
        (_handed("y = y.float().to(device)"), (-1, "copied", True)),  # a view of the batch
        # the parameter is bound again before the copy: what is copied is not the batch
        (_handed("x = torch.zeros(2, 4)\n    x = x.to(device)"), (-1, "iterated", True)),
        (_handed("for _ in range(2):\n        x = x.to(device)"), (-1, "iterated", True)),
        (_handed("pass"), (-1, "iterated", True)),
        (_handed(extra="print(len(train_loader.dataset))"), (-1, "copied", False)),
        # handed to a function this file does not define: nothing is known of its loops
        (_handed().replace("    fit(model, optimizer, loader, 3)", "    print(loader)"), None),
    ],
)
def test_a_loader_handed_to_a_function_of_the_caller_is_followed_into_it(
    tmp_path: Path, train: str, use
) -> None:
    run(tmp_path, "", train=train)
    facts = project_facts([str(tmp_path / "train.py"), str(tmp_path / "data.py")])
    uses = {c.target: c.returned for c in facts[str(tmp_path / "data.py")].calls}
    assert uses["get_loader"] == (((-1, "", False),) if use is None else (use,))


def test_the_builder_pins_a_loader_the_caller_hands_to_a_copying_function(
    tmp_path: Path,
) -> None:
    outcome = run(tmp_path, ", num_workers=2", code="OPT101", train=_handed())["data.py"]
    fixed = messages_by_code(outcome, Status.FIXED)["OPT101"]
    assert len(fixed) == 1  # get_loader's; create_dataloaders is not called here
    assert outcome.new_text.decode().count("pin_memory=torch.cuda.is_available()") == 1
    outcome = run(tmp_path, ", num_workers=2", code="OPT101", train=_handed("pass"))["data.py"]
    assert not messages_by_code(outcome, Status.FIXED).get("OPT101")

"""Loops over a generator that yields its argument's items unchanged (`metric_logger.
log_every(data_loader, 10, header)`, torchvision's references, DETR, MAE) are loops over that
argument: OPT201 follows them to the pinned DataLoader, whether the generator is a method of
a class of this file or of another module of the run, and whether the loader is built in the
same file (torchvision) or handed in from the script (DETR's engine.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import libcst as cst
import pytest

from optimizer_codemod import runner
from optimizer_codemod.analysis import ScriptFacts
from optimizer_codemod.analysis.handoffs import pass_through_argument, passed_through
from optimizer_codemod.config import Settings

LOGGER = """\
import time


class MetricLogger:
    def __init__(self, delimiter="\\t"):
        self.delimiter = delimiter

    def log_every(self, iterable, print_freq, header=None):
        start = time.time()
        for i, obj in enumerate(iterable):
            yield {YIELDED}
            if i % print_freq == 0:
                print(header, i, time.time() - start)
"""
ENGINE = """\
import torch.nn.functional as F

import utils


def train_one_epoch(model, data_loader, optimizer, device):
    metric_logger = utils.MetricLogger(delimiter="  ")
    for samples, targets in metric_logger.log_every(data_loader, 10, "Epoch"):
        samples = samples.to(device)
        loss = F.cross_entropy(model(samples), targets.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""
MAIN = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from engine import train_one_epoch


def main(epochs=2):
    device = torch.device("cuda")
    dataset = TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
    data_loader_train = DataLoader(dataset, batch_size=16, pin_memory=True)
    model = nn.Linear(8, 4).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        train_one_epoch(model, data_loader_train, optimizer, device)


if __name__ == "__main__":
    main()
"""


def _opt201(folder: Path, yielded: str, files: Dict[str, str]) -> Dict[str, List[str]]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "utils.py").write_text(LOGGER.replace("{YIELDED}", yielded))
    for name, text in files.items():
        (folder / name).write_text(text)
    settings = Settings(select=("OPT201",), why_not=True, root=str(folder))
    paths = sorted(str(p) for p in folder.glob("*.py"))
    found: Dict[str, List[str]] = {}
    for outcome in runner.run(paths, settings, runner.Mode(write=False, diff=True), jobs=1):
        assert outcome.error is None, outcome.error
        for d in outcome.diagnostics:
            found.setdefault(Path(outcome.path).name, []).append(f"{d.status.value}: {d.message}")
    return found


def test_a_loop_in_another_module_over_log_every_copies_without_blocking(tmp_path):
    found = _opt201(tmp_path, "obj", {"engine.py": ENGINE, "main.py": MAIN})
    assert len(found["engine.py"]) == 2, found
    assert all(m.startswith("fixed: ") and "pinned DataLoader" in m for m in found["engine.py"])


def test_a_loader_built_beside_the_loop_is_followed_through_the_imported_logger(tmp_path):
    script = MAIN.replace("from engine import train_one_epoch\n", ENGINE.split("\n\n\n")[1])
    script = "import torch.nn.functional as F\nimport utils\n" + script
    found = _opt201(tmp_path, "obj", {"train.py": script})
    assert len(found["train.py"]) == 2, found
    assert all(m.startswith("fixed: ") for m in found["train.py"]), found


@pytest.mark.parametrize("yielded", ["obj.clone()", "i, obj", "start"])
def test_a_generator_that_changes_the_items_is_not_followed(tmp_path, yielded):
    found = _opt201(tmp_path, yielded, {"engine.py": ENGINE, "main.py": MAIN})
    assert not any(m.startswith("fixed: ") for m in found.get("engine.py", [])), found


def _function(source: str) -> cst.FunctionDef:
    return cst.parse_module(source).body[0]


@pytest.mark.parametrize(
    "source, expected",
    [
        ("def cycle(dl):\n    while True:\n        for x in dl:\n            yield x\n", "dl"),
        (
            "def pairs(a, b):\n    for x in a:\n        yield x\n    for y in b:\n        yield y\n",
            None,
        ),
        ("def first(dl):\n    for x in dl:\n        x = x * 2\n        yield x\n", None),
        (
            "def nested(dl):\n    def inner():\n        yield 1\n    for x in dl:\n        yield x\n",
            None,
        ),
        ("def plain(dl):\n    return list(dl)\n", None),
        ("def part(dl):\n    for x, y in dl:\n        yield x\n", None),  # half of each item
        ("def counted(dl):\n    for i, x in enumerate(dl):\n        yield x\n", "dl"),
        ("def index(dl):\n    for i, x in enumerate(dl):\n        yield i\n", None),
    ],
)
def test_which_generators_pass_their_argument_on(source, expected):
    module = cst.parse_module(source)
    facts = ScriptFacts.of(module)
    assert passed_through(facts, module.body[0]) == expected


def test_the_argument_of_a_method_of_a_class_of_this_file():
    source = LOGGER.replace("{YIELDED}", "obj") + (
        "\n\ndef run(loader):\n    logger = MetricLogger()\n"
        "    for x in logger.log_every(print_freq=5, iterable=loader):\n        print(x)\n"
    )
    facts = ScriptFacts.of(cst.parse_module(source))
    loop = next(loop for loop in facts.records.loops if loop.function.name.value == "run")
    assert cst.Module([]).code_for_node(pass_through_argument(facts, loop.iter)) == "loader"
    assert facts.iterated_name(loop.iter) == "loader"


def _many_loggers_and_groups(count: int) -> str:
    """`count` generator classes, parameter-group helpers (with a nested walker, called a
    few times) and loops over each generator."""
    parts = ["import torch\n"]
    for index in range(count):
        parts.append(f"""

class Logger{index}:
    def log_every(self, iterable, freq):
        for i, obj in enumerate(iterable):
            yield obj


def groups_{index}(model, wd):
    found = []

    def walk(module):
        found.extend(module.parameters(recurse=False))
""")
        parts.extend("    walk(model)\n" for _ in range(3))
        parts.append(f"""    return [{{"params": found, "weight_decay": wd}}]


def run_{index}(model, loader):
    optimizer = torch.optim.SGD(groups_{index}(model, 0.1), lr=0.1)
    logger = Logger{index}()
    for x in logger.log_every(loader, 10):
        model(x).sum().backward()
        optimizer.step()
""")
    return "".join(parts)


def test_following_generators_and_groups_costs_linear_work() -> None:
    from test_scaling import assert_linear_work, counted

    from optimizer_codemod.analysis.parameter_groups import gathering_functions

    def work(count: int):
        facts = ScriptFacts.of(cst.parse_module(_many_loggers_and_groups(count)))
        loops = [
            loop for loop in facts.records.loops if loop.function.name.value.startswith("run_")
        ]

        def ask():
            return [facts.iterated_name(loop.iter) for loop in loops], gathering_functions(facts)

        counts, (names, groups) = counted(ask)
        assert names == ["loader"] * count and len(groups) == count
        return counts

    assert_linear_work(work, 4)

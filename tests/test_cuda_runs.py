"""Runs that require CUDA before their loop (analysis/cuda_runs.py), seen through OPT201: a
copy to a device the analysis cannot see is fixed only where every run reaching the loop has
already done something that raises without CUDA, and reported everywhere else."""

from __future__ import annotations

import pytest

from pathlib import Path

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "OPT201"
# `device` is a parameter of `main`, which nothing calls: it may be MPS unless the run
# requires CUDA.
BASE = """\
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader


def setup():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


def train(model, loader, device):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x = x.to(device)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def main(model, dataset, device):
    setup()
    loader = DataLoader(dataset, batch_size=32, pin_memory=True)
    train(model, loader, device)
"""
CALL = "    setup()\n    loader"
REQUIREMENT = '    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n'
FIXED = "x = x.to(device, non_blocking=True)"
UNSEEN = "the device is chosen where the analysis cannot see it"


def _opt201(source: str):
    return rewrite(source, path="train.py", select=["OPT201"], why_not=True)


def _edited(*changes) -> str:
    source = BASE
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new, 1)
    return source


def test_a_requirement_in_a_function_called_before_the_loops_function_fixes_the_copy() -> None:
    result = _opt201(BASE)
    assert FIXED in result.source
    [fixed] = [d for d in result.diagnostics if d.status is Status.FIXED]
    assert "the run requires CUDA" in fixed.message
    assert "`setup()` (which runs `torch.cuda.set_device(" in fixed.message
    assert "before every call of `train`" in fixed.message


TRAIN_CALL = "    train(model, loader, device)\n"
# Edits of BASE after which every run has required CUDA before the loop.
REQUIRED = {
    "nccl-keyword": [(REQUIREMENT, '    dist.init_process_group(backend="NCCL")\n')],
    "nccl-positional-full-name": [
        (REQUIREMENT, '    torch.distributed.init_process_group("nccl", world_size=2)\n')
    ],
    "set-device-index": [(REQUIREMENT, "    torch.cuda.set_device(0)\n")],
    "set-device-string": [(REQUIREMENT, '    torch.cuda.set_device("cuda:1")\n')],
    "assert-cuda": [(REQUIREMENT, "    assert torch.cuda.is_available(), 'needs a GPU'\n")],
    "index-from-environment": [
        (REQUIREMENT, '    rank = int(os.getenv("RANK"))\n    torch.cuda.set_device(rank)\n')
    ],
    "assigned-result": [(CALL, "    ready = setup()\n    loader")],
    # At the top of the module, before the loop's function is defined: importing runs it.
    "module-top": [(CALL, "    loader"), ("\n\ndef train(", "\n\nsetup()\n\n\ndef train(")],
    # In the main guard, before the call of the function that calls the loop's.
    "main-guard": [
        (CALL, "    loader"),
        (
            TRAIN_CALL,
            TRAIN_CALL + "\n\nif __name__ == '__main__':\n    setup()\n    main(1, 2, 3)\n",
        ),
    ],
}
# Edits after which some run may reach the loop without CUDA.
SKIPPABLE = {
    "under-if": [(CALL, "    if torch.cuda.is_available():\n        setup()\n    loader")],
    "under-try": [
        (CALL, "    try:\n        setup()\n    except RuntimeError:\n        pass\n    loader")
    ],
    "under-with": [(CALL, "    with contextlib.suppress(Exception):\n        setup()\n    loader")],
    "in-a-loop": [(CALL, "    for _ in range(world):\n        setup()\n    loader")],
    "conditional-expression": [(CALL, "    setup() if distributed else None\n    loader")],
    "after-the-loop": [(CALL, "    loader"), (TRAIN_CALL, TRAIN_CALL + "    setup()\n")],
    "never-called": [(CALL, "    loader")],
    "index-may-be-negative": [(REQUIREMENT, "    torch.cuda.set_device(args.local_rank)\n")],
    "negative-index": [(REQUIREMENT, "    torch.cuda.set_device(-1)\n")],
    "backend-through-a-name": [
        (REQUIREMENT, '    backend = "nccl"\n    dist.init_process_group(backend)\n')
    ],
    "gloo": [(REQUIREMENT, '    dist.init_process_group("gloo")\n')],
    "assert-or": [(REQUIREMENT, "    assert torch.cuda.is_available() or args.cpu\n")],
    "early-return": [(REQUIREMENT, "    if not distributed:\n        return\n" + REQUIREMENT)],
    "generator": [(REQUIREMENT, REQUIREMENT + "    yield\n")],
    "decorated": [("def setup():", "@rank_zero_only\ndef setup():")],
    # The loop's function also runs where the file does not show, or before the setup.
    "passed-around": [(TRAIN_CALL, TRAIN_CALL + "    spawn(train)\n")],
    "called-before-setup-too": [(CALL, "    train(model, None, device)\n" + CALL)],
}


@pytest.mark.parametrize("changes", REQUIRED.values(), ids=REQUIRED.keys())
def test_requirements_that_every_run_meets_before_the_loop(changes) -> None:
    assert FIXED in _opt201(_edited(*changes)).source


@pytest.mark.parametrize("changes", SKIPPABLE.values(), ids=SKIPPABLE.keys())
def test_requirements_some_run_may_skip_leave_the_copy_reported(changes) -> None:
    result = _opt201(_edited(*changes))
    assert FIXED not in result.source and "non_blocking" not in result.source
    assert any(UNSEEN in d.message for d in result.diagnostics)


SOME_PATHS = FIXTURES / "report_cuda_required_on_some_paths_only.py"


@pytest.mark.parametrize(
    "function, edit",
    [
        (
            "train_where_cuda_is",
            ("    if torch.cuda.is_available():\n        torch.cuda", "    torch.cuda"),
        ),
        (
            "train_without_setup",
            (
                "    loader = DataLoader(dataset, batch_size=16",
                "    ddp_setup(0)\n    loader = DataLoader(dataset, batch_size=16",
            ),
        ),
        (
            "train_then_share",
            ("momentum=0.9)\n", 'momentum=0.9)\n    dist.init_process_group("nccl")\n'),
        ),
        (
            "train_on_any_backend",
            ("dist.init_process_group(backend)", 'dist.init_process_group("nccl")'),
        ),
    ],
)
def test_each_loop_of_the_some_paths_fixture_is_fixed_once_its_run_requires_cuda(
    function: str, edit
) -> None:
    source = SOME_PATHS.read_text()
    assert _opt201(source).source == source
    assert source.count(edit[0]) == 1
    fixed = _opt201(source.replace(*edit)).source
    changed = [name for name in fixed.split("\ndef ")[1:] if "non_blocking=True" in name]
    assert [text.split("(")[0] for text in changed] == [function]


TRAINER = """\
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader


class Trainer:
    def __init__(self, model, dataset):
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(self.gpu_id)
        self.model = model.to(self.gpu_id)
        self.loader = DataLoader(dataset, batch_size=8, pin_memory=True)

    def fit(self):
        for x, y in self.loader:
            F.mse_loss(self.model(x.to(self.gpu_id)), y.to(self.gpu_id)).backward()
"""


@pytest.mark.parametrize(
    "change, fixed",
    [
        (("", ""), True),
        (
            (
                "        torch.cuda.set_device",
                "        if self.gpu_id >= 0:\n            torch.cuda.set_device",
            ),
            False,
        ),
        (("class Trainer:", "class Base:\n    pass\n\n\nclass Trainer(Base):"), False),
        (("\n    def fit", "\n    @staticmethod\n    def fit"), False),
        (
            (
                "backward()\n",
                "backward()\n\n\nclass Quick(Trainer):\n    def __init__(self):\n        pass\n",
            ),
            False,
        ),
    ],
    ids=["in-init", "under-if", "related-to-a-class-of-the-file", "static", "subclassed"],
)
def test_a_requirement_in_the_constructor_holds_for_the_methods_of_its_instances(
    change, fixed: bool
) -> None:
    assert TRAINER.count(change[0]) == 1 or not change[0]
    source = TRAINER.replace(*change) if change[0] else TRAINER
    assert ("non_blocking=True" in _opt201(source).source) is fixed


def test_a_flat_script_requires_cuda_before_its_loop_only_when_the_call_comes_first() -> None:
    flat = (
        "import torch\nimport torch.nn.functional as F\nfrom torch.utils.data import DataLoader\n"
        "{before}loader = DataLoader(dataset, batch_size=8, pin_memory=True)\n"
        "for x, y in loader:\n    x = x.to(args.device)\n"
        "    F.mse_loss(model(x), y).backward()\n{after}"
    )
    line = "torch.cuda.set_device(0)\n"
    assert "non_blocking=True" in _opt201(flat.format(before=line, after="")).source
    # Without CUDA required first, `args.device` (a device by its name) may be MPS: the copy is
    # asynchronous only where it names CUDA.
    after = _opt201(flat.format(before="", after=line)).source
    assert "non_blocking=True" not in after
    assert 'non_blocking=torch.device(args.device).type == "cuda"' in after

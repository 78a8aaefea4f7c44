"""Optimizers built on parameter groups a helper gathers from the model (torchvision's
classification reference: `parameters = utils.set_weight_decay(model, ...)`), and models
converted to SyncBatchNorm after their placement: the per-model rules follow both. Once such
models are known, torchvision's weight lookups (`get_weight`) must not pass for
convolutional builders (the video reference's model is chosen by name among 3-D convnets)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Dict

import libcst as cst
import pytest

from optimizer_codemod import runner
from optimizer_codemod.analysis.parameter_groups import gathered_module, gathering_functions
from optimizer_codemod.analysis.project import from_json, project_facts, to_json
from optimizer_codemod.analysis.script import ScriptFacts
from optimizer_codemod.config import Settings

UTILS = """\
import torch


def set_weight_decay(model, weight_decay, norm_weight_decay=None):
    norm_classes = (torch.nn.BatchNorm2d, torch.nn.LayerNorm)
    params = {"other": [], "norm": []}

    def _add_params(module, prefix=""):
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            key = "norm" if isinstance(module, norm_classes) else "other"
            params[key].append(p)
        for child_name, child_module in module.named_children():
            _add_params(child_module, prefix=f"{prefix}.{child_name}")

    _add_params(model)
    decay = {"other": weight_decay, "norm": norm_weight_decay or weight_decay}
    return [{"params": params[k], "weight_decay": decay[k]} for k in params if params[k]]


def frozen_copy(model):
    print(sum(p.numel() for p in model.head.parameters()))
    return [torch.nn.Parameter(torch.zeros(1))]
"""
TRAIN = """\
import torch
import torchvision

import utils


def train_one_epoch(model, criterion, optimizer, data_loader, device):
    model.train()
    for image, target in data_loader:
        image, target = image.to(device), target.to(device)
        loss = criterion(model(image), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main(args):
    device = torch.device(args.device)
    dataset = torchvision.datasets.FakeData(transform=torchvision.transforms.ToTensor())
    data_loader = torch.utils.data.DataLoader(dataset, batch_size=32)
    model = torchvision.models.get_model(args.model, num_classes=10)
    model.to(device)
    if args.distributed and args.sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    criterion = torch.nn.CrossEntropyLoss()
    parameters = {GROUPS}
    optimizer = torch.optim.SGD(parameters, lr=0.1, momentum=0.9)
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    for epoch in range(args.epochs):
        train_one_epoch(model, criterion, optimizer, data_loader, device)
"""


def _reports(tmp_path: Path, groups: str, paths=("train.py",)) -> Dict[str, str]:
    (tmp_path / "train.py").write_text(TRAIN.replace("{GROUPS}", groups))
    (tmp_path / "utils.py").write_text(UTILS)
    settings = Settings(
        root=str(tmp_path), select=("OPT302", "OPT402"), why_not=True, unsafe_fixes=True
    )
    found: Dict[str, str] = {}
    files = [str(tmp_path / p) for p in paths]
    for outcome in runner.run(files, settings, runner.Mode(write=False, diff=True), jobs=1):
        assert outcome.error is None, outcome.error
        for d in outcome.diagnostics:
            if Path(outcome.path).name == "train.py":
                found[d.code] = f"{d.status.value}: {d.message}"
    return found


@pytest.mark.parametrize("paths", [("train.py",), ("train.py", "utils.py")])
def test_groups_gathered_by_a_helper_module_train_the_model_handed_to_it(tmp_path, paths):
    found = _reports(tmp_path, "utils.set_weight_decay(model, args.weight_decay)", paths)
    assert found["OPT402"].startswith("fixed: `model` is trained in eager mode"), found
    assert found["OPT302"].startswith("fixed: `model` is trained in float32"), found


def test_a_helper_that_gathers_nothing_leaves_the_model_unknown(tmp_path):
    found = _reports(tmp_path, "utils.frozen_copy(model)")
    assert found["OPT402"].startswith("declined: the model this step trains is not known"), found


OPTIMIZERS = """\
import torch


def set_optimizer(opt, model):
    optimizer = torch.optim.SGD(model.parameters(), lr=opt.lr, momentum=0.9)
    return optimizer


def optimizer_and_schedule(opt, model):
    optimizer = torch.optim.SGD(model.parameters(), lr=opt.lr)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 10)


def head_optimizer(opt, model):
    return torch.optim.SGD(model.head.parameters(), lr=opt.lr)
"""
BUILT = (
    "    parameters = {GROUPS}\n    optimizer = torch.optim.SGD(parameters, lr=0.1, momentum=0.9)\n"
)


@pytest.mark.parametrize(
    "built, known",
    [
        ("optimizer = optimizers.set_optimizer(args, model)", True),
        # SupContrast: `optimizer = set_optimizer(opt, model)`, imported by name
        ("optimizer = set_optimizer(args, model)", True),
        # a pair: which of the two is stepped is not followed
        ("optimizer, scheduler = optimizers.optimizer_and_schedule(args, model)", False),
        ("optimizer = optimizers.head_optimizer(args, model)", False),  # a part of the model
        ("optimizer = optimizers.set_optimizer(args, model)\n    optimizer = other", False),
    ],
)
def test_an_optimizer_a_helper_module_builds_trains_the_model_handed_to_it(tmp_path, built, known):
    assert BUILT in TRAIN
    train = TRAIN.replace(BUILT, f"    {built}\n").replace(
        "import utils\n", "import optimizers\nfrom optimizers import set_optimizer\n"
    )
    (tmp_path / "train.py").write_text(train)
    (tmp_path / "optimizers.py").write_text(OPTIMIZERS)
    settings = Settings(root=str(tmp_path), select=("OPT302", "OPT402"), why_not=True)
    found: Dict[str, str] = {}
    for outcome in runner.run(
        [str(tmp_path / "train.py")], settings, runner.Mode(write=False, diff=True), jobs=1
    ):
        assert outcome.error is None, outcome.error
        found.update({d.code: f"{d.status.value}: {d.message}" for d in outcome.diagnostics})
    if known:
        assert found["OPT402"].startswith("fixed: `model` is trained in eager mode"), found
        assert found["OPT302"].startswith("fixed: `model` is trained in float32"), found
    else:
        assert "is not known" in found["OPT402"] and "is not known" in found["OPT302"], found


def test_the_index_names_the_helper_and_survives_the_cache(tmp_path):
    (tmp_path / "train.py").write_text(
        TRAIN.replace("{GROUPS}", "utils.set_weight_decay(model, 0)")
    )
    (tmp_path / "utils.py").write_text(UTILS)
    index = project_facts([str(tmp_path / "train.py"), str(tmp_path / "utils.py")])
    gathering = index[str(tmp_path / "train.py")].gathering_functions
    assert [(g.name, g.module, g.parameter, g.index) for g in gathering] == [
        ("utils.set_weight_decay", "utils.py", "model", 0)
    ]
    assert from_json(json.loads(json.dumps(to_json(index)))) == index


def _facts(source: str) -> ScriptFacts:
    return ScriptFacts.of(cst.parse_module(textwrap.dedent(source)))


@pytest.mark.parametrize(
    "source, expected",
    [
        ("def groups(model, wd):\n    return [p for p in model.parameters()]\n", ("model", 0)),
        (  # a nested function walks the module handed on
            "def groups(wd, net):\n"
            "    found = []\n"
            "    def walk(module):\n"
            "        found.extend(module.named_parameters(recurse=False))\n"
            "    walk(net)\n"
            "    return found\n",
            ("net", 1),
        ),
        ("def groups(model):\n    return list(model.head.parameters())\n", None),  # a part
        (
            "def freeze(model):\n    for p in model.parameters():\n        p.requires_grad = False\n",
            None,
        ),
        ("def groups(model, other):\n    return list(other.buffers())\n", None),
        (  # Swin's build_optimizer hands the model on to another helper of the file
            "def decay(model):\n    return [p for _, p in model.named_parameters()]\n"
            "def build(config, net):\n"
            "    groups = decay(net)\n"
            "    return torch.optim.AdamW(groups)\n",
            ("net", 1),
        ),
    ],
)
def test_which_functions_gather_the_parameters_of_their_argument(source, expected):
    found = gathering_functions(_facts(source))
    assert (found.get("groups") or found.get("freeze") or found.get("build")) == expected


@pytest.mark.parametrize(
    "call, expected",
    [
        ("groups(model, 0.1)", "model"),
        ("groups(wd=0.1, model=self.net)", "self.net"),
        ("groups(*args)", None),
        ("other(model)", None),
    ],
)
def test_the_module_a_call_hands_to_a_gathering_helper(call, expected):
    facts = _facts("def groups(model, wd=0.0):\n    return list(model.parameters())\n")
    assert gathered_module(facts, cst.parse_expression(call)) == expected


@pytest.mark.parametrize(
    "qualname, expected",
    [
        ("torchvision.models.resnet50", True),
        ("torchvision.models.get_weight", False),  # looks weights up, builds nothing
        ("torchvision.models.ResNet50_Weights", False),
        ("torchvision.models.vit_b_16", False),
        ("torch.nn.Conv2d", True),
    ],
)
def test_torchvision_lookups_are_no_convolutions(qualname, expected):
    from optimizer_codemod.analysis.precision import is_convolution

    assert is_convolution(qualname) is expected

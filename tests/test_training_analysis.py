"""analysis/training.py: which model is trained, where, on which device, and at what cost."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from optimizer_codemod.analysis.script import ScriptFacts
from optimizer_codemod.analysis.training import (
    device_type_code,
    each_trained_model,
    model_built,
    model_device,
    namespace_builders,
    placement_devices,
    the_trained_model,
    torch_own_module,
    trained_models,
    training_steps,
    visible_at,
)


def facts_of(*parts: str) -> ScriptFacts:
    return ScriptFacts.of(cst.parse_module("".join(textwrap.dedent(p) for p in parts)))


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node).strip()


LOOP = """
for x, y in loader:
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
"""


def test_model_rebound_by_placement_and_wrapped_in_ddp() -> None:
    facts = facts_of(
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = Net()
        model = model.to(device)
        model = DDP(model)
        optimizer = torch.optim.AdamW(model.parameters())
        class Net(torch.nn.Module):
            pass
        """,
        LOOP,
    )
    model = the_trained_model(facts)
    assert (model.name, model.wrapped_as) == ("model", "model")
    assert code(model_built(facts, model)) == "model = model.to(device)"
    assert code(model_device(facts, model)) == "device"


def test_custom_optimizer_and_parameters_through_a_name() -> None:
    facts = facts_of(
        """
        import torch
        class SGLD(torch.optim.Optimizer):
            pass
        net = torch.nn.Linear(4, 1)
        params = list(net.parameters())
        optimizer = SGLD(params, lr=0.1)
        """,
        LOOP.replace("model(", "net("),
    )
    assert [m.name for m in trained_models(facts)] == ["net"]


def test_two_models_have_no_single_trained_model() -> None:
    facts = facts_of(
        """
        import torch
        g = torch.nn.Linear(4, 4)
        d = torch.nn.Linear(4, 1)
        opt_g = torch.optim.Adam(g.parameters())
        opt_d = torch.optim.Adam(d.parameters())
        """,
        LOOP,
    )
    assert {m.name for m in trained_models(facts)} == {"g", "d"}
    assert the_trained_model(facts) is None


def test_training_step_spans_forward_to_loss_before_backward() -> None:
    facts = facts_of("""
        import torch
        model = torch.nn.Linear(4, 1).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            x = x.to(device)
            out = model(x)
            loss = loss_fn(out, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
        """)
    (step,) = training_steps(facts, the_trained_model(facts))
    assert [code(s) for s in step.forward] == ["out = model(x)", "loss = loss_fn(out, y)"]
    assert (step.loss, step.scaler) == ("loss", "scaler")


@pytest.mark.parametrize(
    "assignment, expected",
    [
        ('device = torch.device("cuda" if torch.cuda.is_available() else "cpu")', "device.type"),
        ('device = "cuda" if torch.cuda.is_available() else "cpu"', "device"),
        ('device = f"cuda:{rank}"', "torch.device(device).type"),
        ("device = args.device", "torch.device(device).type"),
    ],
)
def test_device_type_code(assignment: str, expected: str) -> None:
    facts = facts_of(f"import torch\n{assignment}\nmodel = torch.nn.Linear(4, 1).to(device)\n")
    device = cst.parse_expression("device")
    assert device_type_code(facts, device) == expected


def test_device_visible_only_where_it_is_bound() -> None:
    module = cst.parse_module(textwrap.dedent("""
        def solve(model, puzzles):
            probs = model(puzzles)

        def evaluate(model, loader, device):
            logits = model(loader)

        def main():
            device = "cpu"
            out = model(x)
        """))
    facts = ScriptFacts(module, ScriptFacts.of(module).records)
    functions = {f.name.value: f for f in module.body}
    device = cst.parse_expression("device")
    visible = {name: visible_at(facts, device, f.body.body[-1]) for name, f in functions.items()}
    assert visible == {"solve": False, "evaluate": True, "main": True}


def test_parameter_owners_follow_each_name_once(monkeypatch) -> None:
    # Library code reassigns the same names many times; following every assignment of every
    # name again at each depth made one torch source file take minutes.
    lines = ["import torch", "p0 = model.parameters()"]
    for i in range(1, 12):
        lines += [f"p{i} = p{i - 1} + p{i - 1}", f"p{i} = [p{i - 1}, p{i - 1}]"]
    lines += ["optimizer = torch.optim.SGD(p11)", "model = torch.nn.Linear(4, 1)", LOOP]
    facts = facts_of("\n".join(lines))
    calls = []
    original = facts.assignments_to
    monkeypatch.setattr(facts, "assignments_to", lambda name: calls.append(name) or original(name))
    trained_models(facts)
    assert len(calls) < 60, f"{len(calls)} lookups"


def test_training_step_with_a_divided_loss_assigned_under_a_with() -> None:
    facts = facts_of("""
        import torch
        model = torch.nn.Linear(4, 1).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            with torch.enable_grad():
                loss = loss_fn(model(x), y)
            scaler.scale(loss / accumulation).backward()
        """)
    (step,) = training_steps(facts, the_trained_model(facts))
    assert (step.loss, step.scaler) == ("loss", "scaler")
    assert [code(s).splitlines()[0] for s in step.forward] == ["with torch.enable_grad():"]


TORCH_OWN_BASE = """\
import numpy as np
import torch
import torch.nn as nn

device = torch.device("cuda")


class Block(nn.Module):
    def forward(self, x):
        return x


{build}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    model(x).sum().backward()
    optimizer.step()
"""


@pytest.mark.parametrize(
    "build, expected",
    [
        ("model = nn.Sequential(nn.Linear(8, 16), nn.ReLU()).to(device)", "torch.nn.Sequential"),
        ("net = nn.Sequential(nn.Linear(8, 16))\nmodel = net.to(device)", "torch.nn.Sequential"),
        ("model = nn.Sequential(nn.Linear(8, 2))\nmodel = model.to(device)", "torch.nn.Sequential"),
        ("model = nn.Sequential(nn.Linear(int(np.prod((28, 28))), 10))", "torch.nn.Sequential"),
        ("d = 8\nmodel = nn.Linear(d, 10).to(device)", "torch.nn.Linear"),
        # a module class of the file, inside or by name, or modules the analysis cannot list
        ("model = Block().to(device)", None),
        ("model = nn.Sequential(Block(), nn.ReLU()).to(device)", None),
        ("encoder = Block()\nmodel = nn.Sequential(encoder, nn.ReLU())", None),
        ("model = nn.Sequential(*[Block() for _ in range(3)])", None),
        (
            "layers = []\nfor i in range(3):\n    layers.append(Block())\n"
            "model = nn.Sequential(*layers).to(device)",
            None,
        ),
    ],
)
def test_a_model_of_torchs_own_layers_is_told_from_one_holding_other_modules(
    build: str, expected
) -> None:
    facts = ScriptFacts.of(cst.parse_module(TORCH_OWN_BASE.format(build=build)))
    [model] = each_trained_model(facts)
    assert torch_own_module(facts, model) == expected


# Models built by name -------------------------------------------------------------------------
BUILT_BY_NAME = """
import torch
import torchvision.models as models
from torch import nn

class Net(nn.Module):
    pass

def net():
    return Net()

def flat():
    return torch.zeros(3)

NETS = {"net": net, "class": Net}
"""


@pytest.mark.parametrize(
    "lookup, extra, built",
    [
        ("models.__dict__[arch]()", "", True),
        ("getattr(models, arch)(num_classes=10)", "", True),
        ("vars(models)[arch]()", "", True),
        ("NETS[arch]()", "choices = sorted(NETS) + list(NETS.keys())\n", True),
        ("NETS[arch]()", "assert arch in NETS\nnames = [n for n in NETS]\n", True),
        # the namespace of a module that is no model factory
        ("torch.__dict__[arch]()", "", False),
        ("torch.nn.functional.__dict__[arch]()", "", False),
        # a dict that something may change, or one value that builds no module
        ("NETS[arch]()", "NETS['flat'] = flat\n", False),
        ("NETS[arch]()", "NETS.update(flat=flat)\n", False),
        ("NETS[arch]()", "register(NETS)\n", False),
        ("OTHER[arch]()", "OTHER = {'net': net, 'flat': flat}\n", False),
        ("OTHER[arch]()", "OTHER = {**NETS}\n", False),
        ("OTHER[arch]()", "OTHER = {}\n", False),
        # `getattr` rebound by the file is not the builtin
        ("getattr(models, arch)()", "getattr = lambda m, n: n\n", False),
    ],
)
def test_a_model_built_by_name_is_a_module_only_when_every_name_builds_one(
    lookup: str, extra: str, built: bool
) -> None:
    facts = facts_of(BUILT_BY_NAME, extra, f"model = {lookup}.to(device)\n", OPTIMIZER, LOOP)
    assert (the_trained_model(facts) is not None) is built


OPTIMIZER = "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"


def test_a_module_of_builders_is_one_whose_public_names_all_build_modules() -> None:
    builders = facts_of("""
        import torch.nn as nn
        from helpers import make_tensor

        SIZES = {"base": 768}

        class Net(nn.Module):
            pass

        def net_base(**kwargs):
            model = Net(**kwargs)
            return model

        net = net_base

        def _private():
            return 3
        """)
    assert [d.name.value for d in namespace_builders(builders)] == ["Net", "net_base"]
    for other in (
        "def width():\n    return 3\n",  # a public function that returns no module
        "@register\ndef wrapped():\n    return Net()\n",  # a decorator may change it
        "def gen():\n    yield Net()\n",  # a generator
        "logger = make_logger()\n",  # a public value that may be callable
        "if FLAG:\n    def maybe():\n        return Net()\n",  # defined under a condition
    ):
        facts = facts_of("import torch.nn as nn\nclass Net(nn.Module):\n    pass\n", other)
        assert namespace_builders(facts) is None, other


def test_a_model_placed_on_several_devices_has_no_one_device() -> None:
    facts = facts_of(
        """
        import torch
        model = torch.nn.Linear(4, 4)
        if device.type == "cuda":
            model.cuda()
        else:
            model.to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        """,
        LOOP,
    )
    model = the_trained_model(facts)
    assert model_device(facts, model) is None
    assert placement_devices(facts, model) == ['"cuda"', "device"]

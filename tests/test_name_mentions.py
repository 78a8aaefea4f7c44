"""Which names count as mentions of a variable: `f(train=True)` and `model.train()` do not
mention a function called `train` (pytorch/examples' mnist, vae, siamese_network: their
`train(args, model, device, train_loader, ...)` is called once, and its parameters must be
followed to that call)."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.script import ScriptFacts
from optimizer_codemod.analysis.transfers import parameter_values
from optimizer_codemod.analysis.values import name_mentions, parameter_binding

MNIST_STYLE = """import torch
from torchvision import datasets


def train(model, device, train_loader):
    model.train()
    for data, target in train_loader:
        data = data.to(device)


def main():
    device = torch.device("cuda")
    dataset = datasets.MNIST("../data", train=True, download=True)
    loader = torch.utils.data.DataLoader(dataset, pin_memory=True)
    model = Net().to(device)
    train(model, device, loader)
"""


def _facts(source: str) -> ScriptFacts:
    return ScriptFacts.of(cst.parse_module(source))


def _function(facts: ScriptFacts, name: str) -> cst.FunctionDef:
    return facts.records.functions[name]


def test_keywords_and_attributes_are_not_mentions_of_a_variable() -> None:
    facts = _facts(MNIST_STYLE)
    # The definition and the one call; not `train=True`, not `model.train()`.
    assert name_mentions(facts)["train"] == 2
    # In `main` only: `train`'s parameter `model` and its uses there are `train`'s own.
    assert name_mentions(facts)["model"] == 2


def test_names_in_imports_still_count() -> None:
    # project.py subtracts the names an import statement spells from these counts.
    facts = _facts("import a.train\nfrom b import train as t\n")
    assert name_mentions(facts).get("train") == 2
    assert name_mentions(facts).get("t") == 1


def test_a_function_called_once_has_its_parameters_followed() -> None:
    facts = _facts(MNIST_STYLE)
    train = _function(facts, "train")
    (device,) = parameter_values(facts, train, "device")
    assert cst.Module([]).code_for_node(device) == "device"
    bound = parameter_binding(facts, train, "train_loader")
    assert bound is not None and cst.Module([]).code_for_node(bound.value) == "loader"


def test_a_method_called_through_an_instance_too_is_not_followed() -> None:
    # `self.fit(...)` is one caller; `trainer.fit(...)` is another that the name table of
    # calls by callee does not hold: the attribute mention must still count.
    source = (
        "class Trainer:\n"
        "    def fit(self, device):\n"
        "        pass\n"
        "    def run(self):\n"
        "        self.fit('cuda')\n"
        "trainer = Trainer()\n"
        "trainer.fit('mps')\n"
    )
    facts = _facts(source)
    fit = facts.classes["Trainer"].node.body.body[0]
    assert parameter_values(facts, fit, "device") is None


def test_a_function_also_passed_around_is_not_followed() -> None:
    source = MNIST_STYLE + "    run(train)\n"
    facts = _facts(source)
    assert parameter_values(facts, _function(facts, "train"), "device") is None
    assert parameter_binding(facts, _function(facts, "train"), "device") is None


SIAMESE_STYLE = MNIST_STYLE + """

class Pairs(torch.utils.data.Dataset):
    def __init__(self, root, train, download=False):
        self.dataset = datasets.MNIST(root, train=train, download=download)
        self.rebuild = lambda: datasets.MNIST(root, train=train)
"""


def test_a_parameter_of_another_function_is_not_a_mention_of_the_module_name() -> None:
    # pytorch/examples' siamese_network: `Pairs.__init__(self, root, train, ...)` reads its
    # own `train`, which is not the module's function `train`.
    facts = _facts(SIAMESE_STYLE)
    assert name_mentions(facts)["train"] == 2
    (device,) = parameter_values(facts, _function(facts, "train"), "device")
    assert cst.Module([]).code_for_node(device) == "device"


def test_a_default_value_is_read_in_the_enclosing_scope_and_still_counts() -> None:
    # `def f(train=train)` reads the module's `train` when `f` is defined.
    facts = _facts(MNIST_STYLE + "def later(train=train):\n    return train\n")
    assert name_mentions(facts)["train"] == 3
    assert parameter_values(facts, _function(facts, "train"), "device") is None

"""model_randomness finds dropout a library layer applies inside, from the option the file
passes it (PyG's `MLP(..., dropout=0.5)`, `GPSConv(..., attn_kwargs={"dropout": 0.5})`:
reading round 10), so that OPT402 and OPT407 label their fixes `behavior` there."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from optimizer_codemod.analysis.script import ScriptFacts
from optimizer_codemod.analysis.training import model_randomness, the_trained_model

SCRIPT = """
import torch
from torch_geometric.nn import MLP

options = {OPTIONS}


class Net(torch.nn.Module):
    def __init__(self, dropout, options):
        super().__init__()
        self.mlp = MLP([8, 16, 2], {ARGUMENT})

    def forward(self, x):
        return self.mlp(x)


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = Net(0.5, options).to(device)
optimizer = torch.optim.Adam(model.parameters())
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def _randomness(argument: str, options: str = "{}"):
    source = SCRIPT.replace("{ARGUMENT}", argument).replace("{OPTIONS}", options)
    facts = ScriptFacts.of(cst.parse_module(textwrap.dedent(source)))
    model = the_trained_model(facts)
    assert model is not None
    return model_randomness(facts, model)


@pytest.mark.parametrize(
    "argument, shown",
    [
        ("dropout=0.5", "`MLP(..., dropout=0.5)`"),
        ("dropout=dropout", "`MLP(..., dropout=dropout)`"),
        ("dropout=[0.0, 0.5]", "`MLP(..., dropout=[0.0, 0.5])`"),
        ('act_kwargs={"dropout": 0.1}', '`MLP(..., "dropout": 0.1)`'),
    ],
)
def test_a_dropout_option_of_a_layer_is_randomness(argument: str, shown: str) -> None:
    assert _randomness(argument) == ("dropout", shown)


def test_a_dropout_option_through_a_named_dict_is_randomness() -> None:
    found = _randomness("attn_kwargs=options", options='{"dropout": 0.5}')
    assert found == ("dropout", '`MLP(..., "dropout": 0.5)`')


@pytest.mark.parametrize(
    "argument, options",
    [("dropout=0.0", "{}"), ("dropout=None", "{}"), ("attn_kwargs=options", '{"dropout": 0}')],
)
def test_a_zero_dropout_option_is_no_randomness(argument: str, options: str) -> None:
    assert _randomness(argument, options) is None


@pytest.mark.parametrize(
    "layer, shown",
    [
        ("torch.nn.TransformerEncoderLayer(8, 2)", "(its dropout is 0.1 by default)"),
        ("torch.nn.TransformerEncoderLayer(8, 2, 32, 0.2)", "(..., 0.2)`"),
        ("torch.nn.TransformerDecoderLayer(8, 2, dropout=0.1)", "(..., dropout=0.1)`"),
        ("torch.nn.Transformer(8, 2, 1, 1, 32)", "(its dropout is 0.1 by default)"),
    ],
)
def test_torch_layers_that_drop_out_by_default_are_randomness(layer: str, shown: str) -> None:
    source = SCRIPT.replace("MLP([8, 16, 2], {ARGUMENT})", layer).replace("{OPTIONS}", "{}")
    facts = ScriptFacts.of(cst.parse_module(textwrap.dedent(source)))
    found = model_randomness(facts, the_trained_model(facts))
    assert found is not None and found[0] == "dropout" and found[1].endswith(shown), found


@pytest.mark.parametrize(
    "layer",
    [
        "torch.nn.TransformerEncoderLayer(8, 2, dropout=0.0)",
        "torch.nn.TransformerEncoderLayer(8, 2, 32, 0)",
    ],
)
def test_torch_layers_told_not_to_drop_out_are_no_randomness(layer: str) -> None:
    source = SCRIPT.replace("MLP([8, 16, 2], {ARGUMENT})", layer).replace("{OPTIONS}", "{}")
    facts = ScriptFacts.of(cst.parse_module(textwrap.dedent(source)))
    assert model_randomness(facts, the_trained_model(facts)) is None

"""A function called more than once, every call from one scope passing the same variable
for a parameter (milesial/Pytorch-UNet calls `train_model(model=model, ...)` again when the
first run runs out of memory): the parameter is that variable, as with one call."""

from __future__ import annotations

import libcst as cst
import pytest

from optimizer_codemod.analysis import ScriptFacts
from optimizer_codemod.analysis.training import trained_models
from optimizer_codemod.analysis.values import parameter_binding, unbound_parameter

TRAIN = """\
import torch
import torch.nn as nn


def train(model, lr, steps=2):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        loss = model(torch.randn(4, 8)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


"""

AGAIN = """\
def main():
    net = nn.Linear(8, 2)
    try:
        train(model=net, lr=0.1)
    except RuntimeError:
        train(net, 0.01, steps=1)


main()
"""


def _facts(source: str) -> ScriptFacts:
    return ScriptFacts.of(cst.parse_module(source))


def _train(facts: ScriptFacts) -> cst.FunctionDef:
    return facts.records.functions["train"]


def test_every_call_passing_one_variable_binds_the_parameter() -> None:
    facts = _facts(TRAIN + AGAIN)
    bound = parameter_binding(facts, _train(facts), "model")
    assert bound is not None and bound.value.value == "net"
    assert bound.function is facts.records.functions["main"]
    assert [m.name for m in trained_models(facts)] == ["net"]
    # The two calls pass different learning rates: no one value.
    assert parameter_binding(facts, _train(facts), "lr") is None
    assert "called 2 times" in unbound_parameter(facts, _train(facts), "lr")


@pytest.mark.parametrize(
    "change",
    [
        ("train(net, 0.01, steps=1)", "train(nn.Linear(8, 2), 0.01, steps=1)"),  # another model
        ("train(net, 0.01, steps=1)", "train(*[net, 0.01])"),  # hidden in *args
        ("main()\n", "main()\ntrain(net, 0.1)\n"),  # a call from another scope
        ("main()\n", "main()\nschedule = train\n"),  # passed around: callers unknown
    ],
    ids=["another-model", "star-args", "another-scope", "passed-around"],
)
def test_calls_that_do_not_agree_bind_nothing(change) -> None:
    old, new = change
    source = TRAIN + AGAIN.replace(old, new)
    assert source != TRAIN + AGAIN
    facts = _facts(source)
    assert parameter_binding(facts, _train(facts), "model") is None
    assert trained_models(facts) == [] or [m.name for m in trained_models(facts)] != ["net"]

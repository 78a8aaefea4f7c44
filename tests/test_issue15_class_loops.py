"""Issue 15, one file: training loops in a class (`self.` attributes) and in a function whose
model, loader and device are parameters get the rules that need the trained model."""

from __future__ import annotations

import math
import textwrap

import libcst as cst
import pytest
import torch

from optimizer_codemod import rewrite
from optimizer_codemod.analysis import ScriptFacts
from optimizer_codemod.analysis.training import (
    the_trained_model,
    training_steps,
    why_no_trained_model,
)
from optimizer_codemod.analysis.values import (
    alias_in,
    attribute_assignments,
    method_class,
    the_caller,
    value_sources,
)
from optimizer_codemod.diagnostics import Status

TRAINER = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset


    class TinyLM(nn.Module):
        def __init__(self, vocab=10, width=8):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.head = nn.Linear(width, vocab)

        def forward(self, x):
            return self.head(self.embed(x))


    class Trainer:
        def __init__(self, model, dataset, lr=3e-4):
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
            self.model = model.to(self.device)
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
            self.loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2)

        def run(self):
            for x, y in self.loader:
                x, y = x.to(self.device), y.to(self.device)
                loss = F.cross_entropy(self.model(x).flatten(0, 1), y.flatten())
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()


    def main():
        tokens = torch.randint(0, 10, (32, 5))
        ds = TensorDataset(tokens[:, :-1], tokens[:, 1:])
        net = TinyLM()
        Trainer(net, ds).run()


    if __name__ == "__main__":
        main()
    """)


def _facts(source: str) -> ScriptFacts:
    return ScriptFacts.of(cst.parse_module(source))


def _method(facts: ScriptFacts, class_name: str, name: str) -> cst.FunctionDef:
    body = facts.classes[class_name].node.body.body
    return next(s for s in body if isinstance(s, cst.FunctionDef) and s.name.value == name)


@pytest.fixture(scope="module")
def rewritten():
    return rewrite(TRAINER, path="trainer.py", unsafe_fixes=True)


@pytest.mark.parametrize(
    "code, edit",
    [
        ("OPT302", "with torch.autocast(self.device, dtype=torch.bfloat16):"),
        ("OPT402", 'if self.device == "cuda":\n            self.model.compile()\n'),
        ("OPT201", "x.to(self.device, non_blocking=True)"),
        ("OPT201", "y.to(self.device, non_blocking=True)"),
        ("OPT501", "lr=lr, fused=True)"),
        ("OPT101", "pin_memory=torch.cuda.is_available()"),
    ],
)
def test_the_trainer_class_gets_each_fix(rewritten, code: str, edit: str) -> None:
    assert edit in rewritten.source
    assert any(d.code == code and d.status is Status.FIXED for d in rewritten.diagnostics)


def test_the_compile_follows_the_placement_in_init(rewritten) -> None:
    placed = rewritten.source.index("self.model = model.to(self.device)")
    compiled = rewritten.source.index("self.model.compile()")
    built = rewritten.source.index("self.optimizer = torch.optim.AdamW(")
    assert placed < compiled < built


def test_the_rewritten_trainer_trains_on_cpu(rewritten) -> None:
    compile(rewritten.source, "trainer.py", "exec")
    namespace = {"__name__": "rewritten_trainer"}
    exec(compile(rewritten.source, "trainer.py", "exec"), namespace)
    torch.manual_seed(0)
    tokens = torch.randint(0, 10, (32, 5))  # two batches of 16: two steps
    data = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    trainer = namespace["Trainer"](namespace["TinyLM"](), data)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.run()
    after = list(trainer.model.parameters())
    assert any(not torch.equal(b, a) for b, a in zip(before, after))
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(
            trainer.model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()
        )
    assert math.isfinite(loss.item())


def test_self_attributes_resolve_in_their_own_class_only() -> None:
    other = TRAINER.replace(
        "def main():",
        "class Wrapper(nn.Module):\n"
        "    def __init__(self, inner):\n"
        "        super().__init__()\n"
        "        self.model = inner\n\n\n"
        "def main():",
    )
    facts = _facts(other)
    run = _method(facts, "Trainer", "run")
    assert method_class(facts, run) == "Trainer"
    sources = value_sources(facts, "self.model", run)
    assert [cst.Module([]).code_for_node(s.value) for s in sources] == ["model.to(self.device)"]
    assert len(attribute_assignments(facts, "Wrapper", "self.model")) == 1
    model = the_trained_model(facts)
    assert model is not None and (model.name, model.owner) == ("self.model", "Trainer")
    assert len(training_steps(facts, model)) == 1


def test_a_parameter_is_the_argument_at_the_one_call() -> None:
    facts = _facts(TRAINER)
    init = _method(facts, "Trainer", "__init__")
    assert the_caller(facts, init) is not None
    (source,) = value_sources(facts, "dataset", init)
    assert cst.Module([]).code_for_node(source.value) == "ds"
    assert source.function is not None and source.function.name.value == "main"
    twice = TRAINER.replace(
        "Trainer(net, ds).run()", "Trainer(net, ds).run()\n    Trainer(net, ds)"
    )
    facts = _facts(twice)
    assert the_caller(facts, _method(facts, "Trainer", "__init__")) is None


def test_two_trainer_classes_are_two_models() -> None:
    second = TRAINER.replace(
        "def main():",
        "class Finetuner:\n"
        "    def __init__(self, model):\n"
        "        self.model = model\n"
        "        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n\n\n"
        "def main():",
    ).replace("Trainer(net, ds).run()", "Trainer(net, ds).run()\n    Finetuner(TinyLM())")
    facts = _facts(second)
    assert the_trained_model(facts) is None
    _, reason = why_no_trained_model(facts)
    assert "Trainer's self.model" in reason and "Finetuner's self.model" in reason


FUNCTION_LOOP = textwrap.dedent("""\
    import torch
    import torch.nn.functional as F


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 10)

        def forward(self, x):
            return self.linear(x)


    def train(model, loader, dev):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = F.cross_entropy(model(x.to(dev)), y.to(dev))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    def main(loader):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        net = Net().to(device)
        train(net, loader, device)
    """)


def test_a_function_loop_reads_the_callers_model_and_device() -> None:
    facts = _facts(FUNCTION_LOOP)
    model = the_trained_model(facts)
    assert model is not None and model.name == "net" and model.handed_in is not None
    train = facts.records.functions["train"]
    assert alias_in(facts, "net", model.scope, train) == "model"
    assert alias_in(facts, "device", model.scope, train) == "dev"
    result = rewrite(FUNCTION_LOOP, select=["OPT302", "OPT402"], unsafe_fixes=True)
    assert "with torch.autocast(dev, dtype=torch.bfloat16):" in result.source
    assert '    if device == "cuda":\n        net.compile()\n    train(net' in result.source


def test_a_function_called_twice_is_not_followed() -> None:
    twice = FUNCTION_LOOP + "    train(torch.nn.Linear(8, 10), loader, 'cpu')\n"
    result = rewrite(twice, select=["OPT302", "OPT402"], unsafe_fixes=True, why_not=True)
    assert not result.changed
    assert any(d.status is Status.DECLINED for d in result.diagnostics)


def test_a_subclass_of_the_trainer_is_not_resolved_by_class() -> None:
    # `run` is inherited: in a Finetuner, `self.model` is the Finetuner's.
    subclass = TRAINER.replace(
        "def main():",
        "class Finetuner(Trainer):\n"
        "    def __init__(self, model):\n"
        "        self.model = model\n\n\n"
        "def main():",
    )
    facts = _facts(subclass)
    run = _method(facts, "Trainer", "run")
    assert value_sources(facts, "self.model", run) is None
    result = rewrite(subclass, select=["OPT302", "OPT402"], unsafe_fixes=True)
    assert not result.changed


def test_another_classes_self_model_under_no_grad_is_not_wrapped() -> None:
    sampler = TRAINER.replace(
        "def main():",
        "class Sampler:\n"
        "    def __init__(self, model):\n"
        "        self.model = model\n\n"
        "    @torch.no_grad()\n"
        "    def sample(self, batches):\n"
        "        for x in batches:\n"
        "            out = self.model(x)\n\n\n"
        "def main():",
    )
    result = rewrite(sampler, select=["OPT302"], unsafe_fixes=True)
    assert result.source.count("torch.autocast(") == 1
    assert "            with torch.autocast(self.device" in result.source

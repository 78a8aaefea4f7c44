"""An optimizer the model builds (`self.optimizer = model.configure_optimizers(config)`, the
habit of minGPT, nanoGPT and Lightning), read through a local alias of the trainer's model
(`model, config = self.model, self.config`), with the trainer's static method called beside
its construction (`Trainer.get_default_config()`): the model is still the one trained."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import libcst as cst
import pytest
import torch

from conftest import run_cli
from optimizer_codemod import rewrite
from optimizer_codemod.analysis import ScriptFacts
from optimizer_codemod.analysis.training import optimizers_built_by_models, trained_models
from optimizer_codemod.analysis.values import attribute_aliases
from optimizer_codemod.diagnostics import Status

MODEL = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class TinyGPT(nn.Module):
        def __init__(self, vocab=10, width=8):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.head = nn.Linear(width, vocab)

        def forward(self, idx, targets=None):
            logits = self.head(self.embed(idx))
            loss = None
            if targets is not None:
                loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            return logits, loss

        def configure_optimizers(self, config):
            return torch.optim.AdamW(self.parameters(), lr=config["lr"])
    """)

TRAINER_CLASS = textwrap.dedent("""\
    class Trainer:
        @staticmethod
        def get_default_config():
            return {"lr": 3e-4, "batch_size": 16}

        def __init__(self, config, model, dataset):
            self.config = config
            self.model = model
            self.optimizer = None
            self.dataset = dataset
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
            self.model = self.model.to(self.device)

        def run(self):
            model, config = self.model, self.config
            self.optimizer = model.configure_optimizers(config)
            loader = DataLoader(self.dataset, batch_size=config["batch_size"], shuffle=True)
            model.train()
            for x, y in loader:
                x, y = x.to(self.device), y.to(self.device)
                logits, loss = model(x, y)
                model.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
    """)

DRIVER = textwrap.dedent("""\
    def main():
        tokens = torch.randint(0, 10, (32, 5))
        dataset = TensorDataset(tokens[:, :-1], tokens[:, 1:])
        Trainer(Trainer.get_default_config(), TinyGPT(), dataset).run()


    if __name__ == "__main__":
        main()
    """)

ONE_FILE = "\n\n".join(
    [MODEL, "from torch.utils.data import DataLoader, TensorDataset\n", TRAINER_CLASS, DRIVER]
)
COMPILED = '        if self.device == "cuda":\n            self.model.compile()\n'
AUTOCAST = (
    "            with torch.autocast(self.device, dtype=torch.bfloat16):\n"
    "                logits, loss = model(x, y)\n"
)


def _facts(source: str) -> ScriptFacts:
    return ScriptFacts.of(cst.parse_module(source))


def _fixed(source: str) -> set:
    result = rewrite(source, path="train.py", select=["OPT302", "OPT402"], unsafe_fixes=True)
    return {d.code for d in result.diagnostics if d.status is Status.FIXED}


@pytest.fixture(scope="module")
def rewritten():
    return rewrite(ONE_FILE, path="train.py", select=["OPT302", "OPT402"], unsafe_fixes=True)


def test_the_model_built_optimizer_names_the_trainers_model() -> None:
    facts = _facts(ONE_FILE)
    [built] = optimizers_built_by_models(facts)
    assert built.method == "configure_optimizers"
    assert [(m.name, m.owner) for m in trained_models(facts)] == [("self.model", "Trainer")]
    assert attribute_aliases(facts, built.site.function) == {
        "model": "self.model",
        "config": "self.config",
    }


def test_the_trainer_is_compiled_after_its_placement_and_its_forward_autocast(rewritten):
    placed = rewritten.source.index("self.model = self.model.to(self.device)\n")
    assert rewritten.source.index(COMPILED) > placed
    assert AUTOCAST in rewritten.source
    assert {d.code for d in rewritten.diagnostics if d.status is Status.FIXED} == {
        "OPT302",
        "OPT402",
    }


def test_the_rewritten_trainer_trains_on_cpu(rewritten) -> None:
    namespace = {"__name__": "rewritten_trainer"}
    exec(compile(rewritten.source, "train.py", "exec"), namespace)
    torch.manual_seed(0)
    tokens = torch.randint(0, 10, (32, 5))
    data = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    Trainer = namespace["Trainer"]
    trainer = Trainer(Trainer.get_default_config(), namespace["TinyGPT"](), data)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.run()
    assert any(not torch.equal(b, a) for b, a in zip(before, trainer.model.parameters()))
    _, loss = trainer.model(tokens[:, :-1], tokens[:, 1:])
    assert math.isfinite(loss.item())


@pytest.mark.parametrize(
    "change, why",
    [
        (
            ("self.optimizer.step()", "self.optimizer[0].step()"),
            "the method returns a list or a pair: its result is never stepped as one optimizer",
        ),
        (
            ("self.optimizer = None\n", "self.optimizer = torch.optim.SGD([], lr=0.1)\n"),
            "the name holds another optimizer too",
        ),
        (
            (
                "model.train()\n",
                "model.train()\n        for model in [self.model]:\n" "            pass\n",
            ),
            "the local name is also a loop target: no alias of `self.model`",
        ),
        (
            ("Trainer.get_default_config()", "Trainer.default_config()"),
            "a classmethod (`cls(...)` could build a Trainer with other arguments unseen)",
        ),
    ],
    ids=["never-stepped", "another-optimizer", "loop-target", "classmethod"],
)
def test_must_not_change(change, why) -> None:
    old, new = change
    source = ONE_FILE.replace(old, new)
    if "default_config()" in new:
        source = source.replace(
            "    @staticmethod\n    def get_default_config():",
            "    @classmethod\n    def default_config(cls):",
        )
    assert source != ONE_FILE
    assert _fixed(source) == set(), why


def _project(root: Path, static: bool) -> Path:
    (root / "model.py").write_text(MODEL)
    decorator, name = (
        ("@staticmethod", "get_default_config()")
        if static
        else (
            "@classmethod",
            "get_default_config(cls)",
        )
    )
    trainer = TRAINER_CLASS.replace("@staticmethod", decorator).replace(
        "get_default_config():", name + ":"
    )
    (root / "trainer.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n\n\n" + trainer
    )
    (root / "train.py").write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\n\n"
        "from model import TinyGPT\nfrom trainer import Trainer\n\n\n" + DRIVER
    )
    return root / "trainer.py"


@pytest.mark.parametrize("static", [True, False], ids=["staticmethod", "classmethod"])
def test_a_driver_calling_a_static_method_still_hands_over_its_model(tmp_path, static) -> None:
    trainer = _project(tmp_path, static)
    result = run_cli(
        ["apply", "--select", "OPT402", "--unsafe-fixes", "--no-cache", "."], cwd=tmp_path
    )
    assert result.exit_code == (1 if static else 0), result.output  # 1: a file was fixed
    assert (COMPILED in trainer.read_text()) is static


NANOGPT_SHAPE = MODEL.replace(
    "        def configure_optimizers(self, config):\n"
    '            return torch.optim.AdamW(self.parameters(), lr=config["lr"])\n',
    "        def configure_optimizers(self, config):\n"
    '            optimizer = torch.optim.AdamW(self.parameters(), lr=config["lr"])\n'
    "            return optimizer\n",
) + textwrap.dedent(
    """\

    ddp = False
    model = TinyGPT()
    model = torch.compile(model)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    raw_model = model.module if ddp else model
    optimizer = raw_model.configure_optimizers({"lr": 3e-4})
    idx = torch.randint(0, 10, (2, 5))
    for step in range(3):
        logits, loss = model(idx, idx)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
)


@pytest.mark.parametrize("local", ["optimizer", "opt"])
def test_the_unwrapped_model_of_build_nanogpt_is_the_trained_one(local: str) -> None:
    """build-nanogpt: the optimizer comes from `raw_model = model.module if ddp else model`,
    and `configure_optimizers` binds an `optimizer` of its own (another scope)."""
    source = NANOGPT_SHAPE.replace("            optimizer = ", f"            {local} = ").replace(
        "            return optimizer\n", f"            return {local}\n"
    )
    facts = _facts(source)
    [built] = optimizers_built_by_models(facts)
    assert built.method == "configure_optimizers"
    assert [m.name for m in trained_models(facts)] == ["raw_model"]
    unwrapped_twice = source.replace("model.module if ddp else model", "model.module.module")
    assert [m.name for m in trained_models(_facts(unwrapped_twice))] == ["raw_model"]
    other = source.replace("model.module if ddp else model", "model.module if ddp else 3")
    assert trained_models(_facts(other)) == []


def test_a_function_rebinding_the_global_optimizer_is_a_second_value() -> None:
    """A function's own local `optimizer` is another variable; one declared `global` is not."""
    rebinding = NANOGPT_SHAPE + textwrap.dedent("""\

        def restart():
            global optimizer
            optimizer = torch.optim.SGD(raw_model.parameters(), lr=0.1)
        """)
    assert optimizers_built_by_models(_facts(rebinding)) == []
    local = rebinding.replace("    global optimizer\n", "")
    assert [c.method for c in optimizers_built_by_models(_facts(local))] == ["configure_optimizers"]

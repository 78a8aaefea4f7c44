"""A model built by a function of the same file (`model = build_model(args)` after `def
build_model(args): return Net(args.width)`) is the model the per-model rules act on: its
classes are read through the function, as those of a model built in place."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from optimizer_codemod import rewrite, runner
from optimizer_codemod.analysis import ScriptFacts
from optimizer_codemod.analysis.project import project_facts
from optimizer_codemod.analysis.training import each_trained_model, model_classes
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import Status

SCRIPT = textwrap.dedent("""\
    import torch
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.conv = nn.Conv2d(3, width, 3)
            self.fc = nn.Linear(width, 10)

        def forward(self, x):
            return self.fc(self.conv(x).mean((2, 3)))


    def init_weights(module):
        if isinstance(module, nn.Conv2d):
            nn.init.normal_(module.weight)


    FACTORY


    def main():
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = build_model(8).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            x = torch.randn(4, 3, 16, 16, device=device)
            loss = model(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    if __name__ == "__main__":
        main()
    """)

BUILT = {
    "returned directly": "def build_model(width):\n    return Net(width)",
    "built, initialised, returned": (
        "def build_model(width):\n    model = Net(width)\n    model.apply(init_weights)\n"
        "    return model"
    ),
    "through another factory": (
        "def _make(width):\n    return Net(width)\n\n\ndef build_model(width):\n"
        "    return _make(width)"
    ),
    "by branch": (
        "def build_model(width):\n    if width > 4:\n        return Net(width)\n"
        "    return nn.Sequential(nn.Conv2d(3, 10, 3), nn.Flatten(1))"
    ),
}

NOT_KNOWN = {
    "returns something else on a branch": (
        "def build_model(width):\n    if width > 4:\n        return Net(width)\n    return None"
    ),
    "returns the model with its loss": (
        "def make(width):\n    return Net(width), nn.MSELoss()\n\n\n"
        "def build_model(width):\n    return make(width)[0]"
    ),
    "decorated": "@torch.no_grad()\ndef build_model(width):\n    return Net(width)",
    "rebound": "def build_model(width):\n    return Net(width)\n\n\nbuild_model = print",
    "a generator": "def build_model(width):\n    yield Net(width)",
}


def _fixed(source: str):
    result = rewrite(source, select=["OPT402", "OPT407"], why_not=True)
    return result, {d.code: d for d in result.diagnostics}


@pytest.mark.parametrize("factory", BUILT.values(), ids=BUILT.keys())
def test_a_model_from_a_factory_of_the_file_is_compiled_and_converted(factory: str) -> None:
    source = SCRIPT.replace("FACTORY", factory)
    facts = ScriptFacts.of(cst.parse_module(source))
    (model,) = each_trained_model(facts)
    assert model.name == "model" and "Net" in model_classes(facts, model)
    result, found = _fixed(source)
    assert found["OPT402"].status is Status.FIXED and found["OPT407"].status is Status.FIXED
    placed = "    model = build_model(8).to(device)\n"
    assert placed + '    if device.type == "cuda":\n        model.compile()\n' in result.source
    assert "model = model.to(memory_format=torch.channels_last)\n" in result.source
    compile(result.source, "train.py", "exec")


@pytest.mark.parametrize("factory", NOT_KNOWN.values(), ids=NOT_KNOWN.keys())
def test_a_factory_that_may_return_anything_else_leaves_the_model_unknown(factory: str) -> None:
    source = SCRIPT.replace("FACTORY", factory)
    result, found = _fixed(source)
    assert not result.changed
    assert found["OPT402"].status is Status.DECLINED
    assert "the analysis cannot tell which model it is" in found["OPT402"].message


def test_a_factory_of_non_convolutional_models_is_compiled_not_converted() -> None:
    source = SCRIPT.replace("FACTORY", "def build_model(width):\n    return nn.Linear(3, width)")
    result, found = _fixed(source)
    assert found["OPT402"].status is Status.FIXED
    assert "OPT407" not in found or found["OPT407"].status is not Status.FIXED
    assert "channels_last" not in result.source


# Factories of other modules of the run -------------------------------------------------------
MODEL_PY = textwrap.dedent("""\
    import torch.nn as nn


    class Encoder(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.conv = nn.Conv2d(3, width, 3)

        def forward(self, x):
            return self.conv(x).mean((2, 3))


    class Net(nn.Module):
        def __init__(self, encoder, width):
            super().__init__()
            self.encoder = encoder
            self.fc = nn.Linear(width, 10)

        def forward(self, x):
            return self.fc(self.encoder(x))

        def encode(self, x):
            return self.encoder(x)


    def build_net(width):
        encoder = Encoder(width)
        net = Net(encoder, width)
        return net


    def build_pair(width):
        return build_net(width), nn.MSELoss()
    """)


def _project(tmp_path, driver: str):
    (tmp_path / "nets.py").write_text(MODEL_PY)
    (tmp_path / "train.py").write_text(driver)
    files = [str(tmp_path / "nets.py"), str(tmp_path / "train.py")]
    outcomes = runner.run(
        files,
        Settings(root=str(tmp_path), why_not=True),
        runner.Mode(write=False, diff=True),
        jobs=1,
    )
    train = next(o for o in outcomes if o.path.endswith("train.py"))
    return train, {d.code: d for d in train.diagnostics}, project_facts(files)


@pytest.mark.parametrize(
    "spelling",
    [("from nets import build_net", "build_net(8)"), ("import nets", "nets.build_net(8)")],
    ids=["by name", "through the module"],
)
def test_a_factory_of_another_module_builds_the_model_it_returns(tmp_path, spelling) -> None:
    imported, call = spelling
    driver = SCRIPT.replace("FACTORY", "").replace("build_model(8)", call)
    driver = driver.replace("import torch.nn as nn\n", f"import torch.nn as nn\n{imported}\n")
    train, found, facts = _project(tmp_path, driver)
    summary = facts[str(tmp_path / "train.py")].imported_class(call.split("(")[0])
    # its layers are those of the classes it builds; its model's methods, theirs
    assert {"torch.nn.Conv2d", "torch.nn.Linear"} <= set(summary.layers)
    assert "encode" in summary.eager_methods and summary.module == "nets.py"
    assert found["OPT402"].status is Status.FIXED and found["OPT407"].status is Status.FIXED
    assert "model = model.to(memory_format=torch.channels_last)" in train.diff


def test_a_factory_of_another_module_returning_a_pair_is_no_model(tmp_path) -> None:
    driver = SCRIPT.replace("FACTORY", "").replace("build_model(8)", "build_pair(8)[0]")
    driver = driver.replace(
        "import torch.nn as nn\n", "import torch.nn as nn\nfrom nets import build_pair\n"
    )
    train, found, facts = _project(tmp_path, driver)
    assert facts[str(tmp_path / "train.py")].imported_class("build_pair") is None
    assert found["OPT402"].status is Status.DECLINED
    assert "the analysis cannot tell which model it is" in found["OPT402"].message


def test_a_model_of_a_factory_run_only_through_its_methods_is_not_compiled(tmp_path) -> None:
    driver = SCRIPT.replace("FACTORY", "").replace("build_model(8)", "build_net(8)")
    driver = driver.replace(
        "import torch.nn as nn\n", "import torch.nn as nn\nfrom nets import build_net\n"
    )
    driver = driver.replace("loss = model(x)", "loss = model.encode(x)")
    train, found, _ = _project(tmp_path, driver)
    assert found["OPT402"].status is Status.DECLINED
    assert "only through `model.encode(...)`" in found["OPT402"].message, found["OPT402"].message

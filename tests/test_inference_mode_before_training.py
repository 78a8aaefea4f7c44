"""OPT403 and a forward that runs before training: a model that keeps a tensor its forward
makes (a lazily built cache) must not make it under `inference_mode` when a training step
follows, or that step raises ("Inference tensors cannot be saved for backward")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import messages_by_code
from optimizer_codemod import runner
from optimizer_codemod.api import rewrite_source
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import Status

MODEL = """\
import torch
import torch.nn as nn


class Cached(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.cache = None

    def forward(self, x):
        if self.cache is None:
            self.cache = torch.ones(4, device=x.device)
        return self.lin(x) * self.cache


def evaluate(model, x):
    with torch.no_grad():
        return float(model(x).sum())


model = Cached()
x = torch.randn(2, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""
TRAIN = """\
for step in range(3):
    loss = model(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def rewrite(source: str):
    settings = Settings(select=("OPT403",), why_not=True)
    return rewrite_source(source.encode(), "train.py", settings.options_for("train.py"))


def run_script(tmp_path: Path, source) -> subprocess.CompletedProcess:
    """Runs `source` (text or bytes) as train.py in `tmp_path`."""
    script = tmp_path / "train.py"
    script.write_bytes(source if isinstance(source, bytes) else source.encode())
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True)


def declined_reason(result) -> str:
    [why] = [d.message for d in result.diagnostics if d.status is Status.DECLINED]
    return why


def with_inference_mode(source: str) -> str:
    return source.replace("torch.no_grad()", "torch.inference_mode()")


@pytest.mark.parametrize(
    "source, fixed",
    [
        (MODEL + "print(evaluate(model, x))\n" + TRAIN, False),  # the first forward: no
        (MODEL + TRAIN + "print(evaluate(model, x))\n", True),  # after training: yes
        (  # pytorch/examples' imagenet: an evaluation-only run returns before training
            MODEL
            + "def main(evaluate_only):\n"
            + "    if evaluate_only:\n"
            + "        print(evaluate(model, x))\n"
            + "        return\n"
            + "".join("    " + line + "\n" for line in TRAIN.splitlines())
            + "main(False)\n",
            True,
        ),
    ],
)
def test_an_evaluation_before_training_keeps_no_grad(tmp_path: Path, source, fixed) -> None:
    result = rewrite(source)
    assert (b"inference_mode" in result.new) is fixed
    done = run_script(tmp_path, result.new)
    assert done.returncode == 0, done.stderr[-2000:]
    if not fixed:
        why = declined_reason(result)
        assert "run before a training step" in why and "`self.cache`" in why


def test_the_rewrite_the_check_prevents_raises(tmp_path: Path) -> None:
    """What the decline keeps from happening: the same script with inference_mode."""
    source = MODEL + "print(evaluate(model, x))\n" + TRAIN
    done = run_script(tmp_path, with_inference_mode(source))
    assert done.returncode != 0
    assert "Inference tensors cannot be saved for backward" in done.stderr


def test_a_block_in_a_script_training_through_another_module_says_why(tmp_path: Path) -> None:
    (tmp_path / "loops.py").write_text(
        "def train(model, x, opt):\n"
        "    for step in range(3):\n"
        "        loss = model(x).sum()\n"
        "        opt.zero_grad()\n"
        "        loss.backward()\n"
        "        opt.step()\n"
    )
    (tmp_path / "main.py").write_text(
        "import torch\n"
        "from loops import train\n"
        "model = torch.nn.Linear(4, 4)\n"
        "x = torch.randn(2, 4)\n"
        "with torch.no_grad():\n"
        "    print(float(model(x).sum()))\n"
        "train(model, x, torch.optim.SGD(model.parameters(), lr=0.1))\n"
    )
    outcomes = runner.run(
        [str(tmp_path / "main.py"), str(tmp_path / "loops.py")],
        Settings(root=str(tmp_path), why_not=True, select=("OPT403",)),
        runner.Mode(write=False),
    )
    main = {Path(o.path).name: o for o in outcomes}["main.py"]
    [why] = messages_by_code(main, Status.DECLINED)["OPT403"]
    assert "through a loop of loops.py" in why


def test_an_evaluation_loop_before_training_is_not_wrapped(tmp_path: Path) -> None:
    """The `behavior` wrap of a loop after `.eval()` (autograd on) gets the same check."""
    source = (
        MODEL
        + "model.eval()\n"
        + "for batch in [x, x]:\n"
        + "    print(float(model(batch).sum()))\n"
        + "model.train()\n"
        + TRAIN
    )
    settings = Settings(select=("OPT403",), why_not=True, unsafe_fixes=True)
    result = rewrite_source(source.encode(), "train.py", settings.options_for("train.py"))
    assert b"inference_mode():\n    for batch" not in result.new
    why = declined_reason(result)
    assert "it runs before a training step" in why and "`self.cache`" in why
    after = (
        MODEL + TRAIN + "model.eval()\nfor batch in [x, x]:\n    print(float(model(batch).sum()))\n"
    )
    fixed = rewrite_source(after.encode(), "train.py", settings.options_for("train.py"))
    assert b"with torch.inference_mode():\n    for batch in" in fixed.new


REGROWN = """\
import torch
import torch.nn as nn


class Rotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.length = 0
        self.table = None

    def forward(self, x):
        if x.shape[0] > self.length:
            self.length = x.shape[0]
            self.table = torch.arange(self.length, dtype=torch.float32)[:, None] + 1
        return self.lin(x) * self.table[: x.shape[0]]


def evaluate(model):
    with torch.no_grad():
        return float(model(torch.randn(8, 4)).sum())


model = Rotary()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for step in range(3):
        loss = model(torch.randn(4, 4)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(evaluate(model))
"""


@pytest.mark.parametrize("inline", [False, True])
def test_an_evaluation_between_epochs_that_regrows_a_cache_keeps_no_grad(
    tmp_path: Path, inline: bool
) -> None:
    """The evaluation after an epoch's steps runs a longer sequence than training did: the
    model grows its table again, under `inference_mode` an inference tensor, which the next
    epoch's first step would save for backward. Training follows it (the next epoch)."""
    source = REGROWN
    if inline:
        evaluate = REGROWN[REGROWN.index("def evaluate") : REGROWN.index("model = Rotary")]
        source = source.replace(evaluate, "").replace(
            "    print(evaluate(model))\n",
            "    with torch.no_grad():\n        print(float(model(torch.randn(8, 4)).sum()))\n",
        )
    result = rewrite(source)
    assert b"inference_mode" not in result.new
    why = declined_reason(result)
    assert "run before a training step" in why and "`self.length`" in why
    done = run_script(tmp_path, result.new)
    assert done.returncode == 0, done.stderr[-2000:]
    done = run_script(tmp_path, with_inference_mode(source))
    assert "Inference tensors cannot be saved for backward" in done.stderr


DECORATED = MODEL.replace(
    "def evaluate(model, x):\n    with torch.no_grad():\n        return float(model(x).sum())\n",
    "@torch.no_grad()\ndef evaluate(model, x):\n    return float(model(x).sum())\n",
)


@pytest.mark.parametrize(
    "source, fixed",
    [
        (DECORATED + "print(evaluate(model, x))\n" + TRAIN, False),
        (DECORATED + TRAIN + "print(evaluate(model, x))\n", True),
        (  # nanoGPT's shape: an evaluation at the top of the step loop, before the first step
            DECORATED + TRAIN.replace(":\n", ":\n    print(evaluate(model, x))\n", 1),
            False,
        ),
    ],
)
def test_a_function_decorated_with_no_grad_called_before_training_keeps_it(
    tmp_path: Path, source: str, fixed: bool
) -> None:
    assert "@torch.no_grad()" in source
    result = rewrite(source)
    assert (b"@torch.inference_mode()" in result.new) is fixed
    done = run_script(tmp_path, result.new)
    assert done.returncode == 0, done.stderr[-2000:]
    if not fixed:
        why = declined_reason(result)
        assert "before a training step" in why and "`self.cache`" in why
        done = run_script(tmp_path, with_inference_mode(source))
        assert "Inference tensors cannot be saved for backward" in done.stderr


def test_a_method_called_on_self_before_training_keeps_no_grad(tmp_path: Path) -> None:
    """`self.evaluate()` at the start of `fit`: the method's callers are its method calls."""
    source = (
        MODEL
        + "class Trainer:\n"
        + "    def __init__(self, model, opt):\n"
        + "        self.model, self.opt = model, opt\n\n"
        + "    def evaluate(self):\n"
        + "        with torch.no_grad():\n"
        + "            return float(self.model(x).sum())\n\n"
        + "    def fit(self):\n"
        + "        print(self.evaluate())\n"
        + "".join("        " + line + "\n" for line in TRAIN.splitlines())
        .replace("model(x)", "self.model(x)")
        .replace("opt.", "self.opt.")
        + "\n\nTrainer(model, opt).fit()\n"
    )
    source = source.replace(
        "def evaluate(model, x):\n    with torch.no_grad():\n        return float(model(x).sum())\n",
        "",
    )
    done = run_script(tmp_path, with_inference_mode(source))
    assert "Inference tensors cannot be saved for backward" in done.stderr
    result = rewrite(source)
    assert b"inference_mode" not in result.new
    why = declined_reason(result)
    assert "run before a training step" in why and "`self.cache`" in why


LAZY = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.LazyLinear(8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(F.relu(self.lin(x)))


torch.manual_seed(0)
x = torch.randn(16, 5)
y = torch.randint(0, 3, (16,))
model = Net()
with torch.no_grad():  # Initialize lazy modules.
    out = model(x)
initial = model.lin.weight.detach().clone()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
for epoch in range(3):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        correct = (model(x).argmax(1) == y).sum().item()
    print("epoch", epoch, correct)
print("lazy weights trained:", not torch.equal(initial, model.lin.weight.detach()))
"""


def test_lazy_layers_initialised_before_training_keep_no_grad(tmp_path: Path) -> None:
    """pytorch_geometric's hetero examples: a first forward under `no_grad` materializes the
    lazy layers' parameters; under `inference_mode` they would be inference tensors, which
    never get a `.grad`, and the optimizer would leave them as they were. The evaluation
    after each epoch's step runs once they exist, and is rewritten."""
    done = run_script(tmp_path, with_inference_mode(LAZY))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "lazy weights trained: False" in done.stdout  # the hazard: silently not trained
    result = rewrite(LAZY)
    new = result.new.decode()
    assert "with torch.no_grad():  # Initialize lazy modules." in new
    assert "    with torch.inference_mode():\n        correct" in new
    why = declined_reason(result)
    assert "run before a training step" in why and "`nn.LazyLinear(8)` is a lazy module" in why
    assert "never get a `.grad`" in why
    done = run_script(tmp_path, result.new)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "lazy weights trained: True" in done.stdout


LAZY_NET = LAZY[: LAZY.index("torch.manual_seed")]
LAZY_TRAIN = """\
model = Net()
x = torch.randn(16, 5)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with torch.no_grad():
    print(float(model(x).sum()))
for step in range(3):
    loss = model(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
MIXIN = """\
import torch
import torch.nn as nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import UninitializedParameter


class Scale(LazyModuleMixin, nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = UninitializedParameter()

    def initialize_parameters(self, x):
        self.weight.materialize(x.shape[1:])
        nn.init.ones_(self.weight)

    def forward(self, x):
        return x * self.weight


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = Scale()

    def forward(self, x):
        return self.scale(x)


"""
PYG_NET = """\
import torch
from torch_geometric.nn import Linear, SAGEConv


class Net(torch.nn.Module):
    def __init__(self, in_channels=16):
        super().__init__()
        self.conv = SAGEConv({size}, 8)
        self.lin = Linear(8, 3)

    def forward(self, x):
        return self.lin(self.conv(x, x))


"""


@pytest.mark.parametrize(
    "source, shown",
    [
        (LAZY_NET + LAZY_TRAIN, "`nn.LazyLinear(8)` is a lazy module"),
        (
            LAZY_NET
            + LAZY_TRAIN.replace(
                "model = Net()", "model = nn.Sequential(nn.LazyConv1d(4, 3), nn.Flatten())"
            ),
            "`nn.LazyConv1d(4, 3)` is a lazy module",
        ),
        (MIXIN + LAZY_TRAIN, "`Scale` derives from `torch.nn.modules.lazy.LazyModuleMixin`"),
        (PYG_NET.format(size="(-1, -1)") + LAZY_TRAIN, "`SAGEConv((-1, -1), 8)` leaves a size"),
        (PYG_NET.format(size="-1") + LAZY_TRAIN, "`SAGEConv(-1, 8)` leaves a size as `-1`"),
        (
            PYG_NET.format(size="in_channels")
            + LAZY_TRAIN.replace("model = Net()", "model = Net(in_channels=-1)"),
            "`Net(in_channels=-1)` leaves a size as `-1`",
        ),
    ],
)
def test_what_shows_parameters_made_on_the_first_forward(source: str, shown: str) -> None:
    result = rewrite(source)
    assert b"inference_mode" not in result.new
    why = declined_reason(result)
    assert "may create parameters on its first forward" in why and shown in why


def test_minus_one_as_an_axis_or_a_shape_is_no_lazy_size() -> None:
    source = (
        PYG_NET.format(size="16").replace(
            "return self.lin(self.conv(x, x))",
            "h = torch.nn.Softmax(dim=-1)(self.conv(x, x).view(-1, 8))\n"
            "        return self.lin(Norm(8, dim=-1)(h))",
        )
        + "from graphlib import Norm\n"
        + LAZY_TRAIN
    )
    assert "Softmax(dim=-1)" in source and "view(-1, 8)" in source
    result = rewrite(source)
    assert b"with torch.inference_mode():" in result.new


LAZY_STEP = """\
    loss = model(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
LAZY_EVALUATION = "    with torch.no_grad():\n        print(float(model(x).sum()))\n"


@pytest.mark.parametrize("after_the_step", [False, True])
def test_a_lazy_model_evaluated_inside_the_training_loop(after_the_step: bool) -> None:
    """Before the step's backward, the block may run the model's first forward; after it,
    the training forward has made the parameters."""
    body = LAZY_STEP + LAZY_EVALUATION if after_the_step else LAZY_EVALUATION + LAZY_STEP
    source = (
        LAZY_NET
        + "model = Net()\nx = torch.randn(16, 5)\n"
        + "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "for step in range(3):\n"
        + body
    )
    result = rewrite(source)
    assert (b"with torch.inference_mode():" in result.new) is after_the_step
    if not after_the_step:
        why = declined_reason(result)
        assert "inside the training loop" in why and "`nn.LazyLinear(8)`" in why


def test_a_lazy_layer_of_a_class_in_another_module_of_the_run(tmp_path: Path) -> None:
    (tmp_path / "models.py").write_text(LAZY_NET)
    (tmp_path / "main.py").write_text("import torch\nfrom models import Net\n" + LAZY_TRAIN)
    outcomes = runner.run(
        [str(tmp_path / "main.py"), str(tmp_path / "models.py")],
        Settings(root=str(tmp_path), why_not=True, select=("OPT403",)),
        runner.Mode(write=False),
    )
    main = {Path(o.path).name: o for o in outcomes}["main.py"]
    [why] = messages_by_code(main, Status.DECLINED)["OPT403"]
    assert "`torch.nn.LazyLinear` in models.py is a lazy module" in why

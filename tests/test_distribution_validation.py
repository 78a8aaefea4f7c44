"""OPT204's `validate_args=False` on distributions built every step: on valid arguments every
number is the same; only invalid ones stop raising (why the fix is `behavior`). And compiling
turns the checks off for the whole process, which makes OPT402's compile `behavior` where a
file's distributions rely on them."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from optimizer_codemod import rewrite, runner  # noqa: E402
from optimizer_codemod.config import Settings  # noqa: E402
from optimizer_codemod.diagnostics import Diagnostic, Status  # noqa: E402
from optimizer_codemod.rule import Safety  # noqa: E402

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "OPT204"
SCRIPT = FIXTURE / "fix_distribution_validated_every_step.py"


def _draws(validate: bool):
    torch.manual_seed(0)
    logits = torch.randn(16, 5, requires_grad=True)
    loc = torch.randn(16, 3, requires_grad=True)
    categorical = torch.distributions.Categorical(logits=logits, validate_args=validate)
    normal = torch.distributions.Independent(
        torch.distributions.Normal(loc, loc.exp(), validate_args=validate),
        1,
        validate_args=validate,
    )
    actions, points = categorical.sample(), normal.rsample()
    total = categorical.log_prob(actions).sum() + categorical.entropy().sum()
    total = total + normal.log_prob(points).sum()
    total.backward()
    return [actions, points, total, logits.grad, loc.grad]


def test_valid_arguments_give_the_same_draws_values_and_gradients() -> None:
    for checked, unchecked in zip(_draws(True), _draws(False)):
        assert torch.equal(checked, unchecked)


def test_invalid_arguments_raise_only_with_validation() -> None:
    nan_logits = torch.tensor([[0.0, float("nan")]])
    # Explicit: a compile earlier in this process (another test) turns the default off.
    with pytest.raises(ValueError, match="logits"):
        torch.distributions.Categorical(logits=nan_logits, validate_args=True)
    unchecked = torch.distributions.Categorical(logits=nan_logits, validate_args=False)
    assert torch.isnan(unchecked.probs).any()


def test_the_rewritten_agent_trains_to_the_same_parameters(tmp_path: Path) -> None:
    result = rewrite(SCRIPT.read_text(), path=str(SCRIPT), select=["OPT204"], unsafe_fixes=True)
    assert result.source.count("validate_args=False") == 3
    rewritten = tmp_path / "train.py"
    rewritten.write_text(result.source)
    trained = []
    for script in (SCRIPT, rewritten):
        torch.manual_seed(0)
        trained.append(runpy.run_path(str(script), run_name="__main__")["agent"].state_dict())
    assert trained[0].keys() == trained[1].keys()
    for name in trained[0]:
        assert torch.equal(trained[0][name], trained[1][name]), name


def test_the_fix_is_offered_only_as_a_behavior_fix() -> None:
    result = rewrite(SCRIPT.read_text(), path=str(SCRIPT), select=["OPT204"])
    assert not result.changed
    found = [d for d in result.diagnostics if "validate_args" in (d.fix_title or "")]
    assert len(found) == 3 and all(d.safety is Safety.BEHAVIOR for d in found)


HOST_AND_DEVICE = """
import torch
from torch.distributions import Categorical

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
policy = torch.nn.Linear(4, 2).to(device)
optimizer = torch.optim.Adam(policy.parameters())
for step in range(10):
    probs = torch.softmax(policy(torch.randn(3, 4, device=device)), -1).cpu()
    on_host = Categorical(probs)
    on_device = Categorical(probs=probs.to(device))
    loss = -on_host.entropy().mean() - on_device.entropy().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_distribution_of_host_tensors_is_left_alone() -> None:
    result = rewrite(HOST_AND_DEVICE, select=["OPT204"], unsafe_fixes=True)
    assert "Categorical(probs)\n" in result.source
    assert "Categorical(probs=probs.to(device), validate_args=False)" in result.source


COMPILE_TURNS_CHECKS_OFF = """
import torch
before = torch.distributions.Distribution._validate_args
torch.nn.Linear(2, 2).compile()
print(before, torch.distributions.Distribution._validate_args)
"""


def test_compiling_turns_distribution_checks_off_for_the_process() -> None:
    # A fresh process: the default is global state that a compile in this one has changed.
    done = subprocess.run(
        [sys.executable, "-c", COMPILE_TURNS_CHECKS_OFF], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]


COMPILED_AGENT = """
import torch
from torch.distributions import Categorical

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.net(x)


policy = Policy().to(device)
optimizer = torch.optim.Adam(policy.parameters())
observations = torch.randn(64, 4, device=device)
for step in range(100):
    probs = Categorical(logits=policy(observations))
    loss = -probs.entropy().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_compiling_makes_the_compile_fix_behavior_and_the_checks_fix_moot() -> None:
    eager = rewrite(COMPILED_AGENT, select=["OPT204", "OPT402"])
    (compile_fix,) = [d for d in eager.diagnostics if d.code == "OPT402"]
    assert compile_fix.safety is Safety.BEHAVIOR
    assert "`Categorical(logits=policy(observations))`" in compile_fix.message
    assert not eager.changed  # neither fix is applied without --unsafe-fixes
    both = rewrite(COMPILED_AGENT, select=["OPT204", "OPT402"], unsafe_fixes=True)
    assert "policy.compile()" in both.source and "validate_args=False" in both.source
    compiled = COMPILED_AGENT.replace(
        "policy = Policy().to(device)\n", "policy = torch.compile(Policy().to(device))\n"
    )
    result = rewrite(compiled, select=["OPT204"], unsafe_fixes=True)
    assert not result.changed  # the compile already turned the checks off
    chosen = COMPILED_AGENT.replace(
        "logits=policy(observations))", "logits=policy(observations), validate_args=True)"
    )
    result = rewrite(chosen, select=["OPT402"])
    assert "policy.compile()" in result.source  # explicit checks survive compiling


DERIVED_WITH_ITS_OWN_CONSTRUCTOR = COMPILED_AGENT.replace(
    "\n\nclass Policy",
    "\n\nclass ScaledCategorical(Categorical):\n"
    "    def __init__(self, logits, scale):\n"
    "        super().__init__(logits=logits * scale)\n\n\nclass Policy",
).replace("Categorical(logits=policy(observations))", "ScaledCategorical(policy(observations), 2)")


def test_a_derived_distribution_makes_the_compile_fix_behavior_though_not_its_own() -> None:
    """Whatever its constructor, a class derived from a torch distribution checks by default
    (its own `__init__` may pass `validate_args` on or not): compiling may turn that off."""
    result = rewrite(DERIVED_WITH_ITS_OWN_CONSTRUCTOR, select=["OPT204", "OPT402"])
    (compile_fix,) = [d for d in result.diagnostics if d.code == "OPT402"]
    assert compile_fix.safety is Safety.BEHAVIOR
    assert "`ScaledCategorical(policy(observations..." in compile_fix.message
    assert not [d for d in result.diagnostics if d.code == "OPT204"]
    chosen = DERIVED_WITH_ITS_OWN_CONSTRUCTOR.replace(", 2)", ", 2, validate_args=True)")
    result = rewrite(chosen, select=["OPT402"])
    assert "policy.compile()" in result.source


POLICY_MODULE = """
import torch
from torch.distributions import Normal


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mean = torch.nn.Linear(4, 2)
        self.log_std = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x):
        return Normal(self.mean(x), self.log_std.exp())
"""

POLICY_SCRIPT = """
import torch

from policy import Policy

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
policy = Policy().to(device)
optimizer = torch.optim.Adam(policy.parameters())
observations = torch.randn(64, 4, device=device)
for step in range(100):
    loss = -policy(observations).entropy().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

TRAINER_MODULE = """
import torch
from torch.distributions import Categorical


def train(policy, device, steps=100):
    optimizer = torch.optim.Adam(policy.parameters())
    observations = torch.randn(64, 4, device=device)
    for step in range(steps):
        loss = -Categorical(logits=policy(observations)).entropy().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""

TRAINER_SCRIPT = """
import torch

from trainer import train


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.net(x)


if __name__ == "__main__":
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    policy = Policy().to(device)
    train(policy, device)
"""


def _compile_fix_of_a_project(folder: Path, files: dict) -> Diagnostic:
    for name, text in files.items():
        (folder / name).write_text(text)
    paths = sorted(str(folder / name) for name in files)
    outcomes = runner.run(paths, Settings(root=str(folder)), runner.Mode(write=False, diff=True))
    (script,) = [o for o in outcomes if o.path.endswith("train.py")]
    (compile_fix,) = [
        d for d in script.diagnostics if d.code == "OPT402" and d.status is not Status.DECLINED
    ]
    return compile_fix


@pytest.mark.parametrize(
    "files, builder",
    [
        ({"policy.py": POLICY_MODULE, "train.py": POLICY_SCRIPT}, "policy.py"),
        ({"trainer.py": TRAINER_MODULE, "train.py": TRAINER_SCRIPT}, "trainer.py"),
    ],
    ids=["model-of-another-module", "loop-of-another-module"],
)
def test_distributions_of_imported_modules_make_the_compile_fix_behavior(
    tmp_path: Path, files: dict, builder: str
) -> None:
    """The policy's class (or the loop that trains it) lives in a module the script imports:
    compiling in the script still turns that module's checks off."""
    compile_fix = _compile_fix_of_a_project(tmp_path, files)
    assert compile_fix.safety is Safety.BEHAVIOR
    assert f"the distributions {builder} builds" in compile_fix.message
    assert "`policy.compile()`" in compile_fix.fix_title
    chosen = {
        name: text.replace("exp())", "exp(), validate_args=False)").replace(
            "(observations))", "(observations), validate_args=False)"
        )
        for name, text in files.items()
    }
    assert chosen != files
    (tmp_path / "chosen").mkdir()
    compile_fix = _compile_fix_of_a_project(tmp_path / "chosen", chosen)
    assert compile_fix.safety is not Safety.BEHAVIOR


LIKELIHOODS_MODULE = """
import torch


def gaussian_log_likelihood(x, mean):
    return torch.distributions.Normal(mean, torch.ones_like(mean)).log_prob(x)


def squared_error(x, mean):
    return (x - mean).pow(2)
"""

# The compiled agent's policy trained as a regressor through a helper of another module.
REGRESSION_SCRIPT = COMPILED_AGENT.replace(
    "from torch.distributions import Categorical\n", "import likelihoods\n"
).replace(
    "probs = Categorical(logits=policy(observations))\n    loss = -probs.entropy().mean()",
    "loss = likelihoods.squared_error(observations[:, :2], policy(observations)).mean()",
)


@pytest.mark.parametrize("called", [False, True])
def test_a_distribution_in_code_nothing_names_is_never_built(tmp_path: Path, called: bool) -> None:
    """DiT's diffusion_utils.py defines `continuous_gaussian_log_likelihood` (a Normal's
    `log_prob`) and nothing in the repository names it: compiling turns off no check there, so
    the compile fix keeps its level; once the loop calls it, it is `behavior`."""
    script = REGRESSION_SCRIPT
    assert "likelihoods.squared_error(" in script
    if called:
        script = script.replace("squared_error", "gaussian_log_likelihood")
    files = {"likelihoods.py": LIKELIHOODS_MODULE, "train.py": script}
    compile_fix = _compile_fix_of_a_project(tmp_path, files)
    assert (compile_fix.safety is Safety.BEHAVIOR) is called
    # The same within one file: a helper of the script that nothing calls.
    in_file = LIKELIHOODS_MODULE + script.replace("import likelihoods\n", "").replace(
        "likelihoods.", ""
    )
    (compile_fix,) = [
        d for d in rewrite(in_file, select=["OPT402"]).diagnostics if d.code == "OPT402"
    ]
    assert (compile_fix.safety is Safety.BEHAVIOR) is called

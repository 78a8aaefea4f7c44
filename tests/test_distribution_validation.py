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

from optimizer_codemod import rewrite  # noqa: E402
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

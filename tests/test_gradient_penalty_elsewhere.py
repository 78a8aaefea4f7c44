"""OPT402 does not compile models whose loop calls a gradient penalty from a helper module
(aladdinpersson's ProGAN: utils.py's `gradient_penalty` calls `torch.autograd.grad(...,
create_graph=True)`): the second backward through a compiled module raises."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from optimizer_codemod import runner
from optimizer_codemod.config import Settings

TRAIN = """\
import torch
from torch import nn

from utils import gradient_penalty



class MLP(nn.Module):
    def __init__(self, inputs, outputs):
        super().__init__()
        self.hidden = nn.Linear(inputs, 16)
        self.out = nn.Linear(16, outputs)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


device = "cuda" if torch.cuda.is_available() else "cpu"
gen = MLP(8, 4).to(device)
critic = MLP(4, 1).to(device)
opt_gen = torch.optim.Adam(gen.parameters(), lr=1e-4)
opt_critic = torch.optim.Adam(critic.parameters(), lr=1e-4)
for step in range(100):
    real = torch.randn(32, 4, device=device)
    fake = gen(torch.randn(32, 8, device=device))
    gp = gradient_penalty(critic, real, fake)
    loss_critic = critic(fake.detach()).mean() - critic(real).mean() + 10 * gp
    opt_critic.zero_grad()
    loss_critic.backward()
    opt_critic.step()
    loss_gen = -critic(fake).mean()
    opt_gen.zero_grad()
    loss_gen.backward()
    opt_gen.step()
"""
UTILS = """\
import torch


def gradient_penalty(critic, real, fake):
    beta = torch.rand(real.shape[0], 1, device=real.device)
    mixed = (real * beta + fake.detach() * (1 - beta)).requires_grad_(True)
    scores = critic(mixed)
    gradient = torch.autograd.grad(
        inputs=mixed,
        outputs=scores,
        grad_outputs=torch.ones_like(scores),
        create_graph={create_graph},
    )[0]
    return ((gradient.norm(2, dim=1) - 1) ** 2).mean()
"""


def _opt402(tmp_path: Path, create_graph: str, train: str = TRAIN) -> List[str]:
    (tmp_path / "train.py").write_text(train)
    (tmp_path / "utils.py").write_text(UTILS.format(create_graph=create_graph))
    paths = [str(tmp_path / "train.py"), str(tmp_path / "utils.py")]
    settings = Settings(root=str(tmp_path), select=("OPT402",), why_not=True, unsafe_fixes=True)
    found: Dict[str, List[str]] = {}
    for outcome in runner.run(paths, settings, runner.Mode(write=False, diff=True), jobs=1):
        assert outcome.error is None, outcome.error
        for d in outcome.diagnostics:
            found.setdefault(Path(outcome.path).name, []).append(f"{d.status.value}: {d.message}")
    return found.get("train.py", [])


def test_a_gradient_penalty_from_a_helper_module_keeps_both_models_eager(tmp_path: Path) -> None:
    found = _opt402(tmp_path, "True")
    assert len(found) == 2, found
    for message in found:
        assert message.startswith("declined: `gradient_penalty(critic, real, fake)` runs ")
        assert "`gradient_penalty` of utils.py, which differentiates a gradient again" in message
        assert "double backward" in message


def test_without_a_second_backward_both_are_compiled(tmp_path: Path) -> None:
    found = _opt402(tmp_path, "False")
    assert [m.split(":")[0] for m in found] == ["fixed", "fixed"], found


def test_a_helper_module_differentiating_twice_elsewhere_does_not_count(tmp_path: Path) -> None:
    """x-transformers' package imports a wrapper that trains at test time; scripts that never
    call it compile as before."""
    train = TRAIN.replace("    gp = gradient_penalty(critic, real, fake)\n", "    gp = 0.0\n")
    found = _opt402(tmp_path, "True", train)
    assert [m.split(":")[0] for m in found] == ["fixed", "fixed"], found

"""A library module's `__main__` guard that only demonstrates it (denoising-diffusion-pytorch's
guided_diffusion.py samples from a model; classifier_free_guidance.py takes one step) does not
make it a script: a process-wide setting at its top would run in every program that imports it."""

from __future__ import annotations

import libcst as cst
import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.analysis import ScriptFacts
from optimizer_codemod.diagnostics import Status

LIBRARY = """\
import torch
import torch.nn as nn


class Unet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


class Trainer:
    def __init__(self, model):
        self.model = model.cuda()
        self.opt = torch.optim.Adam(model.parameters())

    def train(self, loader):
        for x in loader:
            self.model(x.cuda()).mean().backward()
            self.opt.step()
            self.opt.zero_grad()


if __name__ == "__main__":
{guard}
"""

GUARDS = {
    # A demo that samples and never trains.
    "demo": "    model = Unet().cuda()\n    print(model(torch.randn(1, 3, 8, 8).cuda()).shape)\n",
    # Guards that run the file's training, by a call or by handing a name on.
    "calls": "    Trainer(Unet()).train(loader)\n",
    "hands on": "    import fire\n    fire.Fire(Trainer)\n",
}


@pytest.mark.parametrize("guard, script", [("demo", False), ("calls", True), ("hands on", True)])
def test_a_guard_counts_as_a_script_when_it_may_run_the_training(guard: str, script: bool) -> None:
    facts = ScriptFacts.of(cst.parse_module(LIBRARY.format(guard=GUARDS[guard])))
    assert facts.main_guard_may_train is script
    assert facts.runs_as_script is script


@pytest.mark.parametrize("guard, fixed", [("demo", False), ("calls", True)])
def test_no_cudnn_setting_at_the_top_of_a_library_module_with_a_demo(
    guard: str, fixed: bool
) -> None:
    source = LIBRARY.format(guard=GUARDS[guard])
    result = rewrite(source, select=["OPT401"], target_device="cuda")
    assert ("cudnn.benchmark = True" in result.source) is fixed
    if not fixed:
        (finding,) = result.diagnostics
        assert finding.status is Status.REPORTED and "importable module" in finding.message


def test_a_file_taking_one_step_gets_no_autotuner() -> None:
    """classifier_free_guidance.py's demo: one `loss.backward()` under the guard."""
    source = (
        "import torch\n\nmodel = torch.nn.Conv2d(3, 8, 3).cuda()\n"
        'if __name__ == "__main__":\n    model(x).sum().backward()\n'
    )
    result = rewrite(source, select=["OPT401"], target_device="cuda", why_not=True)
    assert result.source == source
    (finding,) = result.diagnostics
    assert finding.status is Status.DECLINED and "one training step" in finding.message
    looped = source.replace("    model(x)", "    for x in batches:\n        model(x)")
    assert (
        "cudnn.benchmark = True" in rewrite(looped, select=["OPT401"], target_device="cuda").source
    )

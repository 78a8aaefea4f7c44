"""Training without `torch.optim` (issue 15): a backward plus a hand-written update of each
parameter from its gradient is a training step, and its model gets autocast and compile."""

from __future__ import annotations

import contextlib
import io
import math
import runpy
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from optimizer_codemod.analysis.script import ScriptFacts
from optimizer_codemod.analysis.training import (
    the_trained_model,
    training_steps,
    why_no_trained_model,
)

ROOT = Path(__file__).resolve().parent.parent
HEADER = """
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(4, 2).to(device)
"""


def facts_of(*parts: str) -> ScriptFacts:
    return ScriptFacts.of(cst.parse_module("".join(textwrap.dedent(p) for p in parts)))


@pytest.mark.parametrize(
    "update",
    [
        "p -= lr * p.grad",
        "p.add_(p.grad, alpha=-lr)",
        "p.data.sub_(lr * p.grad)",
        "p.data -= lr * p.grad.data",
        "p.copy_(p - lr * p.grad)",
    ],
)
def test_hand_written_update_names_the_trained_model(update: str) -> None:
    facts = facts_of(
        HEADER,
        f"""
        for x, y in loader:
            loss = loss_fn(model(x), y)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    {update}
                model.zero_grad()
        """,
    )
    model = the_trained_model(facts)
    assert model is not None and model.name == "model"
    assert model.updated_by is not None
    assert why_no_trained_model(facts) is None


def test_update_through_a_parameter_list_and_named_parameters() -> None:
    facts = facts_of(
        HEADER,
        """
        params = list(model.parameters())
        for x, y in loader:
            loss_fn(model(x), y).backward()
            for name, p in model.named_parameters():
                p.data.add_(torch.randn_like(p) * 0.01 - 0.1 * p.grad)
        """,
    )
    model = the_trained_model(facts)
    assert model is not None and model.name == "model"


def test_a_loop_that_never_reads_the_gradient_is_no_update() -> None:
    """Weight clipping (WGAN) changes the parameters in place every step, but it is no
    training update: without one the trained model stays unknown, and the reason says so."""
    facts = facts_of(
        HEADER,
        """
        for x, y in loader:
            loss_fn(model(x), y).backward()
            for p in model.parameters():
                p.data.clamp_(-0.01, 0.01)
        """,
    )
    assert the_trained_model(facts) is None
    missing = why_no_trained_model(facts)
    assert missing is not None and "reads each `p.grad`" in missing[1]


def test_an_update_before_the_forward_stays_out_of_the_step() -> None:
    facts = facts_of(
        HEADER,
        """
        for x, y in loader:
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p -= 0.1 * p.grad
            model.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
        """,
    )
    model = the_trained_model(facts)
    (step,) = training_steps(facts, model)
    first = cst.Module([]).code_for_node(step.forward[0]).strip()
    # The step starts at the forward: neither the update nor `model.zero_grad()` (no
    # forward computation) is in the region autocast would wrap.
    assert first == "out = model(x)"
    assert not any(isinstance(s, cst.With) for s in step.forward)


def _losses(script: Path) -> tuple:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        scope = runpy.run_path(str(script), run_name="__main__")
    losses = [float(line.split()[-1]) for line in out.getvalue().splitlines()]
    return losses, scope


def test_rewritten_manual_update_trains_on_cpu() -> None:
    """The rewritten script (bfloat16 autocast around forward and loss) runs, its losses stay
    finite and fall as the original's do, and the weights stay float32 (the update runs outside
    the autocast block). Bounds are loose: on CPU bfloat16 rounds differently per machine."""
    folder = ROOT / "fixtures/OPT302"
    rewritten = folder / "fix_manual_update_loop.expected.py"
    assert "torch.autocast" in rewritten.read_text(encoding="utf-8")
    before, _ = _losses(folder / "fix_manual_update_loop.py")
    after, scope = _losses(rewritten)
    assert len(after) == len(before) == 40
    assert all(math.isfinite(loss) for loss in after)
    first, last = sum(after[:10]) / 10, sum(after[-10:]) / 10
    assert last < 0.5 * first  # about 0.08 against 0.5
    assert abs(last - sum(before[-10:]) / 10) < 0.5 * first
    assert all(p.dtype is scope["torch"].float32 for p in scope["model"].parameters())


def test_rewritten_sgld_trainer_runs() -> None:
    script = ROOT / "fixtures/OPT302/fix_manual_update_sgld_trainer.expected.py"
    scope = runpy.run_path(str(script), run_name="not_main")
    scope["main"]()

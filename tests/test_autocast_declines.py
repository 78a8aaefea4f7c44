"""OPT302 declines, with their reasons, where bfloat16 autocast would slow a script down or
crash it: a differential-equation solver in the training step (torchdiffeq's examples), and
torch_sparse's `SparseTensor`, whose CUDA matrix product has no bfloat16 kernel (PyG's)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "OPT302"


def _only(source: str, **options):
    result = rewrite(source, select=["OPT302"], why_not=True, **options)
    findings = [d for d in result.diagnostics if d.code == "OPT302"]
    assert len(findings) == 1, findings
    return result, findings[0]


@pytest.mark.parametrize(
    "fixture, reason",
    [
        (
            "keep_step_calls_an_ode_solver",
            "this training step calls the solver `odeint(func, batch_y0, batch_t)`",
        ),
        (
            "keep_step_calls_a_helper_that_solves",
            "this training step calls `trajectories`, which runs the solver `sdeint(",
        ),
        (
            "keep_model_forward_runs_an_ode_solver",
            "`model` runs the solver `odeint(self.odefunc, x,",
        ),
    ],
)
def test_a_step_that_runs_a_solver_is_declined_naming_it(fixture: str, reason: str) -> None:
    source = (FIXTURES / f"{fixture}.py").read_text(encoding="utf-8")
    result, finding = _only(source)
    assert result.source == source and finding.status is Status.DECLINED
    assert reason in finding.message and "function evaluations" in finding.message


ODE_MODEL = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torchdiffeq import odeint

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


    class ODEBlock(nn.Module):
        def __init__(self, odefunc):
            super().__init__()
            self.odefunc = odefunc

        def forward(self, x):
            return odeint(self.odefunc, x, torch.tensor([0.0, 1.0]))[1]


    layers = [nn.Linear(4, 4)]
    layers.append(ODEBlock(lambda t, x: torch.tanh(x)))
    model = nn.Sequential(*layers).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = (model(x) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """)


def test_a_solver_in_a_class_the_model_analysis_does_not_follow_is_declined() -> None:
    # The list the model is built from grows by `.append`: its classes are not followed, so
    # a method of any class of the file that runs a solver counts, as autograd Functions do.
    result, finding = _only(ODE_MODEL)
    assert result.source == ODE_MODEL and finding.status is Status.DECLINED
    assert "`ODEBlock.forward` of this file runs the solver `odeint(" in finding.message
    plain = ODE_MODEL.replace(
        "return odeint(self.odefunc, x, torch.tensor([0.0, 1.0]))[1]", "return x"
    )
    assert _only(plain)[1].status is Status.FIXED


EVALUATED_BY_SOLVING = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torchdiffeq import odeint

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    func = nn.Sequential(nn.Linear(2, 50), nn.Tanh(), nn.Linear(50, 2)).to(device)
    optimizer = torch.optim.Adam(func.parameters(), lr=1e-3)
    for y, dy in loader:
        y, dy = y.to(device), dy.to(device)
        loss = (func(y) - dy).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        for y, dy in val_loader:
            y = y.to(device)
            drift = (odeint(func_of_time, y, ts)[-1] - func(y)).abs().mean()
            print(drift.item())
    """)


def test_an_evaluation_forward_that_solves_stays_float32() -> None:
    """The training step is wrapped; the evaluation statement that also integrates is not."""
    result = rewrite(EVALUATED_BY_SOLVING, select=["OPT302"], why_not=True)
    statuses = sorted(d.status.value for d in result.diagnostics)
    assert statuses == sorted([Status.FIXED.value, Status.DECLINED.value])
    declined = next(d for d in result.diagnostics if d.status is Status.DECLINED)
    assert "this evaluation forward calls the solver `odeint(func_of_time, y, ts)`" in (
        declined.message
    )
    assert "    with torch.autocast(device.type, dtype=torch.bfloat16):\n        loss =" in (
        result.source
    )
    assert "\n        drift = (odeint(" in result.source
    assert result.source.count("torch.autocast(") == 1


SPARSE = (FIXTURES / "keep_sparse_tensor_message_passing.py").read_text(encoding="utf-8")


def test_torch_sparse_is_declined_under_bfloat16_for_cuda() -> None:
    result, finding = _only(SPARSE)
    assert result.source == SPARSE and finding.status is Status.DECLINED
    assert "`T.ToSparseTensor()`" in finding.message and "BFloat16" in finding.message


@pytest.mark.parametrize(
    "imported",
    [
        "import torch_sparse",
        "from torch_sparse import SparseTensor",
        "from torch_geometric.typing import SparseTensor",
    ],
)
def test_any_name_of_torch_sparse_is_declined(imported: str) -> None:
    source = SPARSE.replace("T.Compose([T.GCNNorm(), T.ToSparseTensor()])", "T.GCNNorm()")
    assert source != SPARSE and _only(source)[1].status is Status.FIXED
    source = source.replace("import torch\n", f"import torch\n{imported}\n", 1)
    result, finding = _only(source)
    assert finding.status is Status.DECLINED and imported.split()[1] in finding.message


@pytest.mark.parametrize("options", [{"precision": "fp16"}, {"target_device": "cpu"}])
def test_torch_sparse_gets_autocast_where_its_kernel_has_the_dtype(options) -> None:
    # The CUDA kernel has Half; the CPU kernel (and `torch.sparse.mm` with a reduction, PyG's
    # CPU path) has BFloat16.
    result, finding = _only(SPARSE, **options)
    assert finding.status is Status.FIXED and "torch.autocast(" in result.source

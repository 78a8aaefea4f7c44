"""OPT302 declines, with their reasons, where bfloat16 autocast would slow a script down or
crash it: a differential-equation solver in the training step (torchdiffeq's examples),
torch_sparse's `SparseTensor` and `DynamicEdgeConv`'s neighbour search, whose CUDA kernels
have no bfloat16 version, and the cosine of a learned phase (PyG's)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.analysis.phases import phase_of_a_product
from optimizer_codemod.analysis.script import ScriptFacts
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
    assert source != SPARSE and "torch_sparse" not in _only(source)[1].message
    source = source.replace("import torch\n", f"import torch\n{imported}\n", 1)
    result, finding = _only(source)
    assert finding.status is Status.DECLINED and imported.split()[1] in finding.message


@pytest.mark.parametrize("options", [{"precision": "fp16"}, {"target_device": "cpu"}])
def test_torch_sparse_gets_autocast_where_its_kernel_has_the_dtype(options) -> None:
    # The CUDA kernel has Half; the CPU kernel (and `torch.sparse.mm` with a reduction, PyG's
    # CPU path) has BFloat16.
    result, finding = _only(SPARSE, **options)
    assert finding.status is Status.FIXED and "torch.autocast(" in result.source


FEATURE_KNN = (FIXTURES / "keep_knn_of_learned_features.py").read_text(encoding="utf-8")


def test_a_neighbour_search_of_learned_features_is_declined_under_bfloat16_for_cuda() -> None:
    result, finding = _only(FEATURE_KNN)
    assert result.source == FEATURE_KNN and finding.status is Status.DECLINED
    assert "`DynamicEdgeConv`" in finding.message and "BFloat16" in finding.message


def test_point_convolutions_without_dynamic_edges_are_declined_for_their_sums_only() -> None:
    source = FEATURE_KNN.replace("DynamicEdgeConv", "EdgeConv")
    assert source != FEATURE_KNN
    result, finding = _only(source)
    assert finding.status is Status.DECLINED and "DynamicEdgeConv" not in finding.message
    assert "stop at 256" in finding.message


@pytest.mark.parametrize("options", [{"precision": "fp16"}, {"target_device": "cpu"}])
def test_dynamic_edges_get_autocast_where_the_knn_kernel_has_the_dtype(options) -> None:
    result, finding = _only(FEATURE_KNN, **options)
    assert finding.status is Status.FIXED and "torch.autocast(" in result.source


TIME_ENCODING = (FIXTURES / "keep_cosine_of_a_learned_time_encoding.py").read_text(encoding="utf-8")


@pytest.mark.parametrize("options", [{}, {"precision": "fp16"}, {"target_device": "cpu"}])
def test_a_cosine_of_a_learned_phase_is_declined_in_any_precision(options) -> None:
    result, finding = _only(TIME_ENCODING, **options)
    assert result.source == TIME_ENCODING and finding.status is Status.DECLINED
    assert "`self.lin(elapsed.view(-1, 1)).cos()`" in finding.message


@pytest.mark.parametrize(
    "phase",
    [
        "torch.cos(elapsed.view(-1, 1) @ self.lin.weight.t())",
        "torch.sin(torch.einsum('i,j->ij', elapsed, self.lin.weight.view(-1)))",
    ],
)
def test_any_product_under_a_sine_or_cosine_is_declined(phase: str) -> None:
    source = TIME_ENCODING.replace("self.lin(elapsed.view(-1, 1)).cos()", phase)
    assert source != TIME_ENCODING
    assert _only(source)[1].status is Status.DECLINED


def test_a_cosine_of_a_learned_phase_with_autocast_turned_off_is_not_one() -> None:
    turned_off = TIME_ENCODING.replace(
        "        return self.lin(elapsed.view(-1, 1)).cos()\n",
        '        with torch.autocast("cuda", enabled=False):\n'
        "            return self.lin(elapsed.view(-1, 1).float()).cos()\n",
    )
    assert turned_off != TIME_ENCODING
    assert phase_of_a_product(ScriptFacts.of(cst.parse_module(TIME_ENCODING))) is not None
    assert phase_of_a_product(ScriptFacts.of(cst.parse_module(turned_off))) is None


def test_a_sinusoidal_encoding_of_positions_gets_autocast() -> None:
    source = TIME_ENCODING.replace(
        "self.lin(elapsed.view(-1, 1)).cos()", "torch.cos(elapsed.view(-1, 1) * 1e-4)"
    )
    result, finding = _only(source)
    assert finding.status is Status.FIXED and "torch.bfloat16" in result.source


def test_pyg_tgn_is_declined() -> None:
    source = "from torch_geometric.nn import TGNMemory\n" + TIME_ENCODING.replace(
        "self.lin(elapsed.view(-1, 1)).cos()", "elapsed.view(-1, 1)"
    )
    result, finding = _only(source)
    assert finding.status is Status.DECLINED and "PyG's TGN" in finding.message


PYG_LAYERS = (FIXTURES / "keep_pyg_message_passing.py").read_text(encoding="utf-8")


def test_pyg_layers_are_declined_under_bfloat16_for_cuda() -> None:
    result, finding = _only(PYG_LAYERS)
    assert result.source == PYG_LAYERS and finding.status is Status.DECLINED
    assert "`from torch_geometric.nn import SAGEConv`" in finding.message
    assert "stop at 256" in finding.message


@pytest.mark.parametrize(
    "imported",
    ["import torch_geometric.nn as gnn", "from torch_scatter import scatter_mean"],
)
def test_any_name_of_pyg_layers_is_declined(imported: str) -> None:
    source = PYG_LAYERS.replace("from torch_geometric.nn import SAGEConv", imported)
    assert _only(source)[1].status is Status.DECLINED


def test_pyg_data_alone_is_not_declined() -> None:
    source = PYG_LAYERS.replace("from torch_geometric.nn import SAGEConv\n", "").replace(
        "SAGEConv(", "torch.nn.Linear("
    )
    assert _only(source)[1].status is Status.FIXED


@pytest.mark.parametrize("options", [{"precision": "fp16"}, {"target_device": "cpu"}])
def test_pyg_layers_get_autocast_where_counts_stay_exact(options) -> None:
    result, finding = _only(PYG_LAYERS, **options)
    assert finding.status is Status.FIXED and "torch.autocast(" in result.source


def test_bfloat16_adds_one_at_a_time_stop_counting_at_256() -> None:
    torch = pytest.importorskip("torch")
    index = torch.zeros(1000, dtype=torch.long)
    ones = torch.ones(1000, dtype=torch.bfloat16)
    one_at_a_time = torch.zeros(1, dtype=torch.bfloat16).index_add_(0, index, ones)
    assert one_at_a_time.item() == 256.0
    assert torch.zeros(1, dtype=torch.bfloat16).scatter_add_(0, index, ones).item() == 1000.0
    assert torch.zeros(1, dtype=torch.float16).index_add_(0, index, ones.half()).item() == 1000.0

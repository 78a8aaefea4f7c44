"""Issue 16, items 6 and 7: DDP's `find_unused_parameters=True` (OPT603), `nn.DataParallel`
(OPT604), and hand-written per-parameter optimizer updates (OPT503)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Optional

import libcst as cst
import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.analysis import ScriptFacts
from optimizer_codemod.analysis.module_usage import why_parameters_may_go_unused
from optimizer_codemod.diagnostics import Status
from optimizer_codemod.measured_gains import load_results, measurements_for
from optimizer_codemod.registry import rule_by_code

ROOT = Path(__file__).resolve().parent.parent


def _why(source: str, class_name: str) -> Optional[str]:
    facts = ScriptFacts.of(cst.parse_module(textwrap.dedent(source)))
    return why_parameters_may_go_unused(facts, class_name)


HEADER = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
import timm

"""


# OPT603: the proof that every parameter is used ---------------------------------------------
@pytest.mark.parametrize(
    "body, reason",
    [
        pytest.param(
            """
            class Net(nn.Module):
                def __init__(self, width: int, depth=2):
                    super().__init__()
                    self.width = width
                    self.depth = depth
                    self.scale = width ** -0.5
                    self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
                    self.out = nn.Sequential(nn.ReLU(), nn.Linear(width, 1))

                def forward(self, x):
                    for layer in self.layers:
                        x = layer(x) * self.scale
                    return self.out(x)
            """,
            None,
            id="plain-values-unused-modules-all-used",
        ),
        pytest.param(
            """
            class Net(nn.Module):
                def __init__(self, encoder):
                    super().__init__()
                    self.encoder = encoder
                    self.head = nn.Linear(8, 1)

                def forward(self, x):
                    return self.head(x)
            """,
            "does not use `self.encoder`",
            id="module-passed-in-and-unused",
        ),
        pytest.param(
            """
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.a = nn.Linear(8, 8)
                    self.b = nn.Linear(8, 8)

                def forward(self, x):
                    return self.a(x), self.b(x)
            """,
            "returns several values",
            id="tuple-output",
        ),
        pytest.param(
            """
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.a = nn.Linear(8, 8)
                    self.b = nn.Linear(8, 8)

                def forward(self, x):
                    return self.a(x) + self.b(x).detach()
            """,
            "calls `detach`",
            id="detached-branch",
        ),
        pytest.param(
            """
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.a = nn.Linear(8, 8)

                def forward(self, x):
                    y = self.a(x)
                    return y if y.sum() > 0 else x
            """,
            "a parameter may be skipped",
            id="conditional-expression",
        ),
        pytest.param(
            """
            class Net(nn.Module):
                def __init__(self, n):
                    super().__init__()
                    for i in range(n):
                        self.add_module(f"l{i}", nn.Linear(8, 8))

                def forward(self, x):
                    return x
            """,
            "under control flow",
            id="registered-in-a-loop",
        ),
        pytest.param(
            """
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.backbone = timm.create_model("resnet18")

                def forward(self, x):
                    return self.backbone(x)
            """,
            "may build a module the analysis cannot see",
            id="third-party-factory",
        ),
        pytest.param(
            """
            class Base(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.extra = nn.Linear(8, 8)

            class Net(Base):
                def forward(self, x):
                    return x
            """,
            "derives from `Base`",
            id="inherited-parameters",
        ),
        pytest.param(
            """
            class Inner(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.used = nn.Linear(8, 8)
                    self.spare = nn.Linear(8, 8)

                def forward(self, x):
                    return self.used(x)

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.inner = Inner()

                def forward(self, x):
                    return self.inner(x)
            """,
            "`Inner.forward` does not use `self.spare`",
            id="unused-layer-of-a-submodule",
        ),
        pytest.param(
            """
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.a = nn.Linear(8, 8)
                    self.b = nn.Linear(8, 8)

                def forward(self, x):
                    return self.b(self.encode(x))

                def encode(self, x):
                    return F.relu(self.a(x))
            """,
            None,
            id="helper-method-followed",
        ),
        pytest.param(
            """
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.a = nn.Linear(8, 8)
                    self.register_buffer("mask", torch.ones(8))
                    nn.init.zeros_(self.a.bias)
                    self.apply(init_weights)

                def forward(self, x):
                    return self.a(x) * self.mask
            """,
            None,
            id="buffers-and-initialisation",
        ),
        pytest.param(
            """
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.register_parameter("w", nn.Parameter(torch.ones(8)))

                def forward(self, x):
                    return x
            """,
            "which may register parameters",
            id="register-parameter",
        ),
    ],
)
def test_why_parameters_may_go_unused(body: str, reason: Optional[str]) -> None:
    found = _why(HEADER + textwrap.dedent(body), "Net")
    if reason is None:
        assert found is None
    else:
        assert found is not None and reason in found, found


DDP_SCRIPT = HEADER + textwrap.dedent("""\
    from torch.nn.parallel import DistributedDataParallel as DDP


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 2)

        def forward(self, x):
            return self.fc(x)


    model = Net().to(device)
    model = torch.compile(model)
    model = DDP(model, device_ids=[rank], find_unused_parameters=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    """)


def test_opt603_fix_is_behavior_level_and_follows_rebinding_wrappers() -> None:
    fixed_line = "model = DDP(model, device_ids=[rank])\n"
    default = rewrite(DDP_SCRIPT, select=["OPT603"])
    assert default.source == DDP_SCRIPT
    (finding,) = default.diagnostics
    assert finding.status is Status.UNSAFE
    unsafe = rewrite(DDP_SCRIPT, select=["OPT603"], unsafe_fixes=True)
    assert fixed_line in unsafe.source and "find_unused" not in unsafe.source


def test_opt603_declines_static_graph_under_why_not() -> None:
    source = DDP_SCRIPT.replace(
        "find_unused_parameters=True", "find_unused_parameters=True, static_graph=True"
    )
    result = rewrite(source, select=["OPT603"], unsafe_fixes=True, why_not=True)
    assert result.source == source
    (declined,) = result.diagnostics
    assert declined.status is Status.DECLINED and "static_graph=True" in declined.message


# OPT604 ---------------------------------------------------------------------------------------
def test_opt604_names_the_launch_change() -> None:
    rule = rule_by_code("OPT604")
    for needed in ("torchrun", "init_process_group", "DistributedSampler"):
        assert needed in rule.fix_title
    page = rule.doc_sections()
    assert "It is recommended to use DistributedDataParallel" in page["Why is it slow"]
    # The quotation is the installed torch's own warning, word for word.
    torch = pytest.importorskip("torch")
    doc = " ".join((torch.nn.DataParallel.__doc__ or "").split())
    assert (
        "It is recommended to use :class:`~torch.nn.parallel.DistributedDataParallel`, "
        "instead of this class, to do multi-GPU training, even if there is only a single node"
    ) in doc


# OPT503 ---------------------------------------------------------------------------------------
def test_opt503_reports_the_sgld_seed_and_changes_nothing() -> None:
    path = ROOT / "reference_models" / "sgld_mnist" / "train.py"
    source = path.read_text(encoding="utf-8")
    result = rewrite(source, path=str(path), select=["OPT503"], unsafe_fixes=True)
    assert result.source == source
    (finding,) = result.diagnostics
    assert finding.status is Status.REPORTED
    assert source.splitlines()[finding.line - 1].strip() == 'for p in group["params"]:'
    assert "`SGLD.step`" in finding.message and "2 in-place operations" in finding.message


def test_opt503_declines_a_compiled_step_under_why_not() -> None:
    path = ROOT / "fixtures" / "OPT503" / "keep_compiled_step.py"
    source = path.read_text(encoding="utf-8")
    result = rewrite(source, select=["OPT503"], why_not=True)
    (declined,) = result.diagnostics
    assert declined.status is Status.DECLINED
    assert "torch.compile(optimizer.step)" in declined.message


def test_opt503_measurements_are_committed_with_machine_torch_and_date() -> None:
    data = json.loads(
        (ROOT / "benchmarks" / "results" / "foreach-update-cpu.json").read_text(encoding="utf-8")
    )
    entries = data["results"]
    assert {"OPT503:momentum-small", "OPT503:sgld-sgld"} <= set(entries)
    for entry in entries.values():
        assert {"torch", "date", "cpu_count"} <= set(entry["machine"])
        assert entry["speedup"] == pytest.approx(entry["before_s"] / entry["after_s"])
    # The rule's page renders them.
    assert len(measurements_for("OPT503", load_results())) == len(entries)


# OPT605 ---------------------------------------------------------------------------------------
def test_opt605_offers_bucket_views_on_the_ddp_workload_only_with_unsafe_fixes() -> None:
    path = ROOT / "reference_models" / "mmdit_ddp" / "train.py"
    source = path.read_text(encoding="utf-8")
    default = rewrite(source, path=str(path), select=["OPT605"])
    assert default.source == source
    (finding,) = default.diagnostics
    assert finding.status is Status.UNSAFE
    assert "model = DDP(model, device_ids=" in source.splitlines()[finding.line - 1]
    unsafe = rewrite(source, path=str(path), select=["OPT605"], unsafe_fixes=True)
    assert unsafe.source.count("gradient_as_bucket_view=True") == 1


def test_opt605_quotes_the_installed_torch() -> None:
    torch = pytest.importorskip("torch")
    # Compared without reST/Markdown backticks, which the two texts use differently.
    doc = " ".join((torch.nn.parallel.DistributedDataParallel.__doc__ or "").split())
    doc = doc.replace("`", "")
    page = " ".join(rule_by_code("OPT605").__doc__.split()).replace("`", "")
    for quoted in (
        "Moreover, it avoids the overhead of copying between gradients and allreduce "
        "communication buckets.",
        "alone cannot avoid copies because the bucket view alias is destroyed every iteration",
    ):
        assert quoted in doc and quoted in page

"""Issue 16 item 6: `static_graph=True` in place of `find_unused_parameters=True` (OPT603)
where every forward uses the same parameters and nothing in the script changes that set."""

from __future__ import annotations

import textwrap
from typing import Optional

import libcst as cst
import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.analysis import ScriptFacts
from optimizer_codemod.analysis.module_usage import (
    why_parameters_may_go_unused,
    why_training_may_change_used_parameters,
    why_used_parameters_may_change,
)
from optimizer_codemod.diagnostics import Status

NET = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(8, 8)
            self.heads = nn.ModuleList([nn.Linear(8, 2), nn.Linear(8, 2)])
            self.aux = nn.Linear(8, 2)

        def forward(self, x):
            return self.heads[0](self.body(x))


    model = DDP(Net().to(device), device_ids=[rank], find_unused_parameters=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    """)
UNUSED_HEAD = NET.replace("self.heads[0](self.body(x))", "self.heads(self.body(x))").replace(
    "nn.ModuleList([nn.Linear(8, 2), nn.Linear(8, 2)])", "nn.Sequential(nn.Linear(8, 2))"
)


def _facts(source: str) -> ScriptFacts:
    return ScriptFacts.of(cst.parse_module(source))


def test_unused_attribute_is_static_but_indexing_is_not() -> None:
    assert why_used_parameters_may_change(_facts(UNUSED_HEAD), "Net") is None
    # A Sequential picked by index leaves its other members out, as a ModuleList does.
    picked = UNUSED_HEAD.replace("self.heads(self.body(x))", "self.heads[0](self.body(x))")
    for why in (why_used_parameters_may_change, why_parameters_may_go_unused):
        reason = why(_facts(picked), "Net")
        assert reason is not None and "indexes `self.heads`" in reason
    reason = why_used_parameters_may_change(_facts(NET), "Net")
    assert reason is not None and "indexes `self.heads`" in reason
    branching = UNUSED_HEAD.replace(
        "        return self.heads(self.body(x))\n",
        "        if x.sum() > 0:\n            return self.aux(x)\n        return self.heads(self.body(x))\n",
    )
    reason = why_used_parameters_may_change(_facts(branching), "Net")
    assert reason is not None and "a parameter may be skipped" in reason


@pytest.mark.parametrize(
    "loop_line, reason",
    [
        (
            "    for p in model.module.body.parameters():\n        p.requires_grad = False\n",
            "switches",
        ),
        ("    model.module.body.requires_grad_(epoch > 0)\n", "switches"),
        ("    model.require_backward_grad_sync = False\n", "switches"),
        ("    with model.no_sync():\n        model(x).sum().backward()\n", "no_sync()"),
        ("    model.train()\n", None),
    ],
)
def test_training_that_changes_the_set(loop_line: str, reason: Optional[str]) -> None:
    source = UNUSED_HEAD.replace(
        "    optimizer.zero_grad()\n", loop_line + "    optimizer.zero_grad()\n"
    )
    found = why_training_may_change_used_parameters(_facts(source))
    if reason is None:
        assert found is None
    else:
        assert found is not None and reason in found, found


def test_static_graph_fix_replaces_the_flag_at_behavior_level() -> None:
    default = rewrite(UNUSED_HEAD, select=["OPT603"])
    assert default.source == UNUSED_HEAD
    (finding,) = default.diagnostics
    assert finding.status is Status.UNSAFE and "static_graph=True" in finding.fix_title
    fixed = rewrite(UNUSED_HEAD, select=["OPT603"], unsafe_fixes=True).source
    assert "DDP(Net().to(device), device_ids=[rank], static_graph=True)" in fixed
    assert "find_unused_parameters" not in fixed


@pytest.mark.parametrize(
    "change, reason",
    [
        (("find_unused_parameters=True)", "find_unused_parameters=True, **options)"), "`**`"),
        (
            ("find_unused_parameters=True)", "find_unused_parameters=True, static_graph=False)"),
            "chooses `static_graph`",
        ),
        (("self.heads(self.body(x))", "self.heads[0](self.body(x))"), "indexes `self.heads`"),
    ],
)
def test_static_graph_declined_with_reason(change, reason: str) -> None:
    source = UNUSED_HEAD.replace(*change)
    result = rewrite(source, select=["OPT603"], unsafe_fixes=True)
    assert result.source == source
    (finding,) = result.diagnostics
    assert finding.status is Status.REPORTED
    assert "nor replaced by `static_graph=True`" in finding.message and reason in finding.message


def test_static_graph_needs_target_torch_1_11() -> None:
    result = rewrite(UNUSED_HEAD, select=["OPT603"], unsafe_fixes=True, target_torch="1.10")
    assert result.source == UNUSED_HEAD
    (finding,) = result.diagnostics
    assert "from torch 1.11" in finding.message

"""Issue 16's first families: per-step host syncs (OPT204), tensors made on the host and moved
(OPT203), debugging and cleanup left in the step (OPT703), and how they compose."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.analysis import ScriptFacts
from optimizer_codemod.analysis.calls import code_of
from optimizer_codemod.analysis.syncs import metric_type
from optimizer_codemod.measured_gains import load_results, measurements_for
from optimizer_codemod.rule import Safety


def _facts(source: str) -> ScriptFacts:
    return ScriptFacts.of(cst.parse_module(textwrap.dedent(source)))


STEP = """\
import math
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Linear(8, 2).to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(loader):
    x, y = x.to(device), y.to(device)
    out = model(x)
    loss = criterion(out, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    acc = (out.argmax(1) == y).float().mean()
    print(f"acc {acc:.3f}", x.shape, len(x), step)
    if torch.isnan(norm) or step > 10:
        break
    finite = math.isfinite(loss)
    probs = out.softmax(-1).detach().cpu().numpy()
    print(loss)
    ids = out.argmax(1).tolist()
    on_host = out.to("cpu")
    if step % 100 == 0:
        print(acc.item())
"""


def test_every_per_step_read_of_a_device_value_is_found_and_nothing_else() -> None:
    facts = _facts(STEP)
    (loop,) = facts.training_loops
    found = {(s.kind, code_of(s.node)) for s in facts.host_syncs.sites(loop)}
    assert found == {
        ("format", 'f"acc {acc:.3f}"'),
        ("branch", "torch.isnan(norm)"),
        ("convert", "math.isfinite(loss)"),
        ("cpu", "out.softmax(-1).detach().cpu()"),
        ("print", "print(loss)"),
        ("tolist", "out.argmax(1).tolist()"),
        ("cpu", 'out.to("cpu")'),
    }


def test_a_script_that_uses_no_accelerator_reads_no_device_value() -> None:
    facts = _facts(STEP.replace(".to(device)", "").replace('out.to("cpu")', "out"))
    (loop,) = facts.training_loops
    assert {s.kind for s in facts.host_syncs.sites(loop)} == {"cpu", "tolist"}
    assert not [s for s in facts.host_syncs.sites(loop) if s.certain]


@pytest.mark.parametrize(
    "expression, kind",
    [
        ("(pred == y).sum()", "int"),
        ("pred.eq(y).sum()", "int"),
        ("torch.sum(pred > 0)", "int"),
        ("(~torch.isnan(x)).sum()", "int"),
        ("torch.count_nonzero(pred != y)", "int"),
        ("(pred == y).float().mean()", "float"),
        ("x.float().sum()", "float"),
        ("x.mean()", "float"),
        ("x.sum()", None),
        ("(pred == y).sum(1)", None),
        ("(pred == y).sum(dtype=torch.float16)", None),
        ("helper(pred).sum()", None),
    ],
)
def test_metric_type_knows_counts_and_means_only(expression: str, kind) -> None:
    facts = _facts("import torch\n")
    assert metric_type(facts, cst.parse_expression(expression)) == kind


SYNCS = """\
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Linear(16, 4).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    running, correct = 0.0, 0
    for x, y in loader:
        out = model(x.to(device))
        loss = nn.functional.cross_entropy(out, y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        running += loss.item()
        correct += (out.argmax(1) == y.to(device)).sum().item()
        torch.cuda.synchronize()
    print(epoch, running, correct)
"""


@pytest.mark.parametrize(
    "unsafe, fixed",
    [(False, set()), (True, {"OPT202", "OPT204", "OPT703"})],
)
def test_sync_removing_fixes_are_made_only_when_every_sync_of_the_step_goes(
    unsafe: bool, fixed: set
) -> None:
    # The synchronize() is OPT703's, a behavior-level fix: without --unsafe-fixes it stays,
    # so moving the loss and the count to the device would gain nothing.
    result = rewrite(SYNCS, select=["OPT202", "OPT204", "OPT703"], unsafe_fixes=unsafe)
    assert {d.code for d in result.diagnostics if d.status.value == "fixed"} == fixed
    assert ("torch.cuda.synchronize()" in result.source) is not unsafe
    if unsafe:
        assert "print(epoch, float(running), int(correct))" in result.source


def test_random_factories_move_only_with_unsafe_fixes() -> None:
    source = (
        "import torch\n"
        "device = 'cuda'\n"
        "def sample(n):\n"
        "    return torch.randn(n).to(device) + torch.zeros(n).to(device)\n"
    )
    safe = rewrite(source, select=["OPT203"]).source
    assert "torch.randn(n).to(device) + torch.zeros(n, device=device)" in safe
    unsafe = rewrite(source, select=["OPT203"], unsafe_fixes=True).source
    assert "torch.randn(n, device=device) + torch.zeros(n, device=device)" in unsafe


def test_torch_tensor_is_left_alone_it_builds_on_the_host_either_way() -> None:
    # torch.tensor(data, device=d) fills a host tensor and copies it (tensor_new.cpp's
    # internal_new_from_data); with `.float()` in between, the rewrite would copy float64.
    source = (
        "import torch\n"
        "device = 'cuda'\n"
        "def weights(rows):\n"
        "    for step in range(3):\n"
        "        bias = torch.tensor([step, 1.0]).to(device)\n"
        "        batch = torch.tensor(rows).float().to(device)\n"
        "    return bias, batch\n"
    )
    assert rewrite(source, select=["OPT203"], unsafe_fixes=True).source == source


INIT_DRAW = (
    "class Prompt(torch.nn.Module):\n"
    "    def __init__(self, n, device):\n"
    "        super().__init__()\n"
    "        self.ids = torch.randint(0, 100, (n,)).to(device)\n"
)
MAIN_DRAW = (
    "def main(device):\n    mask = torch.rand(64).to(device)\n    return mask\n\n\nmain('cuda')\n"
)


@pytest.mark.parametrize(
    "setup, per_step",
    [
        # peft's PromptEmbedding.__init__: once per model, and a seeded run's prompt changes
        (INIT_DRAW, INIT_DRAW.replace("def __init__", "def forward")),
        # a main() the module calls once; the same draw in its loop is moved
        (
            MAIN_DRAW,
            MAIN_DRAW.replace("    mask =", "    for step in range(3):\n        mask ="),
        ),
    ],
)
def test_creations_in_code_that_runs_once_are_left_alone(setup: str, per_step: str) -> None:
    source = "import torch\n\n" + setup
    assert rewrite(source, select=["OPT203"], unsafe_fixes=True).source == source
    moved = rewrite("import torch\n\n" + per_step, select=["OPT203"], unsafe_fixes=True)
    assert ", device=device)" in moved.source


LOOP = """\
import gc
import torch

for step, (x, y) in enumerate(loader):
    loss = model(x, y)
    loss.backward()
    optimizer.step()
{tail}"""


@pytest.mark.parametrize(
    "tail, expected",
    [
        # A comment that heads a group stays with the rest of the group.
        (
            "    # Housekeeping.\n    gc.collect()\n    log(step)\n",
            "    # Housekeeping.\n    log(step)\n",
        ),
        # A comment about the deleted line alone goes with it.
        (
            "    # Collect garbage.\n    gc.collect()\n\n    log(step)\n",
            "\n    log(step)\n",
        ),
        ("    # Collect garbage.\n    gc.collect()\n", ""),
    ],
)
def test_a_deleted_call_takes_only_its_own_comment(tail: str, expected: str) -> None:
    result = rewrite(LOOP.format(tail=tail), select=["OPT703"], unsafe_fixes=True)
    assert result.source == LOOP.format(tail=expected)


def test_per_step_empty_cache_runs_every_10th_step_where_the_loop_counts() -> None:
    counted = LOOP.format(tail="    torch.cuda.empty_cache()\n")
    result = rewrite(counted, select=["OPT703"], unsafe_fixes=True)
    assert result.source == LOOP.format(
        tail="    if step % 10 == 0:\n        torch.cuda.empty_cache()\n"
    )
    uncounted = counted.replace("step, (x, y) in enumerate(loader)", "x, y in loader")
    result = rewrite(uncounted, select=["OPT703"], unsafe_fixes=True)
    assert result.source == uncounted
    (finding,) = result.diagnostics
    assert finding.safety is Safety.SUGGEST and "no step counter" in finding.message


def test_a_rule_page_shows_every_benchmark_of_the_rule(tmp_path: Path) -> None:
    machine = {"device": "cpu", "cpu": "x86_64", "cpu_count": 2, "torch": "2.13.0+cpu"}
    entries = {
        "OPT703": {"before_s": 2.0, "after_s": 1.0, "what": "collect", "machine": machine},
        "OPT703:anomaly": {"before_s": 3.0, "after_s": 1.0, "what": "anomaly", "machine": machine},
        "OPT7031": {"before_s": 9.0, "after_s": 1.0, "what": "another rule", "machine": machine},
    }
    (tmp_path / "rule-gains-cpu.json").write_text(json.dumps({"results": entries}))
    found = measurements_for("OPT703", load_results(tmp_path))
    assert [m.what for m in found] == ["micro-benchmark: collect", "micro-benchmark: anomaly"]
    assert [m.speedup for m in found] == [2.0, 3.0]


@pytest.mark.parametrize(
    "call, safety",
    [
        ("torch.arange(8)", Safety.SAFE),
        ("torch.arange(0, n, dtype=torch.long)", Safety.SAFE),
        # A name may hold a float, and CUDA computes a float arange in float32.
        ("torch.arange(n)", Safety.NUMERICS),
        ("torch.arange(0, 1, 0.1)", Safety.NUMERICS),
        ("torch.full((n,), 0.1)", Safety.SAFE),
        ("torch.randperm(n)", Safety.BEHAVIOR),
    ],
)
def test_the_level_of_each_move_says_what_can_change(call: str, safety: Safety) -> None:
    source = f"import torch\ndef f(n, device):\n    return {call}.to(device)\n"
    result = rewrite(source, select=["OPT203"], unsafe_fixes=True)
    (finding,) = result.diagnostics
    assert finding.status.value == "fixed" and finding.safety is safety


def test_a_name_also_bound_to_a_host_value_is_no_device_value() -> None:
    facts = _facts(
        STEP.replace("    print(loss)\n", '    loss = loss.item()\n    print(f"{loss:.3f}")\n')
    )
    (loop,) = facts.training_loops
    found = {(s.kind, code_of(s.node)) for s in facts.host_syncs.sites(loop)}
    # The loss's .item() is the sync (OPT202's); the f-string then formats a Python float.
    assert ("item", "loss.item()") in found
    assert not [kind for kind, code in found if "{loss:.3f}" in code]
    assert ("convert", "math.isfinite(loss)") not in found


@pytest.mark.parametrize(
    "guarded, plain",
    [
        # The author draws on the CPU on purpose (torch's PowerSGD hook: every replica
        # seeds the CPU generator alike to draw the same matrix).
        ("x = torch.randn(4, device='cpu').to(device)", "x = torch.randn(4).to(device)"),
        (
            "with torch.random.fork_rng(devices=[]):\n        x = torch.randn(4).to(device)",
            "with torch.no_grad():\n        x = torch.randn(4).to(device)",
        ),
        (
            "torch.manual_seed(0)\n    x = torch.randn(4).to(device)",
            "print(0)\n    x = torch.randn(4).to(device)",
        ),
    ],
)
def test_random_draws_meant_for_the_cpu_generator_stay(guarded: str, plain: str) -> None:
    template = "import torch\ndef draw(device):\n    {}\n    return 0\n"
    kept = template.format(guarded)
    assert rewrite(kept, select=["OPT203"], unsafe_fixes=True).source == kept
    moved = template.format(plain)
    assert rewrite(moved, select=["OPT203"], unsafe_fixes=True).source != moved


@pytest.mark.parametrize(
    "source_line, move, changed",
    [
        # The `_like` tensor is made where its source is: already on the target.
        ("rewards = torch.zeros(8).to(device)", "torch.zeros_like(rewards).to(device)", False),
        ("rewards = torch.zeros(8, device=device)", "torch.zeros_like(rewards).to(device)", False),
        ("rewards = torch.zeros(8)", "torch.randn_like(rewards).to(rewards.device)", False),
        # A source on the host (cleanrl's ppo_trxl keeps its rewards there) is copied each step.
        ("rewards = torch.zeros(8)", "torch.zeros_like(rewards).to(device)", True),
        ("rewards = torch.zeros(8).to('cpu')", "torch.zeros_like(rewards).to(device)", True),
    ],
)
def test_a_like_factory_whose_source_is_on_the_target_stays(
    source_line: str, move: str, changed: bool
) -> None:
    source = (
        "import torch\n"
        "device = torch.device('cuda')\n"
        f"{source_line}\n"
        "for step in range(10):\n"
        f"    advantages = {move}\n"
    )
    result = rewrite(source, select=["OPT203"], unsafe_fixes=True)
    assert (result.source != source) is changed
    if changed:
        (finding,) = result.diagnostics
        assert "created on its source's device" in finding.message


GAN_STEP = """\
import numpy as np
import torch

cuda = torch.cuda.is_available()
Tensor = {tensor_type}
for epoch in range(10):
    for i, (imgs, _) in enumerate(loader):
        real = imgs.type(Tensor)
        z = {noise}
        loss = model(real, z)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print("[Epoch %d] [Batch %d] [loss: %f]" % (epoch, i, loss.item()))
"""
CUDA_TYPE = "torch.cuda.FloatTensor if cuda else torch.FloatTensor"


@pytest.mark.parametrize(
    "tensor_type, noise, select, gated",
    [
        # Host data copied to the GPU by a blocking copy: the host still waits every step.
        (CUDA_TYPE, "Tensor(np.random.normal(0, 1, (imgs.shape[0], 8)))", ["OPT202"], False),
        (CUDA_TYPE, "torch.randn(imgs.shape[0], 8).type(Tensor)", ["OPT202"], False),
        (CUDA_TYPE, "Tensor(np.ones((imgs.shape[0], 1)))", ["OPT202"], False),
        # OPT203 makes the ones on the device in the same run: no copy stays.
        (CUDA_TYPE, "Tensor(np.ones((imgs.shape[0], 1)))", ["OPT202", "OPT203"], True),
        (
            CUDA_TYPE,
            "torch.randn(imgs.shape[0], 8).type(Tensor, non_blocking=True)",
            ["OPT202"],
            True,
        ),
        (
            CUDA_TYPE,
            "torch.randn(imgs.shape[0], 8, device=imgs.device)",
            ["OPT202"],
            True,
        ),
    ],
)
def test_a_blocking_copy_of_host_data_keeps_the_loss_print_every_step(
    tensor_type: str, noise: str, select: list, gated: bool
) -> None:
    source = GAN_STEP.format(tensor_type=tensor_type, noise=noise)
    result = rewrite(source, select=select, unsafe_fixes=True, target_device="cuda")
    assert ("if i % 10 == 0:" in result.source) is gated
    if not gated:
        (finding,) = [d for d in result.diagnostics if d.code == "OPT202"]
        assert "waits for the device on every step as well" in finding.message

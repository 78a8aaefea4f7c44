"""analysis/autocast_escapes.py: 16-bit values that leave an autocast block, and OPT302's
casts back where they do."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.script import ScriptFacts

ROOT = Path(__file__).resolve().parent.parent

STEP = """
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

criterion = nn.CrossEntropyLoss()


def run(model, loader, history, metric):
    total, correct = 0.0, 0
    for x, y in loader:
        out = model(x)
        loss = criterion(out, y)
        loss.backward()
        {use}
    return 0
"""


def escaping(use: str):
    """The text of each escaping read after the step's forward (its first two statements)."""
    source = textwrap.dedent(STEP).replace("{use}", use)
    facts = ScriptFacts.of(cst.parse_module(source))
    loop = facts.training_loops[0].node
    reads = facts.autocast_escapes.escaping_reads(tuple(loop.body.body[:2]))
    return [facts.module.code_for_node(read) for read in reads]


@pytest.mark.parametrize(
    "use, expected",
    [
        ('preds = torch.sigmoid(out).detach().to("cpu").numpy()', ["out"]),
        ("total += out.sum()", ["out"]),
        ("total += out.sum().item()", ["out"]),
        ("values = out.tolist()", ["out"]),
        ('torch.save({"logits": out}, "out.pt")', ["out"]),
        ("history.append(out.detach())", ["out"]),
        ("metric(out, y)", ["out"]),
        ("return out", ["out"]),
        ("p = out.softmax(-1).cpu()\n        q = p.numpy()", ["out"]),
        ("p = out.cpu()\n        print(p.numpy())", ["out"]),
        # Not escapes: integers and masks, backward, a cast, printing, shapes, `.item()` of
        # the value itself, a float32 loss (cross_entropy runs in float32 under autocast).
        ("correct += (out.argmax(1) == y).sum()", []),
        ("correct += (out > 0).sum().item()", []),
        ("total += out.float().sum()", []),
        ("print(out.mean(), f'{out}')", []),
        ("n = out.shape[0] + out.size(0)", []),
        ("first = out[0, 0].item()", []),
        ("total += loss.detach()\n        history.append(loss)", []),
        ("p = out.cpu()\n        p = torch.zeros(3)\n        print(p.numpy())", []),
        # A name bound again from its own 16-bit value still carries it (makemore's sampler:
        # `logits = logits[:, -1, :] / temperature`, then top-k and multinomial).
        (
            "out = out[:, -1] / 2.0\n        v, _ = torch.topk(out, 3)",
            ["out"],
        ),
        ("out = out.argmax(1)\n        print(out.numpy())", []),
    ],
)
def test_escaping_uses(use: str, expected) -> None:
    assert escaping(use) == expected


BOUND_IN_THE_FORWARD = """
import torch
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=8)
for x, y in loader:
    out = model(x)
    {bound}
    loss = criterion(out, y)
    loss.backward()
metric({read})
"""


@pytest.mark.parametrize(
    "bound, read, escapes",
    [
        # Never 16-bit: what factories make, indices and masks, the loader's batch copied to
        # the device (the dtype stays that of the batch: int64 labels stay int64).
        ("t = torch.randint(0, 10, (8,), device=x.device)", "t", False),
        ("noise = torch.randn(8, 4)", "noise", False),
        ("preds = torch.argmax(out, dim=1)", "preds", False),
        ("y = y.to(device, non_blocking=True)", "y", False),
        ("y = y.cuda()", "y", False),
        # Maybe 16-bit: a factory told so, or copying the dtype of a 16-bit tensor, a copy
        # that takes another tensor's dtype, a helper the analysis does not read.
        ("t = torch.randn(8, 4, dtype=torch.bfloat16)", "t", True),
        ("t = torch.randn_like(out)", "t", True),
        ("y = y.to(out)", "y", True),
        ("t = helper(x)", "t", True),
        # A list of Python numbers is no tensor to cast back (`.float()` of a list raises).
        ("t = [out.mean().item()]", "t", False),
        ("t = (out.argmax(1), 0)", "t", False),
    ],
)
def test_values_bound_in_the_forward(bound: str, read: str, escapes: bool) -> None:
    source = BOUND_IN_THE_FORWARD.replace("{bound}", bound).replace("{read}", read)
    facts = ScriptFacts.of(cst.parse_module(source))
    loop = facts.training_loops[0].node
    reads = facts.autocast_escapes.escaping_reads(tuple(loop.body.body[:3]))
    assert [facts.module.code_for_node(r) for r in reads] == ([read] if escapes else [])


def test_a_name_bound_again_is_no_escape() -> None:
    source = textwrap.dedent("""
        import torch
        for x, y in loader:
            out = model(x)
            loss = (out - y).pow(2).mean()
            loss.backward()
        for x, y in val_loader:
            out = other(x)
            print(out.numpy())
        out = torch.ones(2)
        print(out.numpy(), loss.tolist())
        """)
    facts = ScriptFacts.of(cst.parse_module(source))
    loop = facts.training_loops[0].node
    reads = facts.autocast_escapes.escaping_reads(tuple(loop.body.body[:2]))
    assert [facts.module.code_for_node(r) for r in reads] == ["loss"]


def test_each_scope_is_indexed_once() -> None:
    body = "".join(f"    out{i} = model(x)\n    loss{i} = out{i}.sum()\n" for i in range(200))
    uses = "".join(f"    print(out{i}.numpy())\n" for i in range(200))
    source = "for x in loader:\n" + body + "    loss0.backward()\n" + uses
    facts = ScriptFacts.of(cst.parse_module(source))
    escapes = facts.autocast_escapes
    statements = facts.training_loops[0].node.body.body
    found = [escapes.escaping_reads((s,)) for s in statements[:400:2]]
    assert all(len(reads) == 1 for reads in found)
    assert len(escapes._indexes) == 1


def test_rewritten_script_runs_where_the_original_output_would_crash(tmp_path) -> None:
    """The rewritten evaluation casts the bfloat16 logits back before `.numpy()`."""
    script = ROOT / "fixtures/OPT302/fix_evaluation_predictions_to_numpy.expected.py"
    text = script.read_text(encoding="utf-8")
    assert "logits.float().cpu().numpy()" in text
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    uncast = tmp_path / "uncast.py"
    uncast.write_text(text.replace("logits.float().cpu()", "logits.cpu()"), encoding="utf-8")
    crashed = subprocess.run(
        [sys.executable, str(uncast)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert "BFloat16" in crashed.stderr


EVALUATION = """
import numpy as np
import torch

def sample(model, samples, outputs):
    for x in samples:
        {use}
"""


@pytest.mark.parametrize(
    "use, leaving",
    [
        ("outputs.append(model(x))", "model(x)"),
        ("outputs.append(model(x).cpu().numpy())", "model(x)"),
        ("values = model(x).mean(0).tolist()", "model(x)"),
        ('torch.save(model(x), "out.pt")', "model(x)"),
        ("outputs.extend([torch.sigmoid(model(x))])", "model(x)"),
        ("outputs[0] = model(x)", "model(x)"),
        ("out = model(x); outputs.append(out)", "out"),
        # Summed in 16 bits before `.item()`, as after the block.
        ("outputs.append(model(x).sum().item())", "model(x)"),
        # Settled or cast before it leaves: integers, a 32-bit copy, a Python number, a size.
        ("outputs.append(model(x).argmax(1))", None),
        ("outputs.append(model(x).float().cpu().numpy())", None),
        ("outputs.append(model(x).item())", None),
        ("outputs.append(len(model(x)))", None),
        # A value that did not come out of a forward: the input batch.
        ("outputs.append(x.cpu().numpy())", None),
        ("out = model(x)", None),
        ("out, features = model(x)", None),
        ("outputs.append(model(helper(x)).argmax(1))", None),
        # Grown by a list written out: kept there as it is, or a Python number
        # (cleanrl's `clipfracs += [....mean().item()]`, then `np.mean(clipfracs)`).
        ("outputs += [model(x)]", "[model(x)]"),
        ("outputs += [model(x).float().mean().item()]", None),
        ("outputs += [model(x).mean().item()]", "model(x)"),  # a 16-bit mean
    ],
)
def test_escape_within_the_wrapped_statement(use: str, leaving) -> None:
    source = textwrap.dedent(EVALUATION).replace("{use}", use)
    facts = ScriptFacts.of(cst.parse_module(source))
    loop = find_all(facts.module, cst.For)[0]
    found = facts.autocast_escapes.escape_within(tuple(loop.body.body))
    assert (facts.module.code_for_node(found) if found is not None else None) == leaving

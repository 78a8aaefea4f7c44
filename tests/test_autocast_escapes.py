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
import numpy as np
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
        # Read from what existed before the block: no value autocast computes (PyG's
        # `batch_size = batch["paper"].batch_size` is an int; `int.float()` raises).
        ('n = loader.dataset["paper"].batch_size', "n", False),
        ("n = x.shape[0]", "n", False),
        ("n = x.size(0)", "n", False),
        ("n = len(x)", "n", False),
        ("n = 8", "n", False),
        ("t, n = out, x.size(0)", "n", False),
        ("t, n = out, x.size(0)", "t", True),
        ("s = x.sum() * 2 + y.float()", "s", False),
        ("s = encoder.cache", "s", False),  # no call of the block runs `encoder`
        ("m = np.mean(history)", "m", False),  # a number (`.float()` of it raises)
        # Computed under autocast: matrix products whatever their inputs, casts to 16 bits,
        # what a forward returns or keeps on its module, and what is computed from those.
        ("h = x @ weight", "h", True),
        ("h = torch.mm(x, weight)", "h", True),
        ("h = x.matmul(weight)", "h", True),
        ("h = x.half()", "h", True),
        ("h = out.logits", "h", True),
        ("h = out[:8]", "h", True),
        ("h = max(out, x)", "h", True),
        ("h = model.last_hidden", "h", True),
        ("h = out if x.size(0) else None", "h", True),
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


HOOKED = """
import torch
activations = {}

{defined}

{registered}
for x, y in loader:
    out = model(x)
    features = activations["fc"]
    batch_size = loader.batch_size
    loss = criterion(out, y)
    loss.backward()
metric(features, batch_size)
"""


@pytest.mark.parametrize(
    "defined, registered, escaping",
    [
        # A forward hook keeps the block's activations in a dict of the script: read from
        # it, they are 16-bit values of the block, though the dict existed before it.
        (
            "def keep(module, inputs, output):\n    activations['fc'] = output",
            "model.fc.register_forward_hook(keep)",
            ["features"],
        ),
        (
            "def get_activation(name):\n"
            "    def hook(module, inputs, output):\n"
            "        activations[name] = output.detach()\n"
            "    return hook",
            "model.fc.register_forward_hook(get_activation('fc'))",
            ["features"],
        ),
        (
            "",
            "model.fc.register_forward_hook(lambda m, i, o: activations.update(fc=o))",
            ["features"],
        ),
        # A function that stores into the dict but runs before the loop, not in it.
        (
            "def fill(table):\n    activations['fc'] = table",
            "fill(torch.zeros(3))",
            [],
        ),
    ],
)
def test_what_a_hook_stores_during_the_forward_is_cast_back(
    defined: str, registered: str, escaping
) -> None:
    source = HOOKED.replace("{defined}", defined).replace("{registered}", registered)
    facts = ScriptFacts.of(cst.parse_module(source))
    loop = facts.training_loops[0].node
    reads = facts.autocast_escapes.escaping_reads(tuple(loop.body.body[:4]))
    assert [facts.module.code_for_node(read) for read in reads] == escaping


def test_a_value_computed_from_another_wrapped_block_is_cast_back() -> None:
    """A GAN's discriminator step reads the generator step's 16-bit `fake`: what it
    computes from it is 16-bit too, though `fake` is bound in the other block."""
    source = textwrap.dedent("""
        import torch
        for z, real in loader:
            fake = G(z)
            g_loss = D(fake).mean()
            g_loss.backward()
            detached = fake.detach()
            d_loss = D(detached).mean() - D(real).mean()
            d_loss.backward()
        metric(detached)
        """)
    facts = ScriptFacts.of(cst.parse_module(source))
    body = facts.training_loops[0].node.body.body
    generator, discriminator = tuple(body[:2]), tuple(body[3:5])
    escapes = facts.autocast_escapes
    assert escapes.escaping_reads(discriminator) == []
    reads = escapes.escaping_reads(discriminator, [generator, discriminator])
    assert [facts.module.code_for_node(read) for read in reads] == ["detached"]


def test_a_name_bound_again_in_a_with_body_is_no_escape() -> None:
    """PyG's relbench_gretriever.py binds `homo_x` again under `torch.no_grad()` before its
    inference: that read sees float32 features, not the training step's."""
    source = textwrap.dedent("""
        import torch
        for q, a in pairs:
            homo_x = projector(data)
            loss = model(x=homo_x, label=a)
            loss.backward()
        with torch.no_grad():
            homo_x = projector(data)
        for q in questions:
            with torch.no_grad():
                model.inference(x=homo_x)
        model.inference(x=homo_x)
        """)
    facts = ScriptFacts.of(cst.parse_module(source))
    loop = facts.training_loops[0].node
    assert facts.autocast_escapes.escaping_reads(tuple(loop.body.body[:2])) == []
    conditional = source.replace("with torch.no_grad():\n    homo_x", "if q:\n    homo_x")
    assert conditional != source
    facts = ScriptFacts.of(cst.parse_module(conditional))
    loop = facts.training_loops[0].node
    reads = facts.autocast_escapes.escaping_reads(tuple(loop.body.body[:2]))
    assert [facts.module.code_for_node(read) for read in reads] == ["homo_x", "homo_x"]


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


def test_int_read_in_the_step_keeps_its_text_and_the_script_runs(tmp_path) -> None:
    """PyG's hierarchical_sage.py: `batch_size` (an int of the batch) bound in the wrapped
    step gets no `.float()`, which would raise on the first step; the logits kept for a
    metric are still cast back, without which `.numpy()` raises on bfloat16."""
    script = ROOT / "fixtures/OPT302/fix_batch_size_read_in_the_step_is_not_cast_back.expected.py"
    text = script.read_text(encoding="utf-8")
    assert "total_examples += batch_size\n" in text and "out.float()[:batch_size]" in text
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for old, new, error in (
        ("total_examples += batch_size", "total_examples += batch_size.float()", "'int'"),
        ("out.float()[:batch_size]", "out[:batch_size]", "BFloat16"),
    ):
        variant = tmp_path / "variant.py"
        variant.write_text(text.replace(old, new), encoding="utf-8")
        crashed = subprocess.run(
            [sys.executable, str(variant)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert crashed.returncode != 0 and error in crashed.stderr, crashed.stderr[-2000:]


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

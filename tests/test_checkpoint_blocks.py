"""OPT602: one report per checkpoint, and Hugging Face's `save_pretrained`.

A checkpoint block that saves the model, the optimizer and the arguments with three
`torch.save` calls was reported three times (third reading round); it is one checkpoint,
reported once at its first save. `model.save_pretrained(dir)` writes on the training
thread as `torch.save` does and is reported too; a tokenizer's `save_pretrained` (a few kB)
is not.
"""

from __future__ import annotations

import textwrap

import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status

LOOP = textwrap.dedent("""\
    import torch

    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 1000 == 0:
    {saves}
    """)


def reports(saves: str):
    source = LOOP.format(saves=textwrap.indent(textwrap.dedent(saves), " " * 8))
    result = rewrite(source, select=["OPT602"])
    assert result.source == source
    return [d for d in result.diagnostics if d.code == "OPT602" and d.status is Status.REPORTED]


def test_the_saves_of_one_checkpoint_are_reported_once() -> None:
    found = reports("""\
        torch.save(model.state_dict(), "model.pt")
        torch.save(optimizer.state_dict(), "optimizer.pt")
        torch.save(args, "args.pt")
        """)
    assert len(found) == 1 and "2 more save(s)" in found[0].message
    assert found[0].line == 9


def test_saves_of_two_blocks_are_two_checkpoints() -> None:
    source = LOOP.format(saves='        torch.save(model.state_dict(), "model.pt")') + (
        "    if step % 5000 == 0:\n" '        torch.save(model.state_dict(), f"model-{step}.pt")\n'
    )
    result = rewrite(source, select=["OPT602"])
    found = [d for d in result.diagnostics if d.status is Status.REPORTED]
    assert [d.line for d in found] == [9, 11]
    assert not any("more save" in d.message for d in found)


@pytest.mark.parametrize(
    "saves, expected",
    [
        ("model.save_pretrained(out)\n", 1),
        ("accelerator.unwrap_model(model).save_pretrained(out)\n", 1),
        ("tokenizer.save_pretrained(out)\n", 0),
        ("model.save_pretrained(out)\ntokenizer.save_pretrained(out)\n", 1),
    ],
)
def test_save_pretrained_of_a_model_is_a_checkpoint(saves: str, expected: int) -> None:
    found = reports(saves)
    assert len(found) == expected
    assert all("save_pretrained" in d.message for d in found)

"""Issue 15, item 4 and 5: misses that each owning rule now handles, or declines with a
reason (`--why-not`) instead of leaving silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status


def run(source: str, select: str, **options):
    result = rewrite(source, path="train.py", select=[select], unsafe_fixes=True, **options)
    declined = {
        (d.code, d.line): d.message for d in result.diagnostics if d.status is Status.DECLINED
    }
    return result, declined


# 1. DataLoader options built in a dict -------------------------------------------------------
DICT_LOADER = """import torchvision
from torch.utils.data import DataLoader

B = 64
loader_args = dict(batch_size=B, num_workers=4, pin_memory=True)


def main():
    train_set = torchvision.datasets.FakeData(transform=torchvision.transforms.ToTensor())
    loader = DataLoader(train_set, shuffle=True, **loader_args)
    for epoch in range(3):
        for images, labels in loader:
            print(images.shape)


if __name__ == "__main__":
    main()
"""


def test_persistent_workers_go_into_the_options_dict() -> None:
    result, _ = run(DICT_LOADER, "OPT103")
    assert (
        "loader_args = dict(batch_size=B, num_workers=4, pin_memory=True, "
        "persistent_workers=True)" in result.source
    )
    assert "**loader_args)" in result.source  # the call itself is unchanged


def test_options_in_a_dict_count_as_chosen() -> None:
    # `num_workers=4` and `pin_memory=True` in the dict: neither OPT102 nor OPT101 adds them.
    for code in ("OPT101", "OPT102"):
        result, _ = run(
            DICT_LOADER.replace("print(images.shape)", "images.cuda().sum().backward()"), code
        )
        assert not result.changed, code
        assert not [d for d in result.diagnostics if d.code == code], code


@pytest.mark.parametrize(
    "change, why",
    [
        (
            'loader_args["persistent_workers"] = False\n',
            "`loader_args` is changed after it is built",
        ),
        # a merge is followed when it merges a dict literal; `extra` is not one
        ("loader_args.update(extra)\n", "`loader_args.update(extra)` merges a dict the analysis"),
        ("del loader_args['batch_size']\n", "`loader_args` is changed after it is built"),
    ],
)
def test_a_changed_dict_is_not_trusted_and_the_reason_is_given(change: str, why: str) -> None:
    source = DICT_LOADER.replace("\n\ndef main", change + "\n\ndef main")
    result, declined = run(source, "OPT103", why_not=True)
    assert not result.changed
    reason = declined[("OPT103", 11)]
    assert why in reason


def test_a_dict_passed_elsewhere_is_not_trusted() -> None:
    source = DICT_LOADER.replace("\n\ndef main", "log(loader_args)\n\ndef main")
    result, declined = run(source, "OPT103", why_not=True)
    assert not result.changed
    assert "also used otherwise than as `**loader_args`" in declined[("OPT103", 10)]


def test_reads_of_the_dict_do_not_stop_the_fix() -> None:
    source = DICT_LOADER.replace(
        "\n\ndef main", '\nsteps = 1000 // loader_args["batch_size"]\n\ndef main'
    )
    result, _ = run(source, "OPT103")
    assert "persistent_workers=True)" in result.source


def test_a_dict_shared_with_a_loader_that_gets_no_fix_is_left_and_the_call_gets_it() -> None:
    source = DICT_LOADER.replace(
        "    for epoch in range(3):",
        "    once = DataLoader(train_set, **loader_args)\n"
        "    for images, labels in once:\n"
        "        print(images.shape)\n"
        "    for epoch in range(3):",
    )
    result, _ = run(source, "OPT103")
    assert "loader_args = dict(batch_size=B, num_workers=4, pin_memory=True)\n" in result.source
    assert "**loader_args, persistent_workers=True)" in result.source
    assert "once = DataLoader(train_set, **loader_args)\n" in result.source


# 2. Device moves in comprehensions and tuples (OPT201) -------------------------------------
MOVES = """import torch
from torch.utils.data import DataLoader

loader = DataLoader(train_set, batch_size=64, pin_memory=True)
device = "cuda" if torch.cuda.is_available() else "cpu"
for batch in loader:
    MOVE
    loss = model(x, y)
    loss.backward()
"""


@pytest.mark.parametrize(
    "move, moved",
    [
        (
            "x, y = [t.to(device) for t in batch]",
            "x, y = [t.to(device, non_blocking=True) for t in batch]",
        ),
        (
            "x, y = tuple(t.to(device) for t in batch)",
            "x, y = tuple(t.to(device, non_blocking=True) for t in batch)",
        ),
        (
            "x, y = (batch[0].to(device), batch[1].cuda())",
            "x, y = (batch[0].to(device, non_blocking=True), batch[1].cuda(non_blocking=True))",
        ),
    ],
)
def test_moves_in_comprehensions_and_tuples_become_non_blocking(move: str, moved: str) -> None:
    result, _ = run(MOVES.replace("MOVE", move), "OPT201")
    assert moved in result.source


def test_a_comprehension_variable_is_its_own_binding() -> None:
    # `t` rebound to a device tensor in another statement is another variable.
    source = MOVES.replace(
        "MOVE", "x, y = [t.to(device) for t in batch]\n    z = [t.cpu() for t in model(x)]"
    )
    result, _ = run(source, "OPT201")
    assert "[t.to(device, non_blocking=True) for t in batch]" in result.source


def test_a_comprehension_over_a_written_batch_is_declined_with_the_reason() -> None:
    source = MOVES.replace("MOVE", "x, y = [t.to(device) for t in batch]\n    batch[0].zero_()")
    result, declined = run(source, "OPT201", why_not=True)
    assert not result.changed
    assert "is written in the loop" in declined[("OPT201", 7)]


def test_copies_from_an_unpinned_loader_say_why() -> None:
    source = MOVES.replace(", pin_memory=True", "").replace(
        "MOVE", "x, y = batch[0].to(device), batch[1].to(device)"
    )
    result, declined = run(source, "OPT201", why_not=True)
    assert not result.changed
    assert "not built with `pin_memory=True`" in declined[("OPT201", 7)]


# 3. `.clone()` inside chains (OPT702) --------------------------------------------------------
CLONE_STEP = """import torch
import torch.nn.functional as F


def step(model, optimizer, batch):
    x = torch.randn(8, 4)
    STATEMENT
    loss = F.mse_loss(model(batch), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize(
    "statement, fixed",
    [
        ("y = x.clone().mul(2)", "y = x.mul(2)"),
        ("y = x.clone().view(-1).sum()", "y = x.view(-1).sum()"),
        (
            "y = batch.clone().float().mean()",
            "y = batch.float().mean()",
        ),  # fresh, whatever batch is
        ("y = x.clone().float().pow(2)", "y = x.float().pow(2)"),
    ],
)
def test_a_clone_read_once_by_an_allocating_link_is_removed(statement: str, fixed: str) -> None:
    result, _ = run(CLONE_STEP.replace("STATEMENT", statement), "OPT702")
    assert f"    {fixed}\n" in result.source


@pytest.mark.parametrize(
    "statement",
    [
        "y = x.clone().add_(1)",  # the in-place link writes the copy
        "y = x.clone().float()\n    y.mul_(2)",  # the conversion may be the copy itself
        "y = x.clone().view(-1)\n    x.zero_()",  # the source is written
        "y = batch.clone().float()",  # may be the copy of a tensor from unknown code
        "y = x.clone(memory_format=torch.channels_last).mul(2)",
    ],
)
def test_a_clone_whose_copy_may_matter_stays(statement: str) -> None:
    result, _ = run(CLONE_STEP.replace("STATEMENT", statement), "OPT702")
    assert not result.changed


def test_a_conversion_of_a_copy_nobody_writes_loses_the_copy() -> None:
    source = CLONE_STEP.replace("STATEMENT", "y = x.clone().float()")
    result, _ = run(source, "OPT702")
    assert "    y = x.float()\n" in result.source


# 4. Evaluation without `no_grad` (OPT403) ----------------------------------------------------
EVALUATION = """import torch
import torch.nn as nn

model = nn.Linear(20, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    model.train()
    for x, y in train_loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    correct = 0
    for x, y in val_loader:
        BODY
    print(correct)
"""
COUNT = "correct += (model(x).argmax(1) == y).sum().item()"


def test_an_evaluation_loop_without_no_grad_runs_under_inference_mode() -> None:
    result, _ = run(EVALUATION.replace("BODY", COUNT), "OPT403")
    assert (
        "    with torch.inference_mode():\n"
        "        for x, y in val_loader:\n"
        f"            {COUNT}\n" in result.source
    )
    assert [d.safety.label for d in result.diagnostics] == [
        "behavior"
    ]  # the model's forward is unseen


def test_the_wrap_is_a_behaviour_change_left_out_without_unsafe_fixes() -> None:
    result = rewrite(EVALUATION.replace("BODY", COUNT), path="train.py", select=["OPT403"])
    assert not result.changed


@pytest.mark.parametrize(
    "source, reason",
    [
        (
            EVALUATION.replace("BODY", COUNT).replace(
                "    print(correct)", "    print(model(x).sum().item())"
            ),
            "`x` is used after the block",
        ),
        (EVALUATION.replace("BODY", "outputs.append(model(x))"), "may change state"),
    ],
)
def test_an_evaluation_loop_that_cannot_be_wrapped_says_why(source: str, reason: str) -> None:
    result, declined = run(source, "OPT403", why_not=True)
    assert not result.changed
    assert reason in declined[("OPT403", 15)]
    assert "cannot run under `torch.inference_mode()`" in declined[("OPT403", 15)]


@pytest.mark.parametrize(
    "change, wraps",
    [
        (("    model.eval()\n", ""), 0),  # no `.eval()`: not known to be evaluation
        (("    correct = 0\n", "    correct = 0\n    model.train()\n"), 0),  # training again
        # Under `no_grad` already: only that block is converted, no second one added.
        (
            (
                "    for x, y in val_loader:\n",
                "    with torch.no_grad():\n      for x, y in val_loader:\n",
            ),
            1,
        ),
    ],
)
def test_only_loops_after_eval_without_no_grad_are_wrapped(change, wraps: int) -> None:
    source = EVALUATION.replace("BODY", COUNT).replace(*change)
    result, _ = run(source, "OPT403")
    assert result.source.count("inference_mode()") == wraps
    assert result.source.count("with ") == source.count("with ")


def test_a_no_grad_block_left_alone_says_why() -> None:
    source = EVALUATION.replace("BODY", COUNT).replace(
        "    for x, y in val_loader:\n        " + COUNT,
        "    with torch.no_grad():\n        kept = model(x)\n    outputs.append(kept)",
    )
    result, declined = run(source, "OPT403", why_not=True)
    assert not result.changed
    assert "`kept` is used after the block" in declined[("OPT403", 15)]


# 4. Attention that returns its probabilities (OPT406) -----------------------------------------
ATTENTION = """import math
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def forward(self, q, k, v):
        att = F.softmax(q @ k.transpose(-2, -1) * (1.0 / math.sqrt(k.size(-1))), dim=-1)
        out = att @ v
        return RESULT
"""


def test_attention_returning_its_probabilities_says_why() -> None:
    result, declined = run(ATTENTION.replace("RESULT", "out, att"), "OPT406", why_not=True)
    assert not result.changed
    reason = declined[("OPT406", 9)]
    assert "`att`" in reason and "SDPA does not compute it" in reason


def test_attention_whose_probabilities_stay_inside_is_still_replaced() -> None:
    result, declined = run(ATTENTION.replace("RESULT", "out"), "OPT406", why_not=True)
    assert "F.scaled_dot_product_attention(q, k, v" in result.source
    assert not declined


# 4. channels_last left alone (OPT407) ----------------------------------------------------------
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.mark.parametrize(
    "fixture, line, reason",
    [
        ("keep_already_channels_last.py", 7, "already names a memory format"),
        ("keep_conv3d_in_model.py", 22, "also has 3-D convolutions"),
    ],
)
def test_a_convnet_left_in_nchw_says_why(fixture: str, line: int, reason: str) -> None:
    source = (FIXTURES / "OPT407" / fixture).read_text()
    result, declined = run(source, "OPT407", why_not=True)
    assert not result.changed
    assert reason in declined[("OPT407", line)]


def test_attention_whose_probabilities_a_flag_asks_for_runs_sdpa_otherwise() -> None:
    source = ATTENTION.replace(
        "def forward(self, q, k, v)", "def forward(self, q, k, v, output_attentions=False)"
    ).replace(
        "        return RESULT\n",
        "        if output_attentions:\n            return out, att\n        return out, None\n",
    )
    result, declined = run(source, "OPT406", why_not=True)
    assert "        if output_attentions:\n            att = F.softmax(" in result.source
    assert "        else:\n            out = F.scaled_dot_product_attention(" in result.source
    assert not declined  # the kept branch is the rewrite's own, not a miss
    namespace: dict = {}
    exec(compile(result.source, "attention.py", "exec"), namespace)  # it still runs
    import torch

    layer = namespace["SelfAttention"]()
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    fused, none = layer(q, k, v)
    written, att = layer(q, k, v, output_attentions=True)
    assert none is None and att.shape == (2, 3, 5, 5)
    assert torch.allclose(fused, written, atol=1e-6)


@pytest.mark.parametrize(
    "guard",
    [
        "        output_attentions = True\n        if output_attentions:\n",  # rebound
        "        if output_attentions and att.isfinite().all():\n",  # not the bare flag
        "        if verbose:\n",  # not a parameter
    ],
)
def test_a_flag_that_may_change_or_is_not_a_parameter_keeps_the_attention(guard: str) -> None:
    source = ATTENTION.replace(
        "def forward(self, q, k, v)", "def forward(self, q, k, v, output_attentions=False)"
    ).replace(
        "        return RESULT\n", guard + "            return out, att\n        return out, None\n"
    )
    result, _ = run(source, "OPT406")
    assert not result.changed

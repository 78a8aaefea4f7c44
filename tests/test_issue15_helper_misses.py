"""Issue 15, sites in helpers, decorators and micro-step loops: each owning rule now fixes
them where sound, or says why not (`--why-not`) instead of leaving them silently."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.analysis import ScriptFacts
from optimizer_codemod.analysis.debugging import is_device_check
from optimizer_codemod.analysis.precision import variable_input_shapes

from test_issue15_misses import run  # rewrite with --unsafe-fixes: (result, declines)

# 1. `@torch.no_grad()` as a decorator --------------------------------------------------------
LIBRARY_GENERATE = """import torch
import torch.nn as nn


class GPT(nn.Module):
    def forward(self, idx):
        return self.head(idx)

    @torch.no_grad()
    def generate(self, idx, steps):
        for _ in range(steps):
            idx = torch.cat((idx, self(idx)[:, -1:].argmax(-1)), dim=1)
        return idx
"""


def test_a_decorated_function_returning_a_tensor_says_why_even_in_a_library_module() -> None:
    # No backward in this file: the decorated method is still examined.
    result, declined = run(LIBRARY_GENERATE, "OPT403", why_not=True)
    assert not result.changed
    reason = declined[("OPT403", 9)]
    assert "`generate()` cannot run under `torch.inference_mode()`" in reason
    assert "it returns `idx`, maybe a tensor, and it is a method of `GPT`" in reason
    assert "in a module that is no script: callers elsewhere are not followed" in reason


def test_a_library_module_keeps_its_no_grad_blocks_unexamined() -> None:
    # Blocks (not decorators) in a file that does not train are still left out, silently.
    source = LIBRARY_GENERATE + "\n\ndef copy_weights(a, b):\n    with torch.no_grad():\n"
    source += "        a.weight.copy_(b.weight)\n"
    _, declined = run(source, "OPT403", why_not=True)
    assert sorted(declined) == [("OPT403", 9)]


TRAINED_EVALUATE = """import torch
from torch import no_grad

model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


@no_grad()
def accuracy(batches):
    model.eval()
    hits = 0
    for x, y in batches:
        hits += (model(x).argmax(1) == y).sum().item()
    model.train()
    return hits / len(batches)


for x, y in [(torch.randn(3, 4), torch.tensor([0, 1, 0]))] * 4:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    print(accuracy([(x, y)]))
"""


def test_a_decorated_evaluation_imported_by_name_gets_inference_mode_and_its_import() -> None:
    result, _ = run(TRAINED_EVALUATE, "OPT403")
    assert "@inference_mode()\ndef accuracy" in result.source
    assert "from torch import inference_mode, no_grad" in result.source


def test_a_decorator_with_arguments_or_another_name_is_not_taken_for_no_grad() -> None:
    for decorator in ("@no_grad(False)", "@my.no_grad()"):
        source = TRAINED_EVALUATE.replace("@no_grad()", decorator)
        result, declined = run(source, "OPT403", why_not=True)
        assert decorator + "\ndef accuracy" in result.source, decorator
        assert ("OPT403", 8) not in declined, decorator


# 2. Syncs in a helper the step calls ---------------------------------------------------------
DIFFUSION_LOOP = """import torch

device = "cuda"
model = torch.nn.Linear(4, 4).to(device)
opt = torch.optim.Adam(model.parameters())


class Trainer:
    def forward_backward(self, batch):
        for micro in batch.split(2):
            losses = {"mse": (model(micro) - micro).pow(2).mean(1)}
            log_loss_dict(losses)
            losses["mse"].mean().backward()
        self.log_grad_norm()

    def log_grad_norm(self):
        sqsum = 0.0
        for p in model.parameters():
            sqsum += (p.grad ** 2).sum().item()
        print(sqsum)


def log_loss_dict(losses):
    for key, values in losses.items():
        print(key, values.mean().item())
"""


def test_a_helper_of_the_training_loop_is_read_and_one_outside_it_is_not() -> None:
    # log_loss_dict runs on every micro-step; log_grad_norm is called after the loop, from
    # a function that is no training step (its backward is inside its own loop).
    result = rewrite(DIFFUSION_LOOP, path="train.py", select=["OPT204"])
    reported = {(d.line, d.message.split(" in ")[0]) for d in result.diagnostics}
    assert reported == {(25, "`values.mean().item()`")}


def test_helpers_are_followed_two_levels_from_the_step_and_no_further() -> None:
    step = """import torch

device = "cuda"
model = torch.nn.Linear(4, 4).to(device)
opt = torch.optim.Adam(model.parameters())


def step(x):
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    log(x)


def log(x):
    report(x)


def report(x):
    print(x.norm().item())
    deeper(x)


def deeper(x):
    print(x.sum().item())


for x in torch.randn(10, 2, 4):
    step(x.to(device))
"""
    result = rewrite(step, path="train.py", select=["OPT204"])
    assert [d.line for d in result.diagnostics] == [20]


# 3. Checkpoints saved around a micro-step loop -----------------------------------------------
ACCUMULATION = """import torch

model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    for micro in range(4):
        model(torch.randn(8, 4)).sum().backward()
    opt.step()
    if step % 10 == 0:
        torch.save(model.state_dict(), "ckpt.pt")
"""


def test_the_loop_around_a_micro_step_loop_is_the_step_loop() -> None:
    result = rewrite(ACCUMULATION, path="train.py", select=["OPT602"])
    assert [d.line for d in result.diagnostics] == [10]


def test_an_outer_loop_that_does_not_step_stays_an_epoch_loop() -> None:
    # The optimizer steps in the inner loop: the save in the outer loop runs once an epoch.
    source = ACCUMULATION.replace(
        "        model(torch.randn(8, 4)).sum().backward()\n    opt.step()\n",
        "        model(torch.randn(8, 4)).sum().backward()\n        opt.step()\n",
    )
    result = rewrite(source, path="train.py", select=["OPT602"])
    assert not result.diagnostics


# 4. Singles -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "test, checks",
    [
        ('args.device.startswith("cuda")', True),
        ("torch.cuda.is_available()", True),
        ('device == "cuda"', True),
        ('device.type != "cpu"', True),
        ('"cuda" in device', True),
        ("x.is_cuda", True),
        ('not torch.cuda.is_available() and device == "mps"', True),
        ('args.device.startswith("cuda") and args.sync', False),
        ("args.sync", False),
        ('device.startswith("cuda", 1)', False),
        ('name == "resnet"', False),
    ],
)
def test_a_device_check_is_told_from_a_switch(test: str, checks: bool) -> None:
    module = cst.parse_module(f"import torch\nif {test}:\n    pass\n")
    facts = ScriptFacts.of(module)
    branch = module.body[1]
    assert is_device_check(facts, branch.test) is checks


ACCELERATED = """import torch
from accelerate import Accelerator

accelerator = Accelerator()
model = torch.nn.Linear(16, 1)
optim = torch.optim.Adam(model.parameters(), lr=1e-4)
for i in range(1000):
    total_loss = 0.0
    for _ in range(4):
        loss = model(torch.randn(8, 16, device=accelerator.device)).pow(2).mean()
        total_loss += loss.item()
        accelerator.backward(loss / 4)
    optim.step()
    if i % 100 == 0:
        print(total_loss)
"""


def test_a_loss_run_through_accelerator_backward_is_the_loss() -> None:
    result = rewrite(ACCELERATED, path="train.py", select=["OPT202"], unsafe_fixes=True)
    assert "        total_loss += loss.detach().float()\n" in result.source
    assert "        print(float(total_loss))\n" in result.source


def test_a_micro_batch_total_read_on_every_optimizer_step_is_summed_on_the_device() -> None:
    # One read per step replaces one per micro-batch.
    source = ACCELERATED.replace("    if i % 100 == 0:\n        print", "    print")
    result = rewrite(source, path="train.py", select=["OPT202"], unsafe_fixes=True)
    assert "        total_loss += loss.detach().float()\n" in result.source
    assert "    print(float(total_loss))\n" in result.source


def test_a_total_read_on_every_micro_batch_is_left_with_the_reason() -> None:
    source = ACCELERATED.replace(
        "    if i % 100 == 0:\n        print(total_loss)",
        "    pass",
    ).replace(
        "        total_loss += loss.item()\n",
        "        total_loss += loss.item()\n        print(total_loss)\n",
    )
    assert source.count("print(total_loss)") == 1
    result = rewrite(source, path="train.py", select=["OPT202"], unsafe_fixes=True)
    assert not result.changed
    (finding,) = result.diagnostics
    assert "`total_loss` is read on every step" in finding.message


def test_backward_of_an_object_that_is_no_accelerator_is_not_a_loss() -> None:
    source = ACCELERATED.replace("accelerator = Accelerator()", "accelerator = make_runner()")
    result = rewrite(source, path="train.py", select=["OPT202"], unsafe_fixes=True)
    assert not result.changed and not result.diagnostics


def test_accumulation_through_a_loss_scaler_helper_says_why_it_is_left() -> None:
    path = (
        Path(__file__).parent.parent
        / "fixtures/OPT601/keep_accumulation_in_a_loss_scaler_helper.py"
    )
    _, declined = run(path.read_text(), "OPT601", why_not=True)
    reason = declined[("OPT601", 22)]
    assert "through `loss_scaler(..., update_grad=...)`" in reason
    assert "run the micro-batches that do not update under `model.no_sync()`" in reason
    # A literal flag is no accumulation, and a file choosing `no_sync` itself is left alone.
    for change in ("update_grad=True", "update_grad=model.no_sync() is None"):
        source = path.read_text().replace(
            "update_grad=(data_iter_step + 1) % accum_iter == 0", change
        )
        assert ("OPT601", 22) not in run(source, "OPT601", why_not=True)[1], change


@pytest.mark.parametrize(
    "call, varies",
    [
        ('tokenizer.pad(examples, padding="longest")', True),
        ("tokenizer.pad(examples, padding=True)", True),
        ("self.tokenizer(texts, padding=True)", True),
        ("DataCollatorWithPadding(tokenizer)", True),
        ('DataCollatorWithPadding(tokenizer, padding="max_length")', False),
        ("tokenizer(texts, padding=False)", False),
        ("nn.Conv2d(3, 8, 3, padding=True)", False),
    ],
)
def test_padding_to_the_longest_sequence_is_told_from_a_fixed_length(call, varies) -> None:
    source = (
        "import torch.nn as nn\nfrom transformers import DataCollatorWithPadding\n" f"x = {call}\n"
    )
    facts = ScriptFacts.of(cst.parse_module(source))
    assert (variable_input_shapes(facts) is not None) is varies


PADDING_FUNCTION = """import torch
import numpy as np


def collate(batch, MAX_LEN=64):
    {body}
    return padded
"""


@pytest.mark.parametrize(
    "body, varies",
    [
        # Padded by hand to the longest item of the batch.
        (
            "longest = max(len(s) for s in batch)\n"
            "    padded = torch.zeros(len(batch), longest)\n"
            "    for i, s in enumerate(batch):\n"
            "        padded[i, : len(s)] = torch.as_tensor(s)",
            True,
        ),
        (
            "lengths = torch.tensor([s.size(0) for s in batch])\n"
            "    padded = batch[0].new_full((len(batch), int(lengths.max())), -1)\n"
            "    for i, s in enumerate(batch):\n"
            "        padded[i][0 : s.size(0)] = s",
            True,
        ),
        (
            "size = np.amax([s.shape for s in batch], axis=0)\n"
            "    padded = np.zeros((len(batch), *size))\n"
            "    for s, p in zip(batch, padded):\n"
            "        p[: s.shape[0], : s.shape[1]] = s",
            True,
        ),
        # A fixed length: one shape throughout, whatever the maximum computed beside it.
        (
            "padded = torch.zeros(len(batch), MAX_LEN)\n"
            "    longest = max(len(s) for s in batch)\n"
            "    for i, s in enumerate(batch):\n"
            "        padded[i, : len(s)] = s",
            False,
        ),
        # Sized by the maximum, but nothing is copied into an item's own extent.
        (
            "padded = torch.zeros(len(batch), max(len(s) for s in batch))\n"
            "    n = 3\n"
            "    for i, s in enumerate(batch):\n"
            "        padded[i, :n] = s[:n]",
            False,
        ),
        (  # the bound is read from elsewhere, not from the item: not tied to it
            "lengths = [len(s) for s in batch]\n"
            "    padded = torch.zeros(len(batch), max(lengths))\n"
            "    for i, s in enumerate(batch):\n"
            "        padded[i, : lengths[i]] = s",
            False,
        ),
        (  # another item's extent
            "padded = torch.zeros(len(batch), max(len(s) for s in batch))\n"
            "    for i, (s, t) in enumerate(batch):\n"
            "        padded[i, : len(t)] = s",
            False,
        ),
        (  # an offset into a buffer (a ring), not its corner
            "padded = torch.zeros(max(len(s) for s in batch) * 4)\n"
            "    for i, s in enumerate(batch):\n"
            "        padded[i : i + len(s)] = s",
            False,
        ),
    ],
)
def test_padding_by_hand_to_the_largest_item_is_told_from_fixed_sizes_and_slicing(
    body, varies
) -> None:
    facts = ScriptFacts.of(cst.parse_module(PADDING_FUNCTION.format(body=body)))
    found = variable_input_shapes(facts)
    assert (found is not None) is varies
    if varies:
        assert found.method in ("zeros", "new_full")


CALLBACK = """import torch
from mingpt.trainer import Trainer

trainer = Trainer(config, model, dataset)


def batch_end_callback(trainer):
    if trainer.iter_num % 500 == 0:
        with torch.no_grad():
            print(model.generate(x, 50)[0].tolist())


trainer.set_callback("on_batch_end", batch_end_callback)
trainer.run()
"""


def test_a_no_grad_block_in_a_callback_for_an_imported_trainer_says_why() -> None:
    _, declined = run(CALLBACK, "OPT403", why_not=True)
    assert "`batch_end_callback()`, which this file hands to a call" in declined[("OPT403", 9)]
    # A function that is not handed over is library code: not examined.
    source = CALLBACK.replace('trainer.set_callback("on_batch_end", batch_end_callback)\n', "")
    assert not run(source, "OPT403", why_not=True)[1]


def test_a_function_that_steps_the_optimizer_each_step_runs_its_helpers_every_step() -> None:
    # improved-diffusion's TrainLoop: run_step() in the loop calls optimize(), which steps
    # the optimizer outside any loop and logs the gradient norm parameter by parameter.
    source = DIFFUSION_LOOP.replace(
        "        self.log_grad_norm()\n",
        "\n    def run_step(self, batch):\n        self.forward_backward(batch)\n"
        "        self.optimize()\n\n    def optimize(self):\n        self.log_grad_norm()\n"
        "        opt.step()\n\n    def run_loop(self, data):\n        for batch in data:\n"
        "            self.run_step(batch)\n",
    )
    result = rewrite(source, path="train.py", select=["OPT204"])
    messages = {d.line: d.message for d in result.diagnostics}
    assert "in `log_grad_norm()`, which runs on every training step" in messages[30]
    # A scheduler's step is no optimizer step: the same helper called from it is not read.
    source = source.replace("        opt.step()\n", "        scheduler.step()\n")
    result = rewrite(source, path="train.py", select=["OPT204"])
    assert 30 not in {d.line for d in result.diagnostics}

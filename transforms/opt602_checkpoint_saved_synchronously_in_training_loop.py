"""OPT602: a synchronous `torch.save` checkpoint inside the loop that runs the training step."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt
from optimizer_codemod.analysis.checkpoints import library_saves
from optimizer_codemod.analysis.collect import CallSite
from optimizer_codemod.analysis.epochs import once_per_pass, step_loops
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.analysis.values import local_function
from optimizer_codemod.rule import Example, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

SAVE_FUNCTIONS = ("torch.save", "torch.serialization.save")

SCRIPT = """\
import torch

for step, (x, y) in enumerate(loader):
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if step % 1000 == 0:
        torch.save(model.state_dict(), f"step{step}.pt")
"""
AFTER_THE_LOOP = """\
import torch

for step, (x, y) in enumerate(loader):
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
torch.save(model.state_dict(), "final.pt")
"""


class CheckpointSavedSynchronouslyInTrainingLoop(Rule):
    """
    What it does:
        Reports a call of `torch.save` inside the loop that runs the training step (the
        innermost loop that calls `backward`; with gradient accumulation, where backward runs
        in an inner micro-step loop and the optimizer steps after it, the loop around it), at
        any depth of `if`/`with`/`try` in its body: the usual `if step % every == 0:
        torch.save(...)` checkpoint, also under `if rank == 0 and ...`. A call in that loop
        of a function of the same file that calls `torch.save` (`self.save(milestone)`) is
        reported at the call. So are the checkpoints of training libraries, which write on
        the training thread too: Accelerate's `accelerator.save_state(dir)` and Lightning
        Fabric's `fabric.save(path, state)`, on an object the file builds from
        `accelerate.Accelerator` or `lightning.Fabric` or takes as a parameter annotated with
        it (litgpt's `fit(fabric: L.Fabric, ...)`), and Hugging Face's
        `model.save_pretrained(dir)` (not a tokenizer's, processor's or config's, a few kB).
        The saves of one block (`if step % n == 0:` writing the model, the optimizer and the
        arguments) are one checkpoint, reported once at the first. It reports, never
        rewrites. Saves once per
        epoch (in an outer loop, outside the step loop, or under an `if` that asks the step
        loop's counter for one value, `batch_idx == 0`), after the loop, or in a loop without
        backward are not reported; nor are loops whose backward happens in a called function.

    Why is it slow:
        `torch.save` runs on the training thread: every checkpoint copies the state off the
        device, pickles it and writes it to disk before the next step starts. Under
        DistributedDataParallel rank 0 usually saves alone, and the other ranks wait for it at the
        next all-reduce, so the whole job stalls. An asynchronous checkpoint keeps only a
        copy of the state on the critical path and writes it while training continues.

    Example:
        ```python
        for step, (x, y) in enumerate(loader):
            ...
            optimizer.step()
            if step % 1000 == 0:
                torch.save(model.state_dict(), f"step{step}.pt")
        ```
        is reported, with two ways out: `torch.distributed.checkpoint.async_save` (the
        PyTorch recipe "Asynchronous Saving with Distributed Checkpoint (DCP)" asks for torch
        2.4 or later; it writes a directory of files, not one `.pt` file), or copy the state
        to the CPU on the training thread (`{k: v.detach().to("cpu", copy=True) for k, v in
        model.state_dict().items()}`) and `torch.save` that copy from a background thread,
        joined before the next checkpoint and before the script exits.

    Fix safety:
        `suggest`: no sound rewrite exists. An asynchronous write must snapshot the tensors
        first, or the next optimizer step changes them while they are written; the file
        appears later than the script expects (a loader or a test reading it right away
        breaks); errors surface on another thread or future; and
        `torch.distributed.checkpoint` writes a directory in its own format, which
        `torch.load` cannot open directly.

    Expected gain:
        The time of one `torch.save` on every step that checkpoints, less the snapshot an
        asynchronous save keeps on the training thread; the overlap pays where the device
        computes while the host writes (a GPU), which was not measured here. Measured on the
        shared 2-core x86_64 CPU with torch 2.13.0+cpu (2026-11-22, with other
        jobs on the machine, so noisy), for a 25.2M-parameter model (six `Linear(2048, 2048)`,
        101 MB of float32 state) trained with AdamW on batches of 32 (one step: 165 ms):
        `torch.save(model.state_dict(), path)` to /tmp blocks for a median 118 to 166 ms over
        three runs, about three quarters of a step, while the snapshot (a CPU copy of every
        tensor of the state dict) takes 5 to 9 ms. 20 steps with a checkpoint every 5 took
        2.96 s and 3.35 s with synchronous saves against 2.48 s and 2.69 s without
        checkpoints; saving the snapshot from a background thread took 3.43 s and 3.13 s:
        no reliable gain on this CPU, where training already uses both cores that the
        pickling and writing need.
    """

    code = "OPT602"
    name = "checkpoint-saved-synchronously-in-training-loop"
    message = "`torch.save` in the training loop blocks training while the checkpoint is written"
    fix_title = (
        "Save asynchronously: `torch.distributed.checkpoint.async_save`, or copy the state to "
        "the CPU and write it from a background thread joined before exit"
    )
    safety = Safety.SUGGEST
    min_torch = TorchVersion(1, 0)
    # `torch.save(`, `T.save(`, `save(` after `from torch import save`, and an alias
    # (`from torch import save as save_checkpoint`) named in its import.
    triggers = (r"\bsave\s*\(", r"\bsave\s+as\b", r"\.save_state\s*\(", r"\.save_pretrained\s*\(")
    requires = (BACKWARD_CALL,)
    examples = (
        Example(SCRIPT),
        Example(AFTER_THE_LOOP),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        loops = step_loops(facts)
        if not loops:
            return
        saves = facts.calls_to(*SAVE_FUNCTIONS)
        library = library_saves(facts)
        writes = [(call, None) for call in saves] + list(library)
        # One report per checkpoint: the saves of one block (`if step % n == 0:` writing
        # the model, the optimizer and the arguments) are one checkpoint.
        blocks: dict = {}
        for call, name in sorted(writes, key=lambda write: write[0].site.order):
            if _in_step_loop(facts, call, loops):
                block = facts.parents.get(call.site.statement)
                blocks.setdefault(id(block), []).append((call, name))
        for (call, name), *others in blocks.values():
            more = f" (and {len(others)} more save(s) of the same checkpoint)" if others else ""
            if name is None:
                self.report(call.node, message=(self.message + more) if more else None)
                continue
            self.report(
                call.node,
                message=f"`{excerpt(call.node)}` writes a checkpoint through {name} inside the "
                f"training loop, which blocks training while it is written{more}",
            )
        saves = [*saves, *(call for call, _ in library)]
        savers = {id(call.site.function): call for call in saves if call.site.function}
        for call in facts.records.calls:
            if not call.site.loops or not _in_step_loop(facts, call, loops):
                continue
            function = local_function(facts, call)
            save = savers.get(id(function)) if function is not None else None
            if save is not None:
                self.report(
                    call.node,
                    message=f"`{excerpt(call.node)}` writes a checkpoint "
                    f"(`{excerpt(save.node)}` in `{function.name.value}()`) inside the "
                    "training loop, which blocks training while it is written",
                )


def _in_step_loop(facts, call: CallSite, loops) -> bool:
    """The call sits in the body of a loop that runs the training step, at any depth of
    `if`, `with` or `try`, in that loop's own function (not in a function defined inside
    the loop), and not under an `if` that lets it run on one step of each pass only."""
    return any(
        loop in call.site.loops
        and call.site.function is loop.function
        and id(call.node) not in once_per_pass(facts, loop)
        for loop in loops
    )

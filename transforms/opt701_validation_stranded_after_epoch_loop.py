"""OPT701: validation or checkpointing that an indentation slip left after the epoch loop."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt
from optimizer_codemod.analysis.epochs import StrandedBlock, stranded_blocks
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.rule import Example, Fix, Replace, Rule, Safety


class ValidationStrandedAfterEpochLoop(Rule):
    """
    What it does:
        Finds a block right after the epoch loop (a `for` loop around the training loop, or
        around a call of a training function of the same file) that validates, evaluates,
        logs or saves (a call named like `validate`, `evaluate`, `eval`, `test`, `save`,
        `log`, `print`, `add_scalar`, or `torch.save`) and reads the loop variable (`epoch`,
        or a name the loop body computes from it). It moves the block to the end of the
        loop body, re-indented, comments kept. A block that follows a step loop inside the
        epoch loop's body already runs every epoch, and is left alone.

    Why is it slow:
        It is a bug, not a slowdown: the block was meant to run every epoch, but it runs once,
        after training, with the last epoch's number. Validation metrics are never seen while
        training runs, and a crash loses every epoch since no checkpoint was written.

    Example:
        ```python
        for epoch in range(epochs):
            train_one_epoch(model, loader, optimizer)
        val_loss = evaluate(model, val_loader)
        torch.save(model.state_dict(), f"ckpt_{epoch}.pt")
        ```
        becomes
        ```python
        for epoch in range(epochs):
            train_one_epoch(model, loader, optimizer)
            val_loss = evaluate(model, val_loader)
            torch.save(model.state_dict(), f"ckpt_{epoch}.pt")
        ```

    Fix safety:
        `behavior`: the block then runs every epoch (more validation time, one checkpoint
        per epoch). Always reported; applied with `--unsafe-fixes`. The block starts right
        after the loop, in the same body, and ends at its last statement that reads the loop
        variable or a name the block computed from it (`log = {"epoch": epoch}`, then
        `accelerator.log(log)`): a final test pass or final save that does not read it is left alone, and
        so is everything after a loop with a `break` of its own (early stopping), after a
        `for ... else`, in another notebook cell, or in another scope. So is a block whose
        every statement the loop body already runs (DALLE-pytorch's `save_model(path,
        epoch=epoch)`, at the end of each epoch and again after the loop: moved, it would
        save twice per epoch), and a block whose validation or saving calls the loop body
        already makes under a condition of its own (guided-diffusion's classifier_train.py
        saves every `save_interval` steps and once more after the loop: moved, it would save
        on every step), a block that only prints or logs values the loop body prints or
        logs every epoch (CutMix's `print('Best accuracy ...', best_err1, best_err5)`: a
        summary, which moved would print twice per epoch), and a block that runs only under
        a test holding at the loop's last
        iteration alone (yolov5's `if RANK in {-1, 0} and final_epoch:` with `final_epoch =
        epoch + 1 == epochs`, or `if epoch == epochs - 1:`): written for after training, and
        inside the loop it would run at the same point. Nor a block that says it is written
        for after training: the word "final" in a name, keyword, string or comment
        (`log_validation(..., epoch, is_final_validation=True)` under `# Final inference`),
        or "End of training" (a hub upload's commit message); the 44 end-of-training blocks
        of diffusers' training examples read `epoch` only as a label. A block that binds a
        name the loop body reads before binding it (diffusers' `unet = unwrap_model(unet)`
        before the final save, with `unet.train()` at the top of the epoch) is reported
        without a fix: moved, the next epoch would train what the block bound. A block with
        `return`, `yield`, `break`, `continue`, `global`/`nonlocal` or a definition is not
        moved. Reported without a fix when the block calls `model.eval()` (directly or in a
        function of the file) and nothing in the loop calls `model.train()` again: the next
        epoch would train in eval mode; when the loop's body has a `continue` of its
        own, which would skip the block in some epochs; and when the loop's body already ends
        each epoch, after its last inner loop, with work of its own on the loop variable (a
        checkpoint named after the epoch, a per-epoch log): its author knew where an epoch
        ends, and Hugging Face's run_qa_no_trainer.py, which saves `epoch_{epoch}` there and
        evaluates once after the loop, labelling the log with the last `epoch`, had its whole
        evaluation and prediction pass moved into the loop. Only the loop nearest the loop that
        steps the optimizer counts as the epoch loop (not an outer loop over runs or folds,
        nor the step loop around a micro-step loop), or a loop that calls a function of the
        file that trains: `train(...)`, or `trainer.fit(...)` where a method `fit` of a
        class of the file does (never a call on an imported module, yolov5's
        `validate.run(...)` beside its own `def run`, whose batch loop was taken for an
        epoch loop and had the end-of-epoch block moved into it). When that loop sits in
        another loop of the same function, the block after it already runs once per outer
        iteration, and is left alone where that is what it was written for: it reads the
        outer loop's variable or a name computed from it, the outer loop's variable names
        epochs (and the inner one's does not), or the inner loop iterates batches (a
        DataLoader, `train_loader`, `for batch in ...`). pytorch_geometric's
        distributed_sampling_xpu.py calls a `train_step` of the file in `for batch in
        train_loader:` inside `for epoch in range(1, 21):`; its `dist.barrier()` and
        `print(f"Epoch: {epoch:02d}, Loss: {loss:.4f}")` after the batch loop read the
        step's `loss` and were moved into it, to run on every step. An epoch loop inside
        a loop over folds or runs is still fixed when the block reads only its own names.
        A summary that reads the loop variable on purpose (`print(f"trained {epoch + 1}
        epochs")`) is found too: review the diff, or mark it `# noqa: OPT701`. Binding a
        name is not reading it: a later loop that binds the variable again (`for _ in
        range(3):` starting a second phase, `for epoch in ...` of its own) is no evidence,
        and throwaway names (`_`, `__`, `_unused`) never are.

    Expected gain:
        None in speed: it is a correctness fix (per-epoch validation and checkpoints). The
        test `tests/test_issue4_stranded_validation.py` runs a small convolutional script
        for 3 epochs on CPU: 1 checkpoint before the fix, 3 after.
    """

    code = "OPT701"
    name = "validation-stranded-after-epoch-loop"
    message = "Validation or checkpoint code after the epoch loop reads the loop variable"
    fix_title = "Move the block to the end of the epoch loop's body"
    safety = Safety.BEHAVIOR
    # An epoch loop is a `for` loop, and only training scripts have one.
    triggers = (r"\bfor\b",)
    requires = (BACKWARD_CALL,)
    examples = (
        Example(
            "for epoch in range(3):\n"
            "    for x, y in loader:\n"
            "        loss_fn(model(x), y).backward()\n"
            "# checkpoint\n"
            'torch.save(model.state_dict(), f"ckpt_{epoch}.pt")\n',
            "for epoch in range(3):\n"
            "    for x, y in loader:\n"
            "        loss_fn(model(x), y).backward()\n"
            "    # checkpoint\n"
            '    torch.save(model.state_dict(), f"ckpt_{epoch}.pt")\n',
        ),
        Example(
            "for epoch in range(3):\n"
            "    for x, y in loader:\n"
            "        loss_fn(model(x), y).backward()\n"
            'torch.save(model.state_dict(), "final.pt")\n'
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        for block in stranded_blocks(self.facts):
            first = block.statements[0]
            if block.enclosing_header is not None:
                self.decline(
                    first,
                    f"the loop before the block is nested in `{block.enclosing_header}`, and "
                    f"{block.enclosing_evidence}: the block already runs once per iteration of "
                    "that outer loop, and moved into the inner loop it would run on every inner "
                    "iteration",
                )
                continue
            if block.repeated:
                self.decline(
                    first,
                    "the epoch loop's body already runs this code every epoch: "
                    "after the loop it is a final repeat (a last save or test), and moving it "
                    "would run it twice per epoch",
                )
                continue
            if block.repeats_call is not None:
                self.decline(
                    first,
                    f"the epoch loop's body already calls `{block.repeats_call}` itself "
                    "(every iteration, or under a condition such as every N steps): after the "
                    "loop it is the final call, and moving it would make it on every iteration",
                )
                continue
            if block.summarises:
                self.decline(
                    first,
                    "the block only prints or logs values the epoch loop's body prints or logs "
                    "every epoch: it is the summary after training, and moving it would show "
                    "them twice per epoch",
                )
                continue
            if block.last_iteration_test is not None:
                self.decline(
                    first,
                    f"the block runs only when `{block.last_iteration_test}`, which holds at "
                    "the loop's last iteration alone: it is written for after training, and "
                    "inside the loop it would run at the same point",
                )
                continue
            if block.final_marker is not None:
                self.decline(
                    first,
                    f"the block says it is written for after training "
                    f"(`{excerpt(block.final_marker)}`): a final save, test or upload, "
                    "which inside the loop would run every epoch",
                )
                continue
            message = (
                f"Validation or checkpoint code after the epoch loop reads `{block.variable}`: "
                "it runs once, after training"
            )
            if block.problem is not None:
                self.report(first, message=f"{message}; not moved: {block.problem}")
                continue
            self.report(first, _move_into_loop(block), message=message)


def _move_into_loop(block: StrandedBlock) -> Fix:
    loop = block.loop.node
    body = loop.body
    moved = [s.visit(_BlankLinesUnindented()) for s in block.statements]
    # Comments under the loop's last statement stay above the moved block.
    moved[0] = moved[0].with_changes(leading_lines=(*body.footer, *moved[0].leading_lines))
    new_loop = loop.with_changes(body=body.with_changes(body=(*body.body, *moved), footer=()))
    removals = tuple(Replace(s, cst.RemovalSentinel.REMOVE) for s in block.statements)
    return Fix((Replace(loop, new_loop), *removals))


class _BlankLinesUnindented(cst.CSTTransformer):
    """Blank lines printed at the new depth would end in spaces; keep them empty."""

    def leave_EmptyLine(self, original_node: cst.EmptyLine, updated_node: cst.EmptyLine):
        if updated_node.comment is None and not updated_node.whitespace.value:
            return updated_node.with_changes(indent=False)
        return updated_node

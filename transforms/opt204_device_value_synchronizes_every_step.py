"""OPT204: a device value read on the host on every training step (other than the loss's
`.item()`, OPT202's)."""

from __future__ import annotations

from typing import Optional, Set

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt, with_keyword
from optimizer_codemod.analysis.distributions import validated_distributions
from optimizer_codemod.analysis.gated_evaluations import gated_evaluations, gated_replacements
from optimizer_codemod.analysis.periodic import LOG_EVERY, METRIC_LOG
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.analysis.syncs import (
    METRIC_ACCUMULATION,
    StepSync,
    helper_sync_message,
    helper_syncs,
    device_total_term,
    host_read,
    loss_items,
)
from optimizer_codemod.rule import Example, Fix, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

_LOOP = (
    "import torch\n"
    "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
    "model = torch.nn.Linear(8, 4).to(device)\n"
    "for epoch in range(3):\n"
    "    correct = 0\n"
    "    for x, y in loader:\n"
    "        x, y = x.to(device), y.to(device)\n"
    "        out = model(x)\n"
    "        loss = torch.nn.functional.cross_entropy(out, y)\n"
    "        loss.backward()\n"
)
# Why each kind of sync (syncs.StepSync.kind) waits: {node} is the code, {value} the value.
WAITS = {
    "item": "{node} copies a device value to the host on every step",
    "tolist": "{node} copies a device tensor to the host on every step",
    "cpu": "{node} copies a device tensor to the host on every step",
    "print": "{node} prints the device tensor {value} on every step, which reads its value",
    "format": "{node} formats the device tensor {value} on every step, which reads its value",
    "convert": "{node} reads the value of the device tensor {value} on every step",
    "branch": "the test {node} needs a device value on every step",
}


class DeviceValueSynchronizesEveryStep(Rule):
    """
    What it does:
        Reports every host synchronisation on every step of a training loop other than the
        loss's `.item()` (OPT202) and `torch.cuda.synchronize()`/`empty_cache()` (OPT703):
        `.item()` of a metric, `.tolist()`, `.cpu()` and `.type(torch.LongTensor)` (a CPU
        tensor type) of device tensors, printing one
        (`print(loss)`, `f"{acc:.3f}"`, `"%f" % acc`), converting one (`float(x)`,
        `math.isfinite(loss)`), and branching on one (`if torch.isnan(loss):`,
        `while err > tol:`, `assert`). The message names the value and why the host waits.
        Rewrites the one pattern with a sound fix: a metric summed with `.item()` on every
        step and read only later (`correct += (pred == y).sum().item()`) is summed on the
        device (`correct += (pred == y).sum()`) and read back where the script reads it
        (`int(correct)`), also through a name bound only to such a metric or a function of
        the file returning one (bentrevett's `acc = binary_accuracy(predictions, y)`, which
        returns `correct.sum() / len(correct)`); so is a term of the backpropagated loss summed for a log
        (`agg_content_loss += content_loss.item()` with `total_loss = content_loss +
        style_loss`, pytorch/examples' fast_neural_style), a floating scalar like the loss. A line that only prints or logs device values on every step
        (`print(f"acc {acc.item():.3f}")`, `sys.stdout.write(...)`, a logger's method) runs
        every 10th step by the loop's counter (`if step % 10 == 0:`), under the conditions of
        OPT202's gated lines (OPT202 gates the lines that read the loss; the two are gated
        together when one loop has both). A value read with `.item()` earlier in the step
        only for that line (`D_x = output.mean().item()`, its name bound once and read only
        there, pytorch/examples' dcgan; the value a tensor computed there by a method that
        returns a new one, never a name or a view that a later update in place could
        change before the line reads it) stays on the device (`output.mean().detach()`) and the
        line reads it (`D_x.item()`): the same number, printed every 10th step; this part
        of the fix is reported at the `.item()` it moves. Device values are those computed from the loss, its criterion's
        inputs, model outputs and tensors moved with `.to(device)`; statements under an `if`
        do not run every step and are left alone.
        The step's helpers count too: `.item()` and `.tolist()` in a function of the file
        that a training loop calls on every iteration, or that a training step calls (a
        function running backward, or stepping an optimizer of the file, outside any loop
        of its own, and called from a loop or from a function called in one), and in
        the functions those call in turn (two levels), are reported where they are (`return
        loss.item(), acc.item()` in a `test()` run after every step). Calls under an `if`
        whose test has a `%` (`if step % 100 == 0:`) do not run every step, nor do those
        under `if param == <literal>:` when every call of the helper in the file gives
        `param` another literal (guided-diffusion's `compute_top_k(..., reduction="none")`
        and its `if reduction == "mean": return ....item()`). A name unpacked beside the
        loss from a helper of the file (`loss, parts = compute_loss(...)`) is not taken for
        a device tensor where every `return` of the helper puts a host value (`.cpu()`).
        A `torch.distributions` object (`Categorical`, `Normal`, ...) built in a loop, or in
        a function of the file that a loop calls (cleanrl's `probs = Categorical(logits=...)`
        in `Agent.get_action_and_value`, called on every rollout and update step), checks its
        arguments when built and the value of each `log_prob`, each check a host test of a
        device tensor: it is built with `validate_args=False` (analysis/distributions.py).
        So is a class of the file derived from one of torch's that keeps torch's constructor
        (pytorch-a2c-ppo-acktr-gail's `FixedCategorical(torch.distributions.Categorical)`:
        one base, no `__init__` of its own). Not where the call already chooses, by keyword
        or by position, passes `*args` or `**kwargs`, where every argument is a host value
        (`probs.cpu()`), or where the script turns validation off: with
        `Distribution.set_default_validate_args(False)`, or by compiling anything, which does
        the same for the whole process.

    Why is it slow:
        Reading a device value on the host makes the host wait until the device has
        finished everything queued before it, usually the whole step: while it waits it
        cannot prepare the next batch or queue the next kernels, and the device idles when
        it resumes. One such read anywhere in the step is enough to serialise host and
        device (PyTorch's Performance Tuning Guide, "Avoid unnecessary CPU-GPU
        synchronization", https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html).

    Example:
        ```python
        correct = 0
        for x, y in loader:
            ...
            loss.backward()
            correct += (out.argmax(1) == y).sum().item()
        print(correct / len(dataset))
        ```
        becomes
        ```python
        correct = 0
        for x, y in loader:
            ...
            loss.backward()
            correct += (out.argmax(1) == y).sum()
        print(int(correct) / len(dataset))
        ```

    Fix safety:
        `safe` for counts: the sum of a comparison is an int64 tensor, summed exactly on the
        device, and every read of the total becomes `int(total)` (`float(total)` when it
        started as a float), the same number as before; a total that never grew stays the
        Python number it started as, which both accept. A sum of floats or a mean
        (`acc += (pred == y).float().mean().item()`) is summed on the device in float32
        instead of in Python floats: `numerics`, like OPT202. Rewritten only under the
        conditions of OPT202 (the name is bound only to number literals and its own
        accumulations, used by no nested function, not read on every step, read at least
        once, not printed with `=`) and when the added expression is exactly one `.item()`
        of a value whose type the analysis knows. A fix must pay: where another sync stays
        on every step of the loop (`print(loss.item())`, or a device tensor indexed by a
        boolean mask, `out[data.train_mask]` in PyG's rect.py: the result's size is the
        number of True elements, which the host must read; a mask is an index that is a
        comparison or is named for one), nothing is rewritten and the message names it,
        unless another fix of the same run takes it off the step too
        (OPT202 moves `running += loss.item()` to the device in the same run). Every other
        sync is only reported: printing, branching or logging less often changes what the
        script does, except a line that only prints or logs: it runs every 10th step
        (`behavior`: nine lines in ten are no longer printed; training is unchanged), when the
        fix pays, as in OPT202.

        An evaluation the step runs every step but whose results it reads only under a
        periodic `if` (pytorch/examples' gcn and gat: `loss_val, acc_val = test(model, ...)`
        then `if epoch % print_every == 0: print(...)`) moves to the top of that `if`'s body:
        `behavior`, since the skipped evaluations no longer run; what is printed and trained
        stays the same (tests/test_gated_evaluations.py runs it). Moved only when
        (analysis/gated_evaluations.py): the statements are `names = f(...)` right before an
        `if` whose test has a `%`, calls nothing and has no `else`; the names they bind are
        read nowhere but in that `if`'s body; each `f` is a function of the file that starts
        with `p.eval()` on one of its parameters, keeps nothing (OPT403's analysis: no tensor
        it makes outlives it, no store, no update in place) and draws no random number; the
        step calls `model.train()` on the model it passes before its own forward; the step is
        called only in loops, and after each loop the first use of the model sets its mode
        (`model.eval()`, or a call of such an `f`); and no other sync stays on the step.

        `validate_args=False` on a distribution is `behavior`: on valid arguments every
        sample, `log_prob`, entropy and gradient is the same (tests/test_distribution_validation.py
        compares them bit for bit, and trains a PPO agent both ways to equal parameters), but
        invalid ones (NaN logits, a scale of 0, an action outside the support) no longer raise
        a `ValueError` that names them: they give NaN or a wrong number silently. Validation is
        on by default to help beginners; PyTorch names turning it off as the way to speed
        (pytorch/pytorch#48743).

    Expected gain:
        The host-device round trip of every step, when nothing else waits on that step: a
        fast device and a host with work to queue (data loading, the next step's kernels).
        In facebookresearch/fairchem#2193 (an open pull request), removing host
        synchronisations, most of them in the loss, took a UMA-S training step from 151.2 ms
        to 127.9 ms on 8 B200 GPUs. On a CPU every kernel has run before the host goes on,
        so there is nothing to overlap: `benchmarks/rule_gains/opt204.py` (a 256-512-10 MLP
        step, batch 64, one thread, counting correct predictions with `.item()` against on
        the device; 2-core x86_64, torch 2.13.0+cpu, 2026-11-24) measured x0.98 to x1.05 in
        three runs (0.71 to 0.90 ms per step), no difference beyond noise. The gain needs a
        CUDA device and was not measured here. Skipping a distribution's checks also saves
        their own kernels and Python: `benchmarks/rule_gains/opt204_distributions.py` times a
        PPO minibatch update (cleanrl's CartPole sizes) on the CPU, in the Measured table.
    """

    code = "OPT204"
    name = "device-value-synchronizes-every-step"
    message = "A device value is read on the host on every step, so the host waits for the device"
    fix_title = "Sum it on the device; read the total where the script reads it"
    safety = Safety.SAFE
    min_torch = TorchVersion(1, 0)
    # Every finding is one of these: a copy to the host, printing, formatting or converting
    # a value, or a test.
    triggers = (
        r"\.\s*(?:item|tolist|cpu|to)\s*\(|\b(?:print|float|int|bool|str|repr|format|round)"
        r"\s*\(|\bmath\.|\b(?:if|while|assert)\b|%",
        r"\bdistributions\b",
    )
    requires = (BACKWARD_CALL,)
    removes_syncs = {METRIC_ACCUMULATION: Safety.NUMERICS, METRIC_LOG: Safety.BEHAVIOR}
    examples = (
        Example(
            _LOOP + "        correct += (out.argmax(1) == y).sum().item()\n"
            "    print(epoch, correct / len(loader.dataset))\n",
            _LOOP + "        correct += (out.argmax(1) == y).sum()\n"
            "    print(epoch, int(correct) / len(loader.dataset))\n",
        ),
        Example(
            _LOOP + "        correct += (out.argmax(1) == y).sum().item()\n"
            "        print(f'accuracy {correct / len(loader.dataset):.3f}')\n"
        ),
        Example(
            _LOOP.replace("for x, y in loader", "for i, (x, y) in enumerate(loader)")
            + '        print(f"accuracy {(out.argmax(1) == y).float().mean().item():.3f}")\n',
            _LOOP.replace("for x, y in loader", "for i, (x, y) in enumerate(loader)")
            + "        if i % 10 == 0:\n"
            '            print(f"accuracy {(out.argmax(1) == y).float().mean().item():.3f}")\n',
        ),
        Example(
            _LOOP + "        probs = torch.distributions.Categorical(logits=out)\n"
            "        probs.log_prob(y).mean().neg().backward()\n",
            _LOOP
            + "        probs = torch.distributions.Categorical(logits=out, validate_args=False)\n"
            "        probs.log_prob(y).mean().neg().backward()\n",
        ),
        Example(
            _LOOP + "        if torch.isnan(loss):\n"
            "            raise RuntimeError('loss is NaN')\n"
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        syncs = self.facts.host_syncs
        enabled = self.sync_removals_applied()
        handled = set()
        for total in syncs.metric_accumulations():
            handled.update(total.items)
            statement = total.statements[0]
            what = f"`{excerpt(statement)}` copies a device value to the host on every step"
            obstacle = total.obstacle
            for sync in syncs.plan(total.loop, enabled).remaining if not obstacle else ():
                obstacle = f"`{excerpt(sync.node)}` waits for the device on every step as well"
                break
            if obstacle is not None:
                self.report(statement, message=f"{what}; not rewritten because {obstacle}")
                continue
            edits = [Replace(i, device_total_term(i, total.converter)) for i in total.items]
            edits += [Replace(read, host_read(read, total.converter)) for read in total.reads]
            exact = total.converter == "int"
            self.report(
                statement,
                Fix(tuple(edits)),
                message=what,
                safety=None if exact else Safety.NUMERICS,
            )
        for loop in self.facts.training_loops:
            handled.update(self._gate_log_lines(loop, enabled))
            handled.update(item.node for item in loss_items(self.facts, loop))
            lines = {line.statement: line for line in self.facts.log_lines.of(loop)}
            for sync in syncs.sites(loop):
                if sync.certain and sync.node not in handled and sync.kind in WAITS:
                    line = lines.get(sync.statement)
                    why = (
                        self.facts.log_lines.why_not_gated(line, enabled | {METRIC_LOG})
                        if line is not None
                        else None
                    )
                    self.report(sync.node, message=_message(sync, why))
        gated = {
            node: evaluation
            for evaluation in gated_evaluations(self.facts)
            for node in evaluation.syncs
        }
        for sync in helper_syncs(self.facts):
            if sync.loss:
                continue
            evaluation = gated.get(sync.node)
            if evaluation is None:
                self.report(sync.node, message=helper_sync_message(sync))
                continue
            gate = f"`if {excerpt(evaluation.gate.test, 40)}:`"
            obstacle = evaluation.obstacle or _stays(syncs, sync, evaluation, enabled)
            if obstacle is not None:
                self.report(
                    sync.node,
                    message=f"{helper_sync_message(sync)}; the evaluation does not move under "
                    f"{gate}, where the step prints it, because {obstacle}",
                )
                continue
            self.report(
                sync.node,
                Fix.replacing(gated_replacements(evaluation)),
                message=f"`{excerpt(sync.node)}` in `{sync.function.name.value}()`, which runs "
                "on every training step, copies a device value to the host, so the host waits "
                f"for the device on every step; the step reads its results only under {gate}: "
                "run it there",
                safety=Safety.BEHAVIOR,
                fix_title=f"Run the evaluation under {gate}",
            )
        if syncs.accelerated:
            for built in validated_distributions(self.facts):
                self._skip_validation(built)

    def _skip_validation(self, built) -> None:
        call = built.call.node
        where = (
            f"in `{built.runs_in.name.value}()`, which a loop calls, "
            if built.runs_in is not None
            else "in a loop, "
        )
        self.report(
            call,
            Fix((Replace(call, with_keyword(call, "validate_args", cst.Name("False"))),)),
            message=f"`{excerpt(call)}` {where}checks its arguments each time it is built (and "
            "`log_prob` its value): each check reads a device value on the host, so the host "
            "waits for the device",
            safety=Safety.BEHAVIOR,
            fix_title="Build it with `validate_args=False`",
        )

    def _gate_log_lines(self, loop, enabled) -> Set[cst.CSTNode]:
        """Fix each per-step print or log line of `loop` that reads device values other than
        the loss, where printing it every Nth step pays; the syncs taken off the step by
        these fixes and by OPT202's on lines that read the loss."""
        lines = self.facts.log_lines.paying(loop, enabled | {METRIC_LOG})
        for line in lines:
            if line.periodic is None and not line.loss:
                self.report(
                    line.statement,
                    Fix.replacing(line.replacements()),
                    message=f"`{excerpt(line.call)}` copies device values to the host on every "
                    "step to show them, so the host waits for the device each step; show them "
                    f"every {LOG_EVERY}th step (`if {line.counter} % {LOG_EVERY} == 0:`)",
                    safety=Safety.BEHAVIOR,
                    fix_title=f"Print or log it every {LOG_EVERY}th step",
                )
        for line in lines:
            for deferred in line.deferred:
                if deferred.loss:
                    continue  # OPT202's, as every read of the loss
                # The same edits as the line's own fix (OPT202's, for a line reading the
                # loss): the engine makes equal edits once and marks both findings fixed.
                self.report(
                    deferred.item,
                    Fix.replacing(line.replacements()),
                    message=f"`{excerpt(deferred.item)}` copies a device value to the host on "
                    "every step only for a log line of the step; it stays on the device "
                    f"(`.detach()`) and the line, {line.runs_every}, reads it",
                    safety=Safety.BEHAVIOR,
                    fix_title="Keep it on the device; read it where it is printed",
                )
        return {sync.node for line in lines for sync in line.syncs}


def _message(sync: StepSync, not_gated: Optional[str] = None) -> str:
    value = f"`{excerpt(sync.value, 40)}`" if sync.value is not None else ""
    what = WAITS[sync.kind].format(node=f"`{excerpt(sync.node)}`", value=value)
    if not_gated is not None:
        return (
            f"{what}: the host waits for the device to finish the step; not printed every "
            f"{LOG_EVERY}th step because {not_gated}"
        )
    return (
        f"{what}: the host waits for the device to finish the step; do it every N steps, "
        "or keep the value on the device"
    )


def _stays(syncs, sync, evaluation, enabled) -> Optional[str]:
    """Why moving the evaluation gains nothing: another sync stays on every step of the
    training loop that runs it."""
    loop = sync.in_loop.site.loops[-1] if sync.in_loop is not None else None
    if loop is None:
        return "the training loop that runs it is not found"
    moved = set(evaluation.syncs)
    for other in syncs.plan(loop, enabled).remaining:
        if other.node not in moved:
            return f"`{excerpt(other.node)}` waits for the device on every step as well"
    return None

"""OPT503: a Python loop over parameters that updates each one with small in-place kernels."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt
from optimizer_codemod.analysis.parameter_loops import compiled_by, parameter_update_loops
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.rule import Example, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

SGLD = """\
import math
import torch


class SGLD(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                p.add_(p.grad, alpha=-group["lr"])
                p.add_(torch.randn_like(p), alpha=math.sqrt(2 * group["lr"]))


optimizer = SGLD(model.parameters())
for x, y in loader:
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
"""
MANUAL_SGD = """\
import torch

for x, y in loader:
    loss = loss_fn(model(x), y)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
"""
INIT_LOOP = """\
import torch

for p in model.parameters():
    p.data.uniform_(-0.1, 0.1)
for x, y in loader:
    loss_fn(model(x), y).backward()
    optimizer.step()
"""


class PerParameterUpdateLoop(Rule):
    """
    What it does:
        Reports a Python `for` loop over a model's parameters (`model.parameters()`,
        `named_parameters()`, `group["params"]` of an optimizer's `param_groups`, or a name
        bound to one of them) that updates each parameter in place (`p.add_(...)`,
        `p.data.mul_(...)`, `p.lerp_(...)`, `p -= lr * p.grad`, `p.data = ...`), or another
        model's parameter looked up by the loop's name (`ema_params[name].mul_(d)`, with
        `ema_params = OrderedDict(ema.named_parameters())`), and runs every
        training step: inside the loop that calls backward, in the `step` method of an
        optimizer class written in the file (a subclass of `torch.optim.Optimizer`), or in a
        function the training loop calls. It reports, never rewrites. Loops that run once
        (initialisation before training) are not reported, nor loops whose function is
        already compiled (`@torch.compile`, `torch.compile(optimizer.step)`).

    Why is it slow:
        Each in-place operation on each parameter is its own operator call: Python overhead,
        dispatch, and on a GPU one kernel launch, for a tensor that is often small. A model
        with P parameter tensors and an update of K operations costs P x K launches per
        step, and for small tensors the launch overhead, not the arithmetic, is the time.
        `torch._foreach_*` operations (`torch._foreach_add_(params, grads, alpha=-lr)`,
        `_foreach_mul_`, `_foreach_addcmul_`, `_foreach_lerp_`) apply one operation to a list
        of tensors in a few multi-tensor launches; this is how `torch.optim` implements its
        default `foreach` optimizers. `torch.compile` of the update function fuses it further.
        PyTorch's recipe "(beta) Compiling the optimizer with torch.compile"
        (https://pytorch.org/tutorials/recipes/compiling_optimizer.html) shows an Adam step
        over ten `Linear(1024, 1024)` layers going from 747 us eager to 392 us compiled on a
        CUDA GPU (its sample output).

    Example:
        ```python
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                p.add_(p.grad, alpha=-group["lr"])
        ```
        is reported, with two ways out: gather the lists once per group and update them all
        at once,
        ```python
        params = [p for p in group["params"] if p.grad is not None]
        torch._foreach_add_(params, [p.grad for p in params], alpha=-group["lr"])
        ```
        or keep the loop and compile the step (`optimizer.step = torch.compile(optimizer.step)`
        or `@torch.compile` on the update function; torch 2.2 or later for optimizers).

    Fix safety:
        `suggest`: no rewrite is offered. A loop body mixes per-parameter decisions
        (`if p.grad is None: continue`, per-parameter state) with arithmetic, and draws
        random numbers per parameter (SGLD's `torch.randn_like(p)`: no `_foreach_` form draws
        them); a `_foreach_` form may round differently (fused multiply-adds) and
        `torch._foreach_*` are underscore APIs without a documented stability promise.
        `torch.compile` adds compilation time and recompiles when the learning rate is a
        Python float that changes (the recipe wraps it in a tensor).

    Expected gain:
        The per-operator overhead of P x K calls per step, less what the multi-tensor form
        costs: large for many small tensors on a GPU, little or nothing on a CPU where the
        update is bound by memory. Measured here on the CPU (see the table below, from
        `benchmarks/foreach_update.py`): hand-written SGD with momentum over 16 small tensors
        gains about x1.7 from `_foreach_`; over the 2.4M-parameter MLP of
        reference_models/sgld_mnist (6 tensors) nothing (x0.85 to x0.95 over three runs:
        slower if anything); the SGLD update, whose noise draws
        stay per parameter, gains little on small tensors and loses on large ones, and under
        `torch.compile` on the CPU its random draws became much slower (see
        `benchmarks/results/foreach-update-cpu.md`). Not measured on a GPU here.
    """

    code = "OPT503"
    name = "per-parameter-update-loop"
    message = "Parameters updated one at a time in a Python loop every step"
    fix_title = (
        "Update all parameters at once with `torch._foreach_*` (e.g. `torch._foreach_add_`), "
        "or compile the step (`torch.compile(optimizer.step)`)"
    )
    safety = Safety.SUGGEST
    min_torch = TorchVersion(1, 0)
    # The loop iterates `.parameters()`, `named_parameters()` or `["params"]`, or a name bound
    # to them: each of these files says `param` somewhere.
    triggers = (r"param",)
    requires = (BACKWARD_CALL,)
    examples = (
        Example(SGLD),
        Example(MANUAL_SGD),
        Example(INIT_LOOP),
        Example(
            SGLD.replace("    @torch.no_grad()\n", "    @torch.no_grad()\n    @torch.compile\n")
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        for update in parameter_update_loops(self.facts):
            node = update.loop.node
            compiled = compiled_by(self.facts, update)
            if compiled is not None:
                self.decline(node, f"the update is compiled already (`{excerpt(compiled)}`)")
                continue
            count = len(update.updates)
            operations = "one in-place operation" if count == 1 else f"{count} in-place operations"
            loop = update.loop.node
            self.report(
                node,
                message=(
                    f"`for {excerpt(loop.target, 20)} in {excerpt(loop.iter, 40)}` ({update.why}) "
                    f"updates each parameter tensor with {operations} "
                    f"(`{excerpt(update.updates[0], 50)}`): one operator call per tensor for "
                    "each, every step"
                ),
            )

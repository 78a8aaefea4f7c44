"""OPT502: `zero_grad(set_to_none=False)` fills gradients with zeros instead of dropping them."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.calls import (
    argument,
    code_of,
    has_double_star,
    has_star_args,
    literal,
    without_argument,
)
from optimizer_codemod.analysis.cuda_graphs import cuda_graph_captures, names_a_graph
from optimizer_codemod.analysis.gradients import GradRead, grad_reads
from optimizer_codemod.rule import Example, Fix, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

_NOT_A_LITERAL = object()


class ZeroGradSetToNoneFalse(Rule):
    """
    What it does:
        Removes `set_to_none=False` (or a positional `False`) from `optimizer.zero_grad(...)`
        and `model.zero_grad(...)`, so gradients are reset to None, the default since
        torch 2.0. A plain `zero_grad()` or `set_to_none=True` is not a finding.

    Why is it slow:
        `set_to_none=False` launches a kernel per gradient (or a few multi-tensor ones) to
        write zeros over every gradient, and the next backward then reads those zeros back to
        add the new gradient to them. With None, nothing is written, and backward assigns the
        first gradient instead of accumulating into memory. PyTorch's Performance Tuning Guide
        recommends it ("Use parameter.grad = None instead of model.zero_grad() or
        optimizer.zero_grad()", https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html).
        Between the reset and the backward the gradients also hold no memory.

    Example:
        ```python
        optimizer.zero_grad(set_to_none=False)
        ```
        becomes
        ```python
        optimizer.zero_grad()
        ```

    Fix safety:
        `behavior`: code that reads `.grad` sees None instead of a zero tensor, parameters
        that get no gradient in a step keep `.grad` None after backward, and `torch.optim`
        optimizers skip a parameter whose gradient is None where they would have applied a
        zero-gradient step (momentum and weight decay still move it); see the
        `Optimizer.zero_grad` documentation. Fixed only when the script reads `.grad`
        nowhere (`p.grad`, `p.grad += ...`, `getattr(p, "grad")`): a read in the training
        loop, in a function it calls, or after training could see None. Otherwise reported,
        naming the read that stops the fix. Reads inside modules the script imports are not
        visible to the analysis. Reported, not fixed, when `set_to_none` is a variable. Neither
        fixed nor reported where the script captures CUDA graphs (`torch.cuda.graph`,
        `make_graphed_callables`, `torch.compile` in a CUDA-graph mode) or chooses the value
        by a setting about graphs (torchtitan's `set_to_none=config.disable_cuda_graphs`):
        a replayed graph writes the gradients at the addresses it recorded, so they must stay
        allocated. Needs
        `target-torch` 2.0, whose default is `set_to_none=True`. Zeroing gradients by hand
        (`p.grad.zero_()`) is another pattern, not handled here.

    Expected gain:
        The zero-fill of every gradient before each backward, and the read-modify-write of
        the first accumulation into it: fewer memory operations, as PyTorch's Performance
        Tuning Guide explains. On a CUDA device the caching allocator hands the freed gradient
        memory straight back to backward. On CPU the outcome depends on the C allocator:
        `benchmarks/rule_gains/opt502.py` (`zero_grad` + backward of an MLP with 8.4M
        parameters, batch 32; 2-core x86_64, torch 2.13.0+cpu, 2026-11-21) gave x1.19 to
        x1.26 in three of six runs and x0.80 to x0.87 in the other three. The slow runs are
        those where glibc returned the freed gradients to the OS and backward faulted them in
        again: 3,400 to 5,700 minor page faults per step, against 600 to 2,300 in the fast
        runs and 1,200 to 1,900 with `set_to_none=False`.
    """

    code = "OPT502"
    name = "zero-grad-set-to-none-false"
    message = "`zero_grad(set_to_none=False)` writes zeros into every gradient"
    fix_title = "Remove `set_to_none=False` (gradients become None)"
    safety = Safety.BEHAVIOR
    min_torch = TorchVersion(2, 0)
    # Every finding passes an argument: a bare `zero_grad()` is never one.
    triggers = (r"\bzero_grad\s*\(\s*[^\s)]",)
    examples = (
        Example(
            "for x, y in loader:\n"
            "    optimizer.zero_grad(set_to_none=False)\n"
            "    loss_fn(model(x), y).backward()\n"
            "    optimizer.step()\n",
            "for x, y in loader:\n"
            "    optimizer.zero_grad()\n"
            "    loss_fn(model(x), y).backward()\n"
            "    optimizer.step()\n",
        ),
        Example(
            "for x, y in loader:\n"
            "    optimizer.zero_grad(set_to_none=False)\n"
            "    loss_fn(model(x), y).backward()\n"
            "    print(model.weight.grad.norm())\n"
            "    optimizer.step()\n"
        ),
        Example("optimizer.zero_grad()\nmodel.zero_grad(set_to_none=True)\n"),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        reads = None
        graphs = None
        for site in self.facts.method_calls("zero_grad"):
            call = site.node
            receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
            if (
                receiver is None
                or has_star_args(call)
                or has_double_star(call)
                # `torch.optim.Optimizer.zero_grad(opt, False)`, `super().zero_grad(False)`:
                # the arguments shift, or this is an override forwarding its own.
                or self.facts.qualified_name(receiver) is not None
                or isinstance(receiver, cst.Call)
            ):
                continue
            arg = argument(call, "set_to_none", 0)
            if arg is None:
                continue
            value = literal(arg.value, _NOT_A_LITERAL)
            if value is True:
                continue
            if graphs is None:
                graphs = cuda_graph_captures(self.facts)
            if graphs or names_a_graph(arg.value):
                continue  # gradients a CUDA graph writes must stay allocated
            if value is _NOT_A_LITERAL or type(value) is not bool:
                self.report(
                    call,
                    message=f"`set_to_none` is chosen at run time (`{code_of(arg.value)}`); "
                    "where it is False, every gradient is zero-filled: prefer the default",
                )
                continue
            if reads is None:
                reads = grad_reads(self.facts)
            if reads:
                self.report(
                    call,
                    message="`zero_grad(set_to_none=False)` writes zeros into every gradient; "
                    f"not fixed because the script reads `.grad` in `{_excerpt(reads[0])}`, "
                    "which would see None instead of zeros",
                )
                continue
            self.report(call, Fix((Replace(call, without_argument(call, arg)),)))


def _excerpt(read: GradRead, limit: int = 60) -> str:
    """The first line of the statement holding the read, shortened."""
    node = read.site.statement or read.node
    lines = [line.strip() for line in code_of(node).splitlines() if line.strip()]
    text = next((line for line in lines if not line.startswith(("#", "@"))), "")
    return text if len(text) <= limit else text[: limit - 3] + "..."

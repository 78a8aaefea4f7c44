"""OPT403: evaluation under `torch.no_grad()` where `torch.inference_mode()` would do."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.escapes import block_escape
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.rule import Example, Fix, ImportSpec, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

NO_GRAD = frozenset({"torch.no_grad", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad"})


_TRAIN = (
    "import torch\n"
    "for x, y in loader:\n"
    "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
    "    loss.backward()\n"
)


class EvaluationUnderNoGrad(Rule):
    """
    What it does:
        Replaces `with torch.no_grad():` by `with torch.inference_mode():` around evaluation
        code, outside the training loop: a block that runs the model the script trains and
        whose results leave it only as plain Python values (`.item()`, counts, `len(...)`).

    Why is it slow:
        Under `no_grad`, every tensor still carries autograd bookkeeping: a version counter
        bumped by each in-place operation and view tracking, checked when tensors are used.
        `inference_mode` also skips those, so each operation does less work on the host.
        PyTorch's documentation of `torch.inference_mode` describes it as "analogous to
        no_grad" with "better performance by disabling view tracking and version counter
        bumps" (https://pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html).
        The saving is host time per operator, so it shows with many small operations.

    Example:
        ```python
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in val_loader:
                correct += (model(x).argmax(1) == y).sum().item()
        print(correct / len(val_loader.dataset))
        ```
        becomes
        ```python
        model.eval()
        correct = 0
        with torch.inference_mode():
            for x, y in val_loader:
                correct += (model(x).argmax(1) == y).sum().item()
        print(correct / len(val_loader.dataset))
        ```

    Fix safety:
        `safe`: the same kernels run and compute the same values. What changes is that
        tensors created in the block become inference tensors, which raise when later saved
        for backward or updated in place outside inference mode. So the block is rewritten
        only when nothing it creates can reach later code as a tensor: every name it binds is
        either a plain Python value wherever the scope binds it, or unused after the block
        (or bound again before any later use); it stores into no attribute or subscript,
        returns or yields no tensor, updates nothing in place (`x.add_(...)`, `p -= ...`,
        `optimizer.step()`), and wants no autograd (`backward`, `enable_grad`,
        `requires_grad`). Its calls must be known not to keep or replace tensors: a model or
        loss also called in the training loop (which is how the block is recognised as
        evaluation), library functions (`torch`, `numpy`), builtins, tensor methods that
        return new tensors, views or Python values, loggers, and `append`/`update` of plain
        values. Anything else stops the rewrite: a function of the script, `model.to(...)`
        or `load_state_dict` on the trained model, `m.reset_parameters()`,
        `param.materialize(...)` (new parameters made there would be inference tensors).
        Never inside a training loop, where `no_grad` blocks compute metrics or targets next
        to the graph. The model's own `forward` is assumed not to keep its inputs.
        `@torch.no_grad()` decorators are left alone: their function's callers are not
        analysed. A `no_grad` block in the fallback branch of a feature check (the `else` of
        `if hasattr(torch, "inference_mode")`, an old-torch version branch) stays: it runs
        where `inference_mode` is missing (analysis/guards.py).

    Expected gain:
        Host time per operator in evaluation, small next to the kernels unless they are
        tiny. `benchmarks/rule_gains/opt403.py` (eval forward of a 6-layer MLP with LayerNorm
        and GELU, `no_grad` against `inference_mode`; 2-core x86_64, torch 2.13.0+cpu,
        2026-11-21, machine shared with other jobs) measured x1.02 to x1.04 in three runs at
        width 64 and batch 1 (about 0.11 ms per forward, dominated by per-operator overhead),
        and x0.95 to x1.00 at width 256 and batch 16 (0.33 ms): no gain beyond noise once the
        kernels do real work.
    """

    code = "OPT403"
    name = "evaluation-under-no-grad"
    message = "Evaluation under `torch.no_grad()`: `torch.inference_mode()` does less work"
    fix_title = "Use `torch.inference_mode()`"
    safety = Safety.SAFE
    min_torch = TorchVersion(1, 9)
    triggers = (r"\bno_grad\b",)
    # The block must call a model the training loop also calls: the file trains.
    requires = (BACKWARD_CALL,)
    examples = (
        Example(
            _TRAIN + "correct = 0\n"
            "with torch.no_grad():\n"
            "    for x, y in val_loader:\n"
            "        correct += (model(x).argmax(1) == y).sum().item()\n"
            "print(correct)\n",
            _TRAIN + "correct = 0\n"
            "with torch.inference_mode():\n"
            "    for x, y in val_loader:\n"
            "        correct += (model(x).argmax(1) == y).sum().item()\n"
            "print(correct)\n",
        ),
        Example(
            _TRAIN + "with torch.no_grad():\n"
            "    targets = model(x)\n"
            "loss = torch.nn.functional.mse_loss(model(x), targets)\n"
            "loss.backward()\n"
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        training = set(map(id, self.facts.training_loops))
        for item, site in self.facts.records.with_items:
            call = item.item
            if (
                not isinstance(call, cst.Call)
                or call.args
                or self.facts.qualified_name(call.func) not in NO_GRAD
                or not isinstance(site.statement, cst.With)
                or any(id(loop) in training for loop in site.loops)
            ):
                continue
            scope = site.function if site.function is not None else self.facts.module
            if block_escape(self.facts, site.statement, scope) is not None:
                continue
            if isinstance(call.func, cst.Attribute):
                fixed = call.with_changes(
                    func=call.func.with_changes(attr=cst.Name("inference_mode"))
                )
                fix = Fix((Replace(call, fixed),))
            else:
                fixed = call.with_changes(func=cst.Name("inference_mode"))
                fix = Fix((Replace(call, fixed),), (ImportSpec("torch", "inference_mode"),))
            self.report(call, fix)

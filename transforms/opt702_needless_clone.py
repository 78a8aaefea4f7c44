"""OPT702: a `.clone()` whose copy nobody needs."""

from __future__ import annotations

from typing import Optional, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import code_of, method_name, positional
from optimizer_codemod.analysis.mutation import (
    CALL,
    FRESH,
    FRESH_METHODS,
    SAFE,
    VIEW_METHODS,
    copy_verdict,
)
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.rule import Example, Fix, Replace, Rule, Safety


class NeedlessClone(Rule):
    """
    What it does:
        Removes the copy in `name = x.clone()` (and `torch.clone(x)`), or reduces
        `x.detach().clone()` / `x.clone().detach()` to `x.detach()`, when neither the copy nor
        the tensor it was taken from is ever written in place and neither escapes. Inside a
        chain, `x.clone().div(255)` becomes `x.div(255)` (an operation that allocates its
        result reads the copy once and keeps nothing of it), and `name = x.clone().float()`
        becomes `name = x.float()` under the same conditions as `name = x.clone()`.

    Why is it slow:
        `clone()` allocates a tensor as large as its source and copies every element: one
        full read and one full write of memory, plus the allocation, for a result that holds
        the same values as a tensor the script already has.

    Example:
        ```python
        target = y.clone()
        loss = F.mse_loss(model(x), target)
        ```
        becomes
        ```python
        target = y
        loss = F.mse_loss(model(x), target)
        ```

    Fix safety:
        `safe`: values and gradients are unchanged (the copy's backward is the identity).
        The analysis covers the function (or the module-level code) that binds the copy,
        flow-insensitively, and follows every name that would then share the storage (the
        copy, its source, names bound to views or unpackings of either). A fix needs all
        of this: none of them is written in place anywhere in that scope (`+=` and other
        augmented assignments, a method ending in `_` such as `.add_()`, `x[...] = ...`,
        `x.data = ...`, `out=`, `inplace=True`); none escapes (returned, yielded, stored in an
        attribute or a container, passed to a function other than torch's out-of-place
        operations, torch loss modules and `print`, read by a nested function, compared
        with `is`); and every value they hold was allocated in that scope (a torch factory
        or operation, arithmetic, a batch of a DataLoader with the default collation).
        A copy of a value from unknown code that is otherwise unused in place (a model's
        output, a function's parameter) is reported without a fix. A copy of a parameter,
        a `.grad`, a `state_dict()` entry or anything else the analysis cannot trace is
        left alone: optimizers and backward write those in place. `clone(memory_format=...)`
        changes the layout and is never touched. In a chain, every link between the copy and
        the operation that allocates must be a view or conversion (`.view()`, `.float()`,
        `.to()`); an in-place link (`x.clone().add_(1)`) writes the copy and is left alone,
        and a chain of only views and conversions, whose result may be the copy itself, is
        treated as the copy. Only files that run a backward pass are
        examined (training scripts and the helpers they define), so that library modules,
        whose copies are usually deliberate, cost no parse.

    Expected gain:
        One allocation and one copy per execution (memory traffic of twice the tensor's
        size), and the copy's memory while it lives; `x.detach()` or `x` itself costs about
        0.3 us. Measured with `torch.utils.benchmark.Timer` (median of `x.clone()` over 1 s,
        float32, 2 threads; 2-core x86_64 AMD EPYC, torch 2.13.0+cpu, 2026-11-21): 1 us for a
        32x1 label tensor, 63 to 66 us for a 256x3x32x32 batch (3.1 MB), 17.3 to 18.1 ms for
        a 64x3x224x224 batch (38.5 MB, where the fresh allocation's page faults dominate).
        The gain for a whole training step is that time per removed clone; not measured on
        a whole step, nor on a GPU.
    """

    code = "OPT702"
    name = "needless-clone"
    message = "Copy of a tensor that is never written in place"
    fix_title = "Use the tensor instead of a copy"
    safety = Safety.SAFE
    triggers = (r"\bclone\s*\(",)
    # A product decision for speed: library modules full of deliberate copies are not parsed.
    requires = (BACKWARD_CALL,)
    examples = (
        Example(
            "import torch\n"
            "x = torch.randn(8, 4)\n"
            "y = torch.randn(8, 1)\n"
            "target = y.clone()\n"
            "loss = torch.nn.functional.mse_loss(model(x), target)\n"
            "loss.backward()\n",
            "import torch\n"
            "x = torch.randn(8, 4)\n"
            "y = torch.randn(8, 1)\n"
            "target = y\n"
            "loss = torch.nn.functional.mse_loss(model(x), target)\n"
            "loss.backward()\n",
        ),
        Example(
            "import torch\n"
            "x = torch.randn(8, 4)\n"
            "noisy = x.clone()\n"
            "noisy += 0.1 * torch.randn_like(noisy)\n"
        ),
        Example(
            "import torch\n"
            "before = model.weight.detach().clone()\n"
            "optimizer.step()\n"
            "print((model.weight - before).norm())\n"
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        for site in facts.records.calls:
            chained = _clone_in_chain(site.node)
            if chained is not None:
                self._chain(site, *chained)
                continue
            found = _copy_of(facts, site.node)
            if found is None:
                continue
            source, shared = found
            assignment = facts.assignment_of(site.node)
            if assignment is None or not _binds_one_name(assignment.statement_node):
                continue
            if assignment.site.function is None and assignment.site.class_name is not None:
                continue
            scope = assignment.site.function or facts.module
            verdict = copy_verdict(facts, scope, assignment.target, site.node, source)
            if verdict.outcome != SAFE:
                continue
            if verdict.provenance == FRESH:
                self.report(
                    site.node,
                    Fix((Replace(site.node, shared),)),
                    message=f"`{assignment.target}` is a copy of `{code_of(source).strip()}`, "
                    "and neither is ever written in place",
                )
            elif verdict.provenance == CALL:
                self.report(
                    site.node,
                    message=f"`{assignment.target}` is a copy of `{code_of(source).strip()}`, "
                    "which comes from code the analysis cannot see; neither is written in "
                    "place here, so the copy is likely needless",
                )

    def _chain(self, site, clone: cst.Call, fresh: bool) -> None:
        """`x.clone()` inside a chain: `x.clone().float()`, `x.clone().view(-1).mul(2)`."""
        facts = self.facts
        source = clone.func.value
        text = code_of(source).strip()
        fix = Fix((Replace(clone, source),))
        if fresh:
            # A link that allocates its result (`.mul(2)`, `.sum()`) reads the copy once and
            # keeps nothing of it: the copy is never seen again, whatever `x` is.
            self.report(
                clone,
                fix,
                message=f"`{text}` is copied and the copy only read once by an operation that "
                "allocates its own result",
            )
            return
        # Views and conversions (`.float()`, `.view(-1)`) may return the copy itself: the
        # chain's result would share `x`'s storage, as `name = x` would.
        assignment = facts.assignment_of(site.node)
        if assignment is None or not _binds_one_name(assignment.statement_node):
            return
        if assignment.site.function is None and assignment.site.class_name is not None:
            return
        scope = assignment.site.function or facts.module
        shared = _without(site.node, clone)
        verdict = copy_verdict(facts, scope, assignment.target, site.node, shared)
        if verdict.outcome != SAFE:
            return
        if verdict.provenance == FRESH:
            self.report(
                clone,
                fix,
                message=f"`{assignment.target}` is built from a copy of `{text}`, and neither "
                "is ever written in place",
            )


def _clone_in_chain(call: cst.Call) -> Optional[Tuple[cst.Call, bool]]:
    """(the `.clone()`, whether `call` allocates its result) when `call` is the first link
    after a plain `x.clone()` that allocates (FRESH_METHODS), or the outermost of views and
    conversions (VIEW_METHODS) over it; every link between is a view or conversion. None
    for anything else, and for in-place links (`x.clone().add_(1)` writes the copy)."""
    method = method_name(call)
    if method == "clone" or method not in FRESH_METHODS | VIEW_METHODS:
        return None
    if not isinstance(call.func, cst.Attribute) or any(a.star for a in call.args):
        return None
    node = call.func.value
    if method == "detach" and _is_plain_call(node, "clone"):
        return None  # `x.clone().detach()`: the plain rule's own case
    while isinstance(node, cst.Call):
        inner = method_name(node)
        if inner == "clone":
            if node.args or not isinstance(node.func, cst.Attribute):
                return None
            if _is_plain_call(node.func.value, "detach"):
                return None  # `x.detach().clone().view(...)`: left to the plain rule
            return node, method in FRESH_METHODS
        if inner not in VIEW_METHODS or not isinstance(node.func, cst.Attribute):
            return None
        node = node.func.value
    return None


def _without(chain: cst.BaseExpression, clone: cst.Call) -> cst.BaseExpression:
    """`chain` with the `.clone()` call replaced by its receiver."""
    if chain is clone:
        return clone.func.value
    assert isinstance(chain, cst.Call) and isinstance(chain.func, cst.Attribute)
    inner = _without(chain.func.value, clone)
    return chain.with_changes(func=chain.func.with_changes(value=inner))


def _copy_of(facts, call: cst.Call) -> Optional[Tuple[cst.BaseExpression, cst.BaseExpression]]:
    """(the tensor copied, the expression without the copy) for the outermost call of a
    copy: `x.clone()`, `x.detach().clone()`, `x.clone().detach()`, `torch.clone(x)`."""
    if facts.qualified_name(call.func) == "torch.clone":
        args = positional(call)
        if len(args) == 1 and len(call.args) == 1:
            return args[0].value, args[0].value
        return None
    method = method_name(call)
    if call.args and method in ("clone", "detach"):
        return None
    if method == "clone":
        inner = call.func.value
        if _is_plain_call(inner, "detach"):
            return inner.func.value, inner
        if _is_plain_call(inner, "clone"):
            return None  # a clone of a clone: the inner one is the finding
        return inner, inner
    if method == "detach" and _is_plain_call(call.func.value, "clone"):
        source = call.func.value.func.value
        return source, call.with_changes(func=call.func.with_changes(value=source))
    return None


def _is_plain_call(node: cst.BaseExpression, method: str) -> bool:
    return isinstance(node, cst.Call) and not node.args and method_name(node) == method


def _binds_one_name(statement: cst.CSTNode) -> bool:
    if isinstance(statement, cst.Assign):
        return len(statement.targets) == 1 and isinstance(statement.targets[0].target, cst.Name)
    return isinstance(statement, cst.AnnAssign) and isinstance(statement.target, cst.Name)

"""OPT404: a constant tensor created again on every step of a training loop."""

from __future__ import annotations

from typing import Optional, Set

import libcst as cst

from optimizer_codemod.analysis.calls import keyword, literal
from optimizer_codemod.analysis.walk import parents
from optimizer_codemod.analysis.inplace import unsafe_use
from optimizer_codemod.analysis.invariance import is_invariant, names_bound_in
from optimizer_codemod.analysis.nodes import COMPREHENSIONS, find_all
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.analysis.scopes import name_uses
from optimizer_codemod.analysis.syncs import every_iteration
from optimizer_codemod.rule import Example, Fix, InsertStatements, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

CREATIONS = frozenset({"torch.arange", "torch.ones", "torch.zeros", "torch.eye", "torch.full"})
_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


class LoopInvariantTensorCreation(Rule):
    """
    What it does:
        Moves `torch.arange`, `torch.ones`, `torch.zeros`, `torch.eye` and `torch.full`
        calls whose arguments do not change inside a training loop (literals, and names the
        loop never binds or writes) to a new variable just before the loop, and uses that
        variable in the loop.

    Why is it slow:
        Each call allocates a tensor and launches a kernel to fill it, on every step, to
        build the same values again. On a GPU that is a kernel launch and an allocator round
        trip per call; on the CPU, an allocation and a memory fill. Built once, the tensor is
        only read.

    Example:
        ```python
        for x, y in loader:
            positions = torch.arange(block_size, device=device)
            loss = model(x, positions, y)
            loss.backward()
        ```
        becomes
        ```python
        positions_hoisted = torch.arange(block_size, device=device)
        for x, y in loader:
            positions = positions_hoisted
            loss = model(x, positions, y)
            loss.backward()
        ```

    Fix safety:
        `safe`: the loop reads a tensor with the same values, now shared by every iteration.
        Moved only when that sharing cannot be seen: the result (or the name it is bound to in
        the loop) is only used in arithmetic, comparisons, as an argument of calls that
        neither write their arguments (`out=`, `inplace=True`, functions named with a final
        `_`, functions of the script that write anything in place) nor keep them
        (`list.append`), or as the receiver of a method that returns a new tensor (`.tril()`)
        or that is not in-place and whose result is not bound to a name (it could be a view).
        Modules and functions the analysis cannot see (the model's `forward`) are assumed
        not to write their inputs in place, as PyTorch's modules do not. Never with
        `requires_grad`, `out=` or `*args`, when an argument is bound, assigned or written
        in place in the loop, when the call only runs under a condition (`if`), or inside a
        comprehension or nested function. A name it is bound to that a nested or other
        function uses is left alone. Only creations directly in the training loop are
        moved, to just before it: the moved call runs once per entry into the loop, even
        when the loop then runs no iteration.

    Expected gain:
        One allocation and fill per call and step, a few microseconds for small tensors on
        CPU. `benchmarks/rule_gains/opt404.py` (a 128x128 boolean mask and a 128-long
        `arange` created per step around a small attention step, against the same
        step reading hoisted tensors; 2-core x86_64, torch 2.13.0+cpu, 2026-11-21) measured
        x1.03 to x1.05 in five runs (0.114 ms against 0.110 ms per step; a sixth run, taken
        while the machine was loaded by other jobs, gave x0.85 at 17 ms per step). A real
        training step is longer, so the share is smaller.
    """

    code = "OPT404"
    name = "loop-invariant-tensor-creation"
    message = "Tensor with loop-invariant arguments created on every step"
    fix_title = "Create it once before the loop"
    safety = Safety.SAFE
    min_torch = TorchVersion(1, 0)
    triggers = (r"\b(?:arange|ones|zeros|eye|full)\b",)
    # Findings are in training loops: the loss's backward is called in them.
    requires = (BACKWARD_CALL,)
    examples = (
        Example(
            "import torch\n"
            "for x, y in loader:\n"
            "    mask = torch.ones(16, 16, device=device).tril()\n"
            "    loss = model(x, y, mask)\n"
            "    loss.backward()\n",
            "import torch\n"
            "ones_hoisted = torch.ones(16, 16, device=device)\n"
            "for x, y in loader:\n"
            "    mask = ones_hoisted.tril()\n"
            "    loss = model(x, y, mask)\n"
            "    loss.backward()\n",
        ),
        Example(
            "import torch\n"
            "for x, y in loader:\n"
            "    positions = torch.arange(x.size(1))\n"
            "    loss = model(x, positions, y)\n"
            "    loss.backward()\n"
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        taken: Optional[Set[str]] = None
        for loop in self.facts.training_loops:
            table = None
            per_step = None
            bound = None
            for site in self.facts.loop_calls(loop):
                if site.qualname not in CREATIONS or site.site.loop is not loop:
                    continue
                call = site.node
                per_step = every_iteration(loop) if per_step is None else per_step
                if site.site.statement not in per_step or not self._plain(call):
                    continue
                bound = names_bound_in(loop) if bound is None else bound
                if not all(is_invariant(self.facts, arg.value, bound) for arg in call.args):
                    continue
                table = parents(loop.node) if table is None else table
                target = self._uses_are_safe(loop, call, table)
                if target is False:
                    continue
                if taken is None:
                    taken = {n.value for n in find_all(self.facts.module, cst.Name)}
                fresh = _fresh(target or site.qualname.rsplit(".", 1)[-1], taken)
                hoisted = cst.SimpleStatementLine(
                    [cst.Assign([cst.AssignTarget(cst.Name(fresh))], call)]
                )
                self.report(
                    call,
                    Fix(
                        (
                            Replace(call, cst.Name(fresh)),
                            InsertStatements(loop.node, before=(hoisted,)),
                        )
                    ),
                )

    def _plain(self, call: cst.Call) -> bool:
        if any(arg.star for arg in call.args) or keyword(call, "out") is not None:
            return False
        grad = keyword(call, "requires_grad")
        return grad is None or literal(grad.value, None) is False

    def _uses_are_safe(self, loop, call: cst.Call, table):
        """The name the call is bound to (None when used inline), or False when unsafe."""
        node = table.get(call)
        while node is not None and node is not loop.node:
            if isinstance(node, _SCOPES + COMPREHENSIONS):
                return False
            node = table.get(node)
        parent = table.get(call)
        if not (
            isinstance(parent, cst.Assign)
            and len(parent.targets) == 1
            and isinstance(parent.targets[0].target, cst.Name)
        ):
            return None if unsafe_use(self.facts, call, table) is None else False
        name = parent.targets[0].target.value
        if self._seen_elsewhere(loop, name):
            return False
        for use in name_uses(loop.node, name):
            if use.nested:
                return False
            if use.store:
                if isinstance(table.get(use.node), cst.AugAssign):
                    return False
                continue
            if unsafe_use(self.facts, use.node, table) is not None:
                return False
        return name

    def _seen_elsewhere(self, loop, name: str) -> bool:
        """A nested function or another function may use the variable (a module-level
        loop's global, or a `global` declaration)."""
        scope = loop.function if loop.function is not None else self.facts.module
        if loop.function is not None and any(
            item.name.value == name
            for statement in find_all(loop.function, cst.Global, cst.Nonlocal)
            for item in statement.names
        ):
            return True
        return any(use.nested for use in name_uses(scope, name))


def _fresh(base: str, taken: Set[str]) -> str:
    name = f"{base}_hoisted"
    number = 2
    while name in taken:
        name = f"{base}_hoisted_{number}"
        number += 1
    taken.add(name)
    return name

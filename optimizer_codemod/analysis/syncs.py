"""Host synchronisations in training loops: `.item()` on the loss, and where its value goes.

`loss.item()` copies the loss to the host, so the host waits for the whole step to finish on
the device before it can queue the next one. The common reason is bookkeeping
(`running += loss.item()`): accumulating `loss.detach()` on the device instead, and reading
the total as a Python float only where the script looks at it, removes the per-step wait.

Here: which statements run on every iteration of a loop, every use of a name in the scope
that owns it, and the accumulations of a loss's `.item()` with everything that stops
rewriting them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional, Set, Union

import libcst as cst

from optimizer_codemod.analysis.calls import method_name
from optimizer_codemod.analysis.collect import CallSite, Loop
from optimizer_codemod.analysis.nodes import find_all, is_name
from optimizer_codemod.analysis.walk import children, walk

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

Scope = Union[cst.Module, cst.FunctionDef]
_NESTED = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


# Calls that copy a device tensor to the host, so the host waits for the device: methods
# (without arguments) and functions. The analysis does not know which tensors live on the
# device, so any such call counts: a fix that leaves one of them on every step gains nothing.
HOST_SYNC_METHODS = frozenset({"item", "tolist", "cpu"})
HOST_SYNC_FUNCTIONS = frozenset({"torch.cuda.synchronize"})


def step_syncs(facts: "ScriptFacts", loop: Loop) -> List[CallSite]:
    """Calls in `loop`'s own body that make the host wait for the device on every iteration
    (`.item()`, `.tolist()`, `.cpu()`, `torch.cuda.synchronize()`), in source order."""
    per_step = every_iteration(loop)
    return [
        call
        for call in facts.calls_directly_in(loop)
        if call.site.statement in per_step
        and (
            (call.method in HOST_SYNC_METHODS and not call.node.args)
            or call.qualname in HOST_SYNC_FUNCTIONS
        )
    ]


def every_iteration(loop: Loop) -> Set[cst.CSTNode]:
    """Statements of `loop`'s body that run on every iteration (not under an if or a loop;
    the header of a nested if/for/while runs every time and is included)."""
    found: Set[cst.CSTNode] = set()

    def walk(block: cst.BaseSuite) -> None:
        if isinstance(block, cst.SimpleStatementSuite):
            found.add(block)
            return
        for statement in block.body:
            found.add(statement)
            if isinstance(statement, cst.With):
                walk(statement.body)
            elif isinstance(statement, cst.Try):
                walk(statement.body)
                if statement.finalbody is not None:
                    walk(statement.finalbody.body)

    walk(loop.node.body)
    return found


@dataclass(frozen=True)
class NameUse:
    node: cst.Name
    store: bool  # bound here (assignment target, for target, del, with ... as)
    nested: bool  # inside a nested function, lambda or class of the scope


def name_uses(scope: Scope, name: str) -> List[NameUse]:
    """Every occurrence of the variable `name` in `scope`, in source order.

    Nested functions that bind `name` themselves (without `global`/`nonlocal`) have their
    own variable and are skipped; other nested occurrences are marked `nested`.
    """
    visitor = _NameUses(name, scope)
    walk(scope, visitor)
    return visitor.uses


def _bound_names(target: cst.CSTNode) -> List[cst.Name]:
    """The names a target binds: `a`, `a, (b, *c)`; not `a[0]` nor `a.b`, which read `a`."""
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _bound_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _bound_names(target.value)
    return []


class _NameUses(cst.CSTVisitor):
    def __init__(self, name: str, root: Scope) -> None:
        super().__init__()
        self.name = name
        self.root = root
        self.uses: List[NameUse] = []
        self._stores: Set[cst.CSTNode] = set()
        self._depth = 0

    def _own_variable(self, node: cst.CSTNode) -> bool:
        """A nested function that binds `name` without declaring it global or nonlocal."""
        if not isinstance(node, cst.FunctionDef):
            return False
        declared = any(is_name(n.name, self.name) for n in find_all(node, cst.Global, cst.Nonlocal))
        params = {p.name.value for p in find_all(node.params, cst.Param)}
        binds = self.name in params or any(
            is_name(target, self.name)
            for t in find_all(node.body, cst.AssignTarget, cst.AugAssign, cst.AnnAssign)
            for target in find_all(t.target, cst.Name)
        )
        return binds and not declared

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node is not self.root and isinstance(node, _NESTED):
            if self._own_variable(node):
                return False
            self._depth += 1
        if isinstance(node, cst.AssignTarget):
            self._stores.update(_bound_names(node.target))
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor)):
            self._stores.update(_bound_names(node.target))
        elif isinstance(node, cst.AsName):
            self._stores.update(_bound_names(node.name))
        elif isinstance(node, cst.Del):
            self._stores.update(_bound_names(node.target))
        elif isinstance(node, cst.Param):
            self._stores.add(node.name)
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            self._stores.add(node.name)
        elif isinstance(node, cst.ImportAlias):
            self._stores.update(_bound_names(node.asname.name if node.asname else node.name))
        elif isinstance(node, (cst.Attribute)):
            # `x.running` is no use of the variable `running`.
            walk(node.value, self)
            return False
        elif isinstance(node, cst.Arg) and node.keyword is not None:
            walk(node.value, self)
            return False
        elif isinstance(node, cst.Name) and node.value == self.name:
            self.uses.append(NameUse(node, node in self._stores, self._depth > 0))
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if original_node is not self.root and isinstance(original_node, _NESTED):
            self._depth -= 1


def _declares(function: cst.FunctionDef, name: str) -> bool:
    """`global name` or `nonlocal name` in `function` (nested functions included)."""
    return any(
        is_name(item.name, name)
        for statement in find_all(function.body, cst.Global, cst.Nonlocal)
        for item in statement.names
    )


@dataclass
class Accumulation:
    """`name += loss.item()` (or `name = name + ...`) in a training loop, and its reads."""

    name: str
    loop: Loop
    items: List[cst.Call] = field(default_factory=list)  # the `loss.item()` calls to detach
    statements: List[cst.CSTNode] = field(default_factory=list)  # the accumulating statements
    reads: List[cst.Name] = field(default_factory=list)  # reads to convert with float()
    # Why the accumulation cannot be rewritten; None when it can.
    obstacle: Optional[str] = None


def backward_losses(facts: "ScriptFacts", loop: Loop) -> Set[str]:
    """Names `x` with a bare `x.backward()` (or `scaler.scale(x).backward()`) in `loop`:
    scalar floating tensors."""
    found: Set[str] = set()
    for call in facts.calls_directly_in(loop):
        if call.method != "backward" or call.node.args:
            continue
        receiver = call.node.func.value
        if (
            isinstance(receiver, cst.Call)
            and method_name(receiver) == "scale"
            and len(receiver.args) == 1
            and receiver.args[0].keyword is None
            and not receiver.args[0].star
        ):
            receiver = receiver.args[0].value
        if isinstance(receiver, cst.Name):
            found.add(receiver.value)
    return found


def loss_items(facts: "ScriptFacts", loop: Loop) -> List[CallSite]:
    """`loss.item()` calls in `loop` (its own body) on a name it calls `backward()` on."""
    losses = backward_losses(facts, loop)
    return [
        call
        for call in facts.calls_directly_in(loop)
        if call.method == "item"
        and not call.node.args
        and call.receiver in losses
        and isinstance(call.node.func, cst.Attribute)
        and isinstance(call.node.func.value, cst.Name)
    ]


def _accumulated(statement: cst.CSTNode) -> Optional[tuple]:
    """(name, added expression) for `name += e` and `name = name + e`."""
    if isinstance(statement, cst.AugAssign) and isinstance(statement.operator, cst.AddAssign):
        if isinstance(statement.target, cst.Name):
            return statement.target.value, statement.value
    if (
        isinstance(statement, cst.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0].target, cst.Name)
        and isinstance(statement.value, cst.BinaryOperation)
        and isinstance(statement.value.operator, cst.Add)
        and is_name(statement.value.left, statement.targets[0].target.value)
    ):
        return statement.targets[0].target.value, statement.value.right
    return None


def _is_number(node: cst.BaseExpression) -> bool:
    return isinstance(node, (cst.Integer, cst.Float)) and not node.lpar


def loss_item_accumulations(facts: "ScriptFacts") -> List[Accumulation]:
    """Every accumulation of a loss's `.item()` in a training loop, with its obstacle if any.

    Rewritable when: the name is bound only by number literals (`= 0.0`) and by additions of
    expressions holding loss `.item()` calls (`+= loss.item()`, `+= loss.item() * n`,
    `= name + loss.item()`); it is used by no nested function, lambda or class; it is not
    read on every iteration of the training loop (that read would synchronise anyway).
    Every other read becomes `float(name)`, which keeps its type a Python float.
    """
    found: List[Accumulation] = []
    seen: Set[tuple] = set()
    for loop in facts.training_loops:
        per_step = every_iteration(loop)
        items = loss_items(facts, loop)
        for item in items:
            small = _small_statement(item)
            accumulated = _accumulated(small) if small is not None else None
            if accumulated is None:
                continue
            name = accumulated[0]
            key = (id(loop), name)
            if key in seen:
                continue
            seen.add(key)
            found.append(_accumulation(facts, loop, name, items, per_step))
    return found


def _small_statement(item: CallSite) -> Optional[cst.CSTNode]:
    statement = item.site.statement
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return statement.body[0]
    return None


def _accumulation(facts, loop: Loop, name: str, items, per_step) -> Accumulation:
    result = Accumulation(name, loop)
    scope: Scope = loop.function if loop.function is not None else facts.module
    accumulators = {}
    for item in items:
        small = _small_statement(item)
        accumulated = _accumulated(small) if small is not None else None
        if accumulated is not None and accumulated[0] == name:
            accumulators.setdefault(small, []).append(item)
    own_reads = set()
    for statement, calls in accumulators.items():
        added = _accumulated(statement)[1]
        added_items = [c for c in find_all(added, cst.Call) if method_name(c) == "item"]
        if len(added_items) != len(calls):
            result.obstacle = "it adds `.item()` of something other than the loss"
        result.items.extend(c.node for c in calls)
        result.statements.append(statement)
        if isinstance(statement, cst.Assign):
            own_reads.add(statement.value.left)
        if isinstance(statement, cst.AugAssign):
            own_reads.add(statement.target)
    if isinstance(scope, cst.FunctionDef) and _declares(scope, name):
        result.obstacle = f"`{name}` is declared global or nonlocal"
    for use in name_uses(scope, name):
        if use.nested:
            result.obstacle = result.obstacle or f"`{name}` is used in a nested function"
        elif use.node in own_reads:
            continue
        elif use.store:
            if not _bound_to_number(scope, use.node, accumulators):
                result.obstacle = result.obstacle or f"`{name}` is bound to something else"
        else:
            result.reads.append(use.node)
    if not result.reads and not result.obstacle:
        result.obstacle = f"`{name}` is never read: delete the accumulation instead"
    parents = _parents(scope) if result.reads else {}
    for read in result.reads:
        statement = _statement_of(parents, read)
        if statement in per_step:
            result.obstacle = result.obstacle or f"`{name}` is read on every step"
        holder = parents.get(read)
        if isinstance(holder, cst.FormattedStringExpression) and holder.equal is not None:
            # `f"{running=}"` prints the expression's text, which `float(...)` would change.
            result.obstacle = result.obstacle or f"`{name}` is printed with `=`"
    return result


def _bound_to_number(scope: Scope, name: cst.Name, accumulators) -> bool:
    for statement in find_all(scope, cst.Assign, cst.AugAssign):
        if statement in accumulators:
            if isinstance(statement, cst.AugAssign) and statement.target is name:
                return True
            if isinstance(statement, cst.Assign) and statement.targets[0].target is name:
                return True
            continue
        if isinstance(statement, cst.Assign):
            for target in statement.targets:
                value = _value_bound_to(target.target, statement.value, name)
                if value is not None:
                    return _is_number(value)
    return False


def _value_bound_to(target, value, name: cst.Name) -> Optional[cst.BaseExpression]:
    """What `target = value` binds to `name`, element-wise through tuples (`a, b = 0, 0`)."""
    if target is name:
        return value
    if (
        isinstance(target, (cst.Tuple, cst.List))
        and isinstance(value, (cst.Tuple, cst.List))
        and len(target.elements) == len(value.elements)
        and not any(isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements))
    ):
        for element, bound in zip(target.elements, value.elements):
            found = _value_bound_to(element.value, bound.value, name)
            if found is not None:
                return found
    return None


def _parents(scope: Scope) -> dict:
    parents = {}
    stack: List[cst.CSTNode] = [scope]
    while stack:
        current = stack.pop()
        for child in children(current):
            parents[child] = current
            stack.append(child)
    return parents


def _statement_of(parents: dict, node: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The innermost statement (or one-line suite) that holds `node`."""
    current = parents.get(node)
    while current is not None and not isinstance(
        current, (cst.BaseStatement, cst.SimpleStatementSuite)
    ):
        current = parents.get(current)
    return current

"""Meters a training loop feeds the loss's `.item()` on every step, and whether they could
take the loss as a device tensor instead.

pytorch/examples' imagenet and MoCo log through a class of their own:

    losses = AverageMeter("Loss", ":.4e")
    progress = ProgressMeter(len(loader), [batch_time, losses, top1], prefix=...)
    for i, (images, target) in enumerate(loader):
        ...
        losses.update(loss.item(), images.size(0))   # waits for the device every step
        top1.update(acc1[0], images.size(0))         # a tensor: the class already takes them
        if i % args.print_freq == 0:
            progress.display(i + 1)                  # str(meter) for each meter

`AverageMeter.update` only stores the value and does arithmetic with it (`self.sum += val *
n`, `self.avg = self.sum / self.count`), and `__str__` only formats those attributes
(`"{val:.4e}".format(**self.__dict__)`): a 0-dim tensor formats as its `.item()` does
(`Tensor.__format__`), so `losses.update(loss.detach().float(), n)` prints the same digits up
to the float32 sum, and the host reads the device only where the meter is printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional, Set

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt
from optimizer_codemod.analysis.collect import Loop
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.scopes import name_uses
from optimizer_codemod.analysis.syncs import loss_items

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide)
ARITHMETIC_ASSIGN = (cst.AddAssign, cst.SubtractAssign, cst.MultiplyAssign, cst.DivideAssign)


@dataclass(frozen=True)
class MeterUpdate:
    """`meter.update(loss.item(), ...)` in a training loop, `meter` an instance of a class of
    this file; `obstacle` says why it must keep a Python float (None: it need not)."""

    item: cst.Call  # `loss.item()`
    call: cst.Call  # `losses.update(...)`
    meter: str
    owner: str  # the meter's class
    loop: Loop
    obstacle: Optional[str]


@dataclass(frozen=True)
class _MeterClass:
    """What a meter class of this file does with the value its update method stores."""

    fed: FrozenSet[str]  # attributes holding the value or arithmetic of it: `val`, `sum`, `avg`
    # Methods reading those attributes otherwise than by formatting them (`all_reduce`).
    unsafe_methods: FrozenSet[str]
    obstacle: Optional[str]


def meter_updates(facts: "ScriptFacts") -> List[MeterUpdate]:
    """Every `meter.update(loss.item(), ...)` of the training loops, once per pass."""
    memo = facts.memo("meter_updates")
    if "all" not in memo:
        memo["all"] = [
            update
            for loop in facts.training_loops
            for item in loss_items(facts, loop)
            for update in (_meter_update(facts, loop, item.node, item.site.statement),)
            if update is not None
        ]
    return memo["all"]


def _meter_update(
    facts: "ScriptFacts", loop: Loop, item: cst.Call, statement: cst.CSTNode
) -> Optional[MeterUpdate]:
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    expr = statement.body[0]
    call = expr.value if isinstance(expr, cst.Expr) else None
    if not (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and isinstance(call.func.value, cst.Name)
        and call.args
        and call.args[0].keyword is None
        and not call.args[0].star
        and call.args[0].value is item
    ):
        return None
    meter, method = call.func.value.value, call.func.attr.value
    owner = _instance_class(facts, meter, loop.function)
    if owner is None:
        return None

    def found(obstacle: Optional[str]) -> MeterUpdate:
        return MeterUpdate(item, call, meter, owner, loop, obstacle)

    info = _meter_class(facts, owner, method)
    if info.obstacle is not None:
        return found(info.obstacle)
    return found(
        _instance_escapes(facts, meter, loop.function, owner, info)
        or _attributes_read_elsewhere(facts, meter, loop.function, owner, info)
    )


def _instance_class(
    facts: "ScriptFacts", name: str, function: Optional[cst.FunctionDef]
) -> Optional[str]:
    """The class of this file that `name`, a variable of `function`, is bound to: bound
    there once, by a call of that class; None otherwise."""
    if function is None:
        return None
    return _built_from(facts, name, function)


def _built_from(
    facts: "ScriptFacts", name: str, function: Optional[cst.FunctionDef]
) -> Optional[str]:
    """The class of this file whose one call binds `name` in `function`'s own scope (None:
    module level), when that is its one binding there."""
    bindings = facts.assignments_in_scope(name, function)
    if len(bindings) != 1:
        return None
    (binding,) = bindings
    value = binding.value
    if (
        binding.unpacked
        or binding.augmented
        or not isinstance(value, cst.Call)
        or not isinstance(value.func, cst.Name)
        or value.func.value not in facts.classes
    ):
        return None
    return value.func.value


def _meter_class(facts: "ScriptFacts", owner: str, update: str) -> _MeterClass:
    memo = facts.memo("meter_classes")
    key = (owner, update)
    if key not in memo:
        memo[key] = _read_meter_class(facts, owner, update)
    return memo[key]


def _read_meter_class(facts: "ScriptFacts", owner: str, update: str) -> _MeterClass:
    info = facts.classes[owner]
    methods: Dict[str, cst.FunctionDef] = {
        s.name.value: s for s in info.node.body.body if isinstance(s, cst.FunctionDef)
    }

    def refused(why: str) -> _MeterClass:
        return _MeterClass(frozenset(), frozenset(), f"`{owner}.{update}` {why}")

    if any(base not in ("object", "builtins.object") for base in info.bases):
        return refused("belongs to a class with bases, whose code is not read")
    function = methods.get(update)
    params = function.params.params if function is not None else ()
    if function is None or len(params) < 2 or isinstance(function.params.star_arg, cst.Param):
        return refused("is not a method taking the value as its first argument")
    value = params[1].name.value
    fed: Set[str] = set()
    for use in name_uses(function, value):
        if use.node is params[1].name:
            continue
        if use.store or use.nested:
            return refused(f"binds `{value}` again or reads it in a nested scope")
        target = _fed_attribute(facts, use.node)
        if target is None:
            return refused(f"does more with `{value}` than store it or arithmetic of it")
        fed.add(target)
    if not fed:
        return refused(f"does not store `{value}`")
    # What the class computes from those attributes is fed as well (`self.avg = self.sum /
    # self.count`); every other read of them is unsafe for a tensor, but formatting.
    changed = True
    while changed:
        changed = False
        for method in methods.values():
            for read in _self_reads(method, fed):
                target = _fed_attribute(facts, read)
                if target is not None and target not in fed:
                    fed.add(target)
                    changed = True
    unsafe = set()
    for name, method in methods.items():
        for read in _self_reads(method, fed):
            if _fed_attribute(facts, read) is None:
                unsafe.add(name)
        for attribute in find_all(method.body, cst.Attribute):
            if attribute.attr.value == "__dict__" and not _formats_dict(facts, attribute):
                unsafe.add(name)
    if update in unsafe:
        return refused("reads what it stores otherwise than by arithmetic")
    return _MeterClass(frozenset(fed), frozenset(unsafe), None)


def _self_reads(method: cst.FunctionDef, attributes: Set[str]) -> List[cst.Attribute]:
    return [a for a in find_all(method.body, cst.Attribute) if _is_self_read(a, attributes)]


def _is_self_read(node: cst.CSTNode, attributes: Set[str]) -> bool:
    return (
        isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Name)
        and node.value.value == "self"
        and node.attr.value in attributes
    )


def _fed_attribute(facts: "ScriptFacts", node: cst.CSTNode) -> Optional[str]:
    """The attribute `self.X` that `node` (the value, or a read of a fed attribute) feeds:
    `self.X = node`, `self.X += node * n`, `self.X = self.sum / self.count`, or `self.X`
    itself where it is stored or updated by arithmetic; None when the value goes anywhere
    else (a call, a comparison, a container, a return)."""
    parents = facts.parents
    current = node
    parent = parents.get(current)
    if isinstance(parent, cst.AssignTarget) and isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(parent, cst.AugAssign) and parent.target is node:
        arithmetic = isinstance(parent.operator, ARITHMETIC_ASSIGN)
        return node.attr.value if arithmetic and isinstance(node, cst.Attribute) else None
    while isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, ARITHMETIC):
        current, parent = parent, parents.get(parent)
    if isinstance(parent, cst.Assign) and parent.value is current and len(parent.targets) == 1:
        target = parent.targets[0].target
    elif (
        isinstance(parent, cst.AugAssign)
        and parent.value is current
        and isinstance(parent.operator, ARITHMETIC_ASSIGN)
    ):
        target = parent.target
    else:
        return None
    if not (
        isinstance(target, cst.Attribute)
        and isinstance(target.value, cst.Name)
        and target.value.value == "self"
    ):
        return None
    return target.attr.value


def _formats_dict(facts: "ScriptFacts", attribute: cst.Attribute) -> bool:
    """`self.__dict__` only unpacked into `str.format` (`fmtstr.format(**self.__dict__)`):
    each 0-dim tensor among the values formats as its `.item()` does."""
    parents = facts.parents
    arg = parents.get(attribute)
    call = parents.get(arg)
    return (
        isinstance(attribute.value, cst.Name)
        and attribute.value.value == "self"
        and isinstance(arg, cst.Arg)
        and arg.star == "**"
        and isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "format"
    )


def _instance_escapes(
    facts: "ScriptFacts",
    meter: str,
    function: cst.FunctionDef,
    owner: str,
    info: _MeterClass,
) -> Optional[str]:
    """Why the meter may reach code that reads its values otherwise than by formatting: a
    use in its function other than calling a formatting method of its class, or being an
    element of a list passed to a class of this file (`ProgressMeter(n, [losses, top1])`)."""
    parents = facts.parents
    for use in name_uses(function, meter, facts):
        if use.store:
            continue
        parent = parents.get(use.node)
        if isinstance(parent, cst.Attribute) and parent.value is use.node:
            attribute = parent.attr.value
            if isinstance(parents.get(parent), cst.Call):
                if attribute in info.unsafe_methods:
                    return f"`{meter}.{attribute}()` reads its values otherwise than by formatting"
                continue
            if attribute in info.fed or attribute == "__dict__":
                return f"`{meter}.{attribute}` is read as a number, which a tensor is not"
            continue
        element = parent if isinstance(parent, cst.Element) else None
        container = parents.get(element) if element is not None else None
        arg = parents.get(container) if isinstance(container, (cst.List, cst.Tuple)) else None
        call = parents.get(arg) if isinstance(arg, cst.Arg) else None
        if (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Name)
            and call.func.value in facts.classes
        ):
            reason = _holder_reads(facts, call.func.value, owner, info)
            if reason is None:
                continue
            return reason
        return f"`{meter}` is used otherwise (`{excerpt(parent or use.node, 40)}`)"
    return None


def _holder_reads(
    facts: "ScriptFacts", holder: str, owner: str, info: _MeterClass
) -> Optional[str]:
    """Why a class holding a list of meters (`ProgressMeter`) may read their values otherwise
    than by formatting: each element it takes from its attributes must only go to `str()`
    or to a formatting method of the meter's class."""
    parents = facts.parents
    for loop_target in find_all(facts.classes[holder].node.body, cst.CompFor, cst.For):
        target = loop_target.target
        if not isinstance(target, cst.Name):
            continue
        scope = parents.get(loop_target) if isinstance(loop_target, cst.CompFor) else loop_target
        for name in find_all(scope, cst.Name):
            if name.value != target.value or name is target:
                continue
            parent = parents.get(name)
            if isinstance(parent, cst.Arg):
                call = parents.get(parent)
                if isinstance(call, cst.Call) and _is_builtin(facts, call.func, "str"):
                    continue
            if isinstance(parent, cst.Attribute) and isinstance(parents.get(parent), cst.Call):
                if parent.attr.value not in info.unsafe_methods:
                    continue
            return f"`{holder}` reads the meters it holds otherwise (`{excerpt(parent, 40)}`)"
    for attribute in find_all(facts.classes[holder].node.body, cst.Attribute):
        if attribute.attr.value in info.fed:
            return f"`{holder}` reads `.{attribute.attr.value}` of an object"
    return None


def _is_builtin(facts: "ScriptFacts", func: cst.BaseExpression, name: str) -> bool:
    return isinstance(func, cst.Name) and func.value == name and not facts.imports.is_bound(name)


def _attributes_read_elsewhere(
    facts: "ScriptFacts",
    meter: str,
    function: cst.FunctionDef,
    owner: str,
    info: _MeterClass,
) -> Optional[str]:
    """Why another part of the file may read this meter's values otherwise than by
    formatting: a read of a fed attribute (`x.avg`), or a call of a method that reads them
    (`x.all_reduce()`), on anything but `self` in the class or a name bound in its own
    function only to another instance (`top1 = AverageMeter(...)` in `validate`)."""
    own = facts.classes[owner].node
    inside = {id(a) for a in find_all(own, cst.Attribute)}
    parents = facts.parents
    for attribute in find_all(facts.module, cst.Attribute):
        name = attribute.attr.value
        if id(attribute) in inside or not (
            name in info.fed or name in info.unsafe_methods or name == "__dict__"
        ):
            continue
        call = parents.get(attribute)
        if name in info.fed and isinstance(call, cst.Call) and call.func is attribute:
            continue  # `x.sum(0)`: a method; the meter's `sum` is a number in either case
        receiver = attribute.value
        if isinstance(receiver, cst.Name) and facts.imports.target_of(receiver.value):
            continue  # an imported name's attribute (`models.__dict__`)
        if isinstance(receiver, cst.Name):
            scope = facts.enclosing_function(attribute)
            other = scope is not function or receiver.value != meter
            if other and _built_from(facts, receiver.value, scope) == owner:
                continue
        return f"`{excerpt(attribute, 40)}` may read the meter's value as a float"
    return None

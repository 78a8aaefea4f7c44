"""Hand-written optimizer updates: Python loops over a model's parameters that change each one
in place (`p.add_(g, alpha=-lr)`, `p.data -= lr * p.grad`) every training step (OPT503).

A loop counts as running every step when it sits inside a training loop (one that calls
backward), in the `step` method of an optimizer class of this file (a subclass of a
`torch.optim` class), or in a function of this file that a training loop calls by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import callee_name, positional
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.collect import CallSite, Loop
    from optimizer_codemod.analysis.script import ScriptFacts

# In-place arithmetic that updates a tensor's values (not `requires_grad_`, `share_memory_`).
INPLACE_UPDATES = frozenset(
    {
        "add_",
        "sub_",
        "mul_",
        "div_",
        "addcmul_",
        "addcdiv_",
        "lerp_",
        "copy_",
        "clamp_",
        "clamp_min_",
        "clamp_max_",
        "neg_",
        "sqrt_",
        "pow_",
        "sign_",
        "zero_",
        "fill_",
    }
)
PARAMETER_METHODS = frozenset({"parameters", "named_parameters"})
COMPILE = ("torch.compile",)
FOREACH_PREFIX = "torch._foreach_"


@dataclass(frozen=True)
class ParameterUpdateLoop:
    loop: "Loop"
    parameter: str  # the loop variable that holds each parameter
    updates: Tuple[cst.CSTNode, ...]  # the in-place calls and augmented assignments
    why: str  # why it runs every step: "in the training loop", "in `SGLD.step`"
    function: Optional[cst.FunctionDef]


def parameter_update_loops(facts: "ScriptFacts") -> List[ParameterUpdateLoop]:
    """Every loop over parameters that updates them in place and runs every training step."""
    memo = facts.memo("parameter_update_loops")
    if "found" in memo:
        return memo["found"]
    found: List[ParameterUpdateLoop] = []
    if facts.trains:
        per_step = _per_step_functions(facts)
        training = {id(loop) for loop in facts.training_loops}
        for loop in facts.records.loops:
            if not isinstance(loop.node, cst.For) or not _iterates_parameters(facts, loop):
                continue
            why = _why_every_step(loop, training, per_step)
            if why is None:
                continue
            for parameter in loop.targets:
                updates = _updates(facts, loop, parameter)
                if updates:
                    found.append(ParameterUpdateLoop(loop, parameter, updates, why, loop.function))
                    break
    memo["found"] = found
    return found


def compiled_by(facts: "ScriptFacts", update: ParameterUpdateLoop) -> Optional[cst.CSTNode]:
    """The `torch.compile` that compiles the loop's function: a decorator, or a call whose
    argument names it (`torch.compile(optimizer.step)`, `torch.compile(update)`)."""
    function = update.function
    if function is None:
        return None
    for decorator in function.decorators:
        expr = decorator.decorator
        expr = expr.func if isinstance(expr, cst.Call) else expr
        if facts.qualified_name(expr) in COMPILE:
            return decorator
    name = function.name.value
    for call in facts.calls_to(*COMPILE):
        args = positional(call.node)
        target = dotted_name(args[0].value) if args else None
        if target is not None and target.split(".")[-1] == name:
            return call.node
    return None


def reads_gradient(update: ParameterUpdateLoop) -> bool:
    """The update reads its parameter's gradient (`p.grad`, `p.grad.data`): a training step's
    update, not a clamp or a re-initialisation of the weights."""
    body = update.loop.node.body
    return any(
        node.attr.value == "grad"
        and dotted_name(node.value) in (update.parameter, f"{update.parameter}.data")
        for node in find_all(body, cst.Attribute)
    )


def iterated_parameter_calls(facts: "ScriptFacts", update: ParameterUpdateLoop) -> List["CallSite"]:
    """The `model.parameters()`/`named_parameters()` calls whose tensors the update loop
    iterates: in its header, or bound to a name it iterates (`params = list(model.parameters())`,
    every binding of the name). Empty for `group["params"]` of an optimizer."""
    found: List[cst.Call] = []
    iterated = update.loop.iter
    if iterated is None:
        return []
    found.extend(_parameter_calls(iterated))
    for node in find_all(iterated, cst.Name, cst.Attribute):
        name = dotted_name(node)
        values = [a.value for a in facts.assignments_to(name) if not a.unpacked] if name else []
        if values and all(_parameter_expression(v) for v in values):
            found.extend(call for value in values for call in _parameter_calls(value))
    sites = [facts.call_site_of.get(call) for call in found]
    return [site for site in sites if site is not None]


def _parameter_calls(node: cst.BaseExpression) -> List[cst.Call]:
    return [
        call
        for call in find_all(node, cst.Call)
        if callee_name(call) in PARAMETER_METHODS and isinstance(call.func, cst.Attribute)
    ]


def _iterates_parameters(facts: "ScriptFacts", loop: "Loop") -> bool:
    """`model.parameters()`, `named_parameters()`, `group["params"]`, or a name bound to one
    of those, possibly under `enumerate`/`zip`/`list`."""
    if loop.iter is None:
        return False
    if _parameter_expression(loop.iter):
        return True
    for node in find_all(loop.iter, cst.Name, cst.Attribute):
        name = dotted_name(node)
        if name is None:
            continue
        values = [a.value for a in facts.assignments_to(name) if not a.unpacked]
        if values and all(_parameter_expression(v) for v in values):
            return True
    return False


def _parameter_expression(node: cst.BaseExpression) -> bool:
    if _parameter_calls(node):
        return True
    for subscript in find_all(node, cst.Subscript):
        for element in subscript.slice:
            index = getattr(element.slice, "value", None)
            if isinstance(index, cst.SimpleString) and index.evaluated_value == "params":
                return True
    return False


def _updates(facts: "ScriptFacts", loop: "Loop", parameter: str) -> Tuple[cst.CSTNode, ...]:
    """The in-place updates of `parameter` (or its `.data`) in the loop's body."""
    names = {parameter, parameter + ".data"}
    keys = set(loop.targets) - {parameter}
    found: List[cst.CSTNode] = []
    for call in facts.loop_calls(loop):
        if call.method not in INPLACE_UPDATES:
            continue
        updated = _updated(call.node)
        if updated is None:
            continue
        if dotted_name(updated) in names or _keyed_parameter(facts, updated, keys):
            found.append(call.node)
        elif (call.qualname or "").startswith(FOREACH_PREFIX):
            return ()
    for assignment in facts.assignments_in(loop):
        if assignment.target in names and (
            assignment.augmented or assignment.target.endswith(".data")
        ):
            found.append(assignment.statement_node)
    return tuple(found)


def _updated(call: cst.Call) -> Optional[cst.BaseExpression]:
    """The tensor an in-place call changes: `p` in `p.mul_(d).add_(g)` (both calls)."""
    node: cst.BaseExpression = call
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        if callee_name(node) not in INPLACE_UPDATES:
            return None
        node = node.func.value
    return node


def _keyed_parameter(facts: "ScriptFacts", node: cst.BaseExpression, keys: Set[str]) -> bool:
    """`ema_params[name]` with `name` a loop variable (not the parameter's) and
    `ema_params` bound only to parameters by name (`OrderedDict(ema.named_parameters())`):
    another model's parameter, updated together with the loop's own (an EMA)."""
    if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
        return False
    index = getattr(node.slice[0].slice, "value", None)
    if not isinstance(index, cst.Name) or index.value not in keys:
        return False
    name = dotted_name(node.value)
    values = [a.value for a in facts.assignments_to(name) if not a.unpacked] if name else []
    return bool(values) and all(_parameter_dict(v) for v in values)


def _parameter_dict(node: cst.BaseExpression) -> bool:
    """`dict(m.named_parameters())` or `OrderedDict(m.named_parameters())`: the parameters
    themselves, by name (not a dict of tensors made from them)."""
    if not isinstance(node, cst.Call) or callee_name(node) not in ("dict", "OrderedDict"):
        return False
    args = positional(node)
    return (
        len(node.args) == 1
        and len(args) == 1
        and isinstance(args[0].value, cst.Call)
        and callee_name(args[0].value) == "named_parameters"
        and isinstance(args[0].value.func, cst.Attribute)
    )


def _why_every_step(loop: "Loop", training: Set[int], per_step: Dict[int, str]) -> Optional[str]:
    if any(id(outer) in training for outer in loop.ancestors):
        return "inside the training loop"
    if loop.function is not None:
        return per_step.get(id(loop.function))
    return None


def _per_step_functions(facts: "ScriptFacts") -> Dict[int, str]:
    """Functions whose body runs every step, with why: `step` of an optimizer class of this
    file, and functions of this file called by name in a training loop."""
    found: Dict[int, str] = {}
    for name, info in facts.classes.items():
        if not any((base or "").startswith("torch.optim.") for base in info.bases):
            continue
        for statement in getattr(info.node.body, "body", ()):
            if isinstance(statement, cst.FunctionDef) and statement.name.value == "step":
                found[id(statement)] = f"in `{name}.step`, run every training step"
    called: Set[str] = set()
    for loop in facts.training_loops:
        for call in facts.loop_calls(loop):
            name = callee_name(call.node)
            if name is not None:
                called.add(name)
    for name in called:
        function = facts.records.functions.get(name)
        if function is not None and id(function) not in found:
            found[id(function)] = f"in `{name}`, which the training loop calls"
    return found

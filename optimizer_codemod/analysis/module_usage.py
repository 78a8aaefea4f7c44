"""Whether a module class of this file uses, on every call of its `forward`, every submodule and
parameter its `__init__` registers: then each of its parameters is in the autograd graph of the
output, and DistributedDataParallel needs no search for unused parameters (OPT603). Short of
that, whether every call uses the same ones: then DDP's `static_graph=True` can find the unused
ones once, in the first iteration, instead of searching every iteration.

The answer is a proof or a reason: a class whose `__init__` or `forward` does something the
analysis does not follow (branches, early returns, indexing into a `ModuleList`, a base class
other than `nn.Module`, a submodule built by a function of another file) gets a sentence saying
what, never a guess.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import callee_name, excerpt, receiver
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.training import DATA_PARALLEL_WRAPPERS
from optimizer_codemod.analysis.values import Source, value_sources

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

MAX_DEPTH = 4
MODULE_BASE = "torch.nn.Module"
PARAMETER = ("torch.nn.Parameter", "torch.nn.parameter.Parameter")
# Containers whose members are used only when the container is called or iterated whole.
CONTAINERS = frozenset(
    f"torch.nn.{name}"
    for name in ("ModuleList", "ModuleDict", "Sequential", "ParameterList", "ParameterDict")
)
CALLED_WHOLE = frozenset({"torch.nn.Sequential"})
# Calls that may appear in the arguments of a submodule without building one.
HARMLESS_BUILTINS = frozenset({"range", "len", "int", "float", "min", "max", "list", "tuple"})
# Calls that wrap a module and keep its parameters: `model = DDP(model)`.
WRAPPERS = DATA_PARALLEL_WRAPPERS | {"torch.compile"}
# Methods that return the module they are called on.
MODULE_RETURNING = frozenset({"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "train"})
# Nodes that make a statement of `forward` run only sometimes, or cut a value off the graph.
BRANCHING = (
    cst.If,
    cst.IfExp,
    cst.While,
    cst.Try,
    cst.Break,
    cst.Continue,
    cst.BooleanOperation,
    cst.With,
    cst.Lambda,
    cst.FunctionDef,
    cst.ClassDef,
    cst.Yield,
    cst.Await,
)
DETACHING = frozenset({"detach", "detach_", "requires_grad_", "no_grad", "inference_mode"})


def built_class(
    facts: "ScriptFacts",
    node: cst.BaseExpression,
    function: Optional[cst.CSTNode] = None,
    depth: int = 0,
) -> Optional[str]:
    """The class of this file that `node`, read in `function`, builds: `Net(...)`,
    `Net(...).to(device)`, or a name every (non self-rebinding) assignment of which builds the
    same class. `self.X` and parameters are followed in their scope (values.value_sources:
    `self.model = model.to(device)` in `Trainer.__init__`, called once as `Trainer(Net(),
    ...)`); other names, file-wide."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(node, cst.Call):
        if isinstance(node.func, cst.Name) and node.func.value in facts.classes:
            return node.func.value
        if callee_name(node) in MODULE_RETURNING and isinstance(node.func, cst.Attribute):
            inner = receiver(node)
            return built_class(facts, inner, function, depth + 1) if inner is not None else None
        return None
    name = dotted_name(node)
    if name is None:
        return None
    sources = value_sources(facts, name, function)
    if sources is None:
        sources = [Source(a.value, a.site.function, a) for a in facts.assignments_to(name)]
    found: Set[Optional[str]] = set()
    for source in sources:
        assignment, value = source.assignment, source.value
        if assignment is not None and (assignment.unpacked or assignment.augmented):
            return None
        if assignment is not None and (_rebinds(value, name) or _wraps(facts, value, name)):
            continue
        found.add(built_class(facts, value, source.function, depth + 1))
    return found.pop() if len(found) == 1 else None


def _wraps(facts: "ScriptFacts", value: cst.BaseExpression, name: str) -> bool:
    """`model = DDP(model, ...)`, `model = torch.compile(model)`: the same parameters."""
    if not isinstance(value, cst.Call):
        return False
    qualname = facts.qualified_name(value.func) or ""
    args = [a for a in value.args if a.keyword is None and not a.star]
    return qualname in WRAPPERS and bool(args) and dotted_name(args[0].value) == name


def _rebinds(value: cst.BaseExpression, name: str) -> bool:
    """`model = model.to(device)`: a placement of the same module."""
    while isinstance(value, cst.Call) and callee_name(value) in MODULE_RETURNING:
        inner = receiver(value)
        if inner is None:
            return False
        if dotted_name(inner) == name:
            return True
        value = inner
    return False


def why_parameters_may_go_unused(facts: "ScriptFacts", class_name: str) -> Optional[str]:
    """None when every parameter an instance of `class_name` registers is used by each call of
    its `forward` (submodules of this file checked in turn); else the reason it may not be."""
    return _why_not_used(facts, class_name, every=True, depth=0)


def why_used_parameters_may_change(facts: "ScriptFacts", class_name: str) -> Optional[str]:
    """None when each call of `forward` on an instance of `class_name` uses the same parameters
    (straight-line code: some registered ones may stay unused, always the same); else the
    reason the set may change from one call to the next."""
    return _why_not_used(facts, class_name, every=False, depth=0)


def _why_not_used(facts: "ScriptFacts", class_name: str, every: bool, depth: int) -> Optional[str]:
    if depth > MAX_DEPTH:
        return f"`{class_name}` nests modules deeper than the analysis follows"
    info = facts.classes.get(class_name)
    if info is None:
        return f"`{class_name}` is not a class of this file"
    if list(info.bases) != [MODULE_BASE]:
        bases = ", ".join(f"`{b}`" for b in info.bases if b) or "nothing"
        return (
            f"`{class_name}` derives from {bases}, not from `nn.Module` alone: inherited "
            "parameters are not followed"
        )
    methods = {
        statement.name.value: statement
        for statement in _body(info.node)
        if isinstance(statement, cst.FunctionDef)
    }
    init, forward = methods.get("__init__"), methods.get("forward")
    if forward is None:
        return f"`{class_name}` defines no `forward` of its own"
    registered, reason = _registered(facts, class_name, init)
    if reason is not None:
        return reason
    bodies, reason = _forward_bodies(class_name, forward, methods)
    if reason is not None:
        return reason
    used, indexed = _self_uses(bodies)
    for attribute, kind, classes in registered:
        if attribute not in used:
            if not every:
                continue  # never used, on any call
            return (
                f"`{class_name}.forward` does not use `self.{attribute}`, which `__init__` "
                "registers: its parameters would get no gradient"
            )
        if attribute in indexed:  # a ModuleList, or a Sequential (`self.layers[0]`)
            return (
                f"`{class_name}.forward` indexes `self.{attribute}`: the members it does not "
                "pick would get no gradient"
                if every
                else f"`{class_name}.forward` indexes `self.{attribute}`: the members it picks "
                "may change from call to call"
            )
        for inner in classes:
            reason = _why_not_used(facts, inner, every, depth + 1)
            if reason is not None:
                return reason
    return None


def _body(node: cst.CSTNode) -> List[cst.BaseStatement]:
    body = getattr(node, "body", None)
    return list(getattr(body, "body", ()) or ())


def _registered(
    facts: "ScriptFacts", class_name: str, init: Optional[cst.FunctionDef]
) -> Tuple[List[Tuple[str, str, List[str]]], Optional[str]]:
    """(attribute, kind, classes of this file it builds) for each `self.X = ...` of `__init__`
    that may hold parameters; kind is "module", "container" or "value"."""
    found: List[Tuple[str, str, List[str]]] = []
    if init is None:
        return found, None
    for statement in _body(init):
        if not isinstance(statement, cst.SimpleStatementLine):
            return found, (
                f"`{class_name}.__init__` registers modules under control flow, which the "
                "analysis does not follow"
            )
        for small in statement.body:
            if isinstance(small, cst.Expr) and (
                _is_super_init(small.value) or _registers_no_parameter(facts, small.value)
            ):
                continue
            if isinstance(small, (cst.Assign, cst.AnnAssign)):
                targets = (
                    [t.target for t in small.targets]
                    if isinstance(small, cst.Assign)
                    else [small.target]
                )
                names = [dotted_name(t) for t in targets]
                if all(n is not None and "." not in n for n in names):
                    continue  # a local variable
                if len(names) != 1 or not (names[0] or "").startswith("self."):
                    return found, f"`{class_name}.__init__` assigns `{_code(small)}`"
                attribute = names[0][len("self.") :]
                if "." in attribute or small.value is None:
                    return found, f"`{class_name}.__init__` assigns `{_code(small)}`"
                kind, classes, reason = _kind(facts, small.value)
                if kind == "value" and _plain_parameter(init, small.value):
                    continue
                if reason is not None:
                    return found, f"`self.{attribute}` in `{class_name}.__init__`: {reason}"
                if kind is not None:
                    found.append((attribute, kind, classes))
                continue
            if isinstance(small, (cst.Pass, cst.Expr)) and not find_all(small, cst.Call):
                continue  # a docstring, `pass`
            return found, (
                f"`{class_name}.__init__` runs `{_code(small)}`, which may register "
                "parameters the analysis does not see"
            )
    return found, None


PLAIN_ANNOTATIONS = frozenset({"int", "float", "bool", "str"})


def _plain_parameter(init: cst.FunctionDef, value: cst.BaseExpression) -> bool:
    """`value` is a parameter of `__init__` annotated as a number or string, or defaulting to
    a literal number, string, bool or None: `self.heads = heads`, which holds no module."""
    if not isinstance(value, cst.Name):
        return False
    params = init.params
    for param in (*params.posonly_params, *params.params, *params.kwonly_params):
        if param.name.value != value.value:
            continue
        annotation = param.annotation.annotation if param.annotation else None
        if isinstance(annotation, cst.Name) and annotation.value in PLAIN_ANNOTATIONS:
            return True
        default = param.default
        if isinstance(default, cst.UnaryOperation):
            default = default.expression
        return isinstance(default, (cst.Integer, cst.Float, cst.SimpleString)) or (
            isinstance(default, cst.Name) and default.value in ("True", "False", "None")
        )
    return False


# Calls in `__init__` that register no parameter: buffers, and initialisation of the weights
# already registered.
NO_PARAMETER_METHODS = frozenset({"register_buffer", "apply", "reset_parameters"})


def _registers_no_parameter(facts: "ScriptFacts", node: cst.BaseExpression) -> bool:
    if not isinstance(node, cst.Call):
        return False
    if (facts.qualified_name(node.func) or "").startswith("torch.nn.init."):
        return True
    target = dotted_name(node.func)
    return (
        target is not None
        and target.startswith("self.")
        and (target[len("self.") :] in NO_PARAMETER_METHODS)
    )


def _is_super_init(node: cst.BaseExpression) -> bool:
    return (
        isinstance(node, cst.Call)
        and callee_name(node) == "__init__"
        and isinstance(receiver(node), cst.Call)
        and callee_name(receiver(node)) == "super"
    )


def _kind(
    facts: "ScriptFacts", value: cst.BaseExpression
) -> Tuple[Optional[str], List[str], Optional[str]]:
    """What an attribute's value holds: (kind or None for a plain value, classes of this file
    it builds, reason the analysis cannot tell)."""
    calls = find_all(value, cst.Call)
    if not calls:
        # Numbers and arithmetic hold no parameters; a bare name may hold a module passed in.
        if isinstance(value, (cst.Name, cst.Attribute)):
            return "value", [], None
        return None, [], None
    if not isinstance(value, cst.Call):
        return None, [], "its value is an expression holding calls, not a module built here"
    qualname = facts.qualified_name(value.func) or ""
    classes: List[str] = []
    for call in calls:
        inner = facts.qualified_name(call.func) or ""
        if isinstance(call.func, cst.Name) and call.func.value in facts.classes:
            classes.append(call.func.value)
        elif inner.startswith("torch.nn.") or inner in PARAMETER:
            continue
        elif call is value:
            if inner.startswith("torch."):
                return None, [], None  # a plain tensor: not a parameter
            return None, [], f"`{_code(call.func)}` may build a module the analysis cannot see"
        elif isinstance(call.func, cst.Name) and call.func.value in HARMLESS_BUILTINS:
            continue
        elif inner.startswith("torch.") and not inner.startswith("torch.nn."):
            continue
        else:
            return None, [], f"`{_code(call.func)}` may build a module the analysis cannot see"
    kind = "container" if qualname in CONTAINERS and qualname not in CALLED_WHOLE else "module"
    return kind, classes, None


def _forward_bodies(
    class_name: str, forward: cst.FunctionDef, methods: dict
) -> Tuple[List[cst.FunctionDef], Optional[str]]:
    """`forward` and the methods of the class it calls (`self.encode(x)`), each straight-line:
    no branch, early return or detaching call that could leave a parameter out of the graph."""
    bodies: List[cst.FunctionDef] = []
    pending = [forward]
    while pending:
        function = pending.pop()
        if function in bodies:
            continue
        bodies.append(function)
        if len(bodies) > MAX_DEPTH * 4:
            return bodies, f"`{class_name}.forward` calls more methods than the analysis follows"
        where = f"`{class_name}.{function.name.value}`"
        statements = _body(function)
        for node in find_all(function.body, *BRANCHING):
            return bodies, f"{where} has `{_first_line(node)}`: a parameter may be skipped"
        returns = find_all(function.body, cst.Return)
        if any(r is not _last_return(statements) for r in returns):
            return bodies, f"{where} returns early: a parameter may be skipped"
        for r in returns:
            if isinstance(r.value, (cst.Tuple, cst.List, cst.Dict, cst.Set)):
                return bodies, (
                    f"{where} returns several values: a loss that uses some of them leaves "
                    "the parameters of the others without gradients"
                )
        for call in find_all(function.body, cst.Call):
            name = callee_name(call)
            if name in DETACHING or name in ("getattr", "setattr"):
                return bodies, f"{where} calls `{name}`"
            target = dotted_name(call.func)
            if target and target.startswith("self.") and target[5:] in methods:
                pending.append(methods[target[5:]])
        for loop in find_all(function.body, cst.For):
            iterated = dotted_name(loop.iter)
            if iterated is None or not iterated.startswith("self."):
                return bodies, f"{where} loops over `{_code(loop.iter)}`, not a module's members"
    return bodies, None


def _last_return(statements: List[cst.BaseStatement]) -> Optional[cst.Return]:
    if not statements or not isinstance(statements[-1], cst.SimpleStatementLine):
        return None
    last = statements[-1].body[-1]
    return last if isinstance(last, cst.Return) else None


def _self_uses(bodies: List[cst.FunctionDef]) -> Tuple[Set[str], Set[str]]:
    """(attributes of self read in the bodies, attributes read through a subscript)."""
    used: Set[str] = set()
    indexed: Set[str] = set()
    for function in bodies:
        for node in find_all(function.body, cst.Attribute):
            if isinstance(node.value, cst.Name) and node.value.value == "self":
                used.add(node.attr.value)
        for node in find_all(function.body, cst.Subscript):
            name = dotted_name(node.value)
            if name and name.startswith("self.") and "." not in name[5:]:
                indexed.add(name[5:])
    return used, indexed


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node).strip()


def _first_line(node: cst.CSTNode) -> str:
    line = _code(node).splitlines()[0].rstrip(":").strip()
    return line if len(line) <= 40 else line[:37] + "..."


def why_training_may_change_used_parameters(facts: "ScriptFacts") -> Optional[str]:
    """None when nothing in the script changes, between iterations, which parameters a DDP
    model trains: no `requires_grad` switched (freezing or unfreezing), no `no_sync()`
    accumulation. Else the reason, naming the first such line."""
    for site in facts.method_calls("no_sync"):
        return (
            f"it accumulates gradients under `{excerpt(site.node)}`, which "
            "`static_graph=True` does not support (torch 2.13 stops with an internal assert; "
            "pytorch/pytorch#143580)"
        )
    switches = [
        (site.site.order, site.site.statement or site.node)
        for site in facts.method_calls("requires_grad_")
    ]
    switches += [
        (a.site.order, a.site.statement or a.statement_node)
        for a in facts.records.assignments
        if a.target.rsplit(".", 1)[-1] in ("requires_grad", "require_backward_grad_sync")
        and "." in a.target
    ]
    if switches:
        first = min(switches, key=lambda item: item[0])[1]
        return (
            f"it switches which parameters train (`{excerpt(first)}`): a frozen or unfrozen "
            "parameter changes the set DDP recorded in the first iteration"
        )
    return None

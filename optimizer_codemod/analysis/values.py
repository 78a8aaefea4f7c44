"""What a name holds where it is read: `self.` attributes of the reading method's class, and
function parameters bound at their one call site in this file.

The name-following answers of the other modules look names up file-wide
(`facts.assignments_to`). A training loop in a class (`for x, y in self.loader:` with
`self.model(x)`) or in a function (`def train(model, loader, optimizer, device)`) reads
values bound elsewhere: in `__init__`, or by the caller. This module answers, for one scope:

- `attribute_assignments(facts, class_name, "self.model")`: the `self.model = ...`
  assignments in the methods of that class only (another class's `self.model` is another
  object);
- `parameter_binding(facts, function, "model")`: the argument passed for that parameter at
  the function's single call site (`train(net, loader, ...)`, or `Trainer(net, ds)` for
  `Trainer.__init__`), or the variable every one of its calls passes from their one scope,
  with the caller's scope; None when there are no calls, calls that disagree, or the
  function is used some other way (passed around, stored);
- `value_sources(facts, name, function)`: the expressions (each with the scope it is
  evaluated in) that give `name` its value where `function` reads it. A parameter that no
  call of this file binds is answered from the calls other modules of the run make
  (`facts.project`, from the project index, project.py): `outside_argument` binds it there,
  and its value is a placeholder node that `outside_value` turns back into the caller's
  summary of the argument (an nn.Module, a kind of dataset). Code that does not ask reads
  the placeholder as an unknown expression.

Every table is built once per pass (`facts.memo`), so each question costs its answer's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Collection, Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import has_double_star, has_star_args, keyword, positional
from optimizer_codemod.analysis.collect import names_bound_otherwise
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.collect import Assignment, CallSite
    from optimizer_codemod.analysis.project import (
        Argument,
        ImportedDataset,
        ImportedLoader,
        ImportedRegistry,
        IncomingCall,
    )
    from optimizer_codemod.analysis.script import ScriptFacts

SELF = "self"


@dataclass(frozen=True)
class Source:
    """An expression that gives a name its value, and the function it is evaluated in (None:
    module level)."""

    value: cst.BaseExpression
    function: Optional[cst.FunctionDef]
    assignment: Optional["Assignment"] = None  # None for an argument at a call site


# Methods and classes ----------------------------------------------------------------------
def method_class(facts: "ScriptFacts", function: Optional[cst.CSTNode]) -> Optional[str]:
    """The class of this file whose body defines `function` directly, when its first
    parameter is `self`."""
    if not isinstance(function, cst.FunctionDef):
        return None
    memo = facts.memo("method_class")
    if "table" not in memo:
        table: Dict[int, str] = {}
        for name, info in facts.classes.items():
            for statement in info.node.body.body:
                if isinstance(statement, cst.FunctionDef):
                    table[id(statement)] = name
        memo["table"] = table
    owner = memo["table"].get(id(function))
    params = function.params.posonly_params or function.params.params
    if owner is None or not params or params[0].name.value != SELF:
        return None
    return owner


def standalone_class(facts: "ScriptFacts", class_name: str) -> bool:
    """No class of this file derives from `class_name`, nor it from one: its methods' `self`
    is an instance of this class only, so `self.X` is set by this class's methods only (a
    subclass's method may set it, or an inherited method read the subclass's)."""
    memo = facts.memo("class_family")
    if "related" not in memo:
        related = set()
        for name, info in facts.classes.items():
            bases = {base for base in info.bases if base in facts.classes}
            if bases:
                related.add(name)
                related.update(bases)
        memo["related"] = related
    return class_name in facts.classes and class_name not in memo["related"]


def attribute_assignments(
    facts: "ScriptFacts", class_name: str, target: str
) -> Sequence["Assignment"]:
    """`self.X = ...` (target "self.X") in the methods of `class_name` (not in nested
    functions or other classes)."""
    memo = facts.memo("attribute_assignments")
    if "table" not in memo:
        table: Dict[Tuple[str, str], List["Assignment"]] = {}
        for assignment in facts.records.assignments:
            if not assignment.target.startswith(SELF + "."):
                continue
            owner = method_class(facts, assignment.site.function)
            if owner is not None:
                table.setdefault((owner, assignment.target), []).append(assignment)
        memo["table"] = table
    return memo["table"].get((class_name, target), ())


def self_attribute_elsewhere(facts: "ScriptFacts", target: str) -> bool:
    """`target` ("self.X") is assigned somewhere that is not a method of a class of this file
    (a nested function, a function taking `self` as a plain parameter)."""
    memo = facts.memo("self_attribute_elsewhere")
    if target not in memo:
        memo[target] = any(
            method_class(facts, a.site.function) is None for a in facts.assignments_to(target)
        )
    return memo[target]


def _module_functions(facts: "ScriptFacts") -> set:
    """ids of the functions defined at module level."""
    memo = facts.memo("module_functions")
    if "ids" not in memo:
        memo["ids"] = {
            id(statement)
            for statement in facts.module.body
            if isinstance(statement, cst.FunctionDef)
        }
    return memo["ids"]


# Parameters and their call sites -------------------------------------------------------------
def positional_parameter_names(function: cst.FunctionDef) -> List[str]:
    """Its parameters that a positional argument may bind, in order (`self` included)."""
    params = function.params
    return [p.name.value for p in (*params.posonly_params, *params.params)]


def parameter_names(function: Optional[cst.CSTNode]) -> List[str]:
    if not isinstance(function, cst.FunctionDef):
        return []
    params = function.params
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            every.append(star)
    return [p.name.value for p in every]


def _calls_by_callee(facts: "ScriptFacts") -> Dict[Tuple[bool, str], List["CallSite"]]:
    """Calls `f(...)` by (False, `f`), and `self.f(...)`/`cls.f(...)` by (True, `f`), in
    source order."""
    memo = facts.memo("calls_by_callee")
    if "table" not in memo:
        table: Dict[Tuple[bool, str], List["CallSite"]] = {}
        for call in facts.records.calls:
            if isinstance(call.node.func, cst.Name):
                table.setdefault((False, call.node.func.value), []).append(call)
            elif call.method is not None and call.receiver in ("self", "cls"):
                table.setdefault((True, call.method), []).append(call)
        memo["table"] = table
    return memo["table"]


def parameter_values(
    facts: "ScriptFacts", function: cst.FunctionDef, name: str
) -> Optional[Sequence[cst.BaseExpression]]:
    """What parameter `name` of `function` receives at every call by name in this file (see
    parameter_sources)."""
    sources = parameter_sources(facts, function, name)
    return None if sources is None else [source.value for source in sources]


def parameter_sources(
    facts: "ScriptFacts", function: cst.FunctionDef, name: str
) -> Optional[List[Source]]:
    """What parameter `name` of `function` receives at every call by name in this file, each
    with the caller's scope (a default: the scope of the definition).

    None when some call hides it in `*args`/`**kwargs`, when there are no calls, or when the
    function is also used some other way (passed around, assigned): then its callers are
    unknown.
    """
    params = function.params
    positional_names = [p.name.value for p in (*params.posonly_params, *params.params)]
    method = bool(positional_names) and positional_names[0] in ("self", "cls")
    default = next(
        (
            p.default
            for p in (*params.posonly_params, *params.params, *params.kwonly_params)
            if p.name.value == name
        ),
        None,
    )
    called = function.name.value
    callers = list(_calls_by_callee(facts).get((method, called), ()))
    if not callers or facts.assignments_to(called):
        return None
    # Used other than by these calls (passed to a thread, stored): its callers are unknown. A
    # method may also be called through an instance (`trainer.fit(...)`): any `.fit` counts.
    mentions = name_mentions(facts).get(called, 0)
    if method:
        mentions += attribute_mentions(facts).get(called, 0)
    if mentions > len(callers) + 1:
        return None
    values: List[Source] = []
    for caller in callers:
        arg = keyword(caller.node, name)
        if arg is None and name in positional_names:
            index = positional_names.index(name) - (1 if method else 0)
            args = positional(caller.node)
            if has_star_args(caller.node):
                return None
            arg = args[index] if 0 <= index < len(args) else None
        if arg is None:
            if has_double_star(caller.node) or default is None:
                return None
            values.append(Source(default, None))
        else:
            values.append(Source(arg.value, caller.site.function))
    return values


def calls_named(facts: "ScriptFacts", name: str) -> List["CallSite"]:
    """Calls whose callee is written `name` (`train(...)`, `self.attn(...)`), in source
    order: one table per pass."""
    memo = facts.memo("calls_by_dotted_name")
    if "table" not in memo:
        table: Dict[str, List["CallSite"]] = {}
        for call in facts.records.calls:
            written = dotted_name(call.node.func)
            if written is not None:
                table.setdefault(written, []).append(call)
        memo["table"] = table
    return list(memo["table"].get(name, ()))


def name_mentions(facts: "ScriptFacts") -> Dict[str, int]:
    """How many times each name is written as a variable in the file (counted by the facts'
    one walk; keyword names and attributes are not variables): a function named once more
    than it is called is passed around or stored somewhere."""
    return facts.records.name_counts


def attribute_mentions(facts: "ScriptFacts") -> Dict[str, int]:
    """How many times each name is written as an attribute (`x.train`, any `x`) in the file."""
    return facts.records.attribute_counts


def defined_once(facts: "ScriptFacts", name: str) -> bool:
    """One `def`/`class` of this name and no other binding of it."""
    counts = facts.records.definition_counts
    return counts.get(name, 0) == 1 and not facts.assignments_to(name)


def local_function(
    facts: "ScriptFacts", call: "CallSite", any_receiver: bool = False
) -> Optional[cst.FunctionDef]:
    """The function of this file that `call` runs: `f(...)` or `self.f(...)` (with
    `any_receiver`, also `agent.f(...)`), when the file defines `f` once and binds it no
    other way (matched by name)."""
    func = call.node.func
    if isinstance(func, cst.Name):
        name = func.value
    elif (
        isinstance(func, cst.Attribute)
        and isinstance(func.value, cst.Name)
        and (any_receiver or func.value.value == "self")
    ):
        name = func.attr.value
    else:
        return None
    if not defined_once(facts, name):
        return None
    return facts.records.functions.get(name)


def module_function(facts: "ScriptFacts", call: "CallSite") -> Optional[cst.FunctionDef]:
    """The module-level function of this file `call` runs by its plain name (`f(...)`)."""
    if not isinstance(call.node.func, cst.Name):
        return None
    function = local_function(facts, call)
    if function is None or id(function) not in _module_level_functions(facts):
        return None
    return function


def _module_level_functions(facts: "ScriptFacts") -> Set[int]:
    memo = facts.memo("module_level_functions")
    if None not in memo:
        memo[None] = {id(s) for s in facts.module.body if isinstance(s, cst.FunctionDef)}
    return memo[None]


def the_caller(facts: "ScriptFacts", function: cst.FunctionDef) -> Optional["CallSite"]:
    """The one call of `function` in this file: `train(...)` for a module-level function,
    `Trainer(...)` for `Trainer.__init__`. None when it is called several times or never, or
    used some other way (passed around, stored, decorated), or its name is defined twice, or
    other modules of the run call it (outside_argument answers when only they do, and agree)."""
    callers = the_callers(facts, function)
    return callers[0] if callers is not None and len(callers) == 1 else None


def the_callers(facts: "ScriptFacts", function: cst.FunctionDef) -> Optional[List["CallSite"]]:
    """Every call of `function` in this file, in source order, when they are all it is used
    for and they are all made from one scope (Pytorch-UNet calls `train_model(...)` again in
    the `except` of an out-of-memory error); None otherwise, as for the_caller."""
    calls = every_call(facts, function)
    if calls is None or any(call.site.function is not calls[0].site.function for call in calls):
        return None
    return calls


def every_call(facts: "ScriptFacts", function: cst.FunctionDef) -> Optional[List["CallSite"]]:
    """Every call of `function` in this file, in source order, when they are all it is used
    for: its name defined once and mentioned only to call it, and no other module of the run
    calls it. None otherwise."""
    called = _called_name(facts, function)
    if called is None:
        return None
    if not defined_once(facts, called) or outside_calls(facts, called):
        return None
    calls = calls_named(facts, called)
    # The definition's name and the calls: any other mention passes it around, but for calls
    # of the class's static methods (`Trainer.get_default_config()`), which build no instance.
    mentions = name_mentions(facts).get(called, 0) - static_method_calls(facts, called)
    if not calls or mentions != 1 + len(calls):
        return None
    return calls


def static_methods(facts: "ScriptFacts", class_name: str) -> Set[str]:
    """The methods of a class of this file decorated `@staticmethod`."""
    info = facts.classes.get(class_name)
    if info is None:
        return set()
    return {
        statement.name.value
        for statement in info.node.body.body
        if isinstance(statement, cst.FunctionDef)
        and any(dotted_name(d.decorator) == "staticmethod" for d in statement.decorators)
    }


def static_method_calls(facts: "ScriptFacts", class_name: str) -> int:
    """How many calls `Class.method(...)` of this file call a static method of the class."""
    methods = static_methods(facts, class_name)
    if not methods:
        return 0
    memo = facts.memo("calls_on_names")
    if "found" not in memo:
        found: Dict[Tuple[str, str], int] = {}
        for call in facts.records.calls:
            func = call.node.func
            if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
                key = (func.value.value, func.attr.value)
                found[key] = found.get(key, 0) + 1
        memo["found"] = found
    return sum(memo["found"].get((class_name, method), 0) for method in methods)


def parameter_binding(
    facts: "ScriptFacts", function: Optional[cst.CSTNode], name: str
) -> Optional[Source]:
    """What parameter `name` of `function` receives at its one call site in this file, or at
    each of its calls when every one passes the same variable (see the_callers), with the
    callers' scope; None when it is not a parameter, a call hides it in `*args`/`**kwargs`
    or leaves it to its default, or the calls pass different values."""
    if not isinstance(function, cst.FunctionDef) or name == SELF:
        return None
    params = function.params
    positional_names = [p.name.value for p in (*params.posonly_params, *params.params)]
    if name not in positional_names and name not in [p.name.value for p in params.kwonly_params]:
        return None
    callers = the_callers(facts, function)
    if callers is None:
        return None
    shift = 1 if function.name.value == "__init__" else 0
    passed = [_argument_for(caller, name, positional_names, shift) for caller in callers]
    if any(arg is None for arg in passed):
        return None
    if len(passed) > 1:
        # Several calls bind it only when each passes the same variable (of their one scope).
        spelled = {dotted_name(arg.value) for arg in passed}
        if len(spelled) != 1 or None in spelled:
            return None
    return Source(passed[0].value, callers[0].site.function)


def _argument_for(
    caller: "CallSite", name: str, positional_names: List[str], shift: int
) -> Optional[cst.Arg]:
    """The argument `caller` passes for parameter `name` (None when left to its default or
    hidden in `*args`/`**kwargs`)."""
    arg = keyword(caller.node, name)
    if arg is None and name in positional_names:
        if has_star_args(caller.node):
            return None
        args = positional(caller.node)
        index = positional_names.index(name) - shift
        arg = args[index] if 0 <= index < len(args) else None
    if arg is None or arg.star:
        return None
    return arg


def parameter_receiving(
    function: cst.FunctionDef, call: cst.Call, node: cst.BaseExpression
) -> Optional[str]:
    """The parameter of module-level `function` that `call` binds to its argument `node`, by
    position or keyword; None when `node` is no argument of `call`, or it lands in
    `*args`/`**kwargs` or after a `*` argument of the call."""
    params = function.params
    positional_names = [p.name.value for p in (*params.posonly_params, *params.params)]
    named = set(positional_names) | {p.name.value for p in params.kwonly_params}
    index = 0
    for arg in call.args:
        if arg.star:
            return None  # what follows may land anywhere
        if arg.keyword is not None:
            if arg.value is node:
                return arg.keyword.value if arg.keyword.value in named else None
            continue
        if arg.value is node:
            return positional_names[index] if index < len(positional_names) else None
        index += 1
    return None


def unbound_parameter(
    facts: "ScriptFacts", function: Optional[cst.CSTNode], name: str
) -> Optional[str]:
    """Why parameter `name` of `function` is not followed to a value, for a report ("`dataset`
    is a parameter of `Trainer.__init__`, which is called 2 times in this file"); None when
    `name` is no parameter of `function` or is followed."""
    if not isinstance(function, cst.FunctionDef) or name == SELF:
        return None
    if name not in parameter_names(function) or locally_assigned(facts, name, function):
        return None
    if parameter_binding(facts, function, name) is not None:
        return None
    outside, why_not = outside_argument(facts, function, name)
    if outside is not None:
        return None
    if why_not is not None:
        return why_not
    owner = method_class(facts, function)
    label = f"{owner}.{function.name.value}" if owner else function.name.value
    called = owner if function.name.value == "__init__" else function.name.value
    calls = len(calls_named(facts, called)) if called else 0
    if the_caller(facts, function) is not None:
        why = "its one call leaves it to its default or passes it through `*args`/`**kwargs`"
    elif calls == 0:
        why = "which is not called by name in this file (nor by the other files of the run)"
    elif calls > 1:
        why = f"which is called {calls} times in this file"
    else:
        why = "which is also used other than by its one call (passed around or stored)"
    return f"`{name}` is a parameter of `{label}`, {why}"


def declares_global(function: cst.FunctionDef, name: str) -> bool:
    """`global name` or `nonlocal name` in `function` (nested functions included)."""
    return any(
        item.name.value == name
        for statement in find_all(function.body, cst.Global, cst.Nonlocal)
        for item in statement.names
    )


def locally_assigned(facts: "ScriptFacts", name: str, function: cst.FunctionDef) -> bool:
    memo = facts.memo("locally_assigned")
    names = memo.get(id(function))
    if names is None:
        names = memo[id(function)] = {a.target for a in facts.in_function("assignments", function)}
    return name in names


def local_sources(
    facts: "ScriptFacts", name: str, function: cst.FunctionDef
) -> Optional[List[Source]]:
    """The assignments to `name` in `function`'s own body, when Python makes it a variable of
    that call only, bound by assignment statements alone: assigned there, not a parameter,
    and neither declared global or nonlocal nor bound another way (a loop target, `as`,
    `:=`, `del`) anywhere in the function, nested functions included. A name `coco` assigned
    in `get_loader` is then not also every `coco = ...` of the file's other functions."""
    assigned = facts.assignments_in_scope(name, function)
    if not assigned or name in parameter_names(function):
        return None
    if name in bound_otherwise(facts, function):
        return None
    return [Source(a.value, function, a) for a in assigned]


def bound_otherwise(facts: "ScriptFacts", function: Optional[cst.FunctionDef]) -> Set[str]:
    """The names `function` (None: the whole module) binds other than by assignment
    statements, nested functions included (collect.names_bound_otherwise), once per pass."""
    memo = facts.memo("bound_otherwise")
    if id(function) not in memo:
        root = function.body if function is not None else facts.module
        memo[id(function)] = names_bound_otherwise(root)
    return memo[id(function)]


def attribute_aliases(facts: "ScriptFacts", function: Optional[cst.CSTNode]) -> Dict[str, str]:
    """{local name: `self.X`} for the names `function` binds only to `self.X` (minGPT's
    `model, config = self.model, self.config`)."""
    if not isinstance(function, cst.FunctionDef):
        return {}
    memo = facts.memo("attribute_aliases")
    if id(function) not in memo:
        bound: Dict[str, Set[Optional[str]]] = {}
        for assignment in facts.in_function("assignments", function):
            value = None if assignment.augmented else dotted_name(assignment.value)
            if value is None or not value.startswith(SELF + "."):
                value = None
            bound.setdefault(assignment.target, set()).add(value)
        otherwise = set(parameter_names(function)) | bound_otherwise(facts, function)
        memo[id(function)] = {
            local: next(iter(values))
            for local, values in bound.items()
            if "." not in local
            and len(values) == 1
            and None not in values
            and local not in otherwise
        }
    return memo[id(function)]


# The value of a name in a scope ---------------------------------------------------------------
def value_sources(
    facts: "ScriptFacts", name: str, function: Optional[cst.CSTNode]
) -> Optional[List[Source]]:
    """The expressions that give `name` its value where `function` reads it, or None when
    this module has no scoped answer (the caller then falls back on file-wide assignments):

    - `self.X` read in a method of class C: every `self.X = ...` in C's methods;
    - a parameter of `function` that it never reassigns: the argument at its one call site;
    - a variable of `function`'s own (local_sources): its assignments there.
    """
    if name.startswith(SELF + "."):
        owner = method_class(facts, function)
        if owner is None or not standalone_class(facts, owner):
            return None
        if self_attribute_elsewhere(facts, name):
            return None
        return [
            Source(a.value, a.site.function, a) for a in attribute_assignments(facts, owner, name)
        ]
    if "." in name or not isinstance(function, cst.FunctionDef):
        return None
    if name not in parameter_names(function):
        return local_sources(facts, name, function)
    if locally_assigned(facts, name, function):
        return None
    bound = parameter_binding(facts, function, name)
    if bound is not None:
        return [bound]
    outside, _ = outside_argument(facts, function, name)
    if outside is None:
        return None
    return [Source(_placeholder(facts, function, name, outside), None)]


# Calls from other modules (the project index) -------------------------------------------------
def outside_calls(facts: "ScriptFacts", called: str) -> List["IncomingCall"]:
    """The calls other modules of the run make to `called` (a class or function of this
    file), from the project index; none without one."""
    project = getattr(facts, "project", None)
    return project.calls_to(called) if project is not None else []


def _called_name(facts: "ScriptFacts", function: cst.FunctionDef) -> Optional[str]:
    """The name a call of `function` spells: its class for `__init__`, its own name for a
    module-level function; None for other methods, nested functions, and functions with a
    decorator that may change how they are called (torch's grad-mode decorators do not)."""
    if any(not _keeps_the_call(facts, d.decorator) for d in function.decorators):
        return None
    if function.name.value == "__init__":
        owner = method_class(facts, function)
        if owner is None or facts.classes[owner].node.decorators:
            return None
        return owner
    return function.name.value if id(function) in _module_functions(facts) else None


# Decorators that run the function as it is, only in another autograd mode.
_GRAD_MODE_DECORATORS = frozenset({"torch.no_grad", "torch.inference_mode", "torch.enable_grad"})


def _keeps_the_call(facts: "ScriptFacts", decorator: cst.BaseExpression) -> bool:
    target = decorator.func if isinstance(decorator, cst.Call) else decorator
    return facts.qualified_name(target) in _GRAD_MODE_DECORATORS


def outside_argument(
    facts: "ScriptFacts", function: Optional[cst.CSTNode], name: str
) -> Tuple[Optional["Argument"], Optional[str]]:
    """(what every call from another module passes for parameter `name` of `function`, None)
    when they all agree; (None, why not) when there are such calls but no single answer;
    (None, None) when no other module calls it."""
    if not isinstance(function, cst.FunctionDef) or name == SELF:
        return None, None
    called = _called_name(facts, function)
    calls = outside_calls(facts, called) if called is not None else []
    if not calls:
        return None, None
    memo = facts.memo("outside_argument")
    key = (id(function), name)
    if key not in memo:
        memo[key] = _outside_argument(facts, function, name, called, calls)
    return memo[key]


def _outside_argument(facts, function, name, called, calls):
    params = function.params
    positional_names = [p.name.value for p in (*params.posonly_params, *params.params)]
    keyword_names = [p.name.value for p in params.kwonly_params]
    if name not in positional_names and name not in keyword_names:
        return None, None
    label = f"`{name}` is a parameter of `{called}`"
    callers = sorted({call.caller for call in calls})
    if calls_named(facts, called) or not defined_once(facts, called):
        return None, f"{label}, which is called in this file and from {', '.join(callers)}"
    if name_mentions(facts).get(called, 0) != 1:
        return None, f"{label}, which this file also uses otherwise than by its definition"
    shift = 1 if function.name.value == "__init__" else 0
    index = positional_names.index(name) - shift if name in positional_names else None
    found: List[Tuple["IncomingCall", "Argument"]] = []
    for call in calls:
        if call.passed_around:
            return None, f"{label}, which {call.caller} passes around or stores"
        argument = call.argument(name, index)
        if argument is None:
            why = "through `*args`/`**kwargs`" if call.star else "to its default"
            return None, f"{label}, which {call.caller} calls leaving it {why}"
        found.append((call, argument))
    first = found[0][1]
    if all(argument.same_as(first) for _, argument in found[1:]):
        return first, None
    passed = "; ".join(f"{call.caller} passes `{argument.text}`" for call, argument in found)
    return None, f"{label}, called with values that differ ({passed})"


def _placeholder(
    facts: "ScriptFacts", function: cst.FunctionDef, name: str, argument: "Argument"
) -> cst.BaseExpression:
    """A node standing for an argument passed in another module (see outside_value)."""
    memo = facts.memo("outside_placeholders")
    key = (id(function), name)
    if key not in memo:
        node = cst.Ellipsis()
        memo[key] = node
        memo[id(node)] = argument
    return memo[key]


def outside_value(facts: "ScriptFacts", node: Optional[cst.CSTNode]) -> Optional["Argument"]:
    """The caller's summary of an argument another module passes, when `node` is the
    placeholder value_sources gave for it; else None."""
    if not isinstance(node, cst.Ellipsis):
        return None
    return facts.memo("outside_placeholders").get(id(node))


def imported_module_class(facts: "ScriptFacts", func: cst.BaseExpression) -> bool:
    """`func` names an nn.Module class imported from another module of the run
    (`from model import TinyLM`), as the project index found."""
    project = getattr(facts, "project", None)
    if project is None or not project.module_classes:
        return False
    name = dotted_name(func)
    return name is not None and name in project.module_classes and not _rebound(facts, name)


def imported_registry(facts: "ScriptFacts", name: str) -> Optional["ImportedRegistry"]:
    """The project index's summary of the dict or module of model builders that the dotted
    `name` names, imported from another module of the run (`DiT_models`, `models_mae`); None
    when it is no such import or this file binds it again."""
    project = getattr(facts, "project", None)
    if project is None or not project.imported_registries or _rebound(facts, name):
        return None
    return project.imported_registry(name)


def imported_dataset(facts: "ScriptFacts", name: Optional[str]) -> Optional["ImportedDataset"]:
    """The project index's summary of the dataset class (or function returning one) that the
    dotted `name` names, imported from another module of the run (`ImageDataset`,
    `data.get_training_set`); None when it is no such import or this file binds it again."""
    project = getattr(facts, "project", None)
    if project is None or not project.imported_datasets or name is None:
        return None
    if _bound_here(facts, name):
        return None
    return project.imported_dataset(name)


def imported_loader_named(facts: "ScriptFacts", name: Optional[str]) -> Optional["ImportedLoader"]:
    """The project index's summary of the DataLoader that `name` holds when every assignment
    to it takes one that a function of another module of the run returns: `data_loader =
    get_loader(...)`, or unpacked from the tuple it returns (`train_dl, test_dl, names =
    data_setup.create_dataloaders(...)`)."""
    project = getattr(facts, "project", None)
    if project is None or not project.imported_loaders or not name:
        return None
    found = None
    for assignment in facts.assignments_to(name):
        value = assignment.value
        spelled = dotted_name(value.func) if isinstance(value, cst.Call) else None
        index = assignment.index if assignment.unpacked else -1
        if spelled is None or index is None or assignment.augmented:
            return None
        if _bound_here(facts, spelled):
            return None
        loader = project.imported_loader(spelled, index)
        if loader is None or (found is not None and loader != found):
            return None
        found = loader
    return found


def _bound_here(facts: "ScriptFacts", name: str) -> bool:
    """The first part of dotted `name` is assigned, or defined as a class or function, in
    this file: it is not (only) the import the project index summarised."""
    root = name.split(".")[0]
    return _rebound(facts, name) or root in facts.classes or root in facts.records.functions


def _rebound(facts: "ScriptFacts", name: str) -> bool:
    """The first part of dotted `name` is assigned in this file: not (only) the import."""
    return bool(facts.assignments_to(name.split(".")[0]))


def alias_in(
    facts: "ScriptFacts",
    name: str,
    home: Optional[cst.CSTNode],
    function: Optional[cst.CSTNode],
    depth: int = 0,
) -> Optional[str]:
    """The name that holds, inside `function`, the value `name` holds in `home`: `name`
    itself in the same scope (or in another method of the same class for `self.X`), or the
    parameter of `function` bound to it at `function`'s one call site (following up to three
    calls: `main` -> `train` -> `train_one_epoch`)."""
    if function is home:
        return name
    if name.startswith(SELF + "."):
        owner = method_class(facts, home)
        if owner is not None and owner == method_class(facts, function):
            return name
        return None
    if depth > 2 or not isinstance(function, cst.FunctionDef):
        return None
    callers = the_callers(facts, function)
    if callers is None:
        return None
    outer = alias_in(facts, name, home, callers[0].site.function, depth + 1)
    if outer is None:
        return None
    for param in parameter_names(function):
        if locally_assigned(facts, param, function):
            continue
        bound = parameter_binding(facts, function, param)
        if bound is not None and dotted_name(bound.value) == outer:
            return param
    return None


# Hugging Face Accelerate's entry object: it prepares loaders, runs backward, gathers tensors.
ACCELERATOR = "accelerate.Accelerator"


def built_by(
    facts: "ScriptFacts", receiver: Optional[cst.BaseExpression], qualnames: Collection[str]
) -> bool:
    """Every binding in the file of `receiver` (a name or a `self.` attribute) is a call of
    one of `qualnames`: `accelerator = Accelerator()`, `logger = logging.getLogger(...)`."""
    name = dotted_name(receiver) if receiver is not None else None
    values = [a.value for a in facts.assignments_to(name)] if name else []
    return bool(values) and all(
        isinstance(value, cst.Call) and facts.qualified_name(value.func) in qualnames
        for value in values
    )


# Methods that return the module they are called on (or move it, as the same object).
_SAME_MODULE_METHODS = frozenset({"to", "cuda", "cpu", "eval", "train", "float", "half"})


def instance_of(
    facts: "ScriptFacts", name: str, function: Optional[cst.CSTNode], class_name: str
) -> bool:
    """Every value `name` holds where `function` reads it is built by `class_name(...)` of
    this file (maybe moved or switched: `GPT(config).to(device)`), or is `self` in a method
    of that class; `model = model.to(device)` rebinding adds nothing."""
    if name == SELF:
        return method_class(facts, function) == class_name
    sources = value_sources(facts, name, function)
    if sources is None:
        sources = [Source(a.value, a.site.function, a) for a in facts.assignments_to(name)]
    if not sources or not defined_once(facts, class_name):
        return False
    for source in sources:
        value = source.value
        while (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in _SAME_MODULE_METHODS
        ):
            value = value.func.value
        if isinstance(value, cst.Name) and value.value == name:
            continue  # `model = model.to(device)`
        if not (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Name)
            and value.func.value == class_name
        ):
            return False
    return True

"""Whether every caller drops one element of the tuple a function returns.

A function (or a module's `forward`) that returns `out, extra` can stop computing `extra`, and
return `None` in its place, when no caller reads it: every call in the file unpacks it into a
name that is never read (`out, _ = self.attn(x)`) or subscripts another element
(`self.attn(x)[0]`). The callable must be reachable only by those calls: a module-level
function called by name, a method called as `self.method(...)` in its own class, or a module
class whose instances are bound once (`self.attn = Attention(...)`, `attn = Attention(...)`)
and only ever called. Anything else (passed around, put in a container, returned, hooked,
called through `.forward`) may read the element, and so does code in another module when this
one can be imported: a file without an `if __name__ == "__main__":` guard is a library, unless
the name is private (`_attend`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt, literal
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.scopes import name_uses
from optimizer_codemod.analysis.values import (
    calls_named,
    attribute_assignments,
    method_class,
    name_mentions,
    self_attribute_elsewhere,
    standalone_class,
)

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.collect import CallSite
    from optimizer_codemod.analysis.script import ScriptFacts

# Ways a module's output reaches code that is not one of its calls.
OUTPUT_HOOKS = frozenset({"register_forward_hook", "register_module_forward_hook"})


def why_element_read(
    facts: "ScriptFacts",
    function: cst.FunctionDef,
    klass: Optional[cst.ClassDef],
    index: int,
    size: int,
) -> Optional[str]:
    """None when every caller in this file drops element `index` of the `size`-tuple that
    `function` (a method of `klass`, or a module-level function when `klass` is None)
    returns; otherwise why the element may be read, in words."""
    label = f"{klass.name.value}.{function.name.value}" if klass else function.name.value
    if function.decorators or (klass is not None and klass.decorators):
        return f"`{label}` is decorated: the decorator may read what it returns"
    calls, why = _calls(facts, function, klass)
    if why is not None:
        return why
    if not calls:
        return f"`{label}` is not called in this file: its callers elsewhere may read it"
    public = klass.name.value if klass is not None else function.name.value
    if not facts.records.has_main_guard and not public.startswith("_"):
        return (
            f'this file has no `if __name__ == "__main__":` guard, so it may be imported and '
            f"`{public}` called elsewhere, where what it returns may be read"
        )
    for call in calls:
        if not _drops(facts, call, index, size):
            return f"`{excerpt(call.node, 40)}` keeps element {index} of what `{label}` returns"
    return None


def _calls(
    facts: "ScriptFacts", function: cst.FunctionDef, klass: Optional[cst.ClassDef]
) -> Tuple[List["CallSite"], Optional[str]]:
    """Every call that runs `function`, or a reason why they cannot all be known."""
    if klass is None:
        if not any(statement is function for statement in facts.module.body):
            return [], f"`{function.name.value}` is nested in another function"
        name = function.name.value
        calls = calls_named(facts, name)
        if name_mentions(facts).get(name, 0) != 1 + len(calls):
            return [], f"`{name}` is used other than called by name (passed around or rebound)"
        return calls, None
    owner = klass.name.value
    if not standalone_class(facts, owner):
        return [], f"`{owner}` has subclasses or bases in this file, which share its methods"
    if any(facts.method_calls(hook) for hook in sorted(OUTPUT_HOOKS)):
        return [], "a forward hook is registered in this file: it sees every module's output"
    if function.name.value != "forward":
        return _method_calls(facts, function, owner)
    if _attribute_mentions(facts, "forward"):
        return [], "`.forward` is named in this file: a module may be run other than by its calls"
    return _instance_calls(facts, owner)


def _method_calls(
    facts: "ScriptFacts", function: cst.FunctionDef, owner: str
) -> Tuple[List["CallSite"], Optional[str]]:
    """`self.method(...)` calls in the methods of `owner`, the only mentions of `.method`."""
    method = function.name.value
    calls = [
        c
        for c in calls_named(facts, f"self.{method}")
        if method_class(facts, c.site.function) == owner
    ]
    if _attribute_mentions(facts, method) != len(calls):
        return [], f"`.{method}` is named in this file other than by `self.{method}(...)` calls"
    return calls, None


def _instance_calls(facts: "ScriptFacts", owner: str) -> Tuple[List["CallSite"], Optional[str]]:
    """The calls of `owner`'s instances, each bound once to a name or a `self.` attribute."""
    constructions = [c for c in calls_named(facts, owner) if isinstance(c.node.func, cst.Name)]
    if name_mentions(facts).get(owner, 0) != 1 + len(constructions):
        return [], f"`{owner}` is used other than built (subclassed, passed around, checked)"
    calls: List["CallSite"] = []
    for construction in constructions:
        assignment = facts.assignment_of(construction.node)
        if assignment is None or assignment.unpacked or assignment.augmented:
            return [], (
                f"`{excerpt(construction.node, 40)}` is not bound to a name of its own (built in "
                "a container or another call), so its calls are not followed"
            )
        instance_calls, why = _calls_of_instance(facts, assignment.target, construction)
        if why is not None:
            return [], why
        calls.extend(instance_calls)
    return calls, None


def _calls_of_instance(
    facts: "ScriptFacts", target: str, construction: "CallSite"
) -> Tuple[List["CallSite"], Optional[str]]:
    """The calls of the instance bound to `target` (`attn` or `self.attn`), its only uses."""
    if target.startswith("self."):
        holder = method_class(facts, construction.site.function)
        attribute = target[len("self.") :]
        if (
            holder is None
            or not standalone_class(facts, holder)
            or self_attribute_elsewhere(facts, target)
            or len(attribute_assignments(facts, holder, target)) != 1
        ):
            return [], f"`{target}` is bound more than once, or outside one class's methods"
        calls = [
            c for c in calls_named(facts, target) if method_class(facts, c.site.function) == holder
        ]
        # The binding, the calls and module methods (`.parameters()`): any other `.attn` may
        # read the instance's output.
        if _attribute_mentions(facts, attribute) != 1 + len(calls) + _methods_of(facts, target):
            return [], f"`.{attribute}` is named in this file other than called as `{target}(...)`"
        return calls, None
    if len(facts.assignments_to(target)) != 1:
        return [], f"`{target}` is bound more than once"
    calls = calls_named(facts, target)
    if name_mentions(facts).get(target, 0) != 1 + len(calls) + _methods_of(facts, target):
        return [], f"`{target}` is used other than called (passed around, stored or returned)"
    return calls, None


def _methods_of(facts: "ScriptFacts", instance: str) -> int:
    """How many method calls the file makes on `instance` (`.parameters()`, `.to(device)`,
    `.train()`): none of them returns what its forward returns (`.forward` and hooks are
    checked apart)."""
    memo = facts.memo("method_calls_by_receiver")
    if "counts" not in memo:
        counts: dict = {}
        for call in facts.records.calls:
            if call.receiver is not None and call.method is not None:
                counts[call.receiver] = counts.get(call.receiver, 0) + 1
        memo["counts"] = counts
    return memo["counts"].get(instance, 0)


def _drops(facts: "ScriptFacts", call: "CallSite", index: int, size: int) -> bool:
    """`call`'s result has element `index` unpacked into a name never read, or is subscripted
    for another element."""
    statement = call.site.statement
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for subscript in find_all(statement, cst.Subscript):
        if subscript.value is call.node:
            return _other_element(subscript, index, size)
    for small in statement.body:
        if isinstance(small, cst.Assign) and small.value is call.node and len(small.targets) == 1:
            return _unpacked_unread(facts, call, small.targets[0].target, index, size)
    return False


def _other_element(subscript: cst.Subscript, index: int, size: int) -> bool:
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return False
    position = literal(subscript.slice[0].slice.value, None)
    if not isinstance(position, int) or isinstance(position, bool) or not -size <= position < size:
        return False
    return position % size != index


def _unpacked_unread(
    facts: "ScriptFacts", call: "CallSite", target: cst.BaseExpression, index: int, size: int
) -> bool:
    if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != size:
        return False
    elements = target.elements
    if any(isinstance(e, cst.StarredElement) for e in elements):
        return False
    dropped = elements[index].value
    if not isinstance(dropped, cst.Name):
        return False
    scope = call.site.function if call.site.function is not None else facts.module
    return all(use.store for use in name_uses(scope, dropped.value))


def _attribute_mentions(facts: "ScriptFacts", attribute: str) -> int:
    """How many `X.attribute` the file writes (any X), counted in one walk per pass."""
    memo = facts.memo("attribute_mentions")
    if "counts" not in memo:
        counts: dict = {}
        for node in find_all(facts.module, cst.Attribute):
            counts[node.attr.value] = counts.get(node.attr.value, 0) + 1
        memo["counts"] = counts
    return memo["counts"].get(attribute, 0)

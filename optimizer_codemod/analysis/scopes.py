"""The variables of a scope: every occurrence of a name in a function or module, whether it
binds the name, and whether it sits in a nested function, lambda or class; walked once per
scope and pass."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple, Union

import libcst as cst

from optimizer_codemod.analysis.nodes import find_all, is_name
from optimizer_codemod.analysis.walk import walk

if TYPE_CHECKING:
    from optimizer_codemod.analysis.script import ScriptFacts

Scope = Union[cst.Module, cst.FunctionDef]


@dataclass(frozen=True)
class NameUse:
    node: cst.Name
    store: bool  # bound here (assignment target, for target, del, with ... as)
    nested: bool  # inside a nested function, lambda or class of the scope


def name_uses(scope: Scope, name: str, facts: Optional["ScriptFacts"] = None) -> List[NameUse]:
    """Every occurrence of the variable `name` in `scope`, in source order.

    Nested functions that bind `name` themselves (without `global`/`nonlocal`) have their
    own variable and are skipped; other nested occurrences are marked `nested`. With `facts`,
    the scope is walked once per pass for all names: callers ask about many names of one scope.
    """
    if facts is None:
        return _ScopeNames(scope).uses(name)
    table = facts.memo("scope_names")
    index = table.get(scope)
    if index is None:
        index = table[scope] = _ScopeNames(scope)
    return index.uses(name)


def _bound_names(target: cst.CSTNode) -> List[cst.Name]:
    """The names a target binds: `a`, `a, (b, *c)`; not `a[0]` nor `a.b`, which read `a`."""
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _bound_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _bound_names(target.value)
    return []


class _Event(enum.Enum):
    """What a node of one type means to `_ScopeNames`: decided once per type (isinstance
    against LibCST's abstract node classes is slow enough to matter per node)."""

    NONE = 0
    NESTED = 1  # a lambda: its own scope
    NESTED_DEFINITION = 2  # a def or class: its own scope, and it binds its name
    ASSIGN_TARGET = 3
    TARGET = 4  # AugAssign, AnnAssign, For, CompFor: `.target` is bound
    DEL = 5
    AS_NAME = 6
    PARAM = 7
    IMPORT_ALIAS = 8
    ATTRIBUTE = 9
    ARG = 10
    NAME = 11


_NAME_EVENTS: Dict[type, _Event] = {}
_EVENT_TYPES = (
    ((cst.FunctionDef, cst.ClassDef), _Event.NESTED_DEFINITION),
    ((cst.Lambda,), _Event.NESTED),
    ((cst.AssignTarget,), _Event.ASSIGN_TARGET),
    ((cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor), _Event.TARGET),
    ((cst.AsName,), _Event.AS_NAME),
    ((cst.Del,), _Event.DEL),
    ((cst.Param,), _Event.PARAM),
    ((cst.ImportAlias,), _Event.IMPORT_ALIAS),
    ((cst.Attribute,), _Event.ATTRIBUTE),
    ((cst.Arg,), _Event.ARG),
    ((cst.Name,), _Event.NAME),
)


def _name_event(node_type: type) -> _Event:
    event = next((e for types, e in _EVENT_TYPES if issubclass(node_type, types)), _Event.NONE)
    _NAME_EVENTS[node_type] = event
    return event


class _ScopeNames(cst.CSTVisitor):
    """The names of a scope, each with the nested functions, lambdas and classes around it."""

    def __init__(self, root: Scope) -> None:
        super().__init__()
        self.root = root
        self._found: Dict[str, List[Tuple[cst.Name, Tuple[cst.CSTNode, ...]]]] = {}
        self._stores: Set[cst.CSTNode] = set()
        self._nesting: Tuple[cst.CSTNode, ...] = ()
        self._binds: Dict[Tuple[cst.FunctionDef, str], bool] = {}
        walk(root, self)

    def uses(self, name: str) -> List[NameUse]:
        return [
            NameUse(node, node in self._stores, bool(nesting))
            for node, nesting in self._found.get(name, ())
            if not any(self._own_variable(n, name) for n in nesting)
        ]

    def _own_variable(self, node: cst.CSTNode, name: str) -> bool:
        """A nested function that binds `name` without declaring it global or nonlocal."""
        if not isinstance(node, cst.FunctionDef):
            return False
        key = (node, name)
        found = self._binds.get(key)
        if found is None:
            declared = any(is_name(n.name, name) for n in find_all(node, cst.Global, cst.Nonlocal))
            params = {p.name.value for p in find_all(node.params, cst.Param)}
            binds = name in params or any(
                is_name(target, name)
                for t in find_all(node.body, cst.AssignTarget, cst.AugAssign, cst.AnnAssign)
                for target in find_all(t.target, cst.Name)
            )
            found = self._binds[key] = binds and not declared
        return found

    def on_visit(self, node: cst.CSTNode) -> bool:
        event = _NAME_EVENTS.get(type(node))
        if event is None:
            event = _name_event(type(node))
        if event is _Event.NONE:
            return True
        if event is _Event.NESTED_DEFINITION or event is _Event.NESTED:
            if node is not self.root:
                self._nesting = (*self._nesting, node)
            if event is _Event.NESTED_DEFINITION:
                self._stores.add(node.name)
        elif event is _Event.ASSIGN_TARGET or event is _Event.TARGET or event is _Event.DEL:
            self._stores.update(_bound_names(node.target))
        elif event is _Event.AS_NAME:
            self._stores.update(_bound_names(node.name))
        elif event is _Event.PARAM:
            self._stores.add(node.name)
        elif event is _Event.IMPORT_ALIAS:
            self._stores.update(_bound_names(node.asname.name if node.asname else node.name))
        elif event is _Event.ATTRIBUTE:
            # `x.running` is no use of the variable `running`.
            walk(node.value, self)
            return False
        elif event is _Event.ARG:
            if node.keyword is not None:
                walk(node.value, self)
                return False
        elif event is _Event.NAME:
            self._found.setdefault(node.value, []).append((node, self._nesting))
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        event = _NAME_EVENTS[type(original_node)]
        if (event is _Event.NESTED or event is _Event.NESTED_DEFINITION) and (
            original_node is not self.root
        ):
            self._nesting = self._nesting[:-1]

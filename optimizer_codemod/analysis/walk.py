"""Walking a LibCST tree without rebuilding it.

`node.visit(visitor)` and `node.children` go through `_visit_and_replace_children`, which
constructs (and validates) a new copy of every node it passes, even for a read-only visitor:
a visit costs about as much as parsing the file again. These functions read the same fields
in the same order and call the visitor's hooks exactly as LibCST does (`on_visit`,
`on_visit_attribute`, `on_leave_attribute`, `on_leave`, and through them `visit_<Node>`,
`visit_<Node>_<field>`, `leave_...`), but build nothing.

The order of a node type's fields is read once from its `_visit_and_replace_children`: the
`visit_*(self, "field", ...)` calls it makes, in order. A field visited only under a condition
(`format_spec` when it is not None) gets no attribute events when it is None, as in LibCST.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from operator import attrgetter
from typing import Callable, Dict, List, Optional, Set, Tuple

import libcst as cst

_VISIT_FUNCTIONS = frozenset(
    {
        "visit_required",
        "visit_optional",
        "visit_sentinel",
        "visit_sequence",
        "visit_iterable",
        "visit_body_sequence",
        "visit_body_iterable",
    }
)
# (field name, visited only when not None) in visiting order, per node type.
_FIELDS: Dict[type, Tuple[Tuple[str, bool], ...]] = {}


def fields(cls: type) -> Tuple[Tuple[str, bool], ...]:
    found = _FIELDS.get(cls)
    if found is None:
        found = _FIELDS[cls] = _read_fields(cls)
    return found


def _read_fields(cls: type) -> Tuple[Tuple[str, bool], ...]:
    source = textwrap.dedent(inspect.getsource(cls._visit_and_replace_children))
    order: List[Tuple[Tuple[int, int], str, bool]] = []

    def scan(node: ast.AST, conditional: bool) -> None:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _VISIT_FUNCTIONS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ):
            order.append(((node.lineno, node.col_offset), node.args[1].value, conditional))
        for child in ast.iter_child_nodes(node):
            scan(child, conditional or isinstance(node, (ast.IfExp, ast.If)))

    scan(ast.parse(source), False)
    seen: Dict[str, bool] = {}
    for _, name, conditional in sorted(order):
        # `names` of an ImportFrom is visited by one of two calls: one field, either way.
        seen[name] = seen.get(name, False) or conditional
    return tuple(seen.items())


# What a field holds, by the type of its value: a node (1), a sequence of nodes (2), or
# neither (0: None, MaybeSentinel, a string). isinstance against CSTNode, an abstract base
# class, is several times slower than this lookup, and it ran for every field of every node.
_KINDS: Dict[type, int] = {}


def _kind(value_type: type) -> int:
    kind = _KINDS.get(value_type)
    if kind is None:
        kind = _KINDS[value_type] = (
            1 if issubclass(value_type, cst.CSTNode) else 2 if value_type in (tuple, list) else 0
        )
    return kind


# The values of a node type's fields in visiting order, read by one C call.
_GETTERS: Dict[type, Callable[[cst.CSTNode], tuple]] = {}


def _getter(node_type: type) -> Callable[[cst.CSTNode], tuple]:
    getter = _GETTERS.get(node_type)
    if getter is None:
        names = [name for name, _ in fields(node_type)]
        if len(names) > 1:
            getter = attrgetter(*names)
        elif names:
            single = attrgetter(names[0])
            getter = lambda node: (single(node),)  # noqa: E731
        else:
            getter = lambda node: ()  # noqa: E731
        _GETTERS[node_type] = getter
    return getter


def type_test(*types: type) -> Callable[[object], bool]:
    """`isinstance(value, types)`, answered once per type of value.

    Node classes derive from abstract base classes: `isinstance` against a class that is not
    the node's own type runs ABCMeta's check, in Python, once per class of `types`. A loop
    that tests every node of a tree against a few classes spent more there than in the rest
    of its work."""
    answers: Dict[type, bool] = {}

    def test(value: object) -> bool:
        value_type = type(value)
        answer = answers.get(value_type)
        if answer is None:
            answer = answers[value_type] = issubclass(value_type, types)
        return answer

    return test


def children(node: cst.CSTNode) -> List[cst.CSTNode]:
    """`node.children`: the nodes directly under `node`, in source order."""
    node_type = type(node)
    getter = _GETTERS.get(node_type) or _getter(node_type)
    found: List[cst.CSTNode] = []
    kinds = _KINDS
    for value in getter(node):
        kind = kinds.get(type(value))
        if kind is None:
            kind = _kind(type(value))
        if kind == 1:
            found.append(value)
        elif kind == 2:
            found.extend(value)
    return found


class _Hooks:
    """How a visitor class is called: its own on_* overrides, or its visit_/leave_ methods."""

    def __init__(self, visitor_class: type) -> None:
        self.cls = visitor_class
        base = cst.CSTVisitor
        # A visitor that needs to see every node may define _walk_enter/_walk_leave, called
        # around the visit_/leave_ methods, instead of overriding on_visit/on_leave (which
        # then dispatch by formatting a method name per node).
        self.enter = getattr(visitor_class, "_walk_enter", None)
        self.leave = getattr(visitor_class, "_walk_leave", None)
        # ... for the node types in _walk_types only, when it names them.
        self.enter_types = getattr(visitor_class, "_walk_types", cst.CSTNode)
        self.custom_visit = visitor_class.on_visit is not base.on_visit and self.enter is None
        self.custom_leave = visitor_class.on_leave is not base.on_leave and self.leave is None
        self.custom_attributes = (
            visitor_class.on_visit_attribute is not base.on_visit_attribute
            or visitor_class.on_leave_attribute is not base.on_leave_attribute
        )
        self.plans: Dict[type, tuple] = {}

    def plan(self, node_type: type) -> tuple:
        """(visit method name, leave method name, field getter, per-field plan or None,
        whether _walk_enter and _walk_leave apply): the per-field plan, (name, conditional,
        visit name, leave name) for each field, is None when the visitor has no method for
        any of this type's fields."""
        visit, leave = self._methods(node_type.__name__)
        per_field = []
        observed = self.custom_attributes
        for name, conditional in fields(node_type):
            field_visit, field_leave = self._methods(f"{node_type.__name__}_{name}")
            observed = observed or field_visit is not None or field_leave is not None
            per_field.append((name, conditional, field_visit, field_leave))
        found = self.plans[node_type] = (
            visit,
            leave,
            _getter(node_type),
            tuple(per_field) if observed else None,
            self.enter is not None and issubclass(node_type, self.enter_types),
            self.leave is not None and issubclass(node_type, self.enter_types),
        )
        return found

    def _methods(self, suffix: str) -> Tuple[Optional[str], Optional[str]]:
        visit, leave = f"visit_{suffix}", f"leave_{suffix}"
        return (
            visit if _defined(self.cls, visit) else None,
            leave if _defined(self.cls, leave) else None,
        )


def parents(root: cst.CSTNode) -> Dict[cst.CSTNode, cst.CSTNode]:
    """Each node below `root` with its parent: ParentNodeProvider's answer, without rebuilding
    the tree."""
    table: Dict[cst.CSTNode, cst.CSTNode] = {}
    stack: List[cst.CSTNode] = [root]
    while stack:
        current = stack.pop()
        for child in children(current):
            table[child] = current
            stack.append(child)
    return table


def ancestors(table: Dict[cst.CSTNode, cst.CSTNode], node: cst.CSTNode) -> Set[cst.CSTNode]:
    """The nodes above `node` in a `parents` table, up to the root."""
    found: Set[cst.CSTNode] = set()
    parent = table.get(node)
    while parent is not None:
        found.add(parent)
        parent = table.get(parent)
    return found


def _defined(visitor_class: type, name: str) -> bool:
    method = getattr(visitor_class, name, None)
    # CSTTypedVisitorFunctions defines every visit_/leave_ as an empty stub.
    return method is not None and not getattr(method, "_is_no_op", False)


_HOOKS: Dict[type, _Hooks] = {}


def walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """`node.visit(visitor)` for a read-only visitor, without rebuilding the tree."""
    hooks = _HOOKS.get(type(visitor))
    if hooks is None:
        hooks = _HOOKS[type(visitor)] = _Hooks(type(visitor))
    _walk(node, visitor, hooks)


def _walk(node: cst.CSTNode, visitor: cst.CSTVisitor, hooks: _Hooks) -> None:
    node_type = type(node)
    plan = hooks.plans.get(node_type) or hooks.plan(node_type)
    visit, leave, getter, per_field, enters, leaves = plan
    if enters:
        hooks.enter(visitor, node)
    if hooks.custom_visit:
        descend = visitor.on_visit(node)
    else:
        descend = visit is None or getattr(visitor, visit)(node) is not False
    if descend:
        values = getter(node)
        if per_field is None:
            for value in values:
                _children(value, visitor, hooks)
        else:
            for value, (name, conditional, field_visit, field_leave) in zip(values, per_field):
                if conditional and value is None:
                    continue
                if hooks.custom_attributes:
                    visitor.on_visit_attribute(node, name)
                    _children(value, visitor, hooks)
                    visitor.on_leave_attribute(node, name)
                    continue
                if field_visit is not None:
                    getattr(visitor, field_visit)(node)
                _children(value, visitor, hooks)
                if field_leave is not None:
                    getattr(visitor, field_leave)(node)
    if hooks.custom_leave:
        visitor.on_leave(node)
    elif leave is not None:
        getattr(visitor, leave)(node)
    if leaves:
        hooks.leave(visitor, node)


def _children(value, visitor: cst.CSTVisitor, hooks: _Hooks) -> None:
    kind = _KINDS.get(type(value))
    if kind is None:
        kind = _kind(type(value))
    if kind == 1:
        _walk(value, visitor, hooks)
    elif kind == 2:
        for child in value:
            _walk(child, visitor, hooks)

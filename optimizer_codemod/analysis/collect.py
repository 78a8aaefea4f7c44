"""One traversal that records what the rules ask about: calls, assignments, loops, reads.

Everything is recorded with its context (enclosing statement, loops, function, class) and a
visit order, so later questions ("is this read between zero_grad and the next backward?")
need no parent map and no second walk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Dict, List, Optional, Set, Tuple, Union

import libcst as cst

from optimizer_codemod.analysis.calls import method_name
from optimizer_codemod.analysis.imports import ImportTable, dotted_name
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.walk import walk

LoopNode = Union[cst.For, cst.While]
FunctionNode = cst.FunctionDef


# Identity, not field-by-field, equality: one Loop per loop node, and `loop in site.loops`
# is asked for every record of a file (a field comparison walks the chain of parents).
@dataclass(eq=False)
class Loop:
    node: LoopNode
    parent: Optional["Loop"]
    function: Optional[FunctionNode]
    targets: Tuple[str, ...]  # names bound by a for-target (flattened)
    iter: Optional[cst.BaseExpression]
    start: int = 0  # visit order of the first and last node inside the body
    end: int = 0

    def encloses(self, order: int) -> bool:
        return self.start <= order <= self.end

    @property
    def ancestors(self) -> Tuple["Loop", ...]:
        chain = []
        loop = self.parent
        while loop is not None:
            chain.append(loop)
            loop = loop.parent
        return tuple(chain)


@dataclass
class Site:
    """Where a node sits: its statement, loops (innermost last), function, class, order."""

    statement: Optional[cst.BaseStatement]
    loops: Tuple[Loop, ...]
    function: Optional[FunctionNode]
    class_name: Optional[str]
    order: int

    @property
    def loop(self) -> Optional[Loop]:
        return self.loops[-1] if self.loops else None


@dataclass
class CallSite:
    node: cst.Call
    qualname: Optional[str]
    method: Optional[str]
    receiver: Optional[str]  # dotted text of the receiver of a method call
    site: Site


@dataclass
class Assignment:
    target: str  # dotted text: "x", "self.loader"
    value: cst.BaseExpression  # the value bound to this target (element-wise when possible)
    unpacked: bool  # target received one element of `value` (x, y = batch)
    site: Site
    statement_node: cst.CSTNode  # the Assign/AnnAssign/AugAssign small statement
    augmented: bool = False
    # For an unpacked name at the top level of a flat target, its position counted from the
    # front (`a, b, *rest = f()`: 0 and 1), the element of `value` it receives.
    index: Optional[int] = None


@dataclass
class AttributeRead:
    node: cst.Attribute
    site: Site


@dataclass
class ClassInfo:
    node: cst.ClassDef
    bases: Tuple[Optional[str], ...]  # qualified names of the bases when known


@dataclass
class Comprehension:
    targets: Tuple[str, ...]
    iter: cst.BaseExpression
    site: Site


@dataclass
class Records:
    imports: ImportTable = field(default_factory=ImportTable)
    calls: List[CallSite] = field(default_factory=list)
    assignments: List[Assignment] = field(default_factory=list)
    loops: List[Loop] = field(default_factory=list)
    grad_reads: List[AttributeRead] = field(default_factory=list)
    classes: Dict[str, ClassInfo] = field(default_factory=dict)
    functions: Dict[str, FunctionNode] = field(default_factory=dict)
    comprehensions: List[Comprehension] = field(default_factory=list)
    with_items: List[Tuple[cst.WithItem, Site]] = field(default_factory=list)
    decorators: List[cst.Decorator] = field(default_factory=list)
    # `if`, conditional expressions and `try` (with the suite that holds an `if` statement):
    # where feature checks may sit (guards.py).
    branches: List[Tuple[Union[cst.If, cst.IfExp, cst.Try], Optional[cst.CSTNode]]] = field(
        default_factory=list
    )
    has_main_guard: bool = False
    # How many times each name is written as a variable anywhere in the file (not a keyword
    # argument `f(train=True)`, not an attribute `model.train`), how many times each name is
    # written as an attribute (`x.train`), and how many `def`/`class` statements define each
    # name (values.py: a function named more often than it is called is passed around).
    # Import statements count every name they spell, dotted parts included: project.py
    # subtracts exactly those.
    name_counts: Dict[str, int] = field(default_factory=dict)
    attribute_counts: Dict[str, int] = field(default_factory=dict)
    definition_counts: Dict[str, int] = field(default_factory=dict)
    # The functions (by id) with a `yield` of their own: generators (handoffs.passed_through).
    generators: Set[int] = field(default_factory=set)


def target_names(node: cst.BaseExpression) -> Tuple[str, ...]:
    """Every dotted name bound by an assignment or for target."""
    if isinstance(node, (cst.Tuple, cst.List)):
        names: List[str] = []
        for element in node.elements:
            names.extend(target_names(element.value))
        return tuple(names)
    if isinstance(node, cst.StarredElement):
        return target_names(node.value)
    name = dotted_name(node)
    return (name,) if name else ()


# The nodes names_bound_otherwise reads (find_all tests each node's type once).
_BINDING_OTHERWISE = (
    cst.For,
    cst.CompFor,
    cst.NamedExpr,
    cst.AsName,
    cst.ImportAlias,
    cst.Del,
    cst.FunctionDef,
    cst.ClassDef,
    cst.Global,
    cst.Nonlocal,
)


def names_bound_otherwise(root: cst.CSTNode) -> Set[str]:
    """Names bound under `root` other than by an assignment statement: loop and comprehension
    targets, `:=`, `as` names (`with`, `except`, `import`), plain imports, `del` (of a name or
    a part of it), nested `def`/`class` names, `global`/`nonlocal`."""
    bound: Set[str] = set()
    for node in find_all(root, *_BINDING_OTHERWISE):
        if isinstance(node, (cst.For, cst.CompFor, cst.NamedExpr)):
            bound.update(target_names(node.target))
        elif isinstance(node, cst.AsName):
            bound.update(target_names(node.name))
        elif isinstance(node, cst.ImportAlias) and node.asname is None:
            bound.add((dotted_name(node.name) or "").split(".")[0])
        elif isinstance(node, cst.Del):
            bound.update(n.value for n in find_all(node.target, cst.Name))
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            bound.add(node.name.value)
        elif isinstance(node, (cst.Global, cst.Nonlocal)):
            bound.update(item.name.value for item in node.names)
    bound.discard("")
    return bound


def is_main_guard(node: cst.If) -> bool:
    test = node.test
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    sides = {cst.Module(body=[]).code_for_node(test.left).strip()}
    sides.add(cst.Module(body=[]).code_for_node(test.comparisons[0].comparator).strip())
    return "__name__" in sides and bool(sides & {"'__main__'", '"__main__"'})


@lru_cache(maxsize=None)
def _is_statement(node_type: type) -> bool:
    return issubclass(node_type, cst.BaseStatement)


class Collector(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.records = Records()
        self._order = 0
        self._statements: List[cst.BaseStatement] = []
        self._loops: List[Loop] = []
        self._functions: List[FunctionNode] = []
        self._classes: List[str] = []
        self._stores: Set[cst.CSTNode] = set()
        self._pending_calls: List[cst.Call] = []
        self._suites: List[cst.CSTNode] = []
        self._imports = 0  # depth of import statements being visited
        self._not_variables: Set[int] = set()  # ids of Name nodes that name no variable
        # How many enclosing function bodies have each name as a parameter: there the name is
        # that local, not the module's name of the same spelling.
        self._parameters: Dict[str, int] = {}

    # Context ---------------------------------------------------------------------------
    def _site(self) -> Site:
        self._order += 1
        return Site(
            statement=self._statements[-1] if self._statements else None,
            loops=tuple(self._loops),
            function=self._functions[-1] if self._functions else None,
            class_name=self._classes[-1] if self._classes else None,
            order=self._order,
        )

    # The statement stack, around every statement (walk.py calls these for _walk_types;
    # LibCST's visit calls them through on_visit/on_leave, for every node).
    _walk_types = cst.BaseStatement

    def _walk_enter(self, node: cst.CSTNode) -> None:
        if _is_statement(type(node)):
            self._statements.append(node)

    def _walk_leave(self, node: cst.CSTNode) -> None:
        if _is_statement(type(node)):
            self._statements.pop()

    def on_visit(self, node: cst.CSTNode) -> bool:
        self._walk_enter(node)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        self._walk_leave(original_node)

    # The block that holds the statement being visited (for `if` statements: guards.py).
    def visit_Module(self, node: cst.Module) -> None:
        self._suites.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        self._suites.pop()

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._suites.append(node)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        self._suites.pop()

    # Scopes ----------------------------------------------------------------------------
    def _count_definition(self, name: str) -> None:
        counts = self.records.definition_counts
        counts[name] = counts.get(name, 0) + 1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._count_definition(node.name.value)
        self.records.functions.setdefault(node.name.value, node)
        self.records.imports.add_other_binding(node.name.value)
        self._functions.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._functions.pop()

    def visit_FunctionDef_body(self, node: cst.FunctionDef) -> None:
        for name in _parameter_names(node.params):
            self._parameters[name] = self._parameters.get(name, 0) + 1

    def leave_FunctionDef_body(self, node: cst.FunctionDef) -> None:
        for name in _parameter_names(node.params):
            self._parameters[name] -= 1

    def visit_Yield(self, node: cst.Yield) -> None:
        if self._functions:
            self.records.generators.add(id(self._functions[-1]))

    def visit_Param(self, node: cst.Param) -> None:
        self._not_variables.add(id(node.name))

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._count_definition(node.name.value)
        self.records.imports.add_other_binding(node.name.value)
        bases = tuple(
            self.records.imports.qualified_name(b.value) or dotted_name(b.value) for b in node.bases
        )
        self.records.classes[node.name.value] = ClassInfo(node, bases)
        self._classes.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._classes.pop()

    def visit_If(self, node: cst.If) -> None:
        self.records.branches.append((node, self._suites[-1] if self._suites else None))
        if not self._statements[:-1] and is_main_guard(node):
            self.records.has_main_guard = True

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self.records.branches.append((node, None))

    def visit_Try(self, node: cst.Try) -> None:
        self.records.branches.append((node, None))

    # Loops -----------------------------------------------------------------------------
    def _enter_loop(self, node: LoopNode, targets: Tuple[str, ...], iterable) -> None:
        loop = Loop(
            node=node,
            parent=self._loops[-1] if self._loops else None,
            function=self._functions[-1] if self._functions else None,
            targets=targets,
            iter=iterable,
            start=self._order + 1,
        )
        self.records.loops.append(loop)
        self._loops.append(loop)

    def _leave_loop(self) -> None:
        self._loops.pop().end = self._order

    def visit_For(self, node: cst.For) -> None:
        for name in target_names(node.target):
            self.records.imports.add_other_binding(name)

    def visit_For_body(self, node: cst.For) -> None:
        self._enter_loop(node, target_names(node.target), node.iter)

    def leave_For_body(self, node: cst.For) -> None:
        self._leave_loop()

    def visit_While_body(self, node: cst.While) -> None:
        self._enter_loop(node, (), None)

    def leave_While_body(self, node: cst.While) -> None:
        self._leave_loop()

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self.records.comprehensions.append(
            Comprehension(target_names(node.target), node.iter, self._site())
        )

    # Imports and bindings --------------------------------------------------------------
    def visit_Import(self, node: cst.Import) -> None:
        self.records.imports.add_import(node, top_level=not self._functions and not self._classes)
        self._imports += 1

    def leave_Import(self, original_node: cst.Import) -> None:
        self._imports -= 1

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.records.imports.add_import_from(
            node, top_level=not self._functions and not self._classes
        )
        self._imports += 1

    def leave_ImportFrom(self, original_node: cst.ImportFrom) -> None:
        self._imports -= 1

    def visit_Assign(self, node: cst.Assign) -> None:
        site = self._site()
        for target in node.targets:
            self._record_assignment(target.target, node.value, node, site)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._record_assignment(node.target, node.value, node, self._site())

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        site = self._site()
        self._stores.add(node.target)
        name = dotted_name(node.target)
        if name:
            self.records.assignments.append(
                Assignment(name, node.value, False, site, node, augmented=True)
            )

    def _record_assignment(self, target, value, statement, site: Site) -> None:
        self._stores.add(target)
        if isinstance(target, (cst.Tuple, cst.List)):
            elements = [e.value for e in target.elements]
            values = None
            starred_target = any(isinstance(e, cst.StarredElement) for e in target.elements)
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(elements):
                if not starred_target and not any(
                    isinstance(e, cst.StarredElement) for e in value.elements
                ):
                    values = [e.value for e in value.elements]
            starred = False
            for index, element in enumerate(elements):
                starred = starred or isinstance(target.elements[index], cst.StarredElement)
                if values is not None:
                    self._record_assignment(element, values[index], statement, site)
                else:
                    single = isinstance(element, (cst.Name, cst.Attribute))
                    position = index if single and not starred else None
                    for name in target_names(element):
                        self._bind(name)
                        self.records.assignments.append(
                            Assignment(name, value, True, site, statement, index=position)
                        )
                    self._stores.add(element)
            return
        name = dotted_name(target)
        if name:
            self._bind(name)
            self.records.assignments.append(Assignment(name, value, False, site, statement))

    def _bind(self, name: str) -> None:
        if "." not in name:
            self.records.imports.add_other_binding(name)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        self.records.with_items.append((node, self._site()))
        if node.asname is not None:
            for name in target_names(node.asname.name):
                self._bind(name)

    def visit_Decorator(self, node: cst.Decorator) -> None:
        self.records.decorators.append(node)

    # Calls and reads -------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        receiver = node.func.value if isinstance(node.func, cst.Attribute) else None
        self.records.calls.append(
            CallSite(
                node=node,
                qualname=None,  # resolved in collect(), once every import is known
                method=method_name(node),
                receiver=dotted_name(receiver) if receiver is not None else None,
                site=self._site(),
            )
        )

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._not_variables.add(id(node.keyword))

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) in self._not_variables or self._parameters.get(node.value):
            return
        counts = self.records.name_counts
        counts[node.value] = counts.get(node.value, 0) + 1

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if not self._imports:
            self._not_variables.add(id(node.attr))
            counts = self.records.attribute_counts
            counts[node.attr.value] = counts.get(node.attr.value, 0) + 1
        if node.attr.value == "grad" and node not in self._stores:
            self.records.grad_reads.append(AttributeRead(node, self._site()))


def _parameter_names(params: cst.Parameters) -> List[str]:
    star = [params.star_arg] if isinstance(params.star_arg, cst.Param) else []
    kwargs = [params.star_kwarg] if params.star_kwarg is not None else []
    every = (*params.posonly_params, *params.params, *star, *params.kwonly_params, *kwargs)
    return [param.name.value for param in every]


def collect(module: cst.Module) -> Records:
    collector = Collector()
    walk(module, collector)
    # Qualified names depend on every import, including ones below first use; resolve again.
    imports = collector.records.imports
    for call in collector.records.calls:
        call.qualname = imports.qualified_name(call.node.func)
    return collector.records

"""Every place a file names some objects, and how: called, used as a decorator, or as a value.

Migrating a deprecated API by rewriting its calls is sound only when the file uses the old
name in no other way: a class that is also checked with `isinstance`, subclassed or passed
around cannot be swapped for its replacement call by call. The collector records calls only,
so this walk over names runs on demand, in the rare files that call such an API at all.

Also here: editing the import statements that bind such names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Collection, Dict, List, Optional, Sequence, Tuple, Union

import libcst as cst

from optimizer_codemod.analysis.imports import ImportedName, dotted_name
from optimizer_codemod.analysis.walk import walk

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

CALL = "call"  # the name is the function of a call: `autocast(...)`
DECORATOR = "decorator"  # a bare decorator: `@custom_fwd`
VALUE = "value"  # anything else: isinstance, a base class, an argument, `__all__`, a parameter

ImportStatement = Union[cst.Import, cst.ImportFrom]


@dataclass(frozen=True)
class Reference:
    node: cst.CSTNode  # the Name/Attribute chain; the string for an `__all__` entry
    qualname: str
    use: str
    head: Optional[str]  # the local name the chain starts from
    call: Optional[cst.Call] = None
    decorator: Optional[cst.Decorator] = None


def _matches(qualname: Optional[str], prefixes: Collection[str]) -> bool:
    return qualname is not None and any(
        qualname == p or qualname.startswith(p + ".") for p in prefixes
    )


class _Walker(cst.CSTVisitor):
    def __init__(self, facts: "ScriptFacts", prefixes: Collection[str]) -> None:
        super().__init__()
        self.facts = facts
        self.prefixes = prefixes
        self.found: List[Reference] = []
        self._callers: Dict[cst.CSTNode, cst.Call] = {}
        self._decorators: Dict[cst.CSTNode, cst.Decorator] = {}

    def _record(self, node: cst.BaseExpression) -> bool:
        qualname = self.facts.qualified_name(node)
        if not _matches(qualname, self.prefixes):
            return False
        call = self._callers.get(node)
        decorator = self._decorators.get(node)
        use = CALL if call is not None else DECORATOR if decorator is not None else VALUE
        head = (dotted_name(node) or "").split(".")[0] or None
        self.found.append(Reference(node, qualname, use, head, call, decorator))
        return True

    # Import statements bind names; they do not use them.
    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Call(self, node: cst.Call) -> None:
        self._callers[node.func] = node

    def visit_Decorator(self, node: cst.Decorator) -> None:
        self._decorators[node.decorator] = node

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if not self._record(node):
            walk(node.value, self)  # `x.autocast`: the attribute name is no reference
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self._record(node)

    def visit_Arg(self, node: cst.Arg) -> bool:
        walk(node.value, self)  # keyword names are no references
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        # A parameter named like an import shadows it in its function: the import table cannot
        # tell, so the parameter counts as a use that no rewrite can follow.
        self._record(node.name)
        for part in (node.annotation, node.default):
            if part is not None:
                walk(part, self)
        return False

    def _exported(self, target: cst.BaseExpression, value: Optional[cst.BaseExpression]) -> None:
        if not (isinstance(target, cst.Name) and target.value == "__all__"):
            return
        if isinstance(value, (cst.List, cst.Tuple)):
            for element in value.elements:
                if isinstance(element.value, cst.SimpleString):
                    name = element.value.evaluated_value
                    if isinstance(name, str) and name.isidentifier():
                        qualname = self.facts.qualified_name(cst.Name(name))
                        if _matches(qualname, self.prefixes):
                            self.found.append(Reference(element.value, qualname, VALUE, name))

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._exported(target.target, node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._exported(node.target, node.value)


def find_references(facts: "ScriptFacts", prefixes: Collection[str]) -> List[Reference]:
    """Every use of a name whose qualified name is one of `prefixes` or lies under one."""
    walker = _Walker(facts, tuple(prefixes))
    walk(facts.module, walker)
    return walker.found


def by_head(references: Sequence[Reference]) -> Dict[str, List[Reference]]:
    table: Dict[str, List[Reference]] = {}
    for reference in references:
        if reference.head:
            table.setdefault(reference.head, []).append(reference)
    return table


def by_statement(bindings: Sequence[ImportedName]) -> Dict[cst.CSTNode, List[ImportedName]]:
    """Import bindings grouped by the import statement that makes them, in source order."""
    table: Dict[cst.CSTNode, List[ImportedName]] = {}
    for binding in bindings:
        table.setdefault(binding.statement, []).append(binding)
    return table


# Editing import statements ------------------------------------------------------------------
def dotted(name: str) -> Union[cst.Name, cst.Attribute]:
    """The expression `a.b.c` for the text "a.b.c"."""
    head, *rest = name.split(".")
    node: Union[cst.Name, cst.Attribute] = cst.Name(head)
    for part in rest:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def without_aliases(
    statement: ImportStatement, aliases: Collection[cst.ImportAlias]
) -> ImportStatement:
    """`statement` minus `aliases` (at least one alias must remain), separators kept."""
    names = list(statement.names)
    kept = [alias for alias in names if alias not in aliases]
    assert kept, "an import statement cannot lose every name"
    if names[-1] not in kept:  # the new last name takes over the old last name's comma
        kept[-1] = kept[-1].with_changes(comma=names[-1].comma)
    return statement.with_changes(names=kept)


def with_module(statement: cst.ImportFrom, module: str) -> cst.ImportFrom:
    """`from module import ...` with the same names, layout and comments."""
    return statement.with_changes(module=dotted(module))


def with_alias_module(statement: cst.Import, renames: Dict[cst.ImportAlias, str]) -> cst.Import:
    """`import a.b as x` with some aliases pointing at other modules (`import c.d as x`)."""
    names = [
        alias.with_changes(name=dotted(renames[alias])) if alias in renames else alias
        for alias in statement.names
    ]
    return statement.with_changes(names=names)


def import_names(module: str, names: Sequence[Tuple[str, Optional[str]]]) -> cst.ImportFrom:
    """`from module import a, b as c`."""
    aliases = [
        cst.ImportAlias(
            name=cst.Name(name),
            asname=cst.AsName(name=cst.Name(asname)) if asname else None,
            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
        )
        for name, asname in names
    ]
    aliases[-1] = aliases[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return cst.ImportFrom(module=dotted(module), names=aliases)

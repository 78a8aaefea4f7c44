"""The imports a fix needs, added as LibCST's AddImportsVisitor adds them, at a fraction of the
cost.

AddImportsVisitor is a matcher-decorated transformer: building one inspects its methods'
type hints, and the two it builds for one module (the transformer and its import gatherer)
took about 15 ms each, plus 0.3 to 0.8 s to import `libcst.codemod` once per process; on
training scripts, where many files gain an `import torch` or `import os`, that was a tenth of
a cold run. What it does with an absolute import and no package name (a fix's imports, in a
CodemodContext without `full_package_name`) is short, and repeated here step by step:

1. The imports "at the top" are the statements that are one lone `import`/`from` each, from
   the first statement on (the second when the first is a docstring or `__strict__ = ...`)
   to the first that is not.
2. Wanted imports those already provide are dropped: `import m` by `import m`; `import m as
   a` by the same alias; `from m import o [as a]` by the same names, or by `*`.
3. The first top `from m import ...` (not `*`) of a module that still has names to add gets
   them in front of its own, sorted (unaliased first).
4. What is left goes after the top imports: `from __future__` ones before them, then
   `import m` sorted, `import m as a`, `from m import ...`; the statement after them gets a
   blank line above it if it had none or its first leading line is a comment.

tests/test_add_imports.py compares the two on generated module heads and imports.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from optimizer_codemod.notebook import is_cell_marker, is_magic_placeholder


def add_imports(module: cst.Module, specs: Sequence) -> cst.Module:
    """`module` with the imports `specs` ask for (`module`, `obj`, `asname` each)."""
    body = list(module.body)
    start = 1 if _skip_first(body) else 0
    cells = _notebook_cell_starts(module)
    if cells:
        start = _first_importing_cell(body, cells, start)
    top: List[Tuple[int, cst.BaseSmallStatement]] = []
    for index in range(start, len(body)):
        if index > start and index in cells:
            break
        small = _lone_import(body[index])
        if small is None:
            break
        top.append((index, small))

    wanted = _Wanted(specs)
    wanted.drop_present([small for _, small in top])
    for index, small in top:
        if isinstance(small, cst.ImportFrom):
            merged = wanted.merge_into(small)
            if merged is not None:
                body[index] = body[index].with_changes(body=[merged])
    if wanted.empty():
        return module.with_changes(body=body)

    add_at = top[-1][0] + 1 if top else start
    after = body[add_at:]
    if after and add_at not in cells:
        first = after[0]
        if not first.leading_lines:
            after[0] = first.with_changes(leading_lines=(cst.EmptyLine(),))
        elif first.leading_lines[0].comment is not None:
            after[0] = first.with_changes(leading_lines=(cst.EmptyLine(), *first.leading_lines))
    config = module.config_for_parsing

    def line(text: str) -> cst.BaseStatement:
        return cst.parse_statement(text, config=config)

    from_lines = wanted.from_imports()
    return module.with_changes(
        body=(
            *body[:start],
            *[line(text) for module_name, text in from_lines if module_name == "__future__"],
            *body[start:add_at],
            *[line(f"import {name}") for name in sorted(wanted.modules)],
            *[line(f"import {name} as {alias}") for name, alias in wanted.module_aliases.items()],
            *[line(text) for module_name, text in from_lines if module_name != "__future__"],
            *after,
        )
    )


class _Wanted:
    def __init__(self, specs: Sequence) -> None:
        self.modules: Set[str] = {s.module for s in specs if s.obj is None and s.asname is None}
        self.objects: Dict[str, Set[str]] = {
            module: {
                s.obj
                for s in specs
                if s.module == module and s.obj is not None and s.asname is None
            }
            for module in sorted(
                {s.module for s in specs if s.obj is not None and s.asname is None}
            )
        }
        self.module_aliases: Dict[str, str] = {
            s.module: s.asname for s in specs if s.obj is None and s.asname is not None
        }
        self.aliased_objects: Dict[str, List[Tuple[str, str]]] = {
            module: [
                (s.obj, s.asname)
                for s in specs
                if s.module == module and s.obj is not None and s.asname is not None
            ]
            for module in sorted(
                {s.module for s in specs if s.obj is not None and s.asname is not None}
            )
        }

    def empty(self) -> bool:
        return not (self.modules or self.objects or self.module_aliases or self.aliased_objects)

    def drop_present(self, imports: Sequence[cst.BaseSmallStatement]) -> None:
        modules: Set[str] = set()
        module_aliases: Dict[str, str] = {}
        objects: Dict[str, Set[str]] = {}
        aliased: Dict[str, List[Tuple[str, Optional[str]]]] = {}
        for node in imports:
            if isinstance(node, cst.Import):
                for name in node.names:
                    if name.asname is not None:
                        module_aliases[name.evaluated_name] = name.evaluated_alias
                    else:
                        modules.add(name.evaluated_name)
                continue
            module = _from_module(node)
            if module is None:
                continue
            if isinstance(node.names, cst.ImportStar):
                objects[module] = {"*"}
                continue
            new_aliases = [
                (a.evaluated_name, a.evaluated_alias) for a in node.names if a.asname is not None
            ]
            if new_aliases:
                aliased.setdefault(module, []).extend(new_aliases)
            new_objects = {a.evaluated_name for a in node.names if a.asname is None}
            if new_objects:
                known = objects.setdefault(module, set())
                if "*" in known:
                    objects[module] = {"*"}
                    continue
                known.update(new_objects)
        self.modules -= modules
        for module, alias in module_aliases.items():
            if self.module_aliases.get(module) == alias:
                del self.module_aliases[module]
        for module, pairs in aliased.items():
            for pair in pairs:
                if module in self.aliased_objects and pair in self.aliased_objects[module]:
                    self.aliased_objects[module].remove(pair)
                    if not self.aliased_objects[module]:
                        del self.aliased_objects[module]
        for module, names in objects.items():
            if module not in self.objects:
                continue
            if "*" in names:
                del self.objects[module]
                continue
            self.objects[module] -= names
            if not self.objects[module]:
                del self.objects[module]

    def merge_into(self, node: cst.ImportFrom) -> Optional[cst.ImportFrom]:
        """`node` with the names still wanted from its module in front; None if none are."""
        if isinstance(node.names, cst.ImportStar):
            return None
        module = _from_module(node)
        if module is None or (module not in self.objects and module not in self.aliased_objects):
            return None
        names = sorted(self.objects.pop(module, ()))
        aliases = sorted(self.aliased_objects.pop(module, ()))
        return node.with_changes(
            names=[
                *(cst.ImportAlias(name=cst.Name(name)) for name in names),
                *(
                    cst.ImportAlias(name=cst.Name(name), asname=cst.AsName(name=cst.Name(alias)))
                    for name, alias in aliases
                ),
                *node.names,
            ]
        )

    def from_imports(self) -> List[Tuple[str, str]]:
        """(module, `from module import ...` line) for the names still wanted."""
        by_module: Dict[str, list] = {}
        for module, pairs in self.aliased_objects.items():
            by_module.setdefault(module, []).extend(pairs)
        for module, names in self.objects.items():
            by_module.setdefault(module, []).extend((name, None) for name in names)
        return [
            (
                module,
                f"from {module} import "
                + ", ".join(
                    name if alias is None else f"{name} as {alias}" for name, alias in sorted(pairs)
                ),
            )
            for module, pairs in by_module.items()
        ]


def _notebook_cell_starts(module: cst.Module) -> Set[int]:
    """In a notebook's Python text, the statements that begin a cell (its first is 0); empty
    for a script."""
    if not any(_marks_a_cell(line) for line in module.header):
        return set()
    return {0} | {
        index
        for index, statement in enumerate(module.body)
        if any(_marks_a_cell(line) for line in statement.leading_lines)
    }


def _marks_a_cell(line: cst.EmptyLine) -> bool:
    return line.comment is not None and is_cell_marker(line.comment.value)


def _first_importing_cell(body: Sequence[cst.BaseStatement], cells: Set[int], start: int) -> int:
    """Where a notebook's imports are: the first cell that begins with one (after its magics),
    so that a fix's import joins the cell every session runs first, not a later cell whose top
    happens to continue the run of imports (one that only displays an image)."""
    for cell in sorted(cells):
        index = max(cell, start)
        while index < len(body) and (index == cell or index not in cells):
            if _lone_import(body[index]) is not None:
                return index
            if not _masked_magic(body[index]):
                break
            index += 1
    return start


def _masked_magic(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.Name)
        and is_magic_placeholder(statement.body[0].value.value)
    )


def _skip_first(body: Sequence[cst.BaseStatement]) -> bool:
    """A docstring or a `__strict__ = ...` flag first: imports never go above it."""
    if not body or not isinstance(body[0], cst.SimpleStatementLine) or len(body[0].body) != 1:
        return False
    small = body[0].body[0]
    if isinstance(small, cst.Expr):
        return isinstance(small.value, cst.SimpleString)
    return (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
        and small.targets[0].target.value == "__strict__"
    )


def _lone_import(statement: cst.BaseStatement) -> Optional[cst.BaseSmallStatement]:
    if (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], (cst.Import, cst.ImportFrom))
    ):
        return statement.body[0]
    return None


def _from_module(node: cst.ImportFrom) -> Optional[str]:
    """The module of an absolute `from` import; None for a relative one (no package is known
    here, as in a CodemodContext without `full_package_name`)."""
    if node.relative:
        return None
    return _dotted(node.module) if node.module is not None else None


def _dotted(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return None

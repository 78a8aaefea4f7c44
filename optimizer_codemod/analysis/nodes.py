"""Finding nodes by type in a subtree.

LibCST's matchers do this too, but importing `libcst.matchers` costs about 150 ms, a tenth of
what a whole `apply` over a typical project takes; a plain walk over `children` is enough here.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Type

import libcst as cst
from optimizer_codemod.analysis.walk import children

# Node classes derive from an abstract base class, so `isinstance` against them goes through
# ABCMeta's check on every call; which node types match a type tuple is answered once here.
_MATCHES: Dict[Tuple[type, ...], Dict[type, bool]] = {}


# String literals, implicitly joined or not.
STRING_NODES = (cst.SimpleString, cst.ConcatenatedString)


def find_all(tree: cst.CSTNode, *types: Type[cst.CSTNode]) -> List[cst.CSTNode]:
    """Every node of one of `types` in `tree` (the tree itself included), in source order;
    every node when no type is given."""
    found: List[cst.CSTNode] = []
    stack = [tree]
    pop, push = stack.pop, stack.extend
    matches = _MATCHES.get(types) if types else None
    if types and matches is None:
        matches = _MATCHES[types] = {}
    while stack:
        node = pop()
        if matches is None:
            found.append(node)
        else:
            node_type = type(node)
            hit = matches.get(node_type)
            if hit is None:
                hit = matches[node_type] = issubclass(node_type, types)
            if hit:
                found.append(node)
        below = children(node)
        if below:
            below.reverse()
            push(below)
    return found


def root_name(node: cst.BaseExpression) -> Optional[str]:
    """The name an attribute, subscript or call chain starts from: `model` of
    `model.parameters()`, `model.module.head` and `model[0]`; None for anything else."""
    while isinstance(node, (cst.Call, cst.Attribute, cst.Subscript)):
        node = node.func if isinstance(node, cst.Call) else node.value
    return node.value if isinstance(node, cst.Name) else None


def is_name(node: cst.CSTNode, value: str) -> bool:
    return isinstance(node, cst.Name) and node.value == value


def single_assignment(line: cst.CSTNode, name: str) -> Optional[cst.Assign]:
    """The statement `name = value` when it stands alone on `line`, else None."""
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    small = line.body[0]
    if (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and is_name(small.targets[0].target, name)
    ):
        return small
    return None


def lone_call(line: Optional[cst.CSTNode], call: cst.CSTNode) -> bool:
    """`line` holds nothing but the expression statement `call`: deleting the line deletes
    the call and nothing else."""
    return (
        isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
        and isinstance(line.body[0], cst.Expr)
        and line.body[0].value is call
    )


def under_with(statements: Sequence[cst.BaseStatement], context: str) -> cst.With:
    """`with context:` holding consecutive `statements`; the comments and blank lines above
    the first statement move above the `with`."""
    first = statements[0]
    return cst.With(
        items=[cst.WithItem(cst.parse_expression(context))],
        body=cst.IndentedBlock(body=[first.with_changes(leading_lines=()), *statements[1:]]),
        leading_lines=first.leading_lines,
    )


def without_comment(line: cst.SimpleStatementLine) -> cst.TrailingWhitespace:
    """`line`'s end without its trailing comment: for a line whose code a rule replaces, the
    comment described the old code and would mislead beside the new."""
    return line.trailing_whitespace.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None)


# Comments that steer tools rather than describe code: they stay when their code goes.
TOOL_COMMENTS = ("# fmt:", "# noqa", "# type:", "# pylint:", "# pragma", "# isort:", "# optcodemod")


def without_attached_comments(lines: Sequence[cst.EmptyLine]) -> List[cst.EmptyLine]:
    """The leading lines of a statement whose code a rule removes or replaces, less the
    comments attached to it (the comment block right above it, no blank line between): they
    described that code. Blank lines, comments set apart by a blank line, and tool directives
    (`# fmt: off`, `# noqa`) stay."""
    attached = len(lines)
    while attached > 0 and lines[attached - 1].comment is not None:
        attached -= 1
    return [
        line
        for index, line in enumerate(lines)
        if index < attached
        or line.comment is None
        or line.comment.value.lower().startswith(TOOL_COMMENTS)
    ]


def is_docstring(statement: cst.CSTNode) -> bool:
    """A statement that is a string literal alone (a docstring where it comes first)."""
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


# The expressions that bind their own loop variables.
COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)


def parameters_of(params: cst.Parameters) -> List[cst.Param]:
    """Every parameter of a function or lambda: positional, keyword-only, `*args`, `**kw`."""
    found = [*params.posonly_params, *params.params, *params.kwonly_params]
    for extra in (params.star_arg, params.star_kwarg):
        if isinstance(extra, cst.Param):
            found.append(extra)
    return found


def returned_values(function: cst.CSTNode) -> List[cst.BaseExpression]:
    """What the function's own `return` statements return (not those of nested functions)."""
    nested = {
        id(r)
        for inner in find_all(function.body, cst.FunctionDef)
        for r in find_all(inner.body, cst.Return)
    }
    return [
        r.value
        for r in find_all(function.body, cst.Return)
        if r.value is not None and id(r) not in nested
    ]

"""Reading and editing call arguments without disturbing the author's layout."""

from __future__ import annotations

import ast
from typing import Any, Optional, Sequence

import libcst as cst

_NO_VALUE = object()

# Methods that return the module they are called on (placed, cast or switched mode).
MODULE_RETURNING_METHODS = frozenset(
    {"to", "cuda", "cpu", "float", "train", "eval", "requires_grad_"}
)


def keyword(call: cst.Call, name: str) -> Optional[cst.Arg]:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def positional(call: cst.Call) -> Sequence[cst.Arg]:
    return [a for a in call.args if a.keyword is None and not a.star]


def argument(call: cst.Call, name: str, position: int) -> Optional[cst.Arg]:
    """The argument bound to parameter `name` (given by keyword or at `position`)."""
    found = keyword(call, name)
    if found is not None:
        return found
    args = positional(call)
    if has_star_args(call):
        return None
    return args[position] if position < len(args) else None


def has_double_star(call: cst.Call) -> bool:
    return any(arg.star == "**" for arg in call.args)


def has_star_args(call: cst.Call) -> bool:
    return any(arg.star == "*" for arg in call.args)


def literal(node: Optional[cst.BaseExpression], default: Any = _NO_VALUE) -> Any:
    """The Python value of a literal expression (numbers, strings, True/False/None, tuples)."""
    if node is None:
        return default
    try:
        return ast.literal_eval(cst.Module(body=[]).code_for_node(node).strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return default


def is_literal(node: Optional[cst.BaseExpression], value: Any) -> bool:
    found = literal(node)
    return found is not _NO_VALUE and type(found) is type(value) and found == value


def code_of(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def excerpt(node: cst.CSTNode, limit: int = 60) -> str:
    """`node`'s code on one line, shortened to `limit` characters: for messages."""
    text = " ".join(code_of(node).split()).replace("( ", "(").replace(", )", ")")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bare_line_break(whitespace: cst.BaseParenthesizableWhitespace):
    """A line break copied for a new line: without the comment or the spaces that ended the
    line it was copied from (`batch_size=64, ` would give `shuffle=True, ` a trailing space)."""
    if isinstance(whitespace, cst.ParenthesizedWhitespace):
        return whitespace.with_changes(
            first_line=whitespace.first_line.with_changes(
                comment=None, whitespace=cst.SimpleWhitespace("")
            )
        )
    return whitespace


def _with_last_line(whitespace: cst.BaseParenthesizableWhitespace, last_line: str):
    if isinstance(whitespace, cst.ParenthesizedWhitespace):
        return whitespace.with_changes(last_line=cst.SimpleWhitespace(last_line))
    return cst.SimpleWhitespace(" ")


def _indent_before(call: cst.Call, index: int) -> Optional[str]:
    """The indentation in front of argument `index` when it starts a line."""
    if index == 0:
        before = call.whitespace_before_args
    else:
        comma = call.args[index - 1].comma
        before = comma.whitespace_after if isinstance(comma, cst.Comma) else None
    if isinstance(before, cst.ParenthesizedWhitespace):
        return before.last_line.value
    return None


def with_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """`call` with `name=value` appended, keeping one-argument-per-line layouts and comments.

    Callers make sure no `**kwargs` could already carry `name`.
    """
    new_arg = cst.Arg(value=value, keyword=cst.Name(name), equal=_keyword_equal(call))
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new_arg])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # a trailing comma: the new argument goes last
        indent = _indent_before(call, len(args) - 1)
        trailing = last.comma.whitespace_after
        args[-1] = last.with_changes(
            comma=last.comma.with_changes(
                whitespace_after=(
                    _with_last_line(trailing, indent)
                    if indent is not None
                    else cst.SimpleWhitespace(" ")
                )
            )
        )
        new_arg = new_arg.with_changes(
            comma=cst.Comma(
                whitespace_before=last.comma.whitespace_before,
                whitespace_after=bare_line_break(trailing),
            )
        )
    elif (
        len(args) > 1
        and _indent_before(call, len(args) - 1) is not None
        and isinstance(last.whitespace_after_arg, cst.ParenthesizedWhitespace)
    ):
        # One argument per line, without a trailing comma: the new one gets its own line, and
        # a comment ending the last argument's line stays on that line. (A lone argument on
        # its own line is black's hugging layout, handled below.)
        closing = last.whitespace_after_arg
        args[-1] = last.with_changes(
            comma=cst.Comma(
                whitespace_after=_with_last_line(closing, _indent_before(call, len(args) - 1))
            ),
            whitespace_after_arg=cst.SimpleWhitespace(""),
        )
        new_arg = new_arg.with_changes(whitespace_after_arg=bare_line_break(closing))
    elif len(args) > 1 and _indent_before(call, len(args) - 1) is not None:
        # One argument per line, `)` hugging the last one (`    momentum=0.9)`,
        # PyTorch-YOLOv3's train.py): the new one gets its own line and `)` follows it.
        line_break = args[-2].comma.whitespace_after
        args[-1] = last.with_changes(
            comma=cst.Comma(whitespace_after=bare_line_break(line_break)),
            whitespace_after_arg=cst.SimpleWhitespace(""),
        )
        new_arg = new_arg.with_changes(whitespace_after_arg=last.whitespace_after_arg)
    else:
        # The space before `)` (a line break in black's hugging layout, `f(\n    a, b\n)`)
        # moves behind the new argument, so `)` stays where it was.
        args[-1] = last.with_changes(
            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
            whitespace_after_arg=cst.SimpleWhitespace(""),
        )
        new_arg = new_arg.with_changes(whitespace_after_arg=last.whitespace_after_arg)
    return call.with_changes(args=[*args, new_arg])


def _keyword_equal(call: cst.Call) -> cst.AssignEqual:
    """`=` spaced as the call's own keywords are (`lr = 0.1` in a file written that way)."""
    for arg in call.args:
        equal = arg.equal
        if (
            arg.keyword is not None
            and isinstance(equal, cst.AssignEqual)
            and isinstance(equal.whitespace_before, cst.SimpleWhitespace)
            and isinstance(equal.whitespace_after, cst.SimpleWhitespace)
        ):
            return cst.AssignEqual(
                whitespace_before=equal.whitespace_before, whitespace_after=equal.whitespace_after
            )
    empty = cst.SimpleWhitespace("")
    return cst.AssignEqual(whitespace_before=empty, whitespace_after=empty)


def without_argument(call: cst.Call, arg: cst.Arg) -> cst.Call:
    """`call` without `arg`, keeping the separators of the remaining arguments."""
    args = list(call.args)
    if args == [arg]:
        return call.with_changes(args=[], whitespace_before_args=_emptied_parens(call, arg))
    index = next(i for i, a in enumerate(args) if a is arg)
    del args[index]
    if args and index == len(args):  # removed the last one: the new last keeps its comma style
        previous_last = args[-1]
        args[-1] = previous_last.with_changes(comma=arg.comma)
    return call.with_changes(args=args)


def _emptied_parens(call: cst.Call, arg: cst.Arg) -> cst.BaseParenthesizableWhitespace:
    """The whitespace inside `f()` once its only argument is gone: `()`, or its comments."""
    comma = arg.comma if isinstance(arg.comma, cst.Comma) else None
    spaces = [call.whitespace_before_args, arg.whitespace_after_arg]
    if comma is not None:
        spaces += [comma.whitespace_before, comma.whitespace_after]
    broken = [w for w in spaces if isinstance(w, cst.ParenthesizedWhitespace)]
    comments = [
        line.comment
        for w in broken
        for line in (w.first_line, *w.empty_lines)
        if line.comment is not None
    ]
    if not comments:
        return cst.SimpleWhitespace("")
    before = call.whitespace_before_args
    inner = before.last_line.value if isinstance(before, cst.ParenthesizedWhitespace) else "    "
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(),
        empty_lines=[
            cst.EmptyLine(indent=True, whitespace=cst.SimpleWhitespace(inner), comment=c)
            for c in comments
        ],
        indent=True,
        last_line=broken[-1].last_line,
    )


def method_name(call: cst.Call) -> Optional[str]:
    """`step` for `optimizer.step(...)`."""
    if isinstance(call.func, cst.Attribute):
        return call.func.attr.value
    return None


def callee_name(call: cst.Call) -> Optional[str]:
    """`fit` for `fit(...)` and for `trainer.fit(...)`: the called name, without its receiver."""
    if isinstance(call.func, cst.Name):
        return call.func.value
    return method_name(call)


def receiver(call: cst.Call) -> Optional[cst.BaseExpression]:
    """`optimizer` for `optimizer.step(...)`."""
    if isinstance(call.func, cst.Attribute):
        return call.func.value
    return None


def with_first_argument(call: cst.Call, value: cst.BaseExpression) -> cst.Call:
    """`call` with a positional `value` put before its arguments, in the layout they use."""
    if not call.args:
        return call.with_changes(args=[cst.Arg(value=value)])
    before = call.whitespace_before_args
    after_comma = (
        bare_line_break(before)
        if isinstance(before, cst.ParenthesizedWhitespace)  # one argument per line
        else cst.SimpleWhitespace(" ")
    )
    first = cst.Arg(value=value, comma=cst.Comma(whitespace_after=after_comma))
    return call.with_changes(args=[first, *call.args])


def as_keyword(arg: cst.Arg, name: str) -> cst.Arg:
    """A positional argument passed by keyword instead: `x` becomes `name=x`."""
    return arg.with_changes(
        keyword=cst.Name(name),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        ),
    )


def is_prepare(node: cst.BaseExpression) -> bool:
    """`accelerator.prepare(...)`: whether it is Accelerate's is the caller's question."""
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "prepare"
    )


def is_minus_one(node: cst.BaseExpression) -> bool:
    """`-1` as written: a size left to be inferred (`x.view(n, -1)`, PyG's `Linear(-1, 64)`)."""
    return (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, cst.Integer)
        and node.expression.value == "1"
    )

"""Invariants every rewrite must satisfy, shared by the fixture harness and property tests."""

from __future__ import annotations

import ast
import io
import tokenize
from collections import Counter
from typing import Iterable, List, Sequence, Tuple

from optimizer_codemod.diagnostics import Diagnostic, Status

_NESTED_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")


def comments(source: str) -> Counter:
    found: Counter = Counter()
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                found[token.string.strip()] += 1
    except (tokenize.TokenError, SyntaxError):
        pass
    return found


def comments_of_replaced_code(before: str, after: str) -> Counter:
    """Comments at the end of a line whose code is gone from `after` (a rule replaced it), or
    on their own lines right above such a line (no blank line between): they described that
    code, and may go with it (DESIGN.md §4)."""
    found: Counter = Counter()
    lines = before.splitlines()

    def gone(code: str) -> bool:
        return bool(code) and len(code) > 2 and code not in after

    try:
        for token in tokenize.generate_tokens(io.StringIO(before).readline):
            if token.type != tokenize.COMMENT:
                continue
            code = lines[token.start[0] - 1][: token.start[1]].strip()
            if not code:
                below = token.start[0]
                while below < len(lines) and lines[below].lstrip().startswith("#"):
                    below += 1
                code = lines[below].split("#")[0].strip() if below < len(lines) else ""
            if gone(code):
                found[token.string.strip()] += 1
    except (tokenize.TokenError, SyntaxError):
        pass
    return found


def assert_comments_kept(before: str, after: str) -> None:
    lost = comments(before) - comments(after) - comments_of_replaced_code(before, after)
    assert not lost, f"comments lost by the rewrite: {sorted(lost)}"


def _nested_lines(node: ast.stmt) -> List[int]:
    lines = []
    for name in _NESTED_FIELDS:
        for child in getattr(node, name, None) or []:
            lines.append(child.lineno if hasattr(child, "lineno") else child.pattern.lineno)
    return lines


def statement_units(tree: ast.AST) -> List[Tuple[int, int, str]]:
    """(first line, last line, position-free dump) per statement; compounds by header only."""
    units = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        nested = _nested_lines(node)
        if not nested:
            units.append((node.lineno, node.end_lineno or node.lineno, _dump(node)))
            continue
        decorators = [d.lineno for d in getattr(node, "decorator_list", [])]
        first = min([node.lineno, *decorators])
        header = type(node)(
            **{
                name: ([] if name in _NESTED_FIELDS else value)
                for name, value in ast.iter_fields(node)
            }
        )
        units.append((first, max(first, min(nested) - 1), _dump(header)))
    return units


def _dump(node: ast.AST) -> str:
    return ast.dump(node, include_attributes=False)


def _touches(first: int, last: int, ranges: Sequence[Tuple[int, int]]) -> bool:
    return any(not (last < a or b < first) for a, b in ranges)


def assert_untouched_statements_kept(
    before: str, after: str, diagnostics: Iterable[Diagnostic]
) -> None:
    """Every statement outside the fixes' edit ranges is still in the output, unchanged.

    Imports are exempt: fixes may add to them.
    """
    ranges = [r for d in diagnostics if d.status is Status.FIXED for r in d.edit_lines]
    after_units = Counter(dump for _, _, dump in statement_units(ast.parse(after)))
    expected = Counter(
        dump
        for first, last, dump in statement_units(ast.parse(before))
        if not _touches(first, last, ranges) and not dump.startswith(("Import(", "ImportFrom("))
    )
    missing = expected - after_units
    assert not missing, "statements outside the edits changed:\n" + "\n".join(missing)

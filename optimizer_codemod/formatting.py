"""Formatting the lines a rule changed the way the file's project formats code (black).

When the nearest pyproject.toml above a file has a `[tool.black]` table, the lines the rules
changed are reformatted by black under that configuration, using black's line ranges, so every
other line stays byte-identical. Without such a table, or without black installed, the rules'
edits keep the layout of what they touch (a keyword joins a hugged argument line), and a
changed line that grew past the limit is split the way black splits it (wrap_long_calls), so a
black-clean file stays black-clean either way. black is imported only when configured.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import token
import tokenize
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.walk import children, parents
from optimizer_codemod.chunks import statement_spans
from optimizer_codemod.linediff import opcodes
from optimizer_codemod.extras import BLACK_INSTALL
from optimizer_codemod.lines import split_lines
from optimizer_codemod.positions import positions

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class BlackStyle:
    """The subset of `[tool.black]` that decides how code looks (picklable for workers)."""

    pyproject: str
    line_length: int = 88
    target_versions: Tuple[str, ...] = ()
    string_normalization: bool = True
    magic_trailing_comma: bool = True
    preview: bool = False
    # black's exclude regexes, matched against "/" + the path relative to the pyproject folder.
    excludes: Tuple[str, ...] = ()

    def excludes_path(self, path: Path) -> bool:
        try:
            relative = path.resolve().relative_to(Path(self.pyproject).parent)
        except ValueError:
            return False
        target = "/" + relative.as_posix()
        return any(_black_regex(pattern).search(target) for pattern in self.excludes)


def _black_regex(pattern: str) -> "re.Pattern[str]":
    # black compiles multi-line patterns in verbose mode; so must we, to match the same files.
    return re.compile(pattern, re.VERBOSE if "\n" in pattern else 0)


class FormatterUnavailable(Exception):
    """The project configures black but black cannot be imported here."""


@lru_cache(maxsize=256)
def black_style_for_directory(directory: str) -> Optional[BlackStyle]:
    folder = Path(directory)
    for candidate in (folder, *folder.parents):
        pyproject = candidate / "pyproject.toml"
        if not pyproject.is_file():
            continue
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
            return None  # the configuration loader reports unreadable files
        table = data.get("tool", {}).get("black") if isinstance(data.get("tool"), dict) else None
        if not isinstance(table, dict):
            return None  # the file's project does not use black
        targets = table.get("target-version", table.get("target_version", ())) or ()
        excludes = tuple(
            str(table[key])
            for key in ("exclude", "extend-exclude", "force-exclude")
            if table.get(key)
        )
        return BlackStyle(
            pyproject=str(pyproject),
            line_length=int(table.get("line-length", table.get("line_length", 88))),
            target_versions=tuple(str(t).upper() for t in targets),
            string_normalization=not table.get("skip-string-normalization", False),
            magic_trailing_comma=not table.get("skip-magic-trailing-comma", False),
            preview=bool(table.get("preview", False)),
            excludes=excludes,
        )
    return None


def black_style_for(path: str) -> Optional[BlackStyle]:
    if path in ("-", "<string>") or not path:
        return None
    style = black_style_for_directory(str(Path(path).resolve().parent))
    if style is not None and style.excludes_path(Path(path)):
        return None  # black leaves this file alone, and so do we
    return style


def changed_line_ranges(old: str, new: str) -> List[Tuple[int, int]]:
    """1-based inclusive ranges of lines in `new` that differ from `old`."""
    codes = opcodes(split_lines(old, keepends=True), split_lines(new, keepends=True))
    return [(j1 + 1, j2) for tag, _, _, j1, j2 in codes if tag != "equal" and j2 > j1]


def format_changed_lines(old: str, new: str, style: BlackStyle) -> str:
    """`new` with only the lines that differ from `old` reformatted by black."""
    try:
        import black
    except ImportError:
        raise FormatterUnavailable(
            f"{style.pyproject} configures black, but black is not installed; "
            f"changed lines keep optcodemod's formatting ({BLACK_INSTALL})"
        ) from None
    ranges = changed_line_ranges(old, new)
    if not ranges:
        return new
    mode = black.Mode(
        target_versions={black.TargetVersion[t] for t in style.target_versions},
        line_length=style.line_length,
        string_normalization=style.string_normalization,
        magic_trailing_comma=style.magic_trailing_comma,
        preview=style.preview,
    )
    try:
        return black.format_file_contents(new, fast=False, mode=mode, lines=ranges)
    except black.NothingChanged:
        return new


# Without a formatter configured, a line that a rule made too long is split the way black
# splits it, so a black-clean file stays black-clean without black: at the bracket that ends
# the line, its contents hugged on one line when they fit, else one element per line with a
# trailing comma; a tuple assigned or returned goes in parentheses, one element per line.
# Only brackets on changed lines move; a line this cannot split as black would stays as the
# rule wrote it.
DEFAULT_LINE_LIMIT = 88
_BOM = "\ufeff"
MAX_ROUNDS = 8
_BRACKETED = (cst.Call, cst.List, cst.Tuple, cst.Set, cst.Dict)


def wrap_long_calls(old: str, new: str, line_length: Optional[int] = None) -> str:
    """`new` with each changed line that grew past the limit split as black would split it.

    The limit is `line_length` (a configured black's), else 88 characters (black's default),
    or the original's longest line when that is longer: a file written to 120 columns stays
    at 120.
    """
    if new.startswith(_BOM) and old.startswith(_BOM):
        # LibCST reads a text's BOM as an encoding mark and prints the module without it.
        return _BOM + wrap_long_calls(old[1:], new[1:], line_length)
    limit = line_length or max(DEFAULT_LINE_LIMIT, _written_width(old))
    changed = _changed_lines(old, new)
    exploded = _explode_long_imports(new, changed, limit)
    if exploded is not new:
        new, changed = exploded, _changed_lines(old, exploded)
    for round_number in range(MAX_ROUNDS):
        if round_number:
            changed = _changed_lines(old, new)
        lines = split_lines(new)
        too_long = sorted(n for n in changed if len(lines[n - 1]) > limit)
        if not too_long and not _may_join(lines, changed):
            return new
        windows = _statement_windows(new, changed)
        if windows is None:
            relaid = _relayout(new, too_long, changed, limit)
        else:
            relaid = _relayout_windows(new, windows, too_long, changed, limit)
        if relaid is None:
            return new
        new = relaid
    return new


# `from a.b import c, d as e`: one line, no brackets, comments or semicolons.
_SIMPLE_IMPORT_FROM = re.compile(
    r"^(?P<indent>[ \t]*)from (?P<module>[\w.]+) import "
    r"(?P<names>\w+(?: as \w+)?(?:, \w+(?: as \w+)?)*)(?P<end>\r?\n|\r)?$"
)


def _changed_lines(old: str, new: str) -> Set[int]:
    return {n for first, last in changed_line_ranges(old, new) for n in range(first, last + 1)}


def _explode_long_imports(new: str, changed: Set[int], limit: int) -> str:
    """`new` with each `changed` line `from m import a, b` past the limit laid out as black
    lays out imports: in parentheses, one name per line, with a trailing comma (an added
    import name can push the line of an existing import past the limit); `new` itself when
    there is none."""
    lines = split_lines(new, keepends=True)
    edited = False
    for number in sorted(changed, reverse=True):
        line = lines[number - 1]
        if len(line.rstrip("\r\n")) <= limit:
            continue
        match = _SIMPLE_IMPORT_FROM.match(line)
        if match is None:
            continue
        indent, newline = match.group("indent"), match.group("end") or ""
        inner = indent + "    "
        names = [name.strip() for name in match.group("names").split(",")]
        eol = newline or _first_newline(new)
        body = "".join(f"{inner}{name},{eol}" for name in names)
        lines[number - 1] = (
            f"{indent}from {match.group('module')} import ({eol}{body}{indent}){newline}"
        )
        edited = True
    return "".join(lines) if edited else new


def _relayout(text: str, too_long: List[int], changed, limit: int) -> Optional[str]:
    """`text` with the brackets on the given lines laid out again; None when none can be."""
    module = cst.parse_module(text)
    planner = _Planner(split_lines(text), positions(module), parents(module), limit)
    plan: Dict[cst.CSTNode, object] = dict(planner.plan(too_long)) if too_long else {}
    plan.update(planner.joinable(changed))
    if not plan:
        return None
    return module.visit(_Relayout(plan)).code


# Lines that str.splitlines() ends but Python's tokenizer does not: with one of them in the
# text, line numbers of the two disagree, and only the whole text is laid out.
_OTHER_LINE_BREAKS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


Window = Tuple[int, int, str]  # first line, last line, the indentation its lines share


def _statement_windows(text: str, lines) -> Optional[List[Window]]:
    """The line spans of the statements that hold any of `lines`: the simple statement on
    lines of its own when there is one (`x = x.to(device, non_blocking=True)` in a loop of
    `main()`), else the top-level statement.

    A rewrite changes a few statements of a file; parsing and laying out only those costs
    in proportion to the change, not to the file (a 50,000-line file is otherwise parsed
    again in full, once per round, and a script's whole `main()` for one changed line).
    None when the text cannot be cut safely.
    """
    if _OTHER_LINE_BREAKS.search(text):
        return None
    spans = statement_spans(text)
    if spans is None:
        return None
    starts = [first for first, _ in spans]
    held_by: Dict[Tuple[int, int], List[int]] = {}
    for line in lines:
        index = bisect_right(starts, line) - 1
        if index >= 0 and line <= spans[index][1]:
            held_by.setdefault(spans[index], []).append(line)
    source_lines = split_lines(text)
    chosen = set()
    for span, held in held_by.items():
        narrow = _innermost_statements(source_lines, span, held) if span[1] > span[0] else None
        chosen.update(narrow if narrow is not None else [(*span, "")])
    return sorted(chosen)


def _innermost_statements(
    lines: List[str], span: Tuple[int, int], held: List[int]
) -> Optional[List[Window]]:
    """The windows of the innermost statements that hold `held` (a `with` whose header
    changed is laid out whole), in the top-level statement `span`; None when one cannot be
    cut out on its own, and the whole top-level statement is laid out."""
    try:
        tree = ast.parse("\n".join(lines[span[0] - 1 : span[1]]))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    statements: List[_Statement] = []
    _statements_in(tree.body, span[0] - 1, None, statements)
    # The deepest statement holding each line (the first in source order among equals),
    # found per statement by bisection: time in proportion to the statements and the held
    # lines times their depth, not to their product.
    wanted = sorted(set(held))
    innermost: Dict[int, _Statement] = {}
    for statement in statements:
        for line in wanted[
            bisect_left(wanted, statement.first) : bisect_right(wanted, statement.last)
        ]:
            known = innermost.get(line)
            if known is None or statement.depth > known.depth:
                innermost[line] = statement
    if len(innermost) < len(wanted):
        return None
    chosen = {id(statement): statement for statement in innermost.values()}
    touching: Dict[int, List[_Statement]] = {}
    for statement in statements:
        for line in {statement.first, statement.last}:
            touching.setdefault(line, []).append(statement)
    windows = []
    for statement in chosen.values():
        if statement.inside_one_of(chosen):
            continue  # laid out with the chosen statement that holds it
        window = _own_lines(lines, statement, touching)
        if window is None:
            return None
        windows.append(window)
    return windows


@dataclass
class _Statement:
    node: ast.stmt
    first: int  # its first decorator's line, else its own
    last: int
    parent: Optional["_Statement"]
    depth: int

    def holds(self, other: Optional["_Statement"]) -> bool:
        while other is not None:
            if other is self:
                return True
            other = other.parent
        return False

    def inside_one_of(self, statements: Dict[int, "_Statement"]) -> bool:
        """One of `statements` (by id) holds this one, itself left out."""
        outer = self.parent
        while outer is not None:
            if id(outer) in statements:
                return True
            outer = outer.parent
        return False


def _statements_in(body, offset: int, parent, found: List["_Statement"]) -> None:
    for node in body:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
        depth = parent.depth + 1 if parent is not None else 0
        last = (node.end_lineno or node.lineno) + offset
        statement = _Statement(node, first + offset, last, parent, depth)
        found.append(statement)
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for part in getattr(node, field, None) or ():
                if isinstance(part, ast.stmt):
                    _statements_in([part], offset, statement, found)
                else:  # an except handler or a match case: its statements
                    _statements_in(part.body, offset, statement, found)


def _own_lines(
    lines: List[str], statement: "_Statement", touching: Dict[int, List["_Statement"]]
) -> Optional[Window]:
    """(first, last, indentation) when the statement is alone on its lines (no `a; b`, not
    after `if x:`), each of its lines begins with its indentation in spaces or is empty, and
    no string of it spans lines (whose text a change of indentation would change).
    `touching`: the statements that begin or end on each line. A statement that shares lines
    with this one and neither holds it nor is held by it shares its first or last line (their
    texts do not overlap), so only those are looked at."""
    first, last = statement.first, statement.last
    indent = lines[first - 1][: _column(statement.node)]
    if indent.strip(" ") or (statement.depth and not indent):
        return None
    for other in touching.get(first, []) + touching.get(last, []):
        if other.last >= first and other.first <= last:
            if not (other.holds(statement) or statement.holds(other)):
                return None
    for number in range(first, last + 1):
        line = lines[number - 1]
        if line and not line.startswith(indent):
            return None
    for node in ast.walk(statement.node):
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and node.lineno != node.end_lineno:
            return None
    return first, last, indent


def _column(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", ())
    # A decorator's expression starts after its `@`.
    return decorators[0].col_offset - 1 if decorators else node.col_offset


def _relayout_windows(
    text: str, windows: List[Window], too_long: List[int], changed, limit: int
) -> Optional[str]:
    """_relayout, statement by statement: each statement in `windows` is parsed and laid out
    on its own (positions within it are its own lines, counted from 1), without the
    indentation its lines share, against the limit less that indentation."""
    pieces = _LINE_END.split(text)
    lines = ["".join(pieces[i : i + 2]) for i in range(0, len(pieces) - 1, 2)]
    if pieces[-1]:
        lines.append(pieces[-1])
    newline = _first_newline(text)
    done = False
    too_long, changed_in_order = sorted(too_long), sorted(changed)
    for first, last, indent in reversed(windows):
        snippet = "".join(_dedented(line, indent) for line in lines[first - 1 : last])
        if _first_newline(snippet) != newline:
            return _relayout(text, too_long, changed, limit)  # the module's newline differs
        relaid = _relayout(
            snippet,
            [n - first + 1 for n in _within(too_long, first, last)],
            {n - first + 1 for n in _within(changed_in_order, first, last)},
            limit - len(indent),
        )
        if relaid is not None:
            lines[first - 1 : last] = [
                _indented(line, indent) for line in split_lines(relaid, True)
            ]
            done = True
    return "".join(lines) if done else None


def _within(numbers: List[int], first: int, last: int) -> List[int]:
    """The sorted `numbers` from `first` to `last`."""
    return numbers[bisect_left(numbers, first) : bisect_right(numbers, last)]


def _dedented(line: str, indent: str) -> str:
    return line[len(indent) :] if line.startswith(indent) else line  # an empty line


def _indented(line: str, indent: str) -> str:
    return indent + line if line.strip("\r\n") else line


_LINE_END = re.compile("(\r\n|\r|\n)")


def _first_newline(text: str) -> str:
    found = _LINE_END.search(text)
    return found.group(0) if found else "\n"


_UNSPLITTABLE_TOKENS = {
    token.COMMENT,
    token.STRING,
    *(getattr(token, name, token.COMMENT) for name in ("FSTRING_START", "FSTRING_MIDDLE")),
}


def _written_width(text: str) -> int:
    """The longest line of `text` that black would have split had it been too long: lines
    holding a comment or a string (a docstring, a long message) are left long by black, so
    they do not say the file is written to a wider limit. Below DEFAULT_LINE_LIMIT, where
    the caller's limit is the default anyway, simply the longest line."""
    rows = split_lines(text)
    longest = max((len(line) for line in rows), default=0)
    if longest <= DEFAULT_LINE_LIMIT:
        return longest  # nothing to tell apart under the default limit: no tokenizing
    unsplittable = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in _UNSPLITTABLE_TOKENS:
                unsplittable.update(range(tok.start[0], tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        return longest
    return max((len(line) for n, line in enumerate(rows, 1) if n not in unsplittable), default=0)


def _may_join(lines: List[str], changed) -> bool:
    """A changed value in parentheses of its own (`x = (` ... `)`): cheap text test first."""
    for n in changed:
        for first in (n - 1, n - 2):
            if first >= 1 and first + 2 <= len(lines):
                head = lines[first - 1].rstrip()
                if head.endswith(("= (", "return (")) and lines[first + 1].strip() == ")":
                    return True
    return False


@dataclass(frozen=True)
class _Chain:
    indent: str  # the indentation of the statement whose value the chain is


@dataclass(frozen=True)
class _Conditional:
    indent: str  # the indentation of the statement whose value the conditional expression is
    split: bool  # `body`, `if test` and `else orelse` each on a line of their own


@dataclass(frozen=True)
class _BreakBefore:
    indent: str  # a chain's `.call(...)` starts a line of its own, at this indentation


@dataclass(frozen=True)
class _ArgumentBreaks:
    """Arguments packed several to a continuation line: a line break, at the line's own
    indentation, before each argument listed (by position), where the line grew too long."""

    indent: str
    before: Tuple[int, ...]


@dataclass(frozen=True)
class _Operands:
    """A parenthesised operation with one operand per line, each after the first led by its
    operator, between its parentheses' lines."""

    indent: str  # the indentation of the line the parenthesised operation begins


@dataclass(frozen=True)
class _Comprehension:
    """A list, set or dict comprehension between its brackets' lines: its contents on one
    line, or (`split`) the element and each `for` and `if` clause on a line of its own, as
    black splits at its comprehension delimiters."""

    indent: str  # the indentation of the statement whose value the comprehension is
    split: bool


_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp)


@dataclass(frozen=True)
class _BreakBeforeOperator:
    indent: str  # the operator of this operation starts a line of its own, at this indentation


# Operators black splits at together (its delimiter priorities): `+ -`, then `* / // % @`.
_OPERATOR_CLASSES = (
    (cst.Add, cst.Subtract),
    (cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.MatrixMultiply),
)


@dataclass(frozen=True)
class _Layout:
    explode: bool  # one element per line with a trailing comma; else hugged on one line
    indent: str  # the indentation of the line the opening bracket stands on


class _Planner:
    def __init__(self, lines: List[str], positions, parents, limit: int) -> None:
        self.lines = lines
        self.positions = positions
        self.parents = parents
        self.limit = limit

    def plan(self, too_long: List[int]) -> Dict[cst.CSTNode, _Layout]:
        by_start: Dict[int, List[cst.CSTNode]] = {}
        links: Dict[int, cst.Call] = {}  # `.name(...)` beginning a line of a split chain
        conditionals: Dict[int, List[cst.IfExp]] = {}
        operations: Dict[int, List[cst.BinaryOperation]] = {}
        comprehensions: Dict[int, List[cst.CSTNode]] = {}
        line_starts: Dict[int, cst.Arg] = {}  # an argument that begins a too-long line
        for node, where in self.positions.items():
            if (
                isinstance(node, cst.Arg)
                and where.start.line in too_long
                and where.start.column == len(self._indent(where.start.line))
            ):
                line_starts[where.start.line] = node
            if isinstance(node, _COMPREHENSIONS) and where.start.line in too_long:
                comprehensions.setdefault(where.start.line, []).append(node)
            if isinstance(node, cst.BinaryOperation) and node.lpar and where.start.line in too_long:
                operations.setdefault(where.start.line, []).append(node)
            if isinstance(node, cst.IfExp) and where.start.line in too_long:
                conditionals.setdefault(where.start.line, []).append(node)
            if (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and isinstance(node.func.dot.whitespace_before, cst.ParenthesizedWhitespace)
            ):
                links[self.positions[node.func.attr].start.line] = node
            if (
                isinstance(node, _BRACKETED)
                and where.start.line in too_long
                or (isinstance(node, _BRACKETED) and where.start.line + 1 in too_long)
            ):
                by_start.setdefault(where.start.line, []).append(node)
        plan: Dict[cst.CSTNode, _Layout] = {}
        for line in too_long:
            found = self._conditional_value(line, conditionals.get(line, ()))
            found = found or self._hugged_body(line, by_start.get(line - 1, ()))
            found = found or self._method_chain(line, by_start.get(line, ()), plan)
            found = found or self._chain_link(line, links.get(line))
            found = found or self._ending_bracket(line, by_start.get(line, ()))
            found = found or self._parenthesised_operation(line, operations.get(line, ()), plan)
            found = found or self._comprehension(line, comprehensions.get(line, ()))
            found = found or self._packed_arguments(line, line_starts.get(line))
            if found is not None:
                plan[found[0]] = found[1]
        return plan

    def _parenthesised_operation(
        self, line: int, candidates, plan: Dict[cst.CSTNode, object]
    ) -> Optional[Tuple[cst.CSTNode, _Operands]]:
        """`(a - b)` alone on its line (a chain's first link, or an element of a bracket laid
        out one per line): black splits at its parentheses, then, when the operation is still
        too long, before each operator of its lowest priority."""
        text = self.lines[line - 1]
        indent = self._indent(line)
        for node in candidates:
            where = self.positions[node]  # inside the parentheses
            parent = self.parents.get(node)
            if (
                where.end.line != line
                or where.start.column - 1 != len(indent)
                or len(node.lpar) != 1
                or len(node.rpar) != 1
                or "#" in text
                or _code_part(text[where.end.column + 1 :]).strip() not in ("", ",")
                or not (
                    isinstance(parent, cst.Attribute)
                    or isinstance(parent, (cst.Arg, cst.Element))
                    and not getattr(parent, "keyword", None)
                )
                or getattr(parent, "value", None) is not node
            ):
                continue
            # On a line of its own the operation is 2 columns wider than in its parentheses,
            # so it does not fit there either: it is split at its operators too.
            breaks = self._operator_breaks(node, 0, len(indent) + 4, inside_parentheses=True)
            if not breaks:
                return None
            for link in breaks:
                if link is not node:
                    plan[link] = _BreakBeforeOperator(indent + "    ")
            return node, _Operands(indent)
        return None

    def _packed_arguments(
        self, line: int, first: Optional[cst.Arg]
    ) -> Optional[Tuple[cst.CSTNode, _ArgumentBreaks]]:
        """A call's last line that begins with one of its arguments and holds several, with
        `)` there too (`    num_workers=4, pin_memory=True, persistent_workers=True)`,
        SimSiam's style, not black's): the arguments that no longer fit start a line of their
        own at the same indentation, as the author broke the lines above."""
        call = self.parents.get(first) if first is not None else None
        text = self.lines[line - 1]
        if (
            not isinstance(call, cst.Call)
            or self.positions[call].end.line != line
            or self.positions[call].start.line == line
            or "#" in text
        ):
            return None
        args = list(call.args)
        start = next(i for i, a in enumerate(args) if a is first)
        on_line = args[start:]
        where = [self.positions[a] for a in on_line]
        if len(on_line) < 2 or any(w.start.line != line or w.end.line != line for w in where):
            return None
        columns = [w.start.column for w in where] + [len(text.rstrip())]
        pieces = [text[a:b].rstrip() for a, b in zip(columns, columns[1:])]
        indent = self._indent(line)
        width, breaks = len(indent) + len(pieces[0]), []
        for index, piece in enumerate(pieces[1:], 1):
            if width + 1 + len(piece) <= self.limit:
                width += 1 + len(piece)
            else:
                breaks.append(start + index)
                width = len(indent) + len(piece)
            if width > self.limit:
                return None
        if not breaks:
            return None
        return call, _ArgumentBreaks(indent, tuple(breaks))

    def joinable(self, changed) -> Dict[cst.CSTNode, str]:
        """Values wrapped in parentheses on their own line (`x = (\n    value\n)`) that a
        change made short enough for one line: black drops those parentheses."""
        found: Dict[cst.CSTNode, str] = {}
        for node, where in self.positions.items():
            if not isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Return)):
                continue
            value = node.value
            if (
                value is None
                or len(value.lpar) != 1
                or isinstance(value, (cst.Tuple, cst.GeneratorExp, cst.Yield, cst.NamedExpr))
                or not isinstance(value.lpar[0].whitespace_after, cst.ParenthesizedWhitespace)
                or where.end.line - where.start.line != 2
                or not any(n in changed for n in range(where.start.line, where.end.line + 1))
            ):
                continue
            inner = value.with_changes(lpar=[], rpar=[])
            if _has_comment(value) or "\n" in cst.Module([]).code_for_node(inner):
                continue
            head = self.lines[where.start.line - 1].rstrip()[:-1]  # `x = (` without `(`
            if len(head) + len(cst.Module([]).code_for_node(inner)) <= self.limit:
                found[value] = "join"
        return found

    def _indent(self, line: int) -> str:
        text = self.lines[line - 1]
        return text[: len(text) - len(text.lstrip(" \t"))]

    def _operator_breaks(
        self, node: cst.BaseExpression, lead: int, column: int, inside_parentheses=False
    ) -> Optional[List[cst.BinaryOperation]]:
        """The operations whose operator starts a line when `node`, after `lead` columns of
        the operator before it, is laid out from `column` as black's delimiter split does:
        at its lowest-priority operators, then again within each piece still too long; []
        when it fits, None when a piece neither fits nor is such an operation."""
        text = cst.Module([]).code_for_node(node)
        if "\n" not in text and column + lead + len(text) <= self.limit:
            return []
        if not isinstance(node, cst.BinaryOperation) or node.lpar and not inside_parentheses:
            return None
        chain = _operator_chain(node)
        if chain is None:
            return None
        found = self._operator_breaks(chain[-1].left, lead, column)
        if found is None:
            return None
        found = list(chain) + found
        for link in chain:
            operator = cst.Module([]).code_for_node(link.operator).strip()
            more = self._operator_breaks(link.right, len(operator) + 1, column)
            if more is None:
                return None
            found += more
        return found

    def _conditional_value(
        self, line: int, candidates
    ) -> Optional[Tuple[cst.CSTNode, _Conditional]]:
        """A statement's value that is a conditional expression (`kwargs = {...} if cuda else
        {}`): black puts it in parentheses, on one line when it fits there, else with `if` and
        `else` each starting a line."""
        for node in candidates:
            where = self.positions[node]
            holder = self._holder(node)
            text = self.lines[line - 1]
            if (
                not isinstance(holder, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Return))
                or where.end.line != line
                or node.lpar
                or "#" in text
                or _code_part(text[where.end.column :]).strip()
                or isinstance(node.body, cst.IfExp)
                or isinstance(node.orelse, cst.IfExp)
            ):
                continue
            inner = len(self._indent(line)) + 4
            if inner + len(cst.Module([]).code_for_node(node)) <= self.limit:
                return node, _Conditional(self._indent(line), split=False)
            parts = [
                cst.Module([]).code_for_node(node.body),
                "if " + cst.Module([]).code_for_node(node.test),
                "else " + cst.Module([]).code_for_node(node.orelse),
            ]
            if all(inner + len(part) <= self.limit and "\n" not in part for part in parts):
                return node, _Conditional(self._indent(line), split=True)
            return None
        return None

    def _hugged_body(self, line: int, candidates) -> Optional[Tuple[cst.CSTNode, _Layout]]:
        """A bracket whose contents sit alone on `line`, between its brackets' lines."""
        for node in candidates:
            where = self.positions[node]
            if where.end.line != line + 1 or not _can_explode(node) or _has_trailing_comma(node):
                continue  # (a trailing comma: one element per line already)
            if len(_elements(node)) < 2:
                continue  # black splits a lone element within itself, never adding a comma
            closing = self.lines[line].lstrip()
            if self.lines[line - 2].rstrip().endswith(_opening(node)) and closing.startswith(
                _closing(node)
            ):
                return node, _Layout(True, self._indent(line - 1))
        return None

    def _method_chain(
        self, line: int, candidates, plan: Dict[cst.CSTNode, object]
    ) -> Optional[Tuple[cst.CSTNode, object]]:
        """A statement's value that is a method chain (`y = f(x).transpose(1, 2).view(B, T)`).
        With two or more links after a bracket black puts it in parentheses, on one line when
        it fits there, else one link per line; with one, it splits the last call whose
        opening line fits. A bare expression statement (`Trainer(...).fit().save()`) gets no
        parentheses: black splits its last call whose opening line fits, however many links."""
        for node in candidates:
            top = self._chain_top(node)
            where = self.positions[top]
            holder = self._holder(top)
            if (
                top is not node
                and top in candidates
                or where.start.line != line
                or where.end.line != line
                or not isinstance(
                    holder, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Return, cst.Expr)
                )
                or _code_part(self.lines[line - 1][where.end.column :]).strip()
                or "#" in self.lines[line - 1]
                or "\n" in cst.Module([]).code_for_node(top)
            ):
                continue
            dots = _chain_dots(top)
            if not dots:
                return None  # no link after a bracket: the bracket that ends the line splits
            indent = self._indent(line)
            if len(dots) == 1 or isinstance(holder, cst.Expr):
                return self._call_in_chain(line, top, indent)
            flat = cst.Module([]).code_for_node(top)
            if len(indent) + 4 + len(flat) > self.limit:
                for dot in dots:
                    plan[dot] = _BreakBefore(indent + "    ")
            return top, _Chain(indent)
        return None

    def _chain_link(
        self, line: int, call: Optional[cst.Call]
    ) -> Optional[Tuple[cst.CSTNode, _Layout]]:
        """One link of a chain laid out one link per line, `.view(...)` or `.view(...)[0]`,
        split at its call's brackets as black's right-hand split does."""
        if call is None or not _can_explode(call):
            return None
        text = self.lines[line - 1]
        rest = text[self.positions[call].end.column :]
        if self.positions[call].end.line != line or "#" in text:
            return None
        if rest.strip() and not rest.lstrip().startswith("["):
            return None
        if rest.startswith("[") and len(text) - len(rest) + 1 <= self.limit:
            return None  # black splits the subscript's brackets instead, a layout not made here
        if self.positions[call.func].end.column + 1 > self.limit:
            return None
        indent = self._indent(line)
        several = len(call.args) > 1 or _has_trailing_comma(call)
        explode = several and len(indent) + 4 + len(_flat_body(call)) > self.limit
        return call, _Layout(explode, indent)

    def _chain_top(self, node: cst.CSTNode) -> cst.CSTNode:
        while True:
            parent = self.parents.get(node)
            if (
                isinstance(parent, cst.Call)
                and parent.func is node
                or isinstance(parent, (cst.Attribute, cst.Subscript))
                and parent.value is node
            ):
                node = parent
            else:
                return node

    def _call_in_chain(
        self, line: int, top: cst.CSTNode, indent: str
    ) -> Optional[Tuple[cst.CSTNode, _Layout]]:
        """black's right-hand split of a one-link chain: the last call with arguments whose
        line up to its opening bracket fits."""
        text = self.lines[line - 1]
        for call in _spine_calls(top):
            opening = self.positions[call.func].end
            if opening.line != line or not _can_explode(call):
                continue
            if opening.column + 1 > self.limit:
                continue
            body = _flat_body(call)
            several = len(call.args) > 1 or _has_trailing_comma(call)
            explode = several and len(indent) + 4 + len(body) > self.limit
            closing_line = len(indent) + len(text.rstrip()) - self.positions[call].end.column + 1
            if closing_line > self.limit:
                return None
            return call, _Layout(explode, indent)
        return None

    def _ending_bracket(self, line: int, candidates) -> Optional[Tuple[cst.CSTNode, _Layout]]:
        """The bracket that ends `line` (a whole statement, or one element of a bracket laid
        out one element per line), split at its brackets as black's right-hand split does.
        A bracket opened on `line` and closed further down counts too: the author's aligned
        continuation lines (`DataLoader(ds, batch_size=b,\n                 num_workers=2)`)
        whose first line an edit pushed past the limit are laid out as black lays them out."""
        indent = self._indent(line)
        for node in sorted(candidates, key=lambda n: self.positions[n].start.column):
            where = self.positions[node]
            if where.end.line < line or not _can_explode(node):
                continue
            rest = _code_part(self.lines[where.end.line - 1][where.end.column :]).strip()
            holder = self._holder(node)
            if holder is None:
                continue
            if isinstance(holder, cst.With):
                if not (rest == ":" or (rest.startswith("as ") and rest.endswith(":"))):
                    continue
            elif rest not in ("", ","):
                continue
            bare_tuple = isinstance(node, cst.Tuple) and not node.lpar
            if bare_tuple and not isinstance(holder, (cst.Assign, cst.Return)):
                continue
            if isinstance(node, cst.Call) and _dotted(node.func) is None:
                continue
            body = _flat_body(node)
            literal = not isinstance(node, cst.Call)
            several = len(_elements(node)) > 1 or _has_trailing_comma(node)
            # black splits a bracket's contents at commas, and one element alone only
            # within itself (the next round splits it, as the element line it then is).
            explode = bare_tuple or (
                several and (literal or len(indent) + 4 + len(body) > self.limit)
            )
            return node, _Layout(explode, indent)
        return None

    def _comprehension(self, line: int, candidates) -> Optional[Tuple[cst.CSTNode, object]]:
        """A comprehension that is the whole value of `line`'s statement (`batch = {k:
        v.to(device) for k, v in batch.items()}`), laid out as black's right-hand split."""
        indent = self._indent(line)
        for node in candidates:
            where = self.positions[node]
            if where.end.line != line or _has_comment(node) or self._holder(node) is None:
                continue
            rest = _code_part(self.lines[line - 1][where.end.column :]).strip()
            if rest not in ("", ","):
                continue
            body = cst.Module([]).code_for_node(node).strip()[1:-1].strip()
            return node, _Comprehension(indent, len(indent) + 4 + len(body) > self.limit)
        return None

    def _holder(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The statement or element that `node` is the whole value of, when it begins its
        line: `x = node`, `return node`, `node` alone, or `name=node,` in a bracket."""
        parent = self.parents.get(node)
        if isinstance(parent, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Return, cst.Expr)):
            statement = self.parents.get(parent)
            if (
                getattr(parent, "value", None) is node
                and isinstance(statement, cst.SimpleStatementLine)
                and len(statement.body) == 1
                and self.positions[statement].start.line == self.positions[node].start.line
            ):
                return parent
            return None
        if isinstance(parent, cst.WithItem) and parent.item is node:
            statement = self.parents.get(parent)
            if (
                isinstance(statement, cst.With)
                and len(statement.items) == 1
                and self.positions[statement].start.line == self.positions[node].start.line
            ):
                return statement
            return None
        if isinstance(parent, cst.Attribute) and parent.value is node:
            # The first link of a method chain laid out one call per line.
            where = self.positions[node]
            if where.start.column == len(self._indent(where.start.line)):
                return parent
            return None
        if isinstance(parent, (cst.Arg, cst.Element, cst.DictElement)) and parent.value is node:
            where = self.positions[parent]
            if where.start.column == len(self._indent(where.start.line)):
                return parent
        return None


def _operator_chain(node: cst.BinaryOperation) -> Optional[List[cst.BinaryOperation]]:
    """`a - b + c` as its operations from the outermost in, all of one operator class and
    none in parentheses of its own: where black splits it; None for other operators."""
    kinds = next((k for k in _OPERATOR_CLASSES if isinstance(node.operator, k)), None)
    if kinds is None:
        return None
    chain = [node]
    while (
        isinstance(chain[-1].left, cst.BinaryOperation)
        and not chain[-1].left.lpar
        and isinstance(chain[-1].left.operator, kinds)
    ):
        chain.append(chain[-1].left)
    return chain


def _chain_dots(node: cst.CSTNode) -> List[cst.Attribute]:
    """The `.name` links of a method chain that follow a closing bracket, outermost first:
    where black splits a chain. Empty unless the chain starts from a plain name or dotted
    name (`x.f(a).g()`, `F.sdpa(q, k, v).transpose(1, 2)`) or from an expression in
    parentheses (`(a == b).float().mean()`: each dot follows a closing bracket)."""
    dots: List[cst.Attribute] = []
    current = node
    while not current.lpar or current is node:
        if isinstance(current, cst.Call):
            current = current.func
        elif isinstance(current, cst.Subscript):
            current = current.value
        elif isinstance(current, cst.Attribute):
            if isinstance(current.value, (cst.Call, cst.Subscript)) or current.value.lpar:
                dots.append(current)
            current = current.value
        else:
            break
    if node.lpar or not (isinstance(current, cst.Name) or current.lpar):
        return []
    return dots


def _spine_calls(node: cst.CSTNode) -> List[cst.Call]:
    """The calls along a chain's spine, outermost first."""
    calls = []
    while isinstance(node, (cst.Call, cst.Attribute, cst.Subscript)):
        if isinstance(node, cst.Call):
            calls.append(node)
            node = node.func
        else:
            node = node.value
    return calls


def _opening(node: cst.CSTNode) -> str:
    return {cst.Call: "(", cst.List: "[", cst.Tuple: "(", cst.Set: "{", cst.Dict: "{"}[type(node)]


def _closing(node: cst.CSTNode) -> str:
    return {"(": ")", "[": "]", "{": "}"}[_opening(node)]


def _elements(node: cst.CSTNode) -> Sequence[cst.CSTNode]:
    return node.args if isinstance(node, cst.Call) else node.elements


def _has_trailing_comma(node: cst.CSTNode) -> bool:
    elements = _elements(node)
    return bool(elements) and isinstance(elements[-1].comma, cst.Comma)


def _dotted(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr.value}" if inner is not None else None
    return None


def _flat_body(node: cst.CSTNode) -> str:
    """The bracket's contents on one line, as the hugging layout prints them."""
    elements = list(_elements(node))
    parts = []
    for index, element in enumerate(elements):
        bare = element.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        if isinstance(element, cst.Arg):
            bare = bare.with_changes(whitespace_after_arg=cst.SimpleWhitespace(""))
        parts.append(cst.Module([]).code_for_node(bare).strip())
    return ", ".join(parts)


def _code_part(text: str) -> str:
    """`text` without a trailing comment (rest of a line after a bracket: no strings there
    that could hold `#` unless a string follows, which then is not "" or ",")."""
    return text.split("#", 1)[0]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _can_explode(node: cst.CSTNode) -> bool:
    elements = _elements(node)
    if not elements:
        return False
    if any(_has_comment(e) for e in elements):
        return False  # comments inside stay where the author put them
    # A trailing comma after an unparenthesised generator argument is a syntax error.
    return not (
        isinstance(node, cst.Call)
        and any(isinstance(arg.value, cst.GeneratorExp) and not arg.value.lpar for arg in node.args)
    )


def _has_comment(node: cst.CSTNode) -> bool:
    return "#" in cst.Module([]).code_for_node(node) and any(
        isinstance(n, cst.Comment) for n in _walk(node)
    )


def _walk(node: cst.CSTNode):
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(children(current))


def _comprehension_laid_out(node: cst.CSTNode, layout: _Comprehension) -> cst.CSTNode:
    inner = layout.indent + "    "
    if layout.split:
        node = node.with_changes(for_in=_clauses_on_lines(node.for_in, inner))
    opening, closing = (
        ("lbracket", "rbracket") if isinstance(node, cst.ListComp) else ("lbrace", "rbrace")
    )
    return node.with_changes(
        **{
            opening: getattr(node, opening).with_changes(whitespace_after=_line_break(inner)),
            closing: getattr(node, closing).with_changes(
                whitespace_before=_line_break(layout.indent)
            ),
        }
    )


def _clauses_on_lines(clause: cst.CompFor, indent: str) -> cst.CompFor:
    """Each `for` and `if` of a comprehension on a line of its own."""
    inner = clause.inner_for_in
    return clause.with_changes(
        whitespace_before=_line_break(indent),
        ifs=[i.with_changes(whitespace_before=_line_break(indent)) for i in clause.ifs],
        inner_for_in=_clauses_on_lines(inner, indent) if inner is not None else None,
    )


def _line_break(indent: str) -> cst.ParenthesizedWhitespace:
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(),
        empty_lines=[],
        indent=False,
        last_line=cst.SimpleWhitespace(indent),
    )


def _operator_on_new_line(node: cst.BinaryOperation, indent: str) -> cst.BinaryOperation:
    operator = node.operator.with_changes(
        whitespace_before=_line_break(indent), whitespace_after=cst.SimpleWhitespace(" ")
    )
    return node.with_changes(operator=operator)


class _Relayout(cst.CSTTransformer):
    def __init__(self, plan: Dict[cst.CSTNode, object]) -> None:
        super().__init__()
        self.plan = plan

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        layout = self.plan.get(original_node)
        if layout is None:
            return updated_node
        if layout == "join":
            return updated_node.with_changes(lpar=[], rpar=[])
        if isinstance(layout, _BreakBefore):
            return updated_node.with_changes(
                dot=updated_node.dot.with_changes(whitespace_before=_line_break(layout.indent))
            )
        if isinstance(layout, _Conditional):
            inner = layout.indent + "    "
            if layout.split:
                updated_node = updated_node.with_changes(
                    whitespace_before_if=_line_break(inner),
                    whitespace_before_else=_line_break(inner),
                )
            return updated_node.with_changes(
                lpar=[cst.LeftParen(whitespace_after=_line_break(inner))],
                rpar=[cst.RightParen(whitespace_before=_line_break(layout.indent))],
            )
        if isinstance(layout, _BreakBeforeOperator):
            return _operator_on_new_line(updated_node, layout.indent)
        if isinstance(layout, _ArgumentBreaks):
            args = list(updated_node.args)
            for index in layout.before:
                comma = args[index - 1].comma
                args[index - 1] = args[index - 1].with_changes(
                    comma=comma.with_changes(whitespace_after=_line_break(layout.indent))
                )
            return updated_node.with_changes(args=args)
        if isinstance(layout, _Operands):
            inner = layout.indent + "    "
            updated_node = _operator_on_new_line(updated_node, inner)
            return updated_node.with_changes(
                lpar=[cst.LeftParen(whitespace_after=_line_break(inner))],
                rpar=[cst.RightParen(whitespace_before=_line_break(layout.indent))],
            )
        if isinstance(layout, _Comprehension):
            return _comprehension_laid_out(updated_node, layout)
        if isinstance(layout, _Chain):
            return updated_node.with_changes(
                lpar=[cst.LeftParen(whitespace_after=_line_break(layout.indent + "    "))],
                rpar=[cst.RightParen(whitespace_before=_line_break(layout.indent))],
            )
        inner = layout.indent + "    "
        elements = list(_elements(updated_node))
        last = len(elements) - 1
        laid_out = []
        for index, element in enumerate(elements):
            if layout.explode:
                after = _line_break(layout.indent if index == last else inner)
                comma = cst.Comma(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=after
                )
            elif index < last:
                comma = cst.Comma(
                    whitespace_before=cst.SimpleWhitespace(""),
                    whitespace_after=cst.SimpleWhitespace(" "),
                )
            else:
                comma = cst.MaybeSentinel.DEFAULT
            changes = {"comma": comma}
            if isinstance(element, cst.Arg):
                last_hugged = not layout.explode and index == last
                changes["whitespace_after_arg"] = (
                    _line_break(layout.indent) if last_hugged else cst.SimpleWhitespace("")
                )
            laid_out.append(element.with_changes(**changes))
        if isinstance(updated_node, cst.Call):
            return updated_node.with_changes(
                args=laid_out, whitespace_before_args=_line_break(inner)
            )
        closing_space = cst.SimpleWhitespace("") if layout.explode else _line_break(layout.indent)
        if isinstance(updated_node, cst.Tuple):
            lpar = updated_node.lpar or [cst.LeftParen()]
            rpar = updated_node.rpar or [cst.RightParen()]
            return updated_node.with_changes(
                elements=laid_out,
                lpar=[lpar[0].with_changes(whitespace_after=_line_break(inner)), *lpar[1:]],
                rpar=[rpar[0].with_changes(whitespace_before=closing_space), *rpar[1:]],
            )
        if isinstance(updated_node, cst.Dict):
            brackets = {
                "lbrace": updated_node.lbrace.with_changes(whitespace_after=_line_break(inner)),
                "rbrace": updated_node.rbrace.with_changes(whitespace_before=closing_space),
            }
        elif isinstance(updated_node, cst.Set):
            brackets = {
                "lbrace": updated_node.lbrace.with_changes(whitespace_after=_line_break(inner)),
                "rbrace": updated_node.rbrace.with_changes(whitespace_before=closing_space),
            }
        else:
            brackets = {
                "lbracket": updated_node.lbracket.with_changes(whitespace_after=_line_break(inner)),
                "rbracket": updated_node.rbracket.with_changes(whitespace_before=closing_space),
            }
        return updated_node.with_changes(elements=laid_out, **brackets)

"""Parsing a long file statement by statement: the same tree, in memory and time that follow
the change rather than the file.

LibCST's native parser holds the whole file's tokens and intermediate tree while it builds
the Python one: a 50,000-line file peaks near 1 GB, and a rewrite parses its output again
after every pass that changed something. Here the text is cut before the first line of each
top-level statement's code (positions from Python's own `ast`, which costs a tenth of a
LibCST parse); each piece, the statement and the blank and comment lines that follow it, is
parsed on its own, and the pieces are joined into one Module: the lines after a statement
that LibCST's module parse gives the next statement (its `leading_lines`) come out of a
piece as that piece's footer and move there. Pieces are kept by their text, so parsing the
output of a rewrite parses only the statements whose text changed.

The output of a rewrite is cut where the text it came from was, wherever a cut's line is
unchanged (a line diff maps it), rather than by another `ast` parse of the whole text (which
holds a tree of the whole file at once: about 100 MB for 50,000 lines). A cut the edits moved
into a bracket, a string or a continued line leaves the piece before it unparseable, and a
piece may now hold several statements (a statement a fix added at the top level): both are
checked, and anything else falls back to cutting by `ast`.

The joined tree is used only when it is certainly the one a whole-file parse gives: every
piece parsed with the same indentation and newline conventions as the first that shows
them. Anything else (another
encoding, a byte-order mark, a statement LibCST parses otherwise alone, a continuation line
`ast` and LibCST count differently) returns None and the caller parses the whole file.
"""

from __future__ import annotations

import ast
import re
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

import libcst as cst

from optimizer_codemod.linediff import opcodes

# Below this many lines a whole-file parse is cheap enough, and exactly LibCST's own. Above
# it, the first parse costs about 10% more in pieces, and the parse of a rewrite's output a
# third of a whole one (ecosystem scripts of 150 to 2,000 lines; 2-core AMD EPYC, 2026-11-24).
MIN_LINES = 150
# Lines that str.splitlines() or LibCST end but Python's tokenizer does not (or the other
# way round): with one in the text, line numbers may disagree.
_ODD_BREAKS = re.compile("[\\x0b\\x0c\\x1c\\x1d\\x1e\\x85\\u2028\\u2029]|\\r(?!\\n)")
_LINE = re.compile(".*?(?:\\r\\n|\\n|$)", re.DOTALL)


class PieceCache:
    """Parsed pieces by their text, carried from one pass's parse to the next.

    A text that occurs several times in a file (two identical loops) has one parse per
    occurrence: a node must stand at one place in a tree, since everything about it (its
    position, the facts about it) is looked up by its identity.
    """

    def __init__(self) -> None:
        self.modules: Dict[str, List[cst.Module]] = {}
        # A statement given the lines that end the piece before it, by the two pieces: the
        # same object from one parse to the next while neither piece changes.
        self.statements: Dict[Tuple[int, int], cst.BaseStatement] = {}
        # The lines of the last text parsed, and the first line (1-based) of each piece.
        self.last: Optional[Tuple[List[str], List[int]]] = None


def parse_in_pieces(src: bytes, cache: Optional[PieceCache] = None) -> Optional[cst.Module]:
    """The module LibCST parses from `src` (utf-8, no BOM), built from per-statement parses;
    None when the text is short or not one this can parse exactly."""
    lines = block_lines(src)
    if lines is None:
        return None
    text = "".join(lines)
    cache = cache or PieceCache()
    mapped = _mapped_starts(cache.last, lines)
    module = _parse_cut(text, lines, mapped, cache) if mapped is not None else None
    if module is None:
        starts = _statement_starts(text, lines)
        if starts is None or len(starts) < 2:
            return None
        module = _parse_cut(text, lines, starts, cache)
        mapped = starts
    if module is not None:
        cache.last = (lines, mapped)
    return module


def block_lines(src: bytes) -> Optional[List[str]]:
    """The lines of a text long enough to be worked on in pieces, and whose lines Python,
    LibCST and this module count alike (utf-8 without a BOM or an encoding declaration, no
    line break but `\\n` and `\\r\\n`); None otherwise."""
    if src.count(b"\n") < MIN_LINES or src.startswith(b"\xef\xbb\xbf"):
        return None
    try:
        text = src.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if _ODD_BREAKS.search(text) or _declares_encoding(text):
        return None
    lines = _LINE.findall(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _mapped_starts(last, lines: List[str]) -> Optional[List[int]]:
    """The previous text's piece starts that sit on lines the change left alone, or that
    begin a changed region, at their lines in the new text; None without a previous text or
    when fewer than two are left."""
    if last is None:
        return None
    old_lines, old_starts = last
    starts = [1]
    wanted = iter(old_starts[1:])
    start = next(wanted, None)
    for tag, i1, i2, j1, _ in opcodes(old_lines, lines):
        while start is not None and start - 1 < i2:
            if tag == "equal" and start - 1 >= i1:
                starts.append(j1 + (start - 1 - i1) + 1)
            elif tag == "replace" and start - 1 == i1:
                starts.append(j1 + 1)  # an edited statement most likely starts where it did
            start = next(wanted, None)
    return starts if len(starts) >= 2 else None


def _parse_cut(
    text: str, lines: List[str], starts: List[int], cache: PieceCache
) -> Optional[cst.Module]:
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    cuts = [0] + [offsets[start - 1] for start in starts[1:]] + [len(text)]
    pieces: List[cst.Module] = []
    taken: Dict[str, int] = {}  # parses of each text already placed in this tree
    for begin, end in zip(cuts, cuts[1:]):
        piece = text[begin:end]
        parsed = cache.modules.setdefault(piece, [])
        index = taken.get(piece, 0)
        taken[piece] = index + 1
        if index == len(parsed):
            try:
                module = cst.parse_module(piece)
            except Exception:
                return None
            parsed.append(module)
        pieces.append(parsed[index])
    # A piece prints the same within the joined module as alone when it shares its
    # indentation and newline (checked while joining). Whether LibCST prints each piece back
    # to its text is checked as for a whole-file parse: by printing the module, when a fix
    # is about to change it (engine.py).
    return _join(pieces, cache)


def _declares_encoding(text: str) -> bool:
    head = text.split("\n", 2)[:2]
    return any(re.match(r"^[ \t\f]*#.*?coding[:=]", line) for line in head)


# Lines that can only begin a statement when they are not inside a string or brackets: where
# the text is cut into blocks before `ast` finds the statements in each.
T = TypeVar("T")
_BLOCK_START = re.compile(r"(?:def |class |async def |@|import |from )")
# Lines per block given to `ast` at once: its tree of a whole 50,000-line file (about 200 MB
# while it is built) was the peak of a rewrite's memory.
BLOCK_LINES = 1000


def _statement_starts(text: str, lines: Optional[List[str]] = None) -> Optional[List[int]]:
    """The first line of each top-level statement's code (its first decorator's line)."""
    spans = statement_spans(text, lines)
    return None if spans is None else [first for first, _ in spans]


def statement_spans(
    text: str, lines: Optional[List[str]] = None
) -> Optional[List[Tuple[int, int]]]:
    """(first line, last line) of each top-level statement (from its first decorator; `a; b`
    on one line is one), or None when the text does not parse, found by `ast` block by block
    (in_blocks)."""
    if _ODD_BREAKS.search(text):  # Python's line numbers are not the lines cut here
        return _spans_in(text, 0)
    if lines is None:
        lines = _LINE.findall(text)
    found = in_blocks(lines, _spans_in)
    return None if found is None else [span for spans in found for span in spans]


def in_blocks(lines: List[str], check: Callable[[str, int], Optional[T]]) -> Optional[List[T]]:
    """`check(block, first)` of consecutive blocks of whole top-level statements that cover
    the text (`first`: the block's first line index), or None when the text fails it.

    Python's `ast` and `compile` hold their tree of a whole text at once: for 50,000 lines,
    150 to 200 MB while they run, the peak of a rewrite's memory. Blocks of about BLOCK_LINES
    lines are cut before lines that begin with `def`, `class`, a decorator or an import. A
    cut inside a string, brackets or a continued line leaves the block before it failing:
    that block is then checked together with the next. When that happens so often that the
    blocks checked add up to twice the text, or the text's end fails, the whole text is
    checked at once."""
    cuts = _block_cuts(lines)
    results: List[T] = []
    budget = 2 * len(lines)
    index = 0
    while index < len(cuts) - 1:
        end = index + 1
        while True:
            first, stop = cuts[index], cuts[end]
            budget -= stop - first
            result = check("".join(lines[first:stop]), first) if budget >= 0 else None
            if result is not None:
                break
            if budget < 0 or end == len(cuts) - 1:
                whole = check("".join(lines), 0) if len(cuts) > 2 else None
                return None if whole is None else [whole]
            end += 1
        results.append(result)
        index = end
    return results


def _block_cuts(lines: List[str]) -> List[int]:
    """Line indices (0-based) where blocks begin, and the number of lines at the end."""
    cuts = [0]
    previous = ""
    for number, line in enumerate(lines):
        if (
            number - cuts[-1] >= BLOCK_LINES
            and _BLOCK_START.match(line)
            and not previous.startswith("@")
        ):
            cuts.append(number)
        if line.strip():
            previous = line
    cuts.append(len(lines))
    return cuts


def _spans_in(text: str, offset: int) -> Optional[List[Tuple[int, int]]]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    spans: List[Tuple[int, int]] = []
    for statement in tree.body:
        first = offset + min(
            [statement.lineno, *(d.lineno for d in getattr(statement, "decorator_list", ()))]
        )
        last = offset + (statement.end_lineno or statement.lineno)
        if spans and first <= spans[-1][1]:  # `a; b`: one LibCST statement line
            spans[-1] = (spans[-1][0], max(last, spans[-1][1]))
        else:
            spans.append((first, last))
    return spans


def _join(pieces: List[cst.Module], cache: PieceCache) -> Optional[cst.Module]:
    first = pieces[0]
    indent: Optional[str] = None
    newline = first.default_newline
    body: List[cst.BaseStatement] = []
    carried: Tuple[cst.EmptyLine, ...] = ()
    for index, piece in enumerate(pieces):
        if index and (piece.header or piece.default_newline != newline):
            return None
        if not piece.body:
            return None
        if any(_has_block(statement) for statement in piece.body):
            if indent is None:
                indent = piece.default_indent
            elif piece.default_indent != indent:
                return None
        statement, *more = piece.body
        if carried:
            key = (id(pieces[index - 1]), id(piece))
            joined = cache.statements.get(key)
            if joined is None:
                joined = cache.statements[key] = statement.with_changes(
                    leading_lines=(*carried, *statement.leading_lines)
                )
            statement = joined
        body.append(statement)
        body.extend(more)
        carried = tuple(piece.footer)
        if index < len(pieces) - 1 and not piece.has_trailing_newline:
            return None
    last = pieces[-1]
    return cst.Module(
        body=body,
        header=first.header,
        footer=last.footer,
        encoding="utf-8",
        default_indent=indent or first.default_indent,
        default_newline=newline,
        has_trailing_newline=last.has_trailing_newline,
    )


def _has_block(statement: cst.BaseStatement) -> bool:
    return not isinstance(statement, cst.SimpleStatementLine)

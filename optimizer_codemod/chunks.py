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

The joined tree is used only when it is certainly the one a whole-file parse gives: every
piece parsed with the same indentation and newline conventions as the first that shows
them. Anything else (another
encoding, a byte-order mark, a statement LibCST parses otherwise alone, a continuation line
`ast` and LibCST count differently) returns None and the caller parses the whole file.
"""

from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional, Tuple

import libcst as cst

# Below this many lines a whole-file parse is cheap enough, and exactly LibCST's own.
MIN_LINES = 2000
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


def parse_in_pieces(src: bytes, cache: Optional[PieceCache] = None) -> Optional[cst.Module]:
    """The module LibCST parses from `src` (utf-8, no BOM), built from per-statement parses;
    None when the text is short or not one this can parse exactly."""
    if src.count(b"\n") < MIN_LINES or src.startswith(b"\xef\xbb\xbf"):
        return None
    try:
        text = src.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if _ODD_BREAKS.search(text) or _declares_encoding(text):
        return None
    starts = _statement_starts(text)
    if starts is None or len(starts) < 2:
        return None
    lines = _LINE.findall(text)
    if lines and lines[-1] == "":
        lines.pop()
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    cuts = [0] + [offsets[start - 1] for start in starts[1:]] + [len(text)]
    cache = cache or PieceCache()
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


def _statement_starts(text: str) -> Optional[List[int]]:
    """The first line of each top-level statement's code (its first decorator's line)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    starts: List[int] = []
    last_end = 0
    for statement in tree.body:
        first = min(
            [statement.lineno, *(d.lineno for d in getattr(statement, "decorator_list", ()))]
        )
        if first <= last_end:  # `a; b`: one LibCST statement line
            last_end = max(last_end, statement.end_lineno or first)
            continue
        starts.append(first)
        last_end = statement.end_lineno or first
    return starts


def _join(pieces: List[cst.Module], cache: PieceCache) -> Optional[cst.Module]:
    first = pieces[0]
    indent: Optional[str] = None
    newline = first.default_newline
    body: List[cst.BaseStatement] = []
    carried: Tuple[cst.EmptyLine, ...] = ()
    for index, piece in enumerate(pieces):
        if index and (piece.header or piece.default_newline != newline):
            return None
        if len(piece.body) != 1:
            return None
        if _has_block(piece.body[0]):
            if indent is None:
                indent = piece.default_indent
            elif piece.default_indent != indent:
                return None
        statement = piece.body[0]
        if carried:
            key = (id(pieces[index - 1]), id(piece))
            joined = cache.statements.get(key)
            if joined is None:
                joined = cache.statements[key] = statement.with_changes(
                    leading_lines=(*carried, *statement.leading_lines)
                )
            statement = joined
        body.append(statement)
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

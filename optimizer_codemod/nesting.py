"""How deeply a source nests, bounded from its text before any parser sees it.

LibCST's native parser overflows its stack (a segfault, which no `except` catches) on an
expression a few thousand levels deep, such as `a+a+...` with 10,000 terms, and its Python
visitors run out of recursion far earlier. So a file is measured before it is parsed, in time
linear in its size, and refused with a clear per-file error when it nests deeper than
MAX_NESTING; whatever passes is processed with enough recursion headroom for that depth.

The measure is an upper bound of the depth of the file's LibCST tree. Strings and comments
are blanked out first (an f-string's replacement fields count every byte, and PEP 701 lets
them nest f-strings with the same quotes: they are followed to their real end); then, per statement, every token that can own a node (a name, a
number, a string, each operator character, an opening bracket) counts one level, a bracket
adds two for the wrapper nodes inside it (Arg, Element, SubscriptElement with its Index), a
comma or semicolon starts a sibling whose depth does not add up with the one before, and each
indentation level adds three (the compound statement, its block, the statement line) plus one
per `elif`/`else` before it (LibCST nests each `elif` in the previous one's `orelse`).
tests/test_property.py holds the bound against the real tree on generated deep expressions.
"""

from __future__ import annotations

import re
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, List, Tuple

# Deeper than any file in the torch 2.13 or ecosystem corpora (their deepest bound is 386),
# yet far below where LibCST's parser overflows its stack (between 5,000 and 7,000 levels).
MAX_NESTING = 1000
# CPython's tokenizer refuses deeper bracket nesting (MAXLEVEL); LibCST does not.
PYTHON_MAX_BRACKETS = 200
# Python frames per level of the bound that LibCST's visitors, metadata providers and the
# rules use: measured at up to 3.0 with every rule on the shapes that use most (chains of
# `not`, of strings, of calls, of `elif`s); doubled for margin. test_property.py's deep
# expressions run at bounds up to the limit under this headroom.
FRAMES_PER_LEVEL = 6

_BLANK_RE = re.compile(
    rb"""
    (?=[rRbBuUfFtT'"\#\\])
    (?:
        (?P<string>
            (?P<prefix>(?<![\w\x80-\xff])[rRbBuUfFtT]{1,2})?
            (?P<quote>'''|\"\"\"|'|")
        )
        |\#[^\r\n]*
        |(?P<continuation>\\(?:\r\n|\r|\n))
    )
    """,
    re.VERBOSE,
)
# The rest of a plain string after its opening quotes; an unterminated one ends its line.
_STRING_REST = {
    b"'''": re.compile(rb"(?:[^'\\]+|\\.|'(?!''))*(?:'''|\Z)", re.DOTALL),
    b'"""': re.compile(rb'(?:[^"\\]+|\\.|"(?!""))*(?:"""|\Z)', re.DOTALL),
    b"'": re.compile(rb"(?:[^'\\\r\n]+|\\.)*'?", re.DOTALL),
    b'"': re.compile(rb'(?:[^"\\\r\n]+|\\.)*"?', re.DOTALL),
}
# Where the text of an f-string (or t-string), or of a format spec, can change state.
_TEXT_STOP_RE = re.compile(rb"""\\.|\{\{|\}\}|[{}]|'''|\"\"\"|['"]|\r\n|\r|\n""", re.DOTALL)
# Where the code of a replacement field can: strings (PEP 701 lets them reuse the enclosing
# quotes, and nest f-strings to any depth), comments, brackets, a format spec, line breaks.
_FIELD_STOP_RE = re.compile(
    rb"""(?:(?<![\w\x80-\xff])[rRbBuUfFtT]{1,2})?(?:'''|\"\"\"|['"])|[#()\[\]{}:\r\n]"""
)
_BLANKS = b" \t\f\v\r\n"
_NEWLINES_RE = re.compile(rb"\r\n|\r|\n")
_SPLIT_RE = re.compile(rb"([()\[\]{},;]|\r\n|\r|\n)")
# Bytes that are neither part of a name or number nor blank: each may be an operator.
_OPERATORS = bytes(c for c in range(128) if not (chr(c).isalnum() or chr(c) in "_ \t\f\v\r\n"))
_OPENING = frozenset((b"(", b"[", b"{"))
_CLOSING = frozenset((b")", b"]", b"}"))
_SEPARATORS = frozenset((b",", b";"))
_CHAINED = (b"elif", b"else")


def _blank_out(src: bytes) -> bytes:
    """`src` with each string a run of `S` tokens and each comment a space.

    A string is one token; an f-string or t-string also counts every non-blank byte of its
    replacement fields, which LibCST parses into nodes. A hidden line break becomes \\v: blank
    to bytes.split(), not a statement end, and still countable when a line number is wanted.
    """
    pieces = []
    position, end = 0, len(src)
    while position < end:
        match = _BLANK_RE.search(src, position)
        if match is None:
            break
        pieces.append(src[position : match.start()])
        position = match.end()
        if match.group("continuation") is not None:
            pieces.append(b" \v")
            continue
        quote = match.group("quote")
        if quote is None:  # a comment
            pieces.append(b" ")
            continue
        prefix = (match.group("prefix") or b"").lower()
        if b"f" in prefix or b"t" in prefix:
            position, tokens, breaks = _template_string(src, position, quote)
        else:
            rest = _STRING_REST[quote].match(src, position)
            tokens, breaks = 1, len(_NEWLINES_RE.findall(rest.group()))
            position = rest.end()
        pieces.append(b" S" * tokens + b"\v" * breaks + b" ")
    pieces.append(src[position:])
    return b"".join(pieces)


def _template_string(src: bytes, position: int, quote: bytes) -> Tuple[int, int, int]:
    """(end, tokens, line breaks) of the f-string whose text starts at `position`.

    Iterative, since PEP 701 f-strings nest without limit. A frame is [the closing quote, or
    None for a format spec; the bracket depth in a replacement field, or -1 in text].
    """
    tokens, breaks, end = 1, 0, len(src)
    stack: List[list] = [[quote, -1]]
    while stack:
        frame = stack[-1]
        if frame[1] < 0:  # text
            match = _TEXT_STOP_RE.search(src, position)
            if match is None:
                return end, tokens, breaks
            stop, position = match.group(), match.end()
            if stop[:1] == b"\\" or stop in (b"{{", b"}}"):
                breaks += stop[1:2] in (b"\r", b"\n")
            elif stop == b"{":
                tokens += 2  # the field's node and its expression
                stack.append([None, 0])
            elif stop == b"}":
                if frame[0] is None:  # the end of a format spec, and so of its field
                    stack.pop()
            elif stop[:1] in (b"\r", b"\n"):
                breaks += 1
                if frame[0] is not None and len(frame[0]) == 1:
                    return position, tokens, breaks  # an unterminated string ends its line
            elif frame[0] is not None and stop[:1] == frame[0][:1] and len(stop) >= len(frame[0]):
                position = match.start() + len(frame[0])
                stack.pop()
        else:  # the code of a replacement field
            match = _FIELD_STOP_RE.search(src, position)
            if match is None:
                return end, tokens, breaks
            tokens += len(src[position : match.start()].translate(None, _BLANKS))
            stop, position = match.group(), match.end()
            opening = stop.lstrip(b"rRbBuUfFtT")
            if opening[:1] in (b"'", b'"'):
                tokens += 1
                if set(stop[: len(stop) - len(opening)].lower()) & set(b"ft"):
                    stack.append([opening, -1])
                else:
                    rest = _STRING_REST[opening].match(src, position)
                    breaks += len(_NEWLINES_RE.findall(rest.group()))
                    position = rest.end()
            elif stop == b"#":
                newline = _NEWLINES_RE.search(src, position)
                position = newline.start() if newline else end
            elif stop in (b"(", b"[", b"{"):
                frame[1] += 1
                tokens += 3  # as in code: the bracket's node and the wrappers inside
            elif stop in (b")", b"]"):
                frame[1] = max(0, frame[1] - 1)
            elif stop == b"}":
                if frame[1] == 0:
                    stack.pop()
                else:
                    frame[1] -= 1
            elif stop == b":":
                if frame[1] == 0:
                    stack[-1] = [None, -1]  # the field's format spec
            else:
                breaks += 1
    return position, tokens, breaks


def _scan(src: bytes) -> Tuple[int, int, int, List[bytes]]:
    """(depth bound, deepest bracket nesting, index in the parts of the deepest statement's
    first piece, the parts)."""
    parts = _SPLIT_RE.split(_blank_out(src))
    best = best_at = brackets = 0
    frames: List[Tuple[int, int, int]] = []
    # Per open bracket level: tokens of the current sibling, deepest bracket inside it,
    # deepest sibling so far.
    seg = child = widest = 0
    indents = [[0, 0]]  # [indentation width, elif/else chain] per open block
    base = 3
    statement_at = 0
    at_start = True
    operators = _OPERATORS

    def start(width: int, first: bytes) -> int:
        while len(indents) > 1 and width < indents[-1][0]:
            indents.pop()
        if width > indents[-1][0]:
            indents.append([width, 0])
        if first.rstrip(b":") in _CHAINED:
            indents[-1][1] += 1
        else:
            indents[-1][1] = 0
        return sum(3 + chain for _, chain in indents)

    for index, part in enumerate(parts):
        if not index & 1:
            words = part.split()
            if not words:
                continue
            if at_start and not frames:
                at_start, statement_at = False, index
                base = start(len(part) - len(part.lstrip()), words[0])
            seg += len(words) + 2 * (len(part) - len(part.translate(None, operators)))
        elif part in _OPENING:
            if at_start and not frames:  # a statement that begins with a bracket
                at_start, statement_at = False, index - 1
                base = start(len(parts[index - 1]), part)
            seg += 1
            frames.append((seg, child, widest))
            seg = child = widest = 0
            if len(frames) > brackets:
                brackets = len(frames)
        elif part in _CLOSING:
            if frames:
                inner = max(widest, seg + child) + 2
                seg, child, widest = frames.pop()
                if inner > child:
                    child = inner
        elif part in _SEPARATORS:
            if seg + child > widest:
                widest = seg + child
            seg = child = 0
        elif not frames and not at_start:  # a line break that ends a statement
            depth = base + max(widest, seg + child)
            if depth > best:
                best, best_at = depth, statement_at
            seg = child = widest = 0
            at_start = True
    while frames:  # brackets left open at the end of the file
        inner = max(widest, seg + child) + 2
        seg, child, widest = frames.pop()
        child = max(child, inner)
    depth = base + max(widest, seg + child)
    if depth > best:
        best, best_at = depth, statement_at
    return best, brackets, best_at, parts


def estimate(src: bytes) -> Tuple[int, int]:
    """(upper bound of the LibCST tree's depth, deepest bracket nesting) of `src`."""
    depth, brackets, _, _ = _scan(src)
    return depth, brackets


def deepest_line(src: bytes) -> int:
    """The 1-based line where the statement with the deepest bound starts."""
    _, _, index, parts = _scan(src)
    before = b"".join(parts[:index])
    leading = parts[index][: len(parts[index]) - len(parts[index].lstrip())]
    return 1 + len(_NEWLINES_RE.findall(before)) + before.count(b"\v") + leading.count(b"\v")


_headroom_lock = threading.Lock()
_headroom_users = 0
_saved_limit = 0


@contextmanager
def recursion_headroom() -> Iterator[None]:
    """Enough recursion for a tree MAX_NESTING deep, above the caller's own stack.

    The recursion limit is process-wide: it is raised while any caller is inside and put back
    when the last one leaves. Inputs are bounded by MAX_NESTING before they are parsed, so the
    C stack under these frames stays far from its end.
    """
    global _headroom_users, _saved_limit
    needed = _stack_depth() + MAX_NESTING * FRAMES_PER_LEVEL + 500
    with _headroom_lock:
        if _headroom_users == 0:
            _saved_limit = sys.getrecursionlimit()
        _headroom_users += 1
        if sys.getrecursionlimit() < needed:
            sys.setrecursionlimit(needed)
    try:
        yield
    finally:
        with _headroom_lock:
            _headroom_users -= 1
            if _headroom_users == 0:
                sys.setrecursionlimit(_saved_limit)


def _stack_depth() -> int:
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    return depth

"""Where a notebook cell's source text sits in the notebook's own JSON text.

Findings in a notebook are reported per cell (`cell 3, line 4`), but tools that show a file's
raw lines (SARIF viewers, GitHub annotations) need the line and column in the .ipynb file
itself: the line of the JSON string that holds that source line. `json` gives no positions,
so the cells' `source` values are located here; every other value is skipped with the C
decoder, so large outputs (images) cost little.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from json.decoder import scanstring
from typing import Dict, List, Optional, Tuple

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")

Region = Tuple[int, int, int, int]  # start line, start column, end line, end column (1-based)


def _skip(text: str, index: int) -> int:
    return _SPACE.match(text, index).end()


def _members(text: str, index: int) -> List[Tuple[str, int, int]]:
    """(key, start, end) of each member of the object whose `{` is at `index`."""
    members = []
    index = _skip(text, index + 1)
    if text[index] == "}":
        return members
    while True:
        key, index = scanstring(text, index + 1)
        index = _skip(text, _skip(text, index) + 1)  # past the colon
        end = _DECODER.raw_decode(text, index)[1]
        members.append((key, index, end))
        index = _skip(text, end)
        if text[index] != ",":
            return members
        index = _skip(text, index + 1)


def _elements(text: str, index: int) -> List[Tuple[int, int]]:
    """(start, end) of each element of the array whose `[` is at `index`."""
    elements = []
    index = _skip(text, index + 1)
    if text[index] == "]":
        return elements
    while True:
        end = _DECODER.raw_decode(text, index)[1]
        elements.append((index, end))
        index = _skip(text, end)
        if text[index] != ",":
            return elements
        index = _skip(text, index + 1)


@dataclass(frozen=True)
class _Piece:
    quote: int  # offset of the string's opening quote in the JSON text
    start: int  # offset of its first character in the cell's source text
    length: int  # decoded length


def _raw_offset(text: str, quote: int, count: int) -> int:
    """The JSON-text offset of the `count`-th decoded character of the string at `quote`."""
    index = quote + 1
    for _ in range(count):
        if text[index] != "\\":
            index += 1
        elif text[index + 1] != "u":
            index += 2
        elif (
            0xD800 <= int(text[index + 2 : index + 6], 16) < 0xDC00
            and text[index + 6 : index + 8] == "\\u"
        ):
            index += 12  # a surrogate pair is one character of Python text
        else:
            index += 6
    return index


class NotebookPositions:
    """Maps (cell number, line, column) of a cell's source to (line, column) of the file."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self._cells: Dict[int, List[_Piece]] = {}
        self._sources: Dict[int, str] = {}
        try:
            self._locate_sources()
        except (ValueError, IndexError):  # not the JSON the caller parsed: no positions
            self._cells.clear()

    def _locate_sources(self) -> None:
        start = _skip(self.text, 0)
        if self.text[start] != "{":
            return
        for key, value, _ in _members(self.text, start):
            if key != "cells" or self.text[value] != "[":
                continue
            for number, (cell, _) in enumerate(_elements(self.text, value), start=1):
                if self.text[cell] != "{":
                    continue
                for name, source, _ in _members(self.text, cell):
                    if name == "source":
                        self._add(number, source)

    def _add(self, number: int, source: int) -> None:
        if self.text[source] == '"':
            quotes = [source]
        elif self.text[source] == "[":
            quotes = [start for start, _ in _elements(self.text, source)]
        else:
            return
        pieces, decoded, offset = [], [], 0
        for quote in quotes:
            if self.text[quote] != '"':
                return
            value = scanstring(self.text, quote + 1)[0]
            pieces.append(_Piece(quote, offset, len(value)))
            decoded.append(value)
            offset += len(value)
        self._cells[number] = pieces
        self._sources[number] = "".join(decoded)

    def _file_position(
        self, cell: int, line: int, column: int, end: bool = False
    ) -> Optional[Tuple[int, int]]:
        pieces, source = self._cells.get(cell), self._sources.get(cell)
        if not pieces or source is None:
            return None
        lines = source.splitlines(keepends=True) or [""]
        if not 1 <= line <= len(lines):
            return None
        offset = sum(len(text) for text in lines[: line - 1]) + max(0, column - 1)
        offset = min(offset, len(source))
        starts = [piece.start for piece in pieces]
        # An end that falls on a piece boundary stays at the end of the earlier piece's line.
        find = bisect.bisect_left if end else bisect.bisect_right
        piece = pieces[max(0, find(starts, offset) - 1)]
        within = min(offset - piece.start, piece.length)
        raw = _raw_offset(self.text, piece.quote, within)
        file_line = bisect.bisect_right(self._line_starts, raw)
        return file_line, raw - self._line_starts[file_line - 1] + 1

    def region(
        self, cell: int, line: int, column: int, end_line: int, end_column: int
    ) -> Optional[Region]:
        """The file region of a cell-relative region, or None when it cannot be placed."""
        start = self._file_position(cell, line, column)
        end = self._file_position(cell, end_line, end_column, end=True)
        if start is None:
            return None
        if end is None or end < start:
            end = start
        return start[0], start[1], end[0], end[1]

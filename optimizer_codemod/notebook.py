"""Jupyter notebooks: code cells become one Python text, rewritten, then put back.

The cells are analysed together (a model built in one cell is trained in another). IPython
magics and shell lines are masked with placeholder names and restored untouched; a `%%` cell
magic keeps its cell out of the Python text. Only changed cells differ in the JSON, and the
notebook's own JSON layout (indent, key order, escaping) is kept.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from optimizer_codemod.errors import NotebookError

_CELL_MARKER = "# __optcodemod_cell_{}__"
_CELL_MARKER_RE = re.compile(r"^# __optcodemod_cell_(\d+)__$", re.MULTILINE)
_MAGIC_PLACEHOLDER = "__optcodemod_magic_{}__"
_MAGIC_PLACEHOLDER_RE = re.compile(r"^([ \t]*)__optcodemod_magic_(\d+)__$")
# `%time x`, `!ls`, `x = !ls`, `x = %env`, `obj?`, `??obj`
_MAGIC_RE = re.compile(r"^[ \t]*(?:[%!]|\?{1,2}[\w.]|[\w.,\s\[\]]+=\s*[%!]|[\w.]+\?{1,2}\s*$)")
# What decides whether the next line starts a statement: strings (a triple-quoted one may run
# on), comments, and brackets.
_PYTHON_TOKEN_RE = re.compile(
    r"(?P<string>[rRbBuUfF]{0,2}"
    r"(?:'''|\"\"\"|'(?:[^'\\]|\\.)*(?:'|\\?$)|\"(?:[^\"\\]|\\.)*(?:\"|\\?$)))"
    r"|(?P<comment>#.*)"
    r"|(?P<open>[(\[{])"
    r"|(?P<close>[)\]}])"
)


@dataclass
class _Cell:
    index: int  # position in the notebook's cell list
    text: str  # Python text with magics masked, ending with a newline
    source_was_list: bool
    ends_with_newline: bool
    magics: Dict[int, str] = field(default_factory=dict)  # placeholder number -> original line
    newline: str = "\n"  # the cell's own line break, put back in the lines a rule changed
    # IPython runs a cell indented as a whole (its `leading_indent` transform): the indent
    # taken off for Python, and the cell's lines as written, to put back.
    indent: str = ""
    original: str = ""


class _Continuation:
    """Whether the next line of a cell continues a statement (so cannot be a magic)."""

    def __init__(self) -> None:
        self.depth = 0  # open brackets
        self.string = ""  # the quotes of a triple-quoted string still open
        self.backslash = False

    @property
    def continuing(self) -> bool:
        return self.depth > 0 or bool(self.string) or self.backslash

    def feed(self, line: str) -> None:
        position = 0
        if self.string:
            end = _closing_quotes(line, 0, self.string)
            if end < 0:
                return
            self.string, position = "", end
        self.backslash = False
        while True:
            match = _PYTHON_TOKEN_RE.search(line, position)
            if match is None:
                break
            kind, position = match.lastgroup, match.end()
            if kind == "comment":
                return
            if kind == "open":
                self.depth += 1
            elif kind == "close":
                self.depth = max(0, self.depth - 1)
            if kind != "string":
                continue
            quotes = match.group().lstrip("rRbBuUfF")
            if quotes in ("'''", '"""'):
                end = _closing_quotes(line, position, quotes)
                if end < 0:
                    self.string = quotes
                    return
                position = end
            elif match.group().endswith("\\"):  # a one-quote string continued by a backslash
                self.backslash = True
                return
        self.backslash = line.rstrip("\r").endswith("\\")


def _closing_quotes(line: str, start: int, quotes: str) -> int:
    """The index just past `quotes` closing a string in `line` from `start`, else -1."""
    position = start
    while True:
        found = line.find(quotes, position)
        if found < 0:
            return -1
        backslashes = len(line[:found]) - len(line[:found].rstrip("\\"))
        if backslashes % 2 == 0:
            return found + 3
        position = found + 1


@dataclass
class _Layout:
    indent: Optional[int]
    ensure_ascii: bool
    trailing_newline: bool
    newline: str = "\n"  # a notebook saved on Windows may break its JSON lines with \r\n

    def dump(self, data: Any) -> str:
        text = json.dumps(data, indent=self.indent, ensure_ascii=self.ensure_ascii)
        text += "\n" if self.trailing_newline else ""
        # JSON escapes line breaks inside strings, so every raw one is the layout's own.
        return text.replace("\n", self.newline) if self.newline != "\n" else text


class Notebook:
    def __init__(self, raw: bytes, path: str):
        self.path = path
        self.raw = raw
        try:
            self.text = raw.decode("utf-8")
            self.data = json.loads(self.text)
        except UnicodeDecodeError as exc:
            raise NotebookError(f"notebook is not UTF-8: {exc.reason} at byte {exc.start}", path)
        except json.JSONDecodeError as exc:
            raise NotebookError(
                f"not a valid notebook: JSON error: {exc.msg}",
                path,
                exc.lineno,
                exc.colno,
            ) from None
        if not isinstance(self.data, dict) or not isinstance(self.data.get("cells"), list):
            raise NotebookError("not a valid notebook: no list of cells", path)
        self.cells: List[_Cell] = []
        self._magic_count = 0
        for index, cell in enumerate(self.data["cells"]):
            if isinstance(cell, dict) and cell.get("cell_type") == "code":
                parsed = self._code_cell(index, cell)
                if parsed is not None:
                    self.cells.append(parsed)

    @property
    def is_python(self) -> bool:
        metadata = self.data.get("metadata") or {}
        language = (metadata.get("language_info") or {}).get("name") or (
            metadata.get("kernelspec") or {}
        ).get("language")
        return language is None or str(language).lower() == "python"

    def _code_cell(self, index: int, cell: Dict[str, Any]) -> Optional[_Cell]:
        source = cell.get("source", "")
        was_list = isinstance(source, list)
        text = "".join(source) if was_list else str(source)
        if text.lstrip().startswith("%%"):
            return None
        newline = "\r\n" if "\r\n" in text else "\n"
        text = text.replace("\r\n", "\n")
        ends_with_newline = text.endswith("\n") or text == ""
        magics: Dict[int, str] = {}
        # Only \n breaks lines: a form feed or U+2028 inside the code is not a line break.
        lines = text[:-1].split("\n") if text.endswith("\n") else text.split("\n")
        lines = lines if text else []
        indent = _leading_indent(lines)
        original = "\n".join(lines) + ("\n" if lines else "")
        if indent:
            lines = [line[len(indent) :] if line.startswith(indent) else line for line in lines]
        masked = []
        magic_continues = False
        magic_indent = ""
        python = _Continuation()
        for line in lines:
            if magic_continues or (not python.continuing and _MAGIC_RE.search(line)):
                number = self._magic_count
                self._magic_count += 1
                magics[number] = line
                # A continuation line (`!pip install \` then `    torch \`) stands in at
                # the indent of the magic it continues, not its own.
                if not magic_continues:
                    magic_indent = _indent(line)
                masked.append(magic_indent + _MAGIC_PLACEHOLDER.format(number))
                magic_continues = line.endswith("\\")
            else:
                masked.append(line)
                python.feed(line)
        body = "\n".join(masked) + ("\n" if masked else "")
        return _Cell(index, body, was_list, ends_with_newline, magics, newline, indent, original)

    # Python text ------------------------------------------------------------------------
    def python_text(self) -> str:
        return "".join(_CELL_MARKER.format(cell.index) + "\n" + cell.text for cell in self.cells)

    def indent_of(self, cell_number: int) -> int:
        """How many columns IPython's leading indent took off the cell (1-based number)."""
        cell = next((c for c in self.cells if c.index + 1 == cell_number), None)
        return len(cell.indent) if cell is not None else 0

    def locate(self, line: int) -> Tuple[int, int]:
        """(1-based cell number in the notebook, line within that cell) for a Python line."""
        offset = 1  # the line of the current cell's marker
        for cell in self.cells:
            cell_lines = cell.text.count("\n")
            if line <= offset + cell_lines:
                return cell.index + 1, max(1, line - offset)
            offset += cell_lines + 1
        last = self.cells[-1] if self.cells else None
        return ((last.index + 1) if last else 1), max(1, line - offset)

    def changed_cells(self, new_text: str) -> List[Tuple[int, str, str]]:
        """(cell index, old source, new source) for every code cell `new_text` changes."""
        pieces = _split_cells(new_text)
        if [index for index, _ in pieces] != [cell.index for cell in self.cells]:
            raise NotebookError("a rule moved a cell boundary; notebook left untouched", self.path)
        changes = []
        for cell, (_, text) in zip(self.cells, pieces):
            if text == cell.text:
                continue
            old = self._restore_magics(cell, cell.text)
            new = self._restore_magics(cell, text)
            if cell.indent:
                old, new = cell.original, _indented_like(old, new, cell.original, cell.indent)
            if not cell.ends_with_newline:
                old, new = _drop_final_newline(old), _drop_final_newline(new)
            if cell.newline != "\n":
                old, new = old.replace("\n", cell.newline), new.replace("\n", cell.newline)
            changes.append((cell.index, old, new))
        return changes

    def with_cells(self, changes: List[Tuple[int, str, str]]) -> bytes:
        """The notebook bytes with the given cells' sources replaced; nothing else moves."""
        if not changes:
            return self.raw
        layout = self._layout()
        data = json.loads(self.text)  # a fresh copy in the original key order
        by_index = {cell.index: cell for cell in self.cells}
        for index, _, new in changes:
            node = data["cells"][index]
            was_list = by_index[index].source_was_list
            node["source"] = new.splitlines(keepends=True) if was_list else new
        return layout.dump(data).encode("utf-8")

    def _restore_magics(self, cell: _Cell, text: str) -> str:
        out = []
        remaining = dict(cell.magics)
        for line in text.split("\n"):
            match = _MAGIC_PLACEHOLDER_RE.match(line)
            if match and int(match.group(2)) in remaining:
                out.append(remaining.pop(int(match.group(2))))
            else:
                out.append(line)
        if remaining:
            raise NotebookError(
                f"a rule moved an IPython magic in cell {cell.index + 1}; notebook left untouched",
                self.path,
            )
        return "\n".join(out)

    def _layout(self) -> _Layout:
        trailing = self.text.endswith("\n")
        crlf = "\r\n" in self.text and self.text.count("\r\n") == self.text.count("\n")
        for indent in (1, 2, 4, None, 3, 8):
            for ensure_ascii in (False, True):
                layout = _Layout(indent, ensure_ascii, trailing, "\r\n" if crlf else "\n")
                if layout.dump(self.data) == self.text:
                    return layout
        raise NotebookError(
            "cannot reproduce this notebook's JSON layout, so rewriting it would change "
            "unrelated lines; left untouched (saving it once from Jupyter normalises it)",
            self.path,
        )


def _indent(line: str) -> str:
    return re.match(r"[ \t]*", line).group(0)


def _leading_indent(lines: List[str]) -> str:
    """The indent IPython takes off a cell before running it (`leading_indent`, after
    `leading_empty_lines`): the first line with code's, from every line that starts with it.
    Only when every line with code starts with it: then a line a fix adds or changes gets it
    back for sure (a cell whose indented first line is a comment reads as Python does)."""
    written = [line for line in lines if line.strip()]
    indent = _indent(written[0]) if written else ""
    return indent if all(line.startswith(indent) for line in written) else ""


def _indented_like(old: str, new: str, original: str, indent: str) -> str:
    """`new` (a rewrite of the dedented `old`) indented back: the lines kept are the cell's
    own, as written; the lines a rule added or changed get the cell's indent."""
    old_lines, new_lines = old.split("\n"), new.split("\n")
    original_lines = original.split("\n")
    out: List[str] = []
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for tag, first, last, new_first, new_last in matcher.get_opcodes():
        if tag == "equal":
            out += original_lines[first:last]
        else:
            out += [
                indent + line if line.strip() else line for line in new_lines[new_first:new_last]
            ]
    return "\n".join(out)


def is_cell_marker(comment: str) -> bool:
    """Whether a comment is the line that begins a cell in a notebook's Python text."""
    return _CELL_MARKER_RE.fullmatch(comment) is not None


def is_magic_placeholder(name: str) -> bool:
    """Whether a name is the placeholder a masked magic line (`%matplotlib inline`) became."""
    return _MAGIC_PLACEHOLDER_RE.match(name) is not None


def _split_cells(text: str) -> List[Tuple[int, str]]:
    markers = list(_CELL_MARKER_RE.finditer(text))
    pieces = []
    for position, match in enumerate(markers):
        start = match.end() + 1
        end = markers[position + 1].start() if position + 1 < len(markers) else len(text)
        body = text[start:end]
        if position == 0 and match.start() > 0:  # code a rule put before the first cell
            body = text[: match.start()] + body
        pieces.append((int(match.group(1)), body))
    return pieces


def _drop_final_newline(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text

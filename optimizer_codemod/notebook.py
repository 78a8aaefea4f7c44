"""Jupyter notebooks: code cells become one Python text, rewritten, then put back.

The cells are analysed together (a model built in one cell is trained in another). IPython
magics and shell lines are masked with placeholder names and restored untouched; a `%%` cell
magic keeps its cell out of the Python text. Only changed cells differ in the JSON, and the
notebook's own JSON layout (indent, key order, escaping) is kept.
"""

from __future__ import annotations

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


@dataclass
class _Cell:
    index: int  # position in the notebook's cell list
    text: str  # Python text with magics masked, ending with a newline
    source_was_list: bool
    ends_with_newline: bool
    magics: Dict[int, str] = field(default_factory=dict)  # placeholder number -> original line


@dataclass
class _Layout:
    indent: Optional[int]
    ensure_ascii: bool
    trailing_newline: bool

    def dump(self, data: Any) -> str:
        text = json.dumps(data, indent=self.indent, ensure_ascii=self.ensure_ascii)
        return text + ("\n" if self.trailing_newline else "")


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
        ends_with_newline = text.endswith("\n") or text == ""
        magics: Dict[int, str] = {}
        lines = text.splitlines()
        masked = []
        continuing = False
        for line in lines:
            if continuing or _MAGIC_RE.search(line):
                number = self._magic_count
                self._magic_count += 1
                magics[number] = line
                indent = re.match(r"[ \t]*", line).group(0)
                masked.append(indent + _MAGIC_PLACEHOLDER.format(number))
                continuing = line.endswith("\\")
            else:
                masked.append(line)
        body = "\n".join(masked) + ("\n" if masked else "")
        return _Cell(index, body, was_list, ends_with_newline, magics)

    # Python text ------------------------------------------------------------------------
    def python_text(self) -> str:
        return "".join(_CELL_MARKER.format(cell.index) + "\n" + cell.text for cell in self.cells)

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
            if not cell.ends_with_newline:
                old, new = _drop_final_newline(old), _drop_final_newline(new)
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
        for indent in (1, 2, 4, None, 3, 8):
            for ensure_ascii in (False, True):
                layout = _Layout(indent, ensure_ascii, trailing)
                if layout.dump(self.data) == self.text:
                    return layout
        raise NotebookError(
            "cannot reproduce this notebook's JSON layout, so rewriting it would change "
            "unrelated lines; left untouched (saving it once from Jupyter normalises it)",
            self.path,
        )


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

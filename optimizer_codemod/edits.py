"""Line-level edits between a file's old and new text, for reports that carry fixes (SARIF)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import List

from optimizer_codemod.lines import split_lines
from optimizer_codemod.linediff import opcodes


@dataclass(frozen=True)
class TextEdit:
    """Replace original lines first_line..last_line (1-based) with new_text.

    A pure insertion before line N has first_line == N and last_line == N - 1. offset and length
    count characters of the original text, which is what SARIF's charOffset/charLength mean.
    """

    first_line: int
    last_line: int
    offset: int
    length: int
    new_text: str

    def distance(self, first: int, last: int) -> int:
        """Lines between this edit and original lines first..last (0: on or next to them)."""
        return max(0, self.first_line - (last + 1), first - 1 - self.last_line)


def text_edits(old: str, new: str) -> List[TextEdit]:
    old_lines = split_lines(old, keepends=True)
    new_lines = split_lines(new, keepends=True)
    starts = [0, *accumulate(len(line) for line in old_lines)]
    return [
        TextEdit(
            first_line=i1 + 1,
            last_line=i2,
            offset=starts[i1],
            length=starts[i2] - starts[i1],
            new_text="".join(new_lines[j1:j2]),
        )
        for tag, i1, i2, j1, j2 in opcodes(old_lines, new_lines)
        if tag != "equal"
    ]

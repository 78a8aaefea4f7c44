"""What the engine tells its callers about one file: diagnostics and the file's outcome."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import List, Optional, Tuple

from optimizer_codemod.edits import TextEdit
from optimizer_codemod.rule import Safety


class Status(enum.Enum):
    FIXED = "fixed"  # the fix was applied (or would be, under --check/--diff)
    UNSAFE = "unsafe"  # a behaviour-level fix that --unsafe-fixes would apply
    REPORTED = "reported"  # no fix is offered
    # A site a rule examined and left alone, with the reason (only under --why-not).
    DECLINED = "declined"


@dataclass(frozen=True)
class Diagnostic:
    code: str
    name: str
    message: str
    fix_title: str
    safety: Safety
    status: Status
    line: int
    column: int
    end_line: int
    end_column: int
    cell: Optional[int] = None  # 1-based cell number in a notebook; lines are cell-relative
    # Original-line ranges (first, last) the fix edits; empty for a finding without a fix.
    # In a notebook, lines of the .ipynb file's own text (what FileOutcome.edits edit).
    edit_lines: Tuple[Tuple[int, int], ...] = ()
    # In a notebook: (line, column, end line, end column) of the finding in the .ipynb file's
    # own text, for viewers of the raw file; None where lines are the file's already.
    file_region: Optional[Tuple[int, int, int, int]] = None

    def moved(self, **changes: object) -> "Diagnostic":
        return replace(self, **changes)


@dataclass
class FileOutcome:
    """The result of processing one path."""

    path: str
    diagnostics: List[Diagnostic] = field(default_factory=list)
    changed: bool = False
    written: bool = False
    error: Optional[str] = None
    warning: Optional[str] = None
    skipped: Optional[str] = None  # why the file was not looked at (for --verbose)
    diff: Optional[str] = None
    new_text: Optional[bytes] = None
    # (the text it was read with, its rewrite) in a run of several files that import each
    # other: a rewrite of one may change what another is told (runner._settle_project).
    texts: Optional[Tuple[bytes, bytes]] = None
    # The changes as line-level edits of the original text (Python files, not notebooks).
    edits: List[TextEdit] = field(default_factory=list)

    @property
    def fixed(self) -> List[Diagnostic]:
        return [d for d in self.diagnostics if d.status is Status.FIXED]

    @property
    def unsafe(self) -> List[Diagnostic]:
        return [d for d in self.diagnostics if d.status is Status.UNSAFE]

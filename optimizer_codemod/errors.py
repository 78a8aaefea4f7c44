"""Errors that name the file and the problem. Each leaves the file untouched."""

from __future__ import annotations

from typing import Optional, Sequence


class OptcodemodError(Exception):
    """A problem with one file, or with the configuration; rendered as `path[:line:col]: msg`."""

    def __init__(
        self,
        message: str,
        path: Optional[str] = None,
        line: Optional[int] = None,
        column: Optional[int] = None,
        cell: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.line = line
        self.column = column
        self.cell = cell

    def render(self) -> str:
        where = self.path or "<input>"
        if self.cell is not None:
            where += f":cell {self.cell}"
        if self.line is not None:
            where += f":{self.line}:{self.column if self.column is not None else 1}"
        return f"{where}: {self.message}"

    def with_path(self, path: str) -> "OptcodemodError":
        self.path = path
        return self

    def __str__(self) -> str:
        return self.render()


class SourceParseError(OptcodemodError):
    """The file is not valid Python (or not decodable)."""


class UnreproducibleSourceError(OptcodemodError):
    """LibCST cannot print the file back byte for byte, so rewriting it could lose text."""


class RuleBrokeOutputError(OptcodemodError):
    def __init__(self, message: str, codes: Sequence[str], path: Optional[str] = None):
        super().__init__(message, path)
        self.codes = tuple(codes)


class NonConvergenceError(OptcodemodError):
    def __init__(self, message: str, codes: Sequence[str], path: Optional[str] = None):
        super().__init__(message, path)
        self.codes = tuple(codes)


class NotebookError(OptcodemodError):
    pass


class FileAccessError(OptcodemodError):
    pass


class ConfigError(OptcodemodError):
    """A bad setting; the message names the key."""


class TooDeeplyNestedError(SourceParseError):
    """Valid or not, the text nests deeper than the parser can take without crashing."""


class FileChangedError(FileAccessError):
    """The file on disk is no longer what was read: someone saved it during the run."""

"""Formatting the lines a rule changed the way the file's project formats code (black).

When the nearest pyproject.toml above a file has a `[tool.black]` table, the lines the rules
changed are reformatted by black under that configuration, using black's line ranges, so every
other line stays byte-identical. Without such a table, the original formatting is kept and
inserted code follows PEP 8 as the rules write it. black is imported only when configured.
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

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
    matcher = difflib.SequenceMatcher(
        None, old.splitlines(keepends=True), new.splitlines(keepends=True), autojunk=False
    )
    return [
        (j1 + 1, j2) for tag, _, _, j1, j2 in matcher.get_opcodes() if tag != "equal" and j2 > j1
    ]


def format_changed_lines(old: str, new: str, style: BlackStyle) -> str:
    """`new` with only the lines that differ from `old` reformatted by black."""
    try:
        import black
    except ImportError:
        raise FormatterUnavailable(
            f"{style.pyproject} configures black, but black is not installed; "
            "changed lines keep optcodemod's formatting (pip install 'optcodemod[black]')"
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


# Without a formatter configured, a call that a rule made too long is split one argument per
# line (black's layout), so rewritten code still reads like hand-written code.
DEFAULT_LINE_LIMIT = 88


def wrap_long_calls(old: str, new: str) -> str:
    """`new` with each changed single-line statement that grew past the limit split up.

    The limit is 88 characters (black's), or the original's longest line when that is longer:
    a file written to 120 columns stays at 120.
    """
    limit = max([DEFAULT_LINE_LIMIT, *(len(line) for line in old.splitlines())])
    lines = new.splitlines()
    changed = {n for first, last in changed_line_ranges(old, new) for n in range(first, last + 1)}
    too_long = {n for n in changed if len(lines[n - 1]) > limit}
    if not too_long:
        return new
    module = cst.parse_module(new)
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    outermost: Dict[int, Tuple[cst.Call, int]] = {}
    for node, where in positions.items():
        line = where.start.line
        if (
            isinstance(node, cst.Call)
            and line in too_long
            and where.end.line == line
            and _can_explode(node)
            and (line not in outermost or where.start.column < outermost[line][1])
        ):
            outermost[line] = (node, where.start.column)
    if not outermost:
        return new
    targets = {node: _indent(lines[line - 1]) for line, (node, _) in outermost.items()}
    return module.visit(_ArgumentsOnTheirOwnLines(targets)).code


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _can_explode(call: cst.Call) -> bool:
    # A trailing comma after an unparenthesised generator argument is a syntax error.
    return bool(call.args) and not any(
        isinstance(arg.value, cst.GeneratorExp) and not arg.value.lpar for arg in call.args
    )


def _line_break(indent: str) -> cst.ParenthesizedWhitespace:
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(),
        empty_lines=[],
        indent=False,
        last_line=cst.SimpleWhitespace(indent),
    )


class _ArgumentsOnTheirOwnLines(cst.CSTTransformer):
    def __init__(self, targets: Dict[cst.Call, str]) -> None:
        super().__init__()
        self.targets = targets  # call -> indentation of the line it stands on

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        indent = self.targets.get(original_node)
        if indent is None:
            return updated_node
        inner = indent + "    "
        last = len(updated_node.args) - 1
        args = [
            arg.with_changes(
                whitespace_after_arg=cst.SimpleWhitespace(""),
                comma=cst.Comma(
                    whitespace_before=cst.SimpleWhitespace(""),
                    whitespace_after=_line_break(indent if index == last else inner),
                ),
            )
            for index, arg in enumerate(updated_node.args)
        ]
        return updated_node.with_changes(whitespace_before_args=_line_break(inner), args=args)

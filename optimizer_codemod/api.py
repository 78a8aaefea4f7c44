"""The Python API: source text in, rewritten text and diagnostics out.

    >>> from optimizer_codemod import rewrite
    >>> result = rewrite("import torch\\nopt = torch.optim.AdamW(params, lr=1e-3)\\n")
    >>> print(result.source, end="")
    import torch
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    >>> [(d.code, d.line, d.safety.label) for d in result.diagnostics]
    [('OPT501', 2, 'numerics')]

The command line is built on `rewrite_source`, which works on bytes and notebooks too.
"""

from __future__ import annotations

import gc
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from optimizer_codemod.config import RuleSelection, Settings, validate_codes
from optimizer_codemod.diagnostics import Diagnostic
from optimizer_codemod.engine import (
    PRECISIONS,
    TARGET_DEVICES,
    Resume,
    RewriteOptions,
    may_contain_findings,
    rewrite_bytes,
)
from optimizer_codemod.errors import OptcodemodError
from optimizer_codemod.formatting import (
    FormatterUnavailable,
    black_style_for,
    format_changed_lines,
    wrap_long_calls,
)
from optimizer_codemod.ipynb_positions import NotebookPositions
from optimizer_codemod.nesting import recursion_headroom
from optimizer_codemod.noqa import has_skip_file
from optimizer_codemod.notebook import Notebook
from optimizer_codemod.sources import check_syntax, compile_check
from optimizer_codemod.torch_version import TorchVersion

NOTEBOOK_SUFFIX = ".ipynb"


@dataclass
class SourceRewrite:
    """The outcome for one source: new bytes, diagnostics, and what a diff should show."""

    new: bytes
    changed: bool
    diagnostics: List[Diagnostic] = field(default_factory=list)
    # (label, old text, new text) pairs for diffs: the whole file, or each changed cell.
    diff_parts: List[Tuple[str, str, str]] = field(default_factory=list)
    skipped: Optional[str] = None  # why the file was not looked at, when it was not
    warning: Optional[str] = None  # something the user should know; the rewrite still stands
    # False: the changed lines keep the layout the fixes gave them (format_rewrite lays
    # them out as the project's black would).
    formatted: bool = True


def is_notebook(path: str) -> bool:
    return path.endswith(NOTEBOOK_SUFFIX)


# What test runners collect at the top of a module: pytest's `test_*` functions and `Test*`
# classes (in files named `test_*.py` or `*_test.py`), unittest's TestCase classes (anywhere).
_PYTEST_FILE = re.compile(r"(?:test_.*|.*_test)\.py")
_PYTEST_ITEMS = re.compile(rb"^(?:(?:async\s+)?def\s+test_\w*\s*\(|class\s+Test\w*\s*[(:])", re.M)
_TEST_CASES = re.compile(rb"^class\s+\w+\s*\([^)]*TestCase\s*[,)]", re.M)
TEST_MODULE_SKIPPED = "a test module (exclude-tests)"


def collected_by_test_runners(src: bytes, path: str) -> bool:
    """The file is what a test runner collects: its edits would buy no training time and
    could break assertions on exact values (a fused optimizer's last bits)."""
    if is_notebook(path):
        return False
    named = _PYTEST_FILE.fullmatch(os.path.basename(path)) is not None
    return bool(named and _PYTEST_ITEMS.search(src)) or _TEST_CASES.search(src) is not None


def settle_without_parsing(
    src: bytes,
    path: str,
    rules: Sequence[type],
    project: object = None,
    exclude_tests: bool = False,
) -> Optional[SourceRewrite]:
    """The outcome of a file the cheap pre-filter settles, else None (it needs rewriting).

    A file no selected rule can fire on is never parsed by LibCST, but its syntax is still
    checked with Python's `compile` (DESIGN.md §4): a syntax error raises SourceParseError.
    """
    if not src.strip():
        return SourceRewrite(src, False, skipped="empty file")
    if has_skip_file(src):
        return SourceRewrite(src, False, skipped="# optcodemod: skip-file")
    if exclude_tests and collected_by_test_runners(src, path):
        check_syntax(src, path)
        return SourceRewrite(src, False, skipped=TEST_MODULE_SKIPPED)
    if may_contain_findings(src, rules, project):
        return None
    if is_notebook(path):
        _check_notebook_syntax(src, path)
    else:
        check_syntax(src, path)
    return SourceRewrite(src, False, skipped="no pattern any selected rule looks for")


def _check_notebook_syntax(src: bytes, path: str) -> None:
    notebook = Notebook(src, path)
    if not notebook.is_python or not notebook.cells:
        return
    try:
        check_syntax(notebook.python_text().encode("utf-8"), path)
    except OptcodemodError as error:
        if error.line is not None:
            error.cell, error.line = notebook.locate(error.line)
        raise


def rewrite_source(
    src: bytes,
    path: str,
    options: RewriteOptions,
    formatted: bool = True,
    resume: Optional[Resume] = None,
) -> SourceRewrite:
    """Rewrite one file's bytes; raises OptcodemodError (naming `path`) on any problem.
    Without `formatted`, changed lines keep the layout the fixes gave them (for a run that
    shows no text: findings and whether the file changes are the same). `resume`: go on
    from an earlier rewrite of a Python file (engine.Resume)."""
    if resume is None:
        settled = settle_without_parsing(
            src, path, options.rules, options.project, options.exclude_tests
        )
        if settled is not None:
            return settled
    # The parser refuses what nests deeper than MAX_NESTING; below that, LibCST's recursive
    # visitors need more than Python's default recursion limit.
    with recursion_headroom(), cyclic_gc_paused():
        return _rewrite_parsed(src, path, options, formatted, resume)


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic collector off while one file is rewritten.

    A parse allocates a million nodes for a 30,000-line file, and each time the heap grows
    by a quarter the collector walks all of it: a third of a large file's time went there.
    Syntax trees hold no cycles (reference counting frees them); what cycles a rewrite makes
    are collected once the collector runs again.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _rewrite_parsed(
    src: bytes,
    path: str,
    options: RewriteOptions,
    formatted: bool = True,
    resume: Optional[Resume] = None,
) -> SourceRewrite:
    if is_notebook(path):
        assert resume is None, "a notebook is not resumed"
        return _rewrite_notebook(src, path, options)
    result = rewrite_bytes(src, path, options, resume)
    result.diagnostics.sort(key=reading_order)
    if not result.changed:
        return SourceRewrite(result.code, False, result.diagnostics)
    encoding = _encoding_of(src, path)
    old_text, new_text = src.decode(encoding), result.code.decode(encoding)
    unformatted = SourceRewrite(
        result.code, True, result.diagnostics, [(path, old_text, new_text)], formatted=False
    )
    return format_rewrite(unformatted, src, path) if formatted else unformatted


def format_rewrite(rewrite: SourceRewrite, src: bytes, path: str) -> SourceRewrite:
    """`rewrite` with its changed lines laid out as the project's black would."""
    if rewrite.formatted:
        return rewrite
    encoding = _encoding_of(src, path)
    [(label, old_text, new_text)] = rewrite.diff_parts
    new_text, warning = _format_like_project(path, old_text, new_text, encoding)
    new = new_text.encode(encoding)
    return replace(
        rewrite,
        new=new,
        changed=new != src,
        diff_parts=[(label, old_text, new_text)],
        warning=warning or rewrite.warning,
        formatted=True,
    )


def _checked(path: str, unformatted: str, formatted: str) -> str:
    """`formatted` when it still compiles, else the text the engine verified."""
    ok, _ = compile_check(formatted.encode("utf-8"), path)
    return formatted if ok else unformatted


def _format_like_project(path: str, old: str, new: str, encoding: str):
    """(text, warning): `new` with its changed lines formatted as the project's black would."""
    style = black_style_for(path)
    if style is None:
        return _checked(path, new, wrap_long_calls(old, new)), None
    if encoding != "utf-8" or new.startswith("\ufeff"):
        return new, None
    try:
        formatted = format_changed_lines(old, new, style)
    except FormatterUnavailable as missing:
        wrapped = wrap_long_calls(old, new, style.line_length)
        return _checked(path, new, wrapped), f"{path}: {missing}"
    except Exception as exc:  # black refusing the file must not cost the user the rewrite
        return new, f"{path}: black could not format the changed lines ({type(exc).__name__})"
    ok, _ = compile_check(formatted.encode("utf-8"), path)
    if not ok:
        return new, f"{path}: black's formatting of the changed lines did not compile; not used"
    return formatted, None


def reading_order(diagnostic: Diagnostic) -> Tuple[int, int, int, str]:
    return (diagnostic.cell or 0, diagnostic.line, diagnostic.column, diagnostic.code)


def _encoding_of(src: bytes, path: str) -> str:
    from optimizer_codemod.sources import detect_encoding

    encoding = detect_encoding(src, path)
    return "utf-8" if encoding == "utf-8-sig" else encoding


def _rewrite_notebook(src: bytes, path: str, options: RewriteOptions) -> SourceRewrite:
    notebook = Notebook(src, path)
    if not notebook.is_python or not notebook.cells:
        return SourceRewrite(src, False, skipped="no Python code cells")
    text = notebook.python_text()
    try:
        result = rewrite_bytes(text.encode("utf-8"), path, options)
    except OptcodemodError as error:
        if error.line is not None:
            error.cell, error.line = notebook.locate(error.line)
        raise
    diagnostics = []
    positions = NotebookPositions(notebook.text) if result.diagnostics else None
    for diagnostic in result.diagnostics:
        cell, line = notebook.locate(diagnostic.line)
        _, end_line = notebook.locate(diagnostic.end_line)
        end_line = max(line, end_line)
        indent = notebook.indent_of(cell)
        column, end_column = diagnostic.column + indent, diagnostic.end_column + indent
        edit_lines = _file_lines(notebook, positions, diagnostic.edit_lines)
        file_region = positions.region(cell, line, column, end_line, end_column)
        diagnostics.append(
            diagnostic.moved(
                cell=cell,
                line=line,
                column=column,
                end_line=end_line,
                end_column=end_column,
                edit_lines=edit_lines,
                file_region=file_region,
            )
        )
    diagnostics.sort(key=reading_order)
    if not result.changed:
        return SourceRewrite(src, False, diagnostics)
    changes = notebook.changed_cells(result.code.decode("utf-8"))
    new = notebook.with_cells(changes)
    parts = [
        (f"{path}:cell {index + 1}", _as_lines(old), _as_lines(new_text))
        for index, old, new_text in changes
    ]
    return SourceRewrite(new, new != src, diagnostics, parts)


def _as_lines(cell_text: str) -> str:
    """A cell's text ends without a newline, which is no missing newline at the end of a
    file: diffed as whole lines, it gets no `\\ No newline at end of file` mark."""
    return cell_text if cell_text.endswith("\n") else cell_text + "\n"


def _file_lines(notebook: Notebook, positions: NotebookPositions, ranges):
    """Line ranges of the notebook's Python text as lines of the .ipynb file's own text,
    which is what a fix in a report edits (runner.py diffs the notebook file itself)."""
    placed = []
    for first, last in ranges:
        start = positions.region(*notebook.locate(first), 1, notebook.locate(first)[1], 1)
        end = positions.region(*notebook.locate(last), 1, notebook.locate(last)[1], 1)
        if start is not None and end is not None:
            placed.append((start[0], max(start[0], end[0])))
    return tuple(placed)


@dataclass
class Rewritten:
    """What `rewrite` returns."""

    source: Union[str, bytes]
    changed: bool
    diagnostics: List[Diagnostic]


def rewrite(
    source: Union[str, bytes],
    *,
    path: str = "<string>",
    select: Optional[Iterable[str]] = None,
    ignore: Optional[Iterable[str]] = None,
    extend_select: Optional[Iterable[str]] = None,
    unsafe_fixes: Optional[bool] = None,
    target_torch: Optional[str] = None,
    precision: Optional[str] = None,
    target_device: Optional[str] = None,
    why_not: Optional[bool] = None,
    settings: Optional[Settings] = None,
) -> Rewritten:
    """Rewrite Python source (or notebook JSON when `path` ends in .ipynb).

    Options mirror the command line; `settings` (e.g. from `load_settings`) is the base they
    override. `why_not=True` adds a diagnostic with status `declined` for each site a rule
    examined and left alone, its message the reason. Raises `OptcodemodError` with the path,
    line and problem on bad input.
    """
    base = settings or Settings()
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if target_device is not None and target_device not in TARGET_DEVICES:
        choices = ", ".join(TARGET_DEVICES)
        raise ValueError(f"target_device must be one of {choices}, not {target_device!r}")
    layer = RuleSelection(
        tuple(validate_codes(list(select), "select")) if select is not None else None,
        tuple(validate_codes(list(extend_select or ()), "extend-select")),
        tuple(validate_codes(list(ignore or ()), "ignore")),
    )
    effective = base.with_overrides(
        overrides=(*base.overrides, layer),
        unsafe_fixes=unsafe_fixes,
        target_torch=TorchVersion.parse(target_torch) if target_torch is not None else None,
        precision=precision,
        target_device=target_device,
        why_not=why_not,
    )
    as_text = isinstance(source, str)
    src = source.encode("utf-8") if as_text else source
    result = rewrite_source(src, path, effective.options_for(path))
    new = result.new.decode("utf-8") if as_text else result.new
    return Rewritten(new, result.changed, result.diagnostics)

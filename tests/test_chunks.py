"""Parsing long files piece by piece gives exactly LibCST's whole-file tree."""

from __future__ import annotations

import sys
from pathlib import Path

import libcst as cst
import pytest

from optimizer_codemod import chunks
from optimizer_codemod.analysis.walk import children

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import generate_training_file as generate  # noqa: E402

TRICKY = '''"""Docstring."""
# a header comment

import os  # trailing
import sys; import re


@decorator
# between decorator and def
@other(1)
def f(x):
    if x:
        return 1
        # indented under the if's block

    # indented under the def's block
# dedented, belongs to what follows

    # indented again, after a dedented one
class C:
    a = 1


    def g(self):
        pass
for _ in range(3):
    pass
for _ in range(3):
    pass
x = (
    1,
    2,
)
s = """
not code
"""
if x:
    pass
else:
    pass
# the end
'''


def same_tree(a: cst.Module, b: cst.Module) -> bool:
    fields = ("default_indent", "default_newline", "encoding", "has_trailing_newline")
    return a.deep_equals(b) and all(getattr(a, f) == getattr(b, f) for f in fields)


def sources():
    yield "tricky", TRICKY
    yield "tricky-no-final-newline", TRICKY.rstrip("\n")
    yield "two-space-indent", TRICKY.replace("    ", "  ")
    yield "generated", generate.training_loops(3)
    for path in sorted((ROOT / "optimizer_codemod").rglob("*.py"))[:40]:
        yield path.name, path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "reference_models").glob("*/train.py")):
        yield path.parent.name, path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name, text", list(sources()), ids=[n for n, _ in sources()])
def test_pieces_make_the_whole_file_tree(
    name: str, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunks, "MIN_LINES", 0)
    src = text.encode("utf-8")
    joined = chunks.parse_in_pieces(src)
    assert joined is not None
    assert same_tree(joined, cst.parse_module(src))
    assert joined.bytes == src


def test_every_node_stands_once_in_the_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "MIN_LINES", 0)
    joined = chunks.parse_in_pieces(TRICKY.encode())
    seen = set()
    stack = [joined]
    while stack:
        node = stack.pop()
        assert id(node) not in seen  # the two identical loops are two parses
        seen.add(id(node))
        stack.extend(children(node))


@pytest.mark.parametrize(
    "text",
    [
        TRICKY.replace("\n", "\r\n").replace("\r\n", "\r", 3),  # mixed line endings
        "# -*- coding: latin-1 -*-\n" + TRICKY,
        "\ufeff" + TRICKY,
        "x = 1\nx = (\n",  # not Python
    ],
    ids=["lone-cr", "coding-cookie", "bom", "syntax-error"],
)
def test_texts_it_cannot_cut_exactly_go_to_the_whole_file_parser(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunks, "MIN_LINES", 0)
    assert chunks.parse_in_pieces(text.encode("utf-8")) is None


def test_short_files_are_parsed_whole() -> None:
    assert chunks.parse_in_pieces(TRICKY.encode()) is None


def test_a_second_parse_reuses_the_pieces_whose_text_is_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(chunks, "MIN_LINES", 0)
    parsed = []
    real = cst.parse_module
    monkeypatch.setattr(chunks.cst, "parse_module", lambda text: parsed.append(text) or real(text))
    cache = chunks.PieceCache()
    text = generate.training_loops(6)
    first = chunks.parse_in_pieces(text.encode(), cache)
    count = len(parsed)
    edited = text.replace("def train_3(", "def train_three(")
    second = chunks.parse_in_pieces(edited.encode(), cache)
    assert len(parsed) == count + 1  # only the edited function
    assert same_tree(second, real(edited))
    kept = [a is b for a, b in zip(first.body, second.body)]
    assert kept.count(False) <= 2  # the edited statement (and the one its lines follow)


# Blocks for `ast` and `compile` ---------------------------------------------------------------
# Lines that look like block starts but are not statements: inside a string, brackets, a
# continued line, or a decorator's arguments.
BLOCK_TRAPS = '''from __future__ import annotations
import os
TEMPLATE = """
def not_a_function():
import not_an_import
@not_a_decorator
class NotAClass:
"""
VALUES = [
    1,
# a comment inside brackets
    2,
]
@decorate(
    option=1,
)
def decorated():
    return TEMPLATE
total = 1 + \\
    2
class Model:
    def forward(self, x):
        return x
if VALUES:
    pass
else:
    pass
'''


def _ast_spans(text: str):
    import ast

    tree = ast.parse(text)
    spans = []
    for statement in tree.body:
        decorators = getattr(statement, "decorator_list", ())
        first = min([statement.lineno, *(d.lineno for d in decorators)])
        spans.append((first, statement.end_lineno))
    return spans


@pytest.mark.parametrize("block_lines", [1, 2, 5, 1000])
@pytest.mark.parametrize("name, text", [("traps", BLOCK_TRAPS), *list(sources())[:6]])
def test_statement_spans_in_blocks_are_the_whole_text_spans(
    name: str, text: str, block_lines: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunks, "BLOCK_LINES", block_lines)
    if ";" in text:  # `a; b` is one span for chunks, two statements for ast
        text = text.replace("import sys; import re", "import sys")
    assert chunks.statement_spans(text) == _ast_spans(text)


def test_blocks_that_fail_are_checked_with_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "BLOCK_LINES", 1)
    lines = chunks._LINE.findall(BLOCK_TRAPS)[:-1]
    checked = []

    def check(text: str, first: int):
        found = chunks._spans_in(text, first)
        checked.append((first, text.count("\n"), found is not None))
        return found

    blocks = chunks.in_blocks(lines, check)
    assert blocks is not None and len(blocks) > 3  # cut into several blocks...
    assert any(not ok for _, _, ok in checked)  # ...after cuts in the string had failed
    assert sum(n for _, n, _ in checked) <= 2 * len(lines)  # within the budget


@pytest.mark.parametrize(
    "broken, message",
    [
        ("def f(:\n    pass\n", "invalid syntax"),
        ("from __future__ import annotations\n", "from __future__ imports must occur"),
        ('s = """\n', "unterminated triple-quoted string"),
    ],
    ids=["syntax-error", "late-future-import", "unterminated-string"],
)
def test_compile_in_blocks_finds_what_compiling_the_whole_text_finds(
    broken: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimizer_codemod.sources import _compile, compile_check

    monkeypatch.setattr(chunks, "MIN_LINES", 0)
    monkeypatch.setattr(chunks, "BLOCK_LINES", 3)
    good = generate.training_loops(4)
    assert compile_check(good.encode(), "t.py") == (True, "")
    middle = good.index("\ndef train_2(") + 1
    bad = (good[:middle] + broken + good[middle:]).encode()
    result = compile_check(bad, "t.py")
    assert result == _compile(bad, "t.py")
    assert result[0] is False and message in result[1]


def test_a_reparse_cuts_where_the_last_text_was_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "MIN_LINES", 0)
    cache = chunks.PieceCache()
    text = generate.training_loops(6)
    chunks.parse_in_pieces(text.encode(), cache)
    spans = []
    monkeypatch.setattr(chunks, "_spans_in", lambda t, o: spans.append(o) or None)
    # A statement added at the top level joins the piece before it; a changed statement
    # is parsed alone: no `ast` parse of the new text.
    edited = text.replace("\ndef train_2(", "\nLIMIT = 3\n\n\ndef train_2(").replace(
        "batch_size=32", "batch_size=64", 1
    )
    again = chunks.parse_in_pieces(edited.encode(), cache)
    assert spans == []
    assert same_tree(again, cst.parse_module(edited))


def test_a_cut_moved_into_a_string_falls_back_to_cutting_by_ast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(chunks, "MIN_LINES", 0)
    cache = chunks.PieceCache()
    text = generate.training_loops(4)
    chunks.parse_in_pieces(text.encode(), cache)
    # The function train_2 now sits inside a string: its old cut would split the string.
    edited = text.replace("\ndef train_2(", '\nNOTE = """\ndef train_2(').replace(
        "\ndef train_3(", '\n"""\n\n\ndef train_3('
    )
    again = chunks.parse_in_pieces(edited.encode(), cache)
    assert same_tree(again, cst.parse_module(edited))

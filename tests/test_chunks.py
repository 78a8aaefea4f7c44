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

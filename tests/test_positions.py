"""Node ranges as LibCST's PositionProvider gives them, also when top-level statements'
texts are reused from an earlier print (positions.StatementTexts)."""

from __future__ import annotations

import sys
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from optimizer_codemod import chunks
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.positions import StatementTexts, module_code, positions_and_code

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import generate_training_file as generate  # noqa: E402


def _libcst_ranges(module: cst.Module, nodes):
    ranges = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    return {node: ranges[node] for node in nodes}


def _edit_one_call(module: cst.Module) -> cst.Module:
    """The module with the `batch_size=32` of its third function changed (the other
    top-level statements stay the same objects, as fixes.apply_fixes keeps them)."""
    functions = [s for s in module.body if isinstance(s, cst.FunctionDef)]
    target = functions[2]
    edited = target.deep_replace(
        next(n for n in find_all(target, cst.Integer) if n.value == "32"), cst.Integer("64")
    )
    return module.with_changes(body=[edited if s is target else s for s in module.body])


@pytest.mark.parametrize("wanted_kind", [cst.Call, cst.Name, cst.IndentedBlock])
def test_reused_texts_give_the_ranges_and_code_of_a_fresh_print(wanted_kind) -> None:
    texts = StatementTexts()
    module = cst.parse_module(generate.training_loops(5))
    first_wanted = [*module.body, *find_all(module.body[-1], wanted_kind)]
    positions_and_code(module, first_wanted, texts)  # fills texts
    edited = _edit_one_call(module)
    assert module_code(edited, texts) == edited.code
    # Wanted: every statement, and nodes inside one reused and one edited statement.
    functions = [s for s in edited.body if isinstance(s, cst.FunctionDef)]
    wanted = [*edited.body, *find_all(functions[0], wanted_kind)]
    wanted += find_all(functions[2], wanted_kind)
    found, code = positions_and_code(edited, wanted, texts)
    assert code == edited.code
    assert found == _libcst_ranges(edited, wanted)


def test_statements_are_printed_again_only_when_they_hold_a_wanted_node(monkeypatch) -> None:
    texts = StatementTexts()
    module = cst.parse_module(generate.training_loops(4))
    positions_and_code(module, list(module.body), texts)
    printed = []
    tops = {id(s) for s in module.body}
    for kind in {type(s) for s in module.body}:
        original = kind._codegen

        def record(self, state, _original=original, **kwargs):
            if id(self) in tops:
                printed.append(self)
            return _original(self, state, **kwargs)

        monkeypatch.setattr(kind, "_codegen", record)
    inner = find_all(module.body[-2], cst.Call)[0]
    found, code = positions_and_code(module, [*module.body, inner], texts)
    assert printed == [module.body[-2]]
    monkeypatch.undo()
    assert code == module.code
    assert found[inner] == _libcst_ranges(module, [inner])[inner]


def test_pieces_of_a_long_file_keep_their_texts_from_one_parse_to_the_next(monkeypatch) -> None:
    monkeypatch.setattr(chunks, "MIN_LINES", 0)
    cache, texts = chunks.PieceCache(), StatementTexts()
    text = generate.training_loops(6)
    module = chunks.parse_in_pieces(text.encode(), cache)
    positions_and_code(module, list(module.body), texts)
    edited_text = text.replace("batch_size=32", "batch_size=64", 1)
    again = chunks.parse_in_pieces(edited_text.encode(), cache)
    reused = [s for s in again.body if texts.get(again, s) is not None]
    assert len(reused) >= len(again.body) - 2
    assert module_code(again, texts) == edited_text

"""The fixture harness: every fixture gets every invariant, automatically (black's habit)."""

from __future__ import annotations

import pytest

from fixture_cases import KINDS, Fixture, fixtures, rule_codes, run_fixture
from invariants import assert_comments_kept, assert_untouched_statements_kept
from optimizer_codemod.diagnostics import Status
from optimizer_codemod.notebook import Notebook

ALL = fixtures()
IDS = [f.id for f in ALL]


def _python_text(fixture: Fixture, data: bytes) -> str:
    if fixture.is_notebook:
        notebook = Notebook(data, str(fixture.path))
        return "".join(cell.text for cell in notebook.cells)
    return data.decode("utf-8")


@pytest.mark.parametrize("fixture", ALL, ids=IDS)
def test_output_matches_expected_bytes(fixture: Fixture) -> None:
    assert (
        fixture.kind in KINDS
    ), f"{fixture.path.name}: name must start with fix_, keep_ or report_"
    result = run_fixture(fixture)
    if fixture.kind == "fix":
        assert fixture.expected_path.exists(), f"missing {fixture.expected_path.name}"
        assert result.new.decode() == fixture.expected_path.read_text(encoding="utf-8")
        assert any(d.code == fixture.code and d.status is Status.FIXED for d in result.diagnostics)
    else:
        assert not fixture.expected_path.exists(), "keep_/report_ fixtures have no expected file"
        assert result.new == fixture.path.read_bytes(), "a must-not-change fixture changed"
        own = [d for d in result.diagnostics if d.code == fixture.code]
        if fixture.kind == "keep":
            assert not own, f"keep_ fixture reported: {own}"
        else:
            assert own and all(d.status is not Status.FIXED for d in own)


FIXED_SCRIPTS = [f for f in ALL if f.kind == "fix" and not f.is_notebook]


@pytest.mark.parametrize("fixture", FIXED_SCRIPTS, ids=[f.id for f in FIXED_SCRIPTS])
def test_a_file_without_a_final_newline_is_fixed_the_same(fixture: Fixture) -> None:
    # Statements printed before are reused as one token each: dropping the missing final
    # newline must not drop the last statement with it.
    source, expected = fixture.path.read_bytes(), fixture.expected_path.read_bytes()
    assert source.endswith(b"\n") and expected.endswith(b"\n")
    result = run_fixture(fixture, source=source[:-1])
    assert result.new.decode() == expected[:-1].decode()


@pytest.mark.parametrize("fixture", ALL, ids=IDS)
def test_second_pass_changes_nothing(fixture: Fixture) -> None:
    first = run_fixture(fixture)
    second = run_fixture(fixture, source=first.new)
    assert second.new == first.new
    assert not [d for d in second.diagnostics if d.status is Status.FIXED]


@pytest.mark.parametrize("fixture", ALL, ids=IDS)
def test_output_compiles(fixture: Fixture) -> None:
    text = _python_text(fixture, run_fixture(fixture).new)
    if fixture.is_notebook:
        text = "\n".join(
            line for line in text.splitlines() if not line.lstrip().startswith(("%", "!"))
        )
    compile(text, str(fixture.path), "exec")


@pytest.mark.parametrize("fixture", [f for f in ALL if not f.is_notebook], ids=lambda f: f.id)
def test_statements_outside_edits_unchanged(fixture: Fixture) -> None:
    result = run_fixture(fixture)
    assert_untouched_statements_kept(
        fixture.path.read_text(encoding="utf-8"), result.new.decode(), result.diagnostics
    )


@pytest.mark.parametrize("fixture", ALL, ids=IDS)
def test_comments_kept(fixture: Fixture) -> None:
    before = _python_text(fixture, fixture.path.read_bytes())
    after = _python_text(fixture, run_fixture(fixture).new)
    assert_comments_kept(before, after)


@pytest.mark.parametrize("fixture", ALL, ids=IDS)
def test_all_rules_together_converge_and_compile(fixture: Fixture) -> None:
    result = run_fixture(fixture, all_selected=True)
    again = run_fixture(fixture, all_selected=True, source=result.new)
    assert again.new == result.new
    if not fixture.is_notebook:
        compile(result.new.decode(), str(fixture.path), "exec")


@pytest.mark.parametrize("code", rule_codes())
def test_every_rule_has_fix_and_keep_fixtures(code: str) -> None:
    kinds = {f.kind for f in ALL if f.code == code}
    assert "keep" in kinds, f"{code} has no keep_ (must-not-change) fixture"
    assert kinds & {"fix", "report"}, f"{code} has no fix_ or report_ fixture"

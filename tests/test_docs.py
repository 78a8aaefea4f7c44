"""Generated rule pages stay in step with the rules (ruff's and Fixit's habit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from optimizer_codemod.registry import all_rules
from optimizer_codemod.rule import DOCSTRING_SECTIONS
from optimizer_codemod.measured_gains import load_results
from optimizer_codemod.rule_docs import stale_pages

DOCS = Path(__file__).resolve().parent.parent / "docs" / "rules"


def test_committed_rule_pages_are_up_to_date() -> None:
    # What generate-docs writes: the current rules, and the results committed in the checkout.
    results = load_results()
    assert results.folder == DOCS.parent.parent / "benchmarks" / "results"
    stale = stale_pages(DOCS, all_rules(), results)
    assert not stale, f"run `optcodemod generate-docs`: stale {stale}"


def test_generate_docs_check_fails_on_a_stale_page(tmp_path: Path) -> None:
    assert run_cli(["generate-docs", "--output", str(tmp_path)]).exit_code == 0
    assert run_cli(["generate-docs", "--check", "--output", str(tmp_path)]).exit_code == 0
    page = next(tmp_path.glob("OPT*.md"))
    page.write_text(page.read_text() + "edited by hand\n")
    result = run_cli(["generate-docs", "--check", "--output", str(tmp_path)])
    assert result.exit_code == 1 and page.name in result.stderr


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_rule_docstring_has_every_section(rule) -> None:
    sections = rule.doc_sections()
    for heading in DOCSTRING_SECTIONS:
        assert sections.get(heading, "").strip(), f"{rule.code}: empty '{heading}' section"
    assert rule.examples, f"{rule.code}: no examples"
    assert any(e.changes for e in rule.examples) or rule.safety.label == "suggest"
    assert any(not e.changes for e in rule.examples), f"{rule.code}: no unchanged example"


def test_index_lists_every_rule() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    for rule in all_rules():
        assert f"[{rule.code}]({rule.code}.md)" in index


def test_readme_states_the_number_of_rules() -> None:
    readme = (DOCS.parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Rules", 1)[1].split("\n## ", 1)[0]
    assert f"{len(all_rules())} rules, listed by `optcodemod rules`" in section

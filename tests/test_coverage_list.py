"""The coverage benchmark (benchmarks/coverage.py): its expected list and its matching logic.

The list is checked against the pinned corpus (scripts/ecosystem.toml) and the registered rules;
the matching is checked on hand-made findings and on a small synthetic script rewritten by the
real `apply`, so nothing here needs the repository mirrors.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "coverage_bench", ROOT / "benchmarks" / "coverage.py"
)
coverage = importlib.util.module_from_spec(_spec)
sys.modules["coverage_bench"] = coverage  # dataclasses look their module up
_spec.loader.exec_module(coverage)

Entry = coverage.Entry
Finding = coverage.Finding
Place = coverage.Place
Reviewed = coverage.Reviewed


# -- the list -----------------------------------------------------------------------------------


def test_the_expected_list_is_well_formed_and_covers_every_pinned_file():
    expected = coverage.load_expected(coverage.DEFAULT_EXPECTED)
    entries = coverage.load_corpus(coverage.DEFAULT_CORPUS)
    codes = coverage.known_rule_codes()
    assert coverage.check_expected(expected, entries, codes) == []
    assert {(f.repo, f.path) for f in expected} == {(e.repo, e.path) for e in entries}
    places = [p for f in expected for p in f.places]
    assert len(places) >= 300
    # the list spans the rule families, not one or two rules
    assert len({p.rule for p in places}) >= 20
    assert len({p.rule[:4] for p in places}) >= 6  # OPT1xx ... OPT8xx
    for place in places:
        assert place.rule in codes
        assert place.anchor.strip() and place.why.strip()


def test_a_malformed_list_is_reported():
    entries = [Entry("o/r", "0" * 40, "a.py"), Entry("o/r", "0" * 40, "b.py")]
    document = {
        "file": [
            {
                "repo": "o/r",
                "path": "a.py",
                "place": [
                    {"rule": "OPT501", "line": 3, "anchor": "opt =", "why": "fused"},
                    {"rule": "OPT501", "line": 3, "anchor": "opt =", "why": "again"},
                    {"rule": "OPT999", "line": 4, "anchor": "x", "why": "no such rule"},
                    {"rule": "OPT101", "line": 5, "anchor": "", "why": "no anchor"},
                ],
                "reviewed": [{"rule": "OPT501", "line": 9, "verdict": "fine", "why": "?"}],
            },
            {"repo": "o/r", "path": "c.py", "none": "not pinned"},
        ]
    }
    problems = coverage.check_expected(
        coverage.parse_expected(document), entries, ["OPT101", "OPT501"]
    )
    text = "\n".join(problems)
    assert "a.py:3:OPT501: listed twice" in text
    assert "unknown rule OPT999" in text
    assert "needs an anchor and a why" in text
    assert "verdict must be one of" in text
    assert "c.py: not a file pinned" in text
    assert "b.py: pinned but not in the list" in text
    assert len(problems) == 6


def test_an_anchor_that_is_not_on_its_line_is_reported():
    source = "import torch\nopt = torch.optim.Adam(p)\n"
    good = Place("o/r", "a.py", "OPT501", 2, "opt = torch.optim.Adam", "fused")
    moved = Place("o/r", "a.py", "OPT501", 1, "opt = torch.optim.Adam", "fused")
    past_end = Place("o/r", "a.py", "OPT501", 9, "opt", "fused")
    assert coverage.check_anchors([good], source) == []
    assert len(coverage.check_anchors([moved, past_end], source)) == 2


# -- matching -----------------------------------------------------------------------------------


def _place(rule, line, also=()):
    return Place("o/r", "a.py", rule, line, "x", "why", tuple(also))


def test_places_match_findings_of_their_rule_on_their_lines_with_one_line_of_tolerance():
    places = [_place("OPT501", 10), _place("OPT101", 20), _place("OPT202", 30, also=[32])]
    findings = [
        Finding("OPT501", "fixed", 11, 13),  # one line below: the start of a multi-line call
        Finding("OPT101", "fixed", 25, 25),  # too far
        Finding("OPT202", "reported", 32, 32),  # on an `also` line
    ]
    match = coverage.match_file(places, findings)
    assert [r.outcome for r in match.results] == ["applied", "silent", "reported"]
    assert [f.line for f in match.unlisted] == [25]  # a fix at no listed place


def test_a_fix_is_preferred_to_a_decline_and_each_finding_is_used_once():
    places = [_place("OPT201", 5), _place("OPT201", 6)]
    findings = [
        Finding("OPT201", "declined", 5, 5, "not pinned"),
        Finding("OPT201", "fixed", 5, 5),
    ]
    match = coverage.match_file(places, findings)
    # line 5 takes the fix (exact line, best status); line 6 gets the decline one line away
    assert [(r.outcome, r.finding.status) for r in match.results] == [
        ("applied", "fixed"),
        ("declined", "declined"),
    ]
    assert match.unlisted == []


def test_a_second_fix_in_the_statement_of_a_listed_place_is_not_an_unlisted_edit():
    places = [_place("OPT201", 7)]
    findings = [Finding("OPT201", "fixed", 7, 7), Finding("OPT201", "fixed", 7, 7)]
    match = coverage.match_file(places, findings)
    assert [r.outcome for r in match.results] == ["applied"]
    assert match.unlisted == []


def test_settings_rules_match_anywhere_in_the_file_and_model_rules_take_a_step_decline():
    places = [_place("OPT301", 1), _place("OPT402", 40), _place("OPT402", 41)]
    findings = [
        Finding("OPT301", "fixed", 90, 90),
        Finding("OPT402", "declined", 120, 120, "cannot tell which model"),
    ]
    match = coverage.match_file(places, findings)
    assert [r.outcome for r in match.results] == ["applied", "declined", "declined"]
    # a decline somewhere else does not explain a rule that is not per model
    match = coverage.match_file([_place("OPT501", 1)], [Finding("OPT501", "declined", 50, 50)])
    assert [r.outcome for r in match.results] == ["silent"]


def test_unlisted_fixes_take_their_reviewed_verdicts_and_wrong_edits_are_counted():
    places = [_place("OPT501", 10)]
    findings = [
        Finding("OPT501", "fixed", 10, 10),
        Finding("OPT301", "fixed", 50, 50),
        Finding("OPT302", "fixed", 60, 60),
        Finding("OPT403", "fixed", 70, 70),
        Finding("OPT403", "declined", 80, 80),  # a decline at no place is not an edit
    ]
    reviewed = [
        Reviewed("OPT301", 50, "harmless", "CPU-only script"),
        Reviewed("OPT302", 61, "wrong", "escaping bf16 value"),
    ]
    match = coverage.match_file(places, findings, reviewed, "o/r", "a.py")
    assert [f.line for f in match.unlisted] == [70]
    assert [(f.line, r.verdict) for f, r in match.reviewed] == [(50, "harmless"), (60, "wrong")]
    summary = coverage.summarise([match])
    assert summary["applied"] == 1 and summary["applied_fraction"] == 1.0
    assert summary["unlisted_fixes"] == 1
    assert summary["reviewed_fixes"] == {"wrong": 1, "questionable": 0, "harmless": 1}
    assert summary["wrong_edits"] == ["o/r:a.py:60 OPT302: escaping bf16 value"]
    assert summary["goals"]["no_wrong_edit"] is False
    assert summary["goals"]["every_unlisted_fix_reviewed"] is False


def test_the_summary_counts_fractions_and_groups_silent_misses_by_cause():
    places = [
        _place("OPT501", 1),
        _place("OPT602", 2),
        _place("OPT101", 3),
        Place("o/r", "a.py", "OPT201", 4, "x", "why", (), "loader in another module"),
        _place("OPT403", 5),
    ]
    findings = [
        Finding("OPT501", "fixed", 1, 1),
        Finding("OPT602", "reported", 2, 2),  # a report-only rule
        Finding("OPT101", "declined", 3, 3, "dataset already on the device"),
    ]
    match = coverage.match_file(places, findings, (), "o/r", "a.py")
    summary = coverage.summarise([match])
    assert (summary["applied"], summary["reported"], summary["declined"], summary["silent"]) == (
        1,
        1,
        1,
        2,
    )
    assert summary["applied_fraction"] == 0.2
    assert summary["applied_or_report_only_fraction"] == 0.4
    assert summary["explained_fraction"] == 0.6
    assert summary["per_rule"]["OPT201"]["silent"] == 1
    header = {
        "date": "2026-11-24",
        "machine": "2-core test",
        "python": "3",
        "torch": "none",
        "optcodemod_commit": "abc",
        "uncommitted_tool_files": [],
        "optcodemod_version": "0",
        "command": "python benchmarks/coverage.py",
    }
    md = coverage.render_markdown(summary, [match], header)
    assert "### loader in another module (1)" in md
    assert "### not yet analysed (1)" in md
    assert "dataset already on the device" in md
    assert "| **silent misses** | 2 | 40.0% |" in md
    table = coverage.render_table(summary)
    assert "applied: 1 (20.0%)" in table and "silent misses: 2 (40.0%)" in table


# -- end to end on a synthetic script (the real `apply`, no mirror) ------------------------------

SCRIPT = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(8, 2).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
loader = DataLoader(data, batch_size=8)
for epoch in range(3):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
"""


def test_the_benchmark_matches_the_tools_own_findings_on_a_synthetic_script(tmp_path):
    entry = Entry("o/r", "0" * 40, "train.py")
    findings, error = coverage.apply_findings(
        entry, SCRIPT.encode(), tmp_path, coverage.DEFAULT_COMMAND
    )
    assert error is None
    assert any(f.code == "OPT501" and f.status == "fixed" and f.line == 7 for f in findings)
    places = [
        Place("o/r", "train.py", "OPT501", 7, "optimizer = torch.optim.Adam", "fused Adam"),
        # a place the tool has no reason to touch: nothing there is slow
        Place("o/r", "train.py", "OPT602", 16, "optimizer.step()", "(synthetic)"),
    ]
    assert coverage.check_anchors(places, SCRIPT) == []
    match = coverage.match_file(places, findings, (), "o/r", "train.py")
    assert [r.outcome for r in match.results] == ["applied", "silent"]
    # every other fix the tool made is listed as an edit at no listed place
    others = [f for f in findings if f.status == "fixed" and f.code != "OPT501"]
    assert len(match.unlisted) == len(others)
    rewritten = coverage.isolated_path(tmp_path, entry).read_text()
    assert "fused=True" in rewritten


NOTEBOOK = {
    "cells": [
        {"cell_type": "markdown", "source": ["# Train\n"]},
        {"cell_type": "code", "source": ["import torch\n", "model = torch.nn.Linear(4, 2)"]},
        {
            "cell_type": "code",
            "source": "optimizer = torch.optim.Adam(model.parameters())\nfor step in range(3):\n"
            "    model(torch.randn(8, 4)).sum().backward()\n    optimizer.step()\n",
        },
    ],
    "metadata": {},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def test_places_in_a_notebook_are_found_by_cell_and_line(tmp_path):
    import json

    source = json.dumps(NOTEBOOK, indent=1)
    place = Place("o/r", "nb.ipynb", "OPT501", 1, "optimizer = torch.optim.Adam(", "fused", cell=3)
    assert coverage.check_anchors([place], source, "nb.ipynb") == []
    other_cell = Place("o/r", "nb.ipynb", "OPT501", 1, "optimizer = torch.optim.Adam(", "x", cell=2)
    assert len(coverage.check_anchors([other_cell], source, "nb.ipynb")) == 1
    entry = Entry("o/r", "0" * 40, "nb.ipynb")
    findings, error = coverage.apply_findings(
        entry, source.encode(), tmp_path, coverage.DEFAULT_COMMAND
    )
    assert error is None
    [fused] = [f for f in findings if f.code == "OPT501"]
    assert (fused.cell, fused.line, fused.status) == (3, 1, "fixed")
    # the same line number in another cell is another place
    match = coverage.match_file([other_cell], [fused], (), "o/r", "nb.ipynb")
    assert [r.outcome for r in match.results] == ["silent"]
    assert coverage.match_file([place], [fused]).results[0].outcome == "applied"
    # a notebook's place must say its cell, and only a notebook's
    document = {
        "file": [
            {
                "repo": "o/r",
                "path": "nb.ipynb",
                "place": [{"rule": "OPT501", "line": 1, "anchor": "o", "why": "w"}],
            }
        ]
    }
    problems = coverage.check_expected(
        coverage.parse_expected(document), [entry], coverage.known_rule_codes()
    )
    assert any("has a cell" in p for p in problems)


def test_local_imports_follow_the_projects_own_modules_only():
    paths = {
        "train.py",
        "models/__init__.py",
        "models/resnet.py",
        "util/misc.py",  # a namespace package: no __init__.py
        "pkg/__init__.py",
        "pkg/trainer.py",
        "pkg/sub/helpers.py",
    }
    source = (
        b"import torch\nimport util.misc\nfrom models import *\nfrom pkg.trainer import Trainer\n"
    )
    assert coverage.local_imports("train.py", source, paths) == [
        "util/misc.py",
        "models/__init__.py",
        "pkg/__init__.py",
        "pkg/trainer.py",
    ]
    relative = b"from .resnet import *\nfrom . import resnet\n"
    assert coverage.local_imports("models/__init__.py", relative, paths) == ["models/resnet.py"]
    assert coverage.local_imports("pkg/sub/helpers.py", b"from ..trainer import T\n", paths) == [
        "pkg/trainer.py"
    ]
    assert coverage.local_imports("train.py", b"def broken(:\n", paths) == []


def test_a_place_fixed_in_the_helper_that_builds_its_code_counts_as_applied():
    """yolov5's optimizer is built by `smart_optimizer` in utils/torch_utils.py: the fix there
    (a module read for context) is the place's fix; a fix of another rule or too far is not."""
    place = Place("o/r", "train.py", "OPT501", 10, "x", "why", fixed_in="utils/helpers.py:40")
    other = Place("o/r", "train.py", "OPT605", 20, "x", "why", fixed_in="utils/helpers.py:60")
    match = coverage.match_file([place, other], [])
    assert [r.outcome for r in match.results] == ["silent", "silent"]
    fixes = [
        coverage.ContextFix("o/r", "utils/helpers.py", Finding("OPT501", "fixed", 41, 41)),
        coverage.ContextFix("o/r", "utils/helpers.py", Finding("OPT605", "fixed", 90, 90)),
        coverage.ContextFix("x/y", "utils/helpers.py", Finding("OPT605", "fixed", 60, 60)),
    ]
    match.repo = "o/r"
    assert coverage.credit_fixes_elsewhere([match], fixes) == 1
    assert [(r.outcome, r.finding and r.finding.line) for r in match.results] == [
        ("applied", 41),
        ("silent", None),
    ]


def test_a_fixed_in_that_names_no_other_file_and_line_is_reported():
    entries = [Entry("o/r", "0" * 40, "a.py")]
    document = {
        "file": [
            {
                "repo": "o/r",
                "path": "a.py",
                "place": [
                    {"rule": "OPT501", "line": 3, "anchor": "x", "why": "y", "fixed_in": "b.py"},
                    {"rule": "OPT501", "line": 4, "anchor": "x", "why": "y", "fixed_in": "a.py:9"},
                    {"rule": "OPT501", "line": 5, "anchor": "x", "why": "y", "fixed_in": "b.py:7"},
                ],
            }
        ]
    }
    problems = coverage.check_expected(coverage.parse_expected(document), entries, ["OPT501"])
    assert len(problems) == 2 and all("fixed_in is `path:line`" in p for p in problems)

"""The mutant benchmark's cases still fit the files they edit (benchmarks/verify_mutants.py).

No training here: each case's substitutions must apply exactly once to the current original or
train.optimized.py, so that a change to a workload that breaks a mutant fails this test instead
of the benchmark. Cases built on the engine's rewrite are checked for having one.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location(
    "verify_mutants", ROOT / "benchmarks" / "verify_mutants.py"
)
verify_mutants = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = verify_mutants  # dataclasses look their module up there
SPEC.loader.exec_module(verify_mutants)

CASES = verify_mutants.CASES
SUBSTITUTED = [case for case in CASES if case.subs]


def test_there_are_enough_mutants_and_correct_cases():
    kinds = [case.kind for case in CASES]
    assert kinds.count(verify_mutants.MUTANT) >= 10
    assert kinds.count(verify_mutants.CORRECT) >= 10
    assert set(kinds) == {verify_mutants.MUTANT, verify_mutants.CORRECT}


def test_case_names_are_unique():
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))


def test_every_mutant_edits_something():
    for case in verify_mutants.MUTANTS:
        assert case.subs, case.name
        assert case.base in (verify_mutants.ORIGINAL, verify_mutants.OPTIMIZED), case.name


@pytest.mark.parametrize("case", SUBSTITUTED, ids=lambda case: case.name)
def test_substitutions_apply_exactly_once(case):
    text, _, _ = verify_mutants.base_text(case)
    for old, new in case.subs:
        assert text.count(old) == 1, f"{case.name}: {old!r} occurs {text.count(old)} times"
        assert old != new
    mutated = verify_mutants.apply_substitutions(text, case.subs, case.name)
    assert mutated != text
    compile(mutated, case.name, "exec")  # still Python


def test_every_case_names_an_existing_script():
    for case in CASES:
        assert case.path.is_file(), case.name
        if case.base == verify_mutants.OPTIMIZED:
            assert case.path.with_name("train.optimized.py").is_file(), case.name
        if case.base.startswith("engine:"):
            assert case.level is None, f"{case.name}: engine cases take the engine's level"


def test_apply_substitutions_refuses_a_missing_or_repeated_text():
    with pytest.raises(ValueError, match="0 times"):
        verify_mutants.apply_substitutions("a b", [("c", "d")])
    with pytest.raises(ValueError, match="2 times"):
        verify_mutants.apply_substitutions("a a", [("a", "d")])


def test_rates_count_errors_as_neither_caught_nor_passed():
    records = [
        {"kind": "mutant", "verdict": "caught", "exit_code": 1},
        {"kind": "mutant", "verdict": "error", "exit_code": 2},
        {"kind": "correct", "verdict": "passed", "exit_code": 0, "margin": 7.0},
        {"kind": "correct", "verdict": "FALSE ALARM", "exit_code": 1, "margin": 0.5},
    ]
    s = verify_mutants.summary(records)
    assert (s["caught"], s["mutants"], s["detection_rate"]) == (1, 2, 0.5)
    assert (s["failed"], s["correct"], s["false_alarm_rate"]) == (1, 2, 0.5)
    assert s["errors"] == 1
    assert s["smallest_margin_of_correct"] == 7.0

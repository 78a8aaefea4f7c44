"""How many batches a loop reads when it leaves on a count (analysis/bounded_loops.py)."""

import libcst as cst
import pytest

from optimizer_codemod.analysis.bounded_loops import iterations_at_most, literal_iterations
from optimizer_codemod.analysis.script import ScriptFacts


def _outer_loop_bound(source: str):
    facts = ScriptFacts.of(cst.parse_module(source))
    return iterations_at_most(facts.records.loops[0])


@pytest.mark.parametrize(
    "source, batches",
    [
        ("for ii, s in enumerate(dl):\n    show(s)\n    if ii == 1:\n        break\n", 2),
        ("for i, s in enumerate(dl):\n    if i >= 5:\n        break\n    show(s)\n", 6),
        ("for i, s in enumerate(dl):\n    if i > 5:\n        break\n", 7),
        ("for i, s in enumerate(dl, 1):\n    if 3 < i:\n        break\n", 4),
        ("for i, s in enumerate(dl):\n    if 2 == i:\n        print(i)\n        break\n", 3),
        ("for i, s in enumerate(dl):\n    if i == 9: break\n    if i == 3: break\n", 4),
    ],
)
def test_a_loop_leaving_on_its_counter_reads_that_many_batches(source: str, batches: int):
    assert _outer_loop_bound(source) == batches


@pytest.mark.parametrize(
    "source",
    [
        # Breaks at once, or never on the count: not a bound on what is read.
        "for i, s in enumerate(dl):\n    if i < 3:\n        break\n",
        "for i, s in enumerate(dl, 5):\n    if i == 2:\n        break\n",
        "for i, s in enumerate(dl):\n    if i == 3:\n        print(i)\n",
        "for i, s in enumerate(dl):\n    if i == 3:\n        break\n    else:\n        pass\n",
        # Under another condition, or a bound that is not a literal.
        "for i, s in enumerate(dl):\n    if debug:\n        if i == 3:\n            break\n",
        "for i, s in enumerate(dl):\n    if i == limit:\n        break\n",
        # The count is not enumerate's.
        "for s in dl:\n    if n == 3:\n        break\n",
        "for i, s in zip(range(9), dl):\n    if i == 3:\n        break\n",
    ],
)
def test_other_loops_have_no_bound(source: str):
    assert _outer_loop_bound(source) is None


def _literal_iterations(source: str):
    facts = ScriptFacts.of(cst.parse_module(source))
    return literal_iterations(facts, facts.records.loops[0])


@pytest.mark.parametrize(
    "source, iterations",
    [
        ("for t in range(10):\n    step()\n", 10),
        ("for t in range(2, 5):\n    step()\n", 3),
        ("EPOCHS = 10\nfor t in range(EPOCHS):\n    step()\n", 10),
        ("for _ in range(1):\n    step()\n", 1),
        ("for _ in range(0):\n    step()\n", 0),
    ],
)
def test_a_range_of_literal_numbers_runs_that_many_times(source: str, iterations: int):
    assert _literal_iterations(source) == iterations


@pytest.mark.parametrize(
    "source",
    [
        "for t in range(args.epochs):\n    step()\n",
        # Bound twice, or from a parameter the callers choose: not one known number.
        "EPOCHS = 10\nEPOCHS = 20\nfor t in range(EPOCHS):\n    step()\n",
        "EPOCHS = 10\ndef train(EPOCHS):\n    for t in range(EPOCHS):\n        step()\n",
        "for t in range(0, 10, 2):\n    step()\n",
        "range = my_range\nfor t in range(10):\n    step()\n",
        "for batch in loader:\n    step()\n",
    ],
)
def test_other_loops_have_no_literal_count(source: str):
    assert _literal_iterations(source) is None

"""A loop over a literal range of at most one number repeats nothing: a backward inside it
is one step (training.backward_runs_once), as in votenet's layer self-test."""

from __future__ import annotations

import libcst as cst
import pytest

from optimizer_codemod.analysis.script import ScriptFacts
from optimizer_codemod.analysis.training import backward_runs_once


def _once(loop_header: str, prelude: str = "") -> bool:
    source = f"import torch\n{prelude}{loop_header}\n    loss.backward()\n"
    return backward_runs_once(ScriptFacts.of(cst.parse_module(source))) is not None


@pytest.mark.parametrize(
    "header", ["for _ in range(1):", "for i in range(3, 4):", "for _ in range(0):"]
)
def test_a_loop_of_at_most_one_pass_is_one_step(header: str) -> None:
    assert _once(header)


@pytest.mark.parametrize(
    "header",
    ["for _ in range(2):", "for i in range(0, 2):", "for _ in range(n):", "while True:"],
)
def test_a_loop_that_may_repeat_is_not(header: str) -> None:
    assert not _once(header)


def test_a_range_of_the_script_own_is_not_trusted() -> None:
    assert not _once("for _ in range(1):", prelude="from mylib import range\n")
    assert not _once("for _ in range(1):", prelude="range = lambda n: [0, 1, 2]\n")

"""OPT204 moves a per-step evaluation whose results are only printed every Nth step under the
print's `if` (analysis/gated_evaluations.py): the rewritten fixture prints exactly what the
original printed, the final evaluation included, since `test()` draws no random number and
the step sets `train()` before its own forward."""

from __future__ import annotations

import contextlib
import io

import pytest

from fixture_cases import FIXTURES

torch = pytest.importorskip("torch")

NAME = "fix_evaluation_read_only_on_printed_steps"


def _printed(path) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(path.read_text(), str(path), "exec"), {"__name__": "__main__"})
    return out.getvalue()


def test_the_gated_evaluation_prints_what_the_original_printed() -> None:
    original = FIXTURES / "OPT204" / f"{NAME}.py"
    rewritten = FIXTURES / "OPT204" / f"{NAME}.expected.py"
    text = rewritten.read_text()
    assert text.index("if epoch % print_every == 0:") < text.index("= test(model")
    before = _printed(original)
    assert before.count("epoch ") == 3 and "final loss" in before
    assert _printed(rewritten) == before

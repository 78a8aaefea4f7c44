"""OPT403 follows the evaluated model into a helper called from several places, and through
a method of the model's class that only computes: both fixtures, run before and after the
rewrite, print the same losses and samples (tensors made under `inference_mode` never meet the
next training step)."""

from __future__ import annotations

import contextlib
import io

import pytest

from fixture_cases import FIXTURES

torch = pytest.importorskip("torch")


def _printed(path) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(path.read_text(), str(path), "exec"), {"__name__": "__main__"})
    return out.getvalue()


@pytest.mark.parametrize(
    "name",
    ["fix_evaluation_helper_called_with_the_trained_model", "fix_model_method_that_only_computes"],
)
def test_the_rewritten_evaluation_prints_what_the_original_printed(name: str) -> None:
    original = FIXTURES / "OPT403" / f"{name}.py"
    rewritten = FIXTURES / "OPT403" / f"{name}.expected.py"
    assert "torch.inference_mode()" in rewritten.read_text()
    before = _printed(original)
    assert before.count("\n") >= 4
    assert _printed(rewritten) == before

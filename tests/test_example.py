"""The bundled example: every rule rewrites it, and the rewritten script trains to the same losses.

This is the README's first command made into a check: the example must keep showing a diff, and
what the tool produces from it must run (on CPU here) and match the original's loss curve.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status
from optimizer_codemod.sources import compile_check

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train.py"
STEPS = 6
# Fused AdamW and TF32/cudnn settings change floating-point summation order only; six steps of a
# small conv net stay well within this.
LOSS_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def rewritten() -> str:
    result = rewrite(EXAMPLE.read_text(encoding="utf-8"), path=str(EXAMPLE), unsafe_fixes=True)
    assert result.source != EXAMPLE.read_text(encoding="utf-8")
    compile_check(result.source.encode("utf-8"), str(EXAMPLE))
    return result.source


def test_every_default_fix_and_the_unsafe_ones_apply_to_the_example() -> None:
    default = rewrite(EXAMPLE.read_text(encoding="utf-8"), path=str(EXAMPLE))
    unsafe = rewrite(EXAMPLE.read_text(encoding="utf-8"), path=str(EXAMPLE), unsafe_fixes=True)
    fixed_by_default = {d.code for d in default.diagnostics if d.status is Status.FIXED}
    fixed_with_unsafe = {d.code for d in unsafe.diagnostics if d.status is Status.FIXED}
    assert "OPT501" in fixed_by_default
    assert fixed_by_default < fixed_with_unsafe
    assert not [
        d for d in default.diagnostics if d.status is Status.FIXED and d.safety.label == "behavior"
    ]


def test_rewriting_the_rewritten_example_changes_nothing(rewritten: str) -> None:
    again = rewrite(rewritten, path=str(EXAMPLE), unsafe_fixes=True)
    assert again.source == rewritten


def _losses(script: Path, out: Path) -> list:
    subprocess.run(
        [sys.executable, str(script), "--epochs", "1", "--steps", str(STEPS), "--losses", str(out)],
        check=True,
        cwd=script.parent,
        capture_output=True,
        timeout=300,
    )
    return json.loads(out.read_text())


def test_rewritten_example_trains_to_the_same_losses(rewritten: str, tmp_path: Path) -> None:
    original = tmp_path / "original.py"
    original.write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    optimized = tmp_path / "optimized.py"
    optimized.write_text(rewritten, encoding="utf-8")
    before = _losses(original, tmp_path / "before.json")
    after = _losses(optimized, tmp_path / "after.json")
    assert len(before) == len(after) == STEPS
    assert after == pytest.approx(before, rel=LOSS_TOLERANCE, abs=LOSS_TOLERANCE)

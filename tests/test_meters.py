"""OPT202 hands a meter of the script the loss as a device tensor (analysis/meters.py): a
0-dim tensor formats as its `.item()` does, so the rewritten imagenet-style script prints the
same progress lines, the averages up to a float32 sum."""

from __future__ import annotations

import contextlib
import io
import re
import sys

import pytest

from fixture_cases import FIXTURES

torch = pytest.importorskip("torch")

NAME = "fix_loss_fed_to_a_meter_of_the_script"
NUMBER = re.compile(r"-?\d+\.\d+e[+-]\d+")


@pytest.mark.parametrize("spec", [".4e", "6.2f", "f", "", ".3f", "g"])
def test_a_scalar_tensor_formats_as_its_item(spec: str) -> None:
    for value in (0.123456789, 2.5e-7, 31.0):
        tensor = torch.tensor(value, dtype=torch.float32)
        assert format(tensor, spec) == format(tensor.item(), spec)
        assert ("{v:" + spec + "}").format(v=tensor) == ("{v:" + spec + "}").format(v=tensor.item())


def _printed(path, monkeypatch) -> str:
    monkeypatch.setattr(sys, "argv", [str(path), "--print-freq", "1"])
    torch.manual_seed(0)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(path.read_text(), str(path), "exec"), {"__name__": "__main__"})
    return out.getvalue()


def test_the_meter_prints_the_same_progress_lines(monkeypatch) -> None:
    original = FIXTURES / "OPT202" / f"{NAME}.py"
    rewritten = FIXTURES / "OPT202" / f"{NAME}.expected.py"
    assert "losses.update(loss.detach().float()" in rewritten.read_text()
    before = _printed(original, monkeypatch).splitlines()
    after = _printed(rewritten, monkeypatch).splitlines()
    progress = [line for line in before if line.startswith("Train: ")]
    assert len(progress) == 16 and len(after) == len(before)
    for old, new in zip(before, after):
        if not old.startswith("Train: "):
            assert new == old  # validation: plain floats on both sides
            continue
        # `Loss {val} ({avg})`: the step's loss is the same float; the average differs from
        # the float64 one by float32 rounding of a 16-term sum (about 1e-7), far inside 1e-4.
        old_val, old_avg = map(float, NUMBER.findall(old))
        new_val, new_avg = map(float, NUMBER.findall(new))
        assert new_val == old_val
        assert new_avg == pytest.approx(old_avg, rel=1e-4)
        assert new.split("\t")[0] == old.split("\t")[0]

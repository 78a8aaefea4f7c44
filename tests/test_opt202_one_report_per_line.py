"""OPT202 reports a statement that reads the loss on every step once, however many
`.item()` calls it holds: `ema = loss.item() if ema is None else 0.9 * ema + 0.1 *
loss.item()` runs one of them per step, and was reported twice (third reading round)."""

from __future__ import annotations

from pathlib import Path

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status

FIXTURE = Path(__file__).parent.parent / "fixtures" / "OPT202"
SOURCE = (FIXTURE / "report_moving_average_of_the_loss_once.py").read_text()


def reports(source: str):
    result = rewrite(source, select=["OPT202"])
    return [d for d in result.diagnostics if d.code == "OPT202" and d.status is Status.REPORTED]


def test_both_branches_of_a_moving_average_give_one_report() -> None:
    assert SOURCE.count("loss.item()") == 2
    found = reports(SOURCE)
    assert len(found) == 1 and "`loss.item()`" in found[0].message


def test_reads_on_two_lines_are_still_reported_each() -> None:
    source = SOURCE.replace(
        "    ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()\n",
        "    first = loss.item()\n    print(loss.item())\n",
    )
    assert len(reports(source)) == 2

"""A device tensor indexed by a boolean mask waits for the device (the result's size is the
number of True elements): OPT204 does not gate a progress line to save a wait that such an
index keeps on every step (PyG's rect.py, reading round 10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "OPT204"
SOURCE = (FIXTURE / "report_loss_printed_beside_a_boolean_mask_index.py").read_text()
INDEXED = "criterion(out[train_mask], y[train_mask])"


def _opt204(source: str):
    result = rewrite(source, select=["OPT204"], unsafe_fixes=True, why_not=True)
    [finding] = [d for d in result.diagnostics if d.code == "OPT204"]
    return result, finding


@pytest.mark.parametrize(
    "indexed",
    [
        INDEXED,
        "criterion(out[~train_mask], y[~train_mask])",
        "criterion(out[y[:, 0] > 0], y[y[:, 0] > 0])",
        "criterion(out[data.train_mask], y[data.train_mask])",
    ],
)
def test_a_boolean_mask_index_keeps_the_progress_line(indexed: str) -> None:
    source = SOURCE.replace(INDEXED, indexed)
    if "data." in indexed:
        source = source.replace(
            "train_mask = torch.rand", "data = Masks()\ndata.train_mask = torch.rand"
        ).replace("import torch\n", "import torch\n\n\nclass Masks:\n    pass\n", 1)
    result, finding = _opt204(source)
    assert result.source == source and finding.status is Status.REPORTED
    assert "waits for the device on every step as well" in finding.message


@pytest.mark.parametrize("indexed", ["criterion(out, y)", "criterion(out[:500], y[:500])"])
def test_other_indexes_let_the_progress_line_be_gated(indexed: str) -> None:
    result, finding = _opt204(SOURCE.replace(INDEXED, indexed))
    assert finding.status is Status.FIXED and "epoch % 10" in result.source

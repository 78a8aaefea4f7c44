"""A dataset whose items only read what it holds (OPT102 adds no workers): x-transformers'
TextSamplerDataset slices its text at one random start; work on the item is still work."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer_codemod import rewrite

WINDOW = (
    Path(__file__).parent.parent
    / "fixtures"
    / "OPT102"
    / "keep_dataset_sampling_a_random_window.py"
)


@pytest.mark.parametrize(
    "old, new, workers",
    [
        ("", "", False),
        # A draw of several numbers, or work on the window, is work a worker could take.
        ("(1,))", "(4,))[0]", True),
        # The same window, its start drawn with Python's generator.
        (
            "torch.randint(0, self.data.size(0) - self.seq_len - 1, (1,))",
            "random.randint(0, self.data.size(0) - self.seq_len - 1)",
            False,
        ),
        (".long()", ".long().flip(0)", True),
        (
            "self.data[rand_start : rand_start + self.seq_len + 1]",
            "torch.load(f'{index}.pt')",
            True,
        ),
    ],
)
def test_a_random_window_of_held_data_gets_no_workers(old: str, new: str, workers: bool) -> None:
    source = "import random\n" + WINDOW.read_text()
    if old:
        assert old in source
        source = source.replace(old, new)
    result = rewrite(source, select=["OPT102"], unsafe_fixes=True, target_device="cuda")
    assert ("num_workers" in result.source) is workers

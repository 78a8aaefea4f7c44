"""A script that picks a 16-bit dtype through a dict lookup or a conditional has chosen its
precision (precision.reduced_precision_use); comparing with a dtype chooses nothing."""

from __future__ import annotations

import libcst as cst
import pytest

from optimizer_codemod.analysis.precision import uses_reduced_precision
from optimizer_codemod.analysis.script import ScriptFacts


def _chooses(line: str) -> bool:
    return uses_reduced_precision(ScriptFacts.of(cst.parse_module(f"import torch\n{line}\n")))


@pytest.mark.parametrize(
    "line",
    [
        'dtype_map = {"bf16": torch.bfloat16, "fp32": torch.float32}',
        "dtype = torch.bfloat16 if bf16 else torch.float32",
        "dtype = torch.float32 if full else (torch.float16 if fp16 else torch.float32)",
        "dtype = torch.half",
    ],
)
def test_a_16_bit_dtype_among_the_choices_is_a_choice(line: str) -> None:
    assert _chooses(line)


@pytest.mark.parametrize(
    "line",
    [
        'dtype_map = {"fp32": torch.float32, "fp64": torch.float64}',
        "is_half = x.dtype == torch.float16",
        "dtype = torch.float32",
    ],
)
def test_no_16_bit_choice(line: str) -> None:
    assert not _chooses(line)

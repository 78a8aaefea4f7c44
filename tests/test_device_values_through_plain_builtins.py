"""What `int()`, `len()`, `str()` and f-strings read cannot make a value a device tensor
(hkproj/pytorch-transformer's dataset is split by `int(0.9 * len(ds_raw))`), unless the file
rebinds the builtin; what a value reads outside them still counts."""

from __future__ import annotations

import libcst as cst
import pytest

from optimizer_codemod.analysis import ScriptFacts
from optimizer_codemod.analysis.devices import may_live_on_accelerator

HEAD = """\
import torch
device = "cuda"
on_device = torch.randn(8, 4).to(device)
"""


def _value_of(source: str, name: str) -> bool:
    facts = ScriptFacts.of(cst.parse_module(HEAD + source))
    [assignment] = facts.assignments_to(name)
    return may_live_on_accelerator(facts, assignment.value)


@pytest.mark.parametrize(
    "source, lives",
    [
        ("size = int(0.9 * len(on_device))\n", False),
        ("label = f'{on_device.shape}'\n", False),
        ("text = str(on_device)\n", False),
        ("part = on_device[: int(0.9 * len(on_device))]\n", True),  # the slice reads it
        ("size = max(1, len(on_device))\n", False),
        ("size = abs(on_device)\n", True),  # abs of a tensor is a tensor
        ("def int(x):\n    return x\n\nsize = int(on_device)\n", True),  # rebound
    ],
)
def test_names_read_by_plain_builtins_are_not_followed(source: str, lives: bool) -> None:
    target = source.splitlines()[-1].split(" = ")[0]
    assert _value_of(source, target) is lives

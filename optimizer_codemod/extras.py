"""What the optional parts need, and the install command to print when it is missing.

The commands are ones that work on a fresh machine: optcodemod itself is not on the package
index, so "pip install 'optcodemod[verify]'" would fail; torch, black and matplotlib are.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

TORCH_INSTALL = (
    "pip install torch (the build for your machine: https://pytorch.org/get-started/locally/)"
)
BLACK_INSTALL = "pip install black"
MATPLOTLIB_INSTALL = "pip install matplotlib"


def missing_torch(command: str) -> Optional[str]:
    """The message for `optcodemod COMMAND` when this Python cannot import torch, else None.

    Checked without importing torch (seconds of start-up): `verify` and `bench` run it in
    child processes of this same Python, `doctor` inspects it.
    """
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    return f"optcodemod {command} needs torch: {TORCH_INSTALL}"

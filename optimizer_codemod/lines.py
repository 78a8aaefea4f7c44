"""Splitting text into lines the way Python and LibCST count them.

`str.splitlines` also breaks at form feeds, U+2028 and other separators that are not line
breaks in Python source, so its line numbers drift from LibCST's positions after the first
one (and a diff built from it breaks a line in two).
"""

from __future__ import annotations

import re
from typing import List

_LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def split_lines(text: str, keepends: bool = False) -> List[str]:
    """The lines of `text`, broken only at \\r\\n, \\r and \\n."""
    lines = _LINE_RE.findall(text)
    return lines if keepends else [line.rstrip("\r\n") for line in lines]

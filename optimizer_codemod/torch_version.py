"""Torch versions as the `target-torch` setting and rule metadata spell them."""

from __future__ import annotations

import re
from typing import NamedTuple

_VERSION_RE = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?\s*$")


class TorchVersion(NamedTuple):
    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> "TorchVersion":
        match = _VERSION_RE.match(str(text))
        if not match:
            raise ValueError(f"{text!r} is not a torch version like 2.4 or 2.4.1")
        major, minor, patch = match.groups()
        return cls(int(major), int(minor), int(patch or 0))

    def __str__(self) -> str:
        if self.patch:
            return f"{self.major}.{self.minor}.{self.patch}"
        return f"{self.major}.{self.minor}"


DEFAULT_TARGET = TorchVersion.parse("2.4")

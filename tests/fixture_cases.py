"""Discovering fixtures: fixtures/<CODE>/{fix_,keep_,report_}*.py|.ipynb.

- fix_NAME.py with fix_NAME.expected.py: the rule rewrites the first into the second;
- keep_NAME.py: must not change and must not be reported (a hazard the rule respects);
- report_NAME.py: must not change, but the rule reports a finding (no sound fix here).
A line `# fixture: key=value ...` sets options: unsafe-fixes (default true), target-torch,
precision, target-device (default cuda), select (comma-separated codes, default the folder's
rule: shows rules composing), exclude-tests (default true: a test module is left alone).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional

from optimizer_codemod.api import SourceRewrite, rewrite_source
from optimizer_codemod.config import Settings
from optimizer_codemod.registry import all_rules
from optimizer_codemod.torch_version import TorchVersion

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
KINDS = ("fix", "keep", "report")
_OPTIONS_RE = re.compile(r"#\s*fixture:\s*([\w=.,\- ]+)")


@dataclass(frozen=True)
class Fixture:
    code: str
    path: Path

    @property
    def kind(self) -> str:
        return self.path.name.split("_", 1)[0]

    @property
    def expected_path(self) -> Path:
        return self.path.with_name(self.path.stem + ".expected" + self.path.suffix)

    @property
    def id(self) -> str:
        return f"{self.code}/{self.path.name}"

    @property
    def is_notebook(self) -> bool:
        return self.path.suffix == ".ipynb"

    def options(self) -> Dict[str, str]:
        text = self.path.read_text(encoding="utf-8")
        found: Dict[str, str] = {}
        for match in _OPTIONS_RE.finditer(text):
            for item in match.group(1).split():
                key, _, value = item.partition("=")
                found[key] = value or "true"
        return found

    def settings(self, all_selected: bool = False) -> Settings:
        options = self.options()
        return Settings(
            select=(
                ("ALL",) if all_selected else tuple(options.get("select", self.code).split(","))
            ),
            unsafe_fixes=options.get("unsafe-fixes", "true") == "true",
            target_torch=TorchVersion.parse(options.get("target-torch", "2.4")),
            precision=options.get("precision", "bf16"),
            target_device=options.get("target-device", "cuda"),
            exclude_tests=options.get("exclude-tests", "true") == "true",
        )


def fixtures() -> List[Fixture]:
    found = []
    for folder in sorted(p for p in FIXTURES.iterdir() if p.is_dir()):
        for path in sorted(folder.iterdir()):
            if ".expected." in path.name or path.suffix not in (".py", ".ipynb"):
                continue
            found.append(Fixture(folder.name, path))
    return found


@lru_cache(maxsize=None)
def run_fixture(
    fixture: Fixture, all_selected: bool = False, source: Optional[bytes] = None
) -> SourceRewrite:
    src = fixture.path.read_bytes() if source is None else source
    settings = fixture.settings(all_selected)
    return rewrite_source(src, str(fixture.path), settings.options_for(str(fixture.path)))


def rule_codes() -> List[str]:
    return [rule.code for rule in all_rules()]

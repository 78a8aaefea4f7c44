"""The user guide's commands, run as written against a copy of the bundled example.

In `console` blocks, a line starting with `$ ` is a command; the lines after it (until the next
command) are output lines that must appear, where `...` stands for any text. Commands of one page run in order in one folder that
starts with `train.py` (a copy of examples/train.py), so a page can show a file changing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"^```console\n(.*?)^```", re.S | re.M)


def commands(page: Path) -> List[Tuple[str, List[str]]]:
    found: List[Tuple[str, List[str]]] = []
    for block in BLOCK.findall(page.read_text(encoding="utf-8")):
        for line in block.splitlines():
            if line.startswith("$ "):
                found.append((line[2:], []))
            elif line.strip():
                found[-1][1].append(line)
    return found


PAGES = [page for page in GUIDE if commands(page)]


def test_the_guide_has_runnable_pages() -> None:
    names = {page.name for page in PAGES}
    assert {"getting-started.md", "pre-commit-and-ci.md", "safety.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_guide_commands_run_as_documented(page: Path, tmp_path: Path) -> None:
    shutil.copy(ROOT / "examples" / "train.py", tmp_path / "train.py")
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    for command, expected in commands(page):
        done = subprocess.run(
            command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        output = done.stdout + done.stderr
        assert done.returncode in (0, 1), f"{page.name}: `{command}` failed:\n{output}"
        assert "Traceback" not in output, f"{page.name}: `{command}` crashed:\n{output}"
        for line in expected:
            pattern = ".*".join(re.escape(part) for part in line.split("..."))
            found = re.search(f"^{pattern}$", output, re.M)
            assert found, f"{page.name}: `{command}` lacks {line!r}:\n{output}"

"""Our `# noqa: OPT...` comments survive ruff with the setting docs/configuration.md gives."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from optimizer_codemod import rewrite

DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
SUPPRESSED = "import torch\nopt = torch.optim.Adam(p)  # noqa: OPT501, E501\n"
# RUF102 (invalid rule code) deletes unknown codes; RUF100 (unused noqa) deleted them in older
# ruff releases and still removes ruff's own unused codes. --preview: RUF102 is a preview rule
# in some releases.
RUFF_FIX = ["check", "--no-cache", "--preview", "--select", "RUF100,RUF102", "--fix"]


def _documented_setting() -> str:
    blocks = re.findall(r"```toml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    [setting] = [block for block in blocks if "external" in block]
    return setting


def _ruff_fix(folder: Path, pyproject: str) -> str:
    (folder / "pyproject.toml").write_text(pyproject)
    script = folder / "train.py"
    script.write_text(SUPPRESSED)
    subprocess.run(
        [sys.executable, "-m", "ruff", *RUFF_FIX, str(script)],
        cwd=folder,
        capture_output=True,
        check=False,
    )
    return script.read_text()


def test_without_the_setting_ruff_deletes_our_noqa(tmp_path: Path) -> None:
    fixed = _ruff_fix(tmp_path, "[tool.ruff]\n")
    assert "OPT501" not in fixed  # the hazard the documentation warns about
    assert rewrite(fixed, select=["OPT501"]).changed  # so the finding comes back


def test_the_documented_setting_keeps_our_noqa(tmp_path: Path) -> None:
    fixed = _ruff_fix(tmp_path, _documented_setting())
    assert fixed.splitlines()[1].endswith("Adam(p)  # noqa: OPT501")  # ruff's own E501 went
    assert not rewrite(fixed, select=["OPT501"]).changed

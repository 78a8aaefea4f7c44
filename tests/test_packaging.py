"""The installed wheel claims only our own import name (DESIGN.md §2)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_installs_only_the_optimizer_codemod_package(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 0, completed.stderr
    [wheel] = tmp_path.glob("optcodemod-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    dist_info = {name for name in top_level if name.endswith(".dist-info")}
    assert top_level - dist_info == {"optimizer_codemod"}
    assert "transforms" not in top_level and "fixtures" not in top_level
    rule_modules = [n for n in names if n.startswith("optimizer_codemod/transforms/opt")]
    source_rules = sorted((ROOT / "transforms").glob("opt*.py"))
    assert len(rule_modules) == len(source_rules) > 0
    [info] = dist_info
    top_level_txt = zipfile.ZipFile(wheel).read(f"{info}/top_level.txt").decode().split()
    assert top_level_txt == ["optimizer_codemod"]
    entry_points = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    assert "optcodemod = optimizer_codemod.cli:main" in entry_points
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    requirements = [l for l in metadata.splitlines() if l.startswith("Requires-Dist:")]
    core = [r for r in requirements if "extra ==" not in r]
    assert not any("torch" in r for r in core), core

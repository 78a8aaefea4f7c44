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


def test_version_changelog_and_documented_pins_agree() -> None:
    import re

    from optimizer_codemod import __version__

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    newest = re.search(r"^## (\d+\.\d+\.\d+)\b", changelog, re.M).group(1)
    assert project["version"] == __version__ == newest
    # Every `rev:` the docs show is a commit (a full hash) or a tag that exists.
    tags = subprocess.run(
        ["git", "tag", "--list"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    blocks = [b for page in docs for b in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)]
    revs = [rev for block in blocks for rev in re.findall(r"^\s*rev: (\S+)", block, re.M)]
    assert revs, "the pre-commit snippet is gone"
    for rev in revs:
        assert re.fullmatch(r"[0-9a-f]{40}", rev) or rev in tags, rev
    for tag in tags:  # a release, once tagged, is in the changelog under its version
        assert tag.startswith("v") and f"## {tag[1:]}" in changelog, tag

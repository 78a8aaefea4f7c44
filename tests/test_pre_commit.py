"""The pre-commit hooks, run by the real pre-commit against a copy of this repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TRAINING_SCRIPT

ROOT = Path(__file__).resolve().parent.parent
SLOW = b"optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)"
FUSED = b"optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)"


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=_git_env()
    )
    return done.stdout.strip()


def _git_env() -> dict:
    env = dict(os.environ)
    env.update(
        GIT_AUTHOR_NAME="test",
        GIT_AUTHOR_EMAIL="test@example.com",
        GIT_COMMITTER_NAME="test",
        GIT_COMMITTER_EMAIL="test@example.com",
    )
    return env


def _hook_repository(tmp: Path) -> tuple:
    """A git repository holding this project's working tree, and the commit to pin."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    repo = tmp / "optcodemod-hooks"
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, repo / name)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "hooks")
    return repo, _git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def hooks(tmp_path_factory) -> tuple:
    return _hook_repository(tmp_path_factory.mktemp("pre-commit"))


def _project(hooks: tuple, hook_id: str) -> Path:
    repository, rev = hooks
    project = repository.parent / hook_id
    project.mkdir()
    _git(project, "init", "-q")
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {repository.as_uri()}\n  rev: {rev}\n  hooks:\n  - id: {hook_id}\n"
    )
    _git(project, "add", ".pre-commit-config.yaml")
    _git(project, "commit", "-q", "-m", "config")
    return project


def _pre_commit(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = _git_env()
    env["PRE_COMMIT_HOME"] = str(project.parent / "cache")
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", *args],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_hook_rewrites_then_passes_and_leaves_broken_files_alone(hooks) -> None:
    project = _project(hooks, "optcodemod")
    # No Python file staged: the hook has nothing to do and passes.
    (project / "notes.txt").write_text("hello\n")
    _git(project, "add", "notes.txt")
    nothing = _pre_commit(project)
    assert nothing.returncode == 0, nothing.stdout + nothing.stderr
    assert "no files to check" in nothing.stdout.lower()

    script = project / "train.py"
    script.write_bytes(TRAINING_SCRIPT)
    _git(project, "add", "train.py")
    first = _pre_commit(project)
    assert first.returncode == 1, first.stdout + first.stderr
    assert "files were modified by this hook" in first.stdout
    assert FUSED in script.read_bytes() and SLOW + b"\n" not in script.read_bytes()

    _git(project, "add", "train.py")
    second = _pre_commit(project)
    assert second.returncode == 0, second.stdout + second.stderr
    assert _git(project, "diff", "--stat") == ""

    broken = project / "broken.py"
    broken_text = b"import torch\nopt = torch.optim.AdamW(\n"
    broken.write_bytes(broken_text)
    _git(project, "add", "broken.py")
    failed = _pre_commit(project, "--files", "broken.py")
    assert failed.returncode != 0
    assert "broken.py:2:24: cannot parse: '(' was never closed" in failed.stdout
    assert broken.read_bytes() == broken_text


def test_check_hook_fails_without_writing(hooks) -> None:
    project = _project(hooks, "optcodemod-check")
    script = project / "train.py"
    script.write_bytes(TRAINING_SCRIPT)
    _git(project, "add", "train.py")
    checked = _pre_commit(project)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "OPT501 [numerics]" in checked.stdout
    assert script.read_bytes() == TRAINING_SCRIPT

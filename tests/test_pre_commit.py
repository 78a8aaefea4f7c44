"""The published pre-commit hooks, run by the real pre-commit, offline.

The hooks repository is a git commit of this working tree, pinned by its commit (as a user
pins one without tags). Its `.pre-commit-hooks.yaml` is the published one with one change:
`language: system` instead of `python`, so that pre-commit runs the `optcodemod` of the
Python running the tests instead of pip-installing it from an index (the install itself is
tested in test_install.py). Every other field (entry and its options, file types) is the
published one. Network access is made to fail, so a hook that reached for it would fail too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, TRAINING_SCRIPT, copy_working_tree

SLOW = b"optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)"
FUSED = b"optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)"
PUBLISHED = ROOT / ".pre-commit-hooks.yaml"


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


def _offline_env(project: Path) -> dict:
    env = _git_env()
    env.update(
        PRE_COMMIT_HOME=str(project.parent / "cache"),
        # The optcodemod of this Python, the one under test, comes first on PATH.
        PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
        # Anything that tried the network (pip, git over http) fails at once.
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS="",
        http_proxy="http://127.0.0.1:9",
        https_proxy="http://127.0.0.1:9",
        HTTP_PROXY="http://127.0.0.1:9",
        HTTPS_PROXY="http://127.0.0.1:9",
    )
    return env


def test_published_hooks_force_exclude_and_cover_scripts_and_notebooks() -> None:
    hooks = {hook["id"]: hook for hook in yaml.safe_load(PUBLISHED.read_text())}
    assert set(hooks) == {"optcodemod", "optcodemod-check"}
    assert hooks["optcodemod"]["entry"].split() == ["optcodemod", "apply", "--force-exclude"]
    assert "--check" in hooks["optcodemod-check"]["entry"].split()
    for hook in hooks.values():
        assert "--force-exclude" in hook["entry"].split()
        assert hook["language"] == "python"  # pre-commit installs it from the pinned commit
        assert hook["types_or"] == ["python", "jupyter"]


def _hook_repository(tmp: Path) -> tuple:
    """A git repository holding this project's working tree, and the commit to pin."""
    repo = copy_working_tree(tmp / "optcodemod-hooks")
    published = PUBLISHED.read_text()
    local = published.replace("language: python", "language: system")
    assert local.count("language: system") == 2 and local != published
    (repo / ".pre-commit-hooks.yaml").write_text(local)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "hooks")
    return repo, _git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def hooks(tmp_path_factory) -> tuple:
    return _hook_repository(tmp_path_factory.mktemp("pre-commit"))


def _project(hooks: tuple, hook_id: str, pyproject: str = "") -> Path:
    repository, rev = hooks
    project = repository.parent / f"{hook_id}-{len(list(repository.parent.iterdir()))}"
    project.mkdir()
    _git(project, "init", "-q")
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {repository.as_uri()}\n  rev: {rev}\n  hooks:\n  - id: {hook_id}\n"
    )
    files = [".pre-commit-config.yaml"]
    if pyproject:
        (project / "pyproject.toml").write_text(pyproject)
        files.append("pyproject.toml")
    _git(project, "add", *files)
    _git(project, "commit", "-q", "-m", "config")
    return project


def _pre_commit(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", *args],
        cwd=project,
        capture_output=True,
        text=True,
        env=_offline_env(project),
        timeout=120,
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


def test_hook_honours_exclude_for_the_files_pre_commit_names(hooks) -> None:
    project = _project(
        hooks, "optcodemod", pyproject='[tool.optcodemod]\nexclude = ["experiments/"]\n'
    )
    experiment = project / "experiments" / "try.py"
    experiment.parent.mkdir()
    for path in (experiment, project / "train.py"):
        path.write_bytes(TRAINING_SCRIPT)
    _git(project, "add", "experiments/try.py", "train.py")
    only_excluded = _pre_commit(project, "--files", "experiments/try.py")
    assert only_excluded.returncode == 0, only_excluded.stdout + only_excluded.stderr
    assert experiment.read_bytes() == TRAINING_SCRIPT
    both = _pre_commit(project)  # pre-commit passes both staged files by name
    assert both.returncode == 1, both.stdout + both.stderr
    assert FUSED in (project / "train.py").read_bytes()
    assert experiment.read_bytes() == TRAINING_SCRIPT


def test_autoupdate_pins_the_newest_commit_when_there_are_no_tags(hooks, tmp_path) -> None:
    # What docs/pre-commit-and-ci.md promises for `rev:` while optcodemod has no tags.
    repository, first = hooks
    upstream = tmp_path / "upstream"
    _git(tmp_path, "clone", "-q", repository.as_uri(), str(upstream))
    (upstream / "CHANGELOG.md").write_text((upstream / "CHANGELOG.md").read_text() + "\n")
    _git(upstream, "commit", "-q", "-am", "newer")
    newest = _git(upstream, "rev-parse", "HEAD")
    assert _git(upstream, "tag", "--list") == "" and newest != first
    project = _project((upstream, first), "optcodemod")
    done = subprocess.run(
        [sys.executable, "-m", "pre_commit", "autoupdate"],
        cwd=project,
        capture_output=True,
        text=True,
        env=_offline_env(project),
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load((project / ".pre-commit-config.yaml").read_text())
    assert config["repos"][0]["rev"] == newest

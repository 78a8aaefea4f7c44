"""Which files a run looks at: paths given, directories walked, .gitignore and excludes honoured."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pathspec

from optimizer_codemod.config import DEFAULT_EXCLUDE, Settings

SOURCE_SUFFIXES = (".py", ".pyi", ".ipynb")


@dataclass
class Discovery:
    files: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)
    empty_directories: List[str] = field(default_factory=list)
    skipped: List[Tuple[str, str]] = field(default_factory=list)  # (path, why), for --verbose
    # Symbolic links met in a walked folder that point out of it: always said, since the user
    # may expect their targets rewritten.
    links_outside: List[str] = field(default_factory=list)


class _GitIgnores:
    """The .gitignore files that apply below a directory, read once each."""

    def __init__(self) -> None:
        self._cache: Dict[Path, Optional[pathspec.PathSpec]] = {}

    def _spec(self, folder: Path) -> Optional[pathspec.PathSpec]:
        if folder not in self._cache:
            ignore_file = folder / ".gitignore"
            spec = None
            if ignore_file.is_file():
                try:
                    lines = ignore_file.read_text(encoding="utf-8", errors="replace").splitlines()
                    spec = pathspec.GitIgnoreSpec.from_lines(lines)
                except OSError:
                    spec = None
            self._cache[folder] = spec
        return self._cache[folder]

    def ignored_by(self, path: Path, is_dir: bool) -> Optional[Path]:
        """The .gitignore, from the repository root down, that ignores `path`; else None."""
        for folder in _folders_up_to_repository(path.parent):
            spec = self._spec(folder)
            if spec is None:
                continue
            relative = path.relative_to(folder).as_posix() + ("/" if is_dir else "")
            if spec.match_file(relative):
                return folder / ".gitignore"
        return None


def _folders_up_to_repository(folder: Path) -> Iterator[Path]:
    for candidate in (folder, *folder.parents):
        yield candidate
        if (candidate / ".git").exists():
            return


def excluded_reason(path: str, settings: Settings) -> Optional[str]:
    """Why `force-exclude` keeps a path named on the command line out; None to keep it.

    The user's `exclude` patterns and the folders always skipped (`.venv`, `build`, ...)
    below the configuration's folder, as ruff's `force-exclude` does; .gitignore is not
    consulted (pre-commit names tracked files only).
    """
    pattern = settings.exclude_pattern(path)
    if pattern is not None:
        return f"force-exclude: matches exclude pattern {pattern!r}"
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(settings.root))
    parts = Path(relative).parts
    if parts and parts[0] != os.pardir:
        for name in parts:
            if name in DEFAULT_EXCLUDE:
                return f"force-exclude: inside {name!r}, a folder always skipped"
        if settings.exclude_tests:
            kinds = [True] * (len(parts) - 1) + [os.path.isdir(path)]
            for name, is_dir in zip(parts, kinds):
                test_reason = test_path_reason(name, is_dir)
                if test_reason is not None:
                    return f"force-exclude: {test_reason}"
    return None


# A test suite's folder and pytest's fixture file. Files named like tests elsewhere
# (`test_*.py`) are read first: research repositories name evaluation scripts so
# (api.collected_by_test_runners).
def test_path_reason(name: str, is_dir: bool) -> Optional[str]:
    """Why a file or folder of this name is left alone as part of a test suite, else None."""
    if is_dir:
        return "a test suite's folder (exclude-tests)" if name == "tests" else None
    return "pytest's conftest.py (exclude-tests)" if name == "conftest.py" else None


def discover(paths: List[str], settings: Settings) -> Discovery:
    """Directories are walked; named files are taken, unless `force_exclude` is set.

    A symbolic link named explicitly is rewritten through to its target (as black does), and a
    file reached by two names is taken once. A walked folder's own links are not followed:
    a target inside the folder is reached under its own name, and a link to a file outside
    is skipped with a message, since walking a folder must not rewrite files elsewhere.
    """
    found = Discovery()
    gitignores = _GitIgnores()
    seen = set()

    def add(path: str) -> None:
        key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            found.files.append(path)

    for raw in paths:
        if not os.path.exists(raw):
            found.missing.append(raw)
            continue
        reason = excluded_reason(raw, settings) if settings.force_exclude else None
        if reason is not None:
            found.skipped.append((raw, reason))
            continue
        if not os.path.isdir(raw):
            add(raw)
            continue
        before = len(found.files)
        inside = os.path.join(os.path.realpath(raw), "")
        for path in _walk(Path(raw), settings, gitignores, found.skipped):
            if os.path.islink(path):
                target = os.path.realpath(path)
                if not target.startswith(inside):
                    found.links_outside.append(
                        f"{path}: a symbolic link to {target}, outside {raw}; skipped "
                        "(name the link itself to rewrite its target)"
                    )
                continue
            add(str(path))
        if len(found.files) == before:
            found.empty_directories.append(raw)
    return found


def _walk(
    root: Path, settings: Settings, gitignores: _GitIgnores, skipped: List[Tuple[str, str]]
) -> Iterator[Path]:
    absolute_root = root.resolve()

    def why_not(child: Path, is_dir: bool) -> Optional[str]:
        if is_dir and child.name in DEFAULT_EXCLUDE:
            return "a folder always skipped"
        test_reason = test_path_reason(child.name, is_dir) if settings.exclude_tests else None
        if test_reason is not None:
            return test_reason
        pattern = settings.exclude_pattern(str(child))
        if pattern is not None:
            return f"matches exclude pattern {pattern!r}"
        if settings.respect_gitignore:
            ignore_file = gitignores.ignored_by(
                absolute_root / child.relative_to(root), is_dir=is_dir
            )
            if ignore_file is not None:
                return f"ignored by {ignore_file}"
        return None

    for folder, dirnames, filenames in os.walk(root):
        here = Path(folder)
        kept = []
        for name in sorted(dirnames):
            reason = why_not(here / name, is_dir=True)
            if reason is None:
                kept.append(name)
            elif name != ".git":  # every repository has one: not worth a line
                skipped.append((str(here / name) + os.sep, reason))
        dirnames[:] = kept
        for name in sorted(filenames):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            reason = why_not(here / name, is_dir=False)
            if reason is None:
                yield here / name
            else:
                skipped.append((str(here / name), reason))

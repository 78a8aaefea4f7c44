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
    # Symbolic links met in a walked folder that point out of it, each with the reason.
    skipped: List[str] = field(default_factory=list)


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

    def ignored(self, path: Path, is_dir: bool) -> bool:
        """Whether a .gitignore in any folder from the repository root down ignores `path`."""
        for folder in _folders_up_to_repository(path.parent):
            spec = self._spec(folder)
            if spec is None:
                continue
            relative = path.relative_to(folder).as_posix() + ("/" if is_dir else "")
            if spec.match_file(relative):
                return True
        return False


def _folders_up_to_repository(folder: Path) -> Iterator[Path]:
    for candidate in (folder, *folder.parents):
        yield candidate
        if (candidate / ".git").exists():
            return


def discover(paths: List[str], settings: Settings) -> Discovery:
    """Explicit files are always taken (as black and ruff do); directories are walked.

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
        if not os.path.isdir(raw):
            add(raw)
            continue
        before = len(found.files)
        inside = os.path.join(os.path.realpath(raw), "")
        for path in _walk(Path(raw), settings, gitignores):
            if os.path.islink(path):
                target = os.path.realpath(path)
                if not target.startswith(inside):
                    found.skipped.append(
                        f"{path}: a symbolic link to {target}, outside {raw}; skipped "
                        "(name the link itself to rewrite its target)"
                    )
                continue
            add(str(path))
        if len(found.files) == before:
            found.empty_directories.append(raw)
    return found


def _walk(root: Path, settings: Settings, gitignores: _GitIgnores) -> Iterator[Path]:
    absolute_root = root.resolve()
    for folder, dirnames, filenames in os.walk(root):
        here = Path(folder)
        kept = []
        for name in sorted(dirnames):
            child = here / name
            if name in DEFAULT_EXCLUDE or settings.excludes(str(child)):
                continue
            if settings.respect_gitignore and gitignores.ignored(
                absolute_root / child.relative_to(root), is_dir=True
            ):
                continue
            kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            child = here / name
            if settings.excludes(str(child)):
                continue
            if settings.respect_gitignore and gitignores.ignored(
                absolute_root / child.relative_to(root), is_dir=False
            ):
                continue
            yield child

"""The local modules the files of a run import without being in the run themselves.

Pre-commit, an editor and `apply train.py` hand the tool one file, or the few that changed,
while what decides a fix is often in a module the file imports: guided-diffusion's
train_util.py wraps its model in DDP and its fp16_util.py resets `param.grad` in place (a
gradient bucket view raises there); PyTorch-YOLOv3's train.py asks for determinism through
its utils.py. Rewritten alone, such a file was told nothing and got the unsound fix. The
project index (project.py) therefore reads these modules too, as context: they tell the run's
files what they define and decide (classes, datasets, loops, precision, `.grad`), but are
never rewritten, and what they say about the run's files as callers is not taken (other
callers, outside the run and unseen, may differ).

Found from the text alone, as Python would find them: import lines (`import a.b`,
`from .x import y`, `from pkg import (mod, other)`) resolved from the importer's folder, the
folder above its top package, the run's common folder and the checkout's root
(project._search_roots), then the
same for each module found. Cost: one regular-expression search per file and a few `stat`
calls per import line; a script that imports nothing local reads no other file. The
index then parses what was found, within a budget (MAX_CONTEXT_BYTES).
"""

from __future__ import annotations

import os
import re
from collections import deque
from typing import Iterable, List, Set

from optimizer_codemod.analysis.project import _project_root, _resolve, _run_root

# The nearest modules first (breadth first), up to a budget: the index parses each (about
# 3 ms per KB on a 2-core EPYC), and a script inside a library (timm's train.py imports the
# whole timm package, 4.6 MB) would otherwise parse all of it for one file. A module left out
# is one outside the run, which the index already treats as unknown.
MAX_CONTEXT_FILES = 256
MAX_CONTEXT_BYTES = 512_000

_FROM_IMPORT = re.compile(
    rb"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)", re.MULTILINE
)
_IMPORT = re.compile(rb"^[ \t]*import[ \t]+([^\n#;]+)", re.MULTILINE)
_NAME = re.compile(rb"[A-Za-z_]\w*")


class _OnDisk(dict):
    """Stands for the run's files in project._resolve: any module file on disk."""

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and os.path.isfile(path)


def context_modules(paths: Iterable[str]) -> List[str]:
    """The local modules that the Python files among `paths` import, directly or through
    each other, and that are not among `paths`: absolute, sorted, at most
    MAX_CONTEXT_FILES and MAX_CONTEXT_BYTES. Never raises; an unreadable file imports
    nothing."""
    given = {os.path.abspath(p) for p in paths if p.endswith(".py")}
    if not given:
        return []
    _project_root.cache_clear()  # a marker may have come or gone since the last run
    run_root = _run_root(given)
    seen: Set[str] = set(given)
    found: List[str] = []
    size = 0
    pending = deque(sorted(given))
    while pending:
        path = pending.popleft()
        for target in _imported_files(path, run_root):
            if target in seen:
                continue
            seen.add(target)
            try:
                size += os.path.getsize(target)
            except OSError:
                continue
            if size > MAX_CONTEXT_BYTES or len(found) >= MAX_CONTEXT_FILES:
                return sorted(found)
            found.append(target)
            pending.append(target)
    return sorted(found)


def _imported_files(path: str, run_root: str) -> List[str]:
    try:
        with open(path, "rb") as stream:
            src = stream.read()
    except OSError:
        return []
    on_disk = _OnDisk()
    found: List[str] = []
    for match in _IMPORT.finditer(src):
        for clause in match.group(1).split(b","):
            words = clause.split()
            if words:
                found.extend(_module_and_packages(path, words[0], 0, on_disk, run_root))
    for match in _FROM_IMPORT.finditer(src):
        spelled = match.group(1)
        level = len(spelled) - len(spelled.lstrip(b"."))
        module = spelled[level:]
        found.extend(_module_and_packages(path, module, level, on_disk, run_root))
        names = [n for n in _NAME.findall(match.group(2)) if n != b"as"]
        _, folders = _resolve(path, module.decode("ascii", "replace"), level, on_disk, run_root)
        for folder in folders:
            for name in names:  # `from pkg import mod`: a submodule, when there is one
                candidate = os.path.join(folder, name.decode("ascii", "replace") + ".py")
                if os.path.isfile(candidate):
                    found.append(candidate)
    return [os.path.abspath(f) for f in found]


def _module_and_packages(
    importer: str, module: bytes, level: int, on_disk: _OnDisk, run_root: str
) -> List[str]:
    """The file `module` names and the `__init__.py` of each package on the way to it (they
    run, and may re-export)."""
    parts = module.decode("ascii", "replace").split(".") if module else []
    found: List[str] = []
    for depth in range(0 if level else 1, len(parts) + 1):
        target, _ = _resolve(importer, ".".join(parts[:depth]), level, on_disk, run_root)
        if target is not None:
            found.append(target)
    return found

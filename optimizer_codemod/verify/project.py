"""A driver script and the local modules it imports, rewritten together in a shadow folder.

`verify driver.py` must measure what `apply` on the project would change, and the gains are
often in the modules the driver imports (model.py, trainer.py). The local modules are the
files reached from the driver's imports (following imports of imports) that live under the
driver's folder, where `python driver.py` finds them (its folder is `sys.path[0]`).

The shadow folder mirrors the driver's folder with symbolic links, except along the paths of
rewritten files, which are real folders holding the rewritten text: imports in the shadow
driver find the rewritten modules, and data read relative to a module's file still resolves
to the user's files. Nothing in the user's folder is written.
"""

from __future__ import annotations

import ast
import os
import shutil
import tempfile
from typing import Dict, Iterator, List, Optional, Set


def local_modules(driver: str) -> List[str]:
    """The files under the driver's folder that its imports reach, breadth first."""
    root = os.path.dirname(os.path.abspath(driver))
    seen: Set[str] = {os.path.abspath(driver)}
    order: List[str] = []
    pending = [os.path.abspath(driver)]
    while pending:
        path = pending.pop(0)
        for found in _imports_of(path, root):
            if found not in seen:
                seen.add(found)
                order.append(found)
                pending.append(found)
    return order


def _imports_of(path: str, root: str) -> Iterator[str]:
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return
    package = os.path.dirname(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _resolve(root, alias.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = os.path.dirname(base)
                if not base.startswith(root):
                    continue
                parts = os.path.relpath(base, root).split(os.sep)
                parts = [p for p in parts if p not in (".", "")]
            else:
                parts = []
            module = parts + (node.module.split(".") if node.module else [])
            yield from _resolve(root, module)
            for alias in node.names:  # `from package import module`
                yield from _resolve(root, module + [alias.name], only_module=True)


def _resolve(root: str, parts: List[str], only_module: bool = False) -> Iterator[str]:
    """Files for `a.b.c` under root: each package's __init__.py on the way, then the module."""
    if not parts or any(not p.isidentifier() for p in parts):
        return
    folder = root
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        candidate = os.path.join(folder, part)
        if last and os.path.isfile(candidate + ".py"):
            yield candidate + ".py"
            return
        init = os.path.join(candidate, "__init__.py")
        if not os.path.isfile(init):
            return
        if not only_module or last:
            yield init
        folder = candidate


def shadow_folder(root: str, rewritten: Dict[str, bytes]) -> str:
    """A temporary folder mirroring `root`, with `rewritten` ({absolute path: text}) in place."""
    shadow = tempfile.mkdtemp(prefix="optcodemod-project-")
    real_dirs = {root}
    for path in rewritten:
        folder = os.path.dirname(path)
        while folder.startswith(root) and folder not in real_dirs:
            real_dirs.add(folder)
            folder = os.path.dirname(folder)
    for folder in sorted(real_dirs):
        target = os.path.join(shadow, os.path.relpath(folder, root))
        os.makedirs(target, exist_ok=True)
        for name in os.listdir(folder):
            source = os.path.join(folder, name)
            if source in real_dirs or source in rewritten or name == "__pycache__":
                continue
            os.symlink(source, os.path.join(target, name))
    for path, text in rewritten.items():
        with open(os.path.join(shadow, os.path.relpath(path, root)), "wb") as handle:
            handle.write(text)
    return shadow


def remove_shadow(shadow: Optional[str]) -> None:
    if shadow:
        shutil.rmtree(shadow, ignore_errors=True)

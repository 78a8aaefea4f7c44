"""The oldest torch a project declares it runs on, read from its pyproject.toml.

When `target-torch` is not set, the rewritten code must still run on every torch the project
promises to support, as ruff reads `requires-python` when `target-version` is not set. Only the
declarative places count: PEP 621 `[project] dependencies` and Poetry's
`[tool.poetry.dependencies]`. A requirements.txt is left alone: research repositories pin the
torch their paper used (`torch==1.4.0`), which says where results were reproduced, not the oldest
torch the code is meant to keep running on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, Iterable, List, NamedTuple, Optional

from optimizer_codemod.torch_version import TorchVersion

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)$", re.S)
# PEP 440 operators whose version is a lower bound (`>` too: `>1.13` rules out 1.13 itself,
# so 1.13 is a safe, slightly older, floor); `<`, `<=` and `!=` bound nothing from below.
_LOWER_BOUND = re.compile(r"(~=|===|==|>=|>)\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")
# Poetry's own forms, besides the PEP 440 operators: `^1.10`, `~1.10`, `1.10.1` (exact).
_POETRY_OWN = re.compile(r"^\s*()(?:\^|~(?!=))?\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")


class DeclaredTorch(NamedTuple):
    floor: TorchVersion
    requirement: str  # as written, for messages
    where: str  # "path [project] dependencies"

    def describe(self) -> str:
        return f"the floor of {self.requirement!r} in {self.where}"


def declared_torch(pyproject: Path, data: Dict[str, Any]) -> Optional[DeclaredTorch]:
    """The lowest torch that `data` (the parsed `pyproject`) requires, or None."""
    found: List[DeclaredTorch] = []
    project = data.get("project")
    if isinstance(project, dict) and isinstance(project.get("dependencies"), list):
        where = f"{pyproject} [project] dependencies"
        for requirement in project["dependencies"]:
            floor = _pep508_floor(requirement) if isinstance(requirement, str) else None
            if floor is not None:
                found.append(DeclaredTorch(floor, requirement.strip(), where))
    poetry = data.get("tool", {}).get("poetry", {}) if isinstance(data.get("tool"), dict) else {}
    dependencies = poetry.get("dependencies") if isinstance(poetry, dict) else None
    if isinstance(dependencies, dict) and "torch" in dependencies:
        where = f"{pyproject} [tool.poetry.dependencies]"
        for constraint in _poetry_constraints(dependencies["torch"]):
            floor = _poetry_floor(constraint)
            if floor is not None:
                found.append(DeclaredTorch(floor, f"torch = {constraint!r}", where))
    return min(found, key=lambda declared: declared.floor) if found else None


def nearest_pyproject(start: Path) -> Optional[Path]:
    directory = start if start.is_dir() else start.parent
    for folder in (directory, *directory.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _pep508_floor(requirement: str) -> Optional[TorchVersion]:
    match = _NAME.match(requirement.split(";", 1)[0])
    if not match or _normalised(match.group(1)) != "torch":
        return None
    return _highest(_LOWER_BOUND.finditer(match.group(2)))


def _poetry_constraints(value: Any) -> Iterable[str]:
    """A Poetry dependency's version constraints: a string, a table, or a list of tables."""
    entries = value if isinstance(value, list) else [value]
    for entry in entries:
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, dict) and isinstance(entry.get("version"), str):
            yield entry["version"]


def _poetry_floor(constraint: str) -> Optional[TorchVersion]:
    # `||` joins alternatives: the project runs on the lowest of their floors.
    floors = [
        _highest(_poetry_bound(term) for term in part.split(",")) for part in constraint.split("||")
    ]
    if any(floor is None for floor in floors):
        return None  # an alternative without a floor (`*`, `<2`): nothing below is excluded
    return min(floors) if floors else None  # type: ignore[type-var]


def _poetry_bound(term: str) -> Optional[re.Match]:
    return _POETRY_OWN.match(term) or _LOWER_BOUND.match(term.strip())


def _highest(matches: Iterable[Optional[re.Match]]) -> Optional[TorchVersion]:
    # Specifiers joined by commas all hold, so the highest lower bound is the floor.
    bounds = [
        TorchVersion(int(match.group(2)), int(match.group(3) or 0), int(match.group(4) or 0))
        for match in matches
        if match is not None
    ]
    return max(bounds) if bounds else None


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()

"""What the modules a file imports, transitively, decide (project._imported_settings_of_all):
one pass over the import graph's strongly connected components must answer, for every module,
what walking its own imports answers, on graphs with cycles, self-imports and files outside
the run, and its work must grow linearly with a package whose files all import one another."""

from __future__ import annotations

import random
from typing import Dict, List, Tuple

from optimizer_codemod.analysis import project
from optimizer_codemod.analysis.project import (
    Settings,
    _imported_settings_of_all,
    _imports_of,
    _Module,
)

FIELDS = tuple(Settings.__dataclass_fields__)


def _walked(module: _Module, files: Dict[str, _Module]) -> Tuple[Settings, tuple]:
    """The definition: every file `module` reaches through its imports, itself left out."""
    seen = set()
    pending = [module]
    while pending:
        for path in _imports_of(pending.pop()):
            if path not in seen and path != module.path:
                seen.add(path)
                if path in files:
                    pending.append(files[path])
    decided: Dict[str, str] = {}
    for path in sorted((p for p in seen if p in files), key=lambda p: files[p].label):
        other = files[path]
        if other.facts is None:
            continue
        for name in FIELDS:
            if getattr(other.settings, name):
                decided.setdefault(name, other.label)
    return Settings(*(name in decided for name in FIELDS)), tuple(sorted(decided.items()))


def _graph(seed: int) -> Dict[str, _Module]:
    rng = random.Random(seed)
    count = rng.randint(1, 25)
    paths = [f"/run/m{i}.py" for i in range(count)]
    files: Dict[str, _Module] = {}
    for i, path in enumerate(paths):
        module = _Module(path, f"m{rng.randint(0, 10**6):07d}_{i}", b"")
        if rng.random() < 0.9:  # some are never parsed
            module.facts = object()
            module.settings = Settings(*(rng.random() < 0.15 for _ in FIELDS))
        targets = rng.sample(paths, rng.randint(0, min(4, count))) + ["/elsewhere/x.py"]
        module.modules = {f"n{j}": target for j, target in enumerate(targets)}
        files[path] = module
    return files


def test_one_pass_answers_what_each_module_walk_answers() -> None:
    for seed in range(300):
        files = _graph(seed)
        every = _imported_settings_of_all(files)
        for path, module in files.items():
            assert every[path] == _walked(module, files), (seed, module.label)


def _package(size: int) -> Dict[str, _Module]:
    """`size` files, each importing the next (one cycle through them all), each deciding one
    setting: every file imports every other, transitively."""
    files: Dict[str, _Module] = {}
    for i in range(size):
        module = _Module(f"/run/p{i}.py", f"p{i:05d}", b"")
        module.facts = object()
        module.settings = Settings(*(j == i % len(FIELDS) for j in range(len(FIELDS))))
        module.modules = {"next": f"/run/p{(i + 1) % size}.py"}
        files[module.path] = module
    return files


def test_the_work_grows_linearly_with_a_package_that_imports_itself(monkeypatch) -> None:
    calls: List[int] = []
    real = project._values

    def counted(settings):
        calls.append(1)
        return real(settings)

    monkeypatch.setattr(project, "_values", counted)
    work = []
    for size in (200, 400, 800):
        calls.clear()
        every = _imported_settings_of_all(_package(size))
        assert all(all(settings.__dict__.values()) for settings, _ in every.values())
        work.append(len(calls))
    # Walking each module's imports would ask each module's settings `size` times: 4x the
    # work for 2x the files.
    assert work[1] <= 2.2 * work[0] and work[2] <= 2.2 * work[1], work

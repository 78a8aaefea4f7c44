"""A run of several files settles: where one file's fix changes what another is told (OPT101
pins the loader data.py returns, so train.py's copies of its batches may overlap, OPT201),
both fixes come in the same run, and a second `apply` changes nothing (DESIGN.md section 4).
Before runner._settle_project, train.py's copies were made non-blocking only by a second run."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Dict, List

import pytest

from conftest import messages_by_code
from optimizer_codemod import runner
from optimizer_codemod.analysis import project
from optimizer_codemod.cache import Cache
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import FileOutcome, Status

DATA = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def get_loader(batch_size):
    dataset = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    return DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=2, persistent_workers=True
    )
"""
TRAIN = """\
import torch
from torch import nn

from data import get_loader

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(8, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = get_loader(16)
for epoch in range(2):
    for inputs, labels in loader:
        inputs = inputs.to(device)
        labels = labels.to(device)
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""
SELECTED = ("OPT101", "OPT201")


def write_project(folder: Path, data: str = DATA) -> List[str]:
    (folder / "train.py").write_text(TRAIN)
    (folder / "data.py").write_text(data)
    return [str(folder / "train.py"), str(folder / "data.py")]


def run(paths: List[str], mode: runner.Mode, jobs: int = 1) -> Dict[str, FileOutcome]:
    settings = Settings(root=str(Path(paths[0]).parent), select=SELECTED, why_not=True)
    return {Path(o.path).name: o for o in runner.run(paths, settings, mode, jobs=jobs)}


def test_a_fix_another_file_makes_possible_comes_in_the_same_run(tmp_path: Path) -> None:
    outcomes = run(write_project(tmp_path), runner.Mode(write=False, diff=True))
    assert len(messages_by_code(outcomes["data.py"], Status.FIXED)["OPT101"]) == 1
    fixed = [d for d in outcomes["train.py"].diagnostics if d.status is Status.FIXED]
    # reported where the user's file has them, not where the first rewrite moved them
    assert [(d.code, d.line) for d in fixed] == [("OPT201", 12), ("OPT201", 13)]
    assert not messages_by_code(outcomes["train.py"], Status.DECLINED).get("OPT201")
    assert outcomes["train.py"].diff.count("non_blocking=True") == 2
    assert (tmp_path / "train.py").read_text() == TRAIN  # --diff writes nothing


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_second_apply_of_a_project_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    monkeypatch.setattr(runner, "PARALLEL_THRESHOLD_BYTES", 0)  # jobs=2: worker processes
    paths = write_project(tmp_path)
    first = run(paths, runner.Mode(write=True), jobs=jobs)
    assert first["train.py"].written and first["data.py"].written
    text = (tmp_path / "train.py").read_text()
    assert text.count("non_blocking=True") == 2
    second = run(paths, runner.Mode(write=False), jobs=jobs)
    assert not any(o.changed for o in second.values())
    assert (tmp_path / "train.py").read_text() == text


def test_a_cached_run_settles_the_same_way(tmp_path: Path) -> None:
    cache = Cache(str(tmp_path / "cache"))
    project_folder = tmp_path / "project"
    project_folder.mkdir()
    paths = write_project(project_folder)
    cold = run(paths, runner.Mode(write=False, diff=True, cache=cache))
    warm = run(paths, runner.Mode(write=False, diff=True, cache=cache))
    assert warm["train.py"].diff == cold["train.py"].diff
    assert warm["train.py"].diff.count("non_blocking=True") == 2


def test_a_run_without_fixes_reads_the_project_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = []
    original = project.project_facts
    monkeypatch.setattr(
        runner, "project_facts", lambda *a, **k: built.append(k) or original(*a, **k)
    )
    pinned = DATA.replace("shuffle=True", "shuffle=True, pin_memory=True")
    paths = write_project(tmp_path, pinned)
    (tmp_path / "train.py").write_text(
        TRAIN.replace(".to(device)", ".to(device, non_blocking=True)")
    )
    outcomes = run(paths, runner.Mode(write=False))
    assert not any(o.changed for o in outcomes.values())
    assert len(built) == 1
    # With fixes: read again with the rewritten data.py, which pins its loader (train.py is
    # rewritten again), then with both rewrites, which tell no file anything new.
    run(write_project(tmp_path), runner.Mode(write=False))
    assert len(built) == 4
    assert list(built[2]["sources"]) == paths[1:]
    assert b"pin_memory=torch.cuda.is_available()" in built[2]["sources"][paths[1]]
    assert list(built[3]["sources"]) == paths


def test_a_file_saved_during_the_run_keeps_its_first_outcome(tmp_path: Path) -> None:
    paths = write_project(tmp_path)
    first = FileOutcome(path=paths[0], changed=True, written=True, texts=(b"old", b"rewritten"))
    (tmp_path / "train.py").write_text("# saved by the user meanwhile\n")
    settings = Settings(root=str(tmp_path), select=SELECTED)
    again = runner._rewrite_again(paths[0], settings, runner.Mode(write=True), None, first)
    assert again is first
    assert (tmp_path / "train.py").read_text() == "# saved by the user meanwhile\n"


def test_the_second_look_keeps_the_first_fixes_and_reports_lines_of_the_file(
    tmp_path: Path,
) -> None:
    settings = Settings(root=str(tmp_path))  # every rule: train.py changes in the first look
    outcomes = runner.run(write_project(tmp_path), settings, runner.Mode(write=False, diff=True))
    train = next(o for o in outcomes if o.path.endswith("train.py"))
    fixed = sorted((d.line, d.code) for d in train.fixed)
    # OPT301 inserts two lines above the loop in the first look; OPT201 is reported where
    # the copies are in the user's file
    assert fixed == [(8, "OPT501"), (12, "OPT201"), (13, "OPT201"), (14, "OPT302"), (16, "OPT301")]
    assert train.diff.count("non_blocking=True") == 2
    assert 'torch.set_float32_matmul_precision("high")' in train.diff


def test_a_reason_the_second_look_gives_replaces_the_first_looks(tmp_path: Path) -> None:
    collated = DATA.replace("shuffle=True", "shuffle=True, collate_fn=collate") + (
        "\n\ndef collate(items):\n    return items\n"
    )
    paths = write_project(tmp_path, collated)
    settings = Settings(root=str(tmp_path), why_not=True)  # train.py changes in the first look
    outcomes = runner.run(paths, settings, runner.Mode(write=False))
    declined = messages_by_code(outcomes[0], Status.DECLINED)["OPT201"]
    # first "the DataLoader is not built with `pin_memory=True`"; pinned once data.py is
    # rewritten, the copies are left alone for the custom collate_fn alone
    assert len(declined) == 2
    assert all("custom `collate_fn`" in reason for reason in declined)


def test_a_later_build_parses_only_the_files_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: List[str] = []
    real = project.cst.parse_module
    monkeypatch.setattr(project.cst, "parse_module", lambda src: parsed.append(src) or real(src))
    paths = write_project(tmp_path)
    parses: dict = {}
    first = project.project_facts(paths, parses=parses)
    assert len(parsed) == 2
    pinned = DATA.replace("shuffle=True", "shuffle=True, pin_memory=True").encode()
    second = project.project_facts(paths, sources={paths[1]: pinned}, parses=parses)
    assert parsed[2:] == [pinned]  # train.py's parse is the first build's
    assert second[paths[0]] != first[paths[0]]
    assert second == project.project_facts(paths, sources={paths[1]: pinned})


PROJECTS = Path(__file__).resolve().parent.parent / "fixtures" / "projects"


@pytest.mark.parametrize("name", ["trainer_lm", "trainer_convnet", "datasets_elsewhere"])
def test_a_run_says_the_same_whatever_the_cache_holds(tmp_path: Path, name: str) -> None:
    """The cache holds the index and outcomes of an earlier run with other settings: a run
    must say what it says without any cache (sites left alone included: a resumed rewrite
    reads its own earlier edits, so their reasons come from a look at the source)."""
    folder = tmp_path / name
    shutil.copytree(PROJECTS / name, folder)
    paths = sorted(str(p) for p in folder.rglob("*.py"))
    cache = Cache(str(tmp_path / "cache"))

    def outcomes(settings: Settings, cache=None) -> list:
        mode = runner.Mode(write=False, diff=True, cache=cache)
        return [(o.diff, o.diagnostics) for o in runner.run(paths, settings, mode)]

    everything = Settings(root=str(folder), why_not=True, unsafe_fixes=True)
    outcomes(replace(everything, select=("OPT301",)), cache)
    assert outcomes(everything, cache) == outcomes(everything)


def test_a_warm_run_rewrites_nothing_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resumed rewrites and the looks that give their reasons are cached like the others."""
    folder = tmp_path / "trainer_lm"
    shutil.copytree(PROJECTS / "trainer_lm", folder)
    paths = sorted(str(p) for p in folder.rglob("*.py"))
    settings = Settings(root=str(folder), why_not=True)
    mode = runner.Mode(write=False, cache=Cache(str(tmp_path / "cache")))
    cold = runner.run(paths, settings, mode)
    rewrites: List[str] = []
    real = runner.rewrite_source
    monkeypatch.setattr(runner, "rewrite_source", lambda *a: rewrites.append(a[1]) or real(*a))
    warm = runner.run(paths, settings, mode)
    assert rewrites == []
    assert [o.diagnostics for o in warm] == [o.diagnostics for o in cold]

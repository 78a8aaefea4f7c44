"""The results cache: a hit answers exactly as a cold run; anything that could change the answer
misses; damaged entries and parallel writers cannot corrupt a run."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

from conftest import ATTENTION_SCRIPT, FUSED_LINE, ROOT, TRAINING_SCRIPT, run_cli
from optimizer_codemod import cache as cache_module
from optimizer_codemod import runner
from optimizer_codemod.api import SourceRewrite
from optimizer_codemod.cache import Cache, open_cache
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import Diagnostic, Status
from optimizer_codemod.rule import Safety

NOTHING_TO_DO = b"import os\nprint(os.getcwd())\n"


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("OPTCODEMOD_CACHE_DIR", str(folder))
    monkeypatch.delenv("OPTCODEMOD_NO_CACHE", raising=False)
    return folder


@pytest.fixture
def rewrites(monkeypatch: pytest.MonkeyPatch) -> List[str]:
    """The paths the cache did not settle (rewritten, or settled by the pre-filter), in order."""
    calls: List[str] = []
    real = runner.rewrite_source

    def counting(src, path, options, *formatted):
        calls.append(path)
        return real(src, path, options, *formatted)

    monkeypatch.setattr(runner, "rewrite_source", counting)
    return calls


def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_bytes(TRAINING_SCRIPT)
    (folder / "attention.py").write_bytes(ATTENTION_SCRIPT)
    (folder / "clean.py").write_bytes(NOTHING_TO_DO)
    (folder / "empty.py").write_bytes(b"")
    return folder


def outputs(result) -> tuple:
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    "options",
    [
        ["--check"],
        ["--diff"],
        ["--check", "--output-format", "json", "--statistics"],
        ["--check", "--output-format", "sarif", "--unsafe-fixes"],
    ],
    ids=["check", "diff", "json", "sarif"],
)
def test_a_warm_run_prints_and_exits_as_the_cold_run(
    tmp_path: Path, cache_dir: Path, rewrites: List[str], options: List[str]
) -> None:
    folder = project(tmp_path)
    cold = run_cli(["apply", *options, "."], cwd=folder)
    assert cold.exit_code == 1
    everything = ["attention.py", "clean.py", "empty.py", "train.py"]
    assert sorted(rewrites) == everything
    warm = run_cli(["apply", *options, "."], cwd=folder)
    assert outputs(warm) == outputs(cold)
    assert sorted(rewrites) == everything  # nothing looked at again
    uncached = run_cli(["apply", "--no-cache", *options, "."], cwd=folder)
    assert outputs(uncached) == outputs(cold)


def test_a_hit_writes_the_same_files_as_a_cold_run(
    tmp_path: Path, cache_dir: Path, rewrites: List[str]
) -> None:
    cold_folder = project(tmp_path)
    warm_folder = tmp_path / "warm"
    shutil.copytree(cold_folder, warm_folder)
    # The same path under another working directory: the key names the path as given.
    run_cli(["apply", "--check", "."], cwd=warm_folder)
    assert len(rewrites) == 4
    cold = run_cli(["apply", "--no-cache", "."], cwd=cold_folder)
    warm = run_cli(["apply", "."], cwd=warm_folder)
    assert len(rewrites) == 8  # --no-cache looked at all four again; the warm run at none
    assert outputs(warm) == outputs(cold)
    for name in ("train.py", "attention.py", "clean.py", "empty.py"):
        assert (warm_folder / name).read_bytes() == (cold_folder / name).read_bytes()
    assert FUSED_LINE in (warm_folder / "train.py").read_bytes()


def test_a_check_run_keeps_its_rewrites_unformatted_and_apply_lays_them_out(
    tmp_path: Path, cache_dir: Path, rewrites: List[str]
) -> None:
    # `--check` with a text report shows no text, so it skips laying out the changed lines;
    # the `apply` after it uses the kept rewrite and writes what a cold run writes.
    example = (ROOT / "examples" / "train.py").read_bytes()
    checked, cold = tmp_path / "checked", tmp_path / "cold"
    for folder in (checked, cold):
        folder.mkdir()
        (folder / "train.py").write_bytes(example)
    check = run_cli(["apply", "--check", "."], cwd=checked)
    assert check.exit_code == 1 and rewrites == ["train.py"]
    [entry] = [
        p for p in cache_dir.rglob("*") if p.is_file() and b'"formatted": false' in p.read_bytes()
    ]
    applied = run_cli(["apply", "."], cwd=checked)
    assert rewrites == ["train.py"]  # a hit: laid out, not rewritten again
    reference = run_cli(["apply", "--no-cache", "."], cwd=cold)
    assert (checked / "train.py").read_bytes() == (cold / "train.py").read_bytes() != example
    assert outputs(applied) == outputs(reference)
    assert b'"formatted": true' in entry.read_bytes()  # stored laid out for the next one


def test_changed_bytes_settings_or_tool_miss(
    tmp_path: Path, cache_dir: Path, rewrites: List[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = project(tmp_path)
    run_cli(["apply", "--check", "train.py"], cwd=folder)
    run_cli(["apply", "--check", "train.py"], cwd=folder)
    assert len(rewrites) == 1
    only_fused = run_cli(["apply", "--check", "--select", "OPT501", "train.py"], cwd=folder)
    assert len(rewrites) == 2 and "Would fix 1 finding" in only_fused.stdout
    run_cli(["apply", "--check", "--target-torch", "2.0", "train.py"], cwd=folder)
    assert len(rewrites) == 3
    run_cli(["apply", "--check", "--unsafe-fixes", "train.py"], cwd=folder)
    assert len(rewrites) == 4
    (folder / "train.py").write_bytes(TRAINING_SCRIPT + b"print(step)\n")
    run_cli(["apply", "--check", "train.py"], cwd=folder)
    assert len(rewrites) == 5
    (folder / "pyproject.toml").write_text('[tool.optcodemod]\nignore = ["OPT3"]\n')
    run_cli(["apply", "--check", "train.py"], cwd=folder)
    assert len(rewrites) == 6
    monkeypatch.setattr(cache_module, "tool_fingerprint", lambda: "an edited rule")
    run_cli(["apply", "--check", "train.py"], cwd=folder)
    assert len(rewrites) == 7


def test_the_projects_black_configuration_is_part_of_the_key(
    tmp_path: Path, cache_dir: Path, rewrites: List[str]
) -> None:
    folder = project(tmp_path)
    pyproject = folder / "pyproject.toml"
    pyproject.write_text("[tool.black]\nline-length = 100\n")
    run_cli(["apply", "--check", "attention.py"], cwd=folder)
    pyproject.write_text("[tool.black]\nline-length = 60\n")
    # black's style is read once per folder and process; a new run reads it again.
    from optimizer_codemod.formatting import black_style_for_directory

    black_style_for_directory.cache_clear()
    narrow = run_cli(["apply", "--diff", "attention.py"], cwd=folder)
    assert len(rewrites) == 2
    assert all(len(line) <= 61 for line in narrow.stdout.splitlines() if line.startswith("+ "))


def test_a_damaged_entry_is_a_miss_and_is_replaced(
    tmp_path: Path, cache_dir: Path, rewrites: List[str]
) -> None:
    folder = project(tmp_path)
    cold = run_cli(["apply", "--check", "train.py"], cwd=folder)
    [entry] = [p for p in cache_dir.rglob("*") if p.is_file() and p.name != ".gitignore"]
    good = entry.read_bytes()
    for damage in (good[: len(good) // 2], good.replace(b"OPT501", b"OPT999"), b"", b"\x00" * 9):
        entry.write_bytes(damage)
        again = run_cli(["apply", "--check", "train.py"], cwd=folder)
        assert outputs(again) == outputs(cold)
        assert entry.read_bytes() == good
    assert len(rewrites) == 5


def test_no_cache_reads_and_writes_nothing(
    tmp_path: Path, cache_dir: Path, rewrites: List[str]
) -> None:
    folder = project(tmp_path)
    run_cli(["apply", "--check", "--no-cache", "train.py"], cwd=folder)
    run_cli(["apply", "--check", "--no-cache", "train.py"], cwd=folder)
    assert len(rewrites) == 2
    assert not cache_dir.exists()


def test_the_default_folder_sits_beside_the_configuration_and_git_ignores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPTCODEMOD_CACHE_DIR", raising=False)
    monkeypatch.delenv("OPTCODEMOD_NO_CACHE", raising=False)
    folder = project(tmp_path)
    (folder / "pyproject.toml").write_text("[tool.optcodemod]\n")
    (folder / "src").mkdir()
    shutil.move(str(folder / "train.py"), folder / "src" / "train.py")
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "add", "."], check=True)
    status = lambda: subprocess.run(  # noqa: E731
        ["git", "-C", str(folder), "status", "--porcelain", "--ignored=no"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    before = status()
    run_cli(["apply", "--check", "train.py"], cwd=folder / "src")
    assert (folder / ".optcodemod_cache" / ".gitignore").read_text().splitlines()[-1] == "*"
    assert any((folder / ".optcodemod_cache").rglob("*/??/*"))
    assert status() == before


def test_cache_dir_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPTCODEMOD_CACHE_DIR", raising=False)
    folder = project(tmp_path)
    (folder / "pyproject.toml").write_text('[tool.optcodemod]\ncache-dir = "build/opt"\n')
    run_cli(["apply", "--check", "train.py"], cwd=folder)
    assert (folder / "build" / "opt" / ".gitignore").is_file()
    settings = Settings(root=str(folder), cache_dir="build/opt")
    assert open_cache(settings) == Cache(str(folder / "build" / "opt"))
    monkeypatch.setenv("OPTCODEMOD_NO_CACHE", "1")
    assert open_cache(settings) is None


def test_a_notebook_hit_matches_its_cold_run(
    tmp_path: Path, cache_dir: Path, rewrites: List[str]
) -> None:
    cells = [
        {"cell_type": "code", "metadata": {}, "source": ["import torch\n"], "outputs": []},
        {
            "cell_type": "code",
            "metadata": {},
            "source": ["%matplotlib inline\n", TRAINING_SCRIPT.decode()],
            "outputs": [],
        },
    ]
    notebook = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "train.ipynb").write_text(json.dumps(notebook, indent=1))
    cold = run_cli(["apply", "--diff", "train.ipynb"], cwd=tmp_path)
    warm = run_cli(["apply", "--diff", "train.ipynb"], cwd=tmp_path)
    assert cold.exit_code == 1 and "cell 2" in cold.stdout
    assert outputs(warm) == outputs(cold)
    assert len(rewrites) == 1


# Parallel writers --------------------------------------------------------------------------
def _result(index: int) -> SourceRewrite:
    diagnostic = Diagnostic(
        code="OPT501",
        name="optimizer-without-fused-kernel",
        message="m" * (index % 7),
        fix_title="f",
        safety=Safety.NUMERICS,
        status=Status.FIXED,
        line=index,
        column=1,
        end_line=index,
        end_column=2,
        edit_lines=((index, index),),
    )
    # Large enough that a reader could catch a writer halfway if writes were not atomic.
    new = (b"x = %d\n" % index) * 20000
    return SourceRewrite(new, True, [diagnostic], [("t.py", "old", new.decode())])


def _hammer(args) -> int:
    folder, worker = args
    cache = Cache(folder)
    settings = Settings()
    problems = 0
    written = set()
    for round_ in range(40):
        index = (worker + round_) % 4  # every worker writes and reads the same four keys
        cache.put(cache.key(b"src %d" % index, "t.py", settings), _result(index))
        written.add(index)
        for other in range(4):
            found = cache.get(cache.key(b"src %d" % other, "t.py", settings), b"")
            if found is None:
                # Once written, an entry is always whole: a rewrite replaces it at once.
                problems += other in written
            elif found.new != _result(other).new or found.diagnostics != _result(other).diagnostics:
                problems += 1
    return problems


def test_parallel_writers_and_readers_never_see_half_an_entry(tmp_path: Path) -> None:
    folder = str(tmp_path / "cache")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        problems = pool.map(_hammer, [(folder, worker) for worker in range(4)])
    assert problems == [0, 0, 0, 0]
    leftovers = [p for p in Path(folder).rglob(".tmp-*")]
    assert leftovers == []
    cache = Cache(folder)
    for index in range(4):
        found = cache.get(cache.key(b"src %d" % index, "t.py", Settings()), b"")
        assert found is not None and found.diagnostics == _result(index).diagnostics

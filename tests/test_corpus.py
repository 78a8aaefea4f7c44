"""A slice of the corpus run (scripts/corpus_run.py) in the test suite.

The full run covers every file of the installed torch package and takes minutes; this slice
takes the optimizer and module sources plus the smallest torch files that look like training
code (so that rules fire and fixes are checked), in one process, with every rule and unsafe
fixes on.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import List

import pytest

from optimizer_codemod.registry import all_rules

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import corpus_run  # noqa: E402

TRAINING_CODE = re.compile(rb"\.backward\(|DataLoader\(|zero_grad\(|optim\.(?:Adam|AdamW|SGD)\(")
TRAINING_FILES = 20


def _torch_root() -> Path:
    try:
        return corpus_run.torch_root()
    except SystemExit:
        pytest.skip("torch is not installed")


def corpus_slice(root: Path) -> List[Path]:
    """torch/optim, torch/nn/modules and the smallest files with training code; deterministic."""
    chosen = set(corpus_run.python_files(root, ["optim", "nn/modules"]))
    training = [
        path
        for path in corpus_run.python_files(root)
        if path not in chosen and TRAINING_CODE.search(path.read_bytes())
    ]
    training.sort(key=lambda path: (path.stat().st_size, str(path)))
    return sorted(chosen | set(training[:TRAINING_FILES]))


@pytest.fixture(scope="module")
def stats() -> corpus_run.CorpusStats:
    root = _torch_root()
    return corpus_run.run_corpus(corpus_slice(root), root, jobs=1)


def test_slice_is_checked_without_failures(stats: corpus_run.CorpusStats) -> None:
    assert not stats.failed, corpus_run.render(stats)
    assert len(stats.files) >= 60
    assert not stats.of_kind(corpus_run.CRASHED)
    assert not stats.of_kind(corpus_run.RULE_FAILED)
    assert not stats.not_compiling and not stats.not_idempotent and not stats.touched


def test_slice_exercises_fixes(stats: corpus_run.CorpusStats) -> None:
    """Without a changed file the compile and second-run checks would check nothing."""
    assert stats.changed, corpus_run.render(stats)
    assert set(stats.rules) == {rule.code for rule in all_rules()}


def test_report_names_every_outcome_and_rule(stats: corpus_run.CorpusStats) -> None:
    text = corpus_run.render(stats)
    for label in ("parsed and checked", "refused", "crashed", "second run changes output"):
        assert label in text
    for code in stats.rules:
        assert re.search(rf"^{code}\s", text, re.MULTILINE)
    assert text.rstrip().endswith("OK")


def test_pre_filter_loses_no_finding_on_the_slice(stats: corpus_run.CorpusStats) -> None:
    """Triggers must be necessary conditions: a file the pre-filter skips has no finding."""
    root = Path(stats.root)
    paths = [Path(f.path) for f in stats.files]
    filtered = corpus_run.run_corpus(paths, root, jobs=1, prefilter=True)
    full = {f.path: f.counts for f in stats.files}
    lost = {
        os.path.relpath(f.path, root): full[f.path]
        for f in filtered.files
        if f.kind == corpus_run.SKIPPED and full[f.path]
    }
    assert not lost, f"the pre-filter skipped files with findings: {lost}"
    parsed = {f.path: f.counts for f in filtered.files if f.kind == corpus_run.PARSED}
    assert parsed == {path: full[path] for path in parsed}


def test_refused_inputs_are_counted_not_crashes(tmp_path: Path) -> None:
    (tmp_path / "syntax.py").write_bytes(b"import torch\ndef f(:\n")
    data = Path(__file__).parent / "data" / "libcst_drops_comment.py"
    (tmp_path / "unreproducible.py").write_bytes(data.read_bytes())
    (tmp_path / "train.py").write_bytes(
        b"import torch\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
    )
    stats = corpus_run.run_corpus(corpus_run.python_files(tmp_path), tmp_path, jobs=1)
    kinds = {Path(f.path).name: f.kind for f in stats.files}
    assert kinds == {
        "syntax.py": corpus_run.REFUSED,
        "unreproducible.py": corpus_run.REFUSED,
        "train.py": corpus_run.PARSED,
    }
    assert not stats.failed
    assert (tmp_path / "train.py").read_bytes().endswith(b"lr=1e-3)\n")  # never written


def test_pre_filter_skips_files_without_patterns(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_bytes(b"x = 1\n")
    (tmp_path / "train.py").write_bytes(b"import torch\nopt = torch.optim.SGD(p, lr=0.1)\n")
    paths = corpus_run.python_files(tmp_path)
    stats = corpus_run.run_corpus(paths, tmp_path, jobs=1, prefilter=True)
    assert {Path(f.path).name: f.kind for f in stats.files} == {
        "plain.py": corpus_run.SKIPPED,
        "train.py": corpus_run.PARSED,
    }
    assert [Path(f.path).name for f in stats.changed] == ["train.py"]


@pytest.mark.skipif(
    "fork" not in __import__("multiprocessing").get_all_start_methods(), reason="needs fork"
)
def test_a_dying_worker_is_a_crash_of_its_file_not_of_the_run(tmp_path: Path, monkeypatch) -> None:
    for name in ("a.py", "b.py", "dies.py", "c.py"):
        (tmp_path / name).write_bytes(b"x = 1\n")
    real_check_file = corpus_run.check_file

    def check_file(path, options, prefilter):
        if path.endswith("dies.py"):
            os._exit(3)  # what a segfault in native code looks like to the pool
        return real_check_file(path, options, prefilter)

    # Workers are forked, so they see the patched module.
    monkeypatch.setattr(corpus_run, "check_file", check_file)
    stats = corpus_run.run_corpus(corpus_run.python_files(tmp_path), tmp_path, jobs=2)
    kinds = {Path(f.path).name: f.kind for f in stats.files}
    assert kinds == {
        "a.py": corpus_run.PARSED,
        "b.py": corpus_run.PARSED,
        "c.py": corpus_run.PARSED,
        "dies.py": corpus_run.CRASHED,
    }
    assert stats.failed
    assert "worker process died" in corpus_run.render(stats)

"""exclude-tests: test suites are left alone (their edits buy no training time and can break
assertions on exact values), while an evaluation script named `test_*.py` is still read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pytest

from conftest import TRAINING_SCRIPT, run_cli

PYTEST_MODULE = TRAINING_SCRIPT + b"\n\ndef test_training_runs():\n    assert True\n"
PYTEST_CLASS = (
    TRAINING_SCRIPT + b"\n\nclass TestTraining:\n    def test_runs(self):\n        pass\n"
)
UNITTEST_MODULE = (
    b"import unittest\n" + TRAINING_SCRIPT + b"\n\nclass Checks(unittest.TestCase):\n"
    b"    def test_runs(self):\n        pass\n"
)
# Research repositories name their evaluation script test.py or test_<model>.py.
EVALUATION_SCRIPT = TRAINING_SCRIPT + b"\n\ndef evaluate():\n    pass\n"

FILES = {
    "train.py": TRAINING_SCRIPT,
    "test_model.py": PYTEST_MODULE,
    "checks_test.py": PYTEST_CLASS,
    "sanity.py": UNITTEST_MODULE,
    "test_controlnet.py": EVALUATION_SCRIPT,
    "test.py": EVALUATION_SCRIPT,
    "conftest.py": TRAINING_SCRIPT,
    "tests/train_tiny.py": TRAINING_SCRIPT,
}
REWRITTEN_WITH_TESTS_LEFT_ALONE = ["test.py", "test_controlnet.py", "train.py"]


def _folder(tmp_path: Path) -> Path:
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(text)
    return tmp_path


def _changed(tmp_path: Path, *args: str) -> List[str]:
    command = ["apply", "--check", "--select", "OPT501", "--output-format", "json", *args]
    return sorted(json.loads(run_cli(command, cwd=tmp_path).stdout)["changed_files"])


def test_a_walked_folder_leaves_test_suites_alone(tmp_path: Path) -> None:
    assert _changed(_folder(tmp_path), ".") == REWRITTEN_WITH_TESTS_LEFT_ALONE


def test_exclude_tests_false_rewrites_them_too(tmp_path: Path) -> None:
    changed = _changed(_folder(tmp_path), "--config", "exclude-tests = false", ".")
    assert changed == sorted(FILES)


@pytest.mark.parametrize("name", ["test_model.py", "checks_test.py", "sanity.py"])
def test_a_test_module_named_on_the_command_line_is_left_alone(tmp_path: Path, name: str) -> None:
    _folder(tmp_path)
    assert _changed(tmp_path, name, "train.py") == ["train.py"]
    result = run_cli(["apply", "-v", "--select", "OPT501", name], cwd=tmp_path)
    assert f"skipped {name}: a test module (exclude-tests)" in result.output
    assert (tmp_path / name).read_bytes() == FILES[name]


def test_force_exclude_leaves_a_named_file_of_a_tests_folder_alone(tmp_path: Path) -> None:
    _folder(tmp_path)
    assert _changed(tmp_path, "tests/train_tiny.py") == ["tests/train_tiny.py"]
    assert _changed(tmp_path, "--force-exclude", "tests/train_tiny.py", "conftest.py") == []
    result = run_cli(["apply", "-v", "--force-exclude", "conftest.py"], cwd=tmp_path)
    assert "force-exclude: pytest's conftest.py (exclude-tests)" in result.output

"""Without `target-torch`, the torch a project's pyproject.toml requires sets the target."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import FUSED_LINE, TRAINING_SCRIPT, run_cli
from optimizer_codemod.config import find_config, load_settings, resolve_settings
from optimizer_codemod.declared_torch import _pep508_floor, _poetry_floor
from optimizer_codemod.torch_version import DEFAULT_TARGET, TorchVersion

ONLY_FUSED = ["--select", "OPT501"]  # fused=True needs torch 2.4 (CPU parameters)


def script_in(tmp_path: Path, pyproject: str) -> Path:
    (tmp_path / "pyproject.toml").write_text(pyproject)
    source = tmp_path / "pkg" / "train.py"
    source.parent.mkdir()
    source.write_bytes(TRAINING_SCRIPT)
    return source


@pytest.mark.parametrize(
    "requirement, floor",
    [
        ("torch>=2.0", (2, 0)),
        ("torch >= 2.0.1", (2, 0, 1)),
        ("torch>=2", (2, 0)),
        ("torch==1.10.*", (1, 10)),
        ("torch~=2.2.1", (2, 2, 1)),
        ("torch>1.13", (1, 13)),
        ("torch>=2.1.0dev", (2, 1)),
        ("torch>=2.0.1+cu118", (2, 0, 1)),
        ("Torch[opt] (>=1.13, <3); python_version > '3.8'", (1, 13)),
        ("torch!=2.0.1,>=1.13", (1, 13)),
        ("torch>=1.13,>=2.1", (2, 1)),  # both hold: the higher bound is the floor
        ("torch", None),
        ("torch<2", None),
        ("torch @ https://example.org/torch.whl", None),
        ("torchvision>=0.15", None),
        ("pytorch-lightning>=2.0", None),
    ],
)
def test_floor_of_a_pep508_requirement(requirement: str, floor) -> None:
    expected = TorchVersion(*floor) if floor else None
    assert _pep508_floor(requirement) == expected


@pytest.mark.parametrize(
    "constraint, floor",
    [
        (">=1.3", (1, 3)),
        ("^1.10", (1, 10)),
        ("~1.10", (1, 10)),
        ("1.10.1", (1, 10, 1)),
        (">=1.10.1, < 1.13.0", (1, 10, 1)),
        ("^1.9 || ^2.0", (1, 9)),  # alternatives: the lowest
        ("^2", (2, 0)),
        ("*", None),
        ("^2.0 || *", None),
        ("<2.0", None),
    ],
)
def test_floor_of_a_poetry_constraint(constraint: str, floor) -> None:
    expected = TorchVersion(*floor) if floor else None
    assert _poetry_floor(constraint) == expected


def test_a_project_that_supports_torch_2_0_gets_no_fused_optimizer(tmp_path: Path) -> None:
    source = script_in(tmp_path, "[project]\nname = 'x'\ndependencies = ['numpy', 'torch>=2.0']\n")
    result = run_cli(["apply", "-v", str(source), *ONLY_FUSED])
    assert result.exit_code == 0, result.output
    assert source.read_bytes() == TRAINING_SCRIPT
    where = f"{tmp_path / 'pyproject.toml'} [project] dependencies"
    assert f"settings: target-torch 2.0, the floor of 'torch>=2.0' in {where}" in result.stderr
    # The user's own setting wins: on the command line, inline, or in the table.
    result = run_cli(["apply", "--check", str(source), *ONLY_FUSED, "--target-torch", "2.4"])
    assert result.exit_code == 1 and "OPT501" in result.stdout
    inline = ["--config", "target-torch = '2.4'"]
    result = run_cli(["apply", "--check", "-v", str(source), *ONLY_FUSED, *inline])
    assert result.exit_code == 1 and "the floor of" not in result.stderr


def test_the_table_s_target_torch_wins_over_the_requirement(tmp_path: Path) -> None:
    source = script_in(
        tmp_path,
        "[project]\nname = 'x'\ndependencies = ['torch>=2.0']\n\n"
        "[tool.optcodemod]\ntarget-torch = '2.4'\n",
    )
    settings = load_settings(find_config(str(source)), start=str(source))
    assert settings.target_torch == TorchVersion(2, 4) and settings.target_torch_from is None
    assert run_cli(["apply", str(source), *ONLY_FUSED]).exit_code == 1
    assert FUSED_LINE in source.read_bytes()


def test_the_configuration_file_s_own_requirement_is_read(tmp_path: Path) -> None:
    source = script_in(
        tmp_path,
        "[project]\nname = 'x'\ndependencies = ['torch>=2.6']\n\n"
        "[tool.optcodemod]\nselect = ['OPT5']\n",
    )
    settings = resolve_settings((), str(source.parent))
    assert settings.target_torch == TorchVersion(2, 6)  # newer than the default: allowed too
    assert "'torch>=2.6'" in settings.target_torch_from


def test_poetry_dependencies_are_read(tmp_path: Path) -> None:
    source = script_in(
        tmp_path,
        "[tool.poetry.dependencies]\npython = '^3.9'\ntorch = {version = '>=1.10.1, <1.13.0'}\n",
    )
    settings = resolve_settings((), str(source))
    assert settings.target_torch == TorchVersion(1, 10, 1)
    assert "[tool.poetry.dependencies]" in settings.target_torch_from


@pytest.mark.parametrize(
    "pyproject",
    [
        "[project]\nname = 'x'\ndependencies = ['torch']\n",  # no floor
        "[project]\nname = 'x'\noptional-dependencies = {gpu = ['torch>=2.0']}\n",
        "[project]\nname = 'x'\n",
    ],
)
def test_no_declared_floor_keeps_the_default(tmp_path: Path, pyproject: str) -> None:
    source = script_in(tmp_path, pyproject)
    (tmp_path / "requirements.txt").write_text("torch==1.4.0\n")  # a reproduction pin
    settings = resolve_settings((), str(source))
    assert settings.target_torch == DEFAULT_TARGET and settings.target_torch_from is None
    assert run_cli(["apply", str(source), *ONLY_FUSED]).exit_code == 1
    assert FUSED_LINE in source.read_bytes()


def test_an_unreadable_pyproject_is_named(tmp_path: Path) -> None:
    source = script_in(tmp_path, "[project\n")
    result = run_cli(["apply", str(source)])
    assert result.exit_code == 2
    assert "pyproject.toml" in result.stderr and "cannot read" in result.stderr
    assert source.read_bytes() == TRAINING_SCRIPT

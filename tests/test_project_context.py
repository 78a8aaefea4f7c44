"""A file rewritten alone (pre-commit, an editor, `apply train.py`) is told what the local
modules it imports define and decide (analysis/project_context.py), as in a run of the
whole folder, and is never told anything by them as callers."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path
from typing import Dict

import pytest

from conftest import messages_by_code
from optimizer_codemod import runner
from optimizer_codemod.analysis import project_context
from optimizer_codemod.analysis.project import project_facts
from optimizer_codemod.analysis.project_context import context_modules
from optimizer_codemod.cache import Cache
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import FileOutcome, Status

PROJECTS = Path(__file__).resolve().parent.parent / "fixtures" / "projects"


def alone(path: Path, cache=None, **settings) -> FileOutcome:
    options = dict(unsafe_fixes=True, root=str(path.parent), why_not=True)
    options.update(settings)
    [outcome] = runner.run([str(path)], Settings(**options), runner.Mode(write=False, cache=cache))
    return outcome


def write(folder: Path, files: Dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(textwrap.dedent(text))


# What a lone file is told ------------------------------------------------------------------------
def test_a_lone_trainer_gets_no_bucket_views_where_its_helper_touches_grad(tmp_path: Path) -> None:
    """guided-diffusion's train_util.py given alone: fp16_util.py's `param.grad.detach_()`
    raises on a bucket view, so OPT605 reports instead of fixing."""
    folder = tmp_path / "run"
    shutil.copytree(PROJECTS / "ddp_grad_reset_elsewhere", folder)
    outcome = alone(folder / "trainer.py")
    assert "OPT605" not in messages_by_code(outcome, Status.FIXED)
    [report] = messages_by_code(outcome, Status.REPORTED)["OPT605"]
    assert (
        "but mixed_precision.py, which this module imports, uses `.grad` in a way a view into "
        "a bucket breaks" in report
    )
    helper = folder / "mixed_precision.py"
    helper.write_text(helper.read_text().replace("param.grad.detach_()", "pass"))
    assert "OPT605" in messages_by_code(alone(folder / "trainer.py"), Status.FIXED)


@pytest.mark.parametrize("marker", [".git", "setup.py", "pyproject.toml"])
def test_a_script_of_an_installed_project_reads_its_package_from_the_checkout_root(
    tmp_path: Path, marker: str
) -> None:
    """guided-diffusion's scripts/classifier_train.py given alone (`apply
    scripts/classifier_train.py`): it imports `guided_diffusion.fp16_util`, which lies at the
    repository root, not beside the script; Python finds it once the project is installed.
    Without the root, OPT605 added `gradient_as_bucket_view=True` and `detach_()` raised."""
    source = PROJECTS / "ddp_grad_reset_elsewhere"
    write(tmp_path, {"pkg/__init__.py": ""})
    shutil.copy(source / "mixed_precision.py", tmp_path / "pkg" / "mixed_precision.py")
    trainer = (source / "trainer.py").read_text()
    trainer = trainer.replace("from mixed_precision import", "from pkg.mixed_precision import")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text(trainer)
    assert "OPT605" in messages_by_code(alone(tmp_path / "scripts" / "train.py"), Status.FIXED)
    if marker == ".git":
        (tmp_path / marker).mkdir()
    else:
        (tmp_path / marker).write_text("")
    outcome = alone(tmp_path / "scripts" / "train.py")
    assert "OPT605" not in messages_by_code(outcome, Status.FIXED)
    [report] = messages_by_code(outcome, Status.REPORTED)["OPT605"]
    assert "pkg/mixed_precision.py, which this module imports" in report


def test_a_lone_script_keeps_the_precision_its_seeding_helper_asks_for(tmp_path: Path) -> None:
    """PyTorch-YOLOv3's train.py given alone: utils.py sets `cudnn.deterministic = True`."""
    folder = tmp_path / "run"
    shutil.copytree(PROJECTS / "seeded_helper", folder)
    outcome = alone(folder / "train.py")
    assert "OPT301" not in messages_by_code(outcome, Status.FIXED)
    [reason] = messages_by_code(outcome, Status.DECLINED)["OPT301"]
    assert reason.startswith("seeding.py, which this script imports, already asks for reprod")


def test_a_lone_driver_gets_the_settings_for_the_loop_it_runs(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    shutil.copytree(PROJECTS / "trainer_lm", folder)
    [tf32] = messages_by_code(alone(folder / "train.py"), Status.FIXED)["OPT301"]
    assert "the loop in trainer.py" in tf32


def test_a_warm_run_sees_a_changed_context_module(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    shutil.copytree(PROJECTS / "ddp_grad_reset_elsewhere", folder)
    cache = Cache(str(tmp_path / "cache"))
    assert "OPT605" in messages_by_code(alone(folder / "trainer.py", cache), Status.REPORTED)
    helper = folder / "mixed_precision.py"
    helper.write_text(helper.read_text().replace(".grad", ".data"))
    assert "OPT605" in messages_by_code(alone(folder / "trainer.py", cache), Status.FIXED)


def test_a_context_module_is_never_a_caller_of_the_run(tmp_path: Path) -> None:
    """Its calls into a file of the run stand beside callers the run does not show."""
    write(
        tmp_path,
        {
            "train.py": """\
            import helpers


            def train(model, loader):
                for x in loader:
                    model(x).sum().backward()
            """,
            "helpers.py": """\
            import torch
            import train


            def demo():
                ds = torch.utils.data.TensorDataset(torch.zeros(4, 1))
                train.train(torch.nn.Linear(1, 1), torch.utils.data.DataLoader(ds))
            """,
        },
    )
    both = [str(tmp_path / "train.py"), str(tmp_path / "helpers.py")]
    assert project_facts(both)[both[0]].calls  # in the run, helpers.py is a caller
    lone = project_facts(both[:1], context=context_modules(both[:1]))
    assert context_modules(both[:1]) == [both[1]]
    assert not lone.get(both[0]) or not lone[both[0]].calls
    assert both[1] not in lone  # nothing is said about a context module


# Which modules are read --------------------------------------------------------------------------
def test_imports_are_followed_as_python_finds_them(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "train.py": """\
            import os, numpy as np
            import pkg.sub.deep as deep
            from pkg import (
                alpha,
                beta as b,
            )
            from local import thing  # a module beside the script
            from missing import nothing

            def f():
                import late
            """,
            "pkg/__init__.py": "",
            "pkg/alpha.py": "from .sub import gamma\n",
            "pkg/beta.py": "",
            "pkg/unused.py": "",
            "pkg/sub/__init__.py": "",
            "pkg/sub/deep.py": "",
            "pkg/sub/gamma.py": "from .. import beta\nfrom ..sub.deep import x\n",
            "local.py": "import chained\n",
            "chained.py": "",
            "late.py": "",
            "unrelated.py": "",
        },
    )
    found = [
        Path(p).relative_to(tmp_path).as_posix()
        for p in context_modules([str(tmp_path / "train.py")])
    ]
    assert found == [
        "chained.py",
        "late.py",
        "local.py",
        "pkg/__init__.py",
        "pkg/alpha.py",
        "pkg/beta.py",
        "pkg/sub/__init__.py",
        "pkg/sub/deep.py",
        "pkg/sub/gamma.py",
    ]


def test_a_package_under_the_checkouts_src_is_found(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "pyproject.toml": "",
            "scripts/train.py": "from proj.loops import fit\nimport absent\n",
            "src/proj/__init__.py": "",
            "src/proj/loops.py": "",
        },
    )
    found = context_modules([str(tmp_path / "scripts" / "train.py")])
    assert [Path(p).relative_to(tmp_path).as_posix() for p in found] == [
        "src/proj/__init__.py",
        "src/proj/loops.py",
    ]


def test_a_script_that_imports_nothing_local_reads_no_other_file(tmp_path: Path) -> None:
    write(tmp_path, {"train.py": "import torch\nfrom torch import nn\n", "other.py": ""})
    assert context_modules([str(tmp_path / "train.py")]) == []
    assert runner._project_index([str(tmp_path / "train.py")], None) == {}


def test_the_context_is_bounded_nearest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, {f"m{i}.py": f"import m{i + 1}\n" + "#" * 89 + "\n" for i in range(20)})
    monkeypatch.setattr(project_context, "MAX_CONTEXT_FILES", 5)
    found = context_modules([str(tmp_path / "m0.py")])
    assert found == [str(tmp_path / f"m{i}.py") for i in range(1, 6)]
    monkeypatch.setattr(project_context, "MAX_CONTEXT_FILES", 256)
    monkeypatch.setattr(project_context, "MAX_CONTEXT_BYTES", 350)  # 100 bytes a module
    assert context_modules([str(tmp_path / "m0.py")]) == found[:3]


def test_finding_the_context_grows_linearly(tmp_path: Path) -> None:
    """A chain of modules, each importing the next and a few missing ones: the lines of the
    finder run grow with the files, not with their square."""

    def lines(count: int) -> int:
        folder = tmp_path / f"n{count}"
        write(
            folder,
            {
                f"m{i}.py": f"import torch, numpy\nfrom m{i + 1} import x\nfrom . import nothing\n"
                for i in range(count)
            },
        )
        executed = 0

        def local(frame, event, arg):
            nonlocal executed
            executed += event == "line"
            return local

        sys.settrace(lambda frame, event, arg: local)
        try:
            found = context_modules([str(folder / "m0.py")])
        finally:
            sys.settrace(None)
        assert len(found) == count - 1
        return executed

    small, large = lines(20), lines(80)
    assert large <= 4 * 1.1 * small, (small, large)

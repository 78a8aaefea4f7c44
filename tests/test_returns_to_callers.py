"""OPT403 follows what a `@torch.no_grad()` function returns to every caller of the run: the
decorator becomes `@torch.inference_mode()` only where each caller only reads the result."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Dict

from optimizer_codemod import rewrite, runner
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import Status

PROJECT = Path(__file__).resolve().parent.parent / "fixtures" / "projects" / "evaluate_elsewhere"


def _apply(folder: Path) -> Dict[str, list]:
    files = sorted(str(p) for p in folder.rglob("*.py"))
    settings = Settings(unsafe_fixes=True, root=str(folder), select=["OPT403"], why_not=True)
    outcomes = runner.run(files, settings, runner.Mode(write=True), jobs=1)
    return {Path(o.path).name: o.diagnostics for o in outcomes}


def _project(tmp_path: Path, main: str) -> Path:
    folder = tmp_path / "project"
    shutil.copytree(PROJECT, folder)
    (folder / "main.py").write_text(textwrap.dedent(main))
    return folder


def _declined(diagnostics) -> str:
    return " ".join(d.message for d in diagnostics if d.status is Status.DECLINED)


def test_a_caller_in_another_module_that_only_reads_the_result_lets_it_convert(
    tmp_path: Path,
) -> None:
    folder = _project(tmp_path, (PROJECT / "main.py").read_text())
    _apply(folder)
    assert "@torch.inference_mode()\ndef evaluate" in (folder / "engine.py").read_text()


def test_a_caller_in_another_module_that_trains_on_the_result_keeps_no_grad(
    tmp_path: Path,
) -> None:
    folder = _project(
        tmp_path,
        """\
        import torch
        from engine import evaluate, train_one_epoch

        data = [(torch.randn(16, 8), torch.randint(0, 3, (16,)))]
        model = torch.nn.Linear(8, 3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        train_one_epoch(model, data, optimizer)
        stats = evaluate(model, data)
        penalty = torch.nn.functional.mse_loss(model.weight.sum(), stats["acc1"])
        penalty.backward()
        """,
    )
    diagnostics = _apply(folder)
    assert "@torch.no_grad()" in (folder / "engine.py").read_text()
    reason = _declined(diagnostics["engine.py"])
    assert "main.py keeps the result" in reason
    assert "mse_loss" in reason


def test_a_caller_in_another_module_that_stores_the_result_keeps_no_grad(tmp_path: Path) -> None:
    folder = _project(
        tmp_path,
        """\
        import torch
        from engine import evaluate


        class Runner:
            def check(self, model, data):
                self.stats = evaluate(model, data)


        if __name__ == "__main__":
            Runner().check(torch.nn.Linear(8, 3), [])
        """,
    )
    diagnostics = _apply(folder)
    assert "@torch.no_grad()" in (folder / "engine.py").read_text()
    assert "`self.stats = evaluate(model, data)` stores it" in _declined(diagnostics["engine.py"])


def test_a_function_passed_around_by_another_module_is_not_followed(tmp_path: Path) -> None:
    folder = _project(
        tmp_path,
        """\
        import torch
        from engine import evaluate

        hooks = {"eval": evaluate}
        print(hooks["eval"](torch.nn.Linear(8, 3), []))
        """,
    )
    diagnostics = _apply(folder)
    assert "@torch.no_grad()" in (folder / "engine.py").read_text()
    assert "main.py passes it around or stores it" in _declined(diagnostics["engine.py"])


def test_a_module_no_script_of_the_run_imports_says_its_callers_are_not_followed(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "alone"
    folder.mkdir()
    shutil.copy(PROJECT / "engine.py", folder / "engine.py")
    diagnostics = _apply(folder)
    assert "@torch.no_grad()" in (folder / "engine.py").read_text()
    assert "no module of the run imports it" in _declined(diagnostics["engine.py"])


def _only_decline(source: str) -> str:
    """The one reason OPT403 gives for leaving `source` unchanged."""
    result = rewrite(source, path="train.py", select=["OPT403"], why_not=True)
    assert not result.changed
    (reason,) = [d.message for d in result.diagnostics if d.status is Status.DECLINED]
    return reason


GETTER_GENERATE = '''import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.block_size = 4
        self.head = nn.Linear(1, 5)

    def get_block_size(self):
        """The longest context."""
        return self.block_size

    def forward(self, idx):
        return self.head(idx[..., None].float())


@torch.no_grad()
def generate(model, idx, steps):
    for _ in range(steps):
        block = idx[:, -model.get_block_size():]
        idx = torch.cat((idx, model(block)[:, -1].argmax(-1, keepdim=True)), dim=1)
    return idx


model = TinyLM()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.zeros(2, 3, dtype=torch.long)).sum()
    loss.backward()
    optimizer.step()
print(generate(model, torch.zeros(1, 1, dtype=torch.long), 5)[0].tolist())
'''


def test_a_getter_of_the_trained_class_reads_the_model() -> None:
    result = rewrite(GETTER_GENERATE, path="train.py", select=["OPT403"])
    assert "@torch.inference_mode()\ndef generate" in result.source


def test_a_method_of_the_trained_class_that_does_more_than_return_is_not_a_read() -> None:
    source = GETTER_GENERATE.replace(
        "        return self.block_size", "        self.cache = {}\n        return self.block_size"
    )
    reason = _only_decline(source)
    assert "`model.get_block_size()` may change a module that the script trains" in reason


def test_a_long_chain_of_names_declines_instead_of_overflowing_the_stack() -> None:
    chain = "\n".join(f"a{i} = a{i - 1}" for i in range(1, 2000))
    source = GETTER_GENERATE.replace("print(generate(", "a0 = (generate(")
    source = source.replace("[0].tolist())", "[0])") + chain + "\n"
    source += "print(a1999.tolist())\n"
    reason = _only_decline(source)
    assert "it passes through more than 40 names" in reason


def test_max_imported_from_torch_is_not_the_builtin_that_picks_an_argument() -> None:
    source = GETTER_GENERATE.replace("import torch\n", "import torch\nfrom torch import max\n")
    source += "print(max(model.head.weight, generate(model, torch.zeros(1, 1).long(), 2)))\n"
    reason = _only_decline(source)
    assert "`max(model.head.weight, " in reason and "takes it" in reason


def test_a_method_of_the_result_whose_value_is_used_is_not_taken_for_a_container_update() -> None:
    source = GETTER_GENERATE + "tokens = generate(model, torch.zeros(1, 1).long(), 2)\n"
    source += "loss = tokens.add(model.head.weight.sum()).float().mean()\n"
    reason = _only_decline(source)
    assert (
        "`tokens.add(model.head.weight.sum())` computes with it and a value that may require grad"
        in reason
    )


def test_a_getter_that_reads_a_property_of_the_class_is_not_taken_for_a_read() -> None:
    source = GETTER_GENERATE.replace("        self.block_size = 4\n", "").replace(
        "    def get_block_size(self):",
        "    @property\n    def block_size(self):\n        self.calls = 1\n        return 4\n\n"
        "    def get_block_size(self):",
    )
    reason = _only_decline(source)
    assert "`model.get_block_size()` may change a module that the script trains" in reason


METHOD = (
    Path(__file__).resolve().parent.parent
    / "fixtures"
    / "OPT403"
    / "fix_generate_method_of_the_trained_class.py"
).read_text()


def test_a_method_called_on_a_receiver_not_followed_to_its_class_keeps_no_grad() -> None:
    source = (
        METHOD + "\n\ndef sample(m):\n    return m.generate(torch.zeros(1, 1).long(), 2).tolist()\n"
    )
    reason = _only_decline(source)
    assert "it is a method of `TinyGPT`, and the receiver of `m.generate(" in reason
    assert "is not followed to an instance of it" in reason


def test_a_method_taken_as_a_bound_method_keeps_no_grad() -> None:
    reason = _only_decline(METHOD + "    sampler = model.generate\n")
    assert "this file uses `.generate` otherwise than by calling it" in reason


def test_a_method_of_a_module_other_files_import_is_not_followed(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "model.py").write_text(METHOD)
    (folder / "train.py").write_text(
        "import torch\nfrom model import TinyGPT\n\nmodel = TinyGPT()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model(torch.zeros(1, 2).long()).sum().backward()\n"
        "print(model.generate(torch.zeros(1, 1).long(), 2).tolist())\n"
    )
    diagnostics = _apply(folder)
    assert "@torch.no_grad()" in (folder / "model.py").read_text()
    reason = _declined(diagnostics["model.py"])
    assert "it is a method of `TinyGPT`, and this module is imported by train.py" in reason

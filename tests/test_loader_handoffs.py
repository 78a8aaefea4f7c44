"""OPT103 for a loader that `main()` builds and hands, once per epoch, to a function that loops
over it: in the same file, in another module of the run (DETR's `train_one_epoch` from
engine.py, looping through `MetricLogger.log_every` from util/misc.py), or outside the run
(declined, naming the function). The fixtures under fixtures/OPT103 hold the one-file shapes.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path
from typing import Dict

import libcst as cst
from test_scaling import assert_linear_work, counted

from optimizer_codemod import runner
from optimizer_codemod.analysis import ScriptFacts
from optimizer_codemod.analysis.loaders import handoffs_of, iterated_repeatedly
from optimizer_codemod.analysis.project import from_json, project_facts, to_json
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import FileOutcome, Status

LOGGER = """\
class MetricLogger:
    def __init__(self, delimiter="\\t"):
        self.delimiter = delimiter

    def log_every(self, iterable, print_freq, header=None):
        for i, obj in enumerate(iterable):
            if i % print_freq == 0:
                print(header, i)
            yield obj
"""
ENGINE = """\
import torch.nn.functional as F

import util.misc as utils


def train_one_epoch(model, data_loader, optimizer, epoch):
    metric_logger = utils.MetricLogger(delimiter="  ")
{extra}    for samples, targets in metric_logger.log_every(data_loader, 10, "Epoch"):
        loss = F.cross_entropy(model(samples), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""
MAIN = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from engine import train_one_epoch


def main(num_workers=2, epochs=2):
    dataset = TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
    data_loader_train = DataLoader(dataset, batch_size=16, num_workers=num_workers)
    model = nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        train_one_epoch(model, data_loader_train, optimizer, epoch)


if __name__ == "__main__":
    main()
"""


def _project(folder: Path, extra: str = "") -> Dict[str, FileOutcome]:
    (folder / "util").mkdir(parents=True)
    (folder / "util" / "misc.py").write_text(LOGGER)
    (folder / "engine.py").write_text(ENGINE.format(extra=extra))
    (folder / "main.py").write_text(MAIN)
    settings = Settings(select=("OPT103",), unsafe_fixes=True, why_not=True, root=str(folder))
    files = sorted(str(p) for p in folder.rglob("*.py"))
    outcomes = runner.run(files, settings, runner.Mode(write=True, diff=False, cache=None), jobs=1)
    return {Path(o.path).relative_to(folder).as_posix(): o for o in outcomes}


def test_a_loader_looped_over_in_another_module_gets_persistent_workers(tmp_path: Path) -> None:
    outcomes = _project(tmp_path)
    fixed = [d for d in outcomes["main.py"].diagnostics if d.status is Status.FIXED]
    assert [d.code for d in fixed] == ["OPT103"]
    assert "persistent_workers=num_workers > 0" in (tmp_path / "main.py").read_text()
    assert (tmp_path / "engine.py").read_text() == ENGINE.format(extra="")


def test_the_sampler_may_change_in_the_other_module_but_not_the_dataset(tmp_path: Path) -> None:
    sampler = _project(tmp_path / "sampler", "    data_loader.sampler.set_epoch(epoch)\n")
    assert any(d.status is Status.FIXED for d in sampler["main.py"].diagnostics)
    dataset = _project(tmp_path / "dataset", "    data_loader.dataset.set_epoch(epoch)\n")
    declined = [d for d in dataset["main.py"].diagnostics if d.code == "OPT103"]
    assert [d.status for d in declined] == [Status.DECLINED]
    assert "the dataset is changed after it is built" in declined[0].message
    assert "persistent_workers" not in (tmp_path / "dataset" / "main.py").read_text()


def test_the_index_summary_survives_the_cache(tmp_path: Path) -> None:
    _project(tmp_path)
    paths = [str(p) for p in sorted(tmp_path.rglob("*.py"))]
    index = project_facts(paths)
    main = next(own for path, own in index.items() if path.endswith("main.py"))
    summary = dict(main.looping_functions)["train_one_epoch"]
    assert summary.iterated == ("data_loader",) and summary.parameters[1] == "data_loader"
    assert from_json(to_json(index)) == index


def test_a_function_outside_the_run_is_named_in_the_decline() -> None:
    src = MAIN.replace("from engine import", "from timm.engine import")
    facts = ScriptFacts.of(cst.parse_module(src))
    site = facts.dataloader_constructions()[0]
    assert not iterated_repeatedly(facts, site)
    reason = handoffs_of(facts, site).unknown
    assert reason is not None and "`train_one_epoch`" in reason and "not in the files" in reason


def test_a_callee_looping_over_its_parameter_in_its_own_loop_needs_no_epoch_loop() -> None:
    src = textwrap.dedent("""\
        from torch.utils.data import DataLoader

        def fit(loader, epochs):
            for epoch in range(epochs):
                for batch in loader:
                    print(batch)

        def main(data):
            loader = DataLoader(data, num_workers=2)
            fit(loader, 3)
        """)
    facts = ScriptFacts.of(cst.parse_module(src))
    site = facts.dataloader_constructions()[0]
    assert handoffs_of(facts, site).repeated and iterated_repeatedly(facts, site)


def _handed_loaders(count: int) -> str:
    """`count` loaders built in `main()`, each handed once per epoch to its own function,
    which loops over it through a logging generator of the file."""
    parts = [LOGGER, "\n\nfrom torch.utils.data import DataLoader\n"]
    for index in range(count):
        parts.append(f"""

def run_{index}(model, loader_{index}, epoch):
    logger = MetricLogger()
    loader_{index}.sampler.set_epoch(epoch)
    for x in enumerate(logger.log_every(loader_{index}, 10)):
        model(x)
""")
    parts.append("\n\ndef main(model, data):\n")
    parts.extend(f"    loader_{i} = DataLoader(data, num_workers=2)\n" for i in range(count))
    parts.append("    for epoch in range(3):\n")
    parts.extend(f"        run_{i}(model, loader_{i}, epoch)\n" for i in range(count))
    return "".join(parts)


def test_following_loaders_into_functions_costs_linear_work() -> None:
    def work(count: int) -> Counter:
        facts = ScriptFacts.of(cst.parse_module(_handed_loaders(count)))
        sites = facts.dataloader_constructions()
        counts, repeated = counted(lambda: [handoffs_of(facts, s).repeated for s in sites])
        assert len(repeated) == count and all(repeated)
        return counts

    assert_linear_work(work, 10)

"""Issue 16's rules in issue 15's shapes: each rule's simplest positive case, written as a flat
script, as a loop in a function called from `main()`, as a `Trainer` class (`self.model`,
`self.loader`, ...), and as that class across three modules (model.py, trainer.py, train.py)
run through the engine's project mode. Each shape must get what the flat script gets (the
same fix, or the same report) in the module that holds the site, or, where the analysis
cannot follow the shape, say why at that site (the ids of those cases say `known-limit`).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from optimizer_codemod import runner
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import Diagnostic, FileOutcome, Status

# The templates -----------------------------------------------------------------------------
NET = """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))
"""
IMPORTS = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
DATA_IMPORTS = "from torch.utils.data import DataLoader, TensorDataset\n"
DATASET = "ds = TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))"
# {before}, {pre}, {update}, {step} and {after} are the rule's slots; the other names are the
# shape's: `model` or `self.model`, and so on.
SETUP = """\
{device} = "cuda" if torch.cuda.is_available() else "cpu"
{model} = {built}.to({device})
{wrap}
{optimizer} = torch.optim.SGD({model}.parameters(), lr=0.1)
{loader} = DataLoader({dataset}, batch_size=16, shuffle=True)
"""
LOOP = """\
{before}
for step, (x, y) in enumerate({loader}):
    x, y = x.to({device}), y.to({device})
    {pre}
    out = {model}(x)
    loss = F.cross_entropy(out, y)
    {optimizer}.zero_grad()
    loss.backward()
    {update}
    {step}
{after}
"""
FUNCTION = """\
def train(model, loader, optimizer, device):
{loop}

def main():
    {dataset_line}
{setup}
    {caller}train(model, loader, optimizer, device)


if __name__ == "__main__":
    main()
"""
TRAINER = """\
class Trainer:
    def __init__(self, model, dataset):
{setup}
    def run(self):
{loop}"""
DRIVER = """\
def main():
    {dataset_line}
    {caller}Trainer(Net(), ds).run()


if __name__ == "__main__":
    main()
"""
PROJECT_DRIVER_IMPORTS = "import torch\nfrom torch.utils.data import TensorDataset\n\n"
PROJECT_DRIVER_IMPORTS += "from model import Net\nfrom trainer import Trainer\n\n\n"

FLAT_NAMES = dict(model="model", loader="loader", device="device", optimizer="optimizer")
FLAT_NAMES["dataset"] = "ds"
CLASS_NAMES = {k: f"self.{v}" for k, v in FLAT_NAMES.items()}
CLASS_NAMES["dataset"] = "dataset"
SHAPES = ("flat", "function", "class", "project")


@dataclass(frozen=True)
class Case:
    """A rule's positive case, as slots of the templates (each formatted with the shape's
    names), and what the flat script gets: `edit` is (text before, text after; None when the
    text goes), `reported` a piece of the report's message."""

    code: str
    imports: Tuple[str, ...] = ()
    slots: Dict[str, str] = field(default_factory=dict)
    edit: Optional[Tuple[str, Optional[str]]] = None
    reported: Optional[str] = None


DDP_IMPORTS = (
    "import torch.distributed as dist",
    "from torch.nn.parallel import DistributedDataParallel as DDP",
)
CASES = {
    "OPT703-gc-collect": Case(
        "OPT703", ("import gc",), dict(step="gc.collect()"), edit=("gc.collect()", None)
    ),
    "OPT703-anomaly-in-the-loop-function": Case(
        "OPT703",
        slots=dict(before="torch.autograd.set_detect_anomaly(True)"),
        edit=("set_detect_anomaly", None),
    ),
    "OPT104": Case(
        "OPT104",
        edit=(
            "DataLoader({dataset}, batch_size=16, shuffle=True)",
            "sampler=BatchSampler(RandomSampler({dataset}), 16, drop_last=False)",
        ),
    ),
    "OPT409": Case(
        "OPT409",
        slots=dict(wrap="{model} = torch.compile({model}, dynamic=True)"),
        reported="`dynamic=True` compiles symbolic-size kernels",
    ),
    "OPT408": Case(
        "OPT408",
        slots=dict(
            wrap="{model} = torch.compile({model})",
            after='torch.save({model}.state_dict(), "model.pt")',
        ),
        edit=("{model} = torch.compile({model})", "{model}.compile()"),
    ),
    "OPT204": Case(
        "OPT204",
        slots=dict(
            before="correct = 0",
            step="correct += (out.argmax(1) == y).sum().item()",
            after="print(correct / len({loader}.dataset))",
        ),
        edit=("print(correct / len(", "print(int(correct) / len({loader}.dataset))"),
    ),
    "OPT203": Case(
        "OPT203",
        slots=dict(pre="x = x + torch.randn(x.shape).to({device})"),
        edit=("torch.randn(x.shape).to(", "torch.randn(x.shape, device={device})"),
    ),
    "OPT603": Case(
        "OPT603",
        DDP_IMPORTS,
        dict(
            wrap='dist.init_process_group("nccl")\n{model} = DDP({model}, find_unused_parameters=True)'
        ),
        edit=("find_unused_parameters=True", "{model} = DDP({model})\n"),
    ),
    "OPT604": Case(
        "OPT604",
        slots=dict(wrap="{model} = nn.DataParallel({model})"),
        reported="`nn.DataParallel` drives every GPU from one process",
    ),
    "OPT605": Case(
        "OPT605",
        DDP_IMPORTS,
        dict(wrap='dist.init_process_group("nccl")\n{model} = DDP({model})'),
        edit=("DDP({model})", "DDP({model}, gradient_as_bucket_view=True)"),
    ),
    "OPT503": Case(
        "OPT503",
        slots=dict(
            update="with torch.no_grad():\n"
            "    for p in {model}.parameters():\n"
            "        p -= 0.1 * p.grad"
        ),
        reported="updates each parameter tensor with one in-place operation",
    ),
}
# Where a shape gets less than the flat script: (case, shape) -> the reason given at the site.
KNOWN_LIMITS = {
    # The project index summarises `ds` as a dataset of tensors, not as a plain TensorDataset.
    ("OPT104", "project"): "the dataset is `ds`, passed from another module",
    # `Net` is defined in model.py: its forward's use of parameters is not read from here.
    ("OPT603", "project"): "`self.model` is not built here from one class of this file",
}


def _slot(text: str, names: Dict[str, str], indent: int) -> str:
    return textwrap.indent(text.format(**names), " " * indent).lstrip()


def _lines(text: str) -> str:
    """The text without the lines of empty slots."""
    return "\n".join(line for line in text.splitlines() if line.strip()) + "\n"


def _loop(case: Case, names: Dict[str, str]) -> str:
    slots = {"update": "{optimizer}.step()", **case.slots}
    filled = {s: _slot(slots.get(s, ""), names, 4) for s in ("pre", "update", "step")}
    filled.update({s: slots.get(s, "").format(**names) for s in ("before", "after")})
    return _lines(LOOP.format(**names, **filled))


def _setup(case: Case, names: Dict[str, str], built: str) -> str:
    wrap = case.slots.get("wrap", "").format(**names)
    return _lines(SETUP.format(**names, built=built, wrap=wrap))


def _head(case: Case) -> str:
    return IMPORTS + "".join(f"{line}\n" for line in case.imports) + DATA_IMPORTS + "\n\n"


def render(case: Case, shape: str, caller: str = "") -> Dict[str, str]:
    """The files of `case` in `shape`; `caller` is a line put before the call that runs the
    loop (in `main()`)."""
    caller = f"{caller}\n    " if caller else ""
    if shape == "flat":
        names = FLAT_NAMES
        body = DATASET + "\n" + _setup(case, names, "Net()") + _loop(case, names)
        return {"train.py": _head(case) + NET + "\n\n" + body}
    if shape == "function":
        names = FLAT_NAMES
        text = FUNCTION.format(
            loop=textwrap.indent(_loop(case, names), "    "),
            dataset_line=DATASET,
            setup=textwrap.indent(_setup(case, names, "Net()"), "    "),
            caller=caller,
        )
        return {"train.py": _head(case) + NET + "\n\n" + text}
    names = CLASS_NAMES
    trainer = TRAINER.format(
        setup=textwrap.indent(_setup(case, names, "model"), "        "),
        loop=textwrap.indent(_loop(case, names), "        "),
    )
    driver = DRIVER.format(dataset_line=DATASET, caller=caller)
    if shape == "class":
        return {"train.py": _head(case) + NET + "\n\n" + trainer + "\n\n" + driver}
    return {
        "model.py": "import torch\nimport torch.nn as nn\n\n\n" + NET,
        "trainer.py": _head(case) + trainer,
        "train.py": PROJECT_DRIVER_IMPORTS + driver,
    }


def names_of(shape: str) -> Dict[str, str]:
    return FLAT_NAMES if shape in ("flat", "function") else CLASS_NAMES


# Running the engine ------------------------------------------------------------------------
def apply(folder: Path, code: str) -> Dict[str, FileOutcome]:
    """`apply` over every file of `folder` at once (the project mode), writing in place."""
    files = sorted(str(p) for p in folder.glob("*.py"))
    settings = Settings(select=(code,), unsafe_fixes=True, why_not=True, root=str(folder))
    outcomes = runner.run(files, settings, runner.Mode(write=True, diff=False, cache=None), jobs=1)
    return {Path(o.path).name: o for o in outcomes}


def run_case(files: Dict[str, str], code: str, folder: Path):
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    outcomes = apply(folder, code)
    assert not [o.error for o in outcomes.values() if o.error]
    written = {name: (folder / name).read_text() for name in files}
    return outcomes, written


def findings(outcomes: Dict[str, FileOutcome], code: str) -> Dict[str, List[Diagnostic]]:
    return {
        name: [d for d in o.diagnostics if d.code == code]
        for name, o in outcomes.items()
        if any(d.code == code for d in o.diagnostics)
    }


def summary(found: List[Diagnostic]) -> List[Tuple[str, str]]:
    """(status, message) of each finding, `self.` left out: what a shape must share with the
    flat script."""
    return sorted((d.status.value, d.message.replace("self.", "")) for d in found)


def home(shape: str) -> str:
    """The module that holds the rule's site: the trainer's, in the project."""
    return "trainer.py" if shape == "project" else "train.py"


# The tests ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def flat_results(tmp_path_factory) -> Dict[str, List[Tuple[str, str]]]:
    results = {}
    for key, case in CASES.items():
        folder = tmp_path_factory.mktemp("flat") / key
        outcomes, _ = run_case(render(case, "flat"), case.code, folder)
        results[key] = summary(findings(outcomes, case.code).get("train.py", []))
    return results


def _ids():
    for key in CASES:
        for shape in SHAPES:
            limit = (CASES[key].code, shape) in KNOWN_LIMITS
            yield pytest.param(key, shape, id=f"{key}-{shape}" + ("-known-limit" if limit else ""))


@pytest.mark.parametrize("key, shape", list(_ids()))
def test_the_shape_gets_what_the_flat_script_gets(
    key: str, shape: str, tmp_path: Path, flat_results
) -> None:
    case = CASES[key]
    files = render(case, shape)
    outcomes, written = run_case(files, case.code, tmp_path / "run")
    found = findings(outcomes, case.code)
    assert set(found) == {home(shape)}, f"the finding is in {sorted(found)}"
    limit = KNOWN_LIMITS.get((case.code, shape))
    if limit is not None:
        [declined] = found[home(shape)]
        assert declined.status in (Status.DECLINED, Status.REPORTED)
        assert limit in declined.message
        assert written == files
        return
    got = [d for d in found[home(shape)] if d.status is not Status.DECLINED]
    assert summary(got) == [s for s in flat_results[key] if s[0] != "declined"]
    assert len(got) == 1
    names = names_of(shape)
    if case.reported is not None:
        assert got[0].status is Status.REPORTED and case.reported in got[0].message
        assert written == files
        return
    assert got[0].status is Status.FIXED
    before, after = (None if s is None else s.format(**names) for s in case.edit)
    assert before in files[home(shape)] and before not in written[home(shape)]
    assert after is None or after in written[home(shape)]
    assert all(written[n] == files[n] for n in files if n != home(shape))


@pytest.mark.parametrize("key", [k for k in CASES if CASES[k].edit is not None])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_rewritten_shape_compiles_and_settles(key: str, shape: str, tmp_path: Path) -> None:
    case = CASES[key]
    folder = tmp_path / "run"
    _, written = run_case(render(case, shape), case.code, folder)
    for name, text in written.items():
        compile(text, name, "exec")
    again = apply(folder, case.code)
    assert not any(o.changed for o in again.values())


# How far the shapes are followed, and no further -------------------------------------------
UNVARIED = "the file as rendered, without the variation"
RUN_TRAIN = "    train(model, loader, optimizer, device)"
RUN_TRAINER = "    Trainer(Net(), ds).run()"
ANOMALY = "    torch.autograd.set_detect_anomaly(True)\n"
LOADED = dict(CASES["OPT408"].slots, before='model.load_state_dict(torch.load("last.pt"))')
VARIATIONS = [
    # (rule, case, shape, (text, varied text), status or None, message, text in the output)
    pytest.param(
        "OPT703",
        CASES["OPT104"],
        "function",
        (RUN_TRAIN, ANOMALY + RUN_TRAIN),
        Status.FIXED,
        "anomaly detection is on for training",
        UNVARIED,
        id="anomaly-turned-on-by-the-caller-of-train",
    ),
    pytest.param(
        "OPT703",
        CASES["OPT104"],
        "class",
        (RUN_TRAINER, ANOMALY + RUN_TRAINER),
        Status.FIXED,
        "anomaly detection is on for training",
        UNVARIED,
        id="anomaly-turned-on-by-the-caller-of-run",
    ),
    pytest.param(
        "OPT703",
        CASES["OPT104"],
        "function",
        ("\n\ndef main():", "\n\ndef debug():\n" + ANOMALY + "\n\ndef main():"),
        None,
        None,
        None,
        id="anomaly-in-a-function-that-trains-nothing-stays",
    ),
    pytest.param(
        "OPT408",
        Case("OPT408", slots=LOADED),
        "function",
        ("", ""),
        Status.REPORTED,
        "`model.load_state_dict` after compiling",
        None,
        id="wrapper-loaded-into-in-the-function-it-is-passed-to",
    ),
    pytest.param(
        "OPT104",
        CASES["OPT104"],
        "class",
        (RUN_TRAINER, "    trainer = Trainer(Net(), ds)\n    ds.tensors = ()\n    trainer.run()"),
        Status.DECLINED,
        "the dataset is changed after the loader is built",
        None,
        id="dataset-changed-by-the-caller-after-handing-it-over",
    ),
    pytest.param(
        "OPT104",
        CASES["OPT104"],
        "class",
        (RUN_TRAINER, RUN_TRAINER + "\n    Trainer(Net(), other).run()"),
        Status.DECLINED,
        "which is called 2 times in this file",
        None,
        id="trainer-built-twice",
    ),
    pytest.param(
        "OPT603",
        CASES["OPT603"],
        "class",
        ("(16, 4)\n", "(16, 4)\n        self.aux = nn.Linear(16, 4)\n"),
        Status.FIXED,
        "does not use `self.aux`",
        "self.model = DDP(self.model, static_graph=True)",
        id="unused-head-in-the-trainer-model-gets-static-graph",
    ),
]


@pytest.mark.parametrize("code, case, shape, variation, status, message, output", VARIATIONS)
def test_a_variation_of_the_shape(
    code: str,
    case: Case,
    shape: str,
    variation: Tuple[str, str],
    status: Optional[Status],
    message: Optional[str],
    output: Optional[str],
    tmp_path: Path,
) -> None:
    unvaried = render(case, shape)["train.py"]
    text = unvaried.replace(*variation, 1)
    assert text != unvaried or variation == ("", "")
    outcomes, written = run_case({"train.py": text}, code, tmp_path / "run")
    found = findings(outcomes, code).get("train.py", [])
    if status is None:
        assert not found and written["train.py"] == text
        return
    [finding] = found
    assert finding.status is status and message in finding.message
    if output is None:
        assert written["train.py"] == text
    elif output is UNVARIED:
        assert written["train.py"] == unvaried
    else:
        assert output in written["train.py"]


@pytest.mark.parametrize(
    "where", ["in-main", "at-module-level"], ids=["in-main", "at-module-level"]
)
def test_anomaly_turned_on_by_the_script_whose_loop_is_in_another_module(
    where: str, tmp_path: Path
) -> None:
    """train.py turns anomaly detection on and runs the training loop of trainer.py: the
    switch is process-wide, so it is on for that loop as in the flat script (no backward
    call in train.py's own text)."""
    files = render(CASES["OPT104"], "project", caller=ANOMALY.strip())
    if where == "at-module-level":
        script = files["train.py"].replace(ANOMALY, "")
        files["train.py"] = script.replace(
            "\n\ndef main():", "\n" + ANOMALY.strip() + "\n\n\ndef main():"
        )
    assert "backward" not in files["train.py"] and "set_detect_anomaly(True)" in files["train.py"]
    outcomes, written = run_case(files, "OPT703", tmp_path / "run")
    found = findings(outcomes, "OPT703")
    assert set(found) == {"train.py"}
    [finding] = found["train.py"]
    assert finding.status is Status.FIXED
    assert "anomaly detection is on for training" in finding.message
    assert "set_detect_anomaly" not in written["train.py"]
    assert all(written[name] == files[name] for name in files if name != "train.py")

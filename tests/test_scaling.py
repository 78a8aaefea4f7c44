"""The work done on a file grows linearly with its length: counted, not timed.

A file of n training functions (benchmarks/generate_training_file.py), and one of a single
training loop after n blocks of model code, are rewritten with every rule, and the lines of
Python executed are counted (sys.settrace). Four times the functions must cost at most about
four times the lines, in total and in every function of the tool: a name-following fact
recomputed per use, a scan of the whole file per loop, or a quadratic diff shows up as one
function whose count grows with the square. (That is how an 800-line file came to take 114 s
and a 2,000-line one more than 600 s.)
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Callable, Tuple

import libcst as cst
import pytest

from optimizer_codemod import chunks, linediff
from optimizer_codemod.analysis import ScriptFacts
from optimizer_codemod.analysis.cuda_runs import cuda_required_before
from optimizer_codemod.analysis.devices import may_live_on_accelerator
from optimizer_codemod.analysis.padding import hand_padding
from optimizer_codemod.analysis.transfers import blocking_batch_copies
from optimizer_codemod.analysis.project import _find_shape_varying_functions
from optimizer_codemod.api import rewrite_source
from optimizer_codemod.config import Settings
from optimizer_codemod.formatting import wrap_long_calls

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import generate_training_file as generate  # noqa: E402

FACTOR = 4
# A linear count grows at most FACTOR times; this margin absorbs what varies from run to run
# (set iteration order) and thresholds crossed in between.
GROWTH_LIMIT = FACTOR * 1.25
SLACK_LINES = 500


def counted(work: Callable[[], object]) -> Tuple[Counter, object]:
    """The lines of Python `work()` executes, per function, and what it returned."""
    counts: Counter = Counter()

    def local(frame, event, arg):
        if event == "line":
            counts[frame.f_code] += 1
        return local

    sys.settrace(lambda frame, event, arg: local)
    try:
        returned = work()
    finally:
        sys.settrace(None)
    return counts, returned


def lines_executed(src: str, path: str = "train.py") -> Counter:
    options = Settings(unsafe_fixes=True).options_for(path)
    counts, result = counted(lambda: rewrite_source(src.encode(), path, options))
    assert result.changed
    return counts


def assert_linear_work(work: Callable[[int], Counter], small: int, what: str = "code") -> None:
    """`work(n)` (the lines it executes) grows at most about FACTOR times, in total and in
    every function, from `small` to `small * FACTOR`."""
    work(1)  # imports
    before, after = work(small), work(small * FACTOR)
    total = sum(after.values()) / sum(before.values())
    assert total <= GROWTH_LIMIT, f"{total:.1f}x the lines for {FACTOR}x the {what}"
    grew = [
        code.co_name for code in after if after[code] > GROWTH_LIMIT * before[code] + SLACK_LINES
    ]
    assert not grew, f"superlinear for {FACTOR}x the {what}: {grew}"


@pytest.mark.parametrize(
    "build, small",
    [(generate.training_loops, 3), (generate.one_loop_file, 4)],
    ids=["training-functions", "one-loop-and-model-code"],
)
def test_four_times_the_code_costs_at_most_about_four_times_the_work(
    build: Callable[[int], str], small: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The diff of a long file goes region by region; short files take difflib's exact
    # answer within a fixed budget. Here every diff takes the path long files take.
    monkeypatch.setattr(linediff, "SMALL_REGION", 0)
    monkeypatch.setattr(linediff, "BUDGET_FLOOR", 0)
    monkeypatch.setattr(linediff, "BUDGET_PER_LINE", 0)
    # Likewise parsing: statement by statement at both sizes, as long files are parsed.
    monkeypatch.setattr(chunks, "MIN_LINES", 0)
    # Where no formatter is configured, so that the tool's own line wrapping is counted. Under
    # a project's black, black formats the changed lines, and its own map of them (difflib
    # with autojunk, which drops repeated lines only from 200 lines on) is black's cost.
    path = str(tmp_path / "train.py")
    rewrite_source(build(1).encode(), path, Settings().options_for(path))  # imports
    before = lines_executed(build(small), path)
    after = lines_executed(build(small * FACTOR), path)
    total = sum(after.values()) / sum(before.values())
    assert total <= GROWTH_LIMIT, f"{total:.1f}x the lines for {FACTOR}x the code"
    grew = sorted(
        (
            (after[code] / max(before[code], 1), f"{Path(code.co_filename).name}:{code.co_name}")
            for code in after
            if after[code] > GROWTH_LIMIT * before[code] + SLACK_LINES
        ),
        reverse=True,
    )
    assert not grew, f"superlinear for {FACTOR}x the code: {grew[:5]}"


def _padding_functions(count: int) -> str:
    """`count` collate functions that pad by hand, each calling the one before (a chain of
    calls inside one module, as project.py follows them), and a module-level maximum."""
    parts = ["import torch\n\nlongest = max(3, 4)\nbuffer = torch.zeros(longest)\n"]
    for index in range(count):
        previous = f"    collate_{index - 1}(batch)\n" if index else ""
        parts.append(f"""

def collate_{index}(batch):
{previous}    size = max(len(s) for s in batch)
    width = size + 1
    padded = torch.zeros(len(batch), width)
    for i, s in enumerate(batch):
        padded[i, : len(s)] = s
    return padded
""")
    return "".join(parts)


def test_padding_by_hand_costs_linear_work() -> None:
    def work(count: int) -> Counter:
        facts = ScriptFacts.of(cst.parse_module(_padding_functions(count)))
        counts, (found, varying) = counted(
            lambda: (hand_padding(facts), _find_shape_varying_functions(facts))
        )
        assert len(found) == count and len(varying) == count
        return counts

    assert_linear_work(work, 10)


def test_laying_out_many_changed_lines_of_one_function_costs_linear_work() -> None:
    # Each changed statement is laid out alone (formatting._innermost_statements): finding
    # the statement of each changed line, and whether it shares its lines with another, must
    # not compare every changed line with every statement of the function.
    def work(count: int) -> Counter:
        call = "f(a{0}, non_blocking=True, some_keyword_argument=another_value_to_pass_along_here)"
        old = "def main():\n" + "".join(f"    x{i} = f(a{i})\n" for i in range(count))
        new = "def main():\n" + "".join(f"    x{i} = {call.format(i)}\n" for i in range(count))
        counts, wrapped = counted(lambda: wrap_long_calls(old, new, 88))
        assert wrapped.count("\n") > new.count("\n")  # the long calls were laid out
        return counts

    work(2)  # imports
    before, after = work(50), work(50 * FACTOR)
    grew = sorted(
        (after[code] / max(before[code], 1), code.co_name)
        for code in after
        if after[code] > GROWTH_LIMIT * before[code] + SLACK_LINES
    )
    assert not grew, f"superlinear for {FACTOR}x the changed lines: {grew[-5:]}"


def _datasets_sharing_helpers(count: int, chain: int) -> str:
    """`count` Dataset classes whose items all go through one chain of helpers, the last of
    which moves them to the device."""
    parts = ["import torch\nfrom torch.utils.data import Dataset\n\n"]
    for link in range(chain - 1):
        parts.append(f"def helper_{link}(i):\n    return helper_{link + 1}(i)\n\n\n")
    parts.append(f"def helper_{chain - 1}(i):\n    return torch.zeros(4).to('cuda')\n\n\n")
    for index in range(count):
        parts.append(
            f"class Items{index}(Dataset):\n"
            "    def __getitem__(self, i):\n"
            "        return helper_0(i)\n\n\n"
        )
    return "".join(parts)


def test_datasets_reaching_one_placing_helper_cost_linear_work() -> None:
    # Each class's walk stops at the first name an earlier walk found placing: the chain of
    # helpers is walked once, not once per class.
    def work(count: int) -> Counter:
        facts = ScriptFacts.of(cst.parse_module(_datasets_sharing_helpers(count, chain=count)))
        counts, placing = counted(
            lambda: [facts.class_places_on_accelerator(f"Items{i}") for i in range(count)]
        )
        assert all(placing)
        return counts

    assert_linear_work(work, 20, "classes")


def _cycles_of_names(count: int) -> str:
    """`count` links of a chain of names, each also assigned back from the next (a cycle
    through the whole chain, as `vocab = self.vocab` / `self.vocab = vocab`), on the host."""
    links = ["import torch\n", "v0 = torch.randn(4)\n"]
    for index in range(1, count):
        links.append(f"v{index} = v{index - 1} * 2\nv{index - 1} = v{index}\n")
    return "".join(links)


def test_chains_and_cycles_of_names_cost_linear_work() -> None:
    # Every link is asked about: each name and value is walked once, whatever the order.
    def work(count: int) -> Counter:
        facts = ScriptFacts.of(cst.parse_module(_cycles_of_names(count)))
        values = [a.value for a in facts.records.assignments]
        counts, lives = counted(lambda: [may_live_on_accelerator(facts, v) for v in values])
        assert not any(lives)
        return counts

    assert_linear_work(work, 40, "names")


def _loops_handing_batches_to_one_helper(count: int) -> str:
    """`count` training functions, each handing its pinned batches to one helper that copies
    them (rasbt's `calc_loss_batch`), whose body grows with `count` too."""
    body = "".join(f"    scale_{i} = {i}\n" for i in range(count))
    parts = [
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
        "device = torch.device('cuda')\n\n\n"
        f"def step(x, y, model):\n{body}    x = x.to(device)\n"
        "    return model(x).sum() + y.to(device).sum()\n"
    ]
    for index in range(count):
        parts.append(
            f"\n\ndef train_{index}(model, opt):\n"
            "    data = TensorDataset(torch.randn(8, 4), torch.randn(8))\n"
            "    loader = DataLoader(data, batch_size=4, pin_memory=True)\n"
            "    for x, y in loader:\n"
            "        step(x, y, model).backward()\n"
            "        opt.step()\n"
        )
    return "".join(parts)


def test_copies_in_a_helper_of_many_loops_cost_linear_work() -> None:
    def work(count: int) -> Counter:
        facts = ScriptFacts.of(cst.parse_module(_loops_handing_batches_to_one_helper(count)))
        counts, copies = counted(lambda: blocking_batch_copies(facts))
        assert len(copies) == 2  # `x.to(device)` and `y.to(device)` in the helper
        return counts

    assert_linear_work(work, 10, "loops")


def _stages_after_a_cuda_setup(count: int) -> str:
    """`count` training functions, each calling the next after its loop, the first called by
    `main` after a setup that requires CUDA: every loop's requirement is found through the
    whole chain of callers before it."""
    parts = [
        "import torch\n\n\ndef setup():\n    torch.cuda.set_device(0)\n\n\n"
        "def main(model, loader, device):\n    setup()\n    stage_0(model, loader, device)\n"
    ]
    for index in range(count):
        parts.append(f"""

def stage_{index}(model, loader, device):
    for x, y in loader:
        model(x.to(device)).sum().backward()
    stage_{index + 1}(model, loader, device)
""")
    parts.append(f"\n\ndef stage_{count}(model, loader, device):\n    pass\n")
    return "".join(parts)


def test_requirements_of_cuda_found_through_chains_of_callers_cost_linear_work() -> None:
    def work(count: int) -> Counter:
        facts = ScriptFacts.of(cst.parse_module(_stages_after_a_cuda_setup(count)))
        counts, found = counted(
            lambda: [cuda_required_before(facts, loop) for loop in facts.records.loops]
        )
        assert len(found) == count and all(found)
        return counts

    assert_linear_work(work, 5, "functions")


def _builders_by_name(count: int) -> str:
    """`count` builder functions of one module class, each with an alias, all in one dict the
    trained model is looked up in (DiT's `DiT_models`, MAE's module of builders)."""
    parts = [
        "import torch\nfrom torch import nn\n\n\nclass Net(nn.Module):\n"
        "    def __init__(self, width):\n        super().__init__()\n"
        "        self.layer = nn.Linear(width, 4)\n\n"
        "    def forward(self, x):\n        return self.layer(x)\n"
    ]
    for index in range(count):
        parts.append(
            f"\n\ndef net_{index}(**kwargs):\n    model = Net({index + 1}, **kwargs)\n"
            f"    return model\n\n\nalias_{index} = net_{index}\n"
        )
    entries = ", ".join(f'"{index}": net_{index}' for index in range(count))
    parts.append(f"\n\nNETS = {{{entries}}}\n")
    parts.append(
        "\n\ndef main(name, loader):\n    model = NETS[name]().cuda()\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x, y in loader:\n        loss = (model(x.cuda()) - y.cuda()).pow(2).mean()\n"
        "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n"
    )
    return "".join(parts)


def test_models_built_by_name_cost_linear_work() -> None:
    from optimizer_codemod.analysis.training import namespace_builders, the_trained_model

    def work(count: int) -> Counter:
        script = _builders_by_name(count)
        facts = ScriptFacts.of(cst.parse_module(script))
        # Without `main` (which returns no module) the file is a module of builders.
        module = ScriptFacts.of(cst.parse_module(script.partition("\n\ndef main")[0]))
        counts, (model, builders) = counted(
            lambda: (the_trained_model(facts), namespace_builders(module))
        )
        assert model is not None and model.name == "model"
        assert builders is not None and len(builders) == count + 1  # the class, each builder
        return counts

    assert_linear_work(work, 20, "builders")


def _evaluate_and_readers(count: int) -> str:
    """A `@torch.no_grad()` evaluate and `count` functions that call it and read the result
    through names, a dict comprehension, `max` and formatting (escapes.result_escape)."""
    parts = [
        "import json\nimport torch\n\nmodel = torch.nn.Linear(4, 2)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n\n\n"
        "@torch.no_grad()\ndef evaluate(x):\n    return {'acc1': model(x).sum()}\n"
    ]
    for index in range(count):
        parts.append(f"""

def report_{index}(x, best):
    stats = evaluate(x)
    best = max(best, stats["acc1"])
    log = {{f"test_{{k}}": float(v) for k, v in stats.items()}}
    print(json.dumps(log), f"{{best:.2f}}")
""")
    parts.append("\n\nfor x in [torch.ones(4)]:\n    model(x).sum().backward()\n")
    parts.append("    optimizer.step()\n")
    return "".join(parts)


def test_following_results_to_many_callers_costs_linear_work() -> None:
    options = Settings(select=["OPT403"]).options_for("train.py")

    def work(count: int) -> Counter:
        src = _evaluate_and_readers(count).encode()
        counts, result = counted(lambda: rewrite_source(src, "train.py", options))
        assert b"@torch.inference_mode()" in result.new
        return counts

    # The total only: this runs the whole rewrite, whose line diff and piecewise parse vary
    # per function with where the one edit falls (the analysis' share is what grows here).
    work(1)  # imports
    before, after = work(10), work(10 * FACTOR)
    total = sum(after.values()) / sum(before.values())
    assert total <= GROWTH_LIMIT, f"{total:.1f}x the lines for {FACTOR}x the callers"


def _wrapped_loaders(count: int) -> str:
    """`count` wrapper classes of a DataLoader (makemore's InfiniteDataLoader), each drawn from
    in its own loop beside many method calls without arguments (`h = x.float()`) that are
    no wrapper, and as many names bound by loops."""
    parts = ["import torch\nfrom torch.utils.data import DataLoader\n"]
    for index in range(count):
        parts.append(f"""

class Wrapper{index}:
    def __init__(self, dataset, **kwargs):
        self.loader = DataLoader(dataset, **kwargs)
        self.it = iter(self.loader)

    def next(self):
        return next(self.it)


def train_{index}(model, optimizer, dataset):
    wrapper = Wrapper{index}(dataset, batch_size=8, pin_memory=True)
    for step in range(10):
        x, y = wrapper.next()
        x = x.to("cuda")
        h = x.float()
        g = h.detach()
        for k in range(2):
            g = g.abs()
        loss = model(g, y.to("cuda"))
        loss.backward()
        optimizer.step()
""")
    return "".join(parts)


def test_following_batches_through_wrapper_methods_costs_linear_work() -> None:
    from optimizer_codemod.analysis.loaders import drawing_loops

    def work(count: int) -> Counter:
        facts = ScriptFacts.of(cst.parse_module(_wrapped_loaders(count)))
        counts, loops = counted(lambda: drawing_loops(facts))
        assert len(loops) == count and all(facts.is_pinned(l) for *_, ls in loops for l in ls)
        return counts

    assert_linear_work(work, 10)


def _window_datasets(count: int) -> str:
    """`count` dataset classes of token windows (char_transformer's), each built twice and
    loaded by two DataLoaders, and each reading the module's variable that holds its
    training instance (`len(train_0)`): OPT104 derives a batched `__getitem__` per class."""
    parts = ["import torch\nfrom torch.utils.data import DataLoader, Dataset\n"]
    for index in range(count):
        parts.append(f"""

class Windows{index}(Dataset):
    def __init__(self, tokens, context):
        self.tokens = tokens
        self.context = context
        self.size = len(train_{index}) if "train_{index}" in globals() else 0

    def __len__(self):
        return len(self.tokens) - self.context - 1

    def __getitem__(self, index):
        chunk = self.tokens[index : index + self.context + 1]
        x = chunk[:-1].long()
        return x, chunk[1:]


tokens_{index} = torch.randint(0, 50, (1000,))
train_{index} = Windows{index}(tokens_{index}[:900], 8)
val_{index} = Windows{index}(tokens_{index}[900:], 8)
train_loader_{index} = DataLoader(train_{index}, batch_size=16, shuffle=True)
val_loader_{index} = DataLoader(val_{index}, batch_size=16)
for x, y in train_loader_{index}:
    print(x, y)
for x, y in val_loader_{index}:
    print(x, y)
""")
    return "".join(parts)


def test_batched_items_of_many_dataset_classes_cost_linear_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from optimizer_codemod import rewrite

    # Diffs and parsing take the paths long files take at both sizes (as above).
    monkeypatch.setattr(linediff, "SMALL_REGION", 0)
    monkeypatch.setattr(linediff, "BUDGET_FLOOR", 0)
    monkeypatch.setattr(linediff, "BUDGET_PER_LINE", 0)
    monkeypatch.setattr(chunks, "MIN_LINES", 0)

    def work(count: int) -> Counter:
        source = _window_datasets(count)
        counts, result = counted(lambda: rewrite(source, select=["OPT104"]))
        assert result.source.count("if isinstance(index, list):") == count
        return counts

    assert_linear_work(work, 5, "dataset classes")

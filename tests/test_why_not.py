"""`apply --why-not`: each site a rule examined and left alone is listed with the rule's reason,
and asking for reasons never changes what is rewritten or reported."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ROOT, run_cli
from fixture_cases import fixtures

from optimizer_codemod import rewrite
from optimizer_codemod.api import rewrite_source
from optimizer_codemod.diagnostics import Diagnostic, Status
from optimizer_codemod.engine import RewriteOptions, _declines_of_every_pass, rewrite_bytes
from optimizer_codemod.registry import all_rules
from optimizer_codemod.rule import Safety

LOADER_SCRIPT = """import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        x = torch.full((8,), float(i))
        return x, x.sum()


model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(Squares(), batch_size=10)
for epoch in range(2):
    for x, y in loader:
        loss = (model(x).squeeze(-1) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

TRAINER_SCRIPT = """import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, lr=3e-4):
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = model.to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, foreach=True)

    def step(self, x, y):
        loss = F.mse_loss(self.model(x.to(self.device)), y.to(self.device))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
"""

TENSOR_LOADER_SCRIPT = """import torch
from torch.utils.data import DataLoader, TensorDataset

def main():
    device = torch.device("cuda")
    model = torch.nn.Linear(8, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=16, num_workers=2)
    for x, y in loader:
        loss = (model(x.to(device)) - y.to(device)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

if __name__ == "__main__":
    main()
"""


# pytorch-tutorial's image_captioning/data_loader.py: the loader goes back to train.py, whose
# epoch loop iterates it; that loop is not followed from here.
RETURNED_LOADER_MODULE = """import torch


def get_loader(dataset, batch_size, num_workers):
    data_loader = torch.utils.data.DataLoader(dataset, batch_size, num_workers=num_workers)
    return data_loader
"""


def declined(source: str, **options) -> dict:
    result = rewrite(source, path="train.py", why_not=True, **options)
    return {(d.code, d.line): d.message for d in result.diagnostics if d.status is Status.DECLINED}


# A deprecated autocast in the fallback of an SDPA check: kept, and said so.
FALLBACK_SCRIPT = """import torch
import torch.nn.functional as F


def attend(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v)
    with torch.cuda.amp.autocast():
        w = (q @ k.transpose(-2, -1)).softmax(dim=-1)
    return w @ v
"""

# torchvision's references: evaluate() loops over `metric_logger.log_every(data_loader)`,
# a method of a module outside the run; whether the loader is iterated is unknown.
HANDED_ON_SCRIPT = """import torch
import utils


def evaluate(model, data_loader):
    for x, y in utils.MetricLogger().log_every(data_loader, 10):
        model(x.cuda())


def main(args):
    model = torch.nn.Linear(8, 2).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 2))
    test_loader = torch.utils.data.DataLoader(data, num_workers=args.workers)
    for epoch in range(args.epochs):
        for x, y in data:
            opt.zero_grad()
            model(x.cuda()).sum().backward()
            opt.step()
        evaluate(model, test_loader)


if __name__ == "__main__":
    main(None)
"""


ZIPPED_LOADERS_SCRIPT = """import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
to_tensor = transforms.ToTensor()
loader_A = DataLoader(datasets.MNIST("data", transform=to_tensor), batch_size=32)
loader_B = DataLoader(datasets.USPS("data", transform=to_tensor), batch_size=32)
model = torch.nn.Linear(784, 10).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for (images_A, labels_A), (images_B, _) in zip(loader_A, loader_B):
    images_A, labels_A = images_A.to(device), labels_A.to(device)
    loss = torch.nn.functional.cross_entropy(model(images_A.flatten(1)), labels_A)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize(
    "source, code, line, reason",
    [
        (LOADER_SCRIPT, "OPT102", 16, 'no `if __name__ == "__main__":` guard'),
        (LOADER_SCRIPT, "OPT101", 16, "no loop over this loader copies its batches"),
        (LOADER_SCRIPT, "OPT302", 14, "`model` is not moved to a device"),
        (LOADER_SCRIPT, "OPT402", 14, "`model` is not moved to a device"),
        (TRAINER_SCRIPT, "OPT302", 14, "through the function's one call in this file"),
        (TRAINER_SCRIPT, "OPT402", 14, "through the function's one call in this file"),
        (TRAINER_SCRIPT, "OPT501", 9, "`foreach` is set, and torch refuses it with `fused`"),
        (
            TENSOR_LOADER_SCRIPT.replace(", num_workers=2", ""),
            "OPT102",
            9,
            "the dataset is a TensorDataset",
        ),
        (TENSOR_LOADER_SCRIPT, "OPT103", 9, "not iterated again and again"),
        (FALLBACK_SCRIPT, "OPT801", 8, "the code runs when a feature is missing"),
        (HANDED_ON_SCRIPT, "OPT103", 14, "`evaluate` inside a loop, which passes it on"),
        (HANDED_ON_SCRIPT, "OPT101", 14, "no loop over this loader is found"),
        (ZIPPED_LOADERS_SCRIPT, "OPT101", 7, "together with other iterables through `zip(...)`"),
        (ZIPPED_LOADERS_SCRIPT, "OPT101", 8, "together with other iterables through `zip(...)`"),
        (RETURNED_LOADER_MODULE, "OPT103", 5, "it is returned by `get_loader()`"),
        (
            (ROOT / "fixtures/OPT103/keep_loader_yielded_from_endless_generator.py").read_text(),
            "OPT103",
            17,
            "`load_data()` iterates it with `yield from`",
        ),
        (
            (ROOT / "fixtures/OPT201/keep_wrapper_loader_options_not_all_known.py").read_text(),
            "OPT201",
            33,
            "whether the DataLoader pins its batches is unknown",
        ),
        (
            (ROOT / "fixtures/OPT201/keep_loader_not_pinned.py").read_text(),
            "OPT201",
            11,
            "the DataLoader is not built with `pin_memory=True`",
        ),
        (
            (ROOT / "fixtures/OPT302/keep_half_precision_on_one_path.py").read_text(),
            "OPT302",
            22,
            "already computes in another precision (`model.half()`)",
        ),
        (  # the model is rebound by `.half()`, so its step is not followed: said at the backward
            (ROOT / "fixtures/OPT302/keep_half_precision_on_one_path.py")
            .read_text()
            .replace("    model.half()", "    model = model.half()"),
            "OPT302",
            24,
            "already computes in another precision (`model.half()`)",
        ),
        (
            (
                ROOT
                / "fixtures/OPT201/keep_batch_drawn_through_a_rebound_parameter_of_an_unpinned_loader.py"
            ).read_text(),
            "OPT201",
            19,
            "no DataLoader of this file is pinned",
        ),
        (
            (ROOT / "fixtures/OPT201/keep_loader_not_pinned.py").read_text(),
            "OPT201",
            20,
            "its options arrive through `*args`/`**kwargs` whose entries",
        ),
    ],
)
def test_a_site_left_alone_says_why(source: str, code: str, line: int, reason: str) -> None:
    found = declined(source)
    assert (code, line) in found, sorted(found)
    assert reason in found[(code, line)]


def test_a_fused_kernel_newer_than_target_torch_is_explained() -> None:
    # Adagrad's fused kernel runs on CUDA from torch 2.13; the rule itself from 2.4.
    source = TRAINER_SCRIPT.replace(", foreach=True", "").replace("AdamW", "Adagrad")
    assert ("OPT501", 9) not in declined(source, target_torch="2.13")  # fixed there
    reason = declined(source, target_torch="2.4")[("OPT501", 9)]
    assert "needs torch 2.13, newer than target-torch 2.4" in reason


def test_reasons_are_only_given_when_asked_for() -> None:
    result = rewrite(LOADER_SCRIPT, path="train.py")
    assert not [d for d in result.diagnostics if d.status is Status.DECLINED]


@pytest.mark.parametrize(
    "fixture", [f for f in fixtures() if not f.is_notebook], ids=lambda f: f.id
)
def test_asking_why_not_changes_nothing_else(fixture) -> None:
    # Every rule on every fixture: the rewrite and its findings are the same with reasons on,
    # and no site is both fixed and declined by the same rule.
    settings = fixture.settings(all_selected=True)
    src = fixture.path.read_bytes()
    plain = rewrite_source(src, str(fixture.path), settings.options_for(str(fixture.path)))
    asked = replace(settings, why_not=True)
    explained = rewrite_source(src, str(fixture.path), asked.options_for(str(fixture.path)))
    assert explained.new == plain.new
    kept = [d for d in explained.diagnostics if d.status is not Status.DECLINED]
    assert kept == plain.diagnostics
    fixed = {(d.code, d.line) for d in kept if d.status is Status.FIXED}
    assert not [
        d
        for d in explained.diagnostics
        if d.status is Status.DECLINED and (d.code, d.line) in fixed
    ]


def test_the_command_line_lists_reasons_in_text_and_json(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(LOADER_SCRIPT)
    plain = run_cli(["apply", str(script), "--check"])
    text = run_cli(["apply", str(script), "--check", "--why-not"])
    assert text.exit_code == plain.exit_code == 1  # reasons never change the exit status
    assert "not applied" not in plain.output
    assert f"{script}:16:10: OPT102 not applied: no `if __name__" in text.output
    assert "sites examined and left alone" in text.output
    document = json.loads(
        run_cli(["apply", str(script), "--check", "--why-not", "--output-format", "json"]).output
    )
    statuses = {(f["code"], f["status"]) for f in document["findings"]}
    assert ("OPT102", "declined") in statuses and ("OPT501", "fixable") in statuses
    github = run_cli(["apply", str(script), "--check", "--why-not", "--output-format", "github"])
    assert "OPT102" not in github.output  # no annotation on code left alone
    sarif = json.loads(
        run_cli(["apply", str(script), "--check", "--why-not", "--output-format", "sarif"]).output
    )
    levels = {r["ruleId"]: r["level"] for r in sarif["runs"][0]["results"]}
    assert levels["OPT102"] == "none" and levels["OPT501"] == "warning"


def test_the_documented_example_is_what_the_tool_prints(tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "why-not.md").read_text()
    assert f"```python\n{LOADER_SCRIPT}```" in page
    (tmp_path / "loop.py").write_text(LOADER_SCRIPT)
    result = run_cli(["apply", "loop.py", "--check", "--why-not"], cwd=tmp_path)
    assert "loop.py:16:10: OPT102 not applied" in result.output
    assert f"$ optcodemod apply loop.py --check --why-not\n{result.output}```" in page


# --- declines of every pass (issue 15: every examined site is listed) -------------------------

PROJECTS = Path(__file__).resolve().parent.parent / "fixtures" / "projects"
# OPT101 pins the loader in the first pass; OPT201 declines the copies there (the loader is
# not pinned yet) and fixes them in the second; OPT102 declines the loader in every pass.
PINNED_LATER_SCRIPT = """import torch
from torch.utils.data import DataLoader, TensorDataset

device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(4, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(
    TensorDataset(torch.randn(64, 4), torch.randn(64, 2)), batch_size=8, num_workers=2
)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
TRAINER_DECLINE = "trainer.py:18:13: OPT301 not applied: the setting is process-wide"


def test_a_decline_of_an_earlier_pass_is_listed_in_every_format(tmp_path: Path) -> None:
    # OPT301 declines trainer.py's loop in the first pass (TF32 goes into train.py); OPT302's
    # autocast in that pass means the next pass has nothing for OPT301 to examine there.
    shutil.copytree(PROJECTS / "trainer_lm", tmp_path / "trainer_lm")
    args = ["apply", "--check", "--why-not", "."]
    folder = tmp_path / "trainer_lm"
    alone = run_cli([*args, "--select", "OPT301"], cwd=folder)
    assert TRAINER_DECLINE in alone.output  # what the rule says when nothing else fixes
    text = run_cli(args, cwd=folder)
    assert "trainer.py:16:13: OPT302 [numerics]" in text.output  # the fix in the same run
    assert TRAINER_DECLINE in text.output
    document = json.loads(run_cli([*args, "--output-format", "json"], cwd=folder).output)
    json_declines = [
        (f["filename"], f["location"]["row"], f["location"]["column"])
        for f in document["findings"]
        if f["code"] == "OPT301" and f["status"] == "declined"
    ]
    assert json_declines == [("trainer.py", 18, 13)]
    sarif = json.loads(run_cli([*args, "--output-format", "sarif"], cwd=folder).output)
    declines = [
        (
            result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
            result["locations"][0]["physicalLocation"]["region"]["startLine"],
            result["level"],
        )
        for result in sarif["runs"][0]["results"]
        if result["ruleId"] == "OPT301" and result["properties"]["status"] == "declined"
    ]
    assert declines == [("trainer.py", 18, "none")]


def test_a_decline_whose_site_a_later_pass_fixed_is_not_listed() -> None:
    result = rewrite(PINNED_LATER_SCRIPT, path="train.py", why_not=True)
    statuses = sorted((d.code, d.line, d.column, d.status.value) for d in result.diagnostics)
    assert ("OPT201", 11, 12, "fixed") in statuses and ("OPT201", 11, 26, "fixed") in statuses
    assert not [s for s in statuses if s[0] == "OPT201" and s[3] == "declined"]


def test_a_decline_repeated_by_every_pass_is_listed_once() -> None:
    options = RewriteOptions(rules=tuple(all_rules()), why_not=True)
    result = rewrite_bytes(PINNED_LATER_SCRIPT.encode(), "train.py", options)
    assert result.passes == 2  # OPT201 fixes after OPT101; asking why costs no extra pass
    assert (
        rewrite_bytes(
            PINNED_LATER_SCRIPT.encode(), "train.py", replace(options, why_not=False)
        ).passes
        == 2
    )
    [loader] = [d for d in result.diagnostics if d.code == "OPT104"]
    assert loader.status is Status.DECLINED and loader.line == 7
    assert "built with calls" in loader.message


def _decline(code: str, line: int, column: int, message: str = "reason") -> Diagnostic:
    return Diagnostic(
        code, "name", message, "title", Safety.SAFE, Status.DECLINED, line, column, line, column + 1
    )


def test_each_site_keeps_the_reasons_of_the_first_pass_that_declined_it() -> None:
    x, y = _decline("OPT201", 9, 12), _decline("OPT201", 9, 26)
    other_reason = _decline("OPT201", 9, 12, "another reason")
    fixed_later = replace(_decline("OPT104", 3, 1), status=Status.FIXED)
    passes = [([], [x, y, _decline("OPT104", 3, 1)]), ([fixed_later], [x, other_reason])]
    # Two sites on one line with one reason stay two; the next pass's reasons for the same
    # site (it read the tool's own edits by then) are not listed; the OPT104 decline waited
    # for a fix the next pass made.
    assert _declines_of_every_pass(passes, []) == [x, y]
    new_site = _decline("OPT102", 1, 1)
    last = [replace(x, column=30), new_site]
    assert _declines_of_every_pass(passes, last) == [x, y, new_site]
    # A site first declined by the last pass is listed as the last pass says it.
    assert _declines_of_every_pass([([fixed_later], [])], last) == last
    # A reason given again by a later pass at another line is the same site, moved by the
    # earlier pass's edits.
    moved = _decline("OPT201", 10, 12)
    assert _declines_of_every_pass(passes, [moved]) == [x, y]


TORCH_SEQUENTIAL_CONVNET = """import torch
import torch.nn as nn


def main():
    device = torch.device("cuda")
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.LazyLinear(10))
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    for step in range(10):
        x = torch.randn(4, 3, 8, 8, device=device)
        loss = model(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""


def test_a_site_moved_by_another_rules_insertion_is_declined_once() -> None:
    # OPT407 inserts the channels_last conversion after the placement; the next pass finds
    # OPT402's anchor ("after which to compile") on that inserted line.
    result = rewrite(TORCH_SEQUENTIAL_CONVNET, path="train.py", why_not=True)
    assert any(d.code == "OPT407" and d.status is Status.FIXED for d in result.diagnostics)
    compile_declines = [
        (d.line, d.message)
        for d in result.diagnostics
        if d.code == "OPT402" and d.status is Status.DECLINED
    ]
    assert len(compile_declines) == 1, compile_declines
    assert compile_declines[0][0] == 8 and "torch's own layers" in compile_declines[0][1]


_MOVE = "cannot unpickle: move it to the module's top level first"
_DEFINE = "cannot unpickle: define it with `def` at the module's top level first"


@pytest.mark.parametrize(
    "fixture, reason, advice",
    [
        (
            "keep_collate_defined_inside_a_function",
            "its `collate_fn` is `collate`, defined inside",
            _MOVE,
        ),
        ("keep_lambda_worker_init_fn", "its `worker_init_fn` is a lambda", _DEFINE),
        ("keep_dataset_class_defined_inside_a_function", "its dataset class `NoisyShapes`", _MOVE),
        (
            "keep_dataset_transform_holds_a_lambda",
            "its dataset holds a lambda (`lambda image: image.mul(255)`)",
            _DEFINE,
        ),
    ],
)
def test_workers_are_not_added_when_spawned_workers_could_not_unpickle_the_loader(
    fixture: str, reason: str, advice: str
) -> None:
    path = Path(__file__).resolve().parent.parent / "fixtures" / "OPT102" / f"{fixture}.py"
    result = run_cli(["apply", "--check", "--why-not", "--select", "OPT102", str(path)])
    assert "OPT102 not applied: " + reason in result.stdout, result.stdout
    assert advice in result.stdout, result.stdout


class _TransformedItems:
    """A dataset keeping its transform, as torchvision's keep `transform`."""

    def __init__(self, transform):
        self.transform = transform


def test_a_dataset_holding_a_lambda_cannot_be_sent_to_spawned_workers() -> None:
    # What the OPT102 decline above claims: DataLoader pickles the dataset for each worker
    # started by spawn or forkserver, and pickle finds functions by their module-level name.
    import pickle

    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(_TransformedItems(lambda image: image * 255))
    assert pickle.loads(pickle.dumps(_TransformedItems(abs))).transform is abs


def test_a_view_report_is_not_replaced_by_the_rules_own_conversion() -> None:
    # The first pass converts `pooled` and reports the view of `flat`; the second pass reads
    # `channels_last` in the first pass's edit, which is no choice of the script's author.
    source = (ROOT / "fixtures/OPT407/fix_second_model_keeps_its_view_report.py").read_text()
    result = rewrite(source, path="train.py", select=["OPT407"], why_not=True)
    flat = [d for d in result.diagnostics if d.code == "OPT407" and d.status is not Status.FIXED]
    assert [d.status for d in flat] == [Status.REPORTED], flat
    assert "`out.view(out.size(0), -1)` raises on a channels_last tensor unless" in flat[0].message

"""Issue 15: `pin_memory` that reaches a DataLoader through a dict filled under a condition
(pytorch/examples' mnist, vae, siamese_network, mnist_rnn) is read on every path."""

from __future__ import annotations

import libcst as cst
import pytest

from optimizer_codemod.analysis.loaders import option_values
from optimizer_codemod.analysis.script import ScriptFacts


def _values(source: str):
    facts = ScriptFacts.of(cst.parse_module(source))
    (site,) = facts.dataloader_constructions()
    found = option_values(facts, site.node, "pin_memory")
    return None if found is None else [cst.Module([]).code_for_node(v) for v in found]


@pytest.mark.parametrize(
    "setup, expected",
    [
        ("kw = {'num_workers': 1, 'pin_memory': True} if cuda else {}", ["True"]),
        ("kw = {'batch_size': 8}\nif cuda:\n    kw.update({'pin_memory': True})", ["True"]),
        ("kw = {'batch_size': 8}\nif cuda:\n    kw.update(pin_memory=False)", ["False"]),
        (
            "kw = {'batch_size': 8}\nif cuda:\n    c = {'pin_memory': True}\n    kw.update(c)",
            ["True"],
        ),
        ("kw = {'batch_size': 8}", []),
        # A merged dict changed elsewhere, a change other than update, an unknown dict.
        ("c = {'pin_memory': True}\nc['pin_memory'] = cuda\nkw = {}\nkw.update(c)", None),
        ("kw = {'batch_size': 8}\nkw['pin_memory'] = cuda", None),
        ("kw = make_options()", None),
    ],
)
def test_every_value_an_option_may_take(setup: str, expected) -> None:
    source = f"import torch\n{setup}\nprobe = torch.utils.data.DataLoader(ds, **kw)\n"
    assert _values(source) == expected


def test_an_update_after_the_loader_is_built_does_not_reach_it() -> None:
    source = (
        "import torch\nkw = {'batch_size': 8}\n"
        "probe = torch.utils.data.DataLoader(ds, **kw)\nkw.update(pin_memory=True)\n"
    )
    assert _values(source) is None


UNFOLLOWED = """import torch
from torch.utils.data import DataLoader


class Trainer:
    def __init__(self, model, dataset):
        self.model = model.to("cuda")
        self.train_data = DataLoader(dataset, batch_size=32, pin_memory=True)

    def fit(self, loader, data_iter):
        for source, targets in loader:
            source = source.to("cuda")
            self.model(source).sum().backward()
        while True:
            batch = next(data_iter)
            batch = [t.to("cuda") for t in batch]
            self.model(batch[0]).sum().backward()
"""


def test_copies_of_batches_the_analysis_cannot_follow_are_declined_with_their_origin() -> None:
    from optimizer_codemod import rewrite
    from optimizer_codemod.diagnostics import Status

    result = rewrite(UNFOLLOWED, path="train.py", select=["OPT201"], why_not=True)
    declined = {d.line: d.message for d in result.diagnostics if d.status is Status.DECLINED}
    assert not result.changed
    assert declined[12].startswith("the batch comes from `loader`, which the analysis cannot")
    assert declined[16].startswith("the batch comes from `next(data_iter)`")
    assert 7 not in declined  # the model's placement is no batch copy

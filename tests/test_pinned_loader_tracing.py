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


_WRAPPER = (
    "import torch\n"
    "class Infinite:\n"
    "    def __init__(self, dataset{params}, **kwargs):\n"
    "{body}"
    "        self.loader = torch.utils.data.DataLoader(dataset, **kwargs)\n"
    "{calls}"
)


@pytest.mark.parametrize(
    "params, body, calls, expected",
    [
        # makemore's InfiniteDataLoader: what its one caller passes through `**kwargs`.
        ("", "", "w = Infinite(ds, batch_size=8, pin_memory=True)\n", ["True"]),
        ("", "", "w = Infinite(ds, batch_size=8)\n", []),
        # Taken by a parameter of its own: never in `**kwargs`.
        (", pin_memory=True", "", "w = Infinite(ds, pin_memory=True)\n", []),
        # Changed on the way, several callers, a caller hiding keywords, no caller.
        ("", "        kwargs['pin_memory'] = False\n", "w = Infinite(ds, pin_memory=True)\n", None),
        ("", "", "w = Infinite(ds, pin_memory=True)\nv = Infinite(ds)\n", None),
        ("", "", "w = Infinite(ds, **options)\n", None),
        ("", "", "", None),
    ],
)
def test_options_a_wrapper_hands_on_from_its_one_caller(params, body, calls, expected) -> None:
    source = _WRAPPER.format(params=params, body=body, calls=calls)
    assert _values(source) == expected


def test_a_batch_a_wrapper_method_returns_is_drawn_from_its_loader() -> None:
    from optimizer_codemod.analysis.batch_sources import batch_source, drawn_iterator

    source = _WRAPPER.format(params="", body="", calls="") + (
        "        self.it = iter(self.loader)\n"
        "    def next(self):\n"
        "        try:\n"
        "            batch = next(self.it)\n"
        "        except StopIteration:\n"
        "            self.it = iter(self.loader)\n"
        "            batch = next(self.it)\n"
        "        return batch\n"
        "    def moved(self):\n"
        "        return next(self.it).cuda()\n"
        "w = Infinite(ds, pin_memory=True)\n"
        "for step in range(9):\n"
        "    a = w.next()\n"
        "    b = w.moved()\n"
    )
    facts = ScriptFacts.of(cst.parse_module(source))
    drawn, moved = (a.value for a in facts.records.assignments if a.target in ("a", "b"))
    iterator, method = drawn_iterator(facts, drawn, None)
    assert cst.Module([]).code_for_node(iterator) == "self.it"
    assert method.name.value == "next"
    (loader,) = batch_source(facts, iterator, method).loaders
    assert facts.is_pinned(loader)
    assert drawn_iterator(facts, moved, None) is None


def test_a_wrapper_name_a_function_may_rebind_globally_is_not_followed() -> None:
    from optimizer_codemod.analysis.batch_sources import drawn_iterator

    source = (
        "import torch\n"
        "class Wrap:\n"
        "    def __init__(self, dataset, **kwargs):\n"
        "        self.it = iter(torch.utils.data.DataLoader(dataset, **kwargs))\n"
        "    def next(self):\n"
        "        return next(self.it)\n"
        "{swap}"
        "wrapper = Wrap(ds, pin_memory=True)\n"
        "for step in range(9):\n"
        "    batch = wrapper.next()\n"
    )
    swap = "def swap(other):\n    global wrapper\n    wrapper = other\n"
    for text, followed in ((source.format(swap=""), True), (source.format(swap=swap), False)):
        facts = ScriptFacts.of(cst.parse_module(text))
        (drawn,) = (a.value for a in facts.records.assignments if a.target == "batch")
        assert (drawn_iterator(facts, drawn, None) is not None) is followed


CLASS_READS_ITS_OWN_INSTANCE = """\
import torch
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    def __init__(self, names):
        self.captions = names

    def __len__(self):
        return len(data)

    def __getitem__(self, index):
        return torch.zeros(3) + index


data = Items(["a", "b"])
captions = Items(["c"])
loader = DataLoader(data, batch_size=4)
for batch in loader:
    print(batch.cuda())
"""


def test_a_dataset_class_reading_the_global_that_holds_its_instance_is_analysed() -> None:
    """`len(data)` in a method of the class `data` is built from asked "may the class place
    tensors on the device" again while answering it: that recursed without end (an internal
    error, the file left alone); `self.captions` was taken for the global `captions`."""
    from optimizer_codemod import rewrite
    from optimizer_codemod.analysis.devices import class_may_place_on_accelerator

    result = rewrite(CLASS_READS_ITS_OWN_INSTANCE, why_not=True)
    assert {d.code for d in result.diagnostics} >= {"OPT102", "OPT104"}
    facts = ScriptFacts.of(cst.parse_module(CLASS_READS_ITS_OWN_INSTANCE))
    # The cycle (class, `data`, the class again) is settled as a whole: nothing in it places.
    assert class_may_place_on_accelerator(facts, "Items") is False
    on_device = CLASS_READS_ITS_OWN_INSTANCE.replace("torch.zeros(3)", "torch.zeros(3).cuda()")
    facts = ScriptFacts.of(cst.parse_module(on_device))
    assert class_may_place_on_accelerator(facts, "Items") is True
    placed = CLASS_READS_ITS_OWN_INSTANCE.replace("len(data)", "len(self.captions)")
    facts = ScriptFacts.of(cst.parse_module(placed))
    assert class_may_place_on_accelerator(facts, "Items") is False  # `captions`: attribute

"""OPT104: the rewritten loader yields the same batches as the original, run with torch.

Each case is a DataLoader over a TensorDataset, rewritten by the rule; both loaders are built
after the same seed and iterated for two epochs, and every batch (type, dtype, shape, strides,
values), `len(loader)` and the global random state afterwards must be identical.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

x = torch.arange(37 * 6, dtype=torch.float32).reshape(37, 3, 2)
y = torch.arange(37)
mask = torch.arange(37) % 3 == 0
data = TensorDataset(x, y, mask)
single = TensorDataset(x)
generator = torch.Generator().manual_seed(5)
batch = 8
loader = {call}
for epoch in range(2):
    for items in loader:
        pass
"""

CASES = {
    "shuffled": "DataLoader(data, batch_size=8, shuffle=True)",
    "shuffled, drop_last": "DataLoader(data, batch_size=8, shuffle=True, drop_last=True)",
    "sequential, last partial batch": "DataLoader(data, batch_size=batch)",
    "sequential, drop_last": "DataLoader(data, batch_size=10, shuffle=False, drop_last=True)",
    "generator": "DataLoader(data, batch_size=8, shuffle=True, generator=generator)",
    "one tensor, inline dataset": "DataLoader(TensorDataset(x), batch_size=5, shuffle=True)",
    "positional options": "DataLoader(single, 6, True)",
    "batch larger than the dataset": "DataLoader(data, batch_size=50, shuffle=True)",
    "workers": "DataLoader(data, batch_size=8, shuffle=True, num_workers=2)",
    "persistent workers, generator": (
        "DataLoader(data, batch_size=8, shuffle=True, drop_last=True, num_workers=1, "
        "persistent_workers=True, generator=generator)"
    ),
}


def _rewritten(call: str) -> str:
    source = SCRIPT.format(call=call)
    result = rewrite(source, select=["OPT104"])
    assert [d.status for d in result.diagnostics if d.code == "OPT104"] == [Status.FIXED]
    assert "batch_size=None" in result.source and "BatchSampler(" in result.source
    return result.source


def _batches(source: str):
    """Build the loader as the script does (after seed 0), iterate it for two epochs."""
    head, _, _ = source.partition("for epoch in range(2):")
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(head, "<loader>", "exec"), namespace)
    loader = namespace["loader"]
    batches = [items for _ in range(2) for items in loader]
    return batches, len(loader), torch.rand(3)


def _assert_same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.stride()) == (b.dtype, b.shape, b.stride())
        assert torch.equal(a, b)
    else:
        assert len(a) == len(b)
        for p, q in zip(a, b):
            _assert_same(p, q)


@pytest.mark.parametrize("call", CASES.values(), ids=CASES.keys())
def test_the_rewritten_loader_yields_identical_batches(call: str) -> None:
    original, length, state = _batches(SCRIPT.format(call=call))
    rewritten, new_length, new_state = _batches(_rewritten(call))
    assert original and len(original) == len(rewritten)
    assert new_length == length
    _assert_same(original, rewritten)
    assert torch.equal(state, new_state)  # the same random numbers were drawn


def test_a_different_seed_gives_different_batches() -> None:
    """The comparison can fail: the shuffled order depends on the seed."""
    call = CASES["shuffled"]
    original, _, _ = _batches(SCRIPT.format(call=call))
    source = _rewritten(call).replace("batch = 8", "batch = 8\ntorch.manual_seed(1)")
    rewritten, _, _ = _batches(source)
    assert not all(torch.equal(p[1], q[1]) for p, q in zip(original, rewritten))


DECLINED = {
    "DataLoader(data, batch_size=8, collate_fn=lambda b: b)": "`collate_fn` is given",
    "DataLoader(data, batch_size=8, sampler=None, batch_sampler=None)": None,
    "DataLoader(data, batch_size=8, shuffle=batch > 4)": "`shuffle` is not a literal",
    "DataLoader(data)": "batches of one item",
    "DataLoader(data, batch_size=8, generator=torch.Generator())": "may have side effects",
    "DataLoader(torch.utils.data.Subset(data, [1, 2]), batch_size=8)": "not known to be a",
}


@pytest.mark.parametrize("call, reason", DECLINED.items(), ids=list(DECLINED))
def test_sites_left_alone_say_why(call: str, reason) -> None:
    result = rewrite(SCRIPT.format(call=call), select=["OPT104"], why_not=True)
    own = [d for d in result.diagnostics if d.code == "OPT104"]
    if reason is None:  # samplers given as None are the defaults: fixed
        assert [d.status for d in own] == [Status.FIXED]
        return
    assert not result.changed
    assert [d.status for d in own] == [Status.DECLINED]
    assert reason in own[0].message


def test_reading_the_loader_batch_size_or_handing_it_on_blocks_the_fix() -> None:
    read = SCRIPT.format(call=CASES["shuffled"]) + "print(loader.batch_size)\n"
    handed = SCRIPT.format(call=CASES["shuffled"]) + "trainer.fit(model, loader)\n"
    counted = SCRIPT.format(call=CASES["shuffled"]) + "print(len(loader), loader.dataset)\n"
    for source, reason in ((read, "`loader.batch_size` is read"), (handed, "`trainer.fit`")):
        result = rewrite(source, select=["OPT104"], why_not=True)
        assert not result.changed
        assert reason in result.diagnostics[0].message
    assert rewrite(counted, select=["OPT104"]).changed


def test_the_in_memory_reference_workloads_get_the_rule() -> None:
    models = ROOT / "reference_models"
    for name, loaders in (("sudoku_diffusion", 1), ("sgld_mnist", 1), ("char_transformer", 2)):
        source = (models / name / "train.py").read_text()
        result = rewrite(source, select=["OPT104"], why_not=True)
        assert [d.status for d in result.diagnostics] == [Status.FIXED] * loaders, name


# Dataset classes of the script: the rule adds a branch of `__getitem__` for a list of indices.
CLASS_SCRIPT = """\
import torch
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    def __init__(self, tokens, context=7):
        self.tokens = tokens
        self.labels = torch.arange(len(tokens)) % 5
        self.images = torch.arange(len(tokens) * 12).reshape(len(tokens), 3, 4)
        self.context = context

    def __len__(self):
        return len(self.tokens) - self.context - 1

    def __getitem__(self, index):
{body}


tokens = torch.randint(0, 50, (203,))
data = Items(tokens)
loader = DataLoader(data, batch_size=16, shuffle=True)
for epoch in range(2):
    for items in loader:
        pass
"""

CLASS_CASES = {
    "windows, views of one chunk": (
        "chunk = self.tokens[index : index + self.context + 1]\n" "return chunk[:-1], chunk[1:]"
    ),
    "windows with an offset": (
        "x = self.tokens[index : index + self.context]\n"
        "y = self.tokens[index + 1 : index + 1 + self.context]\n"
        "return x, y"
    ),
    "normalised flattened image and label": (
        "image = (self.images[index] - 0.5) / 0.25\n" "return image.flatten(), self.labels[index]"
    ),
    "converted, negated, viewed": (
        "x = -self.images[index].float() * 2\nreturn x.view(-1), self.labels[index].long()"
    ),
    "a 0-d item flattened": "return self.labels[index].flatten()",
    "one tensor, integer and slice of an item, with a docstring": (
        '"""An item."""\nimage = self.images[index]\nreturn image[0, 1:3]'
    ),
    "elementwise and conversion of strided views": (
        "image = self.images[index]\nreturn image[1] * 2, image[:, 1:].float()"
    ),
    "detached strided view": (
        "chunk = self.tokens[index : index + self.context]\nreturn chunk[::2].detach()"
    ),
}


def _class_source(body: str) -> str:
    indented = "\n".join("        " + line for line in body.splitlines())
    return CLASS_SCRIPT.format(body=indented)


@pytest.mark.parametrize("body", CLASS_CASES.values(), ids=CLASS_CASES.keys())
def test_a_dataset_class_fetching_a_batch_yields_identical_batches(body: str) -> None:
    source = _class_source(body)
    result = rewrite(source, select=["OPT104"])
    assert [d.status for d in result.diagnostics] == [Status.FIXED]
    assert "if isinstance(index, list):" in result.source
    original, length, state = _batches(source)
    rewritten, new_length, new_state = _batches(result.source)
    assert original and len(original) == len(rewritten) and new_length == length
    _assert_same(original, rewritten)
    assert torch.equal(state, new_state)


def test_a_dataset_class_still_answers_one_index_as_before() -> None:
    source = _class_source(CLASS_CASES["windows, views of one chunk"])
    rewritten = rewrite(source, select=["OPT104"]).source
    items = []
    for text in (source, rewritten):
        namespace: dict = {}
        torch.manual_seed(0)
        exec(compile(text.partition("loader = ")[0], "<items>", "exec"), namespace)
        items.append([namespace["data"][i] for i in (0, 5, len(namespace["data"]) - 1)])
    _assert_same(items[0], items[1])


def test_a_wrong_batched_form_would_be_caught() -> None:
    """The comparison can fail: `flatten()` kept as is in the branch flattens the batch."""
    source = _class_source(CLASS_CASES["normalised flattened image and label"])
    rewritten = rewrite(source, select=["OPT104"]).source
    broken = rewritten.replace("image.reshape(len(index), -1)", "image.flatten()", 1)
    assert broken != rewritten
    with pytest.raises((AssertionError, RuntimeError)):
        _assert_same(_batches(source)[0], _batches(broken)[0])


CLASS_DECLINED = {
    "return self.tokens[index : index + self.context + 3]": "may run past its end",
    "return self.tokens[index - 1 : index + self.context]": "is not the index plus a number",
    "return self.tokens[index + -1 : index + self.context]": "may start before the index",
    "return self.images[index] - self.images[0]": "combines two values",
    "return self.images[index].exp()": "calls `.exp()`",
    "if index < 0:\n    index += len(self)\nreturn self.images[index]": "a statement other",
    "return self.images[index], index": "is not a tensor of the item",
    "return self.images[index * 2]": "is not `self.X[index]` or a window",
    "return tokens[index]": "indexes something other than a tensor attribute",
    "x = self.images[index]\nreturn x[index]": "indexes an item other than by slices",
}


@pytest.mark.parametrize("body, reason", CLASS_DECLINED.items(), ids=list(CLASS_DECLINED))
def test_a_dataset_class_without_an_exact_batched_form_says_why(body: str, reason: str) -> None:
    result = rewrite(_class_source(body), select=["OPT104"], why_not=True)
    assert not result.changed
    (diagnostic,) = result.diagnostics
    assert diagnostic.status is Status.DECLINED
    assert "`Items`, defined here, which cannot fetch a list of indices" in diagnostic.message
    assert reason in diagnostic.message


def test_a_dataset_class_whose_tensors_are_unknown_is_left_alone() -> None:
    base = _class_source(CLASS_CASES["windows, views of one chunk"])
    cases = (
        ("tokens = torch.randint(0, 50, (203,))", "tokens = list(range(203))", "`self.tokens`"),
        ("data = Items(tokens)", "data = Items(tokens)\nother = Items", "used other than by"),
    )
    for old, new, reason in cases:
        source = base.replace(old, new, 1)
        assert source != base
        result = rewrite(source, select=["OPT104"], why_not=True)
        assert not result.changed
        assert reason in result.diagnostics[0].message

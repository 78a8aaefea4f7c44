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


def test_the_in_memory_reference_workload_gets_the_rule_and_the_per_item_ones_say_why() -> None:
    models = ROOT / "reference_models"
    sudoku = rewrite((models / "sudoku_diffusion" / "train.py").read_text(), select=["OPT104"])
    assert [d.status for d in sudoku.diagnostics] == [Status.FIXED]
    for name in ("sgld_mnist", "char_transformer"):
        source = (models / name / "train.py").read_text()
        result = rewrite(source, select=["OPT104"], why_not=True)
        assert not result.changed
        assert result.diagnostics and all(
            "`__getitem__` is not known to return a whole batch" in d.message
            for d in result.diagnostics
        )


def test_an_import_line_the_fix_makes_too_long_is_laid_out_as_black_does() -> None:
    source = SCRIPT.format(call="DataLoader(data, batch_size=8, shuffle=True)").replace(
        "from torch.utils.data import DataLoader, TensorDataset",
        "from torch.utils.data import DataLoader, SequentialSampler, TensorDataset, Subset",
    )
    result = rewrite(source, select=["OPT104"])
    assert (
        "from torch.utils.data import (\n    BatchSampler,\n    RandomSampler,\n"
        "    DataLoader,\n    SequentialSampler,\n    TensorDataset,\n    Subset,\n)\n"
    ) in result.source


def test_an_annotated_loader_is_fixed() -> None:
    source = SCRIPT.format(call=CASES["shuffled"]).replace("loader = ", "loader: DataLoader = ")
    assert rewrite(source, select=["OPT104"]).changed

"""The parts of a custom collate function's tuple batches that are tensors it builds
(analysis/collates.py): OPT201 makes copies of those parts non-blocking, in the file that
builds the loader and in a file that imports it (pytorch-tutorial's image captioning)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import FrozenSet

import libcst as cst
import pytest

from conftest import messages_by_code
from optimizer_codemod import runner
from optimizer_codemod.analysis.collates import loop_part, tensor_parts
from optimizer_codemod.analysis.project import from_json, project_facts, to_json
from optimizer_codemod.analysis.script import ScriptFacts
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import Status

CAPTIONS = """\
def collate_fn(data):
    images, captions = zip(*data)
    images = torch.stack(images, 0)
    lengths = [len(cap) for cap in captions]
    targets = torch.zeros(len(captions), max(lengths)).long()
    for i, cap in enumerate(captions):
        targets[i, : lengths[i]] = cap[: lengths[i]]
    return images, targets, lengths
"""


def parts(body: str) -> FrozenSet[int]:
    module = cst.parse_module("import torch\nfrom torch.nn.utils.rnn import pad_sequence\n" + body)
    facts = ScriptFacts.of(module)
    function = next(s for s in module.body if isinstance(s, cst.FunctionDef))
    return tensor_parts(facts, function)


@pytest.mark.parametrize(
    "body, expected",
    [
        (CAPTIONS, {0, 1}),
        ("def c(b):\n    return torch.stack(b), pad_sequence(b).float(), len(b)\n", {0, 1}),
        # bound again after the tensor: a list
        ("def c(b):\n    x = torch.stack(b)\n    x = list(x)\n    return x, torch.cat(b)\n", {1}),
        # bound in a branch after the tensor: either may reach the return
        (
            "def c(b):\n    x = torch.stack(b)\n    if b:\n        x = b\n    return (x,)\n",
            set(),
        ),
        # every return counts, and they must agree in length
        (
            "def c(b):\n    if b:\n        return torch.stack(b), b\n    return torch.cat(b), b\n",
            {0},
        ),
        ("def c(b):\n    if b:\n        return (torch.stack(b),)\n    return b\n", set()),
        ("def c(b):\n    return torch.stack(b), torch.stack(b)\n    return (b,)\n", set()),
        # a tensor the function is handed is not one it builds
        ("def c(b):\n    x = b[0]\n    return x, b\n", set()),
        ("def c(b):\n    yield torch.stack(b), b\n", set()),
    ],
)
def test_the_parts_a_collate_function_fills_with_tensors(body: str, expected) -> None:
    assert parts(body) == frozenset(expected)


@pytest.mark.parametrize(
    "loop, name, expected",
    [
        ("for x, y in loader: pass", "y", 1),
        ("for i, (x, y, n) in enumerate(loader): pass", "x", 0),
        ("for i, (x, y) in enumerate(loader): pass", "i", None),
        ("for batch in loader: pass", "batch", None),
        ("for x, *rest in loader: pass", "x", 0),
        ("for *head, y in loader: pass", "y", None),  # after a starred part: not known
    ],
)
def test_the_part_of_the_batch_a_loop_binds_to_a_name(loop: str, name: str, expected) -> None:
    facts = ScriptFacts.of(cst.parse_module(loop + "\n"))
    assert loop_part(facts.records.loops[0], name) == expected


DATA = """\
import torch
from torch.utils.data import DataLoader

{collate}

def get_loader(dataset):
    return DataLoader(dataset, batch_size=4, collate_fn=collate_fn, pin_memory=True)
"""
TRAIN = """\
import torch
from data import get_loader

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
data_loader = get_loader(dataset)
for epoch in range(3):
    for i, (images, captions, lengths) in enumerate(data_loader):
        images = images.to(device)
        captions = captions.to(device)
        loss = model(images, captions, lengths)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize(
    "collate, fixed",
    [
        (CAPTIONS, ["images", "captions"]),
        (CAPTIONS.replace("    images = torch.stack(images, 0)\n", ""), ["captions"]),
    ],
)
def test_a_loader_built_in_another_module_tells_its_tensor_parts(
    tmp_path: Path, collate: str, fixed
) -> None:
    (tmp_path / "data.py").write_text(DATA.format(collate=collate))
    (tmp_path / "train.py").write_text(TRAIN)
    paths = [str(tmp_path / "train.py"), str(tmp_path / "data.py")]
    settings = Settings(root=str(tmp_path), select=("OPT201",), why_not=True)
    [train, _] = runner.run(paths, settings, runner.Mode(write=False, keep_text=True))
    assert [m.split("`")[1] for m in messages_by_code(train, Status.FIXED)["OPT201"]] == fixed
    left = messages_by_code(train, Status.DECLINED).get("OPT201", [])
    assert len(left) == 2 - len(fixed)
    assert all("custom `collate_fn`" in reason for reason in left)
    assert train.new_text.decode().count("non_blocking=True") == len(fixed)
    index = project_facts(paths)
    [loader] = index[paths[0]].imported_loaders
    assert loader.tensor_parts == ((0, 1) if len(fixed) == 2 else (1,))
    # the results cache keeps the index as JSON: it must come back equal, or every cached
    # run would look at files again for facts that did not change
    assert from_json(json.loads(json.dumps(to_json(index)))) == index

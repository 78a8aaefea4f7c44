"""Names that lead back to themselves, and chains of names of any length, are followed to the
end: a value is on the device exactly when something its names reach places it there.

yunjey/pytorch-tutorial's CocoDataset reads `vocab = self.vocab` in one method and sets
`self.vocab = vocab` in another; followed with a depth limit, the cycle ran out of depth and
its loader was taken to hold device tensors (no pinned memory). The graph is now settled one
strongly connected component at a time (analysis/reachability.py)."""

from __future__ import annotations

import libcst as cst
import pytest

from optimizer_codemod.analysis import ScriptFacts
from optimizer_codemod.analysis.devices import may_live_on_accelerator
from optimizer_codemod.analysis.reachability import reaches_seed
from optimizer_codemod.analysis.values import value_sources


def _reaches(edges: dict, seeds: set, start, memo=None) -> bool:
    memo = {} if memo is None else memo
    return reaches_seed(start, lambda n: edges.get(n, ()), seeds.__contains__, memo)


def test_a_cycle_without_a_seed_reaches_none_and_one_with_a_way_out_reaches_it() -> None:
    cycle = {"a": ["b"], "b": ["c"], "c": ["a"]}
    assert _reaches(cycle, set(), "a") is False
    assert _reaches({**cycle, "c": ["a", "out"]}, {"out"}, "a") is True
    assert _reaches({**cycle, "c": ["a", "out"]}, {"out"}, "b") is True


def test_every_member_of_a_settled_cycle_is_kept_with_the_cycles_answer() -> None:
    # Asked from `a`, the walk enters `b` and `c` while `a` is still open: none of them may be
    # answered "no" before the whole cycle is settled, and then all of them are.
    edges = {"a": ["b"], "b": ["c", "a"], "c": ["b", "d"], "d": ["e"], "e": []}
    memo: dict = {}
    assert _reaches(edges, {"e"}, "a", memo) is True
    assert memo == {"a": True, "b": True, "c": True, "d": True, "e": True}
    memo = {}
    assert _reaches(edges, set(), "a", memo) is False
    assert set(memo) == {"a", "b", "c", "d", "e"} and not any(memo.values())


def test_a_node_settled_earlier_in_the_same_walk_is_not_walked_again() -> None:
    asked = []

    def successors(node):
        asked.append(node)
        return {"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}[node]

    assert reaches_seed("a", successors, lambda n: False, {}) is False
    assert sorted(asked) == ["a", "b", "c", "d"]


def test_a_chain_longer_than_the_recursion_limit_is_walked() -> None:
    length = 50_000
    edges = {i: [i + 1] for i in range(length)}
    assert _reaches(edges, {length}, 0) is True
    assert _reaches(edges, set(), 0) is False


HEAD = "import torch\ndevice = 'cuda'\n"


def _lives(source: str, name: str) -> bool:
    facts = ScriptFacts.of(cst.parse_module(HEAD + source))
    values = [a.value for a in facts.assignments_to(name)]
    return any(may_live_on_accelerator(facts, value) for value in values)


def _chain(first: str, length: int) -> str:
    lines = [f"v0 = {first}"] + [f"v{i} = v{i - 1} * 2" for i in range(1, length)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("length", [3, 12, 40])
def test_a_chain_of_names_is_followed_to_its_first_value(length: int) -> None:
    last = f"v{length - 1}"
    assert _lives(_chain("torch.randn(4).to(device)", length), last) is True
    # Beyond four names the old walk gave up and answered "may".
    assert _lives(_chain("torch.randn(4)", length), last) is False


@pytest.mark.parametrize(
    "source, name, lives",
    [
        ("a = b\nb = a\n", "a", False),
        # `b` is on the device through `a`: an answer for `b` found while `a` was still open
        # must not be kept as "no".
        ("a = b\nb = a\na = torch.zeros(3).cuda()\n", "b", True),
        (
            "class Items:\n"
            "    def __init__(self, vocab):\n        self.vocab = vocab\n"
            "    def get(self):\n        vocab = self.vocab\n        return vocab\n"
            "items = Items(torch.zeros(3))\n",
            "items",
            False,
        ),
        (
            "class Items:\n"
            "    def __init__(self, vocab):\n        self.vocab = vocab\n"
            "    def get(self):\n        vocab = self.vocab\n        return vocab\n"
            "items = Items(torch.zeros(3))\nvocab = torch.zeros(3, device=device)\n",
            "items",
            True,
        ),
    ],
)
def test_names_that_lead_back_to_themselves(source: str, name: str, lives: bool) -> None:
    assert _lives(source, name) is lives


SCOPES = """\
def get_loader(root):
    coco = Coco(root)
    return coco


def other(self):
    coco = self.coco
    return coco
"""


def _sources(source: str, name: str, function: str):
    facts = ScriptFacts.of(cst.parse_module(source))
    found = value_sources(facts, name, facts.records.functions[function])
    return None if found is None else [cst.Module([]).code_for_node(s.value) for s in found]


def test_a_functions_own_variable_is_its_own_assignments() -> None:
    assert _sources(SCOPES, "coco", "get_loader") == ["Coco(root)"]
    assert _sources(SCOPES, "coco", "other") == ["self.coco"]


@pytest.mark.parametrize(
    "binding",
    [
        "    global coco\n",
        "    for coco in range(2):\n        pass\n",
        "    with open(root) as coco:\n        pass\n",
        "    def inner():\n        nonlocal coco\n        coco = 1\n",
        "    del coco\n",
    ],
)
def test_a_variable_bound_another_way_too_is_not_answered_by_its_assignments(
    binding: str,
) -> None:
    source = SCOPES.replace("    return coco\n", binding + "    return coco\n", 1)
    assert _sources(source, "coco", "get_loader") is None

"""Which parts of a custom collate function's batches are tensors it builds.

With a custom `collate_fn`, a batch may hold objects of the user's own classes whose `.to()`
takes no `non_blocking` (DETR's `NestedTensor.to(device)`), so OPT201 leaves copies of its
parts alone. A collate function of the file whose every `return` gives a tuple of the same
length tells more: where an element is a tensor the function builds, the loop's name for that
part holds a tensor. pytorch-tutorial's image captioning collate,

    images, captions = zip(*data)
    images = torch.stack(images, 0)
    lengths = [len(cap) for cap in captions]
    targets = torch.zeros(len(captions), max(lengths)).long()
    for i, cap in enumerate(captions):
        targets[i, :end] = cap[:end]
    return images, targets, lengths

returns tensors at positions 0 and 1: `for i, (images, captions, lengths) in
enumerate(data_loader)` binds tensors to `images` and `captions`.

A name in a `return` counts when the function binds it last, before the `return`, by an
assignment at the top of its body to such a tensor, and nothing binds it after that (a
store into an element, `targets[i, :end] = ...`, keeps the tensor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, FrozenSet, Optional, Sequence

import libcst as cst

from optimizer_codemod.analysis.collect import names_bound_otherwise, target_names
from optimizer_codemod.analysis.devices import HOST_VIEW_METHODS
from optimizer_codemod.analysis.factories import FACTORIES
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.loaders import DEFAULT_COLLATES
from optimizer_codemod.analysis.nodes import find_all, is_name

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.collect import Loop
    from optimizer_codemod.analysis.script import ScriptFacts

# Calls that build a new tensor whatever their arguments are: torch's factories, and these.
TENSOR_BUILDERS = (
    frozenset(FACTORIES)
    | DEFAULT_COLLATES
    | {f"torch.{name}" for name in ("stack", "cat", "as_tensor", "from_numpy")}
    | {"torch.LongTensor", "torch.FloatTensor", "torch.nn.utils.rnn.pad_sequence"}
)
# Methods of a tensor that give a tensor: its views and conversions, and a copy.
TENSOR_METHODS = HOST_VIEW_METHODS | {"clone"}


def tensor_parts(facts: "ScriptFacts", function: cst.FunctionDef) -> FrozenSet[int]:
    """Positions of the tuple every `return` of `function` gives that hold a tensor the
    function builds; empty when a `return` gives anything but a tuple of one length."""
    body = function.body
    if not isinstance(body, cst.IndentedBlock) or find_all(body, cst.Yield):
        return frozenset()
    returns = find_all(body, cst.Return)
    if not returns or find_all(body, cst.FunctionDef, cst.ClassDef):
        return frozenset()  # a `return` found may belong to a nested scope
    tuples = [r.value for r in returns]
    if not all(isinstance(t, cst.Tuple) for t in tuples):
        return frozenset()
    sizes = {len(t.elements) for t in tuples}
    if len(sizes) != 1 or any(
        isinstance(e, cst.StarredElement) for t in tuples for e in t.elements
    ):
        return frozenset()
    return frozenset(
        index
        for index in range(sizes.pop())
        if all(_builds_tensor(facts, body.body, r, r.value.elements[index].value) for r in returns)
    )


def _builds_tensor(
    facts: "ScriptFacts",
    statements: Sequence[cst.BaseStatement],
    returned: cst.Return,
    value: cst.BaseExpression,
) -> bool:
    if isinstance(value, cst.Name):
        bound = _last_binding(statements, returned, value.value)
        return bound is not None and _builds_tensor(facts, (), returned, bound)
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    if isinstance(func, cst.Attribute) and func.attr.value in TENSOR_METHODS:
        if facts.qualified_name(func) not in TENSOR_BUILDERS:
            return _builds_tensor(facts, statements, returned, func.value)
    return facts.qualified_name(func) in TENSOR_BUILDERS


def _last_binding(
    statements: Sequence[cst.BaseStatement], returned: cst.Return, name: str
) -> Optional[cst.BaseExpression]:
    """The value of the last top-level `name = value` before the top-level `return
    returned`, when no statement binds `name` after it; else None."""
    last: Optional[cst.BaseExpression] = None
    for statement in statements:
        if isinstance(statement, cst.SimpleStatementLine) and returned in statement.body:
            return last
        single = _single_assignment(statement, name)
        if single is not None:
            last = single
        elif _binds(statement, name):
            last = None
    return None  # the `return` is inside a block


def _single_assignment(statement: cst.BaseStatement, name: str) -> Optional[cst.BaseExpression]:
    """`value` of a statement that is only `name = value`."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        if is_name(small.targets[0].target, name):
            return small.value
    return None


def _binds(statement: cst.CSTNode, name: str) -> bool:
    """`statement` binds `name` (by assignment, or otherwise: collect.names_bound_otherwise)."""
    assigned = find_all(statement, cst.AssignTarget, cst.AugAssign, cst.AnnAssign)
    return name in names_bound_otherwise(statement) or any(
        name in target_names(node.target) for node in assigned
    )


def loop_part(loop: "Loop", name: str) -> Optional[int]:
    """The position in the loop's batch of the part its target binds to `name`: `x` in `for
    x, y in loader` (0), `y` in `for i, (x, y) in enumerate(loader)` (1); None otherwise."""
    node = loop.node
    if not isinstance(node, cst.For):
        return None
    target, iterated = node.target, node.iter
    if isinstance(iterated, cst.Call) and is_name(iterated.func, "enumerate"):
        if not (isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2):
            return None
        target = target.elements[1].value
    if not isinstance(target, (cst.Tuple, cst.List)):
        return None
    for index, element in enumerate(target.elements):
        if isinstance(element, cst.StarredElement):
            return None
        if is_name(element.value, name):
            return index
    return None


def collate_function(facts: "ScriptFacts", value: cst.BaseExpression) -> Optional[cst.FunctionDef]:
    """The module-level function of the file a `collate_fn=` value names."""
    name = dotted_name(value)
    found = facts.top_level_definitions.get(name or "")
    if isinstance(found, cst.FunctionDef) and not found.decorators:
        return found
    return None

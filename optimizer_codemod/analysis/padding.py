"""Batches padded by hand to their largest item.

A collate function that does by hand what `pad_sequence` does makes batches change shape as
surely: DETR's `nested_tensor_from_tensor_list` sizes a tensor by the largest image of the
batch and copies each image into its corner,

    max_size = _max_by_axis([list(img.shape) for img in tensor_list])
    tensor = torch.zeros([len(tensor_list)] + max_size, ...)
    for img, pad_img in zip(tensor_list, tensor):
        pad_img[: img.shape[0], : img.shape[1], : img.shape[2]].copy_(img)

and a text collate writes `padded[i, : len(seq)] = seq` into `torch.zeros(len(batch),
max_len)`. Both show, in one function (or at module level):

- a tensor allocated with a size that comes from a maximum computed there (`max(...)`,
  `lengths.max()`, `np.amax`, a helper named `_max_by_axis`), directly or through a few
  assignments;
- an item copied into a slice of a tensor whose bounds are that item's own extent
  (`len(item)`, `item.shape[k]`, `item.size(k)`), by assignment or `.copy_(item)`.

Neither alone is padding: `x[:, :n]` slices, `buf[: len(x)] = x` into a buffer allocated once
with a fixed size (a ring buffer) or padding to a constant `MAX_LEN` keep one shape, so they
are left out; so is a bound read from elsewhere (`padded[i, : lengths[i]] = seq`), which the
analysis cannot tie to the item. A name the scope binds once to the item's extent
(`mel_size = mel.size(1)`, then `mels[bid, :, :mel_size] = mel`) is that extent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Set

import libcst as cst

from optimizer_codemod.analysis.calls import callee_name, method_name, positional
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all, is_name

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.collect import CallSite
    from optimizer_codemod.analysis.script import ScriptFacts

# A regular expression every hand padding matches (a slice bounded by an item's own extent),
# for the triggers of rules that ask: `[: len(`, `[i, :x.shape[`, `[0:x.size(`, and a slice
# that ends at a name, which may be bound to the extent (`[bid, :, :mel_size]`).
SLICE_TO_OWN_EXTENT = r"\[[^\]\n]*:\s*(?:len\s*\(|\w+\s*\.\s*(?:shape\s*\[|size\s*\()|\w+\s*\])"
ALLOCATIONS = frozenset(
    f"{module}.{kind}"
    for module in ("torch", "numpy")
    for kind in ("zeros", "ones", "full", "empty")
)
ALLOCATING_METHODS = ("new_zeros", "new_ones", "new_full", "new_empty")
# How many assignments a maximum may pass through before it sizes the tensor: DETR's goes
# `max_size` -> `batch_shape` -> `torch.zeros(batch_shape)`.
MAX_STEPS = 3


@dataclass(frozen=True)
class HandPadding:
    allocation: "CallSite"  # the tensor sized by the largest item: `torch.zeros(b, longest)`
    copy: cst.CSTNode  # an item copied into its own extent of a tensor: `padded[i, :len(s)] = s`


def hand_padding(facts: "ScriptFacts") -> List[HandPadding]:
    """Every allocation of this file, in source order, that pads a batch by hand (the module
    docstring says what counts), with the first copy of an item in the same scope."""
    memo = facts.memo("hand_padding")
    if "found" not in memo:
        memo["found"] = _find_hand_padding(facts)
    return memo["found"]


def pads_by_hand(facts: "ScriptFacts", call: "CallSite") -> Optional[HandPadding]:
    """The hand padding whose allocation is `call`, else None."""
    memo = facts.memo("hand_padding")
    if "by_call" not in memo:
        memo["by_call"] = {id(found.allocation.node): found for found in hand_padding(facts)}
    return memo["by_call"].get(id(call.node))


def _find_hand_padding(facts: "ScriptFacts") -> List[HandPadding]:
    maxima: Dict[int, List["CallSite"]] = {}
    for call in facts.records.calls:
        if _is_maximum(call.node):
            maxima.setdefault(id(call.site.function), []).append(call)
    found: List[HandPadding] = []
    for calls in maxima.values():
        function = calls[0].site.function
        sized = _sized_by_a_maximum(facts, function, calls)
        if not sized:
            continue
        copy = _first_copy_into_own_extent(facts, function)
        if copy is not None:
            found.extend(HandPadding(allocation, copy) for allocation in sized)
    return sorted(found, key=lambda f: f.allocation.site.order)


def _is_maximum(call: cst.Call) -> bool:
    """`max(...)`, `x.max()`, `np.amax(...)`, `_max_by_axis(...)`; not `argmax`, nor a
    pooling layer (`max_pool2d`), whose output is no size."""
    words = (callee_name(call) or "").lower().split("_")
    return ("max" in words or "amax" in words) and not any("pool" in w for w in words)


def _sized_by_a_maximum(
    facts: "ScriptFacts", function: Optional[cst.FunctionDef], maxima: List["CallSite"]
) -> List["CallSite"]:
    """The allocations of `function`'s own scope whose size comes from one of `maxima`."""
    maximum_ids = {id(call.node) for call in maxima}
    assignments = facts.in_function("assignments", function)
    reads = [
        (a.target, {n.value for n in find_all(a.value, cst.Name)}, find_all(a.value, cst.Call))
        for a in assignments
    ]
    derived: Set[str] = {
        target for target, _, calls in reads if any(id(c) in maximum_ids for c in calls)
    }
    for _ in range(MAX_STEPS - 1):
        more = {target for target, names, _ in reads if names & derived} - derived
        if not more:
            break
        derived |= more
    sized = []
    for call in facts.in_function("calls", function):
        if call.qualname in ALLOCATIONS or call.method in ALLOCATING_METHODS:
            sizes = positional(call.node)
            if call.qualname in ("torch.full", "numpy.full") or call.method == "new_full":
                sizes = sizes[:1]  # the rest is the fill value
            if any(_mentions(arg.value, derived, maximum_ids) for arg in sizes):
                sized.append(call)
    return sized


def _mentions(node: cst.BaseExpression, names: Set[str], calls: Set[int]) -> bool:
    return any(
        (isinstance(inner, cst.Name) and inner.value in names) or id(inner) in calls
        for inner in find_all(node, cst.Name, cst.Call)
    )


def _first_copy_into_own_extent(
    facts: "ScriptFacts", function: Optional[cst.FunctionDef]
) -> Optional[cst.CSTNode]:
    """`padded[i, : len(seq)] = seq` or `pad[: img.shape[0]].copy_(img)` in `function`
    (nested functions included; at module level, outside functions and classes)."""
    if function is not None:
        scopes: List[cst.CSTNode] = [function.body]
    else:
        scopes = [
            s for s in facts.module.body if not isinstance(s, (cst.FunctionDef, cst.ClassDef))
        ]
    extents = _extent_names(facts, function)
    for scope in scopes:
        for node in find_all(scope, cst.Assign, cst.Call):
            if isinstance(node, cst.Assign):
                if len(node.targets) == 1 and _into_own_extent(
                    node.targets[0].target, _item(node.value), extents
                ):
                    return node
            elif method_name(node) == "copy_" and len(node.args) == 1:
                assert isinstance(node.func, cst.Attribute)
                if _into_own_extent(node.func.value, _item(node.args[0].value), extents):
                    return node
    return None


def _extent_names(facts: "ScriptFacts", function: Optional[cst.FunctionDef]) -> Dict[str, str]:
    """Names the scope binds once, to an item's extent: `mel_size = mel.size(1)` (StyleTTS2's
    collate, then `mels[bid, :, :mel_size] = mel`), by name to the item's name."""
    assignments = facts.in_function("assignments", function)
    counts: Dict[str, int] = {}
    for assignment in assignments:
        counts[assignment.target] = counts.get(assignment.target, 0) + 1
    extents = {}
    for assignment in assignments:
        item = _extent_of(assignment.value) if counts[assignment.target] == 1 else None
        if item is not None and not assignment.unpacked:
            extents[assignment.target] = item
    return extents


def _item(value: cst.BaseExpression) -> Optional[str]:
    """The item a copy writes: `seq`, or `seq` in `torch.tensor(seq)`."""
    if isinstance(value, cst.Call):
        args = positional(value)
        value = args[0].value if len(args) == 1 else value
    return dotted_name(value)


def _into_own_extent(
    target: cst.BaseExpression, item: Optional[str], extents: Dict[str, str]
) -> bool:
    """`target` is a slice of a tensor bounded by `item`'s own extent on at least one axis,
    from the start (`[i, : len(item)]`, `[: item.shape[0], : item.shape[1]]`), and indexes
    the other axes whole or at one position."""
    if item is None or not isinstance(target, cst.Subscript):
        return False
    bounded = False
    for element in target.slice:
        part = element.slice
        if isinstance(part, cst.Index):
            continue
        if part.step is not None or not (part.lower is None or _zero(part.lower)):
            return False
        if part.upper is None:
            continue
        bound = part.upper
        named = extents.get(bound.value) if isinstance(bound, cst.Name) else None
        if (_extent_of(bound) or named) != item:
            return False
        bounded = True
    return bounded


def _zero(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Integer) and node.value == "0"


def _extent_of(node: cst.BaseExpression) -> Optional[str]:
    """`x` for `len(x)`, `x.shape[k]`, `x.size(k)`, `x.size()[k]`, else None."""
    if isinstance(node, cst.Call):
        if is_name(node.func, "len") and len(node.args) == 1:
            return dotted_name(node.args[0].value)
        if method_name(node) == "size" and len(node.args) == 1:
            assert isinstance(node.func, cst.Attribute)
            return dotted_name(node.func.value)
        return None
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        if not isinstance(node.slice[0].slice, cst.Index):
            return None
        shape = node.value
        if isinstance(shape, cst.Attribute) and shape.attr.value == "shape":
            return dotted_name(shape.value)
        if isinstance(shape, cst.Call) and method_name(shape) == "size" and not shape.args:
            assert isinstance(shape.func, cst.Attribute)
            return dotted_name(shape.func.value)
    return None

"""Host-to-device copies of DataLoader batches in training loops: which may go asynchronous.

A copy `x.to(device, non_blocking=True)` returns before the data has arrived. That is sound
when the copy goes from host memory to a CUDA device (the copy and every later kernel run in
order on one stream, and the caching host allocator keeps a pinned source alive until the
copy is done), and when the target turns out to be the CPU (the call returns `x` itself).
It is not sound the other way (a device-to-host copy read before it lands), towards MPS
(pytorch/pytorch#139550: silently wrong values), nor when the host tensor is written while
the copy may still be reading it. Everything here is conservative in one direction: when the
analysis cannot tell, the copy is left out, or only reported when the target device is the
one unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.nodes import find_all, is_name
from optimizer_codemod.analysis.calls import (
    has_double_star,
    has_star_args,
    keyword,
    positional,
)
from optimizer_codemod.analysis.collect import CallSite, Loop, target_names
from optimizer_codemod.analysis.devices import (
    copy_target,
    device_types,
    is_dtype,
    places_on_accelerator,
)
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.loaders import DEFAULT_COLLATES, loops_over, option
from optimizer_codemod.analysis.script import DATALOADER, derived_root

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

# Device types to which an asynchronous copy from the host is sound without synchronising.
ASYNC_SOUND_TYPES = frozenset({"cuda", "cpu"})
# Keywords each copy method may carry besides the ones that fix the target (no non_blocking).
TO_KEYWORDS = frozenset({"device", "dtype", "copy", "memory_format"})
CUDA_KEYWORDS = frozenset({"device", "memory_format"})
_IN_PLACE = re.compile(r"^[a-z][a-z0-9_]*[a-z0-9]_$")
MAX_DEPTH = 3


@dataclass(frozen=True)
class BatchCopy:
    """`x.to(device)` or `x.cuda()` of (part of) a batch from a pinned DataLoader."""

    call: CallSite
    loop: Loop  # the loop over the loader
    # Device types the copy may go to; None when the device is decided where the analysis
    # cannot see (an argument, a config value): then MPS cannot be ruled out.
    target_types: Optional[FrozenSet[str]]

    @property
    def async_is_sound(self) -> bool:
        return self.target_types is not None and self.target_types <= ASYNC_SOUND_TYPES


def blocking_batch_copies(facts: "ScriptFacts") -> List[BatchCopy]:
    """Blocking copies of pinned batches to a device that is CUDA or may be, in training loops.

    Left out: copies whose target may be a non-CUDA accelerator, whose source may already be
    on the device (a device-to-host copy), whose source is written in the loop, which already
    choose `non_blocking`, whose arguments are hidden in `*args`/`**kwargs`, and, with a custom
    `collate_fn`, copies of a whole batch (it may be an object whose `.to` takes no
    `non_blocking`).
    """
    found: List[BatchCopy] = []
    for loop, loaders in _pinned_batch_loops(facts):
        names = facts.names_derived_in(loop, set(loop.targets))
        custom_collate = any(_custom_collate(facts, loader) for loader in loaders)
        for call in facts.loop_calls(loop):
            copy = _batch_copy(facts, call, loop, names, custom_collate)
            if copy is not None:
                found.append(copy)
    return found


def _pinned_batch_loops(facts: "ScriptFacts") -> List[Tuple[Loop, List[CallSite]]]:
    """Loops over pinned loaders that train: a training loop or one of its enclosing loops."""
    training: Set[int] = set()
    for loop in facts.training_loops:
        training.update(id(outer) for outer in (loop, *loop.ancestors))
    loaders_of: Dict[int, Tuple[Loop, List[CallSite]]] = {}
    for site in facts.dataloader_constructions():
        for loop in loops_over(facts, site):
            if id(loop) in training:
                loaders_of.setdefault(id(loop), (loop, []))[1].append(site)
    return [
        (loop, loaders)
        for loop, loaders in loaders_of.values()
        if all(facts.is_pinned(loader) for loader in loaders)
        and (facts.loader_of(loop) is not None or _only_loaders_passed(facts, loop))
    ]


def _only_loaders_passed(facts: "ScriptFacts", loop: Loop) -> bool:
    """`for batch in loader` over a parameter: every caller passes a DataLoader built here.

    Another iterable could yield objects whose `.to` takes no `non_blocking`, or tensors
    already on the device.
    """
    name = facts.iterated_name(loop.iter)
    if loop.function is None or name is None or name not in _parameter_names(loop.function):
        return False
    values = parameter_values(facts, loop.function, name)
    if values is None:
        return False
    for value in values:
        site = facts.call_site_of.get(value) if isinstance(value, cst.Call) else None
        if site is None or site.qualname != DATALOADER:
            site = facts.loader_named(dotted_name(value) or "")
        if site is None:
            return False
    return True


def _custom_collate(facts: "ScriptFacts", loader: CallSite) -> bool:
    arg = option(loader.node, "collate_fn")
    if arg is None or is_name(arg.value, "None"):
        return False
    return facts.qualified_name(arg.value) not in DEFAULT_COLLATES


def _batch_copy(
    facts: "ScriptFacts", call: CallSite, loop: Loop, names: Set[str], custom_collate: bool
) -> Optional[BatchCopy]:
    node = call.node
    if call.method not in ("to", "cuda") or not isinstance(node.func, cst.Attribute):
        return None
    source = node.func.value
    if not facts.derives_from(source, names) or not _plain_arguments(facts, node, call.method):
        return None
    if not places_on_accelerator(facts, node):
        return None
    if custom_collate and not _element_of_batch(facts, source, loop, names):
        return None
    chain = _host_chain(facts, source, loop, names, call.site.statement)
    if chain is None or _written(facts, loop, chain, call.site.statement):
        return None
    types = (
        frozenset({"cuda"})
        if call.method == "cuda"
        else _target_types(facts, copy_target(facts, node), call)
    )
    if types is not None and not types <= ASYNC_SOUND_TYPES:
        return None
    return BatchCopy(call, loop, types)


def _plain_arguments(facts: "ScriptFacts", call: cst.Call, method: str) -> bool:
    """The call names its target and options plainly and leaves `non_blocking` unset."""
    if has_star_args(call) or has_double_star(call):
        return False
    keywords = {arg.keyword.value for arg in call.args if arg.keyword is not None}
    args = positional(call)
    if method == "cuda":  # cuda(device=None, non_blocking=False, memory_format=...)
        return len(args) <= 1 and keywords <= CUDA_KEYWORDS
    # to(device, dtype, non_blocking, copy) or to(other, non_blocking, copy)
    if not keywords <= TO_KEYWORDS or len(args) > 2:
        return False
    if len(args) == 2:
        second = args[1].value
        return is_dtype(facts, second) or (dotted_name(second) or "").endswith("dtype")
    return True


def _host_chain(
    facts: "ScriptFacts",
    source: cst.BaseExpression,
    loop: Loop,
    names: Set[str],
    statement: Optional[cst.BaseStatement],
) -> Optional[Set[str]]:
    """The batch names `source` comes from, when all of them still hold host tensors.

    Every binding of each name inside the loop (other than in the copy's own statement,
    `x = x.to(device)`) must take a part of another batch name, never a computed value: a
    name rebound to `x.to(device)` or `model(x)` may live on the device, and a copy from it
    could be a device-to-host copy.
    """
    first = derived_root(source, names)
    if first is None:
        return None
    chain: Set[str] = set()
    pending = [first]
    while pending:
        name = pending.pop()
        if name in chain:
            continue
        chain.add(name)
        for assignment in facts.assignments_to(name):
            if loop not in assignment.site.loops or assignment.site.statement is statement:
                continue
            if assignment.augmented:
                continue  # an in-place update: see _written
            root = derived_root(assignment.value, names)
            if root is None:
                return None
            pending.append(root)
        for comprehension in facts.comprehensions_in(loop):
            if name in comprehension.targets:
                if comprehension.site.statement is statement:
                    root = derived_root(comprehension.iter, names)
                else:
                    root = None  # a comprehension elsewhere may compute anything
                if root is None:
                    return None
                pending.append(root)
    return chain


def _written(
    facts: "ScriptFacts",
    loop: Loop,
    chain: Set[str],
    statement: Optional[cst.BaseStatement],
) -> bool:
    """Some name of `chain` is written or rebound in the loop outside the copy's statement.

    A write after an asynchronous copy races with it (the copy may still read the pinned
    buffer); a store of a device tensor into the batch (`batch["x"] = ...`) makes a later copy
    from it a device-to-host copy. Either way, the copy stays as it is.
    """
    for call in facts.loop_calls(loop):
        if call.site.statement is statement or not isinstance(call.node.func, cst.Attribute):
            continue
        if _IN_PLACE.match(call.method or "") and _base(call.node.func.value) in chain:
            return True
    for assignment in facts.assignments_in(loop):
        if assignment.augmented:
            if assignment.site.statement is not statement and _base_of(assignment.target) in chain:
                return True
    own = getattr(statement, "body", ()) if isinstance(statement, cst.SimpleStatementLine) else ()
    for node in find_all(loop.node.body, cst.Assign, cst.AugAssign):
        if any(small is node for small in own):
            continue
        targets = (
            [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        )
        for target in targets:
            for part in _stored_parts(target):
                if _base(part) in chain:
                    return True
    # Rebound where the analysis records no assignment: an inner for, `with ... as`, `:=`.
    for inner in facts.loops_inside(loop):
        if chain & set(inner.targets):
            return True
    for item, site in facts.records.with_items:
        if loop in site.loops and item.asname is not None:
            if chain & set(target_names(item.asname.name)):
                return True
    return any(
        isinstance(walrus.target, cst.Name) and walrus.target.value in chain
        for walrus in find_all(loop.node.body, cst.NamedExpr)
    )


def _stored_parts(target: cst.BaseExpression) -> List[cst.BaseExpression]:
    """The subscripted or attribute targets of an assignment (`batch["x"]`, `a.b` in tuples)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [p for e in target.elements for p in _stored_parts(e.value)]
    if isinstance(target, cst.StarredElement):
        return _stored_parts(target.value)
    return [target] if isinstance(target, (cst.Subscript, cst.Attribute)) else []


def _base(node: cst.BaseExpression) -> Optional[str]:
    """`x` for `x`, `x[0]`, `x.data`, `x[0].view(-1)`."""
    while isinstance(node, (cst.Subscript, cst.Attribute, cst.Call)):
        node = node.func if isinstance(node, cst.Call) else node.value
    return node.value if isinstance(node, cst.Name) else None


def _base_of(dotted: str) -> str:
    return dotted.split(".", 1)[0]


def _element_of_batch(
    facts: "ScriptFacts", source: cst.BaseExpression, loop: Loop, names: Set[str]
) -> bool:
    """`source` is an entry of a batch (`batch["x"]`, a value of `batch.items()`), not a batch.

    With a custom `collate_fn`, a whole batch may be an object of the user's own class whose
    `.to()` takes no `non_blocking`; its entries are tensors in every collator we know of.
    """
    if isinstance(source, cst.Subscript):
        return True
    name = dotted_name(source)
    if name is None:
        return False
    bindings = [a for a in facts.assignments_to(name) if loop in a.site.loops]
    comprehensions = [c for c in facts.comprehensions_in(loop) if name in c.targets]
    if not bindings and not comprehensions:
        return False
    return all(not a.unpacked and isinstance(a.value, cst.Subscript) for a in bindings) and all(
        isinstance(c.iter, cst.Call)
        and isinstance(c.iter.func, cst.Attribute)
        and c.iter.func.attr.value in ("items", "values")
        for c in comprehensions
    )


def _target_types(
    facts: "ScriptFacts", target: Optional[cst.BaseExpression], call: CallSite
) -> Optional[FrozenSet[str]]:
    """The device types `target` may name, following a parameter to its callers' arguments."""
    if target is None:
        return None
    name = dotted_name(target)
    function = call.site.function
    if name is not None and function is not None and name in _parameter_names(function):
        values = parameter_values(facts, function, name)
        if values is None:
            return None
        found: FrozenSet[str] = frozenset()
        for value in values:
            types = device_types(facts, value)
            if types is None:
                return None
            found |= types
        return found
    return device_types(facts, target)


def _parameter_names(function: cst.FunctionDef) -> List[str]:
    params = function.params
    return [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]


def _calls_by_callee(facts: "ScriptFacts") -> Dict[str, List[CallSite]]:
    """Calls `f(...)` by `f`, and `self.f(...)`/`cls.f(...)` by `f`, in source order."""
    memo = facts.memo("calls_by_callee")
    if "table" not in memo:
        table: Dict[str, List[CallSite]] = {}
        for call in facts.records.calls:
            if isinstance(call.node.func, cst.Name):
                table.setdefault(call.node.func.value, []).append(call)
            elif call.method is not None and call.receiver in ("self", "cls"):
                table.setdefault(call.method, []).append(call)
        memo["table"] = table
    return memo["table"]


def _mentions(facts: "ScriptFacts") -> Dict[str, int]:
    """How many times each name is written in the file (one walk per pass, asked per copy)."""
    memo = facts.memo("name_mentions")
    if "counts" not in memo:
        counts: Dict[str, int] = {}
        for node in find_all(facts.module, cst.Name):
            counts[node.value] = counts.get(node.value, 0) + 1
        memo["counts"] = counts
    return memo["counts"]


def parameter_values(
    facts: "ScriptFacts", function: cst.FunctionDef, name: str
) -> Optional[Sequence[cst.BaseExpression]]:
    """What parameter `name` of `function` receives at every call by name in this file.

    None when some call hides it in `*args`/`**kwargs`, when there are no calls, or when the
    function is also used some other way (passed around, assigned): then its callers are
    unknown.
    """
    params = function.params
    positional_names = [p.name.value for p in (*params.posonly_params, *params.params)]
    method = bool(positional_names) and positional_names[0] in ("self", "cls")
    default = next(
        (
            p.default
            for p in (*params.posonly_params, *params.params, *params.kwonly_params)
            if p.name.value == name
        ),
        None,
    )
    callers = list(_calls_by_callee(facts).get(function.name.value, ()))
    if not callers or facts.assignments_to(function.name.value):
        return None
    # Used other than by these calls (passed to a thread, stored): its callers are unknown.
    if _mentions(facts).get(function.name.value, 0) > len(callers) + 1:
        return None
    values: List[cst.BaseExpression] = []
    for caller in callers:
        arg = keyword(caller.node, name)
        if arg is None and name in positional_names:
            index = positional_names.index(name) - (1 if method else 0)
            args = positional(caller.node)
            if has_star_args(caller.node):
                return None
            arg = args[index] if 0 <= index < len(args) else None
        if arg is None:
            if has_double_star(caller.node) or default is None:
                return None
            values.append(default)
        else:
            values.append(arg.value)
    return values

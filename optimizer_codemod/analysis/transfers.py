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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional, Set, Tuple, Union

import libcst as cst

from optimizer_codemod.analysis.batch_sources import batch_source, drawn_iterator
from optimizer_codemod.analysis.nodes import COMPREHENSIONS, find_all, is_name
from optimizer_codemod.analysis.calls import (
    argument,
    code_of,
    excerpt,
    has_double_star,
    has_star_args,
    keyword,
    literal,
    method_name,
    positional,
)
from optimizer_codemod.analysis.collect import CallSite, Loop, Site, target_names
from optimizer_codemod.analysis.collates import collate_function, loop_part, tensor_parts
from optimizer_codemod.analysis.cuda_runs import cuda_required_before
from optimizer_codemod.analysis.factories import FACTORIES
from optimizer_codemod.analysis.devices import (
    COPY_METHODS,
    DeviceKind,
    copy_target,
    device_kind,
    device_types,
    is_dtype,
    places_on_accelerator,
    CURRENT_ACCELERATOR,
    FLOATING_TENSOR_TYPES,
    holds_device_spec,
    is_device_object,
    is_device_object_or_none,
    taken_only_when_available,
    tensor_type_devices,
    tensor_types,
    type_conversion_target,
    under_views,
)
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.loaders import (
    DEFAULT_COLLATES,
    arguments_handed,
    batch_part_of,
    drawing_loops,
    loops_over,
    option_values,
    parameter_copies,
)
from optimizer_codemod.analysis.script import DATALOADER, derived_root
from optimizer_codemod.analysis.training import runs_once
from optimizer_codemod.analysis.values import (
    ACCELERATOR,
    every_call,
    imported_loader_named,
    locally_assigned,
    outside_argument,
    parameter_names,
    parameter_sources,
    parameter_values,
)

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.project import Argument
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
    # Where target_types is None: what the script says of a device that may be MPS, in
    # words; None where it says nothing the analysis can read.
    device_note: Optional[str] = None
    # Where target_types is None: what every run does before the loop that only CUDA allows
    # (cuda_runs.py), in words. With CUDA, torch has no MPS: the device is CUDA or the CPU.
    cuda_required: Optional[str] = None
    # Where the device may be MPS: the copy's device, when it always holds a `torch.device`
    # (devices.is_device_object); the copy can be asynchronous only when its `.type` is cuda.
    cuda_only: Optional[cst.BaseExpression] = None
    # cuda_only holds a string or an index, not always a `torch.device`: its type is
    # `torch.device(cuda_only).type`.
    spec_only: bool = False
    # cuda_only holds a `torch.device` or None (`current_accelerator()` without an
    # `is_available()` check first): its type is read only when it is not None.
    maybe_none: bool = False

    @property
    def async_is_sound(self) -> bool:
        if self.cuda_only is not None:
            return False
        if self.target_types is None:
            return self.cuda_required is not None
        return self.target_types <= ASYNC_SOUND_TYPES


def blocking_batch_copies(
    facts: "ScriptFacts", declined: Optional[List[Tuple[cst.Call, str]]] = None
) -> List[BatchCopy]:
    """Blocking copies of pinned batches to a device that is CUDA or may be, in training loops.

    Left out: copies whose target may be a non-CUDA accelerator, whose source may already be
    on the device (a device-to-host copy), whose source is written in the loop, which already
    choose `non_blocking`, whose arguments are hidden in `*args`/`**kwargs`, and, with a custom
    `collate_fn`, copies of a whole batch (it may be an object whose `.to` takes no
    `non_blocking`). With `declined`, each copy of a batch to an accelerator left out is
    added to it with the reason, in words.
    """
    found: List[BatchCopy] = []
    examined: Set[int] = set()
    handed: Dict[int, _HandedCopy] = {}
    for loop, loaders, pinned, seeds, drawn, passed in _batch_loops(facts) + _drawn_batch_loops(
        facts
    ):
        names = facts.names_derived_in(loop, set(loop.targets) | seeds)
        custom_collate = _loop_collate(
            [_custom_collate(facts, loader) for loader in loaders], passed
        )
        _collect_handed_copies(facts, loop, names, pinned, custom_collate, drawn, handed)
        if not pinned and declined is None:
            continue
        if passed is not None and passed.loader == "unknown":
            unpinned = UNKNOWN_PINNING
        else:
            unpinned = NOT_PINNED if pinned else _not_pinned(facts, loaders)
        for call in facts.loop_calls(loop):
            if id(call.node) in examined:
                continue
            examined.add(id(call.node))
            copy = _batch_copy(facts, call, loop, names, custom_collate, drawn)
            if isinstance(copy, BatchCopy):
                if pinned:
                    found.append(copy)
                elif declined is not None:
                    declined.append((call.node, unpinned))
            elif copy is not None and declined is not None:
                declined.append((call.node, copy if pinned else unpinned))
    for copy in handed.values():
        outcome = copy.outcome(facts)
        if isinstance(outcome, BatchCopy):
            found.append(outcome)
        elif outcome is not None and declined is not None:
            declined.append((copy.call.node, outcome))
        examined.add(id(copy.call.node))
    if declined is not None:
        declined.extend(_unfollowed_copies(facts, examined))
    return found


@dataclass
class _HandedCopy:
    """A copy, in a module-level function, of the parameter that calls in loops over loaders
    bind to a part of their batch (rasbt's `calc_loss_batch(input_batch, ...)` copying
    `input_batch.to(device)`), with each such call: (call, loop, pinned, why the part cannot
    be copied asynchronously or None)."""

    call: CallSite
    function: cst.FunctionDef
    parameter: str
    uses: List[Tuple[CallSite, Loop, bool, Optional[str]]]
    calls: Set[int] = field(default_factory=set)  # ids of the calls in `uses`

    def outcome(self, facts: "ScriptFacts") -> Union[BatchCopy, str, None]:
        name = self.function.name.value
        if not _plain_arguments(facts, self.call.node, self.call.method):
            return None
        every = every_call(facts, self.function)
        if every is None:
            return (
                f"`{name}` is used otherwise than called in this file (passed around, or "
                "called from another module): its copy may be of other data"
            )
        others = [call for call in every if id(call.node) not in self.calls]
        if others:
            caller = others[0].site.function
            where = f"in `{caller.name.value}`" if caller is not None else "at the module level"
            return (
                f"`{name}` is also called {where} with a value for `{self.parameter}` that the "
                "analysis does not follow to a batch of a DataLoader: its copy may be of other "
                "data"
            )
        if not all(pinned for _, _, pinned, _ in self.uses):
            return (
                f"`{name}` is called with a batch of a DataLoader not known to be built with "
                "`pin_memory=True`: a copy from pageable memory cannot overlap with the GPU's work"
            )
        for _, _, _, problem in self.uses:
            if problem is not None:
                return f"`{name}` copies the argument it takes as `{self.parameter}`; {problem}"
        outcomes = [_copy_to_device(facts, self.call, loop) for _, loop, _, _ in self.uses]
        first = outcomes[0]
        for outcome in outcomes:
            if isinstance(outcome, str):
                return outcome
            if replace(outcome, loop=first.loop) != first:
                return (
                    f"what is known of the device differs between the loops that call `{name}` "
                    "(CUDA is required before some of them only)"
                )
        return first


def _collect_handed_copies(
    facts: "ScriptFacts",
    loop: Loop,
    names: Set[str],
    pinned: bool,
    custom_collate: Collate,
    drawn: FrozenSet[int],
    handed: Dict[int, _HandedCopy],
) -> None:
    """Record, in `handed`, the copies made by module-level functions that calls in `loop`
    hand a part of the batch to (loaders.parameter_copies)."""
    part = batch_part_of(facts, names)
    for call in facts.loop_calls(loop):
        for arg, function, parameter in arguments_handed(facts, call, part):
            for copy in parameter_copies(facts, function, parameter):
                entry = handed.setdefault(id(copy.node), _HandedCopy(copy, function, parameter, []))
                if id(call.node) in entry.calls:
                    continue  # the same call seen again from a loop around its loop
                entry.calls.add(id(call.node))
                problem = _batch_part_problem(
                    facts, arg.value, loop, names, custom_collate, drawn, call.site, call.node
                )
                entry.uses.append((call, loop, pinned, problem))


def _unfollowed_copies(facts: "ScriptFacts", examined: Set[int]) -> List[Tuple[cst.Call, str]]:
    """Copies to an accelerator, in a script that trains, of a batch taken from something the
    analysis does not follow to a loader (`self.train_data`, a parameter, `next(data_iter)`,
    `cycle(dl)`), each with where its batch comes from: where some DataLoader is or may be
    pinned (its options may arrive through `**kwargs`), or where the batch comes from a
    loader Accelerate prepared (which moves batches to the device itself), or where the
    file builds DataLoaders but pins none (stylegan2's `next(sample_data(loader))`)."""
    if not facts.trains:
        return []
    loaders = facts.dataloader_constructions()
    pinned = any(
        facts.is_pinned(site) or option_values(facts, site.node, "pin_memory") is None
        for site in loaders
    )
    unfollowed = []
    for call in facts.records.calls:
        node = call.node
        if call.method not in COPY_METHODS or id(node) in examined or call.site.loop is None:
            continue
        origin = _batch_origin(facts, call)
        if origin is None or not places_on_accelerator(facts, node):
            continue
        text = code_of(origin).strip()
        wrapper = _wrapper_class(facts, origin)
        if _prepared_by_accelerate(facts, origin) or _from_prepared(facts, origin, call):
            unfollowed.append((node, PREPARED_BY_ACCELERATE.format(text)))
        elif pinned and wrapper is not None:
            unfollowed.append(
                (
                    node,
                    f"the batch comes from `{text}`, a method of `{wrapper}`, a class of this "
                    "file, and the analysis follows such a method only where each of its "
                    "returns gives a batch drawn from an iterator of a DataLoader whose options "
                    "it can read (`return next(self.data_iter)`): add `non_blocking=True` by "
                    "hand if the loader it wraps is pinned and the device is CUDA",
                )
            )
        elif pinned:
            unfollowed.append(
                (
                    node,
                    f"the batch comes from `{text}`, which the analysis cannot follow to a "
                    "pinned DataLoader: add `non_blocking=True` by hand if it is one and the "
                    "device is CUDA",
                )
            )
        elif loaders:
            unfollowed.append(
                (
                    node,
                    f"the batch comes from `{text}`, which the analysis cannot follow to a "
                    "DataLoader, and no DataLoader of this file is pinned (OPT101 pins one "
                    "where it finds the loop over it): if the batches are a DataLoader's, "
                    "build it with `pin_memory=True` and add `non_blocking=True` here by hand "
                    "when the device is CUDA",
                )
            )
    return unfollowed


PREPARED_BY_ACCELERATE = (
    "the batch comes from `{}`, a DataLoader prepared by Accelerate, which moves each batch to "
    "the accelerator's device itself (device placement is on by default), so a copy to that "
    "device copies nothing. For non-blocking copies there, build the `Accelerator` with "
    "`dataloader_config=DataLoaderConfiguration(non_blocking=True)` and pin the DataLoader"
)


def _prepared_by_accelerate(facts: "ScriptFacts", iterable: cst.BaseExpression) -> bool:
    """`iterable` (or the loader `enumerate`/`tqdm` wrap) is bound to what `prepare` of an
    Accelerate `Accelerator` returns, with device placement left on (its default)."""
    name = facts.iterated_name(iterable)
    return any(
        _accelerate_prepare(facts, assignment.value)
        for assignment in facts.assignments_to(name or "")
    )


def _from_prepared(facts: "ScriptFacts", origin: cst.BaseExpression, copy: CallSite) -> bool:
    """The batch source, followed (batch_sources.py: `next(self.dl)` with `self.dl =
    cycle(dl)`), may be a loader that Accelerate prepared."""
    drawn = drawn_iterator(facts, origin, copy.site.function)
    source = batch_source(facts, *(drawn or (origin, copy.site.function)))
    return source is not None and any(_accelerate_prepare(facts, c) for c in source.prepared)


def _accelerate_prepare(facts: "ScriptFacts", call: cst.BaseExpression) -> bool:
    """`accelerator.prepare(...)` of an Accelerate `Accelerator` built with device placement
    left on (its default)."""
    if not (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "prepare"
        and keyword(call, "device_placement") is None
    ):
        return False
    receiver = call.func.value
    bound = facts.assignments_to(dotted_name(receiver) or "")
    makers = [receiver] if isinstance(receiver, cst.Call) else [a.value for a in bound]
    return bool(makers) and all(
        isinstance(maker, cst.Call)
        and facts.qualified_name(maker.func) == ACCELERATOR
        and not has_double_star(maker)
        and _placement_left_on(keyword(maker, "device_placement"))
        for maker in makers
    )


def _wrapper_class(facts: "ScriptFacts", origin: cst.BaseExpression) -> Optional[str]:
    """`Wrapper` for `wrapper.next()`, where every binding of `wrapper` builds `Wrapper`, a
    class of this file."""
    if not (_is_next(origin) and isinstance(origin.func, cst.Attribute)):
        return None
    bound = facts.assignments_to(dotted_name(origin.func.value) or "")
    classes = {dotted_name(a.value.func) if isinstance(a.value, cst.Call) else None for a in bound}
    name = classes.pop() if len(classes) == 1 else None
    return name if name in facts.classes else None


def _placement_left_on(option: Optional[cst.Arg]) -> bool:
    return option is None or literal(option.value, None) is True


NEXT_CALLS = frozenset({"next", "__next__"})


def _batch_origin(facts: "ScriptFacts", call: CallSite) -> Optional[cst.BaseExpression]:
    """Where the copied value is taken from, when it is a batch: the iterable of an enclosing
    loop that binds it, or a `next(...)` call (directly or through a name bound in the loop,
    or a comprehension over one)."""
    source = call.node.func.value
    name = _base(source)
    local = _comprehension_iters(call.site.statement, call.node)
    if name in local:
        source = local[name]
        name = _base(source)
    if _is_next(source):
        return source
    for loop in reversed(call.site.loops):
        if name in loop.targets:
            return loop.iter
        for assignment in facts.assignments_to(name or ""):
            if loop in assignment.site.loops and _is_next(assignment.value):
                return assignment.value
    return None


def _is_next(node: cst.BaseExpression) -> bool:
    """`next(it)`, `it.next()`, `it.__next__()`."""
    if not isinstance(node, cst.Call):
        return False
    func = node.func
    name = func.attr.value if isinstance(func, cst.Attribute) else dotted_name(func)
    return name in NEXT_CALLS


def _not_pinned(facts: "ScriptFacts", loaders: List[CallSite]) -> str:
    """Why the batches are not known to be pinned: a loader is not built with
    `pin_memory=True`, or its options are not all readable (a `**kwargs` changed on the way,
    filled by several callers, or made by a call)."""
    if any(option_values(facts, loader.node, "pin_memory") is None for loader in loaders):
        return UNKNOWN_PINNING
    return NOT_PINNED


UNKNOWN_PINNING = (
    "whether the DataLoader pins its batches is unknown: its options arrive through `*args`/"
    "`**kwargs` whose entries the analysis cannot all read; add `non_blocking=True` by hand if "
    "it pins them and the device is CUDA"
)
NOT_PINNED = (
    "the DataLoader is not built with `pin_memory=True` (OPT101 adds it where it can): a copy from "
    "pageable memory cannot overlap with the GPU's work"
)


# A loop that takes batches from loaders: the loop, the loaders, whether all are pinned, the
# names bound to batches besides the loop's targets, the `next(it)` calls that give them, and
# what other modules pass for the loader it iterates, when that is where it comes from.
BatchLoop = Tuple[Loop, List[CallSite], bool, FrozenSet[str], FrozenSet[int], Optional["Argument"]]


def _batch_loops(facts: "ScriptFacts") -> List[BatchLoop]:
    """Loops over loaders in a script that trains (its training loops and its evaluation
    loops: each copy runs once per batch either way), and whether every loader they iterate
    is pinned: found by name (loaders.loops_over) or followed further (batch_sources.py);
    and, in a module of the run that does not train itself, loops over a loader the modules
    that train hand to it (an `evaluate(net, dataloader)` called from train.py)."""
    if not facts.trains:
        return [
            (loop, [], passed.loader == "pinned", NO_NAMES, NO_CALLS, passed)
            for loop in facts.records.loops
            if isinstance(loop.node, cst.For)
            for passed in (_loader_passed_from_elsewhere(facts, loop),)
            if passed is not None
        ]
    loaders_of: Dict[int, Tuple[Loop, List[CallSite]]] = {}
    for site in facts.dataloader_constructions():
        for loop in loops_over(facts, site):
            loaders_of.setdefault(id(loop), (loop, []))[1].append(site)
    found = [
        (
            loop,
            loaders,
            all(facts.is_pinned(loader) for loader in loaders),
            NO_NAMES,
            NO_CALLS,
            None,
        )
        for loop, loaders in loaders_of.values()
        if facts.loader_of(loop) is not None or _only_loaders_passed(facts, loop)
    ]
    listed = {id(loop) for loop, *_ in found}
    for loop in facts.records.loops:
        if isinstance(loop.node, cst.For) and id(loop) not in listed:
            # `for x, y in self.train_data`, `enumerate(dataloader)` over a parameter
            source = batch_source(facts, loop.iter, loop.function)
            if source is not None and source.loaders and not source.prepared:
                pinned = all(facts.is_pinned(loader) for loader in source.loaders)
                found.append((loop, list(source.loaders), pinned, NO_NAMES, NO_CALLS, None))
                continue
            passed = _loader_passed_from_elsewhere(facts, loop) or _loader_from_elsewhere(
                facts, loop
            )
            if passed is not None:
                found.append((loop, [], passed.loader == "pinned", NO_NAMES, NO_CALLS, passed))
    return found


def _loader_passed_from_elsewhere(facts: "ScriptFacts", loop: Loop) -> Optional["Argument"]:
    """What the other modules of the run pass for the parameter this loop iterates (UNet's
    `def evaluate(net, dataloader, ...)` called from train.py with its pinned `val_loader`),
    when every such call passes a DataLoader and the file itself never calls the function."""
    name = facts.iterated_name(loop.iter)
    if name is None or loop.function is None:
        return None
    return _outside_loader(facts, loop.function, name, 0)


def _outside_loader(facts: "ScriptFacts", function, name: str, depth: int):
    """What other modules pass for parameter `name` of `function`, when it is a DataLoader:
    directly, or through this file's calls that hand on a parameter of their own
    (engine.py's `train(model, train_dataloader, ...)`, called from train.py, passes it to
    `train_step(model, dataloader=train_dataloader)`, which loops over it)."""
    argument, _why = outside_argument(facts, function, name)
    if argument is not None:
        return argument if argument.loader else None
    if depth >= 2 or name not in parameter_names(function):
        return None
    found = None
    for source in parameter_sources(facts, function, name) or ():
        passed = dotted_name(source.value)
        caller = source.function
        if passed is None or caller is None or locally_assigned(facts, passed, caller):
            return None
        argument = _outside_loader(facts, caller, passed, depth + 1)
        if argument is None or (found is not None and not argument.same_as(found)):
            return None
        found = argument
    return found


def _loader_from_elsewhere(facts: "ScriptFacts", loop: Loop) -> Optional["Argument"]:
    """The loader this loop iterates, when a function of another module of the run builds
    and returns it (yunjey's `data_loader = get_loader(...)` from data_loader.py), described
    as an argument passed in would be."""
    from optimizer_codemod.analysis.project import Argument

    name = facts.iterated_name(loop.iter)
    loader = imported_loader_named(facts, name)
    if loader is None:
        return None
    return Argument(
        text=name or "",
        module=False,
        dataset="",
        changed=False,
        handles=False,
        loader=loader.loader,
        loader_collate=loader.collate,
        loader_tensor_parts=loader.tensor_parts,
    )


NO_NAMES: FrozenSet[str] = frozenset()
NO_CALLS: FrozenSet[int] = frozenset()


def _drawn_batch_loops(facts: "ScriptFacts") -> List[BatchLoop]:
    """Loops that draw batches with `batch = next(it)` from an iterator of pinned or unpinned
    loaders (loaders.drawing_loops), with the names bound to the batches and the `next`
    calls."""
    if not facts.trains:
        return []
    return [
        (
            loop,
            loaders,
            all(facts.is_pinned(l) for l in loaders),
            frozenset(seeds),
            frozenset(calls),
            None,
        )
        for loop, seeds, calls, loaders in drawing_loops(facts)
    ]


def _only_loaders_passed(facts: "ScriptFacts", loop: Loop) -> bool:
    """`for batch in loader` over a parameter: every caller passes a DataLoader built here.

    Another iterable could yield objects whose `.to` takes no `non_blocking`, or tensors
    already on the device.
    """
    name = facts.iterated_name(loop.iter)
    if loop.function is None or name is None or name not in parameter_names(loop.function):
        return False
    values = parameter_values(facts, loop.function, name)
    if values is None:
        return False
    for value in values:
        site = facts.call_site_of.get(value) if isinstance(value, cst.Call) else None
        if site is None or site.qualname != DATALOADER:
            site = facts.loader_named(dotted_name(value) or "", value)
        if site is None:
            return False
    return True


def passed_loader(
    facts: "ScriptFacts", node: cst.BaseExpression
) -> Tuple[str, bool, Tuple[int, ...]]:
    """For an argument a call hands to another module: whether it is a DataLoader of this
    file that pins ("pinned"), does not ("unpinned") or may ("unknown": options it cannot
    read), "" when it is no DataLoader; whether it has a collate_fn of its own; and the parts
    of its batches that collate_fn is known to fill with tensors (collates.py)."""
    site = facts.call_site_of.get(node)
    if site is None or site.qualname != DATALOADER:
        name = dotted_name(node)
        site = facts.loader_named(name, node) if name is not None else None
    if site is None:
        built_elsewhere = imported_loader_named(facts, dotted_name(node))
        if built_elsewhere is not None:
            loader = built_elsewhere
            return loader.loader, loader.collate, loader.tensor_parts
        return "", False, ()
    if facts.is_pinned(site):
        pinning = "pinned"
    else:
        pinning = "unknown" if option_values(facts, site.node, "pin_memory") is None else "unpinned"
    collate = _custom_collate(facts, site)
    return pinning, collate is not None, tuple(sorted(collate or ()))


# What the collate_fn of the loaders a loop iterates makes of its batches: None for the
# default collate; else the positions of a tuple batch known to hold tensors (collates.py).
Collate = Optional[FrozenSet[int]]


def _custom_collate(facts: "ScriptFacts", loader: CallSite) -> Collate:
    values = option_values(facts, loader.node, "collate_fn")
    if values is None:
        return frozenset()  # `**kwargs` may carry one
    custom = [
        value
        for value in values
        if not (is_name(value, "None") or facts.qualified_name(value) in DEFAULT_COLLATES)
    ]
    if not custom:
        return None
    functions = [collate_function(facts, value) for value in custom]
    return frozenset.intersection(
        *(tensor_parts(facts, f) if f is not None else frozenset() for f in functions)
    )


def _loop_collate(collates: List[Collate], passed: Optional["Argument"]) -> Collate:
    """What the collate_fn of every loader of a loop makes of its batches, together."""
    if passed is not None and passed.loader_collate:
        collates.append(frozenset(passed.loader_tensor_parts))
    custom = [c for c in collates if c is not None]
    return frozenset.intersection(*custom) if custom else None


def _batch_copy(
    facts: "ScriptFacts",
    call: CallSite,
    loop: Loop,
    names: Set[str],
    custom_collate: Collate,
    drawn: FrozenSet[int] = frozenset(),
) -> Union[BatchCopy, str, None]:
    """The copy, or why a copy of the batch to an accelerator is left out (None: not one)."""
    node = call.node
    if call.method not in COPY_METHODS or not isinstance(node.func, cst.Attribute):
        return None
    source = node.func.value
    batch_part = under_views(source)
    if not facts.derives_from(batch_part, names) or not places_on_accelerator(facts, node):
        return None
    if not _plain_arguments(facts, node, call.method):
        if has_star_args(node) or has_double_star(node):
            return "the copy's arguments arrive through */**, which may set `non_blocking`"
        return None  # `non_blocking` chosen already, or options the fix does not know
    problem = _batch_part_problem(
        facts, source, loop, names, custom_collate, drawn, call.site, node
    )
    if problem is not None:
        return problem
    return _copy_to_device(facts, call, loop)


def _batch_part_problem(
    facts: "ScriptFacts",
    source: cst.BaseExpression,
    loop: Loop,
    names: Set[str],
    custom_collate: Collate,
    drawn: FrozenSet[int],
    site: Site,
    copy: Optional[cst.Call] = None,
) -> Optional[str]:
    """Why `source`, read at `site` in `loop`, cannot be copied asynchronously as a part of
    the loop's batch: it may be an object of a custom collate, hold a device tensor, or be
    written in the loop; None when it can."""
    batch_part = under_views(source)
    text = code_of(source).strip()
    if (
        custom_collate is not None
        and not _element_of_batch(facts, batch_part, loop, names)
        and not (
            isinstance(batch_part, cst.Name) and loop_part(loop, batch_part.value) in custom_collate
        )
    ):
        return (
            f"with a custom `collate_fn`, `{text}` may be an object of the user's class whose "
            "`.to` takes no `non_blocking`"
        )
    chain = _host_chain(facts, batch_part, loop, names, site.statement, copy, drawn, site)
    if chain is None:
        return (
            f"`{text}` may hold a tensor already on the device (a name it comes from is bound "
            "in the loop to something other than a part of the batch): an asynchronous copy "
            "back to the host could be read before it lands"
        )
    if _written(facts, loop, chain, site.statement):
        return (
            f"`{text}` or the batch it comes from is written in the loop, and the write "
            "could race with an asynchronous copy still reading it"
        )
    return None


def _copy_to_device(facts: "ScriptFacts", call: CallSite, loop: Loop) -> Union[BatchCopy, str]:
    """The copy `call` of a batch iterated by `loop`, with what its device allows; or why it
    must stay blocking (it may go to an accelerator that is not CUDA)."""
    node = call.node
    if call.method == "cuda":
        types: Optional[FrozenSet[str]] = frozenset({"cuda"})
    elif call.method == "type":  # `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`
        types = tensor_type_devices(facts, type_conversion_target(node))
    else:
        types = _target_types(facts, copy_target(facts, node), call)
    if types is not None and types <= ASYNC_SOUND_TYPES:
        return BatchCopy(call, loop, types)
    if types is None:
        required = cuda_required_before(facts, loop)
        if required is not None:
            return BatchCopy(call, loop, types, cuda_required=required)
    device = copy_target(facts, node) if call.method == "to" else None
    if dotted_name(device) is not None and is_device_object(facts, device, call.site.function):
        return BatchCopy(call, loop, types, cuda_only=device)
    if (
        dotted_name(device) is not None
        and (types is None or "cuda" in types)
        and holds_device_spec(facts, device, call.site.function)
    ):
        return BatchCopy(call, loop, types, cuda_only=device, spec_only=True)
    if (
        isinstance(device, cst.Name)
        and (types is None or "cuda" in types)
        and is_device_object_or_none(facts, device, call.site.function)
    ):
        return BatchCopy(call, loop, types, cuda_only=device, maybe_none=True)
    if types is not None:
        return (
            "the copy may go to MPS or another accelerator that is not CUDA, where "
            "asynchronous copies corrupt data (pytorch/pytorch#139550)"
        )
    return BatchCopy(call, loop, types, _device_note(facts, node, call.method))


MPS_UNSAFE = "where asynchronous host-to-device copies are unsafe (pytorch/pytorch#139550)"


def _device_note(facts: "ScriptFacts", copy: cst.Call, method: Optional[str]) -> Optional[str]:
    """Why the device of `copy` may be MPS, where the script names the current accelerator
    (`torch.accelerator.current_accelerator()`, or an integer index, which torch takes as an
    index of the current accelerator), directly or through the names it is bound to."""
    target = copy_target(facts, copy) if method == "to" else None
    return _accelerator_note(facts, target, 0) if target is not None else None


def _accelerator_note(
    facts: "ScriptFacts", target: cst.BaseExpression, depth: int
) -> Optional[str]:
    if isinstance(target, cst.Integer):
        return (
            f"the device is the index `{target.value}`, which torch takes as an index of "
            f"the current accelerator, and that may be MPS, {MPS_UNSAFE}"
        )
    current = next(
        (
            node
            for node in (target, getattr(target, "value", None))
            if isinstance(node, cst.Call) and facts.qualified_name(node.func) == CURRENT_ACCELERATOR
        ),
        None,
    )
    if current is not None:
        unchecked = (
            ""
            if taken_only_when_available(facts, current)
            else " (and None in a build of torch without one: no `torch.accelerator."
            "is_available()` check comes first, so its `.type` cannot be tested)"
        )
        return (
            f"the device is `{code_of(target).strip()}`, which may be MPS{unchecked}, "
            f"{MPS_UNSAFE}"
        )
    if depth >= MAX_DEPTH:
        return None
    if isinstance(target, cst.Call) and facts.qualified_name(target.func) == "torch.device":
        args = positional(target)
        return _accelerator_note(facts, args[0].value, depth + 1) if len(args) == 1 else None
    for bound in facts.assignments_to(dotted_name(target) or ""):
        if not bound.unpacked:
            note = _accelerator_note(facts, bound.value, depth + 1)
            if note is not None:
                return note
    return None


def _plain_arguments(facts: "ScriptFacts", call: cst.Call, method: str) -> bool:
    """The call names its target and options plainly and leaves `non_blocking` unset."""
    if has_star_args(call) or has_double_star(call):
        return False
    keywords = {arg.keyword.value for arg in call.args if arg.keyword is not None}
    args = positional(call)
    if method == "cuda":  # cuda(device=None, non_blocking=False, memory_format=...)
        return len(args) <= 1 and keywords <= CUDA_KEYWORDS
    if method == "type":  # type(dtype=None, non_blocking=False, **kwargs)
        return len(args) + len(keywords) == 1 and keywords <= {"dtype"}
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
    copy: Optional[cst.Call] = None,
    drawn: FrozenSet[int] = frozenset(),
    copy_site: Optional[Site] = None,
) -> Optional[Set[str]]:
    """The batch names `source` comes from, when all of them still hold host tensors.

    Every binding of each name inside the loop (other than in the copy's own statement,
    `x = x.to(device)`) must take a part of another batch name or a batch drawn from a
    loader (`drawn`: ids of `next(it)` calls), never a computed value: a
    name rebound to `x.to(device)` or `model(x)` may live on the device, and a copy from it
    could be a device-to-host copy. A target of the loop itself that is rebound only after
    the copy (`x = x.to(device)`, then `x = vae.encode(x)`) holds the batch again when the
    copy runs: the loop binds it anew before each iteration reaches the copy.
    """
    first = derived_root(source, names)
    if first is None:
        return None
    chain: Set[str] = set()
    pending = [first]
    local = _comprehension_iters(statement, copy) if copy is not None else {}
    while pending:
        name = pending.pop()
        if name in chain:
            continue
        chain.add(name)
        if name in local:
            # `[t.to(device) for t in batch]`: `t` belongs to the comprehension around the
            # copy, bound by it alone (bindings elsewhere are other variables).
            root = derived_root(local[name], names)
            if root is None:
                return None
            pending.append(root)
            continue
        for assignment in facts.assignments_to(name):
            if loop not in assignment.site.loops or assignment.site.statement is statement:
                continue
            if assignment.augmented:
                continue  # an in-place update: see _written
            if id(assignment.value) in drawn or _rebound_after(loop, name, assignment, copy_site):
                continue
            if _other_branch(facts, loop, name, assignment.site.statement, statement):
                continue
            root = derived_root(under_views(assignment.value), names)
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


def _rebound_after(loop: Loop, name: str, assignment, copy_site: Optional[Site]) -> bool:
    """`name`, a target of `loop`, is rebound by `assignment` after the copy in the same
    iteration, and no loop inside `loop` runs both (where the next inner round would copy
    the rebound value)."""
    if copy_site is None or name not in loop.targets or assignment.site.order < copy_site.order:
        return False
    inner = assignment.site.loops[assignment.site.loops.index(loop) + 1 :]
    return not any(inner_loop in copy_site.loops for inner_loop in inner)


def _other_branch(
    facts: "ScriptFacts",
    loop: Loop,
    name: str,
    bound: Optional[cst.CSTNode],
    copied: Optional[cst.CSTNode],
) -> bool:
    """`name`, a target of `loop`, is bound by `bound` in one branch of an `if` of the
    loop's body and copied by `copied` in the other (imagenet's `images =
    images.cuda(args.gpu, ...)` / `else: images = images.to(device)`): the loop binds it anew
    before each iteration, so the binding never reaches the copy. Only where no loop inside
    `loop` holds that `if` (its next round would)."""
    if bound is None or copied is None or name not in loop.targets:
        return False
    branches = _branches(facts, bound, loop.node)
    if branches is None:
        return False
    for if_node, branch in (_branches(facts, copied, loop.node) or {}).items():
        other = branches.get(if_node)
        if other is not None and other is not branch:
            return True
    return False


def _branches(
    facts: "ScriptFacts", statement: cst.CSTNode, loop_node: cst.CSTNode
) -> Optional[Dict[cst.If, cst.CSTNode]]:
    """The `if`s between `statement` and `loop_node`, each with the branch (body or orelse)
    that holds `statement`; None when a loop or a function lies in between."""
    found: Dict[cst.If, cst.CSTNode] = {}
    child, node = statement, facts.parents.get(statement)
    while node is not None and node is not loop_node:
        if isinstance(node, (cst.For, cst.While, cst.FunctionDef, cst.Lambda)):
            return None
        if isinstance(node, cst.If) and child in (node.body, node.orelse):
            found[node] = child
        child, node = node, facts.parents.get(node)
    return found if node is loop_node else None


def _comprehension_iters(
    statement: Optional[cst.BaseStatement], copy: cst.Call
) -> Dict[str, cst.BaseExpression]:
    """The names bound by comprehensions whose element holds `copy`, with what each
    iterates (`{"t": batch}` for `[t.to(device) for t in batch]`)."""
    if statement is None:
        return {}
    found: Dict[str, cst.BaseExpression] = {}
    for comp in find_all(statement, *COMPREHENSIONS):
        parts = (comp.key, comp.value) if isinstance(comp, cst.DictComp) else (comp.elt,)
        if not any(n is copy for part in parts for n in find_all(part, cst.Call)):
            continue
        clause = comp.for_in
        while clause is not None:
            for name in target_names(clause.target):
                found[name] = clause.iter
            clause = clause.inner_for_in
    return found


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
    written_back = _entries_written_back(facts, loop)
    for node in find_all(loop.node.body, cst.Assign, cst.AugAssign):
        if any(small is node for small in own) or id(node) in written_back:
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


def _entries_written_back(facts: "ScriptFacts", loop: Loop) -> Set[int]:
    """Ids of the stores in `loop` that put a copy of a dict's entry back under its own key
    while a loop walks the keys: `for key in batch.keys(): batch[key] = batch[key].to(dev)`
    (llama-recipes, pytorch/examples' FSDP). The store replaces the entry, not the tensor the
    copy reads; and a key that came again would copy a tensor already on the device."""
    memo = facts.memo("entries_written_back")
    if id(loop) not in memo:
        found: Set[int] = set()
        for inner in facts.loops_inside(loop):
            walked = _walked_keys(inner.node)
            if walked is None:
                continue
            for node in find_all(inner.node.body, cst.Assign):
                if _writes_back(node, *walked):
                    found.add(id(node))
        memo[id(loop)] = found
    return memo[id(loop)]


def _walked_keys(node: cst.CSTNode) -> Optional[Tuple[str, str]]:
    """(dict, key) names of `for key in d` or `for key in d.keys()`; None for other loops."""
    if not isinstance(node, cst.For) or not isinstance(node.target, cst.Name):
        return None
    iterated = node.iter
    if isinstance(iterated, cst.Call) and not iterated.args:
        func = iterated.func
        iterated = (
            func.value if isinstance(func, cst.Attribute) and func.attr.value == "keys" else None
        )
    if not isinstance(iterated, cst.Name):
        return None
    return iterated.value, node.target.value


def _writes_back(node: cst.Assign, holder: str, key: str) -> bool:
    """`holder[key] = holder[key].to(...)` (or `.cuda(...)`), as its only target."""
    if len(node.targets) != 1 or not _is_entry(node.targets[0].target, holder, key):
        return False
    copy = node.value
    return (
        isinstance(copy, cst.Call)
        and isinstance(copy.func, cst.Attribute)
        and copy.func.attr.value in COPY_METHODS
        and _is_entry(copy.func.value, holder, key)
    )


def _is_entry(node: cst.BaseExpression, holder: str, key: str) -> bool:
    return (
        isinstance(node, cst.Subscript)
        and is_name(node.value, holder)
        and len(node.slice) == 1
        and isinstance(node.slice[0].slice, cst.Index)
        and is_name(node.slice[0].slice.value, key)
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
    if name is not None and function is not None and name in parameter_names(function):
        return _parameter_types(facts, function, name, 0)
    return device_types(facts, target)


def _parameter_types(
    facts: "ScriptFacts", function: cst.FunctionDef, name: str, depth: int
) -> Optional[FrozenSet[str]]:
    """The device types parameter `name` of `function` may receive: at this file's calls
    (following a parameter a caller hands on, as engine.py's `train(..., device)` to
    `train_step(..., device)`), and at the calls of other modules of the run (what every one
    passes, project.Argument.devices); None when some call's is not known."""
    argument, why = outside_argument(facts, function, name)
    if why is not None or (argument is not None and argument.devices is None):
        return None
    found: FrozenSet[str] = frozenset(argument.devices) if argument is not None else frozenset()
    sources = parameter_sources(facts, function, name)
    if sources is None:
        return found if argument is not None else None
    for source in sources:
        passed = dotted_name(source.value)
        caller = source.function
        if (
            depth < MAX_DEPTH
            and passed is not None
            and isinstance(caller, cst.FunctionDef)
            and passed in parameter_names(caller)
            and not locally_assigned(facts, passed, caller)
        ):
            types = _parameter_types(facts, caller, passed, depth + 1)
        else:
            types = device_types(facts, source.value)
        if types is None:
            return None
        found |= types
    return found


# Tensors created on the host and then copied ----------------------------------------------------
# Methods that only convert the dtype, and give the same result on the device and the host.
DTYPE_METHODS = frozenset(
    {"long", "int", "short", "byte", "char", "float", "double", "half", "bfloat16", "bool"}
)
# Keywords a factory may carry for its call to take `device=` the same way: its own
# arguments by name, and the dtype (the device is replaced).
# A factory given `device=` is made where its author chose (`device="cpu"` on purpose:
# torch's PowerSGD hook draws its random matrices on the CPU so that every replica draws the
# same ones), so none of these is left out when the keyword is there.
FACTORY_KEYWORDS = frozenset(
    "dtype size low high fill_value start end step n m input data mean std".split()
)
# Calls that seed or fork a random number generator: random numbers drawn right after them
# are meant to come from that generator.
SEEDING = frozenset(
    {
        "torch.manual_seed",
        "torch.random.manual_seed",
        "torch.seed",
        "torch.random.seed",
        "torch.set_rng_state",
        "torch.random.set_rng_state",
    }
)
FORK_RNG = frozenset({"torch.random.fork_rng"})
MOVE_KEYWORDS = frozenset({"device", "dtype", "non_blocking", "copy"})


@dataclass(frozen=True)
class HostCreation:
    """`torch.zeros(n).to(device)`: a tensor made on the host, then copied to a device."""

    move: CallSite  # the `.to(device)` or `.cuda()` call
    factory: cst.Call  # the creation call inside its receiver
    qualname: str
    kind: str  # FACTORIES' kind
    device: cst.BaseExpression  # the device to create it on
    dtype: Optional[cst.BaseExpression]  # a dtype `.to()` converts to, moved into the call
    # The device computes the same bits as the host. Not provable for an `arange` that may
    # be floating-point: CUDA computes `start + i * step` in float32, the CPU in float64.
    bit_exact: bool = True


def host_creations_moved(facts: "ScriptFacts") -> List[HostCreation]:
    """Every `factory(...)[.dtype()...].to(device)` / `.cuda()` of the script that could
    create the tensor on the device directly, in a loop or a function (code that runs more
    than once: not an `__init__` or a function run once, outside their loops; never
    `torch.tensor(...)`, which builds on the host even with `device=`).

    Left out: a target that may be a tensor (`.to(other)` takes its dtype too) or is the CPU
    (nothing to gain), `*args`/`**kwargs`, `memory_format`, a factory that chooses its device
    itself (`device="cpu"` on purpose), factory options that the device changes
    (`pin_memory`, `generator`: a CPU generator cannot feed a CUDA factory, `requires_grad`:
    the result would become a leaf, `out`, `layout`), and a dtype conversion in `.to()`
    unless the factory is "exact" and chooses no dtype itself; `torch.normal` only with
    numbers for mean and std (tensors decide its device). Random draws inside
    `torch.random.fork_rng()` or beside a `torch.manual_seed(...)` in the same loop or
    function body are left too: they are meant to come from the CPU's generator."""
    found: List[HostCreation] = []
    forked: Optional[Set[cst.CSTNode]] = None
    for move in facts.method_calls("to") + facts.method_calls("cuda"):
        if move.site.loop is None and move.site.function is None:
            continue
        creation = _host_creation(facts, move)
        # `torch.tensor(data, device=d)` builds on the host and copies all the same.
        if creation is None or creation.kind == "data":
            continue
        if move.site.loop is None and (_constructs(move.site.function) or runs_once(facts, move)):
            continue  # setup: nothing to gain, and a seeded run would draw other numbers
        if creation.kind == "random":
            forked = _under_fork_rng(facts) if forked is None else forked
            if move.node in forked or _seeded_beside(facts, move):
                continue
        found.append(creation)
    return sorted(found, key=lambda c: c.move.site.order)


def _constructs(function: Optional[cst.FunctionDef]) -> bool:
    """`__init__`: runs once per object, when it is built."""
    return function is not None and function.name.value == "__init__"


def _under_fork_rng(facts: "ScriptFacts") -> Set[cst.CSTNode]:
    """Every node inside a `with torch.random.fork_rng(...)` block."""
    inside: Set[cst.CSTNode] = set()
    for item, site in facts.records.with_items:
        call = item.item
        if isinstance(call, cst.Call) and facts.qualified_name(call.func) in FORK_RNG:
            inside.update(find_all(site.statement))
    return inside


def _seeded_beside(facts: "ScriptFacts", move: CallSite) -> bool:
    """The function seeds the random number generator in the same loop (or, outside loops,
    in the same function body) as the draw: the numbers are meant to be the CPU's."""
    return any(
        call.site.function is move.site.function and call.site.loop is move.site.loop
        for call in facts.calls_to(*SEEDING)
    )


def _host_creation(facts: "ScriptFacts", move: CallSite) -> Optional[HostCreation]:
    call = move.node
    if has_star_args(call) or has_double_star(call) or facts.qualified_name(call.func):
        return None
    keywords = {arg.keyword.value for arg in call.args if arg.keyword is not None}
    args = positional(call)
    dtype = None
    if move.method == "cuda":
        if args or not keywords <= {"non_blocking"}:
            return None
        device: cst.BaseExpression = cst.SimpleString('"cuda"')
    else:
        device = copy_target(facts, call)
        if device is None or not keywords <= MOVE_KEYWORDS or len(args) > 2:
            return None
        if not _names_device(facts, device, 0):
            return None
        if device_kind(facts, device) is DeviceKind.CPU:
            return None
        dtype_arg = keyword(call, "dtype") or (args[1] if len(args) == 2 else None)
        if dtype_arg is not None:
            dtype = dtype_arg.value
            if not (is_dtype(facts, dtype) or (dotted_name(dtype) or "").endswith("dtype")):
                return None
    factory = call.func.value
    while isinstance(factory, cst.Call) and _converts_dtype(facts, factory):
        factory = factory.func.value
    if not isinstance(factory, cst.Call):
        return None
    qualname = facts.qualified_name(factory.func)
    kind = FACTORIES.get(qualname or "")
    if kind is None or has_double_star(factory):
        return None
    if any(a.keyword is not None and a.keyword.value not in FACTORY_KEYWORDS for a in factory.args):
        return None
    if qualname == "torch.normal" and not (
        _number(argument(factory, "mean", 0)) and _number(argument(factory, "std", 1))
    ):
        return None
    if dtype is not None and (
        kind != "exact" or keyword(factory, "dtype") is not None or factory is not call.func.value
    ):
        return None
    if qualname.endswith("_like") and _like_source_on(facts, factory, device, move):
        return None
    exact = qualname != "torch.arange" or _integral_arange(facts, factory)
    return HostCreation(move, factory, qualname, kind, device, dtype, exact)


def _like_source_on(
    facts: "ScriptFacts", factory: cst.Call, device: cst.BaseExpression, move: CallSite
) -> bool:
    """`torch.zeros_like(src)` is made on `src`'s device: already the move's target when that
    is `src.device`, or when every binding of the name `src` in this scope put it there
    (`rewards = torch.zeros(n).to(device)`, `torch.zeros(n, device=device)`). Then nothing
    is made on the host and the move copies nothing."""
    source = argument(factory, "input", 0)
    if source is None:
        return False
    target = code_of(device)
    if f"{code_of(source.value)}.device" == target:
        return True
    if not isinstance(source.value, cst.Name):
        return False
    bindings = facts.assignments_in_scope(source.value.value, move.site.function)
    return bool(bindings) and all(
        not b.unpacked and not b.augmented and _placed_on(facts, b.value) == target
        for b in bindings
    )


def _placed_on(facts: "ScriptFacts", value: cst.BaseExpression) -> Optional[str]:
    """The device `value` is put on, as written: its own `.to(d)` / `.cuda()`, or a factory's
    `device=`."""
    if not isinstance(value, cst.Call):
        return None
    method = method_name(value)
    if method == "cuda":
        return None if value.args else '"cuda"'
    if method == "to":
        device = copy_target(facts, value)
    else:
        option = keyword(value, "device")
        device = option.value if option is not None else None
    return code_of(device) if device is not None else None


INTEGRAL_DTYPES = frozenset(
    f"torch.{name}" for name in "uint8 int8 int16 short int32 int int64 long bool".split()
)


def _integral_arange(facts: "ScriptFacts", call: cst.Call) -> bool:
    """`torch.arange` of integer literals, or with an integer `dtype=`: integer values."""
    dtype = keyword(call, "dtype")
    if dtype is not None:
        return facts.qualified_name(dtype.value) in INTEGRAL_DTYPES
    return all(
        arg.keyword is None or arg.keyword.value in ("start", "end", "step") for arg in call.args
    ) and all(type(literal(arg.value, None)) is int for arg in call.args)


def _number(arg: Optional[cst.Arg]) -> bool:
    value = literal(arg.value, None) if arg is not None else None
    return type(value) in (int, float)


def _converts_dtype(facts: "ScriptFacts", call: cst.Call) -> bool:
    """`x.long()`, `x.type(torch.long)`: a dtype conversion with nothing else to it."""
    if not isinstance(call.func, cst.Attribute) or facts.qualified_name(call.func):
        return False
    method = call.func.attr.value
    if method in DTYPE_METHODS:
        return not call.args
    return (
        method == "type"
        and len(call.args) == 1
        and call.args[0].keyword is None
        and not call.args[0].star
        and is_dtype(facts, call.args[0].value)
    )


def _names_device(facts: "ScriptFacts", node: cst.BaseExpression, depth: int) -> bool:
    """`node` is a device, never a tensor: a device string, `torch.device(...)`, `x.device`, a
    name called `device`/`..._device`, or a name only ever bound to one of these."""
    if device_types(facts, node) is not None:
        return True
    if isinstance(node, cst.Call):
        return facts.qualified_name(node.func) == "torch.device"
    name = dotted_name(node)
    if name is None:
        return False
    last = name.rsplit(".", 1)[-1].lower()
    if last == "device" or last.endswith("_device"):
        return True
    assignments = facts.assignments_to(name) if depth < MAX_DEPTH else ()
    return bool(assignments) and all(
        not a.unpacked and not a.augmented and _names_device(facts, a.value, depth + 1)
        for a in assignments
    )


# Host arrays converted by a legacy CUDA tensor type ---------------------------------------------
# `Tensor(np.ones(shape))` with `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`:
# numpy fills a float64 array on the host, the type converts it and copies it to the GPU (a
# blocking copy from pageable memory), every step. The numpy factories whose values the type
# can make on its own device, by the value each fills in.
NUMPY_FILLS = {"numpy.ones": 1, "numpy.zeros": 0}


@dataclass(frozen=True)
class LegacyTypeConversion:
    """`Tensor(np.ones(shape))`: a numpy array made on the host, converted to a tensor type
    that may be a CUDA one (and so copied to the GPU)."""

    call: CallSite  # `Tensor(...)`
    array: cst.Call  # `np.ones(shape)`
    fill: int  # the value of every element
    # `shape` as the type's size arguments (`Tensor(n, *rest)`), or why the type cannot make
    # the array itself.
    sizes: Union[Tuple[cst.Arg, ...], str]
    floating: bool  # every type it may be is a floating-point one (`fill_(1.0)`, not `1`)


def legacy_type_conversions(facts: "ScriptFacts") -> List[LegacyTypeConversion]:
    """Every `T(np.ones(shape))`/`T(np.zeros(shape))` in a loop or function, where `T` may be
    a CUDA tensor type (`torch.cuda.FloatTensor`, or a name bound to it on some branch), and
    the conversions of numpy's random arrays, which the type cannot make: on the device they
    would be other numbers."""
    found: List[LegacyTypeConversion] = []
    for call in facts.records.calls:
        node = call.node
        if call.site.loop is None and call.site.function is None:
            continue  # runs once
        if len(node.args) != 1 or node.args[0].keyword is not None or node.args[0].star:
            continue
        array = node.args[0].value
        qualname = facts.qualified_name(array.func) if isinstance(array, cst.Call) else None
        if not (qualname or "").startswith("numpy.") or not isinstance(array, cst.Call):
            continue
        types = tensor_types(facts, node.func)
        if types is None or "cuda" not in tensor_type_devices(facts, node.func):
            continue
        shape = positional(array)
        if qualname in NUMPY_FILLS and len(array.args) == len(shape) == 1:
            sizes: Union[Tuple[cst.Arg, ...], str] = _size_arguments(shape[0].value)
        elif qualname in NUMPY_FILLS:
            sizes = f"`{excerpt(array)}` passes options that the rewrite does not carry over"
        elif qualname.startswith("numpy.random."):
            sizes = (
                f"`{code_of(array.func).strip()}` draws its numbers from numpy's generator on "
                "the host: drawn on the device they would be other numbers"
            )
        else:
            continue  # data: converting it is a copy whichever way it is written
        fill = NUMPY_FILLS.get(qualname, 0)
        found.append(LegacyTypeConversion(call, array, fill, sizes, types <= FLOATING_TENSOR_TYPES))
    return found


def _size_arguments(shape: cst.BaseExpression) -> Union[Tuple[cst.Arg, ...], str]:
    """`shape` as size arguments of a tensor type: `(n, *rest)` gives `n, *rest`.

    A type called with one argument that is not an int reads it as data (`T(t)` copies a
    tensor `t`, `T((2, 3))` is the vector [2, 3]), so a lone size must be an int for sure;
    with two or more, only sizes can match.
    """
    parts = list(shape.elements) if isinstance(shape, cst.Tuple) else [cst.Element(shape)]
    text = code_of(shape).strip()
    if not parts or isinstance(parts[0], cst.StarredElement):
        return f"the shape `{text}` may be empty or start with a sequence: no size arguments"
    plain = [part for part in parts if not isinstance(part, cst.StarredElement)]
    if len(plain) < 2 and not _an_int(parts[0].value):
        return (
            f"the shape `{text}` may be a sequence or a tensor rather than a number of "
            "elements, which the tensor type would read as data instead of sizes"
        )
    return tuple(
        cst.Arg(part.value, star="*" if isinstance(part, cst.StarredElement) else "")
        for part in parts
    )


def _an_int(node: cst.BaseExpression) -> bool:
    """An int for sure: a literal, `x.size(i)`, `x.shape[i]`, `len(...)`."""
    if isinstance(node, cst.Integer):
        return True
    if isinstance(node, cst.Subscript):  # `x.shape[0]`, not `x.shape[1:]`
        value = node.value
        return (
            isinstance(value, cst.Attribute)
            and value.attr.value == "shape"
            and len(node.slice) == 1
            and isinstance(node.slice[0].slice, cst.Index)
        )
    if isinstance(node, cst.Call):
        func = node.func
        if is_name(func, "len"):
            return True
        return isinstance(func, cst.Attribute) and func.attr.value == "size" and len(node.args) == 1
    return False

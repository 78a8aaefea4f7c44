"""Where the batches of a loop come from: the DataLoaders (or Accelerate-prepared loaders) an
iterable or an iterator holds, followed further than a name's file-wide assignments.

`loaders.loops_over` finds loops over a loader by name (`for x in train_loader`, a parameter
bound to one). Training code written in classes and helpers hides the loader behind more
steps, each followed here the way the rest of the analysis follows values (values.py):

- `self.train_data`, set in `__init__` from a parameter that `Trainer(model, loader)` binds;
- a parameter that every call of its function binds to a loader (`self._run_epoch(epoch,
  self.train_loader)` and `self._run_epoch(epoch, self.test_loader)`);
- `enumerate(x)`, `tqdm(x)`, `iter(x)`: the same batches as `x`;
- a function or method of this file whose every `return` gives a loader
  (`def prepare_dataloader(ds): return DataLoader(ds, pin_memory=True)`);
- a generator that only yields the items of a loop over one of its parameters (`def
  cycle(dl): while True: for data in dl: yield data`), of this file or, through the project
  index, of another module of the run (`metric_logger.log_every(data_loader, 10, header)`,
  handoffs.passed_through): the batches of the argument;
- `x if cond else None`: iterating None fails, so only `x` can give batches.

The answer lists every value that may end the chain; a step the analysis cannot follow (an
argument of another module, a class of the user's, a name also bound by a for loop) gives
no answer at all, so a caller never mistakes a partial answer for the whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import has_star_args, is_prepare, positional
from optimizer_codemod.analysis.collect import CallSite, target_names
from optimizer_codemod.analysis.handoffs import pass_through_argument
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all, is_name
from optimizer_codemod.analysis.script import DATALOADER, ITERATION_WRAPPERS
from optimizer_codemod.analysis.values import (
    Source,
    declares_global,
    local_function,
    locally_assigned,
    method_class,
    outside_calls,
    parameter_names,
    parameter_sources,
    value_sources,
)

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

# Steps followed from the loop to the loader: `self.train_data` -> `train_data` (parameter) ->
# `train_data` (caller's name) -> `prepare_dataloader(...)` -> its return is ten at most.
MAX_STEPS = 10
NEXT = "next"
ANY_SCOPE = -1


@dataclass(frozen=True)
class BatchSource:
    """What an iterable or iterator may hold: DataLoader constructions, and the calls of
    `X.prepare(...)` (Accelerate) whose results it may be."""

    loaders: Tuple[CallSite, ...]
    prepared: Tuple[cst.Call, ...]


def batch_source(
    facts: "ScriptFacts", node: Optional[cst.BaseExpression], function: Optional[cst.CSTNode]
) -> Optional[BatchSource]:
    """The loaders `node`, read in `function` (None: module level), may be, for a `for` over
    it or `next(...)` of it; None when some way it may get its value is not followed, or it
    never gets one."""
    if node is None:
        return None
    ends = _ends(facts, node, function, 0)
    if not ends:
        return None
    loaders: List[CallSite] = []
    prepared: List[cst.Call] = []
    for end in ends:
        site = facts.call_site_of.get(end) if isinstance(end, cst.Call) else None
        if site is not None and site.qualname == DATALOADER:
            loaders.append(site)
        else:
            prepared.append(end)
    return BatchSource(tuple(loaders), tuple(prepared))


def drawn_from(facts: "ScriptFacts", node: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """`it` for `next(it)`: the iterator a `next` call draws from."""
    if (
        isinstance(node, cst.Call)
        and is_name(node.func, NEXT)
        and len(node.args) == 1
        and not node.args[0].star
        and not facts.assignments_to(NEXT)
    ):
        return node.args[0].value
    return None


def drawn_iterator(
    facts: "ScriptFacts", node: cst.BaseExpression, function: Optional[cst.CSTNode]
) -> Optional[Tuple[cst.BaseExpression, Optional[cst.CSTNode]]]:
    """The iterator a batch `node` (read in `function`) is drawn from, with the scope that
    reads that iterator: `it` for `next(it)`; for `wrapper.next()` on an instance of a class
    of this file (makemore's InfiniteDataLoader), the iterator each `return` of that method
    draws from (`return next(self.data_iter)`, or a name the method binds only to such
    draws), read in the method. None for anything else."""
    iterator = drawn_from(facts, node)
    if iterator is not None:
        return iterator, function
    method = _wrapper_method(facts, node, function)
    if method is None:
        return None
    memo = facts.memo("wrapper_method_draws")
    if id(method) not in memo:
        memo[id(method)] = _method_draw(facts, method)
    drawn = memo[id(method)]
    return (drawn, method) if drawn is not None else None


def _method_draw(facts: "ScriptFacts", method: cst.FunctionDef) -> Optional[cst.BaseExpression]:
    """The one iterator every `return` of `method` draws its value from (`next(self.it)`)."""
    if find_all(method.body, cst.FunctionDef, cst.Lambda, cst.ClassDef):
        return None
    rebound = _rebound_names(facts)
    drawn: List[cst.BaseExpression] = []
    for returned in find_all(method.body, cst.Return):
        value = returned.value
        if isinstance(value, cst.Name):
            if (id(method), value.value) in rebound or (ANY_SCOPE, value.value) in rebound:
                return None
            # A name the method assigns is its own: other scopes' bindings do not matter.
            bound = facts.assignments_in_scope(value.value, method)
            if any(a.unpacked or a.augmented for a in bound):
                return None
            values = [a.value for a in bound]
        else:
            values = [value]
        for value in values or [None]:
            iterator = drawn_from(facts, value) if value is not None else None
            if iterator is None:
                return None
            drawn.append(iterator)
    if not drawn or len({dotted_name(i) for i in drawn}) != 1 or dotted_name(drawn[0]) is None:
        return None
    return drawn[0]


def _wrapper_method(
    facts: "ScriptFacts", node: cst.BaseExpression, function: Optional[cst.CSTNode]
) -> Optional[cst.FunctionDef]:
    """The method `m` of class C of this file that `name.m()`, read in `function`, runs,
    where every binding of `name` in its scope builds C (`batch_loader =
    InfiniteDataLoader(...)`), no loop, `with` or `global` binds it too, and C defines `m`
    once, directly, undecorated, taking only `self`."""
    if not (
        isinstance(node, cst.Call)
        and not node.args
        and isinstance(node.func, cst.Attribute)
        and isinstance(node.func.value, cst.Name)
    ):
        return None
    holder = node.func.value.value
    # Python's scopes: a name a function assigns is its own; any other is the module's.
    local = isinstance(function, cst.FunctionDef) and locally_assigned(facts, holder, function)
    scope = function if local else None
    bound = facts.assignments_in_scope(holder, scope)
    built = {dotted_name(a.value.func) if isinstance(a.value, cst.Call) else None for a in bound}
    owner = built.pop() if len(built) == 1 else None
    info = facts.classes.get(owner or "")
    if info is None or any(a.unpacked or a.augmented for a in bound):
        return None
    if holder in _bound_otherwise_somewhere(facts):
        return None
    memo = facts.memo("class_body_bindings")
    if owner not in memo:
        table: Dict[str, List[cst.CSTNode]] = {}
        for statement in info.node.body.body:
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                table.setdefault(statement.name.value, []).append(statement)
                continue
            for target in find_all(statement, cst.AssignTarget, cst.AnnAssign, cst.AugAssign):
                for name in target_names(getattr(target, "target", target)):
                    table.setdefault(name, []).append(statement)
        memo[owner] = table
    bindings = memo[owner].get(node.func.attr.value, [])
    method = bindings[0] if len(bindings) == 1 else None
    if not isinstance(method, cst.FunctionDef) or method.decorators:
        return None
    params = method.params
    only_self = (
        [p.name.value for p in params.params] == ["self"]
        and not params.posonly_params
        and not params.kwonly_params
        and not isinstance(params.star_arg, (cst.Param, cst.ParamStar))
        and params.star_kwarg is None
    )
    return method if only_self and method_class(facts, method) else None


def _ends(
    facts: "ScriptFacts", node: cst.BaseExpression, function: Optional[cst.CSTNode], steps: int
) -> Optional[List[cst.Call]]:
    memo = facts.memo("batch_source_ends")
    key = (id(node), id(function))
    if key in memo:
        return memo[key]
    memo[key] = None  # a cycle of names (`dl = wrap(dl)`) gives no answer
    found = _follow(facts, node, function, steps) if steps < MAX_STEPS else None
    memo[key] = found
    return found


def _follow(
    facts: "ScriptFacts", node: cst.BaseExpression, function: Optional[cst.CSTNode], steps: int
) -> Optional[List[cst.Call]]:
    if isinstance(node, cst.IfExp):
        # `loader if cond else None`: a loop over None raises before any batch is copied.
        branches = [b for b in (node.body, node.orelse) if not is_name(b, "None")]
        return _all_ends(facts, [(b, function) for b in branches], steps)
    if isinstance(node, cst.Call):
        return _call_ends(facts, node, function, steps)
    name = dotted_name(node)
    if name is None:
        return None
    rebound = _rebound_names(facts)
    first = name.split(".")[0]
    if (id(function), first) in rebound or (ANY_SCOPE, first) in rebound:
        return None
    sources = value_sources(facts, name, function)
    if sources is not None:
        return _all_ends(facts, [(s.value, s.function) for s in sources], steps)
    if name in parameter_names(function):
        every = _every_argument(facts, function, name)
        if every is None:
            return None
        return _all_ends(facts, [(s.value, s.function) for s in every], steps)
    if name.startswith("self."):
        return None  # another class's attribute, or set where value_sources cannot see
    if isinstance(function, cst.FunctionDef) and declares_global(function, name.split(".")[0]):
        return None
    # Python's scopes: a name a function assigns is its own; any other is the module's.
    local = isinstance(function, cst.FunctionDef) and locally_assigned(facts, name, function)
    scope = function if local else None
    bound = facts.assignments_in_scope(name, scope)
    if any(a.unpacked and not is_prepare(a.value) for a in bound):
        return None
    return _all_ends(facts, [(a.value, a.site.function) for a in bound], steps)


def _every_argument(
    facts: "ScriptFacts", function: cst.FunctionDef, name: str
) -> Optional[List[Source]]:
    """What every call of this file passes for parameter `name` of `function`, when no other
    module of the run may call it too: a module-level function they do not call, or a
    private method (`_run_epoch`) of a class."""
    if locally_assigned(facts, name, function):
        return None
    owner = method_class(facts, function)
    if owner is None and outside_calls(facts, function.name.value):
        return None
    if owner is not None and outside_calls(facts, owner):
        if not function.name.value.startswith("_"):
            return None
    return parameter_sources(facts, function, name)


def _all_ends(facts, values, steps) -> Optional[List[cst.Call]]:
    if not values:
        return None
    found: List[cst.Call] = []
    for value, scope in values:
        ends = _ends(facts, value, scope, steps + 1)
        if ends is None:
            return None
        found.extend(end for end in ends if all(end is not seen for seen in found))
    return found


def _call_ends(
    facts: "ScriptFacts", call: cst.Call, function: Optional[cst.CSTNode], steps: int
) -> Optional[List[cst.Call]]:
    site = facts.call_site_of.get(call)
    if site is None:
        return None
    if site.qualname == DATALOADER or is_prepare(call):
        return [call]
    wrapper = facts.qualified_name(call.func) or dotted_name(call.func)
    if wrapper in ITERATION_WRAPPERS:
        args = positional(call)
        if not args or has_star_args(call):
            return None
        return _ends(facts, args[0].value, function, steps + 1)
    handed = pass_through_argument(facts, call)
    if handed is not None:
        return _ends(facts, handed, function, steps + 1)
    defined = local_function(facts, site)
    if not isinstance(defined, cst.FunctionDef) or defined.decorators:
        return None
    if find_all(defined.body, cst.FunctionDef, cst.Lambda, cst.ClassDef):
        return None  # a `return`/`yield` found below may belong to a nested scope
    if find_all(defined.body, cst.Yield):
        return None  # a generator that does more than pass its argument's items on
    returns = find_all(defined.body, cst.Return)
    values = [(r.value, defined) for r in returns if r.value is not None]
    if len(values) != len(returns):
        return None
    return _all_ends(facts, values, steps)


def _bound_otherwise_somewhere(facts: "ScriptFacts") -> Set[str]:
    """Names some scope binds otherwise than by an assignment (_rebound_names), or declares
    `global` (a function's assignment then binds the module's name)."""
    memo = facts.memo("batch_source_rebound")
    if "anywhere" not in memo:
        declared = {n.name.value for g in find_all(facts.module, cst.Global) for n in g.names}
        memo["anywhere"] = {name for _, name in _rebound_names(facts)} | declared
    return memo["anywhere"]


def _rebound_names(facts: "ScriptFacts") -> Set[Tuple[int, str]]:
    """(id of the function, name) for names bound by a for loop, a comprehension or `with ...
    as` in that function (ANY_SCOPE for `:=`, wherever it is): bindings that `assignments_to` does not
    record, so a name among them is not followed."""
    memo = facts.memo("batch_source_rebound")
    if "names" not in memo:
        names: Set[Tuple[int, str]] = set()
        for loop in facts.records.loops:
            names.update((id(loop.function), name) for name in loop.targets)
        for comprehension in facts.records.comprehensions:
            scope = id(comprehension.site.function)
            names.update((scope, name) for name in comprehension.targets)
        for item, site in facts.records.with_items:
            if item.asname is not None:
                scope = id(site.function)
                names.update((scope, name) for name in target_names(item.asname.name))
        for walrus in find_all(facts.module, cst.NamedExpr):
            names.update((ANY_SCOPE, name) for name in target_names(walrus.target))
        memo["names"] = names
    return memo["names"]

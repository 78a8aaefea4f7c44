"""Functions that loop over their parameters, and the calls that hand a loader to them.

Real projects build their DataLoaders in `main()` and loop over them elsewhere:
`train_one_epoch(model, criterion, data_loader_train, ...)` from engine.py, called once per
epoch, loops `for samples, targets in metric_logger.log_every(data_loader, 10, header)`,
where `log_every` (a generator method of a class in util/misc.py) loops over its own
parameter. A `LoopingFunction` summarises one function or method: which of its parameters
it loops over (itself or by handing them to another function that does), which it loops over
again and again (inside a loop of its own), and which loaders' datasets it changes
(`data_loader.dataset.set_epoch(epoch)`). Summaries of one file are computed together, in a
few rounds over its calls (a function handing a parameter to another of the file), with the
summaries of other modules of the run given by the project index (project.py) under the
names this file spells them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import has_star_args, positional
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all, is_name
from optimizer_codemod.analysis.values import (
    defined_once,
    locally_assigned,
    parameter_names,
    positional_parameter_names,
)

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.collect import CallSite
    from optimizer_codemod.analysis.script import ScriptFacts

ROUNDS = 4  # a parameter handed on through this many functions of one file
# Builtins that iterate their positional arguments (`zip(loader_a, loader_b)`) when called.
ITERATING_BUILTINS = frozenset({"enumerate", "iter", "zip", "list", "tuple", "sorted"})
# Builtins that read a loader without iterating it.
NOT_ITERATING = frozenset(
    {"len", "print", "isinstance", "hasattr", "getattr", "id", "type", "repr"}
)


@dataclass(frozen=True)
class LoopingFunction:
    """What a function does with its parameters, for a loader handed to it."""

    parameters: Tuple[str, ...]  # its positional parameters in order, `self` left out
    iterated: Tuple[str, ...]  # the parameters it loops over
    repeated: Tuple[str, ...]  # those it loops over inside a loop of its own
    dataset_changed: Tuple[str, ...]  # loaders whose `.dataset` it changes
    varargs: bool = False  # it takes `*args` (positions past `parameters` are unknown)
    # those it hands to a function that cannot be read (`metric_logger.log_every(p)` with
    # MetricLogger from a module outside the run): whether it loops over them is unknown
    handed_away: Tuple[str, ...] = ()
    # A generator that only yields the items of a loop over this parameter, unchanged
    # (`MetricLogger.log_every(self, iterable, ...)`: `for obj in iterable: ... yield obj`):
    # a loop over the call gets the batches of what it is handed (passed_through).
    yields_items_of: str = ""

    def bound(self, call: cst.Call, arg: cst.Arg) -> Optional[str]:
        """The parameter `arg` of `call` binds, None when it cannot be told."""
        if arg.star:
            return None
        if arg.keyword is not None:
            return arg.keyword.value
        if has_star_args(call) and not _before_star(call, arg):
            return None
        index = next(i for i, a in enumerate(positional(call)) if a is arg)
        return self.parameters[index] if index < len(self.parameters) else None


def _before_star(call: cst.Call, arg: cst.Arg) -> bool:
    for each in call.args:
        if each is arg:
            return True
        if each.star:
            return False
    return False


def looping_functions(
    facts: "ScriptFacts", elsewhere: Mapping[str, LoopingFunction]
) -> Dict[str, LoopingFunction]:
    """{`name` of a module-level function, `Class.method`: its summary} for this file, with
    `elsewhere` the summaries of other modules' functions under this file's spelling of them
    (`train_one_epoch`, `engine.train_one_epoch`, `utils.MetricLogger.log_every`)."""
    functions = _functions(facts)
    iterated: Dict[str, set] = {key: set() for key in functions}
    repeated: Dict[str, set] = {key: set() for key in functions}
    changed: Dict[str, set] = {key: set() for key in functions}
    key_of = {id(node): key for key, node in functions.items()}
    loops = [
        (loop.function, loop.iter, loop.ancestors)
        for loop in facts.records.loops
        if isinstance(loop.node, cst.For)
    ]
    loops += [(c.site.function, c.iter, c.site.loops) for c in facts.records.comprehensions]
    for function, iterable, outer_loops in loops:
        key = key_of.get(id(function))
        name = facts.iterated_name(iterable)
        if key is not None and name in parameter_names(function):
            iterated[key].add(name)
            if any(outer.function is function for outer in outer_loops):
                repeated[key].add(name)
    for key, name in _datasets_changed(facts, key_of):
        changed[key].add(name)
    handed_away = _handed_away(facts, key_of, elsewhere)
    through = {key: passed_through(facts, function) or "" for key, function in functions.items()}
    summaries = _summaries(functions, iterated, repeated, changed, handed_away, through)
    for _ in range(ROUNDS):
        grew = False
        for call in facts.records.calls:
            key = key_of.get(id(call.site.function))
            if key is None:
                continue
            callee = callee_summary(facts, call, summaries, elsewhere)
            if callee is None:
                continue
            own = parameter_names(call.site.function)
            in_loop = any(loop.function is call.site.function for loop in call.site.loops)
            for arg in call.node.args:
                name = dotted_name(arg.value)
                target = callee.bound(call.node, arg)
                if name not in own or target is None:
                    continue
                for table, found in (
                    (iterated, target in callee.iterated),
                    (
                        repeated,
                        target in callee.repeated or (in_loop and target in callee.iterated),
                    ),
                    (changed, target in callee.dataset_changed),
                ):
                    if found and name not in table[key]:
                        table[key].add(name)
                        grew = True
        if not grew:
            break
        summaries = _summaries(functions, iterated, repeated, changed, handed_away, through)
    return summaries


def _handed_away(facts, key_of, elsewhere) -> Dict[str, set]:
    """{function key: its parameters handed, as an argument, to a call whose callee has no
    summary here or in the project index (builtins that only read them left out)."""
    found: Dict[str, set] = {key: set() for key in key_of.values()}
    for call in facts.records.calls:
        key = key_of.get(id(call.site.function))
        if key is None:
            continue
        written = dotted_name(call.node.func)
        if written in NOT_ITERATING and not facts.imports.is_bound(written):
            continue
        if callee_summary(facts, call, {}, elsewhere) is not None:
            continue
        if callee_key(facts, call) in found:
            continue  # a function of this file: its own summary says what it does
        own = parameter_names(call.site.function)
        found[key].update(
            dotted_name(arg.value) for arg in call.node.args if dotted_name(arg.value) in own
        )
    return found


def _functions(facts: "ScriptFacts") -> Dict[str, cst.FunctionDef]:
    found: Dict[str, cst.FunctionDef] = {}
    for statement in facts.module.body:
        if isinstance(statement, cst.FunctionDef):
            found[statement.name.value] = statement
    for class_name, info in facts.classes.items():
        for statement in info.node.body.body:
            if isinstance(statement, cst.FunctionDef):
                found[f"{class_name}.{statement.name.value}"] = statement
    return found


def _summaries(
    functions, iterated, repeated, changed, handed_away, through
) -> Dict[str, LoopingFunction]:
    return {
        key: _summary(
            key,
            function,
            iterated=tuple(sorted(iterated[key])),
            repeated=tuple(sorted(repeated[key])),
            dataset_changed=tuple(sorted(changed[key])),
            handed_away=tuple(sorted(handed_away[key])),
            yields_items_of=through[key],
        )
        for key, function in functions.items()
    }


def _summary(key: str, function: cst.FunctionDef, **found) -> LoopingFunction:
    """`function`'s summary under `key`, with what `found` says it does with its parameters;
    `self`/`cls` of a method is no parameter a call binds."""
    params = positional_parameter_names(function)
    if "." in key and params and params[0] in ("self", "cls"):
        params = params[1:]
    varargs = isinstance(function.params.star_arg, cst.Param)
    return LoopingFunction(parameters=tuple(params), varargs=varargs, **found)


def passed_through(facts: "ScriptFacts", function: cst.FunctionDef) -> Optional[str]:
    """The parameter of `function` whose items it yields unchanged, when it is a generator
    whose every `yield` gives the item of a `for item in param` loop over that one parameter
    (never rebound): `def cycle(dl): while True: for x in dl: yield x`, torchvision's
    `log_every`. None for anything else, or when nested scopes make it unclear. Memoised:
    the project index asks again at each round over a file's calls."""
    if id(function) not in facts.records.generators or function.decorators:
        return None
    memo = facts.memo("passed_through")
    if id(function) not in memo:
        memo[id(function)] = _passed_through(facts, function)
    return memo[id(function)]


def _passed_through(facts: "ScriptFacts", function: cst.FunctionDef) -> Optional[str]:
    found = find_all(function.body, cst.Yield, cst.FunctionDef, cst.Lambda, cst.ClassDef)
    if any(not isinstance(node, cst.Yield) for node in found):
        return None  # a `yield` found below may belong to a nested scope
    parameters = set(parameter_names(function))
    items_of = {}
    for loop in find_all(function.body, cst.For):
        looped = _item_of_parameter(loop)
        if looped is None or looped[0] not in parameters:
            continue
        for each in find_all(loop.body, cst.Yield):
            if isinstance(each.value, cst.Name) and each.value.value == looped[1]:
                if not locally_assigned(facts, looped[1], function):
                    items_of[id(each)] = looped[0]
    iterated = set(items_of.values())
    if len(items_of) != len(found) or len(iterated) != 1:
        return None
    parameter = iterated.pop()
    return None if locally_assigned(facts, parameter, function) else parameter


def _item_of_parameter(loop: cst.For) -> Optional[Tuple[str, str]]:
    """(iterated name, the name bound to each whole item) for `for item in name:` and
    `for i, item in enumerate(name):`; None for any other loop."""
    iterated, target = loop.iter, loop.target
    if (
        isinstance(iterated, cst.Call)
        and is_name(iterated.func, "enumerate")
        and len(iterated.args) == 1
        and not iterated.args[0].star
        and isinstance(target, cst.Tuple)
        and len(target.elements) == 2
    ):
        iterated, target = iterated.args[0].value, target.elements[1].value
    if isinstance(iterated, cst.Name) and isinstance(target, cst.Name):
        return iterated.value, target.value
    return None


def pass_through_argument(facts: "ScriptFacts", call: cst.Call) -> Optional[cst.BaseExpression]:
    """What `call` hands to a generator that yields its items unchanged (passed_through), of
    this file (a function, `self.m(...)`, `logger.m(...)` on an instance of a class of it) or
    of another module of the run (the project index's summaries): `data_loader` for
    `metric_logger.log_every(data_loader, 10, header)`. None for any other call."""
    site = facts.call_site_of.get(call)
    if site is None:
        return None
    key = callee_key(facts, site)
    memo = facts.memo("pass_through_functions")
    if "table" not in memo:
        memo["table"] = _pass_through_functions(facts)
    summary = memo["table"].get(key or "")
    if summary is None:
        return None
    for arg in call.args:
        if summary.bound(call, arg) == summary.yields_items_of:
            return arg.value
    return None


def _pass_through_functions(facts: "ScriptFacts") -> Dict[str, LoopingFunction]:
    """{callee key: summary} of the pass-through generators this file may call: its own, and
    those the project index gives (built without the other summaries: iterated_name, which
    those summaries read, asks this table)."""
    project = getattr(facts, "project", None)
    table = {
        key: summary
        for key, summary in getattr(project, "looping_functions", ())
        if summary.yields_items_of
    }
    for key, function in _functions(facts).items():
        if "." not in key and not defined_once(facts, key):
            continue  # defined twice, or bound otherwise: which one runs is unknown
        parameter = passed_through(facts, function)
        if parameter is not None:
            table[key] = _summary(
                key,
                function,
                iterated=(),
                repeated=(),
                dataset_changed=(),
                yields_items_of=parameter,
            )
    return table


def _datasets_changed(facts: "ScriptFacts", key_of: Dict[int, str]):
    """(function, parameter `p`) for each method call of `p.dataset` (or of a part of it)
    and each assignment to an attribute of it: `p.dataset.set_epoch(epoch)`, `p.dataset.x = 1`."""
    written = [(call.receiver or "", call.site.function) for call in facts.records.calls]
    written += [(a.target.rpartition(".")[0], a.site.function) for a in facts.records.assignments]
    for receiver, function in written:
        parts = receiver.split(".")
        key = key_of.get(id(function))
        dataset_of = parts[0] if len(parts) > 1 and parts[1] == "dataset" else None
        if key is not None and dataset_of in parameter_names(function):
            yield key, dataset_of


def callee_summary(
    facts: "ScriptFacts",
    call: "CallSite",
    local: Mapping[str, LoopingFunction],
    elsewhere: Mapping[str, LoopingFunction],
) -> Optional[LoopingFunction]:
    """The summary of the function `call` runs, when this file or the project index knows it:
    `train(...)`, `engine.train_one_epoch(...)`, `self._run_epoch(...)` in a method,
    `metric_logger.log_every(...)` with `metric_logger = utils.MetricLogger(...)`."""
    key = callee_key(facts, call)
    if key is None:
        return None
    if key in ITERATING_BUILTINS and key not in local and not facts.imports.is_bound(key):
        return _BUILTIN_SUMMARIES[key]
    return local.get(key) or elsewhere.get(key)


def callee_key(facts: "ScriptFacts", call: "CallSite") -> Optional[str]:
    """How the callee is spelled in the summaries: `f`, `mod.f`, `Class.method`."""
    func = call.node.func
    if isinstance(func, cst.Name):
        return func.value
    if not isinstance(func, cst.Attribute):
        return None
    receiver = dotted_name(func.value)
    if receiver is None:
        return None
    if receiver in ("self", "cls") and call.site.class_name is not None:
        return f"{call.site.class_name}.{func.attr.value}"
    instance_of = _class_of(facts, receiver, call)
    if instance_of is not None:
        return f"{instance_of}.{func.attr.value}"
    return f"{receiver}.{func.attr.value}"


def _class_of(facts: "ScriptFacts", receiver: str, call: "CallSite") -> Optional[str]:
    """The class spelling of `receiver` when it is assigned once, in the calling function (or
    at module level), from a call of that class: `metric_logger = utils.MetricLogger(...)`."""
    memo = facts.memo("class_of_receiver")
    if "by_scope" not in memo:
        by_scope: Dict[Tuple[str, int], list] = {}
        for assignment in facts.records.assignments:
            by_scope.setdefault((assignment.target, id(assignment.site.function)), []).append(
                assignment
            )
        memo["by_scope"] = by_scope
    by_scope = memo["by_scope"]
    assignments = by_scope.get((receiver, id(call.site.function)), [])
    if call.site.function is not None:
        assignments = assignments + by_scope.get((receiver, id(None)), [])
    single = assignments[0] if len(assignments) == 1 else None
    value = single.value if single is not None and not single.unpacked else None
    return dotted_name(value.func) if isinstance(value, cst.Call) else None


def _builtin(name: str) -> LoopingFunction:
    count = 1 if name in ("enumerate", "iter", "list", "tuple", "sorted") else 8
    parameters = tuple(f"_{i}" for i in range(count))
    return LoopingFunction(parameters, parameters, (), ())


_BUILTIN_SUMMARIES: Dict[str, LoopingFunction] = {n: _builtin(n) for n in ITERATING_BUILTINS}


SummariesByHead = Mapping[str, List[Tuple[str, LoopingFunction]]]


def summaries_by_head(summaries: Mapping[str, LoopingFunction]) -> SummariesByHead:
    """A module's summaries grouped by the name their key begins with (a function's own; a
    class's methods, `Class.method`): an imported name then reads only its own group."""
    grouped: Dict[str, List[Tuple[str, LoopingFunction]]] = {}
    for key, summary in summaries.items():
        grouped.setdefault(key.split(".", 1)[0], []).append((key, summary))
    return grouped


def spelled_summaries(
    spellings: List[Tuple[str, SummariesByHead, str]],
) -> Dict[str, LoopingFunction]:
    """Summaries under this file's spelling: for each (spelling, the defining module's
    summaries by head, the name there, "" for a whole module), its function or its class's
    methods."""
    found: Dict[str, LoopingFunction] = {}
    for spelling, by_head, name in spellings:
        if not name:
            for group in by_head.values():
                for key, summary in group:
                    found[f"{spelling}.{key}"] = summary
            continue
        for key, summary in by_head.get(name.split(".", 1)[0], ()):
            if key == name:
                found[spelling] = summary
            elif key.startswith(name + "."):
                found[spelling + key[len(name) :]] = summary
    return found

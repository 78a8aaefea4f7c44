"""What a script hands to the training loops of other modules: its models.

An entry point often builds the model and runs a loop that lives elsewhere:
`model = create_model(args.model)`, `model = DDP(model)`, then
`train_one_epoch(model, ...)` from engine.py, or `TrainLoop(model=model, ...).run_loop()`.
Read alone, the entry point trains nothing and the loop's module trains a parameter, so the
per-model rules (compile, channels_last, DDP options) see no model anywhere. The project
index (project.py) tells the entry point which of its calls run those loops
(`LoopsElsewhere`); this module follows their arguments back to the statements that build
the models, so that rules can act, or say why not, where the model is built.

Also here: models whose architecture is chosen at run time by name
(`models.__dict__[args.arch]()`, timm's `create_model(args.model)`): no analysis can tell
what they are built from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, List, Optional, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt, positional
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.mutation import builds_torch_loss
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.precision import loops_elsewhere
from optimizer_codemod.analysis.training import (
    MODULE_RETURNING_METHODS,
    PLACEMENT_METHODS,
    builds_module,
    is_expression_statement,
    keeps_module_object,
    left_before,
    placement_calls,
    placement_device,
    wrapped_model,
)

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.collect import Assignment, CallSite
    from optimizer_codemod.analysis.script import ScriptFacts

# Builders that take the architecture's name: timm's registry.
NAMED_BUILDERS = ("timm.create_model", "timm.models.create_model")
WRAPPER_SUFFIX = ".module"  # `model.module`: the model a DDP wrapper holds


@dataclass(frozen=True)
class ModelTrainedElsewhere:
    """A model an entry point builds and hands to a training loop of another module."""

    name: str  # as the entry point spells it: `model`
    built: "Assignment"  # the statement that builds it (wrappers and moves left out)
    # The statement after which it is built and placed: its last `model.to(...)` or
    # `model.cuda()` statement after `built`, in the same function, else `built`'s.
    placed: cst.CSTNode
    placed_at: int  # the visit order of `placed`
    runner: "CallSite"  # the call that runs the loop: `train_one_epoch(...)`, `.run_loop()`
    modules: Tuple[str, ...]  # the files whose loops the script runs

    @property
    def loop(self) -> str:
        """The loop's function or method and its files, for messages."""
        func = self.runner.node.func
        called = func.attr.value if isinstance(func, cst.Attribute) else dotted_name(func)
        return f"`{called}` ({', '.join(self.modules)})"


def models_trained_elsewhere(facts: "ScriptFacts") -> List[ModelTrainedElsewhere]:
    """The models this script builds and hands to training loops of other modules of the run,
    one per model name, in source order; empty for a script without such loops."""
    memo = facts.memo("models_trained_elsewhere")
    if "found" not in memo:
        memo["found"] = _find_models(facts)
    return memo["found"]


def _find_models(facts: "ScriptFacts") -> List[ModelTrainedElsewhere]:
    loops = loops_elsewhere(facts)
    if loops is None:
        return []
    found: dict = {}
    for runner in facts.records.calls:
        if not (dotted_name(runner.node.func) in loops.functions or runner.method in loops.methods):
            continue
        for keyword, value in _arguments(facts, runner):
            name = dotted_name(value)
            if name is None:
                continue
            name = name.removesuffix(WRAPPER_SUFFIX)
            built = _building_assignment(facts, name)
            if built is None or name in found:
                continue
            if _is_model(facts, built, name, keyword):
                placed, order = _placement(facts, name, built, runner)
                found[name] = ModelTrainedElsewhere(
                    name, built, placed, order, runner, loops.modules
                )
    return sorted(found.values(), key=lambda m: m.built.site.order)


def _arguments(
    facts: "ScriptFacts", runner: "CallSite"
) -> Iterator[Tuple[Optional[str], cst.BaseExpression]]:
    """(keyword or None, value) for the arguments of the call that runs the loop and, for a
    method call, of the call that built its receiver (`TrainLoop(model=model).run_loop()`,
    `trainer = Trainer(model, ds)` then `trainer.run()`)."""
    calls = [runner.node]
    func = runner.node.func
    if runner.method is not None and isinstance(func, cst.Attribute):
        if isinstance(func.value, cst.Call):
            calls.append(func.value)
        elif runner.receiver is not None:
            calls += [
                a.value
                for a in facts.assignments_to(runner.receiver)
                if isinstance(a.value, cst.Call) and not a.unpacked
            ]
    for call in calls:
        for arg in call.args:
            if not arg.star:
                yield (arg.keyword.value if arg.keyword is not None else None), arg.value


def _building_assignment(facts: "ScriptFacts", name: str) -> Optional["Assignment"]:
    """The first assignment to `name` that does not take it from itself (`model =
    DDP(model)`, `model = model.to(device)` are left out)."""
    for assignment in sorted(facts.assignments_to(name), key=lambda a: a.site.order):
        if assignment.augmented:
            continue
        if name.split(".")[0] not in _variables(assignment.value):
            return assignment
    return None


def _placement(
    facts: "ScriptFacts", name: str, built: "Assignment", runner: "CallSite"
) -> Tuple[cst.CSTNode, int]:
    placed, order = built.site.statement, built.site.order
    for method in PLACEMENT_METHODS:
        for call in facts.method_calls(method):
            site = call.site
            if (
                call.receiver == name
                and site.function is built.site.function
                and order < site.order < runner.site.order
                and not site.loops
                and is_expression_statement(site.statement, call.node)
                and not left_before(facts, site.statement, runner.node)
            ):
                placed, order = site.statement, site.order
    return placed, order


def placed_device(
    facts: "ScriptFacts", handed: ModelTrainedElsewhere
) -> Optional[cst.BaseExpression]:
    """The device the model's `placed` statement puts it on (`model.to(device)`, `"cuda"` for
    `model.cuda()`), when that is a name or a string it can read; else None."""
    for call in placement_calls(facts, handed.name):
        if call.site.statement is handed.placed:
            device = placement_device(facts, call)
            if isinstance(device, cst.SimpleString) or dotted_name(device) is not None:
                return device
    return None


def rebound_after_placement(
    facts: "ScriptFacts", handed: ModelTrainedElsewhere
) -> Optional[cst.CSTNode]:
    """A statement that binds the model's name again between its placement and the call that
    runs the loop, other than a data-parallel wrapper of it (`model = DDP(model, ...)`)."""
    for assignment in facts.assignments_to(handed.name):
        site = assignment.site
        if (
            site.function is handed.built.site.function
            and handed.placed_at < site.order < handed.runner.site.order
            and wrapped_model(facts, assignment.value) != handed.name
            and not keeps_module_object(assignment, handed.name)
        ):
            return site.statement
    return None


def _variables(node: cst.CSTNode) -> Set[str]:
    """The names `node` reads as variables (not attribute names nor keywords)."""
    labels = {id(a.attr) for a in find_all(node, cst.Attribute)}
    labels |= {id(a.keyword) for a in find_all(node, cst.Arg) if a.keyword is not None}
    return {n.value for n in find_all(node, cst.Name) if id(n) not in labels}


def _is_model(facts: "ScriptFacts", built: "Assignment", name: str, keyword: Optional[str]) -> bool:
    """`built` builds an nn.Module the analysis knows, a model chosen by name, or (a call the
    analysis cannot follow) one passed as `model`. A loss module of torch's
    (`criterion = nn.CrossEntropyLoss()`, handed to the loop beside the model) trains nothing."""
    if builds_torch_loss(facts, built.value):
        return False
    if not built.unpacked and builds_module(facts, built.value):
        return True
    if chosen_by_name(facts, built.value) is not None:
        return True
    return isinstance(built.value, cst.Call) and "model" in (keyword, name)


def chosen_by_name(facts: "ScriptFacts", node: cst.BaseExpression) -> Optional[str]:
    """The lookup (as written) when `node` builds a model whose architecture is chosen at run
    time by name: `models.__dict__[args.arch](...)`, `getattr(models, args.arch)(...)`,
    timm's `create_model(args.model, ...)`, or a builder handed such a class
    (`MoCo(models.__dict__[args.arch], ...)`); else None."""
    # `models.__dict__[arch]().cuda()`: the model the placement returns.
    while (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in MODULE_RETURNING_METHODS
    ):
        node = node.func.value
    if not isinstance(node, cst.Call):
        return None
    func = node.func
    if isinstance(func, cst.Subscript) and _registry(func):
        return excerpt(func)
    if isinstance(func, cst.Call) and dotted_name(func.func) == "getattr":
        args = positional(func)
        if len(args) == 2 and not isinstance(args[1].value, cst.SimpleString):
            return excerpt(func)
    if facts.qualified_name(func) in NAMED_BUILDERS:
        args = positional(node)
        if args and not isinstance(args[0].value, cst.SimpleString):
            return excerpt(node)
        return None
    for arg in node.args:
        if isinstance(arg.value, cst.Subscript) and _registry(arg.value):
            return excerpt(arg.value)
    return None


def _registry(node: cst.Subscript) -> bool:
    """`x.__dict__[...]`: a module's namespace indexed by a name."""
    value = node.value
    return isinstance(value, cst.Attribute) and value.attr.value == "__dict__"


def models_chosen_by_name(facts: "ScriptFacts") -> List[Tuple["Assignment", str]]:
    """(assignment, lookup) for each assignment of this file that builds a model chosen at
    run time by name, in source order."""
    memo = facts.memo("models_chosen_by_name")
    if "found" not in memo:
        memo["found"] = [
            (a, lookup)
            for a in sorted(facts.records.assignments, key=lambda a: a.site.order)
            if not a.augmented and (lookup := chosen_by_name(facts, a.value)) is not None
        ]
    return memo["found"]

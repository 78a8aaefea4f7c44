"""Helpers that gather a module's parameters into optimizer groups.

Real scripts rarely hand `model.parameters()` to the optimizer themselves: torchvision's
classification reference builds `parameters = utils.set_weight_decay(model, ...)`, timm's
`param_groups_weight_decay(model, ...)` and MAE's `lrd.param_groups_lrd(model, ...)` split
the model's parameters by weight decay. The model they are handed is the model the optimizer
trains. A helper counts when it is a top-level function that returns a value and calls
`.parameters()` or `.named_parameters()` on one of its own parameters, or hands that parameter
to a nested function that does (torchvision's `_add_params(model)` walks the children).
Parameters of an attribute (`model.head.parameters()`) do not count: only part of the model
would be trained, and the analysis says nothing of which part.

Functions of this file are found here (memoised per file); those of the other modules of the
run come from the project index (project.ImportedGathering), spelled as this file calls them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import argument, callee_name, receiver
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.parameter_loops import PARAMETER_METHODS
from optimizer_codemod.analysis.values import defined_once, positional_parameter_names

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

# Rounds of helpers handing the module on to helpers found in the round before.
HELPER_DEPTH = 3


def gathering_functions(facts: "ScriptFacts") -> Dict[str, Tuple[str, int]]:
    """{top-level function of this file: (name, position) of the parameter whose module's
    parameters it gathers and returns}, memoised."""
    memo = facts.memo("gathering_functions")
    if "found" not in memo:
        found: Dict[str, Tuple[str, int]] = {}
        gathers = any(call.method in PARAMETER_METHODS for call in facts.records.calls)
        functions = [
            statement
            for statement in (facts.module.body if gathers else ())
            if isinstance(statement, cst.FunctionDef) and defined_once(facts, statement.name.value)
        ]
        # A helper may hand the module on to another of the file's helpers (Swin's
        # build_optimizer calls set_weight_decay(model, ...)): a few rounds, each one pass.
        for _ in range(HELPER_DEPTH):
            before = len(found)
            for function in functions:
                if function.name.value not in found:
                    gathered = _gathered_parameter(function, found)
                    if gathered is not None:
                        found[function.name.value] = gathered
            if len(found) == before:
                break
        memo["found"] = found
    return memo["found"]


def gathered_module(facts: "ScriptFacts", call: cst.Call) -> Optional[str]:
    """The name handed to `call` when it calls a helper that gathers that module's parameters
    (`utils.set_weight_decay(model, wd)` gives `model`); None for any other call."""
    spelling = dotted_name(call.func)
    if spelling is None:
        return None
    gathered = gathering_functions(facts).get(spelling) if "." not in spelling else None
    if gathered is None:
        project = getattr(facts, "project", None)
        for imported in getattr(project, "gathering_functions", ()):
            if imported.name == spelling:
                gathered = (imported.parameter, imported.index)
    if gathered is None:
        return None
    handed = argument(call, *gathered)
    return dotted_name(handed.value) if handed is not None else None


def _gathered_parameter(
    function: cst.FunctionDef, helpers: Dict[str, Tuple[str, int]]
) -> Optional[Tuple[str, int]]:
    """(name, position) of the first parameter of `function` whose parameters it gathers,
    itself, through a nested function or through one of the file's `helpers` found so far,
    when it returns a value; else None."""
    if not any(r.value is not None for r in find_all(function.body, cst.Return)):
        return None
    gathered = _receivers(function.body)
    # Each nested function's own parameters whose parameters it gathers, read once.
    nested: Dict[str, List[Tuple[str, int]]] = {}
    for inner in find_all(function.body, cst.FunctionDef):
        own = _receivers(inner.body)
        nested[inner.name.value] = [
            (parameter, position)
            for position, parameter in enumerate(positional_parameter_names(inner))
            if parameter in own
        ]
    for call in find_all(function.body, cst.Call):
        if not isinstance(call.func, cst.Name):
            continue
        walks = nested.get(call.func.value)
        if walks is None and call.func.value in helpers:
            walks = [helpers[call.func.value]]
        for parameter, position in walks or ():
            handed = argument(call, parameter, position)
            if handed is not None and isinstance(handed.value, cst.Name):
                gathered.add(handed.value.value)
    for position, parameter in enumerate(positional_parameter_names(function)):
        if parameter in gathered:
            return parameter, position
    return None


def _receivers(body: cst.CSTNode) -> Set[str]:
    """The plain names whose `.parameters()`/`.named_parameters()` `body` calls."""
    found = set()
    for call in find_all(body, cst.Call):
        inner = receiver(call)
        if callee_name(call) in PARAMETER_METHODS and isinstance(inner, cst.Name):
            found.add(inner.value)
    return found

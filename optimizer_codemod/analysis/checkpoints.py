"""Checkpoints that training libraries write on the training thread, as `torch.save` does:
Accelerate's `accelerator.save_state(dir)` and Lightning Fabric's `fabric.save(path, state)`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection, List, Optional, Tuple

import libcst as cst

from optimizer_codemod.analysis.collect import CallSite
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import parameters_of
from optimizer_codemod.analysis.values import ACCELERATOR, built_by, locally_assigned

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

FABRICS = ("lightning.Fabric", "lightning.fabric.Fabric", "lightning_fabric.Fabric")
# method -> (the classes whose instances write a checkpoint with it, the library's name)
LIBRARY_SAVES = {
    "save_state": ((ACCELERATOR,), "Accelerate"),
    "save": (FABRICS, "Lightning Fabric"),
}


def library_saves(facts: "ScriptFacts") -> List[Tuple[CallSite, str]]:
    """Each checkpoint write of a library object, with the library's name: the receiver is
    built by that library's class wherever the file binds it, or is a parameter annotated
    with the class (litgpt's `def fit(fabric: L.Fabric, ...)`)."""
    found = []
    for call in facts.records.calls:
        known = LIBRARY_SAVES.get(call.method or "")
        if known is None or not isinstance(call.node.func, cst.Attribute):
            continue
        classes, library = known
        if holds_instance(facts, call.node.func.value, call.site.function, classes):
            found.append((call, library))
    return found


def holds_instance(
    facts: "ScriptFacts",
    receiver: cst.BaseExpression,
    function: Optional[cst.CSTNode],
    classes: Collection[str],
) -> bool:
    """`receiver` holds an instance of one of `classes`: every binding of it builds one, or
    it is a parameter of `function`, never rebound there, annotated with one."""
    if built_by(facts, receiver, classes):
        return True
    name = dotted_name(receiver)
    if not isinstance(function, cst.FunctionDef) or name is None or "." in name:
        return False
    if locally_assigned(facts, name, function):
        return False
    for param in parameters_of(function.params):
        if param.name.value == name and param.annotation is not None:
            return facts.qualified_name(param.annotation.annotation) in classes
    return False

"""Checkpoints that training libraries write on the training thread, as `torch.save` does:
Accelerate's `accelerator.save_state(dir)`, Lightning Fabric's `fabric.save(path, state)` and
Hugging Face's `model.save_pretrained(dir)`."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Collection, List, Optional, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import callee_name, code_of
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
    return found + _pretrained_saves(facts)


# Receivers of `save_pretrained` that hold no weights: a tokenizer's files are a few kB.
_SMALL_PRETRAINED = re.compile(r"token|processor|config|feature_extractor", re.IGNORECASE)


def _pretrained_saves(facts: "ScriptFacts") -> List[Tuple[CallSite, str]]:
    """`model.save_pretrained(dir)` (Hugging Face transformers, diffusers, peft): it
    gathers the state dict and writes it on the calling thread, as `torch.save` does."""
    return [
        (call, "Hugging Face's `save_pretrained`")
        for call in facts.records.calls
        if call.method == "save_pretrained"
        and isinstance(call.node.func, cst.Attribute)
        and not _SMALL_PRETRAINED.search(code_of(call.node.func.value))
    ]


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


# Words in the name of a function that, handed an optimizer, may load saved state into it.
_RESTORING_WORDS = re.compile(r"load|resume|restore", re.IGNORECASE)


def restores_optimizer_state(facts: "ScriptFacts", optimizer: cst.Call) -> Optional[cst.Call]:
    """A call that may load saved state into the optimizer `optimizer` builds: a
    `load_state_dict` on the name it is bound to or on any name that says it holds an
    optimizer (a helper's `optimizer.load_state_dict(ckpt["optimizer"])`), a function named
    for loading, resuming or restoring that is handed that name (vits's
    `utils.load_checkpoint(path, net_g, optim_g)`), or Accelerate's `load_state`; None when
    nothing does."""
    bound = facts.assignment_of(optimizer)
    name = bound.target if bound is not None else None
    last = name.rsplit(".", 1)[-1] if name is not None else None
    for call in facts.records.calls:
        if call.method == "load_state_dict" and call.receiver is not None:
            held = call.receiver.rsplit(".", 1)[-1]
            if call.receiver == name or held == last or "optim" in held.lower():
                return call.node
        elif call.method == "load_state" and call.receiver is not None:
            if holds_instance(facts, call.node.func.value, call.site.function, (ACCELERATOR,)):
                return call.node
        elif name is not None and _RESTORING_WORDS.search(callee_name(call.node) or ""):
            if any(dotted_name(arg.value) == name for arg in call.node.args):
                return call.node
    return None

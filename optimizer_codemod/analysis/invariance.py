"""Loop invariance: expressions whose value is the same on every iteration of a loop.

An expression is invariant when it reads only literals, imported names (`torch.float32`) and
names or attribute chains that nothing in the loop binds or assigns (its targets, assignments,
`for`/`with`/walrus targets, `del`, nested definitions) or writes in place, combined by arithmetic, tuples and
`torch.device(...)`. Any other call, and any subscript, may give a different value each time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Set

import libcst as cst

from optimizer_codemod.analysis.collect import Loop, names_bound_otherwise, target_names
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.inplace import is_inplace_name
from optimizer_codemod.analysis.nodes import find_all

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

INVARIANT_CALLS = frozenset({"torch.device"})


def names_bound_in(loop: Loop) -> Set[str]:
    """Every dotted name the loop (its header target and body) binds or assigns."""
    bound: Set[str] = set(loop.targets) | names_bound_otherwise(loop.node.body)
    for node in find_all(loop.node.body, cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.Call):
        if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)):
            bound.update(target_names(node.target))
        # Written in place: `x.add_(1)`, `x[0] = 1`, `x[0] += 1`.
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            if is_inplace_name(node.func.attr.value):
                bound.add(dotted_name(node.func.value) or "")
        elif isinstance(node, (cst.AssignTarget, cst.AugAssign)):
            for part in find_all(node.target, cst.Subscript):
                bound.add(dotted_name(part.value) or "")
    bound.discard("")
    return bound


def is_invariant(facts: "ScriptFacts", node: cst.BaseExpression, bound: Set[str]) -> bool:
    """`node` has the same value on every iteration of the loop that binds `bound`."""
    if isinstance(node, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString)):
        return True
    if isinstance(node, (cst.Name, cst.Attribute)):
        name = dotted_name(node)
        if name is None:
            return False
        parts = name.split(".")
        prefixes = {".".join(parts[: i + 1]) for i in range(len(parts))}
        return not prefixes & bound
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(
            not isinstance(e, cst.StarredElement) and is_invariant(facts, e.value, bound)
            for e in node.elements
        )
    if isinstance(node, cst.UnaryOperation):
        return is_invariant(facts, node.expression, bound)
    if isinstance(node, cst.BinaryOperation):
        return is_invariant(facts, node.left, bound) and is_invariant(facts, node.right, bound)
    if isinstance(node, cst.Call):
        return facts.qualified_name(node.func) in INVARIANT_CALLS and all(
            not arg.star and is_invariant(facts, arg.value, bound) for arg in node.args
        )
    return False

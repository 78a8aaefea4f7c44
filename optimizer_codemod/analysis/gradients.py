"""Where a script looks at `.grad` (the reads that would see None instead of a zero tensor),
and where it differentiates a gradient again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List

import libcst as cst

from optimizer_codemod.analysis.calls import argument, is_literal, literal, positional
from optimizer_codemod.analysis.collect import CallSite, Site

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts


@dataclass(frozen=True)
class GradRead:
    node: cst.CSTNode  # `p.grad`, the `p.grad += g` statement, or `getattr(p, "grad")`
    site: Site


def grad_reads(facts: "ScriptFacts") -> List[GradRead]:
    """Every place that reads a `.grad`, in visit order.

    Beyond plain attribute reads (`p.grad.norm()`, `p.grad is None`, `p.grad.data`): updates
    in place (`p.grad += noise`, which fails on None) and `getattr(p, "grad")`. Stores
    (`p.grad = None`) read nothing.
    """
    # `torch.autograd.grad(...)` is a function that returns gradients: no `.grad` is read.
    found = [
        GradRead(read.node, read.site)
        for read in facts.records.grad_reads
        if facts.qualified_name(read.node) != "torch.autograd.grad"
    ]
    found += [
        GradRead(a.statement_node, a.site)
        for a in facts.records.assignments
        if a.augmented and a.target.rsplit(".", 1)[-1] == "grad"
    ]
    for call in facts.records.calls:
        func = call.node.func
        args = positional(call.node)
        if (
            isinstance(func, cst.Name)
            and func.value == "getattr"
            and len(args) >= 2
            and literal(args[1].value, None) == "grad"
        ):
            found.append(GradRead(call.node, call.site))
    return sorted(found, key=lambda read: read.site.order)


def grad_touches(facts: "ScriptFacts") -> List[cst.CSTNode]:
    """Reads of `.grad` and assignments to it (their statements), in source order."""
    found = [(read.site.order, read.site.statement or read.node) for read in grad_reads(facts)]
    found += [
        (a.site.order, a.site.statement or a.statement_node)
        for a in facts.records.assignments
        if a.target.rsplit(".", 1)[-1] == "grad" and "." in a.target
    ]
    return [node for _, node in sorted(found, key=lambda item: item[0])]


# Second derivatives: Hessians are computed through a graph of the backward pass.
_HESSIANS = frozenset(
    {
        "torch.autograd.functional.hessian",
        "torch.autograd.functional.hvp",
        "torch.autograd.functional.vhp",
        "torch.func.hessian",
    }
)


def double_backward_calls(facts: "ScriptFacts") -> List[CallSite]:
    """Calls that build a graph of the backward pass so that it can be differentiated again:
    `torch.autograd.grad(..., create_graph=True)` (a gradient penalty), `loss.backward(
    create_graph=True)`, Hessians; a `create_graph` that is not literally False counts."""
    found = facts.calls_to(*_HESSIANS)
    # `create_graph` is the fifth parameter of `torch.autograd.grad`, the fourth of
    # `torch.autograd.backward` and the third of `Tensor.backward`.
    found += [
        call
        for call in facts.calls_to("torch.autograd.grad")
        if _builds_graph(argument(call.node, "create_graph", 4))
    ]
    found += [
        call
        for call in facts.calls_to("torch.autograd.backward")
        if _builds_graph(argument(call.node, "create_graph", 3))
    ]
    found += [
        call
        for call in facts.method_calls("backward")
        if _builds_graph(argument(call.node, "create_graph", 2))
    ]
    return sorted(found, key=lambda call: call.site.order)


def _builds_graph(create_graph) -> bool:
    return create_graph is not None and not is_literal(create_graph.value, False)

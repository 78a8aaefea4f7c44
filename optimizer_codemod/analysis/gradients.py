"""Where a script looks at `.grad`: the reads that would see None instead of a zero tensor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List

import libcst as cst

from optimizer_codemod.analysis.calls import literal, positional
from optimizer_codemod.analysis.collect import Site

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
    found = [GradRead(read.node, read.site) for read in facts.records.grad_reads]
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

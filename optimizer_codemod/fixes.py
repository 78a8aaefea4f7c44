"""Applying fixes: choosing a conflict-free set, then editing the tree in one transform."""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Sequence, Tuple

import libcst as cst
from libcst.metadata import CodeRange

from optimizer_codemod.rule import Finding, Fix, InsertStatements, Replace

Span = Tuple[Tuple[int, int], Tuple[int, int]]


def span(code_range: CodeRange) -> Span:
    return (
        (code_range.start.line, code_range.start.column),
        (code_range.end.line, code_range.end.column),
    )


def _overlaps(a: Span, b: Span) -> bool:
    return not (a[1] <= b[0] or b[1] <= a[0])


def _contains(outer: Span, inner: Span) -> bool:
    return outer[0] <= inner[0] and inner[1] <= outer[1]


def choose_compatible(
    findings: Sequence[Finding], positions: Mapping[cst.CSTNode, CodeRange]
) -> List[Finding]:
    """The findings whose fixes can be applied together, first come first served.

    Two replacements conflict when their nodes overlap; a replacement conflicts with an
    insertion when it would rewrite the insertion's anchor. Inserts on one anchor compose.
    A deferred fix is found again in the next pass, on the rewritten tree.
    """
    replaced: List[Span] = []
    anchors: List[Span] = []
    chosen = []
    for finding in findings:
        assert finding.fix is not None
        mine_replaced = [
            span(positions[e.node]) for e in finding.fix.edits if isinstance(e, Replace)
        ]
        mine_anchors = [
            span(positions[e.anchor]) for e in finding.fix.edits if isinstance(e, InsertStatements)
        ]
        conflict = (
            any(_overlaps(a, b) for a in mine_replaced for b in replaced)
            or any(_contains(a, b) for a in mine_replaced for b in anchors)
            or any(_contains(b, a) for a in mine_anchors for b in replaced)
        )
        if not conflict:
            chosen.append(finding)
            replaced.extend(mine_replaced)
            anchors.extend(mine_anchors)
    return chosen


class _EditApplier(cst.CSTTransformer):
    def __init__(self, replacements: Dict[cst.CSTNode, object], inserts: Dict[cst.CSTNode, tuple]):
        super().__init__()
        self._replacements = replacements
        self._inserts = inserts

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        if original_node in self._replacements:
            return self._replacements[original_node]
        if original_node in self._inserts:
            before, after = self._inserts[original_node]
            return cst.FlattenSentinel([*before, updated_node, *after])
        return updated_node


def apply_fixes(module: cst.Module, fixes: Iterable[Fix]) -> cst.Module:
    replacements: Dict[cst.CSTNode, object] = {}
    inserts: Dict[cst.CSTNode, tuple] = {}
    imports = []
    for fix in fixes:
        imports.extend(fix.imports)
        for edit in fix.edits:
            if isinstance(edit, Replace):
                replacements[edit.node] = edit.new
            else:
                before, after = inserts.get(edit.anchor, ((), ()))
                inserts[edit.anchor] = (before + tuple(edit.before), after + tuple(edit.after))
    new_module = module.visit(_EditApplier(replacements, inserts))
    if imports:
        # Imported here: libcst.codemod pulls in libcst.matchers (~150 ms at start-up), and
        # most runs add no import.
        from libcst.codemod import CodemodContext
        from libcst.codemod.visitors import AddImportsVisitor

        context = CodemodContext()
        for spec in imports:
            AddImportsVisitor.add_needed_import(context, spec.module, spec.obj, spec.asname)
        new_module = new_module.visit(AddImportsVisitor(context))
    return new_module

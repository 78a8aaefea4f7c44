"""Applying fixes: choosing a conflict-free set, then editing the tree in one transform."""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import libcst as cst
from libcst.metadata import CodeRange

from optimizer_codemod.add_imports import add_imports
from optimizer_codemod.analysis.walk import children
from optimizer_codemod.rule import Finding, Fix, InsertStatements, Replace

Span = Tuple[Tuple[int, int], Tuple[int, int]]


def span(code_range: CodeRange) -> Span:
    return (
        (code_range.start.line, code_range.start.column),
        (code_range.end.line, code_range.end.column),
    )


def _contains(outer: Span, inner: Span) -> bool:
    return outer[0] <= inner[0] and inner[1] <= outer[1]


def choose_compatible(
    findings: Sequence[Finding], positions: Mapping[cst.CSTNode, CodeRange]
) -> List[Finding]:
    """The findings whose fixes can be applied together, first come first served.

    Two replacements conflict when their nodes overlap, unless they are the same edit (two
    loaders fixed by one entry in the options dict they share: each finding stays fixed, the
    edit is made once); a replacement conflicts with an insertion when it would rewrite the
    insertion's anchor. Inserts on one anchor compose. A deferred fix is found again in the
    next pass, on the rewritten tree.
    """
    replaced = _DisjointSpans()
    anchors: List[Span] = []
    made: Dict[int, List[Replace]] = {}  # by id of the replaced node
    chosen = []
    for finding in findings:
        assert finding.fix is not None
        mine_replaced = [
            span(positions[e.node])
            for e in finding.fix.edits
            if isinstance(e, Replace)
            and not any(_same_edit(e, m) for m in made.get(id(e.node), ()))
        ]
        mine_anchors = [
            span(positions[e.anchor]) for e in finding.fix.edits if isinstance(e, InsertStatements)
        ]
        conflict = (
            any(replaced.overlaps(a) for a in mine_replaced)
            or any(_contains(a, b) for a in mine_replaced for b in anchors)
            or any(_contains(b, a) for a in mine_anchors for b in replaced.spans)
        )
        if not conflict:
            chosen.append(finding)
            for chosen_span in mine_replaced:
                replaced.add(chosen_span)
            anchors.extend(mine_anchors)
            for edit in finding.fix.edits:
                if isinstance(edit, Replace):
                    made.setdefault(id(edit.node), []).append(edit)
    return chosen


class _DisjointSpans:
    """The spans of the replacements chosen so far, which never overlap one another, sorted:
    whether a new span overlaps one of them is a binary search, not a scan (a file with
    thousands of fixes would otherwise cost their square)."""

    def __init__(self) -> None:
        self.spans: List[Span] = []

    def overlaps(self, new: Span) -> bool:
        # Sorted and pairwise disjoint, the spans' ends rise with their starts: of those
        # starting before `new` ends, the last one reaches furthest.
        before = bisect_left(self.spans, (new[1], (-1, -1)))
        return before > 0 and self.spans[before - 1][1] > new[0]

    def add(self, new: Span) -> None:
        insort(self.spans, new)


def _same_edit(a: Replace, b: Replace) -> bool:
    return (
        isinstance(a.new, cst.CSTNode)
        and isinstance(b.new, cst.CSTNode)
        and a.new.deep_equals(b.new)
    )


class _EditApplier(cst.CSTTransformer):
    def __init__(
        self,
        replacements: Dict[cst.CSTNode, object],
        inserts: Dict[cst.CSTNode, tuple],
        path: Optional[Set[int]] = None,
    ):
        super().__init__()
        self._replacements = replacements
        self._inserts = inserts
        # The ids of the edited nodes and of every node above them: a transform rebuilds
        # each node it descends into, so it descends only where an edit lies. Elsewhere the
        # nodes stay as they are (a full transform would make equal copies of them).
        self._path = path
        self.applied = 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        return self._path is None or id(node) in self._path

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        if original_node in self._replacements:
            self.applied += 1
            return self._replacements[original_node]
        if original_node in self._inserts:
            self.applied += 1
            before, after = self._inserts[original_node]
            return cst.FlattenSentinel([*before, updated_node, *after])
        return updated_node


def _edited_statements(
    module: cst.Module, targets: Iterable[cst.CSTNode], positions: Mapping[cst.CSTNode, CodeRange]
) -> Optional[Set[int]]:
    """Indices of the top-level statements whose ranges hold the targets; None when some
    target lies in none of them (a comment between statements, the module itself)."""
    starts = [span(positions[statement]) for statement in module.body]
    found: Set[int] = set()
    for target in targets:
        where = span(positions[target])
        index = bisect_right(starts, (where[0], (1 << 62, 0))) - 1
        if index < 0 or not _contains(starts[index], where):
            return None
        found.add(index)
    return found


def _path_to(roots: Iterable[cst.CSTNode], targets: Set[int]) -> Set[int]:
    """The ids of the `targets` under `roots` and of all the nodes above them."""
    path: Set[int] = set()

    def mark(node: cst.CSTNode) -> bool:
        hit = id(node) in targets
        for child in children(node):
            if mark(child):
                hit = True
        if hit:
            path.add(id(node))
        return hit

    for root in roots:
        mark(root)
    return path


def _transform_statements(
    module: cst.Module, indices: Set[int], applier: _EditApplier
) -> cst.Module:
    body: List[cst.BaseStatement] = []
    for index, statement in enumerate(module.body):
        if index not in indices:
            body.append(statement)
            continue
        result = statement.visit(applier)
        if isinstance(result, cst.FlattenSentinel):
            body.extend(result)
        elif not isinstance(result, cst.RemovalSentinel):
            body.append(result)
    return module.with_changes(body=body)


def apply_fixes(
    module: cst.Module,
    fixes: Iterable[Fix],
    positions: Optional[Mapping[cst.CSTNode, CodeRange]] = None,
) -> cst.Module:
    """`module` with the fixes' edits made (and their imports added).

    With `positions`, only the top-level statements that hold an edit are transformed, the
    others kept as they are: a transform rebuilds every node it passes, which on a long file
    costs about as much as parsing it.
    """
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
    indices = (
        _edited_statements(module, [*replacements, *inserts], positions)
        if positions is not None
        else None
    )
    new_module = None
    if indices is not None:
        targets = {id(node) for node in (*replacements, *inserts)}
        path = _path_to((module.body[index] for index in indices), targets)
        applier = _EditApplier(replacements, inserts, path)
        new_module = _transform_statements(module, indices, applier)
        if applier.applied != len(replacements) + len(inserts):
            new_module = None  # an edit outside the statements found: edit the whole tree
    if new_module is None:
        applier = _EditApplier(replacements, inserts)
        new_module = module.visit(applier)
    if imports:
        new_module = add_imports(new_module, imports)
    return new_module

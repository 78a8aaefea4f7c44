"""Where each node of a tree lies: `PositionProvider`'s answer, at a fraction of its cost.

`MetadataWrapper.resolve(PositionProvider)` generates the module's code once while tracking
line and column; but the resolver then also runs a batched visit with no provider in it,
which rebuilds the whole tree for nothing (LibCST 1.9), and the tracking itself splits every
token with a regular expression and enters a generator-based context manager per node.
Here the same code generation records the same ranges (the same CodeRange for every node),
without the empty visit and with cheaper bookkeeping.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Set, Tuple

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, PositionProvider
from libcst.metadata.position_provider import NEWLINE_RE, PositionProvidingCodegenState


class _Syntactic:
    """PositionProvidingCodegenState.record_syntactic_position, as a plain context manager."""

    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(self, state, node, start_node, end_node) -> None:
        self.state = state
        self.node = node
        self.start_node = start_node
        self.end_node = end_node

    def __enter__(self) -> None:
        self.start = CodePosition(self.state.line, self.state.column)

    def __exit__(self, *exc_info) -> None:
        state = self.state
        computed = state.provider._computed
        start = computed[self.start_node].start if self.start_node is not None else self.start
        end = (
            computed[self.end_node].end
            if self.end_node is not None
            else CodePosition(state.line, state.column)
        )
        computed[self.node] = CodeRange(start, end)


class _State(PositionProvidingCodegenState):
    def _update_position(self, value: str) -> None:
        if "\n" not in value and "\r" not in value:
            self.column += len(value)
            return
        segments = NEWLINE_RE.split(value)
        self.line += len(segments) - 1
        self.column = len(segments[-1])

    def record_syntactic_position(
        self,
        node: cst.CSTNode,
        *,
        start_node: Optional[cst.CSTNode] = None,
        end_node: Optional[cst.CSTNode] = None,
    ) -> _Syntactic:
        return _Syntactic(self, node, start_node, end_node)


class _Nothing:
    __slots__ = ()

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc_info) -> None:
        pass


_NOTHING = _Nothing()


class _WantedState(_State):
    """Records the ranges of the wanted nodes only, and of the nodes theirs are taken from
    (a block's range ends where its last statement ends): those are named when the wanted
    node's code begins, before their own."""

    # By id(): CSTNode's __hash__ is a Python function, and this is asked of every node.
    wanted: Set[int]

    def before_codegen(self, node: cst.CSTNode) -> None:
        if id(node) in self.wanted:
            self._stack.append(CodePosition(self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        if id(node) in self.wanted:
            start = self._stack.pop()
            if node not in self.provider._computed:
                end = CodePosition(self.line, self.column)
                self.provider._computed[node] = CodeRange(start, end)

    def record_syntactic_position(
        self,
        node: cst.CSTNode,
        *,
        start_node: Optional[cst.CSTNode] = None,
        end_node: Optional[cst.CSTNode] = None,
    ):
        if id(node) not in self.wanted:
            return _NOTHING
        for other in (start_node, end_node):
            if other is not None:
                self.wanted.add(id(other))
        return _Syntactic(self, node, start_node, end_node)


def positions(
    module: cst.Module, wanted: Optional[Iterable[cst.CSTNode]] = None
) -> Dict[cst.CSTNode, CodeRange]:
    """The range of every node of `module` (as PositionProvider defines it), or of the
    `wanted` ones that are in it (a node that is not in the tree gets none)."""
    return positions_and_code(module, wanted)[0]


def positions_and_code(
    module: cst.Module, wanted: Optional[Iterable[cst.CSTNode]] = None
) -> Tuple[Dict[cst.CSTNode, CodeRange], str]:
    """`positions`, and `module.code`: the text the same code generation printed."""
    provider = PositionProvider()
    state_class = _State if wanted is None else _WantedState
    state = state_class(
        default_indent=module.default_indent,
        default_newline=module.default_newline,
        provider=provider,
    )
    if wanted is not None:
        wanted = list(wanted)
        state.wanted = {id(node) for node in wanted}
    module._codegen(state)
    code = "".join(state.tokens)
    computed = provider._computed
    if wanted is not None:
        # Nodes added along the way are not asked for.
        return {node: computed[node] for node in wanted if node in computed}, code
    return computed, code

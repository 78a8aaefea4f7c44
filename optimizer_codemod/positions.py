"""Where each node of a tree lies: `PositionProvider`'s answer, at a fraction of its cost.

`MetadataWrapper.resolve(PositionProvider)` generates the module's code once while tracking
line and column; but the resolver then also runs a batched visit with no provider in it,
which rebuilds the whole tree for nothing (LibCST 1.9), and the tracking itself splits every
token with a regular expression and enters a generator-based context manager per node.
Here the same code generation records the same ranges (the same CodeRange for every node),
without the empty visit and with cheaper bookkeeping.

A rewrite prints its file several times (the positions of each pass, the text of each pass's
output), and most of its top-level statements are the same objects from one print to the
next (fixes.apply_fixes keeps the statements it does not edit, chunks.parse_in_pieces the
pieces whose text did not change). `StatementTexts` keeps what each printed to, and its
range: such a statement is printed again only when it holds a node whose range is wanted.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Set, Tuple

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange, PositionProvider
from libcst.metadata.position_provider import NEWLINE_RE, PositionProvidingCodegenState

from optimizer_codemod.analysis.walk import children


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


class StatementTexts:
    """What top-level statements printed to (with their module's indentation and newline),
    and the range of each relative to where it began: by identity, holding the statement so
    that its id stays its own."""

    def __init__(self) -> None:
        self._texts: Dict[Tuple[int, str, str], tuple] = {}

    def get(self, module: cst.Module, statement: cst.BaseStatement) -> Optional[tuple]:
        found = self._texts.get((id(statement), module.default_indent, module.default_newline))
        return found[1:] if found is not None else None

    def put(self, module: cst.Module, statement: cst.BaseStatement, *printed) -> None:
        key = (id(statement), module.default_indent, module.default_newline)
        self._texts[key] = (statement, *printed)


def module_code(module: cst.Module, texts: Optional[StatementTexts] = None) -> str:
    """`module.code`, printing again only the top-level statements `texts` does not hold."""
    if texts is None:
        return module.code
    state = CodegenState(
        default_indent=module.default_indent, default_newline=module.default_newline
    )
    _print_module(module, state, texts, set())
    return "".join(state.tokens)


def positions_and_code(
    module: cst.Module,
    wanted: Optional[Iterable[cst.CSTNode]] = None,
    texts: Optional[StatementTexts] = None,
) -> Tuple[Dict[cst.CSTNode, CodeRange], str]:
    """`positions`, and `module.code`: the text the same code generation printed. With
    `texts` (and `wanted`), a top-level statement printed before that holds no wanted node
    is not printed again: its text and range come from `texts`."""
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
    if wanted is None or texts is None:
        module._codegen(state)
    else:
        state.before_codegen(module)
        _print_module(module, state, texts, state.wanted)
        state.after_codegen(module)
    code = "".join(state.tokens)
    computed = provider._computed
    if wanted is not None:
        # Nodes added along the way are not asked for.
        return {node: computed[node] for node in wanted if node in computed}, code
    return computed, code


def _print_module(module: cst.Module, state, texts: StatementTexts, wanted: Set[int]) -> None:
    """Module._codegen_impl, with the texts (and ranges) of top-level statements taken from
    `texts` where it has them and they hold no wanted node."""
    computed = state.provider._computed if isinstance(state, _State) else None
    for header in module.header:
        header._codegen(state)
    for statement in module.body:
        known = texts.get(module, statement)
        begin = state.line if computed is not None else 0
        if known is not None and not _must_print(statement, known, wanted):
            text, start, end = known
            state.add_token(text)
            if start is not None and id(statement) in wanted:
                computed[statement] = CodeRange(
                    CodePosition(begin + start[0], start[1]), CodePosition(begin + end[0], end[1])
                )
            continue
        first = len(state.tokens)
        statement._codegen(state)
        where = computed.get(statement) if computed is not None else None
        start = end = None
        if where is not None:
            start = (where.start.line - begin, where.start.column)
            end = (where.end.line - begin, where.end.column)
        texts.put(module, statement, "".join(state.tokens[first:]), start, end)
    for footer in module.footer:
        footer._codegen(state)
    if module.has_trailing_newline:
        if len(state.tokens) == 0:
            state.add_token(state.default_newline)
    else:
        _pop_trailing_newline(state)


def _pop_trailing_newline(state) -> None:
    """What LibCST's `pop_trailing_newline` means: it pops the last token, which is the
    newline when every token is printed apart; a statement taken from `texts` is one token
    that ends with its newline, and popping it would drop the statement."""
    if not state.tokens:
        return
    last = state.tokens[-1]
    for newline in ("\r\n", "\n", "\r"):
        if last.endswith(newline):
            state.tokens[-1] = last[: -len(newline)]
            return
    state.tokens.pop()


def _must_print(statement: cst.BaseStatement, known: tuple, wanted: Set[int]) -> bool:
    """The statement's range is wanted and not known, or it holds a wanted node."""
    if not wanted:
        return False
    if id(statement) in wanted and known[1] is None:
        return True
    return any(_holds_wanted(child, wanted) for child in children(statement))


def _holds_wanted(statement: cst.CSTNode, wanted: Set[int]) -> bool:
    """Whether `statement` is wanted or holds a wanted node (a walk; no printing)."""
    stack: List[cst.CSTNode] = [statement]
    while stack:
        node = stack.pop()
        if id(node) in wanted:
            return True
        stack.extend(children(node))
    return False

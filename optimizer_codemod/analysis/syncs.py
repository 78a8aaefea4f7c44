"""Host synchronisations in training loops: `.item()` on the loss, and where its value goes.

`loss.item()` copies the loss to the host, so the host waits for the whole step to finish on
the device before it can queue the next one. The common reason is bookkeeping
(`running += loss.item()`): accumulating `loss.detach()` on the device instead, and reading
the total as a Python float only where the script looks at it, removes the per-step wait.

Here: which statements run on every iteration of a loop, every use of a name in the scope
that owns it, and the accumulations of a loss's `.item()` with everything that stops
rewriting them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Deque, Dict, Iterable, List, Optional, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import (
    argument,
    code_of,
    excerpt,
    has_double_star,
    has_star_args,
    keyword,
    literal,
    method_name,
    positional,
)
from optimizer_codemod.analysis.collect import CallSite, Loop, target_names
from optimizer_codemod.analysis.epochs import step_loop_of
from optimizer_codemod.analysis.timing import CLOCKS
from optimizer_codemod.analysis.devices import (
    OFF_DEVICE_METHODS,
    DeviceKind,
    copy_target,
    device_kind,
    device_names,
    on_device,
    tensor_type_devices,
    type_conversion_target,
    uses_accelerator,
)
from optimizer_codemod.analysis.factories import FACTORIES
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all, is_name, lone_call, returned_values
from optimizer_codemod.analysis.scopes import Scope, name_uses
from optimizer_codemod.analysis.training import DATA_PARALLEL_WRAPPERS
from optimizer_codemod.analysis.values import (
    ACCELERATOR,
    built_by,
    declares_global,
    local_function,
)
from optimizer_codemod.analysis.walk import children, type_test
from optimizer_codemod.analysis.walk import parents as walk_parents

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

_NESTED = (cst.FunctionDef, cst.Lambda, cst.ClassDef)
_is_nested = type_test(*_NESTED)
# The nodes HostSyncs._classify looks at.
_CLASSIFIED = type_test(
    cst.Call, cst.FormattedString, cst.BinaryOperation, cst.Assert, cst.IfExp, cst.Subscript
)


# Calls that copy a device tensor to the host, so the host waits for the device: methods
# (without arguments) and functions. `torch.cuda.empty_cache()` waits too: it returns cached
# blocks to the driver with `cudaFree`, which synchronises the device.
HOST_SYNC_METHODS = frozenset({"item", "tolist", "cpu"})
HOST_SYNC_FUNCTIONS = {
    "torch.cuda.synchronize": "synchronize",
    "torch.mps.synchronize": "synchronize",
    "torch.cuda.empty_cache": "empty_cache",
    "torch.mps.empty_cache": "empty_cache",
}
# Builtins that read a tensor's value on the host: `float(x)`, `f"{x}"` (through `format`).
READING_BUILTINS = frozenset({"float", "int", "bool", "str", "repr", "format", "round"})

# Work that runs off the default stream: a `synchronize()` may be what waits for it.
OTHER_STREAMS = (
    "torch.distributed.",
    "torch.cuda.Stream",
    "torch.cuda.stream",
    "torch.cuda.Event",
    "torch.cuda.current_stream",
    "torch.cuda.set_stream",
)

# What a sync-removing fix takes off the step, by kind (a rule's `removes_syncs`).
LOSS_ACCUMULATION = "loss-accumulation"  # `running += loss.item()` (OPT202)
METRIC_ACCUMULATION = "metric-accumulation"  # `correct += (p == y).sum().item()`
SYNCHRONIZE = "synchronize"  # a bare `torch.cuda.synchronize()` statement
EMPTY_CACHE = "empty-cache"  # a bare `torch.cuda.empty_cache()` statement
# `Tensor(np.ones(shape))` into a CUDA tensor type, made on the device instead (OPT203).
HOST_FILL = "host-fill"


@dataclass(frozen=True)
class StepSync:
    """Something in a training loop's own body that makes the host wait for the device on
    every iteration."""

    node: cst.CSTNode  # the call, f-string part, `%` expression or test that waits
    # item, tolist, cpu, synchronize, empty_cache, print, format, convert, branch
    kind: str
    value: Optional[cst.BaseExpression]  # the device value read (None: synchronize...)
    statement: cst.CSTNode  # the statement (or one-line suite) of the loop body holding it
    # The value is known to be on the device. Otherwise it may be (any `.item()` counts when
    # a rule asks whether a sync stays, but only certain ones are reported as findings).
    certain: bool
    loop: Loop


@dataclass(frozen=True)
class SyncPlan:
    """The per-step syncs of one loop, given the kinds of fix that will be applied."""

    removed: Dict[cst.CSTNode, str]  # sync node -> the kind of fix that takes it off the step
    # Syncs that stay on every step: the loop's own in source order, then its helpers'.
    remaining: Tuple[StepSync, ...]


def step_syncs(facts: "ScriptFacts", loop: Loop) -> List[StepSync]:
    """Everything in `loop`'s own body that makes the host wait for the device on every
    iteration, in source order (see HostSyncs.sites)."""
    return list(facts.host_syncs.sites(loop))


def alone_in_statement(sync: StepSync) -> bool:
    """The sync is a call that is its statement's only content (`torch.cuda.synchronize()`
    on its own line): deleting the line deletes the call and nothing else."""
    return lone_call(sync.statement, sync.node)


class HostSyncs:
    """Per-step host syncs of the training loops, memoised per loop (one per ScriptFacts)."""

    def __init__(self, facts: "ScriptFacts") -> None:
        self.facts = facts
        self._sites: Dict[int, Tuple[StepSync, ...]] = {}
        self._copies: Dict[int, Tuple[StepSync, ...]] = {}
        self._device: Dict[int, Tuple[Set[str], Set[str]]] = {}
        self._metric: Optional[List["Accumulation"]] = None
        self._loss: Optional[List["Accumulation"]] = None

    @cached_property
    def accelerated(self) -> bool:
        """The script may put something on an accelerator (devices.uses_accelerator)."""
        return uses_accelerator(self.facts)

    # Device values ----------------------------------------------------------------------
    def device(self, loop: Loop) -> Tuple[Set[str], Set[str]]:
        """(names that may hold device tensors, modules) in `loop`'s scope: the losses it
        calls `backward()` on, what their criterion reads, and what is computed from them
        (devices.device_names)."""
        key = id(loop.node)
        if key not in self._device:
            self._device[key] = (
                device_names(self.facts, loop.function, _loss_seeds(self.facts, loop))
                if self.accelerated
                else (set(), set())
            )
        return self._device[key]

    def on_device(self, loop: Loop, node: cst.BaseExpression) -> bool:
        names, modules = self.device(loop)
        return bool(names or modules) and on_device(self.facts, node, names, modules)

    # Sites ------------------------------------------------------------------------------
    def sites(self, loop: Loop) -> Tuple[StepSync, ...]:
        """Every per-step sync of `loop`'s own body (statements not under an `if` or an inner
        loop; headers of inner `if`/`while`/`for` included, and the test of `loop` itself
        when it is a `while`): `.item()`, `.tolist()`, `.cpu()`, `.type(<CPU tensor type>)`;
        `torch.cuda.synchronize()` and `empty_cache()`; and reads of a device value on the
        host: `print(x)`, `f"{x}"`, `"%f" % x`, `float(x)`, `math.isfinite(x)`, `if x:`,
        `while x > y:`, `assert x`."""
        key = id(loop.node)
        if key not in self._sites:
            self._sites[key] = tuple(self._find(loop))
        return self._sites[key]

    def _find(self, loop: Loop) -> List[StepSync]:
        found: List[StepSync] = []
        seen: Set[cst.CSTNode] = set()

        def add(node, kind, value, statement, certain=True) -> None:
            if node not in seen:
                seen.add(node)
                found.append(StepSync(node, kind, value, statement, certain, loop))

        accelerated = self.accelerated
        for statement in _every_step_statements(loop):
            tests, roots = _header(statement, loop)
            for test in tests:
                for value in self._truth_reads(loop, test):
                    add(value, "branch", value, statement)
            for root in roots:
                for node in _walk(root):
                    self._classify(loop, node, statement, add, accelerated)
        return found

    def reads_device_value(self, loop: Loop, node: cst.CSTNode, statement: cst.CSTNode) -> bool:
        """`node` alone (not what it contains) makes the host wait for the device, by the
        rules of `sites`: for code of `loop` that `sites` does not count (under an `if`)."""
        found: List[cst.CSTNode] = []
        self._classify(
            loop, node, statement, lambda *sync, **_: found.append(sync[0]), self.accelerated
        )
        return bool(found)

    def _classify(self, loop, node, statement, add, accelerated: bool) -> None:
        if not _CLASSIFIED(node):
            return  # called for every node of a loop's body
        facts = self.facts
        if isinstance(node, cst.Call):
            method = method_name(node)
            qualname = facts.qualified_name(node.func)
            if qualname in HOST_SYNC_FUNCTIONS:
                add(node, HOST_SYNC_FUNCTIONS[qualname], None, statement)
            elif qualname is None and method in HOST_SYNC_METHODS and not positional(node):
                receiver = node.func.value
                certain = self.on_device(loop, receiver) or (
                    method == "item" and accelerated and not off_device(facts, receiver)
                )
                add(node, method, receiver, statement, certain)
            elif method == "to" and self._copies_to_host(loop, node):
                add(node, "cpu", node.func.value, statement)
            elif method == "type" and self._converts_to_host(loop, node):
                add(node, "cpu", node.func.value, statement)
            elif isinstance(node.func, cst.Name) and node.func.value == "print":
                for arg in node.args:
                    if not arg.keyword and self.on_device(loop, arg.value):
                        add(node, "print", arg.value, statement)
                        break
            elif (isinstance(node.func, cst.Name) and node.func.value in READING_BUILTINS) or (
                qualname or ""
            ).startswith("math."):
                args = positional(node)
                if args and self.on_device(loop, args[0].value):
                    add(node, "convert", args[0].value, statement)
            elif method == "format" and _is_string(node.func.value):
                for arg in node.args:
                    if self.on_device(loop, arg.value):
                        add(node, "format", arg.value, statement)
                        break
        elif isinstance(node, cst.FormattedString):
            for part in node.parts:
                if isinstance(part, cst.FormattedStringExpression):
                    if self.on_device(loop, part.expression):
                        add(node, "format", part.expression, statement)
                        break
        elif isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
            if _is_string(node.left):
                values = (
                    [e.value for e in node.right.elements]
                    if isinstance(node.right, cst.Tuple)
                    else [node.right]
                )
                value = next((v for v in values if self.on_device(loop, v)), None)
                if value is not None:
                    add(node, "format", value, statement)
        elif isinstance(node, cst.Assert):
            for value in self._truth_reads(loop, node.test):
                add(value, "branch", value, statement)
        elif isinstance(node, cst.IfExp):
            for value in self._truth_reads(loop, node.test):
                add(value, "branch", value, statement)
        elif isinstance(node, cst.Subscript):
            mask = _boolean_mask(node)
            if mask is not None and self.on_device(loop, mask):
                # Not reported (the mask's dtype is a guess from its name or a comparison),
                # but a fix that moves another sync off the step gains nothing beside it.
                add(node, "mask", mask, statement, False)

    def _copies_to_host(self, loop: Loop, call: cst.Call) -> bool:
        """`x.to("cpu")` of a device value: a device-to-host copy."""
        target = copy_target(self.facts, call)
        return (
            target is not None
            and device_kind(self.facts, target) is DeviceKind.CPU
            and bool(self.on_device(loop, call.func.value))
        )

    def _converts_to_host(self, loop: Loop, call: cst.Call) -> bool:
        """`x.type(torch.LongTensor)` of a device value: the CPU tensor type copies it to
        the host (d2l's `y_hat.argmax(1).type(torch.LongTensor)`)."""
        devices = tensor_type_devices(self.facts, type_conversion_target(call))
        return devices == frozenset({"cpu"}) and self.on_device(loop, call.func.value)

    def _truth_reads(self, loop: Loop, test: cst.BaseExpression) -> List[cst.BaseExpression]:
        """The device values whose truth Python asks for in a test: `x`, `x > y`, `not x`,
        each operand of `and`/`or`."""
        if isinstance(test, cst.BooleanOperation):
            return self._truth_reads(loop, test.left) + self._truth_reads(loop, test.right)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self._truth_reads(loop, test.expression)
        if _identity_test(test):
            return []
        return [test] if self.on_device(loop, test) else []

    # Accumulations ----------------------------------------------------------------------
    def loss_accumulations(self) -> List["Accumulation"]:
        if self._loss is None:
            self._loss = loss_item_accumulations(self.facts)
        return self._loss

    def metric_accumulations(self) -> List["Accumulation"]:
        if self._metric is None:
            self._metric = metric_item_accumulations(self.facts)
        return self._metric

    # Plans ------------------------------------------------------------------------------
    def synchronize_obstacle(self, sync: StepSync) -> Optional[str]:
        """Why removing this per-step `torch.cuda.synchronize()` would be wrong; None when
        nothing needs it: it is alone on its line, no comment says why it is there, no clock
        is read in the loop (the sync makes a step time honest, `t1 = time.time()`), and the
        script runs no work off the default stream (collectives of `torch.distributed`,
        streams, events), whose results the sync may be what waits for."""
        if not alone_in_statement(sync):
            return "it shares its line with other code"
        if _commented(sync.statement):
            return "a comment beside it says why it is there"
        for call in self.facts.loop_calls(sync.loop):
            if call.qualname in CLOCKS:
                return (
                    f"the loop reads the clock (`{code_of(call.node)}`): the sync makes "
                    "that step time include the device's work"
                )
        other = self._off_default_stream
        if other is not None:
            return (
                f"the script runs work off the default stream (`{excerpt(other.node)}`), "
                "which the sync may be waiting for"
            )
        return None

    @cached_property
    def _off_default_stream(self) -> Optional[CallSite]:
        """A call that runs device work on another stream than the default one: a
        `torch.distributed` collective or wrapper, a stream or an event."""
        for call in self.facts.records.calls:
            name = call.qualname or ""
            if name.startswith(OTHER_STREAMS) or name in DATA_PARALLEL_WRAPPERS:
                return call
        return None

    def plan(self, loop: Loop, enabled: Iterable[str]) -> SyncPlan:
        """Which per-step syncs of `loop` the `enabled` kinds of fix take off the step (each
        only where its own obstacles allow), and which stay: a fix pays only when none stays."""
        enabled = set(enabled)
        removed: Dict[cst.CSTNode, str] = {}
        for kind, accumulations in (
            (LOSS_ACCUMULATION, self.loss_accumulations),
            (METRIC_ACCUMULATION, self.metric_accumulations),
        ):
            if kind in enabled:
                for accumulation in accumulations():
                    if accumulation.loop is loop and accumulation.obstacle is None:
                        removed.update((item, kind) for item in accumulation.items)
        if LOSS_ACCUMULATION in enabled:
            # meters.py reads the loss items this module finds: imported here, not above.
            from optimizer_codemod.analysis.meters import meter_updates

            for update in meter_updates(self.facts):
                if update.loop is loop and update.obstacle is None:
                    removed[update.item] = LOSS_ACCUMULATION
        for line in self.facts.log_lines.gated(loop, enabled):
            removed.update((sync.node, line.kind) for sync in line.syncs)
        for sync in self.sites(loop):
            if sync.kind == "synchronize" and SYNCHRONIZE in enabled:
                if self.synchronize_obstacle(sync) is None:
                    removed[sync.node] = SYNCHRONIZE
            elif sync.kind == "empty_cache" and EMPTY_CACHE in enabled:
                if alone_in_statement(sync):
                    removed[sync.node] = EMPTY_CACHE
        copies = self.blocking_copies(loop)
        if copies and HOST_FILL in enabled:
            # transfers.py reads this module's facts through ScriptFacts: imported here.
            from optimizer_codemod.analysis.transfers import legacy_type_conversions

            fills = {
                c.call.node
                for c in legacy_type_conversions(self.facts)
                if not isinstance(c.sizes, str)
            }
            removed.update((c.node, HOST_FILL) for c in copies if c.node in fills)
        remaining = tuple(s for s in self.sites(loop) + copies if s.node not in removed)
        return SyncPlan(removed, remaining + self._helper_sites(loop) + self._int8_sites(loop))

    def blocking_copies(self, loop: Loop) -> Tuple[StepSync, ...]:
        """Host data made on every step of `loop` and copied to a CUDA tensor type with a
        blocking copy, which waits for the device's queue like any sync: `Tensor(np.random
        .normal(...))` and `torch.randn(n).type(Tensor)`, where `Tensor` may be
        `torch.cuda.FloatTensor`. Not in `sites`: nothing reads a device value, and no rule
        reports them as reads."""
        key = id(loop.node)
        if key not in self._copies:
            found = []
            for statement in _every_step_statements(loop):
                for root in _header(statement, loop)[1]:
                    for node in _walk(root):
                        if isinstance(node, cst.Call) and self._copies_host_data(node):
                            found.append(StepSync(node, "copy", None, statement, True, loop))
            self._copies[key] = tuple(found)
        return self._copies[key]

    def _copies_host_data(self, call: cst.Call) -> bool:
        facts = self.facts
        target = type_conversion_target(call)
        if target is not None:
            made = call.func.value
            return (
                "cuda" in (tensor_type_devices(facts, target) or ())
                and not _blocking_free(call)
                and isinstance(made, cst.Call)
                and facts.qualified_name(made.func) in FACTORIES
                and keyword(made, "device") is None
            )
        args = positional(call)
        return (
            len(call.args) == len(args) == 1
            and isinstance(args[0].value, cst.Call)
            and (facts.qualified_name(args[0].value.func) or "").startswith("numpy.")
            and "cuda" in (tensor_type_devices(facts, call.func) or ())
        )

    def _helper_sites(self, loop: Loop) -> Tuple[StepSync, ...]:
        """The syncs of functions that `loop` runs on every iteration (helper_syncs), as
        syncs of the statement that calls them: no fix of this run removes them."""
        return tuple(
            StepSync(sync.node, sync.node.func.attr.value, None, call.site.statement, False, loop)
            for sync in helper_syncs(self.facts)
            for call in (sync.in_loop, *sync.also_in)
            if call is not None and any(outer.node is loop.node for outer in call.site.loops)
        )

    def _int8_sites(self, loop: Loop) -> Tuple[StepSync, ...]:
        """`load_in_8bit=True` (peft's fine_tune_blip2_int8.py): bitsandbytes' 8-bit layers
        split off the outlier features of their input above `llm_int8_threshold` (6.0 unless
        set to 0), a data-dependent shape that waits for the device in every forward, so a
        model quantized so syncs on every step of any training loop of the file."""
        return tuple(
            StepSync(option, "quantized", None, loop.node, False, loop)
            for option in self._int8_options
        )

    @cached_property
    def _int8_options(self) -> Tuple[cst.Arg, ...]:
        found = []
        for call in self.facts.call_site_of.values():
            option = keyword(call.node, "load_in_8bit")
            if option is None or literal(option.value, None) is False:
                continue
            threshold = keyword(call.node, "llm_int8_threshold")
            if threshold is not None and literal(threshold.value, None) == 0:
                continue
            found.append(option)
        return tuple(found)


def _blocking_free(call: cst.Call) -> bool:
    """`x.type(T, non_blocking=True)`: the copy does not wait."""
    option = keyword(call, "non_blocking")
    return option is not None and literal(option.value, None) is not False


def _loss_seeds(facts: "ScriptFacts", loop: Loop) -> Set[str]:
    """Names in `loop` known to hold device tensors: the losses it calls `backward()` on, the
    names their criterion is given (`loss = criterion(out, y)`), and the other names unpacked
    with a loss (`logits, loss = model(x, y)`)."""
    losses = backward_losses(facts, loop)
    seeds = set(losses)
    for assignment in facts.assignments_in(loop):
        if assignment.target in losses:
            value = assignment.value
            if assignment.unpacked:
                statement = assignment.statement_node
                host = _host_positions(facts, value)
                for target in getattr(statement, "targets", ()):
                    elements = getattr(target.target, "elements", None)
                    if elements is None or not host:
                        seeds.update(target_names(target.target))
                        continue
                    for position, element in enumerate(elements):
                        if position not in host:
                            seeds.update(target_names(element.value))
            elif isinstance(value, cst.Call):
                seeds.update(
                    name
                    for arg in value.args
                    if not arg.star and (name := dotted_name(arg.value)) is not None
                )
            elif isinstance(value, (cst.Attribute, cst.Subscript)):
                root = value
                while isinstance(root, (cst.Attribute, cst.Subscript)):
                    root = root.value
                if isinstance(root, cst.Name):
                    seeds.add(root.value)
    return seeds


def _host_positions(facts: "ScriptFacts", value: cst.BaseExpression) -> Set[int]:
    """Positions of the tuple that `value`, a call of a function of this file, returns that
    hold a host value on every `return`: PyTorch-YOLOv3's `compute_loss` returns `loss,
    to_cpu(torch.cat(...))`, with `to_cpu` returning `tensor.detach().cpu()`."""
    site = facts.call_site_of.get(value) if isinstance(value, cst.Call) else None
    function = local_function(facts, site) if site is not None else None
    returns = find_all(function.body, cst.Return) if function is not None else []
    if not returns or any(not isinstance(r.value, cst.Tuple) for r in returns):
        return set()
    positions = set(range(max(len(r.value.elements) for r in returns)))
    for returned in returns:
        elements = returned.value.elements
        positions &= {i for i, e in enumerate(elements) if _host_result(facts, e.value)}
    return positions


def _host_result(facts: "ScriptFacts", node: cst.BaseExpression) -> bool:
    """A host value for sure (`off_device`), or a call of a function of this file whose
    every `return` gives one (`to_cpu(x)`)."""
    if off_device(facts, node):
        return True
    site = facts.call_site_of.get(node) if isinstance(node, cst.Call) else None
    function = local_function(facts, site) if site is not None else None
    returns = find_all(function.body, cst.Return) if function is not None else []
    return bool(returns) and all(
        r.value is not None and off_device(facts, r.value) for r in returns
    )


def _commented(line: cst.CSTNode) -> bool:
    """A comment ends the line, or stands right above it (no blank line between)."""
    if not isinstance(line, cst.SimpleStatementLine):
        return False
    if line.trailing_whitespace.comment is not None:
        return True
    above = list(line.leading_lines)
    return bool(above) and above[-1].comment is not None


def off_device(facts: "ScriptFacts", node: cst.BaseExpression) -> bool:
    """A value computed on the host for sure: `.cpu()`, `.numpy()`, `.tolist()` of something,
    or the result of a library function other than torch's (`np.float32(x)`)."""
    if not isinstance(node, cst.Call):
        return False
    qualname = facts.qualified_name(node.func)
    if qualname is not None:
        return not qualname.startswith("torch.")
    return method_name(node) in OFF_DEVICE_METHODS


def _is_string(node: cst.BaseExpression) -> bool:
    return isinstance(node, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString))


def _every_step_statements(loop: Loop) -> List[cst.CSTNode]:
    """The statements of `loop`'s own body that run on every iteration, in source order, a
    `while` loop's own test first (the loop node stands for it)."""
    per_step = every_iteration(loop)
    statements: List[cst.CSTNode] = [s for s in _body_order(loop) if s in per_step]
    if isinstance(loop.node, cst.While):
        statements.insert(0, loop.node)
    return statements


def _header(statement: cst.CSTNode, loop: Loop) -> Tuple[List[cst.BaseExpression], List]:
    """(tests, other expressions) of a per-step statement that run on every iteration: a
    simple line's small statements, the test of an `if`/`while`, a `for`'s iterable, the
    context managers of a `with`."""
    if statement is loop.node:
        return [statement.test], [statement.test]
    if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        return [], list(statement.body)
    if isinstance(statement, (cst.If, cst.While)):
        return [statement.test], [statement.test]
    if isinstance(statement, cst.For):
        return [], [statement.iter]
    if isinstance(statement, cst.With):
        return [], [item.item for item in statement.items]
    return [], []


def _walk(root: cst.CSTNode) -> List[cst.CSTNode]:
    """Nodes of `root` in source order, without the bodies of lambdas and nested functions
    (code there runs when it is called, not here)."""
    found: List[cst.CSTNode] = []
    stack = [root]
    while stack:
        node = stack.pop()
        found.append(node)
        if _is_nested(node):
            continue
        stack.extend(reversed(children(node)))
    return found


def _body_order(loop: Loop) -> List[cst.CSTNode]:
    """The statements of `loop`'s body and of the `with`/`try` blocks in it, in source order."""
    return [
        node
        for node in find_all(loop.node.body, cst.BaseStatement, cst.SimpleStatementSuite)
        if node is not loop.node
    ]


def every_iteration(loop: Loop) -> Set[cst.CSTNode]:
    """Statements of `loop`'s body that run on every iteration (not under an if or a loop;
    the header of a nested if/for/while runs every time and is included)."""
    found: Set[cst.CSTNode] = set()

    def walk(block: cst.BaseSuite) -> None:
        if isinstance(block, cst.SimpleStatementSuite):
            found.add(block)
            return
        for statement in block.body:
            found.add(statement)
            if isinstance(statement, cst.With):
                walk(statement.body)
            elif isinstance(statement, cst.Try):
                walk(statement.body)
                if statement.finalbody is not None:
                    walk(statement.finalbody.body)

    walk(loop.node.body)
    return found


def every_iteration_of_some_process(loop: Loop) -> Set[cst.CSTNode]:
    """every_iteration, and the statements under an `if` that only asks which process this
    is (`if RANK in {-1, 0}:`, `if args.rank % ngpus_per_node == 0:`, `if master_process:`,
    `if accelerator.is_main_process:`): the test is the same on every iteration, so that
    process runs them on every step, and a host read there holds every process back at the
    next all-reduce (yolov5's classify/train.py reads `loss.item()` so)."""
    found = set(every_iteration(loop))
    pending = [s for s in found if isinstance(s, cst.If)]
    while pending:
        branch = pending.pop()
        if branch.orelse is not None or not is_process_check(branch.test):
            continue
        for statement in branch.body.body:
            found.add(statement)
            if isinstance(statement, cst.If):
                pending.append(statement)
    return found


# Names that tell processes apart: a rank, or a flag that this is the main process.
_RANK_NAMES = frozenset({"rank", "local_rank", "global_rank", "node_rank", "gpu_rank"})
_MAIN_PROCESS_FLAGS = frozenset(
    {"master_process", "is_master", "is_main_process", "main_process", "is_local_main_process"}
)


def is_process_check(test: cst.BaseExpression) -> bool:
    """`test` only compares the process's rank with numbers, or reads a main-process flag
    (`rank == 0`, `RANK in {-1, 0}`, `args.rank % n == 0`, `dist.get_rank() == 0`,
    `master_process`, `utils.is_main_process()`), possibly several joined by `and`/`or`."""
    if isinstance(test, cst.BooleanOperation):
        return is_process_check(test.left) and is_process_check(test.right)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return is_process_check(test.expression)
    if isinstance(test, cst.Comparison):
        return _names_rank(test.left) and all(
            _numbers(target.comparator) for target in test.comparisons
        )
    return _last_name(test) in _MAIN_PROCESS_FLAGS


def _last_name(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, cst.Call) and not node.args:
        node = node.func
    name = dotted_name(node)
    return name.rsplit(".", 1)[-1] if name is not None else None


def _names_rank(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
        return _names_rank(node.left)
    name = _last_name(node)
    return name is not None and (name.lower() in _RANK_NAMES or name == "get_rank")


def _numbers(node: cst.BaseExpression) -> bool:
    """An integer literal, or a set, list or tuple of them (`{-1, 0}`)."""
    value = literal(node, None)
    values = value if isinstance(value, (set, list, tuple)) else [value]
    return bool(values) and all(type(v) is int for v in values)


@dataclass
class Accumulation:
    """`name += loss.item()` (or `name = name + ...`) in a training loop, and its reads."""

    name: str
    loop: Loop
    items: List[cst.Call] = field(default_factory=list)  # the `loss.item()` calls to detach
    statements: List[cst.CSTNode] = field(default_factory=list)  # the accumulating statements
    reads: List[cst.Name] = field(default_factory=list)  # reads to convert with float()
    # Why the accumulation cannot be rewritten; None when it can.
    obstacle: Optional[str] = None
    # The Python type the total has: `float`, or `int` for integer counts started at an
    # integer (`correct = 0`); reads convert the device total back to it.
    converter: str = "float"


def backward_losses(facts: "ScriptFacts", loop: Loop) -> Set[str]:
    """Names `x` with a bare `x.backward()` (or `scaler.scale(x).backward()`) in `loop`:
    scalar floating tensors."""
    found: Set[str] = set()
    for call in facts.calls_directly_in(loop):
        name = _backward_loss_name(facts, call)
        if name is not None:
            found.add(name)
    return found


def _backward_loss_name(facts: "ScriptFacts", call: CallSite) -> Optional[str]:
    """`x` for a bare `x.backward()`, `scaler.scale(x).backward()`, or a trainer library's
    `accelerator.backward(x)` (also of `x / n`); None otherwise."""
    if call.method != "backward":
        return None
    receiver = call.node.func.value
    if call.node.args:
        args = positional(call.node)
        if len(call.node.args) != 1 or len(args) != 1 or not _is_backward_runner(facts, receiver):
            return None
        loss = args[0].value
        if isinstance(loss, cst.BinaryOperation) and isinstance(loss.operator, cst.Divide):
            loss = loss.left
        return loss.value if isinstance(loss, cst.Name) else None
    if (
        isinstance(receiver, cst.Call)
        and method_name(receiver) == "scale"
        and len(receiver.args) == 1
        and receiver.args[0].keyword is None
        and not receiver.args[0].star
    ):
        receiver = receiver.args[0].value
    return receiver.value if isinstance(receiver, cst.Name) else None


# Objects whose `backward(loss)` runs the loss's backward (scaling it as configured).
BACKWARD_RUNNERS = frozenset({ACCELERATOR, "lightning.Fabric", "lightning.fabric.Fabric"})


def _is_backward_runner(facts: "ScriptFacts", receiver: cst.BaseExpression) -> bool:
    """`accelerator` in `accelerator.backward(loss)`: every binding of the name (or of the
    `self.` attribute) builds an Accelerator or a Fabric."""
    return built_by(facts, receiver, BACKWARD_RUNNERS)


def loss_items(facts: "ScriptFacts", loop: Loop) -> List[CallSite]:
    """`loss.item()` (or `loss.detach().item()`) calls in `loop` (its own body) on a name it
    calls `backward()` on."""
    losses = backward_losses(facts, loop)
    return [
        call
        for call in facts.calls_directly_in(loop)
        if call.method == "item" and not call.node.args and item_of(call.node) in losses
    ]


def item_of(item: cst.Call) -> Optional[str]:
    """`loss` for `loss.item()` and `loss.detach().item()` (diffusers' and Hugging Face's
    habit): the name whose value `.item()` reads; None for anything else."""
    if not isinstance(item.func, cst.Attribute):
        return None
    value = item.func.value
    if _is_detach(value):
        value = value.func.value
    return value.value if isinstance(value, cst.Name) else None


def _is_detach(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Call) and method_name(node) == "detach" and not node.args


# Syncs in functions that every step runs --------------------------------------------------
@dataclass(frozen=True)
class HelperSync:
    """`.item()` or `.tolist()` in a function of the file that runs on every training step:
    the step itself (a function calling backward or stepping an optimizer outside any loop of
    its own, called from a loop or from a function called in one), or a function that a
    training loop or such a step calls on every iteration."""

    node: cst.Call
    function: cst.FunctionDef
    caller: CallSite  # the per-step call that runs `function`
    step: bool  # `function` is the training step itself
    loss: bool  # the value read is the loss the step calls backward on
    # The call in a training loop's body that runs `function` on each of its iterations,
    # directly or through other helpers; None when a function called in the loop calls it.
    in_loop: Optional[CallSite] = None
    # Such calls of the other training loops that run it too (d2l's `grad_clipping`, called
    # by two training functions of one file).
    also_in: Tuple[CallSite, ...] = ()


# How far calls are followed from the step: the step's helpers, and theirs.
HELPER_DEPTH = 2


def helper_syncs(facts: "ScriptFacts") -> List[HelperSync]:
    """Every HelperSync of the file, once per pass. Functions are matched by name (`f(...)`,
    `self.f(...)`) when the file defines that name once; calls under a periodic `if` (a test
    with `%`: `if step % 100 == 0:`) do not run every step, nor do calls under
    `if param == <literal>:` that no call of the function takes, and code inside a training loop
    is left to that loop's own analysis (HostSyncs.sites)."""
    memo = facts.memo("helper_syncs")
    if "all" not in memo:
        memo["all"] = _helper_syncs(facts) if facts.host_syncs.accelerated else []
    return memo["all"]


def _helper_syncs(facts: "ScriptFacts") -> List[HelperSync]:
    calls_of: Dict[int, List[CallSite]] = {}
    for call in facts.records.calls:
        function = local_function(facts, call)
        if function is not None:
            calls_of.setdefault(id(function), []).append(call)
    training = {id(loop) for loop in facts.training_loops}
    queue: Deque[Tuple[cst.FunctionDef, CallSite, int, bool, Optional[CallSite]]] = deque()
    for call in [*facts.backward_calls, *_optimizer_steps(facts)]:
        function = call.site.function
        if function is None or any(loop.function is function for loop in call.site.loops):
            continue
        caller = called_in_a_loop(function, calls_of)
        if caller is not None:
            queue.append((function, caller, 0, True, caller if caller.site.loops else None))
    for loop in facts.training_loops:
        per_step = every_iteration(loop)
        for call in facts.calls_directly_in(loop):
            helper = local_function(facts, call)
            if helper is not None and call.site.statement in per_step:
                queue.append((helper, call, 1, False, call))
    found: Dict[cst.Call, HelperSync] = {}
    seen: Set[Tuple[int, int]] = set()
    while queue:
        function, caller, depth, step, in_loop = queue.popleft()
        # Once per function and loop call: a helper two loops run is a sync of both.
        key = (id(function), id(in_loop.node) if in_loop is not None else 0)
        if key in seen:
            continue
        seen.add(key)
        periodic = _periodic_statements(facts, function)
        callers = calls_of.get(id(function), [])
        skipped = periodic | _branches_no_call_takes(facts, function, callers)
        losses = {
            name
            for call in facts.in_function("calls", function)
            for name in (_backward_loss_name(facts, call),)
            if name is not None and step
        }
        for call in facts.in_function("calls", function):
            if id(call.site.statement) in skipped or any(
                id(loop) in training for loop in call.site.loops
            ):
                continue
            helper = local_function(facts, call)
            if helper is not None and depth < HELPER_DEPTH:
                queue.append((helper, call, depth + 1, False, in_loop))
            elif (
                call.qualname is None
                and call.method in ("item", "tolist")
                and not positional(call.node)
                and not off_device(facts, call.node.func.value)
            ):
                earlier = found.get(call.node)
                if earlier is None:
                    loss = call.method == "item" and call.receiver in losses
                    found[call.node] = HelperSync(call.node, function, caller, step, loss, in_loop)
                elif in_loop is not None and in_loop is not earlier.in_loop:
                    found[call.node] = replace(earlier, also_in=(*earlier.also_in, in_loop))
    return list(found.values())


def _optimizer_steps(facts: "ScriptFacts") -> List[CallSite]:
    """`opt.step()` on a name bound to a `torch.optim` optimizer built in this file."""
    names = set()
    for construction in facts.optimizer_constructions():
        assignment = facts.assignment_of(construction.node)
        if assignment is not None:
            names.add(assignment.target)
    return [call for call in facts.method_calls("step") if call.receiver in names]


def called_in_a_loop(
    function: cst.FunctionDef, calls_of: Dict[int, List[CallSite]]
) -> Optional[CallSite]:
    """A call of `function` in a loop, or in a function called in a loop (`run_step()`
    calling `optimize()` each step): the call nearest `function`."""
    calls = calls_of.get(id(function), ())
    for call in calls:
        if call.site.loops:
            return call
    for call in calls:
        outer = call.site.function
        if outer is not None and any(c.site.loops for c in calls_of.get(id(outer), ())):
            return call
    return None


def helper_sync_message(sync: HelperSync) -> str:
    """What the sync costs, and where the step runs it from."""
    name = f"`{sync.function.name.value}()`"
    where = (
        f"{name}, one training step (run by `{excerpt(sync.caller.node, 40)}`),"
        if sync.step
        else f"{name}, which runs on every training step (`{excerpt(sync.caller.node, 40)}`),"
    )
    return (
        f"`{excerpt(sync.node)}` in {where} copies a device value to the host, so the host "
        "waits for the device on every step; read it every N steps, or keep it on the device"
    )


def tests_a_remainder(branch: cst.If) -> bool:
    """`if step % 100 == 0:`: a test with a `%`, whose body runs every Nth step (and whose
    `else` on most steps)."""
    return bool(find_all(branch.test, cst.Modulo))


def _periodic_statements(facts: "ScriptFacts", function: cst.FunctionDef) -> Set[int]:
    """ids of the statements of `function` in the body of an `if` whose test has a `%`."""
    memo = facts.memo("periodic_statements")
    key = id(function)
    if key not in memo:
        found: Set[int] = set()
        for branch in find_all(function.body, cst.If):
            if id(branch) in found or not tests_a_remainder(branch):
                continue
            # Its `else` runs on most steps.
            found.update(map(id, find_all(branch.body, cst.BaseStatement)))
        memo[key] = found
    return memo[key]


_UNKNOWN = object()  # not a literal


def _branches_no_call_takes(
    facts: "ScriptFacts", function: cst.FunctionDef, calls: List[CallSite]
) -> Set[int]:
    """ids of the statements under `if param == <literal>:` when every call of `function` in
    the file gives `param` another literal (guided-diffusion's `compute_top_k(...,
    reduction="none")` never runs its `if reduction == "mean":` branch)."""
    params = [p for p in (*function.params.posonly_params, *function.params.params)]
    names = [p.name.value for p in params]
    offset = 1 if names[:1] in (["self"], ["cls"]) else 0
    found: Set[int] = set()
    for branch in find_all(function.body, cst.If):
        test = branch.test
        if not (
            isinstance(test, cst.Comparison)
            and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.Equal)
            and isinstance(test.left, cst.Name)
            and test.left.value in names
        ):
            continue
        tested = literal(test.comparisons[0].comparator, _UNKNOWN)
        index = names.index(test.left.value)
        default = params[index].default
        passed = []
        for call in calls:
            if has_star_args(call.node) or has_double_star(call.node):
                break
            arg = argument(call.node, test.left.value, index - offset)
            passed.append(literal(arg.value if arg is not None else default, _UNKNOWN))
        known = tested is not _UNKNOWN and all(value is not _UNKNOWN for value in passed)
        if calls and len(passed) == len(calls) and known and tested not in passed:
            found.update(map(id, find_all(branch.body, cst.BaseStatement)))
    return found


def _accumulated(statement: cst.CSTNode) -> Optional[tuple]:
    """(name, added expression) for `name += e` and `name = name + e`."""
    if isinstance(statement, cst.AugAssign) and isinstance(statement.operator, cst.AddAssign):
        if isinstance(statement.target, cst.Name):
            return statement.target.value, statement.value
    if (
        isinstance(statement, cst.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0].target, cst.Name)
        and isinstance(statement.value, cst.BinaryOperation)
        and isinstance(statement.value.operator, cst.Add)
        and is_name(statement.value.left, statement.targets[0].target.value)
    ):
        return statement.targets[0].target.value, statement.value.right
    return None


def _is_number(node: cst.BaseExpression) -> bool:
    return isinstance(node, (cst.Integer, cst.Float)) and not node.lpar


def loss_item_accumulations(facts: "ScriptFacts") -> List[Accumulation]:
    """Every accumulation of a loss's `.item()` in a training loop, with its obstacle if any.

    Rewritable when: the name is bound only by number literals (`= 0.0`) and by additions of
    expressions holding loss `.item()` calls (`+= loss.item()`, `+= loss.item() * n`,
    `= name + loss.item()`); it is used by no nested function, lambda or class; it is not
    read on every iteration of the training loop (that read would synchronise anyway).
    Every other read becomes `float(name)`, which keeps its type a Python float.
    """
    found: List[Accumulation] = []
    seen: Set[tuple] = set()
    for loop in facts.training_loops:
        # A read on every iteration of the loop that sums the total syncs as often as the
        # `.item()` it replaces; a micro-step loop's total read once per optimizer step, in
        # the loop around it (imagen's trainer), syncs once per step instead of once per
        # micro-batch, and the micro-batches' kernels queue without waiting for each other.
        # A read under `if local_rank == 0:` runs on every step of that process (yolov4's
        # progress bar shows the running mean so).
        per_step = every_iteration_of_some_process(loop)
        items = loss_items(facts, loop)
        for item in items:
            small = _small_statement(item)
            accumulated = _accumulated(small) if small is not None else None
            if accumulated is None:
                continue
            name = accumulated[0]
            key = (id(loop), name)
            if key in seen:
                continue
            seen.add(key)
            found.append(_accumulation(facts, loop, name, items, per_step))
    return found


def step_loss_items(facts: "ScriptFacts") -> List[CallSite]:
    """`loss.item()` on every iteration of the loop around a micro-step loop (the step loop
    of gradient accumulation), on a name the micro-step loop calls backward on."""
    found: List[CallSite] = []
    for loop in facts.training_loops:
        step = step_loop_of(facts, loop)
        if step is loop:
            continue
        losses = backward_losses(facts, loop)
        per_step = every_iteration(step)
        found.extend(
            call
            for call in facts.calls_directly_in(step)
            if call.method == "item"
            and not call.node.args
            and item_of(call.node) in losses
            and call.site.statement in per_step
            and call not in found
        )
    return found


# Boolean-valued tensor methods and functions: a sum of their result counts elements exactly.
BOOLEAN_METHODS = frozenset(
    "eq ne lt le gt ge isnan isinf isfinite isclose logical_and logical_or logical_not "
    "logical_xor bool".split()
)
BOOLEAN_FUNCTIONS = frozenset(f"torch.{name}" for name in BOOLEAN_METHODS - {"bool"})


def metric_type(
    facts: "ScriptFacts", value: cst.BaseExpression, scope: Optional[cst.CSTNode] = None
) -> Optional[str]:
    """The Python type of `value.item()` for a per-step metric whose dtype the analysis
    knows: `int` for a count (`(pred == y).sum()`, `mask.eq(0).sum()`,
    `torch.count_nonzero(...)`: int64, summed exactly on the device too), `float` for a mean
    (`.mean()`) or a sum of floats (`x.float().sum()`), also through names bound only to
    such values, a function of this file returning one (bentrevett's `acc =
    binary_accuracy(predictions, y)`, which returns `correct.sum() / len(correct)`), and a
    quotient or product of one and a host number; None otherwise. Names are read in
    `scope` (the function the value is read in; None: module level)."""
    return _metric_type(facts, value, scope, 0)


def _metric_type(
    facts: "ScriptFacts", value: cst.BaseExpression, scope: Optional[cst.CSTNode], depth: int
) -> Optional[str]:
    if depth > _METRIC_DEPTH:
        return None
    if isinstance(value, cst.Name):
        bound = _bound_in(facts, value.value, scope)
        kinds = {_metric_type(facts, v, scope, depth + 1) for v in bound}
        return kinds.pop() if len(kinds) == 1 else None
    if isinstance(value, cst.BinaryOperation) and isinstance(
        value.operator, (cst.Divide, cst.Multiply)
    ):
        if _host_number(value.right) and _metric_type(facts, value.left, scope, depth + 1):
            return "float"
        return None
    if not isinstance(value, cst.Call):
        return None
    if isinstance(value.func, cst.Name) and value.func.value in facts.records.functions:
        function = facts.records.functions[value.func.value]
        returned = returned_values(function)
        kinds = {_metric_type(facts, r, function, depth + 1) for r in returned}
        return kinds.pop() if len(kinds) == 1 and returned else None
    qualname = facts.qualified_name(value.func)
    if qualname is None:  # a method: `x.sum()`, without arguments (`dim` keeps a tensor)
        method = method_name(value)
        if value.args or method not in ("sum", "count_nonzero", "mean"):
            return None
        if method == "mean":
            return "float"
        inner = value.func.value
    else:  # a function of one tensor: `torch.sum(x)`
        args = value.args
        if len(args) != 1 or args[0].keyword or args[0].star:
            return None
        if qualname == "torch.mean":
            return "float"
        if qualname not in ("torch.sum", "torch.count_nonzero"):
            return None
        inner = args[0].value
    if isinstance(inner, cst.Name):
        bound = _bound_in(facts, inner.value, scope)
        inner = bound[0] if len(bound) == 1 else inner
    if _boolean(facts, inner):
        return "int"
    if isinstance(inner, cst.Call) and method_name(inner) in ("float", "double"):
        return "float" if facts.qualified_name(inner.func) is None and not inner.args else None
    return None


def _bound_in(
    facts: "ScriptFacts", name: str, scope: Optional[cst.CSTNode]
) -> List[cst.BaseExpression]:
    """The values `name` is bound to in `scope`'s own body (or, when it binds nothing
    there, at module level); an unpacking binds no value the analysis can read."""
    assignments = facts.assignments_in_scope(name, scope)
    if not assignments and scope is not None:
        assignments = facts.assignments_in_scope(name, None)
    if any(a.unpacked for a in assignments):
        return []
    return [a.value for a in assignments]


# Names, calls and arithmetic followed from an `.item()` to the metric it reads.
_METRIC_DEPTH = 4


def _host_number(node: cst.BaseExpression) -> bool:
    """A plain number: a literal, or `len(...)`."""
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    return isinstance(node, cst.Call) and is_name(node.func, "len")


def _identity_test(test: cst.BaseExpression) -> bool:
    """`x is None`, `a is not b`: Python compares the objects, never a tensor's value."""
    return isinstance(test, cst.Comparison) and all(
        isinstance(target.operator, (cst.Is, cst.IsNot)) for target in test.comparisons
    )


def _boolean(facts: "ScriptFacts", node: cst.BaseExpression) -> bool:
    """`node` is a boolean tensor expression: a comparison, `x.eq(y)`, `torch.isnan(x)`,
    `~mask` of one."""
    if isinstance(node, cst.Comparison):
        return True
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
        return _boolean(facts, node.expression)
    if isinstance(node, cst.Call):
        qualname = facts.qualified_name(node.func)
        if qualname is not None:
            return qualname in BOOLEAN_FUNCTIONS
        return method_name(node) in BOOLEAN_METHODS
    return False


def metric_item_accumulations(facts: "ScriptFacts") -> List[Accumulation]:
    """Accumulations of a metric's `.item()` on every step of a training loop, other than
    the loss's (`loss_item_accumulations`): `correct += (pred == y).sum().item()`, where the
    added expression is exactly one `.item()` of a value whose type `metric_type` knows,
    with the same conditions and obstacles as the loss's. The total's type is kept: `int`
    for counts started at an integer, `float` otherwise."""
    found: List[Accumulation] = []
    for loop in facts.training_loops:
        per_step = every_iteration(loop)
        losses = backward_losses(facts, loop)
        items: List[CallSite] = []
        types: Dict[str, Set[str]] = {}
        for call in facts.calls_directly_in(loop):
            if call.method != "item" or call.node.args or call.receiver in losses:
                continue
            small = _small_statement(call)
            accumulated = _accumulated(small) if small is not None else None
            if accumulated is None or accumulated[1] is not call.node:
                continue
            receiver = call.node.func.value
            kind = metric_type(facts, receiver, call.site.function) or _loss_term_type(
                facts, loop, call, losses
            )
            if kind is None or call.site.statement not in per_step:
                continue
            items.append(call)
            types.setdefault(accumulated[0], set()).add(kind)
        for name, kinds in types.items():
            found.append(
                _accumulation(
                    facts,
                    loop,
                    name,
                    items,
                    every_iteration_of_some_process(loop),
                    "a metric",
                    counts=kinds == {"int"},
                )
            )
    return found


def _loss_term_type(
    facts: "ScriptFacts", loop: Loop, item: CallSite, losses: Set[str]
) -> Optional[str]:
    """`float` for `name.item()` of a device value (a per-step sync known to be one) that is
    a term of a loss the loop calls backward on (`total_loss = content_loss + style_loss`,
    pytorch/examples' fast_neural_style): a floating scalar, like the loss; None
    otherwise."""
    value = item.node.func.value
    if not isinstance(value, cst.Name):
        return None
    if not any(s.node is item.node and s.certain for s in facts.host_syncs.sites(loop)):
        return None
    for assignment in facts.assignments_in(loop):
        if assignment.target in losses and not assignment.unpacked:
            if value.value in _sum_terms(assignment.value):
                return "float"
    return None


def _sum_terms(node: cst.BaseExpression) -> Set[str]:
    """The names added or subtracted at the top of `node` (`a + b - c`)."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract)):
        return _sum_terms(node.left) | _sum_terms(node.right)
    return {node.value} if isinstance(node, cst.Name) else set()


def _small_statement(item: CallSite) -> Optional[cst.CSTNode]:
    statement = item.site.statement
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return statement.body[0]
    return None


# Why nothing waits in a script that never uses an accelerator (OPT202's reason).
CPU_ONLY = (
    "the script never places a tensor on an accelerator: on the CPU `.item()` waits for nothing"
)


def _accumulation(
    facts, loop: Loop, name: str, items, per_step, what: str = "the loss", counts: bool = False
) -> Accumulation:
    """The accumulation into `name` of the `.item()` calls among `items` (`counts`: they
    are integers), with its reads and its obstacle."""
    result = Accumulation(name, loop)
    numbers: List[cst.BaseExpression] = []
    scope: Scope = loop.function if loop.function is not None else facts.module
    accumulators = {}
    for item in items:
        small = _small_statement(item)
        accumulated = _accumulated(small) if small is not None else None
        if accumulated is not None and accumulated[0] == name:
            accumulators.setdefault(small, []).append(item)
    own_reads = set()
    for statement, calls in accumulators.items():
        added = _accumulated(statement)[1]
        added_items = [c for c in find_all(added, cst.Call) if method_name(c) == "item"]
        if len(added_items) != len(calls):
            result.obstacle = f"it adds `.item()` of something other than {what}"
        result.items.extend(c.node for c in calls)
        result.statements.append(statement)
        if isinstance(statement, cst.Assign):
            own_reads.add(statement.value.left)
        if isinstance(statement, cst.AugAssign):
            own_reads.add(statement.target)
    if isinstance(scope, cst.FunctionDef) and declares_global(scope, name):
        result.obstacle = f"`{name}` is declared global or nonlocal"
    for use in name_uses(scope, name, facts):
        if use.nested:
            result.obstacle = result.obstacle or f"`{name}` is used in a nested function"
        elif use.node in own_reads:
            continue
        elif use.store:
            bound = _bound_number(scope, use.node, accumulators)
            if bound is None:
                result.obstacle = result.obstacle or f"`{name}` is bound to something else"
            elif bound is not True:
                numbers.append(bound)
        else:
            result.reads.append(use.node)
    if not facts.host_syncs.accelerated:
        # d2l's CPU-only `train_ch3`: on the CPU `.item()` waits for no queue.
        result.obstacle = CPU_ONLY
    if not result.reads and not result.obstacle:
        result.obstacle = f"`{name}` is never read: delete the accumulation instead"
    if counts and all(isinstance(n, cst.Integer) for n in numbers):
        result.converter = "int"
    parents = walk_parents(scope) if result.reads else {}
    for read in result.reads:
        statement = statement_of(parents, read)
        if statement in per_step:
            result.obstacle = result.obstacle or f"`{name}` is read on every step"
        holder = parents.get(read)
        if isinstance(holder, cst.FormattedStringExpression) and holder.equal is not None:
            # `f"{running=}"` prints the expression's text, which `float(...)` would change.
            result.obstacle = result.obstacle or f"`{name}` is printed with `=`"
    return result


def _bound_number(scope: Scope, name: cst.Name, accumulators):
    """What the store `name` binds: True for an accumulation, the number literal of
    `name = 0`, None for anything else."""
    for statement in find_all(scope, cst.Assign, cst.AugAssign):
        if statement in accumulators:
            if isinstance(statement, cst.AugAssign) and statement.target is name:
                return True
            if isinstance(statement, cst.Assign) and statement.targets[0].target is name:
                return True
            continue
        if isinstance(statement, cst.Assign):
            for target in statement.targets:
                value = _value_bound_to(target.target, statement.value, name)
                if value is not None:
                    return value if _is_number(value) else None
    return None


def _value_bound_to(target, value, name: cst.Name) -> Optional[cst.BaseExpression]:
    """What `target = value` binds to `name`, element-wise through tuples (`a, b = 0, 0`)."""
    if target is name:
        return value
    if (
        isinstance(target, (cst.Tuple, cst.List))
        and isinstance(value, (cst.Tuple, cst.List))
        and len(target.elements) == len(value.elements)
        and not any(isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements))
    ):
        for element, bound in zip(target.elements, value.elements):
            found = _value_bound_to(element.value, bound.value, name)
            if found is not None:
                return found
    return None


def statement_of(parents: dict, node: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The innermost statement (or one-line suite) that holds `node`."""
    current = parents.get(node)
    while current is not None and not isinstance(
        current, (cst.BaseStatement, cst.SimpleStatementSuite)
    ):
        current = parents.get(current)
    return current


# Edits of an accumulation moved to the device -------------------------------------------------
def device_total_term(item: cst.Call, converter: str = "float") -> cst.BaseExpression:
    """What to add instead of `x.item()`: `x.detach().float()` (a float32 total on the
    device, whatever the value's precision; detached, or the total would keep every step's
    graph), `x.detach()` when `x` is a float32 sum or mean already (`y.float().mean()`), or
    `x` itself for an integer count."""
    value = item.func.value
    if converter == "int":
        return value.with_changes(lpar=[*item.lpar, *value.lpar], rpar=[*value.rpar, *item.rpar])
    if _is_detach(value):  # `loss.detach().item()`: detached already
        return item.with_changes(func=item.func.with_changes(attr=cst.Name("float")))
    detach = cst.Call(func=item.func.with_changes(attr=cst.Name("detach")))
    if _float32_reduction(value):
        return item.with_changes(func=detach.func)
    return item.with_changes(func=cst.Attribute(value=detach, attr=cst.Name("float")))


def _float32_reduction(node: cst.BaseExpression) -> bool:
    """`y.float().sum()`, `y.float().mean()`: a float32 scalar whatever `y` was."""
    return (
        isinstance(node, cst.Call)
        and not node.args
        and method_name(node) in ("sum", "mean")
        and isinstance(node.func.value, cst.Call)
        and not node.func.value.args
        and method_name(node.func.value) == "float"
    )


def host_read(read: cst.Name, converter: str = "float") -> cst.Call:
    """A read of the total as the Python number it was: `float(total)` / `int(total)`."""
    return cst.Call(
        func=cst.Name(converter),
        args=[cst.Arg(value=read.with_changes(lpar=(), rpar=()))],
        lpar=read.lpar,
        rpar=read.rpar,
    )


def _boolean_mask(subscript: cst.Subscript) -> Optional[cst.BaseExpression]:
    """The index of `x[mask]` when it looks boolean: a comparison (`out[y != -1]`), a name
    or attribute called a mask (PyG's `out[data.train_mask]`), or the inverse of one. A
    device tensor indexed by a boolean one waits for the device: the result's size is the
    number of True elements, which the host must read (`nonzero`)."""
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return None
    index = subscript.slice[0].slice.value
    inner = index
    while isinstance(inner, cst.UnaryOperation) and isinstance(inner.operator, cst.BitInvert):
        inner = inner.expression
    if isinstance(inner, cst.Comparison):
        return index
    name = inner.attr.value if isinstance(inner, cst.Attribute) else None
    if isinstance(inner, cst.Name):
        name = inner.value
    return index if name is not None and "mask" in name.lower() else None

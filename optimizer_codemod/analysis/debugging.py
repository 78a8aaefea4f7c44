"""Debugging switches and housekeeping left on around the training step.

Anomaly detection, profilers, and calls made "to be safe" on every step (`gc.collect()`,
`torch.cuda.empty_cache()`, `torch.cuda.synchronize()`) each cost time on every step while
they are on. Found here: where they are, whether they run unconditionally (a switch behind
`if args.debug:` is the user's choice, not a leftover), and what stops deleting them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Dict, List, Optional

import libcst as cst

from optimizer_codemod.analysis.calls import (
    argument,
    has_double_star,
    keyword,
    literal,
    method_name,
    positional,
)
from optimizer_codemod.analysis.collect import Loop, is_main_guard
from optimizer_codemod.analysis.devices import ACCELERATOR_PREFIXES
from optimizer_codemod.analysis.nodes import find_all, lone_call
from optimizer_codemod.analysis.walk import children
from optimizer_codemod.analysis.syncs import (
    HOST_SYNC_FUNCTIONS,
    StepSync,
    alone_in_statement,
    every_iteration,
)

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

ANOMALY_SETTERS = frozenset(
    {"torch.autograd.set_detect_anomaly", "torch.autograd.anomaly_mode.set_detect_anomaly"}
)
ANOMALY_CONTEXTS = frozenset(
    {"torch.autograd.detect_anomaly", "torch.autograd.anomaly_mode.detect_anomaly"}
)
# Profilers that record every step they enclose; `torch.profiler.profile` records only the
# active steps of its `schedule=` when it has one.
SCHEDULED_PROFILERS = frozenset({"torch.profiler.profile", "torch.profiler.profiler.profile"})
PROFILERS = SCHEDULED_PROFILERS | frozenset(
    {
        "torch.autograd.profiler.profile",
        "torch.autograd.profiler.emit_nvtx",
        "torch.autograd.profiler_legacy.profile",
        "torch.cuda.profiler.profile",
    }
)
COLLECTORS = frozenset({"gc.collect"})


@dataclass(frozen=True)
class DebugSite:
    """One debugging switch or housekeeping call that costs time on every training step."""

    # anomaly (a `set_detect_anomaly(True)` call), anomaly-context (a `with` item), profiler,
    # collect, empty_cache, synchronize
    kind: str
    node: cst.CSTNode  # the call (for a `with`, the item's call)
    statement: cst.CSTNode  # the line to delete, or the `with` statement to unwrap
    # Why it cannot simply be deleted (or unwrapped); None when it can.
    obstacle: Optional[str] = None
    loop: Optional[Loop] = None  # the training loop, for per-step calls
    sync: Optional[StepSync] = None  # the per-step sync it is (empty_cache, synchronize)


class DebugSwitches:
    """Debugging and housekeeping of the training step (one per ScriptFacts)."""

    def __init__(self, facts: "ScriptFacts") -> None:
        self.facts = facts
        self._steps: Dict[int, object] = {}

    def _per_step(self, loop: Loop):
        key = id(loop.node)
        if key not in self._steps:
            self._steps[key] = every_iteration(loop)
        return self._steps[key]

    @cached_property
    def sites(self) -> List[DebugSite]:
        """Every site, in source order: anomaly detection turned on for training (a call at
        module level, in a function holding a training loop or calling a function of this
        file that reaches backward, such as `main()` running `Trainer(...).run()`, or a
        training loop of another module of the run, as the project index found; a `with`
        around a training loop or a backward call, or inside a training loop), profilers
        entered the same way (`torch.profiler.profile` only without a `schedule=`), and
        `gc.collect()`, `empty_cache()`, `synchronize()` on every step of a training loop
        (its own body, not under an `if`). Only what runs unconditionally: not under an
        `if` (the main guard aside), an `except` or an `else`."""
        from optimizer_codemod.analysis.precision import entry_calls

        facts = self.facts
        # A script whose training loops are in other modules of the run (project.py) turns
        # anomaly detection on for them: the switch is process-wide.
        runs_elsewhere = {id(call.site.function) for call in entry_calls(facts)}
        if not facts.training_loops and not runs_elsewhere:
            return []
        found: List[DebugSite] = []
        for call in facts.calls_to(*ANOMALY_SETTERS):
            statement = call.site.statement
            in_training = (
                (call.site.function is None and (facts.training_loops or runs_elsewhere))
                or id(call.site.function) in runs_elsewhere
                or any(loop.function is call.site.function for loop in facts.training_loops)
                or (
                    call.site.function is not None
                    and call.site.function.name.value in facts.functions_reaching_backward
                )
            )
            if not (
                _turns_on(call.node)
                and in_training
                and self._unconditional(call.node, call.site.function)
            ):
                continue
            if any(call.node is item.item for item, _ in facts.records.with_items):
                continue  # a context manager: handled with the `with` items below
            obstacle = None if lone_call(statement, call.node) else "it shares its line"
            found.append(DebugSite("anomaly", call.node, statement, obstacle))
        for item, site in facts.records.with_items:
            kind = self._context_kind(item)
            if kind is None or not self._wraps_training(site.statement, site.loops):
                continue
            if not self._unconditional(site.statement, site.function):
                continue
            obstacle = _unwrap_obstacle(site.statement, item) if kind != "profiler" else None
            found.append(DebugSite(kind, item.item, site.statement, obstacle))
        for loop in facts.training_loops:
            for sync in facts.host_syncs.sites(loop):
                if sync.kind in ("empty_cache", "synchronize"):
                    obstacle = None if alone_in_statement(sync) else "it shares its line"
                    found.append(
                        DebugSite(sync.kind, sync.node, sync.statement, obstacle, loop, sync)
                    )
            found.extend(self._under_device_checks(loop))
            for call in facts.calls_to(*COLLECTORS):
                if call.site.loop is loop and call.site.statement in self._per_step(loop):
                    statement = call.site.statement
                    obstacle = None if lone_call(statement, call.node) else "it shares its line"
                    found.append(DebugSite("collect", call.node, statement, obstacle, loop))
        calls = facts.call_site_of
        return sorted(found, key=lambda s: calls[s.node].site.order if s.node in calls else 0)

    def _under_device_checks(self, loop: Loop) -> List[DebugSite]:
        """`synchronize()`/`empty_cache()` alone in an `if` that runs on every step and only
        asks which device the script runs on (`if args.device.startswith("cuda"):`,
        `if torch.cuda.is_available():`): on that device it runs every step. The `if` is
        what a fix deletes (or gates)."""
        found: List[DebugSite] = []
        for branch in self._per_step(loop):
            if not isinstance(branch, cst.If) or branch.orelse is not None:
                continue
            if not is_device_check(self.facts, branch.test):
                continue
            lines = branch.body.body if isinstance(branch.body, cst.IndentedBlock) else ()
            for line in lines:
                for call in find_all(line, cst.Call):
                    kind = HOST_SYNC_FUNCTIONS.get(self.facts.qualified_name(call.func) or "")
                    if kind is None:
                        continue
                    sync = StepSync(call, kind, None, line, True, loop)
                    alone = len(lines) == 1 and alone_in_statement(sync)
                    obstacle = None if alone else "it shares its `if` with other code"
                    found.append(DebugSite(kind, call, branch, obstacle, loop, sync))
        return found

    def _context_kind(self, item: cst.WithItem) -> Optional[str]:
        call = item.item
        if not isinstance(call, cst.Call) or has_double_star(call):
            return None
        qualname = self.facts.qualified_name(call.func)
        if qualname in ANOMALY_CONTEXTS or (qualname in ANOMALY_SETTERS and _turns_on(call)):
            return "anomaly-context"
        if qualname not in PROFILERS:
            return None
        if qualname in SCHEDULED_PROFILERS and keyword(call, "schedule") is not None:
            return None
        enabled = argument(call, "enabled", 0) if qualname not in SCHEDULED_PROFILERS else None
        if enabled is None and qualname in SCHEDULED_PROFILERS:
            enabled = keyword(call, "enabled")
        if enabled is not None and literal(enabled.value, None) is not True:
            return None  # off, or switched at run time: the user's choice
        return "profiler"

    def _wraps_training(self, statement: cst.CSTNode, loops) -> bool:
        """A `with` inside a training loop, or one whose body holds a training loop or a
        backward call (a step function's body)."""
        training = self.facts.training_loops
        if any(loop in loops and statement in self._per_step(loop) for loop in training):
            return True
        inside = set(find_all(statement))
        return any(loop.node in inside for loop in training) or any(
            call.node in inside for call in self.facts.backward_calls
        )

    def _unconditional(self, node: cst.CSTNode, function: Optional[cst.FunctionDef]) -> bool:
        """No `if` (the main guard aside), `except`, `else` or `case` between `node` and its
        function (or the module)."""
        path = _path_to(function if function is not None else self.facts.module, node)
        for parent, child in zip(path, path[1:] + [node]):
            if isinstance(parent, cst.If) and not (is_main_guard(parent) and child is parent.body):
                return False
            if isinstance(
                parent,
                (cst.IfExp, cst.BooleanOperation, cst.ExceptHandler, cst.Else, cst.MatchCase),
            ):
                return False
        return True


def is_device_check(facts: "ScriptFacts", test: cst.BaseExpression) -> bool:
    """The test only asks which device the script runs on: `torch.cuda.is_available()`,
    `device.startswith("cuda")`, `device == "cuda"`, `device.type != "cpu"`,
    `"cuda" in device`, `x.is_cuda`, and `not`/`and` of those."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return is_device_check(facts, test.expression)
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return is_device_check(facts, test.left) and is_device_check(facts, test.right)
    if isinstance(test, cst.Attribute):
        return test.attr.value == "is_cuda"
    if isinstance(test, cst.Call):
        qualname = facts.qualified_name(test.func) or ""
        if qualname.startswith("torch.") and qualname.endswith(".is_available"):
            return True
        args = positional(test)
        return method_name(test) == "startswith" and len(args) == 1 and _names_device(args[0].value)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        if isinstance(target.operator, (cst.Equal, cst.NotEqual)):
            return _names_device(test.left) or _names_device(target.comparator)
        if isinstance(target.operator, cst.In):
            return _names_device(test.left)
    return False


def _names_device(node: cst.BaseExpression) -> bool:
    value = literal(node, None)
    return isinstance(value, str) and value.split(":")[0] in (*ACCELERATOR_PREFIXES, "cpu")


def _path_to(root: cst.CSTNode, target: cst.CSTNode) -> List[cst.CSTNode]:
    """The nodes from `root` down to `target`'s parent (empty when `target` is not there);
    nested functions are not entered unless `root` is one."""
    # Parents are remembered instead of copying a path per node: linear in the tree's size.
    parents: Dict[cst.CSTNode, cst.CSTNode] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        for child in children(node):
            if child is target:
                path = [node]
                while path[-1] is not root:
                    path.append(parents[path[-1]])
                return path[::-1]
            if not isinstance(child, (cst.FunctionDef, cst.Lambda)):
                parents[child] = node
                stack.append(child)
    return []


def _turns_on(call: cst.Call) -> bool:
    """`set_detect_anomaly(True)` / `(mode=True)`."""
    arg = argument(call, "mode", 0)
    return arg is not None and literal(arg.value, None) is True


def _unwrap_obstacle(statement: cst.CSTNode, item: cst.WithItem) -> Optional[str]:
    """Why the `with` cannot lose this item: it binds a name, or its block is one line or
    ends in comments that would have nowhere to go."""
    if not isinstance(statement, cst.With) or item.asname is not None:
        return "it binds a name with `as`"
    if len(statement.items) > 1:
        return None
    body = statement.body
    if not isinstance(body, cst.IndentedBlock):
        return "its block is on the same line"
    if any(line.comment for line in body.footer):
        return "comments close its block"
    return None

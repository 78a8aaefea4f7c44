"""OPT601: gradient accumulation under DistributedDataParallel without `no_sync`."""

from __future__ import annotations

from typing import List, Optional, Sequence, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt, keyword, literal, positional
from optimizer_codemod.analysis.collect import target_names
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all, under_with
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.analysis.training import (
    GRADIENT_CLIPPING,
    TrainedModel,
    TrainingStep,
    optimizer_name,
    the_trained_model,
    training_steps,
    wrapper_assignments,
    visible_at,
)
from optimizer_codemod.rule import Edit, Example, Fix, ImportSpec, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

NO_SYNC = "no_sync"
DDP_CLASS = "torch.nn.parallel.DistributedDataParallel"
SYNC_NAMES = ("sync", "sync_gradients", "sync_step")
# Expressions that read values and compute, never call: safe to evaluate earlier in the step.
PURE_NODES = (
    cst.Name,
    cst.Attribute,
    cst.Integer,
    cst.Float,
    cst.SimpleString,
    cst.BinaryOperation,
    cst.UnaryOperation,
    cst.Comparison,
    cst.ComparisonTarget,
    cst.BooleanOperation,
    cst.BaseBinaryOp,
    cst.BaseUnaryOp,
    cst.BaseCompOp,
    cst.BaseBooleanOp,
    cst.LeftParen,
    cst.RightParen,
    cst.BaseParenthesizableWhitespace,
    cst.Dot,
)
STATEMENT_TARGETS = (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.WithItem)

SCRIPT = """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = Net().to(device)
model = DDP(model)
optimizer = torch.optim.AdamW(model.parameters())
for i, (x, y) in enumerate(loader):
    loss = loss_fn(model(x), y) / accum
    loss.backward()
    if (i + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()


class Net(torch.nn.Module):
    pass
"""
FIXED = SCRIPT.replace(" as DDP\n", " as DDP\nimport contextlib\n", 1).replace(
    "    loss = loss_fn(model(x), y) / accum\n"
    "    loss.backward()\n"
    "    if (i + 1) % accum == 0:\n",
    "    sync = (i + 1) % accum == 0\n"
    "    with contextlib.nullcontext() if sync else model.no_sync():\n"
    "        loss = loss_fn(model(x), y) / accum\n"
    "        loss.backward()\n"
    "    if sync:\n",
)
NESTED = """\
import torch
from torch.nn.parallel import DistributedDataParallel

model = Net().to(device)
model = DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for batches in loader:
    for micro in range(accum):
        x, y = batches[micro]
        loss = loss_fn(model(x), y) / accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()


class Net(torch.nn.Module):
    pass
"""
NESTED_FIXED = NESTED.replace(
    "import DistributedDataParallel\n", "import DistributedDataParallel\nimport contextlib\n", 1
).replace(
    "        loss = loss_fn(model(x), y) / accum\n        loss.backward()\n",
    "        with contextlib.nullcontext() if micro == accum - 1 else model.no_sync():\n"
    "            loss = loss_fn(model(x), y) / accum\n            loss.backward()\n",
)


class DDPAccumulationWithoutNoSync(Rule):
    """
    What it does:
        In a training loop that accumulates gradients over several micro-batches (backward on
        every iteration, `optimizer.step()` only under `if COND:`, or after an inner
        `for micro in range(N):` loop) of a model wrapped in `DistributedDataParallel`, runs
        the forward and backward of the micro-batches that do not step under
        `ddp_model.no_sync()`. The condition is computed once before the forward
        (`sync = COND`); the step that synchronizes runs under `contextlib.nullcontext()`.

    Why is it slow:
        DDP all-reduces the gradients during every backward. Without `no_sync`, a step
        accumulated over N micro-batches sends the whole gradient over the network N times
        instead of once, and each backward waits for its all-reduce buckets.

    Example:
        ```python
        for i, (x, y) in enumerate(loader):
            loss = loss_fn(model(x), y) / accum
            loss.backward()
            if (i + 1) % accum == 0:
                optimizer.step()
        ```
        becomes
        ```python
        for i, (x, y) in enumerate(loader):
            sync = (i + 1) % accum == 0
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = loss_fn(model(x), y) / accum
                loss.backward()
            if sync:
                optimizer.step()
        ```

    Fix safety:
        `numerics`: under `no_sync` each rank accumulates its local gradients and the
        all-reduce of the last micro-batch averages the sums, so the optimizer sees the same
        gradients up to floating-point summation order. The forward is inside `no_sync` too,
        since DDP decides at forward time whether the next backward reduces. Applied only when
        the condition is side-effect free (names, attributes, literals, arithmetic and
        comparisons) and not assigned between the forward and backward; counters incremented
        between backward and the condition (`micro_step += 1`) move before the forward when
        nothing else there reads them. A condition that calls something, a loop that can skip
        the backward of the last micro-batch (`break`/`continue` in the inner loop), or any
        other shape is reported, and so is a loop that reads gradients on every micro-batch
        (`.grad`, clipping outside the step's condition) or is followed by an optimizer step
        for the leftover micro-batches: those would see one rank's unsynchronized gradients.
        A training loop that already uses `no_sync` is left alone, and so is a script that
        uses it outside its training loops (a context chosen before the loop may reach any).
        Accumulation through a loss-scaler helper (`loss_scaler(loss, optimizer,
        update_grad=COND)`, as in MAE and ConvNeXt) is explained, not rewritten: the helper
        runs backward in another module, and the DDP wrapper is built in another one.

    Expected gain:
        PyTorch's documentation of `DistributedDataParallel.no_sync` describes it as the
        context manager that disables gradient synchronization for gradient accumulation
        (https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html#torch.nn.parallel.DistributedDataParallel.no_sync):
        the communication per optimizer step drops from N all-reduces to one for N
        micro-batches; the time saved depends on the interconnect and model size. Measured with
        `optcodemod verify --select OPT601` on reference_models/mmdit_ddp (`--size cpu`, 4
        micro-batches per step, torchrun with 2 processes over gloo, 12 steps, 3 runs each) on
        the shared 2-core x86_64 CPU with torch 2.13.0+cpu (2026-11-22): median step 49.4 ms
        before, 36.5 ms after (1.35x; noisy: two processes on two shared cores), losses equal
        within 1e-7 relative.
    """

    code = "OPT601"
    name = "ddp-accumulation-without-no-sync"
    message = "Gradient accumulation under DistributedDataParallel all-reduces every micro-batch"
    fix_title = "Run the micro-batches that do not step under `model.no_sync()`"
    safety = Safety.NUMERICS
    min_torch = TorchVersion(1, 2)
    # A loss-scaler helper that steps only on some micro-batches (`update_grad=`) is
    # examined too: its backward is out of sight, in another module.
    triggers = (r"DistributedDataParallel|\bDDP\b", r"\bupdate_grad\s*=")
    requires = (BACKWARD_CALL + r"|\bupdate_grad\s*=",)
    examples = (
        Example(SCRIPT, FIXED),
        Example(NESTED, NESTED_FIXED),
        Example(
            SCRIPT.replace(
                "    loss = loss_fn(model(x), y) / accum\n    loss.backward()\n",
                "    with model.no_sync():\n"
                "        loss = loss_fn(model(x), y) / accum\n        loss.backward()\n",
            )
        ),
        Example(SCRIPT.replace("model = DDP(model)\n", "")),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        self._accumulation_in_a_helper(original_node)
        model = the_trained_model(facts)
        if model is None or model.wrapped_as is None:
            return
        wrappers = wrapper_assignments(facts, model.name)
        # DataParallel has no `no_sync`; FSDP's keeps unsharded gradients (memory) and is
        # not this rule's call to make.
        if not wrappers or any(
            facts.qualified_name(w.value.func) != DDP_CLASS
            for w in wrappers
            if isinstance(w.value, cst.Call)
        ):
            return
        # Every identifier of the file, parameters included: `sync` must be fresh everywhere.
        self._identifiers = {node.value for node in find_all(original_node, cst.Name)}
        optimizer = optimizer_name(facts, model)
        if optimizer is None:
            return
        steps = training_steps(facts, model)
        in_loops = [_no_sync_names(step.loop.node) for step in steps]
        inside = {id(n) for found in in_loops for n in found}
        # `no_sync` outside the training loops may reach any of them (a context chosen before
        # the loop): leave the file alone. Inside a loop it only settles that loop.
        if any(id(n) not in inside for n in _no_sync_names(original_node)):
            return
        for step, found in zip(steps, in_loops):
            if not found:
                self._check_step(model, step, optimizer)

    def _accumulation_in_a_helper(self, module: cst.Module) -> None:
        """`loss_scaler(loss, optimizer, update_grad=COND)` in a loop (MAE's and ConvNeXt's
        NativeScaler): the helper runs backward on every micro-batch and steps only when
        COND holds. Its backward and the model's DDP wrapper are in other modules, so no
        `no_sync` can be placed soundly here: say so at the call."""
        # The text is searched first: walking every name of the module cost 1% of a run.
        if self.context.mentions(NO_SYNC) and _no_sync_names(module):
            return
        for call in self.facts.records.calls:
            update = keyword(call.node, "update_grad")
            if update is None or not call.site.loops or literal(update.value, None) is not None:
                continue
            self.decline(
                call.node,
                f"gradient accumulation through `{excerpt(call.node.func)}(..., update_grad=...)`:"
                " its backward runs in that helper, outside this file, and whether the model "
                "is wrapped in DistributedDataParallel is decided where it is built; if it is, "
                "run the micro-batches that do not update under `model.no_sync()`",
            )

    def _check_step(self, model: TrainedModel, step: TrainingStep, optimizer: str) -> None:
        wrapper = model.wrapped_as
        assert wrapper is not None
        receivers = {optimizer} | ({step.scaler} if step.scaler else set())
        statement = step.backward.site.statement
        loop = step.loop
        if not isinstance(loop.node, (cst.For, cst.While)) or not isinstance(
            loop.node.body, cst.IndentedBlock
        ):
            return
        in_loop = self._step_calls(loop, receivers)
        direct = loop.node.body.body is not None and any(
            s is statement for s in loop.node.body.body
        )
        anchor = step.backward.node
        if in_loop:
            if not direct:
                return
            self._flat(model, step, in_loop, anchor, receivers)
        elif loop.parent is not None and self._step_calls(loop.parent, receivers):
            if not direct:
                return
            self._nested(model, step, anchor)

    def _step_calls(self, loop, receivers: Set[str]) -> List[cst.Call]:
        return [
            call.node
            for call in self.facts.loop_calls(loop)
            if call.method == "step" and call.receiver in receivers
        ]

    # `for batch in loader: ...; backward(); if COND: step()` --------------------------------
    def _flat(
        self,
        model: TrainedModel,
        step: TrainingStep,
        calls: List[cst.Call],
        anchor: cst.Call,
        receivers: Set[str],
    ) -> None:
        block = step.block
        statement = step.backward.site.statement
        index = next(i for i, s in enumerate(block) if s is statement)
        ids = {id(call) for call in calls}
        guard: Optional[cst.If] = None
        skip = False
        position = None
        for i in range(index + 1, len(block)):
            candidate = block[i]
            inside = {id(c) for c in find_all(candidate, cst.Call)}
            if isinstance(candidate, cst.If) and candidate.orelse is None:
                body = candidate.body.body
                if ids <= inside:
                    guard, position = candidate, i
                    break
                if (
                    len(body) == 1
                    and isinstance(body[0], cst.SimpleStatementLine)
                    and len(body[0].body) == 1
                    and isinstance(body[0].body[0], cst.Continue)
                    and ids <= {id(c) for s in block[i + 1 :] for c in find_all(s, cst.Call)}
                ):
                    guard, position, skip = candidate, i, True
                    break
            if ids & inside:
                return  # the optimizer steps unconditionally (or in a shape not followed)
        if guard is None or position is None:
            return
        if any(ids & {id(c) for c in find_all(s, cst.Call)} for s in block[: index + 1]):
            return  # a step before backward: not accumulation as written here
        condition = guard.test
        if not _pure(condition):
            self.report(
                anchor,
                message="Gradient accumulation under DistributedDataParallel without `no_sync`; "
                "the condition that decides the optimizer step calls something, so it cannot "
                "be computed before the forward: compute `sync` first and run the other "
                "micro-batches under `model.no_sync()`",
            )
            return
        unsynced = [s for s in block if s is not guard] if not skip else block[: position + 1]
        if _reads_gradients(self.facts, unsynced) or self._steps_after(step, receivers):
            self.report(
                anchor,
                message="Gradient accumulation under DistributedDataParallel without `no_sync`; "
                "gradients are read on every micro-batch (`.grad`, clipping) or the optimizer "
                "steps again after the loop, and under `no_sync` those would see one rank's partial "
                "gradients: move them under the step's condition, then run the other "
                "micro-batches under `model.no_sync()`",
            )
            return
        region = self._region(step)
        names = {node.value for node in find_all(condition, cst.Name)}
        hoisted: List[cst.BaseStatement] = []
        left: List[cst.BaseStatement] = []
        for between in block[index + 1 : position]:
            if _assigned_names(between) & names:
                if not _is_counter(between) or _mentions_any(region, _assigned_names(between)):
                    self._unsure(anchor)
                    return
                hoisted.append(between)
            else:
                left.append(between)
        moved = set().union(*(_assigned_names(s) for s in hoisted)) if hoisted else set()
        if any(_assigned_names(s) & names for s in region) or _mentions_any(left, moved):
            self._unsure(anchor)
            return
        if not self._wrapper_ready(model, region):
            return
        sync = next((n for n in SYNC_NAMES if n not in self._identifiers), None)
        if sync is None:
            self._unsure(anchor)
            return
        value = _negated(condition) if skip else condition
        assign = cst.parse_statement(f"{sync} = {_code(value)}\n")
        edits: List[Edit] = [Replace(s, cst.RemovalSentinel.REMOVE) for s in hoisted]
        edits.extend(self._wrapped(region, model.wrapped_as, sync, (*hoisted, assign)))
        test = cst.parse_expression(f"not {sync}" if skip else sync)
        edits.append(Replace(condition, test))
        self._fix(anchor, edits)

    def _steps_after(self, step: TrainingStep, receivers: Set[str]) -> bool:
        """An optimizer step after the loop (leftover micro-batches) in the same function."""
        loop = step.loop
        return any(
            call.receiver in receivers
            and loop not in call.site.loops
            and call.site.function is loop.function
            and call.site.order > loop.end
            for call in self.facts.method_calls("step")
        )

    # `for micro in range(N): ...; backward()` then `step()` after the inner loop ----------
    def _nested(self, model: TrainedModel, step: TrainingStep, anchor: cst.Call) -> None:
        node = step.loop.node
        iteration = node.iter if isinstance(node, cst.For) else None
        count = positional(iteration) if isinstance(iteration, cst.Call) else []
        simple = (
            isinstance(node, cst.For)
            and isinstance(node.target, cst.Name)
            and isinstance(iteration, cst.Call)
            and dotted_name(iteration.func) == "range"
            and len(iteration.args) == 1
            and len(count) == 1
            and isinstance(count[0].value, (cst.Name, cst.Attribute, cst.Integer))
            and node.orelse is None
        )
        if not simple:
            self._unsure(anchor)
            return
        assert isinstance(node, cst.For) and isinstance(node.target, cst.Name)
        region = self._region(step)
        counter = node.target.value
        limit = count[0].value
        limit_names = {n.value for n in find_all(limit, cst.Name)}
        if (
            find_all(node.body, cst.Break, cst.Continue, cst.Return, cst.Raise)
            or any(_assigned_names(s) & ({counter} | limit_names) for s in node.body.body)
            or _reads_gradients(self.facts, node.body.body)
        ):
            self._unsure(anchor)
            return
        if not self._wrapper_ready(model, region):
            return
        last = f"{counter} == {_code(limit)} - 1"
        self._fix(anchor, self._wrapped(region, model.wrapped_as, last, ()))

    # Shared -----------------------------------------------------------------------------------
    def _region(self, step: TrainingStep) -> Tuple[cst.BaseStatement, ...]:
        """From the first forward statement through the backward statement."""
        block = step.block
        first = next(i for i, s in enumerate(block) if s is step.forward[0])
        last = next(i for i, s in enumerate(block) if s is step.backward.site.statement)
        return tuple(block[first : last + 1])

    def _wrapper_ready(self, model: TrainedModel, region: Sequence[cst.BaseStatement]) -> bool:
        """The wrapper runs the forward in `region` and is bound where the loop runs."""
        wrapper = model.wrapped_as
        assert wrapper is not None
        return _mentions_any(region, {wrapper}) and visible_at(
            self.facts, cst.parse_expression(wrapper), region[0]
        )

    def _wrapped(
        self,
        region: Tuple[cst.BaseStatement, ...],
        wrapper: Optional[str],
        sync: str,
        before: Tuple[cst.BaseStatement, ...],
    ) -> List[Edit]:
        contextlib = self.facts.imports.name_for_module("contextlib") or "contextlib"
        first = region[0]
        block = under_with(
            region, f"{contextlib}.nullcontext() if {sync} else {wrapper}.{NO_SYNC}()"
        )
        statements = [*before, block]
        if before:
            statements[0] = statements[0].with_changes(
                leading_lines=[*first.leading_lines, *statements[0].leading_lines]
            )
            statements[-1] = block.with_changes(leading_lines=())
        edits: List[Edit] = [Replace(first, cst.FlattenSentinel(statements))]
        edits.extend(Replace(s, cst.RemovalSentinel.REMOVE) for s in region[1:])
        return edits

    def _fix(self, anchor: cst.Call, edits: List[Edit]) -> None:
        imports = (
            () if self.facts.imports.name_for_module("contextlib") else (ImportSpec("contextlib"),)
        )
        self.report(anchor, Fix(tuple(edits), imports))

    def _unsure(self, anchor: cst.Call) -> None:
        self.report(
            anchor,
            message="Gradient accumulation under DistributedDataParallel without `no_sync`, in a "
            "shape the rewrite does not follow: run the forward and backward of the "
            "micro-batches that do not step under `model.no_sync()`",
        )


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _pure(node: cst.CSTNode) -> bool:
    return all(isinstance(n, PURE_NODES) for n in find_all(node, cst.CSTNode))


def _negated(condition: cst.BaseExpression) -> cst.BaseExpression:
    """`a != b` becomes `a == b` (and back); anything else `not (...)`."""
    if isinstance(condition, cst.Comparison) and len(condition.comparisons) == 1:
        target = condition.comparisons[0]
        swap = {cst.NotEqual: cst.Equal, cst.Equal: cst.NotEqual}.get(type(target.operator))
        if swap is not None:
            operator = swap(
                whitespace_before=target.operator.whitespace_before,
                whitespace_after=target.operator.whitespace_after,
            )
            return condition.with_changes(comparisons=[target.with_changes(operator=operator)])
    return cst.parse_expression(f"not ({_code(condition)})")


def _assigned_names(statement: cst.CSTNode) -> Set[str]:
    """Names a statement binds: assignment and loop targets, `with ... as`, walrus."""
    names: Set[str] = set()
    for node in find_all(statement, *STATEMENT_TARGETS, cst.NamedExpr):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                names |= set(target_names(target.target))
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr)):
            names |= set(target_names(node.target))
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            names |= set(target_names(node.asname.name))
    return names


def _reads_gradients(facts, statements: Sequence[cst.CSTNode]) -> bool:
    """`.grad` read, or gradients clipped: they would see one rank's partial sums."""
    for statement in statements:
        if any(node.attr.value == "grad" for node in find_all(statement, cst.Attribute)):
            return True
        if any(
            facts.qualified_name(call.func) in GRADIENT_CLIPPING
            for call in find_all(statement, cst.Call)
        ):
            return True
    return False


def _is_counter(statement: cst.CSTNode) -> bool:
    """`step += 1`: a counter whose update can move earlier in the iteration."""
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.AugAssign)
        and isinstance(statement.body[0].target, cst.Name)
        and isinstance(statement.body[0].value, cst.Integer)
    )


def _mentions_any(statements: Sequence[cst.CSTNode], names: Set[str]) -> bool:
    return any(
        node.value in names for statement in statements for node in find_all(statement, cst.Name)
    )


def _no_sync_names(node: cst.CSTNode) -> List[cst.Name]:
    return [n for n in find_all(node, cst.Name) if n.value == NO_SYNC]

"""Evaluations that a training step runs every step but whose results it shows only every
Nth step, and whether they can run under that gate instead.

pytorch/examples' gcn and gat:

    def train_iter(epoch, model, optimizer, criterion, input, target, mask_train, mask_val,
                   print_every=10):
        model.train()
        ...                                                    # forward, backward, step
        loss_train, acc_train = test(model, criterion, input, target, mask_train)
        loss_val, acc_val = test(model, criterion, input, target, mask_val)
        if epoch % print_every == 0:
            print(f"... {loss_train:.4f} ... {acc_val:.4f}")

    def test(model, criterion, input, target, mask):
        model.eval()
        with torch.no_grad():
            ...
        return loss.item(), acc.item()                       # waits for the device

`test` makes nothing that outlives it (escapes.block_escape), draws no random number and runs
the model only after `model.eval()`; the names it binds are read only under the gate; the step
sets `model.train()` before its own forward; and the first use of the model after the loop
that runs the step is again such an evaluation, which sets `eval()` itself. Then the calls can
move to the top of the gate's body: the steps that print print the same, the others skip an
evaluation whose results nobody reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt, method_name, positional
from optimizer_codemod.analysis.collect import CallSite
from optimizer_codemod.analysis.epochs import containing_body
from optimizer_codemod.analysis.escapes import block_escape
from optimizer_codemod.analysis.factories import FACTORIES
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.scopes import name_uses
from optimizer_codemod.analysis.syncs import helper_syncs, tests_a_remainder
from optimizer_codemod.analysis.values import local_function

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

RANDOM_PREFIXES = ("random.", "numpy.random.", "torch.random.", "torch.distributions.")
RANDOM_CALLS = frozenset(
    {name for name, kind in FACTORIES.items() if kind == "random"}
    | {"torch.multinomial", "torch.bernoulli", "torch.poisson", "torch.nn.functional.dropout"}
)


@dataclass(frozen=True)
class GatedEvaluation:
    """Evaluation calls of a training step (`statements`, in order) whose results only the
    body of `gate` (`if epoch % print_every == 0:`) reads."""

    statements: Tuple[cst.SimpleStatementLine, ...]
    gate: cst.If
    syncs: Tuple[cst.Call, ...]  # the `.item()` calls of the evaluations
    obstacle: Optional[str]


def gated_evaluations(facts: "ScriptFacts") -> List[GatedEvaluation]:
    """Every run of evaluation calls right before a periodic `if` of a training step, once
    per pass."""
    memo = facts.memo("gated_evaluations")
    if "all" not in memo:
        memo["all"] = _find(facts)
    return memo["all"]


def _find(facts: "ScriptFacts") -> List[GatedEvaluation]:
    by_statement: Dict[int, List[cst.Call]] = {}
    callers: Dict[int, CallSite] = {}
    for sync in helper_syncs(facts):
        if sync.step:
            continue
        statement = sync.caller.site.statement
        by_statement.setdefault(id(statement), []).append(sync.node)
        callers[id(statement)] = sync.caller
    found: List[GatedEvaluation] = []
    seen = set()
    for key, caller in callers.items():
        statement = caller.site.statement
        if caller.site.function is None:
            continue
        # Searched in the caller's function only: a parent table of the whole module costs
        # 160 MB on a 50,000-line file, for a question asked of a few statements.
        block = containing_body(caller.site.function, statement)
        if not isinstance(block, cst.IndentedBlock):
            continue
        body = list(block.body)
        index = body.index(statement)
        end = index
        while end < len(body) and _assigned_call(body[end]) is not None:
            end += 1
        start = index
        while start > 0 and _assigned_call(body[start - 1]) is not None:
            start -= 1
        gate = body[end] if end < len(body) else None
        if not _is_periodic_if(gate) or id(gate) in seen:
            continue
        seen.add(id(gate))
        statements = tuple(body[start:end])
        syncs = tuple(n for s in statements for n in by_statement.get(id(s), ()))
        obstacle = _obstacle(facts, statements, gate, caller.site.function)
        found.append(GatedEvaluation(statements, gate, syncs, obstacle))
    return found


def _assigned_call(statement: cst.CSTNode) -> Optional[cst.Call]:
    """The call of `names = f(...)` (a name or a tuple of names), else None."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    assign = statement.body[0]
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    target = assign.targets[0].target
    names = target.elements if isinstance(target, cst.Tuple) else [cst.Element(target)]
    if not all(isinstance(e.value, cst.Name) for e in names):
        return None
    return assign.value if isinstance(assign.value, cst.Call) else None


def _bound(statement: cst.SimpleStatementLine) -> List[cst.Name]:
    target = statement.body[0].targets[0].target
    return [e.value for e in target.elements] if isinstance(target, cst.Tuple) else [target]


def _is_periodic_if(node: Optional[cst.CSTNode]) -> bool:
    """`if step % n == 0:` with no `else`, whose test only reads names, attributes and
    numbers (no call: testing it twice or once changes nothing)."""
    return (
        isinstance(node, cst.If)
        and node.orelse is None
        and tests_a_remainder(node)
        and not find_all(node.test, cst.Call, cst.NamedExpr, cst.Await)
    )


def _obstacle(
    facts: "ScriptFacts",
    statements: Tuple[cst.SimpleStatementLine, ...],
    gate: cst.If,
    step: cst.FunctionDef,
) -> Optional[str]:
    inside = {id(n) for n in find_all(gate.body, cst.Name)}
    for statement in statements:
        call = _assigned_call(statement)
        helper = local_function(facts, facts.call_site_of[call])
        if helper is None:
            return f"`{excerpt(call, 40)}` runs code the analysis does not follow"
        reason = _helper_obstacle(facts, helper, call, step)
        if reason is not None:
            return reason
        for name in _bound(statement):
            for use in name_uses(step, name.value, facts):
                if use.node is name:
                    continue
                if use.store or use.nested or id(use.node) not in inside:
                    return f"`{name.value}` is read outside `if {excerpt(gate.test, 30)}:`"
            if name.value in {n.value for n in find_all(gate.test, cst.Name)}:
                return f"the test of the `if` reads `{name.value}`"
    return None


def _helper_obstacle(
    facts: "ScriptFacts", helper: cst.FunctionDef, call: cst.Call, step: cst.FunctionDef
) -> Optional[str]:
    """Why running `helper` only on the gated steps could change the training: it keeps
    something, draws random numbers, or does not set its model's `eval()` first; or the
    step or the code after its loop reads the model's mode it leaves."""
    name = f"`{helper.name.value}()`"
    if block_escape(facts, helper, helper, True) is not None:
        return f"{name} may leave state behind (a tensor it makes, a store)"
    for inner in find_all(helper.body, cst.Call):
        qualname = facts.qualified_name(inner.func) or ""
        if qualname in RANDOM_CALLS or qualname.startswith(RANDOM_PREFIXES):
            return f"{name} draws random numbers (`{excerpt(inner, 30)}`)"
    model = _evaluated_parameter(helper)
    if model is None:
        return f"{name} does not start with `<model>.eval()` on one of its parameters"
    params = [p.name.value for p in helper.params.params]
    args = positional(call)
    index = params.index(model)
    argument = args[index].value if index < len(args) else None
    if not isinstance(argument, cst.Name):
        return f"the model {name} evaluates is not a name of the step"
    if not _starts_with_train(step, argument.value):
        return (
            f"the step does not call `{argument.value}.train()` before its forward: it would "
            f"run in the mode {name} leaves"
        )
    return _mode_read_after_training(facts, step, argument.value)


def _evaluated_parameter(helper: cst.FunctionDef) -> Optional[str]:
    """The parameter `p` of `helper` whose `p.eval()` is its first statement."""
    body = helper.body.body
    first = body[0] if body else None
    if isinstance(first, cst.SimpleStatementLine) and isinstance(first.body[0], cst.Expr):
        call = first.body[0].value
        if (
            isinstance(call, cst.Call)
            and method_name(call) == "eval"
            and not call.args
            and isinstance(call.func.value, cst.Name)
            and call.func.value.value in {p.name.value for p in helper.params.params}
        ):
            return call.func.value.value
    return None


def _starts_with_train(step: cst.FunctionDef, model: str) -> bool:
    """`model.train()` is a top-level statement of `step` before any other use of `model`."""
    for statement in step.body.body:
        for call in find_all(statement, cst.Call):
            if (
                isinstance(call.func, cst.Attribute)
                and isinstance(call.func.value, cst.Name)
                and call.func.value.value == model
                and call.func.attr.value == "train"
                and isinstance(statement, cst.SimpleStatementLine)
            ):
                return True
        if any(n.value == model for n in find_all(statement, cst.Name)):
            return False
    return False


def _mode_read_after_training(
    facts: "ScriptFacts", step: cst.FunctionDef, model: str
) -> Optional[str]:
    """Why code after the training could see the model in training mode where it saw eval
    mode: the step must be called only in loops, with a name for `model`, and the first use
    of that name after each loop must set the mode (`m.eval()`, `m.train()`, or a call of a
    function of the file that starts with `eval()` on it); no use at all is fine."""
    params = [p.name.value for p in step.params.params]
    if model not in params:
        return f"`{model}` is not a parameter of `{step.name.value}()`"
    index = params.index(model)
    calls = [c for c in facts.records.calls if local_function(facts, c) is step]
    if not calls:
        return f"no call of `{step.name.value}()` is found"
    parents = facts.parents
    for call in calls:
        args = positional(call.node)
        argument = args[index].value if index < len(args) else None
        loop = call.site.loops[-1].node if call.site.loops else None
        if not isinstance(argument, cst.Name) or loop is None:
            return f"`{excerpt(call.node, 40)}` is not called in a loop with a named model"
        block = parents.get(loop)
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return f"the loop around `{excerpt(call.node, 40)}` is not in a plain block"
        after = list(block.body)[list(block.body).index(loop) + 1 :]
        for statement in after:
            uses = [n for n in find_all(statement, cst.Name) if n.value == argument.value]
            if not uses:
                continue
            if not _sets_mode(facts, statement, uses[0]):
                return (
                    f"`{argument.value}` is used after the training loop "
                    f"(`{excerpt(statement, 40)}`) in the mode the last step left"
                )
            break
    return None


def _sets_mode(facts: "ScriptFacts", statement: cst.CSTNode, use: cst.Name) -> bool:
    parents = facts.parents
    parent = parents.get(use)
    if isinstance(parent, cst.Attribute) and parent.attr.value in ("eval", "train"):
        return isinstance(parents.get(parent), cst.Call)
    arg = parent if isinstance(parent, cst.Arg) else None
    call = parents.get(arg) if arg is not None else None
    if not isinstance(call, cst.Call) or arg.keyword is not None:
        return False
    site = facts.call_site_of.get(call)
    helper = local_function(facts, site) if site is not None else None
    if helper is None:
        return False
    position = list(call.args).index(arg)
    params = [p.name.value for p in helper.params.params]
    return position < len(params) and _evaluated_parameter(helper) == params[position]


def gated_replacements(
    evaluation: GatedEvaluation,
) -> List[Tuple[cst.CSTNode, object]]:
    """The evaluation's statements deleted where they are and put first in the gate's body
    (their comments with them, not their blank lines)."""
    moved = [
        statement.with_changes(leading_lines=[ln for ln in statement.leading_lines if ln.comment])
        for statement in evaluation.statements
    ]
    gate = evaluation.gate
    inner = gate.body.with_changes(body=(*moved, *gate.body.body))
    pairs: List[Tuple[cst.CSTNode, object]] = [
        (statement, cst.RemovalSentinel.REMOVE) for statement in evaluation.statements
    ]
    pairs.append((gate, gate.with_changes(body=inner)))
    return pairs

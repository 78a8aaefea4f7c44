"""The epoch loop, and work that an indentation slip left after it.

A training script's outer loop runs once per epoch; validation, logging and checkpointing
usually belong at the end of its body. A block right after the loop that still reads the
loop variable (`epoch`, or a name the loop body derives from it) was almost always meant to
run every epoch: after the loop it runs once, with the last epoch's number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst

from optimizer_codemod.analysis.calls import callee_name, excerpt
from optimizer_codemod.analysis.collect import Loop
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.mutation import binding_targets, target_name_nodes
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.walk import children

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

Body = Union[cst.Module, cst.IndentedBlock]
CELL_MARKER = "__optcodemod_cell_"
# Words in a callee's name that mark validation, evaluation, logging or saving.
ACTION_WORDS = frozenset(
    {
        "val",
        "valid",
        "validate",
        "validation",
        "eval",
        "evaluate",
        "evaluation",
        "test",
        "save",
        "checkpoint",
        "log",
        "print",
        "info",
        "scalar",
        "scalars",
    }
)
_LOOPS = (cst.For, cst.While)
_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


@dataclass(frozen=True)
class StrandedBlock:
    loop: Loop  # the epoch loop
    statements: Tuple[cst.BaseStatement, ...]  # the block, in order, right after the loop
    variable: str  # the loop variable (or a name derived from it) that the block reads
    problem: Optional[str] = None  # why moving it is not sound, when it is not
    # The loop body already runs each statement of the block every epoch: what follows the
    # loop repeats it once more (a final save or test), and moving it would run it twice.
    repeated: bool = False
    # The loop body already makes the block's validation or saving call, under a condition
    # of its own (every N steps): what follows the loop is the final one. The call's code.
    repeats_call: Optional[str] = None
    # The block only prints or logs values that the loop body prints or logs too (CutMix's
    # `print('Best accuracy ...', best_err1, best_err5)` after the loop that prints them
    # each epoch): a summary of training, which moved would print twice per epoch.
    summarises: bool = False
    # The block runs only under a test that holds at the loop's last iteration alone
    # (`if final_epoch:`, `final_epoch = epoch + 1 == epochs`): written for after training.
    # The test's code.
    last_iteration_test: Optional[str] = None
    # What in the block says it is written for after training (`is_final_validation=True`,
    # "# Final inference", `commit_message="End of training"`).
    final_marker: Optional[cst.CSTNode] = None
    # The loop is nested in another loop whose iterations the block already belongs to
    # (pytorch_geometric's distributed_sampling_xpu.py: `for batch in train_loader:` inside
    # `for epoch in range(1, 21):`, then `print(f"Epoch: {epoch:02d}, Loss: {loss:.4f}")`).
    # The enclosing loop's header, and why the block is that loop's.
    enclosing_header: Optional[str] = None
    enclosing_evidence: Optional[str] = None


def epoch_loops(facts: "ScriptFacts") -> List[Loop]:
    """`for` loops that run training once per iteration: they enclose the loop that runs one
    optimizer step per iteration (a micro-step loop's step loop is no epoch loop), or call a
    function of this file that reaches backward; or, without an inner loop, they call
    backward themselves and name their variable after epochs."""
    training = facts.training_loops
    found = []
    steps = [step_loop_of(facts, inner) for inner in training]
    around_training = {id(step.parent) for step in steps if step.parent is not None}
    training_ids = {id(inner) for inner in training}
    for loop in facts.records.loops:
        if not isinstance(loop.node, cst.For) or not loop.targets:
            continue
        # The nearest loop around the training loop; an outer one (over runs, folds) is not
        # an epoch loop.
        encloses = id(loop) in around_training
        calls_training = any(
            calls_training_function(facts, call.node) for call in facts.calls_directly_in(loop)
        )
        full_batch = id(loop) in training_ids and any(
            "epoch" in name.lower() for name in loop.targets
        )
        if encloses or calls_training or full_batch:
            found.append(loop)
    return found


def calls_training_function(facts: "ScriptFacts", call: cst.Call) -> bool:
    """`call` runs a function or method of this file that reaches backward: `train(...)`, or
    `trainer.fit(...)` where a method `fit` of a class of the file does. Not a call on an
    imported module or object (yolov5's `validate.run(...)`, `from classify import val as
    validate`, beside its own `def run`), nor a method call that only a module-level function
    of the file is named like (`callbacks.run(...)`)."""
    name = callee_name(call)
    if name not in facts.functions_reaching_backward:
        return False
    if isinstance(call.func, cst.Name):
        return True
    receiver = dotted_name(call.func.value) if isinstance(call.func, cst.Attribute) else None
    if receiver is not None and facts.imports.target_of(receiver.split(".")[0]) is not None:
        return False
    return name in _method_names(facts)


def _method_names(facts: "ScriptFacts") -> Set[str]:
    memo = facts.memo("method_names")
    if None not in memo:
        memo[None] = {
            statement.name.value
            for info in facts.classes.values()
            for statement in info.node.body.body
            if isinstance(statement, cst.FunctionDef)
        }
    return memo[None]


def step_loops(facts: "ScriptFacts") -> List[Loop]:
    """Loops that run one optimizer step per iteration: each training loop, except that a
    micro-step loop (gradient accumulation: backward in an inner loop with no `.step()` in
    it, and the `.step()` right in the body of the loop around it, in the same function)
    gives way to the loop around it."""
    found: List[Loop] = []
    for loop in facts.training_loops:
        step = step_loop_of(facts, loop)
        if step not in found:
            found.append(step)
    return found


def step_loop_of(facts: "ScriptFacts", loop: Loop) -> Loop:
    """The loop that runs one optimizer step per iteration for the training loop `loop`:
    itself, or the loop around it when it is a micro-step loop (see step_loops)."""
    memo = facts.memo("step_loop_of")
    if id(loop) not in memo:
        outer = loop.parent
        micro = (
            outer is not None
            and outer.function is loop.function
            and not any(call.method == "step" for call in facts.loop_calls(loop))
            and any(call.method == "step" for call in facts.calls_directly_in(outer))
        )
        memo[id(loop)] = outer if micro else loop
    return memo[id(loop)]


def stranded_blocks(facts: "ScriptFacts") -> List[StrandedBlock]:
    found = []
    for loop in epoch_loops(facts):
        block = _stranded_after(facts, loop)
        if block is not None:
            found.append(block)
    return found


def containing_body(root: cst.CSTNode, statement: cst.BaseStatement) -> Optional[Body]:
    """The module or indented block that holds `statement` directly."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Module, cst.IndentedBlock)) and any(
            s is statement for s in node.body
        ):
            return node
        stack.extend(children(node))
    return None


def statement_bodies(facts: "ScriptFacts") -> List[Body]:
    """The module and every indented block of it, found once per pass."""
    memo = facts.memo("statement_bodies")
    if None not in memo:
        memo[None] = find_all(facts.module, cst.IndentedBlock, cst.Module)
    return memo[None]


def body_holding(facts: "ScriptFacts", statement: cst.BaseStatement) -> Optional[Body]:
    """containing_body(facts.module, statement), from a table of every statement's body built
    once per pass: asked per epoch loop, a walk of the module each time was quadratic."""
    memo = facts.memo("bodies_by_statement")
    if None not in memo:
        memo[None] = {id(held): body for body in statement_bodies(facts) for held in body.body}
    return memo[None].get(id(statement))


def _stranded_after(facts: "ScriptFacts", loop: Loop) -> Optional[StrandedBlock]:
    node = loop.node
    if not isinstance(node.body, cst.IndentedBlock) or node.asynchronous is not None:
        return None  # `for epoch in ...: train()` on one line; `async for`
    if node.orelse is not None or _breaks_out(node.body):
        return None  # `for ... else` and early stopping: what follows is meant to follow
    body = body_holding(facts, node)
    if body is None:
        return None
    statements = list(body.body)
    after = statements[statements.index(node) + 1 :]
    candidates: List[cst.BaseStatement] = []
    for statement in after:
        if _has_cell_marker(statement) or not _movable(statement):
            break  # another notebook cell, or code whose meaning a loop body would change
        candidates.append(statement)
    epoch_names = _epoch_names(facts, loop)
    variables = set(epoch_names)
    last_use, variable = -1, ""
    for index, statement in enumerate(candidates):
        reads, binds = _reads_and_binds(statement)
        # A name the statement binds itself (`for _ in range(3):` starting a second phase)
        # is read from that binding, not from the epoch loop; from then on it is not the
        # loop's any more.
        used = (reads - binds) & variables
        # What the statement computes from the loop variable is the loop's too (`log =
        # {"epoch": epoch}`, then `accelerator.log(log)`): the block ends after its use, or a
        # second pass would find the rest stranded after the moved part.
        variables = (variables - binds) | (binds if used else set())
        if used:
            last_use, variable = index, variable or sorted(used)[0]
    block = tuple(candidates[: last_use + 1])
    if not block or not any(_is_action(facts, s) for s in block):
        return None
    problem = (
        _eval_mode_problem(facts, loop, block)
        or _rebinding_problem(node.body, block)
        or _epoch_end_problem(facts, node.body, epoch_names)
    )
    if _breaks_out(node.body, cst.Continue):
        problem = "the loop's `continue` would skip it in some epochs"
    repeated = _runs_in_body(facts.module, node.body, block)
    repeats_call = _action_call_made_in_body(facts, node.body, block)
    last = _last_iteration_test(facts, loop, block)
    final = _final_marker(block)
    summary = _summarises_what_body_reports(facts, node.body, block)
    enclosing = _enclosing_loop_owning(facts, loop, block)
    header, evidence = enclosing if enclosing is not None else (None, None)
    return StrandedBlock(
        loop,
        block,
        variable,
        problem,
        repeated,
        repeats_call,
        summary,
        last,
        final,
        enclosing_header=header,
        enclosing_evidence=evidence,
    )


def _enclosing_loop_owning(
    facts: "ScriptFacts", loop: Loop, block: Sequence[cst.BaseStatement]
) -> Optional[Tuple[str, str]]:
    """When `loop` sits in another loop of the same function whose iterations `block`
    belongs to, that loop's header and the evidence: the block reads that loop's variable
    (or a name computed from it outside `loop`), that loop's variable names epochs and this
    one's does not, or this loop iterates batches (a DataLoader, `train_loader`, `for batch
    in ...`), which makes it the step loop of the loop around it. After `loop`, in that
    loop's body, the block already runs once per outer iteration: it is not stranded."""
    enclosing = [outer for outer in loop.ancestors if outer.function is loop.function]
    if not enclosing:
        return None
    inner_names = set(loop.targets) | {a.target for a in facts.assignments_in(loop)}
    read: Set[str] = set()
    bound: Set[str] = set()
    for statement in block:
        reads, binds = _reads_and_binds(statement)
        read |= reads - binds - bound
        bound |= binds
    for outer in enclosing:
        outer_names = _epoch_names(facts, outer, skip=loop) - inner_names
        if read & outer_names:
            name = sorted(read & outer_names)[0]
            if name in _loop_variables(facts, outer):
                return _header(outer), f"the block reads `{name}`, the outer loop's variable"
            return (
                _header(outer),
                f"the block reads `{name}`, which the outer loop computes from its variable",
            )
    if not _names_epochs(loop.targets):
        for outer in enclosing:
            if _names_epochs(outer.targets):
                names = ", ".join(outer.targets)
                return _header(outer), f"the outer loop's `{names}` names it the epoch loop"
    batches = _batches_iterated(facts, loop)
    if batches is not None:
        return (
            _header(enclosing[0]),
            f"the inner loop, over batches (`{batches}`), is the outer loop's step loop",
        )
    return None


def _names_epochs(names: Sequence[str]) -> bool:
    return any("epoch" in name.lower() for name in names)


def _batches_iterated(facts: "ScriptFacts", loop: Loop) -> Optional[str]:
    """What `loop` iterates when it goes over batches: a DataLoader, an iterable named like
    one (`train_loader`, `batches`), or with a variable named like one (`batch`,
    `batch_idx`)."""
    if not isinstance(loop.node, cst.For):
        return None
    iterated = facts.iterated_name(loop.iter)
    if facts.loader_of(loop) is not None or _names_batches(iterated or ""):
        return iterated or excerpt(loop.node.iter)
    if any(_names_batches(target) for target in loop.targets):
        return excerpt(loop.node.target)
    return None


def _names_batches(name: str) -> bool:
    words = name.rsplit(".", 1)[-1].lower().split("_")
    return any("batch" in word or "loader" in word for word in words)


def _header(loop: Loop) -> str:
    node = loop.node
    if isinstance(node, cst.For):
        return f"for {excerpt(node.target)} in {excerpt(node.iter)}"
    return f"while {excerpt(node.test)}"


def _epoch_end_problem(
    facts: "ScriptFacts", body: cst.IndentedBlock, variables: Set[str]
) -> Optional[str]:
    """The loop's body already ends its epochs with work of its own on the loop variable (a
    checkpoint named after the epoch, a per-epoch log), after its last inner loop: the author
    knew where an epoch ends, so what follows the loop reads as written for after training
    (Hugging Face's run_qa_no_trainer.py saves `epoch_{epoch}` in the loop and evaluates
    once after it, labelling the log with the last `epoch`)."""
    statements = list(body.body)
    loops = [i for i, s in enumerate(statements) if isinstance(s, (cst.For, cst.While))]
    for statement in statements[loops[-1] + 1 if loops else 0 :]:
        reads = _reads_and_binds(statement)[0]
        if reads & variables:
            for call in _action_calls(facts, statement):
                return (
                    "the loop's body already ends each epoch with its own work on "
                    f"`{sorted(reads & variables)[0]}` (`{excerpt(call)}`), so the code after "
                    "the loop reads as written for after training; indent it by hand if it is "
                    "meant to run every epoch"
                )
    return None


# Callee words of a call that only shows values.
_REPORTING_WORDS = frozenset({"print", "log", "info", "scalar", "scalars", "write"})


def _reporting_calls(tree: cst.CSTNode) -> List[cst.Call]:
    return [call for call in find_all(tree, cst.Call) if _named_with(call, _REPORTING_WORDS)]


def _argument_reads(call: cst.Call) -> Set[str]:
    """The names the call's arguments read."""
    return {name for arg in call.args for name in _reads_and_binds(arg.value)[0]}


def _summarises_what_body_reports(
    facts: "ScriptFacts", body: cst.IndentedBlock, block: Sequence[cst.BaseStatement]
) -> bool:
    """Every statement of `block` is a call that prints or logs, and every name its
    arguments read is also read by a printing or logging call of the loop body."""
    shown = {name for call in _reporting_calls(body) for name in _argument_reads(call)}
    for statement in block:
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if not (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and isinstance(small, cst.Expr)
            and isinstance(small.value, cst.Call)
            and _reporting_calls(small.value) == [small.value]
        ):
            return False
        read = _argument_reads(small.value)
        if not read or not read <= shown:
            return False
    return True


# How a block says it is written for after training: the word "final" in a name, a keyword,
# a string or a comment (diffusers' `log_validation(..., is_final_validation=True)` under
# "# Final inference"), or a phrase such as "End of training" (its hub upload's message).
_FINAL_WORD = "final"
_AFTER_TRAINING = re.compile(
    r"\b(?:end of training|after training|training (?:is )?(?:done|finished|complete[d]?))\b",
    re.IGNORECASE,
)
_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


def _final_marker(block: Sequence[cst.BaseStatement]) -> Optional[cst.CSTNode]:
    """The first keyword argument, name, string or comment of `block` that calls it final."""
    for statement in block:
        for node in find_all(statement, cst.Arg, cst.Name, cst.SimpleString, cst.Comment):
            if isinstance(node, cst.Arg):
                text = node.keyword.value if node.keyword is not None else ""
            else:
                text = node.value
            words = {word.lower() for word in _WORDS.findall(text)}
            if _FINAL_WORD in words or _AFTER_TRAINING.search(text):
                return node
    return None


def _rebinding_problem(
    body: cst.IndentedBlock, block: Sequence[cst.BaseStatement]
) -> Optional[str]:
    """Moved to the end of the loop body, a block that binds a name the body reads before
    binding it would hand the next epoch its value: diffusers' `unet = unwrap_model(unet)`
    and `unet = unet.to(torch.float32)` before the final save would train on."""
    bound: Set[str] = set()
    for statement in block:
        bound |= _reads_and_binds(statement)[1]
    for name in sorted(bound):
        if not is_throwaway(name) and _first_use(body.body, name) == _READ:
            return (
                f"it binds `{name}`, which the loop reads before binding it: moved, the next "
                f"epoch would run with the block's `{name}`"
            )
    return None


_READ, _BOUND = "read", "bound"


def _first_use(statements: Sequence[cst.CSTNode], name: str) -> Optional[str]:
    """Whether `statements`, run in order, read `name` before they surely bind it (_READ),
    surely bind it first (_BOUND), or neither (None). A binding in one branch of an `if`, or
    in a `try`, may not run, so it is not sure; one in a loop's body counts as sure (the
    batch loop of an epoch runs: `loss` bound there and printed after it is the epoch's)."""
    for statement in statements:
        use = _statement_use(statement, name)
        if use is not None:
            return use
    return None


def _statement_use(statement: cst.CSTNode, name: str) -> Optional[str]:
    if isinstance(statement, cst.SimpleStatementLine):
        return _first_use(statement.body, name)
    if isinstance(statement, cst.BaseSmallStatement):
        reads, binds = _reads_and_binds(_without_comprehensions_of(statement, name))
        if name in reads or (isinstance(statement, cst.AugAssign) and name in binds):
            return _READ
        return _BOUND if name in binds else None
    if isinstance(statement, cst.If):
        if name in _reads_and_binds(statement.test)[0]:
            return _READ
        branches = [_first_use(statement.body.body, name)]
        orelse = statement.orelse
        branches.append(None if orelse is None else _statement_use_of_else(orelse, name))
        if _READ in branches:
            return _READ
        return _BOUND if all(b == _BOUND for b in branches) else None
    if isinstance(statement, (cst.For, cst.While)):
        header = statement.iter if isinstance(statement, cst.For) else statement.test
        if name in _reads_and_binds(header)[0]:
            return _READ
        targets = target_name_nodes(statement.target) if isinstance(statement, cst.For) else []
        if any(target.value == name for target in targets):
            return None  # the body reads the loop's own binding
        return _first_use(statement.body.body, name)
    if isinstance(statement, cst.With):
        if any(name in _reads_and_binds(item.item)[0] for item in statement.items):
            return _READ
        return _first_use(statement.body.body, name)
    reads = _reads_and_binds(statement)[0]
    return _READ if name in reads else None  # try, match, definitions: reads count, binds not


_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def _without_comprehensions_of(statement: cst.CSTNode, name: str) -> cst.CSTNode:
    """`statement` less the comprehensions that bind `name`: in their own scope, their
    `for i in ...` neither reads nor binds the statement's `i`."""
    if not find_all(statement, *_COMPREHENSIONS):
        return statement
    return statement.visit(_ComprehensionsOf(name))


class _ComprehensionsOf(cst.CSTTransformer):
    """Replaces each comprehension that binds `name` with `None`."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def leave_ListComp(self, original_node, updated_node):
        binds = set()
        for_in = updated_node.for_in
        while for_in is not None:
            binds.update(n.value for n in target_name_nodes(for_in.target))
            for_in = for_in.inner_for_in
        return cst.Name("None") if self.name in binds else updated_node

    leave_SetComp = leave_DictComp = leave_GeneratorExp = leave_ListComp


def _statement_use_of_else(orelse: Union[cst.If, cst.Else], name: str) -> Optional[str]:
    if isinstance(orelse, cst.If):  # elif
        return _statement_use(orelse, name)
    return _first_use(orelse.body.body, name)


def _last_iteration_test(
    facts: "ScriptFacts", loop: Loop, block: Sequence[cst.BaseStatement]
) -> Optional[str]:
    """The test every statement of `block` runs under, when it holds only at the loop's last
    iteration: an equality with a loop variable (`epoch == epochs - 1`), or a name the loop
    body binds to one (yolov5's `final_epoch = epoch + 1 == epochs`, then `if RANK in {-1, 0}
    and final_epoch:` after the loop). Such a block was written for after training; inside
    the loop it would run at the same point, so there is nothing to move."""
    targets = set(loop.targets)
    flags = {
        assignment.target
        for assignment in facts.assignments_in(loop)
        if not assignment.augmented and _equality_with(assignment.value, targets)
    }
    tests = []
    for statement in block:
        if not isinstance(statement, cst.If) or statement.orelse is not None:
            return None
        test = statement.test
        if not (_equality_with(test, targets) or _reads_and_binds(test)[0] & flags):
            return None
        tests.append(" ".join(facts.module.code_for_node(test).split()))
    return tests[0] if tests else None


def _equality_with(tree: cst.CSTNode, names: Set[str]) -> bool:
    """`tree` holds an `==` comparison that reads one of `names`."""
    return any(
        any(isinstance(target.operator, cst.Equal) for target in comparison.comparisons)
        and _reads_and_binds(comparison)[0] & names
        for comparison in find_all(tree, cst.Comparison)
    )


def _runs_in_body(
    module: cst.Module, body: cst.IndentedBlock, block: Sequence[cst.BaseStatement]
) -> bool:
    """Each statement of `block` is also a statement of `body` (same code, comments aside)."""
    inside = {_bare_code(module, statement) for statement in body.body}
    return all(_bare_code(module, statement) in inside for statement in block)


def _action_call_made_in_body(
    facts: "ScriptFacts", body: cst.IndentedBlock, block: Sequence[cst.BaseStatement]
) -> Optional[str]:
    """The code of the block's last validation or saving call (its main work, after what it
    logs) when the loop body makes every one of them too, at any depth
    (`if step % save_interval == 0: save_model(step)`)."""
    inside = {_call_code(facts.module, call) for call in _action_calls(facts, body)}
    made = [_call_code(facts.module, call) for s in block for call in _action_calls(facts, s)]
    return made[-1] if made and all(code in inside for code in made) else None


def _call_code(module: cst.Module, call: cst.Call) -> str:
    return " ".join(module.code_for_node(call).split())


def _bare_code(module: cst.Module, statement: cst.BaseStatement) -> str:
    """The statement's code without its comments and surrounding blank lines."""
    if isinstance(statement, cst.SimpleStatementLine):
        return "; ".join(module.code_for_node(small).strip() for small in statement.body)
    return module.code_for_node(statement.with_changes(leading_lines=())).strip()


def _epoch_names(facts: "ScriptFacts", loop: Loop, skip: Optional[Loop] = None) -> Set[str]:
    """The loop's variables and the names its body computes from them (`step = epoch * n`),
    except in the nested loop `skip`; throwaway names (`_`, `__`, `_unused`) are never
    evidence."""
    names = _loop_variables(facts, loop)
    inside = [
        a
        for a in facts.assignments_in(loop)
        if not a.augmented and "." not in a.target and (skip is None or skip not in a.site.loops)
    ]
    changed = True
    while changed:
        changed = False
        for assignment in inside:
            if assignment.target in names or is_throwaway(assignment.target):
                continue
            if _reads_and_binds(assignment.value)[0] & names:
                names.add(assignment.target)
                changed = True
    return names


def _loop_variables(facts: "ScriptFacts", loop: Loop) -> Set[str]:
    """A `for` loop's targets; a `while` loop's counters, the names its test reads and its
    body binds (`while epoch < epochs:` with `epoch += 1`). Throwaway names are left out."""
    if isinstance(loop.node, cst.While):
        tested = _reads_and_binds(loop.node.test)[0]
        names = {a.target for a in facts.assignments_in(loop) if a.target in tested}
    else:
        names = set(loop.targets)
    return {name for name in names if not is_throwaway(name)}


def is_throwaway(name: str) -> bool:
    """`_`, `__`, `_unused`, `dummy`: a name bound only to be ignored."""
    bare = name.strip("_")
    return not bare or bare.startswith(("unused", "dummy", "ignore"))


def _reads_and_binds(tree: cst.CSTNode) -> Tuple[Set[str], Set[str]]:
    """(plain names `tree` reads, names it binds). Attribute names (`x.epoch`), keyword
    names and binding targets (`for _ in`, `x = ...`, `with ... as f`, `except E as e`,
    imports, definitions) are not reads; `x += 1` binds `x` (its read is not counted)."""
    reads: Set[str] = set()
    binds: Set[str] = set()
    stores: Set[cst.CSTNode] = set()
    stack: List[cst.CSTNode] = [tree]
    while stack:
        node = stack.pop()
        for target in binding_targets(node):
            for name in target_name_nodes(target):
                stores.add(name)
                binds.add(name.value)
        if isinstance(node, cst.Name):
            if node not in stores:
                reads.add(node.value)
        elif isinstance(node, cst.Attribute):
            stack.append(node.value)
        elif isinstance(node, cst.Arg):
            stack.append(node.value)
        elif isinstance(node, (cst.Import, cst.ImportFrom)):
            names = node.names if isinstance(node.names, (list, tuple)) else ()
            for alias in names:
                bound = alias.asname.name if alias.asname is not None else alias.name
                binds.add((dotted_name(bound) or "").split(".")[0])
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            binds.add(node.name.value)
            stack.extend(c for c in children(node) if c is not node.name)
        else:
            stack.extend(children(node))
    return reads, binds


def _breaks_out(block: cst.BaseSuite, kind: type = cst.Break) -> bool:
    """A `break` (or `continue`) of the loop's own (not of an inner loop or nested function)."""
    stack: List[cst.CSTNode] = [block]
    while stack:
        node = stack.pop()
        if isinstance(node, kind):
            return True
        if isinstance(node, _LOOPS):
            if node.orelse is not None:
                stack.append(node.orelse)  # an inner loop's `else` belongs to the outer one
            continue
        if isinstance(node, _SCOPES):
            continue
        stack.extend(children(node))
    return False


def _movable(statement: cst.BaseStatement) -> bool:
    """Code that means the same at the end of a loop body: no control flow leaving it, no
    definitions, no scope declarations."""
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return False
    stack: List[cst.CSTNode] = [statement]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Return, cst.Global, cst.Nonlocal, cst.Yield, cst.Await)):
            return False
        if isinstance(node, (cst.Break, cst.Continue)):
            return False
        if isinstance(node, _LOOPS):
            # break/continue inside an inner loop are that loop's own.
            stack.extend(
                n for n in find_all(node.body, cst.Return, cst.Yield, cst.Global, cst.Nonlocal)
            )
            if node.orelse is not None:
                stack.append(node.orelse)
            stack.extend(c for c in children(node) if c is not node.body and c is not node.orelse)
            continue
        if isinstance(node, cst.Lambda):
            continue
        stack.extend(children(node))
    return True


def _has_cell_marker(statement: cst.BaseStatement) -> bool:
    lines = getattr(statement, "leading_lines", ())
    return any(line.comment is not None and CELL_MARKER in line.comment.value for line in lines)


def _is_action(facts: "ScriptFacts", statement: cst.BaseStatement) -> bool:
    return bool(_action_calls(facts, statement))


def _action_calls(facts: "ScriptFacts", tree: cst.CSTNode) -> List[cst.Call]:
    """Calls in `tree` that validate, evaluate, log or save (see ACTION_WORDS)."""
    return [
        call
        for call in find_all(tree, cst.Call)
        if facts.qualified_name(call.func) == "torch.save" or _named_with(call, ACTION_WORDS)
    ]


def _named_with(call: cst.Call, words: frozenset) -> bool:
    """The callee's name holds one of `words` between underscores (`log_validation`)."""
    return bool(set((callee_name(call) or "").lower().split("_")) & words)


def _eval_mode_problem(
    facts: "ScriptFacts", loop: Loop, block: Sequence[cst.BaseStatement]
) -> Optional[str]:
    """`model.eval()` moved into the loop leaves the next epoch in eval mode unless the loop
    switches back (`model.train()` in the loop, or in a function of this file it calls)."""
    switched_back = {c.receiver for c in facts.loop_calls(loop) if c.method == "train"}
    own = set(facts.records.functions)
    called = {callee_name(c.node) for c in facts.loop_calls(loop)} & own
    trains_inside = any(
        c.method == "train" and c.site.function is not None
        for c in facts.records.calls
        if c.site.function is not None and c.site.function.name.value in called
    )
    evaluating = {  # functions of this file that switch a module to eval mode
        c.site.function.name.value: c
        for c in facts.records.calls
        if c.method == "eval" and not c.node.args and c.site.function is not None
    }
    for statement in block:
        for call in find_all(statement, cst.Call):
            if callee_name(call) in evaluating and not isinstance(call.func, cst.Attribute):
                call = evaluating[callee_name(call)].node
            if not isinstance(call.func, cst.Attribute) or call.func.attr.value != "eval":
                continue
            receiver = dotted_name(call.func.value)
            if receiver not in switched_back and not trains_inside:
                return (
                    f"`{receiver or 'model'}.eval()` would stay in effect for the next epoch's "
                    f"training: call `{receiver or 'model'}.train()` at the start of the loop"
                )
    return None


def once_per_pass(facts: "ScriptFacts", loop: Loop) -> Set[int]:
    """ids of the calls in `loop`'s body that run on one iteration of each pass only: under
    an `if` whose test asks the loop's counter for one value (`batch_idx == 0`, also as a
    conjunct: `(epoch + 1) % every == 0 and batch_idx == 0`, pytorch-GAT's checkpoint)."""
    memo = facts.memo("once_per_pass")
    if id(loop.node) not in memo:
        found: Set[int] = set()
        counters = set(loop.targets)
        for branch in find_all(loop.node.body, cst.If):
            if _asks_counter_for_one_value(branch.test, counters):
                found.update(id(call) for call in find_all(branch.body, cst.Call))
        memo[id(loop.node)] = found
    return memo[id(loop.node)]


def _asks_counter_for_one_value(test: cst.BaseExpression, counters: Set[str]) -> bool:
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _asks_counter_for_one_value(test.left, counters) or _asks_counter_for_one_value(
            test.right, counters
        )
    return (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Equal)
        and isinstance(test.left, cst.Name)
        and test.left.value in counters
        and isinstance(test.comparisons[0].comparator, cst.Integer)
    )

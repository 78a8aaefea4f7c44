"""Runs that can only go on with CUDA: what a script did before a loop that only CUDA allows.

`torch.cuda.set_device(0)` raises where torch has no CUDA, `init_process_group("nccl")`
raises where torch has no NCCL (which it has only with CUDA), and
`assert torch.cuda.is_available()` stops a run without a GPU. A loop that every run reaches
only after one of these runs with a CUDA build of torch, and torch is built for CUDA or for
MPS (macOS), never both: there, a device the analysis cannot see (an argument, a config
value, an index of the current accelerator) is CUDA or the CPU, never MPS.

Only what runs on every path to the loop counts: a statement at the top level of the body
of the function that holds the loop, before it; at the top level of a function called
there (by name, defined once in the file, undecorated, not a generator, with no `return`
before it); at the top level of the module (its main guard too) before the loop; at the top
level of `__init__` for a method of its class; or, for a function whose every call in the
file comes after such a statement (and which the file uses no other way, and no other file
of the run imports), before its entry. Nothing under an `if`, a loop, a `try` or a `with` (a
context manager may swallow the error), nor after the loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import argument, excerpt, literal, positional
from optimizer_codemod.analysis.collect import Loop, is_main_guard
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.values import (
    attribute_mentions,
    calls_named,
    local_function,
    method_class,
    name_mentions,
    parameter_names,
    standalone_class,
)

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.collect import CallSite
    from optimizer_codemod.analysis.script import ScriptFacts

SET_DEVICE = "torch.cuda.set_device"
INIT_PROCESS_GROUP = frozenset(
    {
        "torch.distributed.init_process_group",
        "torch.distributed.distributed_c10d.init_process_group",
    }
)
CUDA_AVAILABLE = "torch.cuda.is_available"
MAX_DEPTH = 4
# Callers followed from a loop's function towards the code that requires CUDA: real scripts
# need a few (`main` -> `Trainer.train` -> `_run_epoch`); the bound keeps the recursion far
# from Python's limit in a generated chain of hundreds of functions.
MAX_CALLERS = 30
# (visit order of the call, index of the module statement it is in, what it is, in words)
Requirement = Tuple[int, int, str]


def cuda_required_before(facts: "ScriptFacts", loop: Loop) -> Optional[str]:
    """What makes every run that reaches `loop` one with CUDA, in words (`torch.cuda.set_device(
    rank)` in `ddp_setup()`); None when the analysis sees nothing that does."""
    memo = facts.memo("cuda_required_before")
    if id(loop) not in memo:
        function = loop.function
        found = _required_at(facts, function, loop.start)
        if found is not None and function is not None and not _before(facts, function, loop):
            found = f"{found} before every call of `{function.name.value}`"
        memo[id(loop)] = found
    return memo[id(loop)]


def _before(facts: "ScriptFacts", function: cst.FunctionDef, loop: Loop) -> bool:
    return any(r[0] < loop.start for r in _requirements(facts, function))


def _required_at(
    facts: "ScriptFacts", function: Optional[cst.FunctionDef], order: int, depth: int = 0
) -> Optional[str]:
    """What requires CUDA before the node of visit order `order` in `function` (None: the
    module's own code) is reached."""
    earlier = [r for r in _requirements(facts, function) if r[0] < order]
    if earlier:
        return earlier[0][2]
    if function is None or depth > MAX_CALLERS:
        return None
    return _required_on_entry(facts, function, depth)


def _requirements(facts: "ScriptFacts", scope: Optional[cst.FunctionDef]) -> List[Requirement]:
    """The statements at the top level of `scope`'s body (the module's, with its main
    guard's) that raise without CUDA, in source order."""
    memo = facts.memo("cuda_requirements")
    key = id(scope)
    if key in memo:
        return memo[key] or []
    memo[key] = None  # a function that reaches itself requires nothing through itself
    found: List[Requirement] = []
    for index, statement in _body(facts, scope):
        if not isinstance(statement, cst.SimpleStatementLine):
            nested = isinstance(statement, (cst.FunctionDef, cst.ClassDef))
            if scope is not None and not nested and find_all(statement, cst.Return):
                break  # it may return before anything below runs
            continue
        for small in statement.body:
            if isinstance(small, cst.Return):
                memo[key] = found
                return found
            what = _requirement(facts, small)
            if what is not None:
                call, words = what
                found.append((facts.call_site_of[call].site.order, index, words))
    memo[key] = found
    return found


def _body(
    facts: "ScriptFacts", scope: Optional[cst.FunctionDef]
) -> List[Tuple[int, cst.BaseStatement]]:
    """The statements of `scope`'s body, each with the index of the module statement it is
    in; the module's main guard counts as the module's body."""
    if scope is not None:
        block = scope.body
        return [(0, s) for s in block.body] if isinstance(block, cst.IndentedBlock) else []
    found: List[Tuple[int, cst.BaseStatement]] = []
    for index, statement in enumerate(facts.module.body):
        if isinstance(statement, cst.If) and is_main_guard(statement):
            block = statement.body
            if isinstance(block, cst.IndentedBlock):
                found.extend((index, s) for s in block.body)
        else:
            found.append((index, statement))
    return found


def _requirement(
    facts: "ScriptFacts", small: cst.BaseSmallStatement
) -> Optional[Tuple[cst.Call, str]]:
    """The call of `small` that raises without CUDA, and what it is in words."""
    if isinstance(small, cst.Assert):
        test = small.test
        if (
            isinstance(test, cst.Call)
            and not test.args
            and facts.qualified_name(test.func) == CUDA_AVAILABLE
        ):
            return test, f"`{excerpt(small)}`"
        return None
    value = getattr(small, "value", None)
    if not isinstance(small, (cst.Expr, cst.Assign, cst.AnnAssign)) or not isinstance(
        value, cst.Call
    ):
        return None
    qualname = facts.qualified_name(value.func)
    if qualname == SET_DEVICE:
        device = positional(value)[0].value if len(positional(value)) == 1 else None
        site = facts.call_site_of[value]
        if device is not None and _never_negative(facts, device, site.site.function, 0):
            return value, f"`{excerpt(value)}`"
        return None  # a negative index makes it do nothing
    if qualname in INIT_PROCESS_GROUP:
        backend = argument(value, "backend", 0)
        found = literal(backend.value, None) if backend is not None else None
        if isinstance(found, str) and found.lower() == "nccl":
            return value, f"`{excerpt(value)}`"
        return None
    function = local_function(facts, facts.call_site_of[value])
    if function is None or not _runs_when_called(facts, function):
        return None
    inner = _requirements(facts, function)
    if not inner:
        return None
    return value, f"`{excerpt(value)}` (which runs {inner[0][2]})"


def _runs_when_called(facts: "ScriptFacts", function: cst.FunctionDef) -> bool:
    """Calling `function` runs its body there and then: no decorator may change that, it is
    no coroutine and no generator."""
    if function.decorators or function.asynchronous is not None:
        return False
    memo = facts.memo("runs_when_called")
    if id(function) not in memo:
        memo[id(function)] = not find_all(function.body, cst.Yield)
    return memo[id(function)]


def _never_negative(
    facts: "ScriptFacts",
    node: cst.BaseExpression,
    function: Optional[cst.FunctionDef],
    depth: int,
) -> bool:
    """`node` is a device or an index of one that is not negative: an int or string literal,
    `torch.device(...)`, `int(os.environ["LOCAL_RANK"])` (launchers set it to a rank),
    `rank % torch.cuda.device_count()`, or a name bound only to those.
    (`torch.cuda.set_device(-1)` does nothing, and `--local_rank` often defaults to -1.)"""
    if isinstance(node, (cst.Integer, cst.SimpleString, cst.FormattedString)):
        return True
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
        divisor = node.right
        return isinstance(divisor, cst.Integer) or (
            isinstance(divisor, cst.Call)
            and facts.qualified_name(divisor.func) == "torch.cuda.device_count"
        )
    if isinstance(node, cst.Call):
        qualname = facts.qualified_name(node.func)
        if qualname == "torch.device":
            return True
        args = positional(node)
        return (
            dotted_name(node.func) == "int"
            and len(node.args) == len(args) == 1
            and _environment_variable(facts, args[0].value)
        )
    name = dotted_name(node)
    if name is None or depth >= MAX_DEPTH or name in parameter_names(function):
        return False
    bound = facts.assignments_to(name)
    return bool(bound) and all(
        not a.unpacked
        and not a.augmented
        and _never_negative(facts, a.value, a.site.function, depth + 1)
        for a in bound
    )


def _environment_variable(facts: "ScriptFacts", node: cst.BaseExpression) -> bool:
    """`os.environ["X"]`, `os.environ.get("X")` or `os.getenv("X")`: with no default, a
    variable that is not set raises rather than giving a negative index."""
    if isinstance(node, cst.Subscript):
        return facts.qualified_name(node.value) == "os.environ"
    if isinstance(node, cst.Call) and len(node.args) == 1:
        return facts.qualified_name(node.func) in ("os.environ.get", "os.getenv")
    return False


def _required_on_entry(
    facts: "ScriptFacts", function: cst.FunctionDef, depth: int
) -> Optional[str]:
    """What requires CUDA before `function` is entered: a requirement at the top of the
    module before its definition (importing the module runs it first), or one before each of
    its calls in the file; for a method, one at the top of its class's `__init__`."""
    memo = facts.memo("cuda_required_on_entry")
    key = id(function)
    if key in memo:
        return memo[key]
    memo[key] = None  # recursion: a function's own calls do not establish anything
    defined_at = _module_statement_index(facts, function)
    before_definition = [
        r
        for r in _requirements(facts, None)
        if defined_at is not None and r[1] < defined_at and not _in_main_guard(facts, r[1])
    ]
    if before_definition:
        memo[key] = before_definition[0][2]
        return memo[key]
    constructed = _required_by_constructor(facts, function)
    if constructed is not None:
        memo[key] = constructed
        return constructed
    callers = _every_caller(facts, function)
    if not callers:
        return None
    found: Optional[str] = None
    for call in callers:
        found = _required_at(facts, call.site.function, call.site.order, depth + 1)
        if found is None:
            return None
    memo[key] = found
    return found


def _required_by_constructor(facts: "ScriptFacts", method: cst.FunctionDef) -> Optional[str]:
    """A requirement at the top of `__init__` of the class of `method`: a method runs on an
    instance, which `__init__` has made. Only for a class that no class of the file derives
    from (a subclass may replace `__init__`) in a file no other file of the run imports."""
    owner = method_class(facts, method)
    project = getattr(facts, "project", None)
    if owner is None or method.decorators or method.name.value == "__init__":
        return None
    if not standalone_class(facts, owner) or (project is not None and project.importers):
        return None
    for statement in facts.classes[owner].node.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == "__init__":
            if statement.decorators:
                return None
            found = _requirements(facts, statement)
            return f"{found[0][2]} in `{owner}.__init__`" if found else None
    return None


def _every_caller(facts: "ScriptFacts", function: cst.FunctionDef) -> Sequence["CallSite"]:
    """Every call in the file that may run `function`, matched by name (a method: any call
    of a method of that name), when the file uses the name no other way and no other module
    of the run imports this one; empty otherwise."""
    name = function.name.value
    records = facts.records
    defined = records.definition_counts.get(name, 0)
    project = getattr(facts, "project", None)
    if function.decorators or (project is not None and project.importers):
        return ()  # other files of the run may call it with no requirement before
    if facts.assignments_to(name):
        return ()
    if method_class(facts, function) is not None:
        calls = facts.method_calls(name)
        if name_mentions(facts).get(name, 0) != defined:
            return ()
        if attribute_mentions(facts).get(name, 0) != len(calls):
            return ()  # `self.fit` passed around: called where the file does not show
        return calls
    if _module_statement_index(facts, function) is None:
        return ()  # nested, or a static method: not followed
    calls = calls_named(facts, name)
    if name_mentions(facts).get(name, 0) != len(calls) + defined or defined != 1:
        return ()  # `mp.spawn(main, ...)`: run where the file does not show
    return calls


def _module_statement_index(facts: "ScriptFacts", function: cst.FunctionDef) -> Optional[int]:
    """The index of the module statement that defines `function`, itself or as a method of
    a class there; None for nested functions."""
    memo = facts.memo("module_statement_index")
    if "table" not in memo:
        table: Dict[int, int] = {}
        for index, statement in enumerate(facts.module.body):
            if isinstance(statement, cst.FunctionDef):
                table[id(statement)] = index
            elif isinstance(statement, cst.ClassDef):
                for inner in statement.body.body:
                    if isinstance(inner, cst.FunctionDef):
                        table[id(inner)] = index
        memo["table"] = table
    return memo["table"].get(id(function))


def _in_main_guard(facts: "ScriptFacts", index: int) -> bool:
    statement = facts.module.body[index]
    return isinstance(statement, cst.If) and is_main_guard(statement)

"""Whether values created inside a block can leave it (and feed code that runs after it).

`torch.inference_mode()` makes every tensor created under it an inference tensor: it can be
read later, but never saved for backward nor modified in place outside inference mode (nor can
a view created under it). Replacing `torch.no_grad()` by it is sound only when nothing created
in the block reaches later code as a tensor. The questions here are answered conservatively:
when the analysis cannot tell, a value escapes.

- Host values: names whose every binding in a scope is a number, a string, `.item()`,
  `.tolist()`, `.numpy()`, `.size()`, `len()`, `float()`... or arithmetic on such names.
- Reads of a name after a block that cannot see the block's binding, because the name is
  bound again first (an earlier statement of the same block, a `for` target).
- Escapes of a block: non-host names read after it, stores into attributes or subscripts,
  returns, in-place updates, and calls that could keep or replace tensors (anything but the
  trained model, functions of known libraries, builtins, pure tensor methods and loggers; a
  function of the project may keep what it is given).
- What callers do with a value a function returns (`result_escape`): followed through the
  names, loops, comprehensions and containers it reaches, it may only be read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Set, Union

import libcst as cst

from optimizer_codemod.analysis.calls import callee_name, code_of, excerpt, method_name
from optimizer_codemod.analysis.collect import target_names
from optimizer_codemod.analysis.devices import HOST_ATTRIBUTES, HOST_BUILTINS, HOST_METHODS
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.inplace import FRESH_METHODS
from optimizer_codemod.analysis.model_calls import (
    LOGGING_METHODS,
    PURE_METHODS,
    SAFE_BUILTINS,
    computing_method_of_trained_classes,
    getter_of_trained_classes,
    is_library_call,
    method_of_trained_class,
    runs_trained_module,
    training_callees,
)
from optimizer_codemod.analysis.nodes import COMPREHENSIONS, STRING_NODES, find_all
from optimizer_codemod.analysis.scopes import name_uses
from optimizer_codemod.analysis.values import (
    ACCELERATOR,
    attribute_mentions,
    built_by,
    calls_named,
    instance_of,
    method_class,
    name_mentions,
    outside_calls,
    parameter_names,
)
from optimizer_codemod.analysis.walk import ancestors, children, parents, type_test

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.collect import Loop
    from optimizer_codemod.analysis.script import ScriptFacts

Scope = Union[cst.Module, cst.FunctionDef]
_NESTED = (cst.FunctionDef, cst.Lambda, cst.ClassDef)
_is_nested = type_test(*_NESTED)
# The nodes host_names reads bindings from.
_HOST_BINDINGS = type_test(
    cst.Assign,
    cst.AugAssign,
    cst.AnnAssign,
    cst.For,
    cst.CompFor,
    cst.AsName,
    cst.NamedExpr,
    cst.Param,
)
KEEPING_METHODS = frozenset({"append", "extend", "insert", "add", "update"})
# Methods of a trained module that neither make nor replace its tensors: mode switches and
# iterators over its parameters (what is done with a parameter is checked where it is done).
MODULE_READS = frozenset({"eval", "train", "parameters", "named_parameters"})
# Calls under which autograd is wanted, or that change what `inference_mode` would freeze.
GRAD_WORDS = ("backward", "enable_grad", "set_grad_enabled", "requires_grad", "autograd")


# Methods of Hugging Face Accelerate's `Accelerator` that gather, reduce or pad tensors across
# processes: they read their inputs and return new tensors (one process: the inputs).
ACCELERATOR_READS = frozenset({"gather", "gather_for_metrics", "reduce", "pad_across_processes"})


def _accelerator_read(facts: "ScriptFacts", call: cst.Call) -> bool:
    """`accelerator.gather_for_metrics(...)` on a name bound only to `Accelerator(...)`."""
    if method_name(call) not in ACCELERATOR_READS or not isinstance(call.func, cst.Attribute):
        return False
    return built_by(facts, call.func.value, {ACCELERATOR})


def _is_inplace(name: Optional[str]) -> bool:
    return bool(name) and name.endswith("_") and not name.endswith("__")


# `.numpy()` makes an ndarray: no tensor, so nothing autograd could save nor inference mode
# could refuse (writing into it writes the storage it shares, as it did under `no_grad`).
HOST_OR_ARRAY_METHODS = HOST_METHODS | frozenset({"numpy"})


def is_host_value(
    node: cst.BaseExpression, host: Set[str], facts: Optional["ScriptFacts"] = None
) -> bool:
    """`node` evaluates to a plain Python value or a NumPy array (never a tensor), given the
    host names; with the file's facts, a call of the `math` module (`log10(1 / mse.item())`)
    is one too."""
    if isinstance(
        node,
        (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.ConcatenatedString),
    ) or isinstance(node, cst.FormattedString):
        return True
    if isinstance(node, cst.Name):
        return node.value in host or node.value in ("True", "False", "None")
    if isinstance(node, cst.Call):
        if method_name(node) in HOST_OR_ARRAY_METHODS:
            return True
        if facts is not None and (facts.qualified_name(node.func) or "").startswith("math."):
            return True  # math functions take and return Python numbers (a tensor raises)
        return isinstance(node.func, cst.Name) and node.func.value in HOST_BUILTINS
    if isinstance(node, cst.BinaryOperation):
        return is_host_value(node.left, host, facts) and is_host_value(node.right, host, facts)
    if isinstance(node, cst.UnaryOperation):
        return is_host_value(node.expression, host, facts)
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(
            not isinstance(e, cst.StarredElement) and is_host_value(e.value, host, facts)
            for e in node.elements
        )
    return False


def host_names(scope: Scope, facts: Optional["ScriptFacts"] = None) -> Set[str]:
    """Names of `scope` whose every binding there is a host value (greatest fixpoint)."""
    bindings: Dict[str, List[Optional[cst.BaseExpression]]] = {}

    def bind(name: str, value: Optional[cst.BaseExpression]) -> None:
        bindings.setdefault(name, []).append(value)

    def bind_target(target: cst.BaseExpression, value: Optional[cst.BaseExpression]) -> None:
        if isinstance(target, cst.Name):
            bind(target.value, value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            values = None
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(
                target.elements
            ):
                values = [e.value for e in value.elements]
            for index, element in enumerate(target.elements):
                inner = element.value
                if isinstance(element, cst.StarredElement) or values is None:
                    for name in target_names(inner):
                        bind(name, None)
                else:
                    bind_target(inner, values[index])

    for node in _scope_nodes(scope):
        if not _HOST_BINDINGS(node):
            continue
        if isinstance(node, cst.Assign):
            for target in node.targets:
                bind_target(target.target, node.value)
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
            bind_target(node.target, node.value)
        elif isinstance(node, (cst.For, cst.CompFor)):
            for name in target_names(node.target):
                bind(name, None)
        elif isinstance(node, cst.AsName):
            for name in target_names(node.name):
                bind(name, None)
        elif isinstance(node, cst.NamedExpr):
            for name in target_names(node.target):
                bind(name, None)
        elif isinstance(node, cst.Param):
            bind(node.name.value, None)
    host = set(bindings)
    changed = True
    while changed:
        changed = False
        for name in list(host):
            if not all(v is not None and is_host_value(v, host, facts) for v in bindings[name]):
                host.discard(name)
                changed = True
    return host


def _scope_nodes(scope: Scope) -> Iterable[cst.CSTNode]:
    """Nodes of `scope` outside nested functions and classes (their parameters included)."""
    stack: List[cst.CSTNode] = [scope]
    while stack:
        node = stack.pop()
        yield node
        for child in children(node):
            if _is_nested(child):
                continue
            stack.append(child)


def _updates_started_in_block(body: cst.CSTNode) -> Set[int]:
    """The `x += ...` of the block (by id) whose name a statement of the block itself set
    (`correct = 0`) before the statement holding the update: every update then happens
    under the block's mode, on a value the block made (a tensor made under `inference_mode`
    may be updated there)."""
    started: Set[str] = set()
    found: Set[int] = set()
    statements = getattr(body, "body", ())
    for statement in statements if isinstance(statements, (list, tuple)) else ():
        for update in find_all(statement, cst.AugAssign):
            if isinstance(update.target, cst.Name) and update.target.value in started:
                found.add(id(update))
        line = statement.body if isinstance(statement, cst.SimpleStatementLine) else ()
        if len(line) == 1 and isinstance(line[0], cst.Assign):
            started.update(
                t.target.value for t in line[0].targets if isinstance(t.target, cst.Name)
            )
    return found


def block_escape(
    facts: "ScriptFacts",
    block: cst.BaseCompoundStatement,
    scope: Scope,
    returns_read: bool = False,
) -> Optional[str]:
    """Why a value created in `block` may reach code after it as a tensor; None when none can.
    With `returns_read`, what a function returns is known to be only read by its callers.

    Also refuses blocks that want autograd (backward, `enable_grad`, `requires_grad`) or update
    anything in place (`x.add_(...)`, `p += ...` on a non-host name, `optimizer.step()`).
    A `for` loop is taken whole (its target and iterable too): the block a fix would put
    around it.
    """
    body = block if isinstance(block, cst.For) else block.body
    text = code_of(body)
    for word in GRAD_WORDS:
        if word in text:
            return f"the block uses `{word}`"
    inside = set(find_all(body))
    host = _scope_host_names(facts, scope)
    bound_inside: Set[str] = set()
    for node in find_all(
        body, cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.AsName
    ):
        target = node.name if isinstance(node, cst.AsName) else node.target
        for name in find_all(target, cst.Name):
            if isinstance(target, (cst.Attribute, cst.Subscript)):
                continue
            bound_inside.add(name.value)
    runs_model = False
    trained = training_callees(facts)
    if isinstance(scope, cst.FunctionDef) and method_of_trained_class(facts, scope):
        trained = trained | {"self"}  # `self(idx)` in `GPT.generate`: the model's forward
    for node in find_all(body, cst.Call):
        method = method_name(node)
        func_name = method or (node.func.value if isinstance(node.func, cst.Name) else None)
        if _is_inplace(func_name) or method == "step":
            return f"`{_short(node)}` updates a tensor in place"
        function = scope if isinstance(scope, cst.FunctionDef) else None
        if runs_trained_module(facts, node.func, function, trained):
            runs_model = True
            continue
        if method is not None and code_of(node.func.value).strip() in trained:
            if method in MODULE_READS or getter_of_trained_classes(facts, method):
                continue
            if computing_method_of_trained_classes(facts, method):
                runs_model = True  # `model.decode(z)`: part of the model, as its forward is
                continue
            # `model.to(device)`, `model.load_state_dict(...)`: new parameters made here would
            # be inference tensors.
            return f"`{_short(node)}` may change a module that the script trains"
        if is_library_call(facts, node) or _accelerator_read(facts, node):
            continue
        if method is None:
            if func_name in SAFE_BUILTINS:
                continue
            if function is not None and func_name in parameter_names(function):
                return (
                    f"`{_short(node)}` runs `{func_name}`, a parameter of "
                    f"`{function.name.value}()`, and not every call of it passes a model the "
                    "script trains or a torch module"
                )
            return f"`{_short(node)}` runs code the analysis cannot see"
        if method in KEEPING_METHODS and all(
            is_host_value(a.value, host, facts) for a in node.args
        ):
            continue  # `losses.append(loss.item())`
        if method not in PURE_METHODS:
            return f"`{_short(node)}` may change state that outlives the block"
    if not runs_model:
        return "the block does not run a model that the script trains"
    started = _updates_started_in_block(body)
    for node in find_all(body, cst.Assign, cst.AugAssign, cst.AnnAssign):
        targets = (
            [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        )
        for target in targets:
            for part in find_all(target, cst.Attribute, cst.Subscript):
                if node.value is not None and not is_host_value(node.value, host, facts):
                    return f"`{_short(node)}` stores a value from the block"
                break
        if (
            isinstance(node, cst.AugAssign)
            and not is_host_value(node.value, host, facts)
            and id(node) not in started
        ):
            return f"`{_short(node)}` updates a value in place"
    for node in find_all(body, cst.Return, cst.Yield, cst.Global, cst.Nonlocal):
        value = getattr(node, "value", None)
        if isinstance(node, (cst.Global, cst.Nonlocal)):
            return "the block declares global names"
        if isinstance(node, cst.Return) and returns_read:
            continue
        if value is not None and not is_host_value(value, host, facts):
            return f"`{_short(node)}` hands a value from the block to the caller"
    table = None
    for name in sorted(bound_inside - host):
        for use in name_uses(scope, name, facts):
            if use.node in inside:
                continue
            if use.nested:
                return f"`{name}` is used by a nested function"
            if use.store:
                continue
            table = parents(scope) if table is None else table
            if _rebound_before(table, use.node, name, block, scope):
                continue
            if _reads_only_its_value(table, use.node):
                continue
            # Followed as far as value_escape follows a function's result: a new tensor
            # computed from it (`outputs.argmax(-1)`) is an ordinary tensor.
            why = _value_escape(facts, use.node, scope, table)
            if why is not None:
                return f"`{name}` is used after the block ({why})"
    return None


def _rebound_before(table, read: cst.Name, name: str, block, scope) -> bool:
    """`read` is certain to see a binding made after `block` ran: an earlier statement of one
    of its enclosing blocks binds `name` (with `block` not in between), or an enclosing
    `for` or comprehension binds it. A binding outside a loop that holds both the read and
    `block` is no such certainty: from the second iteration on, the read sees the block's."""
    enclosing_block = ancestors(table, block)
    node: cst.CSTNode = read
    while True:
        parent = table.get(node)
        if parent is None or parent is scope and not isinstance(scope, cst.Module):
            return False
        if isinstance(parent, _NESTED):
            return False
        if isinstance(parent, cst.For) and node is parent.body:
            if name in target_names(parent.target):
                return True
        if isinstance(parent, (cst.For, cst.While)) and parent in enclosing_block:
            return False
        if isinstance(parent, COMPREHENSIONS):
            if any(name in target_names(c.target) for c in find_all(parent, cst.CompFor)):
                return True
        siblings = getattr(parent, "body", None)
        if isinstance(siblings, (list, tuple)) and node in siblings:
            for statement in reversed(siblings[: siblings.index(node)]):
                if statement is block or block in find_all(statement, type(block)):
                    return False
                if _binds(statement, name):
                    return True
        if parent is scope:
            return False
        node = parent


# An inference tensor may be read outside inference mode; only saving it for backward and
# updating it in place are refused. These uses read a Python value or text out of it, maybe
# through an index first (`xgen[i, :n].tolist()`).
_VALUE_READING_BUILTINS = HOST_BUILTINS | frozenset({"repr", "print"})


def _reads_only_its_value(table, read: cst.Name) -> bool:
    """`read` only takes a Python value, an array or text out of the tensor: `loss.item()`,
    `xgen[i].tolist()`, `y.numpy()`, `x.size(1)`, `x.shape`, `float(loss)`, `print(loss)`,
    `f"{loss}"`."""
    node: cst.CSTNode = read
    parent = table.get(node)
    while isinstance(parent, cst.Subscript) and parent.value is node:
        node, parent = parent, table.get(parent)
    if isinstance(parent, cst.Attribute) and parent.value is node:
        if parent.attr.value in HOST_ATTRIBUTES:
            return True
        call = table.get(parent)
        return (
            parent.attr.value in HOST_OR_ARRAY_METHODS
            and isinstance(call, cst.Call)
            and call.func is parent
        )
    if isinstance(parent, cst.Arg) and parent.value is node and not parent.keyword:
        call = table.get(parent)
        return (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Name)
            and call.func.value in _VALUE_READING_BUILTINS
        )
    return isinstance(parent, cst.FormattedStringExpression) and parent.expression is node


def _binds(statement: cst.CSTNode, name: str) -> bool:
    """`statement` always binds `name` with a plain assignment: a simple line, or a `with`
    block whose body does (a `with` body runs whenever the statement completes)."""
    if isinstance(statement, cst.With) and isinstance(statement.body, cst.IndentedBlock):
        return any(_binds(inner, name) for inner in statement.body.body)
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for small in statement.body:
        if isinstance(small, cst.Assign) and any(
            name in target_names(t.target) for t in small.targets
        ):
            return True
    return False


def _short(node: cst.CSTNode, limit: int = 50) -> str:
    text = code_of(node).strip().splitlines()[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def evaluation_loops(facts: "ScriptFacts", training: Set[int]) -> List["Loop"]:
    """`for` loops that evaluate: right after `model.eval()` (in the same block, with no
    `.train()` between) on a model the training loop calls, holding no training loop and
    inside none."""
    trained = training_callees(facts)
    # `.eval()`/`.train()` calls by the block they sit in (function and innermost loop).
    switches: Dict[tuple, list] = {}
    for method in ("eval", "train"):
        for call in facts.method_calls(method):
            if call.receiver in trained and not call.node.args:
                key = (id(call.site.function), id(call.site.loop))
                switches.setdefault(key, []).append(call)
    found = []
    for loop in facts.records.loops:
        if not isinstance(loop.node, cst.For) or any(
            id(outer) in training for outer in (loop, *loop.ancestors)
        ):
            continue
        if any(id(inner) in training for inner in facts.loops_inside(loop)):
            continue
        last = max(
            (
                call
                for call in switches.get((id(loop.function), id(loop.parent)), ())
                if call.site.order < loop.start
            ),
            key=lambda call: call.site.order,
            default=None,
        )
        if last is not None and last.method == "eval" and _may_run(facts, loop, last.receiver):
            found.append(loop)
    return found


def _may_run(facts: "ScriptFacts", loop: "Loop", model: Optional[str]) -> bool:
    """The loop's body mentions the model put in eval mode (`model(x)`, `evaluate(model)`)
    or calls a function of this file, which may run it: a loop that only logs Python numbers
    after `model.eval()` (cleanrl's episodic returns) evaluates nothing."""
    return _mentions_or_may_run(facts, loop.node.body, model, set())


# How deep `_mentions_or_may_run` follows the file's functions calling one another.
_RUN_DEPTH = 3


def _mentions_or_may_run(
    facts: "ScriptFacts", body: cst.CSTNode, model: Optional[str], seen: Set[str]
) -> bool:
    """`body` names the model, or calls a function of this file that may run it: one whose
    own body does, a method or a class (not followed), or one followed too deep. votenet's
    `log_string(...)`, which writes to a log file, runs no model."""
    for node in find_all(body, cst.Name, cst.Attribute, cst.Call):
        if isinstance(node, cst.Call):
            name = callee_name(node)
            if name in facts.records.functions and _function_may_run(facts, name, model, seen):
                return True
        elif model is not None and dotted_name(node) == model:
            return True
    return False


def _function_may_run(
    facts: "ScriptFacts", name: str, model: Optional[str], seen: Set[str]
) -> bool:
    if name in seen:
        return False  # a cycle: the first visit on this path reads the whole body
    definition = facts.top_level_definitions.get(name)
    if model is None or len(seen) >= _RUN_DEPTH or not isinstance(definition, cst.FunctionDef):
        return True
    if facts.records.definition_counts.get(name, 0) != 1 or "." in model:
        return True  # defined twice, or a model reached through an attribute: not followed
    # One answer per function and model, whatever the path: each body is read once. (A
    # cycle cut short may answer False for a function that reaches the model only through
    # it: the loop is then not taken for an evaluation, and left as it is.)
    memo = facts.memo("function_may_run")
    key = (name, model)
    if key not in memo:
        memo[key] = _mentions_or_may_run(facts, definition.body, model, seen | {name})
    return memo[key]


# What callers do with a returned value -----------------------------------------------------------
# Methods through which a tensor, or a dict or list of them, passes on unchanged, as a view or
# as a copy: `.to("cpu")` of a CPU tensor is the tensor itself. What they give is followed on.
_PASSING_METHODS = frozenset({"to", "cpu", "detach", "numpy", "items", "keys", "values", "get"})
# Builtins whose result is one of their arguments (or a view of it): followed on too.
_CHOOSING_BUILTINS = frozenset({"max", "min"})
# Library calls that only serialise or format what they are given.
_SERIALISING_CALLS = frozenset({"json.dumps", "json.dump", "torch.save"})
_MAX_CHAIN = 40  # names followed one into the next (`a = f(); b = a; ...`): Python's stack


def result_escape(facts: "ScriptFacts", node: cst.BaseExpression, scope: Scope) -> Optional[str]:
    """Why the value of `node` (a call whose result may be, or hold, inference tensors), read
    in `scope`, may be saved for backward or updated in place later; None when every use of it
    only reads it.

    Followed: indexing, `.items()`/`.values()` and the other `_PASSING_METHODS`, names it is
    assigned or unpacked to (every use of them in the scope), `for` loops and comprehensions
    over it, containers and comprehensions it is packed into, `max`/`min`, arithmetic with
    host values. Accepted as reads: what `_reads_only_its_value` accepts (`.item()`,
    `.tolist()`, `float(...)`, `print(...)`, f-strings), comparisons, truth tests, loggers'
    methods, `str.format`, `json.dumps`, `torch.save`, and `update`/`append` of a container
    that holds it, as a statement of its own (what goes in is followed where it goes in).
    Anything else (another call, an attribute read or store, a subscript store, a `return`)
    is an escape. Each name of a scope is followed once per pass.
    """
    table = facts.memo("parents").get(scope)
    if table is None:
        table = facts.memo("parents")[scope] = parents(scope)
    return _value_escape(facts, node, scope, table)


def _value_escape(facts, node: cst.CSTNode, scope: Scope, table) -> Optional[str]:
    node = _passed_on(table, node)
    parent = table.get(node)
    if _reads_only_its_value(table, node):
        return None
    if isinstance(parent, (cst.Comparison, cst.ComparisonTarget, cst.Assert)):
        return None  # a comparison makes a new tensor that never requires grad
    if isinstance(parent, (cst.If, cst.While, cst.IfExp)) and parent.test is node:
        return None
    if isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
        return None
    if isinstance(parent, cst.BooleanOperation):
        return _value_escape(facts, parent, scope, table)
    if isinstance(parent, cst.BinaryOperation):
        other = parent.right if parent.left is node else parent.left
        if not is_host_value(other, _scope_host_names(facts, scope), facts):
            return f"`{_short(parent)}` computes with it"
        return _value_escape(facts, parent, scope, table)
    if isinstance(parent, cst.Arg):
        return _argument_escape(facts, parent, scope, table)
    if isinstance(parent, (cst.Element, cst.DictElement, cst.StarredDictElement)):
        return _value_escape(facts, table[parent], scope, table)
    if isinstance(parent, (cst.DictComp, cst.ListComp, cst.SetComp, cst.GeneratorExp)):
        return _value_escape(facts, parent, scope, table)  # the element a comprehension makes
    if isinstance(parent, cst.CompFor) and parent.iter is node:
        return _comprehension_escape(facts, parent, scope, table)
    if isinstance(parent, cst.For) and parent.iter is node:
        return _names_escape(facts, target_names(parent.target), scope, table)
    if isinstance(parent, cst.Attribute) and parent.value is node:
        # A method call: `_passed_on` took other attributes, and a host one is a read.
        call = table.get(parent)
        if parent.attr.value in KEEPING_METHODS and isinstance(table.get(call), cst.Expr):
            return None  # `log_stats.update(...)`: what goes in is followed where it goes in
        if parent.attr.value in FRESH_METHODS:
            # `outputs.argmax(-1)`: outside inference_mode, a new tensor computed from an
            # inference tensor alone is an ordinary one (views stay inference tensors, and
            # one computed with a tensor that requires grad would save it for backward).
            host = _scope_host_names(facts, scope)
            if all(is_host_value(arg.value, host, facts) for arg in call.args):
                return None
            return f"`{_short(call)}` computes with it and a value that may require grad"
        return f"`{_short(call)}` may change it"
    if isinstance(parent, cst.Assign) and parent.value is node:
        names: List[str] = []
        for target in parent.targets:
            if find_all(target.target, cst.Attribute, cst.Subscript):
                return f"`{_short(parent)}` stores it"
            names.extend(target_names(target.target))
        return _names_escape(facts, names, scope, table)
    if isinstance(parent, (cst.Return, cst.Yield)):
        return f"`{_short(parent)}` hands it on to the caller"
    return f"`{_short(parent if parent is not None else node)}` uses it"


def _comprehension_escape(facts, loop: cst.CompFor, scope: Scope, table) -> Optional[str]:
    """The names a comprehension's `for` binds live in the comprehension only: their uses
    there are followed."""
    comprehension: cst.CSTNode = loop
    while not isinstance(comprehension, COMPREHENSIONS):
        comprehension = table[comprehension]
    names = set(target_names(loop.target))
    bound = {id(n) for c in find_all(comprehension, cst.CompFor) for n in find_all(c.target)}
    for use in find_all(comprehension, cst.Name):
        if use.value in names and id(use) not in bound:
            reason = _value_escape(facts, use, scope, table)
            if reason is not None:
                return reason
    return None


def _passed_on(table, node: cst.CSTNode) -> cst.CSTNode:
    """`node` taken through indexing (`x[i, 1:]`, `stats["acc1"]`), attributes that are not
    called (`outputs.logits` of a model's output, `x.T`: what they hold is followed in turn)
    and `_PASSING_METHODS`."""
    while True:
        parent = table.get(node)
        if isinstance(parent, cst.Subscript) and parent.value is node:
            node = parent
            continue
        call = table.get(parent)
        if (
            isinstance(parent, cst.Attribute)
            and parent.value is node
            and parent.attr.value not in HOST_ATTRIBUTES
            and not (isinstance(call, cst.Call) and call.func is parent)
        ):
            node = parent
            continue
        if (
            isinstance(parent, cst.Attribute)
            and parent.value is node
            and parent.attr.value in _PASSING_METHODS
            and isinstance(call, cst.Call)
            and call.func is parent
        ):
            node = call
            continue
        return node


def _argument_escape(facts, arg: cst.Arg, scope: Scope, table) -> Optional[str]:
    call = table.get(arg)
    if not isinstance(call, cst.Call):
        return f"`{_short(arg)}` uses it"
    if (
        isinstance(call.func, cst.Name)
        and call.func.value in _CHOOSING_BUILTINS
        and facts.qualified_name(call.func) is None  # not `from torch import max`
    ):
        return _value_escape(facts, call, scope, table)
    if method_name(call) in LOGGING_METHODS or facts.qualified_name(call.func) in (
        _SERIALISING_CALLS
    ):
        return None
    if method_name(call) == "format" and isinstance(call.func.value, STRING_NODES):
        return None  # `"{acc:.1f}".format(acc=best_acc)`
    return f"`{_short(call)}` takes it, and the analysis does not see what that keeps"


def _names_escape(facts, names: Iterable[str], scope: Scope, table) -> Optional[str]:
    """The first escape among the uses of `names` in `scope`. Each name is followed once per
    pass. A name met again while it is being followed (`a = b` ... `b = a`) is assumed to
    read only: its own uses decide. What was answered under such an assumption is settled
    when the outermost name is: it escapes with it (conservative), or reads only."""
    memo = facts.memo("name_escapes")
    state = facts.memo("name_escapes_pending")
    active: List[tuple] = state.setdefault("active", [])
    provisional: List[tuple] = state.setdefault("provisional", [])
    for name in names:
        key = (id(scope), name)
        if key in memo:
            reason = memo[key]
        elif key in active:
            state["assumed"] = True
            reason = None
        elif len(active) >= _MAX_CHAIN:
            reason = f"it passes through more than {_MAX_CHAIN} names, and is not followed further"
        else:
            active.append(key)
            reason = _name_escape(facts, name, scope, table)
            active.pop()
            if reason is None and active and state.get("assumed"):
                provisional.append(key)
            else:
                memo[key] = reason
            if not active:
                for pending in provisional:
                    memo[pending] = reason
                provisional.clear()
                state["assumed"] = False
        if reason is not None:
            return reason
    return None


def _name_escape(facts, name: str, scope: Scope, table) -> Optional[str]:
    for use in name_uses(scope, name, facts):
        if use.store:
            continue
        if use.nested:
            return f"`{name}` is used by a nested function"
        reason = _value_escape(facts, use.node, scope, table)
        if reason is not None:
            return reason
    return None


def _scope_host_names(facts, scope: Scope) -> Set[str]:
    known = facts.memo("host_names")
    if scope not in known:
        known[scope] = host_names(scope, facts)
    return known[scope]


def callers_keep_result(facts: "ScriptFacts", function: cst.FunctionDef) -> Optional[str]:
    """Why what `function` returns may not be only read by its callers; None when every call
    of it in the run is known and only reads the result (result_escape): the calls of this
    file, and those the project index found in the other modules of the run (each with the
    caller's own result_escape). A function passed around or stored, in a module that is no
    script and that no module of the run imports, is not followed; nor is a method of such
    a module or of one other modules import (instances made there are not followed)."""
    name = function.name.value
    owner = method_class(facts, function)
    if owner is not None:
        return _method_callers_keep(facts, name, owner)
    if id(function) not in {id(s) for s in facts.module.body}:
        return (
            "it is defined in a function or class without being a method: its calls are "
            "not followed"
        )
    calls = calls_named(facts, name)
    outside = outside_calls(facts, name)
    if name_mentions(facts).get(name, 0) != 1 + len(calls) or facts.assignments_to(name):
        return "this file uses it otherwise than by calling it"
    project = facts.project
    if not (facts.runs_as_script or (project is not None and project.importers)):
        return (
            "this module is no script (no `__main__` guard, no training at its top level) "
            "and no module of the run imports it: callers elsewhere are not followed"
        )
    for used, importer in project.used_otherwise if project is not None else ():
        if used == name:
            return f"{importer} passes it around or stores it"
    if not calls and not outside:
        return "no module of the run calls it: callers elsewhere are not followed"
    for call in outside:
        if call.passed_around:
            return f"{call.caller} passes it around or stores it"
        if call.result is None:
            return f"what {call.caller} does with the result is not known"
        if call.result:
            return f"{call.caller} keeps the result: {call.result}"
    return _local_callers_keep(facts, calls)


def _local_callers_keep(facts, calls) -> Optional[str]:
    for call in calls:
        scope = call.site.function if call.site.function is not None else facts.module
        reason = result_escape(facts, call.node, scope)
        if reason is not None:
            return f"a caller keeps the result: {reason}"
    return None


def _method_callers_keep(facts, name: str, owner: str) -> Optional[str]:
    """For method `name` of class `owner`: every `.name` of the file is a call on an instance
    of `owner`, and no other module of the run imports the file (instances made there are
    not followed)."""
    label = f"it is a method of `{owner}`"
    project = facts.project
    if project is not None and project.importers:
        return (
            f"{label}, and this module is imported by {', '.join(project.importers)}: calls "
            "through instances made there are not followed"
        )
    if not facts.runs_as_script:
        return f"{label}, in a module that is no script: callers elsewhere are not followed"
    calls = facts.method_calls(name)
    if attribute_mentions(facts).get(name, 0) != len(calls) or not calls:
        return f"{label}, and this file uses `.{name}` otherwise than by calling it"
    for call in calls:
        receiver = dotted_name(call.node.func.value)
        if receiver is None or not instance_of(facts, receiver, call.site.function, owner):
            return (
                f"{label}, and the receiver of `{excerpt(call.node, 40)}` is not followed to "
                "an instance of it"
            )
    return _local_callers_keep(facts, calls)

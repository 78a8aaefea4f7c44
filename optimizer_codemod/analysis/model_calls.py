"""Which calls of an evaluation block run a model the script trains, or only read it.

An evaluation block (`with torch.no_grad():`, a loop after `model.eval()`) is recognised by
the model it runs. Its calls may run that model, a torch module such as a loss, or a
method of the model's classes that only computes from its submodules (`model.decode(z)`);
anything else may keep or replace tensors (escapes.block_escape).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable, Dict, List, NamedTuple, Optional, Set

import libcst as cst

from optimizer_codemod.analysis.calls import code_of, excerpt, is_minus_one, method_name
from optimizer_codemod.analysis.devices import HOST_METHODS
from optimizer_codemod.analysis.epochs import calls_training_function, statement_bodies
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all, is_docstring
from optimizer_codemod.analysis.values import (
    attribute_assignments,
    locally_assigned,
    method_class,
    calls_named,
    outside_calls,
    parameter_names,
    parameter_sources,
)

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts
    from optimizer_codemod.analysis.collect import CallSite
    from optimizer_codemod.analysis.training import TrainedModel

MAX_DEPTH = 4
# Methods of long-lived objects that take values without keeping tensors: loggers and
# progress bars format or convert what they get.
LOGGING_METHODS = frozenset(
    {"add_scalar", "add_scalars", "set_postfix", "set_description", "write", "info", "debug"}
)
# Builtins that neither keep nor change tensors.
SAFE_BUILTINS = frozenset(
    "print len range zip enumerate float int bool str round abs min max sum sorted list tuple "
    "dict set isinstance iter next repr format".split()
)
# Methods that change nothing the block did not create, and keep no tensor: tensor methods
# returning new tensors, views or Python values, loggers, dictionary reads, mode switches.
PURE_METHODS = (
    HOST_METHODS
    | LOGGING_METHODS
    | frozenset(
        "tril triu clone sum mean std var max min amax amin exp log sqrt abs neg pow sub "
        "mul div matmul softmax log_softmax sigmoid tanh relu cumsum argmax argmin argsort "
        "sort topk eq ne lt gt le ge logical_not masked_fill float double half bfloat16 long "
        "int bool to cpu cuda numpy detach view view_as reshape flatten squeeze unsqueeze "
        "permute transpose contiguous expand gather index_select split chunk round "
        "t clamp clip norm square prod all any floor ceil sign repeat expand_as narrow "
        "unbind type type_as mm bmm dot log1p "
        "items keys values get format join eval parameters named_parameters".split()
    )
)
# Libraries whose functions keep no tensor they are given (they read, convert, save or log it).
# A function of any other module, above all one of the project (`utils.remember(logits)`),
# may store its argument where later training code finds it.
LIBRARY_ROOTS = frozenset(
    "torch torchvision torchaudio numpy scipy sklearn pandas PIL matplotlib einops tqdm wandb "
    "mlflow tensorboardX math cmath time datetime os sys logging json csv pickle random "
    "itertools functools operator collections statistics copy pprint warnings pathlib "
    "shutil".split()
)


def is_library_call(facts: "ScriptFacts", call: cst.Call) -> bool:
    """`call` calls a function of one of LIBRARY_ROOTS (`torch.cat`, `np.mean`)."""
    qualified = facts.qualified_name(call.func)
    return qualified is not None and qualified.partition(".")[0] in LIBRARY_ROOTS


# torch's own modules (`nn.CrossEntropyLoss()`): library code, whatever names hold them.
TORCH_MODULES = "torch.nn."


def training_callees(facts: "ScriptFacts") -> Set[str]:
    """The text of every callee called in a training loop: `model`, `self.net`, `criterion`."""
    return {
        code_of(site.node.func).strip()
        for loop in facts.training_loops
        for site in facts.loop_calls(loop)
    }


def runs_trained_module(
    facts: "ScriptFacts",
    func: cst.BaseExpression,
    function: Optional[cst.FunctionDef],
    trained: Set[str],
) -> bool:
    """`func` (the callee of a call in `function`) is a model the script trains or a torch
    module: a callee of a training loop (`trained`), or a parameter whose every argument, at
    every call of the function in this file, is one (`test(model, criterion, ...)` called
    from the training step with its own parameters, and from the script with `gcn`)."""
    if code_of(func).strip() in trained:
        return True
    return isinstance(func, cst.Name) and _holds_module(facts, func.value, function, trained, 0)


def _holds_module(
    facts: "ScriptFacts",
    name: str,
    function: Optional[cst.FunctionDef],
    trained: Set[str],
    depth: int,
) -> bool:
    if depth > MAX_DEPTH:
        return False
    memo = facts.memo("holds_trained_module")
    key = (name, id(function))
    if key not in memo:
        memo[key] = False  # a cycle of parameters holds nothing known
        memo[key] = _follow_to_module(facts, name, function, trained, depth)
    return memo[key]


def _follow_to_module(
    facts: "ScriptFacts",
    name: str,
    function: Optional[cst.FunctionDef],
    trained: Set[str],
    depth: int,
) -> bool:
    if function is not None and name in parameter_names(function):
        if locally_assigned(facts, name, function) or outside_calls(facts, function.name.value):
            return False
        sources = parameter_sources(facts, function, name)
        return bool(sources) and all(
            isinstance(source.value, cst.Name)
            and (
                source.value.value in trained
                or _holds_module(facts, source.value.value, source.function, trained, depth + 1)
            )
            for source in sources
        )
    if function is not None and locally_assigned(facts, name, function):
        return False  # a local of its own, not the module-level name
    from optimizer_codemod.analysis.training import trained_models

    if any(
        name in model.spellings and model.owner is None and model.scope is None
        for model in trained_models(facts)
    ):
        return True
    assignments = facts.assignments_to(name)
    return bool(assignments) and all(
        a.site.function is None
        and isinstance(a.value, cst.Call)
        and (facts.qualified_name(a.value.func) or "").startswith(TORCH_MODULES)
        for a in assignments
    )


def method_of_trained_class(facts: "ScriptFacts", function: cst.FunctionDef) -> bool:
    """`function` is a method of a class that a model the file trains is built from."""
    from optimizer_codemod.analysis.training import model_classes, trained_models

    memo = facts.memo("trained_classes")
    if "all" not in memo:
        memo["all"] = {c for model in trained_models(facts) for c in model_classes(facts, model)}
    return method_class(facts, function) in memo["all"]


def getter_of_trained_classes(facts: "ScriptFacts", method: str) -> bool:
    """`model.get_block_size()`: every model the file trains is built from classes of this
    file whose bases are classes of this file or `nn.Module`, and each of them that defines
    `method` defines it as a getter (one `return` of an expression without calls, reading
    no property or method of those classes: `return self.block_size`): the call only reads
    the module, as `.eval()` only switches it."""
    return _every_definition(
        facts, method, "getter", lambda definition, methods: _is_getter(definition, methods)
    )


def computing_method_of_trained_classes(facts: "ScriptFacts", method: str) -> bool:
    """`model.decode(z)`: as for getter_of_trained_classes, each definition of `method` in
    the trained models' classes only computes, as a `forward` does: it calls submodules
    (`self.fc3(z)`, attributes its class assigns), other such methods of those classes,
    library functions and tensor methods that return new values, and stores, updates in
    place and yields nothing."""
    return _every_definition(
        facts,
        method,
        "computing",
        lambda definition, methods: _only_computes(facts, definition, methods, set()),
    )


def _every_definition(
    facts: "ScriptFacts",
    method: str,
    kind: str,
    holds: Callable[[cst.FunctionDef, Dict[str, cst.FunctionDef]], bool],
) -> bool:
    from optimizer_codemod.analysis.training import MODULE_BASE, model_classes, trained_models

    memo = facts.memo(f"{kind}_methods_of_trained_classes")
    if method not in memo:
        models = trained_models(facts)
        classes = [model_classes(facts, model) for model in models]
        every = {name for names in classes for name in names}
        functions = {
            statement.name.value: statement
            for name in every
            for statement in getattr(facts.classes[name].node.body, "body", ())
            if isinstance(statement, cst.FunctionDef)
        }
        definitions = [
            statement
            for name in every
            for statement in getattr(facts.classes[name].node.body, "body", ())
            if isinstance(statement, cst.FunctionDef) and statement.name.value == method
        ]
        memo[method] = (
            bool(models)
            and all(classes)
            and all(b in every or b == MODULE_BASE for n in every for b in facts.classes[n].bases)
            and bool(definitions)
            and all(holds(definition, functions) for definition in definitions)
        )
    return memo[method]


def _is_getter(function: cst.FunctionDef, functions: Dict[str, cst.FunctionDef]) -> bool:
    statements = [s for s in getattr(function.body, "body", ()) if not (is_docstring(s))]
    if len(statements) != 1 or not isinstance(statements[0], cst.SimpleStatementLine):
        return False
    (small,) = statements[0].body if len(statements[0].body) == 1 else (None,)
    return (
        isinstance(small, cst.Return)
        and small.value is not None
        and not find_all(small.value, cst.Call, cst.NamedExpr, cst.Lambda)
        and not any(a.attr.value in functions for a in find_all(small.value, cst.Attribute))
    )


# Statements that could keep a tensor past the call or change the module.
_KEEPING = (
    cst.Global,
    cst.Nonlocal,
    cst.Del,
    cst.Yield,
    cst.Await,
    cst.AugAssign,
    cst.NamedExpr,
    cst.Lambda,
    cst.FunctionDef,
    cst.ClassDef,
)


def _only_computes(
    facts: "ScriptFacts",
    function: cst.FunctionDef,
    functions: Dict[str, cst.FunctionDef],
    seen: Set[str],
) -> bool:
    if function.name.value in seen or len(seen) > MAX_DEPTH:
        return False
    seen = seen | {function.name.value}
    body = function.body
    if find_all(body, *_KEEPING):
        return False
    for assignment in find_all(body, cst.Assign, cst.AnnAssign):
        targets = (
            [t.target for t in assignment.targets]
            if isinstance(assignment, cst.Assign)
            else [assignment.target]
        )
        if any(find_all(target, cst.Attribute, cst.Subscript) for target in targets):
            return False
    called = {id(call.func) for call in find_all(body, cst.Call)}
    if any(
        attribute.attr.value in functions and id(attribute) not in called
        for attribute in find_all(body, cst.Attribute)
    ):
        return False  # a property of the classes runs code of its own
    owner = method_class(facts, function)
    for call in find_all(body, cst.Call):
        func = call.func
        method = method_name(call)
        if method is not None and method.endswith("_") and not method.endswith("__"):
            return False  # in place
        if (
            isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and func.value.value == "self"
        ):
            if method in functions:
                if not _only_computes(facts, functions[method], functions, seen):
                    return False
                continue
            if owner is None or not attribute_assignments(facts, owner, f"self.{method}"):
                return False  # `self.to(...)`, `self.register_buffer(...)`: nn.Module's own
            continue  # a submodule, run as the forward runs it
        if is_library_call(facts, call):
            continue
        if method is None:
            if isinstance(func, cst.Name) and func.value in SAFE_BUILTINS:
                continue
            return False
        if method not in PURE_METHODS:
            return False
    return True


# Calls on an attribute of `self` that would keep their argument in the module.
_KEEPING_CALLS = frozenset(
    "append extend insert update add setdefault register_buffer register_parameter "
    "copy_ set_".split()
)


def trained_classes_keep_nothing(facts: "ScriptFacts", seen_only: bool = False) -> Optional[str]:
    """Why a forward of the trained models might keep a tensor it makes in the module (an
    inference tensor the next training step would save for backward); None when every model
    the file trains is built from classes of this file deriving from `nn.Module` or each
    other, and no method of theirs but `__init__` stores on `self` (`self.h = ...`,
    `self.cache.append(...)`, `setattr`). `seen_only`: only the classes of this file are
    asked, a model of other code is taken to keep nothing."""
    from optimizer_codemod.analysis.training import MODULE_BASE, model_classes, trained_models

    memo = facts.memo("trained_classes_keep_nothing")
    if seen_only in memo:
        return memo[seen_only]
    why: Optional[str] = None
    models = trained_models(facts)
    classes = [model_classes(facts, model) for model in models]
    every = {name for names in classes for name in names}
    if not seen_only and (not models or not all(classes)):
        why = "a model the loop trains is not built from classes of this file"
    elif not seen_only and any(
        b not in every and b != MODULE_BASE for n in every for b in facts.classes[n].bases
    ):
        why = "a class the trained model is built from derives from a class not read here"
    for name in sorted(every) if why is None else ():
        for method in find_all(facts.classes[name].node.body, cst.FunctionDef):
            if method.name.value == "__init__":
                continue
            kept = _keeps_on_self(method)
            if kept is not None:
                why = f"`{name}.{method.name.value}` keeps a value on the module (`{kept}`)"
                break
        if why is not None:
            break
    memo[seen_only] = why
    return why


def _keeps_on_self(method: cst.FunctionDef) -> Optional[str]:
    for node in find_all(method.body, cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.Call):
        if isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Name) and func.value == "setattr":
                return excerpt(node, 40)
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value in _KEEPING_CALLS
                and _rooted_at_self(func.value)
            ):
                return excerpt(node, 40)
            continue
        target = node.target
        if any(_rooted_at_self(t) for t in find_all(target, cst.Attribute, cst.Subscript)):
            return excerpt(target, 40)
    return None


def _rooted_at_self(node: cst.BaseExpression) -> bool:
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        node = node.value
    return isinstance(node, cst.Name) and node.value == "self"


# What training may follow a statement (training_may_follow).
NO_TRAINING, TRAINING_AGAIN, TRAINING_FIRST = 0, 1, 2


def training_may_follow(
    facts: "ScriptFacts", statement: cst.CSTNode, function: Optional[cst.CSTNode], order: int
) -> int:
    """Whether a training step of this file may run after `statement`, at visit `order` in
    `function` (None: the module's top level). TRAINING_FIRST: training may first run
    after it, later in the same scope (an "initial loss" evaluated before the loop, or at
    the start of each epoch), or so for a call of the function holding it (`evaluate()`
    called before the epoch's steps); its forward may be the model's first, and a model
    keeping a tensor it made (a lazily built cache) would hand that inference tensor to the
    first training step, which raises when it saves it for backward. TRAINING_AGAIN: only
    in a later pass of a loop around both that trained before it (an evaluation after an
    epoch's steps); the model's caches exist, but one that grows again (a longer sequence)
    would meet the next epoch's first step the same way. NO_TRAINING when its block exits
    the program right after it, or no training follows; when its block returns right after
    it, only what follows the function's calls counts. Training is a loop with a backward
    call, or a call of a function of this file that reaches one
    (epochs.calls_training_function)."""
    leaves = _statements_before_leaving(facts).get(id(statement))
    if leaves == _EXIT:
        return NO_TRAINING
    return _followed_by_training(facts, function, _after(order, leaves), 0, set())


def _after(order: int, leaves: Optional[str]) -> int:
    """Where a statement stands for what may follow it in its function: past every training
    site when its block returns right after it (only the function's callers may train)."""
    return sys.maxsize if leaves == _RETURN else order


def _followed_by_training(facts, function, order, depth, seen) -> int:
    found = NO_TRAINING
    for where in _training_sites(facts):
        if where.function is not function:
            continue
        if where.order > order:
            return TRAINING_FIRST
        if where.start <= order <= where.end:
            found = TRAINING_AGAIN
    if not isinstance(function, cst.FunctionDef) or depth > MAX_DEPTH or id(function) in seen:
        return found
    seen.add(id(function))
    leaving = _statements_before_leaving(facts)
    for call in _callers(facts, function):
        leaves = leaving.get(id(call.site.statement))
        if leaves == _EXIT:
            continue
        site = call.site
        follows = _followed_by_training(
            facts, site.function, _after(site.order, leaves), depth + 1, seen
        )
        found = max(found, follows)
        if found == TRAINING_FIRST:
            break
    return found


def training_may_follow_calls(facts: "ScriptFacts", function: cst.FunctionDef) -> int:
    """What training may follow a call of `function` in this file (training_may_follow, for
    a function decorated with `no_grad`). A model it gets from a caller in another module is
    not followed at all: escapes.block_escape declines first."""
    return _followed_by_training(facts, function, sys.maxsize, 0, set())


def _callers(facts: "ScriptFacts", function: cst.FunctionDef) -> List["CallSite"]:
    # A method is called on any receiver (`self.evaluate()`, `trainer.evaluate()`): taking
    # every call of that name can only find more training after it.
    name = function.name.value
    calls = calls_named(facts, name)
    if method_class(facts, function) is not None:
        seen = {id(call.node) for call in calls}
        calls += [call for call in facts.method_calls(name) if id(call.node) not in seen]
    return calls


# What a forward may call to differentiate inside itself: autograd turned back on, or a
# gradient taken (test-time training, an input-gradient step): neither works under
# inference_mode, where `enable_grad` has no effect.
_GRADIENTS_IN_FORWARD = frozenset(
    {"torch.enable_grad", "torch.set_grad_enabled", "torch.autograd.grad", "torch.func.grad"}
)


def model_differentiates_in_forward(facts: "ScriptFacts") -> Optional[str]:
    """A call among a trained model's layers, in this file or its classes from other modules
    of the run, that differentiates inside the forward (`torch.autograd.grad` in
    x-transformers' test-time training), as training.model_code_call shows it; None when
    none."""
    from optimizer_codemod.analysis.training import model_code_call, trained_models

    memo = facts.memo("model_differentiates_in_forward")
    if None not in memo:
        memo[None] = next(
            (
                found
                for model in trained_models(facts)
                for found in [model_code_call(facts, model, _GRADIENTS_IN_FORWARD.__contains__)]
                if found is not None
            ),
            None,
        )
    return memo[None]


def forward_may_keep_for_training(facts: "ScriptFacts", follows: int) -> Optional[str]:
    """Why a forward under `inference_mode` followed by training of kind `follows`
    (training_may_follow) might hand the training step an inference tensor it kept; None
    when it may not. Before the first step every model must be seen to keep nothing; before
    a later pass of a loop only the classes of this file are asked (a cache built in training
    and grown again under `inference_mode`): torch's own modules keep nothing from a
    forward, and a model of other code is taken to as well."""
    from optimizer_codemod.analysis.devices import deepspeed_engine, sharding_wrapper

    if follows == NO_TRAINING:
        return None
    wrapper = sharding_wrapper(facts) if follows == TRAINING_FIRST else None
    if wrapper is not None:
        # FSDP's lazy init under inference_mode: "The grad_fn is needed to access the
        # AccumulateGrad" (pytorch/pytorch#113203); fully_shard: "Inplace update to
        # inference tensor outside InferenceMode" at the first training step.
        return (
            f"the model may be sharded (`{wrapper}`): FSDP and DeepSpeed build their state on "
            "the model's first forward"
        )
    engine = deepspeed_engine(facts)
    if engine is not None:
        return (
            f"the model may train under DeepSpeed (`{engine}`), whose ZeRO-3 keeps the "
            "parameters it gathers in a forward for the next: after an evaluation under "
            '`inference_mode`, training raises "Inference tensors cannot be saved for '
            'backward" (snowflakedb/ArcticTraining#265, modelscope/ms-swift#3237)'
        )
    return trained_classes_keep_nothing(facts, seen_only=follows == TRAINING_AGAIN)


# torch's modules that create their parameters from the first input they see hold
# `UninitializedParameter`s until then: `nn.LazyLinear`, `nn.LazyConv2d`, ..., and a module
# of one's own deriving from `LazyModuleMixin`.
_UNINITIALIZED = frozenset({"UninitializedParameter", "UninitializedBuffer", "LazyModuleMixin"})
# Keywords whose `-1` is an axis or an index, not a size left to the first input.
_NOT_SIZES = frozenset(
    "dim dims axis axes start_dim end_dim ignore_index padding_idx fill_value".split()
)
_INDEX_SUFFIXES = ("_index", "_idx", "_id")


def is_lazy_torch_module(qualname: str) -> bool:
    """`torch.nn.LazyLinear`, `torch.nn.modules.lazy.LazyModuleMixin`,
    `torch.nn.parameter.UninitializedParameter`: parameters made on the first forward."""
    parts = qualname.split(".")
    return parts[0] == "torch" and (parts[-1].startswith("Lazy") or parts[-1] in _UNINITIALIZED)


def parameters_made_on_first_forward(facts: "ScriptFacts") -> Optional[str]:
    """What may make a model the file trains create parameters on its first forward, shown;
    None when nothing does that the analysis sees. Its classes of this file and the calls
    that build it (training.model_layer_calls) are read for torch's lazy modules (a class
    deriving from `LazyModuleMixin`, a call of `nn.LazyLinear`, `UninitializedParameter`,
    `.materialize(...)`) and for a class of another library, or of this file, given `-1`
    as a size (PyG's `Linear(-1, 64)`, `SAGEConv((-1, -1), 64)`, `HAN(in_channels=-1)`:
    the size is taken from the first input, and the parameters made then); its classes
    from other modules of the run, for torch's lazy modules among their layers."""
    from optimizer_codemod.analysis.training import imported_layer, trained_models

    memo = facts.memo("parameters_made_on_first_forward")
    if None not in memo:
        memo[None] = None
        for model in trained_models(facts):
            found = _lazy_layer(facts, model)
            if found is None:
                elsewhere = imported_layer(facts, model, is_lazy_torch_module)
                if elsewhere is not None:
                    found = f"`{elsewhere[0]}` in {elsewhere[1].module} is a lazy module"
            if found is not None:
                memo[None] = found
                break
    return memo[None]


def _lazy_layer(facts: "ScriptFacts", model: "TrainedModel") -> Optional[str]:
    from optimizer_codemod.analysis.training import model_classes, model_layer_calls

    for name in sorted(model_classes(facts, model)):
        base = next((b for b in facts.classes[name].bases if b and is_lazy_torch_module(b)), None)
        if base is not None:
            return f"`{name}` derives from `{base}`"
    for call in model_layer_calls(facts, model):
        if is_lazy_torch_module(call.qualname or ""):
            return f"`{excerpt(call.node, 50)}` is a lazy module"
        if call.method == "materialize":
            return f"`{excerpt(call.node, 50)}` materializes a parameter"
        if _builds_a_class(facts, call) and _size_left_to_the_input(call.node):
            return (
                f"`{excerpt(call.node, 50)}` leaves a size as `-1`, which lazy layers such as "
                "PyG's take from the first input"
            )
    return None


def _builds_a_class(facts: "ScriptFacts", call: "CallSite") -> bool:
    """`call` builds a class of this file, or one of a library outside LIBRARY_ROOTS (whose
    own classes take no `-1` for a size): a name starting with a capital (`SAGEConv`,
    `Linear` of `torch_geometric.nn`), not a function such as `scatter`."""
    func = call.node.func
    if isinstance(func, cst.Name) and func.value in facts.classes:
        return True
    qualname = call.qualname
    if qualname is None or qualname.partition(".")[0] in LIBRARY_ROOTS:
        return False
    return qualname.rsplit(".", 1)[-1][:1].isupper()


def _size_left_to_the_input(call: cst.Call) -> bool:
    """An argument of `call` is `-1`, or a tuple or list holding one (`(-1, -1)` for a
    bipartite layer's two input sizes), other than an axis or index keyword (`dim=-1`)."""
    for arg in call.args:
        keyword = arg.keyword.value if arg.keyword is not None else ""
        if keyword in _NOT_SIZES or keyword.endswith(_INDEX_SUFFIXES):
            continue
        value = arg.value
        values = (
            [element.value for element in value.elements]
            if isinstance(value, (cst.Tuple, cst.List))
            else [value]
        )
        if any(is_minus_one(v) for v in values):
            return True
    return False


_EXIT, _RETURN = "exit", "return"


def _statements_before_leaving(facts: "ScriptFacts") -> Dict[int, str]:
    """Statements after which their block leaves the program (`sys.exit()`: _EXIT) or the
    function (`return`, `raise`: _RETURN) with no training in between: pytorch/examples'
    imagenet `if args.evaluate: validate(...); return` runs no training after that call
    (nor does main's caller). A statement with training between it and the leaving one
    (`evaluate(); for batch in loader: ...backward()...; return results`) is not among
    them. Found once per pass, by id."""
    memo = facts.memo("statements_before_leaving")
    if None not in memo:
        training = {id(call.node) for call in _training_calls(facts)}
        found: Dict[int, str] = {}
        for body in statement_bodies(facts):
            leaves: Optional[str] = None
            for statement in reversed(body.body):
                if leaves is not None:
                    if any(id(node) in training for node in find_all(statement, cst.Call)):
                        leaves = None
                    else:
                        found[id(statement)] = leaves
                if leaves is None:
                    leaves = _leaves(facts, statement)
        memo[None] = found
    return memo[None]


def _leaves(facts: "ScriptFacts", statement: cst.CSTNode) -> Optional[str]:
    if not isinstance(statement, cst.SimpleStatementLine):
        return None
    for small in statement.body:
        if isinstance(small, (cst.Return, cst.Raise)):
            return _RETURN
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            func = small.value.func
            if facts.qualified_name(func) in _EXITS or dotted_name(func) in ("exit", "quit"):
                return _EXIT
    return None


_EXITS = frozenset({"sys.exit", "os._exit"})


class _Where(NamedTuple):
    function: Optional[cst.CSTNode]
    order: int
    start: int  # the span of the outermost loop around it in its function, or empty
    end: int


def _training_calls(facts: "ScriptFacts") -> List["CallSite"]:
    """Each backward call, and each call of a function of this file that reaches one."""
    return facts.backward_calls + [
        call for call in facts.records.calls if calls_training_function(facts, call.node)
    ]


def _training_sites(facts: "ScriptFacts") -> List[_Where]:
    """Where training runs: each backward call, and each call of a function of this file
    that reaches one, with the outermost loop around it. Found once per pass."""
    memo = facts.memo("training_sites")
    if None not in memo:
        sites = []
        for call in _training_calls(facts):
            site = call.site
            around = [loop for loop in site.loops if loop.function is site.function]
            start, end = (around[0].start, around[0].end) if around else (0, -1)
            sites.append(_Where(site.function, site.order, start, end))
        memo[None] = sites
    return memo[None]

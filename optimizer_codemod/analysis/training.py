"""The training step: which model is trained, where it is built, placed and wrapped, where its
forward, loss, backward and optimizer step happen, and where it is evaluated.

Rules that change how the model runs (compile, autocast, memory format) share these answers.
Every answer is conservative: when the script does something the analysis does not follow
(the model rebuilt in a loop, the loss computed in a nested block), the answer is None and the
rule leaves the script alone or reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

import libcst as cst

from optimizer_codemod.analysis.calls import (
    MODULE_RETURNING_METHODS,
    argument,
    callee_name,
    code_of,
    excerpt,
    has_star_args,
    is_prepare,
    keyword,
    literal,
    positional,
    receiver,
)
from optimizer_codemod.analysis.collect import is_main_guard, target_names
from optimizer_codemod.analysis.imports import dotted_name, runs_on_the_host
from optimizer_codemod.analysis.epochs import body_holding
from optimizer_codemod.analysis.guards import always_exits
from optimizer_codemod.analysis.nodes import find_all, is_name, root_name
from optimizer_codemod.analysis.walk import ancestors, children
from optimizer_codemod.analysis.bounded_loops import literal_iterations
from optimizer_codemod.analysis.parameter_groups import gathered_module
from optimizer_codemod.analysis.parameter_loops import (
    PARAMETER_METHODS,
    iterated_parameter_calls,
    parameter_update_loops,
    reads_gradient,
)
from optimizer_codemod.analysis.scopes import name_uses
from optimizer_codemod.analysis.values import (
    ACCELERATOR,
    alias_in,
    attribute_aliases,
    attribute_assignments,
    built_by,
    calls_named,
    declares_global,
    imported_module_class,
    imported_registry,
    locally_assigned,
    method_class,
    module_function,
    name_mentions,
    outside_value,
    parameter_names,
    parameter_receiving,
    standalone_class,
    Source,
    the_callers,
    value_sources,
)

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.collect import Assignment, CallSite, Loop
    from optimizer_codemod.analysis.parameter_loops import ParameterUpdateLoop
    from optimizer_codemod.analysis.project import ImportedClass
    from optimizer_codemod.analysis.script import ScriptFacts

MAX_DEPTH = 4
# Methods that switch a module's mode or clear its gradients: not a forward pass.
MODE_METHODS = frozenset({"train", "eval", "zero_grad", "requires_grad_"})
MODULE_BASE = "torch.nn.Module"
# Calls that return a model from outside this file.
MODEL_FACTORIES = ("torchvision.models.", "timm.create_model", "timm.models.")
# Modules of those builders, whose namespace a script may look an architecture up in by name.
FACTORY_MODULES = tuple(prefix for prefix in MODEL_FACTORIES if prefix.endswith("."))
PRETRAINED_METHOD = "from_pretrained"
PLACEMENT_METHODS = frozenset({"to", "cuda"})
# Functions that change the module they are handed in place and return that same object:
# `nn.SyncBatchNorm.convert_sync_batchnorm(model)` swaps its BatchNorm children for
# SyncBatchNorm ones (a new object only for a lone BatchNorm layer, which no script trains).
MODULE_KEEPING_FUNCTIONS = frozenset({"convert_sync_batchnorm"})
DATA_PARALLEL_WRAPPERS = frozenset(
    {
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.distributed.fsdp.FullyShardedDataParallel",
    }
)
# `nn.DataParallel`, under the names a qualified name resolves it to.
DATA_PARALLEL = (
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
)
# DistributedDataParallel's constructor, as a qualified name resolves it.
DDP_CLASSES = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
)
WRAPPER_NAMES = frozenset(name.rsplit(".", 1)[-1] for name in DATA_PARALLEL_WRAPPERS) | {
    "DDP",
    "FSDP",
}
GRADIENT_CLIPPING = frozenset(
    f"torch.nn.utils.{name}" for name in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm")
)
NO_GRAD_CONTEXTS = frozenset({"torch.no_grad", "torch.inference_mode"})
# Source text of a decorator that may be `torch.no_grad` (a cheap test before parsing).
NO_GRAD_DECORATOR = r"@[ \t]*(?:torch\.(?:autograd\.)?)?no_grad\b"
COMPILE_FUNCTIONS = ("torch.compile", "torch.jit.script", "torch.jit.trace")
NOT_MODULES = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch.nn.Buffer"})
# Dropout that draws one mask element per activation element, in memory order: on a tensor
# whose memory format changes (channels_last), a seeded run drops other elements (checked with
# torch 2.13.0+cpu: `F.dropout` and `nn.Dropout` differ). Channel-wise dropout
# (`Dropout1d/2d/3d`, `FeatureAlphaDropout`) draws an (N, C, 1, 1) mask whose memory order does
# not depend on the input's, so it is not listed. Alpha dropout agrees on CPU but draws an
# element-wise mask too, so it is listed rather than trusted to a kernel detail.
ELEMENTWISE_DROPOUT = frozenset(
    {
        *(f"torch.nn.{kind}" for kind in ("Dropout", "AlphaDropout")),
        *(f"torch.nn.modules.dropout.{kind}" for kind in ("Dropout", "AlphaDropout")),
        *(f"torch.nn.functional.{fn}" for fn in ("dropout", "alpha_dropout")),
        *(f"torch.{fn}" for fn in ("dropout", "dropout_", "alpha_dropout", "alpha_dropout_")),
    }
)
# Random draws shaped like an activation: `torch.randn_like(mu)` allocates in `mu`'s memory
# format and fills it in memory order, so in channels_last a seeded run gives each element
# other noise (checked with torch 2.13.0+cpu; `F.gumbel_softmax` allocates its noise
# contiguous and agrees). In-place fills draw in the receiver's memory order too.
ELEMENTWISE_RANDOM_FUNCTIONS = frozenset(
    f"torch.{fn}" for fn in ("randn_like", "rand_like", "randint_like", "bernoulli", "normal")
)
ELEMENTWISE_RANDOM_METHODS = frozenset(
    {"bernoulli", "bernoulli_", "normal_", "uniform_", "exponential_", "random_"}
)
# A parameter's own tensor (`m.weight.data`): an in-place draw into it initialises the model.
_PARAMETER_RECEIVER = re.compile(r"\b(weight|bias)(\.data)?$")
# torchvision builders whose networks apply element-wise dropout to 4-D feature maps
# (SqueezeNet's classifier and DenseNet's `drop_rate` before a convolution, the ASPP and FCN
# heads); the others drop only flattened 2-D features.
SPATIAL_DROPOUT_MODELS = tuple(
    f"torchvision.models.{name}"
    for name in ("squeezenet", "densenet", "segmentation.deeplabv3", "segmentation.fcn")
)

# cuDNN-backed recurrent layers: CUDA autocast runs them in float16 whatever dtype it was asked
# for, and Dynamo graph-breaks on them unless `torch._dynamo.config.allow_rnn` (OPT302, OPT402).
RECURRENT_LAYERS = frozenset(
    f"torch.nn.{prefix}{kind}" for prefix in ("", "modules.rnn.") for kind in ("RNN", "LSTM", "GRU")
)

# Calls that build or multiply sparse tensors: torch.compile does not trace them (Dynamo:
# "torch.compile does not support sparse Tensors"), besides `torch.sparse.*`, `torch.sparse_*`
# and `.to_sparse*()`.
SPARSE_FUNCTIONS = frozenset({"torch.spmm", "torch.smm", "torch.hspmm", "torch.sspaddmm"})


@dataclass(frozen=True)
class TrainedModel:
    """A model whose parameters an optimizer, or a hand-written update, updates."""

    name: str  # dotted: "model", "self.net"
    # The optimizer construction that receives its parameters; for a hand-written update
    # (`updated_by`), the `.parameters()` call whose tensors the update loop iterates.
    optimizer: "CallSite"
    wrapped_as: Optional[str]  # the name of its DistributedDataParallel/DataParallel wrapper
    # For `self.X`: the class whose methods assign it (another class's `self.X` is another
    # object); None for other names.
    owner: Optional[str] = None
    # When the optimizer is built in a function that receives the model as a parameter
    # (`def train(model, ...): opt = AdamW(model.parameters())`), the one call that hands it
    # over (`train(net, ...)`); `name` is then the caller's name for the model.
    handed_in: Optional["CallSite"] = None
    # A training step without `torch.optim`: the loop that updates each parameter from its
    # gradient (`p -= lr * p.grad` after `loss.backward()`); None when an optimizer does.
    updated_by: Optional["ParameterUpdateLoop"] = None

    @property
    def spellings(self) -> Set[str]:
        """The names the model is called by: its own, and its data-parallel wrapper's."""
        return {self.name} | ({self.wrapped_as} if self.wrapped_as else set())

    @property
    def scope(self) -> Optional[cst.FunctionDef]:
        """The function that reads the model by `name`, where it must be built."""
        site = self.handed_in.site if self.handed_in is not None else self.optimizer.site
        return site.function

    @property
    def needed_at(self) -> int:
        """The visit order by which the model must be built: the optimizer's construction, or
        the call that hands the model to the function building it."""
        site = self.handed_in.site if self.handed_in is not None else self.optimizer.site
        return site.order


@dataclass(frozen=True)
class TrainingStep:
    """One backward call in a loop, and the statements before it that compute its loss."""

    loop: "Loop"
    backward: "CallSite"
    loss: str  # the name backward is called on (through `scaler.scale(...)` when scaled)
    scaler: Optional[str]
    block: Tuple[cst.BaseStatement, ...]  # the body holding the backward statement
    forward: Tuple[cst.BaseStatement, ...]  # from the first statement calling the model to
    # the last one assigning the loss, all before backward in `block`


# Models -------------------------------------------------------------------------------------
def is_module_class(facts: "ScriptFacts", class_name: str, depth: int = 0) -> bool:
    """A class of this file deriving (through classes of this file) from nn.Module."""
    info = facts.classes.get(class_name)
    if info is None or depth > MAX_DEPTH:
        return False
    for base in info.bases:
        if base is None:
            continue
        if base == MODULE_BASE or (base.startswith("torch.nn.") and base[9:10].isupper()):
            return True
        if is_module_class(facts, base, depth + 1):
            return True
    return False


def builds_module(
    facts: "ScriptFacts",
    node: cst.BaseExpression,
    depth: int = 0,
    function: Optional[cst.FunctionDef] = None,
) -> bool:
    """`node` evaluates to an nn.Module: a module class of this file or of torch.nn called,
    a torchvision/timm/`from_pretrained` model, or a module placed or cast (`model.to(...)`).
    `function` is the scope `node` is evaluated in (see holds_module); an argument passed
    from another module of the run, what its caller's analysis said (values.outside_value)."""
    outside = outside_value(facts, node)
    if outside is not None:
        return outside.module
    if isinstance(node, cst.IfExp) and depth <= MAX_DEPTH:
        # `raw_model = model.module if ddp else model` (nanoGPT)
        return all(builds_module(facts, n, depth + 1, function) for n in (node.body, node.orelse))
    if isinstance(node, cst.Attribute) and node.attr.value == "module" and depth <= MAX_DEPTH:
        # What a data-parallel wrapper (or `torch.compile`'s) wraps, of a name holding it.
        return builds_module(facts, node.value, depth + 1, function)
    if depth > MAX_DEPTH or not isinstance(node, cst.Call):
        name = dotted_name(node) if depth <= MAX_DEPTH else None
        return name is not None and holds_module(facts, name, depth + 1, function)
    qualname = facts.qualified_name(node.func) or ""
    if qualname.startswith("torch.nn.") and qualname.rsplit(".", 1)[-1][:1].isupper():
        return qualname not in DATA_PARALLEL_WRAPPERS and qualname not in NOT_MODULES
    if qualname.startswith(MODEL_FACTORIES):
        return True
    if isinstance(node.func, cst.Name) and is_module_class(facts, node.func.value):
        return True
    if factory_definition(facts, node.func) is not None:
        return True
    if imported_module_class(facts, node.func):
        return True
    if built_by_name(facts, node.func):
        return True
    method = callee_name(node) if isinstance(node.func, cst.Attribute) else None
    if method == PRETRAINED_METHOD:
        return True
    if method in MODULE_RETURNING_METHODS:
        inner = receiver(node)
        return inner is not None and builds_module(facts, inner, depth + 1, function)
    return False


# Models built by name -------------------------------------------------------------------------
def by_name_lookup(
    facts: "ScriptFacts", func: cst.BaseExpression
) -> Optional[Tuple[cst.BaseExpression, bool]]:
    """(the container, a dotted name, and whether it is a module's namespace) when `func`
    looks a callable up by a name: `M.__dict__[k]`, `vars(M)[k]` and `getattr(M, k)` in
    module M's namespace, `R[k]` in the container R; else None."""
    container: Optional[cst.BaseExpression] = None
    namespace = True
    if isinstance(func, cst.Subscript) and len(func.slice) == 1:
        value = func.value
        if isinstance(value, cst.Attribute) and value.attr.value == "__dict__":
            container = value.value
        elif _builtin_call(facts, value, "vars", 1):
            container = value.args[0].value
        else:
            container, namespace = value, False
    elif _builtin_call(facts, func, "getattr", 2):
        container = func.args[0].value
    if container is None or dotted_name(container) is None:
        return None
    return container, namespace


def _builtin_call(facts: "ScriptFacts", node: cst.BaseExpression, name: str, count: int) -> bool:
    """`name(...)` with `count` plain positional arguments, `name` not bound by the file."""
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value == name
        and not facts.imports.is_bound(name)
        and len(node.args) == count
        and len(positional(node)) == count
    )


def built_by_name(facts: "ScriptFacts", func: cst.BaseExpression) -> bool:
    """Calling `func` builds an nn.Module whichever name it looks up (by_name_lookup): a name
    of a module of model builders that MODEL_FACTORIES trusts (`models.__dict__[args.arch]`
    for torchvision.models), an item of a dict of this file whose every value builds a module
    (registry_builders), or a name of a dict or module of another module of the run that the
    project index found so (values.imported_registry)."""
    lookup = by_name_lookup(facts, func)
    if lookup is None:
        return False
    container, namespace = lookup
    if namespace and f"{facts.qualified_name(container)}.".startswith(FACTORY_MODULES):
        return True
    name = dotted_name(container) or ""
    imported = imported_registry(facts, name)
    if imported is not None:
        return imported.namespace == namespace
    return not namespace and registry_builders(facts, name) is not None


def registry_builders(facts: "ScriptFacts", name: str) -> Optional[Tuple[cst.CSTNode, ...]]:
    """The definitions of this file (classes, functions) that calling an item of the dict
    `name` may run, when `name` is a dict of this file whose every value builds an nn.Module
    when called (builder_definitions) and which nothing but lookups reads (registry_unchanged);
    None when it is not (one value that is not a module builder is enough), memoised."""
    memo = facts.memo("registry_builders")
    if name in memo:
        return memo[name]
    memo[name] = None  # a registry that holds itself is none
    assignments = facts.assignments_to(name)
    value = assignments[0].value if len(assignments) == 1 else None
    if (
        isinstance(value, cst.Dict)
        and value.elements
        and assignments[0].site.function is None
        and assignments[0].site.class_name is None
        and not facts.records.definition_counts.get(name)
        and registry_unchanged(facts, name, 1)
    ):
        found: Dict[int, cst.CSTNode] = {}
        for element in value.elements:
            definitions = (
                builder_definitions(facts, element.value)
                if isinstance(element, cst.DictElement)
                else None  # `**other`: values not shown
            )
            if definitions is None:
                return None
            found.update((id(d), d) for d in definitions)
        memo[name] = tuple(found.values())
    return memo[name]


def builder_definitions(
    facts: "ScriptFacts", value: cst.BaseExpression, depth: int = 0
) -> Optional[List[cst.CSTNode]]:
    """The definitions of this file that calling `value` runs, when the call builds an
    nn.Module: a module class of this file (is_module_class), a function of this file that
    returns one (returns_module), `functools.partial` of either, a lambda whose body builds
    one, or a builder MODEL_FACTORIES trusts (`torchvision.models.resnet18`: none of this
    file); None otherwise."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(value, cst.Lambda):
        if not builds_module(facts, value.body, depth + 1):
            return None
        called = (dotted_name(call.func) for call in find_all(value.body, cst.Call))
        return [facts.top_level_definitions[c] for c in called if c in facts.top_level_definitions]
    if isinstance(value, cst.Call):
        args = positional(value)
        if facts.qualified_name(value.func) == "functools.partial" and args:
            return builder_definitions(facts, args[0].value, depth + 1)
        return None
    if (facts.qualified_name(value) or "").startswith(MODEL_FACTORIES):
        return []
    name = value.value if isinstance(value, cst.Name) else None
    definition = facts.top_level_definitions.get(name) if name else None
    if isinstance(definition, cst.ClassDef) and not facts.assignments_to(name):
        return [definition] if is_module_class(facts, name) else None
    factory = factory_definition(facts, value)
    return [factory] if factory is not None else None


def factory_definition(facts: "ScriptFacts", func: cst.BaseExpression) -> Optional[cst.FunctionDef]:
    """The function of this file's top level that `func` names, never rebound, when every
    return of it builds an nn.Module (returns_module): `model = build_model(args)` after
    `def build_model(args): return Net(args.width)`. None otherwise."""
    if not isinstance(func, cst.Name) or facts.assignments_to(func.value):
        return None
    definition = facts.top_level_definitions.get(func.value)
    if not isinstance(definition, cst.FunctionDef):
        return None
    return definition if returns_module(facts, definition) else None


def factory_classes(facts: "ScriptFacts", name: str) -> Set[str]:
    """The nn.Module classes of this file that the function `name` builds, directly or
    through the functions of this file it calls by name: what a factory's model may be."""
    classes: Set[str] = set()
    pending, seen = [name], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for call in facts.calls_made_in(current):
            called = call.node.func.value if isinstance(call.node.func, cst.Name) else None
            if called in facts.classes and is_module_class(facts, called):
                classes.add(called)
            elif called in facts.records.functions:
                pending.append(called)
    return classes


def returns_module(facts: "ScriptFacts", function: cst.FunctionDef) -> bool:
    """Every `return` of `function` (one at least; it is no generator, has no decorator that
    could change what it returns, and defines nothing nested whose returns would be mixed in)
    builds an nn.Module. Memoised."""
    memo = facts.memo("returns_module")
    key = id(function)
    if key not in memo:
        memo[key] = False  # a function returning its own call is not known to build one
        returns = find_all(function.body, cst.Return)
        memo[key] = (
            bool(returns)
            and not function.decorators
            and not find_all(function.body, cst.FunctionDef, cst.ClassDef, cst.Yield)
            and all(
                r.value is not None and _returned_module(facts, r.value, function) for r in returns
            )
        )
    return memo[key]


def _returned_module(
    facts: "ScriptFacts", value: cst.BaseExpression, function: cst.FunctionDef
) -> bool:
    """`value`, returned by `function`, builds a module; a name the function assigns is read
    in the function alone (`model = Net(...); return model`), whatever else of that name the
    file holds."""
    name = value.value if isinstance(value, cst.Name) else None
    if name is None or declares_global(function, name) or name in parameter_names(function):
        return builds_module(facts, value, 0, function)
    own = [a for a in facts.in_function("assignments", function) if a.target == name]
    built = [a for a in own if not _rebinds_itself(a, name)]
    return bool(built) and all(
        not a.unpacked and not a.augmented and builds_module(facts, a.value, 0, function)
        for a in built
    )


def namespace_builders(facts: "ScriptFacts") -> Optional[Tuple[cst.CSTNode, ...]]:
    """The public classes and functions of this module when looking any public name up in
    its namespace (`models_mae.__dict__[args.model]`) and calling it builds an nn.Module:
    every public class it defines is a module class, every public function returns a module,
    and every other public name it assigns at its top level is an alias of one of them, a
    literal or a display (calling a number or a dict raises: the script breaks as written). Names it
    imports are what it uses, not what it offers, and are not looked at. None otherwise,
    memoised."""
    memo = facts.memo("namespace_builders")
    if "found" not in memo:
        memo["found"] = _namespace_builders(facts)
    return memo["found"]


def _namespace_builders(facts: "ScriptFacts") -> Optional[Tuple[cst.CSTNode, ...]]:
    definitions = facts.top_level_definitions
    for statement in facts.module.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            if statement.name.value not in definitions:
                return None  # defined twice
        elif not isinstance(statement, cst.SimpleStatementLine) and not (
            isinstance(statement, cst.If) and is_main_guard(statement)
        ):
            if find_all(statement, cst.FunctionDef, cst.ClassDef):
                return None  # defined under a condition
    found: Dict[str, cst.CSTNode] = {}
    for name in definitions:
        if not name.startswith("_"):
            built = builder_definitions(facts, cst.Name(name))
            if built is None:
                return None
            found.update((d.name.value, d) for d in built)
    for assignment in facts.records.assignments:
        site = assignment.site
        if site.function is not None or site.class_name is not None:
            continue
        if assignment.target.startswith("_") or "." in assignment.target:
            continue
        value = assignment.value
        aliased = isinstance(value, cst.Name) and value.value in found
        if not (aliased or _not_callable(value)):
            return None
    return tuple(found.values()) if found else None


def _not_callable(node: cst.BaseExpression) -> bool:
    """A literal or a display (`{...}`, `[...]`, a comprehension): calling it raises."""
    return isinstance(node, _NOT_CALLABLE) or (
        isinstance(node, cst.Name) and node.value in ("True", "False", "None")
    )


_NOT_CALLABLE = (
    cst.SimpleString,
    cst.ConcatenatedString,
    cst.FormattedString,
    cst.Integer,
    cst.Float,
    cst.Imaginary,
    cst.Dict,
    cst.List,
    cst.Tuple,
    cst.Set,
    cst.DictComp,
    cst.ListComp,
    cst.SetComp,
)


def registry_unchanged(facts: "ScriptFacts", name: str, spelled: int) -> bool:
    """Nothing in this file but lookups, read-only calls and tests (`name[k](...)`,
    `name.keys()`, `sorted(name)`, `k in name`, `for k in name`) mentions the registry `name`
    (dotted for `module.REGISTRY`), besides the `spelled` mentions that bind it (its
    assignment, an import): no item is set, no `update`, it is handed to no function that
    could change it."""
    counts = facts.records.name_counts
    if "." in name:
        counts, last = facts.records.attribute_counts, name.rpartition(".")[2]
    else:
        last = name
    return counts.get(last, 0) == spelled + _registry_reads(facts).get(name, 0)


def _registry_reads(facts: "ScriptFacts") -> Dict[str, int]:
    """{dotted name: how many of its mentions are reads that change nothing}, memoised."""
    memo = facts.memo("registry_reads")
    if "found" not in memo:
        reads: Dict[str, int] = {}
        for call in facts.records.calls:
            func = call.node.func
            names: List[Optional[str]] = []
            if isinstance(func, cst.Subscript):
                names.append(dotted_name(func.value))
            elif call.method in _REGISTRY_READ_METHODS:
                names.append(call.receiver)
            elif isinstance(func, cst.Name) and func.value in _REGISTRY_READ_FUNCTIONS:
                if not facts.imports.is_bound(func.value):
                    names.extend(dotted_name(a.value) for a in call.node.args if not a.star)
            for name in names:
                if name is not None:
                    reads[name] = reads.get(name, 0) + 1
        # `for name in NETS:`, `[... for name in NETS]` and `name in NETS` read it too.
        iterated = [loop.iter for loop in facts.records.loops if loop.iter is not None]
        iterated += [comprehension.iter for comprehension in facts.records.comprehensions]
        tested = [
            part.comparator
            for comparison in find_all(facts.module, cst.Comparison)
            for part in comparison.comparisons
            if isinstance(part.operator, (cst.In, cst.NotIn))
        ]
        for node in iterated + tested:
            name = dotted_name(node)
            if name is not None:
                reads[name] = reads.get(name, 0) + 1
        memo["found"] = reads
    return memo["found"]


_REGISTRY_READ_METHODS = frozenset({"keys", "values", "items", "get"})
_REGISTRY_READ_FUNCTIONS = frozenset({"sorted", "list", "tuple", "set", "len", "iter"})


def holds_module(
    facts: "ScriptFacts", name: str, depth: int = 0, function: Optional[cst.FunctionDef] = None
) -> bool:
    """Every assignment to `name` builds a module; `model = model.to(device)` keeps one.

    Read in `function` (when given), `self.X` is looked up in that method's class only, and a
    parameter the function never reassigns is the argument at its one call site
    (values.value_sources); other names, file-wide."""
    if function is not None and depth <= MAX_DEPTH:
        sources = value_sources(facts, name, function)
        if sources is not None:
            built = [
                s
                for s in sources
                if s.assignment is None or not _rebinds_itself(s.assignment, name)
            ]
            return bool(built) and all(
                (s.assignment is None or (not s.assignment.unpacked and not s.assignment.augmented))
                and builds_module(facts, s.value, depth, s.function)
                for s in built
            )
    assignments = facts.assignments_to(name)
    built = [a for a in assignments if not _rebinds_itself(a, name)]
    return bool(built) and all(
        not a.unpacked and not a.augmented and builds_module(facts, a.value, depth, a.site.function)
        for a in built
    )


def _rebinds_itself(assignment: "Assignment", name: str) -> bool:
    """`model = model.to(device)`, `model = torch.compile(model)`, `model = DDP(model)`:
    `name` from itself; also `model, opt = accelerator.prepare(model, opt)`, which places
    the model and may wrap it for data parallelism, as DDP does."""
    if assignment.unpacked or is_prepare(assignment.value):
        return _prepared_in_place(assignment, name)
    node = assignment.value
    while isinstance(node, cst.Call):
        if isinstance(node.func, cst.Attribute) and callee_name(node) in MODULE_RETURNING_METHODS:
            node = node.func.value
        elif node.args and callee_name(node) in ("compile", "script", "trace"):
            node = node.args[0].value
        elif node.args and callee_name(node) in MODULE_KEEPING_FUNCTIONS:
            node = node.args[0].value
        elif node.args and _is_wrapper_call(node):
            node = node.args[0].value
        else:
            return False
    return dotted_name(node) == name


def keeps_module_object(assignment: "Assignment", name: str) -> bool:
    """`model = nn.SyncBatchNorm.convert_sync_batchnorm(model)`: `name` is bound again to the
    object it held (MODULE_KEEPING_FUNCTIONS), so what was done to it before (compiling, a
    memory format) stays done."""
    value = assignment.value
    return (
        not assignment.unpacked
        and isinstance(value, cst.Call)
        and callee_name(value) in MODULE_KEEPING_FUNCTIONS
        and bool(value.args)
        and value.args[0] in positional(value)
        and dotted_name(value.args[0].value) == name
    )


def _prepared_in_place(assignment: "Assignment", name: str) -> bool:
    """`a, model, b = accelerator.prepare(x, model, y)` (or `model = accelerator.prepare(model)`):
    `name` takes back what it handed in at the same position."""
    statement = assignment.statement_node
    value = assignment.value
    if not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
        return False
    if not is_prepare(value) or has_star_args(value):
        return False
    target = statement.targets[0].target
    if not assignment.unpacked:
        args = positional(value)
        return len(args) == len(value.args) == 1 and dotted_name(args[0].value) == name
    if not isinstance(target, (cst.Tuple, cst.List)):
        return False
    names = [dotted_name(element.value) for element in target.elements]
    args = positional(value)
    return (
        len(names) == len(args) == len(value.args)
        and names.count(name) == 1
        and dotted_name(args[names.index(name)].value) == name
    )


def _is_wrapper_call(node: cst.Call) -> bool:
    # Only the import table knows the wrapper's qualified name; the collector stores none for
    # assignments, so match on the callee's last name here.
    return callee_name(node) in WRAPPER_NAMES


def wrapper_assignments(facts: "ScriptFacts", model: str) -> List["Assignment"]:
    """`x = DistributedDataParallel(model, ...)` and the like, for this model."""
    found = []
    for assignment in facts.records.assignments:
        value = assignment.value
        if wrapped_model(facts, value) == model:
            found.append(assignment)
    return found


def wrapped_model(facts: "ScriptFacts", value: Optional[cst.BaseExpression]) -> Optional[str]:
    """`model` for `DistributedDataParallel(model, ...)`, for a wrapper built around the
    model's placement, `DDP(model.to(device), ...)`, and for a wrapper placed once built,
    `DDP(model, device_ids=[rank]).to(device)` (HiFi-GAN); None for anything else."""
    value = _placed_once_built(value)
    if not isinstance(value, cst.Call):
        return None
    if facts.qualified_name(value.func) not in DATA_PARALLEL_WRAPPERS:
        return None
    args = positional(value)
    if not args:
        return None
    inner = args[0].value
    while (
        isinstance(inner, cst.Call)
        and isinstance(inner.func, cst.Attribute)
        and inner.func.attr.value in PLACEMENT_METHODS
    ):
        inner = inner.func.value
    return dotted_name(inner)


def _placed_once_built(value: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
    """The call a placement is applied to, `DDP(model, ...)` in `DDP(model, ...).to(device)`;
    `value` itself when it is no placement of a call's result."""
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in PLACEMENT_METHODS
        and isinstance(value.func.value, cst.Call)
    ):
        value = value.func.value
    return value


def places_while_wrapping(facts: "ScriptFacts", statement: cst.BaseStatement, model: str) -> bool:
    """`model = DDP(model.to(device), ...)`: the statement that places the model also wraps
    it, so what must happen between the two (compiling, a memory format) goes before it."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    assign = statement.body[0]
    if not isinstance(assign, cst.Assign):
        return False
    value = assign.value
    # `DDP(model, ...).to(device)` wraps a model placed before (or placed by that `.to`,
    # after which compiling the inner module still comes first): not a placement inside.
    return wrapped_model(facts, value) == model and isinstance(
        positional(_placed_once_built(value))[0].value, cst.Call
    )


def unwrapped(facts: "ScriptFacts", name: str) -> Tuple[str, Optional[str]]:
    """(the model, its data-parallel wrapper) for `ddp_model = DDP(model, ...)` or
    `model = DDP(model)`; (name, None) when `name` is not a wrapper."""
    for assignment in facts.assignments_to(name):
        inner = wrapped_model(facts, assignment.value)
        if inner is not None:
            return inner, name
    return name, None


def _parameter_owners(facts: "ScriptFacts", node: cst.BaseExpression) -> Set[str]:
    """Names whose `.parameters()` (or `named_parameters()`) reach `node`, directly, through a
    helper that gathers them into groups (`utils.set_weight_decay(model, wd)`,
    parameter_groups.py), or through names assigned up to MAX_DEPTH steps away (`params =
    list(model.parameters())`). Each name is followed once: library code reassigns the same
    names many times."""
    owners: Set[str] = set()
    seen: Set[str] = set()
    frontier = [node]
    for _ in range(MAX_DEPTH + 1):
        following: List[cst.BaseExpression] = []
        for expression in frontier:
            for call in find_all(expression, cst.Call):
                if callee_name(call) in PARAMETER_METHODS:
                    inner = receiver(call)
                    name = dotted_name(inner) if inner is not None else None
                else:
                    name = gathered_module(facts, call)
                if name is not None:
                    owners.add(name.removesuffix(".module"))
            for name_node in find_all(expression, cst.Name):
                if name_node.value in seen:
                    continue
                seen.add(name_node.value)
                following.extend(
                    a.value for a in facts.assignments_to(name_node.value) if not a.unpacked
                )
        frontier = following
    return owners


def trained_models(facts: "ScriptFacts") -> List[TrainedModel]:
    """Models of this file that an optimizer trains, one per (model, optimizer) pair, then
    those a hand-written update trains (see hand_updated_models)."""
    memo = facts.memo("trained_models")
    if "found" in memo:
        return memo["found"]
    found: List[TrainedModel] = []
    if facts.trains:
        for optimizer in facts.optimizer_constructions() + _custom_optimizer_constructions(facts):
            args = positional(optimizer.node)
            if not args:
                continue
            for owner in sorted(_parameter_owners(facts, args[0].value)):
                model = _trained_model(facts, owner, optimizer)
                if model is not None:
                    found.append(model)
        for optimizer in optimizers_built_by_models(facts):
            model = _trained_model(facts, optimizer.receiver, optimizer)
            if model is not None:
                found.append(model)
        for optimizer, owner in optimizers_built_by_helpers(facts):
            model = _trained_model(facts, owner, optimizer)
            if model is not None:
                found.append(model)
        found.extend(hand_updated_models(facts, {m.name for m in found}))
    memo["found"] = found
    return found


def optimizers_built_by_models(facts: "ScriptFacts") -> List["CallSite"]:
    """`self.optimizer = model.configure_optimizers(config)`: a method of the model, named for
    optimizers, builds the optimizer (minGPT, nanoGPT, Lightning's habit). Taken only where
    the result is the one value ever assigned to a name (a `None` placeholder aside) and that
    name's `.step()` is called: evidence that the result is one optimizer, not a list or a
    (optimizer, scheduler) pair."""
    memo = facts.memo("optimizers_built_by_models")
    if "found" not in memo:
        memo["found"] = [
            call
            for call in facts.records.calls
            if call.receiver is not None
            and "optimizer" in (call.method or "")
            and _one_stepped_result(facts, call)
        ]
    return memo["found"]


def optimizers_built_by_helpers(facts: "ScriptFacts") -> List[Tuple["CallSite", str]]:
    """`optimizer = set_optimizer(opt, model)` (SupContrast): a helper that gathers the
    parameters of a module it is handed (parameter_groups.py) and whose result is stepped
    like an optimizer, with the name it is handed. The same evidence as for
    optimizers_built_by_models: the result is the one value ever assigned to its name (a
    `None` placeholder aside), and that name's `.step()` is called."""
    memo = facts.memo("optimizers_built_by_helpers")
    if "found" not in memo:
        handed = ((call, gathered_module(facts, call.node)) for call in facts.records.calls)
        memo["found"] = [
            (call, owner.removesuffix(".module"))
            for call, owner in handed
            if owner is not None and _one_stepped_result(facts, call)
        ]
    return memo["found"]


def _one_stepped_result(facts: "ScriptFacts", call: "CallSite") -> bool:
    """Whether `call`'s result is assigned to a name whose `.step()` is called, and nothing
    but a `None` placeholder is ever assigned to that name besides."""
    memo = facts.memo("stepped_receivers")
    if "found" not in memo:
        memo["found"] = {c.receiver for c in facts.records.calls if c.method == "step"}
    assignment = facts.assignment_of(call.node)
    if assignment is None or assignment.unpacked or assignment.target not in memo["found"]:
        return False
    others = [
        a
        for a in facts.assignments_to(assignment.target)
        if a is not assignment and _bind_one_variable(a, assignment)
    ]
    return all(is_name(a.value, "None") and not a.augmented for a in others)


def _bind_one_variable(one: "Assignment", other: "Assignment") -> bool:
    """Both bind one variable: an attribute (`self.optimizer`) anywhere, a plain name in one
    scope (nanoGPT's `configure_optimizers` binds a local `optimizer` of its own) or declared
    `global`/`nonlocal` in either function."""
    if "." in one.target or one.site.function is other.site.function:
        return True
    return any(
        function is not None and declares_global(function, one.target)
        for function in (one.site.function, other.site.function)
    )


def _trained_model(
    facts: "ScriptFacts",
    owner: str,
    parameters_to: "CallSite",
    updated_by: Optional["ParameterUpdateLoop"] = None,
) -> Optional[TrainedModel]:
    """The model `owner` names where `parameters_to` (an optimizer construction, or the
    `.parameters()` call a hand-written update iterates) takes its parameters; None when
    `owner` is not followed to a module."""
    scope = parameters_to.site.function
    model, wrapper = unwrapped(facts, attribute_aliases(facts, scope).get(owner, owner))
    if not holds_module(facts, model, 0, scope):
        return None
    handed = _handed_in(facts, model, scope) if wrapper is None else None
    if handed is not None:
        return TrainedModel(handed[0], parameters_to, None, None, handed[1], updated_by)
    owning_class = method_class(facts, scope) if model.startswith("self.") else None
    if owning_class is not None and not standalone_class(facts, owning_class):
        owning_class = None  # a class hierarchy: `self.X` is looked up file-wide
    return TrainedModel(model, parameters_to, wrapper, owning_class, None, updated_by)


def hand_updated_models(facts: "ScriptFacts", known: Set[str]) -> List[TrainedModel]:
    """Models trained without `torch.optim`: a loop over `model.parameters()` that runs every
    step and updates each parameter in place from its gradient (`p -= lr * p.grad`,
    `p.data.sub_(lr * p.grad)`, SGLD's added noise; analysis/parameter_loops.py). Models in
    `known` (an optimizer trains them already) are left out."""
    found: List[TrainedModel] = []
    for update in parameter_update_loops(facts):
        if not reads_gradient(update):
            continue
        for call in iterated_parameter_calls(facts, update):
            owner = (call.receiver or "").removesuffix(".module")
            if not owner or owner in known:
                continue
            model = _trained_model(facts, owner, call, update)
            if model is not None and model.name not in known:
                found.append(model)
    return found


def _handed_in(
    facts: "ScriptFacts", name: str, function: Optional[cst.FunctionDef]
) -> Optional[Tuple[str, "CallSite"]]:
    """(the caller's name, the first call) when `name` is a parameter of `function` bound,
    at its one call site or at each of its calls, to a plain name of the caller:
    `train(net, ...)` for `model`."""
    if "." in name or function is None:
        return None
    sources = value_sources(facts, name, function)
    if not sources or len(sources) != 1 or sources[0].assignment is not None:
        return None
    outer = dotted_name(sources[0].value)
    callers = the_callers(facts, function)
    if outer is None or "." in outer or not callers:
        return None
    return outer, callers[0]  # the first call: where the model must be built by


def _custom_optimizer_constructions(facts: "ScriptFacts") -> List["CallSite"]:
    """Constructions of optimizer classes written in this file."""
    classes = {
        name
        for name, info in facts.classes.items()
        if any((base or "").startswith("torch.optim.") for base in info.bases)
    }
    return [
        call
        for call in facts.records.calls
        if isinstance(call.node.func, cst.Name) and call.node.func.value in classes
    ]


def the_trained_model(facts: "ScriptFacts") -> Optional[TrainedModel]:
    """The one model this file trains, or None when there are none or several."""
    models = each_trained_model(facts)
    return models[0] if len(models) == 1 else None


def each_trained_model(facts: "ScriptFacts") -> List[TrainedModel]:
    """Every model this file trains, once each (its first optimizer), in source order."""
    seen: Set[Tuple[str, Optional[str]]] = set()
    found: List[TrainedModel] = []
    for model in trained_models(facts):
        if (model.name, model.owner) not in seen:
            seen.add((model.name, model.owner))
            found.append(model)
    return found


# How many functions up from a `.backward()` call `backward_runs_once` follows its callers.
_CALLER_DEPTH = 4


def backward_runs_once(facts: "ScriptFacts") -> "CallSite | None":
    """The file's first `.backward()` call when every one of them runs at most once per
    process (a demo that takes one step): written as a whole statement in no loop, at module
    level or in a function of this file that is named nowhere but in such calls, each of
    which runs once in the same sense, up to module level. None when a step may repeat or
    the analysis cannot tell (a method, a function handed to `mp.spawn` or a callback)."""
    memo = facts.memo("backward_runs_once")
    if "call" not in memo:
        calls = facts.method_calls("backward")
        once = bool(calls) and all(_runs_once(facts, call, 0) for call in calls)
        memo["call"] = calls[0] if once else None
    return memo["call"]


def one_training_step(facts: "ScriptFacts") -> Optional[str]:
    """Why the file's training is one step, said for rules whose gain is paid for up front
    (compiling, cuDNN autotuning): the lone backward call (backward_runs_once); None when a
    step may repeat."""
    once = backward_runs_once(facts)
    if once is None:
        return None
    return (
        f"the file takes one training step (`{excerpt(once.node)}` runs in no loop that "
        "repeats, nor in a function called from one)"
    )


# In-place initialisers of weights: a random one fills a tensor in its memory order.
_IN_PLACE_INIT_PREFIX = "torch.nn.init."


def initialised_after(
    facts: "ScriptFacts", model: TrainedModel, anchor: cst.CSTNode
) -> Optional[cst.CSTNode]:
    """The last statement after `anchor`, in the same block, that initialises the model's
    weights in place (`model.apply(weights_init)`, `nn.init.normal_(model.fc.weight)`); None
    when none does. A memory-format conversion must come after it: a random initialiser
    fills a channels_last tensor in another order, so a seeded run starts elsewhere."""
    block = body_holding(facts, anchor)
    if block is None:
        return None
    statements = list(block.body)
    later = statements[statements.index(anchor) + 1 :]
    # `self.apply(self._init_weights)` after `self.G = Generator()` reaches `self.G` too.
    parts = model.name.split(".")
    holders = {".".join(parts[:end]) for end in range(1, len(parts) + 1)}
    found = None
    for statement in later:
        for node in find_all(statement, cst.Call):
            call = facts.call_site_of.get(node)
            if call is None:
                continue
            if call.method == "apply" and call.receiver in holders:
                found = statement
            elif (call.qualname or "").startswith(_IN_PLACE_INIT_PREFIX) and node.args:
                if root_name(node.args[0].value) == model.name:
                    found = statement
            elif isinstance(node.func, cst.Name) and any(
                root_name(arg.value) == model.name for arg in node.args
            ):
                if _initialises_in_place(facts, node.func.value, 0):
                    found = statement  # CycleGAN's `init_weights(generator_A2B)`
    return found


def _initialises_in_place(facts: "ScriptFacts", function: str, depth: int) -> bool:
    """The function `function` of this file, or one it calls by name, fills tensors with
    random numbers in place (`torch.nn.init.normal_(m.weight)`, `m.weight.data.normal_()`)."""
    if depth > 3 or function not in facts.records.functions:
        return False
    for call in facts.calls_made_in(function):
        if (call.qualname or "").startswith(_IN_PLACE_INIT_PREFIX):
            return True
        if call.qualname is None and call.method in ELEMENTWISE_RANDOM_METHODS:
            return True
        func = call.node.func
        if isinstance(func, cst.Name) and func.value != function:
            if _initialises_in_place(facts, func.value, depth + 1):
                return True
    return False


def data_parallel_wrapping(facts: "ScriptFacts", model: TrainedModel) -> Optional["CallSite"]:
    """`nn.DataParallel(model)` (`torch.nn.DataParallel(model).cuda()`, CutMix's), also of
    an attribute (`self.model_self = nn.DataParallel(self.model_self, ...)` under `if
    args.data_parallel:`, TabSurvey's VIME): the construction that wraps the model, None
    when none does."""
    for call in facts.calls_to(*DATA_PARALLEL):
        args = positional(call.node)
        if args and _names_model(args[0].value, model.name):
            return call
    return None


def _names_model(node: cst.BaseExpression, name: str) -> bool:
    """`node` is the model `name` or a part of it: `model`, `model.cuda()`, `model[0]`,
    `self.net.module` for `self.net`."""
    if "." not in name:
        return root_name(node) == name
    while isinstance(node, (cst.Call, cst.Subscript)) or (
        isinstance(node, cst.Attribute) and dotted_name(node) is None
    ):
        node = node.func if isinstance(node, cst.Call) else node.value
    spelled = dotted_name(node) or ""
    return spelled == name or spelled.startswith(name + ".")


def runs_once(facts: "ScriptFacts", call: "CallSite") -> bool:
    """The call runs at most once per process, as backward_runs_once reads a backward call:
    its whole statement in no loop, at module level or in a function of this file named
    nowhere but in such calls, up to module level."""
    return _runs_once(facts, call, 0)


def _runs_once(facts: "ScriptFacts", call: "CallSite", depth: int) -> bool:
    statement = call.site.statement
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    if any(not _single_pass(facts, loop) for loop in call.site.loops):
        return False
    small = statement.body[0]
    if not isinstance(small, (cst.Expr, cst.Assign)) or small.value is not call.node:
        return False  # inside a lambda or a comprehension, which may run it again and again
    function = call.site.function
    if function is None:
        return True
    name = function.name.value
    if depth >= _CALLER_DEPTH or call.site.class_name is not None:
        return False
    if facts.records.definition_counts.get(name, 0) != 1 or facts.assignments_to(name):
        return False
    callers = [c for c in calls_named(facts, name) if isinstance(c.node.func, cst.Name)]
    # Its `def` names it once more; any other mention hands it on (`mp.spawn(main)`).
    if not callers or name_mentions(facts).get(name, 0) != len(callers) + 1:
        return False
    return all(_runs_once(facts, caller, depth + 1) for caller in callers)


def _single_pass(facts: "ScriptFacts", loop: "Loop") -> bool:
    """`for _ in range(1):` (votenet's pointnet2_modules.py self-test): a loop over a literal
    range of at most one number (bounded_loops.literal_iterations), which runs its body once
    or not at all."""
    iterations = literal_iterations(facts, loop)
    return iterations is not None and iterations <= 1


def why_no_trained_model(facts: "ScriptFacts") -> Optional[Tuple[cst.CSTNode, str]]:
    """Where this file trains (its first `.backward()` call) and why `the_trained_model`
    finds no model there; None when the file does not train or the model is found."""
    if not facts.trains:
        return None
    backward = facts.method_calls("backward")
    if not backward:
        return None
    models = each_trained_model(facts)
    if len(models) == 1:
        return None
    names = sorted(f"{m.owner}'s {m.name}" if m.owner else m.name for m in models)
    if names:
        return backward[0].node, (
            f"this file trains several models ({', '.join(names)}); the rules that change "
            "how a model is trained act only where one model is trained"
        )
    return backward[0].node, (
        "the model this step trains is not known to be a module handed to a `torch.optim` "
        "optimizer, or updated by a loop over its `.parameters()` that reads each `p.grad`: "
        "names, `self.` attributes (in their class) and function parameters (through the "
        "function's one call in this file, or the calls from the other files of the run) are "
        "followed to a module built there, by a module class or by a function of the run whose "
        "every return builds one, and this model is not (a model from a module outside the run, "
        "a function called several times, a function that may return something else, or an "
        "update the analysis does not read, such as `torch._foreach_*` calls): the analysis "
        "cannot tell which model it is"
    )


def model_built(facts: "ScriptFacts", model: TrainedModel) -> Optional[cst.SimpleStatementLine]:
    """The statement after which `model` is built and placed on its device: its last
    assignment or `model.to(...)` statement, all in one function, none in a loop, before the
    optimizer is built and before any data-parallel wrapper. None when the analysis is unsure.
    When the wrapper is built around the placement (`model = DDP(model.to(device))`), that
    statement, before which the model is built and placed (`places_while_wrapping`)."""
    events: List[Tuple[int, cst.BaseStatement, "Loop | None", object]] = []
    wrappers = _wrapping_assignments(facts, model)
    for assignment in model_assignments(facts, model):
        site = assignment.site
        if keeps_module_object(assignment, model.name):
            continue
        if assignment in wrappers:
            if not places_while_wrapping(facts, site.statement, model.name):
                continue
            wrappers = [w for w in wrappers if w is not assignment]
        events.append((site.order, site.statement, site.loop, site.function))
    for call in facts.records.calls:
        if call.receiver == model.name and call.method in PLACEMENT_METHODS:
            if not _same_variable(facts, model, call.site.function, moved=True):
                continue
            if placement_device(facts, call) is None:
                continue  # `model.to(dtype=torch.float32)` places nothing
            statement = call.site.statement
            if is_expression_statement(statement, call.node):
                events.append((call.site.order, statement, call.site.loop, call.site.function))
    needed = (model.handed_in or model.optimizer).node
    events = [event for event in events if not left_before(facts, event[1], needed)]
    if not events:
        return None
    functions = {id(function) for _, _, _, function in events}
    in_init = _built_in_init(facts, model, [function for _, _, _, function in events])
    if functions != {id(model.scope)} and not in_init:
        return None
    if any(loop is not None for _, _, loop, _ in events):
        return None
    order, statement, _, _ = max(events, key=lambda event: event[0])
    if not isinstance(statement, cst.SimpleStatementLine):
        return None
    if order > model.needed_at and not in_init:
        return None
    if any(w.site.order < order for w in wrappers):
        return None
    return statement


def model_constructed(facts: "ScriptFacts", model: TrainedModel) -> Optional[cst.BaseStatement]:
    """The statement that first builds `model` (its first assignment, data-parallel wrappers
    left out): where a finding about the model as a whole points."""
    wrappers = _wrapping_assignments(facts, model)
    built = [
        assignment
        for assignment in model_assignments(facts, model)
        if assignment not in wrappers and assignment.site.statement is not None
    ]
    if not built:
        return None
    return min(built, key=lambda assignment: assignment.site.order).site.statement


def _wrapping_assignments(facts: "ScriptFacts", model: TrainedModel) -> List["Assignment"]:
    """Data-parallel wrappers of the model, and `model, opt = accelerator.prepare(model, opt)`,
    which may wrap it as well: what changes the model's placement after it is built."""
    return wrapper_assignments(facts, model.name) + _prepared(facts, model)


def _prepared(facts: "ScriptFacts", model: TrainedModel) -> List["Assignment"]:
    """`model, opt = accelerator.prepare(model, opt)` for this model."""
    return [a for a in model_assignments(facts, model) if _prepared_in_place(a, model.name)]


def _built_in_init(
    facts: "ScriptFacts", model: TrainedModel, functions: Sequence[Optional[cst.FunctionDef]]
) -> bool:
    """A `self.X` built and placed in its class's `__init__` only, and trained (its optimizer
    built, or its hand-written update) in another method: `__init__` runs before any method
    of the object can."""
    if model.owner is None or model.scope is None:
        return False
    if model.scope.name.value == "__init__":
        return False
    return all(
        function is not None
        and function.name.value == "__init__"
        and method_class(facts, function) == model.owner
        for function in functions
    )


def model_assignments(facts: "ScriptFacts", model: TrainedModel) -> Sequence["Assignment"]:
    """The assignments to the model's name: for `self.X`, in the methods of its class only;
    for another name, in the scope that trains it and in functions declaring it `global` or
    `nonlocal` (a builder's own `model = Net()` is another variable)."""
    if model.owner is not None:
        return attribute_assignments(facts, model.owner, model.name)
    return [
        assignment
        for assignment in facts.assignments_to(model.name)
        if _same_variable(facts, model, assignment.site.function)
    ]


def _same_variable(facts: "ScriptFacts", model: TrainedModel, function, moved=False) -> bool:
    """`model.name` read or bound in `function` is the trained model's variable: the scope
    that trains it, module level, or a function declaring the name `global`/`nonlocal`;
    for `self.X`, a method of its class. With `moved` (an in-place `.to()`/`.cuda()` of the
    module), also any function that does not bind the name itself: its parameter or the
    global may be the trained module (`def place(model): model.cuda()`)."""
    if model.owner is not None:
        return _in_owner(facts, model, function)
    if function is model.scope or function is None:
        return True
    memo = facts.memo("rebinds_the_model")
    key = (id(function), model.name)
    if key not in memo:
        memo[key] = declares_global(function, model.name)
    if memo[key]:
        return True
    return moved and (
        model.name in parameter_names(function) or not locally_assigned(facts, model.name, function)
    )


def _in_owner(facts: "ScriptFacts", model: TrainedModel, function: Optional[cst.CSTNode]) -> bool:
    """A read of `self.X` in `function` is this model's (always true for other names)."""
    return model.owner is None or method_class(facts, function) == model.owner


def is_expression_statement(statement: Optional[cst.CSTNode], call: cst.Call) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and statement.body[0].value is call
    )


def model_device(facts: "ScriptFacts", model: TrainedModel) -> Optional[cst.BaseExpression]:
    """The device expression the model is placed on: `device` in `model.to(device)`, a
    `"cuda"` string for `.cuda()`; None when it is placed nowhere or on several devices."""
    placed = model_placement(facts, model)
    return placed[0] if placed is not None else None


def model_placement(
    facts: "ScriptFacts", model: TrainedModel
) -> Optional[Tuple[cst.BaseExpression, Optional[cst.FunctionDef]]]:
    """model_device, with the function whose `.to(...)` call reads it."""
    found, scopes = placements(facts, model)
    texts = {cst.Module([]).code_for_node(node) for node in found}
    return (found[0], scopes[0]) if len(texts) == 1 else None


def placement_devices(facts: "ScriptFacts", model: TrainedModel) -> List[str]:
    """The devices (as written; `"cuda"` for `.cuda()`) the model is placed on, each once,
    in source order: more than one, and model_device has no answer."""
    found, _ = placements(facts, model)
    return list(dict.fromkeys(cst.Module([]).code_for_node(node) for node in found))


def placements(
    facts: "ScriptFacts", model: TrainedModel
) -> Tuple[List[cst.BaseExpression], List[Optional[cst.FunctionDef]]]:
    """The device of each `.to(...)`/`.cuda()` placement of the model, with its function."""
    found: List[cst.BaseExpression] = []
    scopes: List[Optional[cst.FunctionDef]] = []
    for call in placement_calls(facts, model.name):
        if not _same_variable(facts, model, call.site.function, moved=True):
            continue
        device = placement_device(facts, call)
        if device is not None:
            found.append(device)
            scopes.append(call.site.function)
    if not found:
        for assignment in _prepared(facts, model):
            device = _accelerate_placement(facts, assignment.value)
            if device is not None:
                found.append(device)
                scopes.append(assignment.site.function)
    return found, scopes


def placement_device(facts: "ScriptFacts", call: "CallSite") -> Optional[cst.BaseExpression]:
    """The device a `.to(...)`/`.cuda()` call places on: `"cuda"` for `.cuda()`, the first
    positional argument or `device=` of `.to(...)`; None for a `.to` that only casts."""
    if call.method == "cuda":
        return cst.SimpleString('"cuda"')
    args = positional(call.node)
    arg = args[0] if args else keyword(call.node, "device")
    if arg is None or facts.qualified_name(arg.value) in _DTYPE_NAMES:
        return None
    return arg.value


def _accelerate_placement(facts: "ScriptFacts", prepare: cst.Call) -> Optional[cst.Attribute]:
    """`accelerator.device` for `accelerator.prepare(...)` on a name bound only to
    `Accelerator(...)` without `device_placement`: Accelerate places what it prepares there
    (device_placement is on by default)."""
    accelerator = prepare.func.value
    name = dotted_name(accelerator)
    if name is None or not built_by(facts, accelerator, {ACCELERATOR}):
        return None
    if any(keyword(a.value, "device_placement") for a in facts.assignments_to(name)):
        return None
    return cst.Attribute(accelerator, cst.Name("device"))


_DTYPE_NAMES = frozenset({"torch.float32", "torch.float", "torch.float64", "torch.double"})


def placement_calls(facts: "ScriptFacts", name: str) -> List["CallSite"]:
    """`.to(...)`/`.cuda()` calls that place `name`: on it, or assigned to it
    (`model = Net().to(device)`), in source order."""
    return list(_placement_calls(facts).get(name, ()))


def _placement_calls(facts: "ScriptFacts") -> Dict[str, List["CallSite"]]:
    """`.to(...)`/`.cuda()` calls by the name they place: their receiver, and the name their
    result is assigned to (`model = Net().to(device)`), in source order; built once per pass
    so that placing each of many models costs its own calls only."""
    memo = facts.memo("placement_calls")
    if "by_name" not in memo:
        by_name: Dict[str, List["CallSite"]] = {}
        for call in facts.records.calls:
            if call.method not in PLACEMENT_METHODS:
                continue
            assignment = facts.assignment_of(call.node)
            names = {call.receiver, assignment.target if assignment is not None else None}
            for name in names - {None}:
                by_name.setdefault(name, []).append(call)
        memo["by_name"] = by_name
    return memo["by_name"]


def device_type_code(facts: "ScriptFacts", device: cst.BaseExpression) -> str:
    """Source text of the device type (`"cuda"`, `"cpu"`) of a device expression, for APIs
    that take a type rather than a device (`torch.autocast`, `torch.amp.GradScaler`)."""
    value = literal(device, None)
    if isinstance(value, str):
        return repr(value.split(":")[0]).replace("'", '"')
    code = cst.Module([]).code_for_node(device)
    if (
        isinstance(device, cst.Attribute)
        and device.attr.value == "device"
        and built_by(facts, device.value, {ACCELERATOR})
    ):
        return f"{code}.type"  # `Accelerator.device` is a `torch.device`
    name = dotted_name(device)
    if name is not None:
        assignments = facts.assignments_to(name)
        if assignments and all(
            facts.qualified_name(getattr(a.value, "func", a.value)) == "torch.device"
            for a in assignments
        ):
            return f"{code}.type"
        if assignments and all(_plain_device_strings(a.value) for a in assignments):
            return code
    return f"torch.device({code}).type"


def device_type_code_in(
    facts: "ScriptFacts",
    device: cst.BaseExpression,
    home: Optional[cst.FunctionDef],
    function: Optional[cst.FunctionDef],
) -> Optional[str]:
    """device_type_code, written for `function` when `device` is read in `home`: the
    parameter bound to it at `function`'s one call site (`train(net, loader, dev)` gives
    `device` in `def train(model, loader, device)`), `self.device` in any method of its
    class. None when `function` has no name for that value."""
    code = device_type_code(facts, device)
    name = dotted_name(device)
    if name is None or function is home:
        return code
    root, _, rest = name.partition(".")
    own = name.startswith("self.")
    alias = alias_in(facts, name if own else root, home, function)
    if alias is None:
        return None
    moved = alias if own or not rest else f"{alias}.{rest}"
    original = cst.Module([]).code_for_node(device)
    for form in ("{}", "{}.type", "torch.device({}).type"):
        if code == form.format(original):
            return form.format(moved)
    return None


def _plain_device_strings(node: cst.BaseExpression) -> bool:
    """`"cuda"`, or `"cuda" if ... else "cpu"`: strings that are device types already."""
    if isinstance(node, cst.IfExp):
        return _plain_device_strings(node.body) and _plain_device_strings(node.orelse)
    value = literal(node, None)
    return isinstance(value, str) and value.isidentifier()


def left_before(facts: "ScriptFacts", statement: cst.CSTNode, later: cst.CSTNode) -> bool:
    """`statement` sits in a block of its function that always returns or raises and does not
    hold `later`: whatever it does never reaches `later` (torchvision's quantization script
    places the model again under `if args.test_only:`, which evaluates and returns before the
    training loop)."""
    holding_later = ancestors(facts.parents, later)
    node = facts.parents.get(statement)
    while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
        if isinstance(node, cst.IndentedBlock) and node not in holding_later and always_exits(node):
            return True
        node = facts.parents.get(node)
    return False


# The training step ----------------------------------------------------------------------------
def enclosing_block(
    root: cst.CSTNode, statement: cst.CSTNode
) -> Optional[Tuple[cst.BaseStatement, ...]]:
    """The body (sequence of statements) under `root` that holds `statement` directly."""
    for suite in find_all(root, cst.IndentedBlock, cst.Module):
        if any(child is statement for child in suite.body):
            return tuple(suite.body)
    return None


def _mentions(statement: cst.CSTNode, name: str) -> bool:
    return any(dotted_name(node) == name for node in find_all(statement, cst.Name, cst.Attribute))


def _uses_model(statement: cst.CSTNode, name: str) -> bool:
    """`statement` calls the model `name`, one of its submodules or methods, or passes it on;
    reading a plain attribute (`valid = torch.ones(n, *D.output_shape)`) is no forward."""
    attributes = find_all(statement, cst.Attribute)
    called = {id(call.func) for call in find_all(statement, cst.Call)}
    inner = {id(attribute.value) for attribute in attributes}
    reads = sum(
        1
        for attribute in attributes
        if id(attribute) not in inner
        and id(attribute) not in called
        and (dotted_name(attribute) or "").startswith(name + ".")
    )
    mentions = sum(
        1 for node in find_all(statement, cst.Name, cst.Attribute) if dotted_name(node) == name
    )
    return mentions > reads


def _assigns(statement: cst.CSTNode, name: str) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for small in statement.body:
        if isinstance(small, cst.Assign):
            if any(name in target_names(t.target) for t in small.targets):
                return True
        elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
            if dotted_name(small.target) == name:
                return True
    return False


def _assigns_within(statement: cst.CSTNode, name: str) -> bool:
    """_assigns, looking through the bodies of `with` statements."""
    if isinstance(statement, cst.With) and isinstance(statement.body, cst.IndentedBlock):
        return any(_assigns_within(inner, name) for inner in statement.body.body)
    return _assigns(statement, name)


def _backward_subject(call: cst.Call) -> Tuple[Optional[str], Optional[str]]:
    """(loss, scaler) for `loss.backward()` and `scaler.scale(loss).backward()`, the loss
    possibly divided first (`(loss / accumulation).backward()`)."""
    inner = receiver(call)
    scaler = None
    if (
        isinstance(inner, cst.Call)
        and callee_name(inner) == "scale"
        and len(inner.args) == 1
        and isinstance(inner.func, cst.Attribute)
    ):
        scaler = dotted_name(inner.func.value)
        inner = inner.args[0].value
    if isinstance(inner, cst.BinaryOperation) and isinstance(inner.operator, cst.Divide):
        inner = inner.left
    return (dotted_name(inner) if inner is not None else None), scaler


def training_steps(facts: "ScriptFacts", model: TrainedModel) -> List[TrainingStep]:
    """Every backward call in a loop whose loss is computed from `model` in the same block
    (the loss may be assigned under a `with`: `with ctx: loss = ...`)."""
    steps: List[TrainingStep] = []
    updates = {id(update.loop.node) for update in parameter_update_loops(facts)}
    backward_calls = {id(call.node) for call in facts.backward_calls}
    for backward in facts.backward_calls:
        loop = backward.site.loop
        statement = backward.site.statement
        if loop is None or backward.method != "backward":
            continue
        model_names = names_in(facts, model, loop.function)
        loss, scaler = _backward_subject(backward.node)
        block = enclosing_block(loop.node, statement)
        if loss is None or block is None:
            continue
        index = next(i for i, s in enumerate(block) if s is statement)
        last = max((i for i in range(index) if _assigns_within(block[i], loss)), default=None)
        if last is None:
            continue
        # The parameter update of the previous step, when it comes first, stays out of the
        # forward (and of the autocast a rule puts around it): it runs on float32 weights.
        # So does another backward call (a GAN's generator step before the discriminator's):
        # the forward of this step starts after it.
        start = max(
            (
                i + 1
                for i in range(last)
                if _holds_loop(block[i], updates) or _holds_call(block[i], backward_calls)
            ),
            default=0,
        )
        first = next(
            (
                i
                for i in range(start, last + 1)
                if any(_uses_model(block[i], n) for n in model_names)
                and not _switches_mode(block[i], model_names)
            ),
            None,
        )
        if first is None:
            continue
        steps.append(
            TrainingStep(loop, backward, loss, scaler, block, tuple(block[first : last + 1]))
        )
    return steps


def _switches_mode(statement: cst.CSTNode, names: Set[str]) -> bool:
    """`model.train()` alone on its line, or `for p in model.parameters(): p.requires_grad
    = False` (a GAN freezing its discriminator): a switch before the forward pass, not part
    of it."""
    if isinstance(statement, cst.For):
        return _toggles_requires_grad(statement, names)
    body = statement.body if isinstance(statement, cst.SimpleStatementLine) else ()
    call = body[0].value if len(body) == 1 and isinstance(body[0], cst.Expr) else None
    func = call.func if isinstance(call, cst.Call) else None
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value in MODE_METHODS
        and dotted_name(func.value) in names
    )


def _toggles_requires_grad(loop: cst.For, names: Set[str]) -> bool:
    """`for p in model.parameters(): p.requires_grad = <bool>`: `model.requires_grad_()`."""
    iterable = loop.iter
    if not (
        isinstance(loop.target, cst.Name)
        and isinstance(iterable, cst.Call)
        and isinstance(iterable.func, cst.Attribute)
        and iterable.func.attr.value == "parameters"
        and dotted_name(iterable.func.value) in names
        and loop.orelse is None
        and isinstance(loop.body, cst.IndentedBlock)
    ):
        return False
    for line in loop.body.body:
        if not (
            isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
            and isinstance(line.body[0], cst.Assign)
            and len(line.body[0].targets) == 1
        ):
            return False
        target = line.body[0].targets[0].target
        value = line.body[0].value
        if not (
            isinstance(target, cst.Attribute)
            and target.attr.value == "requires_grad"
            and is_name(target.value, loop.target.value)
            and isinstance(value, cst.Name)
            and value.value in ("True", "False")
        ):
            return False
    return True


def _holds_loop(statement: cst.CSTNode, loops: Set[int]) -> bool:
    return bool(loops) and any(id(node) in loops for node in find_all(statement, cst.For))


def _holds_call(statement: cst.CSTNode, calls: Set[int]) -> bool:
    return any(id(node) in calls for node in find_all(statement, cst.Call))


def names_in(
    facts: "ScriptFacts", model: TrainedModel, function: Optional[cst.FunctionDef]
) -> Set[str]:
    """The names `model` (and its wrapper) is read by inside `function`: its own names (for
    `self.X`, only in the methods of its class), and the parameters bound to them at
    `function`'s one call site (`def train(model, ...)` called as `train(net, ...)`)."""
    own = [model.name] + ([model.wrapped_as] if model.wrapped_as else [])
    home = model.scope
    names: Set[str] = set()
    for name in own:
        if model.owner is None or method_class(facts, function) == model.owner:
            names.add(name)
        alias = alias_in(facts, name, home, function)
        if alias is not None:
            names.add(alias)
    if model.owner is not None and method_class(facts, function) == model.owner:
        # `model = self.model` in the method: the local name reads the same module
        aliases = attribute_aliases(facts, function)
        names.update(local for local, attribute in aliases.items() if attribute in names)
    return names


def optimizer_name(facts: "ScriptFacts", model: TrainedModel) -> Optional[str]:
    """The name the model's optimizer is assigned to, when it is assigned once (None for a
    hand-written update, which has no optimizer)."""
    if model.updated_by is not None:
        return None
    assignment = facts.assignment_of(model.optimizer.node)
    if assignment is None or assignment.unpacked:
        return None
    others = [a for a in facts.assignments_to(assignment.target) if a is not assignment]
    if not all(is_name(a.value, "None") for a in others):
        return None  # a `None` placeholder before the optimizer is built is no other optimizer
    return assignment.target


def loop_method_calls(
    facts: "ScriptFacts", step: TrainingStep, receiver_name: str, method: str
) -> List["CallSite"]:
    """`receiver_name.method(...)` calls in the step's loop."""
    return [
        call
        for call in facts.loop_calls(step.loop)
        if call.method == method and call.receiver == receiver_name
    ]


def gradient_clipping(facts: "ScriptFacts", step: TrainingStep) -> List["CallSite"]:
    """`clip_grad_norm_`/`clip_grad_value_` calls in the step's loop."""
    return [call for call in facts.loop_calls(step.loop) if call.qualname in GRADIENT_CLIPPING]


# Evaluation -----------------------------------------------------------------------------------
def no_grad_regions(facts: "ScriptFacts") -> List[cst.CSTNode]:
    """`with torch.no_grad()`/`inference_mode()` statements and functions decorated so."""
    regions: List[cst.CSTNode] = []
    for item, site in facts.records.with_items:
        expr = item.item.func if isinstance(item.item, cst.Call) else item.item
        if facts.qualified_name(expr) in NO_GRAD_CONTEXTS and site.statement is not None:
            regions.append(site.statement)
    for function in facts.records.functions.values():
        if decorated_without_grad(facts, function):
            regions.append(function)
    return regions


def decorated_without_grad(facts: "ScriptFacts", function: cst.FunctionDef) -> bool:
    """`function` is decorated with `torch.no_grad()` or `torch.inference_mode()`."""
    for decorator in function.decorators:
        expr = decorator.decorator
        expr = expr.func if isinstance(expr, cst.Call) else expr
        if facts.qualified_name(expr) in NO_GRAD_CONTEXTS:
            return True
    return False


def evaluation_forwards(facts: "ScriptFacts", model: TrainedModel) -> List[cst.SimpleStatementLine]:
    """Statements in loops under no_grad/inference_mode that call the model, outside any loop
    that runs backward."""
    training = {id(step.loop.node) for step in training_steps(facts, model)}
    names = model.spellings
    found: List[cst.SimpleStatementLine] = []
    for region in no_grad_regions(facts):
        for loop in find_all(region, cst.For, cst.While):
            if id(loop) in training or find_all(loop, cst.For, cst.While)[1:]:
                continue
            for statement in loop.body.body:
                if not isinstance(statement, cst.SimpleStatementLine):
                    continue
                calls = find_all(statement, cst.Call)
                if (
                    any(
                        dotted_name(call.func) in names and _call_in_owner(facts, model, call)
                        for call in calls
                    )
                    and statement not in found
                ):
                    found.append(statement)
    return found


def _call_in_owner(facts: "ScriptFacts", model: TrainedModel, call: cst.Call) -> bool:
    """A call of `self.X` is this model's only in a method of its class (another class's
    `self.X` is another object, and its `self.device` may not exist)."""
    if model.owner is None:
        return True
    site = facts.call_site_of.get(call)
    return site is not None and method_class(facts, site.site.function) == model.owner


def visible_at(
    facts: "ScriptFacts", expression: cst.BaseExpression, statement: cst.CSTNode
) -> bool:
    """Whether the variable `expression` reads (`device`, `args.device`) is bound once
    `statement` has run: a parameter of its function, an assignment in its scope by then, or
    a module-level name (for code in a function). Code copied there from another function
    (`device.type`), or above the name's assignment, would raise NameError otherwise."""
    name = dotted_name(expression)
    if name is None:
        return True  # a literal or a call: nothing of another function's scope
    root = name.split(".")[0]
    sites = [facts.call_site_of.get(call) for call in find_all(statement, cst.Call)]
    functions = {id(site.site.function): site.site.function for site in sites if site}
    if len(functions) != 1:
        return False
    function = next(iter(functions.values()))
    if function is not None:
        params = function.params
        declared = [*params.posonly_params, *params.params, *params.kwonly_params]
        declared += [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
        if any(param.name.value == root for param in declared):
            return True
    imported = any(
        binding.bound == root and binding.top_level for binding in facts.imports.bindings
    )
    # Bound in the same scope only after `statement` (`accelerator = Accelerator()` below
    # `model = Net()`), the name would not exist yet when the copied code runs.
    end = max(site.site.order for site in sites if site)
    return imported or any(
        (a.site.function is None and function is not None)
        or (a.site.function is function and a.site.order <= end)
        for a in facts.assignments_to(root)
    )


# What the script already does ---------------------------------------------------------------
def compiles(facts: "ScriptFacts") -> bool:
    """`torch.compile(...)`, TorchScript, or any `.compile()` method call."""
    return bool(facts.calls_to(*COMPILE_FUNCTIONS) or facts.method_calls("compile"))


# What the model is made of ------------------------------------------------------------------
def _model_expressions(facts: "ScriptFacts", model: TrainedModel) -> List[cst.BaseExpression]:
    """The expressions that build `model`, following names they are built from
    (`net = Net(); model = net.to(device)`), self-rebinding placements left out; `self.`
    attributes in their class and parameters through their one call (values.value_sources);
    for a model looked up by name in a dict of this file, the definitions of every class and
    function the dict holds (registry_builders)."""
    found: List[cst.BaseExpression] = []
    pending: List[Tuple[str, Optional[cst.FunctionDef]]] = [(model.name, model.scope)]
    seen: Set[Tuple[str, int]] = set()
    while pending and len(seen) <= MAX_DEPTH:
        name, scope = pending.pop()
        if (name, id(scope)) in seen:
            continue
        seen.add((name, id(scope)))
        sources = value_sources(facts, name, scope)
        if sources is None:
            sources = [Source(a.value, a.site.function, a) for a in facts.assignments_to(name)]
        for source in sources:
            if source.assignment is not None and _rebinds_itself(source.assignment, name):
                continue
            found.append(source.value)
            for node in find_all(source.value, cst.Name, cst.Attribute):
                other = dotted_name(node)
                if other is None or (other, id(source.function)) in seen:
                    continue
                if facts.assignments_to(other) or value_sources(facts, other, source.function):
                    pending.append((other, source.function))
    # A model built by name from a dict of this file is built by any of its builders; one
    # built by a function of this file (`build_model(args)`), by that function's code.
    builders: Dict[int, cst.CSTNode] = {}
    unread: List[cst.CSTNode] = list(found)
    while unread:
        for call in find_all(unread.pop(), cst.Call):
            lookup = by_name_lookup(facts, call.func)
            if lookup is not None and not lookup[1]:
                held = registry_builders(facts, dotted_name(lookup[0]) or "") or ()
                builders.update((id(b), b) for b in held)
            factory = factory_definition(facts, call.func)
            if factory is not None and id(factory) not in builders:
                builders[id(factory)] = factory
                unread.append(factory)  # a factory may call another
    return found + list(builders.values())


def torch_own_module(facts: "ScriptFacts", model: TrainedModel) -> Optional[str]:
    """The torch.nn class `model` is (`torch.nn.Sequential`) when every module its
    construction builds is one of torch's own, written out in it (`nn.Sequential(nn.Linear(
    ...), nn.ReLU())`); None when it may build any other class (this file's, another module's,
    a library's), holds modules passed by name or unpacked (`nn.Sequential(*layers)`: a list
    filled by `append` is not followed), or the analysis cannot see its construction."""
    found: Optional[str] = None
    expressions = _model_expressions(facts, model)
    incidental = _size_and_device_names(facts, expressions)
    for expression in expressions:
        assignment = facts.assignment_of(expression)
        if assignment is not None and assignment.target in incidental:
            continue  # `num_classes = dataset.features["labels"].num_classes`: no module
        if any(_may_build_other_modules(facts, call) for call in find_all(expression, cst.Call)):
            return None
        call = _constructor_call(facts, expression)
        if call is None:
            continue  # `net.to(device)`: `net` is followed on its own; a device, a number
        qualname = facts.qualified_name(call.func) or ""
        if not (qualname.startswith("torch.nn.") and builds_module(facts, call)):
            if builds_module(facts, call):
                return None
            continue
        if qualname in _CONTAINERS and any(
            arg.star or not isinstance(arg.value, cst.Call) for arg in call.args
        ):
            return None
        found = found or qualname
    return found


_CONTAINERS = frozenset({"torch.nn.Sequential", "torch.nn.ModuleList", "torch.nn.ModuleDict"})
# torch.nn classes that take a module as an argument: a name handed to them may be one.
_TAKING_MODULES = _CONTAINERS | frozenset(
    {
        "torch.nn.TransformerEncoder",
        "torch.nn.TransformerDecoder",
        "torch.nn.Transformer",
        "torch.nn.DataParallel",
    }
)


def _size_and_device_names(
    facts: "ScriptFacts", expressions: Sequence[cst.BaseExpression]
) -> Set[str]:
    """Names the model's construction reads only as arguments of torch's layers that take
    no module (`LazyLinear(num_classes)`) or of placements (`.to(device)`), and the names
    only their values are computed from (peft's pvera example: `num_classes` from the
    dataset `load_dataset(...)` returns): sizes and devices, which add no module."""
    targets = {}
    for expression in expressions:
        assignment = facts.assignment_of(expression)
        targets[id(expression)] = assignment.target if assignment is not None else None
    incidental: Set[str] = set()
    while True:
        modules: Set[str] = set()
        arguments: Set[str] = set(incidental)
        for expression in expressions:
            if targets[id(expression)] in incidental:
                arguments.update(_names_in(expression))
            else:
                _sort_names(facts, expression, False, modules, arguments)
        grown = arguments - modules
        if grown <= incidental:
            return incidental
        incidental |= grown


def _names_in(node: cst.CSTNode) -> Set[str]:
    found: Set[str] = set()
    _sort_names(None, node, True, found, found)
    return found


def _sort_names(facts, node: cst.CSTNode, inert: bool, modules: Set[str], arguments: Set[str]):
    """Each name read in `node` into `arguments` when it is inside an argument of a layer
    taking no module or of a placement (`inert`), else into `modules`."""
    name = dotted_name(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
    if name:
        (arguments if inert else modules).update((name, name.split(".")[0]))
        return
    if isinstance(node, cst.Call):
        qualname = (facts.qualified_name(node.func) if facts is not None else None) or ""
        method = isinstance(node.func, cst.Attribute)
        placement = method and node.func.attr.value in _VALUE_METHODS
        leaf = qualname.startswith("torch.nn.") and qualname.count(".") == 2
        takes_none = placement or (leaf and qualname not in _TAKING_MODULES)
        receiver = node.func.value if method and not qualname else node.func
        _sort_names(facts, receiver, inert, modules, arguments)
        for arg in node.args:
            _sort_names(facts, arg.value, inert or takes_none, modules, arguments)
        return
    if isinstance(node, cst.Attribute):  # `load(...).features`: `features` names nothing
        _sort_names(facts, node.value, inert, modules, arguments)
        return
    for child in children(node):
        _sort_names(facts, child, inert, modules, arguments)


def _constructor_call(facts: "ScriptFacts", expression: cst.BaseExpression) -> Optional[cst.Call]:
    """`nn.Sequential(...)` in `nn.Sequential(...).to(device).float()`; None for a method
    called on a name (`net.to(device)`) and for what is not a call."""
    while isinstance(expression, cst.Call):
        func = expression.func
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Call):
            expression = func.value
        elif isinstance(func, cst.Attribute) and facts.qualified_name(func) is None:
            return None
        else:
            return expression
    return None


# Methods of a model or tensor value that build no module (`net.to(device)`).
_VALUE_METHODS = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train"})


def _may_build_other_modules(facts: "ScriptFacts", call: cst.Call) -> bool:
    """A call that may build a module other than torch's own: a class or function of this
    file, a name it binds, a method of `self`, or anything imported from elsewhere; Python's
    builtins, host libraries (`argparse`, numpy: imports.runs_on_the_host) and the placement
    methods of a value do not."""
    qualname = facts.qualified_name(call.func)
    if qualname is not None:
        return not (qualname.startswith("torch.") or runs_on_the_host(qualname))
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in _VALUE_METHODS:
        return False
    head = (dotted_name(func) or "").split(".")[0]
    return not head or head == "self" or facts.imports.is_bound(head)


def class_without_forward(facts: "ScriptFacts", model: TrainedModel) -> Optional[str]:
    """The class of this file every construction of `model` calls (`Agent(envs).to(device)`)
    when neither it nor a base of this file defines `forward` and every other base is
    `torch.nn.Module`: the model is used through its other methods only (cleanrl's
    `agent.get_action_and_value(x)`), which `Module.compile()` leaves eager."""
    built = set()
    for expression in _model_expressions(facts, model):
        calls = [
            call.func.value
            for call in find_all(expression, cst.Call)
            if isinstance(call.func, cst.Name) and call.func.value in facts.classes
            # the environment wrapper it is handed (`Agent(envs)`) is built there too
            and is_module_class(facts, call.func.value)
        ]
        built.update(calls)  # (the device and other names it is built from call none)
    if len(built) != 1:
        return None
    name = built.pop()
    pending, seen = [name], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        info = facts.classes[current]
        if any(
            isinstance(s, cst.FunctionDef) and s.name.value in ("forward", "__call__")
            for s in info.node.body.body
        ):
            return None
        for base in info.bases:
            if base in facts.classes:
                pending.append(base)
            elif base != "torch.nn.Module":
                return None
    return name


# Module methods that never call the module: compiling its `__call__` changes none of them.
_MODULE_UPKEEP = frozenset(
    "parameters named_parameters buffers named_buffers modules named_modules children "
    "named_children to cuda cpu float half double bfloat16 train eval apply state_dict "
    "load_state_dict zero_grad requires_grad_ share_memory".split()
)


def model_run_only_through_methods(facts: "ScriptFacts", model: TrainedModel) -> Optional[str]:
    """A method of the model's classes through which alone the file runs `model`, when the
    file never calls the model itself: every mention of its name binds it or calls a method,
    each one of those classes' methods that never calls `self(...)` (which runs
    `self.forward(...)` or its submodules instead: PyTorch-GAN's `D.compute_loss(x, valid)`),
    or upkeep such as `.parameters()`. `Module.compile()` compiles `__call__` only, so
    nothing would run compiled. The classes are this file's, or other modules' of the run
    (project.ImportedClass.eager_methods). None otherwise."""
    name = model.name
    if "." in name or model.wrapped_as or model.handed_in is not None:
        return None
    # Where the model is a variable of the function that trains it, its mentions are counted
    # there; else file-wide, where calls in a function that takes a parameter of the same
    # name are that parameter's (the file's name count leaves its mentions there out). A
    # helper the model is handed to counts through what it does with its parameter.
    scope = model.scope
    local = scope is not None and not declares_global(scope, name)
    assigned = [a for a in facts.in_function("assignments", scope) if a.target == name]
    if local and assigned:
        calls = facts.in_function("calls", scope)
        uses = len(name_uses(scope, name, facts))
    else:
        calls = [c for c in facts.records.calls if name not in parameter_names(c.site.function)]
        assigned = [
            a for a in facts.assignments_to(name) if name not in parameter_names(a.site.function)
        ]
        uses = facts.records.name_counts.get(name, 0)
    methods, handed = _methods_and_helpers(facts, calls, name)
    if not methods or uses != len(methods) + len(handed) + len(assigned) or None in handed:
        return None
    seen = {(id(f), p) for f, p in handed}
    for function, parameter in handed:
        more = _used_through_methods(facts, function, parameter, seen)
        if more is None:
            return None
        methods.extend(more)
    classes = model_classes(facts, model)
    imported = model_imported_classes(facts, model)
    if bool(classes) == bool(imported):
        return None  # built from neither, or from both: not known
    eager = (
        eager_methods(facts, classes)
        if classes
        else set.intersection(*(set(c.eager_methods) for c in imported))
    )
    runs = None
    for method in methods:
        if method in _MODULE_UPKEEP:
            continue
        if method not in eager:
            return None
        runs = runs or method
    return runs


# How many helpers deep a model handed on (`run_validation(model)` calling `decode(model)`)
# is followed, and how many helpers in all.
_HANDED_DEPTH, _HANDED_HELPERS = 3, 8


def _methods_and_helpers(facts: "ScriptFacts", calls: Sequence["CallSite"], name: str):
    """The methods `calls` call on the variable `name`, and for each of them that hands it to
    a function of this file, (that function, its parameter), or None where the callee or the
    parameter is not known (a builtin, a method, `*args`, the name passed twice)."""
    methods = [
        call.node.func.attr.value
        for call in calls
        if isinstance(call.node.func, cst.Attribute) and is_name(call.node.func.value, name)
    ]
    handed = []
    for call in calls:
        passed = [arg for arg in call.node.args if is_name(arg.value, name)]
        if not passed:
            continue
        function = module_function(facts, call)
        receiving = None
        if function is not None and len(passed) == 1:
            receiving = parameter_receiving(function, call.node, passed[0].value)
        handed.append((function, receiving) if receiving is not None else None)
    return methods, handed


def _used_through_methods(
    facts: "ScriptFacts",
    function: cst.FunctionDef,
    parameter: str,
    seen: Set[Tuple[int, str]],
    depth: int = 1,
) -> Optional[List[str]]:
    """The methods `function` calls on its `parameter`, and those the helpers of this file it
    hands the parameter on to call, when it does nothing else with it (no call of it, no
    attribute read, no rebinding, no use in a nested scope that could keep it); else None."""
    if depth > _HANDED_DEPTH or len(seen) > _HANDED_HELPERS:
        return None
    uses = name_uses(function, parameter, facts)
    if sum(use.store for use in uses) != 1 or any(use.nested for use in uses):
        return None  # bound again, or kept by a nested function or lambda
    methods, handed = _methods_and_helpers(facts, facts.in_function("calls", function), parameter)
    if None in handed or len(uses) - 1 != len(methods) + len(handed):
        return None
    for helper, inner in handed:
        if (id(helper), inner) in seen:
            continue
        seen.add((id(helper), inner))
        more = _used_through_methods(facts, helper, inner, seen, depth + 1)
        if more is None:
            return None
        methods.extend(more)
    return methods


def model_run_through_forward(facts: "ScriptFacts", model: TrainedModel) -> Optional[cst.Call]:
    """The first `model.forward(...)` call, when the file runs the model by that name only
    so and never calls `model(...)` (PyTorch's optimizer-step-in-backward tutorial: `loss =
    model.forward(fake_image)`): the method runs eager whatever `compile()` did to
    `__call__`. A function of the file that takes the model under another name and calls it
    counts as a call it cannot see, so the answer errs towards not compiling."""
    forward = None
    for call in facts.records.calls:
        func = call.node.func
        if dotted_name(func) in model.spellings:
            return None
        if (
            forward is None
            and isinstance(func, cst.Attribute)
            and func.attr.value == "forward"
            and dotted_name(func.value) == model.name
        ):
            forward = call.node
    return forward


def eager_methods(facts: "ScriptFacts", class_names: Iterable[str]) -> Set[str]:
    """The methods that the classes `class_names` of this file and their bases of this file
    define, and that never call `self(...)`: called on a model, they run its `forward` or its
    submodules without its `__call__`."""
    defined: Dict[str, bool] = {}
    pending, seen = list(class_names), set()
    while pending:
        current = pending.pop()
        info = facts.classes.get(current)
        if current in seen or info is None:
            continue
        seen.add(current)
        pending.extend(b for b in info.bases if b in facts.classes)
        for statement in info.node.body.body:
            if isinstance(statement, cst.FunctionDef):
                calls_itself = any(
                    is_name(call.func, "self") for call in find_all(statement, cst.Call)
                )
                defined[statement.name.value] = defined.get(statement.name.value, True) and (
                    not calls_itself
                )
    return {method for method, eager in defined.items() if eager}


def model_classes(facts: "ScriptFacts", model: TrainedModel) -> Set[str]:
    """Classes of this file that `model` is built from: those its construction calls, their
    bases of this file, and the classes of this file they build in turn (any method)."""
    classes: Set[str] = set()
    expressions = _model_expressions(facts, model)
    pending = [
        call.func.value
        for expression in expressions
        for call in find_all(expression, cst.Call)
        if isinstance(call.func, cst.Name) and call.func.value in facts.classes
    ] + [e.name.value for e in expressions if isinstance(e, cst.ClassDef)]
    while pending:
        name = pending.pop()
        if name in classes:
            continue
        classes.add(name)
        pending.extend(b for b in facts.classes[name].bases if b in facts.classes)
        pending.extend(
            call.node.func.value
            for call in facts.records.calls
            if call.site.class_name == name
            and isinstance(call.node.func, cst.Name)
            and call.node.func.value in facts.classes
        )
    return classes


def model_imported_classes(facts: "ScriptFacts", model: TrainedModel) -> List["ImportedClass"]:
    """nn.Module classes of other modules of the run that `model`'s construction calls
    (`G = GeneratorResNet(...)` after `from models import *`), or the dicts and modules of
    model builders it looks the model up in (`DiT_models[args.model](...)`), with the layers
    the project index found them built from (project.ImportedClass, ImportedRegistry)."""
    project = getattr(facts, "project", None)
    if project is None or not (project.imported_classes or project.imported_registries):
        return []
    found = []
    for expression in _model_expressions(facts, model):
        for call in find_all(expression, cst.Call):
            name = dotted_name(call.func)
            imported = (
                project.imported_class(name) if imported_module_class(facts, call.func) else None
            )
            lookup = by_name_lookup(facts, call.func)
            if lookup is not None:
                imported = imported_registry(facts, dotted_name(lookup[0]) or "")
            if imported is not None and imported not in found:
                found.append(imported)
    return found


def imported_layer(
    facts: "ScriptFacts", model: TrainedModel, wanted: Callable[[str], bool]
) -> Optional[Tuple[str, "ImportedClass"]]:
    """The first layer (qualified name) `wanted` among those `model`'s classes from other
    modules of the run (model_imported_classes) may build, optional ones included (for
    hazards), with its class."""
    for imported in model_imported_classes(facts, model):
        layer = next((q for q in imported.possible_layers if wanted(q)), None)
        if layer is not None:
            return layer, imported
    return None


def model_code_call(
    facts: "ScriptFacts", model: TrainedModel, wanted: Callable[[str], bool]
) -> Optional[str]:
    """The first call `wanted` (by qualified name) in `model`'s code: among its layer calls
    in this file (model_layer_calls), else among those of its classes from other modules
    (imported_layer); shown as `` `name` `` or `` `name` in module.py ``; None when none."""
    own = next(
        (c.qualname for c in model_layer_calls(facts, model) if wanted(c.qualname or "")), None
    )
    if own is not None:
        return f"`{own}`"
    elsewhere = imported_layer(facts, model, wanted)
    return f"`{elsewhere[0]}` in {elsewhere[1].module}" if elsewhere is not None else None


def is_elementwise_dropout(qualname: str) -> bool:
    return qualname in ELEMENTWISE_DROPOUT or qualname.startswith(SPATIAL_DROPOUT_MODELS)


def model_layer_calls(facts: "ScriptFacts", model: TrainedModel) -> List["CallSite"]:
    """Calls that may build `model`'s layers: inside the expressions that build it, in every
    method of its classes of this file (see model_classes), in source order, then in the
    functions those call (model_helper_functions)."""
    own = _own_layer_calls(facts, model)
    helpers = _helper_functions(facts, model)
    return own + [c for f in helpers.values() for c in facts.in_function("calls", f)]


def model_helper_functions(facts: "ScriptFacts", model: TrainedModel) -> Set[str]:
    """Functions of this file's top level that build `model`'s layers: called by name in the
    methods of its classes (`conv3x3(in_planes, planes)` building `nn.Conv2d` for a ResNet),
    or by those functions in turn. (Functions called where the model is built compute its
    arguments, such as a dataset's sizes, and are left out.)"""
    return set(_helper_functions(facts, model))


def _own_layer_calls(facts: "ScriptFacts", model: TrainedModel) -> List["CallSite"]:
    inside = {
        id(call)
        for expression in _model_expressions(facts, model)
        for call in find_all(expression, cst.Call)
    }
    classes = model_classes(facts, model)
    return [
        call
        for call in facts.records.calls
        if id(call.node) in inside or call.site.class_name in classes
    ]


def _helper_functions(facts: "ScriptFacts", model: TrainedModel) -> Dict[str, cst.FunctionDef]:
    classes = model_classes(facts, model)
    calls = [c for c in facts.records.calls if c.site.class_name in classes]
    functions = {
        name: node
        for name, node in facts.top_level_definitions.items()
        if isinstance(node, cst.FunctionDef)
    }
    pending = [c.node.func.value for c in calls if isinstance(c.node.func, cst.Name)]
    found: Dict[str, cst.FunctionDef] = {}
    while pending:
        name = pending.pop()
        if name in found or name not in functions:
            continue
        found[name] = functions[name]
        inner = facts.in_function("calls", functions[name])
        pending.extend(c.node.func.value for c in inner if isinstance(c.node.func, cst.Name))
    return found


def model_dropout_calls(facts: "ScriptFacts", model: TrainedModel) -> List["CallSite"]:
    """Element-wise dropout the model may apply to its activations: layers and functional
    calls among its layer calls (see model_layer_calls), and torchvision builders whose
    networks drop elements of 4-D feature maps. The tensor's rank is not followed, so dropout
    on flattened features counts too (conservative for a rule that changes memory format)."""
    return [
        call
        for call in model_layer_calls(facts, model)
        if is_elementwise_dropout(call.qualname or "")
    ]


def model_random_draws(facts: "ScriptFacts", model: TrainedModel) -> List["CallSite"]:
    """Random numbers the model draws per element of a tensor (`torch.randn_like(mu)` for a
    VAE's latent, `x.bernoulli_(p)`) among its layer calls (see model_layer_calls); like
    model_dropout_calls, the tensor's rank is not followed."""
    return [
        call
        for call in model_layer_calls(facts, model)
        if (call.qualname or "") in ELEMENTWISE_RANDOM_FUNCTIONS
        or (
            call.qualname is None
            and call.method in ELEMENTWISE_RANDOM_METHODS
            # `m.weight.data.normal_(0.0, 0.02)` initialises a parameter when the model is
            # built, before any conversion (initialised_after places one after a later init).
            and not _PARAMETER_RECEIVER.search(call.receiver or "")
        )
    ]


def model_randomness(facts: "ScriptFacts", model: TrainedModel) -> Optional[Tuple[str, str]]:
    """What in `model`'s code draws random numbers per element while it trains, shown:
    ("dropout", "`nn.Dropout`") for element-wise dropout among its layer calls, or a layer
    one of its classes from another module may build ("`torch.nn.Dropout` in model.py");
    ("draws", "`torch.randn_like`") for a per-element draw (a VAE's latent noise); None when
    nothing does. A change of layout or of kernels changes which numbers a seeded run
    draws for which element."""
    dropout = model_dropout_calls(facts, model)
    if dropout:
        return "dropout", f"`{code_of(dropout[0].node.func)}`"
    elsewhere = imported_layer(facts, model, is_elementwise_dropout)
    if elsewhere is not None:
        return "dropout", f"`{elsewhere[0]}` in {elsewhere[1].module}"
    option = _dropout_option(facts, model)
    if option is not None:
        return "dropout", option
    draws = model_random_draws(facts, model)
    if draws:
        return "draws", f"`{code_of(draws[0].node.func)}`"
    return None


# Probabilities that mean no dropout, as a layer's option.
_NO_DROPOUT = (0, 0.0, False, None)
# torch's layers that apply dropout unless told not to, with the position of `dropout`.
_DROPOUT_BY_DEFAULT = {
    "torch.nn.TransformerEncoderLayer": 3,
    "torch.nn.TransformerDecoderLayer": 3,
    "torch.nn.Transformer": 5,
}


def _dropout_option(facts: "ScriptFacts", model: TrainedModel) -> Optional[str]:
    """A layer of `model` built with a dropout probability that is not literally zero,
    shown: a library layer that applies dropout inside (PyG's `MLP(..., dropout=0.5)`,
    `TransformerConv(..., dropout=0.1)`, `GPSConv(..., attn_kwargs={"dropout": 0.5})`,
    reading round 10), found by the option's name, or torch's Transformer layers without
    a `dropout` (0.1 by default)."""
    for call in model_layer_calls(facts, model):
        layer = code_of(call.node.func)
        position = _DROPOUT_BY_DEFAULT.get(call.qualname or "")
        given = argument(call.node, "dropout", position) if position is not None else None
        if position is not None and given is None:
            return f"`{layer}` (its dropout is 0.1 by default)"
        chosen = next(_dropout_options(facts, call.node, given), None)
        if chosen is not None:
            return f"`{layer}(..., {excerpt(chosen, 40).rstrip(',')})`"
    return None


def _dropout_options(
    facts: "ScriptFacts", call: cst.Call, given: Optional[cst.Arg]
) -> Iterator[Union[cst.Arg, cst.DictElement]]:
    """The options of `call` that set a dropout probability not literally zero: `given`
    (the `dropout` argument of a torch layer, maybe positional), keywords named for dropout,
    and such keys of dict arguments (`attn_kwargs={"dropout": 0.5}`)."""
    for arg in call.args:
        named = arg.keyword is not None and "dropout" in arg.keyword.value
        if arg is given or named:
            options = [arg]
        else:
            options = [
                element
                for found in _dict_values(facts, arg.value)
                for element in found.elements
                if isinstance(element, cst.DictElement)
                and "dropout" in str(literal(element.key, ""))
            ]
        yield from (o for o in options if literal(o.value, "") not in _NO_DROPOUT)


def _dict_values(facts: "ScriptFacts", value: cst.BaseExpression) -> List[cst.Dict]:
    """`value` when it is a dict literal, or the dict literals a name is bound to
    (`attn_kwargs = {"dropout": 0.5}` in PyG's graph_gps.py)."""
    if isinstance(value, cst.Dict):
        return [value]
    if isinstance(value, cst.Name):
        return [a.value for a in facts.assignments_to(value.value) if isinstance(a.value, cst.Dict)]
    return []


def model_recurrent_layers(facts: "ScriptFacts", model: TrainedModel) -> List["CallSite"]:
    """`nn.LSTM(...)`, `nn.GRU(...)`, `nn.RNN(...)` among the model's layer calls."""
    return [call for call in model_layer_calls(facts, model) if call.qualname in RECURRENT_LAYERS]


def model_sparse_calls(facts: "ScriptFacts", model: TrainedModel) -> List["CallSite"]:
    """Calls that build or multiply sparse tensors in the model (its layer calls) or in a loop
    that trains it; sparse preprocessing that ends in a dense tensor (GAT's features) is not
    counted."""
    loops = [step.loop for step in training_steps(facts, model)]
    calls = model_layer_calls(facts, model) + [c for loop in loops for c in facts.loop_calls(loop)]
    return [call for call in calls if _builds_sparse(call)]


def compile_hazards(facts: "ScriptFacts") -> Dict[str, bool]:
    """What in this module would make compiling a model it trains, or helps build, fail or
    not pay, wherever the model is built (project.Settings): it compiles already, defines a
    custom autograd Function (its backward may call autograd itself), builds recurrent
    layers or sparse tensors."""
    calls = facts.records.calls
    return {
        "compiles": compiles(facts),
        "custom_autograd": any(
            (base or "").startswith("torch.autograd.Function")
            for info in facts.classes.values()
            for base in info.bases
        ),
        "recurrent_layers": any(call.qualname in RECURRENT_LAYERS for call in calls),
        "sparse_tensors": any(_builds_sparse(call) for call in calls),
    }


def _builds_sparse(call: "CallSite") -> bool:
    qualname = call.qualname or ""
    return (
        qualname in SPARSE_FUNCTIONS
        or qualname.startswith(("torch.sparse.", "torch.sparse_"))
        or (call.method or "").startswith("to_sparse")
    )


def model_output_names(facts: "ScriptFacts", model: TrainedModel) -> Set[str]:
    """Names assigned (or unpacked) from a call of the model or its wrapper: `out = model(x)`."""
    names = model.spellings
    return {
        assignment.target
        for assignment in facts.records.assignments
        if isinstance(assignment.value, cst.Call) and dotted_name(assignment.value.func) in names
    }


def models_fed_by(facts: "ScriptFacts", model: TrainedModel) -> List[TrainedModel]:
    """Other trained models called with `model`'s output: `critic(fake)` after
    `fake = generator(z)`, or `critic(generator(z).detach())`."""
    names = model.spellings
    outputs = model_output_names(facts, model)
    found = []
    for other in each_trained_model(facts):
        if other.spellings & names:
            continue
        for call in facts.records.calls:
            if dotted_name(call.node.func) not in other.spellings:
                continue
            arguments = [argument.value for argument in call.node.args]
            if any(
                name.value in outputs
                for argument in arguments
                for name in find_all(argument, cst.Name)
            ) or any(
                dotted_name(inner.func) in names
                for argument in arguments
                for inner in find_all(argument, cst.Call)
            ):
                found.append(other)
                break
    return found


def lightning_module_optimizer(facts: "ScriptFacts", optimizer: "CallSite") -> bool:
    """The optimizer is built in `configure_optimizers` of a LightningModule (a class of this
    file deriving from `lightning.LightningModule`, `pytorch_lightning.LightningModule` or
    `L.LightningModule`): the Trainer steps it (minGPT's own `configure_optimizers`, on a
    plain nn.Module, does not count)."""
    function = optimizer.site.function
    if not isinstance(function, cst.FunctionDef):
        return False
    if function.name.value != "configure_optimizers":
        return False
    info = facts.classes.get(optimizer.site.class_name or "")
    return info is not None and any(
        (base or "").rsplit(".", 1)[-1] == "LightningModule" for base in info.bases
    )


def model_layer_names(facts: "ScriptFacts", model: TrainedModel) -> Optional[List[str]]:
    """The qualified names of every call `model` may be built of (its layer calls in this
    file, see model_layer_calls, and the layers of its classes from other modules of the run),
    when the analysis sees all of it: every module its construction builds is a class of this
    file deriving from torch's nn classes and classes of this file, a class of another module
    of the run, or a torch.nn class, and no class of it calls a module handed to its
    constructor (`self.backbone = backbone`). None otherwise (a torchvision or timm builder, a
    function of this file, `torch.load`, a base class from a library)."""
    expressions = _model_expressions(facts, model)
    if any(isinstance(e, cst.FunctionDef) for e in expressions):
        return None
    built = False
    for expression in expressions:
        for call in find_all(expression, cst.Call):
            if not _may_build_other_modules(facts, call):
                qualname = facts.qualified_name(call.func) or ""
                if qualname.startswith("torch.nn.") and builds_module(facts, call):
                    built = True
                elif qualname.startswith(("torch.load", "torch.jit.", "torch.hub.")):
                    return None
                continue
            name = dotted_name(call.func) or ""
            if (name in facts.classes and is_module_class(facts, name)) or imported_module_class(
                facts, call.func
            ):
                built = True
            elif not _method_of_a_value(facts, call):
                return None
    classes = model_classes(facts, model)
    if not (built or classes) or any(_opaque_class(facts, name) for name in classes):
        return None
    names = [
        call.qualname or ""
        for call in model_layer_calls(facts, model)
        if not imported_module_class(facts, call.node.func)  # read through its layers below
    ]
    for imported in model_imported_classes(facts, model):
        names.extend(imported.possible_layers)
    return names


def _method_of_a_value(facts: "ScriptFacts", call: cst.Call) -> bool:
    """`parser.parse_args()`, `args.get("nz")`: a method of a name bound in the file, which
    builds no module; the value's own construction is followed with the names the model is
    built from."""
    head = root_name(call.func)
    return (
        isinstance(call.func, cst.Attribute)
        and head not in (None, "self")
        and head not in facts.top_level_definitions
        and facts.qualified_name(call.func) is None
    )


def _opaque_class(facts: "ScriptFacts", name: str) -> bool:
    """A class of this file whose code the analysis cannot see whole: a base neither of this
    file nor torch.nn's, or a module handed to its constructor that it calls."""
    info = facts.classes[name]
    if any(
        base is None or not (base in facts.classes or base.startswith("torch.nn."))
        for base in info.bases
    ):
        return True
    handed = set()
    for function in find_all(info.node.body, cst.FunctionDef):
        parameters = {p.name.value for p in function.params.params}
        for assign in find_all(function.body, cst.Assign):
            value = assign.value
            if isinstance(value, cst.Name) and value.value in parameters:
                handed.update(dotted_name(t.target) for t in assign.targets)
    return any(dotted_name(call.func) in handed for call in find_all(info.node.body, cst.Call))


def every_optimizer_model_known(facts: "ScriptFacts") -> bool:
    """Every optimizer of this file takes the parameters of models the analysis follows
    (trained_models): none of a model loaded whole (`torch.load`), handed in from elsewhere,
    or of parameters gathered some other way."""
    for optimizer in facts.optimizer_constructions() + _custom_optimizer_constructions(facts):
        args = positional(optimizer.node)
        owners = _parameter_owners(facts, args[0].value) if args else set()
        if not owners or any(_trained_model(facts, o, optimizer) is None for o in owners):
            return False
    return True

"""Where tensors live: device expressions, dtype arguments, values placed on an accelerator."""

from __future__ import annotations

import enum
import re
from typing import (
    TYPE_CHECKING,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
)

import libcst as cst

from optimizer_codemod.analysis.nodes import COMPREHENSIONS, STRING_NODES, find_all, parameters_of
from optimizer_codemod.analysis.calls import code_of, keyword, literal, positional
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.reachability import reaches_seed
from optimizer_codemod.analysis.training import holds_module, placements
from optimizer_codemod.analysis.values import imported_dataset, parameter_names, parameter_values

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts
    from optimizer_codemod.analysis.training import TrainedModel

MAX_DEPTH = 4

DTYPES = frozenset(
    f"torch.{name}"
    for name in (
        "float32 float float64 double float16 half bfloat16 uint8 int8 int16 short int32 int "
        "int64 long bool complex64 cfloat complex128 cdouble float8_e4m3fn float8_e5m2"
    ).split()
)
# Tensor methods that may copy their tensor to another device: `.to(device)`, `.cuda()` and
# `.type(torch.cuda.FloatTensor)` (places_on_accelerator says whether a call does).
COPY_METHODS = frozenset({"to", "cuda", "type"})
# Methods that give a tensor's values in another shape or dtype on the tensor's own device: of
# a host batch, a host tensor. A view of a pinned batch is pinned, as is a conversion to the
# dtype it has (`.float()` of a float batch returns it); one that must copy gives pageable
# memory, where a non-blocking copy is still correct, only not faster. Never a copy to a
# device, nor `type_as`, which follows its argument's device.
HOST_VIEW_METHODS = frozenset(
    "view view_as reshape reshape_as flatten unflatten squeeze unsqueeze transpose t permute "
    "movedim narrow select expand expand_as unfold diagonal contiguous detach cpu float "
    "double half bfloat16 long int bool".split()
)
FLOATING_KINDS = frozenset({"Float", "Double", "Half", "BFloat16"})
ACCELERATOR_PREFIXES = ("cuda", "mps", "xpu", "hpu", "npu", "xla", "meta")
# Calls that return plain Python values, whatever they are called on.
HOST_METHODS = frozenset({"item", "tolist", "size", "numel", "dim", "nelement", "element_size"})
HOST_BUILTINS = frozenset({"float", "int", "len", "bool", "str"})
# Tensor methods and attributes whose result is no tensor on the device: host values, a copy
# on the host (`.cpu()`, `.numpy()` of one), or facts about the tensor.
OFF_DEVICE_METHODS = HOST_METHODS | frozenset(
    {
        "cpu",
        "numpy",
        "stride",
        "data_ptr",
        "get_device",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "is_pinned",
        "is_set_to",
    }
)
HOST_ATTRIBUTES = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "ndim",
        "is_cuda",
        "requires_grad",
        "layout",
        "is_leaf",
        "names",
        "grad_fn",
        "is_sparse",
        "is_quantized",
        "is_meta",
    }
)
NOT_TENSOR_NAMESPACES = (
    "torch.cuda.",
    "torch.mps.",
    "torch.backends.",
    "torch.distributed.",
    "torch.optim.",
    "torch.utils.",
    "torch.profiler.",
)
HOST_TORCH_FUNCTIONS = frozenset(
    {"torch.is_tensor", "torch.numel", "torch.is_floating_point", "torch.is_complex"}
)


class DeviceKind(enum.Enum):
    CPU = "cpu"
    ACCELERATOR = "accelerator"
    UNKNOWN = "unknown"  # decided at run time, or not known to the analysis


def _combine(kinds: Iterable[DeviceKind]) -> DeviceKind:
    kinds = set(kinds)
    return kinds.pop() if len(kinds) == 1 else DeviceKind.UNKNOWN


def is_dtype(facts: "ScriptFacts", node: cst.BaseExpression) -> bool:
    return facts.imports.qualified_name(node) in DTYPES


def device_kind(
    facts: "ScriptFacts", node: Optional[cst.BaseExpression], depth: int = 0
) -> DeviceKind:
    if node is None or depth > MAX_DEPTH:
        return DeviceKind.UNKNOWN
    return _memoized(facts, "device_kind", (node, depth), _device_kind, node, depth)


def _device_kind(facts: "ScriptFacts", node: cst.BaseExpression, depth: int) -> DeviceKind:
    # Only a string literal can name a device; printing other nodes to find out is costly.
    value = literal(node, None) if isinstance(node, STRING_NODES) else None
    if isinstance(value, str):
        if value.split(":")[0] == "cpu":
            return DeviceKind.CPU
        if value.startswith(ACCELERATOR_PREFIXES):
            return DeviceKind.ACCELERATOR
        return DeviceKind.UNKNOWN
    if isinstance(node, cst.Call) and facts.imports.qualified_name(node.func) == "torch.device":
        args = positional(node)
        first = args[0].value if args else (keyword(node, "type") or keyword(node, "device"))
        if isinstance(first, cst.Arg):
            first = first.value
        return device_kind(facts, first, depth + 1)
    if isinstance(node, cst.IfExp):
        return _combine(
            [device_kind(facts, node.body, depth + 1), device_kind(facts, node.orelse, depth + 1)]
        )
    name = dotted_name(node)
    if name is not None:
        return _memoized(facts, "name_device_kind", (name, depth), _name_device_kind, name, depth)
    return DeviceKind.UNKNOWN


def _name_device_kind(facts: "ScriptFacts", name: str, depth: int) -> DeviceKind:
    values = [a.value for a in facts.assignments_to(name) if not a.unpacked]
    if values:
        return _combine(device_kind(facts, v, depth + 1) for v in values)
    return DeviceKind.UNKNOWN


def _memoized(facts: "ScriptFacts", table: str, key, compute, *args):
    # Every name-following answer here depends only on its key within one pass's facts: a
    # name assigned in each of a file's n functions is followed once, not n times per use.
    memo = facts.memo(table)
    try:
        return memo[key]
    except KeyError:
        found = memo[key] = compute(facts, *args)
        return found


def device_types(
    facts: "ScriptFacts", node: Optional[cst.BaseExpression], depth: int = 0
) -> Optional[FrozenSet[str]]:
    """The device types (`cuda`, `cpu`, `mps`...) `node` may name; None when not known.

    Finer than `device_kind` where the kind of accelerator matters: asynchronous copies are
    sound on CUDA but not on MPS, so a rule may need to know that `mps` is impossible.
    """
    if node is None or depth > MAX_DEPTH:
        return None
    return _memoized(facts, "device_types", (node, depth), _device_types, node, depth)


def _device_types(
    facts: "ScriptFacts", node: cst.BaseExpression, depth: int
) -> Optional[FrozenSet[str]]:
    value = literal(node, None)
    if isinstance(value, str):
        return frozenset({value.split(":")[0]}) if value else None
    prefix = _device_string_prefix(node)
    if prefix is not None:
        return frozenset({prefix})
    if isinstance(node, cst.Call) and facts.imports.qualified_name(node.func) == "torch.device":
        args = positional(node)
        first = args[0].value if args else (keyword(node, "type") or keyword(node, "device"))
        if isinstance(first, cst.Arg):
            first = first.value
        return device_types(facts, first, depth + 1)
    if isinstance(node, cst.IfExp):
        body = device_types(facts, node.body, depth + 1)
        orelse = device_types(facts, node.orelse, depth + 1)
        return body | orelse if body is not None and orelse is not None else None
    name = dotted_name(node)
    if name is not None:
        return _memoized(facts, "name_device_types", (name, depth), _name_device_types, name, depth)
    return None


def _name_device_types(facts: "ScriptFacts", name: str, depth: int) -> Optional[FrozenSet[str]]:
    values = [a.value for a in facts.assignments_to(name) if not a.unpacked]
    if values and not any(a.unpacked for a in facts.assignments_to(name)):
        found: FrozenSet[str] = frozenset()
        for value in values:
            types = device_types(facts, value, depth + 1)
            if types is None:
                return None
            found |= types
        return found
    return None


def _device_string_prefix(node: cst.BaseExpression) -> Optional[str]:
    """`cuda` for `f"cuda:{rank}"`, `"cuda:%d" % rank` and `"cuda:" + str(rank)`."""
    text = None
    if isinstance(node, cst.FormattedString) and node.parts:
        first = node.parts[0]
        text = first.value if isinstance(first, cst.FormattedStringText) else None
    elif isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Modulo, cst.Add)):
        left = literal(node.left, None)
        text = left if isinstance(left, str) else None
    if text and ":" in text and text.split(":")[0]:
        return text.split(":")[0]
    return None


# Legacy tensor types (`torch.cuda.FloatTensor`): a type names a device and a dtype at once, so
# `x.type(torch.cuda.FloatTensor)` is a copy to the GPU and `torch.cuda.FloatTensor(2, 3)` a
# tensor made there. `torch.Tensor` is the default type: the CPU, the default dtype.
LEGACY_TYPE_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Byte": "uint8",
    "Char": "int8",
    "Short": "int16",
    "Int": "int32",
    "Long": "int64",
    "Bool": "bool",
}
LEGACY_TENSOR_TYPES = {
    "torch.Tensor": "cpu",
    **{f"torch.{kind}Tensor": "cpu" for kind in LEGACY_TYPE_DTYPES},
    **{f"torch.cuda.{kind}Tensor": "cuda" for kind in LEGACY_TYPE_DTYPES},
}
FLOATING_TENSOR_TYPES = frozenset(
    name
    for name in LEGACY_TENSOR_TYPES
    if name == "torch.Tensor" or name.rsplit(".", 1)[-1][: -len("Tensor")] in FLOATING_KINDS
)


def tensor_types(
    facts: "ScriptFacts", node: Optional[cst.BaseExpression], depth: int = 0
) -> Optional[FrozenSet[str]]:
    """The legacy tensor types (`torch.cuda.FloatTensor`...) `node` may be, following names
    (`Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`) and type strings
    (`"torch.cuda.FloatTensor"`); None when it may be anything else (a dtype, a class)."""
    if node is None or depth > MAX_DEPTH:
        return None
    return _memoized(facts, "tensor_types", (node, depth), _tensor_types, node, depth)


def _tensor_types(
    facts: "ScriptFacts", node: cst.BaseExpression, depth: int
) -> Optional[FrozenSet[str]]:
    if isinstance(node, STRING_NODES):
        text = literal(node, None)
        return frozenset({text}) if text in LEGACY_TENSOR_TYPES else None
    if isinstance(node, cst.IfExp):
        body = tensor_types(facts, node.body, depth + 1)
        orelse = tensor_types(facts, node.orelse, depth + 1)
        return body | orelse if body is not None and orelse is not None else None
    qualname = facts.imports.qualified_name(node)
    if qualname is not None:
        return frozenset({qualname}) if qualname in LEGACY_TENSOR_TYPES else None
    name = dotted_name(node)
    if name is None:
        return None
    return _memoized(facts, "name_tensor_types", (name, depth), _name_tensor_types, name, depth)


def _name_tensor_types(facts: "ScriptFacts", name: str, depth: int) -> Optional[FrozenSet[str]]:
    assignments = facts.assignments_to(name)
    if not assignments or any(a.unpacked or a.augmented for a in assignments):
        return None
    found: FrozenSet[str] = frozenset()
    for assignment in assignments:
        types = tensor_types(facts, assignment.value, depth + 1)
        if types is None:
            return None
        found |= types
    return found


def tensor_type_devices(
    facts: "ScriptFacts", node: Optional[cst.BaseExpression]
) -> Optional[FrozenSet[str]]:
    """The device types a legacy tensor type `node` may put its tensors on (`cuda`, `cpu`)."""
    types = tensor_types(facts, node)
    return None if types is None else frozenset(LEGACY_TENSOR_TYPES[t] for t in types)


def type_conversion_target(call: cst.Call) -> Optional[cst.BaseExpression]:
    """The type of `x.type(T)` (positional or `dtype=`), or None for another call."""
    func = call.func
    if not isinstance(func, cst.Attribute) or func.attr.value != "type":
        return None
    target = keyword(call, "dtype")
    args = positional(call)
    if target is None and args:
        target = args[0]
    return target.value if target is not None else None


def copy_target(facts: "ScriptFacts", call: cst.Call) -> Optional[cst.BaseExpression]:
    """The device argument of `x.to(...)`, or None when the call converts only the dtype."""
    device = keyword(call, "device")
    if device is not None:
        return device.value
    args = positional(call)
    if not args:
        return None
    first = args[0].value
    if is_dtype(facts, first) or keyword(call, "dtype") is None and _looks_like_dtype(first):
        return None
    return first


def _looks_like_dtype(node: cst.BaseExpression) -> bool:
    name = dotted_name(node) or ""
    return name.endswith("dtype")


# Calls that ask at run time which device there is: a script calling one may fall back on
# the CPU.
_DEVICE_QUESTIONS = frozenset(
    {"torch.cuda.is_available", "torch.backends.mps.is_available", "torch.cuda.device_count"}
)
# Libraries that choose the device when the script is launched.
_DEVICE_AT_LAUNCH = ("accelerate.", "lightning.", "pytorch_lightning.")


def may_run_on_the_cpu(facts: "ScriptFacts") -> bool:
    """False only for a script written for CUDA alone: it places things with `.cuda()` or on
    a CUDA device named in the file, asks nothing about the machine (`is_available()`), and
    names no other device to move to (`"cpu"`, `args.device`: a tensor's own `x.device`
    follows the tensor, so it does not count). Accelerate, Lightning and the like choose
    the device at launch: they may pick the CPU."""
    memo = facts.memo("may_run_on_the_cpu")
    if None not in memo:
        memo[None] = _may_run_on_the_cpu(facts)
    return memo[None]


def _may_run_on_the_cpu(facts: "ScriptFacts") -> bool:
    on_cuda = False
    for call in facts.records.calls:
        if call.qualname in _DEVICE_QUESTIONS or (call.qualname or "").startswith(
            _DEVICE_AT_LAUNCH
        ):
            return True
        if call.method == "cuda":
            on_cuda = True
            continue
        target = copy_target(facts, call.node) if call.method == "to" else None
        device = keyword(call.node, "device")
        for node in (target, device.value if device is not None else None):
            if node is None or (isinstance(node, cst.Attribute) and node.attr.value == "device"):
                continue
            if device_kind(facts, node) is not DeviceKind.ACCELERATOR:
                return True
            on_cuda = True
    return not on_cuda


def places_on_accelerator(facts: "ScriptFacts", call: cst.Call) -> bool:
    """Whether this call may put its result on an accelerator (`.cuda()`, `.to(dev)`, `device=`)."""
    return _memoized(facts, "places_on_accelerator", call, _places_on_accelerator, call)


def _places_on_accelerator(facts: "ScriptFacts", call: cst.Call) -> bool:
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "cuda":
        return True
    if isinstance(func, cst.Attribute) and func.attr.value == "to":
        target = copy_target(facts, call)
        return target is not None and device_kind(facts, target) is not DeviceKind.CPU
    if isinstance(func, cst.Attribute) and func.attr.value == "type":
        return "cuda" in (tensor_type_devices(facts, type_conversion_target(call)) or ())
    if "cuda" in (tensor_type_devices(facts, func) or ()):
        return True  # `Tensor(n, 1)` with `Tensor = torch.cuda.FloatTensor`
    device = keyword(call, "device")
    return device is not None and device_kind(facts, device.value) is not DeviceKind.CPU


def may_live_on_accelerator(facts: "ScriptFacts", node: cst.BaseExpression) -> bool:
    """Whether the value of `node` could be a tensor on an accelerator, following names.

    Used to keep `pin_memory` away from data already on the device (pinning raises there).
    A value may live there when one of its calls places a tensor there, builds a class of
    this file that may (class_may_place_on_accelerator), or when a name it reads is assigned
    such a value anywhere in the file, however long the chain of names (see _live_graph).
    """
    return _live_graph(facts, node)


def class_may_place_on_accelerator(facts: "ScriptFacts", class_name: str) -> bool:
    """A method of this file's class `class_name` (or of its bases of this file), or a function
    or class of this file they call by name, transitively, may place a tensor on an accelerator
    (`load(i)` returning `torch.load(p).to(device)`), or reads a module-level value that may
    live there (`return DATA[i]` with `DATA = torch.randn(n, 4, device="cuda")`)."""
    return _live_graph(facts, (_DEFINITION, class_name))


# The graph behind both questions: a value leads to the names it reads and the classes of
# this file it builds, a name to every value assigned to it, a class or function to its bases,
# the functions and classes it calls by name and the module-level values it reads. A value is
# a seed when one of its calls places a tensor on an accelerator, a definition when a call
# made in it does. Names and definitions are tagged tuples; values are their nodes.
_NAME, _DEFINITION = "name", "definition"


def _live_graph(facts: "ScriptFacts", start) -> bool:
    return reaches_seed(
        start,
        lambda node: _live_successors(facts, node),
        lambda node: _live_seed(facts, node),
        facts.memo("may_live"),
    )


def _live_seed(facts: "ScriptFacts", node) -> bool:
    if isinstance(node, tuple):
        kind, name = node
        return kind == _DEFINITION and any(
            places_on_accelerator(facts, call.node) for call in facts.calls_made_in(name)
        )
    calls, _ = _calls_and_names(facts, node)
    for call in calls:
        if places_on_accelerator(facts, call):
            return True
        imported = imported_dataset(facts, dotted_name(call.func))
        if imported is not None and imported.places_on_accelerator:
            return True
    return False


def _live_successors(facts: "ScriptFacts", node) -> Iterable:
    if not isinstance(node, tuple):
        calls, names = _calls_and_names(facts, node)
        for call in calls:
            constructed = facts.imports.qualified_name(call.func) or dotted_name(call.func)
            if constructed in facts.classes:
                yield (_DEFINITION, constructed)
        yield from ((_NAME, name) for name in names)
    elif node[0] == _NAME:
        yield from (assignment.value for assignment in facts.assignments_to(node[1]))
        yield from _added_items(facts).get(node[1], ())
    else:
        yield from _definition_successors(facts, node[1])


# Methods that put their arguments into the container they are called on.
_ADDING_METHODS = frozenset({"append", "extend", "insert", "add"})


def _added_items(facts: "ScriptFacts") -> Dict[str, List[cst.BaseExpression]]:
    """For each name, the values `name.append(v)` (extend, insert, add) puts into it: a list
    of device tensors built item by item (pplm's `x.append(torch.tensor(..., device=device))`)
    holds them."""
    memo = facts.memo("added_items")
    if None not in memo:
        found: Dict[str, List[cst.BaseExpression]] = {}
        for call in facts.records.calls:
            if call.method in _ADDING_METHODS and call.receiver is not None:
                found.setdefault(call.receiver, []).extend(a.value for a in call.node.args)
        memo[None] = found
    return memo[None]


def _definition_successors(facts: "ScriptFacts", name: str) -> Iterable:
    info = facts.classes.get(name)
    definition = info.node if info is not None else facts.records.functions.get(name)
    if definition is None:
        return
    if info is not None:
        yield from ((_DEFINITION, base) for base in info.bases if base in facts.classes)
    for call in facts.calls_made_in(name):
        if isinstance(call.node.func, cst.Name):
            yield (_DEFINITION, call.node.func.value)
    # `captions` in `self.captions` is an attribute, not the module's variable `captions`.
    attributes = {id(node.attr) for node in find_all(definition, cst.Attribute)}
    read = {node.value for node in find_all(definition, cst.Name) if id(node) not in attributes}
    for variable in read:
        for assignment in facts.assignments_to(variable):
            if assignment.site.function is None and assignment.site.class_name is None:
                yield assignment.value


def _calls_and_names(facts: "ScriptFacts", node: cst.BaseExpression):
    """The calls in `node` and the dotted names it reads, in source order (kept per node: a
    value is asked about by every question whose chain of names reaches it)."""
    memo = facts.memo("calls_and_names")
    found = memo.get(node)
    if found is None:
        plain = _plain_parts(facts, node)
        calls = [call for call in find_all(node, cst.Call) if id(call) not in plain]
        local = _scoped_references(node)
        names = [
            dotted_name(ref)
            for ref in find_all(node, cst.Name, cst.Attribute)
            if id(ref) not in local and id(ref) not in plain
        ]
        found = memo[node] = (calls, [n for n in names if n is not None])
    return found


# Builtins whose result is never a tensor: what their arguments read cannot reach the value
# (`int(0.9 * len(ds_raw))`, a split size in hkproj/pytorch-transformer).
_PLAIN_RESULT_BUILTINS = frozenset(
    "int float bool str len repr format range isinstance issubclass hasattr callable".split()
)


def _plain_parts(facts: "ScriptFacts", node: cst.BaseExpression) -> Set[int]:
    """The nodes of `node` inside an f-string or a call of such a builtin (not bound by the
    file): their values are strings and numbers, never tensors."""
    plain: Set[int] = set()
    for part in find_all(node, cst.FormattedString, cst.Call):
        if id(part) in plain:
            continue
        if isinstance(part, cst.Call) and not (
            isinstance(part.func, cst.Name)
            and part.func.value in _PLAIN_RESULT_BUILTINS
            and not facts.imports.is_bound(part.func.value)
        ):
            continue
        plain.update(map(id, find_all(part)))
    return plain


def _scoped_references(node: cst.BaseExpression) -> Set[int]:
    """The references in `node` to a lambda's parameters or a comprehension's targets, read
    where those bind them: they name the lambda's argument or the iterable's items, not the
    file's variables of the same name (`Lambda(lambda x: x.mul(255))` beside a loop's
    `x = x.to(device)`). The values they stand for are read from the iterable, which stays."""
    scoped: Set[int] = set()
    for scope in find_all(node, cst.Lambda, *COMPREHENSIONS):
        if isinstance(scope, cst.Lambda):
            every = parameters_of(scope.params)
            bound = {p.name.value for p in every}
            scoped.update(id(p.name) for p in every)
            bodies: list = [scope.body]
        else:
            bound, bodies, clause = set(), [], scope.for_in
            while clause is not None:
                targets = find_all(clause.target, cst.Name)
                bound.update(n.value for n in targets)
                scoped.update(map(id, targets))
                bodies.extend(clause.ifs)
                clause = clause.inner_for_in
                if clause is not None:
                    bodies.append(clause.iter)
            if isinstance(scope, cst.DictComp):
                bodies.extend((scope.key, scope.value))
            else:
                bodies.append(scope.elt)
        for body in bodies:
            for ref in find_all(body, cst.Name, cst.Attribute):
                if _root_name(ref) in bound:
                    scoped.add(id(ref))
    return scoped


def _root_name(ref: cst.BaseExpression) -> Optional[str]:
    while isinstance(ref, cst.Attribute):
        ref = ref.value
    return ref.value if isinstance(ref, cst.Name) else None


# Values on the device -------------------------------------------------------------------------
def uses_accelerator(facts: "ScriptFacts") -> bool:
    """Some call of the script may put a tensor or a module on an accelerator: without one,
    every tensor stays on the CPU and reading a value waits for nothing."""
    return any(places_on_accelerator(facts, call.node) for call in facts.records.calls)


# What places a script's tensors on an accelerator without a `.to(device)` of its own, or
# chooses one: device APIs, launchers and trainers.
ACCELERATOR_MODULES = (
    "torch.cuda",
    "torch.mps",
    "torch.xpu",
    "torch.device",
    "torch.distributed",
    "torch.backends.cuda",
    "torch.backends.cudnn",
    "torch.backends.mps",
    "torch_xla",
    "accelerate",
    "lightning",
    "pytorch_lightning",
    "deepspeed",
)
# Words of a name (split at `.` and `_`) that say device: `args.gpu`, `to_device`, `use_cuda`;
# whole words only for the short ones (`plt.xlabel` and `json.dumps` say nothing).
DEVICE_WORDS = frozenset({"gpu", "gpus", "tpu", "tpus", "mps", "xla", "xpu", "ngpu"})
DEVICE_WORD_PREFIXES = ("device", "cuda", "accelerat")


# Why a rule whose setting acts on CUDA alone leaves a script that mentions_accelerator denies.
TRAINS_ON_THE_CPU = (
    "this script never places a tensor or module on an accelerator nor names one (no "
    "`.cuda()`, no `.to(device)` or `device=` that may be one, no device API or launcher): it "
    "trains on the CPU"
)


def mentions_accelerator(facts: "ScriptFacts") -> bool:
    """Whether anything in the script may place tensors on an accelerator or names one: a
    placement (see uses_accelerator), an import or call of a device API, launcher or trainer
    (ACCELERATOR_MODULES), or a callee, receiver, argument or assigned name that says device
    (`to_device(batch)`, `Net(args.gpu)`, `dev = pick()`). False means the script trains on
    the CPU as far as its own text can tell."""
    memo = facts.memo("mentions_accelerator")
    if None not in memo:
        memo[None] = _mentions_accelerator(facts)
    return memo[None]


def _mentions_accelerator(facts: "ScriptFacts") -> bool:
    if uses_accelerator(facts):
        return True
    if any(_accelerator_module(b.target) for b in facts.imports.bindings):
        return True
    # Each text with the value it names, where one is known: a device the script pins to the
    # CPU (`device = torch.device("cpu")`, the GPU line commented out) names no accelerator.
    texts: List[Tuple[str, Optional[cst.BaseExpression]]] = [
        (a.target, None if a.unpacked else a.value) for a in facts.records.assignments
    ]
    for call in facts.records.calls:
        if _accelerator_module(call.qualname or "") and not _on_the_cpu(facts, call.node):
            return True
        texts += [(dotted_name(call.node.func) or "", call.node), (call.receiver or "", None)]
        texts += [(dotted_name(arg.value) or "", arg.value) for arg in call.node.args]
    return any(
        _says_device(text) and (value is None or not _on_the_cpu(facts, value))
        for text, value in texts
    )


def _says_device(text: str) -> bool:
    return any(
        word in DEVICE_WORDS or word.startswith(DEVICE_WORD_PREFIXES)
        for word in re.split(r"[._]", text.lower())
    )


def _on_the_cpu(facts: "ScriptFacts", value: cst.BaseExpression) -> bool:
    return device_kind(facts, value) is DeviceKind.CPU


def _accelerator_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in ACCELERATOR_MODULES)


def xla_device_source(facts: "ScriptFacts") -> Optional[str]:
    """How the script may come to train on an XLA device (a TPU): "torch_xla" where it imports
    or calls torch_xla itself, "accelerate" where an Accelerate `Accelerator` picks the
    device at launch (`accelerate config` may choose a TPU, with no change to the file);
    None otherwise."""
    return _package_named(facts, ("torch_xla", "accelerate"))


# What says a script that Accelerate launches is written to run on TPUs too: a branch on the
# XLA distributed type, an availability check or test marker for torch_xla, or `_mp_fn`, the
# entry point `xla_spawn` calls (accelerate's examples and test scripts).
_XLA_SPELLINGS = (
    "DistributedType.XLA",
    "DistributedType.TPU",
    "is_torch_xla_available",
    "is_tpu_available",
    "require_torch_xla",
    "require_tpu",
)


def declares_xla_runs(facts: "ScriptFacts") -> Optional[str]:
    """The first thing in the script that says it runs on XLA devices as well (see
    _XLA_SPELLINGS), as written; None when nothing does."""
    memo = facts.memo("declares_xla_runs")
    if None not in memo:
        memo[None] = _declared_xla(facts)
    return memo[None]


# Backend names that launch on TPUs: pytorch-ignite's `idist.Parallel(backend="xla-tpu")`.
_XLA_BACKEND_NAMES = frozenset({"xla-tpu"})


def _declared_xla(facts: "ScriptFacts") -> Optional[str]:
    if "_mp_fn" in facts.top_level_definitions:
        return "def _mp_fn"
    for node in find_all(facts.module, cst.Attribute, cst.Name):
        spelled = dotted_name(node) or ""
        if any(spelled == s or spelled.endswith("." + s) for s in _XLA_SPELLINGS):
            return spelled
    for node in find_all(facts.module, cst.SimpleString):
        if literal(node, None) in _XLA_BACKEND_NAMES:
            return node.value
    return None


_TPU_WORD = re.compile(r"\bTPUs?\b")


def comment_naming_tpus(facts: "ScriptFacts") -> Optional[str]:
    """A comment of the script that names TPUs (accelerate's examples list "(multi) TPUs"
    among the setups they run on), stripped; None when none does."""
    memo = facts.memo("comment_naming_tpus")
    if None not in memo:
        memo[None] = next(
            (
                node.value.lstrip("#").strip()
                for node in find_all(facts.module, cst.Comment)
                if _TPU_WORD.search(node.value)
            ),
            None,
        )
    return memo[None]


# Parameters that are DTensors when the optimizer steps: FSDP2's `fully_shard`, tensor
# parallelism, a device mesh, torchft, or Accelerate's ParallelismConfig and FSDP2 plugin.
_DTENSOR_PACKAGES = (
    "torch.distributed.fsdp.fully_shard",
    "torch.distributed.fsdp.FSDPModule",
    "torch.distributed._composable.fsdp",
    "torch.distributed.tensor",
    "torch.distributed._tensor",
    "torch.distributed.device_mesh",
    "torchft",
    "accelerate.ParallelismConfig",
    "accelerate.parallelism_config",
    # Opacus's FSDP2Wrapper calls fully_shard (its fsdp_example.py, fsdp_llama3.py).
    "opacus.utils.fsdp_utils",
)
_DTENSOR_KEYWORDS = frozenset({"tp_plan", "parallelism_config", "device_mesh"})


def dtensor_parameters(facts: "ScriptFacts") -> Optional[str]:
    """What in the script may make the parameters DTensors (see _DTENSOR_PACKAGES; a
    `tp_plan=`, `parallelism_config=` or `device_mesh=` keyword, `fsdp_version=2`, Opacus's
    `grad_sample_mode="ghost_fsdp"`), as written; None when nothing does."""
    memo = facts.memo("dtensor_parameters")
    if None not in memo:
        memo[None] = _package_named(facts, _DTENSOR_PACKAGES) or _keyword_named(
            facts,
            lambda arg: arg.keyword.value in _DTENSOR_KEYWORDS
            or (arg.keyword.value == "fsdp_version" and literal(arg.value, None) == 2)
            or (
                arg.keyword.value == "grad_sample_mode" and literal(arg.value, None) == "ghost_fsdp"
            ),
        )
    return memo[None]


# What scales fp16 losses for a sharded model (FSDP1): torch's ShardedGradScaler, which
# Accelerate also picks for a model its FSDP plugin wraps.
_ACCELERATE_FSDP_PLUGIN = (
    "accelerate.FullyShardedDataParallelPlugin",
    "accelerate.utils.FullyShardedDataParallelPlugin",
)
_SHARDED_SCALER_NAMES = (
    "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler",
    "torch.distributed.fsdp.ShardedGradScaler",
    *_ACCELERATE_FSDP_PLUGIN,
)


def sharded_grad_scaler(facts: "ScriptFacts") -> Optional[str]:
    """`ShardedGradScaler`, or Accelerate's FSDP plugin (or an `fsdp_plugin=` keyword) that
    brings one under fp16, where the script names it, or a module of the run it imports
    (dinov2's train.py steps with the scaler its `SSLMetaArch` builds); None otherwise."""
    memo = facts.memo("sharded_grad_scaler")
    if None not in memo:
        named = _package_named(facts, _SHARDED_SCALER_NAMES)
        project = facts.project
        imported = project.decided_by("sharded_grad_scaler") if project is not None else ""
        memo[None] = (
            named.rsplit(".", 1)[-1]
            if named is not None
            else _keyword_named(facts, lambda arg: arg.keyword.value == "fsdp_plugin")
            or _reads_fsdp_state(facts)
            or (f"ShardedGradScaler in {imported}" if imported else None)
        )
    return memo[None]


def names_sharded_grad_scaler(facts: "ScriptFacts") -> bool:
    """This file names a ShardedGradScaler itself (the project index tells the files that
    import it: llama-recipes' train_utils.py, dinov2's ssl_meta_arch.py). A library module
    that only reads Accelerate's FSDP state in a helper (diffusers' training_utils.py,
    accelerate's own state.py) says nothing of how the importing script runs."""
    return _package_named(facts, _SHARDED_SCALER_NAMES) is not None


# Accelerate's state says FSDP is on: `accelerator.state.fsdp_plugin` (also through
# `getattr(state, "fsdp_plugin", None)`), `is_fsdp2`, `DistributedType.FSDP`.
_FSDP_STATE_ATTRIBUTES = frozenset({"fsdp_plugin", "is_fsdp2"})


def _reads_fsdp_state(facts: "ScriptFacts") -> Optional[str]:
    """A read of Accelerate's FSDP state, as written: a script that branches on it is run
    under FSDP, whose plugin brings ShardedGradScaler under fp16."""
    for node in find_all(facts.module, cst.Attribute):
        name = node.attr.value
        if name in _FSDP_STATE_ATTRIBUTES or (
            name == "FSDP" and (dotted_name(node.value) or "").endswith("DistributedType")
        ):
            return code_of(node)
    for call in facts.records.calls:
        if isinstance(call.node.func, cst.Name) and call.node.func.value in ("getattr", "hasattr"):
            args = call.node.args
            if len(args) >= 2 and literal(args[1].value, None) in _FSDP_STATE_ATTRIBUTES:
                return code_of(call.node)
    return None


_FSDP_PACKAGES = (
    "torch.distributed.fsdp",
    "torch.distributed._composable.fsdp",
    *_ACCELERATE_FSDP_PLUGIN,
)


def sharding_wrapper(facts: "ScriptFacts") -> Optional[str]:
    """What may wrap the script's models in a wrapper that builds its state on their first
    forward (FSDP's lazy init, `fully_shard`, DeepSpeed's engine), as written; None when
    nothing does."""
    return (
        _package_named(facts, _FSDP_PACKAGES)
        or sharded_grad_scaler(facts)
        or dtensor_parameters(facts)
        or deepspeed_engine(facts)
    )


def per_sample_gradients(facts: "ScriptFacts") -> Optional[str]:
    """`opacus` where the script imports or calls it: DP-SGD's per-sample gradients, whose
    convolution gradients assume NCHW tensors; None otherwise."""
    return _package_named(facts, ("opacus",))


def multithreaded_runtime(facts: "ScriptFacts") -> Optional[str]:
    """`jax`, `flax` or `tensorflow` where the script imports or calls it: runtimes that
    start threads of their own, which a forked DataLoader worker would inherit locked."""
    return _package_named(facts, ("jax", "flax", "tensorflow"))


def reads_skipped_steps(facts: "ScriptFacts") -> Optional[cst.Attribute]:
    """A read of Accelerate's `step_was_skipped` or `optimizer_step_was_skipped`: whether
    the loss scaler skipped the last step, which Accelerate learns by watching whether
    `GradScaler.step` calls the optimizer's `step()`."""
    memo = facts.memo("reads_skipped_steps")
    if None not in memo:
        memo[None] = next(
            (
                node
                for node in find_all(facts.module, cst.Attribute)
                if node.attr.value in ("step_was_skipped", "optimizer_step_was_skipped")
            ),
            None,
        )
    return memo[None]


def _package_named(facts: "ScriptFacts", packages: Sequence[str]) -> Optional[str]:
    """The first of `packages` (dotted names) that the script imports or calls, itself or
    something inside it; None when it names none. Memoised: rules ask per call site."""
    memo = facts.memo("package_named")
    key = tuple(packages)
    if key not in memo:
        names = [b.target for b in facts.imports.bindings]
        names += [call.qualname or "" for call in facts.records.calls]
        memo[key] = next(
            (
                package
                for package in packages
                if any(name == package or name.startswith(package + ".") for name in names)
            ),
            None,
        )
    return memo[key]


def _keyword_named(facts: "ScriptFacts", accepts: Callable[[cst.Arg], bool]) -> Optional[str]:
    """The first keyword argument of a call in the script that `accepts`, as `name=`."""
    for call in facts.records.calls:
        for arg in call.node.args:
            if arg.keyword is not None and accepts(arg):
                return f"{arg.keyword.value}="
    return None


# Names through which a script hands its model to DeepSpeed's engine: the package itself,
# or Accelerate's plugin for it (`Accelerator(deepspeed_plugin=DeepSpeedPlugin(...))`).
_DEEPSPEED_NAMES = ("deepspeed", "accelerate.DeepSpeedPlugin", "accelerate.utils.DeepSpeedPlugin")
_DEEPSPEED_KEYWORDS = frozenset({"deepspeed_plugin", "deepspeed_plugins"})


def deepspeed_engine(facts: "ScriptFacts") -> Optional[str]:
    """What makes the script train under DeepSpeed, as its text shows: `deepspeed` (an import
    or call of the package), `DeepSpeedPlugin` or a `deepspeed_plugin=` keyword; None
    otherwise. (A DeepSpeed chosen at launch, by `accelerate config`, does not show.)"""
    memo = facts.memo("deepspeed_engine")
    if None not in memo:
        named = _package_named(facts, _DEEPSPEED_NAMES)
        memo[None] = named.rsplit(".", 1)[-1] if named is not None else _deepspeed_keyword(facts)
    return memo[None]


_DEEPSPEED_HANDOFFS = frozenset(
    {"deepspeed.initialize", "accelerate.DeepSpeedPlugin", "accelerate.utils.DeepSpeedPlugin"}
)


def hands_models_to_deepspeed(facts: "ScriptFacts") -> bool:
    """The module calls `deepspeed.initialize`, builds a `DeepSpeedPlugin` or passes a
    `deepspeed_plugin=` keyword: what a launcher helper of a project does. (Importing
    deepspeed is not enough: a library that supports it optionally, as diffusers'
    training_utils.py, hands nothing to it.)"""
    memo = facts.memo("hands_models_to_deepspeed")
    if None not in memo:
        memo[None] = any(call.qualname in _DEEPSPEED_HANDOFFS for call in facts.records.calls) or (
            _deepspeed_keyword(facts) is not None
        )
    return memo[None]


def _deepspeed_keyword(facts: "ScriptFacts") -> Optional[str]:
    return _keyword_named(facts, lambda arg: arg.keyword.value in _DEEPSPEED_KEYWORDS)


def on_device(
    facts: "ScriptFacts", node: cst.BaseExpression, names: Set[str], modules: Set[str]
) -> bool:
    """`node` evaluates to a tensor on the device, given the `names` that hold one and the
    `modules` (models, losses) whose outputs are: one of them, a part or attribute of one
    (not `.shape`, `.dtype`...), arithmetic or a comparison on one, a tensor method or torch
    function of one (not `.item()`, `.cpu()`, `.size()`...), a module's output, or a tensor
    placed on an accelerator (`.to(device)`, `device=`). Calls of anything else (the script's
    own functions, numpy, builtins) are not followed: their result is not known to be one."""
    if isinstance(node, (cst.Name, cst.Attribute)):
        name = dotted_name(node)
        if name is not None and name in names:
            return True
        return (
            isinstance(node, cst.Attribute)
            and node.attr.value not in HOST_ATTRIBUTES
            and on_device(facts, node.value, names, modules)
        )
    if isinstance(node, cst.Subscript):
        return on_device(facts, node.value, names, modules)
    if isinstance(node, cst.Call):
        qualname = facts.imports.qualified_name(node.func)
        if qualname is not None:
            if not _tensor_function(qualname):
                return False
            return places_on_accelerator(facts, node) or any(
                on_device(facts, arg.value, names, modules)
                or _of_module(arg.value, modules)  # `clip_grad_norm_(model.parameters())`
                for arg in node.args
            )
        if dotted_name(node.func) in modules:
            return True
        if isinstance(node.func, cst.Attribute):
            if node.func.attr.value in OFF_DEVICE_METHODS:
                return False
            receiver = node.func.value
            if dotted_name(receiver) in modules:
                return False  # `model.to(device)`, `criterion.cuda()`: a module, no tensor
            return on_device(facts, receiver, names, modules) or places_on_accelerator(facts, node)
        return False
    if isinstance(node, cst.BinaryOperation):
        return on_device(facts, node.left, names, modules) or on_device(
            facts, node.right, names, modules
        )
    if isinstance(node, cst.UnaryOperation):
        return not isinstance(node.operator, cst.Not) and on_device(
            facts, node.expression, names, modules
        )
    if isinstance(node, cst.Comparison):
        return on_device(facts, node.left, names, modules) or any(
            on_device(facts, target.comparator, names, modules) for target in node.comparisons
        )
    if isinstance(node, cst.IfExp):
        return on_device(facts, node.body, names, modules) or on_device(
            facts, node.orelse, names, modules
        )
    return False


def _tensor_function(qualname: str) -> bool:
    """A torch function that computes tensors (`torch.max`, `F.relu`, `clip_grad_norm_`):
    not a class (`torch.optim.SGD`, `torch.nn.Linear`), nor a function of the runtime
    (`torch.cuda.*`, `torch.distributed.*`) or of data loading, nor one returning host
    values."""
    return (
        qualname.startswith("torch.")
        and not qualname.rsplit(".", 1)[-1][:1].isupper()
        and not qualname.startswith(NOT_TENSOR_NAMESPACES)
        and qualname not in HOST_TORCH_FUNCTIONS
    )


def _of_module(node: cst.BaseExpression, modules: Set[str]) -> bool:
    """`model.parameters()` and the like: the tensors of a module (on its device)."""
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and dotted_name(node.func.value) in modules
    )


def device_names(
    facts: "ScriptFacts", function: Optional[cst.FunctionDef], seeds: Iterable[str]
) -> Tuple[Set[str], Set[str]]:
    """(names of `function`'s scope that may hold tensors on the device, names of modules it
    calls), from `seeds` known to hold device tensors (a loss, the inputs of its criterion)
    and every assignment of the scope (see `on_device`). A name the scope also binds to a
    host value (`loss = loss.item()`, `total = 0.0`) is left out: which one a read sees
    depends on the order of statements, which this does not follow. Callers ask only where
    the script places something on an accelerator (`uses_accelerator`): elsewhere no tensor
    is on one."""
    assignments = facts.in_function("assignments", function)
    modules: Set[str] = set()
    for call in facts.in_function("calls", function):
        callee = dotted_name(call.node.func)
        if callee is not None and callee not in modules:
            if call.qualname is None and holds_module(facts, callee):
                modules.add(callee)
    names = set(seeds) - modules
    changed = True
    while changed:
        changed = False
        for assignment in assignments:
            target = assignment.target
            if target in names or target in modules:
                continue
            if on_device(facts, assignment.value, names, modules):
                names.add(target)
                changed = True
    host = {a.target for a in assignments if not a.unpacked and _host_value(a.value)}
    return names - host, modules


def _host_value(node: cst.BaseExpression) -> bool:
    """A plain Python value for sure: a number or string, `x.item()`, `float(x)`..."""
    if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString, cst.FormattedString)):
        return True
    if isinstance(node, cst.Call):
        if isinstance(node.func, cst.Name):
            return node.func.value in HOST_BUILTINS
        return isinstance(node.func, cst.Attribute) and node.func.attr.value in HOST_METHODS
    return False


# Device objects ---------------------------------------------------------------------------------
CURRENT_ACCELERATOR = "torch.accelerator.current_accelerator"
ACCELERATOR_AVAILABLE = "torch.accelerator.is_available"


def is_device_object(
    facts: "ScriptFacts",
    node: Optional[cst.BaseExpression],
    function: Optional[cst.FunctionDef] = None,
    depth: int = 0,
) -> bool:
    """`node` always evaluates to a `torch.device`, never a string, an index or None, so
    `node.type` can be read: `torch.device(...)`; `torch.accelerator.current_accelerator()`
    where only a branch taken when `torch.accelerator.is_available()` runs it (it returns None
    in a build of torch without an accelerator); either of them chosen by `a if c else b`; a
    name every assignment of the file binds to one of those; a parameter of `function` that
    every call of the file passes one of those."""
    return _every_value(facts, node, function, depth, _device_object, "name_device_object")


def is_device_object_or_none(
    facts: "ScriptFacts",
    node: Optional[cst.BaseExpression],
    function: Optional[cst.FunctionDef] = None,
) -> bool:
    """As is_device_object, but `torch.accelerator.current_accelerator()` counts wherever it
    runs: `node` is a `torch.device`, or None in a build of torch without an accelerator
    (`x.to(None)` leaves the tensor where it is)."""
    return _every_value(facts, node, function, 0, _device_object_or_none, "name_device_or_none")


def _device_object_or_none(facts: "ScriptFacts", node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Call) and facts.qualified_name(node.func) in (
        "torch.device",
        CURRENT_ACCELERATOR,
    )


def _device_object(facts: "ScriptFacts", node: cst.BaseExpression) -> bool:
    if not isinstance(node, cst.Call):
        return False
    qualname = facts.qualified_name(node.func)
    if qualname == "torch.device":
        return True
    return qualname == CURRENT_ACCELERATOR and taken_only_when_available(facts, node)


def holds_device_spec(
    facts: "ScriptFacts",
    node: Optional[cst.BaseExpression],
    function: Optional[cst.FunctionDef] = None,
) -> bool:
    """`node` always holds what both `.to(node)` and `torch.device(node)` take as a device, so
    `torch.device(node).type` can be read where the copy runs: a device string (`"cuda"`,
    `f"cuda:{rank}"`), an index (an int literal, `int(...)`, which torch takes as one of the
    current accelerator), a `torch.device` (as `is_device_object`); either of them chosen by
    `a if c else b`; a name every assignment of the file binds to one of those, or a parameter
    every call passes one; and a value read from a configuration that names it a device
    (`config.device`, `args.device`, assigned nowhere in the file): taken for a device by its
    name, as `.to(...)` takes it (a dtype there would be a script's own naming slip)."""
    return _every_value(
        facts, node, function, 0, _device_spec, "name_device_spec", _configured_device
    )


def _device_spec(facts: "ScriptFacts", node: cst.BaseExpression) -> bool:
    value = literal(node, None)
    if isinstance(value, str):
        return bool(value)
    if isinstance(node, cst.Integer) or _device_string_prefix(node) is not None:
        return True
    if isinstance(node, cst.Call) and dotted_name(node.func) == "int":
        return not facts.imports.is_bound("int")  # the builtin, not a name of the file
    return _device_object(facts, node)


def _every_value(
    facts: "ScriptFacts",
    node: Optional[cst.BaseExpression],
    function: Optional[cst.FunctionDef],
    depth: int,
    leaf: Callable[["ScriptFacts", cst.BaseExpression], bool],
    table: str,
    unassigned: Callable[[str], bool] = lambda name: False,
) -> bool:
    """`leaf` holds for every value `node` may have: both branches of `a if c else b`, what
    every call of the file passes to a parameter of `function`, what every assignment of the
    file binds to a name (`unassigned` answers for a name the file never assigns)."""
    if node is None or depth > MAX_DEPTH:
        return False
    if isinstance(node, cst.IfExp):
        return all(
            _every_value(facts, branch, None, depth + 1, leaf, table, unassigned)
            for branch in (node.body, node.orelse)
        )
    name = dotted_name(node)
    if name is None:
        return leaf(facts, node)
    if function is not None and name in parameter_names(function):
        values = parameter_values(facts, function, name)
        return bool(values) and all(
            _every_value(facts, value, None, depth + 1, leaf, table, unassigned) for value in values
        )
    return _memoized(
        facts, table, (name, depth), _every_assignment, name, depth, leaf, table, unassigned
    )


def _every_assignment(facts, name, depth, leaf, table, unassigned) -> bool:
    assignments = facts.assignments_to(name)
    if not assignments:
        return unassigned(name)
    return all(
        not a.unpacked
        and not a.augmented
        and _every_value(facts, a.value, None, depth + 1, leaf, table, unassigned)
        for a in assignments
    )


def _configured_device(name: str) -> bool:
    """`config.device`, `args.train_device`: read from a configuration, named a device."""
    last = name.rsplit(".", 1)[-1].lower()
    return "." in name and (last == "device" or last.endswith("_device"))


def taken_only_when_available(facts: "ScriptFacts", call: cst.Call) -> bool:
    """`call` sits in the body of an `if` whose test holds only when an accelerator is
    available (`if use_accel:` with `use_accel = ... and torch.accelerator.is_available()`)."""
    table = facts.parents
    child, node = call, table.get(call)
    while node is not None:
        if isinstance(node, cst.If) and child is node.body:
            if _implies_available(facts, node.test, 0):
                return True
        child, node = node, table.get(node)
    return False


def _implies_available(facts: "ScriptFacts", test: cst.BaseExpression, depth: int) -> bool:
    if depth > MAX_DEPTH:
        return False
    if isinstance(test, cst.Call):
        return facts.qualified_name(test.func) == ACCELERATOR_AVAILABLE
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _implies_available(facts, test.left, depth + 1) or _implies_available(
            facts, test.right, depth + 1
        )
    name = dotted_name(test)
    assignments = facts.assignments_to(name) if name is not None else ()
    # Every binding implies it (imagenet binds `use_accel` alike in two functions).
    return bool(assignments) and all(
        not a.unpacked and not a.augmented and _implies_available(facts, a.value, depth + 1)
        for a in assignments
    )


def under_views(node: cst.BaseExpression) -> cst.BaseExpression:
    """`images` for `images.reshape(n, -1).float()`: the tensor under a chain of
    HOST_VIEW_METHODS, which the chain's result shares the device (and, for views, the
    memory) of."""
    while (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in HOST_VIEW_METHODS
        and not any(arg.star for arg in node.args)
    ):
        node = node.func.value
    return node


def placed_on_the_cpu(facts: "ScriptFacts", model: "TrainedModel") -> Optional[str]:
    """How the model is placed on the CPU, and only there: `model.to("cpu")`, or
    `model.to(device)` with `device` a parameter of the function placing it that every call
    of the file (and its default) gives as the CPU (llama-recipes' prompt_guard notebook:
    `train_model(..., device='cpu')`). None when it may be placed elsewhere."""
    devices, homes = placements(facts, model)
    literals: List[str] = []
    functions: List[str] = []
    for device, home in zip(devices, homes):
        if device_kind(facts, device) is DeviceKind.CPU:
            literals.append(f"`{code_of(device)}`")
            continue
        name = device.value if isinstance(device, cst.Name) else None
        if home is None or name is None or name not in parameter_names(home):
            return None
        values = parameter_values(facts, home, name)
        if not values or any(device_kind(facts, value) is not DeviceKind.CPU for value in values):
            return None
        functions.append(f"`{home.name.value}`")
    if functions:
        literals.append(f"every call of {' and '.join(dict.fromkeys(functions))} passes the CPU")
    return ", ".join(dict.fromkeys(literals)) or None

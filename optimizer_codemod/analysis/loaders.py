"""DataLoader facts: its options, what its dataset is, where it is iterated and how batches go.

Everything here is conservative in one direction: when the analysis cannot tell, the answer is
the one that makes a rule leave the loader alone (or only report it).
"""

from __future__ import annotations

import enum
import weakref
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Dict, Iterator, List, Optional, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.nodes import find_all, is_name, returned_values
from optimizer_codemod.analysis.calls import (
    argument,
    excerpt,
    has_double_star,
    has_star_args,
    is_literal,
    keyword,
    literal,
    positional,
    with_keyword,
)
from optimizer_codemod.analysis.collect import (
    Assignment,
    CallSite,
    Loop,
    Site,
    is_main_guard,
)
from optimizer_codemod.analysis.handoffs import (
    NOT_ITERATING,
    LoopingFunction,
    callee_key,
    callee_summary,
    looping_functions,
)
from optimizer_codemod.analysis.devices import (
    COPY_METHODS,
    may_live_on_accelerator,
    places_on_accelerator,
    under_views,
)
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.batch_sources import batch_source, drawn_iterator
from optimizer_codemod.analysis.batched_items import BatchedItems, batched_items
from optimizer_codemod.analysis.bounded_loops import iterations_at_most
from optimizer_codemod.analysis.calls import is_prepare
from optimizer_codemod.analysis.precision import loops_elsewhere
from optimizer_codemod.analysis.script import DATALOADER
from optimizer_codemod.analysis.values import (
    ACCELERATOR,
    bound_otherwise,
    built_by,
    declares_global,
    imported_dataset,
    locally_assigned,
    module_function,
    name_mentions,
    outside_value,
    parameter_names,
    parameter_receiving,
    the_caller,
    unbound_parameter,
    value_sources,
)
from optimizer_codemod.analysis.walk import parents
from optimizer_codemod.analysis.scopes import name_uses

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

MAX_DEPTH = 3
# DataLoader's positional parameters, in order (torch.utils.data.DataLoader.__init__).
PARAMETERS = (
    "dataset batch_size shuffle sampler batch_sampler num_workers collate_fn pin_memory "
    "drop_last timeout worker_init_fn multiprocessing_context generator"
).split()
TENSOR_DATASETS = frozenset(
    {"torch.utils.data.TensorDataset", "torch.utils.data.dataset.TensorDataset"}
)


def legacy_tensor_dataset(call: cst.Call) -> bool:
    """`TensorDataset(data_tensor=x, target_tensor=y)`: the signature of torch before 0.4
    (today's takes `*tensors` and no keyword), in code written for that torch."""
    return any(arg.keyword is not None for arg in call.args)


ITERABLE_BASES = frozenset(
    {"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"}
)
# Wrappers whose items are the items of (one of) their first argument.
SUBSETS = frozenset(
    {
        "torch.utils.data.Subset",
        "torch.utils.data.dataset.Subset",
        "torch.utils.data.random_split",
        "torch.utils.data.dataset.random_split",
    }
)
CONCATENATIONS = frozenset(
    {"torch.utils.data.ConcatDataset", "torch.utils.data.dataset.ConcatDataset"}
)
DEFAULT_COLLATES = frozenset(
    {
        "torch.utils.data.default_collate",
        "torch.utils.data.dataloader.default_collate",
        "torch.utils.data._utils.collate.default_collate",
    }
)
PER_ITEM_PREFIXES = ("torchvision.datasets.",)
# Calls returning a handle whose state forked worker processes would share.
HANDLE_OPENERS = frozenset(
    {
        "open",
        "io.open",
        "h5py.File",
        "lmdb.open",
        "sqlite3.connect",
        "zipfile.ZipFile",
        "tarfile.open",
    }
)
# Calls that neither have side effects nor change between two evaluations in one statement.
PURE_FUNCTIONS = frozenset(
    {
        "min",
        "max",
        "int",
        "abs",
        "round",
        "len",
        "os.cpu_count",
        "multiprocessing.cpu_count",
        "torch.get_num_threads",
        "os.sched_getaffinity",
        "torch.cuda.is_available",
        "torch.cuda.device_count",
    }
)


class DatasetKind(enum.Enum):
    """What a loader's dataset is, as far as the file shows."""

    # A map-style dataset whose __getitem__ does work: a class defined here, torchvision's.
    PER_ITEM = "per-item"
    # TensorDataset: indexing only; workers add nothing but overhead.
    TENSORS = "tensors"
    # An IterableDataset defined here: each worker replays it unless it shards by worker.
    ITERABLE = "iterable"
    # Its items may already live on an accelerator.
    ON_DEVICE = "on-device"
    # Built elsewhere: the analysis cannot see what its items are.
    UNKNOWN = "unknown"


# Options -------------------------------------------------------------------------------
def option(call: cst.Call, name: str) -> Optional[cst.Arg]:
    """The argument bound to DataLoader parameter `name`, by keyword or by position."""
    if name in PARAMETERS:
        return argument(call, name, PARAMETERS.index(name))
    return keyword(call, name)


def options_hidden(call: cst.Call) -> bool:
    """Options arrive through `*args`/`**kwargs`, which may carry any keyword."""
    return has_double_star(call) or has_star_args(call)


def is_pure(facts: "ScriptFacts", node: cst.BaseExpression) -> bool:
    """Evaluating `node` twice gives the same value and does nothing else."""
    if find_all(node, cst.NamedExpr, cst.Await, cst.Yield, cst.Lambda):
        return False
    for call in find_all(node, cst.Call):
        assert isinstance(call, cst.Call)
        name = facts.qualified_name(call.func) or dotted_name(call.func)
        if name not in PURE_FUNCTIONS or (
            "." not in name and facts.imports.is_bound(name)  # a shadowed builtin
        ):
            return False
    return True


# Datasets ------------------------------------------------------------------------------
def dataset_kind(facts: "ScriptFacts", site: CallSite) -> DatasetKind:
    arg = option(site.node, "dataset")
    if arg is None or arg.star:
        return DatasetKind.UNKNOWN
    return value_kind(facts, arg.value, site.site.function)


def value_kind(
    facts: "ScriptFacts",
    node: cst.BaseExpression,
    function: Optional[cst.FunctionDef],
    classes: Optional[List[str]] = None,
) -> DatasetKind:
    """What `node`, read in `function`, is as a dataset (collecting the classes of this file
    it is built from into `classes`): a parameter bound in another module of the run is
    what the caller's analysis said of its argument (project.py)."""
    node = dataset_value(facts, node, function)
    outside = outside_value(facts, node)
    if outside is not None:
        return DatasetKind(outside.dataset)
    if may_live_on_accelerator(facts, node):
        return DatasetKind.ON_DEVICE
    return _kind_of(facts, node, 0, [] if classes is None else classes)


def outside_dataset(facts: "ScriptFacts", site: CallSite):
    """The caller's summary (project.Argument) of the loader's dataset when it is a parameter
    bound by calls from other modules of the run; else None."""
    arg = option(site.node, "dataset")
    if arg is None or arg.star:
        return None
    return outside_value(facts, dataset_value(facts, arg.value, site.site.function))


def dataset_parameter(facts: "ScriptFacts", site: CallSite) -> Optional[str]:
    """Why a dataset that is a parameter of the loader's function is not followed to its
    value: "is `dataset`, a parameter of `Trainer.__init__`, which is called 2 times in this
    file" (values.unbound_parameter); None when it is no such parameter."""
    arg = option(site.node, "dataset")
    name = dotted_name(arg.value) if arg is not None and not arg.star else None
    why = unbound_parameter(facts, site.site.function, name) if name else None
    if why is None and outside_dataset(facts, site) is not None:
        outside = outside_dataset(facts, site)
        return f"is `{outside.text}`, passed from another module, which the analysis cannot follow"
    return f"is unknown: {why}" if why else None


def dataset_value(
    facts: "ScriptFacts", node: cst.BaseExpression, function: Optional[cst.FunctionDef]
) -> cst.BaseExpression:
    """The expression the dataset argument stands for (see dataset_source)."""
    return dataset_source(facts, node, function)[0]


def dataset_source(
    facts: "ScriptFacts", node: cst.BaseExpression, function: Optional[cst.FunctionDef]
) -> Tuple[cst.BaseExpression, Optional[cst.FunctionDef]]:
    """The expression the dataset argument stands for, with the function it is read in: a
    parameter of the loader's function is the argument at its one call site (`Trainer(model,
    ds)` for `DataLoader(dataset)` in `Trainer.__init__`), `self.X` the one `self.X = ...`
    of the method's class, and a function's own variable its one assignment there; otherwise
    `node` itself (then followed file-wide by name)."""
    return dataset_chain(facts, node, function)[-1]


def dataset_chain(
    facts: "ScriptFacts", node: cst.BaseExpression, function: Optional[cst.FunctionDef]
) -> List[Tuple[cst.BaseExpression, Optional[cst.FunctionDef]]]:
    """Each expression the dataset argument was followed through, from `node` to its
    source (see dataset_source): the names on the way all hold the dataset."""
    chain = [(node, function)]
    for _ in range(MAX_DEPTH):
        name = dotted_name(node)
        sources = value_sources(facts, name, function) if name is not None else None
        if not sources or len(sources) != 1:
            break
        (source,) = sources
        if source.assignment is not None and (
            source.assignment.unpacked or source.assignment.augmented
        ):
            break
        node, function = source.value, source.function
        chain.append((node, function))
    return chain


def _kind_of(
    facts: "ScriptFacts", node: cst.BaseExpression, depth: int, classes: List[str]
) -> DatasetKind:
    if depth > MAX_DEPTH:
        return DatasetKind.UNKNOWN
    name = dotted_name(node)
    if name is not None:
        # Every use of a name asks the same question of all its assignments: answered once
        # per pass, with the classes the answer went through (callers collect those).
        memo = facts.memo("dataset_kind_of_name")
        key = (name, depth)
        if key not in memo:
            found: List[str] = []
            memo[key] = (_kind_of_name(facts, name, depth, found), tuple(found))
        kind, seen = memo[key]
        classes.extend(seen)
        return kind
    if not isinstance(node, cst.Call):
        return DatasetKind.UNKNOWN
    qualname = facts.qualified_name(node.func)
    if qualname in TENSOR_DATASETS:
        return DatasetKind.UNKNOWN if legacy_tensor_dataset(node) else DatasetKind.TENSORS
    if qualname and qualname.startswith(PER_ITEM_PREFIXES):
        return DatasetKind.PER_ITEM
    args = positional(node)
    if qualname in SUBSETS:
        return _kind_of(facts, args[0].value, depth + 1, classes) if args else DatasetKind.UNKNOWN
    if qualname in CONCATENATIONS:
        parts = args[0].value if args else None
        if not isinstance(parts, (cst.List, cst.Tuple)) or not parts.elements:
            return DatasetKind.UNKNOWN
        kinds = {_kind_of(facts, e.value, depth + 1, classes) for e in parts.elements}
        return kinds.pop() if len(kinds) == 1 else DatasetKind.UNKNOWN
    local = dotted_name(node.func)
    if qualname is None and local in facts.classes:
        return _class_kind(facts, local, 0, classes)
    if qualname is None and local in facts.records.functions:
        return _returned_kind(facts, facts.records.functions[local], depth, classes)
    imported = imported_dataset(facts, local)
    if imported is not None:
        classes.append(imported.name)
        return DatasetKind(imported.kind)
    return DatasetKind.UNKNOWN


def _returned_kind(
    facts: "ScriptFacts", function: cst.FunctionDef, depth: int, classes: List[str]
) -> DatasetKind:
    """What a function of this file returns as a dataset, its names read in its own body
    (Hugging Face's `load_and_cache_examples` ends `dataset = TensorDataset(...)`, `return
    dataset`): one kind for every return, else unknown."""
    kinds = set()
    for value in returned_values(function):
        if isinstance(value, cst.Name):
            bound = facts.assignments_in_scope(value.value, function)
            if bound:
                if any(a.unpacked or a.augmented for a in bound):
                    return DatasetKind.UNKNOWN
                kinds.update(_kind_of(facts, a.value, depth + 1, classes) for a in bound)
                continue
        kinds.add(_kind_of(facts, value, depth + 1, classes))
    return kinds.pop() if len(kinds) == 1 else DatasetKind.UNKNOWN


def class_kind_of(
    facts: "ScriptFacts", node: cst.BaseExpression, classes: List[str]
) -> DatasetKind:
    """What `node` builds as a dataset, as this file alone shows (collecting into `classes`
    the classes it is built from): for the project index, summarising another module."""
    return _kind_of(facts, node, 0, classes)


def class_kind(facts: "ScriptFacts", name: str, classes: List[str]) -> DatasetKind:
    """What class `name` of this file is as a dataset, collecting into `classes` it and the
    bases of this file its kind was read from."""
    return _class_kind(facts, name, 0, classes)


def _kind_of_name(facts: "ScriptFacts", name: str, depth: int, classes: List[str]) -> DatasetKind:
    kinds = set()
    for assignment in facts.assignments_to(name):
        value = assignment.value
        if assignment.unpacked:  # `train, val = random_split(dataset, ...)`
            split = isinstance(value, cst.Call) and facts.qualified_name(value.func) in SUBSETS
            if not split:
                return DatasetKind.UNKNOWN
        kinds.add(_kind_of(facts, value, depth + 1, classes))
    return kinds.pop() if len(kinds) == 1 else DatasetKind.UNKNOWN


def _class_kind(facts: "ScriptFacts", name: str, depth: int, classes: List[str]) -> DatasetKind:
    info = facts.classes.get(name)
    if info is None or depth > MAX_DEPTH:
        return DatasetKind.UNKNOWN
    classes.append(name)
    methods = {
        statement.name.value
        for statement in info.node.body.body
        if isinstance(statement, cst.FunctionDef)
    }
    if any(base in ITERABLE_BASES for base in info.bases) or (
        "__iter__" in methods and "__getitem__" not in methods
    ):
        return DatasetKind.ITERABLE
    if "__getitem__" in methods:
        return DatasetKind.PER_ITEM
    for base in info.bases:
        if base in TENSOR_DATASETS:
            return DatasetKind.TENSORS
        if base and base.startswith(PER_ITEM_PREFIXES):
            return DatasetKind.PER_ITEM
        if base in facts.classes:
            return _class_kind(facts, base, depth + 1, classes)
    return DatasetKind.UNKNOWN


def in_memory_dataset_class(facts: "ScriptFacts", site: CallSite) -> Optional[str]:
    """A dataset class (of this file, or of another module of the run: project.py asks
    holds_its_items there) the loader's dataset is built from whose `__getitem__`
    only reads tensors the instance holds, at the index (`self.x[i]`, a window of it,
    arithmetic with numbers: batched_items.py derives its batched form), or calls nothing
    at all (diffusers' PromptDataset returns `{"prompt": self.prompt, "index": index}`):
    its items cost nothing to prepare, as a TensorDataset's (LLMs-from-scratch's ToyDataset)."""
    for name in dataset_classes(facts, site):
        if name in facts.classes and holds_its_items(facts, name):
            return name
        imported = imported_dataset(facts, name) if name not in facts.classes else None
        if imported is not None and imported.holds_items:
            return name
    return None


def holds_its_items(facts: "ScriptFacts", class_name: str) -> bool:
    """The dataset class `class_name` of this file has a `__getitem__` that only reads what
    the instance holds (in_memory_dataset_class): accelerate's RegressionDataset returns
    `{"x": self.x[i], "y": self.y[i]}`."""
    return class_name in facts.classes and (
        _calls_nothing(facts, facts.classes[class_name].node, "__getitem__")
        or isinstance(batched_items(facts, class_name), BatchedItems)
    )


# Calls an item may make and cost no more than reading it: dtype conversions and size reads,
# and one random index drawn for a window (x-transformers' TextSamplerDataset:
# `torch.randint(0, n - seq_len, (1,))`, then a slice of the tensor it holds).
_CHEAP_ITEM_METHODS = frozenset({"long", "int", "float", "size", "item", "dim"})
_CHEAP_ITEM_BUILTINS = frozenset({"len", "int", "min", "max", "slice"})
# Draws of one number for a window's start, as `torch.randint(0, n, (1,))` is.
_ONE_NUMBER_DRAWS = frozenset(
    {"random.randint", "random.randrange", "numpy.random.randint", "numpy.random.randrange"}
)


def _calls_nothing(facts: "ScriptFacts", node: cst.ClassDef, method: str) -> bool:
    """The class defines `method`, and its body calls nothing but what reads as cheaply as
    an index: dtype and size methods, `len`/`int`/`min`/`max`, a draw of one number
    (`torch.randint(..., (1,))`, `random.randint(a, b)`)."""
    for statement in node.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == method:
            return all(_cheap_item_call(facts, call) for call in find_all(statement.body, cst.Call))
    return False


def _cheap_item_call(facts: "ScriptFacts", call: cst.Call) -> bool:
    if isinstance(call.func, cst.Name) and not facts.imports.is_bound(call.func.value):
        return call.func.value in _CHEAP_ITEM_BUILTINS and call.func.value not in facts.classes
    qualname = facts.qualified_name(call.func)
    if qualname == "torch.randint":
        size = argument(call, "size", len(positional(call)) - 1)
        return size is not None and is_literal(size.value, (1,))
    if qualname in _ONE_NUMBER_DRAWS:
        return keyword(call, "size") is None and len(positional(call)) <= 2
    return (
        qualname is None
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value in _CHEAP_ITEM_METHODS
    )


def dataset_classes(facts: "ScriptFacts", site: CallSite) -> List[str]:
    """The classes the loader's dataset is built from: those of this file, and the dataset
    classes (or functions returning one) imported from other modules of the run, as spelled
    here (values.imported_dataset)."""
    arg = option(site.node, "dataset")
    classes: List[str] = []
    if arg is not None and not arg.star:
        _kind_of(facts, arg.value, 0, classes)
    return classes


def opens_handles_when_built(facts: "ScriptFacts", class_name: str) -> bool:
    """`__init__` keeps an open file, HDF5, LMDB or database handle on `self`.

    Forked workers share such a handle's file offset and library state, which corrupts
    reads; the usual remedy is to open it lazily in `__getitem__`, once per worker. A class
    imported from another module of the run is answered from the project index's summary.
    """
    imported = imported_dataset(facts, class_name) if class_name not in facts.classes else None
    if imported is not None:
        return imported.opens_handles
    info = facts.classes.get(class_name)
    init = next(
        (
            statement
            for statement in (info.node.body.body if info else ())
            if isinstance(statement, cst.FunctionDef) and statement.name.value == "__init__"
        ),
        None,
    )
    if init is None:
        return False
    for assignment in facts.records.assignments:
        if assignment.site.function is not init or not assignment.target.startswith("self."):
            continue
        value = assignment.value
        while isinstance(value, (cst.Subscript, cst.Attribute)):  # `h5py.File(path)["x"]`
            value = value.value
        if isinstance(value, cst.Call):
            name = facts.qualified_name(value.func) or dotted_name(value.func)
            if name in HANDLE_OPENERS:
                return True
    return False


# Random generators a dataset may keep as its own: workers receive copies in one state.
OWN_RANDOM_GENERATORS = frozenset(
    {
        "random.Random",
        "numpy.random.RandomState",
        "numpy.random.default_rng",
        "numpy.random.Generator",
        "torch.Generator",
    }
)


def own_random_generator(facts: "ScriptFacts", class_name: str) -> Optional[str]:
    """The generator a dataset class of this file keeps on `self` (`self.rng =
    random.Random(911)`, LoRA's FT_Dataset), as written; None when it keeps none.

    PyTorch seeds `random`, NumPy's global generator and torch's in each worker, not an
    object the dataset holds: every worker starts from a copy of the same state and draws
    the same numbers, so random picks repeat across the workers' items. A class imported
    from another module of the run is answered from the project index's summary."""
    info = facts.classes.get(class_name)
    if info is None:
        imported = imported_dataset(facts, class_name)
        return imported.random_generator if imported is not None else None
    for assignment in facts.records.assignments:
        if not assignment.target.startswith("self."):
            continue
        if assignment.site.class_name != class_name:
            continue
        value = assignment.value
        if isinstance(value, cst.Call):
            if (facts.qualified_name(value.func) or "") in OWN_RANDOM_GENERATORS:
                return excerpt(value)
    return None


# What a DataLoader hands each worker process, pickled when workers start by spawn or
# forkserver (the default on macOS, Windows and, from Python 3.14, Linux).
PICKLED_FOR_WORKERS = ("collate_fn", "worker_init_fn")


def unpicklable_for_workers(facts: "ScriptFacts", site: CallSite) -> Optional[str]:
    """Why workers started by spawn could not receive this loader's dataset, collate_fn or
    worker_init_fn: a lambda, or a function or class defined inside a function (pickle
    finds functions and classes by their module-level name); None when nothing says so."""
    local = _local_definitions(facts)
    for name in PICKLED_FOR_WORKERS:
        value = option_value(facts, site.node, name)
        while isinstance(value, cst.Call) and value.args:  # `functools.partial(f, ...)`
            if (facts.qualified_name(value.func) or "") != "functools.partial":
                break
            value = value.args[0].value
        if _is_lambda(facts, value):
            return f"its `{name}` is a lambda, which {_SPAWNED_WORKERS_CANNOT_PICKLE}{_DEFINE}"
        if isinstance(value, cst.Name) and value.value in local:
            return (
                f"its `{name}` is `{value.value}`, defined inside a function, which "
                f"{_SPAWNED_WORKERS_CANNOT_PICKLE}{_MOVE}"
            )
    inside = [n for n in dataset_classes(facts, site) if n in local and n in facts.classes]
    if inside:
        return (
            f"its dataset class `{inside[0]}` is defined inside a function, which "
            f"{_SPAWNED_WORKERS_CANNOT_PICKLE}{_MOVE}"
        )
    held = _unpicklable_held_by_dataset(facts, site, local)
    if held is not None:
        return f"its dataset holds {held}"
    return None


def _unpicklable_held_by_dataset(
    facts: "ScriptFacts", site: CallSite, local: Set[str]
) -> Optional[str]:
    """A lambda, or a function defined inside a function, in the expression that builds the
    loader's dataset or in the values of the names it reads, followed MAX_DEPTH assignments
    deep (`ImageFolder(root, transform)` with `transform = Compose([..., Lambda(lambda x:
    x.mul(255))])`): the dataset keeps it, and workers receive the dataset pickled. Each name
    is followed once."""
    arg = option(site.node, "dataset")
    if arg is None or arg.star:
        return None
    pending = [dataset_value(facts, arg.value, site.site.function)]
    followed: Set[str] = set()
    for _ in range(MAX_DEPTH + 1):
        following = []
        for node in pending:
            for found in _values_read(node):
                if isinstance(found, cst.Lambda):
                    return (
                        f"a lambda (`{excerpt(found)}`), which "
                        f"{_SPAWNED_WORKERS_CANNOT_PICKLE}{_DEFINE}"
                    )
                if found.value in local:
                    return (
                        f"`{found.value}`, defined inside a function, which "
                        f"{_SPAWNED_WORKERS_CANNOT_PICKLE}{_MOVE}"
                    )
                if found.value not in followed:
                    followed.add(found.value)
                    following.extend(a.value for a in facts.assignments_to(found.value))
        pending = following
    return None


def _values_read(node: cst.CSTNode) -> List[cst.CSTNode]:
    """The lambdas in `node` and the names it reads as values (not an attribute's name after
    its dot, nor a keyword's name)."""
    skipped = {id(a.attr) for a in find_all(node, cst.Attribute)}
    skipped.update(id(a.keyword) for a in find_all(node, cst.Arg) if a.keyword is not None)
    return [n for n in find_all(node, cst.Lambda, cst.Name) if id(n) not in skipped]


def _is_lambda(facts: "ScriptFacts", value: Optional[cst.BaseExpression]) -> bool:
    """`lambda batch: ...`, or a name assigned one (`collate = lambda batch: ...`)."""
    if isinstance(value, cst.Name):
        return any(isinstance(a.value, cst.Lambda) for a in facts.assignments_to(value.value))
    return isinstance(value, cst.Lambda)


_SPAWNED_WORKERS_CANNOT_PICKLE = (
    "worker processes started by spawn or forkserver (the default on macOS, Windows and, from "
    "Python 3.14, Linux) cannot unpickle"
)
# Pickle finds a function by its module-level name: a lambda has none, a nested `def` none
# reachable from the module.
_DEFINE = ": define it with `def` at the module's top level first"
_MOVE = ": move it to the module's top level first"


def _local_definitions(facts: "ScriptFacts") -> Set[str]:
    """Names of the functions and classes defined inside a function or method (any depth)."""
    memo = facts.memo("local_definitions")
    if "names" not in memo:
        bodies = []
        for statement in facts.module.body:
            if isinstance(statement, cst.FunctionDef):
                bodies.append(statement.body)
            elif isinstance(statement, cst.ClassDef):
                methods = find_all(statement.body, cst.FunctionDef)
                bodies.extend(m.body for m in methods)
        memo["names"] = {
            d.name.value for body in bodies for d in find_all(body, cst.FunctionDef, cst.ClassDef)
        }
    return memo["names"]


def collate_places_on_accelerator(facts: "ScriptFacts", call: cst.Call) -> Optional[bool]:
    """Whether `collate_fn` may return tensors on an accelerator; None when it is unknown."""
    value = option_value(facts, call, "collate_fn")
    if value is None or is_name(value, "None"):
        return False
    return _callable_places(facts, value, 0)


def _callable_places(facts: "ScriptFacts", node: cst.BaseExpression, depth: int):
    if depth > MAX_DEPTH:
        return None
    if isinstance(node, cst.Lambda):
        return any(places_on_accelerator(facts, c) for c in find_all(node.body, cst.Call))
    qualname = facts.qualified_name(node)
    if qualname in DEFAULT_COLLATES:
        return False
    if isinstance(node, cst.Call):
        func = facts.qualified_name(node.func) or dotted_name(node.func)
        if func in facts.classes:  # a collator object: `Collator(...)`
            return facts.class_places_on_accelerator(func) or may_live_on_accelerator(facts, node)
        if func == "functools.partial" and node.args:
            inner = _callable_places(facts, node.args[0].value, depth + 1)
            rest = any(may_live_on_accelerator(facts, a.value) for a in node.args[1:])
            return None if inner is None else inner or rest
        return None
    name = dotted_name(node)
    if name is None or qualname is not None:
        return None
    function = facts.records.functions.get(name)
    if function is not None and not facts.assignments_to(name):
        return any(
            places_on_accelerator(facts, c.node)
            for c in facts.records.calls
            if c.site.function is function
        )
    values = [a.value for a in facts.assignments_to(name) if not a.unpacked]
    if len(values) == 1:
        return _callable_places(facts, values[0], depth + 1)
    return None


def dataset_mutated(facts: "ScriptFacts", site: CallSite) -> bool:
    """The dataset is changed from outside after it is built (`ds.set_epoch(e)`, `ds.x = ...`).

    Worker processes hold their own copy of the dataset; persistent ones never see the change.
    """
    outside = outside_dataset(facts, site)
    if outside is not None and outside.changed:
        return True
    names = set()
    arg = option(site.node, "dataset")
    if arg is not None and dotted_name(arg.value):
        names.add(dotted_name(arg.value))
    if arg is not None and not arg.star:
        # `Trainer(model, ds)`: the caller may change `ds` after handing it over.
        for followed, _ in dataset_chain(facts, arg.value, site.site.function):
            if dotted_name(followed) is not None:
                names.add(dotted_name(followed))
    copies = prepared_copies(facts, site)
    for loader in (*loader_names(facts, site), *(copies.names if copies else ())):
        names.add(f"{loader}.dataset")
    if handoffs_of(facts, site).dataset_changed:
        return True
    return bool(names) and names_changed(
        facts, names, site.site, _before_first_iteration(facts, site)
    )


def _before_first_iteration(facts: "ScriptFacts", site: CallSite):
    """Whether a statement's site runs before the loader is first iterated (when its workers
    start, and copy the dataset as it is then): outside any loop, in the function that
    builds the loader and holds every loop over it, before the first of them."""
    loops = loops_over(facts, site)
    function = site.site.function
    if not loops or any(loop.function is not function for loop in loops):
        return lambda other: False
    first = min(loop.start for loop in loops)
    return lambda other: (other.function is function and other.loop is None and other.order < first)


def names_changed(
    facts: "ScriptFacts",
    names: Set[str],
    built: Optional[Site] = None,
    settled=lambda site: False,
) -> bool:
    """A method of one of `names` is called, or an attribute of one assigned (outside
    classes): the object may change after it is built. With `built` (where the loader is
    built), changes that run only before it are left out: earlier in the same function, with
    the construction in no loop (barlowtwins evaluate.py fills `train_dataset.samples`, then
    builds the loader). `settled(site)`: a change there comes before the object is first
    used (its loader first iterated), and does not count either."""

    def counts(where: Site) -> bool:
        return not settled(where) and not (
            built is not None
            and not built.loops
            and where.function is built.function
            and where.order < built.order
        )

    changes = _changes_by_name(facts)
    for name in names:
        owner = _owner(facts, name, built)
        for where in changes.get(name, ()):
            if (owner is None or where.function is owner) and counts(where):
                return True
    return False


def _owner(facts: "ScriptFacts", name: str, built: Optional[Site]) -> Optional[cst.CSTNode]:
    """The function whose local variable `name` (its first part) is where the loader is
    built, when no function nested in it could see that variable: only changes made there
    are changes of that object (`coco = self.coco` in a dataset's `__getitem__` is another
    variable than get_loader's `coco = CocoDataset(...)`). None: any change counts."""
    function = built.function if built is not None else None
    if not isinstance(function, cst.FunctionDef):
        return None
    root = name.split(".")[0]
    if root == "self" or _visible_in(facts, root, function) is not function:
        return None
    if find_all(function.body, cst.FunctionDef, cst.ClassDef):
        return None
    return function


def _changes_by_name(facts: "ScriptFacts") -> Dict[str, List[Site]]:
    """Where each object may be changed, by its dotted name and every dotted prefix of it: a
    call of a method of `a.b` counts for `a.b` and `a`, an assignment to `a.b.c` (outside
    classes) for `a.b` and `a`. One table per pass: asked per loader, a walk of the file's
    calls each time made the rule quadratic in the file's loaders."""
    memo = facts.memo("changes_by_name")
    if "table" not in memo:
        table: Dict[str, List[Site]] = {}
        for call in facts.records.calls:
            if call.receiver:
                parts = call.receiver.split(".")
                for end in range(1, len(parts) + 1):
                    table.setdefault(".".join(parts[:end]), []).append(call.site)
        for assignment in facts.records.assignments:
            if assignment.site.class_name is None:
                parts = assignment.target.split(".")
                for end in range(1, len(parts)):
                    table.setdefault(".".join(parts[:end]), []).append(assignment.site)
        memo["table"] = table
    return memo["table"]


def loader_names(facts: "ScriptFacts", site: CallSite) -> Set[str]:
    assignment = facts.assignment_of(site.node)
    return {assignment.target} if assignment is not None else set()


# Copies Accelerate's `prepare` makes ------------------------------------------------------
@dataclass(frozen=True)
class PreparedCopies:
    """The loaders `accelerator.prepare(...)` (Accelerate) builds from this one, bound to
    `names`: new DataLoaders with the original's arguments (accelerate's data_loader.py passes
    every DataLoader argument on, `persistent_workers` and `num_workers` among them), so an
    option set on the original holds for them."""

    names: Tuple[str, ...]
    loops: Tuple[Loop, ...]  # the for loops over them
    repeated: bool  # one of those loops runs again and again, the copy being made once
    problem: Optional[str]  # a use of a copy other than iterating it, which may see more


def prepared_copies(facts: "ScriptFacts", site: CallSite) -> Optional[PreparedCopies]:
    """`model, loader = accelerator.prepare(model, loader)` (or `loader = accelerator.prepare(
    loader)`) of this loader, with `accelerator` an `Accelerator`; None when there is none."""
    memo = facts.memo("prepared_copies")
    if None not in memo:
        memo[None] = _prepared_copies_by_site(facts)
    return memo[None].get(id(site))


def _prepared_copies_by_site(facts: "ScriptFacts") -> Dict[int, PreparedCopies]:
    bound: Dict[int, List[Tuple[str, Assignment]]] = {}
    sites = {id(s.node): s for s in facts.dataloader_constructions()}
    for assignment in facts.records.assignments:
        argument_node = _prepared_argument(facts, assignment)
        name = dotted_name(argument_node) if argument_node is not None else None
        if name is None:
            continue
        origins = [
            a.value for a in facts.assignments_to(name) if _prepared_argument(facts, a) is None
        ]
        if origins and all(id(value) == id(origins[0]) for value in origins):
            site = sites.get(id(origins[0]))
            if site is not None:
                bound.setdefault(id(site), []).append((assignment.target, assignment))
    return {key: _copies(facts, sites_bound) for key, sites_bound in bound.items()}


def _copies(facts: "ScriptFacts", bound: List[Tuple[str, Assignment]]) -> PreparedCopies:
    names = tuple(dict.fromkeys(name for name, _ in bound))
    functions = {id(a.site.function) for _, a in bound}
    made_in = {id(loop) for _, a in bound for loop in a.site.loops}
    loops = tuple(
        loop
        for loop in facts.records.loops
        if isinstance(loop.node, cst.For)
        and id(loop.function) in functions
        and facts.iterated_name(loop.iter) in names
    )
    repeated = any(any(id(outer) not in made_in for outer in loop.ancestors) for loop in loops)
    # The prepare calls, and the tuples they are unpacked into: `a, b = accelerator.prepare(a, b)`
    prepare_parts = {id(a.value) for _, a in bound} | {
        id(target.target) for _, a in bound for target in getattr(a.statement_node, "targets", ())
    }
    problem = None
    for name, assignment in bound:
        scope = _visible_in(facts, name, assignment.site.function)
        for node, parent, grandparent in _name_uses(facts, scope).get(name, ()):
            if isinstance(parent, (cst.Arg, cst.Element)) and id(grandparent) in prepare_parts:
                continue
            problem = problem or _use_problem(facts, name, node, parent, grandparent, set())
    return PreparedCopies(names, loops, repeated, problem)


def _accelerate_prepare(facts: "ScriptFacts", call: cst.BaseExpression) -> Optional[cst.Call]:
    """`call` when it is `accelerator.prepare(a, b, ...)` with `accelerator` an `Accelerator`
    and only positional arguments."""
    if (
        is_prepare(call)
        and all(arg.keyword is None and not arg.star for arg in call.args)
        and built_by(facts, call.func.value, (ACCELERATOR,))
    ):
        return call
    return None


def _prepared_argument(
    facts: "ScriptFacts", assignment: Assignment
) -> Optional[cst.BaseExpression]:
    """The argument of `accelerator.prepare(...)` whose prepared copy `assignment` binds: the
    one at the target's place in `a, b = accelerator.prepare(a, b)`, the only one for
    `a = accelerator.prepare(a)` (prepare returns a lone object itself, not a tuple)."""
    call = _accelerate_prepare(facts, assignment.value)
    if call is None:
        return None
    if not assignment.unpacked:
        return call.args[0].value if len(call.args) == 1 else None
    statement = assignment.statement_node
    if not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
        return None
    target = statement.targets[0].target
    if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != len(call.args):
        return None
    for element, arg in zip(target.elements, call.args):
        if isinstance(element, cst.StarredElement):
            return None
        if dotted_name(element.value) == assignment.target:
            return arg.value
    return None


# Iteration -----------------------------------------------------------------------------
# Per ScriptFacts (one per pass): loops over each loader, and calls by the name they call.
_LOOPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_CALLS_BY_NAME: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def loops_over(facts: "ScriptFacts", site: CallSite) -> List[Loop]:
    """For loops that iterate this loader: directly, through names, or a function parameter."""
    table = _LOOPS.get(facts)
    if table is None:
        table = {}
        for loop in facts.records.loops:
            if not isinstance(loop.node, cst.For):
                continue
            # A parameter is what its callers pass, whatever the file binds to the same name
            # elsewhere (`def train(train_loader)` called with `test_loader` too).
            loaders = _loaders_through_parameter(facts, loop)
            direct = facts.loader_of(loop) if not loaders else None
            loaders = [direct] if direct is not None else loaders
            for loader in loaders:
                table.setdefault(id(loader), []).append(loop)
        _LOOPS[facts] = table
    return table.get(id(site), [])


# Why neither workers' rule adds `persistent_workers` to such a loader (the use, as written).
ITERATED_WITHIN_ITS_LOOP = (
    "`{}` may iterate the loader again inside its own loop: with `persistent_workers=True` "
    "a second `iter(loader)` resets the one iterator the loader keeps, and the outer epoch "
    "silently ends early"
)
# Calls that read a loader without iterating it.
_LOADER_READS = frozenset({"len", "isinstance", "print", "id", "type", "hasattr", "getattr"})


def iterated_within_its_own_loop(facts: "ScriptFacts", site: CallSite) -> Optional[cst.CSTNode]:
    """A use, in the body of a loop over this loader, that may iterate it again (a nested
    `for` over it, or the loader handed to a call: `evaluate(loader)` in the middle of an
    epoch); None when there is none. With `persistent_workers=True`, `iter(loader)` hands
    out the one iterator it keeps and resets it, so the outer epoch silently ends early."""
    local = looping_summaries(facts)
    elsewhere = imported_looping_functions(facts)
    for loop in loops_over(facts, site):
        names = {facts.iterated_name(loop.iter)} - {None}
        for node in find_all(loop.node.body, cst.For, cst.Call):
            if isinstance(node, cst.For):
                if facts.iterated_name(node.iter) in names:
                    return node
                continue
            if dotted_name(node.func) in _LOADER_READS:
                continue
            for arg in node.args:
                if dotted_name(arg.value) in names and _may_iterate(
                    facts, node, arg, local, elsewhere
                ):
                    return node
    return None


def _may_iterate(facts, call: cst.Call, arg: cst.Arg, local, elsewhere) -> bool:
    """The function `call` runs may loop over what `arg` passes: unless its summary (this
    file's, or the project index's) says the parameter is neither looped over nor handed on
    (barlowtwins' `adjust_learning_rate(args, optimizer, loader, step)` reads `len(loader)`)."""
    site = facts.call_site_of.get(call)
    summary = callee_summary(facts, site, local, elsewhere) if site is not None else None
    bound = summary.bound(call, arg) if summary is not None else None
    if bound is None or summary.varargs:
        return True
    return bound in (*summary.iterated, *summary.repeated, *summary.handed_away)


def zipped_with_other_iterables(facts: "ScriptFacts", site: CallSite) -> bool:
    """`for (a, b) in enumerate(zip(loader_A, loader_B)):`: a loop that iterates this loader
    together with other iterables, whose batches `loops_over` does not assign to a loader."""
    return bool(loader_names(facts, site) & _zipped_names(facts))


def _zipped_names(facts: "ScriptFacts") -> Set[str]:
    """The names some `for` loop's iterable hands to `zip(...)`, found once per pass."""
    memo = facts.memo("zipped_names")
    if None not in memo:
        memo[None] = {
            dotted_name(argument.value)
            for loop in facts.records.loops
            if isinstance(loop.node, cst.For)
            for call in find_all(loop.iter, cst.Call)
            if dotted_name(call.func) == "zip"
            for argument in call.args
        }
    return memo[None]


def _loaders_through_parameter(facts: "ScriptFacts", loop: Loop) -> List[CallSite]:
    """`def train(model, loader): for batch in loader:` called as `train(model, train_loader)`."""
    name = facts.iterated_name(loop.iter)
    if loop.function is None or name is None:
        return []
    return _parameter_loaders(facts, loop.function, name, set())


def _parameter_loaders(
    facts: "ScriptFacts", function: cst.FunctionDef, name: str, seen: Set[int]
) -> List[CallSite]:
    """The DataLoaders the callers of `function` bind its parameter `name` to; through a
    caller's own parameter (`train(model, train_dataloader)` handing it on to
    `train_step(model, dataloader=train_dataloader)`), that caller's callers in turn, never
    a module-level loader that happens to share the parameter's name."""
    params = [p.name.value for p in (*function.params.posonly_params, *function.params.params)]
    kwonly = [p.name.value for p in function.params.kwonly_params]
    if (name not in params and name not in kwonly) or id(function) in seen:
        return []
    seen.add(id(function))
    method = bool(params) and params[0] in ("self", "cls")
    index = params.index(name) - (1 if method else 0) if name in params else None
    loaders = []
    for caller in _callers(facts, function):
        bound = keyword(caller.node, name)
        if bound is None and index is not None and index >= 0 and not has_star_args(caller.node):
            args = positional(caller.node)
            bound = args[index] if index < len(args) else None
        if bound is None:
            continue
        direct = facts.call_site_of.get(bound.value)
        spelled = dotted_name(bound.value)
        if direct is not None and direct.qualname == DATALOADER:
            loaders.append(direct)
        elif _names_a_parameter(bound.value, caller.site.function):
            loaders += _parameter_loaders(facts, caller.site.function, spelled, seen)
        elif spelled:
            named = facts.loader_named(spelled, caller.node)
            if named is not None:
                loaders.append(named)
    return loaders


def _callers(facts: "ScriptFacts", function: cst.FunctionDef) -> List[CallSite]:
    """Calls that may run `function`: `train(...)`, `obj.train(...)` for a method, and
    `Trainer(...)` for `Trainer.__init__`."""
    table = _CALLS_BY_NAME.get(facts)
    if table is None:
        table = {}
        for call in facts.records.calls:
            func = call.node.func
            called = func.attr.value if isinstance(func, cst.Attribute) else dotted_name(func)
            if called:
                table.setdefault(called, []).append(call)
        _CALLS_BY_NAME[facts] = table
    name = function.name.value
    if name == "__init__":
        owners = [
            owner
            for owner, info in facts.classes.items()
            if any(statement is function for statement in info.node.body.body)
        ]
        return [call for owner in owners for call in table.get(owner, [])]
    params = function.params.posonly_params or function.params.params
    if params and params[0].name.value in ("self", "cls"):
        return list(table.get(name, []))
    return [call for call in table.get(name, []) if isinstance(call.node.func, cst.Name)]


def loaders_run_elsewhere(facts: "ScriptFacts") -> List[Tuple[CallSite, str, bool]]:
    """The DataLoaders of a script that runs training loops of other modules of the run (as
    the project index found) and hands them to such a loop (`train_one_epoch(model,
    data_loader_train, ...)` from engine.py) or to another function it imports
    (`evaluate(...)`), each with that call as written and whether it runs a training loop."""
    loops = loops_elsewhere(facts)
    if loops is None:
        return []
    found: List[Tuple[CallSite, str, bool]] = []
    for site in facts.dataloader_constructions():
        for call in facts.records.calls:
            written = dotted_name(call.node.func)
            runs_loop = written in loops.functions or call.method in loops.methods
            imported = (call.qualname or "").partition(".")[0] not in ("", "torch")
            if not (runs_loop or imported):
                continue
            if any(_is_loader(facts, arg.value, site) for arg in call.node.args):
                found.append((site, written or call.method or "", runs_loop))
                break
    return found


def _is_loader(facts: "ScriptFacts", node: cst.BaseExpression, site: CallSite) -> bool:
    if node is site.node:
        return True
    name = dotted_name(node)
    return name is not None and facts.loader_named(name, node) is site


def iterated_repeatedly(facts: "ScriptFacts", site: CallSite) -> bool:
    """The same loader object is iterated again and again (once per epoch, typically).

    True when a loop over it sits inside an outer loop, or inside a function called from a
    loop, and the loader is not rebuilt on each of those repetitions; or when it is handed to
    a function that loops over it (handoffs.py: of this file or of another module of the
    run) from such a place, or to one that loops over it inside a loop of its own.
    """
    if handoffs_of(facts, site).repeated or repeated_by_callers(facts, site):
        return True
    copies = prepared_copies(facts, site)
    if copies is not None and copies.repeated and copies.problem is None:
        return True
    built_in = {id(loop) for loop in site.site.loops}
    for loop in loops_over(facts, site):
        if any(id(outer) not in built_in for outer in loop.ancestors):
            return True
        if loop.function is not None and _called_in_loop(
            facts, loop.function, site, built_in, 0, set()
        ):
            return True
    return False


def iterated_once(facts: "ScriptFacts", site: CallSite) -> bool:
    """Each loader this construction builds is iterated one time: it is itself the iterable
    of a for loop or comprehension (`torch.cat([d[0] for d in DataLoader(data)])`), or the one
    name it is bound to is read once, by the one loop over it, in the function that builds it,
    and nothing repeats that loop without building the loader again. Persistent workers would
    then outlive every use."""
    parent = facts.parents.get(site.node)
    if isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is site.node:
        return True
    loops = loops_over(facts, site)
    if len(loops) != 1 or loops[0].function is not site.site.function:
        return False
    names = loader_names(facts, site)
    if len(names) != 1:
        return False
    (name,) = names
    if not name.isidentifier():
        return False  # `self.loader`: read wherever the object goes
    scope = site.site.function or facts.module
    reads = [use for use in name_uses(scope, name, facts) if not use.store]
    return (
        len(reads) == 1
        and not iterated_repeatedly(facts, site)
        and repetition_unknown(facts, site) is None
    )


def batches_read_at_most(facts: "ScriptFacts", site: CallSite) -> Optional[int]:
    """How many batches the one loop over a loader iterated once reads at most, when that
    loop leaves on a count of its own (`if ii == 1: break`: bounded_loops.py)."""
    loops = loops_over(facts, site)
    if len(loops) != 1 or not iterated_once(facts, site):
        return None
    return iterations_at_most(loops[0])


def _called_in_loop(facts, function, site, built_in, depth, seen) -> bool:
    if depth > MAX_DEPTH or function is site.site.function or id(function) in seen:
        return False  # a loader built inside the function is a new loader on each call
    if id(function) in _obtaining_functions(facts, site):
        return False  # so is one it gets by calling the function that builds it
    seen.add(id(function))
    for caller in _callers(facts, function):
        if any(id(loop) not in built_in for loop in caller.site.loops):
            return True
        if caller.site.function is not None and _called_in_loop(
            facts, caller.site.function, site, built_in, depth + 1, seen
        ):
            return True
    return False


# Loaders handed to functions -------------------------------------------------------------


@dataclass(frozen=True)
class Handoffs:
    """What the functions a loader is handed to do with it (handoffs.py)."""

    repeated: bool = False  # one of them loops over it again and again
    dataset_changed: bool = False  # one of them changes its dataset
    unknown: Optional[str] = None  # why one handed it inside a loop cannot be told


def handoffs_of(facts: "ScriptFacts", site: CallSite) -> Handoffs:
    """The calls that hand this loader to a function (`train_one_epoch(model, loader)`,
    `self._run_epoch(epoch, self.train_loader)`) and what those functions do with it."""
    table = facts.memo("loader_handoffs")
    if "sites" not in table:
        table["sites"] = _handoffs_by_site(facts)
    return table["sites"].get(id(site), Handoffs())


def looping_summaries(facts: "ScriptFacts") -> Dict[str, LoopingFunction]:
    """This file's LoopingFunction summaries, with those the project index gives."""
    memo = facts.memo("looping_functions")
    if "table" not in memo:
        memo["table"] = looping_functions(facts, imported_looping_functions(facts))
    return memo["table"]


def imported_looping_functions(facts: "ScriptFacts") -> Dict[str, LoopingFunction]:
    project = getattr(facts, "project", None)
    return dict(project.looping_functions) if project is not None else {}


def _handoffs_by_site(facts: "ScriptFacts") -> Dict[int, Handoffs]:
    local = looping_summaries(facts)
    elsewhere = imported_looping_functions(facts)
    found: Dict[int, Handoffs] = {}
    for call in facts.records.calls:
        for arg in call.node.args:
            if _names_a_parameter(arg.value, call.site.function):
                continue  # bound by the function's callers (_loaders_through_parameter)
            site, assigned_in = _loader_value(facts, arg.value, local)
            if site is None:
                continue
            built_in = {id(loop) for loop in (*site.site.loops, *assigned_in)}
            runs_again = any(id(loop) not in built_in for loop in call.site.loops) or (
                call.site.function is not None
                and _called_in_loop(facts, call.site.function, site, built_in, 0, set())
            )
            summary = callee_summary(facts, call, local, elsewhere)
            bound = summary.bound(call.node, arg) if summary is not None else None
            before = found.get(id(site), Handoffs())
            if bound is not None:
                repeated = bound in summary.repeated or (runs_again and bound in summary.iterated)
                found[id(site)] = replace(
                    before,
                    repeated=before.repeated or repeated,
                    dataset_changed=before.dataset_changed or bound in summary.dataset_changed,
                )
                if runs_again and not repeated and before.unknown is None:
                    if bound in summary.handed_away:
                        found[id(site)] = replace(found[id(site)], unknown=_handed_away(call.node))
            elif runs_again and before.unknown is None:
                reason = _unknown_callee(facts, call, summary, arg)
                if reason is not None:
                    found[id(site)] = replace(before, unknown=reason)
    return found


def _unknown_callee(facts, call, summary, arg) -> Optional[str]:
    written = excerpt(call.node.func)
    if _accelerate_prepare(facts, call.node) is not None:
        return (
            f"it is handed to `{written}` (Accelerate) inside a loop, which builds a new "
            "loader, with workers of its own, each time"
        )
    if written in NOT_ITERATING and not facts.imports.is_bound(written):
        return None
    if summary is not None:
        return (
            f"it is handed to `{written}` inside a loop in a way that cannot be matched to "
            "one of its parameters (`*args`)"
        )
    return (
        f"it is handed to `{written}` inside a loop, and that function is not in the files "
        "of this run (or is called through a name that cannot be followed), so what it does "
        "with the loader cannot be read"
    )


def _handed_away(call: cst.Call) -> str:
    return (
        f"it is handed to `{excerpt(call.func)}` inside a loop, which passes it on to a "
        "function that is not in the files of this run (or is called through a name that "
        "cannot be followed), so what that does with the loader cannot be read"
    )


def _names_a_parameter(node: cst.BaseExpression, function: Optional[cst.CSTNode]) -> bool:
    """`node` is a plain name that a parameter of `function` binds: a module-level loader of
    the same name (mrdbourke's `train(model, train_dataloader)` beside a global
    `train_dataloader`) is not what it holds. (`self.train_loader` is an attribute, followed
    as such.)"""
    if not isinstance(node, cst.Name) or not isinstance(function, cst.FunctionDef):
        return False
    return node.value in parameter_names(function) and node.value not in ("self", "cls")


def _obtaining_functions(facts: "ScriptFacts", site: CallSite) -> Set[int]:
    """ids of the functions that call the function of this file returning the loader `site`
    builds (`eval_dataloader = self.get_eval_dataloader()` in HF's Trainer.evaluate)."""
    builder = site.site.function
    if not isinstance(builder, cst.FunctionDef):
        return set()
    memo = facts.memo("obtaining_functions")
    if id(site) not in memo:
        name = builder.name.value
        memo[id(site)] = {
            id(call.site.function)
            for call in facts.records.calls
            if (call.method or dotted_name(call.node.func)) == name
            and call.site.function is not None
            and _returned_loader(facts, call) is site
        }
    return memo[id(site)]


def _loader_value(facts, node, local) -> Tuple[Optional[CallSite], Tuple[Loop, ...]]:
    """The DataLoader construction `node` is, with the loops the name it is read through is
    assigned in: the call itself, a name bound to it, or a name bound only to it (or to
    None) and to calls of a function of this file that returns it
    (`self.train_loader = self._prepare_dataloader(ds)`)."""
    direct = facts.call_site_of.get(node)
    if direct is not None and direct.qualname == DATALOADER:
        return direct, ()
    name = dotted_name(node)
    if name is None:
        return None, ()
    named = facts.loader_named(name, node)
    if named is not None:
        return named, ()
    found, loops = None, []
    for assignment in facts.assignments_to(name):
        value = assignment.value
        if is_name(value, "None") and not assignment.unpacked:
            continue  # `data_loader_val = None` without a validation set: nothing to iterate
        site = facts.call_site_of.get(value) if not assignment.unpacked else None
        direct = site if site is not None and site.qualname == DATALOADER else None
        made = direct or (_returned_loader(facts, site) if site is not None else None)
        if made is None or (found is not None and made is not found):
            return None, ()
        found = made
        loops.extend(assignment.site.loops)
    return found, tuple(loops)


def _returned_loader(facts: "ScriptFacts", call: CallSite) -> Optional[CallSite]:
    """The DataLoader construction a function of this file returns on every path, whole:
    `def _prepare_dataloader(self, ds): return DataLoader(ds, ...)`."""
    return returned_loader_at(facts, call, -1)


def returned_loader_at(facts: "ScriptFacts", call: CallSite, index: int) -> Optional[CallSite]:
    """The DataLoader construction a function of this file returns at position `index` of
    the tuple every `return` of it gives (`return train_dataloader, val_dataloader, tokenizer`
    unpacked as `train_dl, val_dl, tok = get_ds(config)`)."""
    key = callee_key(facts, call)
    memo = facts.memo("returned_loader_at")
    if (key, index) not in memo:
        function = _function_named(facts, key)
        memo[(key, index)] = dict(returned_loaders(facts, function)).get(index)
    return memo[(key, index)]


def returned_loaders(
    facts: "ScriptFacts", function: Optional[cst.FunctionDef]
) -> List[Tuple[int, CallSite]]:
    """The DataLoader constructions `function` returns on every path, with their positions:
    -1 for a loader every `return` gives as the whole value, else the index it has in the
    tuple every `return` gives (`return train_dl, test_dl, class_names`: 0 and 1)."""
    if function is None:
        return []
    memo = facts.memo("returned_loaders")
    if id(function) not in memo:
        values = [r.value for r in find_all(function.body, cst.Return)]
        found = []
        if values and not find_all(function.body, cst.FunctionDef, cst.ClassDef):
            widths = {len(v.elements) if isinstance(v, cst.Tuple) else -1 for v in values}
            positions = range(widths.pop()) if len(widths) == 1 else ()
            for index in [-1, *positions]:
                made = [_loader_returned_at(facts, v, index, function) for v in values]
                first = made[0]
                if first is not None and all(m is first for m in made):
                    found.append((index, first))
        memo[id(function)] = found
    return memo[id(function)]


def _loader_returned_at(facts, value, index, function) -> Optional[CallSite]:
    """The DataLoader construction `value` (a returned expression) gives, whole (index -1) or
    at `index` of the tuple it is."""
    if index >= 0:
        if not isinstance(value, cst.Tuple) or len(value.elements) <= index:
            return None
        if any(isinstance(e, cst.StarredElement) for e in value.elements[: index + 1]):
            return None
        value = value.elements[index].value
    if value is None:
        return None
    direct = facts.call_site_of.get(value)
    if direct is not None:
        return direct if direct.qualname == DATALOADER else None
    if not isinstance(value, cst.Name):
        return None
    bound = facts.assignments_in_scope(value.value, function)
    if not bound or any(a.unpacked or a.augmented for a in bound):
        return None
    sites = [facts.call_site_of.get(a.value) for a in bound]
    site = sites[0]
    same = site is not None and all(other is site for other in sites)
    return site if same and site.qualname == DATALOADER else None


def _function_named(facts: "ScriptFacts", key: Optional[str]) -> Optional[cst.FunctionDef]:
    if key is None:
        return None
    memo = facts.memo("functions_by_key")
    if "table" not in memo:
        # The first `def` of each name at module level ("train") and in each class
        # ("Trainer.fit"): one walk per pass, not one per loader.
        table: Dict[str, cst.FunctionDef] = {}
        scopes = [("", facts.module.body)]
        scopes += [(f"{owner}.", info.node.body.body) for owner, info in facts.classes.items()]
        for prefix, statements in scopes:
            for statement in statements:
                if isinstance(statement, cst.FunctionDef):
                    table.setdefault(prefix + statement.name.value, statement)
        memo["table"] = table
    return memo["table"].get(key)


def repetition_unknown(facts: "ScriptFacts", site: CallSite) -> Optional[str]:
    """Why it cannot be told whether the loader is iterated once per epoch: it is handed,
    inside a loop, to a function that cannot be read, or returned to callers whose loops are
    not followed (None when nothing is in doubt)."""
    unknown = handoffs_of(facts, site).unknown
    copies = prepared_copies(facts, site)
    if unknown is None and copies is not None and copies.repeated and copies.problem:
        unknown = (
            f"Accelerate's `prepare` builds the loader iterated every epoch from it, and "
            f"{copies.problem}: what that does to the workers' copy of the dataset is not "
            "followed"
        )
    if unknown is None and not loops_over(facts, site):
        function = returned_by(facts, site)
        if function is not None:
            unknown = (
                f"it is returned by `{function}()`, and the loops of its callers are not "
                "followed"
            )
        elif _yielded_from(facts, site):
            unknown = (
                f"`{site.site.function.name.value}()` iterates it with `yield from`, and how "
                "often (`while True:` around it) and who draws from the generator are not "
                "followed"
            )
    return unknown


def _yielded_from(facts: "ScriptFacts", site: CallSite) -> bool:
    """A generator function iterates this loader with `yield from loader` (guided-diffusion's
    `load_data`: `while True: yield from loader`)."""
    function = site.site.function
    if not isinstance(function, cst.FunctionDef):
        return False
    names = loader_names(facts, site)
    return any(
        isinstance(node.value, cst.From)
        and (node.value.item is site.node or dotted_name(node.value.item) in names)
        for node in find_all(function.body, cst.Yield)
    )


def returned_by(facts: "ScriptFacts", site: CallSite) -> Optional[str]:
    """The function that returns this loader to its callers (`return data_loader`, or the
    construction itself, alone or in a tuple), if any."""
    function = site.site.function
    if not isinstance(function, cst.FunctionDef):
        return None
    names = loader_names(facts, site)
    for node in find_all(function.body, cst.Return):
        values = node.value.elements if isinstance(node.value, cst.Tuple) else [node]
        for element in values:
            value = element.value
            if value is site.node or (value is not None and dotted_name(value) in names):
                return function.name.value
    return None


def batch_loops(facts: "ScriptFacts", site: CallSite) -> List[Tuple[Loop, Set[str]]]:
    """The loops that get this loader's batches, with the names bound to them: loops over it,
    and loops that draw them with `batch = next(it)` from an iterator of it."""
    loops = [(loop, set(loop.targets)) for loop in loops_over(facts, site)]
    loops += [(loop, seeds) for loop, seeds, _, loaders in drawing_loops(facts) if site in loaders]
    return loops


def copies_batches_to_accelerator(facts: "ScriptFacts", site: CallSite) -> bool:
    """Some loop over this loader copies (parts of) its batches to an accelerator (`.to(device)`,
    `.cuda()`, `.type(torch.cuda.FloatTensor)`), or a loop that draws them with
    `batch = next(it)` from an iterator of it (`it = iter(loader)`); or, for a loader a
    function returns to other modules of the run, a loop of theirs does."""
    return _loops_copy_batches(facts, batch_loops(facts, site)) or bool(
        copied_by_callers(facts, site)
    )


def copied_by_callers(facts: "ScriptFacts", site: CallSite) -> List[str]:
    """The files of the run that call the function returning this loader and copy its batches
    to an accelerator in a loop over what it returns (project.IncomingCall.returned)."""
    return _callers_using(facts, site, lambda use, repeated: use == "copied")


def repeated_by_callers(facts: "ScriptFacts", site: CallSite) -> List[str]:
    """The files of the run that call the function returning this loader and loop over what
    it returns inside another loop (once per epoch), never reading its `.dataset`."""
    return _callers_using(facts, site, lambda use, repeated: repeated)


def _callers_using(facts: "ScriptFacts", site: CallSite, wanted) -> List[str]:
    function = site.site.function
    project = getattr(facts, "project", None)
    if project is None or not project.calls or not isinstance(function, cst.FunctionDef):
        return []
    if not any(statement is function for statement in facts.module.body):
        return []  # a method: its callers are not told apart from other classes' methods
    indexes = [index for index, made in returned_loaders(facts, function) if made is site]
    return sorted(
        {
            call.caller
            for call in project.calls_to(function.name.value)
            for index, use, repeated in call.returned
            if index in indexes and wanted(use, repeated)
        }
    )


def returned_loader_use(facts: "ScriptFacts", call: CallSite, index: int) -> Tuple[str, bool]:
    """What this file does with the DataLoader a call of another module's function returns
    (whole, index -1, or at `index` of its tuple): "copied" when a loop over it copies its
    batches to an accelerator; "iterated" when loops over it copy nothing; "" when no loop
    over it is found here (it is stored, passed elsewhere...). The loops are those of the
    calling function, or, when it has none, those a function of this file it is handed to
    runs over the parameter receiving it (rasbt's `train_model_simple(model, train_loader,
    ...)`). With whether such a loop runs inside another loop that does not also make the
    call (once per epoch), no function reading the loader's `.dataset` (which workers kept
    alive across epochs would not see change)."""
    bound = {
        a.target
        for a in facts.assignments_taking(call.node)
        if (a.index if a.unpacked else -1) == index and not a.augmented
    }
    if not bound:
        return "", False
    function = call.site.function
    wrapped = {
        a.target
        for a in facts.records.assignments
        if a.site.function is function
        and isinstance(a.value, cst.Call)
        and not a.unpacked
        and facts.iterated_name(a.value) in bound
    }
    loops = _loops_over_names(facts, function, bound | wrapped)
    readers = [(function, bound | wrapped)]
    built_in = {id(loop) for loop in call.site.loops}
    # A loop around the hand-over runs the helper's loops once per pass, as an epoch.
    handed_per_pass = False
    if not loops:
        for helper, parameter, handing in _handed_to_helpers(facts, function, bound):
            helper_loops = _loops_over_names(facts, helper, {parameter})
            loops += helper_loops
            readers.append((helper, {parameter}))
            handed_per_pass = handed_per_pass or bool(
                helper_loops and any(id(outer) not in built_in for outer in handing.site.loops)
            )
    if not loops:
        return "", False
    use = "copied" if _loops_copy_batches(facts, loops) else "iterated"
    nested = handed_per_pass or any(
        id(outer) not in built_in for loop, _ in loops for outer in loop.ancestors
    )
    dataset_read = any(
        isinstance(parent, cst.Attribute)
        and parent.value is node
        and parent.attr.value == "dataset"
        for scope, names in readers
        for name in names
        for node, parent, _ in _name_uses(facts, scope if scope is not None else facts.module).get(
            name, ()
        )
    )
    return use, nested and not dataset_read


def _loops_over_names(
    facts: "ScriptFacts", function: Optional[cst.FunctionDef], names: Set[str]
) -> List[Tuple[Loop, Set[str]]]:
    return [
        (loop, set(loop.targets))
        for loop in facts.records.loops
        if isinstance(loop.node, cst.For)
        and loop.function is function
        and facts.iterated_name(loop.iter) in names
    ]


def _handed_to_helpers(
    facts: "ScriptFacts", function: Optional[cst.FunctionDef], names: Set[str]
) -> List[Tuple[cst.FunctionDef, str, CallSite]]:
    """(the function, its parameter, the call) for each call in `function` that hands one of
    `names` to a module-level function of this file that never rebinds that parameter."""
    return [
        (helper, parameter, call)
        for call in facts.in_function("calls", function)
        for _, helper, parameter in arguments_handed(
            facts, call, lambda value: dotted_name(value) in names
        )
        if not _rebinds(facts, helper, parameter)
    ]


def arguments_handed(
    facts: "ScriptFacts", call: CallSite, wanted: Callable[[cst.BaseExpression], bool]
) -> Iterator[Tuple[cst.Arg, cst.FunctionDef, str]]:
    """(argument, function, parameter) for each argument of `call` that `wanted` accepts and
    that `call` binds to a parameter of the module-level function of this file it runs."""
    function = module_function(facts, call)
    if function is None:
        return
    for arg in call.node.args:
        if arg.star or not wanted(arg.value):
            continue
        parameter = parameter_receiving(function, call.node, arg.value)
        if parameter is not None:
            yield arg, function, parameter


def batch_part_of(facts: "ScriptFacts", names: Set[str]) -> Callable[[cst.BaseExpression], bool]:
    """Accepts a part of the batch bound to `names`, or a view of one."""
    return lambda value: facts.derives_from(under_views(value), names)


def _rebinds(facts: "ScriptFacts", function: cst.FunctionDef, name: str) -> bool:
    return locally_assigned(facts, name, function) or name in bound_otherwise(facts, function)


def _loops_copy_batches(facts: "ScriptFacts", loops: List[Tuple[Loop, Set[str]]]) -> bool:
    for loop, seeds in loops:
        names = facts.names_derived_in(loop, seeds)
        for call in facts.loop_calls(loop):
            func = call.node.func
            if (
                call.method in COPY_METHODS
                and isinstance(func, cst.Attribute)
                and facts.derives_from(under_views(func.value), names)
                and places_on_accelerator(facts, call.node)
            ):
                return True
            if _helper_copies(facts, call, names):
                return True
    return False


def _helper_copies(facts: "ScriptFacts", call: CallSite, names: Set[str]) -> bool:
    """`call` hands a part of the batch to a module-level function of this file that copies
    the parameter receiving it to an accelerator (rasbt's `calc_loss_batch(input_batch, ...)`
    doing `input_batch.to(device)`) before anything else binds that parameter."""
    return any(
        parameter_copies(facts, helper, parameter)
        for _, helper, parameter in arguments_handed(facts, call, batch_part_of(facts, names))
    )


def parameter_copies(facts: "ScriptFacts", function: cst.FunctionDef, name: str) -> List[CallSite]:
    """The copies to an accelerator (`.to(device)`, `.cuda()`...) of parameter `name` of
    `function` (or of a view of it) made in its body outside any loop, while the parameter
    still holds what the caller passed: before any statement that binds it again."""
    # Asked once per call that hands a batch to `function`: answered once per pass.
    memo = facts.memo("parameter_copies")
    key = (id(function), name)
    if key not in memo:
        memo[key] = _parameter_copies(facts, function, name)
    return memo[key]


def _parameter_copies(facts: "ScriptFacts", function: cst.FunctionDef, name: str) -> List[CallSite]:
    if name in bound_otherwise(facts, function):
        return []
    rebound = facts.assignments_in_scope(name, function)

    def before_rebinding(call: CallSite) -> bool:
        # An assignment's value is read before it binds: `x = x.to(device)` copies the argument.
        return all(
            a.site.order > call.site.order or a.site.statement is call.site.statement
            for a in rebound
        )

    return [
        call
        for call in facts.in_function("calls", function)
        if call.method in COPY_METHODS
        and call.site.loop is None
        and isinstance(call.node.func, cst.Attribute)
        and dotted_name(under_views(call.node.func.value)) == name
        and before_rebinding(call)
        and places_on_accelerator(facts, call.node)
    ]


def drawing_loops(facts: "ScriptFacts") -> List[Tuple[Loop, Set[str], Set[int], List[CallSite]]]:
    """Loops that bind batches with `x = next(it)` from an iterator of loaders
    (`it = iter(train_loader)`, `self.dl = cycle(dl)`; batch_sources.py): each with the names
    bound to the batches, the ids of those `next` calls and the loaders. Iterators of
    Accelerate-prepared loaders are left out."""
    memo = facts.memo("drawing_loops")
    if None not in memo:
        drawn: Dict[int, Tuple[Loop, Set[str], Set[int], List[CallSite]]] = {}
        for assignment in facts.records.assignments:
            loop = assignment.site.loop
            iterator = drawn_iterator(facts, assignment.value, assignment.site.function)
            if loop is None or iterator is None or assignment.augmented:
                continue
            source = batch_source(facts, *iterator)
            if source is None or not source.loaders or source.prepared:
                continue
            _, seeds, calls, loaders = drawn.setdefault(id(loop), (loop, set(), set(), []))
            seeds.add(assignment.target)
            calls.add(id(assignment.value))
            loaders.extend(source.loaders)
        memo[None] = list(drawn.values())
    return memo[None]


# Processes -----------------------------------------------------------------------------
def runs_only_under_main_guard(facts: "ScriptFacts", site: CallSite) -> bool:
    """The loader is built, or every loop over it runs, only when the file is the main program.

    Worker processes started with `spawn` or `forkserver` (the default on macOS, Windows and,
    since Python 3.14, Linux) import the main module again: a loop over the loader at module
    level would start workers from inside a worker.
    """
    if not facts.records.has_main_guard and not imported_only_under_main_guard(facts):
        return False
    guarded = _guarded_nodes(facts.module)

    def runs_guarded(node: cst.CSTNode, function: Optional[cst.FunctionDef]) -> bool:
        if function is None:
            return node in guarded
        return _function_guarded(facts, function, guarded, 0)

    if runs_guarded(site.node, site.site.function):
        return True
    loops = loops_over(facts, site)
    return bool(loops) and all(runs_guarded(loop.node, loop.function) for loop in loops)


def imported_only_under_main_guard(facts: "ScriptFacts") -> bool:
    """Other modules of the run call into this one, and each such call runs only under its
    file's `__main__` guard (project.py): a worker started with spawn imports the main module
    again, which runs none of those calls, and this module only on import."""
    project = getattr(facts, "project", None)
    return project is not None and bool(project.calls) and all(c.guarded for c in project.calls)


def unguarded_callers(facts: "ScriptFacts") -> List[str]:
    """The files of the run that call into this module outside a `__main__` guard."""
    project = getattr(facts, "project", None)
    calls = project.calls if project is not None else ()
    return sorted({c.caller for c in calls if not c.guarded})


def runs_under_main_guard(
    facts: "ScriptFacts", node: cst.CSTNode, function: Optional[cst.FunctionDef]
) -> bool:
    """`node` (in `function`, None: module level) runs only when this file is the main
    program: under its `__main__` guard, or in functions called only from there."""
    if not facts.records.has_main_guard:
        return False
    memo = facts.memo("guarded_nodes")
    if "nodes" not in memo:
        memo["nodes"] = _guarded_nodes(facts.module)
    guarded = memo["nodes"]
    if function is None:
        return node in guarded
    return _function_guarded(facts, function, guarded, 0) and bool(_callers(facts, function))


def _function_guarded(facts, function, guarded, depth) -> bool:
    if depth > MAX_DEPTH:
        return False
    for caller in _callers(facts, function):
        if caller.site.function is None:
            if caller.node not in guarded:
                return False
        elif caller.site.function is not function and not _function_guarded(
            facts, caller.site.function, guarded, depth + 1
        ):
            return False
    return True


def _guarded_nodes(module: cst.Module) -> Set[cst.CSTNode]:
    nodes: Set[cst.CSTNode] = set()
    for statement in module.body:
        if isinstance(statement, cst.If) and is_main_guard(statement):
            nodes.update(find_all(statement.body, cst.For, cst.While, cst.Call))
    return nodes


def module_name(facts: "ScriptFacts", module: str) -> Optional[str]:
    """The local name for `module`, or None when that name is taken by something else.

    When the module is not imported, its own name is returned and the caller adds the import.
    """
    bound = facts.imports.name_for_module(module)
    if bound is not None:
        return bound
    return None if facts.imports.is_bound(module) else module


# Batched fetching ----------------------------------------------------------------------
# The loader attributes that auto-batching sets and `batch_size=None` with a batch sampler
# does not: code reading them sees a different value after OPT104's rewrite.
BATCHING_ATTRIBUTES = frozenset(
    {"batch_size", "batch_sampler", "sampler", "drop_last", "collate_fn", "_auto_collation"}
)


def dataset_call(facts: "ScriptFacts", site: CallSite) -> Optional[cst.Call]:
    """The call that builds the loader's dataset: the argument itself, or the value of a name
    (or attribute) assigned exactly once, in the loader's function or at module level; a
    parameter is first followed to its argument at the one call (dataset_source)."""
    arg = option(site.node, "dataset")
    if arg is None or arg.star:
        return None
    node, function = dataset_source(facts, arg.value, site.site.function)
    params = parameter_names(function)
    for _ in range(MAX_DEPTH):
        if isinstance(node, cst.Call):
            return node
        name = dotted_name(node)
        if name is None or name in params:
            return None
        assignments = facts.assignments_to(name)
        if len(assignments) != 1:
            return None
        (assignment,) = assignments
        where = assignment.site.function
        if assignment.unpacked or assignment.augmented:
            return None
        if "." not in name and where is not function and where is not None:
            return None
        node = assignment.value
    return None


def _name_uses(facts: "ScriptFacts", scope: cst.CSTNode) -> dict:
    """Every Name or attribute chain read in `scope` (a function, or the module), by its
    dotted text, with its parent and grandparent: built once per pass and scope."""
    memo = facts.memo("name_uses")
    key = id(scope)
    if key not in memo:
        table: dict = {}
        up = parents(scope)
        for node, parent in up.items():
            if not isinstance(node, (cst.Name, cst.Attribute)):
                continue
            if isinstance(parent, cst.Attribute) and parent.attr is node:
                continue  # `loader` in `self.loader` is not the name `loader`
            name = dotted_name(node)
            if name is not None:
                table.setdefault(name, []).append((node, parent, up.get(parent)))
        memo[key] = table
    return memo[key]


def _visible_in(
    facts: "ScriptFacts", name: str, function: Optional[cst.FunctionDef]
) -> cst.CSTNode:
    """Where `name`, bound in `function`, can be read: that function (with the functions
    nested in it) when the name is local to it (a parameter, or assigned there without a
    `global`/`nonlocal`), else the whole module. Searching the scope rather than the file
    keeps a loader's check proportional to its function, not to the file."""
    if function is None or "." in name:
        return facts.module
    if declares_global(function, name):
        return facts.module
    local = name in parameter_names(function) or locally_assigned(facts, name, function)
    return function if local else facts.module


def loader_use_beyond_iteration(facts: "ScriptFacts", site: CallSite) -> Optional[str]:
    """How the loader is used other than by iterating it, when it is: None when every use of
    it is a `for` loop over it (directly or through `enumerate`/`iter`/`tqdm`/`zip`),
    `len(loader)`, `loader.dataset`, or passing it to a function of this file that loops
    over it. Anything else (reading `loader.batch_size`, handing it to a library) may see the
    loader's own batching options, which a batch sampler changes.
    """
    call = site.node
    # Each name the loader is read by, with the scope that can see that binding.
    bindings = [(name, site.site.function) for name in sorted(loader_names(facts, site))]
    loops = loops_over(facts, site)
    for loop in loops:
        iterated = facts.iterated_name(loop.iter)
        if iterated is not None:
            bindings.append((iterated, loop.function))
    assignment = facts.assignment_of(call)
    direct = any(loop.iter is call for loop in loops)
    if assignment is None and not direct:
        return "the loader is not bound to a name or iterated where it is built"
    looping_functions = {loop.function.name.value for loop in loops if loop.function is not None}
    # In source order, each (name, scope) once: the first problem found is the one reported.
    scopes = dict.fromkeys(
        (name, _visible_in(facts, name, function)) for name, function in bindings
    )
    for name, scope in scopes:
        for node, parent, grandparent in _name_uses(facts, scope).get(name, ()):
            problem = _use_problem(facts, name, node, parent, grandparent, looping_functions)
            if problem is not None:
                return problem
    return None


def _use_problem(facts, name, node, parent, grandparent, looping_functions) -> Optional[str]:
    if isinstance(parent, cst.Attribute) and parent.value is node:
        attr = parent.attr.value
        return None if attr == "dataset" else f"`{name}.{attr}` is read"
    if isinstance(parent, cst.For) and parent.iter is node:
        return None
    if isinstance(parent, (cst.AssignTarget, cst.Param, cst.FunctionDef, cst.ClassDef)):
        return None  # where it is bound
    if isinstance(parent, cst.AnnAssign) and parent.target is node:
        return None
    if isinstance(parent, (cst.ImportAlias, cst.AsName)):
        return None
    if isinstance(parent, cst.Arg):
        if parent.keyword is node:
            return None  # `f(loader=...)`: the keyword, not the name
        if isinstance(grandparent, cst.Call) and not parent.star:
            callee = facts.qualified_name(grandparent.func) or dotted_name(grandparent.func)
            if callee in ITERATION_FUNCTIONS:
                return None
            if callee is not None and callee.rsplit(".", 1)[-1] in looping_functions:
                return None
            return f"`{name}` is passed to `{callee or 'a call'}`"
    if isinstance(parent, cst.Assign) and parent.value is node:
        return f"`{name}` is assigned to another name"
    return f"`{name}` is used as a value"


# Calls that only iterate (or count) the loader they are given.
ITERATION_FUNCTIONS = frozenset(
    {"enumerate", "iter", "len", "zip", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm"}
)


# Options from a dict -------------------------------------------------------------------
# Methods that change a dict in place.
DICT_MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__"})


@dataclass
class OptionsDict:
    """`loader_args = dict(batch_size=64, num_workers=4)` (or `{...}`) assigned once and
    passed as `DataLoader(ds, **loader_args)`: options a rule can read, and maybe edit."""

    name: str
    node: cst.BaseExpression  # the `dict(...)` call or the `{...}` literal
    entries: Dict[str, cst.BaseExpression]
    loaders: Tuple[cst.Call, ...]  # every DataLoader call that receives `**name`
    # Why the dict's options cannot be trusted (it is changed or passed on), or None.
    problem: Optional[str]
    # The `a if condition else b` the dict is a branch of: only one of its branches applies.
    branch_of: Optional[cst.IfExp] = None

    def with_entry(self, key: str, value: cst.BaseExpression) -> cst.BaseExpression:
        """The dict with `key` set to `value` (its value replaced when it is there)."""
        node = self.node
        if isinstance(node, cst.Call):
            found = keyword(node, key)
            if found is not None:
                return node.with_changes(
                    args=[a.with_changes(value=value) if a is found else a for a in node.args]
                )
            return with_keyword(node, key, value)
        assert isinstance(node, cst.Dict)
        elements = list(node.elements)
        for index, element in enumerate(elements):
            if isinstance(element, cst.DictElement) and literal(element.key, None) == key:
                elements[index] = element.with_changes(value=value)
                return node.with_changes(elements=elements)
        first = elements[0].key if elements else None
        quote = first.quote if isinstance(first, cst.SimpleString) else '"'
        new = cst.DictElement(cst.SimpleString(f"{quote}{key}{quote}"), value)
        if not elements:
            return node.with_changes(elements=[new])
        last = elements[-1]
        if isinstance(last.comma, cst.Comma):  # a trailing comma: the new entry goes last
            trailing = last.comma.whitespace_after
            between = (
                elements[-2].comma.whitespace_after
                if len(elements) > 1 and isinstance(elements[-2].comma, cst.Comma)
                else node.lbrace.whitespace_after
            )
            multiline = isinstance(trailing, cst.ParenthesizedWhitespace) or isinstance(
                node.rbrace.whitespace_before, cst.ParenthesizedWhitespace
            )
            if not multiline or not isinstance(between, cst.ParenthesizedWhitespace):
                between = cst.SimpleWhitespace(" ")
            elements[-1] = last.with_changes(
                comma=last.comma.with_changes(whitespace_after=between)
            )
            new = new.with_changes(comma=cst.Comma(whitespace_after=trailing))
        else:  # one entry a line stays one entry a line
            between = (
                elements[-2].comma.whitespace_after
                if len(elements) > 1 and isinstance(elements[-2].comma, cst.Comma)
                else None
            )
            if not isinstance(between, cst.ParenthesizedWhitespace):
                between = cst.SimpleWhitespace(" ")
            elements[-1] = last.with_changes(comma=cst.Comma(whitespace_after=between))
        elements.append(new)
        return node.with_changes(elements=elements)


def options_dict(facts: "ScriptFacts", call: cst.Call) -> Optional[OptionsDict]:
    """The dict a loader's `**name` options come from, when the file shows all of it: one
    `**name` and no `*args`, `name` assigned once, at module level or before the call in
    its function, to `dict(key=value, ...)` or a `{"key": value}` literal. Its `problem`
    says when the dict is changed or used otherwise than as `**name` of DataLoaders and
    `name["key"]` reads (then its options are as unknown as those of any `**kwargs`)."""
    assignment = _options_assignment(facts, call)
    entries = _entries(facts, assignment.value) if assignment is not None else None
    if assignment is None or entries is None:
        return None
    loaders, problem, _ = _options_uses(facts, assignment)
    return OptionsDict(assignment.target, assignment.value, entries, loaders, problem)


def _options_assignment(facts: "ScriptFacts", call: cst.Call):
    """The one assignment of the `name` of a loader's only `**name` (no `*args`), at module
    level or before the call in its function; None otherwise."""
    stars = [a for a in call.args if a.star == "**"]
    if has_star_args(call) or len(stars) != 1 or not isinstance(stars[0].value, cst.Name):
        return None
    site = facts.call_site_of.get(call)
    assignments = facts.assignments_to(stars[0].value.value)
    if site is None or len(assignments) != 1:
        return None
    assignment = assignments[0]
    if (
        assignment.unpacked
        or assignment.augmented
        or assignment.site.function not in (None, site.site.function)
        or (assignment.site.function is not None and assignment.site.order > site.site.order)
    ):
        return None
    return assignment


def _options_uses(facts: "ScriptFacts", assignment):
    memo = facts.memo("options_dict")
    if id(assignment.value) not in memo:
        scope = assignment.site.function or facts.module
        memo[id(assignment.value)] = _dict_uses(facts, scope, assignment.target, assignment)
    return memo[id(assignment.value)]


def option_values(
    facts: "ScriptFacts", call: cst.Call, name: str
) -> Optional[List[cst.BaseExpression]]:
    """Every value DataLoader option `name` may take, when the file shows them all: from the
    call, or from each dict its `**options` take entries from (option_sources). [] when
    nothing sets it (its default); None when the options cannot all be read."""
    arg = option(call, name)
    if arg is not None:
        return [arg.value]
    if not options_hidden(call):
        return []
    forwarded = _forwarded_option(facts, call, name)
    if forwarded is not None:
        return forwarded
    sources = option_sources(facts, call)
    if sources is None:
        return None
    return [source.entries[name] for source in sources if name in source.entries]


def option_settings(
    facts: "ScriptFacts", call: cst.Call, name: str
) -> Optional[List[cst.BaseExpression]]:
    """option_values, with each plain name the file binds only to literals replaced by those
    literals (`num_workers=num_workers` with `num_workers = 0` in a notebook's first cell)."""
    values = option_values(facts, call, name)
    if values is None:
        return None
    site = facts.call_site_of.get(call)
    function = site.site.function if site is not None else None
    # Names a parameter, a loop or `with` binds hold what no assignment shows.
    unsettled = bound_otherwise(facts, None)
    if isinstance(function, cst.FunctionDef):
        unsettled = unsettled | set(parameter_names(function)) | bound_otherwise(facts, function)
    settled: List[cst.BaseExpression] = []
    for value in values:
        plain = isinstance(value, cst.Name) and value.value not in unsettled
        bound = facts.assignments_to(value.value) if plain else ()
        if bound and all(
            not a.unpacked and not a.augmented and literal(a.value, None) is not None for a in bound
        ):
            settled.extend(a.value for a in bound)
        else:
            settled.append(value)
    return settled


def loads_in_main_process(facts: "ScriptFacts", call: cst.Call) -> bool:
    """Whether DataLoader `call` prepares its batches in the training process on every path:
    `num_workers` unset, or 0 wherever it is set (literals bound to a plain name count).
    Such a loader also pins each batch there, inline, right before the loop gets it
    (torch's `_SingleProcessDataLoaderIter._next_data`); only with workers does a separate
    thread pin them. False when the options cannot all be read."""
    workers = option_settings(facts, call, "num_workers")
    return workers is not None and all(is_literal(value, 0) for value in workers)


def _forwarded_option(
    facts: "ScriptFacts", call: cst.Call, name: str
) -> Optional[List[cst.BaseExpression]]:
    """Option `name` of `DataLoader(ds, **kwargs)` built in a function (a wrapper class's
    `__init__`, as makemore's InfiniteDataLoader) that hands on its own `**kwargs` untouched:
    what the function's one caller in this file passes by that keyword ([] when it passes
    none, or when the function takes `name` as a parameter of its own). None when the call
    does not have this shape or the caller is not the only one, or hides keywords itself."""
    stars = [a for a in call.args if a.star == "**"]
    site = facts.call_site_of.get(call)
    function = site.site.function if site is not None else None
    if (
        has_star_args(call)
        or len(stars) != 1
        or not isinstance(stars[0].value, cst.Name)
        or not isinstance(function, cst.FunctionDef)
    ):
        return None
    forwarded = function.params.star_kwarg
    spelled = stars[0].value.value
    if not isinstance(forwarded, cst.Param) or forwarded.name.value != spelled:
        return None
    # Read once, by this call: nothing adds, removes or replaces an entry on the way.
    if sum(1 for n in find_all(function.body, cst.Name) if n.value == spelled) != 1:
        return None
    caller = the_caller(facts, function)
    if caller is None or options_hidden(caller.node):
        return None
    params = function.params
    if name in [p.name.value for p in (*params.params, *params.kwonly_params)]:
        return []  # taken by the function's own parameter: never in `**kwargs`
    passed = keyword(caller.node, name)
    return [passed.value] if passed is not None else []


def option_sources(facts: "ScriptFacts", call: cst.Call) -> Optional[List[OptionsDict]]:
    """The dicts a loader's `**options` take their entries from, when the file shows them
    all: the dict itself, each branch of a dict chosen by a condition (`{"num_workers": 1}
    if use_cuda else {}`) and each dict merged into it by `options.update(...)` before the
    call (pytorch/examples fills its loaders' options so under `if use_accel:`). Each one's
    `loaders` are every DataLoader it reaches (through every dict it is merged into), its
    `problem` why it may not be edited; None when the options cannot all be read."""
    assignment = _options_assignment(facts, call)
    if assignment is None:
        return None
    value = assignment.value
    loaders, problem, updates = _options_uses(facts, assignment)
    if problem is not None and updates is None:
        return None
    branch_of = value if isinstance(value, cst.IfExp) else None
    dicts = [value.body, value.orelse] if branch_of is not None else [value]
    sources = []
    for node in dicts:
        entries = _entries(facts, node)
        if entries is None:
            return None
        sources.append(OptionsDict(assignment.target, node, entries, loaders, None, branch_of))
    site = facts.call_site_of[call]
    for update in updates or ():
        update_site = facts.call_site_of.get(update)
        if update_site is None or update_site.site.order > site.site.order:
            return None  # an update after the call does not reach this loader
        merged = _merged_source(facts, update, assignment.target, loaders)
        if merged is None:
            return None
        sources.append(merged)
    return sources


def _merged_source(
    facts: "ScriptFacts", update: cst.Call, receiver: str, loaders: Tuple[cst.Call, ...]
) -> Optional[OptionsDict]:
    """The dict `receiver.update(...)` merges: `update(pin_memory=True)` itself, a dict
    literal, or a name bound once to a dict that is only ever merged into others (then it
    reaches the loaders of each of them)."""
    if not update.args or update.args[0].keyword is not None:  # `options.update(key=value)`
        entries = {a.keyword.value: a.value for a in update.args if a.keyword is not None}
        if any(a.keyword is None or a.star for a in update.args):
            return None
        return OptionsDict(receiver, update, entries, loaders, None)
    if len(update.args) != 1 or update.args[0].star:
        return None
    merged = update.args[0].value
    node = _only_merged_dict(facts, merged)
    entries = _entries(facts, node) if node is not None else None
    if entries is None:
        return None
    if not isinstance(merged, cst.Name):
        return OptionsDict(receiver, node, entries, loaders, None)
    reached, problem = _merged_loaders(facts, merged.value)
    return OptionsDict(merged.value, node, entries, reached, problem)


def _merged_loaders(facts: "ScriptFacts", name: str) -> Tuple[Tuple[cst.Call, ...], Optional[str]]:
    """Every DataLoader that dict `name` reaches through the dicts it is merged into, and why
    an entry added to it could reach something else (None when it cannot)."""
    memo = facts.memo("merged_loaders")
    if name not in memo:
        loaders: List[cst.Call] = []
        problem = None
        for update in _merges_of(facts).get(name, ()):
            func = update.func
            receiver = func.value if isinstance(func, cst.Attribute) else None
            assignments = (
                facts.assignments_to(receiver.value) if isinstance(receiver, cst.Name) else ()
            )
            uses = _options_uses(facts, assignments[0]) if len(assignments) == 1 else None
            if uses is None or uses[2] is None:
                problem = problem or (
                    f"`{name}` is also merged into `{excerpt(func)}`, which is not only the "
                    "options of DataLoaders"
                )
                continue
            loaders.extend(c for c in uses[0] if c not in loaders)
        memo[name] = (tuple(loaders), problem)
    return memo[name]


def _only_merged_dict(facts: "ScriptFacts", node: cst.BaseExpression):
    """The dict literal `node` is, or the one a name is bound to when it is only ever merged
    into others (`options.update(cuda_kwargs)`); None otherwise."""
    if not isinstance(node, cst.Name):
        return node
    assignments = facts.assignments_to(node.value)
    if len(assignments) != 1 or assignments[0].unpacked or assignments[0].augmented:
        return None
    merges = len(_merges_of(facts).get(node.value, ()))
    return assignments[0].value if name_mentions(facts).get(node.value) == merges + 1 else None


def _merges_of(facts: "ScriptFacts") -> Dict[str, List[cst.Call]]:
    """The `x.update(name)` calls of the file, by `name`: read once per pass."""
    memo = facts.memo("merges_of")
    if "by_name" not in memo:
        by_name: Dict[str, List[cst.Call]] = {}
        for update in facts.method_calls("update"):
            args = update.node.args
            if len(args) == 1 and isinstance(args[0].value, cst.Name) and not args[0].star:
                by_name.setdefault(args[0].value.value, []).append(update.node)
        memo["by_name"] = by_name
    return memo["by_name"]


def _entries(
    facts: "ScriptFacts", node: cst.BaseExpression
) -> Optional[Dict[str, cst.BaseExpression]]:
    entries: Dict[str, cst.BaseExpression] = {}
    if isinstance(node, cst.Call):
        if not is_name(node.func, "dict") or facts.imports.is_bound("dict"):
            return None
        for arg in node.args:
            if arg.keyword is None or arg.star:
                return None
            entries[arg.keyword.value] = arg.value
        return entries
    if isinstance(node, cst.Dict):
        for element in node.elements:
            if not isinstance(element, cst.DictElement):
                return None
            key = literal(element.key, None)
            if not isinstance(key, str) or key in entries:
                return None
            entries[key] = element.value
        return entries
    return None


def _dict_uses(facts: "ScriptFacts", scope: cst.CSTNode, name: str, assignment):
    """The DataLoader calls that get `**name`, and why other uses make the dict untrusted."""
    loaders = []
    allowed: Set[int] = set()
    target = assignment.statement_node
    for small in find_all(target, cst.AssignTarget, cst.AnnAssign):
        allowed.update(id(n) for n in find_all(small.target, cst.Name) if n.value == name)
    for loader in facts.dataloader_constructions():
        for arg in loader.node.args:
            if arg.star == "**" and is_name(arg.value, name):
                loaders.append(loader.node)
                allowed.add(id(arg.value))
    stored: Set[int] = set()
    for node in find_all(scope, cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.Del):
        stored.update(id(n) for n in find_all(node.target, cst.Subscript))
    changes = []
    for node in find_all(scope, cst.Subscript, cst.Attribute):
        if not is_name(node.value, name):
            continue
        if isinstance(node, cst.Subscript) and id(node) not in stored:
            allowed.add(id(node.value))
        elif isinstance(node, cst.Subscript) or node.attr.value in DICT_MUTATORS:
            changes.append(node)
    problem = (
        f"`{name}` is changed after it is built, by `{excerpt(changes[-1])}`" if changes else None
    )
    # Changed only by `name.update(...)` calls: option_values can still read every value.
    updates = None
    if all(isinstance(n, cst.Attribute) and n.attr.value == "update" for n in changes):
        allowed.update(id(n.value) for n in changes)
        calls = {id(c.node.func): c.node for c in facts.method_calls("update")}
        updates = tuple(calls[id(n)] for n in changes if id(n) in calls)
        updates = updates if len(updates) == len(changes) else None
    for node in find_all(scope, cst.Name):
        if node.value == name and id(node) not in allowed:
            problem = (
                problem or f"`{name}` is also used otherwise than as `**{name}` of a DataLoader"
            )
            updates = None
            break
    return tuple(loaders), problem, updates


def option_value(facts: "ScriptFacts", call: cst.Call, name: str) -> Optional[cst.BaseExpression]:
    """The value of DataLoader option `name`: from the call, or from its `**options` dict."""
    arg = option(call, name)
    if arg is not None:
        return arg.value
    found = options_dict(facts, call)
    if found is not None and found.problem is None:
        return found.entries.get(name)
    return None


def options_unknown(facts: "ScriptFacts", call: cst.Call) -> bool:
    """Options arrive through `*args`/`**kwargs` the file does not show in full."""
    if not options_hidden(call):
        return False
    found = options_dict(facts, call)
    return found is None or found.problem is not None


def hidden_options_reason(facts: "ScriptFacts", call: cst.Call) -> str:
    """Why the options a loader gets through `*`/`**` cannot be read, in words."""
    found = options_dict(facts, call)
    if found is not None and found.problem is not None:
        return _unread_update(facts, call) or found.problem
    return "its options arrive through */** arguments the analysis cannot read"


def _unread_update(facts: "ScriptFacts", call: cst.Call) -> Optional[str]:
    """Why a dict changed only by `.update(...)` calls still cannot be read for `call`."""
    assignment = _options_assignment(facts, call)
    updates = _options_uses(facts, assignment)[2] if assignment is not None else None
    site = facts.call_site_of.get(call)
    for update in updates or ():
        update_site = facts.call_site_of.get(update)
        if site is None or update_site is None or update_site.site.order > site.site.order:
            return f"`{excerpt(update)}` comes after the loader is built"
        if _merged_source(facts, update, assignment.target, ()) is None:
            return (
                f"`{excerpt(update)}` merges a dict the analysis cannot read (not a dict "
                "literal, or also changed or used otherwise)"
            )
    return None


def by_options_dict(
    facts: "ScriptFacts", calls: List[cst.Call]
) -> Tuple[List[cst.Call], List[Tuple[OptionsDict, List[cst.Call]]]]:
    """The loaders a rule fixes, split into those whose options are all in the call and, per
    `**options` dict, those built from it (the dict is edited when they are all its loaders)."""
    plain: List[cst.Call] = []
    groups: Dict[int, Tuple[OptionsDict, List[cst.Call]]] = {}
    for call in calls:
        found = options_dict(facts, call) if options_hidden(call) else None
        if found is None:
            plain.append(call)
        else:
            groups.setdefault(id(found.node), (found, []))[1].append(call)
    return plain, list(groups.values())


def fixes_every_loader(found: OptionsDict, calls: List[cst.Call]) -> bool:
    """`calls` are all the loaders built from the dict: an option added to it changes only them."""
    return {id(c) for c in calls} == {id(c) for c in found.loaders}

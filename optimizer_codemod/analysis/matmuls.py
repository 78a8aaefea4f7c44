"""Whether a script's training multiplies float32 matrices through cuBLAS at all.

`torch.set_float32_matmul_precision("high")` changes the precision of cuBLAS matmuls (and of
oneDNN's on x86 CPUs with AMX-FP16) only. cuDNN convolutions already run float32 on TF32
tensor cores by default: torch 2.13 reports `torch.backends.cudnn.conv.fp32_precision ==
"tf32"` before and after the call, and the convolution descriptor asks cuDNN for FMA math only
when TF32 is off (`ConvolutionDescriptor::set` in aten/src/ATen/cudnn/Descriptors.h). A script
whose every model is built of convolutions, normalisation, pooling and element-wise layers,
and which multiplies no matrices itself, gains nothing from the setting.

Every answer is conservative: a layer or call the analysis does not know (a library's model,
a class of another module it cannot see, a recurrent layer, `F.affine_grid`) counts as a
matmul.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Optional, Set

import libcst as cst

from optimizer_codemod.analysis.imports import dotted_name, runs_on_the_host
from optimizer_codemod.analysis.loaders import dataset_classes
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.precision import CUDNN_ENABLED, is_convolution
from optimizer_codemod.analysis.training import (
    each_trained_model,
    every_optimizer_model_known,
    model_layer_names,
)
from optimizer_codemod.analysis.values import imported_dataset, imported_module_class

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

# Methods that multiply matrices whatever their receiver (`x.bmm(y)`, `w.t().mm(v)`).
MATMUL_METHODS = frozenset(
    {
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "addmm_",
        "baddbmm",
        "baddbmm_",
        "addbmm",
        "mv",
        "addmv",
        "einsum",
        "tensordot",
        "inner",
        "__matmul__",
    }
)
# Functions of torch that multiply matrices, or run cuBLAS or cuSOLVER through them
# (`affine_grid` is a batched matmul; `spectral_norm`'s power iteration multiplies).
_MATMUL_FUNCTIONS = frozenset(
    {
        *(f"torch.{name}" for name in MATMUL_METHODS if not name.startswith("_")),
        "operator.matmul",  # `@` in a class of another module (project._class_layers)
        "torch.chain_matmul",
        "torch.cdist",
        "torch.pinverse",
        "torch.inverse",
        "torch.svd",
        "torch.cholesky",
        "torch.lstsq",
        "torch.nn.functional.linear",
        "torch.nn.functional.bilinear",
        "torch.nn.functional.scaled_dot_product_attention",
        "torch.nn.functional.multi_head_attention_forward",
        "torch.nn.functional.affine_grid",
        "torch.nn.utils.spectral_norm",
    }
)
_MATMUL_PREFIXES = ("torch.linalg.", "torch.nn.utils.parametrizations.", "torch.func.")
# torch.nn classes that run no matmul: convolutions (cuDNN), normalisation, pooling, padding,
# resampling, containers, dropout, embeddings (a gather), element-wise activations, losses.
_MATMUL_FREE_LAYERS = (
    "Conv",
    "LazyConv",
    "BatchNorm",
    "LazyBatchNorm",
    "SyncBatchNorm",
    "InstanceNorm",
    "LazyInstanceNorm",
    "GroupNorm",
    "LayerNorm",
    "RMSNorm",
    "LocalResponseNorm",
    "MaxPool",
    "AvgPool",
    "AdaptiveMaxPool",
    "AdaptiveAvgPool",
    "LPPool",
    "FractionalMaxPool",
    "MaxUnpool",
    "Dropout",
    "AlphaDropout",
    "FeatureAlphaDropout",
    "ReflectionPad",
    "ReplicationPad",
    "ZeroPad",
    "ConstantPad",
    "CircularPad",
    "Upsampl",
    "PixelShuffle",
    "PixelUnshuffle",
    "ChannelShuffle",
    "Flatten",
    "Unflatten",
    "Identity",
    "Sequential",
    "Module",
    "Parameter",
    "Embedding",
    "Fold",
    "Unfold",
    "ReLU",
    "RReLU",
    "LeakyReLU",
    "PReLU",
    "ELU",
    "SELU",
    "CELU",
    "GELU",
    "SiLU",
    "Mish",
    "Tanh",
    "Sigmoid",
    "LogSigmoid",
    "Hardtanh",
    "Hardswish",
    "Hardsigmoid",
    "Hardshrink",
    "Softshrink",
    "Softplus",
    "Softsign",
    "Softmax",
    "Softmin",
    "LogSoftmax",
    "Threshold",
    "GLU",
    "init.",
    "parallel.",  # replicas and gradient all-reduce of DataParallel and DDP
    "DataParallel",
    "functional.",
    "utils.",
    "modules.",
)


def may_multiply_matrices(qualname: str) -> bool:
    """A call (by qualified name; "" for a method of a value or a builtin) that may run a
    float32 matmul: torch's matmul functions, a torch.nn class that is not known to run none
    (`nn.Linear`, `nn.LSTM`, `nn.MultiheadAttention`), or anything from outside torch but
    Python's standard library and host libraries (imports.runs_on_the_host)."""
    if not qualname:
        return False
    if qualname in _MATMUL_FUNCTIONS or qualname.startswith(_MATMUL_PREFIXES):
        return True
    if qualname.startswith("torch.nn."):
        layer = qualname[len("torch.nn.") :]
        if layer.startswith("modules."):
            layer = layer.rsplit(".", 1)[-1]
        return not (layer.startswith(_MATMUL_FREE_LAYERS) or layer.endswith("Loss"))
    return not (qualname.startswith("torch.") or runs_on_the_host(qualname))


def convolution_only_training(facts: "ScriptFacts") -> Optional[str]:
    """The first convolution (shown, `` `torch.nn.Conv2d` ``) when every model this file
    trains is built of layers that run no matmul and one at least convolves, the file itself
    multiplies no matrices (`@`, `torch.mm`, `x.bmm(y)`, an `nn.Linear` anywhere), builds no
    torch.nn class not known to run none, and leaves cuDNN on (`cudnn.enabled = False` sends
    convolutions to im2col and cuBLAS); None otherwise."""
    models = each_trained_model(facts)
    if not (models and every_optimizer_model_known(facts)):
        return None
    if facts.uses(CUDNN_ENABLED) or _multiplies_matrices(facts):
        return None
    convolution = None
    for model in models:
        layers = model_layer_names(facts, model)
        if layers is None or any(may_multiply_matrices(q) for q in layers if q):
            return None
        convolution = convolution or next((q for q in layers if is_convolution(q)), None)
    return f"`{convolution}`" if convolution else None


def bare_tensor_training(facts: "ScriptFacts") -> bool:
    """The file trains tensors it makes itself, with element-wise arithmetic only (PyTorch's
    polynomial tutorials: `y_pred = a + b * x + c * x ** 2 + d * x ** 3` on four scalars): no
    model is trained, the file multiplies no matrices, and every call it makes is known, so
    no model hides behind a name (`model = torch.load(path)`, then `model(x)` or
    `model.forward(x)`)."""
    if each_trained_model(facts) or _multiplies_matrices(facts):
        return False
    own = set(facts.records.functions) | set(facts.classes)
    for call in facts.records.calls:
        func = call.node.func
        qualname = call.qualname or ""
        if qualname.startswith(_LOADED_MODELS) or call.method in ("forward", "parameters"):
            return False
        if isinstance(func, cst.Name) and not (
            qualname or func.value in own or func.value in _BUILTINS
        ):
            return False
    return True


# Calls that return a model the file does not build.
_LOADED_MODELS = ("torch.load", "torch.hub.", "torch.jit.", "torch.export.", "torch.package.")
_BUILTINS = frozenset(dir(builtins))


def _multiplies_matrices(facts: "ScriptFacts") -> bool:
    """Any matmul written in the file, or any call the analysis cannot read for one: `@`, a
    matmul method or function, a torch.nn class not known to run none, a class of another
    module of the run built with one, any other call outside torch, Python's standard library
    and libraries that never touch the GPU (neural_style's `utils.gram_matrix(y)` runs
    `bmm`; a torchvision VGG for a perceptual loss ends in `nn.Linear`)."""
    project = getattr(facts, "project", None)
    datasets = _host_dataset_classes(facts)
    for call in facts.records.calls:
        if call.site.class_name in datasets:
            continue
        qualname = call.qualname or ""
        if call.method in MATMUL_METHODS or may_multiply_matrices(qualname):
            if not qualname or qualname.startswith(("torch.", "operator.")):
                return True
            if call.method in MATMUL_METHODS and runs_on_the_host(qualname):
                continue  # `np.einsum`, `np.matmul`
            dataset = imported_dataset(facts, dotted_name(call.node.func))
            if dataset is not None and not dataset.places_on_accelerator:
                continue  # a dataset of another module of the run: host code, as below
            imported = (
                project.imported_class(dotted_name(call.node.func) or "")
                if imported_module_class(facts, call.node.func)
                else None
            )
            if imported is None or any(may_multiply_matrices(q) for q in imported.possible_layers):
                return True
    return any(
        writes_matmul_operator(statement)
        for statement in facts.module.body
        if not (isinstance(statement, cst.ClassDef) and statement.name.value in datasets)
    )


def _host_dataset_classes(facts: "ScriptFacts") -> Set[str]:
    """Classes of this file that a DataLoader's dataset is built from, or that derive from
    torch's Dataset, and never move a tensor (no `.to(...)`, `.cuda()`): their code runs on
    the host, in the loader's workers or before the batch is copied (Wav2Lip's `Dataset`
    computes mel spectrograms with its `audio` module)."""
    named = {
        name
        for site in facts.dataloader_constructions()
        for name in dataset_classes(facts, site)
        if name in facts.classes
    }
    named |= {
        name
        for name, info in facts.classes.items()
        if any((base or "").startswith("torch.utils.data.") for base in info.bases)
    }
    moving = {
        call.site.class_name
        for call in facts.records.calls
        if call.method in ("to", "cuda") or call.qualname in ("torch.device",)
    }
    return named - moving


def writes_matmul_operator(tree: cst.CSTNode) -> bool:
    """`a @ b` or `a @= b` anywhere in `tree`."""
    return any(
        isinstance(getattr(node, "operator", None), (cst.MatrixMultiply, cst.MatrixMultiplyAssign))
        for node in find_all(tree, cst.BinaryOperation, cst.AugAssign)
    )

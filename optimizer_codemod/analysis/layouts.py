"""Which tensors are laid out contiguously whatever the model's memory format.

A channels_last model keeps its feature maps channels_last, and `.view` of one that merges
channels with pixels raises. Some values a model views are never feature maps in that layout:
the output of an `nn.Linear` (a matmul writes a new contiguous tensor, also from a 4-D
channels_last input), of `nn.Flatten`/`torch.flatten`/`.reshape` (a copy where no view
fits), or of `.contiguous()`. Checked with torch 2.13.0+cpu in
tests/test_channels_last_views.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Optional

import libcst as cst

from optimizer_codemod.analysis.calls import argument, callee_name, keyword
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.collect import CallSite
    from optimizer_codemod.analysis.script import ScriptFacts

# Layers whose output is a new contiguous tensor.
_CONTIGUOUS_LAYERS = frozenset(
    {"torch.nn.Linear", "torch.nn.LazyLinear", "torch.nn.Bilinear", "torch.nn.Flatten"}
)
_CONTIGUOUS_FUNCTIONS = frozenset(
    {"torch.flatten", "torch.reshape", "torch.nn.functional.linear", "torch.matmul"}
)
# Methods of a tensor whose result is contiguous (`contiguous()` without a memory format).
_CONTIGUOUS_METHODS = frozenset({"contiguous", "reshape", "flatten"})
# Element-wise layers after a Linear in an `nn.Sequential` keep its layout.
_ELEMENTWISE_LAYERS = frozenset(
    f"torch.nn.{name}"
    for name in (
        "ReLU",
        "LeakyReLU",
        "PReLU",
        "ELU",
        "SELU",
        "GELU",
        "SiLU",
        "Tanh",
        "Sigmoid",
        "Softmax",
        "LogSoftmax",
        "Dropout",
        "Identity",
    )
)


def viewed_in_standard_layout(facts: "ScriptFacts", view: "CallSite") -> bool:
    """The tensor `view` (a `.view(...)` call) reads is contiguous in the standard layout
    whatever the model's memory format: the result of a Linear or Flatten layer of the
    class, `torch.flatten`, `.reshape`, `.contiguous()`, written in place of the receiver
    or assigned to it by the last statement of the same function before the view."""
    func = view.node.func
    if not isinstance(func, cst.Attribute):
        return False
    receiver = func.value
    if isinstance(receiver, cst.Name):
        value = _last_value_before(facts, receiver.value, view)
        return value is not None and _contiguous_value(facts, value, view.site.class_name)
    return _contiguous_value(facts, receiver, view.site.class_name)


def _last_value_before(
    facts: "ScriptFacts", name: str, view: "CallSite"
) -> Optional[cst.BaseExpression]:
    """The value the last assignment to `name` before `view` binds, when both are statements
    of the body of one function (straight-line code, as a `forward` is written); else None."""
    function = view.site.function
    body = getattr(getattr(function, "body", None), "body", ())
    if not any(statement is view.site.statement for statement in body):
        return None
    before = [
        a
        for a in facts.assignments_to(name)
        if a.site.function is function
        and a.site.order < view.site.order
        and a.site.statement is not view.site.statement
    ]
    if not before or before[-1].unpacked:
        return None
    if not any(statement is before[-1].site.statement for statement in body):
        return None
    return before[-1].value


def _contiguous_value(
    facts: "ScriptFacts", value: cst.BaseExpression, class_name: Optional[str]
) -> bool:
    if not isinstance(value, cst.Call):
        return False
    qualname = facts.qualified_name(value.func) or ""
    if qualname in _CONTIGUOUS_FUNCTIONS:
        return True
    method = callee_name(value)
    if method in _CONTIGUOUS_METHODS and qualname == "":
        return method != "contiguous" or keyword(value, "memory_format") is None
    layer = dotted_name(value.func) or ""
    return (
        layer.startswith("self.")
        and class_name is not None
        and _contiguous_layer(facts, layer, class_name)
    )


def _contiguous_layer(facts: "ScriptFacts", attribute: str, class_name: str) -> bool:
    """`self.fc` is built, in every assignment of the class, as a Linear or Flatten layer,
    or an `nn.Sequential` whose last layer that is not element-wise is one."""
    built = [a for a in facts.assignments_to(attribute) if a.site.class_name == class_name]
    return bool(built) and all(_contiguous_build(facts, a.value) for a in built)


def _contiguous_build(facts: "ScriptFacts", value: cst.BaseExpression) -> bool:
    if not isinstance(value, cst.Call):
        return False
    qualname = facts.qualified_name(value.func) or ""
    if qualname in _CONTIGUOUS_LAYERS:
        return True
    if qualname != "torch.nn.Sequential" or any(a.star or a.keyword for a in value.args):
        return False
    for layer_argument in reversed(value.args):
        inner = layer_argument.value
        name = facts.qualified_name(inner.func) if isinstance(inner, cst.Call) else None
        if name not in _ELEMENTWISE_LAYERS:
            return _contiguous_build(facts, inner)
    return False


# Layers and functions that return NCHW tensors whatever their input's layout: ATen's
# `instance_norm` normalises `input.contiguous()` (aten/src/ATen/native/Normalization.cpp),
# so a channels_last feature map comes out NCHW (checked with torch 2.13.0+cpu).
NCHW_RESULTS = frozenset(
    {
        *(f"torch.nn.{kind}InstanceNorm2d" for kind in ("", "Lazy")),
        *(f"torch.nn.modules.instancenorm.{kind}InstanceNorm2d" for kind in ("", "Lazy")),
        "torch.nn.functional.instance_norm",
    }
)


def nchw_layer_mentioned(facts: "ScriptFacts", code: Iterable[cst.CSTNode]) -> Optional[str]:
    """The first name in `code` (a model's classes and helper functions) that refers to a
    layer returning NCHW tensors, called or handed over (`norm_layer=nn.InstanceNorm2d` as a
    default argument, `functools.partial(nn.InstanceNorm2d, affine=False)`), as written;
    None when none."""
    for tree in code:
        for node in find_all(tree, cst.Attribute, cst.Name):
            if facts.qualified_name(node) in NCHW_RESULTS:
                return dotted_name(node)
    return None


# `layer_norm` normalises a contiguous copy too: a channels_last map comes out NCHW whatever
# its normalized_shape (torch 2.13.0+cpu). It normalises feature maps where that shape lists
# two or more sizes (`nn.LayerNorm([C, H, W])`, cleanrl's pqn_atari_envpool.py); one size is
# also a ConvNeXt block's channels after a permute to NHWC, whose result is channels_last
# again once permuted back, so it does not count.
_LAYER_NORMS = {"torch.nn.LayerNorm": 0, "torch.nn.functional.layer_norm": 1}


def normalises_feature_maps(call: "CallSite") -> bool:
    """`call` is a layer norm over two or more trailing sizes, written as a list or tuple."""
    position = _LAYER_NORMS.get(call.qualname or "")
    if position is None:
        return False
    shape = argument(call.node, "normalized_shape", position)
    return (
        shape is not None
        and isinstance(shape.value, (cst.List, cst.Tuple))
        and len(shape.value.elements) >= 2
    )

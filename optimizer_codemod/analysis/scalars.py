"""Whether an expression is provably a plain Python number, never a tensor.

Some APIs take only Python numbers (`F.scaled_dot_product_attention(..., scale=)` raises
`TypeError: scale must be float` for a tensor or an `nn.Parameter`). A value counts as a number
when it is built from number literals, `math` functions, `float()`/`int()`/`len()`,
`.item()`, `x.size(i)`/`x.shape[i]`/`.numel()`/`.dim()`, arithmetic and conditionals of
numbers, and names whose every binding (in the function, or for `self.x` in the class) is a
number. A parameter counts when it is annotated `int`/`float`, has a number as default, or
is a constructor's (`__init__(self, width, heads)`: hyper-parameters). Anything else (a
tensor, a Parameter, a buffer, an attribute never assigned in this file, an unannotated
parameter of another function) is not provably a number.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst

from optimizer_codemod.analysis.calls import literal, method_name
from optimizer_codemod.analysis.escapes import HOST_METHODS
from optimizer_codemod.analysis.imports import dotted_name

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.collect import Assignment
    from optimizer_codemod.analysis.script import ScriptFacts

MAX_DEPTH = 6
NUMBER_BUILTINS = frozenset({"float", "int", "len"})
# Host methods that return a number (not `tolist`, and `size` only with an axis).
NUMBER_METHODS = HOST_METHODS - {"tolist"}
NUMBER_ANNOTATIONS = frozenset({"int", "float"})


def is_python_number(
    facts: "ScriptFacts",
    node: cst.BaseExpression,
    function: Optional[cst.FunctionDef],
    klass: Optional[cst.ClassDef],
    depth: int = 0,
) -> bool:
    """`node`, read in `function` (a method of `klass` or None), is a Python number."""
    if depth > MAX_DEPTH:
        return False
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    if isinstance(node, cst.UnaryOperation):
        return not isinstance(node.operator, cst.Not) and is_python_number(
            facts, node.expression, function, klass, depth + 1
        )
    if isinstance(node, (cst.BinaryOperation, cst.BooleanOperation)):
        if isinstance(node.operator, cst.MatrixMultiply):
            return False
        return all(
            is_python_number(facts, side, function, klass, depth + 1)
            for side in (node.left, node.right)
        )
    if isinstance(node, cst.IfExp):
        return all(
            is_python_number(facts, side, function, klass, depth + 1)
            for side in (node.body, node.orelse)
        )
    if isinstance(node, cst.Call):
        return _number_call(facts, node)
    if isinstance(node, cst.Subscript):
        return _is_shape(node.value)
    name = dotted_name(node)
    if name is None:
        return False
    if "." not in name and function is not None:
        parameter = _parameter(function, name)
        if parameter is not None:
            return _number_parameter(parameter, function)
        bindings = facts.assignments_in_scope(name, function)
    elif "." not in name:
        bindings = facts.assignments_in_scope(name, None)
    elif name.count(".") == 1 and name.startswith("self.") and klass is not None:
        bindings = [a for a in facts.assignments_to(name) if a.site.class_name == klass.name.value]
    else:
        return False
    return bool(bindings) and all(_number_binding(facts, a, klass, depth) for a in bindings)


def _number_call(facts: "ScriptFacts", node: cst.Call) -> bool:
    qualified = facts.qualified_name(node.func) or ""
    if qualified.startswith("math."):
        return True
    if isinstance(node.func, cst.Name) and node.func.value in NUMBER_BUILTINS:
        return not facts.imports.is_bound(node.func.value)
    method = method_name(node)
    if method == "size":
        return bool(node.args)
    return method in NUMBER_METHODS


def _is_shape(node: cst.BaseExpression) -> bool:
    """`x.shape` or `x.size()`: indexing it gives an int."""
    if isinstance(node, cst.Attribute):
        return node.attr.value == "shape"
    return isinstance(node, cst.Call) and method_name(node) == "size" and not node.args


def _number_binding(facts: "ScriptFacts", assignment: "Assignment", klass, depth: int) -> bool:
    if assignment.unpacked:
        return _is_shape(assignment.value)  # `B, T, C = x.size()`
    return is_python_number(facts, assignment.value, assignment.site.function, klass, depth + 1)


def _parameter(function: cst.FunctionDef, name: str) -> Optional[cst.Param]:
    params = function.params
    for param in (*params.posonly_params, *params.params, *params.kwonly_params):
        if param.name.value == name:
            return param
    return None


def _number_parameter(parameter: cst.Param, function: cst.FunctionDef) -> bool:
    annotation = parameter.annotation
    if annotation is not None:
        return dotted_name(annotation.annotation) in NUMBER_ANNOTATIONS
    if parameter.default is not None:
        value = literal(parameter.default, "")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if value is not None:
            return False
    return function.name.value == "__init__"

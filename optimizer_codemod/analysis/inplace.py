"""Whether one use of a tensor value may write it in place, alias it or keep it.

A tensor shared across loop iterations (hoisted out of a loop) must never be written: each
use of it is checked from the expression that produces it outwards. Harmless uses consume the
value: an operand of arithmetic or a comparison, an argument of a call that neither writes its
arguments (`out=`, `inplace=True`, a function whose name ends in `_`) nor keeps them (a
container's `append`), or the receiver of a method that returns a new tensor, or of one that is not in-place and
whose result is not bound to a name (it could be a view). Anything else counts as unsafe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional

import libcst as cst

from optimizer_codemod.analysis.calls import code_of, keyword, literal, method_name
from optimizer_codemod.analysis.nodes import find_all

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

# Methods of containers and objects that keep what they are given.
KEEPING_METHODS = frozenset(
    {"append", "extend", "insert", "add", "update", "setdefault", "put", "push", "register_buffer"}
)


# Tensor methods that always return a new tensor (never the receiver, never a view of it).
FRESH_METHODS = frozenset(
    "tril triu clone sum mean std var max min amax amin exp log sqrt rsqrt abs neg pow add "
    "sub mul div matmul mm bmm softmax log_softmax sigmoid tanh relu cumsum argmax argmin "
    "masked_fill eq ne lt gt le ge logical_not logical_and logical_or outer".split()
)


def is_inplace_name(name: Optional[str]) -> bool:
    """`add_`, `masked_fill_`, `zero_`: PyTorch's naming of in-place operations."""
    return bool(name) and name.endswith("_") and not name.endswith("__")


def unsafe_use(
    facts: "ScriptFacts", node: cst.CSTNode, parents: Dict[cst.CSTNode, cst.CSTNode]
) -> Optional[str]:
    """Why this use of the tensor `node` may write, alias or keep it; None when it cannot."""
    parent = parents.get(node)
    if isinstance(parent, (cst.BinaryOperation, cst.Comparison, cst.ComparisonTarget)):
        return None
    if isinstance(parent, cst.UnaryOperation):
        return None
    if isinstance(parent, cst.Arg):
        call = parents.get(parent)
        if not isinstance(call, cst.Call):
            return "it is used in an unusual position"
        if parent.keyword is not None and parent.keyword.value == "out":
            return f"`{_short(call)}` writes into it"
        inplace = keyword(call, "inplace")
        if inplace is not None and literal(inplace.value, True) is not False:
            return f"`{_short(call)}` works in place"
        method = method_name(call)
        callee = method or (call.func.value if isinstance(call.func, cst.Name) else None)
        if method is None and is_inplace_name(_last_name(call.func)):
            return f"`{_short(call)}` writes into its argument"
        if method in KEEPING_METHODS:
            return f"`{_short(call)}` keeps it"
        if callee in facts.records.functions and _writes_something(facts.records.functions[callee]):
            return f"`{callee}` may write into its arguments"
        return None
    if isinstance(parent, cst.Attribute) and parent.value is node:
        call = parents.get(parent)
        if isinstance(call, cst.Call) and call.func is parent:
            if is_inplace_name(parent.attr.value):
                return f"`{_short(call)}` writes into it"
            holder = parents.get(call)
            if parent.attr.value in FRESH_METHODS:
                return None
            if isinstance(holder, (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.NamedExpr)):
                return f"`{_short(holder)}` may keep a view of it"
            return None
        if parent.attr.value in ("shape", "dtype", "device", "ndim"):
            return None
        return f"`{_short(parent)}` is used"
    if isinstance(parent, cst.Subscript) and parent.value is node:
        holder = parents.get(parent)
        if isinstance(holder, (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.AssignTarget)):
            return f"`{_short(holder)}` may write or keep a part of it"
        if isinstance(holder, cst.Call) and holder.func is parent:
            return "it is called"
        return None
    return f"`{_short(parent or node)}` may write or keep it"


def _last_name(func: cst.BaseExpression) -> Optional[str]:
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def _writes_something(function: cst.FunctionDef) -> bool:
    """The function writes something in place (a `_` method, `+=`, an item or attribute)."""
    for call in find_all(function, cst.Call):
        if is_inplace_name(_last_name(call.func)):
            return True
    if find_all(function, cst.AugAssign):
        return True
    return any(
        find_all(target.target, cst.Subscript, cst.Attribute)
        for target in find_all(function, cst.AssignTarget)
    )


def _short(node: cst.CSTNode, limit: int = 50) -> str:
    text = code_of(node).strip().splitlines()[0] if code_of(node).strip() else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Operators whose result is a new tensor that their backward does not read (it reads the
# operands): writing the result in place leaves their gradients intact.
_UNSAVED_OPERATORS = (cst.MatrixMultiply, cst.Multiply, cst.Divide, cst.Add, cst.Subtract)
UNSAVED_FUNCTIONS = frozenset({"torch.matmul", "torch.mm", "torch.bmm", "torch.einsum"})
UNSAVED_METHODS = frozenset({"matmul", "mm", "bmm"})


def is_fresh_unsaved(facts: "ScriptFacts", node: cst.BaseExpression) -> bool:
    """`node` computes a new tensor (never a view, a leaf or an existing name) that autograd
    does not keep for backward: `q @ k.T`, `a * scale`, `torch.matmul(a, b)`."""
    if isinstance(node, cst.BinaryOperation):
        return isinstance(node.operator, _UNSAVED_OPERATORS)
    if isinstance(node, cst.Call):
        if facts.qualified_name(node.func) in UNSAVED_FUNCTIONS:
            return True
        return method_name(node) in UNSAVED_METHODS and facts.qualified_name(node.func) is None
    return False

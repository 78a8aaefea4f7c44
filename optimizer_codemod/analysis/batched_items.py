"""A dataset class's `__getitem__` written for a whole batch of indices at once.

OPT104 makes a DataLoader pass each batch's list of indices to `ds[indices]` in one call
(`batch_size=None`, a `BatchSampler` as sampler). A `TensorDataset` already answers a list;
a dataset class of the script answers it when its `__getitem__` gets a branch for lists that
computes, for every index at once, exactly what `default_collate` would have stacked from the
items. This module derives that branch, or says why it cannot.

The derivation is an exact, small algebra over the statements of `__getitem__`: every value
is a per-item tensor whose batched form has one more, leading, dimension. What is allowed:

- `self.A[i]`, `A` a tensor attribute: `self.A[indices]` (one gather, the rows stacked);
- `self.A[i + a : i + b]`: `self.A[starts + torch.arange(a, b)]`, with
  `starts = torch.tensor(indices)[:, None]` first in the branch,
  when `__len__` (`len(self.A) - X`) proves the window never runs past the end of `A`, where
  a slice would silently come out shorter;
- `x[s, ...]` of such a value, slices and integers: `x[:, s, ...]`;
- `x op c` and `c op x` with `c` a number, `-x`: elementwise, the same arithmetic per element;
- dtype conversions and copies (`.float()`, `.long()`, `.clone()`...): the same per element;
- `x.flatten()`, `x.view(-1)`, `x.reshape(-1)`: `x.reshape(len(indices), -1)`.

Two per-item tensors are never combined (their broadcast, with a batch dimension added to
each, is another one), and nothing transcendental is computed (a vectorised kernel may round
differently at another offset). A returned value that may be a strided view gets
`.contiguous()`: `default_collate` stacks into a new contiguous tensor, and the training code
may `.view()` it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Union

import libcst as cst

from optimizer_codemod.analysis.calls import (
    code_of,
    excerpt,
    has_double_star,
    has_star_args,
    literal,
)
from optimizer_codemod.analysis.factories import FACTORIES
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all, is_docstring, is_name
from optimizer_codemod.analysis.values import (
    attribute_assignments,
    calls_named,
    name_mentions,
    outside_calls,
    parameter_names,
    parameter_sources,
    self_attribute_elsewhere,
)

if TYPE_CHECKING:
    from optimizer_codemod.analysis.collect import CallSite
    from optimizer_codemod.analysis.script import ScriptFacts

MAX_DEPTH = 4
DATASET_BASES = frozenset({"torch.utils.data.Dataset", "torch.utils.data.dataset.Dataset"})
TENSOR_FUNCTIONS = frozenset(
    {
        *FACTORIES,
        *(f"torch.{name}" for name in ("as_tensor", "from_numpy", "cat", "stack", "where")),
    }
)
# Methods of a tensor that return a tensor (for "is this attribute a tensor").
TENSOR_METHODS = frozenset(
    "clamp clip float double half bfloat16 long int short bool byte to contiguous view reshape "
    "flatten permute transpose clone detach unsqueeze squeeze cuda cpu pin_memory abs neg "
    "type_as round floor ceil exp log sqrt sigmoid tanh add sub mul div pow".split()
)
# Methods whose result holds, element for element, what they make of each element.
ELEMENTWISE_METHODS = frozenset(
    "float double half bfloat16 long int short bool byte clone abs neg".split()
)
FLATTENING_METHODS = frozenset({"flatten", "view", "reshape"})
# Module names a call of `__getitem__` may name a function of (for the reason it gives).
MODULES = frozenset({"torch", "np", "numpy", "random", "F"})
ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo)
BATCH_COMMENT = "# a batch of indices, from the BatchSampler"


@dataclass(frozen=True)
class BatchedItems:
    """The `__getitem__` of a dataset class, and what replaces it: the same function with a
    first branch for a list of indices."""

    class_name: str
    getitem: cst.FunctionDef
    replacement: cst.FunctionDef


class _NotBatchable(Exception):
    """Why `__getitem__` has no batched form derived here (its text is the reason)."""


@dataclass
class _Item:
    """A per-item value in its batched form; `strided` when it may be a non-contiguous view."""

    batched: cst.BaseExpression
    strided: bool = False


def batched_items(facts: "ScriptFacts", class_name: str) -> Union[BatchedItems, str]:
    """The batched `__getitem__` of `class_name`, a dataset class of this file, or why there
    is none."""
    memo = facts.memo("batched_items")
    if class_name not in memo:
        try:
            memo[class_name] = _Derivation(facts, class_name).run()
        except _NotBatchable as reason:
            memo[class_name] = str(reason)
    return memo[class_name]


def _constructions(facts: "ScriptFacts", class_name: str) -> List["CallSite"]:
    """Every `Class(...)` call in the run, when the class is used only to be built here."""
    calls = calls_named(facts, class_name)
    if outside_calls(facts, class_name):
        raise _NotBatchable("other modules of the run build it too")
    if not calls or name_mentions(facts).get(class_name, 0) != len(calls) + 1:
        raise _NotBatchable(
            "it is used other than by calls that build it (its instances' tensors are unknown)"
        )
    return calls


class _Derivation:
    def __init__(self, facts: "ScriptFacts", class_name: str):
        self.facts = facts
        self.class_name = class_name
        info = facts.classes[class_name]
        self.methods: Dict[str, List[cst.FunctionDef]] = {}
        for statement in info.node.body.body:
            if isinstance(statement, cst.FunctionDef):
                self.methods.setdefault(statement.name.value, []).append(statement)
        for base, written in zip(info.bases, info.node.bases):
            if base not in DATASET_BASES:
                raise _NotBatchable(
                    f"it derives from `{code_of(written.value)}`, not known to be "
                    "`torch.utils.data.Dataset` (a base class may define how items are made)"
                )
        self.constructions = _constructions(facts, class_name)
        self.torch_name = facts.imports.name_for_module("torch")
        self.index = ""
        self.items: Dict[str, _Item] = {}
        self.starts = ""  # the name of the column of indices, once a window needs it

    def run(self) -> BatchedItems:
        getitem = self._method("__getitem__")
        params = getitem.params
        names = parameter_names(getitem)
        if len(names) != 2 or params.params[0].default is not None or len(params.params) != 2:
            raise _NotBatchable("its `__getitem__` takes other parameters than `(self, index)`")
        for builtin in ("isinstance", "list", "len"):
            if self.facts.imports.is_bound(builtin) or self.facts.assignments_to(builtin):
                raise _NotBatchable(f"`{builtin}` names something else in this file")
        self.index = names[1]
        body = list(getitem.body.body) if isinstance(getitem.body, cst.IndentedBlock) else []
        if not body:
            raise _NotBatchable("its `__getitem__` is not a block of statements")
        head = 1 if is_docstring(body[0]) else 0
        batched = [self._statement(s) for s in body[head:]]
        if not batched or not batched[-1].startswith("return "):
            raise _NotBatchable("its `__getitem__` does not end with a `return`")
        lines = [f"if isinstance({self.index}, list):  {BATCH_COMMENT}"]
        if self.starts:  # each index as a row, for the windows' positions to be added to
            lines.append(f"    {self.starts} = {self.torch}.tensor({self.index})[:, None]")
        lines += [f"    {line}" for line in batched]
        branch = cst.parse_statement("\n".join(lines) + "\n")
        block = getitem.body
        assert isinstance(block, cst.IndentedBlock)
        replacement = getitem.with_changes(
            body=block.with_changes(body=[*body[:head], branch, *body[head:]])
        )
        return BatchedItems(self.class_name, getitem, replacement)

    def _fresh_name(self, name: str) -> str:
        """`name`, or `name_`..., bound nowhere in `__getitem__` (nor the index)."""
        getitem = self.methods["__getitem__"][0]
        taken = {n.value for n in find_all(getitem, cst.Name)}
        while name in taken:
            name += "_"
        return name

    @property
    def torch(self) -> str:
        """The name `torch` is imported as: only a window needs it."""
        name = self.torch_name
        if name is None or self.facts.assignments_to(name):
            raise _NotBatchable("`torch` is not imported as a module, and the batch needs it")
        return name

    def _method(self, name: str) -> cst.FunctionDef:
        found = self.methods.get(name, [])
        if len(found) != 1 or found[0].decorators:
            raise _NotBatchable(f"it does not define `{name}` once, undecorated")
        return found[0]

    # Statements ------------------------------------------------------------------------
    def _statement(self, statement: cst.BaseStatement) -> str:
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            raise _NotBatchable(
                "its `__getitem__` has a statement other than assignments and a `return`"
            )
        small = statement.body[0]
        if isinstance(small, cst.Return) and small.value is not None:
            return "return " + self._returned(small.value)
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = small.targets[0].target
            if isinstance(target, cst.Name) and target.value not in self.items:
                if target.value == self.index:
                    raise _NotBatchable("its `__getitem__` assigns the index")
                item = self._item(small.value)
                self.items[target.value] = item
                return f"{target.value} = {code_of(item.batched)}"
        raise _NotBatchable(
            f"`{excerpt(statement)}` in its `__getitem__` is not an assignment of one name "
            "that the batch can repeat"
        )

    def _returned(self, value: cst.BaseExpression) -> str:
        parts = value.elements if isinstance(value, cst.Tuple) else None
        if parts and any(isinstance(e, cst.StarredElement) for e in parts):
            raise _NotBatchable("its `__getitem__` returns a starred element")
        items = [self._item(e.value) for e in parts] if parts else [self._item(value)]
        texts = [
            code_of(item.batched) + (".contiguous()" if item.strided else "") for item in items
        ]
        return ", ".join(texts) if parts else texts[0]

    # Expressions -----------------------------------------------------------------------
    def _item(self, node: cst.BaseExpression) -> _Item:
        """`node`, a per-item tensor, in its batched form."""
        if isinstance(node, cst.Name) and node.value in self.items:
            return _Item(node, self.items[node.value].strided)
        if isinstance(node, cst.Subscript):
            return self._subscript(node)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, ARITHMETIC):
            if _is_number(node.right):
                return _Item(node.with_changes(left=self._item(node.left).batched))
            if _is_number(node.left):
                return _Item(node.with_changes(right=self._item(node.right).batched))
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
            return _Item(node.with_changes(expression=self._item(node.expression).batched))
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            method = node.func.attr.value
            inner = node.func.value
            if method in ELEMENTWISE_METHODS and not node.args:
                batched = self._item(inner).batched
                return _Item(node.with_changes(func=node.func.with_changes(value=batched)))
            if method == "detach" and not node.args:
                item = self._item(inner)
                func = node.func.with_changes(value=item.batched)
                return _Item(node.with_changes(func=func), item.strided)
            if method in FLATTENING_METHODS and _flattens_whole(node):
                text = f"{_atom(self._item(inner).batched)}.reshape(len({self.index}), -1)"
                return _Item(cst.parse_expression(text))
        raise _NotBatchable(f"`{excerpt(node)}` in its `__getitem__` {_why_not_batched(node)}")

    def _subscript(self, node: cst.Subscript) -> _Item:
        value = node.value
        if isinstance(value, cst.Name) and value.value in self.items:
            parts = []
            for element in node.slice:
                index = element.slice
                if isinstance(index, cst.Slice) and all(
                    part is None or self._invariant(part)
                    for part in (index.lower, index.upper, index.step)
                ):
                    parts.append(code_of(index))
                elif isinstance(index, cst.Index) and isinstance(index.value, cst.Integer):
                    parts.append(code_of(index.value))
                else:
                    raise _NotBatchable(
                        f"`{excerpt(node)}` in its `__getitem__` indexes an item other than "
                        "by slices and integers"
                    )
            text = f"{value.value}[:, {', '.join(parts)}]"
            return _Item(cst.parse_expression(text), strided=True)
        attribute = _self_attribute(value)
        if attribute is None or len(node.slice) != 1:
            raise _NotBatchable(
                f"`{excerpt(node)}` in its `__getitem__` indexes something other than a "
                "tensor attribute with the index"
            )
        self._require_tensor(attribute)
        index = node.slice[0].slice
        if isinstance(index, cst.Index) and is_name(index.value, self.index):
            return _Item(node)
        if isinstance(index, cst.Slice) and index.step is None:
            start, stop = self._offset(index.lower), self._offset(index.upper)
            self._require_window_inside(attribute, start, stop)
            bounds = code_of(stop)
            if not (isinstance(start, cst.Integer) and start.value == "0"):
                bounds = f"{code_of(start)}, {bounds}"
            self.starts = self.starts or self._fresh_name("starts")
            text = f"self.{attribute}[{self.starts} + {self.torch}.arange({bounds})]"
            return _Item(cst.parse_expression(text))
        raise _NotBatchable(
            f"`{excerpt(node)}` in its `__getitem__` is not `self.X[index]` or a window "
            "`self.X[index + a : index + b]`"
        )

    def _offset(self, node: Optional[cst.BaseExpression]) -> cst.BaseExpression:
        """`a` of a bound `index + a` (0 for the index itself); raises for another bound."""
        if node is None:
            raise _NotBatchable("a window of its `__getitem__` has an open end")
        if is_name(node, self.index):
            return cst.Integer("0")
        rest = _without_leading(node, self.index)
        if rest is None or not self._invariant(rest):
            raise _NotBatchable(
                f"`{excerpt(node)}` in its `__getitem__` is not the index plus a number "
                "or attributes"
            )
        return rest

    def _invariant(self, node: cst.BaseExpression) -> bool:
        """`node` reads no index and no item: numbers, `self` attributes, + and -."""
        if isinstance(node, cst.Integer):
            return True
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
            return self._invariant(node.expression)
        if isinstance(node, cst.BinaryOperation) and isinstance(
            node.operator, (cst.Add, cst.Subtract)
        ):
            return self._invariant(node.left) and self._invariant(node.right)
        return _self_attribute(node) is not None

    # Facts the derivation needs --------------------------------------------------------
    def _require_window_inside(self, attribute: str, start, stop) -> None:
        """Every window `A[i + start : i + stop]` lies inside `A` for `i` in
        `range(len(self))`: `start >= 0` and, with `__len__` returning `len(self.A) - X`,
        `(len(A) - X - 1) + stop <= len(A)`, as sums of the same attributes."""
        length = self._method("__len__")
        returned = _only_return(length)
        sized = f"len(self.{attribute})"
        bound = _linear(returned, sized) if returned is not None else None
        lower = _linear(start, sized)
        upper = _linear(stop, sized)
        outside = f"a window `self.{attribute}[...]` may run past its end: `__len__` does not "
        if bound is None or lower is None or upper is None or bound.get(sized) != 1:
            raise _NotBatchable(outside + f"return `len(self.{attribute}) - ...`")
        if set(lower) - {""} or lower.get("", 0) < 0:
            raise _NotBatchable("a window of its `__getitem__` may start before the index")
        last = _add(_add(bound, upper), {"": -1, sized: -1})
        if set(k for k, v in last.items() if v) - {""} or last.get("", 0) > 0:
            raise _NotBatchable(outside + "leave room for the whole window")

    def _require_tensor(self, attribute: str) -> None:
        target = f"self.{attribute}"
        assignments = attribute_assignments(self.facts, self.class_name, target)
        init = self.methods.get("__init__", [])
        if (
            len(assignments) != 1
            or len(init) != 1
            or assignments[0].site.function is not init[0]
            or assignments[0].unpacked
            or assignments[0].augmented
            or self_attribute_elsewhere(self.facts, target)
        ):
            raise _NotBatchable(f"`{target}` is not assigned once, in `__init__`")
        if not self._is_tensor(assignments[0].value, init[0], 0):
            raise _NotBatchable(f"`{target}` is not known to be a tensor")

    def _is_tensor(self, node: cst.BaseExpression, function, depth: int) -> bool:
        if depth > MAX_DEPTH:
            return False
        if isinstance(node, cst.Call):
            qualname = self.facts.qualified_name(node.func)
            if qualname in TENSOR_FUNCTIONS:
                return True
            func = node.func
            return (
                isinstance(func, cst.Attribute)
                and func.attr.value in TENSOR_METHODS
                and self._is_tensor(func.value, function, depth + 1)
            )
        if isinstance(node, cst.Subscript):
            return self._is_tensor(node.value, function, depth + 1)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, ARITHMETIC):
            sides = (node.left, node.right)
            tensors = [self._is_tensor(side, function, depth + 1) for side in sides]
            return any(tensors) and all(t or _is_number(s) for t, s in zip(tensors, sides))
        name = dotted_name(node)
        if name is None or "." in name:
            return False
        if name in parameter_names(function):
            values = self._arguments(function, name)
            return values is not None and all(
                self._is_tensor(value, scope, depth + 1) for value, scope in values
            )
        assignments = self.facts.assignments_in_scope(name, function)
        return bool(assignments) and all(
            not a.unpacked and not a.augmented and self._is_tensor(a.value, function, depth + 1)
            for a in assignments
        )

    def _arguments(self, function: cst.FunctionDef, name: str):
        """What parameter `name` of `function` receives at every call, with the caller."""
        if not any(function is init for init in self.methods.get("__init__", [])):
            sources = parameter_sources(self.facts, function, name)
            return None if sources is None else [(s.value, s.function) for s in sources]
        params = [p.name.value for p in function.params.params][1:]
        if name not in params:
            return None
        found = []
        for site in self.constructions:
            call = site.node
            if has_star_args(call) or has_double_star(call):
                return None
            given = [a for a in call.args if a.keyword is None]
            keyword = [a for a in call.args if a.keyword is not None and a.keyword.value == name]
            position = params.index(name)
            arg = keyword[0] if keyword else given[position] if position < len(given) else None
            if arg is None:
                return None
            found.append((arg.value, site.site.function))
        return found


# Helpers ---------------------------------------------------------------------------------
def _why_not_batched(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.BinaryOperation):
        return (
            "combines two values that are not both numbers (a batch dimension changes how "
            "two per-item tensors broadcast), or with an operator other than + - * / // %"
        )
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        if isinstance(node.func.value, cst.Name) and node.func.value.value in MODULES:
            name = node.func.attr.value
            if any(word in name for word in ("rand", "normal", "choice", "shuffle", "sample")):
                return (
                    f"calls `{code_of(node.func)}`, a random draw (for a whole batch it "
                    "would draw its numbers in another order)"
                )
            return (
                f"calls `{code_of(node.func)}`: the batch repeats only reads of the dataset's "
                "tensors at the index and arithmetic on them"
            )
        return (
            f"calls `.{node.func.attr.value}()`, which is not a dtype conversion, a copy or a "
            "flattening (others may reshape by item, or round differently in a batch)"
        )
    return "is not a tensor of the item computed from the index"


def _is_number(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float))


def _self_attribute(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, cst.Attribute) and is_name(node.value, "self"):
        return node.attr.value
    return None


def _flattens_whole(call: cst.Call) -> bool:
    """`x.flatten()`, `x.view(-1)` or `x.reshape(-1)`: every element in one dimension."""
    if call.func.attr.value == "flatten":  # type: ignore[attr-defined]
        return not call.args
    return (
        len(call.args) == 1
        and call.args[0].keyword is None
        and not call.args[0].star
        and literal(call.args[0].value, None) == -1
    )


def _atom(node: cst.BaseExpression) -> str:
    text = code_of(node)
    simple = isinstance(node, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) or node.lpar
    return text if simple else f"({text})"


def _without_leading(node: cst.BaseExpression, name: str) -> Optional[cst.BaseExpression]:
    """`a + b` for `name + a + b`: the sum without its leading `name +`."""
    if not isinstance(node, cst.BinaryOperation) or node.lpar:
        return None
    if isinstance(node.operator, cst.Add) and is_name(node.left, name):
        return node.right
    rest = _without_leading(node.left, name)
    if rest is None:
        return None
    return node.with_changes(left=rest)


def _only_return(function: cst.FunctionDef) -> Optional[cst.BaseExpression]:
    body = function.body.body if isinstance(function.body, cst.IndentedBlock) else ()
    statements = [s for s in body if not is_docstring(s)]
    if len(statements) != 1 or not isinstance(statements[0], cst.SimpleStatementLine):
        return None
    small = statements[0].body
    if len(small) != 1 or not isinstance(small[0], cst.Return):
        return None
    return small[0].value


def _linear(node: Optional[cst.BaseExpression], sized: str) -> Optional[Dict[str, int]]:
    """`node` as a sum of integer multiples of `self` attributes, `len(self.A)` (`sized`) and
    a constant (key ""); None for anything else."""
    if node is None:
        return None
    if isinstance(node, cst.Integer):
        return {"": int(node.evaluated_value)}
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = _linear(node.expression, sized)
        return None if inner is None else {k: -v for k, v in inner.items()}
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract)):
        left, right = _linear(node.left, sized), _linear(node.right, sized)
        if left is None or right is None:
            return None
        if isinstance(node.operator, cst.Subtract):
            right = {k: -v for k, v in right.items()}
        return _add(left, right)
    if _self_attribute(node) is not None:
        return {f"self.{_self_attribute(node)}": 1}
    if isinstance(node, cst.Call) and code_of(node).replace(" ", "") == sized:
        return {sized: 1}
    return None


def _add(a: Dict[str, int], b: Dict[str, int]) -> Dict[str, int]:
    total = dict(a)
    for key, value in b.items():
        total[key] = total.get(key, 0) + value
    return total

"""Which tensors a scope writes in place, lets escape, or shares storage with.

A copy (`.clone()`) is needed exactly when the copy or the tensor it was taken from is
written in place while the other is still used, or when either reaches code that might do
so. This module answers that for the names of one scope (a function body, or module-level
code), flow-insensitively: a write anywhere in the scope counts, whatever its position.

Every read of a name is followed outwards through the expressions around it until its
value is consumed (arithmetic, a reduction, `print`), bound to another name (that name then
shares its storage), written in place (`+=`, `.add_()`, `x[...] = ...`, `out=`,
`inplace=True`) or handed to code the analysis cannot see (an unknown call, a container
that is stored, a `return`): anything not known to be harmless is an escape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple, Union

import libcst as cst

from optimizer_codemod.analysis.calls import (
    MODULE_RETURNING_METHODS,
    keyword,
    literal,
    method_name,
)
from optimizer_codemod.analysis.nodes import parameters_of
from optimizer_codemod.analysis.walk import children, type_test

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

# Tensor methods whose result is a new tensor (or no tensor at all).
FRESH_METHODS = frozenset(
    "item tolist sum mean std var norm max min amax amin argmax argmin exp log log1p sqrt "
    "rsqrt abs neg pow square add sub mul div true_divide matmul mm bmm softmax log_softmax "
    "sigmoid tanh relu eq ne lt gt le ge clamp clip cumsum prod any all numel dim size "
    "nelement isnan isinf isfinite round floor ceil sign sin cos logsumexp allclose equal "
    "clone dot".split()
)
# Tensor methods whose result may share the receiver's storage (or be the receiver itself).
VIEW_METHODS = frozenset(
    "view view_as reshape reshape_as flatten squeeze unsqueeze transpose t permute expand "
    "expand_as narrow select split chunk unbind detach to cpu cuda float double half "
    "bfloat16 long int bool type type_as contiguous numpy unfold diagonal movedim".split()
)
VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real", "imag"})
READ_ATTRIBUTES = frozenset(
    {"shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_leaf", "layout"}
)
# torch and torch.nn.functional functions that allocate their result.
FRESH_FUNCTIONS = frozenset(
    "randn rand randint randn_like rand_like randint_like zeros ones empty full zeros_like "
    "ones_like empty_like full_like arange linspace logspace eye tensor cat concat "
    "concatenate stack hstack vstack matmul mm bmm einsum softmax log_softmax sigmoid tanh "
    "relu gelu silu exp log sqrt abs sum mean std var norm argmax argmin where add sub mul "
    "div pow clamp maximum minimum eq ne lt gt le ge sin cos cumsum linear conv1d conv2d "
    "conv3d layer_norm one_hot normalize cross_entropy mse_loss l1_loss nll_loss "
    "binary_cross_entropy_with_logits smooth_l1_loss huber_loss kl_div".split()
)
VIEW_FUNCTIONS = frozenset(
    "reshape flatten squeeze unsqueeze transpose t permute narrow select split chunk unbind "
    "movedim detach broadcast_to".split()
)
FUNCTION_NAMESPACES = ("torch.", "torch.nn.functional.")
SAFE_BUILTINS = frozenset({"print", "len", "float", "int", "bool", "str", "repr", "format"})
_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)

SAFE, MUTATED, ESCAPES = "safe", "mutated", "escapes"
# Provenance of a value: allocated here, borrowed from names of the scope, the result of a
# call of unknown code (a model, a parameter), or something else (an attribute, a method).
FRESH, CALL, OPAQUE = "fresh", "call", "opaque"


@dataclass(frozen=True)
class _Up:
    node: cst.CSTNode  # the expression whose value may now be the same storage


@dataclass
class Use:
    name: str
    node: cst.Name
    outcome: str  # SAFE, MUTATED or ESCAPES
    binds: Tuple[str, ...] = ()  # names that now share this one's storage


@dataclass
class ScopeFacts:
    """Uses and bindings of the plain names of one scope."""

    uses: List[Use] = field(default_factory=list)
    # Every value a name is bound to: an expression, or a provenance for parameters etc.
    bindings: Dict[str, List[Union[cst.BaseExpression, str]]] = field(default_factory=dict)
    escaped: Set[str] = field(default_factory=set)  # read by nested functions, global...

    def bind(self, name: str, value: Union[cst.BaseExpression, str]) -> None:
        self.bindings.setdefault(name, []).append(value)


class _Scope:
    def __init__(self, facts: "ScriptFacts", root: cst.CSTNode) -> None:
        self.facts = facts
        self.root = root
        self.parents: Dict[cst.CSTNode, cst.CSTNode] = {}
        self.stores: Set[cst.CSTNode] = set()  # Name nodes that bind, not read
        self.updated: Set[cst.CSTNode] = set()  # `x` in `x += ...`
        self.result = ScopeFacts()
        self._walk()

    # The walk ---------------------------------------------------------------------------
    def _walk(self) -> None:
        if isinstance(self.root, cst.FunctionDef):
            for param in parameters_of(self.root.params):
                self.result.bind(param.name.value, CALL)
            stack: List[cst.CSTNode] = [self.root.body]
        else:
            stack = [self.root]
        names: List[cst.Name] = []
        while stack:
            node = stack.pop()
            if isinstance(node, _SCOPES):
                self.result.escaped |= {
                    n.value for n in _all_names(node) if isinstance(n, cst.Name)
                }
                if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                    self.result.bind(node.name.value, OPAQUE)
                continue
            if isinstance(node, (cst.Global, cst.Nonlocal)):
                self.result.escaped |= {item.name.value for item in node.names}
            self._record_bindings(node)
            for child in children(node):
                self.parents[child] = node
                stack.append(child)
            if isinstance(node, cst.Name):
                names.append(node)
        for name in names:
            use = self._classify(name)
            if use is not None:
                self.result.uses.append(use)

    def _record_bindings(self, node: cst.CSTNode) -> None:
        def bind(name: str, value) -> None:
            self.result.bind(name, value)

        for target in binding_targets(node):
            self.stores.update(target_name_nodes(target))
        if isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name):
            self.updated.add(node.target)
        if isinstance(node, cst.Assign):
            for target in node.targets:
                for name, value in _pairs(target.target, node.value):
                    bind(name, value)
        elif isinstance(node, cst.AnnAssign) and node.value is not None:
            for name in _target_names(node.target):
                bind(name, node.value)
        elif isinstance(node, cst.AugAssign):
            for name in _target_names(node.target):
                bind(name, FRESH)  # the write itself is a use: MUTATED
        elif isinstance(node, cst.For):
            fresh = self._iterates_dataloader(node)
            for name in _target_names(node.target):
                bind(name, FRESH if fresh else node.iter)
        elif isinstance(node, cst.NamedExpr):
            for name in _target_names(node.target):
                bind(name, node.value)
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            for name in _target_names(node.asname.name):
                bind(name, OPAQUE)
        elif isinstance(node, (cst.ExceptHandler,)) and node.name is not None:
            for name in _target_names(node.name.name):
                bind(name, OPAQUE)
        elif isinstance(node, (cst.Import, cst.ImportFrom)):
            names = node.names if isinstance(node.names, (list, tuple)) else ()
            for alias in names:
                bound = alias.asname.name if alias.asname else alias.name
                for name in _target_names(bound):
                    bind(name.split(".")[0], OPAQUE)
        elif isinstance(node, cst.CompFor):
            for name in _target_names(node.target):
                bind(name, node.iter)

    def _iterates_dataloader(self, node: cst.For) -> bool:
        """Each batch of a DataLoader with the default collation is a new tensor."""
        loop = next((l for l in self.facts.records.loops if l.node is node), None)
        loader = self.facts.loader_of(loop) if loop is not None else None
        if loader is None or keyword(loader.node, "collate_fn") is not None:
            return False
        batch_size = keyword(loader.node, "batch_size")
        return batch_size is None or literal(batch_size.value, 0) is not None

    # Following a read outwards ------------------------------------------------------------
    def _classify(self, name: cst.Name) -> Optional[Use]:
        if name in self.updated:
            return Use(name.value, name, MUTATED)
        parent = self.parents.get(name)
        if parent is None or name in self.stores or not _is_read(name, parent):
            return None
        current: cst.CSTNode = name
        while True:
            parent = self.parents.get(current)
            if parent is None:
                return Use(name.value, name, ESCAPES)
            outcome = self._step(current, parent)
            if isinstance(outcome, _Up):
                current = outcome.node
                continue
            if outcome == "up":
                current = parent
                continue
            if isinstance(outcome, tuple):
                return Use(name.value, name, SAFE, outcome)
            return Use(name.value, name, outcome)

    def _step(self, current: cst.CSTNode, parent: cst.CSTNode):
        """What `parent` does with the value of `current`: "up" (its value may be `current`'s
        storage), a tuple of names it is bound to, or SAFE / MUTATED / ESCAPES."""
        if isinstance(parent, cst.Attribute) and parent.value is current:
            holder = self.parents.get(parent)
            if isinstance(holder, cst.Call) and holder.func is parent:
                outcome = self._method(parent.attr.value, holder)
                return _Up(holder) if outcome == "up" else outcome
            if _is_store(parent, holder):
                return MUTATED
            if parent.attr.value in VIEW_ATTRIBUTES:
                return "up"
            return SAFE if parent.attr.value in READ_ATTRIBUTES else ESCAPES
        if isinstance(parent, cst.Subscript):
            if parent.value is not current:
                return SAFE  # an index
            holder = self.parents.get(parent)
            return MUTATED if _is_store(parent, holder) else "up"
        if isinstance(parent, (cst.SubscriptElement, cst.Index, cst.Slice)):
            return SAFE
        if isinstance(parent, cst.Arg):
            outcome = self._argument(parent)
            return _Up(self.parents[parent]) if outcome == "up" else outcome
        if isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation)):
            return SAFE
        if isinstance(parent, cst.Comparison) or isinstance(parent, cst.ComparisonTarget):
            if isinstance(parent, cst.ComparisonTarget):
                identity = isinstance(parent.operator, (cst.Is, cst.IsNot))
            else:
                identity = any(
                    isinstance(t.operator, (cst.Is, cst.IsNot)) for t in parent.comparisons
                )
            return ESCAPES if identity else SAFE
        if isinstance(parent, cst.Element):
            paired = self._paired_target(parent)
            return paired if paired is not None else "up"
        if isinstance(parent, (cst.BooleanOperation, cst.StarredElement)):
            return "up"
        if isinstance(parent, (cst.Tuple, cst.List, cst.Set)):
            return "up"
        if isinstance(parent, cst.IfExp):
            return SAFE if parent.test is current else "up"
        if isinstance(parent, (cst.FormattedStringExpression, cst.If, cst.While)):
            return SAFE
        if isinstance(parent, cst.Expr):
            return SAFE
        if isinstance(parent, (cst.Assign, cst.AnnAssign)) and parent.value is current:
            targets = (
                [t.target for t in parent.targets]
                if isinstance(parent, cst.Assign)
                else [parent.target]
            )
            if all(isinstance(t, (cst.Name, cst.Tuple, cst.List)) for t in targets):
                names = tuple(n for t in targets for n in _target_names(t))
                if all("." not in n for n in names):
                    return names
            return ESCAPES  # stored in an attribute or a container
        if isinstance(parent, cst.For) and parent.iter is current:
            if self._iterates_dataloader(parent):
                return SAFE  # each batch is a new tensor
            return tuple(_target_names(parent.target))
        if isinstance(parent, cst.Del):
            return SAFE
        return ESCAPES

    def _paired_target(self, element: cst.Element) -> Optional[Tuple[str, ...]]:
        """`a` for the `x` in `a, b = x, y`: unpacking binds element to element."""
        values = self.parents.get(element)
        assign = self.parents.get(values) if values is not None else None
        if not isinstance(assign, cst.Assign) or assign.value is not values:
            return None
        names: List[str] = []
        for target in assign.targets:
            for name, value in _pairs(target.target, values):
                if value is element.value:
                    names.append(name)
                elif value is values:
                    return None  # not unpacked element-wise
        return tuple(names)

    def _method(self, method: str, call: cst.Call):
        if method.endswith("_") and not method.startswith("__"):
            return MUTATED
        if method in FRESH_METHODS:
            return SAFE
        if method in VIEW_METHODS:
            return "up"
        return ESCAPES

    def _argument(self, arg: cst.Arg):
        call = self.parents.get(arg)
        if not isinstance(call, cst.Call) or arg.star:
            return ESCAPES
        if arg.keyword is not None and arg.keyword.value == "out":
            return MUTATED
        inplace = keyword(call, "inplace")
        if inplace is not None and literal(inplace.value, True) is not False:
            return MUTATED
        if keyword(call, "out") is not None:
            return ESCAPES
        method = method_name(call)
        qualname = self.facts.qualified_name(call.func)
        if qualname is not None and qualname.startswith(FUNCTION_NAMESPACES):
            short = qualname.rsplit(".", 1)[-1]
            if qualname.rsplit(".", 1)[0] + "." not in FUNCTION_NAMESPACES:
                return ESCAPES
            if short in FRESH_FUNCTIONS:
                return SAFE
            if short in VIEW_FUNCTIONS and call.args and call.args[0] is arg:
                return "up"
            return ESCAPES
        if method is not None and qualname is None:
            # `a.mul(x)`, `a.view_as(x)`: the result never shares `x`'s storage.
            return SAFE if method in FRESH_METHODS | VIEW_METHODS else ESCAPES
        if isinstance(call.func, cst.Name):
            if call.func.value in SAFE_BUILTINS and not self.facts.imports.is_bound(
                call.func.value
            ):
                return SAFE
            if self._is_loss_module(call.func.value):
                return SAFE
        return ESCAPES

    def _is_loss_module(self, name: str) -> bool:
        """`criterion = nn.CrossEntropyLoss()`: torch's loss modules only read their inputs."""
        values = self.result.bindings.get(name) or [
            a.value for a in self.facts.assignments_to(name)
        ]
        return bool(values) and all(builds_torch_loss(self.facts, v) for v in values)

    # Provenance ---------------------------------------------------------------------------
    def provenance(self, node: cst.BaseExpression) -> Tuple[str, Set[str]]:
        """FRESH, CALL or OPAQUE for `node`'s storage, and the names of the scope it borrows."""
        if isinstance(node, cst.Name):
            return FRESH, {node.value}
        if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString, cst.FormattedString)):
            return FRESH, set()
        if isinstance(node, (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison)):
            return FRESH, set()
        if isinstance(node, cst.Subscript):
            return self.provenance(node.value)
        if isinstance(node, cst.Attribute):
            if node.attr.value in VIEW_ATTRIBUTES:
                return self.provenance(node.value)
            return OPAQUE, set()
        if isinstance(node, (cst.Tuple, cst.List)):
            return self._combined([e.value for e in node.elements])
        if isinstance(node, (cst.ListComp, cst.GeneratorExp)):
            kind, borrowed = self.provenance(node.elt)
            return (kind, set()) if not borrowed else (OPAQUE, set())
        if isinstance(node, cst.Call):
            method = method_name(node)
            qualname = self.facts.qualified_name(node.func)
            if qualname is not None:
                short = qualname.rsplit(".", 1)[-1]
                if qualname.rsplit(".", 1)[0] + "." in FUNCTION_NAMESPACES:
                    if short in FRESH_FUNCTIONS and keyword(node, "out") is None:
                        return FRESH, set()
                    if short in VIEW_FUNCTIONS and node.args:
                        return self.provenance(node.args[0].value)
                return OPAQUE, set()
            if method is not None:
                if method in FRESH_METHODS:
                    return FRESH, set()
                if method in VIEW_METHODS:
                    return self.provenance(node.func.value)
                return OPAQUE, set()
            if isinstance(node.func, cst.Name):
                return CALL, set()
        return OPAQUE, set()

    def _combined(self, parts: List[cst.BaseExpression]) -> Tuple[str, Set[str]]:
        kinds, names = set(), set()
        for part in parts:
            kind, borrowed = self.provenance(part)
            kinds.add(kind)
            names |= borrowed
        kind = OPAQUE if OPAQUE in kinds else CALL if CALL in kinds else FRESH
        return kind, names


@dataclass(frozen=True)
class CopyVerdict:
    """Whether a copy bound to `name` could share its source's storage instead."""

    outcome: str  # SAFE (nothing writes or leaks either), MUTATED or ESCAPES
    provenance: str  # FRESH (proven), CALL (a call of unknown code), OPAQUE
    culprit: Optional[cst.CSTNode] = None  # the read that writes or leaks, when one does
    group: Tuple[str, ...] = ()


def copy_verdict(
    facts: "ScriptFacts",
    scope: cst.CSTNode,
    name: str,
    copy: cst.BaseExpression,
    shared: cst.BaseExpression,
) -> CopyVerdict:
    """Would `name = shared` (instead of `name = copy`) change what the scope computes?

    The names that would then share storage (`name`, the names `shared` borrows from, and
    every name bound to any of them) must never be written in place nor escape, and every
    value they are bound to must be freshly allocated in this scope (otherwise code the
    analysis cannot see may hold and write the same storage).
    """
    analysis = _Scope(facts, scope)
    result = analysis.result
    kind, borrowed = analysis.provenance(shared)
    group = _closure(result, {name} | borrowed)
    worst = SAFE
    culprit = None
    for use in result.uses:
        if use.name in group and use.outcome != SAFE:
            if worst == SAFE or use.outcome == MUTATED:
                worst, culprit = use.outcome, use.node
    if group & result.escaped and worst == SAFE:
        worst = ESCAPES
    kinds = {kind}
    for member in group:
        for value in result.bindings.get(member, [OPAQUE]):
            if value is copy:
                continue
            if isinstance(value, str):
                kinds.add(value)
            else:
                kinds.add(analysis.provenance(value)[0])
    provenance = OPAQUE if OPAQUE in kinds else CALL if CALL in kinds else FRESH
    return CopyVerdict(worst, provenance, culprit, tuple(sorted(group)))


def _closure(result: ScopeFacts, seeds: Set[str]) -> Set[str]:
    """`seeds` and every name that shares storage with one of them, both ways."""
    edges: Dict[str, Set[str]] = {}
    for use in result.uses:
        for bound in use.binds:
            edges.setdefault(use.name, set()).add(bound)
            edges.setdefault(bound, set()).add(use.name)
    for name, values in result.bindings.items():
        for value in values:
            if not isinstance(value, str):
                for other in _borrowed_names(value):
                    edges.setdefault(name, set()).add(other)
                    edges.setdefault(other, set()).add(name)
    group, stack = set(seeds), list(seeds)
    while stack:
        for other in edges.get(stack.pop(), ()):
            if other not in group:
                group.add(other)
                stack.append(other)
    return group


def _borrowed_names(value: cst.BaseExpression) -> Set[str]:
    """Names whose storage a bound value may be (through views, containers, unpacking)."""
    if isinstance(value, cst.Name):
        return {value.value}
    if isinstance(value, (cst.Subscript,)):
        return _borrowed_names(value.value)
    if isinstance(value, cst.Attribute):
        return _borrowed_names(value.value) if value.attr.value in VIEW_ATTRIBUTES else set()
    if isinstance(value, (cst.Tuple, cst.List)):
        return {n for e in value.elements for n in _borrowed_names(e.value)}
    if isinstance(value, cst.Call):
        # Calls of unknown code may return their arguments, but such values are never
        # proven fresh anyway; torch's view functions are matched by their short name here.
        method = method_name(value)
        if method in VIEW_METHODS:
            return _borrowed_names(value.func.value)
        func = value.func
        short = func.attr.value if isinstance(func, cst.Attribute) else None
        if short in VIEW_FUNCTIONS and value.args:
            return _borrowed_names(value.args[0].value)
    return set()


def _target_names(node: cst.CSTNode) -> List[str]:
    if isinstance(node, cst.Name):
        return [node.value]
    if isinstance(node, (cst.Tuple, cst.List)):
        return [n for e in node.elements for n in _target_names(e.value)]
    if isinstance(node, cst.StarredElement):
        return _target_names(node.value)
    return []


def _all_names(node: cst.CSTNode) -> List[cst.CSTNode]:
    found, stack = [], [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Name):
            found.append(current)
        stack.extend(children(current))
    return found


def _pairs(target: cst.CSTNode, value: cst.BaseExpression) -> List[Tuple[str, cst.BaseExpression]]:
    """(name, value) bound by `target = value`, element-wise for `a, b = x, y`."""
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
        targets, values = target.elements, value.elements
        if len(targets) == len(values) and not any(
            isinstance(e, cst.StarredElement) for e in (*targets, *values)
        ):
            return [p for t, v in zip(targets, values) for p in _pairs(t.value, v.value)]
    return [(name, value) for name in _target_names(target)]


_BINDS = type_test(
    cst.Assign,
    cst.AnnAssign,
    cst.AugAssign,
    cst.For,
    cst.CompFor,
    cst.NamedExpr,
    cst.WithItem,
    cst.ExceptHandler,
)


def binding_targets(node: cst.CSTNode) -> List[cst.CSTNode]:
    if not _BINDS(node):
        return []  # called for every node of a scope: most bind nothing
    if isinstance(node, cst.Assign):
        return [t.target for t in node.targets]
    if isinstance(node, (cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor, cst.NamedExpr)):
        return [node.target]
    if isinstance(node, cst.WithItem) and node.asname is not None:
        return [node.asname.name]
    if isinstance(node, cst.ExceptHandler) and node.name is not None:
        return [node.name.name]
    return []


def target_name_nodes(node: cst.CSTNode) -> List[cst.Name]:
    """The Name nodes a target binds (not those read in `x[i] = ...` or `x.a = ...`)."""
    if isinstance(node, cst.Name):
        return [node]
    if isinstance(node, (cst.Tuple, cst.List)):
        return [n for e in node.elements for n in target_name_nodes(e.value)]
    if isinstance(node, cst.StarredElement):
        return target_name_nodes(node.value)
    return []


def _is_store(node: cst.CSTNode, holder: Optional[cst.CSTNode]) -> bool:
    if isinstance(holder, cst.AssignTarget) and holder.target is node:
        return True
    if isinstance(holder, (cst.AugAssign, cst.AnnAssign)) and holder.target is node:
        return True
    return isinstance(holder, cst.Del)


def _is_read(name: cst.Name, parent: cst.CSTNode) -> bool:
    """Whether this Name node reads a variable (not an attribute name, keyword, target...)."""
    if isinstance(parent, cst.Attribute) and parent.attr is name:
        return False
    if isinstance(parent, cst.Arg) and parent.keyword is name:
        return False
    return not isinstance(
        parent, (cst.AsName, cst.ImportAlias, cst.Param, cst.NameItem, cst.FunctionDef)
    )


def builds_torch_loss(facts: "ScriptFacts", value: cst.BaseExpression) -> bool:
    """`nn.CrossEntropyLoss()`: a call of one of torch's loss modules, which hold no
    parameters and only read their inputs; also placed or switched
    (`CrossEntropyLoss().to(opt.device)`: 3D-ResNets' main.py)."""
    while isinstance(value, cst.Call) and method_name(value) in MODULE_RETURNING_METHODS:
        value = value.func.value
    if not isinstance(value, cst.Call):
        return False
    qualified = facts.qualified_name(value.func) or ""
    return qualified.startswith("torch.nn.") and qualified.endswith("Loss")

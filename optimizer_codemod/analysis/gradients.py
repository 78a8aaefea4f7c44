"""Where a script looks at `.grad` (the reads that would see None instead of a zero tensor),
and where it differentiates a gradient again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Set

import libcst as cst

from optimizer_codemod.analysis.calls import (
    argument,
    excerpt,
    is_literal,
    literal,
    method_name,
    positional,
)
from optimizer_codemod.analysis.collect import Assignment, CallSite, Site
from optimizer_codemod.analysis.devices import HOST_ATTRIBUTES
from optimizer_codemod.analysis.inplace import FRESH_METHODS
from optimizer_codemod.analysis.nodes import find_all, is_name, root_name
from optimizer_codemod.analysis.scopes import name_uses

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts


@dataclass(frozen=True)
class GradRead:
    node: cst.CSTNode  # `p.grad`, the `p.grad += g` statement, or `getattr(p, "grad")`
    site: Site


def grad_reads(facts: "ScriptFacts") -> List[GradRead]:
    """Every place that reads a `.grad`, in visit order.

    Beyond plain attribute reads (`p.grad.norm()`, `p.grad is None`, `p.grad.data`): updates
    in place (`p.grad += noise`, which fails on None) and `getattr(p, "grad")`. Stores
    (`p.grad = None`) read nothing.
    """
    # `torch.autograd.grad(...)` is a function that returns gradients: no `.grad` is read.
    found = [
        GradRead(read.node, read.site)
        for read in facts.records.grad_reads
        if facts.qualified_name(read.node) != "torch.autograd.grad"
    ]
    found += [
        GradRead(a.statement_node, a.site)
        for a in facts.records.assignments
        if a.augmented and a.target.rsplit(".", 1)[-1] == "grad"
    ]
    for call in facts.records.calls:
        func = call.node.func
        args = positional(call.node)
        if (
            isinstance(func, cst.Name)
            and func.value == "getattr"
            and len(args) >= 2
            and literal(args[1].value, None) == "grad"
        ):
            found.append(GradRead(call.node, call.site))
    return sorted(found, key=lambda read: read.site.order)


# Second derivatives: Hessians are computed through a graph of the backward pass.
_HESSIANS = frozenset(
    {
        "torch.autograd.functional.hessian",
        "torch.autograd.functional.hvp",
        "torch.autograd.functional.vhp",
        "torch.func.hessian",
    }
)


# Calls that may differentiate a gradient again, as named in another module's summary (the
# project index keeps qualified names, not arguments: a `create_graph` cannot be read there).
SECOND_DERIVATIVE_CALLS = _HESSIANS | {"torch.autograd.grad"}


def double_backward_calls(facts: "ScriptFacts") -> List[CallSite]:
    """Calls that build a graph of the backward pass so that it can be differentiated again:
    `torch.autograd.grad(..., create_graph=True)` (a gradient penalty), `loss.backward(
    create_graph=True)`, Hessians; a `create_graph` that is not literally False counts."""
    found = facts.calls_to(*_HESSIANS)
    # `create_graph` is the fifth parameter of `torch.autograd.grad`, the fourth of
    # `torch.autograd.backward` and the third of `Tensor.backward`.
    found += [
        call
        for call in facts.calls_to("torch.autograd.grad")
        if _builds_graph(argument(call.node, "create_graph", 4))
    ]
    found += [
        call
        for call in facts.calls_to("torch.autograd.backward")
        if _builds_graph(argument(call.node, "create_graph", 3))
    ]
    found += [
        call
        for call in facts.method_calls("backward")
        if _builds_graph(argument(call.node, "create_graph", 2))
    ]
    return sorted(found, key=lambda call: call.site.order)


def input_gradient_names(facts: "ScriptFacts") -> Set[str]:
    """Names bound to what `torch.autograd.grad` returns, or to an element of it
    (`gradients = autograd.grad(outputs, inputs, ...)[0]`, `(g,) = torch.autograd.grad(...)`)."""
    names = set()
    for assignment in facts.records.assignments:
        value = assignment.value
        if isinstance(value, cst.Subscript):
            value = value.value
        if (
            isinstance(value, cst.Call)
            and facts.qualified_name(value.func) == "torch.autograd.grad"
        ):
            names.add(assignment.target)
    return names


def _builds_graph(create_graph) -> bool:
    return create_graph is not None and not is_literal(create_graph.value, False)


# Bucket views (OPT605) --------------------------------------------------------------------------
# In-place methods that fail on a view (`detach_`: "Can't detach views in-place") or make the
# gradient stop being the bucket's memory.
VIEW_BREAKING_METHODS = frozenset({"detach_", "requires_grad_", "set_", "resize_"})
# Methods and torch functions that may return the gradient itself or a view of it: what is
# done with their result decides, as for the gradient.
SAME_TENSOR_METHODS = frozenset(
    "detach view view_as reshape flatten squeeze unsqueeze float to cpu cuda contiguous".split()
)
TORCH_VIEW_FUNCTIONS = frozenset(
    f"torch.{name}"
    for name in "flatten reshape squeeze unsqueeze narrow select t transpose permute".split()
)
# Tensor methods of another tensor that read the gradient passed to them.
ARGUMENT_READING_METHODS = frozenset(
    "add add_ sub sub_ mul mul_ div div_ addcmul addcmul_ addcdiv addcdiv_ copy_ lerp lerp_ "
    "dot matmul maximum minimum".split()
    # `state["exp_avg"].to(grad)` (HF's Adafactor) reads only the gradient's dtype and device.
    + "to type_as view_as reshape_as expand_as".split()
)
MAX_DEPTH = 3
# Methods that return a new tensor or a Python value computed from the gradient.
NEW_VALUE_METHODS = FRESH_METHODS | frozenset(
    "norm item tolist numel size dim isfinite isnan isinf any all square".split()
)


def sparse_gradients(facts: "ScriptFacts") -> Optional[str]:
    """Who may make sparse gradients: "the script" when it builds a layer with `sparse=` not
    literally False, or the module of the run it imports that does (transformer-xl's
    mem_transformer.py: `nn.Embedding(n_token, d_embed, sparse=sample_softmax>0)`); None
    when neither does."""
    if facts.uses_sparse_gradients:
        return "the script"
    project = facts.project
    if project is not None and project.imported.sparse_gradients:
        return project.decided_by("sparse_gradients") or "a module this script imports"
    return None


def bucket_view_hazards(facts: "ScriptFacts") -> List[cst.CSTNode]:
    """The statements whose use of a `.grad` would break once gradients are views into DDP's
    buckets (`gradient_as_bucket_view=True`), in source order: `p.grad.detach_()` (raises on
    a view), a gradient kept past its statement (bound to a name, put in a container,
    returned: the next backward overwrites the bucket), handed to a function other than
    torch's, a `.grad` set to a tensor, `getattr(p, "grad")`. Sound, and left out: reads
    that compute from it (`p.grad.norm()`, `torch.norm(p.grad.detach())`, `p.grad is
    None`), updates in place as statements (`p.grad.data.mul_(c)`, `p.grad += noise`) and
    `p.grad = None` (DDP reads and writes the same memory, and points a gradient reset to
    None at its bucket again; tests/test_bucket_view_claims.py runs each on DDP)."""
    table = facts.parents
    found = []
    for read in grad_reads(facts):
        node = read.node
        if isinstance(node, cst.AugAssign):
            continue  # `p.grad += noise`: an update in place
        if isinstance(node, cst.Attribute) and _bucket_safe_use(facts, table, node):
            continue
        found.append((read.site.order, read.site.statement or node))
    found += [(a.site.order, a.site.statement or a.statement_node) for a in gradient_stores(facts)]
    return [node for _, node in sorted(found, key=lambda item: item[0])]


def gradient_stores(facts: "ScriptFacts") -> List["Assignment"]:
    """The assignments that set a `.grad` to a tensor (`p.grad = g`, `p.grad = None` left
    out), in visit order."""
    memo = facts.memo("gradient_stores")
    if None not in memo:
        memo[None] = [
            a
            for a in facts.records.assignments
            if a.target.rsplit(".", 1)[-1] == "grad"
            and "." in a.target
            and not a.augmented
            and not is_name(a.value, "None")
        ]
    return memo[None]


def stored_gradients(facts: "ScriptFacts") -> Optional[str]:
    """Who sets a `.grad` to a tensor of its own: the statement of the script, as written,
    or the module of the run it imports that does (continual-learning's OWM projects the
    gradients and stores strided views of one matrix: `linear.weight.grad =
    scaled_g[..., 0:-1].detach()`); None when neither does."""
    stores = gradient_stores(facts)
    if stores:
        return f"the script (`{excerpt(stores[0].statement_node)}`)"
    project = facts.project
    if project is not None and project.imported.stores_gradients:
        return project.decided_by("stores_gradients") or "a module this script imports"
    return None


def _bucket_safe_use(facts: "ScriptFacts", table, node: cst.CSTNode, depth: int = 0) -> bool:
    """What `node` (a gradient, or the same tensor) flows into only reads it or updates it
    in place: within its statement, or through a local name (`dp = p.grad` in an optimizer's
    step) whose every use does."""
    while True:
        parent = table.get(node)
        if isinstance(parent, cst.Subscript) and parent.value is node:
            node = parent
            continue
        if isinstance(parent, (cst.Comparison, cst.ComparisonTarget, cst.BinaryOperation)):
            return True
        if isinstance(parent, cst.UnaryOperation):
            return True
        if isinstance(parent, cst.Attribute) and parent.value is node:
            call = table.get(parent)
            name = parent.attr.value
            if not (isinstance(call, cst.Call) and call.func is parent):
                if name == "data":
                    node = parent
                    continue
                return name in HOST_ATTRIBUTES
            if name in VIEW_BREAKING_METHODS:
                return False
            if name in SAME_TENSOR_METHODS:
                node = call
                continue
            if name in NEW_VALUE_METHODS:
                return True
            # `p.grad.data.mul_(c)` as a statement: DDP wrote there and will write again.
            return name.endswith("_") and isinstance(table.get(call), cst.Expr)
        if isinstance(parent, cst.Arg):
            call = table.get(parent)
            if not isinstance(call, cst.Call):
                return False
            qualified = facts.qualified_name(call.func) or ""
            if qualified in TORCH_VIEW_FUNCTIONS:
                node = call
                continue
            if qualified.startswith("torch.") and not qualified.endswith("_"):
                return True
            # `mu.mul_(momentum).add_(dp)`: a tensor method that reads its argument.
            return method_name(call) in ARGUMENT_READING_METHODS
        if isinstance(parent, cst.Assign) and parent.value is node and depth < MAX_DEPTH:
            if depth > 0 and _rebinds_its_own_name(parent):
                return True  # `grad = grad.float()`: the name's other uses are being checked
            return _name_safe_uses(facts, table, parent, depth)
        return False


def _rebinds_its_own_name(assign: cst.Assign) -> bool:
    """`grad = grad.float()` (Hugging Face's Adafactor): the name is bound again to what its
    own value gives, the same tensor or a new one."""
    targets = assign.targets
    return (
        len(targets) == 1
        and isinstance(targets[0].target, cst.Name)
        and root_name(assign.value) == targets[0].target.value
    )


def _name_safe_uses(facts: "ScriptFacts", table, assign: cst.Assign, depth: int) -> bool:
    """`dp = p.grad` in an optimizer's step: every read of `dp` comes later in the block of
    the assignment, with no backward in between, and only reads it or updates it in place.
    A read before it (`prev = p.grad` at the end of a step, read at the top of the next)
    would see the bucket that the next backward overwrote."""
    if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
        return False
    name = assign.targets[0].target.value
    statement = table.get(assign)
    body = list(getattr(table.get(statement), "body", ()) or ())
    index = next((i for i, s in enumerate(body) if s is statement), None)
    if index is None:
        return False
    later = body[index + 1 :]
    if any(method_name(call) == "backward" for s in later for call in find_all(s, cst.Call)):
        return False
    later_ids = {id(s) for s in later}
    scope: Optional[cst.CSTNode] = statement
    while scope is not None and not isinstance(scope, (cst.FunctionDef, cst.Module)):
        scope = table.get(scope)
    if scope is None:
        return False
    for use in name_uses(scope, name, facts):
        if use.nested:
            return False
        if use.store:
            continue
        if not _inside(table, use.node, later_ids):
            return False
        if not _bucket_safe_use(facts, table, use.node, depth + 1):
            return False
    return True


def _inside(table, node: Optional[cst.CSTNode], statements: Set[int]) -> bool:
    """`node` lies in one of the `statements` (by id)."""
    while node is not None:
        if id(node) in statements:
            return True
        node = table.get(node)
    return False

"""Hand-written scaled dot-product attention: `softmax(q @ k^T * scale [mask]) [dropout] @ v`.

The pattern is matched from the final product `W @ v` backwards. Each stage has one data
operand; when that operand is a name, the statement just before (in the same block) must bind
it (`att = ...`), and that statement joins the chain. So both the one-expression spelling and
nanoGPT's chain of assignments are read as one expression. Every name the chain binds must be
used nowhere else in the function: attention weights that are returned, stored or read again
leave the pattern alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional, Set, Tuple, Union

import libcst as cst

from optimizer_codemod.analysis.calls import argument, code_of, literal, method_name
from optimizer_codemod.analysis.dropped_results import why_element_read
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all, single_assignment
from optimizer_codemod.analysis.scalars import is_python_number
from optimizer_codemod.analysis.scopes import name_uses
from optimizer_codemod.analysis.walk import children

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

SOFTMAX = frozenset({"torch.nn.functional.softmax", "torch.softmax", "torch.Tensor.softmax"})
DROPOUT = "torch.nn.functional.dropout"
MATMUL = frozenset({"torch.matmul"})
NEG_INF = frozenset({'float("-inf")', "float('-inf')", '-float("inf")', "-float('inf')"})
NEG_INF_NAMES = frozenset({"math.inf", "torch.inf", "numpy.inf"})
# `transpose` arguments that swap the last two axes of a 4-D key (or of any key: -2, -1).
LAST_TWO = ({-2, -1}, {2, 3})


@dataclass
class Attention:
    """A matched attention: where it is, and the pieces of the SDPA call."""

    statement: cst.SimpleStatementLine  # the statement holding the final product
    product: cst.BaseExpression  # `W @ v` or `torch.matmul(W, v)`
    chain: List[cst.SimpleStatementLine]  # earlier statements folded in, in source order
    q: cst.BaseExpression
    k: cst.BaseExpression
    v: cst.BaseExpression
    scale: Optional[str] = None  # source of the scale; None: no scaling (1.0)
    scale_node: Optional[cst.BaseExpression] = None  # the scale (or divisor) as written
    scale_is_number: bool = True  # provably a Python number (SDPA's `scale` takes no tensor)
    mask: Optional[str] = None  # source of a boolean keep-mask for `attn_mask`
    causal: bool = False
    additive: Optional[cst.BaseExpression] = None  # `scores + mask`: content unknown
    dropout_p: Optional[str] = None
    reads: List[cst.BaseExpression] = field(default_factory=list)  # inputs evaluated later
    # A parameter (`output_attentions`) under whose `if` alone the probabilities are read
    # later: the hand-written attention stays for that case, SDPA runs for the other.
    flag: Optional[str] = None
    # Names of the chain that `function` returns and every caller drops (`out, _ = attn(x)`):
    # each becomes `None`, so the callers' unpacking still holds.
    dropped: List[cst.Name] = field(default_factory=list)


class _Chain:
    def __init__(self, body: List[cst.BaseStatement], index: int) -> None:
        self.body = body
        self.position = index - 1
        self.folded: List[cst.SimpleStatementLine] = []
        self.names: Set[str] = set()

    def resolve(self, node: cst.BaseExpression) -> cst.BaseExpression:
        """The value of `node` when it is a name the previous statement binds."""
        node = _unparen(node)
        if not isinstance(node, cst.Name) or self.position < 0:
            return node
        line = self.body[self.position]
        assignment = single_assignment(line, node.value)
        value = assignment.value if assignment is not None else None
        if value is None:
            return node
        self.folded.insert(0, line)
        self.names.add(node.value)
        self.position -= 1
        return self.resolve(value)


def find_attentions(
    facts: "ScriptFacts", declined: Optional[List[Tuple[cst.CSTNode, str]]] = None
) -> List[Attention]:
    """Hand-written attentions SDPA can replace; with `declined`, each attention recognised
    but left is added to it with the reason, in words."""
    found: List[Attention] = []
    reasons: List[Tuple[cst.CSTNode, str]] = [] if declined is None else declined
    if not any(
        call.qualname in SOFTMAX or (call.method == "softmax" and call.qualname is None)
        for call in facts.records.calls
    ):
        return found  # `softmax` only in text: nothing to match
    for function, klass in _functions(facts.module, None):
        for block in _blocks(function):
            body = list(block.body)
            for index, line in enumerate(body):
                if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
                    continue
                for product in _products(facts, line):
                    match = _match(facts, klass, function, body, index, line, product)
                    if isinstance(match, str):
                        if not _flagged_branch(function, block):
                            reasons.append((line, match))
                        break
                    if match is not None:
                        found.append(match)
                        break
    return found


# Only these nodes can hold statements; expressions and simple statements never hold a `def`
# or a block, so the walks below skip them (most of a large module's nodes).
_STATEMENT_HOLDERS = (
    cst.IndentedBlock,
    cst.BaseCompoundStatement,
    cst.Else,
    cst.ExceptHandler,
    cst.ExceptStarHandler,
    cst.Finally,
    cst.MatchCase,
)


def _functions(node: cst.CSTNode, klass: Optional[cst.ClassDef]):
    """Every function with the class it is a method of (None for other functions)."""
    for child in children(node):
        if isinstance(child, cst.FunctionDef):
            yield child, klass
            yield from _functions(child.body, None)
        elif isinstance(child, cst.ClassDef):
            yield from _functions(child.body, child)
        elif isinstance(child, _STATEMENT_HOLDERS):
            yield from _functions(child, klass if isinstance(node, cst.IndentedBlock) else None)


def _blocks(function: cst.FunctionDef) -> List[cst.IndentedBlock]:
    """The blocks of `function`'s own body (not of functions or classes nested in it)."""
    found = []
    stack: List[cst.CSTNode] = [function.body]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(node, cst.IndentedBlock):
            found.append(node)
        stack.extend(child for child in children(node) if isinstance(child, _STATEMENT_HOLDERS))
    return found


def _products(facts, line):
    for node in find_all(line, cst.BinaryOperation, cst.Call):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
            yield node
        elif isinstance(node, cst.Call) and facts.qualified_name(node.func) in MATMUL:
            yield node


def _operands(facts, node):
    """(left, right) of `a @ b` or `torch.matmul(a, b)`."""
    node = _unparen(node)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
        return node.left, node.right
    if (
        isinstance(node, cst.Call)
        and facts.qualified_name(node.func) in MATMUL
        and len(node.args) == 2
        and all(a.keyword is None and not a.star for a in node.args)
    ):
        return node.args[0].value, node.args[1].value
    return None


def _match(facts, klass, function, body, index, line, product) -> Union[Attention, str, None]:
    """The attention whose final product is `product`; a reason when it is one but cannot be
    replaced; None when it is no attention."""
    chain = _Chain(body, index)
    weights, v = _operands(facts, product)
    weights = chain.resolve(weights)
    dropout_p = None
    dropped = _dropout(facts, klass, weights)
    if dropped is not None:
        inner, dropout_p = dropped
        weights = chain.resolve(inner)
    scores = _softmax_input(facts, weights)
    if scores is None:
        return None
    scores = chain.resolve(scores)
    match = Attention(line, product, [], None, None, v, dropout_p=dropout_p)
    scores = _mask(facts, klass, scores, chain, match)
    if scores is None:
        return None
    scores = chain.resolve(scores)
    if not _scaled_product(facts, scores, chain, match):
        return None
    if match.scale_node is not None:
        match.scale_is_number = is_python_number(facts, match.scale_node, function, klass)
    match.chain = chain.folded
    for node in (match.q, match.k, match.v):
        name = dotted_name(node)
        if name is None:
            return (
                f"`{code_of(node).strip()}` is computed in place of a query, key or value "
                "name, and the rewrite takes names only"
            )
        if name.startswith("self."):
            # vit-pytorch's PatchMerger: a 2-D learned query against 3-D keys, which no
            # fused kernel takes: SDPA would run its math fallback, the same product.
            return (
                f"`{name}` is an attribute of the module (a learned query or key shared by "
                "the batch, with fewer dimensions than the other operands): no fused kernel "
                "takes such inputs, so SDPA would compute the same product"
            )
    inputs = [match.q, match.k, match.v, *match.reads]
    if match.additive is not None:
        inputs.append(match.additive)
    if any(n.value in chain.names for i in inputs for n in find_all(i, cst.Name)):
        return None
    kept = _used_elsewhere(function, chain, line, product)
    if kept is not None:
        match.flag = _flag_guarding(function, chain, line, product, body, index)
        if match.flag is not None:
            return match
        dropped = _dropped_by_callers(facts, klass, function, chain, product)
        if isinstance(dropped, list):
            match.dropped = dropped
            return match
        return (
            f"the attention's intermediate `{kept}` is used outside the computation (returned "
            "or stored: the attention probabilities, for instance), and SDPA does not compute "
            "it" + (f"; it is returned, but {dropped}" if dropped else "")
        )
    return match


def _dropped_by_callers(facts, klass, function, chain: _Chain, product):
    """The returned names of the chain (to become `None`) when its names are read outside it
    only as one element of the tuple `function` returns, and every caller drops that element
    (analysis/dropped_results.py); the reason in words when only the callers keep it; None
    when the names are used otherwise."""
    inside = _inside(chain, product)
    outside = set()
    for name in chain.names:
        for use in name_uses(function, name):
            if id(use.node) in inside:
                continue
            if use.nested or use.store:
                return None
            outside.add(id(use.node))
    returned = _returned_elements(function, outside)
    if returned is None:
        return None
    position, size, nodes = returned
    why = why_element_read(facts, function, klass, position, size)
    return nodes if why is None else why


def _dropout(facts, klass, node):
    """(input, dropout_p source) for `self.drop(x)` (an nn.Dropout) or `F.dropout(x, ...)`."""
    if not isinstance(node, cst.Call) or any(a.star for a in node.args) or not node.args:
        return None
    if facts.qualified_name(node.func) == DROPOUT:
        data = argument(node, "input", 0)
        p = argument(node, "p", 1)
        training = argument(node, "training", 2)
        if data is None or len(node.args) > 4:
            return None
        p_code = code_of(p.value).strip() if p is not None else "0.5"
        if training is None:
            return data.value, p_code
        if literal(training.value, None) is False:
            return data.value, None
        return data.value, f"{p_code} if {code_of(training.value).strip()} else 0.0"
    name = dotted_name(node.func)
    if (
        klass is not None
        and name is not None
        and name.startswith("self.")
        and len(node.args) == 1
        and node.args[0].keyword is None
        and _is_dropout_module(facts, klass, name)
    ):
        return node.args[0].value, f"{name}.p if {name}.training else 0.0"
    return None


def _is_dropout_module(facts, klass, name: str) -> bool:
    values = [
        a.value
        for a in facts.assignments_to(name)
        if a.site.class_name == klass.name.value and not a.unpacked
    ]
    return (
        len(values) == 1
        and isinstance(values[0], cst.Call)
        and facts.qualified_name(values[0].func) == "torch.nn.Dropout"
        and len(facts.assignments_to(name)) == 1
    )


def _softmax_input(facts, node) -> Optional[cst.BaseExpression]:
    """`x` for `F.softmax(x, dim=-1)`, `torch.softmax(x, -1)`, `x.softmax(dim=-1)`."""
    if not isinstance(node, cst.Call) or any(a.star for a in node.args):
        return None
    qualified = facts.qualified_name(node.func)
    if qualified in SOFTMAX:
        data, dim, count = argument(node, "input", 0), argument(node, "dim", 1), 2
    elif method_name(node) == "softmax" and qualified is None:
        data, dim, count = cst.Arg(node.func.value), argument(node, "dim", 0), 1
    else:
        return None
    if data is None or dim is None or len(node.args) != count:
        return None
    if literal(dim.value, None) != -1 or isinstance(literal(dim.value, None), bool):
        return None
    return data.value


def _mask(facts, klass, node, chain, match) -> Optional[cst.BaseExpression]:
    """The scores under the mask: fills in `match.mask`/`causal`/`additive`."""
    node = _unparen(node)
    if isinstance(node, cst.Call) and method_name(node) in ("masked_fill", "masked_fill_"):
        if len(node.args) != 2 or any(a.star or a.keyword for a in node.args):
            return None
        mask, value = node.args[0].value, node.args[1].value
        if not _is_neg_inf(facts, value):
            return None
        if _is_causal(facts, klass, mask):
            match.causal = True
        else:
            match.mask = _keep_mask(mask)
            match.reads.append(mask)
        return node.func.value
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        match.additive = node.right
        return node.left
    return node


def _is_neg_inf(facts, node) -> bool:
    if code_of(node).strip().replace(" ", "") in NEG_INF:
        return True
    node = _unparen(node)
    return (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and facts.qualified_name(node.expression) in NEG_INF_NAMES
    )


def _keep_mask(mask: cst.BaseExpression) -> str:
    """The boolean keep-mask SDPA wants, for a `masked_fill` mask (True = filled)."""
    bare = _unparen(mask)
    if (
        isinstance(bare, cst.Comparison)
        and len(bare.comparisons) == 1
        and isinstance(bare.comparisons[0].operator, cst.Equal)
    ):
        return code_of(
            bare.with_changes(
                comparisons=[bare.comparisons[0].with_changes(operator=cst.NotEqual())]
            )
        ).strip()
    if isinstance(bare, cst.UnaryOperation) and isinstance(bare.operator, cst.BitInvert):
        return code_of(bare.expression).strip()
    if isinstance(bare, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)):
        return "~" + code_of(bare).strip()
    return "~(" + code_of(bare).strip() + ")"


def _is_causal(facts, klass, mask) -> bool:
    """`self.bias[:, :, :T, :T] == 0` for a buffer of `tril(ones(n, n))`, or that inline."""
    mask = _unparen(mask)
    if not (
        isinstance(mask, cst.Comparison)
        and len(mask.comparisons) == 1
        and isinstance(mask.comparisons[0].operator, cst.Equal)
        and literal(mask.comparisons[0].comparator, None) in (0,)
        and not isinstance(literal(mask.comparisons[0].comparator, None), bool)
    ):
        return False
    left = _unparen(mask.left)
    if _tril_of_ones(facts, left) is not None:
        return True
    if not isinstance(left, cst.Subscript) or klass is None:
        return False
    name = dotted_name(left.value)
    dims = _tril_buffer_dims(facts, klass, name) if name and name.startswith("self.") else None
    if dims is None or len(left.slice) != dims:
        return False
    slices = [element.slice for element in left.slice]
    if not all(isinstance(s, cst.Slice) and s.lower is None and s.step is None for s in slices):
        return False
    *lead, rows, cols = slices
    if any(s.upper is not None for s in lead) or rows.upper is None or cols.upper is None:
        return False
    return code_of(rows.upper).strip() == code_of(cols.upper).strip()


def _tril_of_ones(facts, node) -> Optional[int]:
    """2 for `torch.tril(torch.ones(n, n))` or `torch.ones(n, n).tril()`; else None."""
    node = _unparen(node)
    if not isinstance(node, cst.Call):
        return None
    if facts.qualified_name(node.func) == "torch.tril" and len(node.args) == 1:
        inner = node.args[0].value
    elif method_name(node) == "tril" and not node.args:
        inner = node.func.value
    else:
        return None
    inner = _unparen(inner)
    if not isinstance(inner, cst.Call) or facts.qualified_name(inner.func) != "torch.ones":
        return None
    sizes = [a for a in inner.args if a.keyword is None]
    if len(sizes) != 2 or any(a.star for a in inner.args):
        return None
    if code_of(sizes[0].value).strip() != code_of(sizes[1].value).strip():
        return None
    if any(a.keyword.value not in ("dtype", "device") for a in inner.args if a.keyword):
        return None
    return 2


def _tril_buffer_dims(facts, klass, name: str) -> Optional[int]:
    """How many axes the buffer `self.NAME` has, when it is registered once as a lower
    triangle of ones (optionally `.view(1, 1, n, n)`) and never written or rebound."""
    attr = name[len("self.") :]
    registrations = []
    for call in find_all(klass, cst.Call):
        if method_name(call) == "register_buffer" and dotted_name(call.func.value) == "self":
            first = argument(call, "name", 0)
            if first is None or literal(first.value, None) == attr:
                registrations.append(call)
        func = call.func
        if (
            isinstance(func, cst.Attribute)
            and dotted_name(func.value) == name
            and func.attr.value.endswith("_")
        ):
            return None
    if len(registrations) != 1 or facts.assignments_to(name):
        return None
    value = argument(registrations[0], "tensor", 1)
    if value is None:
        return None
    value = _unparen(value.value)
    if isinstance(value, cst.Name):
        bound = [
            a.value
            for a in facts.assignments_to(value.value)
            if a.site.class_name == klass.name.value
        ]
        if len(bound) != 1:
            return None
        value = _unparen(bound[0])
    dims = 2
    if isinstance(value, cst.Call) and method_name(value) == "view":
        sizes = [a for a in value.args if a.keyword is None and not a.star]
        if len(sizes) != len(value.args) or len(sizes) < 2:
            return None
        if any(literal(a.value, None) != 1 for a in sizes[:-2]):
            return None
        dims = len(sizes)
        value = _unparen(value.func.value)
    return dims if _tril_of_ones(facts, value) is not None else None


def _scaled_product(facts, node, chain, match) -> bool:
    """`q @ kT * s`, `s * (q @ kT)`, `q @ kT / d` or bare `q @ kT`: sets q, k, scale."""
    node = _unparen(node)
    product = None
    if isinstance(node, cst.BinaryOperation) and isinstance(
        node.operator, (cst.Multiply, cst.Divide)
    ):
        left = chain.resolve(node.left)
        right = _unparen(node.right)
        if _operands(facts, left) is not None:
            product = left
            scale = code_of(right).strip()
            if isinstance(node.operator, cst.Divide):
                match.scale = f"1.0 / {_wrapped(right)}"
            else:
                match.scale = scale
        elif isinstance(node.operator, cst.Multiply) and _operands(facts, right) is not None:
            product = right
            match.scale = code_of(_unparen(node.left)).strip()
        else:
            return False
        match.scale_node = _unparen(node.right if product is left else node.left)
        match.reads.append(node.right if product is left else node.left)
    elif _operands(facts, node) is not None:
        product = node
        match.scale = "1.0"
    else:
        return False
    q, transposed = _operands(facts, product)
    k = _transposed(_unparen(transposed))
    if k is None:
        return False
    match.q, match.k = _unparen(q), k
    return True


def _transposed(node) -> Optional[cst.BaseExpression]:
    """`k` for `k.transpose(-2, -1)`, `k.transpose(2, 3)` (4-D keys), `k.mT`."""
    if isinstance(node, cst.Attribute) and node.attr.value == "mT":
        return _unparen(node.value)
    if isinstance(node, cst.Call) and method_name(node) == "transpose" and len(node.args) == 2:
        axes = {literal(a.value, None) for a in node.args if a.keyword is None}
        if any(axes == pair for pair in LAST_TWO):
            return _unparen(node.func.value)
    return None


def _inside(chain: _Chain, product) -> Set[int]:
    """ids of the name nodes the rewrite replaces: the folded statements and the weights
    operand of the final product."""
    inside = {id(n) for statement in chain.folded for n in find_all(statement, cst.Name)}
    inside |= {id(n) for n in find_all(_operands_node_left(product), cst.Name)}
    return inside


def _used_elsewhere(function, chain: _Chain, line, product) -> Optional[str]:
    """A name the chain binds that is used outside the chain (and the final operand)."""
    inside = _inside(chain, product)
    for name in sorted(chain.names):
        for use in name_uses(function, name):
            if use.nested or id(use.node) not in inside:
                return name
    return None


def _returned_elements(
    function: cst.FunctionDef, outside: Set[int]
) -> Optional[Tuple[int, int, List[cst.Name]]]:
    """(index, size, the name nodes) when every name node whose id is in `outside` is element
    `index` of a `size`-tuple that `function` returns, and every `return` of `function`
    returns a tuple of that size; None otherwise."""
    returns = [
        small
        for block in _blocks(function)
        for line in block.body
        if isinstance(line, cst.SimpleStatementLine)
        for small in line.body
        if isinstance(small, cst.Return)
    ]
    if not returns or any(not isinstance(r.value, cst.Tuple) for r in returns):
        return None
    sizes = {len(r.value.elements) for r in returns}
    if len(sizes) != 1 or any(
        isinstance(e, cst.StarredElement) for r in returns for e in r.value.elements
    ):
        return None
    found: List[cst.Name] = []
    positions = set()
    for r in returns:
        for position, element in enumerate(r.value.elements):
            if isinstance(element.value, cst.Name) and id(element.value) in outside:
                found.append(element.value)
                positions.add(position)
    if len(found) != len(outside) or len(positions) != 1:
        return None
    return positions.pop(), sizes.pop(), found


def _flag_guarding(function, chain: _Chain, line, product, body, index) -> Optional[str]:
    """The parameter `flag` when every use of the chain's names outside it is inside an
    `if flag:` (without `else`) that follows the attention in its block, and the function
    never rebinds `flag`: `if output_attentions: return out, att`."""
    inside = _inside(chain, product)
    params = function.params
    parameters = {p.name.value for p in (*params.posonly_params, *params.params)}
    parameters |= {p.name.value for p in params.kwonly_params}
    guarded: dict = {}
    for statement in body[index + 1 :]:
        if (
            isinstance(statement, cst.If)
            and isinstance(statement.test, cst.Name)
            and statement.orelse is None
            and statement.test.value in parameters
        ):
            flag = statement.test.value
            guarded.update((id(n), flag) for n in find_all(statement.body, cst.Name))
    flags = set()
    for name in chain.names:
        for use in name_uses(function, name):
            if id(use.node) in inside:
                continue
            if use.nested or use.store or id(use.node) not in guarded:
                return None
            flags.add(guarded[id(use.node)])
    if len(flags) != 1:
        return None
    flag = flags.pop()
    declared = {id(p.name) for p in (*params.posonly_params, *params.params, *params.kwonly_params)}
    if flag in chain.names or any(
        use.store and id(use.node) not in declared for use in name_uses(function, flag)
    ):
        return None
    return flag


def _flagged_branch(function, block) -> bool:
    """`block` is the `if output_attentions:` branch of an attention rewritten before: its
    `else` runs SDPA (OPT406 keeps the hand-written attention there on purpose)."""
    for node in find_all(function, cst.If):
        if node.body is block and isinstance(node.orelse, cst.Else):
            if "scaled_dot_product_attention" in code_of(node.orelse.body):
                return True
    return False


def _operands_node_left(product):
    if isinstance(product, cst.BinaryOperation):
        return product.left
    return product.args[0].value


def _unparen(node):
    while node is not None and getattr(node, "lpar", None):
        node = node.with_changes(lpar=[], rpar=[])
    return node


def _wrapped(node) -> str:
    text = code_of(node).strip()
    if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)):
        return text
    return f"({text})"

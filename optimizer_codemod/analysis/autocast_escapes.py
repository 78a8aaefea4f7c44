"""Values computed under autocast that escape the block to code that needs 32 bits.

Tensors computed inside `torch.autocast(..., dtype=torch.bfloat16)` are 16-bit (except the
outputs of ops autocast runs in float32: losses, softmax). Used after the block they break
or silently change the script: `.numpy()` raises on bfloat16, `.tolist()` and metrics
accumulated from them (`total += out.sum()`) lose precision, `torch.save` stores 16-bit
tensors, a step function returns them to callers that expect float32.

`escaping_reads(facts, statements)` answers, for statements about to be wrapped, which reads
after them (in the same function, or module) take such a value to such a use, following
the value through tensor-preserving operations (`torch.sigmoid(out).detach().cpu()`) and
through local names (`preds = out.sigmoid()` then `preds.numpy()`). Only what autocast can
make 16-bit counts: what a call run under it returns (a forward, a helper, torch's matrix
products and convolutions) and what is computed from that; what torch's factories make
(`torch.randint(...)`), a DataLoader's batch copied to the device, and what is read from
what existed before the block (`batch["paper"].batch_size`, an int; `x.shape[0]`, `len(x)`)
are never 16-bit, unless a call of the block may have stored a tensor there (`model.cache`,
a forward hook's dict). Reads that end in
backward, `.item()`, an integer or boolean result (`out.argmax(1) == y`), an explicit cast
(`.float()`), a shape or dtype, printing, or a name bound again before the read are not
escapes. Anything else handed to a function that is not torch's (a metric function, numpy,
`list.append`) or stored in an attribute or subscript is.

Each scope is indexed once (parents, reads and bindings of every name, in source order) and
every name's verdict is memoised, so the cost stays linear in the size of the file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst

from optimizer_codemod.analysis.calls import callee_name, keyword, method_name
from optimizer_codemod.analysis.devices import device_types
from optimizer_codemod.analysis.escapes import HOST_METHODS
from optimizer_codemod.analysis.factories import FACTORIES
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.mutation import binding_targets, target_name_nodes
from optimizer_codemod.analysis.nodes import find_all, is_name
from optimizer_codemod.analysis.walk import children, type_test

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

Scope = Union[cst.Module, cst.FunctionDef]
_NESTED = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
_is_nested = type_test(*_NESTED)
_SUITES = (cst.IndentedBlock, cst.Module, cst.SimpleStatementSuite)
_DISPLAYS = (cst.List, cst.Tuple, cst.Set)
MAX_DEPTH = 3

# Methods whose result is no 16-bit float tensor (an index, a mask, a size, a 32-bit cast),
# or that end the value's use harmlessly (`.item()` only when nothing was computed first).
SETTLING_METHODS = HOST_METHODS - {"tolist", "item"} | frozenset(
    {
        "argmax",
        "argmin",
        "argsort",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "isnan",
        "isinf",
        "isfinite",
        "long",
        "int",
        "bool",
        "float",
        "double",
        "backward",
        "register_hook",
        "type",
    }
)
ESCAPING_METHODS = frozenset({"numpy", "tolist"})
# Methods of a container that keep the value they are given (`outputs.append(model(x))`).
KEEPING_METHODS = frozenset({"append", "extend", "insert"})
# Methods that move or reshape a tensor without computing on its values.
# Copies to a device (or the host), which keep the dtype.
MOVING_METHODS = frozenset({"to", "cuda", "cpu"})
VIEW_METHODS = frozenset(
    "detach cpu cuda to view reshape flatten squeeze unsqueeze permute transpose contiguous "
    "clone expand narrow select unbind split chunk t".split()
)
SETTLING_ATTRIBUTES = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad"})
# Builtins that print or measure; `float()`/`int()` make Python numbers of full precision.
SETTLING_BUILTINS = frozenset(
    {"print", "len", "float", "int", "bool", "str", "repr", "format", "isinstance", "type"}
)
WIDE_DTYPES = frozenset({"torch.float32", "torch.float", "torch.float64", "torch.double"})
NARROW_OR_INTEGER_DTYPES = frozenset(
    {"torch.long", "torch.int64", "torch.int", "torch.int32", "torch.bool", "torch.uint8"}
)
# Ops that autocast runs in float32 (on CUDA and CPU): their outputs are 32-bit already.
FLOAT32_FUNCTIONS = frozenset(
    f"torch.nn.functional.{name}"
    for name in (
        "cross_entropy",
        "nll_loss",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "kl_div",
        "binary_cross_entropy_with_logits",
        "softmax",
        "log_softmax",
    )
) | frozenset({"torch.softmax", "torch.log_softmax"})
FLOAT32_MODULES = frozenset(
    f"torch.nn.{name}"
    for name in (
        "CrossEntropyLoss",
        "NLLLoss",
        "MSELoss",
        "L1Loss",
        "SmoothL1Loss",
        "HuberLoss",
        "KLDivLoss",
        "BCEWithLogitsLoss",
        "Softmax",
        "LogSoftmax",
    )
)
FLOAT32_METHODS = frozenset({"softmax", "log_softmax"})

# Ops that autocast runs in 16 bits (CUDA's and CPU's lists): their results are 16-bit
# whatever their inputs, as function (`torch.mm`, `F.linear`) or method (`x.matmul(w)`).
LOWERED_OPS = frozenset(
    "matmul mm bmm mv addmm addbmm baddbmm addmv addr dot vdot inner outer einsum tensordot "
    "chain_matmul multi_dot linalg_vecdot linear bilinear conv1d conv2d conv3d conv_tbc "
    "conv_transpose1d conv_transpose2d conv_transpose3d prelu scaled_dot_product_attention "
    "multi_head_attention_forward __matmul__".split()
)
# Tensor methods whose result is as 16-bit as their receiver or arguments, no more: views,
# element-wise maths, reductions, containers' reads.
FOLLOWING_METHODS = VIEW_METHODS | frozenset(
    "sum mean std var max min amax amin exp log log1p sqrt abs neg pow add sub mul div "
    "clamp clip sigmoid tanh relu cumsum sort topk masked_fill gather index_select repeat "
    "expand_as view_as round floor ceil sign norm square prod tril triu new_zeros new_ones "
    "new_full new_empty get items keys values copy".split()
)
# Builtins whose result is made of their arguments (`max(a, b)`, `sum(losses)`).
PASSING_BUILTINS = frozenset(
    "sum max min abs round sorted list tuple dict set zip enumerate reversed iter next "
    "getattr range map filter".split()
)
# Libraries whose functions return numbers or arrays, never a 16-bit torch tensor.
HOST_LIBRARIES = frozenset(
    "numpy math cmath random statistics time scipy sklearn pandas json os".split()
)
# Methods by which a function keeps a value in an object it did not create.
STORING_METHODS = KEEPING_METHODS | frozenset({"update", "setdefault", "__setitem__", "add"})
# Expressions that hold no tensor: literals, and functions written out.
_NO_TENSOR = (
    cst.Integer,
    cst.Float,
    cst.Imaginary,
    cst.SimpleString,
    cst.ConcatenatedString,
    cst.FormattedString,
    cst.Ellipsis,
    cst.Lambda,
    cst.Comparison,
)

# Tensor methods whose result `escape_within` follows from their receiver, never a start.
_FOLLOWED_METHODS = (
    VIEW_METHODS | SETTLING_METHODS | ESCAPING_METHODS | KEEPING_METHODS | frozenset({"item"})
)


class _ScopeIndex:
    """One walk over a scope: parents, source order, reads and bindings of every name."""

    def __init__(self, scope: Scope) -> None:
        self.parents: Dict[cst.CSTNode, cst.CSTNode] = {}
        self.order: Dict[cst.CSTNode, int] = {}
        self.reads: Dict[str, List[cst.Name]] = {}
        # name -> (order, region): the binding is seen by later code inside `region`.
        self.bindings: Dict[str, List[Tuple[int, cst.CSTNode]]] = {}
        stores: Set[cst.CSTNode] = set()
        stack: List[Tuple[cst.CSTNode, Optional[cst.CSTNode]]] = [(scope, None)]
        count = 0
        while stack:
            node, parent = stack.pop()
            if parent is not None:
                self.parents[node] = parent
            count += 1
            self.order[node] = count
            if node is not scope and _is_nested(node):
                continue
            for target in binding_targets(node):
                region = node.body if isinstance(node, cst.For) else None
                for name in target_name_nodes(target):
                    stores.add(name)
                    self.bindings.setdefault(name.value, []).append((count, region or node))
            if isinstance(node, cst.Name):
                if node not in stores:
                    self.reads.setdefault(node.value, []).append(node)
                continue
            below: Sequence[cst.CSTNode] = children(node)
            if isinstance(node, cst.Attribute):
                below = (node.value,)
            elif isinstance(node, cst.Arg):
                below = (node.value,)
            elif isinstance(node, cst.FunctionDef):
                below = (node.body,)
            elif isinstance(node, (cst.Import, cst.ImportFrom)):
                below = ()
            stack.extend((child, node) for child in reversed(below))

    def suite_of(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        while node is not None and not isinstance(node, _SUITES):
            node = self.parents.get(node)
        return node


class AutocastEscapes:
    """Memoised answers for one module (ScriptFacts.autocast_escapes)."""

    def __init__(self, facts: "ScriptFacts") -> None:
        self.facts = facts
        self._indexes: Dict[cst.CSTNode, _ScopeIndex] = {}
        self._name_escapes: Dict[Tuple[cst.CSTNode, str, bool], bool] = {}

    def escaping_reads(
        self,
        statements: Sequence[cst.BaseStatement],
        regions: Sequence[Sequence[cst.BaseStatement]] = (),
    ) -> List[cst.Name]:
        """Reads after `statements` (about to run under autocast) that take a possibly
        16-bit value they compute to a use that needs 32 bits, in source order. `regions`:
        the other blocks wrapped too, whose 16-bit values `statements` may compute from
        (a GAN's discriminator step reading the generator's `fake`)."""
        scope = self._scope_of(statements)
        index = self._index(scope)
        inside = {n for s in statements for n in find_all(s, cst.Name)}
        end = max(index.order.get(n, 0) for n in inside) if inside else 0
        found: List[cst.Name] = []
        for name in self._narrow_names(statements, regions):
            for read in self._reads_after(index, name, end, inside):
                if self._use_escapes(index, scope, read, 0):
                    found.append(read)
        return sorted(found, key=lambda n: index.order[n])

    def escape_within(
        self,
        statements: Sequence[cst.BaseStatement],
        regions: Sequence[Sequence[cst.BaseStatement]] = (),
    ) -> Optional[cst.BaseExpression]:
        """The first value `statements` compute, possibly a 16-bit tensor, that leaves them
        in the statement that computes it, where no read after the block could cast it
        back: `.numpy()`, `.tolist()`, a list's `.append()` (`outputs.append(model(x))`),
        `torch.save`, an attribute or subscript it is stored in. A value handed to another
        forward or helper is followed from that call's result; `regions` as for
        escaping_reads."""
        scope = self._scope_of(statements)
        index = self._index(scope)
        narrow = self._narrow_names(statements, regions)
        for statement in statements:
            for grown in find_all(statement, cst.AugAssign):
                # `outs += [model(x)]`: kept in a container, which no cast after the block fits
                if isinstance(grown.value, _DISPLAYS) and not self._is_wide(grown.value):
                    return grown.value
            for node in find_all(statement, cst.Call, cst.Name):
                if isinstance(node, cst.Name):
                    start = node.value in narrow  # a binding target stops at its statement
                else:
                    start = self._may_compute_narrow(node)
                if start and self._use_escapes(index, scope, node, 0, within=True):
                    return node
        return None

    def _may_compute_narrow(self, call: cst.Call) -> bool:
        """A call whose result may be a 16-bit tensor: a forward or helper called by name
        (`model(x)`, `self.G(x)`), not torch's own op nor a tensor method (their dtype
        follows their inputs, which are followed from their own calls)."""
        name = dotted_name(call.func)
        if name is None or method_name(call) in _FOLLOWED_METHODS:
            return False
        qualified = self.facts.qualified_name(call.func) or ""
        if qualified.startswith("torch.") or self._is_wide(call):
            return False
        return not (name in SETTLING_BUILTINS and not self.facts.imports.is_bound(name))

    # Scopes --------------------------------------------------------------------------
    def _index(self, scope: Scope) -> _ScopeIndex:
        index = self._indexes.get(scope)
        if index is None:
            index = self._indexes[scope] = _ScopeIndex(scope)
        return index

    def _scope_of(self, statements: Sequence[cst.BaseStatement]) -> Scope:
        for statement in statements:
            for call in find_all(statement, cst.Call):
                site = self.facts.call_site_of.get(call)
                if site is not None:
                    return site.site.function or self.facts.module
        return self.facts.module

    # Values ----------------------------------------------------------------------------
    def _narrow_names(
        self,
        statements: Sequence[cst.BaseStatement],
        regions: Sequence[Sequence[cst.BaseStatement]] = (),
    ) -> Set[str]:
        """Names the statements bind to values that may be 16-bit tensors: what a call that
        runs under autocast returns (a forward, a helper, one of torch's matrix products),
        and what is computed from such values, through the names of the block (and of the
        other wrapped `regions`, whose values it may read) until nothing changes. A value
        read from what existed before the block (`batch["paper"].batch_size`, `x.shape[0]`,
        `len(x)`, a constant, the loader's batch) is no such tensor, unless a call in the
        block may have stored one there (`model.cache` after `model(x)`, a hook's dict)."""
        everywhere = {id(s): s for s in (*statements, *(s for r in regions for s in r))}
        memo = self.facts.memo("autocast_narrow_names")
        key = frozenset(everywhere)
        narrow = memo.get(key)
        if narrow is None:  # one answer for all the blocks of a rewrite, whichever is asked
            pairs = [pair for s in everywhere.values() for pair in _bound_values(s)]
            written = self._written_paths(list(everywhere.values()))
            narrow = memo[key] = set()
            # A worklist, not rounds over every pair until none changes (quadratic in a
            # long step): a value is looked at again only when a name it reads turns narrow.
            readers: Dict[str, List[int]] = {}
            for position, (_, value) in enumerate(pairs):
                for read in find_all(value, cst.Name) if value is not None else ():
                    readers.setdefault(read.value, []).append(position)
            turned: List[str] = []

            def settle(position: int) -> None:
                name, value = pairs[position]
                if name not in narrow and (
                    value is None or self._may_be_narrow(value, narrow, written)
                ):
                    narrow.add(name)
                    turned.append(name)

            for position in range(len(pairs)):
                settle(position)
            while turned:
                for position in readers.get(turned.pop(), ()):
                    settle(position)
        return narrow & {name for s in statements for name, _ in _bound_values(s)}

    def _may_be_narrow(self, value: cst.BaseExpression, narrow: Set[str], written) -> bool:
        """`value`, computed in an autocast block whose names in `narrow` may hold 16-bit
        tensors, may be one: autocast turns into 16 bits only what its listed ops compute
        (matrix products, convolutions) and what other ops compute from 16-bit inputs."""
        if self._is_wide(value):
            return False

        def follows(node) -> bool:
            return self._may_be_narrow(node, narrow, written)

        if isinstance(value, cst.Name):
            return value.value in narrow
        if isinstance(value, cst.Attribute):
            if value.attr.value in SETTLING_ATTRIBUTES:
                return False
            return follows(value.value) or _stored_by(value, written)
        if isinstance(value, cst.Subscript):
            return follows(value.value) or _stored_by(value, written)
        if isinstance(value, cst.BinaryOperation):
            return isinstance(value.operator, cst.MatrixMultiply) or (
                follows(value.left) or follows(value.right)
            )
        if isinstance(value, cst.UnaryOperation):
            return follows(value.expression)
        if isinstance(value, cst.BooleanOperation):
            return follows(value.left) or follows(value.right)
        if isinstance(value, cst.IfExp):
            return follows(value.body) or follows(value.orelse)
        if isinstance(value, cst.NamedExpr):
            return follows(value.value)
        if isinstance(value, _DISPLAYS):
            return any(follows(element.value) for element in value.elements)
        if isinstance(value, cst.Dict):
            return any(follows(element.value) for element in value.elements)
        if isinstance(value, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
            produced = value.value if isinstance(value, cst.DictComp) else value.elt
            loops = find_all(value.for_in, cst.CompFor)
            return follows(produced) or any(follows(loop.iter) for loop in loops)
        if isinstance(value, cst.Call):
            return self._call_may_be_narrow(value, follows)
        return not isinstance(value, _NO_TENSOR)

    def _call_may_be_narrow(self, call: cst.Call, follows) -> bool:
        """A forward or helper may return anything autocast computed; torch's own ops and
        tensor methods are 16-bit when autocast lowers them (`torch.mm`, `x @ w`) or when an
        input is; builtins that pass values on (`max`, `sum`) when an argument is."""

        def from_inputs() -> bool:
            return any(follows(arg.value) for arg in call.args)

        qualified = self.facts.qualified_name(call.func) or ""
        if qualified.startswith("torch."):
            if qualified in FACTORIES and not qualified.endswith("_like"):
                return not self._made_wide(call)
            return qualified.rpartition(".")[2] in LOWERED_OPS or from_inputs()
        if qualified.partition(".")[0] in HOST_LIBRARIES:
            return False  # `np.mean(...)`, `math.sqrt(...)`: a number or an array
        method = method_name(call)
        if method is not None and not qualified:
            if method in MOVING_METHODS:
                if not self._only_moves(call):
                    return True
            elif method not in FOLLOWING_METHODS:
                return True  # `rec.forward(obs, h)`, `self.net(x)`, `x.mm(w)`, `x.half()`
            return follows(call.func.value) or from_inputs()
        name = dotted_name(call.func)
        if name in SETTLING_BUILTINS | PASSING_BUILTINS and not self.facts.imports.is_bound(name):
            return name in PASSING_BUILTINS and from_inputs()
        return True  # `model(x)`, `criterion(out, y)`, a helper of the script or a library

    def _written_paths(self, statements: Sequence[cst.BaseStatement]) -> Set[str]:
        """Objects whose attributes the calls of `statements` may set to what autocast
        computes: a callee and what it holds (`model(x)` may keep `model.cache`,
        `self.net(x)` `self.net.*`, `trainer.step()` `trainer.*`), and every object of the
        file that a function running with them stores into (a forward hook's
        `activations[name] = out`, see _stored_while_running)."""
        paths = self._stored_while_running(statements)
        for statement in statements:
            for call in find_all(statement, cst.Call):
                qualified = self.facts.qualified_name(call.func) or ""
                if qualified.startswith("torch."):
                    continue
                method = method_name(call)
                if method is not None and method in FOLLOWING_METHODS | MOVING_METHODS:
                    continue
                callee = dotted_name(call.func)
                if callee is None or (
                    callee in PASSING_BUILTINS | SETTLING_BUILTINS
                    and not self.facts.imports.is_bound(callee)
                ):
                    continue
                paths.add(callee)
                receiver = callee.rpartition(".")[0]
                if receiver and (receiver != "self" or self._is_own_method(call, method)):
                    paths.add(receiver)  # `trainer.step()` may set any attribute of `trainer`
        return paths

    def _is_own_method(self, call: cst.Call, method: str) -> bool:
        """`self.method(...)` calls a method of the class it is in (not a submodule such as
        `self.net(x)`, which may set only its own attributes)."""
        site = self.facts.call_site_of.get(call)
        info = self.facts.classes.get(site.site.class_name) if site is not None else None
        if info is None:
            return True
        return any(
            isinstance(s, cst.FunctionDef) and s.name.value == method for s in info.node.body.body
        )

    def _stored_while_running(self, statements: Sequence[cst.BaseStatement]) -> Set[str]:
        """Names (other than `self`) that code running during `statements` may store into:
        the functions they call by name, every `forward` of the file, and the hooks the file
        registers (`register_forward_hook(get_activation("fc"))`, a lambda, a `partial`),
        with `outputs[name] = out`, `cache.x = out` or `features.append(out)`."""
        functions, hooks = self._functions_and_hooks()
        running = list(hooks) + functions.get("forward", [])
        for statement in statements:
            for call in find_all(statement, cst.Call):
                running.extend(functions.get(callee_name(call) or "", ()))
        names: Set[Optional[str]] = set()
        for code in running:
            for node in find_all(code, cst.Assign, cst.AugAssign, cst.Call):
                if isinstance(node, cst.Call):
                    if method_name(node) in STORING_METHODS:
                        names.add(_root_name(node.func.value))
                    continue
                for target in binding_targets(node):
                    if isinstance(target, (cst.Attribute, cst.Subscript)):
                        names.add(_root_name(target))
        return {name for name in names if name not in (None, "self", "cls")}

    def _functions_and_hooks(self):
        """Every function of the file by name (nested ones too), and the code of the hooks
        it registers: lambdas, and the functions named in the registration's arguments."""
        memo = self.facts.memo("autocast_functions_and_hooks")
        if "found" not in memo:
            functions: Dict[str, List[cst.FunctionDef]] = {}
            for function in find_all(self.facts.module, cst.FunctionDef):
                functions.setdefault(function.name.value, []).append(function)
            hooks: List[cst.CSTNode] = []
            for call in find_all(self.facts.module, cst.Call):
                if "hook" not in (method_name(call) or ""):
                    continue
                for arg in call.args:
                    hooks.extend(find_all(arg.value, cst.Lambda))
                    for name in find_all(arg.value, cst.Name):
                        hooks.extend(functions.get(name.value, ()))
            memo["found"] = (functions, hooks)
        return memo["found"]

    def _is_wide(self, value: cst.BaseExpression) -> bool:
        """`value` is a 32-bit tensor or no float tensor at all, even under autocast (a list
        or tuple written out of such values: cleanrl's `clipfracs += [x.mean().item()]`)."""
        if isinstance(value, (cst.Integer, cst.Float, cst.SimpleString, cst.Comparison)):
            return True
        if isinstance(value, _DISPLAYS):
            return all(
                not isinstance(element, cst.StarredElement) and self._is_wide(element.value)
                for element in value.elements
            )
        if not isinstance(value, cst.Call):
            return False
        method = method_name(value)
        if method in SETTLING_METHODS or method in FLOAT32_METHODS or method == "item":
            return True
        if method == "to" and self._casts_wide(value):
            return True
        if method in MOVING_METHODS:
            return self._moves_a_batch(value)
        qualified = self.facts.qualified_name(value.func)
        if qualified in FLOAT32_FUNCTIONS:
            return True
        if qualified in FACTORIES and not qualified.endswith("_like"):
            return self._made_wide(value)
        name = dotted_name(value.func)
        if name is None:
            return False
        assignments = self.facts.assignments_to(name)
        return bool(assignments) and all(
            isinstance(a.value, cst.Call)
            and self.facts.qualified_name(a.value.func) in FLOAT32_MODULES
            for a in assignments
        )

    def _moves_a_batch(self, call: cst.Call) -> bool:
        """`y.to(device)`, `x.cuda()`: a copy to a device, which keeps the dtype, of a part
        of a DataLoader's batch (a target of the loop over the loader, bound in the loop by
        nothing but such copies): the loader made it outside any autocast."""
        if not isinstance(call.func, cst.Attribute) or not isinstance(call.func.value, cst.Name):
            return False
        if not self._only_moves(call):
            return False
        name = call.func.value.value
        site = self.facts.call_site_of.get(call)
        loop = site.site.loop if site is not None else None
        if loop is None or name not in loop.targets or self.facts.loader_of(loop) is None:
            return False
        return all(
            isinstance(a.value, cst.Call)
            and method_name(a.value) in MOVING_METHODS
            and is_name(a.value.func.value, name)
            and self._only_moves(a.value)
            for a in self.facts.assignments_in(loop)
            if a.target == name
        )

    def _only_moves(self, call: cst.Call) -> bool:
        """The call copies to a device and nothing else: `.cuda()`, `.to(device,
        non_blocking=True)`; not `.to(other)`, which takes the dtype of a tensor `other`."""
        for arg in call.args:
            if arg.keyword is not None:
                if arg.keyword.value not in ("device", "non_blocking", "copy"):
                    return False
            elif method_name(call) == "to" and not self._names_a_device(arg.value):
                return False
        return True

    def _names_a_device(self, node: cst.BaseExpression) -> bool:
        if device_types(self.facts, node) is not None:
            return True
        name = dotted_name(node) or ""
        return name.rpartition(".")[2].endswith("device")  # `device`, `args.device`

    def _made_wide(self, factory: cst.Call) -> bool:
        """`torch.randint(...)`, `torch.zeros(n)`: autocast casts the inputs of its ops, never
        what a factory makes, which is float32 or int64 unless `dtype=` says otherwise
        (the `*_like` ones copy the dtype of a tensor that may be 16-bit)."""
        dtype = keyword(factory, "dtype")
        if dtype is None:
            return True
        qualified = self.facts.qualified_name(dtype.value)
        return qualified in WIDE_DTYPES or qualified in NARROW_OR_INTEGER_DTYPES

    def _casts_wide(self, call: cst.Call) -> bool:
        """`.to(torch.float32)`, `.to(dtype=torch.long)`: a cast out of 16 bits."""
        for arg in call.args:
            qualified = self.facts.qualified_name(arg.value)
            if qualified in WIDE_DTYPES or qualified in NARROW_OR_INTEGER_DTYPES:
                return True
        return False

    # Reads -----------------------------------------------------------------------------
    def _reads_after(
        self, index: _ScopeIndex, name: str, end: int, inside: Set[cst.CSTNode]
    ) -> List[cst.Name]:
        """Reads of `name` after position `end` that can see the value bound before it."""
        found = []
        for read in index.reads.get(name, ()):
            position = index.order[read]
            if position <= end or read in inside:
                continue
            if not self._rebound_between(index, name, end, read):
                found.append(read)
        return found

    def _rebound_between(self, index: _ScopeIndex, name: str, start: int, read) -> bool:
        """A binding of `name` after `start` that surely runs before `read`: a plain
        statement of an enclosing block (or of a `with` body there), or an enclosing `for`
        target."""
        position = index.order[read]
        ancestors = set()
        node = read
        while node is not None:
            ancestors.add(node)
            node = index.parents.get(node)
        for order, region in index.bindings.get(name, ()):
            if not start < order < position:
                continue
            if isinstance(region, cst.IndentedBlock) and region in ancestors:
                return True  # a `for` target around the read
            if region in ancestors:
                continue  # `logits = logits[:, -1] / t`: the read runs before this binding
            statement = index.parents.get(region)
            if isinstance(region, (cst.Assign, cst.AnnAssign)) and statement is not None:
                suite = index.suite_of(statement)
                # A `with` body runs whenever its statement does (`with torch.no_grad():
                # homo_x = ...` before the read): its bindings are as sure as the `with`.
                while suite not in ancestors and isinstance(index.parents.get(suite), cst.With):
                    suite = index.suite_of(index.parents[suite])
                if suite in ancestors:
                    return True
        return False

    def _use_escapes(
        self,
        index: _ScopeIndex,
        scope: Scope,
        read: cst.BaseExpression,
        depth: int,
        computed=False,
        within=False,
    ) -> bool:
        """Where the value `read` reads goes: up through the expression around it.
        `computed`: an operation after the block already ran on it in 16 bits (a sum, a
        softmax, a loss), so even `.item()` of the result has lost precision. `within`: the
        value is read inside the block, where handing it to a forward or helper is no
        escape, and a name it is bound to is followed by `escaping_reads`."""
        node: cst.CSTNode = read
        while True:
            parent = index.parents.get(node)
            if parent is None:
                return False
            if isinstance(parent, cst.Attribute):
                holder = index.parents.get(parent)
                if isinstance(holder, cst.Call) and holder.func is parent:
                    method = parent.attr.value
                    if method in ESCAPING_METHODS:
                        return True
                    if method == "item":
                        return computed
                    if method in SETTLING_METHODS or (method == "to" and self._casts_wide(holder)):
                        return False
                    computed = computed or method not in VIEW_METHODS
                    node = holder  # detach, cpu, sigmoid, sum, view...: still a tensor
                    continue
                if parent.attr.value in SETTLING_ATTRIBUTES:
                    return False
                node = parent  # `.T`, `.data`
                continue
            if isinstance(parent, cst.Arg):
                call = index.parents.get(parent)
                if not isinstance(call, cst.Call):
                    return False
                verdict = self._argument_escapes(call, within)
                if verdict is not None:
                    return verdict
                node, computed = call, True
                continue
            if isinstance(parent, (cst.Comparison, cst.ComparisonTarget, cst.FormattedString)):
                return False
            if isinstance(parent, cst.FormattedStringExpression):
                return False
            if isinstance(parent, (cst.Return, cst.Yield)):
                return True
            if isinstance(parent, cst.AugAssign):
                return parent.value is node  # `total += out.sum()`: accumulated
            if isinstance(parent, (cst.Assign, cst.AnnAssign)) and parent.value is node:
                if within:  # `self.fake = G(x)`, `out[i] = ...`: kept; names are followed
                    return any(
                        find_all(target, cst.Attribute, cst.Subscript)
                        for target in binding_targets(parent)
                    )
                return self._assigned_value_escapes(index, scope, parent, depth, computed)
            if isinstance(parent, (cst.BaseStatement, cst.BaseSmallStatement, cst.BaseSuite)):
                return False
            if isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation)):
                computed = True
            node = parent  # arithmetic, subscripts, tuples, lists: the value goes on

    def _argument_escapes(self, call: cst.Call, within=False) -> Optional[bool]:
        """True: the call keeps or converts the value; False: it settles it; None: the
        call computes a new tensor from it (a torch op) and the walk goes on. `within` the
        block, only a container's or `torch.save` keeps it: another call is a forward."""
        facts = self.facts
        qualified = facts.qualified_name(call.func) or ""
        if qualified == "torch.save":
            return True
        if qualified.startswith("torch."):
            return None
        method = method_name(call)
        if within:
            return method in KEEPING_METHODS
        if method is not None:
            if method == "scale":  # `scaler.scale(loss).backward()`
                return False
            return True  # `history.append(x)`, `metric.update(x)`, `writer.add_histogram`
        name = dotted_name(call.func)
        if name in SETTLING_BUILTINS and not facts.imports.is_bound(name):
            return False
        return True  # metric functions, numpy, anything that is not torch's

    def _assigned_value_escapes(self, index, scope, assign, depth: int, computed: bool) -> bool:
        targets = binding_targets(assign)
        if any(not isinstance(t, cst.Name) for t in targets):
            return True  # stored in an attribute or subscript, or unpacked
        if depth >= MAX_DEPTH:
            return True
        start = index.order[assign]
        for target in targets:
            key = (assign, target.value, computed)
            if key not in self._name_escapes:
                self._name_escapes[key] = False  # a cycle adds nothing
                reads = self._reads_after(index, target.value, start, set())
                self._name_escapes[key] = any(
                    self._use_escapes(index, scope, read, depth + 1, computed) for read in reads
                )
            if self._name_escapes[key]:
                return True
        return False


def _bound_values(statement: cst.CSTNode) -> List[Tuple[str, Optional[cst.BaseExpression]]]:
    """(name, the value it gets) for each name `statement` binds: elementwise for `a, b =
    x, y`, the whole value for each name of `out, h = rnn(x, h)`, the iterable for a `for`
    target; None where the value is unknown (`with ... as name`)."""
    pairs: List[Tuple[str, Optional[cst.BaseExpression]]] = []
    for node in find_all(statement, cst.Assign, cst.AnnAssign, cst.AugAssign, cst.For):
        if isinstance(node, cst.For):
            value = node.iter
        else:
            value = node.value
            if value is None:  # `x: Tensor`, an annotation alone
                continue
        for target in binding_targets(node):
            pairs.extend(_paired(target, value))
    for node in find_all(statement, cst.NamedExpr):
        pairs.extend(_paired(node.target, node.value))
    for node in find_all(statement, cst.WithItem):
        if node.asname is not None:
            pairs.extend((name.value, None) for name in target_name_nodes(node.asname.name))
    return pairs


def _paired(target: cst.BaseExpression, value: cst.BaseExpression):
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
        targets, values = target.elements, value.elements
        if len(targets) == len(values) and not any(
            isinstance(e, cst.StarredElement) for e in (*targets, *values)
        ):
            return [p for t, v in zip(targets, values) for p in _paired(t.value, v.value)]
    return [(name.value, value) for name in target_name_nodes(target)]


def _root_name(node: cst.BaseExpression) -> Optional[str]:
    while isinstance(node, (cst.Attribute, cst.Subscript, cst.Call)):
        node = node.func if isinstance(node, cst.Call) else node.value
    return node.value if isinstance(node, cst.Name) else None


def _object_path(node: cst.BaseExpression) -> Optional[str]:
    """`batch.x` for `batch.x["paper"].batch_size`: the longest dotted object it reads from."""
    while node is not None:
        path = dotted_name(node)
        if path is not None:
            return path
        node = (
            getattr(node, "value", None)
            if isinstance(node, (cst.Attribute, cst.Subscript))
            else None
        )
    return None


def _stored_by(read: cst.BaseExpression, written: Set[str]) -> bool:
    """`read` (`model.cache`, `outputs["conv"]`) may find what a call stored in one of the
    `written` objects (`batch["paper"].batch_size` finds none after `model(x)`)."""
    path = _object_path(read)
    return path is not None and any(path == p or path.startswith(p + ".") for p in written)

"""OPT802: `torch.backends.cuda.sdp_kernel`, deprecated for `torch.nn.attention.sdpa_kernel`."""

from __future__ import annotations

from typing import List, Tuple, Union

import libcst as cst

from optimizer_codemod.analysis.calls import (
    argument,
    code_of,
    has_double_star,
    has_star_args,
    literal,
    positional,
)
from optimizer_codemod.analysis.imports import CANONICAL, ImportedName
from optimizer_codemod.analysis.references import (
    CALL,
    Reference,
    by_head,
    by_statement,
    find_references,
    import_names,
    without_aliases,
)
from optimizer_codemod.rule import Example, Fix, ImportSpec, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

SDP_KERNEL = "torch.backends.cuda.sdp_kernel"
ATTENTION = "torch.nn.attention"
# The flags in the order of sdp_kernel's parameters, and the backend each one enables. The
# backends are listed in the order sdp_kernel itself builds its list (flash, efficient, math,
# cuDNN), so the rewrite reads like torch's own implementation of the old API.
FLAGS = (
    ("enable_flash", "FLASH_ATTENTION"),
    ("enable_math", "MATH"),
    ("enable_mem_efficient", "EFFICIENT_ATTENTION"),
    ("enable_cudnn", "CUDNN_ATTENTION"),
)
BACKEND_ORDER = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION")
OBJECTS = ("SDPBackend", "sdpa_kernel")


class DeprecatedSdpKernel(Rule):
    """
    What it does:
        Rewrites the deprecated context manager `torch.backends.cuda.sdp_kernel(enable_flash=...,
        enable_math=..., enable_mem_efficient=..., enable_cudnn=...)` to
        `sdpa_kernel([...])` from `torch.nn.attention`, listing the enabled backends, and adds
        `from torch.nn.attention import SDPBackend, sdpa_kernel`.

    Why is it slow:
        It is not: this is a modernization rule. Every call of `sdp_kernel` emits a
        `FutureWarning` ("`torch.backends.cuda.sdp_kernel()` is deprecated. In the future,
        this context manager will be removed. Please see `torch.nn.attention.sdpa_kernel()`
        for the new context manager, with updated signature."), and the rewrite keeps the
        script working once it is removed.

    Example:
        ```python
        with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_mem_efficient=False):
            out = F.scaled_dot_product_attention(q, k, v)
        ```
        becomes
        ```python
        with sdpa_kernel([SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(q, k, v)
        ```

    Fix safety:
        `safe`: since torch 2.3 `sdp_kernel` is itself implemented as `sdpa_kernel` over the
        list of enabled backends, which is what the rewrite writes (every flag defaults to
        True, `enable_cudnn` included). Reported, not rewritten: a flag that is not a literal
        `True`/`False` (the list would depend on run-time values), flags passed through
        `*args`/`**kwargs`, `sdp_kernel` used other than by calling it, and files where
        `SDPBackend` or `sdpa_kernel` already name something else. All flags False becomes
        `sdpa_kernel([])`, which disables every backend just as before (attention inside the
        region raises either way). The rewrite names the two objects through one
        `from torch.nn.attention import ...`, the spelling of torch's documentation: the fully
        qualified form would repeat `torch.nn.attention.` for every backend. Needs
        `target-torch` 2.3 (the first release with `torch.nn.attention`). An `sdp_kernel`
        in the fallback of a feature check (after `if HAS_SDPA_KERNEL: ... return`, in an
        `except ImportError` handler, an old-torch version branch) stays: it runs where
        `torch.nn.attention` is missing (analysis/guards.py).

    Expected gain:
        None in speed: both context managers select the same kernels. The gain is a script
        without a `FutureWarning` at every entry, that keeps running once torch removes
        `torch.backends.cuda.sdp_kernel`. Measured on a 2-core x86_64 CPU with torch
        2.13.0+cpu (2026-11-21): `fixtures/OPT802/fix_math_backend_attribute_form.py` emits 3
        FutureWarnings in its 3 training steps before the rewrite and none after (it runs
        under `-W error::FutureWarning`); `scaled_dot_product_attention` inside the rewritten
        regions (math backend, causal and not) returned the same sums as before.
    """

    code = "OPT802"
    name = "deprecated-sdp-kernel"
    message = "Deprecated `torch.backends.cuda.sdp_kernel` context manager"
    fix_title = "Use `torch.nn.attention.sdpa_kernel` with the enabled backends"
    safety = Safety.SAFE
    min_torch = TorchVersion(2, 3)
    triggers = (r"\bsdp_kernel\b",)
    examples = (
        Example(
            "import torch\n\n"
            "with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_mem_efficient=False):\n"
            "    out = attention(q, k, v)\n",
            "import torch\nfrom torch.nn.attention import SDPBackend, sdpa_kernel\n\n"
            "with sdpa_kernel([SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION]):\n"
            "    out = attention(q, k, v)\n",
        ),
        Example(
            "from torch.backends.cuda import sdp_kernel\n\n"
            "with sdp_kernel(enable_flash=False, enable_mem_efficient=False, enable_cudnn=False):"
            "\n    out = attention(q, k, v)\n",
            "from torch.nn.attention import SDPBackend, sdpa_kernel\n\n"
            "with sdpa_kernel(SDPBackend.MATH):\n    out = attention(q, k, v)\n",
        ),
        Example(
            "import torch\n\nwith torch.backends.cuda.sdp_kernel(enable_math=allow_math):\n"
            "    out = attention(q, k, v)\n"
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        if not self.facts.calls_to(SDP_KERNEL):
            return
        names_free = self._names_free()
        references = find_references(self.facts, (SDP_KERNEL,))
        heads = by_head(references)
        moved = set()
        for statement, bindings in by_statement(self._deprecated_bindings()).items():
            ok = [b for b in bindings if self._movable(b, heads.get(b.bound, ()), names_free)]
            if ok:
                self._move(statement, ok, heads)
                moved.update(b.bound for b in ok)
        for reference in references:
            if reference.qualname != SDP_KERNEL or reference.head in moved:
                continue
            new = self._rewrite(reference, names_free)
            if isinstance(new, str):
                self.report(reference.node, message=f"`{code_of(reference.node)}` {new}")
                continue
            self.report(
                reference.call,
                Fix((Replace(reference.call, new),), self._imports([new])),
                message="`sdp_kernel` is deprecated: use `sdpa_kernel` with the enabled backends",
            )

    def _names_free(self) -> bool:
        """`SDPBackend` and `sdpa_kernel` are unbound here, or bound to torch's objects."""
        imports = self.facts.imports
        return not any(
            imports.is_bound(obj) and imports.target_of(obj) != f"{ATTENTION}.{obj}"
            for obj in OBJECTS
        )

    def _imports(self, calls: List[cst.Call]) -> Tuple[ImportSpec, ...]:
        """What the new calls need imported: SDPBackend only when they name a backend."""
        needed = ["sdpa_kernel"]
        if any(_names_backends(call) for call in calls):
            needed.insert(0, "SDPBackend")
        return tuple(
            ImportSpec(ATTENTION, obj)
            for obj in needed
            if self.facts.imports.name_for_module(f"{ATTENTION}.{obj}") != obj
        )

    def _deprecated_bindings(self) -> List[ImportedName]:
        return [
            b
            for b in self.facts.imports.bindings
            if b.is_from and CANONICAL.get(b.target, b.target) == SDP_KERNEL
        ]

    def _movable(self, binding: ImportedName, uses, names_free: bool) -> bool:
        same_name = [b for b in self.facts.imports.bindings if b.bound == binding.bound]
        return (
            len(same_name) == 1
            and bool(uses)
            and all(not isinstance(self._rewrite(r, names_free), str) for r in uses)
        )

    def _move(self, statement, bindings: List[ImportedName], heads) -> None:
        """One fix: every call rewritten, and the import of sdp_kernel replaced by ours."""
        edits, calls = [], []
        for binding in bindings:
            for reference in heads[binding.bound]:
                calls.append(self._rewrite(reference, True))
                edits.append(Replace(reference.call, calls[-1]))
        imports = self._imports(calls)
        if len(bindings) == len(statement.names):  # the statement imports sdp_kernel only
            needed = [(spec.obj, None) for spec in imports] or [("sdpa_kernel", None)]
            edits.insert(0, Replace(statement, import_names(ATTENTION, needed)))
            imports = ()
        else:
            edits.insert(
                0, Replace(statement, without_aliases(statement, [b.alias for b in bindings]))
            )
        self.report(
            statement,
            Fix(tuple(edits), imports),
            message="`sdp_kernel` is deprecated: import `sdpa_kernel` and `SDPBackend` from "
            "`torch.nn.attention` instead",
        )

    def _rewrite(self, reference: Reference, names_free: bool) -> Union[cst.Call, str]:
        """The sdpa_kernel call replacing one sdp_kernel call, or why there is none."""
        if reference.use != CALL:
            return "is deprecated and used other than by calling it: migrate by hand"
        if not names_free:
            return "is deprecated; `SDPBackend` or `sdpa_kernel` names something else here"
        call = reference.call
        if has_star_args(call) or has_double_star(call):
            return "is deprecated; its flags arrive through */** arguments: list the backends"
        enabled = set()
        for position, (flag, backend) in enumerate(FLAGS):
            arg = argument(call, flag, position)
            value = True if arg is None else literal(arg.value, None)
            if not isinstance(value, bool):
                return f"is deprecated; `{flag}` is not a literal True/False: list the backends"
            if value:
                enabled.add(backend)
        known = {flag for flag, _ in FLAGS}
        if len(positional(call)) > len(FLAGS) or any(
            a.keyword is not None and a.keyword.value not in known for a in call.args
        ):
            return "is deprecated; it has arguments sdp_kernel does not accept"
        members = [
            cst.Element(cst.Attribute(cst.Name("SDPBackend"), cst.Name(backend)))
            for backend in BACKEND_ORDER
            if backend in enabled
        ]
        if len(members) == 1:
            backends: cst.BaseExpression = members[0].value
        else:
            backends = cst.List(
                [
                    m.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                    for m in members[:-1]
                ]
                + members[-1:]
            )
        return cst.Call(func=cst.Name("sdpa_kernel"), args=[cst.Arg(backends)])


def _names_backends(call: cst.Call) -> bool:
    backends = call.args[0].value
    return not (isinstance(backends, cst.List) and not backends.elements)

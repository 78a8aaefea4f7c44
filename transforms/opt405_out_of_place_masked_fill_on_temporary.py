"""OPT405: `masked_fill` copies a temporary that nothing else reads."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from optimizer_codemod.analysis.calls import has_double_star, has_star_args
from optimizer_codemod.analysis.inplace import is_fresh_unsaved
from optimizer_codemod.analysis.nodes import find_all, is_name, single_assignment
from optimizer_codemod.rule import Example, Fix, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion


class OutOfPlaceMaskedFillOnTemporary(Rule):
    """
    What it does:
        Replaces `masked_fill` by `masked_fill_` when the tensor it fills is a temporary:
        the result of `@`, `*`, `/`, `+`, `-` or `torch.matmul`/`bmm`/`einsum`, either
        written inline (`(q @ k.T).masked_fill(mask, value)`) or bound to a name by the
        statement just before and rebound by the fill (`att = q @ k.T * scale` followed by
        `att = att.masked_fill(mask, value)`).

    Why is it slow:
        Out of place, `masked_fill` allocates a second tensor of the same size and copies
        every element, masked or not, into it; the temporary is then thrown away. In place,
        only the masked elements are written. For attention scores (batch x heads x T x T)
        that is one allocation and one full read and write of the largest activation of
        the layer, in the forward pass of every step.

    Example:
        ```python
        att = (q @ k.transpose(-2, -1)) * scale
        att = att.masked_fill(mask == 0, float("-inf"))
        ```
        becomes
        ```python
        att = (q @ k.transpose(-2, -1)) * scale
        att = att.masked_fill_(mask == 0, float("-inf"))
        ```

    Fix safety:
        `behavior`: the values and gradients are the same (the operators above do not keep
        their result for backward, and nothing else reads the temporary), but the in-place
        form does not broadcast the filled tensor to the mask's shape: where the mask has
        more dimensions or larger sizes than the temporary, it raises on the first step
        where the out-of-place call returned a larger tensor. The analysis does not know
        shapes, so the fix is applied only with `--unsafe-fixes`. The same holds under
        `torch.func.vmap` when only the mask is batched. Never rewritten when the
        filled tensor may be read elsewhere (any name other than the adjacent pattern
        above, a view such as `x.view(...)`, a parameter or input), or when it is the
        result of an operation whose backward needs its result (`softmax`, `exp`,
        `sigmoid`, ...), where the in-place write would make backward raise. The written-out
        attention in the fallback branch of a feature check (nanoGPT's `else` of `if
        self.flash:`, a version or `hasattr` check) is the author's compatibility path and
        is left as written (analysis/guards.py).

    Expected gain:
        One allocation and one full copy of the filled tensor per call.
        `benchmarks/rule_gains/opt405.py` (`(q @ k^T).masked_fill(causal, -inf)` against
        `masked_fill_`, scores 2x4x128x128 float32, matmul included; 2-core x86_64, one
        thread, torch 2.13.0+cpu, 2026-11-21) measured x1.06 to x1.07 in four runs (0.20 ms
        against 0.19 ms). With two threads on the shared machine the times jumped by whole
        scheduler ticks and gave no usable figure.
    """

    code = "OPT405"
    name = "out-of-place-masked-fill-on-temporary"
    message = "`masked_fill` copies a temporary that nothing else reads"
    fix_title = "Fill the temporary in place with `masked_fill_`"
    safety = Safety.BEHAVIOR
    min_torch = TorchVersion(1, 0)
    triggers = (r"masked_fill\s*\(",)
    examples = (
        Example(
            'scores = (q @ k.transpose(-2, -1)).masked_fill(mask, float("-inf"))\n',
            'scores = (q @ k.transpose(-2, -1)).masked_fill_(mask, float("-inf"))\n',
        ),
        Example(
            "att = torch.softmax(q @ k.transpose(-2, -1), dim=-1)\n"
            "att = att.masked_fill(mask, 0.0)\n"
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        for site in self.facts.method_calls("masked_fill"):
            call = site.node
            if has_star_args(call) or has_double_star(call) or len(call.args) != 2:
                continue
            receiver = call.func.value
            if is_fresh_unsaved(self.facts, receiver) or self._rebinds_temporary(site):
                fixed = call.with_changes(
                    func=call.func.with_changes(attr=cst.Name("masked_fill_"))
                )
                self.report(call, Fix((Replace(call, fixed),)))

    def _rebinds_temporary(self, site) -> bool:
        """`n = n.masked_fill(...)` right after `n = <temporary>`, reading `n` nowhere else."""
        call = site.node
        receiver = call.func.value
        line = site.site.statement
        if not isinstance(receiver, cst.Name) or not isinstance(line, cst.SimpleStatementLine):
            return False
        small = single_assignment(line, receiver.value)
        if small is None or small.value is not call:
            return False
        if sum(is_name(n, receiver.value) for n in find_all(small.value, cst.Name)) != 1:
            return False
        previous = self._previous_statement(line)
        bound = single_assignment(previous, receiver.value) if previous is not None else None
        return bound is not None and is_fresh_unsaved(self.facts, bound.value)

    def _previous_statement(self, line: cst.SimpleStatementLine) -> Optional[cst.CSTNode]:
        for block in find_all(self.facts.module, cst.Module, cst.IndentedBlock):
            body = list(block.body)
            if line in body:
                index = body.index(line)
                return body[index - 1] if index > 0 else None
        return None

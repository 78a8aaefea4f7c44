"""OPT406: attention written out as matmul, softmax and matmul instead of the fused kernel."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import libcst as cst

from optimizer_codemod.analysis.attention import Attention, find_attentions
from optimizer_codemod.analysis.calls import code_of
from optimizer_codemod.analysis.nodes import (
    find_all,
    without_attached_comments,
    without_comment,
)
from optimizer_codemod.analysis.precision import uses_reduced_precision
from optimizer_codemod.rule import Example, Fix, ImportSpec, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

FUNCTIONAL = "torch.nn.functional"
# OPT302 adds autocast to the training step; compared by code so that rules stay independent.
AUTOCAST_RULE = "OPT302"


class HandWrittenAttention(Rule):
    """
    What it does:
        Replaces attention written by hand, `softmax(q @ k^T * scale [masked], dim=-1)
        [dropout] @ v`, by `F.scaled_dot_product_attention(q, k, v, ...)`. The pattern may
        be one expression or a chain of assignments in one block (nanoGPT's `att = ...`,
        `att = att.masked_fill(...)`, `att = F.softmax(att, dim=-1)`,
        `att = self.attn_dropout(att)`, `y = att @ v`); the folded statements are removed.
        Spellings: `F.softmax`, `torch.softmax`, `.softmax(dim=-1)`; `@` or `torch.matmul`;
        `k.transpose(-2, -1)`, `k.transpose(2, 3)`, `k.mT`; scale by `* s`, `s *` or `/ d`
        (passed as `scale=`, so the scale is the author's). A `masked_fill(mask, -inf)`
        (or `masked_fill_`) with a registered buffer `tril(ones(n, n))` sliced `[..., :T,
        :T]`, or `torch.tril(torch.ones(T, T)) == 0`, becomes `is_causal=True`; any other
        `masked_fill(mask, -inf)` becomes `attn_mask=` the negated mask (`m == 0` becomes
        `m != 0`). An `nn.Dropout` module becomes `dropout_p=self.drop.p if
        self.drop.training else 0.0`; `F.dropout(x, p, training=t)` becomes
        `dropout_p=p if t else 0.0`. Comments that described the written-out code go with
        it: the comment at the end of a replaced line, and the comment block right above a
        removed statement (or above the final one, when its whole value is replaced), such
        as minGPT's `# (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)`. A comment set
        apart by a blank line, and tool directives (`# noqa`, `# fmt: off`), stay.

    Why is it slow:
        Written out, attention materialises the batch x heads x T x T score matrix several
        times (product, scaled copy, masked copy, softmax, dropout) and keeps most of them
        for backward. The fused kernels (FlashAttention, memory-efficient attention on CUDA;
        a blocked flash kernel on CPU) compute the same result block by block in one pass,
        never storing the score matrix, and skip the masked half of a causal product.

    Example:
        ```python
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        ```
        becomes
        ```python
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_dropout.p if self.attn_dropout.training else 0.0, is_causal=True, scale=1.0 / math.sqrt(k.size(-1)))
        ```

    Fix safety:
        `numerics`: the fused kernels sum in another order (CPU float32, forward and
        backward, agree with the written-out form within 1e-5 relative on our fixtures);
        with dropout on the attention weights the fix is `behavior` (applied with
        `--unsafe-fixes`): SDPA draws its random mask differently, so a seeded run drops
        other weights, as channels_last does for OPT407. A row whose keys are all
        masked gives NaN written out and may give zeros fused. `is_causal=True` assumes the
        slice bound `T` is the query and key length, as in self-attention (the buffer is
        sliced by it). Never rewritten when a name of the chain (the attention weights) is
        used anywhere else in the function (returned, stored, logged), unless every such use
        sits under a later `if flag:` on a parameter the function never rebinds
        (`if output_attentions: return y, att`): then the written-out attention stays under
        `if flag:` and SDPA runs in its `else`; or unless the names are only returned, as
        one element of the tuple the function returns (`return out, att`), and every caller
        in the file drops that element (`out, _ = self.attn(x)`, `self.attn(x)[0]`): then
        `None` is returned in its place, so the callers' unpacking still holds
        (analysis/dropped_results.py). The callable must be reachable only by those calls: a
        function called by name, or a module class bound once per instance (`self.attn =
        Attention(...)`) and only called (its module methods such as `.parameters()` aside),
        with no forward hook and no `.forward` named in the file. A file without an
        `if __name__ == "__main__":` guard is a library another file may import, reading what
        it returns: left alone, unless the name is private (`_attend`). Never either when softmax is
        over another axis or has a `dtype`, when anything else is applied between the
        steps (a bias after softmax), when q, k or v are not names (or are attributes of the module: a learned query shared
        by the batch, as in vit-pytorch's PatchMerger, has fewer dimensions than the keys, and
        no fused kernel takes it), or for a mask
        filled with another value than -inf. A mask added to the scores (`att + mask`) is
        reported, not rewritten: a float mask could go to `attn_mask` as it is, a boolean
        one could not, and the analysis cannot tell which. The causal buffer registration
        stays. Needs `target-torch` 2.1 (the `scale` argument). SDPA's `scale` must be a
        Python number: a scale that is not provably one (an `nn.Parameter`, a tensor, a
        buffer, an unannotated parameter of the function; analysis/scalars.py) is reported
        and left written out, never passed as `scale=`. Attention in the fallback branch of
        a feature check (`else` of `if hasattr(F, "scaled_dot_product_attention")`, of
        `if self.flash:` or a version check, code after `if HAS_SDPA: return ...`) is left
        alone: it runs exactly where the fused kernel is missing (analysis/guards.py).

    Expected gain:
        `benchmarks/rule_gains/opt406.py` (forward and backward of nanoGPT's causal
        attention core, batch 8, 6 heads of 64, T=256, float32, written out against
        `scaled_dot_product_attention(..., is_causal=True)`; 2-core x86_64, torch
        2.13.0+cpu, 2026-11-21) measured x1.51, x1.55 and x1.34 in three runs (about 31 ms
        against 21 ms). The memory saved (no T x T score matrices kept for backward) grows
        with T squared.

        On CPU under bfloat16 autocast the fused kernel loses: its backward is the slow part
        (2-core AMD EPYC with AVX-512 BF16, torch 2.13.0+cpu, 2026-11-22; forward and
        backward, B,H,T,D = 64,8,128,64: written out in bf16 34 ms, fused in float32 69 ms,
        fused in bf16 143 ms; 64,4,81,12: 4.8, 9.1 and 35.2 ms). On the sudoku_diffusion
        workload the other rules gave x2.45 and adding this one x1.11; vision_bdh x1.69 and
        x1.30. So with `target-device = "cpu"` the attention is left as written when it will
        run under reduced precision: the file already uses autocast or 16-bit types, or
        OPT302 (which adds autocast) is selected. On CUDA (the default target) the fused
        kernel under bfloat16 is the fastest combination for the usual shapes.

        Where it loses on CUDA: values with fewer heads than the queries (broadcast), which
        both fused kernels refuse, so SDPA runs its math backend; and short sequences with a
        large head dim. vision_bdh's attention (batch 256, 4 heads, T=64, head dim 768, one
        head of values broadcast; NVIDIA H200, torch 2.11.0+cu130, 2026-11-30,
        `benchmarks/results/sdpa-head-broadcast-cuda.md`): written out 1.53 ms forward and
        backward in float32, 1.00 ms in bfloat16; SDPA 2.09 and 2.46 ms; SDPA with the
        values expanded to 4 heads 1.74 and 1.26 ms. Head counts and lengths are not in the
        source, so the rule cannot tell; `# noqa: OPT406` keeps such an attention.
    """

    code = "OPT406"
    name = "hand-written-attention"
    message = "Attention written out by hand materialises the score matrix"
    fix_title = "Use `F.scaled_dot_product_attention`"
    safety = Safety.NUMERICS
    min_torch = TorchVersion(2, 1)
    triggers = (r"softmax\s*\(",)
    # A matrix product: `@` after an operand on its line, `@ ` opening a continuation line
    # (black's split), or a matmul call; a decorator (`@name` at a line start) is not one.
    requires = (r"[\w)\]] *@|\n[ \t]*@[ \t]+[\w(]|\bmatmul\s*\(",)
    examples = (
        Example(
            "import torch.nn.functional as F\n"
            "def attend(q, k, v, scale: float):\n"
            "    return F.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v\n",
            "import torch.nn.functional as F\n"
            "def attend(q, k, v, scale: float):\n"
            "    return F.scaled_dot_product_attention(q, k, v, scale=scale)\n",
        ),
        Example(
            "import torch.nn.functional as F\n"
            "def attend(q, k, v, temperature):\n"
            "    return F.softmax(q @ k.transpose(-2, -1) / temperature, dim=-1) @ v\n"
        ),
        Example(
            "import torch.nn.functional as F\n"
            "def attend(q, k, v):\n"
            "    if hasattr(F, 'scaled_dot_product_attention'):\n"
            "        return F.scaled_dot_product_attention(q, k, v)\n"
            "    return F.softmax(q @ k.transpose(-2, -1), dim=-1) @ v\n"
        ),
        Example(
            "import torch.nn.functional as F\n"
            "def attend(q, k, v, scale):\n"
            "    att = F.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)\n"
            "    return att @ v, att\n"
        ),
        Example(
            "import torch\n"
            "import torch.nn.functional as F\n"
            "def attend(q, k, v, scale):\n"
            "    with torch.autocast('cpu', dtype=torch.bfloat16):\n"
            "        return F.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v\n",
            options=(("target-device", "cpu"),),
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        if self.context.target_torch < self.min_torch:
            return
        if self.context.target_device == "cpu" and self._reduced_precision():
            return
        declined: list = []
        matches = find_attentions(self.facts, declined if self.context.options.why_not else None)
        for node, reason in declined:
            self.decline(node, reason)
        for match in matches:
            if match.additive is not None:
                self.report(
                    match.statement,
                    message="Attention written out by hand with an added mask: pass a float "
                    "mask as `attn_mask` of `F.scaled_dot_product_attention` (a boolean one "
                    "must be turned into a keep-mask)",
                )
                continue
            if not match.scale_is_number:
                self.report(
                    match.statement,
                    message="Attention written out by hand with a scale that is not known to be "
                    f"a Python number (`{match.scale}`): `F.scaled_dot_product_attention` takes "
                    "only a float `scale`; for a tensor or learned scale, multiply `q` by it "
                    "and pass `scale=1.0`",
                )
                continue
            binding = self._functional()
            if binding is None:
                self.decline(
                    match.statement, "`torch.nn.functional` cannot be named here (`F` is taken)"
                )
                continue
            module, imports = binding
            fix = Fix(self._edits(match, module), imports)
            if match.dropout_p is None:
                message = None
                if match.dropped:
                    message = (
                        "Attention written out by hand materialises the score matrix; it "
                        f"returns its probabilities (`{match.dropped[0].value}`), which every "
                        "caller in this file drops: SDPA can run, returning `None` in their place"
                    )
                if match.flag is not None:
                    message = (
                        "Attention written out by hand materialises the score matrix; its "
                        f"probabilities are wanted only when `{match.flag}` is set: SDPA "
                        "can run otherwise"
                    )
                self.report(match.statement, fix, message=message)
                continue
            self.report(
                match.statement,
                fix,
                message="Attention written out by hand, with dropout on its weights: "
                "`F.scaled_dot_product_attention` draws its dropout mask differently, so a "
                "seeded run drops other weights",
                safety=Safety.BEHAVIOR,
            )

    def _reduced_precision(self) -> bool:
        """The attention will run under autocast or 16-bit types: the file already does, or
        OPT302 will add autocast (it runs in this same pass, so ask whether it may apply)."""
        options = self.context.options
        if any(
            rule.code == AUTOCAST_RULE and options.may_apply(rule.code, rule.safety)
            for rule in options.rules
        ):
            return True
        return uses_reduced_precision(self.facts)

    def _functional(self) -> Optional[Tuple[str, Tuple[ImportSpec, ...]]]:
        """The name of torch.nn.functional in the script, and the import it needs."""
        imports = self.facts.imports
        bound = imports.name_for_module(FUNCTIONAL)
        if bound is not None:
            return bound, ()
        if not imports.is_bound("F"):
            return "F", (ImportSpec(FUNCTIONAL, None, "F"),)
        torch = imports.name_for_module("torch")
        return (f"{torch}.nn.functional", ()) if torch is not None else None

    def _edits(self, match: Attention, module: str) -> Tuple[Replace, ...]:
        args = [code_of(match.q).strip(), code_of(match.k).strip(), code_of(match.v).strip()]
        if match.mask is not None:
            args.append(f"attn_mask={match.mask}")
        if match.dropout_p is not None:
            args.append(f"dropout_p={match.dropout_p}")
        if match.causal:
            args.append("is_causal=True")
        args.append(f"scale={match.scale}")
        call = cst.parse_expression(f"{module}.scaled_dot_product_attention({', '.join(args)})")
        # Probabilities every caller drops become `None`: the returned tuple keeps its shape.
        inside = {id(node) for node in find_all(match.statement, cst.Name)}
        returned = [Replace(n, cst.Name("None")) for n in match.dropped if id(n) not in inside]
        replacements = {id(n): cst.Name("None") for n in match.dropped if id(n) in inside}
        replacements[id(match.product)] = call
        statement = match.statement.visit(_Substitute(replacements))
        # A comment at the end of a replaced line describes the code it replaces (the score
        # matrix's shapes): it goes with that code. Comments on lines of their own stay.
        statement = statement.with_changes(trailing_whitespace=without_comment(statement))
        lines = [line for folded in match.chain for line in folded.leading_lines]
        own = match.statement.leading_lines
        if match.flag is None:
            # The comments right above a removed statement (a shape note on `att = q @ k...`,
            # "manual implementation of attention") described the written-out code; so do
            # those above the final one when its whole value is the replaced product.
            lines = [
                line
                for folded in match.chain
                for line in without_attached_comments(folded.leading_lines)
            ]
            if _value(match.statement) is match.product:
                own = without_attached_comments(own)
        if match.flag is not None:
            # `if output_attentions:` keeps the hand-written attention, whose probabilities
            # are read under that flag alone; SDPA runs otherwise.
            kept = [s.with_changes(leading_lines=()) for s in (*match.chain, match.statement)]
            statement = cst.If(
                test=cst.Name(match.flag),
                body=cst.IndentedBlock(body=kept),
                orelse=cst.Else(body=cst.IndentedBlock(body=[statement])),
                leading_lines=[*lines, *match.statement.leading_lines],
            )
        else:
            statement = statement.with_changes(leading_lines=_one_blank_per_run([*lines, *own]))
        edits = [Replace(folded, cst.RemovalSentinel.REMOVE) for folded in match.chain]
        return (*edits, Replace(match.statement, statement), *returned)


def _one_blank_per_run(lines: Sequence[cst.EmptyLine]) -> List[cst.EmptyLine]:
    """The lines above the removed statements and the final one, where a blank line above
    each removed statement would otherwise stack on the final one's (deit's Attention)."""
    kept: List[cst.EmptyLine] = []
    for line in lines:
        blank = line.comment is None
        if blank and kept and kept[-1].comment is None:
            continue
        kept.append(line)
    return kept


def _value(statement: cst.SimpleStatementLine) -> Optional[cst.BaseExpression]:
    """The value a one-statement line assigns or returns (`y = ...`, `return ...`)."""
    small = statement.body[0]
    return small.value if isinstance(small, (cst.Assign, cst.Return, cst.Expr)) else None


class _Substitute(cst.CSTTransformer):
    """Replaces nodes by identity in one pass: a second `deep_replace` would not find nodes
    that the first rebuilt."""

    def __init__(self, replacements: dict) -> None:
        super().__init__()
        self.replacements = replacements

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        return self.replacements.get(id(original_node), updated_node)

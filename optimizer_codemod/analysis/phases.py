"""Sines and cosines of a phase that a matrix product computes: time encodings (TGN's
`TimeEncoder`: `self.lin(t.view(-1, 1)).cos()`), Fourier features (`torch.sin(x @ B)`),
SIREN layers (`torch.sin(w0 * self.linear(x))`), rotary tables built with `torch.einsum`.

Under autocast the product runs in 16 bits, inputs included: a time difference of one day
(86,400 s) is rounded to 512 s in bfloat16 and overflows float16, and a phase in the
thousands of radians is rounded by whole periods, so the sine is noise (a Linear(1, 256)
time encoding's correlation with its float32 self was 0.15 at one hour, 0.01 at one day:
torch 2.13.0+cpu, tests/test_autocast_phase_claims.py). Hugging Face's rotary embeddings
turn autocast off around theirs for this reason ("Force float32 since bfloat16 loses
precision on long contexts", transformers' LlamaRotaryEmbedding)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst

from optimizer_codemod.analysis.autocast_escapes import LOWERED_OPS
from optimizer_codemod.analysis.calls import callee_name, is_literal, keyword
from optimizer_codemod.analysis.graph_libraries import tgn_use
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.precision import AUTOCAST_CALLABLES
from optimizer_codemod.analysis.walk import ancestors

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

_PERIODIC = frozenset({"sin", "cos"})


def phase_of_a_product(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    """The first import or call of the file that names PyG's TGN (graph_libraries.tgn_use),
    else the first `sin`/`cos`
    (torch's function or the tensor method) of a value a matrix product or a module call
    computes, outside a block that turns autocast off; None when none."""
    memo = facts.memo("phase_of_a_product")
    if None not in memo:
        memo[None] = _phase_of_a_product(facts)
    return memo[None]


def _phase_of_a_product(facts: "ScriptFacts") -> Optional[cst.CSTNode]:
    tgn = tgn_use(facts)
    if tgn is not None:
        return tgn
    for call in facts.records.calls:
        node = call.node
        if callee_name(node) not in _PERIODIC:
            continue
        qualname = facts.qualified_name(node.func) or ""
        if qualname in ("torch.sin", "torch.cos") and node.args:
            phase = node.args[0].value
        elif qualname == "" and isinstance(node.func, cst.Attribute):
            phase = node.func.value
        else:
            continue
        if _computed_by_a_product(facts, phase) and not _autocast_turned_off(facts, node):
            return node
    return None


def _computed_by_a_product(facts: "ScriptFacts", phase: cst.BaseExpression) -> bool:
    for node in find_all(phase, cst.BinaryOperation, cst.Call):
        if isinstance(node, cst.BinaryOperation):
            if isinstance(node.operator, cst.MatrixMultiply):
                return True
            continue
        name = dotted_name(node.func) or ""
        if name.startswith("self.") and name.count(".") == 1:
            return True  # `self.lin(t)`: a layer of the model
        if callee_name(node) in LOWERED_OPS:
            return True  # `torch.einsum(...)`, `F.linear(...)`, `x.matmul(w)`
    return False


def _autocast_turned_off(facts: "ScriptFacts", node: cst.CSTNode) -> bool:
    """`node` runs in a `with torch.autocast(..., enabled=False):` block."""
    return any(
        isinstance(ancestor, cst.With)
        and any(_turns_autocast_off(facts, item.item) for item in ancestor.items)
        for ancestor in ancestors(facts.parents, node)
    )


def _turns_autocast_off(facts: "ScriptFacts", entered: cst.BaseExpression) -> bool:
    if not isinstance(entered, cst.Call):
        return False
    enabled = keyword(entered, "enabled")
    return (
        facts.qualified_name(entered.func) in AUTOCAST_CALLABLES
        and enabled is not None
        and is_literal(enabled.value, False)
    )

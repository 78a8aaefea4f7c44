"""analysis/guards.py: code that runs when a feature is missing is never rewritten into it;
analysis/scalars.py: what is provably a Python number."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.scalars import is_python_number
from optimizer_codemod.analysis.script import ScriptFacts


def marked(source: str):
    """{text of each `x = "..."` marker statement: whether it is in a fallback}."""
    facts = ScriptFacts.of(cst.parse_module(textwrap.dedent(source)))
    found = {}
    for line in find_all(facts.module, cst.SimpleStatementLine):
        small = line.body[0]
        if isinstance(small, cst.Assign) and isinstance(small.value, cst.SimpleString):
            found[small.value.evaluated_value] = facts.feature_guards.in_fallback(line)
    return found


@pytest.mark.parametrize(
    "test, body, orelse",
    [
        ('hasattr(F, "scaled_dot_product_attention")', False, True),
        ('not hasattr(torch, "compile")', True, False),
        ('hasattr(F, "scaled_dot_product_attention") and x', False, True),
        ('hasattr(F, "scaled_dot_product_attention") or x', True, True),
        ('getattr(F, "scaled_dot_product_attention", None) is not None', False, True),
        ('getattr(F, "scaled_dot_product_attention", None) is None', True, False),
        ('version.parse(torch.__version__) >= version.parse("2.0")', False, True),
        ('version.parse(torch.__version__) < version.parse("2.0")', True, False),
        ('"2.0" <= torch.__version__', False, True),
        ("sys.version_info >= (3, 8)", False, True),
        ('torch.__version__.startswith("2")', True, True),
        ('is_torch_version(">=", "2.3")', False, True),
        ('is_torch_version("<", "2.3")', True, False),
        ("_TORCH_GREATER_EQUAL_2_4", False, True),
        ("_TORCH_LESS_THAN_2_0", True, False),
        ("HAS_FUSED", False, True),
        ("_APEX_AVAILABLE", False, True),
        ("self.fused_attn", False, True),
        ("not self.flash", True, False),
        ("use_fused_attn()", False, True),
        ('"fused" in inspect.signature(torch.optim.AdamW).parameters', False, True),
        # Not feature checks: devices, user objects, configuration.
        ("torch.cuda.is_available()", False, False),
        ('hasattr(model, "module")', False, False),
        ("args.use_amp", False, False),
        ('device == "cuda"', False, False),
    ],
)
def test_branches_of_a_check(test: str, body: bool, orelse: bool) -> None:
    found = marked(f"""
        import sys, inspect
        import torch
        import torch.nn.functional as F
        from packaging import version
        if {test}:
            a = "body"
        else:
            b = "orelse"
        c = "after"
        """)
    assert found == {"body": body, "orelse": orelse, "after": False}


def test_flags_derived_from_checks_and_try_imports() -> None:
    found = marked("""
        import torch
        try:
            from flash_attn import flash_attn_func
            ok = True
        except ImportError:
            ok = False
            h = "handler"
        sdpa_ok = hasattr(torch.nn.functional, "scaled_dot_product_attention")
        fast = sdpa_ok and torch.cuda.is_available()
        if ok:
            a = "try flag body"
        else:
            b = "try flag orelse"
        if not fast:
            c = "derived negated body"
        try:
            import numpy
        except KeyboardInterrupt:
            d = "other handler"
        """)
    assert found == {
        "handler": True,
        "try flag body": False,
        "try flag orelse": True,
        "derived negated body": True,
        "other handler": False,
    }


def test_conditional_expression_branch() -> None:
    facts = ScriptFacts.of(
        cst.parse_module(
            "import torch\n"
            "ctx = torch.inference_mode if hasattr(torch, 'inference_mode') else torch.no_grad\n"
        )
    )
    ifexp = find_all(facts.module, cst.IfExp)[0]
    assert not facts.feature_guards.in_fallback(ifexp.body)
    assert facts.feature_guards.in_fallback(ifexp.orelse)


def test_statements_after_an_exiting_feature_branch() -> None:
    found = marked("""
        import torch
        def attend(q, k, v):
            if self.flash:
                with torch.no_grad():
                    return F.scaled_dot_product_attention(q, k, v)
            a = "after return"
            return a
        def other(x):
            if self.flash:
                y = "no exit"
            b = "after no exit"
        """)
    assert found == {"after return": True, "no exit": False, "after no exit": False}


def test_statements_after_a_raising_requirement_are_no_fallback() -> None:
    # As in torchvision's references/classification/train.py, whose main() follows one.
    found = marked("""
        import torch
        try:
            import apex
        except ImportError:
            apex = None
        def main(args):
            if args.apex and apex is None:
                raise RuntimeError("Failed to import apex.")
            a = "after raise"
            if args.apex and apex is None:
                raise RuntimeError("again")
            else:
                b = "else of raise"
        """)
    assert found == {"after raise": False, "else of raise": False}


def test_nested_fallbacks_are_marked_once() -> None:
    source = "import torch\n" + "".join(
        "    " * i + f"if not hasattr(torch, 'f{i}'):\n" for i in range(30)
    )
    source += "    " * 30 + 'x = "deep"\n'
    assert marked(source) == {"deep": True}


SCRIPT = """
import math
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim, heads, qk_scale=None):
        super().__init__()
        self.scale = qk_scale or (dim // heads) ** -0.5
        self.inv = 1.0 / math.sqrt(dim)
        self.temperature = nn.Parameter(torch.ones(heads, 1, 1))
        self.register_buffer("buffer_scale", torch.tensor(0.125))

    def forward(self, q, k, v, tau, gamma: float, beta=0.5):
        B, T, C = q.shape
        d = k.size(-1)
        t = q.shape[-1]
        return [
            self.scale, self.inv, d ** -0.5, 1 / math.sqrt(t), C // 2, float(tau), gamma, beta,
            self.temperature, self.buffer_scale, tau, q.norm(), self.missing, torch.tensor(2.0),
        ]
"""


def test_python_numbers() -> None:
    facts = ScriptFacts.of(cst.parse_module(SCRIPT))
    klass = find_all(facts.module, cst.ClassDef)[0]
    forward = [f for f in find_all(klass, cst.FunctionDef) if f.name.value == "forward"][0]
    returned = find_all(forward, cst.List)[0]
    verdicts = [
        is_python_number(facts, element.value, forward, klass) for element in returned.elements
    ]
    assert verdicts == [True] * 8 + [False] * 6


def test_sdpa_scale_must_be_a_number() -> None:
    source = (
        "import torch.nn.functional as F\n"
        "def attend(q, k, v, temperature):\n"
        "    return F.softmax(q @ k.transpose(-2, -1) / temperature, dim=-1) @ v\n"
    )
    result = rewrite(source, path="a.py", select=["OPT406"])
    assert result.source == source
    assert [d.code for d in result.diagnostics] == ["OPT406"]
    annotated = source.replace("temperature)", "temperature: float)", 1)
    fixed = rewrite(annotated, path="a.py", select=["OPT406"]).source
    assert "scale=1.0 / temperature" in fixed


def test_hardware_checks_are_no_feature_checks() -> None:
    found = marked("""
        import torch
        supports_bf16 = torch.cuda.is_bf16_supported()
        if supports_bf16:
            a = "bf16"
        else:
            b = "fp16 on an older GPU, new torch all the same"
        """)
    assert found == {"bf16": False, "fp16 on an older GPU, new torch all the same": False}

"""The engine's promises (DESIGN.md §4), proven with real and deliberately broken rules."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from optimizer_codemod.analysis.calls import with_keyword
from optimizer_codemod.diagnostics import Status
from optimizer_codemod.engine import MAX_PASSES, RewriteOptions, rewrite_bytes
from optimizer_codemod.errors import (
    NonConvergenceError,
    RuleBrokeOutputError,
    SourceParseError,
    UnreproducibleSourceError,
)
from optimizer_codemod.fixes import choose_compatible
from optimizer_codemod.registry import rule_by_code
from optimizer_codemod.rule import Finding, Fix, InsertStatements, Replace, Rule, Safety

FUSED = rule_by_code("OPT501")
FIXTURE_DATA = Path(__file__).parent / "data"


class _TestRule(Rule):
    abstract = True
    name = "test-rule"
    message = "test finding"
    fix_title = "test fix"
    safety = Safety.SAFE
    triggers = (r".",)


class ReturnAtModuleLevel(_TestRule):
    """Replaces the first module-level statement by `return 1`: parses, does not compile."""

    code = "OPT991"

    def visit_Module(self, node: cst.Module) -> None:
        first = node.body[0]
        self.report(first, Fix((Replace(first, cst.parse_statement("return 1\n")),)))


class CrashingRule(_TestRule):
    code = "OPT992"

    def visit_Call(self, node: cst.Call) -> None:
        raise ValueError("boom")


class SwapNames(_TestRule):
    """Renames `a` to `b` and `b` to `a`: the file cycles between two texts."""

    code = "OPT993"

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in ("a", "b"):
            other = "b" if node.value == "a" else "a"
            self.report(node, Fix((Replace(node, cst.Name(other)),)))


class CountUp(_TestRule):
    """Increments every integer literal: never converges."""

    code = "OPT994"

    def visit_Integer(self, node: cst.Integer) -> None:
        self.report(node, Fix((Replace(node, cst.Integer(str(int(node.value) + 1))),)))


class InsertAfterImports(_TestRule):
    """Inserts one statement after the import block and one inside each function body."""

    code = "OPT995"

    def visit_Module(self, node: cst.Module) -> None:
        anchor = self.facts.top_level_import_anchor
        if anchor is not None and "inserted" not in node.code:
            new = cst.parse_statement("inserted = True\n")
            self.report(anchor, Fix((InsertStatements(anchor, after=(new,)),)))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        first = node.body.body[0]
        if "inner_inserted" not in cst.Module(body=[]).code_for_node(node):
            new = cst.parse_statement("inner_inserted = 1\n")
            self.report(first, Fix((InsertStatements(first, before=(new,)),)))


class BehaviorKeyword(_TestRule):
    code = "OPT996"
    safety = Safety.BEHAVIOR

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value == "f" and not node.args:
            self.report(node, Fix((Replace(node, with_keyword(node, "x", cst.Integer("1"))),)))


def rewrite(src: bytes, *rules: type, **options) -> bytes:
    return rewrite_bytes(src, "t.py", RewriteOptions(rules=rules, **options)).code


def test_rule_that_breaks_the_output_is_named_and_nothing_changes() -> None:
    with pytest.raises(RuleBrokeOutputError) as error:
        rewrite(b"x = 1\ny = 2\n", ReturnAtModuleLevel)
    assert error.value.codes == ("OPT991",)
    assert "OPT991" in str(error.value) and "reverted" in str(error.value)


def test_only_the_rule_that_broke_the_output_is_blamed() -> None:
    src = b"import torch\nopt = torch.optim.Adam(p)\n"
    with pytest.raises(RuleBrokeOutputError) as error:
        rewrite(src, FUSED, ReturnAtModuleLevel)
    assert error.value.codes == ("OPT991",)


def test_output_that_lost_statements_is_refused(monkeypatch) -> None:
    # The fault fixed in positions._pop_trailing_newline dropped whole statements from the
    # printed text, which still parsed and compiled: the engine refuses such output itself.
    from optimizer_codemod import positions

    monkeypatch.setattr(positions, "_pop_trailing_newline", lambda state: state.tokens.pop())
    with pytest.raises(RuleBrokeOutputError, match="2 top-level statements where"):
        rewrite(b"import torch\nopt = torch.optim.Adam(p)\ny = 1", FUSED)


def test_rule_that_crashes_is_named() -> None:
    with pytest.raises(RuleBrokeOutputError) as error:
        rewrite(b"f(1)\n", CrashingRule)
    assert "OPT992" in str(error.value) and "boom" in str(error.value)


def test_rules_that_cycle_are_reported_not_looped() -> None:
    with pytest.raises(NonConvergenceError) as error:
        rewrite(b"a = 1\n", SwapNames)
    assert error.value.codes == ("OPT993",)


def test_rules_that_never_converge_stop_after_the_bound() -> None:
    with pytest.raises(NonConvergenceError) as error:
        rewrite(b"x = 1\n", CountUp)
    assert error.value.codes == ("OPT994",)
    assert str(MAX_PASSES) in str(error.value)


def test_fixpoint_reports_each_fix_once_at_original_lines() -> None:
    src = b"import torch\n\n\nopt = torch.optim.SGD(p, lr=1)\n"
    result = rewrite_bytes(src, "t.py", RewriteOptions(rules=(FUSED,)))
    assert [(d.code, d.line, d.status) for d in result.diagnostics] == [("OPT501", 4, Status.FIXED)]
    assert rewrite(result.code, FUSED) == result.code


def test_inserted_lines_follow_the_files_newline_and_indentation() -> None:
    src = b"import os\r\n\r\ndef f():\r\n\tx = 1\r\n\treturn x\r\n"
    out = rewrite(src, InsertAfterImports)
    assert out == (
        b"import os\r\ninserted = True\r\n\r\ndef f():\r\n\tinner_inserted = 1\r\n"
        b"\tx = 1\r\n\treturn x\r\n"
    )


@pytest.mark.parametrize(
    "src",
    [
        "# -*- coding: latin-1 -*-\nimport torch\nname = 'caf\xe9'\nopt = torch.optim.Adam(p)\n".encode(
            "latin-1"
        ),
        b"\xef\xbb\xbfimport torch\r\nopt = torch.optim.Adam(p)\r\n",
        b"import torch\nopt = torch.optim.Adam(p)",  # no final newline
    ],
    ids=["latin-1 cookie", "BOM and CRLF", "no final newline"],
)
def test_encoding_bom_and_newlines_are_kept(src: bytes) -> None:
    out = rewrite(src, FUSED)
    assert out == src.replace(b"Adam(p)", b"Adam(p, fused=True)")


def test_a_file_libcst_cannot_reproduce_is_refused() -> None:
    src = (FIXTURE_DATA / "libcst_drops_comment.py").read_bytes()
    assert cst.parse_module(src).bytes != src  # the LibCST 1.9 bug this case documents
    with pytest.raises(UnreproducibleSourceError) as error:
        rewrite(src, FUSED)
    assert "byte for byte" in str(error.value)


def test_an_unreproducible_file_without_fixes_is_not_an_error() -> None:
    src = b"x = 1\n  # indented comment\n \n"
    assert rewrite(src, FUSED) == src


@pytest.mark.parametrize(
    "src, line, column, words",
    [
        (b"import torch\ndef f(:\n    pass\n", 2, 7, "invalid syntax"),
        (b"import torch\nx = (1,\n", 2, 5, "never closed"),
        (b"import torch\nx = 'caf\xe9'\n", 2, 9, "cannot decode as utf-8: byte 0xe9"),
    ],
    ids=["syntax", "unclosed", "non-utf8"],
)
def test_bad_source_names_line_and_column(src: bytes, line: int, column: int, words: str) -> None:
    with pytest.raises(SourceParseError) as error:
        rewrite(src, FUSED)
    assert (error.value.line, error.value.column) == (line, column)
    assert words in error.value.message
    assert str(error.value).startswith(f"t.py:{line}:{column}: ")


def test_behaviour_fixes_need_the_unsafe_flag_or_config() -> None:
    src = b"f()\n"
    safe_only = rewrite_bytes(src, "t.py", RewriteOptions(rules=(BehaviorKeyword,)))
    assert safe_only.code == src
    assert [d.status for d in safe_only.diagnostics] == [Status.UNSAFE]
    assert rewrite(src, BehaviorKeyword, unsafe_fixes=True) == b"f(x=1)\n"
    assert rewrite(src, BehaviorKeyword, extend_safe_fixes=("OPT99",)) == b"f(x=1)\n"


def test_extend_unsafe_fixes_demotes_numerics_fixes() -> None:
    src = b"import torch\nopt = torch.optim.Adam(p)\n"
    assert rewrite(src, FUSED, extend_unsafe_fixes=("OPT5",)) == src
    assert rewrite(src, FUSED, extend_unsafe_fixes=("OPT5",), unsafe_fixes=True) != src


def test_noqa_suppresses_only_the_named_codes() -> None:
    src = (
        b"import torch\n"
        b"a = torch.optim.Adam(p)  # noqa: OPT501\n"
        b"b = torch.optim.Adam(p)  # noqa\n"
        b"c = torch.optim.Adam(p)  # noqa: OPT201\n"
        b"d = torch.optim.Adam(p, note='# noqa')\n"
    )
    out = rewrite(src, FUSED).splitlines()
    assert out[1].endswith(b"Adam(p)  # noqa: OPT501")
    assert out[2].endswith(b"Adam(p)  # noqa")
    assert b"fused=True" in out[3] and b"fused=True" in out[4]


class ReportsACopy(_TestRule):
    code = "OPT997"

    def visit_Call(self, node: cst.Call) -> None:
        copy = node.deep_clone()
        self.report(copy, Fix((Replace(copy, copy),)))


def test_rule_that_reports_a_node_outside_the_tree_is_named() -> None:
    with pytest.raises(RuleBrokeOutputError) as error:
        rewrite(b"f(1)\n", ReportsACopy)
    assert error.value.codes == ("OPT997",)


class AttributeVisitor(_TestRule):
    """Reports each call's callee through an attribute visitor; has a property that must not be
    read by the engine (LibCST's own method discovery reads every attribute)."""

    code = "OPT998"

    @property
    def expensive(self) -> None:
        raise AssertionError("the engine read a rule property")

    def visit_Call_func(self, node: cst.Call) -> None:
        self.report(node.func)

    def leave_Call_args(self, node: cst.Call) -> None:
        self.report(node)


def test_rules_visit_once_per_node_without_reading_their_properties(monkeypatch) -> None:
    from optimizer_codemod.analysis import ScriptFacts

    def no_facts(module):
        raise AssertionError("facts computed although no rule asked for them")

    monkeypatch.setattr(ScriptFacts, "of", no_facts)
    result = rewrite_bytes(b"f(g(1))\n", "t.py", RewriteOptions(rules=(AttributeVisitor,)))
    assert [(d.column, d.end_column) for d in result.diagnostics] == [
        (1, 2),
        (3, 4),
        (3, 7),
        (1, 8),
    ]


@pytest.mark.parametrize(
    "header", [b"", b"\xef\xbb\xbf", b"# -*- coding: latin-1 -*-\nname = '\xe9'\n"]
)
def test_noqa_is_read_from_the_source_text_in_any_encoding(header: bytes) -> None:
    src = (
        header + b"import torch\na = torch.optim.Adam(p)  # noqa: OPT501\nb = torch.optim.Adam(p)\n"
    )
    out = rewrite(src, FUSED)
    assert out.startswith(header)
    assert out.splitlines()[-2].endswith(b"Adam(p)  # noqa: OPT501")
    assert out.splitlines()[-1].endswith(b"fused=True)")


def test_prefilter_needs_a_trigger_and_every_required_pattern() -> None:
    from optimizer_codemod.engine import may_contain_findings
    from optimizer_codemod.registry import rule_by_code

    cudnn = rule_by_code("OPT401")
    library = b"import torch.nn as nn\nlayer = nn.Conv2d(3, 8, 3)\n"
    training = library + b"loss = layer(x).sum()\nloss.backward()\n"
    assert not may_contain_findings(library, [cudnn])  # a conv, but nothing trains here
    assert may_contain_findings(training, [cudnn])
    assert not may_contain_findings(b"loss.backward()\n", [cudnn])  # no convolution


@pytest.mark.parametrize(
    "text",
    [
        b"loss.backward()\n",
        b"(model(x)\n .sum()\n .backward())\n",
        b"torch.autograd.backward([loss])\n",
        b"from torch.autograd import backward\nbackward(loss)\n",
        b"from torch.autograd import (\n    grad,\n    backward as bw,\n)\nbw(loss)\n",
        b"from torch.autograd import *\nbackward(loss)\n",
    ],
)
def test_every_spelling_of_a_backward_call_passes_the_training_prefilter(text: bytes) -> None:
    from optimizer_codemod.engine import may_contain_findings
    from optimizer_codemod.registry import rule_by_code

    assert may_contain_findings(b"import torch\n" + text, [rule_by_code("OPT301")])


def test_autograd_functions_alone_do_not_pass_the_training_prefilter() -> None:
    from optimizer_codemod.engine import may_contain_findings
    from optimizer_codemod.registry import rule_by_code

    function = (
        b"class Square(torch.autograd.Function):\n    def backward(ctx, g):\n        return g\n"
    )
    assert not may_contain_findings(function, [rule_by_code("OPT301")])


@pytest.mark.parametrize(
    "text, passes",
    [
        (b"att = F.softmax(s, dim=-1)\ny = att @ v\n", True),
        (b"att = s.softmax(dim=-1)\ny = (\n    att\n    @ v\n)\n", True),  # black's split
        (b"att = torch.softmax(s, -1)\ny = torch.matmul(att, v)\n", True),
        (b"@torch.no_grad()\ndef f(x):\n    return F.softmax(x, dim=-1)\n", False),  # decorator
    ],
)
def test_attention_prefilter_tells_matrix_products_from_decorators(text, passes) -> None:
    from optimizer_codemod.engine import may_contain_findings
    from optimizer_codemod.registry import rule_by_code

    assert may_contain_findings(text, [rule_by_code("OPT406")]) is passes


class UnprintableEnding(_TestRule):
    """Ends the module with an indented comment before a whitespace-only line: the output
    compiles and parses, but LibCST 1.9 prints it back without the comment."""

    code = "OPT989"

    def visit_Module(self, node: cst.Module) -> None:
        if node.footer:
            return
        footer = (
            cst.EmptyLine(
                indent=False, whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment("# c")
            ),
            cst.EmptyLine(indent=False, whitespace=cst.SimpleWhitespace(" ")),
        )
        self.report(node, Fix((Replace(node, node.with_changes(footer=footer)),)))


@pytest.mark.parametrize("others", [(), (FUSED,)], ids=["alone", "with a rule that reports"])
def test_output_libcst_cannot_print_back_is_blamed_on_its_rule(others) -> None:
    # The round trip of a pass's output is checked on the next pass's printed text: the
    # error must still name the rule and revert everything.
    src = b"import torch\nopt = torch.optim.Adam(p)\nx = 1\n"
    with pytest.raises(RuleBrokeOutputError) as error:
        rewrite(src, UnprintableEnding, *others)
    assert error.value.codes == ("OPT989",)
    assert "byte for byte" in str(error.value) and "reverted" in str(error.value)


def test_the_same_edit_from_two_findings_is_made_once_and_both_are_fixed() -> None:
    # Two loaders sharing one options dict: each finding carries the one entry added to it.
    wrapper = MetadataWrapper(cst.parse_module("kwargs = {'a': 1}\nf(**kwargs)\ng(**kwargs)\n"))
    module = wrapper.module
    positions = wrapper.resolve(PositionProvider)
    target = module.body[0].body[0].value
    calls = [module.body[1].body[0].value, module.body[2].body[0].value]

    def finding(call, new_text):
        fix = Fix((Replace(target, cst.parse_expression(new_text)),))
        return Finding(Rule, call, "m", Safety.SAFE, fix, "t")

    same = [finding(c, "{'a': 1, 'b': 2}") for c in calls]
    assert choose_compatible(same, positions) == same
    different = [finding(calls[0], "{'a': 1, 'b': 2}"), finding(calls[1], "{'a': 2}")]
    assert choose_compatible(different, positions) == different[:1]


def test_chosen_replacements_are_searched_as_a_scan_would_find_them() -> None:
    """The sorted search for overlaps answers as the scan over every chosen span did,
    including empty spans and spans that touch."""
    import random

    from optimizer_codemod.fixes import _DisjointSpans

    def overlap(a, b) -> bool:
        return not (a[1] <= b[0] or b[1] <= a[0])

    rng = random.Random(7)
    for _ in range(200):
        chosen = _DisjointSpans()
        kept = []
        for _ in range(30):
            start = (rng.randint(1, 6), rng.randint(0, 4))
            end = max(start, (rng.randint(1, 6), rng.randint(0, 4)))
            expected = any(overlap((start, end), k) for k in kept)
            assert chosen.overlaps((start, end)) == expected
            if not expected:
                chosen.add((start, end))
                kept.append((start, end))

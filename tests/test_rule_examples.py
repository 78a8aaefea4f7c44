"""Every rule's own examples (Fixit's habit): rewritten exactly, or left unchanged."""

from __future__ import annotations

import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.registry import all_rules

CASES = [
    pytest.param(rule, example, id=f"{rule.code}-{number}")
    for rule in all_rules()
    for number, example in enumerate(rule.examples, 1)
]


@pytest.mark.parametrize("rule, example", CASES)
def test_rule_example(rule, example) -> None:
    options = dict(example.options)
    result = rewrite(
        example.before,
        path=options.get("path", "example.py"),
        select=[rule.code],
        unsafe_fixes=True,
        target_torch=options.get("target-torch"),
        precision=options.get("precision"),
        target_device=options.get("target-device"),
    )
    if example.changes:
        assert result.source == example.after
    else:
        assert result.source == example.before
        assert not [
            d for d in result.diagnostics if d.code == rule.code and d.status.value == "fixed"
        ]

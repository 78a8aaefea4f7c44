"""OPT605 leaves DDP alone where NVIDIA Apex's amp manages the gradients (SwAV): Apex sets each
`.grad` to None before every backward and, with master weights, detaches each in place in its
`zero_grad`, which raises on a bucket view. The same script without Apex gets the option."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer_codemod import rewrite

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "OPT605"
SCRIPT = (FIXTURE / "keep_apex_amp_manages_gradients.py").read_text()
WITHOUT_APEX = (
    SCRIPT.replace("import apex\n", "")
    .replace('model, optimizer = apex.amp.initialize(model, optimizer, opt_level="O1")\n', "")
    .replace(
        "    with apex.amp.scale_loss(loss, optimizer) as scaled_loss:\n"
        "        scaled_loss.backward()\n",
        "    loss.backward()\n",
    )
)


def _opt605(source: str):
    result = rewrite(source, path="train.py", select=["OPT605"], unsafe_fixes=True, why_not=True)
    return result, [d for d in result.diagnostics if d.code == "OPT605"]


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_ddp_under_apex_amp_is_declined_with_the_reason(level: str) -> None:
    result, [finding] = _opt605(SCRIPT.replace('"O1"', f'"{level}"'))
    assert "gradient_as_bucket_view" not in result.source
    assert finding.status.value == "declined"
    assert "Apex's amp (`apex.amp.initialize(" in finding.message
    assert "`detach_()`" in finding.message


def test_amp_imported_from_apex_counts_too() -> None:
    source = SCRIPT.replace("import apex\n", "from apex import amp\n").replace("apex.amp.", "amp.")
    result, [finding] = _opt605(source)
    assert finding.status.value == "declined" and "`amp.initialize(" in finding.message


def test_the_same_script_without_apex_gets_the_option() -> None:
    assert "apex" not in WITHOUT_APEX
    result, [finding] = _opt605(WITHOUT_APEX)
    assert finding.status.value == "fixed"
    assert "gradient_as_bucket_view=True" in result.source

"""Issue 12: fixes that would silently change a script, or gain nothing, and what they do now."""

from __future__ import annotations


import pytest

from fixture_cases import FIXTURES, Fixture, run_fixture
from optimizer_codemod.diagnostics import Status
from optimizer_codemod.rule import Safety


def _own(code: str, name: str):
    fixture = Fixture(code, FIXTURES / code / name)
    return [d for d in run_fixture(fixture).diagnostics if d.code == code]


# Item 3: channels_last changes which elements a seeded dropout drops ----------------------
def test_seeded_dropout_drops_other_elements_in_channels_last() -> None:
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = torch.randn(4, 8, 6, 6)
    channels_last = x.contiguous(memory_format=torch.channels_last)
    torch.manual_seed(0)
    a = F.dropout(x, 0.5)
    torch.manual_seed(0)
    b = F.dropout(channels_last, 0.5)
    assert not torch.equal(a, b)  # element-wise: behaviour, not last bits
    module = torch.nn.Dropout(0.5)
    torch.manual_seed(0)
    a = module(x)
    torch.manual_seed(0)
    assert not torch.equal(a, module(channels_last))
    # Channel-wise dropout draws one value per (sample, channel) whatever the layout.
    torch.manual_seed(0)
    a = F.dropout2d(x, 0.5)
    torch.manual_seed(0)
    assert torch.equal(a, F.dropout2d(channels_last, 0.5))


@pytest.mark.parametrize(
    "name, safety, status",
    [
        ("report_dropout_needs_unsafe_fixes.py", Safety.BEHAVIOR, Status.UNSAFE),
        ("report_torchvision_squeezenet_dropout.py", Safety.BEHAVIOR, Status.UNSAFE),
        ("fix_functional_dropout_with_unsafe_fixes.py", Safety.BEHAVIOR, Status.FIXED),
        ("fix_channelwise_dropout_stays_numerics.py", Safety.NUMERICS, Status.FIXED),
        ("fix_resnet_like.py", Safety.NUMERICS, Status.FIXED),
    ],
)
def test_channels_last_is_behavior_for_a_model_with_dropout(
    name: str, safety: Safety, status: Status
) -> None:
    [diagnostic] = _own("OPT407", name)
    assert (diagnostic.safety, diagnostic.status) == (safety, status)
    assert ("dropout" in diagnostic.message) is (safety is Safety.BEHAVIOR)


# Item 5: a fix that leaves the step synchronising gains nothing --------------------------
@pytest.mark.parametrize(
    "name, why",
    [
        (
            "report_another_item_in_the_same_step.py",
            "`(out.argmax(1) == y).sum().item()` still waits for the device on every step",
        ),
        (
            "report_loss_also_printed_every_step.py",
            "`loss.item()` still waits for the device on every step",
        ),
        ("report_accumulator_never_read.py", "`epoch_loss` is never read"),
    ],
)
def test_a_loss_item_fix_that_gains_nothing_is_reported_not_applied(name: str, why: str) -> None:
    findings = _own("OPT202", name)
    accumulation = next(d for d in findings if "not rewritten because" in d.message)
    assert why in accumulation.message
    assert accumulation.safety is Safety.SUGGEST  # neither applied nor counted as a fix
    assert all(d.status is not Status.FIXED for d in findings)

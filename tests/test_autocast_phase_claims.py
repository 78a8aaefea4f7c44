"""The precision claim OPT302 declines on (analysis/phases.py), run on the installed torch:
under autocast a Linear computes its phase in 16 bits, inputs included, and the cosine of a
phase in the thousands of radians is noise, while one of a few radians is only rounded."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _correlation_with_float32(offset: float, spread: float) -> float:
    torch.manual_seed(0)
    encoder = torch.nn.Linear(1, 256)
    elapsed = offset + torch.rand(4000, 1) * spread
    reference = encoder(elapsed).cos()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        encoded = encoder(elapsed).cos().float()
    both = torch.stack([reference.flatten(), encoded.flatten()])
    return torch.corrcoef(both)[0, 1].item()


@pytest.mark.parametrize("seconds", [3600.0, 86400.0])
def test_a_bfloat16_time_encoding_of_hours_or_days_is_noise(seconds: float) -> None:
    # Measured 0.15 at one hour and 0.01 at one day (torch 2.13.0+cpu).
    assert abs(_correlation_with_float32(seconds, 100.0)) < 0.5


def test_a_bfloat16_time_encoding_of_seconds_still_follows_float32() -> None:
    # Measured 0.99998: bfloat16 only rounds phases of a few radians.
    assert _correlation_with_float32(0.0, 2.0) > 0.99

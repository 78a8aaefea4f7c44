"""What OPT403 relies on about inference tensors, run on the installed torch: a tensor made
under `torch.inference_mode()` can be read after the block (`.item()`, `float()`, printing,
f-strings), but not saved for backward nor updated in place there (analysis/escapes.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _inference_tensor():
    with torch.inference_mode():
        made = torch.ones(3) * 2
    assert made.is_inference()
    return made


def test_an_inference_tensor_can_be_read_after_the_block() -> None:
    made = _inference_tensor()
    assert made.sum().item() == 6.0
    assert float(made[0]) == 2.0
    assert made.tolist() == [2.0, 2.0, 2.0]
    assert "2." in f"{made}" and "2." in str(made)


def test_an_inference_tensor_cannot_be_saved_for_backward_after_the_block() -> None:
    made = _inference_tensor()
    weight = torch.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        (weight * made).sum().backward()


def test_an_inference_tensor_cannot_be_updated_in_place_after_the_block() -> None:
    made = _inference_tensor()
    with pytest.raises(RuntimeError, match="[Ii]nplace update to inference tensor"):
        made.add_(1)

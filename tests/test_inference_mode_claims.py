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


def test_what_a_caller_may_do_with_returned_inference_tensors() -> None:
    # What escapes.result_escape accepts at the call site of a `@torch.inference_mode()`
    # function: moves to the CPU, indexing, dict iteration, max/min, comparisons, string
    # formatting, json of the values read out, and torch.save.
    import io
    import json

    stats = {"acc1": _inference_tensor().sum(), "loss": 0.5}
    tokens = _inference_tensor().to("cpu")
    assert tokens.is_inference() and tokens[1:].tolist() == [2.0, 2.0]
    assert tokens.cpu().detach().numpy().tolist() == [2.0, 2.0, 2.0]
    best = max(0.0, stats["acc1"])
    assert bool(best > 5.0) and "6.0" in "{:.1f}".format(best)
    assert json.dumps({f"test_{k}": float(v) for k, v in stats.items()}) == (
        '{"test_acc1": 6.0, "test_loss": 0.5}'
    )
    scaled = stats["acc1"] * 100.0 / 3
    assert float(scaled) == 200.0
    buffer = io.BytesIO()
    torch.save({"best": best, "tokens": tokens}, buffer)
    buffer.seek(0)
    assert torch.load(buffer)["tokens"].tolist() == [2.0, 2.0, 2.0]


def test_a_new_tensor_computed_from_an_inference_tensor_alone_is_an_ordinary_one() -> None:
    # escapes.py accepts `outputs.argmax(-1)` after the block (FRESH_METHODS with host
    # arguments) and follows views and attributes, which stay inference tensors.
    made = _inference_tensor()
    predictions = made.argmax(dim=-1)
    assert not predictions.is_inference()
    predictions += 1  # an ordinary tensor: updating it in place is allowed
    assert made[:2].is_inference() and made.unsqueeze(0).is_inference()
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        made.matmul(torch.ones(3, requires_grad=True))


def test_a_forward_in_training_mode_under_inference_mode_leaves_buffers_ordinary() -> None:
    # OPT403 inside a training loop: batch norm's running statistics, updated in place by a
    # forward under `inference_mode`, stay ordinary tensors, and training goes on.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(16, 4)).square().mean().backward()
        optimizer.step()
        with torch.inference_mode():
            model(torch.randn(16, 4))
    assert not model[1].running_mean.is_inference()
    assert int(model[1].num_batches_tracked) == 6


def test_a_state_kept_by_the_forward_under_inference_mode_breaks_the_next_step() -> None:
    # Why OPT403 declines there when a method of the model stores on `self`.
    cell = torch.nn.GRUCell(1, 4)
    with torch.inference_mode():
        kept = cell(torch.ones(2, 1))
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        cell(torch.ones(2, 1), kept).sum().backward()


def test_the_numpy_array_of_an_inference_tensor_is_free_of_its_restrictions() -> None:
    # escapes.is_host_value counts `.numpy()` as a host value: the array is no tensor, and a
    # tensor made from it again is an ordinary one, usable by autograd and in place.
    array = _inference_tensor().numpy()
    again = torch.from_numpy(array)
    assert not again.is_inference()
    again.mul_(2)
    weight = torch.ones(3, requires_grad=True)
    (weight * again).sum().backward()
    assert weight.grad.tolist() == [4.0, 4.0, 4.0]
    array += 1  # writes the storage it shares, as a `no_grad` tensor's array would
    assert array.tolist() == [5.0, 5.0, 5.0]


def test_a_tensor_kept_from_the_block_breaks_the_next_step_that_feeds_it_back() -> None:
    # Why a name the block binds and the next iteration reads (before binding it again) is an
    # escape, even when the script bound it before the loop.
    model = torch.nn.Linear(2, 2)
    start = torch.ones(1, 2)
    model(start).sum().backward()
    with torch.inference_mode():
        start = model(torch.ones(1, 2))
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        model(start).sum().backward()

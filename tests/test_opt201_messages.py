"""What OPT201 says where it does not fix: what is known of a device that may be MPS, and
copies of batches that Hugging Face Accelerate already moved to the device."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "OPT201"
MPS_UNSAFE = "where asynchronous host-to-device copies are unsafe (pytorch/pytorch#139550)"


def _opt201(source: str) -> dict:
    result = rewrite(source, path="train.py", select=["OPT201"], why_not=True)
    assert result.source == source  # reported or declined, never rewritten
    return {(d.line, d.status): d.message for d in result.diagnostics}


def test_a_device_naming_the_current_accelerator_is_quoted() -> None:
    found = _opt201((FIXTURES / "report_current_accelerator_may_be_mps.py").read_text())
    current = found[(11, Status.REPORTED)]
    assert "the device is `torch.accelerator.current_accelerator()`, which may be MPS" in current
    assert MPS_UNSAFE in current and "cannot see" not in current
    index = found[(12, Status.REPORTED)]
    assert "the device is the index `0`" in index and MPS_UNSAFE in index


@pytest.mark.parametrize(
    "device",
    ["torch.device(torch.accelerator.current_accelerator())", "torch.device(1)"],
)
def test_a_torch_device_that_may_be_mps_is_copied_asynchronously_only_on_cuda(device: str) -> None:
    source = (FIXTURES / "report_current_accelerator_may_be_mps.py").read_text()
    current = "torch.accelerator.current_accelerator()"
    source = source.replace(
        f"model = torch.nn.Linear(8, 2).to({current})",
        f"device = {device}\nmodel = torch.nn.Linear(8, 2).to(device)",
    )
    source = source.replace(f"x = x.to({current})", "x = x.to(device)")
    result = rewrite(source, path="train.py", select=["OPT201"])
    assert 'x = x.to(device, non_blocking=device.type == "cuda")' in result.source
    assert "y = y.to(0)  #" in result.source  # an index has no `.type`: still reported
    [fixed] = [d for d in result.diagnostics if d.status is Status.FIXED]
    assert fixed.line == 12 and "may be MPS" in fixed.message


def test_current_accelerator_unchecked_is_tested_for_none_before_its_type() -> None:
    path = FIXTURES / "fix_current_accelerator_not_checked_available.py"
    result = rewrite(path.read_text(), path="train.py", select=["OPT201"])
    [data, target] = [d for d in result.diagnostics if d.status is Status.FIXED]
    assert data.line == target.line == 7
    assert '`device is not None and device.type == "cuda"`' in data.message
    checked = path.read_text().replace("if args.accel:", "if torch.accelerator.is_available():")
    checked = rewrite(checked, path="train.py", select=["OPT201"]).source
    assert 'non_blocking=device.type == "cuda"' in checked and "is not None" not in checked
    inline = path.read_text().replace(".to(device)", ".to(torch.accelerator.current_accelerator())")
    message = _opt201(inline)[(7, Status.REPORTED)]
    assert "None in a build of torch without one" in message and MPS_UNSAFE in message


def test_a_device_out_of_sight_is_still_said_to_be_unknown() -> None:
    source = (FIXTURES / "report_current_accelerator_may_be_mps.py").read_text()
    source = source.replace("torch.accelerator.current_accelerator()", "pick_device()")
    message = _opt201(source)[(11, Status.REPORTED)]
    assert "the device is chosen where the analysis cannot see it" in message


ACCELERATE_REASON = "a DataLoader prepared by Accelerate, which moves each batch"


def test_a_batch_of_a_loader_accelerate_prepared_is_declined_with_accelerates_option() -> None:
    found = _opt201((FIXTURES / "keep_loader_prepared_by_accelerate.py").read_text())
    [reason] = {message for (line, status), message in found.items() if line == 15}
    assert ACCELERATE_REASON in reason
    assert "dataloader_config=DataLoaderConfiguration(non_blocking=True)" in reason


@pytest.mark.parametrize(
    "change",
    [
        ("Accelerator()", "Accelerator(device_placement=False)"),
        ("Accelerator()", "Accelerator(**options)"),
        ("loader)\n", "loader, device_placement=[True, True, False])\n"),
        ("accelerator = Accelerator()", "accelerator = make_accelerator()"),
    ],
    ids=["placement-off", "options-hidden", "placement-per-object", "not-accelerate"],
)
def test_where_accelerate_may_not_move_the_batch_its_reason_is_not_given(change) -> None:
    source = (FIXTURES / "keep_loader_prepared_by_accelerate.py").read_text()
    assert change[0] in source
    found = _opt201(source.replace(*change))
    assert not [m for m in found.values() if ACCELERATE_REASON in m]


RUNNABLE_ACCELERATOR_SHAPE = """
import types
import torch
from torch.utils.data import DataLoader, TensorDataset


def train(model, device, loader, optimizer, losses):
    for data, target in loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())


def main(args, losses):
    torch.manual_seed(0)
    use_accel = not args.no_accel and torch.accelerator.is_available()
    if use_accel:
        device = torch.accelerator.current_accelerator()
    else:
        device = torch.device("cpu")
    dataset = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    loader = DataLoader(dataset, batch_size=16, pin_memory=True)
    model = torch.nn.Linear(8, 3).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, device, loader, optimizer, losses)
"""


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
@pytest.mark.parametrize("no_accel", [True, False])
def test_the_copy_tested_for_cuda_trains_the_same_and_runs_without_an_accelerator(
    no_accel: bool,
) -> None:
    rewritten = rewrite(RUNNABLE_ACCELERATOR_SHAPE, path="train.py", select=["OPT201"]).source
    assert rewritten.count('non_blocking=device.type == "cuda"') == 2
    _assert_same_losses(RUNNABLE_ACCELERATOR_SHAPE, rewritten, no_accel)


def _assert_same_losses(original: str, rewritten: str, no_accel: bool) -> None:
    curves = []
    for source in (original, rewritten):
        namespace: dict = {}
        exec(compile(source, "train.py", "exec"), namespace)
        losses: list = []
        namespace["main"](namespace["types"].SimpleNamespace(no_accel=no_accel), losses)
        curves.append(losses)
    assert len(curves[0]) == 4 and curves[0] == curves[1]


RUNNABLE_CONFIGURED_DEVICE = """
import types
import torch
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, config, model, dataset):
        if config.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            self.device = config.device
        self.model = model.to(self.device)
        self.loader = DataLoader(dataset, batch_size=16, pin_memory=True)

    def run(self, losses):
        optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        for batch in self.loader:
            x, y = [t.to(self.device) for t in batch]
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())


def main(device, losses):
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    config = types.SimpleNamespace(device=device)
    Trainer(config, torch.nn.Linear(8, 3), dataset).run(losses)
"""


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
@pytest.mark.parametrize("device", ["auto", "cpu", "cpu:0"])
def test_a_device_string_from_the_configuration_is_tested_through_torch_device(
    device: str,
) -> None:
    rewritten = rewrite(RUNNABLE_CONFIGURED_DEVICE, path="train.py", select=["OPT201"]).source
    test = 'non_blocking=torch.device(self.device).type == "cuda"'
    assert rewritten.count(test) == 1
    curves = []
    for source in (RUNNABLE_CONFIGURED_DEVICE, rewritten):
        namespace: dict = {}
        exec(compile(source, "train.py", "exec"), namespace)
        losses: list = []
        namespace["main"](device, losses)
        curves.append(losses)
    assert len(curves[0]) == 4 and curves[0] == curves[1]


def test_a_device_bound_once_to_none_is_not_read_through_torch_device() -> None:
    found = _opt201((FIXTURES / "report_device_that_may_be_none.py").read_text())
    assert found and all("cannot see" in message for message in found.values())


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
@pytest.mark.parametrize("accel", [True, False])
def test_a_current_accelerator_that_may_be_none_is_tested_for_none_first(accel: bool) -> None:
    # Without the `is_available()` check, `--accel` on a machine with no accelerator copies
    # with `.to(None)`; the keyword must not read `None.type` there.
    unchecked = RUNNABLE_ACCELERATOR_SHAPE.replace(
        "use_accel = not args.no_accel and torch.accelerator.is_available()",
        "use_accel = not args.no_accel",
    )
    rewritten = rewrite(unchecked, path="train.py", select=["OPT201"]).source
    assert rewritten.count('non_blocking=device is not None and device.type == "cuda"') == 2
    _assert_same_losses(unchecked, rewritten, no_accel=not accel)

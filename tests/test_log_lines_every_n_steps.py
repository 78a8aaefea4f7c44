"""A per-step print or log line that reads device values runs every 10th step (OPT202 for the
loss, OPT204 for other values): the training is the same, one line in ten is printed, and
the fix composes with the accumulations it lets pay."""

from __future__ import annotations

import contextlib
import io

from optimizer_codemod import rewrite
from optimizer_codemod.diagnostics import Status
from optimizer_codemod.rule import Safety

GAN_STEP = """
import sys
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
generator = nn.Linear(4, 8).to(device)
discriminator = nn.Linear(8, 1).to(device)
optimizer_G = torch.optim.Adam(generator.parameters(), lr=1e-3)
optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
criterion = nn.BCEWithLogitsLoss()
dataloader = [(torch.randn(16, 8), None) for _ in range(23)]
losses = []

for epoch in range(2):
    for i, (imgs, _) in enumerate(dataloader):
        real = imgs.to(device)
        optimizer_G.zero_grad()
        fake = generator(torch.randn(16, 4, device=device))
        g_loss = criterion(discriminator(fake), torch.ones(16, 1, device=device))
        g_loss.backward()
        optimizer_G.step()
        optimizer_D.zero_grad()
        d_loss = criterion(discriminator(real), torch.ones(16, 1, device=device))
        d_loss.backward()
        optimizer_D.step()
        losses.append((d_loss.detach().clone(), g_loss.detach().clone()))
        sys.stdout.write(
            "[Epoch %d] [Batch %d/%d] [D loss: %f] [G loss: %f]\\n"
            % (epoch, i, len(dataloader), d_loss.item(), g_loss.item())
        )
"""


def _run(source: str):
    out = io.StringIO()
    namespace: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(source, "train.py", "exec"), namespace)
    return namespace["losses"], out.getvalue().splitlines()


def test_the_gated_progress_line_trains_the_same_and_prints_every_tenth_step() -> None:
    result = rewrite(GAN_STEP, path="train.py", select=["OPT202", "OPT204"], unsafe_fixes=True)
    assert "        if i % 10 == 0:\n            sys.stdout.write(" in result.source
    [fixed] = [d for d in result.diagnostics if d.status is Status.FIXED]
    assert fixed.code == "OPT202" and fixed.safety is Safety.BEHAVIOR
    before, printed_before = _run(GAN_STEP)
    after, printed_after = _run(result.source)
    assert len(before) == len(after) == 46
    assert all(a[0].equal(b[0]) and a[1].equal(b[1]) for a, b in zip(before, after))
    # Batches 0, 10 and 20 of each epoch: the same lines, the others gone.
    kept = [
        line
        for line in printed_before
        if line.split("[Batch ")[1].split("/")[0] in {"0", "10", "20"}
    ]
    assert len(printed_before) == 46 and printed_after == kept and len(kept) == 6


def test_without_unsafe_fixes_the_line_is_offered_and_nothing_changes() -> None:
    result = rewrite(GAN_STEP, path="train.py", select=["OPT202", "OPT204"])
    assert result.source == GAN_STEP
    [offered] = [d for d in result.diagnostics if d.code == "OPT202"]
    assert offered.safety is Safety.BEHAVIOR and "every 10th step" in offered.message


ACCUMULATION_AND_PRINT = """
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Linear(8, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    epoch_loss = 0
    for iteration, (x, y) in enumerate(loader, 1):
        x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(model(x), y)
        epoch_loss += loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print("Epoch[{}]({}): Loss: {:.4f}".format(epoch, iteration, loss.item()))
    print("Avg. Loss: {:.4f}".format(epoch_loss / len(loader)))
"""


def test_the_accumulation_pays_only_where_the_print_is_gated_too() -> None:
    # pytorch/examples' super_resolution: the per-step print keeps the host waiting, so moving
    # the running total to the device gains nothing unless the print goes every 10th step.
    safe = rewrite(ACCUMULATION_AND_PRINT, path="train.py", select=["OPT202"])
    assert safe.source == ACCUMULATION_AND_PRINT
    declined = [d for d in safe.diagnostics if "epoch_loss +=" in d.message]
    assert declined and "still waits for the device" in declined[0].message
    unsafe = rewrite(ACCUMULATION_AND_PRINT, path="train.py", select=["OPT202"], unsafe_fixes=True)
    assert "epoch_loss += loss.detach().float()" in unsafe.source
    assert "if iteration % 10 == 0:" in unsafe.source
    assert "float(epoch_loss) / len(loader)" in unsafe.source


def test_a_line_reading_the_loss_and_a_metric_is_one_fix_of_opt202() -> None:
    source = (
        ACCUMULATION_AND_PRINT.replace("        epoch_loss += loss.item()\n", "")
        .replace(
            "loss = nn.functional.mse_loss(model(x), y)",
            "out = model(x)\n        loss = nn.functional.mse_loss(out, y)",
        )
        .replace(
            '"Epoch[{}]({}): Loss: {:.4f}".format(epoch, iteration, loss.item())',
            '"Loss: {:.4f} mean output {:.4f}".format(loss.item(), out.mean().item())',
        )
    )
    result = rewrite(source, path="train.py", select=["OPT202", "OPT204"], unsafe_fixes=True)
    assert "if iteration % 10 == 0:" in result.source
    assert [d.code for d in result.diagnostics if d.status is Status.FIXED] == ["OPT202"]
    assert not [d for d in result.diagnostics if d.code == "OPT204"]
    # Without OPT202, the loss's `.item()` stays on the step: OPT204 cannot gate the line.
    alone = rewrite(source, path="train.py", select=["OPT204"], unsafe_fixes=True)
    assert alone.source == source
    [reported] = [d for d in alone.diagnostics if d.code == "OPT204"]
    assert "not printed every 10th step" in reported.message


def test_a_script_that_never_uses_an_accelerator_is_left_alone() -> None:
    # Nothing runs on a device: `.item()` waits for nothing (time_sequence_prediction).
    source = GAN_STEP.replace('"cuda" if torch.cuda.is_available() else "cpu"', '"cpu"')
    source = source.replace("torch.cuda.is_available()", "False")
    result = rewrite(source, path="train.py", select=["OPT202", "OPT204"], unsafe_fixes=True)
    assert result.source == source


DCGAN_STEP = """
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
netD = nn.Sequential(nn.Linear(8, 1), nn.Sigmoid()).to(device)
netG = nn.Linear(4, 8).to(device)
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=1e-3)
optimizerG = torch.optim.Adam(netG.parameters(), lr=1e-3)
dataloader = [(torch.randn(16, 8),) for _ in range(12)]
losses = []
for epoch in range(2):
    for i, data in enumerate(dataloader, 0):
        netD.zero_grad()
        real = data[0].to(device)
        label = torch.ones(16, 1, device=device)
        output = netD(real)
        errD = criterion(output, label)
        errD.backward()
        D_x = output.mean().item()
        optimizerD.step()
        netG.zero_grad()
        output = netD(netG(torch.randn(16, 4, device=device)))
        errG = criterion(output, label)
        errG.backward()
        D_G_z = output.mean().item()
        optimizerG.step()
        losses.append((errD.detach().clone(), errG.detach().clone()))
        print("[%d][%d] Loss_D: %.6f Loss_G: %.6f D(x): %.6f D(G(z)): %.6f"
              % (epoch, i, errD.item(), errG.item(), D_x, D_G_z))
"""


def test_values_only_printed_stay_on_the_device_and_print_the_same_digits() -> None:
    # pytorch/examples' dcgan: `D_x = output.mean().item()` feeds only the progress line.
    result = rewrite(DCGAN_STEP, path="train.py", select=["OPT202", "OPT204"], unsafe_fixes=True)
    assert "D_x = output.mean().detach()" in result.source
    assert "D_x.item(), D_G_z.item())" in result.source
    fixed = sorted(d.code for d in result.diagnostics if d.status is Status.FIXED)
    assert fixed == ["OPT202", "OPT204", "OPT204"]
    before, printed_before = _run(DCGAN_STEP)
    after, printed_after = _run(result.source)
    assert all(a[0].equal(b[0]) and a[1].equal(b[1]) for a, b in zip(before, after))
    assert len(before) == len(after) == 24
    kept = [line for line in printed_before if line.split("][")[1].split("]")[0] in {"0", "10"}]
    assert printed_after == kept and len(kept) == 4


LOSS_TERMS = """
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
model = nn.Linear(8, 8).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loader = [(torch.randn(16, 8), None) for _ in range(20)]
losses = []
agg_content = 0.0
agg_style = 0.0
for batch_id, (x, _) in enumerate(loader):
    x = x.to(device)
    y = model(x)
    content_loss = 2.0 * nn.functional.mse_loss(y, x)
    style_loss = nn.functional.mse_loss(y.mean(0), x.mean(0))
    total_loss = content_loss + style_loss
    optimizer.zero_grad()
    total_loss.backward()
    optimizer.step()
    losses.append(total_loss.detach().clone())
    agg_content += content_loss.item()
    agg_style += style_loss.item()
    if (batch_id + 1) % 10 == 0:
        print("{:.6f} {:.6f}".format(agg_content / (batch_id + 1), agg_style / (batch_id + 1)))
"""


def test_loss_terms_summed_on_the_device_print_the_same_totals() -> None:
    # pytorch/examples' fast_neural_style: `agg_content_loss += content_loss.item()`.
    result = rewrite(LOSS_TERMS, path="train.py", select=["OPT204"])
    assert "agg_content += content_loss.detach().float()" in result.source
    assert "agg_style += style_loss.detach().float()" in result.source
    before, printed_before = _run(LOSS_TERMS)
    after, printed_after = _run(result.source)
    assert all(a.equal(b) for a, b in zip(before, after)) and len(after) == 20
    # Summed in float32 instead of Python floats: equal to the printed six digits here.
    assert len(printed_after) == 2
    for old, new in zip(printed_before, printed_after):
        for a, b in zip(old.split(), new.split()):
            assert abs(float(a) - float(b)) <= 1e-5 * max(1.0, abs(float(a)))


BENCH_STEP = """
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
model = nn.Linear(8, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for stage, num_steps in enumerate([10, 20]):
    x = torch.randn(16, 8, device=device)
    for k in range(num_steps):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().clone())
        lossf = loss.item()
        print(f"{k}/{num_steps} loss: {lossf:.6f}")
"""


def test_a_loss_read_for_the_next_line_only_is_read_there_every_tenth_step() -> None:
    # nanoGPT's bench.py: `lossf = loss.item()`, then the line that prints it.
    result = rewrite(BENCH_STEP, path="train.py", select=["OPT202", "OPT204"], unsafe_fixes=True)
    assert "lossf = loss.detach()\n        if k % 10 == 0:\n" in result.source
    assert "{lossf.item():.6f}" in result.source
    fixed = sorted(d.code for d in result.diagnostics if d.status is Status.FIXED)
    assert fixed == ["OPT202", "OPT202"]
    before, printed_before = _run(BENCH_STEP)
    after, printed_after = _run(result.source)
    assert len(before) == len(after) == 30
    assert all(a.equal(b) for a, b in zip(before, after))
    kept = [line for line in printed_before if line.split("/")[0] in {"0", "10"}]
    assert printed_after == kept and len(kept) == 3


def test_a_loss_read_through_a_name_is_kept_where_anything_runs_before_the_line() -> None:
    # Between the read and the line, `loss` could be changed in place through another name.
    for change in (
        ("        lossf = loss.item()\n", "        lossf = loss.item()\n        step_done()\n"),
        ("        print(f", "        history.append(lossf)\n        print(f"),
    ):
        source = BENCH_STEP.replace(*change)
        result = rewrite(source, path="train.py", select=["OPT202", "OPT204"], unsafe_fixes=True)
        assert result.source == source
        assert any(d.code == "OPT202" and d.status is Status.REPORTED for d in result.diagnostics)

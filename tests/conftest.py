"""Shared test helpers: writing sources, running the command line in-process."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest
from click.testing import CliRunner, Result

from optimizer_codemod.cli import main
from optimizer_codemod.diagnostics import FileOutcome, Status

# Runs of the command line cache their results (cache.py) beside the configuration, or in
# the working directory: the checkout itself for most tests. One folder per test process
# keeps the checkout clean; the cache stays on, so every test of the command line also runs
# through it.
_CACHE = tempfile.mkdtemp(prefix="optcodemod-test-cache-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ.setdefault("OPTCODEMOD_CACHE_DIR", _CACHE)

if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    # Parallel workers each start torch processes: one thread apiece, or OpenMP threads of
    # several processes contend for the same cores and every training step slows many times.
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, "1")

# A bug in the project index costs a user only the cross-file facts (with a warning); in
# the tests it must fail loudly, not pass for a project with nothing to learn.
os.environ["OPTCODEMOD_DEBUG"] = "1"

# The colour of reports follows NO_COLOR and FORCE_COLOR; a CI that sets either must not
# change what the tests read. Tests of those variables set them themselves.
for _name in ("NO_COLOR", "FORCE_COLOR"):
    os.environ.pop(_name, None)

# The script names CUDA (OPT301 leaves a script that never does alone: it trains on the CPU)
# but keeps its model where it is built, so that OPT302 and OPT402 find no device.
TRAINING_SCRIPT = b"""import torch

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    loss = model(torch.randn(8, 4)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(torch.cuda.max_memory_allocated())
"""
FUSED_LINE = b"optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)"
# Hand-written attention in a float32 training loop: OPT302 adds autocast, OPT406 fuses the
# attention unless the target device is the CPU (where fused attention under autocast is slow).
ATTENTION_SCRIPT = b"""import torch
import torch.nn.functional as F


class Attention(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.qkv = torch.nn.Linear(width, 3 * width)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = F.softmax(q @ k.transpose(-2, -1) * x.size(-1) ** -0.5, dim=-1)
        return att @ v


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = Attention(16).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(4, 8, 16, device=device)
    loss = model(x).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


ROOT = Path(__file__).resolve().parent.parent


def copy_working_tree(dest: Path) -> Path:
    """A copy of this checkout as a clone would have it: tracked and new files, not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def run_cli(
    args: Sequence[str], stdin: Optional[bytes] = None, cwd: Optional[Path] = None
) -> Result:
    runner = CliRunner()
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return runner.invoke(main, list(args), input=stdin, catch_exceptions=False)
    finally:
        os.chdir(old)


def messages_by_code(outcome: FileOutcome, status: Status) -> Dict[str, List[str]]:
    """{rule code: [message, ...]} of the outcome's diagnostics with `status`."""
    found: Dict[str, List[str]] = {}
    for diagnostic in outcome.diagnostics:
        if diagnostic.status is status:
            found.setdefault(diagnostic.code, []).append(diagnostic.message)
    return found


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_bytes(TRAINING_SCRIPT)
    return path

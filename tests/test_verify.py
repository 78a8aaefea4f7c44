"""Runtime verification: the probe records what a script does, and verify judges a rewrite.

The probe runs unchanged scripts in a subprocess, so these tests write small training scripts
and run them for real on CPU (a few seconds each, mostly torch's import).
"""

from __future__ import annotations

import functools
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from conftest import run_cli
from optimizer_codemod.rule import Safety
from optimizer_codemod.verify.equivalence import (
    TOLERANCES,
    Tolerance,
    compare_losses,
    tolerance_for,
    verify_pair,
)
from optimizer_codemod.verify.runner import (
    ProbeOptions,
    ProbeRun,
    declared_processes,
    kill_run,
    run_probe,
)

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train.py"

PRINTS_ITS_LOSSES = """
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(8):
    loss = torch.nn.functional.mse_loss(model(x), y)
    print(f"loss {loss.item()!r}", flush=True)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

GRAD_SCALER = """
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(4):
    loss = torch.nn.functional.mse_loss(model(x), y)
    print(f"loss {loss.item()!r}", flush=True)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""

# Workers that outlive the probe would be a hang (or stray processes) for every verify run.
PERSISTENT_WORKERS = """
import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, index):
        info = torch.utils.data.get_worker_info()
        if info is not None:
            with open(os.path.join(sys.argv[1], f"worker-{os.getpid()}"), "w"):
                pass
        return torch.full((4,), float(index)), torch.tensor([index % 3.0])


if __name__ == "__main__":
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    loader = DataLoader(Numbers(), batch_size=8, num_workers=2, persistent_workers=True)
    for epoch in range(1000):
        for inputs, targets in loader:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""

# The clone is needed: `targets` decays in place, the regression target must not.
NEEDS_ITS_CLONE = """
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
inputs, targets = torch.randn(64, 8), torch.randn(64, 1)
goal = targets.clone()
for step in range(50):
    loss = torch.nn.functional.mse_loss(model(inputs), goal)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    targets.mul_(0.5)
"""


DISTRIBUTED = """# bench: torchrun --nproc-per-node 2
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(dist.get_rank())
for step in range(100):
    inputs, targets = torch.randn(16, 8, generator=data), torch.randn(16, 1, generator=data)
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
"""

# Rank 1 never reaches the barrier: rank 0 waits in it until the run's timeout.
HANGS_ON_RANK_1 = """
import os
import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}-{os.getpid()}"), "w"):
    pass
if dist.get_rank() == 1:
    time.sleep(600)
dist.barrier()
"""

# torchrun's way of starting workers: each in a session of its own, sharing our stdout.
LAUNCHER = """
import subprocess
import sys

children = [
    subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    for _ in range(2)
]
print(" ".join(str(child.pid) for child in children), flush=True)
for child in children:
    child.wait()
"""


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _printed_losses(stdout: str) -> list:
    return [float(m) for m in re.findall(r"^loss (\S+)$", stdout, re.M)]


# --- the probe -------------------------------------------------------------------------------


def test_probe_records_the_losses_the_script_prints(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", PRINTS_ITS_LOSSES)
    run = run_probe(str(script), [], ProbeOptions(steps=5, warmup=1, seed=None, cwd=tmp_path))
    assert run.ok, run.stderr
    result = run.result
    assert result["status"] == "stopped"
    assert result["steps"] == 5 and result["backward_calls"] == 5
    # Bit for bit. A step is an iteration, told apart by the line that calls backward: the probe
    # stops when the sixth one's backward begins (its forward has run and printed).
    assert run.losses == _printed_losses(run.stdout)[:5]
    assert len(_printed_losses(run.stdout)) == 6
    assert len(result["step_times"]) == 4  # steps 2..5: the first is warm-up
    assert result["device"] == "cpu" and result["peak_memory_kind"] == "host max RSS"
    assert result["peak_memory"] > 10 * 2**20
    assert result["measured_seconds"] == pytest.approx(sum(result["step_times"]))


def test_probe_passes_arguments_and_reports_a_script_that_ends_first(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", "import sys\nprint(sys.argv[1:])\n" + PRINTS_ITS_LOSSES)
    run = run_probe(str(script), ["--a", "b"], ProbeOptions(steps=50, warmup=2, cwd=tmp_path))
    assert run.ok, run.stderr
    assert "['--a', 'b']" in run.stdout
    assert run.result["status"] == "finished"
    assert run.result["steps"] == 8 and len(run.losses) == 8


LINEAR_LAYER = """
import torch
model = torch.nn.Linear(64, 32, bias=False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    loss = model(torch.randn(16, 64)).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_probe_counts_one_warm_up_steps_flops(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", LINEAR_LAYER)
    counted = run_probe(str(script), [], ProbeOptions(steps=4, warmup=2, count_flops=True))
    assert counted.ok, counted.stderr
    # Forward 16x64 @ 64x32, backward the weight's gradient only (the input needs none).
    assert counted.flops_per_step == 2 * (2 * 16 * 64 * 32)
    assert len(counted.result["step_times"]) == 2  # the counted step is not timed
    plain = run_probe(str(script), [], ProbeOptions(steps=4, warmup=2))
    assert plain.flops_per_step is None
    # Counting would slow a timed step: with one warm-up step nothing is counted.
    timed = run_probe(str(script), [], ProbeOptions(steps=4, warmup=1, count_flops=True))
    assert timed.ok and timed.flops_per_step is None


# Inductor's compile workers, as the script's compile left them: started, answering after 0.3 s.
STARTED_COMPILE_WORKERS = """
import functools, sys, time, types
class AsyncCompile:
    @staticmethod
    @functools.lru_cache(1)
    def process_pool():
        return "pool"
    @classmethod
    def wait_pool_ready(cls, timeout):
        print("waited at iteration", len(losses) + 1, "timeout", timeout)
        time.sleep(0.3)
module = types.ModuleType("torch._inductor.async_compile")
module.AsyncCompile = AsyncCompile
sys.modules[module.__name__] = module
AsyncCompile.process_pool()
losses = []
"""


def test_the_timed_window_starts_once_compile_workers_have_started(tmp_path: Path) -> None:
    counting = LINEAR_LAYER + "    losses.append(loss)\n"
    script = _write(tmp_path, "train.py", STARTED_COMPILE_WORKERS + counting)
    run = run_probe(str(script), [], ProbeOptions(steps=6, warmup=2))
    assert run.ok, run.stderr
    assert "waited at iteration 3 timeout 60.0" in run.stdout  # once, as the window opens
    assert run.stdout.count("waited") == 1
    assert run.result["settle_seconds"] >= 0.3
    assert len(run.result["step_times"]) == 4 and max(run.result["step_times"]) < 0.3
    # Without started workers (nothing compiled with Triton) the probe does not wait.
    plain = run_probe(str(_write(tmp_path, "plain.py", LINEAR_LAYER)), [], ProbeOptions(steps=4))
    assert plain.ok and plain.result["settle_seconds"] is None


def test_waiting_for_compile_workers_never_breaks_a_run(monkeypatch) -> None:
    from optimizer_codemod.verify import probe

    class AsyncCompile:
        process_pool = staticmethod(functools.lru_cache(1)(lambda: "pool"))

        @classmethod
        def wait_pool_ready(cls, timeout):
            raise TimeoutError(timeout)

    module = types.ModuleType("torch._inductor.async_compile")
    module.AsyncCompile = AsyncCompile
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert probe.settle_compile_workers() is None  # no pool started yet: no wait
    AsyncCompile.process_pool()
    assert probe.settle_compile_workers(timeout=0.1) is None  # the wait failed: measure as before


def test_verify_counts_flops_in_the_originals_runs_only(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", LINEAR_LAYER)
    rewritten = LINEAR_LAYER.replace("lr=0.1)", "lr=0.1, foreach=False)")
    report = verify_pair(script, rewritten, steps=4, repeats=1, warmup=2, count_flops=True)
    assert report.error is None, report.error
    assert [r.flops_per_step for r in report.before] == [2 * 2 * 16 * 64 * 32]
    assert [r.flops_per_step for r in report.after] == [None]
    assert report.flops_per_step == 2 * 2 * 16 * 64 * 32


def test_probe_records_the_loss_before_grad_scaler_scaling(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", GRAD_SCALER)
    run = run_probe(str(script), [], ProbeOptions(steps=3, warmup=1, cwd=tmp_path))
    assert run.ok, run.stderr
    printed = _printed_losses(run.stdout)
    assert run.losses == printed[:3]
    assert max(run.losses) < 10  # not scaled by 1024


def test_probe_stops_a_script_with_persistent_workers_and_leaves_no_process(
    tmp_path: Path,
) -> None:
    script = _write(tmp_path, "train.py", PERSISTENT_WORKERS)
    marks = tmp_path / "workers"
    marks.mkdir()
    started = time.perf_counter()
    run = run_probe(
        str(script), [str(marks)], ProbeOptions(steps=3, warmup=1, cwd=tmp_path, timeout=120)
    )
    assert not run.timed_out and run.ok, run.stderr
    assert run.result["steps"] == 3 and run.returncode == 0
    assert time.perf_counter() - started < 100
    # Workers that miss the stop message each cost a 5-second join timeout at exit.
    assert time.time() - run.result["ended_at"] < 4
    pids = [int(p.name.split("-")[1]) for p in marks.iterdir()]
    assert pids, "the workers never ran"
    for pid in pids:
        assert not _alive(pid), f"DataLoader worker {pid} outlived the probe"


def _alive_after(pid: int, grace: float) -> bool:
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            state = next(line for line in handle if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        return False
    return "zombie" not in state and "(dead)" not in state


SLEEPS = """
import os
import sys
import time

import torch

with open(sys.argv[1], "w") as handle:
    handle.write(str(os.getpid()))
with torch.cuda.amp.autocast(enabled=False):  # something to rewrite (OPT801)
    time.sleep(120)
"""


def test_sigterm_to_verify_ends_the_run_in_flight(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", SLEEPS)
    pid_file = tmp_path / "pid"
    command = [sys.executable, "-m", "optimizer_codemod", "verify", str(script)]
    verify = subprocess.Popen(command + ["--steps", "2", "--", str(pid_file)], cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and verify.poll() is None, "the run never started"
        time.sleep(0.1)
    run_pid = int(pid_file.read_text())
    verify.send_signal(signal.SIGTERM)  # what `timeout` sends
    assert verify.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while _alive(run_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(run_pid), "the run outlived verify"
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".py"] == ["train.py"]


def test_verify_runs_a_script_that_declares_torchrun_on_every_rank(tmp_path: Path) -> None:
    _write(tmp_path, "train.py", DISTRIBUTED)
    report_file = tmp_path / "report.json"
    result = run_cli(
        ["verify", "train.py", "--steps", "3", "--warmup", "1", "--repeats", "1"]
        + ["--timeout", "120", "--json", str(report_file)],
        cwd=tmp_path,
    )
    assert result.exit_code == 0, result.output
    assert "; torchrun, 2 processes; cpu" in result.stdout
    report = json.loads(report_file.read_text())
    assert report["processes"] == 2 and report["equivalent"]
    for run in report["before"] + report["after"]:
        rank0 = run["result"]
        assert rank0["rank"] == 0 and rank0["status"] == "stopped"
        assert rank0["steps"] == 3 and len(rank0["losses"]) == 3
        # Every rank stopped after the same step, so none waits in a collective.
        (rank1,) = rank0["other_ranks"]
        assert rank1["rank"] == 1 and rank1["status"] == "stopped" and rank1["steps"] == 3
        assert run["returncode"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "train.py"]


def test_declared_processes(tmp_path: Path) -> None:
    assert declared_processes(str(_write(tmp_path, "a.py", DISTRIBUTED))) == 2
    other = _write(tmp_path, "b.py", "# bench: torchrun --nproc_per_node=4\nimport torch\n")
    assert declared_processes(str(other)) == 4
    assert declared_processes(str(_write(tmp_path, "c.py", PRINTS_ITS_LOSSES))) is None
    assert declared_processes(str(tmp_path / "missing.py")) is None


def test_a_run_fails_when_another_rank_failed() -> None:
    ok = {"status": "stopped", "steps": 3, "other_ranks": [{"rank": 1, "status": "stopped"}]}
    assert ProbeRun("train.py", 0, ok, "", "", 1.0).ok
    failed = dict(
        ok, other_ranks=[{"rank": 1, "status": "error"}, {"rank": 2, "status": "no result"}]
    )
    run = ProbeRun("train.py", 1, failed, "", "", 1.0, label="rewritten")
    assert not run.ok
    assert run.problem() == (
        "rewritten script failed on other ranks (rank 1: error, rank 2: no result; exit code 1)"
    )


def test_a_timeout_under_torchrun_ends_every_rank(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", HANGS_ON_RANK_1)
    marks = tmp_path / "ranks"
    marks.mkdir()
    options = ProbeOptions(steps=3, cwd=tmp_path, timeout=15, nproc_per_node=2)
    run = run_probe(str(script), [str(marks)], options)
    assert run.timed_out and not run.ok and "did not finish in 15 s" in run.problem()
    # The workers hold the output pipes: had one survived, reading them would have waited.
    assert run.seconds < 15 + 8
    pids = [int(p.name.split("-")[1]) for p in marks.iterdir()]
    assert pids, "no rank started within the timeout"
    for pid in pids:
        # SIGKILL takes effect when the process is next scheduled: on a loaded machine that
        # can be a moment after `run_probe` returns, so a rank gets a short grace to die.
        assert not _alive_after(pid, grace=5.0), f"rank process {pid} outlived the timeout"


def test_kill_run_ends_workers_in_sessions_of_their_own(tmp_path: Path) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pids = [int(pid) for pid in launcher.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    kill_run(launcher)
    launcher.communicate(timeout=10)  # no worker holds the pipe any more
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


def test_probe_reports_the_scripts_own_error(tmp_path: Path) -> None:
    script = _write(
        tmp_path, "train.py", PRINTS_ITS_LOSSES + "\nraise ValueError('broken on purpose')\n"
    )
    run = run_probe(str(script), [], ProbeOptions(steps=50, cwd=tmp_path))
    assert not run.ok and run.returncode == 1
    assert run.result["status"] == "error"
    assert "ValueError: broken on purpose" in run.stderr_tail()
    assert "runpy" not in run.result["error"]  # the traceback starts at the script


def test_probe_is_not_stopped_by_a_broad_except(tmp_path: Path) -> None:
    body = PRINTS_ITS_LOSSES.replace(
        "    optimizer.step()\n",
        "    try:\n        optimizer.step()\n    except Exception:\n        pass\n",
    )
    run = run_probe(str(_write(tmp_path, "t.py", body)), [], ProbeOptions(steps=2, cwd=tmp_path))
    assert run.result["status"] == "stopped" and run.result["steps"] == 2


# --- tolerances ------------------------------------------------------------------------------


def test_tolerances_grow_with_the_safety_level() -> None:
    safe, numerics, behavior = (
        TOLERANCES[s] for s in (Safety.SAFE, Safety.NUMERICS, Safety.BEHAVIOR)
    )
    assert safe.rtol < numerics.rtol < behavior.rtol
    assert behavior.window > 1 and safe.window == numerics.window == 1
    assert tolerance_for(Safety.SUGGEST) is behavior


def test_compare_losses() -> None:
    tight = Tolerance(Safety.SAFE, rtol=1e-5, atol=1e-6)
    assert compare_losses([1.0, 2.0], [1.0, 2.0], tight).max_relative == 0
    apart = compare_losses([1.0, 2.0, 4.0], [1.0, 2.2, 4.0], tight)
    assert apart.worst == 1 and apart.max_relative == pytest.approx(0.1)
    assert apart.first_beyond(0.05) == 1 and apart.first_beyond(0.2) is None
    # Near zero the comparison becomes absolute (floor = atol / rtol = 0.1).
    assert compare_losses([1e-9], [2e-9], tight).max_relative == pytest.approx(1e-8)
    assert compare_losses([math.nan], [math.nan], tight).max_relative == 0
    assert compare_losses([1.0], [math.nan], tight).max_relative == math.inf
    assert not compare_losses([1.0, 2.0], [1.0], tight).lengths_match
    curve = Tolerance(Safety.BEHAVIOR, rtol=0.1, atol=0.01, window=2)
    # Curve-level: noise that cancels within a block of two losses does not count.
    assert compare_losses([1.0, 1.0], [0.9, 1.1], curve).max_relative == pytest.approx(0)


# --- verify ----------------------------------------------------------------------------------


@pytest.fixture
def example(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    shutil.copy(EXAMPLE, path)
    return path


def test_verify_passes_on_the_example(example: Path, tmp_path: Path) -> None:
    report_file = tmp_path / "report.json"
    result = run_cli(
        [
            "verify",
            "train.py",
            "--steps",
            "5",
            "--repeats",
            "1",
            "--unsafe-fixes",
            "--json",
            str(report_file),
            "--",
            "--epochs",
            "1",
        ],
        cwd=tmp_path,
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"^steps +5 +5$", result.stdout, re.M)
    assert "most permissive level: behavior" in result.stdout
    assert "Equivalent (" in result.stdout
    assert re.search(r"^step time \(median\) .* speedup \d+\.\d\dx$", result.stdout, re.M)
    assert "run 4: " in result.stderr and "run 5" not in result.stderr  # 2 local, 2 timed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "train.py"]
    report = json.loads(report_file.read_text())
    assert report["exit_code"] == 0 and report["level"] == "behavior"
    assert report["before"][0]["result"]["args"] == ["--epochs", "1"]


def test_verify_fails_on_a_wrong_learning_rate(example: Path) -> None:
    wrong = example.read_text().replace("lr=1e-3", "lr=2e-3")
    report = verify_pair(example, wrong, level=Safety.BEHAVIOR, steps=5, repeats=1)
    assert report.error is None, report.error
    assert report.exit_code == 1
    assert "Losses disagree" in report.render()


def test_verify_fails_when_a_needed_clone_is_removed(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", NEEDS_ITS_CLONE)
    wrong = NEEDS_ITS_CLONE.replace("goal = targets.clone()", "goal = targets")
    report = verify_pair(script, wrong, level=Safety.SAFE, steps=5, repeats=1)
    assert report.exit_code == 1, report.render()
    text = report.render()
    assert re.search(r"Losses disagree at step 2: original \S+, rewritten \S+", text), text
    same = NEEDS_ITS_CLONE + "\n# unchanged\n"
    right = verify_pair(script, same, level=Safety.SAFE, steps=5, repeats=2)
    assert right.exit_code == 0 and right.comparison.max_relative == 0
    assert right.noise == 0 and len(right.before) == len(right.after) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]  # temporary files removed


def test_verify_reports_a_crash_with_its_stderr_and_exit_2(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", PRINTS_ITS_LOSSES)
    broken = PRINTS_ITS_LOSSES.replace("loss.backward()", "loss.backward(); 1 / 0")
    report = verify_pair(script, broken, steps=3, repeats=2)
    assert report.exit_code == 2
    text = report.render()
    assert "The rewritten script failed" in text and "ZeroDivisionError: division by zero" in text
    assert "the rewrite broke it" in text
    # Stopped at the first failure: the candidate's run that steps from the original's state.
    assert report.recorded is not None and report.recorded.ok
    assert report.stepped is None and report.before == report.after == []


def test_verify_cli_errors_and_nothing_to_do(tmp_path: Path) -> None:
    untouched = _write(tmp_path, "plain.py", "print('no training here')\n")
    result = run_cli(["verify", str(untouched)])
    assert result.exit_code == 0 and "nothing to verify" in result.stdout
    crashing = _write(tmp_path, "crash.py", "import torch\nopt = torch.optim.AdamW(p)\n")
    result = run_cli(["verify", str(crashing), "--steps", "2", "--repeats", "1"])
    assert result.exit_code == 2
    assert "The original script failed" in result.stdout and "NameError" in result.stdout
    assert run_cli(["verify", str(tmp_path / "missing.py")]).exit_code == 2


def test_verify_parent_process_needs_no_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import optimizer_codemod.cli, optimizer_codemod.verify.equivalence\n"
        "from optimizer_codemod.verify import verify_pair\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# --- the judgment: local error, trajectory, iterations, --against, projects ---------------------

TWO_OPTIMIZERS = """
import torch

torch.manual_seed(0)
generator = torch.nn.Linear(4, 8)
critic = torch.nn.Linear(8, 1)
opt_g = torch.optim.Adam(generator.parameters(), lr=1e-2)
opt_c = torch.optim.Adam(critic.parameters(), lr=1e-2)
for step in range(100):
    fake = generator(torch.randn(16, 4))
    c_loss = critic(fake.detach()).mean() - critic(torch.randn(16, 8)).mean()
    opt_c.zero_grad()
    c_loss.backward()
    opt_c.step()
    g_loss = -critic(fake).mean()
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
"""

MANUAL_UPDATES = """
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(20):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.05)
            p.grad = None
"""

# Gradients far above the clipping norm: every update is clipped, and a small learning rate keeps
# the losses of a few steps within any floor. Only the local check sees a wrong clipping norm.
CLIPPED = """
import torch

torch.manual_seed(0)
model = torch.nn.Linear(32, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
inputs, targets = torch.randn(64, 32), 100 * torch.randn(64, 1)
for step in range(20):
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
"""


def test_a_step_is_one_iteration_whatever_number_of_optimizers_steps_in_it(
    tmp_path: Path,
) -> None:
    script = _write(tmp_path, "train.py", TWO_OPTIMIZERS)
    run = run_probe(str(script), [], ProbeOptions(steps=6, warmup=2))
    assert run.ok, run.stderr
    result = run.result
    assert result["steps"] == 6 and result["backward_calls"] == 12
    assert result["optimizer_steps"] == 12 and len(run.losses) == 12
    assert len(result["step_times"]) == 4  # iterations 3..6, each with both optimizers' steps


def test_a_script_with_hand_written_updates_is_verified(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", MANUAL_UPDATES)
    foreach = MANUAL_UPDATES.replace(
        """        for p in model.parameters():
            p.add_(p.grad, alpha=-0.05)
            p.grad = None""",
        """        params = list(model.parameters())
        torch._foreach_add_(params, [p.grad for p in params], alpha=-0.05)
        for p in params:
            p.grad = None""",
    )
    assert foreach != MANUAL_UPDATES
    report = verify_pair(script, foreach, level=Safety.SAFE, steps=6, repeats=1)
    assert report.error is None, report.error
    assert report.before[0].result["steps"] == 6 and report.before[0].result["optimizer_steps"] == 0
    assert report.local is not None and report.local.unavailable  # nothing to restore into
    assert report.exit_code == 0, report.render()
    assert "local check: not run" in report.render()
    wrong = MANUAL_UPDATES.replace("alpha=-0.05", "alpha=-0.06")
    assert verify_pair(script, wrong, level=Safety.SAFE, steps=6, repeats=1).exit_code == 1


def test_the_local_check_catches_a_wrong_step_the_losses_do_not_show(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", CLIPPED)
    wrong = CLIPPED.replace("parameters(), 1.0)", "parameters(), 0.5)")
    report = verify_pair(script, wrong, level=Safety.NUMERICS, steps=5, repeats=1)
    assert report.error is None, report.error
    assert report.trajectory.passed  # the losses alone would call it equivalent
    assert not report.local.passed and report.exit_code == 1
    assert report.decided_by == "local" and report.margin < 1
    assert "local check: FAILED" in report.render()
    assert [step.iteration for step in report.local.steps] == [2, 3, 5]
    worst = max(step.update for step in report.local.steps)
    assert worst == pytest.approx(0.5, rel=1e-3)  # half the clipped update
    right = verify_pair(script, CLIPPED + "\n# same\n", level=Safety.SAFE, steps=5, repeats=1)
    assert (
        right.exit_code == 0
        and right.local.passed
        and right.local.margin is None
        or (right.local.margin == math.inf)
    )


# GradScaler hands a fused optimizer its gradients still scaled (it unscales in its kernel) and
# calls its step even when they hold an inf; the local check must see what an unfused one sees.
OVERFLOWING_SCALER = (
    GRAD_SCALER.replace("range(4)", "range(10)")
    .replace("init_scale=1024.0", "init_scale=2.0**127, growth_interval=1")
    .replace("loss = torch.nn", "loss = 4 * torch.nn")
)


@pytest.mark.parametrize(
    "script_text",
    [GRAD_SCALER.replace("range(4)", "range(8)"), OVERFLOWING_SCALER],
    ids=["scaled-gradients", "every-other-step-skipped"],
)
def test_a_fused_optimizer_under_grad_scaler_is_checked_on_unscaled_gradients(
    tmp_path: Path, script_text: str
) -> None:
    script = _write(tmp_path, "train.py", script_text)
    fused = script_text.replace("lr=0.05)", "lr=0.05, fused=True)")
    assert fused != script_text
    report = verify_pair(script, fused, level=Safety.NUMERICS, steps=8, repeats=1)
    assert report.error is None, report.error
    assert report.local.judged and report.local.passed, report.render()
    gradients = [step.gradient for step in report.local.steps if step.gradient is not None]
    assert gradients and max(gradients) < 1e-6, report.render()
    assert report.exit_code == 0, report.render()
    if script_text is OVERFLOWING_SCALER:
        return  # one wrong step caught under a scaler is enough; each verify costs ~15 s
    wrong = fused.replace("lr=0.05,", "lr=0.1,")
    wrong_report = verify_pair(script, wrong, level=Safety.NUMERICS, steps=8, repeats=1)
    assert wrong_report.decided_by == "local" and wrong_report.exit_code == 1


def test_verify_against_compares_two_versions_a_person_wrote(tmp_path: Path) -> None:
    original = _write(tmp_path, "train.py", PRINTS_ITS_LOSSES)
    same = _write(tmp_path, "train_fast.py", PRINTS_ITS_LOSSES.replace("print(", "(print)("))
    wrong = _write(tmp_path, "train_wrong.py", PRINTS_ITS_LOSSES.replace("lr=0.05", "lr=0.1"))
    out = tmp_path / "report.json"
    args = ["--steps", "4", "--repeats", "1", "--json", str(out)]
    result = run_cli(["verify", str(original), "--against", str(same), "--level", "safe"] + args)
    assert result.exit_code == 0, result.output
    assert f"against {same}: judged at the safe level" in result.stdout
    data = json.loads(out.read_text())
    assert data["candidate"] == str(same) and data["fixed"] == [] and data["equivalent"]
    result = run_cli(["verify", str(original), "--against", str(wrong)] + args)
    assert result.exit_code == 1, result.output
    assert "judged at the numerics level" in result.stdout and "Not equivalent" in result.stdout
    assert json.loads(out.read_text())["decided_by"] == "local"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report.json",
        "train.py",
        "train_fast.py",
        "train_wrong.py",
    ]
    assert run_cli(["verify", str(original), "--level", "safe"]).exit_code == 2


TRAINER_MODULE = """
import torch


def train(model, inputs, targets, steps):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
"""

DRIVER = """
import torch

from helpers.trainer import train

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
train(model, torch.randn(64, 8), torch.randn(64, 1), steps=20)
"""


def test_verify_rewrites_the_local_modules_a_driver_imports(tmp_path: Path) -> None:
    (tmp_path / "helpers").mkdir()
    _write(tmp_path / "helpers", "__init__.py", "")
    trainer = _write(tmp_path / "helpers", "trainer.py", TRAINER_MODULE)
    driver = _write(tmp_path, "driver.py", DRIVER)
    result = run_cli(["verify", str(driver), "--steps", "4", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    assert re.search(r"^  helpers/trainer\.py: \d fixes \(OPT5\d\d", result.stdout, re.M)
    assert "nothing to verify" not in result.stdout
    assert trainer.read_text() == TRAINER_MODULE  # the user's files are never written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["driver.py", "helpers"]


def test_a_chaotic_gan_rewritten_with_fused_adam_passes_over_160_iterations(
    tmp_path: Path,
) -> None:
    gan = Path(__file__).resolve().parent.parent / "benchmarks" / "verify_cases" / "gan.py"
    script = tmp_path / "gan.py"
    script.write_bytes(gan.read_bytes())
    text = gan.read_text()
    fused = text.replace("betas=(0.0, 0.99))", "betas=(0.0, 0.99), fused=True)")
    assert fused.count("fused=True") == 2
    report = verify_pair(script, fused, level=Safety.NUMERICS, steps=160, repeats=1, warmup=2)
    sys.stdout.write(report.render())
    assert report.error is None, report.error
    # Chaos: the losses part by far more than any fixed tolerance would allow...
    assert report.comparison.max_relative > 0.1
    # ...while one step from the same state differs in the last bits only.
    assert report.local.passed and max(s.update for s in report.local.steps) < 1e-5
    # Judged against how far the original drifts under bfloat16: chaos, which rounding starts.
    assert report.trajectory.rounding_envelope is not None and report.trajectory.passed
    assert report.exit_code == 0


def test_noise_of_the_rewrites_own_size_explains_the_chaotic_gan_too(
    tmp_path: Path, monkeypatch
) -> None:
    from dataclasses import replace

    from optimizer_codemod.verify import equivalence

    # Without the bfloat16 reference (as for a level that allows no rounding), the perturbed
    # runs alone must explain the chaos.
    without_rounding = replace(TOLERANCES[Safety.NUMERICS], rounding_factor=None)
    monkeypatch.setattr(equivalence, "tolerance_for", lambda level: without_rounding)
    gan = Path(__file__).resolve().parent.parent / "benchmarks" / "verify_cases" / "gan.py"
    script = tmp_path / "gan.py"
    script.write_bytes(gan.read_bytes())
    fused = gan.read_text().replace("betas=(0.0, 0.99))", "betas=(0.0, 0.99), fused=True)")
    report = verify_pair(script, fused, level=Safety.NUMERICS, steps=160, repeats=1, warmup=2)
    sys.stdout.write(report.render())
    assert report.error is None, report.error
    assert report.comparison.max_relative > 0.1 and report.rounding_trajectory is None
    assert report.trajectory.perturbed_runs == 2 and report.exit_code == 0


def test_speed_within_noise_when_the_steps_spread_explains_the_ratio() -> None:
    def run(label: str, times: list) -> ProbeRun:
        result = {"status": "stopped", "steps": len(times), "step_times": times}
        result["step_time"] = sorted(times)[len(times) // 2]
        return ProbeRun("s.py", 0, result, "", "", 1.0, label=label)

    from optimizer_codemod.verify.equivalence import VerifyReport

    report = VerifyReport("s.py", Safety.SAFE, TOLERANCES[Safety.SAFE])
    # Bimodal steps on a loaded machine: 5 ms or 100 ms. The medians say 0.47x.
    report.before = [run("original", [0.005] * 6 + [0.1] * 4)]
    report.after = [run("rewritten", [0.005] * 4 + [0.1] * 6)]
    assert report.speedup < 0.1 and report.speed_within_noise
    steady = VerifyReport("s.py", Safety.SAFE, TOLERANCES[Safety.SAFE])
    steady.before = [run("original", [0.010, 0.0101, 0.0099, 0.0100, 0.0102])]
    steady.after = [run("rewritten", [0.005, 0.0051, 0.0049, 0.0050, 0.0050])]
    assert steady.speedup == pytest.approx(2.0) and not steady.speed_within_noise


def test_the_trajectory_is_judged_against_what_chaos_alone_does() -> None:
    from optimizer_codemod.verify.judgment import ENVELOPE_FACTOR, judge_trajectory

    numerics = TOLERANCES[Safety.NUMERICS]
    reference = [1.0, 1.0, 1.0, 1.0]
    drifting = [1.0, 1.01, 1.1, 1.3]  # beyond the 2e-2 floor from the third step on
    alone = judge_trajectory(numerics, reference, [drifting])
    assert not alone.passed and alone.first_beyond == 2
    # Perturbed originals that part as far: chaos explains it.
    chaos = [[1.0, 0.995, 1.05, 0.8], [1.0, 1.0, 0.98, 1.02]]
    judged = judge_trajectory(numerics, reference, [drifting], chaos)
    assert judged.passed and judged.envelope == pytest.approx([0.0, 0.005, 0.07, 0.22])
    assert judged.threshold(3) == pytest.approx(ENVELOPE_FACTOR * 0.22)
    assert judged.margin == pytest.approx(ENVELOPE_FACTOR * 0.005 / 0.01)
    # The envelope never shrinks: two runs that meet again have not stopped being apart.
    assert judge_trajectory(numerics, reference, [drifting], [[1.0, 1.0, 1.2, 1.0]]).envelope[
        -1
    ] == pytest.approx(0.2)


def test_a_numerics_trajectory_may_drift_as_far_as_bfloat16_rounding_takes_the_original() -> None:
    from optimizer_codemod.verify.judgment import ROUNDING_FACTOR, judge_trajectory

    numerics = TOLERANCES[Safety.NUMERICS]
    reference = [1.0, 1.0, 1.0, 1.0]
    rewrite = [1.0, 1.01, 1.05, 1.1]  # autocast's bias: beyond the 2e-2 floor from step 3
    # The original under bfloat16 autocast drifts alike: rounding, not a bug.
    rounded = [1.0, 1.005, 1.02, 0.99]
    judged = judge_trajectory(numerics, reference, [rewrite], rounding=rounded)
    assert judged.passed and judged.rounding_envelope == pytest.approx([0.0, 0.005, 0.02, 0.02])
    assert judged.threshold(3) == pytest.approx(ROUNDING_FACTOR * 0.02)
    # A rewrite drifting far more than rounding does is still caught.
    runaway = [1.0, 1.01, 1.3, 1.6]
    assert judge_trajectory(numerics, reference, [runaway], rounding=rounded).first_beyond == 2
    # The safe level has no rounding to allow: its floor holds.
    safe = TOLERANCES[Safety.SAFE]
    assert judge_trajectory(safe, reference, [rewrite], rounding=rounded).first_beyond == 1
    # A reference that stopped early (its own crash) sets no envelope.
    short = judge_trajectory(numerics, reference, [rewrite], rounding=[1.0, 1.0])
    assert short.rounding_envelope is None and not short.passed

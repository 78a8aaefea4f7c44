"""Start the probe on a script in a subprocess and read its result (no torch needed here).

A script launched with torchrun says so in a comment line, `# bench: torchrun --nproc-per-node 2`
(`declared_processes` reads it): the probe then runs under `python -m torch.distributed.run
--standalone` (a free port for each run), one probe per process; rank 0's result is the run's
result and the other ranks' outcomes are attached to it as `other_ranks`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

PROBE_MODULE = "optimizer_codemod.verify.probe"
STDERR_TAIL_LINES = 30
TORCHRUN = re.compile(r"^# bench: torchrun --nproc[-_]per[-_]node[= ](\d+)\s*$", re.M)
GOOD_STATUSES = ("stopped", "finished")
# After a kill, how long the pipes may stay open (a process that escaped the kill holds them).
DRAIN_SECONDS = 10.0


def declared_processes(path: str) -> Optional[int]:
    """N from a line `# bench: torchrun --nproc-per-node N` in the script, else None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            found = TORCHRUN.search(handle.read())
    except OSError:
        return None
    return int(found.group(1)) if found and int(found.group(1)) > 0 else None


@dataclass
class ProbeRun:
    """One run of one script under the probe."""

    script: str
    returncode: int
    result: Optional[Dict[str, Any]]
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    label: str = ""

    @property
    def ok(self) -> bool:
        return (
            not self.timed_out
            and self.result is not None
            and self.result.get("status") in GOOD_STATUSES
            and not self.failed_ranks()
        )

    def failed_ranks(self) -> List[Dict[str, Any]]:
        """Under torchrun: the other ranks that did not stop or finish (or wrote nothing)."""
        others = self.result.get("other_ranks", []) if self.result else []
        return [rank for rank in others if rank.get("status") not in GOOD_STATUSES]

    @property
    def losses(self) -> List[float]:
        return list(self.result.get("losses", [])) if self.result else []

    @property
    def step_time(self) -> Optional[float]:
        return self.result.get("step_time") if self.result else None

    @property
    def peak_memory(self) -> Optional[int]:
        return self.result.get("peak_memory") if self.result else None

    @property
    def flops_per_step(self) -> Optional[int]:
        return self.result.get("flops_per_step") if self.result else None

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        return "\n".join(self.stderr.rstrip().splitlines()[-lines:])

    def problem(self) -> Optional[str]:
        """Why this run cannot be compared, or None."""
        name = f"{self.label} script" if self.label else self.script
        if self.timed_out:
            return f"{name} did not finish in {self.seconds:.0f} s"
        if self.result is None:
            return f"{name} exited with code {self.returncode} before the probe wrote a result"
        if self.result.get("status") not in GOOD_STATUSES:
            status = self.result.get("status")
            return f"{name} failed ({status}, exit code {self.returncode})"
        failed = self.failed_ranks()
        if failed:
            ranks = ", ".join(f"rank {r['rank']}: {r.get('status')}" for r in failed)
            return f"{name} failed on other ranks ({ranks}; exit code {self.returncode})"
        if not self.result.get("steps"):
            return f"{name} ran no training step (no backward() call): is it a training script?"
        return None


@dataclass
class ProbeOptions:
    steps: int
    warmup: int = 1
    seed: Optional[int] = 0
    timeout: Optional[float] = None
    cwd: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)
    python: str = sys.executable
    # More than 1: start the script under torchrun (`torch.distributed.run --standalone`) with
    # this many processes; rank 0's result is the run's result.
    nproc_per_node: int = 1
    # Count one warm-up step's floating-point operations (the probe's --count-flops).
    count_flops: bool = False
    # The local-error check (see checks.py): iterations, shared folder, "record" or "compare".
    check_at: Sequence[int] = ()
    check_dir: Optional[str] = None
    check_role: Optional[str] = None
    # The original under bfloat16 autocast: how much rounding alone moves one step.
    reference_autocast: bool = False
    # A perturbed reference run: per-parameter noise norms (a JSON file), or relative noise.
    perturb: Optional[str] = None
    perturb_relative: float = 0.0
    perturb_seed: int = 1


def probe_command(script: str, args: Sequence[str], options: ProbeOptions, out: str) -> List[str]:
    command = [options.python]
    if options.nproc_per_node > 1:
        command += ["-m", "torch.distributed.run", "--standalone"]
        command += [f"--nproc-per-node={options.nproc_per_node}"]
    command += ["-m", PROBE_MODULE, "--steps", str(options.steps)]
    command += ["--warmup", str(options.warmup), "--out", out]
    if options.seed is not None:
        command += ["--seed", str(options.seed)]
    if options.count_flops:
        command.append("--count-flops")
    if options.check_role and options.check_dir:
        command += ["--check-role", options.check_role, "--check-dir", options.check_dir]
        command += ["--check-at", ",".join(str(k) for k in options.check_at)]
    if options.reference_autocast:
        command.append("--reference-autocast")
    if options.perturb:
        command += ["--perturb", options.perturb]
    if options.perturb_relative:
        command += ["--perturb-relative", repr(options.perturb_relative)]
    if options.perturb or options.perturb_relative:
        command += ["--perturb-seed", str(options.perturb_seed)]
    return command + ["--", script, *args]


def end_runs_on_sigterm() -> None:
    """Make SIGTERM (`timeout`, a job scheduler) end the run in flight, as Ctrl-C does.

    A run has a session of its own, so a signal to this process does not reach it, and
    Python's default SIGTERM exits without unwinding: the run would live on as an orphan,
    measuring nothing and slowing whatever is measured next. Raising SystemExit instead goes
    through `run_probe`'s cleanup. Call it from the main thread of a command.
    """
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def run_probe(script: str, args: Sequence[str], options: ProbeOptions, label: str = "") -> ProbeRun:
    """Run `script args` under the probe; never raises for the script's own failures."""
    with tempfile.TemporaryDirectory(prefix="optcodemod-probe-") as folder:
        out = os.path.join(folder, "result.json")
        env = dict(os.environ, **options.env)
        started = time.perf_counter()
        process = subprocess.Popen(
            probe_command(script, args, options, out),
            cwd=options.cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            # Its own process group, so a timeout also ends the script's DataLoader workers.
            start_new_session=True,
        )
        timed_out = False
        try:
            stdout, stderr = process.communicate(timeout=options.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_run(process)
            stdout, stderr = _drain(process)
        except BaseException:
            # Ctrl-C reaches only us (the run has its own session): end the run before leaving.
            kill_run(process)
            process.wait()
            raise
        seconds = time.perf_counter() - started
        result = _read_json(out)
        if result is not None and options.nproc_per_node > 1:
            result["other_ranks"] = [
                _rank_outcome(rank, _read_json(f"{out}.rank{rank}"))
                for rank in range(1, options.nproc_per_node)
            ]
    return ProbeRun(script, process.returncode, result, stdout, stderr, seconds, timed_out, label)


def _read_json(path: str) -> Optional[Dict[str, Any]]:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _rank_outcome(rank: int, result: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    if result is None:
        return {"rank": rank, "status": "no result"}
    keys = ("status", "steps", "exit_code", "error", "step_time")
    return dict({"rank": rank}, **{key: result.get(key) for key in keys})


def _drain(process: subprocess.Popen):
    """The output of a killed run; gives up on pipes that a stray process keeps open."""
    try:
        return process.communicate(timeout=DRAIN_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        process.wait()
        return "", "(output lost: a process of the run outlived the kill and held its pipes)"


def kill_run(process: subprocess.Popen) -> None:
    """SIGKILL the run's process group and every process group below it.

    torchrun starts each worker in a session of its own, so killing the launcher's group alone
    would leave the workers running (holding our pipes open, so `communicate` would wait for
    them). The launcher is stopped first, so that it starts no new worker, and the tree is read
    from /proc before anything dies (an orphan's parent link is lost). Without /proc: SIGTERM,
    which torchrun passes on to its workers, then SIGKILL.
    """
    try:
        os.killpg(process.pid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError, AttributeError):  # pragma: no cover
        process.kill()
        return
    descendants = _descendants(process.pid)
    if descendants is None:  # pragma: no cover - no /proc (macOS)
        os.killpg(process.pid, signal.SIGTERM)
        os.killpg(process.pid, signal.SIGCONT)
        try:
            process.wait(timeout=DRAIN_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        descendants = {}
    groups = {process.pid} | set(descendants.values())
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in descendants:  # one that left its group for another
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _descendants(root: int) -> Optional[Dict[int, int]]:
    """{pid: process group} of every process below `root`, from /proc; None without /proc."""
    if not os.path.isdir("/proc/self"):
        return None
    parents: Dict[int, List[int]] = {}
    groups: Dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as handle:
                # "pid (command) state ppid pgrp ...": the command may hold spaces and brackets.
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(name)
        parents.setdefault(int(fields[1]), []).append(pid)
        groups[pid] = int(fields[2])
    found: Dict[int, int] = {}
    pending = list(parents.get(root, []))
    while pending:
        pid = pending.pop()
        if pid not in found and pid in groups:
            found[pid] = groups[pid]
            pending.extend(parents.get(pid, []))
    return found

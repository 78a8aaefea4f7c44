"""Start the probe on a script in a subprocess and read its result (no torch needed here)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

PROBE_MODULE = "optimizer_codemod.verify.probe"
STDERR_TAIL_LINES = 30


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
            and self.result.get("status") in ("stopped", "finished")
        )

    @property
    def losses(self) -> List[float]:
        return list(self.result.get("losses", [])) if self.result else []

    @property
    def step_time(self) -> Optional[float]:
        return self.result.get("step_time") if self.result else None

    @property
    def peak_memory(self) -> Optional[int]:
        return self.result.get("peak_memory") if self.result else None

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        return "\n".join(self.stderr.rstrip().splitlines()[-lines:])

    def problem(self) -> Optional[str]:
        """Why this run cannot be compared, or None."""
        name = f"{self.label} script" if self.label else self.script
        if self.timed_out:
            return f"{name} did not finish in {self.seconds:.0f} s"
        if self.result is None:
            return f"{name} exited with code {self.returncode} before the probe wrote a result"
        if not self.ok:
            status = self.result.get("status")
            return f"{name} failed ({status}, exit code {self.returncode})"
        if not self.result.get("steps"):
            return f"{name} ran no optimizer step: is it a training script?"
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


def probe_command(script: str, args: Sequence[str], options: ProbeOptions, out: str) -> List[str]:
    command = [options.python]
    if options.nproc_per_node > 1:
        command += ["-m", "torch.distributed.run", "--standalone"]
        command += [f"--nproc-per-node={options.nproc_per_node}"]
    command += ["-m", PROBE_MODULE, "--steps", str(options.steps)]
    command += ["--warmup", str(options.warmup), "--out", out]
    if options.seed is not None:
        command += ["--seed", str(options.seed)]
    return command + ["--", script, *args]


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
            _kill_group(process)
            stdout, stderr = process.communicate()
        except BaseException:
            # Ctrl-C reaches only us (the run has its own session): end the run before leaving.
            _kill_group(process)
            process.wait()
            raise
        seconds = time.perf_counter() - started
        result = None
        if os.path.exists(out):
            with open(out, encoding="utf-8") as handle:
                result = json.load(handle)
    return ProbeRun(script, process.returncode, result, stdout, stderr, seconds, timed_out, label)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):  # pragma: no cover
        process.kill()

"""`optcodemod doctor`: what this machine offers a training script, and which rules pay off here.

The facts come from torch at run time (device, capability, bf16, TF32, pinned memory, whether
`torch.compile` works, tried in a subprocess with a timeout). Which rules pay off on such a
machine is decided in one place, `PAYOFF`: an entry per rule code, and one per code family
(`OPT3` …) for rules that have no entry of their own yet.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

PAYS_OFF, NO_GAIN, NO_SPEED_CHANGE = "pays off", "no gain here", "no speed change"


@dataclass
class CudaDevice:
    name: str
    capability: Tuple[int, int]
    memory_gib: float


@dataclass
class Machine:
    """What `doctor` found out; every field is plain data (JSON output)."""

    python: str
    platform: str
    torch: Optional[str]
    cpu: str
    cpu_cores: int
    usable_cores: int
    cpu_bf16_instructions: bool  # AVX512-BF16 or AMX: bf16 matmuls run natively on the CPU
    cuda: bool = False
    cuda_version: Optional[str] = None
    cudnn_version: Optional[int] = None
    devices: List[CudaDevice] = field(default_factory=list)
    cuda_bf16: bool = False
    tf32: bool = False  # a device of compute capability 8.0 (Ampere) or newer
    mps: bool = False
    pinned_memory: bool = False
    compile_works: Optional[bool] = None  # None: not checked, or timed out
    compile_seconds: Optional[float] = None
    compile_problem: Optional[str] = None

    @property
    def torch_version(self) -> Tuple[int, int]:
        parts = (self.torch or "0.0").split("+")[0].split(".")
        try:
            return int(parts[0]), int(parts[1])
        except (IndexError, ValueError):
            return (0, 0)

    @property
    def capability(self) -> Tuple[int, int]:
        return min((d.capability for d in self.devices), default=(0, 0))


@dataclass(frozen=True)
class Payoff:
    """Whether rules matching `prefix` pay off on a machine, and why."""

    prefix: str
    test: Callable[[Machine], str]  # returns PAYS_OFF, NO_GAIN or NO_SPEED_CHANGE
    why: str


def _cuda_and(condition: Callable[[Machine], bool]) -> Callable[[Machine], str]:
    return lambda m: PAYS_OFF if m.cuda and condition(m) else NO_GAIN


def _always(m: Machine) -> str:
    return PAYS_OFF


def _no_speed(m: Machine) -> str:
    return NO_SPEED_CHANGE


def _workers(m: Machine) -> str:
    return PAYS_OFF if m.usable_cores >= 2 else NO_GAIN


def _processes(m: Machine) -> str:
    # DDP runs one process per GPU, or several CPU processes over gloo.
    if m.cuda:
        return PAYS_OFF if len(m.devices) > 1 else NO_GAIN
    return _workers(m)


def _fused_optimizer(m: Machine) -> str:
    return PAYS_OFF if m.cuda or m.torch_version >= (2, 4) else NO_GAIN


def _compiles(m: Machine) -> str:
    return NO_GAIN if m.compile_works is False else PAYS_OFF


def _precision(m: Machine) -> str:
    if m.cuda and (m.cuda_bf16 or m.tf32):
        return PAYS_OFF
    return PAYS_OFF if m.cpu_bf16_instructions else NO_GAIN


# Most specific prefix wins. Family entries cover rules added later without an entry here.
PAYOFF: Tuple[Payoff, ...] = (
    Payoff("OPT101", _cuda_and(lambda m: m.pinned_memory), "pinned memory needs a CUDA device"),
    Payoff("OPT102", _workers, "workers prepare batches on other cores: needs 2 or more"),
    Payoff("OPT103", _workers, "persistent workers save their start-up each epoch"),
    Payoff("OPT104", _always, "one fetch per batch instead of one per item, on any device"),
    Payoff("OPT201", _cuda_and(lambda m: m.pinned_memory), "asynchronous copies need CUDA"),
    Payoff("OPT301", _cuda_and(lambda m: m.tf32), "TF32 tensor cores: CUDA capability 8.0+"),
    Payoff("OPT401", _cuda_and(lambda m: m.cudnn_version is not None), "cuDNN autotuner: CUDA"),
    Payoff("OPT501", _fused_optimizer, "fused kernels: CUDA, and CPU from torch 2.4"),
    Payoff("OPT502", _always, "skips writing zeros into every gradient, on any device"),
    Payoff("OPT1", _workers, "input pipeline: overlaps data loading with training"),
    Payoff("OPT2", _cuda_and(lambda m: True), "host/device transfers and syncs: accelerator"),
    Payoff("OPT3", _precision, "reduced precision: bf16/TF32 units (CUDA, or AVX512-BF16/AMX)"),
    Payoff("OPT402", _compiles, "torch.compile must work (it is emitted for CUDA only)"),
    Payoff("OPT408", _no_speed, "checkpoint keys without `_orig_mod.`: the same compiled code"),
    Payoff("OPT409", _compiles, "reports compile settings that undo compiling's gain"),
    Payoff("OPT410", _cuda_and(lambda m: True), "a report on the CUDA caching allocator"),
    Payoff("OPT4", _always, "fewer or faster kernels (attention, memory format), on any device"),
    Payoff("OPT5", _always, "optimizer work, on any device"),
    Payoff(
        "OPT601",
        _processes,
        "skips all-reduces of DDP: 2+ processes (GPUs, or CPU processes over gloo)",
    ),
    Payoff(
        "OPT602",
        lambda m: PAYS_OFF if m.cuda else NO_GAIN,
        "the write overlaps GPU work; on a CPU training already uses the cores (measured)",
    ),
    Payoff(
        "OPT604",
        _cuda_and(lambda m: len(m.devices) > 1),
        "DataParallel and DDP only split work across 2+ GPUs",
    ),
    Payoff("OPT6", _processes, "distributed training: 2+ processes"),
    Payoff("OPT703", _always, "debugging and per-step cleanup cost time on any device"),
    Payoff("OPT7", _always, "bug fixes: the script does what was meant, on any device"),
    Payoff("OPT8", _no_speed, "API modernisation: keeps the script running on new torch"),
)


def payoff_for(code: str) -> Optional[Payoff]:
    matching = [p for p in PAYOFF if code.upper().startswith(p.prefix)]
    return max(matching, key=lambda p: len(p.prefix), default=None)


def assess(machine: Machine, rules: Sequence[type]) -> List[Dict[str, str]]:
    rows = []
    for rule in rules:
        entry = payoff_for(rule.code)
        verdict = entry.test(machine) if entry else "unknown"
        why = entry.why if entry else "no entry in the doctor's table"
        if not machine.cuda and "cpu" not in rule.target_devices:
            # Not selected for the CPU target a machine without CUDA trains with.
            verdict, why = NO_GAIN, f"{rule.device_limit()}: not run for a CPU target"
        rows.append({"code": rule.code, "name": rule.name, "verdict": verdict, "why": why})
    return rows


# --- facts -------------------------------------------------------------------------------------

COMPILE_CHECK = """
import torch
def f(x):
    return torch.sin(x) * 2 + x.mean()
x = torch.randn(64)
assert torch.allclose(torch.compile(f)(x), f(x), atol=1e-5)
print("compile ok")
"""


def check_compile(
    timeout: float, python: str = sys.executable
) -> Tuple[Optional[bool], float, str]:
    """(works, seconds, problem): compile a tiny function in a fresh process, with a timeout."""
    if timeout <= 0:
        return None, 0.0, ""
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [python, "-c", COMPILE_CHECK], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - started, f"timed out after {timeout:g} s"
    seconds = time.perf_counter() - started
    if done.returncode == 0 and "compile ok" in done.stdout:
        return True, seconds, ""
    lines = (done.stderr or done.stdout).strip().splitlines()
    return False, seconds, lines[-1] if lines else f"exit code {done.returncode}"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def inspect_machine(compile_timeout: float = 120) -> Machine:
    flags = _cpu_flags()
    machine = Machine(
        python=platform.python_version(),
        platform=platform.platform(),
        torch=None,
        cpu=cpu_model(),
        cpu_cores=os.cpu_count() or 1,
        usable_cores=_usable_cores(),
        cpu_bf16_instructions=bool(flags & {"avx512_bf16", "amx_bf16"}),
    )
    try:
        import torch
    except ImportError:
        return machine
    machine.torch = torch.__version__
    machine.cuda = torch.cuda.is_available()
    machine.mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if machine.cuda:
        machine.cuda_version = torch.version.cuda
        machine.cudnn_version = (
            torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        )
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            machine.devices.append(
                CudaDevice(props.name, (props.major, props.minor), props.total_memory / 2**30)
            )
        machine.cuda_bf16 = torch.cuda.is_bf16_supported()
        machine.tf32 = machine.capability >= (8, 0)
        try:
            machine.pinned_memory = bool(torch.empty(1).pin_memory().is_pinned())
        except RuntimeError:
            machine.pinned_memory = False
    works, seconds, problem = check_compile(compile_timeout)
    machine.compile_works, machine.compile_seconds = works, round(seconds, 1)
    machine.compile_problem = problem or None
    return machine


# --- the command -------------------------------------------------------------------------------


def advice(machine: Machine) -> List[str]:
    """Settings to use for scripts that train on this machine."""
    if machine.cuda:
        return []
    # The rewrite is tuned for CUDA by default; on CPU some of it (fused attention under
    # bfloat16 autocast) is slower than what it replaces.
    return [
        'advice      no CUDA: set target-device = "cpu" in [tool.optcodemod] (or pass '
        "--target-device cpu) for scripts that train here"
    ]


def _yes(value: Optional[bool]) -> str:
    return "not checked" if value is None else ("yes" if value else "no")


def render(machine: Machine, rows: List[Dict[str, str]]) -> str:
    lines = [
        f"python      {machine.python} on {machine.platform}",
        f"torch       {machine.torch or 'not installed'}",
        f"cpu         {machine.cpu}: {machine.usable_cores} usable of {machine.cpu_cores} cores; "
        f"native bf16 instructions: {_yes(machine.cpu_bf16_instructions)}",
    ]
    if machine.cuda:
        for index, device in enumerate(machine.devices):
            major, minor = device.capability
            lines.append(
                f"cuda:{index}      {device.name}, capability {major}.{minor}, "
                f"{device.memory_gib:.0f} GiB"
            )
        lines.append(
            f"cuda        {machine.cuda_version}, cuDNN {machine.cudnn_version}; "
            f"bf16: {_yes(machine.cuda_bf16)}; TF32: {_yes(machine.tf32)}; "
            f"pinned memory: {_yes(machine.pinned_memory)}"
        )
    else:
        lines.append("cuda        not available (no pinned memory, no TF32)")
    if machine.mps:
        lines.append("mps         available")
    compiled = _yes(machine.compile_works)
    if machine.compile_problem and machine.compile_works is None:
        compiled = f"unknown ({machine.compile_problem})"
    elif machine.compile_works is not None:
        compiled += f" ({machine.compile_seconds:.1f} s"
        compiled += f": {machine.compile_problem})" if machine.compile_problem else ")"
    lines.append(f"compile     torch.compile works: {compiled}")
    lines += advice(machine)
    lines.append("")
    lines.append("Rules on this machine:")
    width = max((len(r["code"]) + len(r["name"]) + 1 for r in rows), default=0)
    verdict_width = max((len(r["verdict"]) for r in rows), default=0)
    for row in rows:
        label = f"{row['code']} {row['name']}".ljust(width)
        lines.append(f"  {label}  {row['verdict'].ljust(verdict_width)}  {row['why']}")
    return "\n".join(lines) + "\n"


def doctor_command(
    output_format: str = "text",
    compile_timeout: float = 120,
    echo: Optional[Callable[..., None]] = None,
) -> int:
    import click

    from optimizer_codemod.extras import missing_torch
    from optimizer_codemod.registry import all_rules

    echo = echo or click.echo
    machine = inspect_machine(compile_timeout)
    if machine.torch is None:
        echo(missing_torch("doctor") or "optcodemod doctor needs torch", err=True)
        return 2
    rows = assess(machine, all_rules())
    if output_format == "json":
        report = {"machine": asdict(machine), "rules": rows, "advice": advice(machine)}
        echo(json.dumps(report, indent=2))
    else:
        echo(render(machine, rows), nl=False)
    return 0

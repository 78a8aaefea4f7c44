"""Is the rewritten script equivalent? Run both under the probe and compare what they record.

`verify_script` rewrites a script with the engine and calls `verify_pair`, which writes the
rewritten text next to the original (same folder, so relative imports and data paths work),
runs original and rewritten alternately (ABBA order, so a machine that slows down or warms up
during the runs does not favour either), compares their loss curves with the tolerance of the
most permissive safety level among the applied fixes, and removes the temporary file.

The tolerances and the measurements behind them are in docs/verify.md.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from optimizer_codemod.rule import Safety
from optimizer_codemod.verify.runner import ProbeOptions, ProbeRun, declared_processes, run_probe

EXIT_EQUIVALENT, EXIT_DIFFERENT, EXIT_ERROR = 0, 1, 2
DEFAULT_STEPS, DEFAULT_REPEATS, DEFAULT_WARMUP = 20, 3, 3
# The tolerance grows to this multiple of the original's own run-to-run difference, when that is
# larger (a script whose kernels are not deterministic cannot be held to a tighter standard).
NOISE_FACTOR = 4.0


@dataclass(frozen=True)
class Tolerance:
    """How close two loss curves must be for fixes of one safety level.

    Losses `a` (original) and `b` (rewritten) agree when `|a - b| <= rtol * max(|a|, floor)`,
    with `floor = atol / rtol` so that losses near zero are compared absolutely. With
    `window > 1` the curves are first averaged over consecutive blocks of that many losses: a
    curve-level comparison, for fixes that may change random streams (data order, augmentation)
    and so move each step's loss but not the training.
    """

    level: Safety
    rtol: float
    atol: float
    window: int = 1

    @property
    def floor(self) -> float:
        return self.atol / self.rtol

    def describe(self) -> str:
        text = f"{self.rtol:.1e}"
        if self.window > 1:
            text += f" on means of {self.window} losses"
        return text


TOLERANCES: Dict[Safety, Tolerance] = {
    Safety.SAFE: Tolerance(Safety.SAFE, rtol=1e-5, atol=1e-6),
    Safety.NUMERICS: Tolerance(Safety.NUMERICS, rtol=2e-2, atol=1e-3),
    Safety.BEHAVIOR: Tolerance(Safety.BEHAVIOR, rtol=1e-1, atol=1e-2, window=5),
}


def tolerance_for(level: Safety) -> Tolerance:
    return TOLERANCES[min(level, Safety.BEHAVIOR)]


@dataclass
class Comparison:
    """Two loss curves side by side (block means when compared in windows), and how far apart."""

    before: List[float]
    after: List[float]
    differences: List[float]  # relative difference at each position
    length_before: int
    length_after: int

    @property
    def lengths_match(self) -> bool:
        return self.length_before == self.length_after

    @property
    def max_relative(self) -> float:
        return max(self.differences, default=0.0)

    @property
    def worst(self) -> Optional[int]:
        if not self.differences:
            return None
        return self.differences.index(self.max_relative)

    def first_beyond(self, rtol: float) -> Optional[int]:
        """The first position (0-based) whose difference exceeds `rtol`."""
        return next((i for i, d in enumerate(self.differences) if d > rtol), None)


def _blocks(values: Sequence[float], window: int) -> List[float]:
    if window <= 1:
        return list(values)
    return [
        sum(values[i : i + window]) / len(values[i : i + window])
        for i in range(0, len(values), window)
    ]


def relative_difference(a: float, b: float, floor: float) -> float:
    if math.isnan(a) and math.isnan(b):
        return 0.0
    if math.isnan(a) or math.isnan(b):
        return math.inf
    if a == b:  # equal infinities too
        return 0.0
    return abs(a - b) / max(abs(a), floor)


def compare_losses(before: Sequence[float], after: Sequence[float], tol: Tolerance) -> Comparison:
    a, b = _blocks(before, tol.window), _blocks(after, tol.window)
    differences = [relative_difference(x, y, tol.floor) for x, y in zip(a, b)]
    return Comparison(a, b, differences, len(before), len(after))


@dataclass
class VerifyReport:
    """Everything `verify` found out; `exit_code` and `render()` are what the command uses."""

    script: str
    level: Optional[Safety]
    tolerance: Optional[Tolerance]
    fixed: List[str] = field(default_factory=list)  # codes of the applied fixes, one per fix
    before: List[ProbeRun] = field(default_factory=list)
    after: List[ProbeRun] = field(default_factory=list)
    comparison: Optional[Comparison] = None
    noise: Optional[float] = None  # largest difference among the original's own runs
    error: Optional[str] = None
    unchanged: bool = False
    steps: int = DEFAULT_STEPS
    warmup: int = DEFAULT_WARMUP
    processes: int = 1  # per run: more than 1 under torchrun

    @property
    def flops_per_step(self) -> Optional[int]:
        """One step's floating-point operations, counted in the original's runs."""
        return next((r.flops_per_step for r in self.before if r.flops_per_step), None)

    @property
    def effective_rtol(self) -> Optional[float]:
        if self.tolerance is None:
            return None
        return max(self.tolerance.rtol, NOISE_FACTOR * (self.noise or 0.0))

    @property
    def equivalent(self) -> bool:
        if self.unchanged:
            return True
        if self.error or self.comparison is None:
            return False
        return (
            self.comparison.lengths_match
            and self.comparison.length_before > 0
            and self.comparison.max_relative <= self.effective_rtol
        )

    @property
    def exit_code(self) -> int:
        if self.error:
            return EXIT_ERROR
        return EXIT_EQUIVALENT if self.equivalent else EXIT_DIFFERENT

    def step_time(self, runs: List[ProbeRun]) -> Optional[float]:
        times = [run.step_time for run in runs if run.step_time is not None]
        return statistics.median(times) if times else None

    @property
    def speed_within_noise(self) -> bool:
        """Whether the two versions' step times, run by run, overlap (so do not tell them apart)."""
        before = [r.step_time for r in self.before if r.step_time is not None]
        after = [r.step_time for r in self.after if r.step_time is not None]
        if len(before) < 2 or len(after) < 2:
            return False
        return max(before) >= min(after) and max(after) >= min(before)

    @property
    def speedup(self) -> Optional[float]:
        before, after = self.step_time(self.before), self.step_time(self.after)
        if not before or not after:
            return None
        return before / after

    def render(self) -> str:
        return render(self)

    def to_json(self) -> Dict[str, Any]:
        def runs(items: List[ProbeRun]) -> List[Dict[str, Any]]:
            return [
                {"returncode": r.returncode, "seconds": r.seconds, "result": r.result}
                for r in items
            ]

        comparison = self.comparison
        return {
            "script": self.script,
            "fixed": self.fixed,
            "level": self.level.label if self.level is not None else None,
            "tolerance": (
                {
                    "rtol": self.tolerance.rtol,
                    "atol": self.tolerance.atol,
                    "window": self.tolerance.window,
                    "effective_rtol": self.effective_rtol,
                }
                if self.tolerance
                else None
            ),
            "max_relative_difference": comparison.max_relative if comparison else None,
            "noise": self.noise,
            "equivalent": self.equivalent,
            "exit_code": self.exit_code,
            "error": self.error,
            "unchanged": self.unchanged,
            "step_time_before": self.step_time(self.before),
            "step_time_after": self.step_time(self.after),
            "speedup": self.speedup,
            "processes": self.processes,
            "before": runs(self.before),
            "after": runs(self.after),
        }


def verify_pair(
    original: Union[str, os.PathLike],
    rewritten: Union[str, bytes],
    *,
    level: Safety = Safety.NUMERICS,
    fixed: Sequence[str] = (),
    args: Sequence[str] = (),
    steps: int = DEFAULT_STEPS,
    repeats: int = DEFAULT_REPEATS,
    warmup: Optional[int] = None,
    seed: Optional[int] = 0,
    timeout: Optional[float] = None,
    cwd: Optional[str] = None,
    nproc_per_node: Optional[int] = None,
    on_run: Optional[Callable[[ProbeRun], None]] = None,
    count_flops: bool = False,
) -> VerifyReport:
    """Run `original` and the `rewritten` text of it alternately; compare at `level`'s tolerance.

    The rewritten text is written to a temporary file in the original's folder, removed after.
    `nproc_per_node` None: as the original declares (`# bench: torchrun --nproc-per-node N`),
    else one process. `count_flops`: the original's runs count one warm-up step's floating-point
    operations (the rewrite computes the same model; it may compile, which the counter must
    not watch).
    """
    original = os.fspath(original)
    if nproc_per_node is None:
        nproc_per_node = declared_processes(original) or 1
    warmup = min(DEFAULT_WARMUP if warmup is None else warmup, steps - 1)
    tolerance = tolerance_for(level)
    report = VerifyReport(
        original,
        level,
        tolerance,
        list(fixed),
        steps=steps,
        warmup=max(warmup, 0),
        processes=nproc_per_node,
    )
    options = ProbeOptions(
        steps=steps,
        warmup=report.warmup,
        seed=seed,
        timeout=timeout,
        cwd=cwd,
        nproc_per_node=nproc_per_node,
    )
    folder = os.path.dirname(os.path.abspath(original))
    stem = os.path.splitext(os.path.basename(original))[0]
    data = rewritten.encode("utf-8") if isinstance(rewritten, str) else rewritten
    handle, temporary = tempfile.mkstemp(
        prefix=f".{stem}.optcodemod-verify-", suffix=".py", dir=folder
    )
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        _run_alternately(
            report, original, temporary, args, options, max(repeats, 1), on_run, count_flops
        )
    finally:
        os.unlink(temporary)
    if report.error is None:
        _compare(report)
    return report


def _run_alternately(
    report: VerifyReport,
    original: str,
    temporary: str,
    args: Sequence[str],
    options: ProbeOptions,
    repeats: int,
    on_run: Optional[Callable[[ProbeRun], None]],
    count_flops: bool = False,
) -> None:
    scripts = {
        "original": (original, report.before, replace(options, count_flops=count_flops)),
        "rewritten": (temporary, report.after, options),
    }
    for repeat in range(repeats):
        order = ("original", "rewritten") if repeat % 2 == 0 else ("rewritten", "original")
        for label in order:
            path, runs, run_options = scripts[label]
            run = run_probe(path, args, run_options, label=label)
            runs.append(run)
            if on_run is not None:
                on_run(run)
            problem = run.problem()
            if problem is not None:
                report.error = _crash_message(label, problem, run, report.before)
                return


def _crash_message(label: str, problem: str, run: ProbeRun, before: List[ProbeRun]) -> str:
    lines = [f"The {problem}" + ("" if problem.endswith(("?", ".")) else ".")]
    if label == "rewritten" and any(r.ok for r in before):
        lines.append(
            "The original script ran; the rewrite broke it. Please report this with the script."
        )
    tail = run.stderr_tail()
    if tail:
        lines += ["Last lines of its stderr:", tail]
    return "\n".join(lines)


def _compare(report: VerifyReport) -> None:
    tolerance = report.tolerance
    reference = report.before[0].losses
    if not reference:
        report.error = (
            "The original recorded no loss: it never called backward() on a one-element "
            "tensor, so there is nothing to compare."
        )
        return
    noise = [compare_losses(reference, run.losses, tolerance) for run in report.before[1:]]
    report.noise = max((c.max_relative for c in noise if c.lengths_match), default=None)
    comparisons = [compare_losses(reference, run.losses, tolerance) for run in report.after]
    mismatched = [c for c in comparisons if not c.lengths_match]
    report.comparison = mismatched[0] if mismatched else max(comparisons, key=_largest)


def _largest(comparison: Comparison) -> float:
    return comparison.max_relative


def verify_script(
    path: str,
    settings: Any = None,
    *,
    args: Sequence[str] = (),
    steps: int = DEFAULT_STEPS,
    repeats: int = DEFAULT_REPEATS,
    warmup: Optional[int] = None,
    seed: Optional[int] = 0,
    timeout: Optional[float] = None,
    nproc_per_node: Optional[int] = None,
    on_run: Optional[Callable[[ProbeRun], None]] = None,
) -> VerifyReport:
    """Rewrite `path` with `settings` (defaults: the built-in ones) and verify the result."""
    from optimizer_codemod.api import is_notebook, rewrite_source
    from optimizer_codemod.config import Settings
    from optimizer_codemod.diagnostics import Status
    from optimizer_codemod.errors import OptcodemodError

    if is_notebook(path):
        return VerifyReport(
            path, None, None, error=f"{path}: verify runs .py scripts, not notebooks"
        )
    settings = settings or Settings()
    try:
        with open(path, "rb") as handle:
            src = handle.read()
        result = rewrite_source(src, path, settings.options_for(path))
    except OSError as exc:
        return VerifyReport(path, None, None, error=f"{path}: {exc.strerror or exc}")
    except OptcodemodError as error:
        return VerifyReport(path, None, None, error=error.render())
    fixed = [d for d in result.diagnostics if d.status is Status.FIXED]
    if not result.changed:
        return VerifyReport(path, None, None, unchanged=True)
    level = max(d.safety for d in fixed) if fixed else Safety.SAFE
    return verify_pair(
        path,
        result.new,
        level=level,
        fixed=[d.code for d in fixed],
        args=args,
        steps=steps,
        repeats=repeats,
        warmup=warmup,
        seed=seed,
        timeout=timeout,
        nproc_per_node=nproc_per_node,
        on_run=on_run,
    )


# --- the table -------------------------------------------------------------------------------


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def _time_cell(runs: List[ProbeRun], median: Optional[float]) -> str:
    """The median step time, with the range over runs when there are several."""
    times = [run.step_time for run in runs if run.step_time is not None]
    if len(times) < 2:
        return _duration(median)
    low, high = _duration(min(times)), _duration(max(times))
    if low.split()[-1] == high.split()[-1]:  # same unit: "19.9 ms (18.4-22.9)"
        low, high = low.split()[0], high.split()[0]
    return f"{_duration(median)} ({low}-{high})"


def _memory(value: Optional[int]) -> str:
    if value is None:
        return "n/a"
    return f"{value / 2**20:.0f} MiB"


def _loss(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def _first(runs: List[ProbeRun], key: str, default: Any = None) -> Any:
    for run in runs:
        if run.result and run.result.get(key) is not None:
            return run.result[key]
    return default


def render(report: VerifyReport) -> str:
    if report.unchanged:
        return f"{report.script}: nothing to verify: no fix applies with these settings.\n"
    lines: List[str] = []
    if report.fixed:
        codes = ", ".join(sorted(set(report.fixed)))
        level = report.level.label if report.level is not None else "?"
        lines.append(
            f"{report.script}: {len(report.fixed)} fixes applied ({codes}); "
            f"most permissive level: {level}"
        )
    if report.before or report.after:
        device = _first(report.before + report.after, "device", "?")
        name = _first(report.before + report.after, "device_name", "")
        torch = _first(report.before + report.after, "torch", "?")
        launch = f"; torchrun, {report.processes} processes" if report.processes > 1 else ""
        lines.append(
            f"runs: {len(report.before)} original, {len(report.after)} rewritten, alternating; "
            f"{report.steps} steps each ({report.warmup} warm-up){launch}; "
            f"{device} ({name}), torch {torch}"
        )
    if report.error:
        lines.append("")
        lines.append(f"error: {report.error}")
        return "\n".join(lines) + "\n"
    lines.append("")
    rows = [("", "original", "rewritten", "")]
    rows.append(
        ("steps", str(_first(report.before, "steps", 0)), str(_first(report.after, "steps", 0)), "")
    )
    comparison = report.comparison
    if comparison is not None:
        rows.append(("losses", str(comparison.length_before), str(comparison.length_after), ""))
        last_before = report.before[0].losses[-1:] or [None]
        last_after = report.after[0].losses[-1:] or [None]
        rows.append(("last loss", _loss(last_before[0]), _loss(last_after[0]), ""))
    speedup = report.speedup
    rows.append(
        (
            _step_time_label(report),
            _time_cell(report.before, report.step_time(report.before)),
            _time_cell(report.after, report.step_time(report.after)),
            f"speedup {speedup:.2f}x" if speedup else "speedup n/a",
        )
    )
    kind = _first(report.before, "peak_memory_kind", "")
    rows.append(
        (
            "peak memory" + (" (CUDA)" if kind.startswith("cuda") else " (host RSS)"),
            _memory(_peak(report.before)),
            _memory(_peak(report.after)),
            "",
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        line = f"{row[0].ljust(widths[0])}  {row[1].rjust(widths[1])}  {row[2].rjust(widths[2])}"
        lines.append((line + ("  " + row[3] if row[3] else "")).rstrip())
    lines.append("")
    lines.extend(_verdict(report))
    return "\n".join(lines) + "\n"


def _step_time_label(report: VerifyReport) -> str:
    device = _first(report.before, "device", "cpu")
    return "step time (median)" if device == "cpu" else "step time (mean)"


def _peak(runs: List[ProbeRun]) -> Optional[int]:
    values = [run.peak_memory for run in runs if run.peak_memory is not None]
    return max(values) if values else None


def _verdict(report: VerifyReport) -> List[str]:
    comparison, tolerance = report.comparison, report.tolerance
    assert comparison is not None and tolerance is not None
    level = tolerance.level.label
    lines = []
    if not comparison.lengths_match:
        lines.append(
            f"Losses disagree: the original recorded {comparison.length_before} losses, "
            f"the rewritten script {comparison.length_after}."
        )
        return lines
    rtol = report.effective_rtol
    tolerance_text = f"tolerance {rtol:.1e} for {level} fixes"
    if tolerance.window > 1:
        tolerance_text += f", on means of {tolerance.window} consecutive losses"
    lines.append(
        f"loss agreement: max relative difference {comparison.max_relative:.1e} "
        f"({tolerance_text})"
    )
    if report.noise and rtol > tolerance.rtol:
        lines.append(
            f"note: the original's own runs differ by up to {report.noise:.1e}; the tolerance "
            f"was widened to {NOISE_FACTOR:g}x that (its kernels or data are not deterministic)."
        )
    first = comparison.first_beyond(rtol)
    if comparison.length_before == 0:
        lines.append("No losses recorded: no backward() on a one-element tensor was seen.")
    elif first is None:
        speedup = report.speedup
        faster = f"; speedup {speedup:.2f}x" if speedup else ""
        if speedup and report.speed_within_noise:
            faster += " (within run-to-run noise: the runs' step times overlap)"
        lines.append(f"Equivalent: the losses agree within tolerance{faster}.")
    else:
        if tolerance.window > 1:
            last = min((first + 1) * tolerance.window, comparison.length_before)
            where = f"the mean of losses {first * tolerance.window + 1}-{last}"
        else:
            where = f"step {first + 1}"
        lines.append(
            f"Losses disagree at {where}: original {_loss(comparison.before[first])}, "
            f"rewritten {_loss(comparison.after[first])} (relative difference "
            f"{comparison.differences[first]:.1e} > {rtol:.1e})."
        )
    return lines


# --- the command -----------------------------------------------------------------------------


def verify_command(
    script: str,
    script_args: Sequence[str],
    settings: Any,
    *,
    steps: int = DEFAULT_STEPS,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    timeout: Optional[float] = None,
    nproc_per_node: Optional[int] = None,
    json_path: Optional[str] = None,
    echo: Optional[Callable[..., None]] = None,
) -> int:
    """What `optcodemod verify` does: verify, print progress and the table; the exit code."""
    import click

    echo = echo or click.echo
    total = 2 * repeats
    done: List[ProbeRun] = []

    def progress(run: ProbeRun) -> None:
        done.append(run)
        state = "ok" if run.ok else "failed"
        echo(f"run {len(done)}/{total}: {run.label} {state} in {run.seconds:.1f} s", err=True)

    report = verify_script(
        script,
        settings,
        args=script_args,
        steps=steps,
        repeats=repeats,
        warmup=warmup,
        timeout=timeout,
        nproc_per_node=nproc_per_node,
        on_run=progress,
    )
    echo(report.render(), nl=False)
    if json_path:
        import json

        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump(report.to_json(), handle, indent=1)
    return report.exit_code

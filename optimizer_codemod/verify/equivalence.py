"""Is the rewritten script equivalent? Run both under the probe and judge what they record.

`verify_pair` runs an original and a candidate (the engine's rewrite, or any version a person
wrote: `verify A --against B`):

1. the original once with its training state recorded at a few iterations, and the candidate
   once stepping from each recorded state: the local error (judgment.py);
2. both alternately, `repeats` times each (ABBA order, so a machine that slows down or warms up
   during the runs favours neither): their free loss curves and step times;
3. when the loss curves differ by more than a fifth of the level's floor, perturbed runs of the
   original: the chaos envelope the trajectory is judged against.

A candidate given as text is written next to the original (same folder, so relative imports
and data paths work) and removed after. The tolerances and the measurements behind them are in
docs/verify.md.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from optimizer_codemod.rule import Safety
from optimizer_codemod.verify.judgment import (
    ENVELOPE_FACTOR,
    FALLBACK_RELATIVE_NOISE,
    MARGIN_GOAL,
    PERTURBED_RUNS,
    TOLERANCES,
    Comparison,
    LocalJudgment,
    Tolerance,
    TrajectoryJudgment,
    compare_losses,
    judge_local,
    judge_trajectory,
    rounding_of,
    relative_difference,
    tolerance_for,
)
from optimizer_codemod.verify.runner import ProbeOptions, ProbeRun, declared_processes, run_probe

__all__ = [
    "TOLERANCES",
    "Comparison",
    "Tolerance",
    "VerifyReport",
    "compare_losses",
    "relative_difference",
    "tolerance_for",
    "verify_pair",
    "verify_script",
]

EXIT_EQUIVALENT, EXIT_DIFFERENT, EXIT_ERROR = 0, 1, 2
DEFAULT_STEPS, DEFAULT_REPEATS, DEFAULT_WARMUP = 20, 3, 3
# A speed ratio within this factor of the runs' own spread is "within noise".
SPREAD_QUANTILES = (0.25, 0.75)


def check_iterations(steps: int) -> List[int]:
    """Where the local check steps the candidate from the original's state."""
    if steps < 2:
        return []
    return sorted({2, max(2, (steps + 1) // 2), steps})


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
    candidate: Optional[str] = None  # `--against`: the candidate's path
    local: Optional[LocalJudgment] = None
    trajectory: Optional[TrajectoryJudgment] = None
    recorded: Optional[ProbeRun] = None  # the original's run that recorded its states
    stepped: Optional[ProbeRun] = None  # the candidate's run that stepped from them
    rounding: Optional[ProbeRun] = None  # the original under bfloat16 autocast, stepped the same
    rounding_rejected: Optional[Dict[str, float]] = None  # its figures, when beyond rounding
    rounding_trajectory: Optional[ProbeRun] = None  # the original under bfloat16, run freely
    perturbed: List[ProbeRun] = field(default_factory=list)
    modules: Dict[str, List[str]] = field(default_factory=dict)  # project: fixes per module

    @property
    def flops_per_step(self) -> Optional[int]:
        """One step's floating-point operations, counted in the original's runs."""
        return next((r.flops_per_step for r in self.before if r.flops_per_step), None)

    @property
    def effective_rtol(self) -> Optional[float]:
        if self.tolerance is None:
            return None
        if self.trajectory is not None and self.comparison is not None:
            worst = self.comparison.worst
            return self.trajectory.threshold(worst if worst is not None else 0)
        return self.tolerance.rtol

    @property
    def equivalent(self) -> bool:
        if self.unchanged:
            return True
        if self.error or self.trajectory is None:
            return False
        return self.trajectory.passed and (self.local is None or self.local.passed)

    @property
    def margin(self) -> Optional[float]:
        """How far below its threshold the closest figure is (above 1: passes)."""
        if self.trajectory is None:
            return None
        margins = [self.trajectory.margin]
        if self.local is not None and self.local.margin is not None:
            margins.append(self.local.margin)
        return min(margins)

    @property
    def decided_by(self) -> Optional[str]:
        """Which check decided the verdict (the failing one, or the one with least margin)."""
        if self.trajectory is None:
            return None
        if self.local is not None and not self.local.passed:
            return "local"
        if not self.trajectory.passed:
            return "trajectory"
        local = self.local.margin if self.local is not None else None
        if local is not None and local < self.trajectory.margin:
            return "local"
        return "trajectory"

    @property
    def exit_code(self) -> int:
        if self.error:
            return EXIT_ERROR
        return EXIT_EQUIVALENT if self.equivalent else EXIT_DIFFERENT

    def step_time(self, runs: List[ProbeRun]) -> Optional[float]:
        times = [run.step_time for run in runs if run.step_time is not None]
        return statistics.median(times) if times else None

    def spread(self, runs: List[ProbeRun]) -> Optional[float]:
        """Upper over lower quartile of every measured step of `runs` (1.0: no spread)."""
        times = sorted(t for run in runs for t in (run.result or {}).get("step_times") or [])
        if len(times) < 4:
            return None
        low, high = (times[int(q * (len(times) - 1))] for q in SPREAD_QUANTILES)
        return high / low if low > 0 else None

    @property
    def speed_within_noise(self) -> bool:
        """Whether run-to-run or step-to-step spread could explain the speed ratio."""
        before = [r.step_time for r in self.before if r.step_time is not None]
        after = [r.step_time for r in self.after if r.step_time is not None]
        if len(before) >= 2 and len(after) >= 2:
            if max(before) >= min(after) and max(after) >= min(before):
                return True
        speedup = self.speedup
        if not speedup:
            return False
        ratio = max(speedup, 1 / speedup)
        spreads = [s for s in (self.spread(self.before), self.spread(self.after)) if s]
        return bool(spreads) and ratio <= max(spreads)

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
        local, trajectory = self.local, self.trajectory
        return {
            "script": self.script,
            "candidate": self.candidate,
            "fixed": self.fixed,
            "modules": self.modules,
            "level": self.level.label if self.level is not None else None,
            "tolerance": (
                {
                    "rtol": self.tolerance.rtol,
                    "atol": self.tolerance.atol,
                    "window": self.tolerance.window,
                    "effective_rtol": self.effective_rtol,
                    "local_loss": _finite(self.tolerance.local_loss),
                    "local_gradient": _finite(self.tolerance.local_gradient),
                    "local_update": _finite(self.tolerance.local_update),
                }
                if self.tolerance
                else None
            ),
            "max_relative_difference": comparison.max_relative if comparison else None,
            "local": (
                {
                    "judged": local.judged,
                    "passed": local.passed,
                    "margin": _finite(local.margin),
                    "unavailable": local.unavailable,
                    "steps": [vars(step) for step in local.steps],
                }
                if local
                else None
            ),
            "trajectory": (
                {
                    "passed": trajectory.passed,
                    "margin": _finite(trajectory.margin),
                    "envelope": trajectory.envelope,
                    "perturbed_runs": trajectory.perturbed_runs,
                    "rounding_envelope": trajectory.rounding_envelope,
                }
                if trajectory
                else None
            ),
            "margin": _finite(self.margin),
            "decided_by": self.decided_by,
            "noise": self.noise,
            "equivalent": self.equivalent,
            "exit_code": self.exit_code,
            "error": self.error,
            "unchanged": self.unchanged,
            "step_time_before": self.step_time(self.before),
            "step_time_after": self.step_time(self.after),
            "speedup": self.speedup,
            "speed_within_noise": self.speed_within_noise,
            "processes": self.processes,
            "before": runs(self.before),
            "after": runs(self.after),
            "perturbed": runs(self.perturbed),
            "rounding_trajectory": runs(
                [self.rounding_trajectory] if self.rounding_trajectory else []
            ),
        }


def _finite(value: Optional[float]) -> Optional[float]:
    return value if value is None or math.isfinite(value) else None


def verify_pair(
    original: Union[str, os.PathLike],
    candidate: Union[str, bytes, os.PathLike],
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
    local_check: bool = True,
    candidate_path: Optional[str] = None,
) -> VerifyReport:
    """Run `original` and `candidate` and judge them at `level`.

    `candidate`: the candidate's text (str or bytes), written to a temporary file next to the
    original and removed after; or, with `candidate_path`, a script that already exists (then
    `candidate` is ignored). `nproc_per_node` None: as the original declares (`# bench:
    torchrun --nproc-per-node N`), else one process. `count_flops`: the original's runs count
    one warm-up step's floating-point operations. `local_check` False: trajectory only (the
    ablation rows of bench, which measure speed).
    """
    original = os.fspath(original)
    if nproc_per_node is None:
        nproc_per_node = declared_processes(original) or 1
    warmup = min(DEFAULT_WARMUP if warmup is None else warmup, steps - 1)
    report = VerifyReport(
        original,
        level,
        tolerance_for(level),
        list(fixed),
        steps=steps,
        warmup=max(warmup, 0),
        processes=nproc_per_node,
        candidate=candidate_path,
    )
    options = ProbeOptions(
        steps=steps,
        warmup=report.warmup,
        seed=seed,
        timeout=timeout,
        cwd=cwd,
        nproc_per_node=nproc_per_node,
    )
    temporary = None
    if candidate_path is None:
        folder = os.path.dirname(os.path.abspath(original))
        stem = os.path.splitext(os.path.basename(original))[0]
        data = candidate.encode("utf-8") if isinstance(candidate, str) else candidate
        handle, temporary = tempfile.mkstemp(
            prefix=f".{stem}.optcodemod-verify-", suffix=".py", dir=folder
        )
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)  # type: ignore[arg-type]
    scripts = {"original": original, "rewritten": candidate_path or temporary}
    work = tempfile.mkdtemp(prefix="optcodemod-verify-")
    try:
        _run_all(
            report, scripts, args, options, max(repeats, 1), on_run, count_flops, work, local_check
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if temporary is not None:
            os.unlink(temporary)
    return report


def _run_all(
    report: VerifyReport,
    scripts: Dict[str, str],
    args: Sequence[str],
    options: ProbeOptions,
    repeats: int,
    on_run: Optional[Callable[[ProbeRun], None]],
    count_flops: bool,
    work: str,
    local_check: bool,
) -> None:
    def run(label: str, run_options: ProbeOptions, fatal: bool = True) -> Optional[ProbeRun]:
        done = run_probe(
            scripts["original" if label.startswith("original") else "rewritten"],
            args,
            run_options,
            label=label,
        )
        if on_run is not None:
            on_run(done)
        problem = done.problem()
        if problem is not None and not fatal:
            return None  # a reference that cannot run (bfloat16 everywhere) leaves fixed limits
        if problem is not None:
            report.error = _crash_message(
                label, problem, done, report.before + report.perturbed, report.recorded
            )
            return None
        return done

    iterations = check_iterations(options.steps) if local_check else []
    if iterations:
        shared = dict(check_at=tuple(iterations), check_dir=work)
        report.recorded = run("original", replace(options, check_role="record", **shared))
        if report.recorded is None:
            return
        if report.tolerance is not None and report.tolerance.rounding_factor is not None:
            report.rounding = run(
                "original (bfloat16 reference)",
                replace(options, check_role="compare", reference_autocast=True, **shared),
                fatal=False,
            )
        report.stepped = run("rewritten", replace(options, check_role="compare", **shared))
        if report.stepped is None:
            return
    timed = {
        "original": (report.before, replace(options, count_flops=count_flops)),
        "rewritten": (report.after, options),
    }
    for repeat in range(repeats):
        order = ("original", "rewritten") if repeat % 2 == 0 else ("rewritten", "original")
        for label in order:
            runs, run_options = timed[label]
            done = run(label, run_options)
            if done is None:
                return
            runs.append(done)
    _judge(report)
    if report.trajectory is None or report.trajectory.margin >= MARGIN_GOAL:
        return
    if report.local is not None and not report.local.passed:
        return  # decided; and a wrong step's error would size a meaninglessly wide envelope
    sizes = report.local.update_errors(_checks(report.stepped)) if report.local else {}
    if report.local is not None and report.local.judged and not any(sizes.values()):
        return  # the candidate's steps equal the original's: chaos has nothing to amplify
    if report.rounding is not None and report.rounding_rejected is None:
        # Autocast rounds the same way every step: a bias, which noise of the rewrite's own
        # update error does not reproduce (the naive GPT's rewrite drifted 23x farther than
        # such noise on an AVX512-BF16 Xeon). The original's own drift under bfloat16 does.
        report.rounding_trajectory = run(
            "original (bfloat16 reference)", replace(options, reference_autocast=True), False
        )
        if report.rounding_trajectory is not None:
            _judge(report)
            if report.trajectory is None or report.trajectory.margin >= MARGIN_GOAL:
                return
    noise: Dict[str, Any] = {"perturb_relative": FALLBACK_RELATIVE_NOISE}
    if any(sizes.values()):
        path = os.path.join(work, "perturbation.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(sizes, handle)
        noise = {"perturb": path}
    for index in range(PERTURBED_RUNS):
        done = run("original (perturbed)", replace(options, perturb_seed=index + 1, **noise))
        if done is None:
            return
        report.perturbed.append(done)
    _judge(report)


def _checks(run: Optional[ProbeRun]) -> List[Dict[str, Any]]:
    check = ((run.result or {}).get("check") if run else None) or {}
    return check.get("checks") or []


def _crash_message(
    label: str,
    problem: str,
    run: ProbeRun,
    before: List[ProbeRun],
    recorded: Optional[ProbeRun] = None,
) -> str:
    lines = [f"The {problem}" + ("" if problem.endswith(("?", ".")) else ".")]
    original_ran = any(r.ok for r in before) or (recorded is not None and recorded.ok)
    if label == "rewritten" and original_ran:
        lines.append(
            "The original script ran; the rewrite broke it. Please report this with the script."
        )
    tail = run.stderr_tail()
    if tail:
        lines += ["Last lines of its stderr:", tail]
    return "\n".join(lines)


def _compare(report: VerifyReport) -> None:
    """Judge from the runs recorded so far (kept for callers that build a report by hand)."""
    _judge(report)


def _judge(report: VerifyReport) -> None:
    tolerance = report.tolerance
    assert tolerance is not None
    reference_run = report.recorded or (report.before[0] if report.before else None)
    reference = reference_run.losses if reference_run else []
    if not reference:
        report.error = (
            "The original recorded no loss: it never called backward() on a one-element "
            "tensor, so there is nothing to compare."
        )
        return
    own = [r for r in report.before if r is not reference_run]
    noise = [compare_losses(reference, run.losses, tolerance) for run in own]
    report.noise = max((c.max_relative for c in noise if c.lengths_match), default=None)
    if report.stepped is not None:
        rounding = None
        if report.rounding is not None:
            rounding = rounding_of(tolerance, (report.rounding.result or {}).get("check"))
            if rounding.get("loss", 0.0) > tolerance.local_loss:
                # bfloat16 everywhere changed what this script computes, not just its rounding
                # (measured: a ResNet that stops learning under it): the fixed limits hold.
                report.rounding_rejected = rounding
                rounding = None
        report.local = judge_local(
            tolerance, (report.stepped.result or {}).get("check"), rounding or None
        )
        error = (report.stepped.result or {}).get("check_error")
        if error:
            report.local.unavailable = "the check failed: " + error.strip().splitlines()[-1]
    # The original's own runs differ when its kernels or data are not deterministic: those
    # runs are then perturbed references too.
    perturbed = [run.losses for run in report.perturbed]
    if report.noise:
        perturbed += [run.losses for run in own]
    drift = None
    if report.rounding_trajectory is not None and report.rounding_rejected is None:
        drift = report.rounding_trajectory.losses
    report.trajectory = judge_trajectory(
        tolerance, reference, [run.losses for run in report.after], perturbed, drift
    )
    report.comparison = report.trajectory.comparison


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
    """Rewrite `path` and the local modules it imports with `settings`; verify the result."""
    from optimizer_codemod.api import is_notebook, rewrite_source
    from optimizer_codemod.config import Settings
    from optimizer_codemod.diagnostics import Status
    from optimizer_codemod.errors import OptcodemodError
    from optimizer_codemod.verify.project import local_modules, remove_shadow, shadow_folder

    if is_notebook(path):
        return VerifyReport(
            path, None, None, error=f"{path}: verify runs .py scripts, not notebooks"
        )
    settings = settings or Settings()
    root = os.path.dirname(os.path.abspath(path))
    rewritten: Dict[str, bytes] = {}
    modules: Dict[str, List[str]] = {}
    fixed = []
    for file in [os.path.abspath(path)] + local_modules(path):
        shown = path if file == os.path.abspath(path) else os.path.relpath(file, root)
        try:
            with open(file, "rb") as handle:
                src = handle.read()
            result = rewrite_source(src, shown, settings.options_for(file))
        except OSError as exc:
            return VerifyReport(path, None, None, error=f"{shown}: {exc.strerror or exc}")
        except OptcodemodError as error:
            return VerifyReport(path, None, None, error=error.render())
        if result.changed:
            rewritten[file] = result.new
            codes = [d for d in result.diagnostics if d.status is Status.FIXED]
            fixed += codes
            modules[shown] = [d.code for d in codes]
    if not rewritten:
        return VerifyReport(path, None, None, unchanged=True)
    level = max(d.safety for d in fixed) if fixed else Safety.SAFE
    common = dict(
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
    if list(rewritten) == [os.path.abspath(path)]:
        return verify_pair(path, rewritten[os.path.abspath(path)], **common)
    driver = os.path.abspath(path)
    if driver not in rewritten:
        with open(driver, "rb") as handle:
            rewritten[driver] = handle.read()
    shadow = shadow_folder(root, rewritten)
    try:
        report = verify_pair(
            path, b"", candidate_path=os.path.join(shadow, os.path.basename(path)), **common
        )
    finally:
        remove_shadow(shadow)
    report.candidate = None
    report.modules = modules
    return report


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
    if report.candidate:
        level = report.level.label if report.level is not None else "?"
        lines.append(f"{report.script} against {report.candidate}: judged at the {level} level")
    for module, codes in sorted(report.modules.items()):
        lines.append(f"  {module}: {len(codes)} fixes ({', '.join(sorted(set(codes)))})")
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


def verdict_lines(report: VerifyReport) -> List[str]:
    """Why the report judged as it did: its local and trajectory figures (none when unjudged)."""
    if report.error or report.unchanged or report.comparison is None:
        return []
    return _verdict(report)


def _verdict(report: VerifyReport) -> List[str]:
    comparison, tolerance, trajectory = report.comparison, report.tolerance, report.trajectory
    assert comparison is not None and tolerance is not None and trajectory is not None
    level = tolerance.level.label
    if not comparison.lengths_match:
        return [
            f"Losses disagree: the original recorded {comparison.length_before} losses, "
            f"the rewritten script {comparison.length_after}."
        ]
    if comparison.length_before == 0:
        return ["No losses recorded: no backward() on a one-element tensor was seen."]
    lines = _local_lines(report.local, level) + _trajectory_lines(trajectory, level, report)
    if report.rounding_rejected:
        lines.insert(
            1,
            f"note: under bfloat16 autocast everywhere this script's loss moved by "
            f"{report.rounding_rejected['loss']:.1e} in one step: more than rounding, so the "
            f"local check keeps the {level} level's fixed limits.",
        )
    if report.equivalent:
        speedup = report.speedup
        faster = f"; speedup {speedup:.2f}x" if speedup else ""
        if speedup and report.speed_within_noise:
            faster += " (within run-to-run noise: the step times' spread could explain it)"
        margin = report.margin
        closest = f", {margin:.0f}x below the closest threshold" if margin and margin < 1e6 else ""
        lines.append(f"Equivalent ({report.decided_by} check closest{closest}){faster}.")
    else:
        lines.append(f"Not equivalent: decided by the {report.decided_by} check.")
    spread = max(
        (s for s in (report.spread(report.before), report.spread(report.after)) if s), default=1
    )
    if spread > 1.2:
        lines.append(
            f"note: step times vary {spread:.1f}x between the quartiles of steps: the machine "
            f"is busy or the steps differ; more --repeats and --steps give a steadier ratio."
        )
    return lines


def _local_lines(local: Optional[LocalJudgment], level: str) -> List[str]:
    if local is None:
        return []
    if local.unavailable:
        return [f"local check: not run ({local.unavailable})."]
    worst = local.worst
    if worst is None:
        return []
    step, what, limit, value = worst
    if not local.judged:
        return [
            f"local check (reported, not judged for {level} fixes, which may change random "
            f"streams): largest {what} difference {value:.1e} at iteration {step.iteration}."
        ]
    if what == "structure":
        return [f"local check: FAILED at iteration {step.iteration}: {step.problem}."]
    measured = [s for s in local.steps if s.problem is None]
    figures = ", ".join(
        f"{metric} {max((getattr(s, metric) or 0.0) for s in measured):.1e} "
        f"(limit {local.limit(metric):.2g})"
        for metric in ("loss", "gradient", "update")
    )
    basis = ""
    if local.rounding:
        rounding = ", ".join(f"{m} {v:.1e}" for m, v in sorted(local.rounding.items()))
        basis = (
            f" Limits: the {level} level's, or {local.tolerance.rounding_factor:g}x what bfloat16 "
            f"rounding alone does to this script ({rounding}), whichever is larger."
        )
    iterations = ", ".join(str(s.iteration) for s in local.steps)
    if local.passed:
        return [
            f"local check: one step from the original's own state at iterations {iterations} "
            f"differs by at most: {figures}.{basis}"
        ]
    return [
        f"local check: FAILED: one step from the original's own state at iteration "
        f"{step.iteration} gives a {what} {value:.1e} away from the original's "
        f"(limit {limit:.2g} for {level} fixes): the rewrite computes something else, "
        f"not just rounding it differently. All figures: {figures}.{basis}"
    ]


def _trajectory_lines(
    trajectory: TrajectoryJudgment, level: str, report: VerifyReport
) -> List[str]:
    comparison, tolerance = trajectory.comparison, trajectory.tolerance
    unit = "step" if tolerance.window <= 1 else f"mean of {tolerance.window} losses"
    worst = comparison.worst or 0
    threshold = trajectory.threshold(worst)
    parts = [f"the {level} floor {tolerance.rtol:.2g}"]
    if trajectory.envelope is not None:
        parts.append(
            f"{ENVELOPE_FACTOR:g}x the spread of {trajectory.perturbed_runs} runs of the "
            f"original nudged each step by the rewrite's own rounding"
        )
    if trajectory.rounding_envelope is not None:
        parts.append(
            f"{tolerance.rounding_factor:g}x how far the original drifts under bfloat16 autocast"
        )
    basis = parts[0] if len(parts) == 1 else f"max of {', '.join(parts[:-1])} and {parts[-1]}"
    lines = [
        f"trajectory: losses over {comparison.length_before} steps differ by at most "
        f"{comparison.max_relative:.1e} (at {unit} {worst + 1}; threshold there {threshold:.1e}"
        f": {basis})."
    ]
    first = trajectory.first_beyond
    if first is not None:
        if tolerance.window > 1:
            last = min((first + 1) * tolerance.window, comparison.length_before)
            where = f"the mean of losses {first * tolerance.window + 1}-{last}"
        else:
            where = f"step {first + 1}"
        lines.append(
            f"Losses disagree at {where}: original {_loss(comparison.before[first])}, "
            f"rewritten {_loss(comparison.after[first])} (relative difference "
            f"{comparison.differences[first]:.1e} > {trajectory.threshold(first):.1e})."
        )
    if report.noise:
        lines.append(
            f"note: the original's own runs differ by up to {report.noise:.1e} (its kernels or "
            f"data are not deterministic); they count as perturbed runs."
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
    against: Optional[str] = None,
    level: Optional[Safety] = None,
) -> int:
    """What `optcodemod verify` does: verify, print progress and the table; the exit code."""
    import click

    echo = echo or click.echo
    done: List[ProbeRun] = []

    def progress(run: ProbeRun) -> None:
        done.append(run)
        state = "ok" if run.ok else "failed"
        echo(f"run {len(done)}: {run.label} {state} in {run.seconds:.1f} s", err=True)

    common = dict(
        steps=steps,
        repeats=repeats,
        warmup=warmup,
        timeout=timeout,
        nproc_per_node=nproc_per_node,
        on_run=progress,
    )
    if against is not None:
        report = verify_pair(
            script,
            b"",
            candidate_path=against,
            level=Safety.NUMERICS if level is None else level,
            args=script_args,
            **common,
        )
    else:
        report = verify_script(script, settings, args=script_args, **common)
    echo(report.render(), nl=False)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump(report.to_json(), handle, indent=1)
    return report.exit_code

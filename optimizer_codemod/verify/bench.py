"""`optcodemod bench`: original against rewritten, for every workload in a folder.

A workload is a folder with a `train.py` that accepts `--size cpu|gpu` (the bundled ones are in
`reference_models/`). For each, the script is rewritten afresh as `optcodemod apply` would
(every rule at the default levels; behaviour-level fixes too with `unsafe_fixes`), and
`verify_pair` runs original and rewritten
alternately and compares their losses with the tolerance of the most permissive level applied.
With `ablate`, each applied rule is also measured alone (a rewrite with only that rule selected).

A workload whose `train.py` has a line `# bench: twin PATH` is also measured against that
hand-optimized twin (run after each rewritten run, so the two alternate); the twin itself is not
benchmarked as a workload. A line `# bench: torchrun --nproc-per-node N` runs the workload (both
versions; a twin by its own line) under torchrun with N processes, rank 0 measured.

Results: `<name>.json` (device, torch, date, machine, per workload: step-time medians, speedup,
loss agreement, peak memory), `<name>.md` (a table) and `<name>.png` (a bar chart; needs
matplotlib, the `verify` extra).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from optimizer_codemod.extras import MATPLOTLIB_INSTALL
from optimizer_codemod.verify.equivalence import VerifyReport, verdict_lines, verify_pair
from optimizer_codemod.verify.peaks import dense_bf16_peak
from optimizer_codemod.verify.runner import ProbeOptions, ProbeRun, declared_processes, run_probe

SCRIPT = "train.py"
SNAPSHOT = "train.optimized.py"
TWIN = re.compile(r"^# bench: twin (\S+)\s*$", re.M)
DEFAULT_STEPS, DEFAULT_REPEATS, DEFAULT_WARMUP = 20, 3, 5


def bench_settings(unsafe_fixes: bool = False, target_device: str = "cuda"):
    """What `optcodemod apply [--unsafe-fixes] --target-device D` applies: the speed a user
    training on D gets by default.

    Behaviour-level fixes are measured only on request: they are opt-in for users too, and
    some (DataLoader workers on a machine with few cores) can cost more than they save.
    """
    from optimizer_codemod.config import Settings

    return Settings(unsafe_fixes=unsafe_fixes, target_device=target_device)


def rewrite_workload(
    path: str,
    select: Optional[Sequence[str]] = None,
    unsafe_fixes: bool = False,
    target_device: str = "cuda",
):
    """The rewrite of `path` as `apply` writes it (or with only the `select`ed rules)."""
    from optimizer_codemod.api import rewrite_source
    from optimizer_codemod.config import RuleSelection

    settings = bench_settings(unsafe_fixes, target_device)
    if select is not None:
        settings = settings.with_overrides(overrides=(RuleSelection(tuple(select)),))
    with open(path, "rb") as handle:
        src = handle.read()
    return rewrite_source(src, path, settings.options_for(path))


def workloads(root: str) -> List[str]:
    """Folders under `root` (or `root` itself) with a train.py, minus the twins others name."""
    if os.path.isfile(os.path.join(root, SCRIPT)):
        return [root]
    found = sorted(
        os.path.join(root, name)
        for name in os.listdir(root)
        if os.path.isfile(os.path.join(root, name, SCRIPT))
    )
    twins = {os.path.normpath(os.path.dirname(t)) for t in map(twin_of, found) if t}
    return [folder for folder in found if os.path.normpath(folder) not in twins]


def workload_name(folder: str) -> str:
    return os.path.basename(os.path.normpath(folder))


def twin_of(folder: str) -> Optional[str]:
    with open(os.path.join(folder, SCRIPT), encoding="utf-8") as handle:
        found = TWIN.search(handle.read())
    return os.path.normpath(os.path.join(folder, found.group(1))) if found else None


@dataclass
class WorkloadResult:
    name: str
    report: VerifyReport
    twin: Optional[str] = None
    twin_runs: List[ProbeRun] = field(default_factory=list)
    ablation: Dict[str, VerifyReport] = field(default_factory=dict)
    processes: int = 1  # per run; more than 1 under torchrun
    measured_at: str = field(default_factory=lambda: _utc_now())

    @property
    def speedup(self) -> Optional[float]:
        return self.report.speedup

    def twin_ratio(self) -> Optional[float]:
        """Rewritten throughput as a fraction of the twin's (twin step time / rewritten's)."""
        twin = _median([run.step_time for run in self.twin_runs])
        rewritten = self.report.step_time(self.report.after)
        return twin / rewritten if twin and rewritten else None

    def to_json(self) -> Dict[str, Any]:
        report = self.report
        data: Dict[str, Any] = {
            "name": self.name,
            "date": self.measured_at,
            "processes": self.processes,
            "fixed": sorted(set(report.fixed)),
            "level": report.level.label if report.level is not None else None,
            "unchanged": report.unchanged,
            "error": report.error,
            "equivalent": report.equivalent,
            "max_relative_difference": (
                report.comparison.max_relative if report.comparison else None
            ),
            "effective_rtol": report.effective_rtol,
            "step_time_before": report.step_time(report.before),
            "step_time_after": report.step_time(report.after),
            "step_times_before": [r.step_time for r in report.before],
            "step_times_after": [r.step_time for r in report.after],
            "speedup": report.speedup,
            # Fastest run against fastest run: what a machine shared with other jobs (whose
            # slow runs are the other jobs' doing) can best tell about the scripts themselves.
            "speedup_best_runs": _ratio(_fastest(report.before), _fastest(report.after)),
            "speed_within_noise": report.speed_within_noise,
            "peak_memory_before": _peak(report.before),
            "peak_memory_after": _peak(report.after),
            "last_loss_before": _last_loss(report.before),
            "last_loss_after": _last_loss(report.after),
            # Counted on the original (the rewrite trains the same model): FLOP/s per version.
            "flops_per_step": report.flops_per_step,
            "flop_rate_before": _rate(report.flops_per_step, report.step_time(report.before)),
            "flop_rate_after": _rate(report.flops_per_step, report.step_time(report.after)),
            # What `verify` would print: a results file from a lent GPU says why it judged so.
            "verdict": verdict_lines(report),
        }
        if self.twin:
            data["twin"] = {
                "script": self.twin,
                "step_time": _median([run.step_time for run in self.twin_runs]),
                "step_times": [run.step_time for run in self.twin_runs],
                "peak_memory": _peak(self.twin_runs),
                "errors": [run.problem() for run in self.twin_runs if run.problem()],
                "rewritten_throughput_vs_twin": self.twin_ratio(),
                "flop_rate": _rate(
                    report.flops_per_step, _median([run.step_time for run in self.twin_runs])
                ),
            }
        if self.ablation:
            data["ablation"] = {
                code: {
                    "unchanged": r.unchanged,
                    "step_time_before": r.step_time(r.before),
                    "step_time_after": r.step_time(r.after),
                    "speedup": r.speedup,
                    "speed_within_noise": r.speed_within_noise,
                    "equivalent": r.equivalent,
                    "max_relative_difference": r.comparison.max_relative if r.comparison else None,
                    "error": r.error,
                    "verdict": verdict_lines(r),
                }
                for code, r in self.ablation.items()
            }
        return data


def _fastest(runs: List[ProbeRun]) -> Optional[float]:
    return min((r.step_time for r in runs if r.step_time is not None), default=None)


def _ratio(before: Optional[float], after: Optional[float]) -> Optional[float]:
    return before / after if before and after else None


def _median(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _peak(runs: List[ProbeRun]) -> Optional[int]:
    return max((r.peak_memory for r in runs if r.peak_memory is not None), default=None)


def _rate(flops: Optional[int], seconds: Optional[float]) -> Optional[float]:
    return flops / seconds if flops and seconds else None


def _last_loss(runs: List[ProbeRun]) -> Optional[float]:
    losses = runs[0].losses if runs else []
    return losses[-1] if losses else None


def bench_workload(
    folder: str,
    *,
    size: str,
    env: Dict[str, str],
    steps: int,
    repeats: int,
    warmup: int,
    timeout: Optional[float],
    ablate: bool,
    echo: Callable[..., None],
    unsafe_fixes: bool = False,
    target_device: str = "cuda",
) -> WorkloadResult:
    from optimizer_codemod.diagnostics import Status
    from optimizer_codemod.errors import OptcodemodError
    from optimizer_codemod.rule import Safety

    name = workload_name(folder)
    script = os.path.join(folder, SCRIPT)
    args = ["--size", size]
    twin = twin_of(folder)
    processes = declared_processes(script) or 1
    options = ProbeOptions(
        steps=steps,
        warmup=warmup,
        timeout=timeout,
        env=env,
        nproc_per_node=(declared_processes(twin) or 1) if twin else 1,
    )
    twin_runs: List[ProbeRun] = []

    def progress(run: ProbeRun) -> None:
        echo(f"  {name}: {run.label} {'ok' if run.ok else 'failed'} in {run.seconds:.1f} s")
        if twin and run.label == "rewritten":
            twin_run = run_probe(twin, args, options, label="twin")
            twin_runs.append(twin_run)
            echo(f"  {name}: twin {'ok' if twin_run.ok else 'failed'} in {twin_run.seconds:.1f} s")

    def measure(select: Optional[Sequence[str]], on_run) -> VerifyReport:
        try:
            result = rewrite_workload(script, select, unsafe_fixes, target_device)
        except (OSError, OptcodemodError) as error:
            message = error.render() if isinstance(error, OptcodemodError) else str(error)
            return VerifyReport(script, None, None, error=message)
        fixed = [d for d in result.diagnostics if d.status is Status.FIXED]
        if not result.changed:
            return VerifyReport(script, None, None, unchanged=True)
        return verify_pair(
            script,
            result.new,
            level=max(d.safety for d in fixed) if fixed else Safety.SAFE,
            fixed=[d.code for d in fixed],
            args=args,
            steps=steps,
            repeats=repeats,
            warmup=warmup,
            timeout=timeout,
            nproc_per_node=processes,
            on_run=on_run,
            count_flops=select is None,  # once per workload; the ablations train the same model
            # The ablation rows measure speed: each rule alone was judged with the others.
            local_check=select is None,
        )

    report = measure(None, progress)
    result = WorkloadResult(name, report, twin, twin_runs, processes=processes)
    if ablate and not report.unchanged and len(set(report.fixed)) > 1:
        for code in sorted(set(report.fixed)):
            echo(f"  {name}: {code} alone")
            result.ablation[code] = measure([code], None)
    return result


def machine_facts() -> Dict[str, Any]:
    from optimizer_codemod.verify.doctor import cpu_model

    return {
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def summary(workloads: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Over the workloads' JSON records (those of this run and any resumed from a file)."""
    speedups = [w["speedup"] for w in workloads if w.get("speedup") is not None]
    best = [w["speedup_best_runs"] for w in workloads if w.get("speedup_best_runs") is not None]
    ratios = [
        w["twin"]["rewritten_throughput_vs_twin"]
        for w in workloads
        if w.get("twin") and w["twin"].get("rewritten_throughput_vs_twin") is not None
    ]
    return {
        "median_speedup": statistics.median(speedups) if speedups else None,
        "median_speedup_best_runs": statistics.median(best) if best else None,
        "workloads": len(workloads),
        "equivalent": sum(1 for w in workloads if w.get("equivalent")),
        "rewritten_throughput_vs_twin": ratios[0] if len(ratios) == 1 else ratios or None,
    }


def _first_result(results: List[WorkloadResult], key: str) -> Any:
    for result in results:
        for run in result.report.before + result.report.after:
            if run.result and run.result.get(key) is not None:
                return run.result[key]
    return None


def to_json(
    results: List[WorkloadResult],
    settings: Dict[str, Any],
    earlier: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The results file; `earlier`: a results file of the same settings whose workloads are
    kept (`bench --resume`)."""
    earlier = earlier or {}
    device_name = _first_result(results, "device_name") or earlier.get("device_name")
    fresh = [r.to_json() for r in results]
    peak = dense_bf16_peak(device_name)
    if peak is not None:
        for w in fresh:
            w["mfu_before"] = _share(w["flop_rate_before"], peak[0])
            w["mfu_after"] = _share(w["flop_rate_after"], peak[0])
            if w.get("twin"):
                w["twin"]["mfu"] = _share(w["twin"]["flop_rate"], peak[0])
    workloads = sorted(earlier.get("workloads", []) + fresh, key=lambda w: w["name"])
    return {
        "tool": "optcodemod bench",
        "date": _utc_now(),
        "device": _first_result(results, "device") or earlier.get("device") or settings["device"],
        "device_name": device_name,
        "dense_bf16_peak": {"flops": peak[0], "source": peak[1]} if peak else None,
        "torch": _first_result(results, "torch") or earlier.get("torch"),
        "machine": machine_facts(),
        "settings": settings,
        "summary": summary(workloads),
        "workloads": workloads,
    }


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _share(rate: Optional[float], peak: float) -> Optional[float]:
    return rate / peak if rate else None


def _ms(seconds: Optional[float]) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _x(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _mib(value: Optional[int]) -> str:
    return "n/a" if value is None else f"{value / 2**20:.0f} MiB"


def _disagreements_section(data: Dict[str, Any]) -> List[str]:
    """The judgment behind each "no": which check decided it, and its figures."""
    lines: List[str] = []
    for w in data["workloads"]:
        runs = [(w["name"], w)] + [
            (f"{w['name']}, {code} alone", a) for code, a in (w.get("ablation") or {}).items()
        ]
        for name, run in runs:
            if run.get("error") or run.get("unchanged") or run.get("equivalent"):
                continue
            lines += ["", f"`{name}`: losses disagree."]
            lines += [f"- {line}" for line in run.get("verdict") or ["(no judgment recorded)"]]
    return (["", "## Why losses disagree"] + lines) if lines else []


def render_markdown(data: Dict[str, Any]) -> str:
    s = data["settings"]
    lines = [
        f"# optcodemod bench: {data['device']} ({data['device_name']})",
        "",
        f"torch {data['torch']}, {data['date']}, {data['machine']['platform']}, "
        f"{data['machine']['cpu_count']} CPU cores; size `{s['size']}`, {s['steps']} steps "
        f"({s['warmup']} warm-up), {s['repeats']} runs of each version, alternating"
        + (
            f"; rewritten for target-device `{s['target_device']}`."
            if "target_device" in s
            else "."
        ),
        "",
        "| workload | fixes | step time before | after | speedup | fastest runs | "
        "losses agree (max rel. diff) | peak memory before | after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in data["workloads"]:
        if w["error"]:
            agree = "error"
        elif w["unchanged"]:
            agree = "unchanged"
        else:
            diff = w["max_relative_difference"]
            agree = ("yes" if w["equivalent"] else "**no**") + (
                f" ({diff:.1e})" if diff is not None else ""
            )
        speedup = _x(w["speedup"]) + (" ~" if w.get("speed_within_noise") else "")
        name = w["name"]
        if (w.get("processes") or 1) > 1:
            name += f" (torchrun, {w['processes']} processes)"
        lines.append(
            f"| {name} | {', '.join(w['fixed']) or '-'} | {_ms(w['step_time_before'])} "
            f"| {_ms(w['step_time_after'])} | {speedup} | {_x(w.get('speedup_best_runs'))} "
            f"| {agree} "
            f"| {_mib(w['peak_memory_before'])} | {_mib(w['peak_memory_after'])} |"
        )
    summary_ = data["summary"]
    lines += [
        "",
        f"Median speedup: **{_x(summary_['median_speedup'])}** (fastest runs: "
        f"{_x(summary_.get('median_speedup_best_runs'))}).",
    ]
    lines.append(
        "Step times: the median over runs of each run's median step; speedup: original / "
        "rewritten; fastest runs: the fastest original run against the fastest rewritten one."
    )
    if any(
        w.get("speed_within_noise")
        or any(a.get("speed_within_noise") for a in (w.get("ablation") or {}).values())
        for w in data["workloads"]
    ):
        lines.append("`~`: within run-to-run noise (the runs' step times overlap).")
    if any((w.get("processes") or 1) > 1 for w in data["workloads"]):
        lines.append("Workloads run under torchrun: rank 0's losses, step times and memory.")
    for w in data["workloads"]:
        twin = w.get("twin")
        if twin:
            lines.append(
                f"\n`{w['name']}` rewritten against its hand-optimized twin "
                f"(`{os.path.basename(os.path.dirname(twin['script']))}`): twin step time "
                f"{_ms(twin['step_time'])}, rewritten {_ms(w['step_time_after'])}: the rewrite "
                f"reaches {_pct(twin['rewritten_throughput_vs_twin'])} of the twin's throughput"
                + (
                    f"; model FLOPs utilisation: rewritten {_pct(w.get('mfu_after'))}, twin "
                    f"{_pct(twin.get('mfu'))}, original {_pct(w.get('mfu_before'))}."
                    if data.get("dense_bf16_peak")
                    else "."
                )
            )
    lines += _flops_section(data)
    ablated = [w for w in data["workloads"] if w.get("ablation")]
    if ablated:
        lines += ["", "## Each rule alone", "", "| workload | rule | speedup | losses agree |"]
        lines.append("|---|---|---|---|")
        for w in ablated:
            for code, a in w["ablation"].items():
                agree = "error" if a["error"] else ("yes" if a["equivalent"] else "**no**")
                if a.get("unchanged"):
                    agree = "unchanged alone (it needs another rule's fix)"
                speedup = _x(a["speedup"]) + (" ~" if a.get("speed_within_noise") else "")
                lines.append(f"| {w['name']} | {code} | {speedup} | {agree} |")
    lines += _disagreements_section(data)
    return "\n".join(lines) + "\n"


def _flops_section(data: Dict[str, Any]) -> List[str]:
    counted = [w for w in data["workloads"] if w.get("flops_per_step")]
    if not counted:
        return []
    peak = data.get("dense_bf16_peak")
    lines = [
        "",
        "## Model FLOPs",
        "",
        "One step's floating-point operations, counted by `torch.utils.flop_counter` in a warm-up "
        "step of the original (forward and backward; the rewrite trains the same model), "
        "divided by each version's step time"
        + (
            f"; utilisation (MFU) against the dense bf16 peak, {peak['flops'] / 1e12:.0f} "
            f"TFLOPS ({peak['source']})."
            if peak
            else "; no bf16 peak is known for this device, so no utilisation."
        ),
        "",
        "| workload | GFLOP per step | TFLOP/s before | after | MFU before | after |",
        "|---|---|---|---|---|---|",
    ]
    for w in counted:
        lines.append(
            f"| {w['name']} | {w['flops_per_step'] / 1e9:.2f} | {_tflops(w['flop_rate_before'])} "
            f"| {_tflops(w['flop_rate_after'])} | {_pct(w.get('mfu_before'), 1)} "
            f"| {_pct(w.get('mfu_after'), 1)} |"
        )
    return lines


def _tflops(rate: Optional[float]) -> str:
    return "n/a" if rate is None else f"{rate / 1e12:.3f}"


def _pct(value: Optional[float], digits: int = 0) -> str:
    return "n/a" if value is None else f"{value * 100:.{digits}f}%"


def write_chart(data: Dict[str, Any], path: str) -> Optional[str]:
    """Write the bar chart; returns why not when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"no chart: matplotlib is not installed ({MATPLOTLIB_INSTALL})"
    panels = [
        (
            "all fixes together",
            [(w["name"], w["speedup"]) for w in data["workloads"] if w["speedup"] is not None],
        ),
        (
            "each rule alone (--ablate)",
            [
                (f"{w['name']}: {code}", a["speedup"])
                for w in data["workloads"]
                for code, a in (w.get("ablation") or {}).items()
                if a["speedup"] is not None
            ],
        ),
    ]
    panels = [(title, bars) for title, bars in panels if bars]
    if not panels:
        panels = [("all fixes together", [])]
    # Horizontal bars, one row each: dozens of ablation rows stay readable.
    heights = [max(len(bars), 1) for _, bars in panels]
    figure, axes_list = plt.subplots(
        len(panels),
        1,
        figsize=(8, 1.5 + 0.3 * sum(heights) + 0.6 * len(panels)),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    for (title, bars), (axes,) in zip(panels, axes_list):
        rows = list(range(len(bars)))[::-1]  # first bar on top
        axes.barh(rows, [b[1] for b in bars], color="#4c72b0")
        axes.axvline(1.0, color="black", linewidth=0.8)
        axes.set_yticks(rows)
        axes.set_yticklabels([b[0] for b in bars], fontsize=8)
        for row, (_, value) in zip(rows, bars):
            axes.annotate(
                f"{value:.2f}x",
                (value, row),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize=7,
            )
        axes.set_xlim(0, max([b[1] for b in bars] + [1.0]) * 1.15)  # room for the labels
        axes.set_title(title, fontsize=9)
    axes_list[-1][0].set_xlabel("speedup (original / rewritten step time)")
    figure.suptitle(
        f"optcodemod bench: {data['device']} ({data['device_name']}), {data['date']}", fontsize=10
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return None


def bench_command(
    path: str,
    *,
    device: str = "cpu",
    size: str = "cpu",
    steps: int = DEFAULT_STEPS,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    timeout: Optional[float] = None,
    ablate: bool = False,
    unsafe_fixes: bool = False,
    output: str = ".",
    name: Optional[str] = None,
    echo: Optional[Callable[..., None]] = None,
    resume: bool = False,
) -> int:
    """What `optcodemod bench` does; exit 0 when every workload ran and its losses agree.

    The results files are rewritten after each workload, so a run cut short keeps what it
    measured; with `resume`, the workloads already in the results file (measured with the same
    settings) are kept and not run again."""
    echo = echo or print
    found = workloads(path)
    if not found:
        echo(f"{path}: no workload (a folder with {SCRIPT}) found", err=True)
        return 2
    warmup = min(warmup, steps - 1)
    settings = {
        "device": device,
        "target_device": device,
        "size": size,
        "steps": steps,
        "repeats": repeats,
        "warmup": warmup,
        "ablate": ablate,
        "rewrite": "all rules" + (", unsafe fixes on" if unsafe_fixes else ", default levels"),
        "command": f"optcodemod bench {path} --device {device} --size {size} --steps {steps} "
        f"--repeats {repeats} --warmup {warmup}"
        + (" --ablate" if ablate else "")
        + (" --unsafe-fixes" if unsafe_fixes else ""),
    }
    stem = os.path.join(output, name or f"bench-{device}-{size}")
    earlier: Dict[str, Any] = {}
    if resume and os.path.exists(stem + ".json"):
        try:
            earlier = _resumable(stem + ".json", settings)
        except ValueError as problem:
            echo(str(problem), err=True)
            return 2
    done = {w["name"] for w in earlier.get("workloads", [])}
    for name in sorted(done & {workload_name(folder) for folder in found}):
        echo(f"{name}: kept from {stem}.json", err=True)
    # The scripts pick CUDA when they see it: hide it to measure the CPU on a GPU machine.
    # (Set in our environment, which every probe subprocess inherits, verify_pair's too.)
    env = {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}
    results: List[WorkloadResult] = []
    data = to_json(results, settings, earlier)
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        for folder in [f for f in found if workload_name(f) not in done]:
            echo(f"{workload_name(folder)}:", err=True)
            results.append(
                bench_workload(
                    folder,
                    size=size,
                    env=env,
                    steps=steps,
                    repeats=repeats,
                    warmup=warmup,
                    timeout=timeout,
                    ablate=ablate,
                    unsafe_fixes=unsafe_fixes,
                    # The rewrite is tuned for the device it is measured on.
                    target_device=device,
                    echo=lambda text: echo(text, err=True),
                )
            )
            data = to_json(results, settings, earlier)
            _write_results(data, stem, chart=False)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    missing = _write_results(data, stem, chart=True)
    for w in data["workloads"]:
        state = w["error"] or ("unchanged" if w["unchanged"] else None)
        if state is None:
            state = "losses agree" if w["equivalent"] else "LOSSES DISAGREE"
        echo(
            f"{w['name']:<20} speedup {_x(w['speedup']):>7} (fastest runs "
            f"{_x(w['speedup_best_runs'])})  {state.splitlines()[0]}"
        )
        if w.get("twin"):
            ratio = w["twin"]["rewritten_throughput_vs_twin"]
            echo(f"{'':<20} rewritten reaches {_pct(ratio)} of its twin's throughput")
    summary_ = data["summary"]
    echo(
        f"median speedup: {_x(summary_['median_speedup'])} (fastest runs "
        f"{_x(summary_['median_speedup_best_runs'])})"
    )
    echo(f"wrote {stem}.json, {stem}.md" + ("" if missing else f", {stem}.png"))
    if missing:
        echo(missing, err=True)
    ok = all(w["error"] is None and (w["equivalent"] or w["unchanged"]) for w in data["workloads"])
    return 0 if ok else 1


# Settings that must match for a results file's workloads to be kept by --resume.
RESUME_KEYS = ("device", "size", "steps", "repeats", "warmup", "ablate", "rewrite")


def _resumable(path: str, settings: Dict[str, Any]) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        try:
            earlier = json.load(handle)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: cannot resume, not a results file ({error})") from None
    differ = [
        key for key in RESUME_KEYS if earlier.get("settings", {}).get(key) != settings.get(key)
    ]
    if differ:
        raise ValueError(
            f"{path}: cannot resume, it was measured with other settings ({', '.join(differ)}); "
            "use another --name or the same settings"
        )
    return earlier


def _write_results(data: Dict[str, Any], stem: str, chart: bool) -> Optional[str]:
    """Write STEM.json and STEM.md (and STEM.png); returns why the chart is missing."""
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    # Replaced whole: a run stopped while writing leaves the previous file, not half of one.
    with open(stem + ".json.tmp", "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
        handle.write("\n")
    os.replace(stem + ".json.tmp", stem + ".json")
    with open(stem + ".md", "w", encoding="utf-8") as handle:
        handle.write(render_markdown(data))
    return write_chart(data, stem + ".png") if chart else None

"""The speed of the tool on training scripts: against a bare parse and `black --check`, cold and
warm, and how its cost grows with the length of a file.

    python benchmarks/script_speed.py [--copies N] [--repeats N] [--jobs N] [--no-scaling]

The corpus is every kind of training script the project knows: the reference workloads
(reference_models/*/train.py), the example, the fixtures' training scripts (inputs with a
backward call) and the ecosystem scripts (scripts/ecosystem.toml, read from the local git
mirrors with scripts/ecosystem.py's own functions; repositories missing there are listed and
left out; nothing third-party is written anywhere but a temporary folder). Each file is copied
`--copies` times into a temporary folder, under different paths.

Timed alternately, `--repeats` rounds, medians reported:
- bare parse: `libcst.parse_module` of every file in one process, already imported (the least
  any LibCST tool spends);
- black: `black --check` over the folder in a subprocess, with an empty cache
  (`BLACK_CACHE_DIR`), as a user runs it beside optcodemod in the same pre-commit;
- cold: `optcodemod apply --check` over the folder in a subprocess, with an empty cache;
- warm: the same command again on the cache the cold run left (nothing changed in between).
Goals: cold at most 1.0x black; warm at most 0.1x cold.

Scaling: generated files (benchmarks/generate_training_file.py) of training loops at 200 and
2,000 lines, and one of 50,000 lines with a single training loop after model code, each run
through `optcodemod apply --check --no-cache` in its own process: wall time and peak memory
(the process's maximum resident set). Goals: the 2,000-line file at most 12x the 200-line
one; the 50,000-line file under 30 s and 500 MB.

Writes benchmarks/results/script-speed-cpu.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import ecosystem  # noqa: E402
import generate_training_file  # noqa: E402

RESULTS = HERE / "results"
SCALING = (
    ("training loops, 200 lines", 200, None),
    ("training loops, 2,000 lines", 2000, None),
    ("one training loop, 50,000 lines", 50000, 1),
)


# The corpus ------------------------------------------------------------------------------
def training_scripts() -> Tuple[Dict[str, List[Tuple[str, bytes]]], Dict[str, str]]:
    """Files by group: (name inside the group, bytes); and the ecosystem entries missing."""
    groups: Dict[str, List[Tuple[str, bytes]]] = {}
    groups["reference_models"] = [
        (p.relative_to(ROOT / "reference_models").as_posix(), p.read_bytes())
        for p in sorted((ROOT / "reference_models").glob("*/train.py"))
    ]
    groups["example"] = [("train.py", (ROOT / "examples" / "train.py").read_bytes())]
    groups["fixtures"] = [
        (p.relative_to(ROOT / "fixtures").as_posix(), p.read_bytes())
        for p in sorted((ROOT / "fixtures").rglob("*.py"))
        if not p.name.endswith(".expected.py") and b"backward(" in p.read_bytes()
    ]
    missing: Dict[str, str] = {}
    found = []
    for entry in ecosystem.load_corpus(ecosystem.DEFAULT_CORPUS):
        source, origin = ecosystem.read_entry(entry, list(ecosystem.DEFAULT_MIRRORS), [])
        if source is None:
            missing[f"{entry.repo}:{entry.path}"] = origin
            continue
        found.append((f"{entry.key}/{entry.path}", source))
    groups["ecosystem"] = found
    return groups, missing


def materialise(groups, copies: int, folder: Path) -> List[Path]:
    files = []
    for copy in range(copies):
        for group, entries in groups.items():
            for name, data in entries:
                target = folder / f"copy{copy}" / group / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                files.append(target)
    return files


# Running ---------------------------------------------------------------------------------
def optcodemod_command() -> List[str]:
    script = Path(sys.executable).with_name("optcodemod")
    return [str(script)] if script.exists() else [sys.executable, "-m", "optimizer_codemod"]


def black_command() -> List[str]:
    script = Path(sys.executable).with_name("black")
    return [str(script)] if script.exists() else [sys.executable, "-m", "black"]


def run_measured(command: Sequence[str], cwd: Path, env: Optional[dict] = None) -> dict:
    """Run to completion: wall seconds, exit code, the process's peak resident memory."""
    start = time.perf_counter()
    process = subprocess.Popen(
        list(command),
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    stderr = process.stderr.read() if process.stderr else b""
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in (0, 1):
        raise SystemExit(
            f"{' '.join(command)} exited {process.returncode}:\n{stderr.decode()[-2000:]}"
        )
    # ru_maxrss is in kilobytes on Linux; the CPU times include the worker processes the
    # command waited for. On a machine shared with other jobs, CPU time moves less than wall.
    return {
        "s": seconds,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "exit": process.returncode,
        "peak_mb": usage.ru_maxrss / 1024,
    }


def bare_parse(sources: Sequence[bytes]) -> None:
    import libcst

    for src in sources:
        libcst.parse_module(src)


def corpus_rounds(files: List[Path], folder: Path, repeats: int, jobs: int) -> dict:
    sources = [p.read_bytes() for p in files]
    caches = Path(tempfile.mkdtemp(prefix="caches-", dir=folder))
    tool = [*optcodemod_command(), "apply", "--check", "--quiet", "--jobs", str(jobs), "corpus"]
    black = [*black_command(), "--check", "--quiet", "--workers", str(jobs), "corpus"]
    samples: Dict[str, List[float]] = {"bare_parse": [], "black": [], "cold": [], "warm": []}
    cpu: Dict[str, List[float]] = {"bare_parse": [], "black": [], "cold": [], "warm": []}
    exits: Dict[str, int] = {}
    bare_parse(sources)  # imports, and the files into the page cache
    for round_ in range(repeats + 1):  # round 0 warms the machine up and is left out
        start, start_cpu = time.perf_counter(), time.process_time()
        bare_parse(sources)
        parse_s, parse_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        black_run = run_measured(black, folder, {"BLACK_CACHE_DIR": str(caches / f"b{round_}")})
        cache = {"OPTCODEMOD_CACHE_DIR": str(caches / f"o{round_}")}
        cold = run_measured(tool, folder, cache)
        warm = run_measured(tool, folder, cache)
        exits = {"black": black_run["exit"], "cold": cold["exit"], "warm": warm["exit"]}
        if round_:
            for name, value in (
                ("bare_parse", parse_s),
                ("black", black_run["s"]),
                ("cold", cold["s"]),
                ("warm", warm["s"]),
            ):
                samples[name].append(value)
            for name, value in (
                ("bare_parse", parse_cpu),
                ("black", black_run["cpu_s"]),
                ("cold", cold["cpu_s"]),
                ("warm", warm["cpu_s"]),
            ):
                cpu[name].append(value)
        print(
            f"  round {round_}: parse {parse_s:.2f} s  black {black_run['s']:.2f} s  "
            f"cold {cold['s']:.2f} s  warm {warm['s']:.2f} s",
            file=sys.stderr,
        )
    startup = [
        run_measured([*optcodemod_command(), "--version"], folder)["s"] for _ in range(repeats)
    ]
    medians = {name: statistics.median(values) for name, values in samples.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
    return {
        "commands": {"optcodemod": " ".join(tool[-7:]), "black": " ".join(black[-6:])},
        "exit_codes": exits,
        "median_s": medians,
        "samples_s": samples,
        "cpu_median_s": cpu_medians,
        "cpu_samples_s": cpu,
        "startup_median_s": statistics.median(startup),
        "ratios": {
            "cold_over_black": medians["cold"] / medians["black"],
            "warm_over_cold": medians["warm"] / medians["cold"],
            "cold_over_bare_parse": medians["cold"] / medians["bare_parse"],
            "black_over_bare_parse": medians["black"] / medians["bare_parse"],
            "cpu_cold_over_black": cpu_medians["cold"] / cpu_medians["black"],
            "cpu_warm_over_cold": cpu_medians["warm"] / cpu_medians["cold"],
        },
    }


def scaling(folder: Path, repeats: int) -> List[dict]:
    rows = []
    for label, lines, loops in SCALING:
        text = generate_training_file.generate(lines, loops)
        path = folder / f"generated_{lines}.py"
        path.write_text(text)
        command = [*optcodemod_command(), "apply", "--check", "--quiet", "--no-cache", path.name]
        runs = [run_measured(command, folder) for _ in range(1 if lines > 10000 else repeats)]
        rows.append(
            {
                "what": label,
                "lines": text.count("\n"),
                "bytes": len(text.encode()),
                "median_s": statistics.median(r["s"] for r in runs),
                "samples_s": [r["s"] for r in runs],
                "peak_mb": max(r["peak_mb"] for r in runs),
                "exit": runs[-1]["exit"],
            }
        )
        print(
            f"  {label}: {rows[-1]['median_s']:.2f} s, {rows[-1]['peak_mb']:.0f} MB",
            file=sys.stderr,
        )
    return rows


# Reporting -------------------------------------------------------------------------------
def machine() -> dict:
    import torch

    from optimizer_codemod import __version__

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from importlib.metadata import version

    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "libcst": version("libcst"),
        "black": version("black"),
        "optcodemod": __version__,
        "date": datetime.date.today().isoformat(),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def markdown(results: dict) -> str:
    corpus, machine_info = results["corpus"], results["machine"]
    rounds = corpus["timings"]
    medians, ratios, cpu = rounds["median_s"], rounds["ratios"], rounds["cpu_median_s"]
    lines = [
        "# optcodemod speed on training scripts",
        "",
        f"Measured by `benchmarks/script_speed.py` on {machine_info['cpu']} "
        f"({machine_info['cpu_count']} cores), Python {machine_info['python']}, "
        f"torch {machine_info['torch']}, libcst {machine_info['libcst']}, black "
        f"{machine_info['black']}, {machine_info['date']}. Medians of {results['repeats']} "
        "alternating rounds; a machine shared with other jobs, so figures move by tens of "
        "percent between runs.",
        "",
        f"Corpus: {corpus['files']} files ({corpus['copies']} copies of "
        f"{corpus['distinct_files']}), {corpus['lines']:,} lines, "
        f"{corpus['bytes'] / 1e6:.2f} MB: "
        + ", ".join(f"{n} {g}" for g, n in corpus["groups"].items())
        + (
            f"; {len(corpus['missing'])} ecosystem files missing locally"
            if corpus["missing"]
            else ""
        )
        + ".",
        "",
        "| | time (s) | x bare parse | CPU time (s) |",
        "|---|---:|---:|---:|",
        f"| bare `libcst.parse_module`, 1 process | {medians['bare_parse']:.2f} | 1.00 | "
        f"{cpu['bare_parse']:.2f} |",
        f"| `black --check`, empty cache | {medians['black']:.2f} | "
        f"{ratios['black_over_bare_parse']:.2f} | {cpu['black']:.2f} |",
        f"| `optcodemod apply --check`, empty cache (cold) | {medians['cold']:.2f} | "
        f"{ratios['cold_over_bare_parse']:.2f} | {cpu['cold']:.2f} |",
        f"| `optcodemod apply --check` again (warm) | {medians['warm']:.2f} | "
        f"{medians['warm'] / medians['bare_parse']:.2f} | {cpu['warm']:.2f} |",
        "",
        f"- cold / black: **{ratios['cold_over_black']:.2f}** (goal at most 1.0; in CPU time "
        f"{ratios['cpu_cold_over_black']:.2f})",
        f"- warm / cold: **{ratios['warm_over_cold']:.3f}** (goal at most 0.1); start-up alone "
        f"(`optcodemod --version`) {rounds['startup_median_s']:.2f} s",
        "",
        "## Cost against file length",
        "",
        "| generated file | lines | time (s) | peak memory (MB) |",
        "|---|---:|---:|---:|",
    ]
    for row in results["scaling"]:
        lines.append(
            f"| {row['what']} | {row['lines']:,} | {row['median_s']:.2f} | {row['peak_mb']:.0f} |"
        )
    figures = results["scaling_ratios"]
    lines += [
        "",
        f"- 2,000 / 200 lines: **{figures['2000_over_200']:.1f}x** the time (goal at most 12x; "
        f"10x the lines); less the start-up both pay, "
        f"{figures['2000_over_200_net_of_startup']:.1f}x",
        f"- 50,000 lines: **{figures['50000_s']:.1f} s**, **{figures['50000_peak_mb']:.0f} MB** "
        "(goals under 30 s and 500 MB)",
        "",
    ]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-scaling", action="store_true", help="skip the generated files")
    parser.add_argument("--output", type=Path, default=RESULTS / "script-speed-cpu.json")
    args = parser.parse_args(argv)

    groups, missing = training_scripts()
    distinct = [data for entries in groups.values() for _, data in entries]
    with tempfile.TemporaryDirectory(prefix="optcodemod-script-speed-") as temporary:
        folder = Path(temporary)
        files = materialise(groups, args.copies, folder / "corpus")
        print(f"corpus: {len(files)} files; {args.repeats} rounds", file=sys.stderr)
        timings = corpus_rounds(files, folder, args.repeats, args.jobs)
        rows = [] if args.no_scaling else scaling(folder, args.repeats)
        shutil.rmtree(folder / "corpus", ignore_errors=True)

    results = {
        "what": "optcodemod apply --check on training scripts against a bare LibCST parse and "
        "black --check (cold and warm caches), and its cost against file length",
        "repeats": args.repeats,
        "jobs": args.jobs,
        "corpus": {
            "groups": {group: len(entries) for group, entries in groups.items()},
            "distinct_files": len(distinct),
            "copies": args.copies,
            "files": len(files),
            "lines": sum(d.count(b"\n") for d in distinct) * args.copies,
            "bytes": sum(len(d) for d in distinct) * args.copies,
            "missing": missing,
            "timings": timings,
        },
        "scaling": rows,
        "goals": {
            "cold_over_black": "<= 1.0",
            "warm_over_cold": "<= 0.1",
            "2000_over_200": "<= 12",
            "2000_over_200_net_of_startup": "<= 12",
            "50000_s": "< 30",
            "50000_peak_mb": "< 500",
        },
        "machine": machine(),
    }
    if rows:
        small, large, huge = rows
        startup = timings["startup_median_s"]
        results["scaling_ratios"] = {
            "2000_over_200": large["median_s"] / small["median_s"],
            # The interpreter's start and the imports are the same for both files.
            "2000_over_200_net_of_startup": (large["median_s"] - startup)
            / (small["median_s"] - startup),
            "50000_s": huge["median_s"],
            "50000_peak_mb": huge["peak_mb"],
        }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    if rows:
        args.output.with_suffix(".md").write_text(markdown(results))
    ratios = timings["ratios"]
    print(
        f"cold/black {ratios['cold_over_black']:.2f} (CPU {ratios['cpu_cold_over_black']:.2f})  "
        f"warm/cold {ratios['warm_over_cold']:.3f}  cold/parse {ratios['cold_over_bare_parse']:.2f}"
    )
    if rows:
        print(json.dumps(results["scaling_ratios"]))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

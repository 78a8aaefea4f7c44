"""The speed of the tool itself: `optcodemod apply --check` against bare LibCST parsing.

    python benchmarks/tool_speed.py [--repeats N] [--jobs N] [--output FILE]

The corpus is the installed torch package's `nn` and `optim` sources (DESIGN.md §8). They are
copied to a temporary folder first: the installed package lives in a virtual environment, which
`apply` skips when walking a folder (like every linter), and a folder outside any repository
means default settings with no `pyproject.toml` to pick up. `--check` writes nothing anyway.

The tool runs as a user runs it, through the command line in a subprocess (interpreter start,
imports, discovery, pre-filter, parsing, every rule), with default settings and `--jobs` = the
machine's CPU count. The baseline is `libcst.parse_module` of the same files in one process,
already imported: the least any LibCST tool must spend. The two are timed alternately, so that
a change in the machine's load affects both. Reports files/s, MB/s and the ratio tool time /
bare parse time (goal: at most 1.0), and writes benchmarks/results/tool-speed-cpu.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

SUBDIRS = ("nn", "optim")


def _rule_gains_runner():
    # benchmarks/rule_gains.py shares its name with the benchmarks/rule_gains/ package, so it
    # is loaded by path to reuse its machine description.
    spec = importlib.util.spec_from_file_location("rule_gains_runner", HERE / "rule_gains.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torch_sources() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def corpus_files(torch_root: Path) -> List[Path]:
    return sorted(p for sub in SUBDIRS for p in (torch_root / sub).rglob("*.py") if p.is_file())


def copy_corpus(files: Sequence[Path], torch_root: Path, destination: Path) -> List[Path]:
    copies = []
    for source in files:
        target = destination / source.relative_to(torch_root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        copies.append(target)
    return copies


def optcodemod_command() -> List[str]:
    script = Path(sys.executable).with_name("optcodemod")
    return [str(script)] if script.exists() else [sys.executable, "-m", "optimizer_codemod"]


def run_tool(command: List[str], cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, capture_output=True)
    # 0: nothing to change, 1: something would change; anything else is a failed run.
    if result.returncode not in (0, 1):
        raise SystemExit(
            f"{' '.join(command)} exited {result.returncode}:\n{result.stderr.decode()[-2000:]}"
        )
    return result


def bare_parse(sources: Sequence[bytes]) -> None:
    import libcst

    for src in sources:
        libcst.parse_module(src)


def alternate(functions: Dict[str, Callable[[], object]], repeats: int) -> Dict[str, List[float]]:
    """One warm-up call each, then `repeats` rounds calling each function once per round."""
    for function in functions.values():
        function()
    samples: Dict[str, List[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            samples[name].append(time.perf_counter() - start)
    return samples


def pre_filter_candidates(paths: Sequence[Path]) -> int:
    """How many files the default rule selection's pre-filter lets through to the parser."""
    from optimizer_codemod.config import Settings
    from optimizer_codemod.engine import may_contain_findings

    settings = Settings()
    return sum(may_contain_findings(p.read_bytes(), settings.rules_for(str(p))) for p in paths)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (median reported)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--output", type=Path, default=HERE / "results" / "tool-speed-cpu.json", help="results"
    )
    args = parser.parse_args(argv)

    torch_root = torch_sources()
    originals = corpus_files(torch_root)
    with tempfile.TemporaryDirectory(prefix="optcodemod-speed-") as folder:
        corpus = Path(folder) / "torch"
        files = copy_corpus(originals, torch_root, corpus)
        sources = [p.read_bytes() for p in files]
        size = sum(len(s) for s in sources)
        # Every round runs cold: with its cache, a second run over unchanged files would
        # only read and hash them (benchmarks/script_speed.py measures that warm run).
        command = [
            *optcodemod_command(),
            "apply",
            "--check",
            "--quiet",
            "--no-cache",
            "--jobs",
            str(args.jobs),
        ]
        command.append(str(corpus))
        check = run_tool(command, Path(folder))
        startup = alternate(
            {"startup": lambda: run_tool([*optcodemod_command(), "--version"], Path(folder))},
            args.repeats,
        )["startup"]
        samples = alternate(
            {
                "tool": lambda: run_tool(command, Path(folder)),
                "bare_parse": lambda: bare_parse(sources),
            },
            args.repeats,
        )
        candidates = pre_filter_candidates(files)
        load_after = os.getloadavg()

    from optimizer_codemod import __version__
    from optimizer_codemod.config import Settings

    tool_s = statistics.median(samples["tool"])
    parse_s = statistics.median(samples["bare_parse"])
    results = {
        "what": "optcodemod apply --check over torch's nn and optim sources, against bare "
        "libcst.parse_module of the same files in one process",
        "corpus": {
            "folders": [f"torch/{sub}" for sub in SUBDIRS],
            "files": len(files),
            "bytes": size,
            "pre_filter_candidates": candidates,
        },
        "tool": {
            "command": f"optcodemod apply --check --quiet --no-cache --jobs {args.jobs} <corpus>",
            "version": __version__,
            "jobs": args.jobs,
            "rules_selected": len(Settings().rules_for(str(files[0]))),
            "exit_code": check.returncode,
            "median_s": tool_s,
            "samples_s": samples["tool"],
            "files_per_s": len(files) / tool_s,
            "mb_per_s": size / 1e6 / tool_s,
            "startup_median_s": statistics.median(startup),
        },
        "bare_parse": {
            "processes": 1,
            "median_s": parse_s,
            "samples_s": samples["bare_parse"],
            "files_per_s": len(files) / parse_s,
            "mb_per_s": size / 1e6 / parse_s,
        },
        "ratio_tool_over_bare_parse": tool_s / parse_s,
        "goal": "ratio <= 1.0",
        "machine": {
            **_rule_gains_runner().machine("cpu"),
            "libcst": _libcst_version(),
            "load_average_after": [round(x, 2) for x in load_after],
        },
    }
    print(
        f"corpus: torch {'+'.join(SUBDIRS)}: {len(files)} files, {size / 1e6:.2f} MB "
        f"({candidates} pass the pre-filter)"
    )
    print(
        f"optcodemod apply --check (jobs {args.jobs}, exit {check.returncode}): "
        f"{tool_s:6.2f} s  {len(files) / tool_s:7.1f} files/s  {size / 1e6 / tool_s:5.2f} MB/s"
        f"  (of which start-up {statistics.median(startup):.2f} s)"
    )
    print(
        f"bare libcst.parse_module (1 process):     "
        f"{parse_s:6.2f} s  {len(files) / parse_s:7.1f} files/s  {size / 1e6 / parse_s:5.2f} MB/s"
    )
    print(f"ratio tool / bare parse: {tool_s / parse_s:.2f} (goal <= 1.0)")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.output}")
    return 0


def _libcst_version() -> str:
    from importlib.metadata import version

    return version("libcst")


if __name__ == "__main__":
    raise SystemExit(main())

"""Every Python file of each pinned repository in one run, as a user runs it on a checkout.

    python benchmarks/whole_repositories.py [--json FILE] [--only REPO] [--mirror DIR]

scripts/ecosystem.py checks the listed training files (and their repositories' listed files
together); this runs `optcodemod apply --check --unsafe-fixes -j 2 --no-cache` over every
`.py` file and notebook of each repository of scripts/ecosystem.toml at its pinned commit (libraries,
tests, examples and all: 2089 files in diffusers), with `OPTCODEMOD_DEBUG=1`, so that a bug
in the project index raises instead of only warning. A repository fails when the run exits
with a traceback or an internal error, or passes its timeout; files it reports and leaves
untouched (Python 2 code, a notebook that is not JSON) are counted, as a user would see them.

Prints, per repository, its files and lines, the wall time and the peak memory of the run's
main process (where the project index is built; workers rewrite files and stay small).
The repositories come from local git mirrors, as for scripts/ecosystem.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from collections import Counter
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.coverage import _machine  # noqa: E402
from scripts import ecosystem  # noqa: E402  (corpus and mirrors are shared)

TIMEOUT_SECONDS = 1800
APPLY = (sys.executable, "-m", "optimizer_codemod", "apply", "--unsafe-fixes", "-j", "2")
APPLY += ("--no-cache",)


def _debug_environment() -> dict:
    """A bug in the project index raises here instead of only warning."""
    return dict(os.environ, OPTCODEMOD_DEBUG="1")


@dataclass
class RepositoryRun:
    repo: str
    commit: str
    files: int
    lines: int
    exit_code: Optional[int]  # None: timed out
    seconds: float
    peak_mib: int
    file_errors: int  # files the run reported and left untouched (syntax errors and such)
    first_errors: List[str]
    fixes: Dict[str, int]  # by rule: what `apply --unsafe-fixes` would change
    second_run: Optional[List[str]] = None  # files a second apply changes (--second-run)
    failure: str = ""


def _shown(path: Path) -> str:
    """The corpus as the header names it: relative to the checkout where it lies there."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def materialise(repo: str, commit: str, mirrors: Sequence[Path], dest: Path) -> Optional[int]:
    """Every `.py` file and notebook of `repo` at `commit` written under `dest` (a snapshot
    may lack its largest files: those are left out); how many, or None. Streamed one file at
    a time: the peak memory of a run's process counts what its parent held when it started."""
    entry = ecosystem.Entry(repo, commit, "")
    for git_dir in ecosystem._git_dirs(entry, mirrors):
        git = ["git", f"--git-dir={ecosystem._dot_git(git_dir)}"]
        listing = subprocess.run(
            [*git, "ls-tree", "-r", "--name-only", commit], capture_output=True, text=True
        )
        if listing.returncode != 0:
            continue
        wanted = [p for p in listing.stdout.splitlines() if p.endswith((".py", ".ipynb"))]
        (dest / ".git").mkdir(exist_ok=True)  # a checkout's root, as the tool finds it
        return sum(_write_blobs(git, commit, wanted, dest))
    return None


def _write_blobs(git: List[str], commit: str, paths: List[str], dest: Path) -> Iterator[int]:
    """1 for each of `paths` at `commit` written under `dest`, 0 for each the mirror lacks."""
    with subprocess.Popen(
        [*git, "cat-file", "--batch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as batch:
        for path in paths:
            batch.stdin.write(f"{commit}:{path}\n".encode())
            batch.stdin.flush()
            header = batch.stdout.readline().split()
            if len(header) != 3 or header[1] != b"blob":  # "<name> missing"
                yield 0
                continue
            data = batch.stdout.read(int(header[2]))
            batch.stdout.read(1)  # the newline after each object
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            yield 1
        batch.stdin.close()


def second_run_changes(folder: Path) -> List[str]:
    """The files that a second `apply` would change once the first has written its fixes
    (DESIGN.md section 4: none), relative to `folder`."""
    env = _debug_environment()
    subprocess.run([*APPLY, "-q", str(folder)], capture_output=True, env=env)
    again = subprocess.run(
        [*APPLY, "--check", "--output-format", "json", str(folder)], capture_output=True, env=env
    )
    try:
        changed = json.loads(again.stdout).get("changed_files", [])
    except ValueError:
        return [f"(no report: exit {again.returncode})"]
    return sorted(os.path.relpath(path, folder) for path in changed)


def run_repository(repo: str, commit: str, folder: Path, files: int) -> RepositoryRun:
    lines = sum(path.read_bytes().count(b"\n") for path in folder.rglob("*.py") if path.is_file())
    argv = [*APPLY, "--check", "--output-format", "json", str(folder)]
    env = _debug_environment()
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        timer = threading.Timer(TIMEOUT_SECONDS, process.kill)
        timer.start()
        try:
            # wait4 gives this process's own peak memory, not its workers'.
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            timer.cancel()
        process.returncode = code = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        err.seek(0)
        stderr = err.read().decode(errors="replace")
        out.seek(0)
        fixes, errors = _read_report(out.read())
        errors = [error.replace(f"{folder}{os.sep}", "") for error in errors]
    peak = round(usage.ru_maxrss / 1024)
    failure = ""
    if seconds >= TIMEOUT_SECONDS:
        code, failure = None, f"timed out after {TIMEOUT_SECONDS} s"
    elif "Traceback" in stderr or "internal error" in stderr or code not in (0, 1, 2):
        failure = stderr[-2000:]
    # Exit 2 with files named: Python 2 code, a notebook that is not JSON; the run goes on.
    return RepositoryRun(
        repo,
        commit,
        files,
        lines,
        code,
        round(seconds, 1),
        peak,
        len(errors),
        errors[:5],
        fixes,
        failure=failure,
    )


def _read_report(report: bytes) -> Tuple[Dict[str, int], List[str]]:
    """({rule code: how many of its fixes the run would apply}, the errors it names files
    for), from the JSON report."""
    try:
        document = json.loads(report)
    except ValueError:
        return {}, []
    findings = document.get("findings", [])
    counts = Counter(f["code"] for f in findings if f.get("status") in ("fixable", "fixed"))
    errors = [error.get("message", "") for error in document.get("errors", [])]
    return dict(sorted(counts.items())), errors


def _summary(runs: List[RepositoryRun], missing: List[str]) -> List[str]:
    failed = [run for run in runs if run.failure]
    lines = [
        f"repositories: {len(runs)} ({len(missing)} missing: {', '.join(missing) or 'none'})",
        f"files: {sum(r.files for r in runs)}, lines of .py files: {sum(r.lines for r in runs)}",
        f"failures (traceback, internal error, timeout): {len(failed)}",
    ]
    lines += [f"  {run.repo}: {run.failure.strip().splitlines()[-1]}" for run in failed]
    lines.append(f"files reported and left untouched: {sum(r.file_errors for r in runs)}")
    for run in runs:
        lines += [f"  {run.repo}: {error[:160]}" for error in run.first_errors]
    checked = [run for run in runs if run.second_run is not None]
    if checked:
        changing = sum(len(run.second_run) for run in checked)
        lines.append(
            f"second apply after writing the fixes ({len(checked)} repositories with fixes): "
            f"{changing} files would change again"
        )
    lines.append(f"total time of the checks: {sum(r.seconds for r in runs):.1f} s")
    by_rule: Counter = Counter()
    for run in runs:
        by_rule.update(run.fixes)
    shown = ", ".join(f"{code} {count}" for code, count in sorted(by_rule.items()))
    lines.append(f"fixes (--unsafe-fixes): {sum(by_rule.values())}: {shown}")
    lines.append("largest (lines of .py files):")
    for run in sorted(runs, key=lambda r: -r.lines)[:5]:
        rate = run.seconds / max(run.lines, 1) * 1e6
        lines.append(
            f"  {run.repo}: {run.files} files, {run.lines} lines, {run.seconds} s "
            f"({rate:.0f} us/line), peak {run.peak_mib} MiB"
        )
    lines.append("per repository (seconds, peak MiB, files, lines):")
    for run in runs:
        lines.append(
            f"  {run.repo}: {run.seconds} s, {run.peak_mib} MiB, {run.files} files, {run.lines}"
        )
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=ecosystem.DEFAULT_CORPUS)
    parser.add_argument("--mirror", type=Path, action="append")
    parser.add_argument("--only", help="only repositories whose owner/name contains this")
    parser.add_argument(
        "--second-run",
        action="store_true",
        help="also apply the fixes, then check that a second apply changes nothing",
    )
    parser.add_argument("--json", type=Path, help="write the records here")
    parser.add_argument("--markdown", type=Path, help="write the summary here, with its header")
    args = parser.parse_args(argv)
    mirrors = args.mirror if args.mirror is not None else list(ecosystem.DEFAULT_MIRRORS)
    repos = {entry.repo: entry.commit for entry in ecosystem.load_corpus(args.corpus)}
    runs: List[RepositoryRun] = []
    missing: List[str] = []
    for repo, commit in repos.items():
        if args.only and args.only not in repo:
            continue
        with tempfile.TemporaryDirectory(prefix="optcodemod-whole-") as workdir:
            folder = Path(workdir) / repo.replace("/", "+")
            folder.mkdir()
            files = materialise(repo, commit, mirrors, folder)
            if files is None:
                missing.append(repo)
                continue
            run = run_repository(repo, commit, folder, files)
            if args.second_run and run.fixes:
                run.second_run = second_run_changes(folder)
                if run.second_run:
                    run.failure = "a second apply changes " + ", ".join(run.second_run[:5])
        runs.append(run)
        flag = "FAIL" if run.failure else "ok"
        print(
            f"{flag:4s} {run.seconds:7.1f} s {run.peak_mib:7.0f} MiB {run.files:5d} files "
            f"{run.lines:8d} lines  {repo}",
            flush=True,
        )
    failed = [run for run in runs if run.failure]
    summary = _summary(runs, missing)
    print("\n".join(summary))
    if args.markdown:
        header = [
            "# Whole repositories (benchmarks/whole_repositories.py)",
            "",
            f"- {datetime.date.today().isoformat()}, {_machine()}, Python "
            f"{platform.python_version()}, optcodemod at {ecosystem._git_commit()}",
            "- `apply --check --unsafe-fixes -j 2 --no-cache` over every `.py` file and notebook "
            f"of each repository of {_shown(args.corpus)} at its pinned commit, with "
            "`OPTCODEMOD_DEBUG=1`; peak memory is the run's main process (the project index)",
        ]
        if args.second_run:
            header.append(
                "- `--second-run`: each repository's fixes then written (`apply --unsafe-fixes`) "
                "and the result checked again"
            )
        header += [
            "",
            "```",
        ]
        args.markdown.write_text("\n".join(header + summary + ["```", ""]))
    if args.json:
        document = {
            "date": datetime.date.today().isoformat(),
            "machine": _machine(),
            "python": platform.python_version(),
            "optcodemod_commit": ecosystem._git_commit(),
            "uncommitted_tool_files": ecosystem._uncommitted_tool_files(),
            "repositories": [asdict(run) for run in runs],
            "missing": missing,
        }
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

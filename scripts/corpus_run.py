"""Run every rule over a large real corpus (the installed torch package) and check the engine.

    python scripts/corpus_run.py [--root DIR] [--subdir SUB ...] [--jobs N] [--prefilter]
                                 [--no-unsafe-fixes] [--list-changed] [--quiet]

For every .py file under the root (default: the installed torch package): the engine must not crash (a file LibCST cannot parse or
reproduce is refused with an OptcodemodError: counted and listed, not a crash); every changed
output must compile; a second run over the output must change nothing; no file on disk may
change (everything happens on bytes in memory). All rules are selected, unsafe fixes are on,
and by default the pre-filter is bypassed so that every file is parsed and visited. The
engine checks that LibCST reproduces a file byte for byte only before changing it, so an
unreproducible file is refused only when some rule would fix it.

Prints per-rule statistics and file counts; exits 1 when any file crashed, a rule failed
(the engine's own safety net caught broken output or non-convergence), an output did not
compile, a second run changed something, or a file on disk changed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import traceback
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from optimizer_codemod.api import rewrite_source  # noqa: E402
from optimizer_codemod.diagnostics import Diagnostic, Status  # noqa: E402
from optimizer_codemod.engine import RewriteOptions, rewrite_bytes  # noqa: E402
from optimizer_codemod.errors import (  # noqa: E402
    NonConvergenceError,
    OptcodemodError,
    RuleBrokeOutputError,
)
from optimizer_codemod.nesting import recursion_headroom  # noqa: E402
from optimizer_codemod.registry import all_rules  # noqa: E402
from optimizer_codemod.sources import compile_check  # noqa: E402
from optimizer_codemod.torch_version import DEFAULT_TARGET, TorchVersion  # noqa: E402

# Outcome kinds, one per file.
SKIPPED = "skipped"  # the pre-filter (only with --prefilter) or an empty file: not parsed
PARSED = "parsed"  # parsed and visited by every rule
REFUSED = "refused"  # an OptcodemodError about the input (syntax, encoding, unreproducible)
RULE_FAILED = "rule-failed"  # the engine caught a rule crashing, breaking output or cycling
CRASHED = "crashed"  # any other exception escaped the engine

# The engine raises these when a rule misbehaves; the file is left untouched, but on a corpus
# run they are bugs to report, not properties of the input.
RULE_ERRORS = (RuleBrokeOutputError, NonConvergenceError)


@dataclass
class FileReport:
    path: str
    size: int
    kind: str
    changed: bool = False
    seconds: float = 0.0
    # (rule code, status value) -> count
    counts: Dict[Tuple[str, str], int] = field(default_factory=dict)
    error: Optional[str] = None
    not_compiling: Optional[str] = None
    not_idempotent: Optional[str] = None


@dataclass
class CorpusStats:
    root: str
    files: List[FileReport]
    seconds: float
    jobs: int
    prefilter: bool
    rules: Tuple[str, ...]
    unsafe_fixes: bool = True
    touched: List[str] = field(default_factory=list)  # files whose size or mtime changed

    def of_kind(self, kind: str) -> List[FileReport]:
        return [f for f in self.files if f.kind == kind]

    @property
    def changed(self) -> List[FileReport]:
        return [f for f in self.files if f.changed]

    @property
    def not_compiling(self) -> List[FileReport]:
        return [f for f in self.files if f.not_compiling]

    @property
    def not_idempotent(self) -> List[FileReport]:
        return [f for f in self.files if f.not_idempotent]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def per_rule(self) -> Dict[str, Counter]:
        """Rule code -> Counter of findings, fixed, unsafe, reported and files."""
        table: Dict[str, Counter] = {code: Counter() for code in self.rules}
        for report in self.files:
            seen = set()
            for (code, status), count in report.counts.items():
                row = table.setdefault(code, Counter())
                row["findings"] += count
                row[status] += count
                seen.add(code)
            for code in seen:
                table[code]["files"] += 1
        return table

    @property
    def failed(self) -> bool:
        return bool(
            self.of_kind(CRASHED)
            or self.of_kind(RULE_FAILED)
            or self.not_compiling
            or self.not_idempotent
            or self.touched
        )


def torch_root() -> Path:
    """The installed torch package's folder, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed here; pass --root DIR")
    return Path(list(spec.submodule_search_locations)[0])


def python_files(root: Path, subdirs: Sequence[str] = ()) -> List[Path]:
    bases = [root / s for s in subdirs] if subdirs else [root]
    found = set()
    for base in bases:
        if base.is_file():
            found.add(base)
        else:
            found.update(p for p in base.rglob("*.py") if p.is_file())
    return sorted(found)


def corpus_options(unsafe_fixes: bool = True) -> RewriteOptions:
    """Every registered rule, with a target new enough that none is held back by min_torch:
    the newest of the default target, every rule's min_torch and the installed torch (rules
    may also check the target for newer APIs, as OPT501 does for Adagrad)."""
    rules = tuple(all_rules())
    newest = max([DEFAULT_TARGET, *(rule.min_torch for rule in rules), *_installed_torch()])
    return RewriteOptions(rules=rules, target_torch=newest, unsafe_fixes=unsafe_fixes)


def _installed_torch() -> List[TorchVersion]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("torch").split("+")[0].split(".")
        return [TorchVersion.parse(".".join(release[:2]))]
    except (PackageNotFoundError, ValueError):
        return []


def _counts(diagnostics) -> Dict[Tuple[str, str], int]:
    return dict(Counter((d.code, d.status.value) for d in diagnostics))


@dataclass
class Checked:
    """A report with what the engine returned, for callers that inspect the output."""

    report: FileReport
    new: Optional[bytes] = None  # the first run's output; None unless the file was parsed
    diagnostics: List[Diagnostic] = field(default_factory=list)


def check_source(src: bytes, path: str, options: RewriteOptions, prefilter: bool) -> FileReport:
    """Run the engine on one text in memory and check its promises; never raises."""
    return check_text(src, path, options, prefilter).report


def check_text(src: bytes, path: str, options: RewriteOptions, prefilter: bool = False) -> Checked:
    """`check_source`, also returning the output and diagnostics; never raises."""
    start = time.perf_counter()
    # As the command line does: a text within the parser's nesting limit gets the recursion
    # LibCST's visitors need for it.
    with recursion_headroom():
        checked = _check_source(src, path, options, prefilter)
    checked.report.seconds = time.perf_counter() - start
    return checked


def _check_source(src: bytes, path: str, options: RewriteOptions, prefilter: bool) -> Checked:
    report = FileReport(path=path, size=len(src), kind=PARSED)
    checked = Checked(report)
    try:
        if prefilter:
            result = rewrite_source(src, path, options)
            if result.skipped is not None:
                report.kind = SKIPPED
                return checked
            new, changed, diagnostics = result.new, result.changed, result.diagnostics
        else:
            result = rewrite_bytes(src, path, options)
            new, changed, diagnostics = result.code, result.changed, result.diagnostics
    except RULE_ERRORS as error:
        report.kind, report.error = RULE_FAILED, error.render()
        return checked
    except OptcodemodError as error:
        report.kind, report.error = REFUSED, error.render()
        return checked
    except Exception as exc:  # every other exception is an engine or rule crash
        report.kind = CRASHED
        report.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        return checked
    checked.new, checked.diagnostics = new, list(diagnostics)
    report.counts = _counts(diagnostics)
    report.changed = changed
    if changed != (new != src):
        report.not_idempotent = f"`changed` is {changed} but the bytes say {new != src}"
    if new != src:
        ok, problem = compile_check(new, path)
        if not ok:
            report.not_compiling = problem
        report.not_idempotent = report.not_idempotent or _second_run_problem(new, path, options)
    return checked


def _second_run_problem(new: bytes, path: str, options: RewriteOptions) -> Optional[str]:
    try:
        again = rewrite_bytes(new, path, options)
    except Exception as exc:
        message = exc.render() if isinstance(exc, OptcodemodError) else repr(exc)
        return f"the second run failed on the first run's output: {message}"
    if again.changed or again.code != new:
        codes = sorted({d.code for d in again.diagnostics if d.status is Status.FIXED})
        return f"the second run changed the output again (rules {', '.join(codes) or '?'})"
    return None


def check_file(path: str, options: RewriteOptions, prefilter: bool) -> FileReport:
    with open(path, "rb") as handle:
        src = handle.read()
    return check_source(src, path, options, prefilter)


_WORKER_OPTIONS: Optional[RewriteOptions] = None
_WORKER_PREFILTER = False


def _init_worker(unsafe_fixes: bool, prefilter: bool) -> None:
    global _WORKER_OPTIONS, _WORKER_PREFILTER
    _WORKER_OPTIONS = corpus_options(unsafe_fixes)
    _WORKER_PREFILTER = prefilter


def _worker(path: str) -> FileReport:
    assert _WORKER_OPTIONS is not None
    return check_file(path, _WORKER_OPTIONS, _WORKER_PREFILTER)


def _snapshot(paths: Iterable[str]) -> Dict[str, Tuple[int, int]]:
    stats = {}
    for path in paths:
        st = os.stat(path)
        stats[path] = (st.st_size, st.st_mtime_ns)
    return stats


def _mp_context():
    import multiprocessing

    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def run_corpus(
    paths: Sequence[Path],
    root: Path,
    jobs: int = 0,
    prefilter: bool = False,
    unsafe_fixes: bool = True,
    progress: bool = False,
) -> CorpusStats:
    """Check every path; the core of the script, importable by tests."""
    names = [str(p) for p in paths]
    options = corpus_options(unsafe_fixes)
    jobs = jobs or os.cpu_count() or 1
    before = _snapshot(names)
    start = time.perf_counter()
    # Largest files first so the slowest file does not start last and run alone.
    ordered = sorted(names, key=lambda p: (-before[p][0], p))
    tick = _Progress(progress, len(ordered))
    if jobs > 1 and len(ordered) > 1:
        reports = _run_parallel(ordered, jobs, unsafe_fixes, prefilter, tick)
    else:
        reports = []
        for path in ordered:
            reports.append(check_file(path, options, prefilter))
            tick()
    elapsed = time.perf_counter() - start
    after = _snapshot(names)
    touched = [p for p in names if before[p] != after[p]]
    reports.sort(key=lambda r: r.path)
    return CorpusStats(
        root=str(root),
        files=reports,
        seconds=elapsed,
        jobs=jobs,
        prefilter=prefilter,
        rules=tuple(rule.code for rule in options.rules),
        unsafe_fixes=unsafe_fixes,
        touched=touched,
    )


def _run_parallel(
    ordered: Sequence[str], jobs: int, unsafe_fixes: bool, prefilter: bool, tick: "_Progress"
) -> List[FileReport]:
    """Check files in worker processes; a worker that dies (a crash in native code, the
    out-of-memory killer) must not take the run down: the files it may have been working on
    are checked again one at a time, each in its own process, to name the culprit."""
    reports: List[FileReport] = []
    suspects: List[str] = []
    with _pool(min(jobs, len(ordered)), unsafe_fixes, prefilter) as pool:
        futures = {pool.submit(_worker, path): path for path in ordered}
        for future in as_completed(futures):
            path = futures[future]
            try:
                reports.append(future.result())
            except BrokenProcessPool:
                suspects.append(path)
                continue
            except Exception as exc:  # a report that could not come back from the worker
                reports.append(_crash_report(path, exc))
            tick()
    for path in sorted(suspects, key=lambda p: -os.path.getsize(p)):
        with _pool(1, unsafe_fixes, prefilter) as pool:
            try:
                reports.append(pool.submit(_worker, path).result())
            except BrokenProcessPool:
                report = FileReport(path=path, size=os.path.getsize(path), kind=CRASHED)
                report.error = "the worker process died while checking this file"
                reports.append(report)
            except Exception as exc:
                reports.append(_crash_report(path, exc))
        tick()
    return reports


def _pool(workers: int, unsafe_fixes: bool, prefilter: bool) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=_mp_context(),
        initializer=_init_worker,
        initargs=(unsafe_fixes, prefilter),
    )


def _crash_report(path: str, exc: BaseException) -> FileReport:
    size = os.path.getsize(path) if os.path.exists(path) else 0
    return FileReport(path=path, size=size, kind=CRASHED, error=f"{type(exc).__name__}: {exc}")


class _Progress:
    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total, self.done = enabled, total, 0

    def __call__(self) -> None:
        self.done += 1
        if self.enabled and (self.done % 100 == 0 or self.done == self.total):
            print(f"  {self.done}/{self.total} files", file=sys.stderr, flush=True)


def render(stats: CorpusStats, slowest: int = 5, list_changed: bool = False) -> str:
    lines = []

    def relative(path: str) -> str:
        return os.path.relpath(path, stats.root)

    megabytes = stats.total_bytes / 1e6
    parsed = stats.of_kind(PARSED)
    with_findings = [f for f in parsed if f.counts and not f.changed]
    lines.append(f"corpus: {stats.root}")
    lines.append(
        f"rules: {len(stats.rules)} ({', '.join(stats.rules)}); "
        f"unsafe fixes {'on' if stats.unsafe_fixes else 'off'}; "
        f"pre-filter {'on' if stats.prefilter else 'off'}; jobs {stats.jobs}"
    )
    lines.append(f"files: {len(stats.files)} ({megabytes:.1f} MB)")
    lines.append("")
    lines.append("outcome                        files")
    for label, count in (
        ("parsed and checked", len(parsed)),
        ("  changed", len(stats.changed)),
        ("  unchanged, with findings", len(with_findings)),
        ("  unchanged, no findings", len(parsed) - len(stats.changed) - len(with_findings)),
        ("skipped (pre-filter, empty)", len(stats.of_kind(SKIPPED))),
        ("refused (documented)", len(stats.of_kind(REFUSED))),
        ("rule failed", len(stats.of_kind(RULE_FAILED))),
        ("crashed", len(stats.of_kind(CRASHED))),
        ("output does not compile", len(stats.not_compiling)),
        ("second run changes output", len(stats.not_idempotent)),
        ("file changed on disk", len(stats.touched)),
    ):
        lines.append(f"{label:<30} {count:>5}")
    rate = len(stats.files) / stats.seconds if stats.seconds else 0.0
    lines.append("")
    lines.append(
        f"total time: {stats.seconds:.1f} s ({rate:.1f} files/s, "
        f"{megabytes / stats.seconds if stats.seconds else 0.0:.2f} MB/s, with the second runs)"
    )
    lines.append("")
    row_format = "{:<8} {:>7} {:>9} {:>7} {:>7} {:>9}"
    lines.append(row_format.format("rule", "files", "findings", "fixed", "unsafe", "reported"))
    total: Counter = Counter()
    for code, row in sorted(stats.per_rule().items()):
        total.update(row)
        lines.append(
            row_format.format(
                code,
                row["files"],
                row["findings"],
                row[Status.FIXED.value],
                row[Status.UNSAFE.value],
                row[Status.REPORTED.value],
            )
        )
    lines.append(
        row_format.format(
            "all",
            len([f for f in stats.files if f.counts]),
            total["findings"],
            total[Status.FIXED.value],
            total[Status.UNSAFE.value],
            total[Status.REPORTED.value],
        )
    )
    for title, kind in (("refused", REFUSED), ("rule failures", RULE_FAILED), ("crashes", CRASHED)):
        group = stats.of_kind(kind)
        if group:
            lines.append("")
            lines.append(f"{title} ({len(group)}):")
            for report in group:
                lines.append(f"  {relative(report.path)}: {report.error}")
    for title, attribute in (
        ("non-compiling outputs", "not_compiling"),
        ("non-idempotent files", "not_idempotent"),
    ):
        group = [f for f in stats.files if getattr(f, attribute)]
        if group:
            lines.append("")
            lines.append(f"{title} ({len(group)}):")
            for report in group:
                lines.append(f"  {relative(report.path)}: {getattr(report, attribute)}")
    if stats.touched:
        lines.append("")
        lines.append("files changed on disk (must never happen):")
        lines.extend(f"  {relative(p)}" for p in stats.touched)
    if list_changed and stats.changed:
        lines.append("")
        lines.append("changed files (rules that fixed something):")
        for report in stats.changed:
            codes = sorted(
                {code for (code, status), _ in report.counts.items() if status == "fixed"}
            )
            lines.append(f"  {relative(report.path)}: {', '.join(codes)}")
    timed = sorted(stats.files, key=lambda f: -f.seconds)[:slowest]
    if timed:
        lines.append("")
        lines.append("slowest files (both runs):")
        for report in timed:
            lines.append(
                f"  {report.seconds:6.2f} s  {report.size / 1e3:7.1f} kB  {relative(report.path)}"
            )
    lines.append("")
    lines.append("FAILED" if stats.failed else "OK")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, help="corpus folder (default: the installed torch)")
    parser.add_argument(
        "--subdir",
        action="append",
        default=[],
        help="only these folders or files under the root (repeatable), e.g. --subdir optim",
    )
    parser.add_argument("-j", "--jobs", type=int, default=0, help="worker processes (0: all)")
    parser.add_argument("--prefilter", action="store_true", help="skip files no trigger matches")
    parser.add_argument(
        "--no-unsafe-fixes", dest="unsafe_fixes", action="store_false", help="safe fixes only"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "--list-changed", action="store_true", help="list every changed file and its rules"
    )
    args = parser.parse_args(argv)
    root = (args.root or torch_root()).resolve()
    paths = python_files(root, args.subdir)
    if not paths:
        print(f"no .py files under {root}", file=sys.stderr)
        return 2
    stats = run_corpus(
        paths,
        root,
        jobs=args.jobs,
        prefilter=args.prefilter,
        unsafe_fixes=args.unsafe_fixes,
        progress=not args.quiet,
    )
    sys.stdout.write(render(stats, list_changed=args.list_changed))
    return 1 if stats.failed else 0


if __name__ == "__main__":
    sys.exit(main())

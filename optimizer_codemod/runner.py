"""Processing many files: read, pre-filter, rewrite, write or diff; in worker processes."""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from optimizer_codemod.api import (
    SourceRewrite,
    cyclic_gc_paused,
    format_rewrite,
    is_notebook,
    reading_order,
    rewrite_source,
)
from optimizer_codemod.analysis.project import DEBUG_VARIABLE, project_facts
from optimizer_codemod.analysis.project_context import context_modules
from optimizer_codemod.cache import Cache, write_atomically
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import FileOutcome, Status
from optimizer_codemod.engine import Resume
from optimizer_codemod.edits import text_edits
from optimizer_codemod.errors import OptcodemodError
from optimizer_codemod.lines import split_lines
from optimizer_codemod.sources import (
    FileStamp,
    read_source,
    remove_stale_temporaries,
    write_atomic,
)

# Below this much source to look at (files the cache does not settle; the pre-filter runs
# in the workers too), starting worker processes costs more than it saves.
# Measured on 2 cores (fork): a pool adds 10-20 ms; two 3 KB training scripts take 150 ms
# alone and 105 ms on two workers, 281 training scripts 11.3 s and 5.6 s; twelve fixtures of
# 170 bytes (2 ms each) 15 ms alone and 25 ms on two workers.
PARALLEL_THRESHOLD_BYTES = 4 * 1024
# How often the run looks for a SIGINT while it waits for its workers.
_POLL_S = 0.05


@dataclass(frozen=True)
class Mode:
    write: bool = True  # False under --check and --diff
    diff: bool = False
    keep_text: bool = False  # keep the new bytes (stdin mode)
    cache: Optional[Cache] = None  # where outcomes are looked up and stored; None: nowhere
    # Whether anything shows or keeps the rewritten text (it is written, diffed, kept, or its
    # edits go into a JSON or SARIF report). Without it (`--check` with a text report, as in a
    # pre-commit hook) the changed lines are not formatted, a tenth of a cold run: findings,
    # exit code and "would change" do not depend on the layout.
    text_shown: bool = True
    # Keep each changed file's old and new text in its outcome (FileOutcome.texts).
    keep_texts: bool = False


def unified_diff(parts) -> str:
    chunks = []
    for label, old, new in parts:
        chunks.extend(
            difflib.unified_diff(
                split_lines(old, keepends=True),
                split_lines(new, keepends=True),
                fromfile=label if os.path.isabs(label) else f"a/{label}",
                tofile=label if os.path.isabs(label) else f"b/{label}",
            )
        )
    return "".join(_terminated(line) for line in chunks)


def _terminated(line: str) -> str:
    """A diff line ending in a newline. A file's last line without one is marked as diff and
    git mark it: a patch tool would otherwise look for a newline the file lacks and refuse
    the hunk."""
    if line.endswith("\n"):
        return line
    return line + "\n\\ No newline at end of file\n"


class Interrupted(KeyboardInterrupt):
    """SIGINT stopped a run: what was already written, and what may have been."""

    def __init__(self, written: Sequence[str], in_flight: Sequence[str] = ()) -> None:
        super().__init__()
        self.written = list(written)
        # Files a worker was rewriting when it had to be stopped: each is either untouched or
        # completely rewritten, but which one was not reported back.
        self.in_flight = list(in_flight)


def process_bytes(
    src: bytes,
    path: str,
    settings: Settings,
    mode: Mode,
    stamp: Optional[FileStamp] = None,
    on_written: Optional[Callable[[FileOutcome], None]] = None,
    project: Any = None,
    resume: Optional[Resume] = None,
) -> FileOutcome:
    """`project`: what the other files of the run tell this one (analysis/project.py);
    `resume`: where an earlier rewrite of `src` stopped (engine.Resume)."""
    try:
        result = _cached_rewrite(src, path, settings, mode.cache, project, mode.text_shown, resume)
    except OptcodemodError as error:
        return FileOutcome(path=path, error=error.with_path(error.path or path).render())
    except RecursionError:
        return FileOutcome(
            path=path, error=f"{path}: too deeply nested for the parser; left untouched"
        )
    except Exception as exc:  # a bug of ours must cost this file, not the whole run
        return FileOutcome(
            path=path,
            error=f"{path}: internal error ({type(exc).__name__}: {exc}); left untouched. "
            "Please report it with this file.",
        )
    return _outcome(result, src, path, mode, stamp, on_written)


def _cached_rewrite(
    src: bytes,
    path: str,
    settings: Settings,
    cache: Optional[Cache],
    project: Any = None,
    formatted: bool = True,
    resume: Optional[Resume] = None,
) -> SourceRewrite:
    # A rewrite resumed from another text is not the rewrite of `src` with these facts.
    told = project if resume is None else (project, hashlib.sha256(resume.code).hexdigest())
    key = cache.key(src, path, settings, told) if cache is not None else None
    result = cache.get(key, src) if key is not None else None
    stale = result is None
    if result is None:
        options = settings.options_for(path)
        if project is not None:
            options = replace(options, project=project)
        result = rewrite_source(src, path, options, formatted, resume)
    if formatted and not result.formatted:
        # Kept by a run that showed no text (`--check`): laid out now, once.
        result, stale = format_rewrite(result, src, path), True
    if key is not None and stale:
        cache.put(key, result)
    return result


def _outcome(
    result: SourceRewrite,
    src: bytes,
    path: str,
    mode: Mode,
    stamp: Optional[FileStamp] = None,
    on_written: Optional[Callable[[FileOutcome], None]] = None,
) -> FileOutcome:
    outcome = FileOutcome(path=path)
    outcome.diagnostics = result.diagnostics
    outcome.changed = result.changed
    outcome.skipped = result.skipped
    if result.skipped == "empty file":
        outcome.warning = f"{path}: empty file, nothing to do"
    if result.warning:
        outcome.warning = result.warning
    if result.changed and mode.diff:
        outcome.diff = unified_diff(result.diff_parts)
    if result.changed and mode.text_shown and is_notebook(path):
        # A notebook's fixes edit its JSON text (the diff shows its cells).
        outcome.edits = text_edits(src.decode("utf-8"), result.new.decode("utf-8"))
    elif result.changed and mode.text_shown:
        [(_, old_text, new_text)] = result.diff_parts
        outcome.edits = text_edits(old_text, new_text)
    if mode.keep_text:
        outcome.new_text = result.new
    if result.changed and mode.keep_texts:
        outcome.texts = (src, result.new)
    if result.changed and mode.write:
        _write(outcome, result.new, stamp, on_written)
    return outcome


def _write(
    outcome: FileOutcome,
    data: bytes,
    stamp: Optional[FileStamp],
    on_written: Optional[Callable[[FileOutcome], None]] = None,
) -> None:
    def replaced(_: str) -> None:
        # Runs before a deferred SIGTERM or SIGINT can stop this process.
        outcome.written = True
        if on_written is not None:
            on_written(outcome)

    try:
        write_atomic(outcome.path, data, stamp, on_replaced=replaced)
    except OptcodemodError as error:
        outcome.error = error.render()


def process_path(
    path: str,
    settings: Settings,
    mode: Mode,
    on_written: Optional[Callable[[FileOutcome], None]] = None,
    project: Any = None,
) -> FileOutcome:
    try:
        src, stamp = read_source(path)
    except OptcodemodError as error:
        return FileOutcome(path=path, error=error.render())
    return process_bytes(src, path, settings, mode, stamp, on_written, project)


def _worker(args) -> FileOutcome:
    path, settings, mode, project, journal = args
    save = functools.partial(_save_outcome, journal) if journal else None
    return process_path(path, settings, mode, on_written=save, project=project)


def _save_outcome(journal: str, outcome: FileOutcome) -> None:
    """Keep a rewritten file's outcome where the parent finds it if the pool breaks.

    When any worker dies, the pool fails every future still pending, including outcomes
    another worker already computed and sent, and terminates the other workers: the file is
    rewritten, and without this its fixes would go unreported. It is saved right after the
    rename, while a SIGTERM still waits.
    """
    data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    write_atomically(Path(_journal_path(journal, outcome.path)), data)


def _saved_outcome(journal: str, path: str) -> Optional[FileOutcome]:
    try:
        with open(_journal_path(journal, path), "rb") as handle:
            return pickle.load(handle)
    except (OSError, pickle.UnpicklingError, EOFError):
        return None


def _journal_path(journal: str, path: str) -> str:
    return os.path.join(journal, hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest())


def _init_worker(parent: int) -> None:
    # Ctrl-C reaches the whole process group: the main process decides what happens, and a
    # worker finishes the file it has. SIGTERM kills at once, except while a file is being
    # replaced (write_atomic holds it back until the rename is done).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent)


_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """Make this worker end when the process that started it ends, however it ends.

    Otherwise a SIGKILL'd run leaves its workers running, holding the caller's pipes open
    (a pre-commit or CI job then waits forever). Linux delivers SIGTERM on the parent's death
    (prctl); elsewhere a thread watches for the parent to change.
    """
    if sys.platform.startswith("linux") and _set_parent_death_signal(signal.SIGTERM):
        if os.getppid() != parent:  # the parent died before the request was made
            os.kill(os.getpid(), signal.SIGTERM)
        return
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _set_parent_death_signal(signum: int) -> bool:
    try:
        import ctypes

        # The running program's own symbols include libc's prctl.
        return ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (ImportError, OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    if hasattr(signal, "pthread_sigmask"):
        # The SIGTERM sent below must reach the main thread, which holds it back mid-write.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)


def _cached_outcome(
    path: str, settings: Settings, mode: Mode, project: Any = None
) -> Optional[FileOutcome]:
    """The outcome the cache holds for the file as it is now, else None."""
    if mode.cache is None:
        return None
    try:
        src, stamp = read_source(path)
    except OptcodemodError:
        return None  # reported when the file is processed
    hit = mode.cache.get(mode.cache.key(src, path, settings, project), src)
    if hit is None or (mode.text_shown and not hit.formatted):
        return None  # an unformatted hit is laid out where files are processed
    return _outcome(hit, src, path, mode, stamp)


def run(
    paths: Sequence[str],
    settings: Settings,
    mode: Mode,
    jobs: int = 0,
    on_done: Optional[Callable[[FileOutcome], None]] = None,
) -> List[FileOutcome]:
    """Process every path; outcomes come back in the order of `paths`.

    SIGINT raises Interrupted, which names the files already rewritten; every other file is
    untouched.
    """
    outcomes: Dict[str, FileOutcome] = {}
    written: Dict[str, None] = {}  # an ordered set

    def record(outcome: FileOutcome) -> None:
        outcomes[outcome.path] = outcome
        if outcome.written:
            written[outcome.path] = None
        if on_done:
            on_done(outcome)

    def mark_written(outcome: FileOutcome) -> None:
        written[outcome.path] = None

    def replaced(outcome: FileOutcome) -> None:
        outcomes[outcome.path] = outcome
        if outcome.written:
            written[outcome.path] = None

    if mode.write:
        remove_stale_temporaries({os.path.dirname(os.path.realpath(p)) for p in paths})
    try:
        with _SigintWatch() as sigint:
            parses: Dict[str, Any] = {}  # the index's, kept for the settling builds
            failures: List[str] = []
            index = _project_index(paths, mode.cache, parses=parses, failures=failures)
            if index:
                mode = replace(mode, keep_texts=True)
            _run_all(paths, settings, mode, jobs, record, mark_written, sigint, index)
            if index:
                _settle_project(
                    paths, settings, mode, index, outcomes, replaced, sigint, parses, failures
                )
            parses.clear()
            if failures and paths:
                _warn(outcomes[paths[0]], failures[0])
    except Interrupted as stop:
        raise Interrupted(list(written), stop.in_flight) from None
    except KeyboardInterrupt:
        raise Interrupted(list(written)) from None
    return [outcomes[path] for path in paths]


class _SigintWatch:
    """Remembers that SIGINT came, whatever became of its KeyboardInterrupt.

    Library code can lose it: LibCST's position provider, interrupted inside its context
    manager, raises a KeyError while handling it, which would then pass for a per-file error
    and the run would go on. The run checks after each file instead.
    """

    def __init__(self) -> None:
        self.received = 0  # how many SIGINTs came
        self._raises = True
        self._previous = None

    def __enter__(self) -> "_SigintWatch":
        in_main = threading.current_thread() is threading.main_thread()
        if in_main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.received += 1
        if self._raises:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def counted_only(self) -> Iterator[None]:
        """SIGINT is only counted; the code inside calls check() where stopping is safe.

        For the worker pool: a KeyboardInterrupt raised inside concurrent.futures, between
        its taking a future's lock and its `with` block, leaves the lock held; the pool's
        manager thread then waits on it forever and so does the run (about one Ctrl-C in 20
        on a loaded 2-core machine, 2026-11-24).
        """
        self._raises = False
        try:
            yield
        finally:
            self._raises = True

    def check(self) -> None:
        if self.received:
            raise KeyboardInterrupt

    def __exit__(self, *exc_info) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _run_all(
    paths, settings, mode, jobs, record, mark_written, sigint: _SigintWatch, index
) -> None:
    """`index`: what each file learns from the others (imports, calls, entry points), read
    up front, so that each file is still rewritten on its own, here or in a worker, and cached."""
    candidates: List[str] = []
    for path in paths:
        cached = _cached_outcome(path, settings, mode, index.get(path))
        sigint.check()
        if cached is None:
            candidates.append(path)
        else:
            record(cached)
    jobs = jobs or os.cpu_count() or 1
    size = sum(_size(p) for p in candidates)
    if jobs > 1 and len(candidates) > 1 and size >= PARALLEL_THRESHOLD_BYTES:
        # Large files first, so one big file does not finish last on its own.
        ordered = sorted(candidates, key=lambda p: -_size(p))
        workers = min(jobs, len(candidates))
        with sigint.counted_only():
            _run_in_workers(ordered, settings, mode, workers, record, sigint, index)
        sigint.check()  # a SIGINT while the last files were being collected
    else:
        for path in candidates:
            outcome = process_path(
                path, settings, mode, on_written=mark_written, project=index.get(path)
            )
            sigint.check()  # an outcome made while SIGINT was being lost is not the file's
            record(outcome)


class _IndexFailed(Exception):
    """The index hit a bug of ours; raised through the cache, so that no empty index is
    stored for the files (a warm run would then lose the facts without a word)."""


def _project_index(
    paths: Sequence[str],
    cache: Optional[Cache],
    sources: Optional[Dict[str, bytes]] = None,
    parses: Optional[Dict[str, Any]] = None,
    failures: Optional[List[str]] = None,
) -> Dict[str, Any]:
    """What each file learns from the other files of the run and from the local modules they
    import (analysis/project.py, project_context.py), from the cache when no file changed;
    nothing for a single file that imports nothing local. `sources`: rewritten text to read
    instead of a file's; `parses`: the modules' parses, kept from one build to the next. An
    index that failed is empty, and what the run must say about it goes to `failures`."""
    context = context_modules(paths)
    if sum(path.endswith(".py") for path in paths) + len(context) < 2:
        return {}

    def build(paths: Sequence[str]) -> Dict[str, Any]:
        lost: List[Exception] = []
        index = project_facts(
            paths, context=context, sources=sources, parses=parses, on_failure=lost.append
        )
        if lost:
            raise _IndexFailed(lost[0])
        return index

    # The index parses every importing module and keeps each tree until it is done: with
    # the cyclic collector on, the growing heap is walked again and again (a quarter of the
    # index's time on the benchmark corpus); what cycles it leaves are collected after.
    with cyclic_gc_paused():
        try:
            if cache is None:
                return build(paths)
            return cache.project_index(paths, build, context, sources)
        except _IndexFailed as failed:
            if failures is not None:
                failures.append(_index_failure_message(failed.args[0]))
            return {}


def _index_failure_message(exc: Exception) -> str:
    return (
        f"warning: the project index failed ({type(exc).__name__}: {exc}), so what the "
        "files of this run tell each other (the models, loaders, devices and training loops "
        "they hand on) is missing from their rewrites. Please report it with these files; "
        f"{DEBUG_VARIABLE}=1 shows where it failed."
    )


def _warn(outcome: FileOutcome, message: str) -> None:
    outcome.warning = f"{outcome.warning}\n{message}" if outcome.warning else message


# Each round follows one more link between files: data.py's loader is pinned by OPT101, so
# train.py's copies of its batches can be made non-blocking (OPT201).
MAX_PROJECT_ROUNDS = 3


def _settle_project(
    paths: Sequence[str],
    settings: Settings,
    mode: Mode,
    index: Dict[str, Any],
    outcomes: Dict[str, FileOutcome],
    replaced: Callable[[FileOutcome], None],
    sigint: "_SigintWatch",
    parses: Optional[Dict[str, Any]] = None,
    failures: Optional[List[str]] = None,
) -> None:
    """Rewrite again the files whose project facts change once the index reads the run's
    rewrites instead of the old texts, until the facts stop changing: what one file's fix
    makes possible in another is done in the same run, and a second `apply` changes nothing
    (DESIGN.md section 4). A file rewritten already goes on from its rewrite, keeping its
    fixes, as a second `apply` would: OPT301's TF32 setting in train.py stays although the
    autocast OPT302 adds to trainer.py would have kept OPT301 from adding it."""
    for _ in range(MAX_PROJECT_ROUNDS):
        rewritten = {p: o.texts[1] for p, o in outcomes.items() if o.texts is not None}
        if not rewritten:
            return
        lost: List[str] = []
        settled = _project_index(paths, mode.cache, rewritten, parses, lost)
        if lost:  # the index the files were rewritten with stands
            if failures is not None:
                failures.extend(lost)
            return
        again = [p for p in paths if settled.get(p) != index.get(p) and not outcomes[p].error]
        for path in again:
            replaced(_rewrite_again(path, settings, mode, settled.get(path), outcomes[path]))
            sigint.check()
        if not again:
            return
        index = settled


def _rewrite_again(
    path: str, settings: Settings, mode: Mode, project: Any, first: FileOutcome
) -> FileOutcome:
    """The outcome of rewriting `path` with what the project now tells it, going on from its
    earlier rewrite; the file on disk goes from that rewrite (or its text) to the new one."""
    try:
        current, stamp = read_source(path)
    except OptcodemodError:
        return first
    original, rewritten = first.texts or (current, current)
    if current != (rewritten if first.written else original):
        return first  # saved by someone during the run: the write would be refused
    resume = None
    if first.texts is not None:
        resume = Resume(rewritten, tuple(first.fixed))
    unwritten = replace(mode, write=False)
    outcome = process_bytes(original, path, settings, unwritten, None, None, project, resume)
    if outcome.error:
        first.warning = f"{outcome.error}; its first rewrite stands"
        return first
    if resume is not None and settings.why_not:
        _explain_from_source(outcome, original, path, settings, mode, project)
    new = outcome.texts[1] if outcome.texts else original
    if mode.write and new != current:
        _write(outcome, new, stamp)
    outcome.written = outcome.written or first.written
    return outcome


def _explain_from_source(
    outcome: FileOutcome, original: bytes, path: str, settings: Settings, mode: Mode, project: Any
) -> None:
    """Give a resumed outcome the sites a rewrite of `original` with what the project now
    tells it leaves alone (engine.Resume reports none), but those the resumed one fixed."""
    looking = Mode(write=False, cache=mode.cache, text_shown=False)
    look = process_bytes(original, path, settings, looking, project=project)
    fixed = {(d.code, d.line) for d in outcome.fixed}
    outcome.diagnostics = [d for d in outcome.diagnostics if d.status is not Status.DECLINED]
    outcome.diagnostics += [
        d for d in look.diagnostics if d.status is Status.DECLINED and (d.code, d.line) not in fixed
    ]
    outcome.diagnostics.sort(key=reading_order)


def _run_in_workers(
    paths: List[str],
    settings: Settings,
    mode: Mode,
    workers: int,
    record: Callable[[FileOutcome], None],
    sigint: _SigintWatch,
    index: Optional[Dict[str, Any]] = None,
) -> None:
    """Process `paths` in worker processes; a worker that dies costs only its own file."""
    index = index or {}
    before = {path: _stat_key(path) for path in paths}
    journal = tempfile.mkdtemp(prefix="optcodemod-outcomes-") if mode.write else ""
    try:
        unfinished = _pool_pass(paths, settings, mode, workers, record, index, journal, sigint)
        # A worker died (a crash in native code) and took the pool down with it: the files it
        # left are run one at a time, so that a second crash names its own file.
        for path in unfinished:
            saved = _saved_outcome(journal, path) if mode.write else None
            if saved is not None:
                record(saved)  # rewritten and reported to the journal; only the pool lost it
            elif mode.write and _stat_key(path) != before[path]:
                # The worker was stopped after its rename but before it could report.
                record(
                    FileOutcome(
                        path=path,
                        changed=True,
                        written=True,
                        warning=f"{path}: rewritten, but its worker was stopped before it "
                        "could report the fixes",
                    )
                )
            elif _pool_pass([path], settings, mode, 1, record, index, journal, sigint):
                record(FileOutcome(path=path, error=f"{path}: {_crash_message()}; left untouched"))
    finally:
        if journal:
            shutil.rmtree(journal, ignore_errors=True)


def _pool_pass(paths, settings, mode, workers, record, index, journal, sigint) -> List[str]:
    """Run `paths` in one pool; the paths left without an outcome when a worker died."""
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=_mp_context(),
        initializer=_init_worker,
        initargs=(os.getpid(),),
    )
    unrecorded = {}
    left: List[str] = []
    # One file per task, largest first: a task's round trip is about 0.1 ms (908 empty tasks
    # took 0.096 s on 2 fork workers; 2-core AMD EPYC, 2026-11-24), under 1% of a training
    # script's 30 ms, so bigger chunks would only let one worker finish last alone.
    for number, path in enumerate(paths):
        try:
            future = pool.submit(_worker, (path, settings, mode, index.get(path), journal))
        except BrokenProcessPool:  # a worker died while the rest were being handed out
            left.extend(paths[number:])
            break
        unrecorded[future] = path

    def collect(future) -> None:
        path = unrecorded[future]
        try:
            outcome = future.result()
        except BrokenProcessPool:
            left.append(path)
        except Exception as exc:  # the outcome could not come back (pickling)
            record(FileOutcome(path=path, error=f"{path}: internal error ({exc!r})"))
        else:
            record(outcome)
        # Forgotten only once recorded: an interrupt before this line records it again.
        del unrecorded[future]

    try:
        while unrecorded and not left:
            sigint.check()
            done, _ = wait(list(unrecorded), timeout=_POLL_S, return_when=FIRST_COMPLETED)
            for future in done:
                collect(future)
        sigint.check()
        pool.shutdown(wait=True)
        for future in list(unrecorded):  # after a crash: what finished, and what did not
            collect(future)
    except KeyboardInterrupt:
        _stop(pool, unrecorded, collect, sigint)
        raise
    return left


def _stop(pool, unrecorded, collect, sigint: _SigintWatch) -> None:
    """After SIGINT: start nothing new, let each worker finish its file, report those."""
    for future in list(unrecorded):
        if future.cancel():
            del unrecorded[future]
    first = sigint.received
    try:
        while unrecorded and sigint.received == first:
            done, _ = wait(list(unrecorded), timeout=_POLL_S, return_when=FIRST_COMPLETED)
            for future in done:
                collect(future)
    except KeyboardInterrupt:
        pass  # the caller kept its own SIGINT handler, which raised where the signal came
    if not unrecorded:
        pool.shutdown(wait=True)
        return
    # A second SIGINT: stop the workers now. SIGTERM waits for a rename in progress, so
    # each of their files is either untouched or completely rewritten.
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    raise Interrupted([], list(unrecorded.values())) from None


def _crash_message() -> str:
    return (
        "the worker process handling this file died (a crash in native code, such as the "
        "parser running out of stack)"
    )


def _stat_key(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _mp_context():
    # fork starts workers in milliseconds with every rule already imported; spawn is the
    # fallback where fork does not exist.
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()

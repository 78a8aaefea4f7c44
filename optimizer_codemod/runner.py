"""Processing many files: read, pre-filter, rewrite, write or diff; in worker processes."""

from __future__ import annotations

import difflib
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from optimizer_codemod.api import (
    SourceRewrite,
    is_notebook,
    rewrite_source,
)
from optimizer_codemod.cache import Cache
from optimizer_codemod.config import Settings
from optimizer_codemod.diagnostics import FileOutcome
from optimizer_codemod.edits import text_edits
from optimizer_codemod.errors import OptcodemodError
from optimizer_codemod.sources import read_bytes, write_atomic

# Below this much source to look at (files the cache does not settle; the pre-filter runs
# in the workers too), starting worker processes costs more than it saves.
# Measured on 2 cores (fork): a pool adds 10-20 ms; two 3 KB training scripts take 150 ms
# alone and 105 ms on two workers, 281 training scripts 11.3 s and 5.6 s; twelve fixtures of
# 170 bytes (2 ms each) 15 ms alone and 25 ms on two workers.
PARALLEL_THRESHOLD_BYTES = 4 * 1024


@dataclass(frozen=True)
class Mode:
    write: bool = True  # False under --check and --diff
    diff: bool = False
    keep_text: bool = False  # keep the new bytes (stdin mode)
    cache: Optional[Cache] = None  # where outcomes are looked up and stored; None: nowhere


def unified_diff(parts) -> str:
    chunks = []
    for label, old, new in parts:
        chunks.extend(
            difflib.unified_diff(
                old.splitlines(keepends=True),
                new.splitlines(keepends=True),
                fromfile=label if os.path.isabs(label) else f"a/{label}",
                tofile=label if os.path.isabs(label) else f"b/{label}",
            )
        )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in chunks)
    return text


def process_bytes(src: bytes, path: str, settings: Settings, mode: Mode) -> FileOutcome:
    try:
        result = _cached_rewrite(src, path, settings, mode.cache)
    except OptcodemodError as error:
        outcome = FileOutcome(path=path)
        outcome.error = error.with_path(error.path or path).render()
        return outcome
    except RecursionError:
        return FileOutcome(
            path=path, error=f"{path}: too deeply nested for the parser; left untouched"
        )
    return _outcome(result, path, mode)


def _cached_rewrite(
    src: bytes, path: str, settings: Settings, cache: Optional[Cache]
) -> SourceRewrite:
    key = cache.key(src, path, settings) if cache is not None else None
    if key is not None:
        hit = cache.get(key, src)
        if hit is not None:
            return hit
    result = rewrite_source(src, path, settings.options_for(path))
    if key is not None:
        cache.put(key, result)
    return result


def _outcome(result: SourceRewrite, path: str, mode: Mode) -> FileOutcome:
    outcome = FileOutcome(path=path)
    outcome.diagnostics = result.diagnostics
    outcome.changed = result.changed
    if result.skipped == "empty file":
        outcome.warning = f"{path}: empty file, nothing to do"
    if result.warning:
        outcome.warning = result.warning
    if result.changed and mode.diff:
        outcome.diff = unified_diff(result.diff_parts)
    if result.changed and not is_notebook(path):
        [(_, old_text, new_text)] = result.diff_parts
        outcome.edits = text_edits(old_text, new_text)
    if mode.keep_text:
        outcome.new_text = result.new
    if result.changed and mode.write:
        try:
            write_atomic(path, result.new)
            outcome.written = True
        except OptcodemodError as error:
            outcome.error = error.render()
    return outcome


def process_path(path: str, settings: Settings, mode: Mode) -> FileOutcome:
    try:
        src = read_bytes(path)
    except OptcodemodError as error:
        return FileOutcome(path=path, error=error.render())
    return process_bytes(src, path, settings, mode)


def _worker(args) -> FileOutcome:
    path, settings, mode = args
    return process_path(path, settings, mode)


def _cached_outcome(path: str, settings: Settings, mode: Mode) -> Optional[FileOutcome]:
    """The outcome the cache holds for the file as it is now, else None."""
    if mode.cache is None:
        return None
    try:
        src = read_bytes(path)
    except OptcodemodError:
        return None  # reported when the file is processed
    hit = mode.cache.get(mode.cache.key(src, path, settings), src)
    return _outcome(hit, path, mode) if hit is not None else None


def run(
    paths: Sequence[str],
    settings: Settings,
    mode: Mode,
    jobs: int = 0,
    on_done: Optional[Callable[[FileOutcome], None]] = None,
) -> List[FileOutcome]:
    """Process every path; outcomes come back in the order of `paths`."""
    outcomes: dict = {}
    candidates: List[str] = []
    for path in paths:
        cached = _cached_outcome(path, settings, mode)
        if cached is None:
            candidates.append(path)
        else:
            outcomes[path] = cached
            if on_done:
                on_done(cached)
    jobs = jobs or os.cpu_count() or 1
    size = sum(_size(p) for p in candidates)
    if jobs > 1 and len(candidates) > 1 and size >= PARALLEL_THRESHOLD_BYTES:
        context = _mp_context()
        with ProcessPoolExecutor(
            max_workers=min(jobs, len(candidates)), mp_context=context
        ) as pool:
            work = [(path, settings, mode) for path in candidates]
            # Large files first, so one big file does not finish last on its own; one file
            # per task: chunks of 4 took as long over 281 scripts, chunks of 16 longer (the
            # last chunk's worker works alone).
            order = sorted(range(len(work)), key=lambda i: -_size(candidates[i]))
            results = pool.map(_worker, [work[i] for i in order], chunksize=1)
            for index, outcome in zip(order, results):
                outcomes[candidates[index]] = outcome
                if on_done:
                    on_done(outcome)
    else:
        for path in candidates:
            outcome = process_path(path, settings, mode)
            outcomes[path] = outcome
            if on_done:
                on_done(outcome)
    return [outcomes[path] for path in paths]


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

"""Ecosystem check: `optcodemod apply --unsafe-fixes` over real public training scripts.

    python scripts/ecosystem.py [--corpus scripts/ecosystem.toml] [--mirror DIR ...]
                                [--cache DIR ...] [--json OUT] [--keep DIR] [--only TEXT]
                                [--slowest N]

The corpus (`scripts/ecosystem.toml`) pins repositories by commit and lists the scripts to check;
no third-party code lives in this repository. Each file is read from a local copy:

- a bare or normal git mirror, `MIRROR/<owner>+<name>/repo` or `MIRROR/<owner>+<name>` (read
  with `git show COMMIT:PATH`, so any commit the mirror holds works); default mirror dir
  `/work/.mirror`;
- or a cache dir of checkouts at the pinned commit, `CACHE/<owner>+<name>/PATH`.

Repositories found in neither are listed with the commands that fetch them, and skipped. The
files are all copied into a temporary folder first, with the local modules they import
(keeping their paths inside the repository, under a root marked as a checkout by an empty
`.git`), so that a module a file imports is there as in a clone, and each is rewritten there
on its own, serially (`-j 1`), beside the others as they were, as a user runs `optcodemod
apply train.py`.

For every file it records and checks:
- the exit status: 0 or 1 is fine; a traceback, a signal or any other status is a crash; exit 2
  (the tool refused the file, or a rule's output was caught by the engine) is an error;
- the output compiles;
- a second `apply --check` on the output changes nothing;
- unchanged lines stay byte-identical: every replaced or deleted line of the original lies in a
  hunk that overlaps the span of a finding that was fixed, and no added line ends in whitespace;
- the wall time of the `apply` call (less the tool's start-up time, measured once on an empty
  file).

Then each repository with two or more listed files is rewritten as a project, its listed files
in one `apply` (where one file's fix can change what another is told: a loader pinned in
data.py makes train.py's copies non-blocking), and checked the same way: no crash or error,
every output compiles, and a second `apply --check` over them changes nothing.

It tallies fixes per rule from `--output-format json` and prints a summary (files, crashes,
errors, invalid outputs, second-run changes, non-identical unchanged lines, fixes per rule, the
slowest files). `--json OUT` writes every record with each file's diff hunks (line ranges and
rules; `--hunk-text` adds their text, which is third-party code: keep that out of commits), and
`--keep DIR` keeps the rewritten files for review.
Exit status: 0 when every check holds, 1 when one fails, 2 when no file could be checked.

Not part of the test suite (it needs the mirrors); tests/test_ecosystem.py tests its checking
logic on a local fake corpus.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import platform
import posixpath
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = Path(__file__).with_name("ecosystem.toml")
DEFAULT_MIRRORS = (Path("/work/.mirror"),)
DEFAULT_COMMAND = (sys.executable, "-m", "optimizer_codemod")


@dataclass(frozen=True)
class Entry:
    repo: str  # owner/name
    commit: str
    path: str  # inside the repository

    @property
    def key(self) -> str:
        return self.repo.replace("/", "+")


def load_corpus(path: Path) -> List[Entry]:
    with open(path, "rb") as handle:
        document = tomllib.load(handle)
    entries = []
    for repo in document.get("repo", []):
        for item in repo["paths"]:
            entries.append(Entry(repo["name"], repo["commit"], item))
    return entries


# -- materialising ------------------------------------------------------------------------------


def _git_dirs(entry: Entry, mirrors: Sequence[Path]) -> List[Path]:
    found = []
    for mirror in mirrors:
        for candidate in (mirror / entry.key / "repo", mirror / entry.key):
            if candidate.exists():
                found.append(candidate)
    return found


def read_entry(
    entry: Entry, mirrors: Sequence[Path], caches: Sequence[Path]
) -> Tuple[Optional[bytes], str]:
    """The file's bytes at the pinned commit and where they came from, or (None, reason)."""
    for cache in caches:
        candidate = cache / entry.key / entry.path
        if candidate.is_file():
            return candidate.read_bytes(), str(candidate)
    reason = "repository not found locally"
    for git_dir in _git_dirs(entry, mirrors):
        result = subprocess.run(
            ["git", f"--git-dir={_dot_git(git_dir)}", "show", f"{entry.commit}:{entry.path}"],
            capture_output=True,
        )
        if result.returncode == 0:
            return result.stdout, f"{git_dir}@{entry.commit[:12]}"
        reason = f"{git_dir}: {result.stderr.decode(errors='replace').strip()}"
    return None, reason


def _dot_git(git_dir: Path) -> Path:
    # A normal checkout keeps its git dir in .git; a bare mirror is the git dir itself.
    return git_dir / ".git" if (git_dir / ".git").exists() else git_dir


def fetch_hint(repo: str, commit: str, caches: Sequence[Path]) -> str:
    cache = caches[0] if caches else Path("CACHE")
    target = cache / repo.replace("/", "+")
    return (
        f"git clone https://github.com/{repo} {target} && "
        f"git -C {target} checkout {commit}   (then pass --cache {cache})"
    )


# -- the local modules a pinned file imports ---------------------------------------------------


MAX_CONTEXT_FILES = 80  # local modules read beside a repository's pinned files, at most


class RepoFiles:
    """The files of one repository at its pinned commit: a git mirror, or a checkout cache."""

    def __init__(self, entry: Entry, mirrors: Sequence[Path], caches: Sequence[Path]):
        self.entry, self.caches = entry, caches
        self.git_dir: Optional[Path] = None
        self.paths: Set[str] = set()
        for cache in caches:
            root = cache / entry.key
            if root.is_dir():
                self.paths = {
                    p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.is_file()
                }
                return
        for git_dir in _git_dirs(entry, mirrors):
            listing = subprocess.run(
                [
                    "git",
                    f"--git-dir={_dot_git(git_dir)}",
                    "ls-tree",
                    "-r",
                    "--name-only",
                    entry.commit,
                ],
                capture_output=True,
                text=True,
            )
            if listing.returncode == 0:
                self.git_dir = git_dir
                self.paths = {p for p in listing.stdout.splitlines() if p.endswith(".py")}
                return

    def read(self, path: str) -> Optional[bytes]:
        for cache in self.caches:
            candidate = cache / self.entry.key / path
            if candidate.is_file():
                return candidate.read_bytes()
        if self.git_dir is None:
            return None
        shown = subprocess.run(
            [
                "git",
                f"--git-dir={_dot_git(self.git_dir)}",
                "show",
                f"{self.entry.commit}:{path}",
            ],
            capture_output=True,
        )
        return shown.stdout if shown.returncode == 0 else None


def _module_files(base: str, parts: Sequence[str], paths: Set[str]) -> List[str]:
    """The files an import of `parts` from folder `base` runs: the packages on the way
    (their `__init__.py`; a folder without one is a namespace package) and the module
    itself, when it is a file of the repository."""
    found = []
    for i in range(1, len(parts) + 1):
        stem = posixpath.join(base, *parts[:i])
        init = posixpath.join(stem, "__init__.py")
        if i == len(parts) and stem + ".py" in paths:
            found.append(stem + ".py")
        elif init in paths:
            found.append(init)
        elif not any(p.startswith(stem + "/") for p in paths):
            return []
    return found


def _search_bases(path: str, paths: Set[str]) -> List[str]:
    """Where an absolute import in `path` is looked up: its own folder (a script's folder is
    on sys.path), the folder above its top package, and the repository root and its `src`
    (a project installed with `pip install -e .` or run from its root), as the tool does."""
    folder = posixpath.dirname(path)
    top = folder
    while top and posixpath.join(top, "__init__.py") in paths:
        top = posixpath.dirname(top)
    return list(dict.fromkeys([folder, top, "", "src"]))


def local_imports(path: str, source: bytes, paths: Set[str]) -> List[str]:
    """The files of the repository (`paths`) that the imports of `path` name; imports of
    anything else (the standard library, torch, other packages) are left out."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: List[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                for base in _search_bases(path, paths):
                    files = _module_files(base, parts, paths)
                    if files:
                        found += files
                        break
        elif isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".") if node.module else []
            if node.level:
                base = posixpath.dirname(path)
                for _ in range(node.level - 1):
                    base = posixpath.dirname(base)
                bases = [base]
            else:
                bases = _search_bases(path, paths)
            for base in bases:
                files = _module_files(base, parts, paths) if parts else []
                package = posixpath.join(base, *parts)
                submodules = [
                    f
                    for alias in node.names
                    if alias.name != "*"
                    for f in _module_files(package, [alias.name], paths)
                ]
                if files or submodules:
                    found += files + submodules
                    break
    return list(dict.fromkeys(f for f in found if f != path))


def project_files(
    repo: RepoFiles, pinned: Dict[str, bytes], limit: int = MAX_CONTEXT_FILES
) -> Tuple[Dict[str, bytes], bool]:
    """The repository's local modules that its pinned files import, transitively (pinned
    files left out), at most `limit` of them; and whether the limit cut the search short."""
    context: Dict[str, bytes] = {}
    pending = list(pinned.items())
    while pending:
        path, source = pending.pop(0)
        for imported in local_imports(path, source, repo.paths):
            if imported in pinned or imported in context:
                continue
            if len(context) >= limit:
                return context, True
            text = repo.read(imported)
            if text is not None:
                context[imported] = text
                pending.append((imported, text))
    return context, False


# -- running ------------------------------------------------------------------------------------


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def report(self) -> dict:
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError:
            return {}


DEFAULT_TIMEOUT = 600  # seconds for one file; a run past it is a hang, counted as a crash
TIMEOUT_SECONDS = DEFAULT_TIMEOUT


def run_apply(
    command: Sequence[str], path: Union[Path, Sequence[Path]], *extra: str, cwd: Path
) -> Run:
    argv = [*command, "apply", "--unsafe-fixes", "--output-format", "json", "-j", "1", *extra]
    argv.extend(str(p) for p in ([path] if isinstance(path, Path) else path))
    start = time.perf_counter()
    try:
        # A bug in the project index only warns a user; here it must crash the run and count.
        debug = dict(os.environ, OPTCODEMOD_DEBUG="1")
        result = subprocess.run(
            argv, capture_output=True, cwd=cwd, timeout=TIMEOUT_SECONDS, env=debug
        )
    except subprocess.TimeoutExpired as expired:
        seconds = time.perf_counter() - start
        stderr = (expired.stderr or b"").decode(errors="replace")
        return Run(-9, "", f"timed out after {TIMEOUT_SECONDS} s\n{stderr}", seconds)
    seconds = time.perf_counter() - start
    return Run(
        result.returncode,
        result.stdout.decode(errors="replace"),
        result.stderr.decode(errors="replace"),
        seconds,
    )


# -- checking -----------------------------------------------------------------------------------


@dataclass
class Hunk:
    """One changed region: original lines [start, end) (1-based, end exclusive), new lines."""

    start: int
    end: int
    new_start: int
    new_end: int
    rules: List[str]  # codes of fixed findings whose span overlaps (or, for an insert, touches)
    before: str
    after: str


@dataclass
class LineCheck:
    hunks: List[Hunk]
    # Original lines whose bytes changed while their text did not, other than re-indentation
    # (line endings, trailing or inner whitespace, a BOM): "unchanged" lines that are not
    # byte-identical. (original line, new line)
    whitespace_changes: List[Tuple[int, int]]
    reindented: List[Tuple[int, int]]  # same text, new indentation (a block wrapped in a with)
    away_from_findings: List[Hunk]  # replaced/deleted lines that no fixed finding's span covers
    trailing_whitespace: List[int]  # new-file line numbers of added lines ending in whitespace
    newline_changes: List[int]  # new-file lines whose line ending differs from the file's


def _lines(data: bytes) -> List[bytes]:
    return data.splitlines(keepends=True)


def _ending(line: bytes) -> bytes:
    return line[len(line.rstrip(b"\r\n")) :]


def _dominant_ending(lines: Sequence[bytes]) -> bytes:
    counts = Counter(_ending(line) for line in lines if _ending(line))
    return counts.most_common(1)[0][0] if counts else b"\n"


def _line_end(line: bytes) -> Tuple[bytes, bytes]:
    """The last character of a line before its trailing whitespace, and that whitespace: how
    a trailing space an edit kept (`lr=1e-3)  ` -> `lr=1e-3, fused=True)  `) is told from one
    it added (`shuffle=True)` -> `shuffle=True, `)."""
    body = line.rstrip(b"\r\n")
    text = body.rstrip()
    if not text:  # a line of spaces only: re-indented with its block, it keeps being one
        return (b"", b" ")
    return (text[-1:], body[len(text) :])


def check_notebook(before: bytes, after: bytes) -> LineCheck:
    """check_lines over the code of a notebook's cells, each cell's source after a marker
    line, so that a block wrapped in a `with` counts as re-indented there as in a script (in
    the JSON the indentation sits inside the strings); every other part of the notebook (its
    metadata, each cell's outputs, type and count) must be unchanged, else the check fails at
    (0, cell number). Findings in notebooks are placed by cell, so no hunk is matched to one:
    every hunk is listed for review."""
    try:
        old, new = json.loads(before), json.loads(after)
    except ValueError:
        return check_lines(before, after, [])

    def code(notebook) -> bytes:
        parts = []
        for number, cell in enumerate(notebook.get("cells", []), 1):
            text = cell.get("source", "") if cell.get("cell_type") == "code" else ""
            text = "".join(text) if isinstance(text, list) else text
            parts.append(f"# cell {number}\n{text}\n")
        return "".join(parts).encode()

    def rest(notebook):
        cells = [{k: v for k, v in c.items() if k != "source"} for c in notebook.get("cells", [])]
        return cells, {k: v for k, v in notebook.items() if k != "cells"}

    lines = check_lines(code(old), code(new), [])
    old_cells, old_top = rest(old)
    new_cells, new_top = rest(new)
    if old_top != new_top or len(old_cells) != len(new_cells):
        lines.whitespace_changes.append((0, 0))
    else:
        changed = [n for n, (a, b) in enumerate(zip(old_cells, new_cells), 1) if a != b]
        lines.whitespace_changes.extend((0, n) for n in changed)
    return lines


def check_lines(before: bytes, after: bytes, spans: Sequence[Tuple[str, int, int]]) -> LineCheck:
    """Compare original and rewritten bytes line by line (difflib over byte lines).

    `spans` are (rule code, first line, last line) of the fixed findings, in original lines.
    Lines outside the changed hunks are byte-identical by construction of the diff. Inside a
    hunk, an original line whose text reappears with other bytes (a line ending, trailing or
    inner whitespace) is an "unchanged" line that is not byte-identical: a failure. Re-indented
    lines (a block wrapped in a new `with`) are listed, not failed. A hunk that replaces or
    deletes original lines no fixed finding covers is listed for review (some fixes edit a
    second site, such as a use of a value they changed); an added line ending in whitespace
    that no replaced line of its hunk ended in after the same character, or with another line
    ending than the file's, is a failure.
    """
    if before.startswith(b"\xef\xbb\xbf") != after.startswith(b"\xef\xbb\xbf"):
        whitespace = [(1, 1)]  # the BOM came or went
    else:
        whitespace = []
    old, new = _lines(before), _lines(after)
    ending = _dominant_ending(old)
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    hunks, away, trailing, reindented, newlines = [], [], [], [], []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        start, end = i1 + 1, i2 + 1  # 1-based, end exclusive
        if tag == "insert":
            rules = [code for code, first, last in spans if first - 1 <= i1 <= last + 1]
        else:
            rules = [code for code, first, last in spans if first < end and last >= start]
        hunk = Hunk(
            start,
            end,
            j1 + 1,
            j2 + 1,
            sorted(set(rules)),
            b"".join(old[i1:i2]).decode("utf-8", errors="replace"),
            b"".join(new[j1:j2]).decode("utf-8", errors="replace"),
        )
        hunks.append(hunk)
        if tag != "insert" and not rules:
            away.append(hunk)
        by_text: Dict[bytes, List[int]] = {}
        for j in range(j1, j2):
            by_text.setdefault(b"".join(new[j].split()), []).append(j)
        for i in range(i1, i2):
            text = b"".join(old[i].split())
            if not text:
                continue
            for j in by_text.get(text, []):
                if new[j].lstrip() == old[i].lstrip():
                    reindented.append((i + 1, j + 1))
                else:
                    whitespace.append((i + 1, j + 1))
                break
        carried = Counter(_line_end(line) for line in old[i1:i2])
        for j in range(j1, j2):
            line = new[j]
            if line in old[i1:i2]:
                continue
            body = line.rstrip(b"\r\n")
            if body != body.rstrip():
                if carried[_line_end(line)] > 0:  # the edited line had it: kept, not added
                    carried[_line_end(line)] -= 1
                else:
                    trailing.append(j + 1)
            if _ending(line) and _ending(line) != ending:
                newlines.append(j + 1)
    return LineCheck(hunks, whitespace, reindented, away, trailing, newlines)


@dataclass
class FileResult:
    repo: str
    commit: str
    path: str
    status: str = "ok"  # ok | crash | error | missing
    exit_code: Optional[int] = None
    seconds: float = 0.0
    net_seconds: float = 0.0
    lines: int = 0
    changed: bool = False
    compiles: bool = True
    compile_error: Optional[str] = None
    second_run_changes: bool = False
    second_run_detail: Optional[str] = None
    message: Optional[str] = None
    fixed: Dict[str, int] = field(default_factory=dict)
    unsafe: Dict[str, int] = field(default_factory=dict)
    reported: Dict[str, int] = field(default_factory=dict)
    findings: List[dict] = field(default_factory=list)
    hunks: List[dict] = field(default_factory=list)
    whitespace_changes: List[Tuple[int, int]] = field(default_factory=list)
    reindented_lines: int = 0
    away_from_findings: List[int] = field(default_factory=list)  # first line of each hunk
    trailing_whitespace: List[int] = field(default_factory=list)
    newline_changes: List[int] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return (
            self.status in ("crash", "error")
            or not self.compiles
            or self.second_run_changes
            or bool(self.whitespace_changes)
            or bool(self.trailing_whitespace)
            or bool(self.newline_changes)
        )


def _is_crash(run: Run) -> bool:
    return run.returncode not in (0, 1, 2) or "Traceback (most recent call last)" in run.stderr


def _materialise(
    entries: Sequence[Entry],
    mirrors: Sequence[Path],
    caches: Sequence[Path],
    workdir: Path,
    missing: Dict[str, str],
) -> Dict[Entry, bytes]:
    """Every listed file written into `workdir` before any is checked, with the local modules
    the listed files of its repository import (project_files; read, never checked), so that a
    module a file imports is there as in a clone (a user rewrites a file inside its
    project); what is missing goes into `missing`."""
    sources: Dict[Entry, bytes] = {}
    for entry in entries:
        if entry.repo in missing:
            continue
        source, origin = read_entry(entry, mirrors, caches)
        if source is None:
            if "not found locally" in origin:
                missing[entry.repo] = fetch_hint(entry.repo, entry.commit, caches)
            else:
                missing.setdefault(f"{entry.repo}:{entry.path}", origin)
            continue
        sources[entry] = source
        # A checkout's root: the tool looks up an installed project's packages from there.
        (workdir / entry.key / ".git").mkdir(parents=True, exist_ok=True)
        target = workdir / entry.key / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source)
    by_repo: Dict[str, List[Entry]] = {}
    for entry in sources:
        by_repo.setdefault(entry.repo, []).append(entry)
    for listed in by_repo.values():
        pinned = {entry.path: sources[entry] for entry in listed}
        context, _cut = project_files(RepoFiles(listed[0], mirrors, caches), pinned)
        for path, text in context.items():
            target = workdir / listed[0].key / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(text)
    return sources


def check_file(
    entry: Entry, source: bytes, workdir: Path, command: Sequence[str], startup: float = 0.0
) -> FileResult:
    result = FileResult(entry.repo, entry.commit, entry.path, lines=len(_lines(source)))
    target = workdir / entry.key / entry.path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source)
    first = run_apply(command, target, cwd=workdir)
    result.exit_code = first.returncode
    result.seconds = round(first.seconds, 3)
    result.net_seconds = round(max(0.0, first.seconds - startup), 3)
    if _is_crash(first):
        result.status = "crash"
        result.message = (first.stderr or first.stdout)[-2000:]
        return result
    report = first.report()
    errors = report.get("errors") or []
    if first.returncode == 2 or errors:
        result.status = "error"
        result.message = "; ".join(e.get("message", "") for e in errors) or first.stderr[-2000:]
    spans = []
    for finding in report.get("findings", []):
        status, code = finding["status"], finding["code"]
        tally = {"fixed": result.fixed, "unsafe": result.unsafe}.get(status, result.reported)
        tally[code] = tally.get(code, 0) + 1
        record = {
            "code": code,
            "status": status,
            "safety": finding.get("safety"),
            "line": finding["location"]["row"],
            "end_line": finding["end_location"]["row"],
            "message": finding.get("message"),
        }
        result.findings.append(record)
        if status == "fixed":
            spans.append((code, record["line"], record["end_line"]))
    after = target.read_bytes()
    result.changed = after != source
    if not result.changed:
        return result
    try:
        compile(after, str(target), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        result.compiles = False
        result.compile_error = f"{type(error).__name__}: {error}"
    second = run_apply(command, target, "--check", cwd=workdir)
    if _is_crash(second):
        result.second_run_changes = True
        result.second_run_detail = "crash: " + second.stderr[-1000:]
    elif target.read_bytes() != after:
        result.second_run_changes = True
        result.second_run_detail = "--check wrote to the file"
    else:
        again = second.report()
        fixed_again = [f for f in again.get("findings", []) if f["status"] == "fixed"]
        if second.returncode == 1 or again.get("changed_files") or fixed_again:
            result.second_run_changes = True
            result.second_run_detail = ", ".join(
                f"{f['code']}@{f['location']['row']}" for f in fixed_again
            )
    if entry.path.endswith(".ipynb"):
        lines = check_notebook(source, after)
    else:
        lines = check_lines(source, after, spans)
    result.hunks = [asdict(h) for h in lines.hunks]
    result.whitespace_changes = lines.whitespace_changes
    result.reindented_lines = len(lines.reindented)
    result.away_from_findings = [h.start for h in lines.away_from_findings]
    result.trailing_whitespace = lines.trailing_whitespace
    result.newline_changes = lines.newline_changes
    return result


@dataclass
class ProjectResult:
    """A repository's listed files rewritten together, in one `apply`."""

    repo: str
    files: int
    status: str = "ok"  # ok | crash | error
    message: Optional[str] = None
    seconds: float = 0.0
    changed_files: int = 0
    fixes: int = 0
    invalid_outputs: List[str] = field(default_factory=list)
    second_run_changes: bool = False
    second_run_detail: Optional[str] = None

    @property
    def failed(self) -> bool:
        return self.status != "ok" or bool(self.invalid_outputs) or self.second_run_changes


def check_project(
    entries: Sequence[Entry], sources: Dict[Entry, bytes], workdir: Path, command: Sequence[str]
) -> Optional[ProjectResult]:
    """Rewrite `entries` (one repository's) in one run, check the outputs compile and that a
    second run changes nothing; the files are left as they were. None for fewer than 2."""
    listed = [e for e in entries if e in sources]
    if len(listed) < 2:
        return None
    targets = [workdir / e.key / e.path for e in listed]
    result = ProjectResult(listed[0].repo, len(listed))
    try:
        first = run_apply(command, targets, cwd=workdir)
        result.seconds = round(first.seconds, 3)
        report = first.report()
        if _is_crash(first) or first.returncode == 2 or report.get("errors"):
            result.status = "crash" if _is_crash(first) else "error"
            messages = [e.get("message", "") for e in report.get("errors") or []]
            result.message = "; ".join(messages) or (first.stderr or first.stdout)[-2000:]
            return result
        result.fixes = sum(f["status"] == "fixed" for f in report.get("findings", []))
        after = {t: t.read_bytes() for t in targets}
        changed = [(e, t) for e, t in zip(listed, targets) if after[t] != sources[e]]
        result.changed_files = len(changed)
        for entry, target in changed:
            if target.suffix != ".py":
                continue
            try:
                compile(after[target], str(target), "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as error:
                result.invalid_outputs.append(f"{entry.path}: {type(error).__name__}: {error}")
        second = run_apply(command, targets, "--check", cwd=workdir)
        again = second.report()
        pending = [f for f in again.get("findings", []) if f["status"] in ("fixed", "fixable")]
        if _is_crash(second):
            result.second_run_changes = True
            result.second_run_detail = "crash: " + second.stderr[-1000:]
        elif any(t.read_bytes() != after[t] for t in targets):
            result.second_run_changes = True
            result.second_run_detail = "--check wrote to a file"
        elif second.returncode == 1 or again.get("changed_files") or pending:
            result.second_run_changes = True
            result.second_run_detail = ", ".join(
                f"{f['filename']}:{f['code']}@{f['location']['row']}" for f in pending
            )
        return result
    finally:
        for entry, target in zip(listed, targets):
            target.write_bytes(sources[entry])


def measure_startup(command: Sequence[str], workdir: Path, repeat: int = 3) -> float:
    """The tool's fixed cost per call (interpreter, imports, CLI), on a file with no pattern."""
    probe = workdir / "_startup_probe.py"
    probe.write_text("x = 1\n")
    times = [run_apply(command, probe, "--check", cwd=workdir).seconds for _ in range(repeat)]
    probe.unlink()
    return min(times)


# -- summary ------------------------------------------------------------------------------------


def summarise(
    results: Sequence[FileResult],
    missing: Dict[str, str],
    slowest: int = 10,
    projects: Sequence[ProjectResult] = (),
) -> dict:
    checked = [r for r in results if r.status != "missing"]
    fixed, unsafe, reported = Counter(), Counter(), Counter()
    for r in checked:
        fixed.update(r.fixed)
        unsafe.update(r.unsafe)
        reported.update(r.reported)
    by_time = sorted(checked, key=lambda r: -r.seconds)[:slowest]
    return {
        "files": len(checked),
        "repositories": len({r.repo for r in checked}),
        "changed_files": sum(r.changed for r in checked),
        "crashes": [r.repo + ":" + r.path for r in checked if r.status == "crash"],
        "errors": [r.repo + ":" + r.path for r in checked if r.status == "error"],
        "invalid_outputs": [r.repo + ":" + r.path for r in checked if not r.compiles],
        "second_run_changes": [r.repo + ":" + r.path for r in checked if r.second_run_changes],
        "non_identical_unchanged_lines": [
            f"{r.repo}:{r.path} (original:new lines {r.whitespace_changes})"
            for r in checked
            if r.whitespace_changes
        ],
        "trailing_whitespace": [
            f"{r.repo}:{r.path} lines {r.trailing_whitespace}"
            for r in checked
            if r.trailing_whitespace
        ],
        "newline_changes": [
            f"{r.repo}:{r.path} lines {r.newline_changes}" for r in checked if r.newline_changes
        ],
        "edits_away_from_findings": [
            f"{r.repo}:{r.path} hunks at lines {r.away_from_findings}"
            for r in checked
            if r.away_from_findings
        ],
        "reindented_lines": sum(r.reindented_lines for r in checked),
        "fixes": sum(fixed.values()),
        "fixes_per_rule": dict(sorted(fixed.items())),
        "unsafe_not_applied_per_rule": dict(sorted(unsafe.items())),
        "reported_per_rule": dict(sorted(reported.items())),
        "total_seconds": round(sum(r.seconds for r in checked), 2),
        "slowest": [
            {"file": f"{r.repo}:{r.path}", "seconds": r.seconds, "lines": r.lines} for r in by_time
        ],
        "missing_repositories": missing,
        "projects": len(projects),
        "project_fixes": sum(p.fixes for p in projects),
        "project_failures": [_project_failure(p) for p in projects if p.failed],
    }


def _project_failure(project: ProjectResult) -> str:
    if project.status != "ok":
        return f"{project.repo}: {project.status}: {project.message}"
    if project.invalid_outputs:
        return f"{project.repo}: invalid outputs: {'; '.join(project.invalid_outputs)}"
    return f"{project.repo}: a second run changes {project.second_run_detail}"


def render_summary(summary: dict, startup: float) -> str:
    out = [
        f"files checked: {summary['files']} from {summary['repositories']} repositories "
        f"({summary['changed_files']} changed)",
    ]
    for label, key in (
        ("crashes (tracebacks, signals)", "crashes"),
        ("errors (exit 2: refused or rule output caught)", "errors"),
        ("invalid outputs (do not compile)", "invalid_outputs"),
        ("second-run changes", "second_run_changes"),
        ("non-identical unchanged lines", "non_identical_unchanged_lines"),
        ("added lines with trailing whitespace", "trailing_whitespace"),
        ("added lines with another line ending", "newline_changes"),
        ("(review) edits away from any fixed finding's span", "edits_away_from_findings"),
    ):
        items = summary[key]
        out.append(f"{label}: {len(items)}")
        out.extend(f"    {item}" for item in items)
    out.append(
        f"(review) re-indented lines (blocks wrapped in a with): {summary['reindented_lines']}"
    )
    out.append(
        f"projects (a repository's files in one run): {summary['projects']}, "
        f"{summary['project_fixes']} fixes; failures: {len(summary['project_failures'])}"
    )
    out.extend(f"    {item}" for item in summary["project_failures"])
    out.append(f"fixes applied: {summary['fixes']}")
    for code, count in summary["fixes_per_rule"].items():
        out.append(f"    {code}: {count}")
    if summary["reported_per_rule"]:
        out.append(
            "reported without a fix: "
            + ", ".join(f"{c} {n}" for c, n in summary["reported_per_rule"].items())
        )
    out.append(
        f"time: {summary['total_seconds']} s in all; start-up {startup:.2f} s per call; slowest:"
    )
    for row in summary["slowest"]:
        out.append(f"    {row['seconds']:7.2f} s  {row['lines']:5d} lines  {row['file']}")
    if summary["missing_repositories"]:
        out.append("MISSING repositories (skipped); fetch them with:")
        for repo, hint in summary["missing_repositories"].items():
            out.append(f"    {repo}: {hint}")
    return "\n".join(out) + "\n"


def _git_commit() -> Optional[str]:
    result = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return result.stdout.strip() or None


def _uncommitted_tool_files() -> List[str]:
    """Engine or rule files that differ from the commit (the run used the working tree)."""
    result = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "optimizer_codemod", "transforms"],
        capture_output=True,
        text=True,
    )
    return [line[3:] for line in result.stdout.splitlines() if line.strip()]


def _tool_version(command: Sequence[str]) -> str:
    result = subprocess.run([*command, "--version"], capture_output=True, text=True)
    return result.stdout.strip()


def main(argv: Optional[Sequence[str]] = None) -> int:
    global TIMEOUT_SECONDS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument(
        "--mirror", type=Path, action="append", help="dir of git mirrors <owner>+<name>[/repo]"
    )
    parser.add_argument(
        "--cache", type=Path, action="append", default=[], help="dir of checkouts <owner>+<name>"
    )
    parser.add_argument("--json", type=Path, help="write every record here")
    parser.add_argument("--keep", type=Path, help="materialise and rewrite here (kept)")
    parser.add_argument(
        "--hunk-text",
        action="store_true",
        help="put each hunk's old and new text in --json (third-party code: do not commit it)",
    )
    parser.add_argument("--only", help="check only files whose repo:path contains this")
    parser.add_argument("--slowest", type=int, default=10)
    parser.add_argument(
        "--timeout", type=int, default=DEFAULT_TIMEOUT, help="seconds per apply call (a hang)"
    )
    parser.add_argument(
        "--command",
        default=None,
        help="how to call the tool (default: this Python's -m optimizer_codemod)",
    )
    args = parser.parse_args(argv)
    TIMEOUT_SECONDS = args.timeout
    command = tuple(args.command.split()) if args.command else DEFAULT_COMMAND
    mirrors = args.mirror if args.mirror is not None else list(DEFAULT_MIRRORS)
    entries = load_corpus(args.corpus)
    if args.only:
        entries = [e for e in entries if args.only in f"{e.repo}:{e.path}"]

    # The tool as it is when the run starts (others may commit while it runs).
    commit, uncommitted = _git_commit(), _uncommitted_tool_files()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="optcodemod-ecosystem-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: List[FileResult] = []
    projects: List[ProjectResult] = []
    missing: Dict[str, str] = {}
    try:
        startup = measure_startup(command, workdir)
        sources = _materialise(entries, mirrors, args.cache, workdir, missing)
        rewritten: Dict[Path, bytes] = {}
        for index, entry in enumerate(entries, 1):
            source = sources.get(entry)
            if source is None:
                results.append(FileResult(entry.repo, entry.commit, entry.path, status="missing"))
                continue
            result = check_file(entry, source, workdir, command, startup)
            results.append(result)
            # The next files are checked beside this one as it was: each is rewritten alone.
            target = workdir / entry.key / entry.path
            rewritten[target] = target.read_bytes()
            target.write_bytes(source)
            flag = "FAIL" if result.failed else "ok"
            fixes = sum(result.fixed.values())
            print(
                f"[{index:3d}/{len(entries)}] {flag:4s} {result.seconds:6.2f} s "
                f"{fixes:3d} fixes  {entry.repo}:{entry.path}",
                file=sys.stderr,
            )
        by_repo: Dict[str, List[Entry]] = {}
        for entry in entries:
            by_repo.setdefault(entry.repo, []).append(entry)
        for repo, listed in by_repo.items():
            project = check_project(listed, sources, workdir, command)
            if project is not None:
                projects.append(project)
                flag = "FAIL" if project.failed else "ok"
                print(
                    f"[project] {flag:4s} {project.seconds:6.2f} s {project.fixes:3d} fixes  "
                    f"{repo} ({project.files} files)",
                    file=sys.stderr,
                )
        for target, data in rewritten.items():
            target.write_bytes(data)  # what --keep keeps: every file as the tool left it
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    summary = summarise(results, missing, args.slowest, projects)
    sys.stdout.write(render_summary(summary, startup))
    if args.json:
        files = [asdict(r) for r in results]
        if not args.hunk_text:
            for record in files:
                for hunk in record["hunks"]:
                    hunk.pop("before"), hunk.pop("after")
        document = {
            "optcodemod_commit": commit,
            "uncommitted_tool_files": uncommitted,
            "optcodemod_version": _tool_version(command),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "startup_seconds": round(startup, 3),
            "summary": summary,
            "files": files,
            "projects": [asdict(p) for p in projects],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    if not summary["files"]:
        return 2
    return 1 if any(r.failed for r in [*results, *projects]) else 0


if __name__ == "__main__":
    sys.exit(main())

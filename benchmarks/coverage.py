"""Coverage benchmark: how many of the places an expert would optimize does `apply` optimize?

    python benchmarks/coverage.py [--json benchmarks/results/coverage-cpu.json] [-j N]
                                  [--expected benchmarks/coverage_expected.toml]
                                  [--corpus scripts/ecosystem.toml] [--mirror DIR ...]
                                  [--cache DIR ...] [--only TEXT]

`benchmarks/coverage_expected.toml` lists, for every file pinned in `scripts/ecosystem.toml`, the
places where an expert would apply one of optcodemod's optimizations (rule code, line at the
pinned commit, an anchor from that line, why). It was written once, by reading the files.

Each pinned file is materialised into a temporary folder (scripts/ecosystem.py's `read_entry`)
and rewritten on its own exactly as the ecosystem check does it
(`apply --unsafe-fixes --output-format json -j 1 --why-not FILE`). Every expected place is then
matched to the tool's findings of the same rule on the same line (or an `also` line, or the
finding's span, with one line of tolerance; settings rules OPT301/OPT401/OPT410 match anywhere
in the file; for the per-model rules OPT302/OPT402/OPT407 a decline at the training step
explains the file's models that nothing matches line by line), each finding used once, the best
status first:

- applied: a fix was made there (or, for a place with `fixed_in = "path:line"`, in the module
  read for context where the code it names is built, as yolov5's `smart_optimizer`);
- reported: a report-only rule (safety `suggest`: OPT409, OPT410, OPT503, OPT602, OPT604)
  reported it, or a rule reported the site without a fix. A report-only rule's report is all
  that rule promises, so the table also gives "applied or reported by a report-only rule";
- declined: the rule examined the site and said why it left it alone (`--why-not`);
- silent miss: none of these.

"Explained" is applied + reported + declined. Fixes the tool made at places not in the list are
listed too: each must be reviewed, either added to the list (the list was incomplete) or
recorded under the file's `reviewed` entries with a verdict (`wrong`, `questionable` or
`harmless`).
Goals (issue 15): at least 80% applied, 100% explained, no wrong edit.

Writes the table to stdout and, with --json OUT, OUT and the same name with `.md` beside it
(per-rule and per-file tables, silent misses grouped by the cause noted on each place, declined
sites with their reasons, the machine, torch version, date and optcodemod commit).
Exit status: 0 when the run completes (whatever the figures), 2 when the list is malformed, an
anchor does not match its line, or no file could be read.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for scripts.ecosystem
from scripts import ecosystem  # noqa: E402  (corpus loading, reading and running are shared)

Entry, load_corpus, read_entry, run_apply = (
    ecosystem.Entry,
    ecosystem.load_corpus,
    ecosystem.read_entry,
    ecosystem.run_apply,
)
RepoFiles, local_imports, project_files = (
    ecosystem.RepoFiles,
    ecosystem.local_imports,
    ecosystem.project_files,
)
MAX_CONTEXT_FILES = ecosystem.MAX_CONTEXT_FILES
DEFAULT_COMMAND, DEFAULT_CORPUS = ecosystem.DEFAULT_COMMAND, ecosystem.DEFAULT_CORPUS

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

DEFAULT_EXPECTED = Path(__file__).with_name("coverage_expected.toml")
FILE_SCOPE_RULES = frozenset({"OPT301", "OPT401", "OPT410"})  # one setting per script
# Per trained model: a decline at the training step (the rule could not tell which model the
# step trains) explains the file's listed models that no finding matches line by line.
MODEL_RULES = frozenset({"OPT302", "OPT402", "OPT407"})
REPORT_ONLY_RULES = frozenset({"OPT409", "OPT410", "OPT503", "OPT602", "OPT604"})
TOLERANCE = 1  # lines: a finding reported on the first line of a multi-line call
OUTCOMES = ("applied", "reported", "declined", "silent")
_RANK = {"fixed": 0, "unsafe": 0, "reported": 1, "declined": 2}
VERDICTS = ("wrong", "questionable", "harmless")
# The figures of the other mode printed beside the main ones.
COMPARED = ("places", "applied", "applied_fraction", "explained_fraction", "silent")


# -- the list -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    repo: str
    path: str
    rule: str
    line: int
    anchor: str
    why: str
    also: Tuple[int, ...] = ()
    cause: Optional[str] = None  # why the tool misses it, noted after a run (silent misses)
    source: str = "reading"  # "reading" (written from the file) or "review" (of a tool edit)
    cell: Optional[int] = None  # in a notebook: the cell (1-based, as the tool reports it)
    # In a notebook, lines of other cells that identify the same place ((cell, line): a model
    # built in one cell and moved to the device in the next).
    also_cells: Tuple[Tuple[int, int], ...] = ()
    # "path:line" in a module of the repository read for context, where the rule fixes the
    # place (yolov5's optimizer, built by `smart_optimizer` in utils/torch_utils.py): a fix
    # of the rule there counts for the place (credit_fixes_elsewhere).
    fixed_in: Optional[str] = None

    @property
    def lines(self) -> Tuple[int, ...]:
        return (self.line, *self.also)

    def positions(self) -> Tuple[Tuple[Optional[int], int], ...]:
        """(cell, line) of every line that identifies the place."""
        return (*((self.cell, line) for line in self.lines), *self.also_cells)

    @property
    def where(self) -> str:
        return f"{self.repo}:{self.path}:{_position(self.cell, self.line)}"

    @property
    def key(self) -> str:
        return f"{self.where}:{self.rule}"


def _position(cell: Optional[int], line: int) -> str:
    """`12`, or `cell 3:12` in a notebook (lines count within the cell)."""
    return f"{line}" if cell is None else f"cell {cell}:{line}"


@dataclass(frozen=True)
class Reviewed:
    """A fix the tool made at a place not in the list, with the reviewer's verdict."""

    rule: str
    line: int
    verdict: str  # wrong | harmless
    why: str
    cell: Optional[int] = None


@dataclass
class FileExpectation:
    repo: str
    path: str
    places: List[Place] = field(default_factory=list)
    none: Optional[str] = None  # why the file has no place
    reviewed: List[Reviewed] = field(default_factory=list)


def parse_expected(document: dict) -> List[FileExpectation]:
    files = []
    for item in document.get("file", []):
        repo, path = item["repo"], item["path"]
        places = [
            Place(
                repo,
                path,
                p["rule"],
                int(p["line"]),
                p.get("anchor", ""),
                p.get("why", ""),
                tuple(int(x) for x in p.get("also", ()) if not isinstance(x, list)),
                p.get("cause"),
                p.get("source", "reading"),
                _optional_int(p.get("cell")),
                tuple((int(x[0]), int(x[1])) for x in p.get("also", ()) if isinstance(x, list)),
                p.get("fixed_in"),
            )
            for p in item.get("place", [])
        ]
        reviewed = [
            Reviewed(
                r["rule"],
                int(r["line"]),
                r["verdict"],
                r.get("why", ""),
                _optional_int(r.get("cell")),
            )
            for r in item.get("reviewed", [])
        ]
        files.append(FileExpectation(repo, path, places, item.get("none"), reviewed))
    return files


def _optional_int(value) -> Optional[int]:
    return None if value is None else int(value)


def load_expected(path: Path) -> List[FileExpectation]:
    with open(path, "rb") as handle:
        return parse_expected(tomllib.load(handle))


def known_rule_codes() -> List[str]:
    from optimizer_codemod.registry import all_rules, load_transforms

    load_transforms()
    return sorted(rule.code for rule in all_rules())


def check_expected(
    files: Sequence[FileExpectation], entries: Sequence[Entry], codes: Iterable[str]
) -> List[str]:
    """Problems with the list: unknown rules or files, duplicates, empty entries."""
    codes = set(codes)
    pinned = {(e.repo, e.path) for e in entries}
    problems, seen_files, seen_places = [], set(), set()
    for item in files:
        name = f"{item.repo}:{item.path}"
        if (item.repo, item.path) not in pinned:
            problems.append(f"{name}: not a file pinned in the corpus")
        if (item.repo, item.path) in seen_files:
            problems.append(f"{name}: listed twice")
        seen_files.add((item.repo, item.path))
        if not item.places and not item.none:
            problems.append(f"{name}: no place and no `none` reason")
        if item.places and item.none:
            problems.append(f"{name}: both places and `none`")
        for place in item.places:
            if place.rule not in codes:
                problems.append(f"{place.key}: unknown rule {place.rule}")
            if place.line < 1 or any(n < 1 for n in place.also):
                problems.append(f"{place.key}: line numbers start at 1")
            if not place.anchor.strip() or not place.why.strip():
                problems.append(f"{place.key}: needs an anchor and a why")
            if place.source not in ("reading", "review"):
                problems.append(f"{place.key}: source is `reading` or `review`")
            if place.path.endswith(".ipynb") != (place.cell is not None):
                problems.append(f"{place.key}: a place in a notebook, and only there, has a cell")
            if place.fixed_in is not None and _fixed_in(place) is None:
                problems.append(f"{place.key}: fixed_in is `path:line` of another file")
            if place.key in seen_places:
                problems.append(f"{place.key}: listed twice")
            seen_places.add(place.key)
        for review in item.reviewed:
            if review.verdict not in VERDICTS:
                problems.append(f"{name}:{review.line}: verdict must be one of {VERDICTS}")
            if review.rule not in codes:
                problems.append(f"{name}:{review.line}: unknown rule {review.rule}")
    for repo, path in sorted(pinned - seen_files):
        problems.append(f"{repo}:{path}: pinned but not in the list (say `none` and why)")
    return problems


def _fixed_in(place: Place) -> Optional[Tuple[str, int]]:
    path, _, line = (place.fixed_in or "").rpartition(":")
    if not path or path == place.path or not line.isdigit() or int(line) < 1:
        return None
    return path, int(line)


def credit_fixes_elsewhere(
    matches: Sequence["FileMatch"], context_fixes: Sequence["ContextFix"]
) -> int:
    """A place not applied in its own file whose `fixed_in` names a module read for context
    counts as applied when the tool fixed that rule there (one line of tolerance): the fix in
    the helper is the fix of every call that builds through it. Returns how many."""
    credited = 0
    for match in matches:
        for result in match.results:
            where = _fixed_in(result.place)
            if where is None or result.outcome == "applied":
                continue
            path, line = where
            fix = next(
                (
                    c.finding
                    for c in context_fixes
                    if c.repo == match.repo
                    and c.path == path
                    and c.finding.code == result.place.rule
                    and c.finding.line - TOLERANCE <= line <= c.finding.end_line + TOLERANCE
                ),
                None,
            )
            if fix is not None:
                result.outcome, result.finding = "applied", fix
                credited += 1
    return credited


def check_anchors(places: Sequence[Place], source: str, path: str = "") -> List[str]:
    """Places whose anchor is not on their line of `source` (the file at the pinned commit;
    in a notebook, the line of the place's cell)."""
    lines = _lines_by_cell(source, path)
    problems = []
    for place in places:
        cell = lines.get(place.cell, [])
        text = cell[place.line - 1] if place.line <= len(cell) else ""
        if place.anchor.strip() not in text:
            problems.append(
                f"{place.key}: anchor {place.anchor!r} is not on "
                f"{_position(place.cell, place.line)}"
            )
    return problems


def _lines_by_cell(source: str, path: str) -> Dict[Optional[int], List[str]]:
    """The lines of a file under None, or of each cell of a notebook under its number."""
    if not path.endswith(".ipynb"):
        return {None: source.splitlines()}
    try:
        cells = json.loads(source).get("cells", [])
    except (ValueError, AttributeError):
        return {}
    found: Dict[Optional[int], List[str]] = {}
    for number, cell in enumerate(cells, 1):
        text = cell.get("source", "") if isinstance(cell, dict) else ""
        found[number] = ("".join(text) if isinstance(text, list) else text).splitlines()
    return found


# -- matching -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    code: str
    status: str  # fixed | unsafe | reported | declined
    line: int
    end_line: int
    message: str = ""
    cell: Optional[int] = None

    @property
    def position(self) -> str:
        return _position(self.cell, self.line)


def findings_from_report(report: dict) -> List[Finding]:
    return [
        Finding(
            f["code"],
            f["status"],
            f["location"]["row"],
            f["end_location"]["row"],
            f.get("message") or "",
            f.get("cell"),
        )
        for f in report.get("findings", [])
    ]


@dataclass
class PlaceResult:
    place: Place
    outcome: str  # applied | reported | declined | silent
    finding: Optional[Finding] = None


@dataclass
class FileMatch:
    repo: str
    path: str
    results: List[PlaceResult]
    unlisted: List[Finding]  # fixes at no listed place and not reviewed
    reviewed: List[Tuple[Finding, Reviewed]]  # fixes at no listed place, with a verdict


def _distance(place: Place, finding: Finding) -> Optional[int]:
    """How far the finding lies from the place (0: on a listed line), None when too far."""
    if place.rule in FILE_SCOPE_RULES:
        return 0
    best = None
    for cell, line in place.positions():
        if cell != finding.cell:
            continue
        if finding.line <= line <= finding.end_line:
            gap = 0
        else:
            gap = min(abs(line - finding.line), abs(line - finding.end_line))
        if gap <= TOLERANCE and (best is None or gap < best):
            best = gap
    return best


def _outcome(finding: Finding) -> str:
    if finding.status in ("fixed", "unsafe"):
        return "applied" if finding.status == "fixed" else "reported"
    return "reported" if finding.status == "reported" else "declined"


def match_file(
    places: Sequence[Place],
    findings: Sequence[Finding],
    reviewed: Sequence[Reviewed] = (),
    repo: str = "",
    path: str = "",
) -> FileMatch:
    """Pair each place with at most one finding of its rule, each finding with one place.

    Pairs on a listed line come before pairs one line away; among those, a fix before a
    report before a decline. A further fix of the same rule on a listed line belongs to that
    place (two copies in one statement); other fixes left over are edits at places not in the
    list, matched to the file's reviewed verdicts.
    """
    pairs = []
    for i, place in enumerate(places):
        for j, finding in enumerate(findings):
            if finding.code != place.rule:
                continue
            gap = _distance(place, finding)
            if gap is not None:
                pairs.append((gap, _RANK.get(finding.status, 3), place.line, i, j))
    used_places, used_findings = {}, set()
    for _gap, _rank, _line, i, j in sorted(pairs):
        if i in used_places or j in used_findings:
            continue
        used_places[i] = j
        used_findings.add(j)
    results = []
    for i, place in enumerate(places):
        if i in used_places:
            finding = findings[used_places[i]]
            results.append(PlaceResult(place, _outcome(finding), finding))
            continue
        step = next(
            (
                f
                for f in findings
                if place.rule in MODEL_RULES and f.code == place.rule and f.status == "declined"
            ),
            None,
        )
        results.append(
            PlaceResult(place, "declined", step) if step else PlaceResult(place, "silent")
        )
    unlisted, verdicts = [], []
    for j, finding in enumerate(findings):
        if j in used_findings or finding.status != "fixed":
            continue
        if any(
            place.rule == finding.code and _distance(place, finding) == 0
            for place in places
            if place.rule not in FILE_SCOPE_RULES
        ):
            continue  # a second fix in the statement of a listed place (`x.to(d), y.to(d)`)
        review = next(
            (
                r
                for r in reviewed
                if r.rule == finding.code
                and r.cell == finding.cell
                and finding.line - TOLERANCE <= r.line <= finding.line + TOLERANCE
            ),
            None,
        )
        if review is None:
            unlisted.append(finding)
        else:
            verdicts.append((finding, review))
    return FileMatch(repo, path, results, unlisted, verdicts)


# -- summary ------------------------------------------------------------------------------------


def _fraction(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def summarise(matches: Sequence[FileMatch]) -> dict:
    results = [r for m in matches for r in m.results]
    counts = Counter(r.outcome for r in results)
    total = len(results)
    report_only = sum(
        1 for r in results if r.outcome == "reported" and r.place.rule in REPORT_ONLY_RULES
    )
    per_rule: Dict[str, Counter] = defaultdict(Counter)
    for r in results:
        per_rule[r.place.rule][r.outcome] += 1
    per_file = []
    for m in matches:
        c = Counter(r.outcome for r in m.results)
        per_file.append(
            {
                "file": f"{m.repo}:{m.path}",
                "places": len(m.results),
                **{o: c[o] for o in OUTCOMES},
                "unlisted_fixes": len(m.unlisted),
                "reviewed_fixes": len(m.reviewed),
            }
        )
    wrong = [
        f"{m.repo}:{m.path}:{f.position} {f.code}: {r.why}"
        for m in matches
        for f, r in m.reviewed
        if r.verdict == "wrong"
    ]
    explained = counts["applied"] + counts["reported"] + counts["declined"]
    return {
        "places": total,
        "files": len(matches),
        **{o: counts[o] for o in OUTCOMES},
        "applied_fraction": _fraction(counts["applied"], total),
        "applied_or_report_only_fraction": _fraction(counts["applied"] + report_only, total),
        "explained_fraction": _fraction(explained, total),
        "silent_fraction": _fraction(counts["silent"], total),
        "report_only_reported": report_only,
        "places_from_review": sum(1 for r in results if r.place.source == "review"),
        "unlisted_fixes": sum(len(m.unlisted) for m in matches),
        "reviewed_fixes": {
            v: sum(1 for m in matches for _f, r in m.reviewed if r.verdict == v) for v in VERDICTS
        },
        "wrong_edits": wrong,
        "per_rule": {
            code: {o: c[o] for o in OUTCOMES} | {"places": sum(c.values())}
            for code, c in sorted(per_rule.items())
        },
        "per_file": per_file,
        "goals": {
            "applied_at_least_80_percent": _fraction(counts["applied"], total) >= 0.8,
            "all_explained": counts["silent"] == 0,
            "no_wrong_edit": not wrong,
            "every_unlisted_fix_reviewed": not any(m.unlisted for m in matches),
        },
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def render_table(summary: dict) -> str:
    s = summary
    out = [
        f"mode: {_mode_words(s)}",
        f"places: {s['places']} in {s['files']} files",
        f"applied: {s['applied']} ({_pct(s['applied_fraction'])}); "
        f"with reports of report-only rules: {_pct(s['applied_or_report_only_fraction'])}",
        f"reported: {s['reported']}; declined with a reason: {s['declined']}",
        f"explained (applied + reported + declined): {_pct(s['explained_fraction'])}",
        f"silent misses: {s['silent']} ({_pct(s['silent_fraction'])})",
        f"fixes at places not in the list: {s['unlisted_fixes']} unreviewed, "
        + ", ".join(f"{n} {v}" for v, n in s["reviewed_fixes"].items()),
        f"wrong edits: {len(s['wrong_edits'])}",
        *(
            [
                f"fixes in modules read for context: {s['context_fixes']} (not scored, but "
                f"{s.get('applied_in_context_modules', 0)} listed places that name where their "
                "code is built, `fixed_in`, count as applied by a fix there)"
            ]
            if s.get("mode") == "project"
            else []
        ),
        *_comparisons(s),
        "",
        f"{'rule':8s} {'places':>6s} {'applied':>7s} {'reported':>8s} {'declined':>8s} "
        f"{'silent':>6s}",
    ]
    for code, c in s["per_rule"].items():
        out.append(
            f"{code:8s} {c['places']:6d} {c['applied']:7d} {c['reported']:8d} "
            f"{c['declined']:8d} {c['silent']:6d}"
        )
    return "\n".join(out) + "\n"


def _mode_words(summary: dict) -> str:
    if summary.get("mode") == "per-file":
        return "each pinned file rewritten on its own (`--per-file`)"
    return (
        "one run per repository over its pinned files and the local modules they import, "
        "in their layout (as `apply repo/`)"
    )


def _comparisons(summary: dict) -> List[str]:
    lines = []
    for key, words in (
        ("per_file_mode", "each file on its own (--per-file, no other file beside it)"),
        (
            "alone_in_layout_mode",
            "each file given alone in its repository's layout (as pre-commit passes a changed "
            "file; it reads the modules it imports)",
        ),
    ):
        other = summary.get(key)
        if other:
            lines.append(
                f"{words} for comparison: applied {other['applied']} "
                f"({_pct(other['applied_fraction'])}), explained "
                f"{_pct(other['explained_fraction'])}, silent {other['silent']}"
            )
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(
    summary: dict,
    matches: Sequence[FileMatch],
    header: dict,
    context_fixes: Sequence["ContextFix"] = (),
    read: Optional[Dict[str, dict]] = None,
) -> str:
    s = summary
    md = [
        "# Coverage benchmark: places an expert would optimize, and what `apply` does there",
        "",
        f"- Date: {header['date']}. Machine: {header['machine']}; Python {header['python']}, "
        f"torch {header['torch']}.",
        f"- optcodemod commit `{header['optcodemod_commit']}` ({header['optcodemod_version']})"
        + (
            f", with uncommitted changes to {', '.join(header['uncommitted_tool_files'])}"
            if header["uncommitted_tool_files"]
            else ", a clean working tree"
        )
        + ".",
        f"- Command: `{header['command']}`; {_mode_words(s)}, with "
        "`apply --unsafe-fixes --output-format json -j 1 --why-not PATH`.",
        *[f"- {line}." for line in _comparisons(s)],
        "- The list: `benchmarks/coverage_expected.toml`, written by reading the files pinned in "
        "`scripts/ecosystem.toml` (conventions in its header); a place matches a finding of its "
        f"rule on a listed line or within {TOLERANCE} line (OPT301, OPT401, OPT410: anywhere in "
        "the file).",
        "",
        "## Totals",
        "",
        "| what | count | fraction |",
        "|---|---|---|",
        f"| places | {s['places']} in {s['files']} files | |",
        f"| applied (fixed) | {s['applied']} | {_pct(s['applied_fraction'])} |",
        f"| of which fixed where their code is built, in a module read for context "
        f"(`fixed_in`) | {s.get('applied_in_context_modules', 0)} | |",
        f"| applied, or reported by a report-only rule | {s['applied'] + s['report_only_reported']}"
        f" | {_pct(s['applied_or_report_only_fraction'])} |",
        f"| reported without a fix | {s['reported']} | |",
        f"| declined with a reason | {s['declined']} | |",
        f"| **explained** (applied + reported + declined) | "
        f"{s['places'] - s['silent']} | **{_pct(s['explained_fraction'])}** |",
        f"| **silent misses** | {s['silent']} | {_pct(s['silent_fraction'])} |",
        f"| fixes at places not in the list, unreviewed | {s['unlisted_fixes']} | |",
        f"| fixes at places not in the list, reviewed harmless | "
        f"{s['reviewed_fixes']['harmless']} | |",
        f"| fixes at places not in the list, reviewed questionable | "
        f"{s['reviewed_fixes']['questionable']} | |",
        f"| **wrong edits** | {len(s['wrong_edits'])} | |",
        "",
        "Goals (issue 15): at least 80% applied "
        f"({'met' if s['goals']['applied_at_least_80_percent'] else 'not met'}), 100% explained "
        f"({'met' if s['goals']['all_explained'] else 'not met'}), no wrong edit "
        f"({'met' if s['goals']['no_wrong_edit'] else 'not met'}).",
        "",
        "## Per rule",
        "",
        "| rule | places | applied | reported | declined | silent |",
        "|---|---|---|---|---|---|",
    ]
    for code, c in s["per_rule"].items():
        md.append(
            f"| {code} | {c['places']} | {c['applied']} | {c['reported']} | {c['declined']} "
            f"| {c['silent']} |"
        )
    md += [
        "",
        "## Per file",
        "",
        "| file | places | applied | reported | declined | silent | unlisted fixes |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in s["per_file"]:
        md.append(
            f"| {row['file']} | {row['places']} | {row['applied']} | {row['reported']} "
            f"| {row['declined']} | {row['silent']} | {row['unlisted_fixes']} |"
        )
    by_cause: Dict[str, List[PlaceResult]] = defaultdict(list)
    for m in matches:
        for r in m.results:
            if r.outcome == "silent":
                by_cause[r.place.cause or "not yet analysed"].append(r)
    md += ["", "## Silent misses, grouped by cause", ""]
    if not by_cause:
        md.append("None.")
    for cause, results in sorted(by_cause.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        md.append(f"### {cause} ({len(results)})")
        md.append("")
        for r in results:
            p = r.place
            md.append(f"- {p.rule} {p.where}: {_cell(p.why)}")
        md.append("")
    declined: Dict[str, List[PlaceResult]] = defaultdict(list)
    for m in matches:
        for r in m.results:
            if r.outcome in ("declined", "reported"):
                declined[r.place.rule].append(r)
    md += ["## Places declined or reported without a fix, with the tool's words", ""]
    for code in sorted(declined):
        md.append(f"### {code}")
        md.append("")
        for r in declined[code]:
            p = r.place
            md.append(
                f"- {r.outcome} {p.where}: {_cell(r.finding.message)}"
                if r.finding
                else f"- {p.where}"
            )
        md.append("")
    md += ["## Fixes at places not in the list", ""]
    rows = [
        f"- **unreviewed** {f.code} {m.repo}:{m.path}:{f.position}: {_cell(f.message)}"
        for m in matches
        for f in m.unlisted
    ] + [
        f"- **{r.verdict}** {f.code} {m.repo}:{m.path}:{f.position}: {_cell(r.why)}"
        for m in matches
        for f, r in m.reviewed
    ]
    md += rows or ["None."]
    if read is not None:
        md += [
            "",
            "## Fixes in the modules read for context",
            "",
            "Local modules the pinned files import, rewritten in the same run; no place is "
            "listed there, so these fixes are shown for review, not counted, but for those "
            "a listed place names with `fixed_in` (where the code it points at is built), "
            "which count for that place.",
            "",
        ]
        md += [
            f"- {c.finding.code} {c.repo}:{c.path}:{c.finding.position}: "
            f"{_cell(c.finding.message)}"
            for c in context_fixes
        ] or ["None."]
        md += ["", "Modules read for context, per repository:", ""]
        md += [
            f"- {repo}: {len(info['context_files'])}"
            + (f" (cut at {MAX_CONTEXT_FILES})" if info["truncated"] else "")
            + (f": {', '.join(info['context_files'])}" if info["context_files"] else "")
            for repo, info in sorted(read.items())
        ]
    return "\n".join(md) + "\n"


# -- a repository as its user has it -------------------------------------------------------------


def materialise(root: Path, files: Dict[str, bytes]) -> Path:
    """Write `files` (path inside the repository -> bytes) under `root`, in their layout,
    with an empty `.git` folder: a checkout's root, which the tool looks up an installed
    project's packages from (`scripts/x.py` importing `pkg.module`), as in a user's clone."""
    (root / ".git").mkdir(parents=True, exist_ok=True)
    for path, source in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source)
    return root


def by_repo(expected: Sequence[FileExpectation]) -> Dict[str, List[FileExpectation]]:
    repos: Dict[str, List[FileExpectation]] = defaultdict(list)
    for item in expected:
        repos[item.repo].append(item)
    return repos


def apply_project(
    key: str,
    pinned: Dict[str, bytes],
    context: Dict[str, bytes],
    workdir: Path,
    command: Sequence[str],
) -> Tuple[Dict[str, List[Finding]], Optional[str]]:
    """Materialise the files in their layout and rewrite them in one run, as `apply repo/`:
    the findings by path inside the repository, or an error."""
    root = materialise(workdir / key, {**context, **pinned})
    run = run_apply(command, root, "--why-not", cwd=workdir)
    if run.returncode not in (0, 1):
        return {}, (run.stderr or run.stdout)[-2000:]
    found: Dict[str, List[Finding]] = defaultdict(list)
    report = run.report()
    for record, finding in zip(report.get("findings", []), findings_from_report(report)):
        path = Path(record["filename"]).resolve().relative_to(root.resolve()).as_posix()
        found[path].append(finding)
    return dict(found), None


# -- running ------------------------------------------------------------------------------------


def isolated_path(workdir: Path, entry: Entry) -> Path:
    """Where apply_findings writes `entry`: in a folder of its own, in its layout, outside
    the materialised checkouts (whose root the tool would search for imports)."""
    return workdir / "alone" / entry.key / entry.path.replace("/", "__") / entry.path


def apply_findings(
    entry: Entry, source: bytes, workdir: Path, command: Sequence[str]
) -> Tuple[List[Finding], Optional[str]]:
    """Rewrite one materialised file as the ecosystem check does, in a folder of its own (no
    other file of the repository beside it): its findings, or an error."""
    target = isolated_path(workdir, entry)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source)
    run = run_apply(command, target, "--why-not", cwd=workdir)
    if run.returncode not in (0, 1):
        return [], (run.stderr or run.stdout)[-2000:]
    return findings_from_report(run.report()), None


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle if "model name" in line]
        model = names[0] if names else model
    except OSError:
        pass
    return f"{os.cpu_count()}-core {model}"


def _torch_version() -> str:
    try:
        import torch  # only for the header: `apply` itself never imports torch

        return torch.__version__
    except ImportError:
        return "not installed"


@dataclass
class ContextFix:
    """A fix the tool made in a local module read only as context (not pinned, not scored)."""

    repo: str
    path: str
    finding: Finding


Outcome = Tuple[List[Finding], Optional[str]]


def run_per_file(
    expected: Sequence[FileExpectation],
    by_key: Dict[Tuple[str, str], Entry],
    sources: Dict[Tuple[str, str], bytes],
    workdir: Path,
    jobs: int,
) -> List[Outcome]:
    """Each pinned file rewritten on its own (the ecosystem check's way)."""

    def run(item: FileExpectation) -> Outcome:
        entry = by_key[(item.repo, item.path)]
        return apply_findings(entry, sources[(item.repo, item.path)], workdir, DEFAULT_COMMAND)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(run, expected))


def run_projects(
    expected: Sequence[FileExpectation],
    by_key: Dict[Tuple[str, str], Entry],
    sources: Dict[Tuple[str, str], bytes],
    mirrors: Sequence[Path],
    caches: Sequence[Path],
    workdir: Path,
    jobs: int,
) -> Tuple[List[Outcome], List[ContextFix], Dict[str, dict]]:
    """One `apply` per repository over its pinned files and the local modules they import,
    in their layout: the pinned files' outcomes, the fixes made in the modules read for
    context, and per repository which modules were read."""
    repos = by_repo(expected)

    def run(repo: str):
        items = repos[repo]
        entry = by_key[(repo, items[0].path)]
        pinned = {i.path: sources[(repo, i.path)] for i in items}
        context, truncated = project_files(RepoFiles(entry, mirrors, caches), pinned)
        findings, error = apply_project(entry.key, pinned, context, workdir, DEFAULT_COMMAND)
        return findings, error, context, truncated

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = dict(zip(repos, pool.map(run, list(repos))))
    outcomes: List[Outcome] = []
    for item in expected:
        findings, error, _context, _truncated = runs[item.repo]
        outcomes.append((findings.get(item.path, []), error))
    context_fixes = [
        ContextFix(repo, path, finding)
        for repo, (findings, _error, context, _truncated) in runs.items()
        for path in sorted(context)
        for finding in findings.get(path, [])
        if finding.status == "fixed"
    ]
    read = {
        repo: {"context_files": sorted(context), "truncated": truncated}
        for repo, (_findings, _error, context, truncated) in runs.items()
    }
    return outcomes, context_fixes, read


def run_alone_in_layout(
    expected: Sequence[FileExpectation],
    by_key: Dict[Tuple[str, str], Entry],
    sources: Dict[Tuple[str, str], bytes],
    mirrors: Sequence[Path],
    caches: Sequence[Path],
    workdir: Path,
    jobs: int,
) -> List[Outcome]:
    """Each pinned file given alone to `apply`, as pre-commit passes a changed file, with the
    repository's pinned files and the local modules they import around it on disk."""
    roots: Dict[str, Path] = {}
    for repo, items in by_repo(expected).items():
        entry = by_key[(repo, items[0].path)]
        pinned = {i.path: sources[(repo, i.path)] for i in items}
        context, _truncated = project_files(RepoFiles(entry, mirrors, caches), pinned)
        roots[repo] = materialise(workdir / entry.key, {**context, **pinned})

    def run(item: FileExpectation) -> Outcome:
        report = run_apply(DEFAULT_COMMAND, roots[item.repo] / item.path, "--why-not", cwd=workdir)
        if report.returncode not in (0, 1):
            return [], (report.stderr or report.stdout)[-2000:]
        return findings_from_report(report.report()), None

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(run, expected))


def _matches(
    expected: Sequence[FileExpectation], outcomes: Sequence[Outcome]
) -> Tuple[List[FileMatch], List[str]]:
    matches, errors = [], []
    for item, (findings, error) in zip(expected, outcomes):
        if error:
            errors.append(f"{item.repo}:{item.path}: {error}")
        matches.append(match_file(item.places, findings, item.reviewed, item.repo, item.path))
    return matches, errors


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--expected", type=Path, default=DEFAULT_EXPECTED)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--mirror", type=Path, action="append")
    parser.add_argument("--cache", type=Path, action="append", default=[])
    parser.add_argument("--json", type=Path, help="write the results here (and .md beside it)")
    parser.add_argument("--only", help="only files whose repo:path contains this")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="runs at once")
    parser.add_argument(
        "--per-file",
        action="store_true",
        help="rewrite each pinned file on its own (no project index), as the ecosystem check",
    )
    parser.add_argument(
        "--no-compare",
        action="store_true",
        help="in project mode, skip the per-file run whose figures are printed beside",
    )
    args = parser.parse_args(argv)
    mirrors = args.mirror if args.mirror is not None else list(ecosystem.DEFAULT_MIRRORS)

    entries = load_corpus(args.corpus)
    expected = load_expected(args.expected)
    problems = check_expected(expected, entries, known_rule_codes())
    if problems:
        print("the expected list is malformed:", *problems, sep="\n  ", file=sys.stderr)
        return 2
    by_key = {(e.repo, e.path): e for e in entries}
    if args.only:
        expected = [f for f in expected if args.only in f"{f.repo}:{f.path}"]
    commit, uncommitted = ecosystem._git_commit(), ecosystem._uncommitted_tool_files()
    workdir = Path(tempfile.mkdtemp(prefix="optcodemod-coverage-"))
    sources: Dict[Tuple[str, str], bytes] = {}
    context_fixes: List[ContextFix] = []
    read: Dict[str, dict] = {}
    compared: Optional[dict] = None
    compared_in_layout: Optional[dict] = None
    try:
        for item in expected:
            source, origin = read_entry(by_key[(item.repo, item.path)], mirrors, args.cache)
            if source is None:
                print(f"cannot read {item.repo}:{item.path}: {origin}", file=sys.stderr)
                return 2
            sources[(item.repo, item.path)] = source
            text = source.decode("utf-8", errors="replace")
            problems += check_anchors(item.places, text, item.path)
        if problems:
            print("anchors do not match:", *problems, sep="\n  ", file=sys.stderr)
            return 2
        if args.per_file:
            outcomes = run_per_file(expected, by_key, sources, workdir / "files", args.jobs)
        else:
            outcomes, context_fixes, read = run_projects(
                expected, by_key, sources, mirrors, args.cache, workdir / "projects", args.jobs
            )
            if not args.no_compare:
                alone = run_per_file(expected, by_key, sources, workdir / "files", args.jobs)
                compared = summarise(_matches(expected, alone)[0])
                lone = run_alone_in_layout(
                    expected, by_key, sources, mirrors, args.cache, workdir / "alone", args.jobs
                )
                compared_in_layout = summarise(_matches(expected, lone)[0])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    matches, errors = _matches(expected, outcomes)
    credited = credit_fixes_elsewhere(matches, context_fixes)
    summary = summarise(matches)
    summary["applied_in_context_modules"] = credited
    summary["tool_errors"] = errors
    summary["mode"] = "per-file" if args.per_file else "project"
    summary["context_fixes"] = len(context_fixes)
    if compared is not None:
        summary["per_file_mode"] = {k: compared[k] for k in COMPARED}
    if compared_in_layout is not None:
        summary["alone_in_layout_mode"] = {k: compared_in_layout[k] for k in COMPARED}
    sys.stdout.write(render_table(summary))
    for error in errors:
        print(f"tool error: {error}", file=sys.stderr)
    if args.json:
        header = {
            "date": datetime.date.today().isoformat(),
            "machine": _machine(),
            "python": platform.python_version(),
            "torch": _torch_version(),
            "optcodemod_commit": commit,
            "uncommitted_tool_files": uncommitted,
            "optcodemod_version": ecosystem._tool_version(DEFAULT_COMMAND),
            "command": "python benchmarks/coverage.py --json "
            + os.path.relpath(args.json, Path.cwd())
            + (" --per-file" if args.per_file else ""),
        }
        places = [
            {**asdict(r.place), "outcome": r.outcome, "finding": r.finding and asdict(r.finding)}
            for m in matches
            for r in m.results
        ]
        unlisted = [
            {"file": f"{m.repo}:{m.path}", **asdict(f)} for m in matches for f in m.unlisted
        ]
        document = {
            **header,
            "summary": summary,
            "places": places,
            "unlisted_fixes": unlisted,
            "context_files": read,
            "context_fixes": [asdict(c) for c in context_fixes],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=1) + "\n")
        args.json.with_suffix(".md").write_text(
            render_markdown(summary, matches, header, context_fixes, read)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Rendering outcomes: the text report, JSON, statistics. Formats register by name."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Set

import click

from optimizer_codemod import __version__
from optimizer_codemod.diagnostics import Diagnostic, FileOutcome, Status
from optimizer_codemod.edits import TextEdit


@dataclass(frozen=True)
class ReportContext:
    outcomes: Sequence[FileOutcome]
    writing: bool  # fixes were written (not --check/--diff)
    color: bool

    def wrote(self, outcome: FileOutcome) -> bool:
        """The fixes of `outcome` are in its file: a file whose write failed keeps them out."""
        return written_to(outcome, self.writing)


def written_to(outcome: FileOutcome, writing: bool) -> bool:
    """Whether `outcome`'s fixes reached its file in a run that writes (`writing`)."""
    return writing and outcome.error is None


FORMATS: Dict[str, Callable[[ReportContext], str]] = {}
# The formats that print each fix's edits (edits_of_fixes): they need the rewritten text.
FORMATS_WITH_EDITS: Set[str] = set()


def output_format(name: str, shows_edits: bool = False):
    def register(function: Callable[[ReportContext], str]):
        FORMATS[name] = function
        if shows_edits:
            FORMATS_WITH_EDITS.add(name)
        return function

    return register


def location(path: str, diagnostic: Diagnostic) -> str:
    cell = f":cell {diagnostic.cell}" if diagnostic.cell is not None else ""
    return f"{path}{cell}:{diagnostic.line}:{diagnostic.column}"


def _status_text(diagnostic: Diagnostic, writing: bool) -> str:
    if diagnostic.status is Status.FIXED:
        verb = "fixed" if writing else "fix"
        return f"{verb}: {diagnostic.fix_title}"
    if diagnostic.status is Status.UNSAFE:
        return f"with --unsafe-fixes: {diagnostic.fix_title}"
    if diagnostic.status is Status.DECLINED:
        return "declined"
    return "no automatic fix"


def _style(text: str, color: bool, **style) -> str:
    return click.style(text, **style) if color else text


@output_format("text")
def text_report(context: ReportContext) -> str:
    lines: List[str] = []
    for outcome in context.outcomes:
        for d in outcome.diagnostics:
            where = _style(location(outcome.path, d), context.color, bold=True)
            if d.status is Status.DECLINED:
                code = _style(d.code, context.color, dim=True)
                lines.append(f"{where}: {code} not applied: {d.message}")
                continue
            code = _style(
                d.code, context.color, fg="red" if d.status is Status.REPORTED else "cyan"
            )
            lines.append(
                f"{where}: {code} [{d.safety.label}] {d.message} "
                f"({_status_text(d, context.wrote(outcome))})"
            )
    lines.extend(summary_lines(context))
    return "\n".join(lines) + ("\n" if lines else "")


def summary_lines(context: ReportContext) -> List[str]:
    everything = [d for o in context.outcomes for d in o.diagnostics]
    diagnostics = [d for d in everything if d.status is not Status.DECLINED]
    counts = Counter(d.status for d in everything)
    changed = [o for o in context.outcomes if o.changed and not o.error]
    # Fixes of a file that could not be written were never made.
    unwritten = sum(
        len(o.fixed) for o in context.outcomes if context.writing and not context.wrote(o)
    )
    counts[Status.FIXED] -= unwritten
    lines = []
    if not diagnostics:
        lines.append("Nothing to change.")
    else:
        fixed = counts[Status.FIXED]
        files = len(changed)
        file_word = "file" if files == 1 else "files"
        if not fixed:
            head = "No fixes made" if unwritten else "No fixes to apply"
        elif context.writing:
            head = f"Fixed {fixed} finding{'s' if fixed != 1 else ''} in {files} {file_word}"
        else:
            head = f"Would fix {fixed} finding{'s' if fixed != 1 else ''} in {files} {file_word}"
        if counts[Status.REPORTED]:
            head += f"; {counts[Status.REPORTED]} reported without a fix"
        lines.append(head + ".")
    if unwritten:
        lines.append(
            f"{unwritten} fix{'es' if unwritten != 1 else ''} not made: "
            "their files could not be written (see the errors)."
        )
    if counts[Status.UNSAFE]:
        unsafe = counts[Status.UNSAFE]
        lines.append(
            f"{unsafe} more fix{'es' if unsafe != 1 else ''} available with --unsafe-fixes "
            "(behaviour-level: read each before enabling)."
        )
    if counts[Status.DECLINED]:
        declined = counts[Status.DECLINED]
        lines.append(
            f"{declined} site{'s' if declined != 1 else ''} examined and left alone, "
            "each with its reason (--why-not)."
        )
    errors = [o for o in context.outcomes if o.error]
    if errors:
        lines.append(f"{len(errors)} file{'s' if len(errors) != 1 else ''} could not be processed.")
    return lines


def status_label(diagnostic: Diagnostic, writing: bool) -> str:
    """The status machine-readable formats show: `fixable` where nothing was written."""
    if diagnostic.status is Status.FIXED and not writing:
        return "fixable"
    return diagnostic.status.value


def edits_of_fixes(outcome: FileOutcome) -> Dict[int, List[TextEdit]]:
    """For each fixed diagnostic of `outcome` (by index), the edits its fix made.

    The edits come from a line diff of the whole file, so an insertion may land a blank line
    away from its anchor: each edit goes to the fixed finding(s) whose fix edits lines nearest
    to it, and a fixed finding that is nearest to no edit (its insertion shares a hunk with a
    closer one) gets the edits nearest to it: every finding shown as fixed carries its edits.
    Findings whose fixes were not applied (unsafe, reported, declined) own none.
    """
    fixed = [
        (i, d.edit_lines)
        for i, d in enumerate(outcome.diagnostics)
        if d.status is Status.FIXED and d.edit_lines
    ]
    owned: Dict[int, List[TextEdit]] = {}
    if not fixed or not outcome.edits:
        return owned
    gaps = [
        [min(edit.distance(first, last) for first, last in lines) for edit in outcome.edits]
        for _, lines in fixed
    ]
    for number, edit in enumerate(outcome.edits):
        nearest = min(row[number] for row in gaps)
        for (index, _), row in zip(fixed, gaps):
            if row[number] == nearest:
                owned.setdefault(index, []).append(edit)
    for (index, _), row in zip(fixed, gaps):
        if index not in owned:
            nearest = min(row)
            owned[index] = [e for e, gap in zip(outcome.edits, row) if gap == nearest]
    return owned


def diagnostic_record(
    path: str, d: Diagnostic, writing: bool = True, edits: Sequence[TextEdit] = ()
) -> dict:
    """One finding of the JSON report; `edits`: what its fix changed (edits_of_fixes)."""
    return {
        "filename": path,
        "cell": d.cell,
        "code": d.code,
        "name": d.name,
        "message": d.message,
        "safety": d.safety.label,
        "status": status_label(d, writing),
        "fix_title": d.fix_title,
        "location": {"row": d.line, "column": d.column},
        "end_location": {"row": d.end_line, "column": d.end_column},
        "fix": _fix_record(d, edits),
    }


def _fix_record(d: Diagnostic, edits: Sequence[TextEdit]) -> Optional[dict]:
    """ruff's shape: each edit replaces the text from `location` up to `end_location` (rows
    and columns of the original file, 1-based, the end exclusive) by `content`."""
    if d.status is not Status.FIXED:
        return None
    return {
        "message": d.fix_title,
        "applicability": d.safety.label,
        "edits": [
            {
                "content": edit.new_text,
                "location": {"row": edit.first_line, "column": 1},
                "end_location": {"row": edit.last_line + 1, "column": 1},
            }
            for edit in edits
        ],
    }


def _github_escape(text: str, in_property: bool = False) -> str:
    # GitHub's workflow-command escaping: data escapes %, CR, LF; properties also : and ,.
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if in_property:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


@output_format("github")
def github_report(context: ReportContext) -> str:
    """GitHub Actions workflow commands: each finding becomes an annotation on its line."""
    lines = []
    for outcome in context.outcomes:
        for d in outcome.diagnostics:
            if d.status is Status.DECLINED:
                continue  # no annotation on code left alone
            where = f"file={_github_escape(outcome.path, True)}"
            # Notebook lines are cell-relative: annotate the line of the .ipynb JSON that holds
            # the source, when it is known, else the notebook file without a line.
            region = (d.line, d.column, d.end_line, d.end_column) if d.cell is None else None
            region = d.file_region or region
            if region is not None:
                line, column, end_line, end_column = region
                where += f",line={line},col={column},endLine={end_line},endColumn={end_column}"
            title = _github_escape(f"{d.code} ({d.name})", True)
            cell = f"cell {d.cell}: " if d.cell is not None else ""
            message = (
                f"{cell}{d.message} [{d.safety.label}] ({_status_text(d, context.wrote(outcome))})"
            )
            level = "notice" if d.status is Status.REPORTED else "warning"
            lines.append(f"::{level} {where},title={title}::{_github_escape(message)}")
        if outcome.error:
            lines.append(
                f"::error file={_github_escape(outcome.path, True)}::{_github_escape(outcome.error)}"
            )
    return "".join(line + "\n" for line in lines)


@output_format("sarif", shows_edits=True)
def sarif_report(context: ReportContext) -> str:
    from optimizer_codemod.sarif import sarif_document

    return json.dumps(sarif_document(context.outcomes, context.writing), indent=2) + "\n"


@output_format("json", shows_edits=True)
def json_report(context: ReportContext) -> str:
    findings = []
    for outcome in context.outcomes:
        owned = edits_of_fixes(outcome)
        findings.extend(
            diagnostic_record(outcome.path, d, context.wrote(outcome), owned.get(index, ()))
            for index, d in enumerate(outcome.diagnostics)
        )
    document = {
        "tool": {"name": "optcodemod", "version": __version__},
        "written": context.writing,
        "findings": findings,
        "changed_files": [o.path for o in context.outcomes if o.changed and not o.error],
        "errors": [{"filename": o.path, "message": o.error} for o in context.outcomes if o.error],
        "summary": dict(Counter(finding["status"] for finding in findings)),
    }
    return json.dumps(document, indent=2) + "\n"


def statistics(outcomes: Sequence[FileOutcome]) -> str:
    rows: Dict[str, Counter] = {}
    names: Dict[str, str] = {}
    for outcome in outcomes:
        for d in outcome.diagnostics:
            if d.status is Status.DECLINED:
                continue
            rows.setdefault(d.code, Counter())[d.status] += 1
            names[d.code] = d.name
    if not rows:
        return "No findings.\n"
    lines = [f"{'count':>5}  {'fixed':>5}  {'unsafe':>6}  {'other':>5}  code    name"]
    for code in sorted(rows, key=lambda c: (-sum(rows[c].values()), c)):
        counter = rows[code]
        lines.append(
            f"{sum(counter.values()):>5}  {counter[Status.FIXED]:>5}  {counter[Status.UNSAFE]:>6}  "
            f"{counter[Status.REPORTED]:>5}  {code}  {names[code]}"
        )
    return "\n".join(lines) + "\n"


def fixes_summary(context: ReportContext) -> str:
    """ruff's --show-fixes: the fixes made (or that would be made), per file and rule."""
    per_file = []
    total = 0
    for outcome in context.outcomes:
        counts = Counter((d.code, d.name) for d in outcome.fixed)
        if counts and not outcome.error:
            per_file.append((outcome.path, counts))
            total += sum(counts.values())
    if not total:
        return "No fixes " + ("made" if context.writing else "would be made") + ".\n"
    verb = "Fixed" if context.writing else "Would fix"
    lines = [f"{verb} {total} finding{'s' if total != 1 else ''}:"]
    for path, counts in per_file:
        lines.append(f"- {path}:")
        for (code, name), count in sorted(counts.items()):
            lines.append(f"    {count} × {code} ({name})")
    return "\n".join(lines) + "\n"

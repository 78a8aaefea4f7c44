"""SARIF 2.1.0: findings as code-scanning results, with rule metadata and the fixes themselves.

Schema: https://docs.oasis-open.org/sarif/sarif/v2.1.0/sarif-v2.1.0.html. Regions use 1-based
lines and columns counted in code points (Python's); fixes replace character ranges of the
original text (charOffset/charLength), which is unambiguous for insertions and for a file's last
line.

Notebooks: a region always means lines of the artifact itself, so a finding in a notebook gets
the region of its source text inside the .ipynb JSON (what a viewer of the raw file shows), a
logical location naming the cell, and the cell-relative region in `properties`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence
from urllib.parse import quote

from optimizer_codemod import __version__
from optimizer_codemod.diagnostics import Diagnostic, FileOutcome, Status
from optimizer_codemod.edits import TextEdit
from optimizer_codemod.registry import all_rules
from optimizer_codemod.report import edits_of_fixes, status_label, written_to

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://github.com/optcodemod/optcodemod"
# A finding with a fix is something to act on; one without a fix is advice.
LEVELS = {
    Status.FIXED: "warning",
    Status.UNSAFE: "warning",
    Status.REPORTED: "note",
    Status.DECLINED: "none",  # examined and left alone (--why-not): informational only
}


def _uri(path: str) -> str:
    # SARIF wants URIs (RFC 3986): relative paths stay relative (to the working directory, as
    # given), and every character a URI reserves is percent-encoded (a space, `#`, `%`, `:`).
    location = Path(path)
    if location.is_absolute():
        return location.as_uri()
    return quote(location.as_posix(), safe="/")


def _rule_descriptor(rule: type) -> dict:
    sections = rule.doc_sections()
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.message},
        "fullDescription": {"text": " ".join(sections.get("What it does", rule.message).split())},
        "help": {"text": " ".join(sections.get("Why is it slow", "").split()) or rule.message},
        "helpUri": f"{INFORMATION_URI}/blob/main/docs/rules/{rule.code}.md",
        "defaultConfiguration": {"level": "warning"},
        "properties": {
            "safety": rule.safety.label,
            "minTorch": str(rule.min_torch),
            "fixTitle": rule.fix_title,
        },
    }


def _fixes(path: str, diagnostic: Diagnostic, mine: Sequence[TextEdit]) -> List[dict]:
    if not mine:
        return []
    replacements = [
        {
            "deletedRegion": {"charOffset": edit.offset, "charLength": edit.length},
            "insertedContent": {"text": edit.new_text},
        }
        for edit in mine
    ]
    return [
        {
            "description": {"text": diagnostic.fix_title},
            "artifactChanges": [
                {"artifactLocation": {"uri": _uri(path)}, "replacements": replacements}
            ],
        }
    ]


def _region(line: int, column: int, end_line: int, end_column: int) -> dict:
    return {"startLine": line, "startColumn": column, "endLine": end_line, "endColumn": end_column}


def _location(path: str, diagnostic: Diagnostic) -> dict:
    own = _region(diagnostic.line, diagnostic.column, diagnostic.end_line, diagnostic.end_column)
    physical: dict = {"artifactLocation": {"uri": _uri(path)}}
    if diagnostic.cell is None:
        physical["region"] = own
        return {"physicalLocation": physical}
    if diagnostic.file_region is not None:
        physical["region"] = _region(*diagnostic.file_region)
    cell = f"cell {diagnostic.cell}"
    return {
        "physicalLocation": physical,
        "logicalLocations": [{"name": cell, "fullyQualifiedName": f"{path}:{cell}"}],
        "message": {"text": f"{cell}, line {diagnostic.line}, column {diagnostic.column}"},
        "properties": {"cell": diagnostic.cell, "cellRegion": own},
    }


def _result(
    path: str, diagnostic: Diagnostic, mine, rule_index: Dict[str, int], writing: bool
) -> dict:
    result = {
        "ruleId": diagnostic.code,
        "ruleIndex": rule_index[diagnostic.code],
        "level": LEVELS[diagnostic.status],
        "message": {"text": diagnostic.message},
        "locations": [_location(path, diagnostic)],
        "properties": {
            "safety": diagnostic.safety.label,
            "status": status_label(diagnostic, writing),
        },
    }
    if diagnostic.cell is not None:
        result["properties"]["cell"] = diagnostic.cell
    fixes = _fixes(path, diagnostic, mine)
    if fixes:
        result["fixes"] = fixes
    return result


def sarif_document(outcomes: Sequence[FileOutcome], writing: bool = False) -> dict:
    """The SARIF log of one run; `writing`: the fixes were written (not --check/--diff)."""
    rules = sorted(all_rules(), key=lambda rule: rule.code)
    rule_index = {rule.code: index for index, rule in enumerate(rules)}
    results = []
    for outcome in outcomes:
        owned = edits_of_fixes(outcome)
        for index, diagnostic in enumerate(outcome.diagnostics):
            mine = owned.get(index, [])
            wrote = written_to(outcome, writing)
            results.append(_result(outcome.path, diagnostic, mine, rule_index, wrote))
    notifications = [
        {
            "level": "error",
            "message": {"text": outcome.error},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(outcome.path)}}}],
        }
        for outcome in outcomes
        if outcome.error
    ]
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "optcodemod",
                        "version": __version__,
                        "informationUri": INFORMATION_URI,
                        "rules": [_rule_descriptor(rule) for rule in rules],
                    }
                },
                "columnKind": "unicodeCodePoints",
                "invocations": [
                    {
                        "executionSuccessful": not notifications,
                        "toolExecutionNotifications": notifications,
                    }
                ],
                "results": results,
            }
        ],
    }

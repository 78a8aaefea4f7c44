"""Machine-readable reports, checked as parsed documents: GitHub annotations, SARIF, JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List
from urllib.parse import unquote

import pytest

from conftest import TRAINING_SCRIPT, run_cli

# A syntax error in a file the pre-filter lets through (it mentions an optimizer).
BROKEN = "import torch\nopt = torch.optim.AdamW(\n"
GITHUB_LINE = re.compile(r"^::(?P<level>warning|notice|error) (?P<props>[^:]*)::(?P<message>.*)$")


def _github_annotations(output: str) -> List[Dict[str, str]]:
    annotations = []
    for line in output.splitlines():
        match = GITHUB_LINE.match(line)
        assert match, f"not a workflow command: {line!r}"
        fields = dict(item.split("=", 1) for item in match.group("props").split(","))
        fields.update(level=match.group("level"), message=match.group("message"))
        annotations.append(fields)
    return annotations


def test_github_annotations_name_file_line_and_rule(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(TRAINING_SCRIPT)
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN)
    result = run_cli(
        [
            "apply",
            "--check",
            "--select",
            "OPT501",
            "--output-format",
            "github",
            "train.py",
            "broken.py",
        ],
        cwd=tmp_path,
    )
    assert result.exit_code == 2
    finding, error = _github_annotations(result.stdout)
    assert finding["level"] == "warning"
    assert finding["file"] == "train.py"
    assert (finding["line"], finding["col"]) == ("4", "13")
    assert finding["title"] == "OPT501 (optimizer-without-fused-kernel)"
    assert "[numerics]" in finding["message"] and "fused=True" in finding["message"]
    assert error["level"] == "error" and error["file"] == "broken.py"
    assert "cannot parse" in error["message"]


def test_github_escapes_separators_in_properties(tmp_path: Path) -> None:
    odd = tmp_path / "a,b:c.py"
    odd.write_bytes(TRAINING_SCRIPT)
    result = run_cli(
        ["apply", "--check", "--select", "OPT501", "--output-format", "github", odd.name],
        cwd=tmp_path,
    )
    [annotation] = _github_annotations(result.stdout)
    assert annotation["file"] == "a%2Cb%3Ac.py"


def _apply_replacements(text: str, replacements: List[dict]) -> str:
    for item in sorted(replacements, key=lambda r: -r["deletedRegion"]["charOffset"]):
        region = item["deletedRegion"]
        start, length = region["charOffset"], region["charLength"]
        text = text[:start] + item["insertedContent"]["text"] + text[start + length :]
    return text


def test_sarif_document_structure_and_fixes_that_reproduce_the_rewrite(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(TRAINING_SCRIPT)
    result = run_cli(["apply", "--check", "--output-format", "sarif", "train.py"], cwd=tmp_path)
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert document["version"] == "2.1.0" and "sarif" in document["$schema"]
    [run] = document["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "optcodemod"
    codes = [rule["id"] for rule in driver["rules"]]
    assert codes == sorted(codes) and "OPT501" in codes
    assert run["invocations"][0]["executionSuccessful"] is True
    assert run["results"]
    replacements = []
    for finding in run["results"]:
        rule = driver["rules"][finding["ruleIndex"]]
        assert rule["id"] == finding["ruleId"]
        assert rule["properties"]["safety"] in {"safe", "numerics", "behavior", "suggest"}
        [location] = finding["locations"]
        assert location["physicalLocation"]["artifactLocation"]["uri"] == "train.py"
        region = location["physicalLocation"]["region"]
        assert 1 <= region["startLine"] <= region["endLine"]
        if finding["properties"]["status"] == "fixable":
            [fix] = finding["fixes"]
            [change] = fix["artifactChanges"]
            replacements.extend(change["replacements"])
    unique = {json.dumps(r, sort_keys=True): r for r in replacements}.values()
    fixed = run_cli(["apply", "train.py"], cwd=tmp_path)
    assert fixed.exit_code == 1
    assert _apply_replacements(TRAINING_SCRIPT.decode(), list(unique)) == script.read_text()


def test_sarif_reports_unreadable_files_as_notifications(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN)
    result = run_cli(["apply", "--check", "--output-format", "sarif", str(broken)])
    [run] = json.loads(result.stdout)["runs"]
    invocation = run["invocations"][0]
    assert invocation["executionSuccessful"] is False
    [notification] = invocation["toolExecutionNotifications"]
    assert notification["level"] == "error" and "cannot parse" in notification["message"]["text"]
    uri = notification["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == broken.as_uri()


def test_json_carries_each_edit_with_its_safety_level(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(TRAINING_SCRIPT.replace(b"zero_grad()", b"zero_grad(set_to_none=False)"))
    result = run_cli(["apply", "--check", "--output-format", "json", "train.py"], cwd=tmp_path)
    document = json.loads(result.stdout)
    by_code = {finding["code"]: finding for finding in document["findings"]}
    assert by_code["OPT501"]["safety"] == "numerics" and by_code["OPT501"]["status"] == "fixable"
    assert by_code["OPT502"]["safety"] == "behavior" and by_code["OPT502"]["status"] == "unsafe"
    assert document["changed_files"] == ["train.py"]


# --- SARIF against the 2.1.0 schema; notebooks; URIs; missing paths ---------------------------

SCHEMA = Path(__file__).resolve().parent / "data" / "sarif-schema-2.1.0.json"
NOTEBOOK_CELLS = [
    ("markdown", ["# Training\n"]),
    ("code", ["%matplotlib inline\n", "import torch\n", "model = torch.nn.Linear(4, 2)\n"]),
    (
        "code",
        [
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n",
            "for step in range(3):\n",
            "    loss = model(torch.randn(8, 4)).sum()\n",
            "    optimizer.zero_grad()\n",
            "    loss.backward()\n",
            "    optimizer.step()",
        ],
    ),
]


def _notebook(path: Path, indent) -> str:
    cells = [
        {"cell_type": kind, "metadata": {}, "source": source}
        | ({"execution_count": None, "outputs": []} if kind == "code" else {})
        for kind, source in NOTEBOOK_CELLS
    ]
    document = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    text = json.dumps(document, indent=indent) + "\n"
    path.write_text(text)
    return text


def _valid_sarif(text: str) -> dict:
    from jsonschema import Draft4Validator, FormatChecker

    document = json.loads(text)
    validator = Draft4Validator(json.loads(SCHEMA.read_text()), format_checker=FormatChecker())
    problems = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]
    assert not problems, problems
    return document


def test_the_vendored_schema_rejects_what_sarif_forbids() -> None:
    from jsonschema import Draft4Validator

    validator = Draft4Validator(json.loads(SCHEMA.read_text()))
    good = {"version": "2.1.0", "runs": []}
    assert validator.is_valid(good)
    assert not validator.is_valid({**good, "version": "2.0.0"})
    run = {"tool": {"driver": {"name": "x"}}, "results": [{"message": {"text": "m"}}]}
    assert validator.is_valid({**good, "runs": [run]})
    region = {"startLine": 0}  # lines are 1-based
    location = {"physicalLocation": {"artifactLocation": {"uri": "a"}, "region": region}}
    bad = {**run, "results": [{"message": {"text": "m"}, "locations": [location]}]}
    assert not validator.is_valid({**good, "runs": [bad]})


@pytest.mark.parametrize("indent", [1, None], ids=["one-per-line", "minified"])
def test_sarif_of_a_notebook_is_valid_and_points_into_the_ipynb_text(
    tmp_path: Path, indent
) -> None:
    notebook = tmp_path / "train.ipynb"
    text = _notebook(notebook, indent)
    result = run_cli(["apply", "--check", "--output-format", "sarif", "train.ipynb"], cwd=tmp_path)
    assert result.exit_code == 1, result.output
    [run] = _valid_sarif(result.stdout)["runs"]
    by_rule = {finding["ruleId"]: finding for finding in run["results"]}
    [location] = by_rule["OPT501"]["locations"]
    # The cell and the line within it, as the text report says (train.ipynb:cell 3:1:13).
    assert location["logicalLocations"] == [
        {"name": "cell 3", "fullyQualifiedName": "train.ipynb:cell 3"}
    ]
    assert location["properties"]["cell"] == 3
    assert location["properties"]["cellRegion"]["startLine"] == 1
    assert location["properties"]["cellRegion"]["startColumn"] == 13
    assert location["message"]["text"] == "cell 3, line 1, column 13"
    # The region is where that text is in the notebook file itself, never JSON line 1 or 2.
    region = location["physicalLocation"]["region"]
    line = text.splitlines()[region["startLine"] - 1]
    assert line[region["startColumn"] - 1 :].startswith("torch.optim.AdamW(model.parameters()")
    if indent is not None:
        assert line.strip().startswith('"optimizer = torch.optim.AdamW(')
    assert by_rule["OPT501"]["properties"]["status"] == "fixable"


def test_github_annotations_of_a_notebook_name_the_line_of_the_ipynb(tmp_path: Path) -> None:
    text = _notebook(tmp_path / "train.ipynb", 1)
    result = run_cli(
        ["apply", "--check", "--select", "OPT501", "--output-format", "github", "train.ipynb"],
        cwd=tmp_path,
    )
    [annotation] = _github_annotations(result.stdout)
    assert annotation["message"].startswith("cell 3: ")
    line = text.splitlines()[int(annotation["line"]) - 1]
    assert "torch.optim.AdamW(model.parameters(), lr=1e-3)" in line


def test_sarif_uris_are_percent_encoded(tmp_path: Path) -> None:
    odd = tmp_path / "runs 100% #1" / "trän.py"
    odd.parent.mkdir()
    odd.write_bytes(TRAINING_SCRIPT)
    relative = run_cli(
        ["apply", "--check", "--select", "OPT501", "--output-format", "sarif", "runs 100% #1"],
        cwd=tmp_path,
    )
    [result] = _valid_sarif(relative.stdout)["runs"][0]["results"]
    uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == "runs%20100%25%20%231/tr%C3%A4n.py"
    assert unquote(uri) == "runs 100% #1/trän.py"
    absolute = run_cli(["apply", "--check", "--output-format", "sarif", str(odd)])
    [run] = _valid_sarif(absolute.stdout)["runs"]
    uris = {
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]
    }
    assert uris == {odd.as_uri()} and "%20100%25%20%231/tr%C3%A4n.py" in odd.as_uri()


def test_a_missing_path_makes_the_run_unsuccessful_in_every_format(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(TRAINING_SCRIPT)
    args = ["apply", "--check", "train.py", "missing.py", "--output-format"]
    sarif = run_cli([*args, "sarif"], cwd=tmp_path)
    assert sarif.exit_code == 2
    [run] = _valid_sarif(sarif.stdout)["runs"]
    [invocation] = run["invocations"]
    assert invocation["executionSuccessful"] is False
    [notification] = invocation["toolExecutionNotifications"]
    assert notification["message"]["text"] == "missing.py: no such file or directory"
    assert run["results"]  # the file that exists is still reported
    as_json = json.loads(run_cli([*args, "json"], cwd=tmp_path).stdout)
    assert as_json["errors"] == [
        {"filename": "missing.py", "message": "missing.py: no such file or directory"}
    ]
    github = _github_annotations(run_cli([*args, "github"], cwd=tmp_path).stdout)
    assert {"level": "error", "file": "missing.py"}.items() <= github[0].items()


def test_status_is_fixable_in_check_mode_and_fixed_when_written(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(TRAINING_SCRIPT)
    only = ["--select", "OPT501", "--output-format"]
    checked = json.loads(
        run_cli(["apply", "--check", *only, "sarif", "train.py"], cwd=tmp_path).stdout
    )
    assert checked["runs"][0]["results"][0]["properties"]["status"] == "fixable"
    diffed = run_cli(["apply", "--diff", *only, "json", "train.py"], cwd=tmp_path)
    report = json.loads(diffed.stderr)  # --diff owns stdout
    assert report["summary"] == {"fixable": 1} and report["written"] is False
    written = json.loads(run_cli(["apply", *only, "sarif", "train.py"], cwd=tmp_path).stdout)
    assert written["runs"][0]["results"][0]["properties"]["status"] == "fixed"


# --- a finding shown as fixable carries its fix, whatever else the file has -----------------

# Fixed in the first pass (OPT101, OPT301 after the imports, OPT302, OPT402 beside OPT301's
# insertion), in the second (OPT201, once the loader is pinned), unsafe (OPT502), suppressed
# (OPT501) and declined (OPT104, with --why-not).
MIXED_SCRIPT = b"""import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

model = Net().cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # noqa: OPT501
loader = DataLoader(
    TensorDataset(torch.randn(64, 32), torch.randint(0, 10, (64,))), batch_size=8, num_workers=2
)
for epoch in range(2):
    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(32, 32)
        self.out = nn.Linear(32, 10)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))
"""


@pytest.mark.parametrize("extra", [[], ["--unsafe-fixes"]], ids=["default", "unsafe-fixes"])
def test_every_fixable_finding_carries_its_fix_in_sarif_and_json(tmp_path: Path, extra) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(MIXED_SCRIPT)
    args = ["apply", "--check", "--why-not", *extra, "train.py", "--output-format"]
    sarif = json.loads(run_cli([*args, "sarif"], cwd=tmp_path).stdout)
    results = sarif["runs"][0]["results"]
    statuses = {(r["ruleId"], r["properties"]["status"]) for r in results}
    assert {("OPT301", "fixable"), ("OPT402", "fixable"), ("OPT201", "fixable")} <= statuses
    assert ("OPT104", "declined") in statuses and "OPT501" not in {r for r, _ in statuses}
    assert (("OPT502", "fixable") if extra else ("OPT502", "unsafe")) in statuses
    replacements = []
    for result in results:
        fixable = result["properties"]["status"] == "fixable"
        assert fixable == bool(result.get("fixes")), (result["ruleId"], result["locations"])
        for fix in result.get("fixes", ()):
            [change] = fix["artifactChanges"]
            replacements.extend(change["replacements"])
    document = json.loads(run_cli([*args, "json"], cwd=tmp_path).stdout)
    for finding in document["findings"]:
        fixable = finding["status"] == "fixable"
        assert fixable == (finding["fix"] is not None), (finding["code"], finding["location"])
        assert not fixable or finding["fix"]["edits"]
    unique = {json.dumps(r, sort_keys=True): r for r in replacements}.values()
    assert run_cli(["apply", *extra, "train.py"], cwd=tmp_path).exit_code == 1
    assert _apply_replacements(MIXED_SCRIPT.decode(), list(unique)) == script.read_text()


def test_json_fix_edits_reproduce_the_rewrite(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(MIXED_SCRIPT)
    args = ["apply", "--check", "train.py", "--output-format", "json"]
    document = json.loads(run_cli(args, cwd=tmp_path).stdout)
    edits = {
        json.dumps(edit, sort_keys=True): edit
        for finding in document["findings"]
        if finding["fix"] is not None
        for edit in finding["fix"]["edits"]
    }
    lines = MIXED_SCRIPT.decode().splitlines(keepends=True)
    for edit in sorted(edits.values(), key=lambda e: -e["location"]["row"]):
        start, end = edit["location"]["row"] - 1, edit["end_location"]["row"] - 1
        lines[start:end] = [edit["content"]]
    run_cli(["apply", "train.py"], cwd=tmp_path)
    assert "".join(lines) == script.read_text()


def test_fixable_findings_of_a_notebook_carry_fixes_of_the_ipynb_text(tmp_path: Path) -> None:
    notebook = tmp_path / "train.ipynb"
    text = _notebook(notebook, 1)
    result = run_cli(["apply", "--check", "--output-format", "sarif", "train.ipynb"], cwd=tmp_path)
    [run] = _valid_sarif(result.stdout)["runs"]
    replacements = []
    for finding in run["results"]:
        assert (finding["properties"]["status"] == "fixable") == bool(finding.get("fixes"))
        for fix in finding.get("fixes", ()):
            [change] = fix["artifactChanges"]
            assert change["artifactLocation"]["uri"] == "train.ipynb"
            replacements.extend(change["replacements"])
    assert replacements
    unique = {json.dumps(r, sort_keys=True): r for r in replacements}.values()
    run_cli(["apply", "train.ipynb"], cwd=tmp_path)
    assert _apply_replacements(text, list(unique)) == notebook.read_text()

"""Machine-readable reports, checked as parsed documents: GitHub annotations, SARIF, JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List

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
        if finding["properties"]["status"] == "fixed":
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
    assert by_code["OPT501"]["safety"] == "numerics" and by_code["OPT501"]["status"] == "fixed"
    assert by_code["OPT502"]["safety"] == "behavior" and by_code["OPT502"]["status"] == "unsafe"
    assert document["changed_files"] == ["train.py"]

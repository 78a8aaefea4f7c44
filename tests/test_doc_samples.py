"""The sample outputs in the docs come from real runs, and a test notices when they go stale.

scripts/doc_samples.py writes them; here the commands run again and what cannot differ
between runs or machines must match the page: for `verify`, the fixes, the run and step
counts, the report's lines and the verdict (timings and rounding notes are left out); for
`doctor`, the page must be exactly what the recorded machine facts give with today's rules.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from optimizer_codemod.registry import all_rules

pytest.importorskip("torch")

_spec = importlib.util.spec_from_file_location("doc_samples", ROOT / "scripts" / "doc_samples.py")
doc_samples = importlib.util.module_from_spec(_spec)
sys.modules["doc_samples"] = doc_samples  # dataclasses look their module up there
_spec.loader.exec_module(doc_samples)


def test_every_sample_block_is_in_its_page_with_its_command() -> None:
    for name, sample in doc_samples.SAMPLES.items():
        command, output = doc_samples.block(name)
        assert command == " ".join(sample.command)
        assert output.strip(), f"sample {name} is empty: run scripts/doc_samples.py"


def test_the_verify_sample_matches_a_real_run(tmp_path: Path) -> None:
    _, documented = doc_samples.block("verify")
    expected = doc_samples.verify_parts(documented)
    assert expected["fixes"].startswith("train.py: ") and expected["verdict"] == "Equivalent"
    assert expected["counts"] == {"steps": ["3", "3"], "losses": ["3", "3"]}
    live = doc_samples.verify_parts(doc_samples.run("verify", tmp_path))
    assert live == expected, "docs/verify.md is stale: run python scripts/doc_samples.py"


def test_verify_parts_notice_what_would_make_the_sample_wrong() -> None:
    _, documented = doc_samples.block("verify")
    parts = doc_samples.verify_parts(documented)
    # one fix and its rule fewer
    fewer_fixes = re.sub(
        r"(\d+) fixes applied \(OPT\d+, ",
        lambda found: f"{int(found[1]) - 1} fixes applied (",
        documented,
        count=1,
    )
    assert fewer_fixes != documented
    assert doc_samples.verify_parts(fewer_fixes) != parts
    other_steps = documented.replace("3 steps each", "4 steps each", 1)
    assert doc_samples.verify_parts(other_steps) != parts
    # Timings and this CPU's rounding note are not compared.
    other_timing = documented.replace(" ms", "0 ms").replace("note: under", "note: with")
    assert doc_samples.verify_parts(other_timing) == parts


def test_the_doctor_sample_is_what_its_recorded_machine_gives_today() -> None:
    facts = json.loads(doc_samples.DOCTOR_FACTS.read_text())
    _, documented = doc_samples.block("doctor")
    assert documented == doc_samples.doctor_output(
        facts
    ), "docs/verify.md's doctor sample is stale: run python scripts/doc_samples.py"
    for rule in all_rules():
        assert f"  {rule.code} {rule.name} " in documented


def test_the_recorded_machine_has_the_fields_doctor_reports_now() -> None:
    live = run_cli(["doctor", "--output-format", "json", "--compile-timeout", "0"])
    assert live.exit_code == 0, live.output
    report = json.loads(live.stdout)
    recorded = json.loads(doc_samples.DOCTOR_FACTS.read_text())
    assert sorted(recorded) == sorted(report["machine"])
    assert [row["code"] for row in report["rules"]] == [rule.code for rule in all_rules()]

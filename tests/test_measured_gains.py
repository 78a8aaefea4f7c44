"""Rule pages' "Measured" figures come from the results files, with machine, torch and date."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from optimizer_codemod import measured_gains
from optimizer_codemod.measured_gains import (
    Measurement,
    Results,
    format_speedup,
    load_results,
    measurements_for,
    render_measured,
)
from optimizer_codemod.registry import rule_by_code
from optimizer_codemod.rule_docs import render_rule_page

GPU_BENCH = {
    "tool": "optcodemod bench",
    "date": "2026-11-22 01:00 UTC",
    "device": "cuda",
    "device_name": "NVIDIA H100 80GB HBM3",
    "torch": "2.13.0+cu128",
    "machine": {"machine": "x86_64", "cpu_count": 16},
    "settings": {"rewrite": "all rules, default levels", "ablate": True},
    "workloads": [
        {
            "name": "gpt",
            "fixed": ["OPT501", "OPT301", "OPT501"],
            "speedup": 1.8,
            "speed_within_noise": False,
            "equivalent": True,
            "error": None,
            "ablation": {
                "OPT301": {"speedup": 1.5, "unchanged": False, "equivalent": True, "error": None},
                "OPT501": {
                    "speedup": 1.04,
                    "unchanged": False,
                    "equivalent": True,
                    "error": None,
                    "speed_within_noise": True,
                },
            },
        },
        {
            "name": "mlp",
            "fixed": ["OPT501"],
            "speedup": 1.1,
            "speed_within_noise": True,
            "equivalent": True,
            "error": None,
        },
        {"name": "cnn", "fixed": ["OPT101"], "speedup": 1.3, "equivalent": True, "error": None},
    ],
}
GPU_MICRO = {
    "results": {
        "OPT501": {
            "before_s": 0.004,
            "after_s": 0.001,
            "speedup": 4.0,
            "what": "AdamW.step() | 8 tensors",
            "machine": {
                "device": "cuda",
                "device_name": "NVIDIA H100 80GB HBM3",
                "cpu": "x86_64",
                "cpu_count": 16,
                "torch": "2.13.0+cu128",
                "date": "2026-11-22",
            },
        }
    }
}
H100 = dict(machine="NVIDIA H100 80GB HBM3", torch="2.13.0+cu128")


@pytest.fixture
def synthetic(tmp_path: Path) -> Path:
    (tmp_path / "reference-gpu.json").write_text(json.dumps(GPU_BENCH))
    (tmp_path / "rule-gains-cuda.json").write_text(json.dumps(GPU_MICRO))
    # Not about rules: skipped.
    (tmp_path / "tool-speed-cpu.json").write_text(json.dumps({"tool": "x", "what": "parse"}))
    return tmp_path


def test_a_synthetic_results_folder_gives_the_expected_rows(synthetic: Path) -> None:
    results = load_results(synthetic)
    assert [name for name, _ in results.files] == ["reference-gpu.json", "rule-gains-cuda.json"]
    bench = dict(**H100, date="2026-11-22 01:00 UTC", source="reference-gpu.json")
    assert measurements_for("OPT501", results) == [
        Measurement(
            what="micro-benchmark: AdamW.step() | 8 tensors",
            speedup=4.0,
            detail="4 ms before, 1 ms after",
            date="2026-11-22",
            source="rule-gains-cuda.json",
            **H100,
        ),
        Measurement(
            "workload `gpt`, this rule alone (default levels)", 1.04, "within noise", **bench
        ),
        Measurement(
            "workload `gpt`, all fixes together: OPT301, OPT501 (default levels)", 1.8, "", **bench
        ),
        Measurement(
            "workload `mlp`, this rule alone: the only fix that applied (default levels)",
            1.1,
            "within noise",
            **bench,
        ),
    ]
    page = render_measured("OPT501", results)
    assert "| x4.00 (4 ms before, 1 ms after) | NVIDIA H100 80GB HBM3 | 2.13.0+cu128 |" in page
    assert "AdamW.step() \\| 8 tensors" in page  # a pipe would split the table cell
    assert "| x1.04 (within noise) |" in page
    assert measurements_for("OPT101", results)[0].what.startswith("workload `cnn`, this rule")


def test_each_workload_keeps_the_date_it_was_measured(synthetic: Path) -> None:
    # A resumed bench: the file's date is its last workload's, an earlier one keeps its own.
    workloads = [dict(GPU_BENCH["workloads"][0], date="2026-11-21 09:00 UTC")]
    workloads += GPU_BENCH["workloads"][1:]
    (synthetic / "reference-gpu.json").write_text(json.dumps(dict(GPU_BENCH, workloads=workloads)))
    dates = {
        m.what.split("`")[1]: m.date
        for m in measurements_for("OPT501", load_results(synthetic))
        if m.source == "reference-gpu.json"
    }
    assert dates == {"gpt": "2026-11-21 09:00 UTC", "mlp": "2026-11-22 01:00 UTC"}


def test_cpu_machines_are_named_by_cores_and_model(synthetic: Path) -> None:
    data = dict(GPU_BENCH, device="cpu", device_name="AMD EPYC", torch="2.13.0+cpu")
    data["machine"] = {"machine": "x86_64", "cpu_count": 2}
    (synthetic / "reference-gpu.json").write_text(json.dumps(data))
    [row] = measurements_for("OPT101", load_results(synthetic))
    assert (row.machine, row.torch) == ("2-core x86_64 (AMD EPYC)", "2.13.0+cpu")


def test_a_rule_ablated_unchanged_or_failed_says_so(synthetic: Path) -> None:
    data = json.loads(json.dumps(GPU_BENCH))
    data["workloads"][0]["ablation"]["OPT501"] = {"speedup": None, "unchanged": True}
    data["workloads"][0]["ablation"]["OPT301"] = {"speedup": None, "error": "crashed"}
    (synthetic / "reference-gpu.json").write_text(json.dumps(data))
    page = render_measured("OPT501", load_results(synthetic))
    assert "| nothing to change alone: it needs another rule's fix |" in page
    assert "| the run failed |" in render_measured("OPT301", load_results(synthetic))


def test_the_committed_results_give_opt501_a_measured_section() -> None:
    results = load_results()
    assert results.folder is not None, "benchmarks/results/ not found from the checkout"
    committed = json.loads((results.folder / "rule-gains-cpu.json").read_text())
    figure = format_speedup(committed["results"]["OPT501"]["speedup"])
    page = render_rule_page(rule_by_code("OPT501"), results)
    gain = page.split("## Expected gain", 1)[1].split("\n## ", 1)[0]
    measured = gain.split("### Measured", 1)[1]
    assert f"| {figure} (" in measured and "| 2.13.0+cpu | 2026-11-21 |" in measured
    reference = json.loads((results.folder / "reference-cpu.json").read_text())
    for workload in reference["workloads"]:
        if "OPT501" in workload["fixed"]:
            assert f"workload `{workload['name']}`, all fixes together" in measured
            assert format_speedup(workload["speedup"]) in measured
    # The rule's own text comes first, untouched.
    assert gain.strip().startswith(rule_by_code("OPT501").doc_sections()["Expected gain"])


def test_a_rule_without_data_says_so(tmp_path: Path) -> None:
    page = render_rule_page(rule_by_code("OPT501"), load_results(tmp_path))
    assert "No committed measurement yet: no results file" in page
    assert "No committed measurement yet" in render_measured("OPT999", load_results())


def test_explain_without_a_results_folder_says_none_is_installed(monkeypatch) -> None:
    monkeypatch.setattr(measured_gains, "default_folder", lambda: None)
    assert load_results() == Results(None)
    page = run_cli(["explain", "OPT501"])
    assert page.exit_code == 0
    assert "No committed measurements in this installation" in page.stdout


def test_generate_docs_reads_the_results_it_is_given(synthetic: Path, tmp_path: Path) -> None:
    output = tmp_path / "rules"
    args = ["generate-docs", "--output", str(output)]
    assert run_cli([*args, "--results", str(synthetic)]).exit_code == 0
    assert "| NVIDIA H100 80GB HBM3 |" in (output / "OPT501.md").read_text()
    assert run_cli([*args, "--check", "--results", str(synthetic)]).exit_code == 0
    # Other results, other pages: the staleness check covers the figures too.
    stale = run_cli([*args, "--check"])
    assert stale.exit_code == 1 and "OPT501.md" in stale.stderr

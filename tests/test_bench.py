"""`optcodemod bench`: one tiny workload for real, the rest of the machinery on canned data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import run_cli
from optimizer_codemod.verify import bench
from optimizer_codemod.verify.bench import bench_workload, render_markdown, twin_of, workloads
from optimizer_codemod.rule import Safety
from optimizer_codemod.verify.equivalence import VerifyReport, tolerance_for
from optimizer_codemod.verify.equivalence import _compare as compare_report
from optimizer_codemod.verify.peaks import dense_bf16_peak
from optimizer_codemod.verify.runner import ProbeRun

pytest.importorskip("torch")

REFERENCE = Path(__file__).resolve().parent.parent / "reference_models"


def test_bench_runs_a_workload_and_writes_json_and_markdown(tmp_path: Path) -> None:
    folder = tmp_path / "workloads" / "sgld_mnist"
    folder.mkdir(parents=True)
    shutil.copy(REFERENCE / "sgld_mnist" / "train.py", folder / "train.py")
    out = tmp_path / "out"
    result = run_cli(
        ["bench", str(tmp_path / "workloads"), "--steps", "4", "--repeats", "1", "--warmup", "1"]
        + ["--output", str(out), "--name", "tiny", "--timeout", "120"]
    )
    assert result.exit_code == 0, result.output
    assert "sgld_mnist" in result.output and "median speedup: " in result.output
    data = json.loads((out / "tiny.json").read_text())
    assert data["device"] == "cpu" and data["torch"] and data["date"]
    assert {"machine", "cpu_count", "platform"} <= set(data["machine"])
    assert data["settings"]["steps"] == 4 and data["settings"]["size"] == "cpu"
    (workload,) = data["workloads"]
    assert workload["name"] == "sgld_mnist" and workload["equivalent"] is True
    assert "OPT501" not in workload["fixed"]  # SGLD has no fused kernel
    assert "OPT102" not in workload["fixed"]  # behaviour-level: only with --unsafe-fixes
    assert workload["step_time_before"] > 0 and workload["step_time_after"] > 0
    assert workload["speedup"] == pytest.approx(
        workload["step_time_before"] / workload["step_time_after"]
    )
    assert workload["peak_memory_before"] > 0
    assert workload["verdict"][-1].startswith("Equivalent"), workload["verdict"]
    assert data["summary"]["median_speedup"] == workload["speedup"]
    table = (out / "tiny.md").read_text()
    assert "| workload | fixes | step time before |" in table
    # --device cpu rewrites for a CPU target: pinning (OPT101) changes nothing there.
    assert "OPT101" not in workload["fixed"] and "OPT302" in workload["fixed"]
    assert "OPT104" in workload["fixed"]  # its dataset class fetches whole batches
    assert "| sgld_mnist | OPT104, OPT302" in table and "Median speedup" in table
    assert [p.name for p in folder.iterdir()] == ["train.py"]  # no temporary file left


def test_bench_without_workloads_is_an_error(tmp_path: Path) -> None:
    result = run_cli(["bench", str(tmp_path)])
    assert result.exit_code == 2 and "no workload" in result.output


def test_the_twin_is_found_and_not_benchmarked_on_its_own() -> None:
    names = [Path(folder).name for folder in workloads(str(REFERENCE))]
    assert "naive_gpt" in names and "expert_gpt" not in names
    assert twin_of(str(REFERENCE / "naive_gpt")) == str(REFERENCE / "expert_gpt" / "train.py")
    assert twin_of(str(REFERENCE / "sgld_mnist")) is None


def test_bench_launches_a_workload_as_its_torchrun_line_says(monkeypatch) -> None:
    """mmdit_ddp says `# bench: torchrun --nproc-per-node 2`: both versions run that way.

    (tests/test_reference_models.py runs it for real under torchrun; here only the launch.)
    """
    launched = []

    def fake_verify_pair(script, rewritten, **options):
        launched.append(options["nproc_per_node"])
        return VerifyReport(script, None, None, fixed=["OPT801"])

    monkeypatch.setattr(bench, "verify_pair", fake_verify_pair)
    common = dict(size="cpu", env={}, steps=4, repeats=1, warmup=1, timeout=None)
    folder = str(REFERENCE / "mmdit_ddp")
    result = bench_workload(folder, ablate=False, echo=lambda text: None, **common)
    assert launched == [2] and result.to_json()["processes"] == 2
    bench_workload(str(REFERENCE / "sgld_mnist"), ablate=False, echo=lambda text: None, **common)
    assert launched == [2, 1]


def test_markdown_shows_twin_ablation_and_failures() -> None:
    row = {
        "fixed": ["OPT301", "OPT501"],
        "unchanged": False,
        "error": None,
        "equivalent": True,
        "max_relative_difference": 1e-7,
        "step_time_before": 0.02,
        "step_time_after": 0.01,
        "speedup": 2.0,
        "speed_within_noise": False,
        "peak_memory_before": 2**30,
        "peak_memory_after": 2**29,
    }
    data = {
        "device": "cuda",
        "device_name": "NVIDIA H100",
        "torch": "2.13.0",
        "date": "2026-11-21 12:00 UTC",
        "machine": {"platform": "Linux", "cpu_count": 16},
        "settings": {"size": "gpu", "steps": 20, "warmup": 5, "repeats": 3},
        "summary": {"median_speedup": 2.0},
        "workloads": [
            dict(
                row,
                name="naive_gpt",
                twin={
                    "script": "reference_models/expert_gpt/train.py",
                    "step_time": 0.009,
                    "rewritten_throughput_vs_twin": 0.9,
                },
                ablation={
                    "OPT501": {"speedup": 1.5, "equivalent": True, "error": None},
                    "OPT301": {
                        "speedup": 1.02,
                        "speed_within_noise": True,
                        "equivalent": True,
                        "error": None,
                    },
                },
            ),
            dict(
                row,
                name="broken",
                equivalent=False,
                max_relative_difference=0.5,
                verdict=["local check: FAILED at iteration 2.", "Not equivalent: decided by it."],
            ),
            dict(row, name="judged_before_verdicts_were_kept", equivalent=False),
            dict(row, name="mmdit_ddp", processes=2),
        ],
    }
    text = render_markdown(data)
    assert (
        "| naive_gpt | OPT301, OPT501 | 20.0 ms | 10.0 ms | 2.00x | n/a | yes (1.0e-07) |" in text
    )
    assert "| broken |" in text and "**no** (5.0e-01)" in text
    assert "reaches 90% of the twin's throughput" in text and "(`expert_gpt`)" in text
    assert "| naive_gpt | OPT501 | 1.50x | yes |" in text
    assert "| naive_gpt | OPT301 | 1.02x ~ | yes |" in text
    assert "`~`: within run-to-run noise" in text  # an ablation row is enough
    assert "| mmdit_ddp (torchrun, 2 processes) | OPT301, OPT501 |" in text
    assert "Workloads run under torchrun: rank 0's" in text
    why = text[text.index("## Why losses disagree") :]
    assert "`broken`: losses disagree.\n- local check: FAILED at iteration 2.\n" in why
    assert "`judged_before_verdicts_were_kept`: losses disagree.\n- (no judgment" in why
    assert "naive_gpt" not in why and "mmdit_ddp" not in why
    assert "## Why losses disagree" not in render_markdown(
        dict(data, workloads=[dict(row, name="fine")])
    )


def test_bench_rewrites_for_the_device_it_measures(tmp_path: Path, monkeypatch) -> None:
    from conftest import ATTENTION_SCRIPT

    folder = tmp_path / "workloads" / "attention"
    folder.mkdir(parents=True)
    (folder / "train.py").write_bytes(ATTENTION_SCRIPT)
    fixed = []

    def fake_verify_pair(script, rewritten, **options):
        fixed.append(options["fixed"])
        return VerifyReport(script, None, None, fixed=options["fixed"])

    monkeypatch.setattr(bench, "verify_pair", fake_verify_pair)
    out = tmp_path / "out"
    for device in ("cpu", "cuda"):
        args = ["bench", str(tmp_path / "workloads"), "--device", device, "--size", "cpu"]
        run_cli(args + ["--output", str(out), "--name", device, "--steps", "2"])
    cpu, cuda = fixed
    assert "OPT302" in cpu and "OPT406" not in cpu and "OPT402" not in cpu
    assert "OPT406" in cuda and "OPT402" in cuda
    for device in ("cpu", "cuda"):
        data = json.loads((out / f"{device}.json").read_text())
        assert data["settings"]["target_device"] == device
        assert f"rewritten for target-device `{device}`" in (out / f"{device}.md").read_text()


def _probe_run(label: str, step_time: float, **result) -> ProbeRun:
    data = {"status": "stopped", "step_time": step_time, "losses": [1.0], "device": "cuda"}
    return ProbeRun("train.py", 0, dict(data, **result), "", "", 1.0, label=label)


def test_model_flops_utilisation_against_the_devices_bf16_peak() -> None:
    flops = 4 * 10**12
    name = "NVIDIA H100 80GB HBM3"
    report = VerifyReport("naive_gpt/train.py", None, None, fixed=["OPT302"])
    report.before = [_probe_run("original", 0.4, flops_per_step=flops, device_name=name)]
    report.after = [_probe_run("rewritten", 0.01, device_name=name)]
    twin_runs = [_probe_run("twin", 0.008, device_name=name)]
    result = bench.WorkloadResult("naive_gpt", report, "expert_gpt/train.py", twin_runs)
    data = bench.to_json([result], {"size": "gpu", "steps": 20, "warmup": 5, "repeats": 1})
    assert data["dense_bf16_peak"]["flops"] == 989e12
    (w,) = data["workloads"]
    assert w["flops_per_step"] == flops
    assert w["flop_rate_before"] == pytest.approx(10e12)
    assert w["mfu_after"] == pytest.approx(400e12 / 989e12)
    assert w["twin"]["mfu"] == pytest.approx(500e12 / 989e12)
    text = render_markdown(data)
    assert "| naive_gpt | 4000.00 | 10.000 | 400.000 | 1.0% | 40.4% |" in text
    assert "model FLOPs utilisation: rewritten 40%, twin 51%, original 1%." in text


def test_no_utilisation_where_no_peak_is_known() -> None:
    report = VerifyReport("w/train.py", None, None, fixed=["OPT302"])
    report.before = [_probe_run("original", 0.2, flops_per_step=10**9, device_name="AMD EPYC")]
    report.after = [_probe_run("rewritten", 0.1, device_name="AMD EPYC")]
    data = bench.to_json([bench.WorkloadResult("w", report)], {"size": "cpu", "steps": 4})
    assert data["dense_bf16_peak"] is None and "mfu_after" not in data["workloads"][0]
    text = render_markdown(
        dict(data, settings={"size": "cpu", "steps": 4, "warmup": 2, "repeats": 1})
    )
    assert "| w | 1.00 | 0.005 | 0.010 | n/a | n/a |" in text
    assert "no bf16 peak is known for this device" in text


def test_peaks_prefer_the_specific_model() -> None:
    assert dense_bf16_peak("NVIDIA H100 PCIe")[0] == 756e12
    assert dense_bf16_peak("NVIDIA H200")[0] == 989e12
    assert dense_bf16_peak("NVIDIA A100-SXM4-80GB")[0] == 312e12
    assert dense_bf16_peak("AMD EPYC 9B14") is None and dense_bf16_peak(None) is None


def _canned_result(name: str, before: float, after: float) -> bench.WorkloadResult:
    level = Safety.NUMERICS
    report = VerifyReport(f"{name}/train.py", level, tolerance_for(level), fixed=["OPT302"])
    report.before = [_probe_run("original", before, device="cpu", device_name="AMD EPYC")]
    report.after = [_probe_run("rewritten", after, device="cpu", device_name="AMD EPYC")]
    compare_report(report)  # the same losses: equivalent
    return bench.WorkloadResult(name, report)


def test_bench_writes_after_each_workload_and_resumes(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "workloads"
    for name in ("a", "b", "c"):
        (root / name).mkdir(parents=True)
        (root / name / "train.py").write_text("print('never run')\n")
    timings = {"a": (0.3, 0.1), "b": (0.2, 0.1), "c": (0.1, 0.1)}
    ran: list = []

    def fake_bench_workload(folder, **_):
        name = Path(folder).name
        ran.append(name)
        if ran == ["a", "b"]:
            raise KeyboardInterrupt  # the first run is cut short after `a`
        return _canned_result(name, *timings[name])

    monkeypatch.setattr(bench, "bench_workload", fake_bench_workload)
    out = tmp_path / "out"
    out.mkdir()
    command = dict(output=str(out), name="r", echo=lambda *a, **k: None)
    with pytest.raises(KeyboardInterrupt):
        bench.bench_command(str(root), **command)
    kept = json.loads((out / "r.json").read_text())
    assert [w["name"] for w in kept["workloads"]] == ["a"]  # written before the cut

    ran.clear()
    assert bench.bench_command(str(root), resume=True, **command) == 0
    assert ran == ["b", "c"]  # `a` is kept, not run again
    data = json.loads((out / "r.json").read_text())
    assert [w["name"] for w in data["workloads"]] == ["a", "b", "c"]
    assert data["summary"]["median_speedup"] == pytest.approx(2.0)
    assert data["summary"]["workloads"] == 3 and data["summary"]["equivalent"] == 3

    # Other settings: the file is not mixed with them.
    assert bench.bench_command(str(root), resume=True, steps=10, **command) == 2
    assert json.loads((out / "r.json").read_text()) == data


def test_chart_has_a_panel_for_the_ablation(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from PIL import Image

    row = {"speedup": 1.5, "name": "w"}
    data = {"device": "cpu", "device_name": "AMD EPYC", "date": "2026-11-22 00:00 UTC"}
    plain = dict(data, workloads=[row, dict(row, name="v", speedup=None)])
    ablated = dict(data, workloads=[dict(row, ablation={"OPT302": {"speedup": 2.0}})] * 10)
    assert bench.write_chart(plain, str(tmp_path / "plain.png")) is None
    assert bench.write_chart(ablated, str(tmp_path / "ablated.png")) is None
    plain_size = Image.open(tmp_path / "plain.png").size
    ablated_size = Image.open(tmp_path / "ablated.png").size
    # One row per bar: ten workloads and their ablations make a taller chart, not a wider one.
    assert ablated_size[0] == plain_size[0] and ablated_size[1] > 2 * plain_size[1]

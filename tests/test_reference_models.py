"""The reference workloads: their checked-in rewrites are up to date, and both versions train alike.

Each reference_models/<name>/train.optimized.py is a snapshot of the rewrite `optcodemod bench`
measures by default (what `optcodemod apply` writes). When a rule changes, regenerate them all with

    .venv/bin/python scripts/update_reference_models.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from optimizer_codemod.diagnostics import Status
from optimizer_codemod.verify.bench import SCRIPT, SNAPSHOT, rewrite_workload, workloads
from optimizer_codemod.verify.equivalence import verify_pair
from optimizer_codemod.verify.runner import ProbeOptions, declared_processes, run_probe

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reference_models"
FOLDERS = sorted(p for p in REFERENCE.iterdir() if (p / SCRIPT).is_file())
REGENERATE = ".venv/bin/python scripts/update_reference_models.py"
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def test_the_workloads_are_there() -> None:
    names = {folder.name for folder in FOLDERS}
    assert {
        "sgld_mnist",
        "resnet_cifar",
        "char_transformer",
        "naive_gpt",
        "expert_gpt",
        "mmdit_ddp",
        "sudoku_diffusion",
        "vision_bdh",
    } <= names
    # The expert twin is measured against naive_gpt's rewrite, not as a workload of its own.
    assert "expert_gpt" not in {Path(f).name for f in workloads(str(REFERENCE))}


@pytest.mark.parametrize("folder", FOLDERS, ids=[folder.name for folder in FOLDERS])
def test_snapshot_is_up_to_date(folder: Path) -> None:
    expected = rewrite_workload(str(folder / SCRIPT)).new
    snapshot = folder / SNAPSHOT
    assert snapshot.exists(), f"{snapshot} is missing: run `{REGENERATE}`"
    assert snapshot.read_bytes() == expected, (
        f"{snapshot.relative_to(ROOT)} is stale against the current rules: run `{REGENERATE}` "
        "and review the diff"
    )


# naive_gpt's rewrite (equal to its snapshot, above) is verified over 50 steps in
# test_issue3_gpt.py; four more steps here would repeat a minute of the suite's slowest run.
VERIFIED_ELSEWHERE = {"naive_gpt"}
AGREEMENT_FOLDERS = [folder for folder in FOLDERS if folder.name not in VERIFIED_ELSEWHERE]


def _verify_copies(folder: Path) -> set:
    return {p for p in os.listdir(folder) if "optcodemod-verify" in p}


@pytest.mark.parametrize(
    "folder", AGREEMENT_FOLDERS, ids=[folder.name for folder in AGREEMENT_FOLDERS]
)
def test_both_versions_run_on_cpu_and_agree(folder: Path, monkeypatch) -> None:
    """A few steps at CPU size; the figures are printed (pytest -s shows them).

    A workload with a `# bench: torchrun --nproc-per-node N` line runs under torchrun, as bench
    runs it (mmdit_ddp: 2 gloo processes).
    """
    for key, value in CPU_ONLY.items():
        monkeypatch.setenv(key, value)
    # A run killed earlier (a session cut off mid-test) may have left its copy behind.
    leftovers_before = _verify_copies(folder)
    script = folder / SCRIPT
    processes = declared_processes(str(script)) or 1
    result = rewrite_workload(str(script))
    args = ["--size", "cpu"]
    if not result.changed:  # the hand-optimized twin: it must still run
        options = ProbeOptions(steps=3, timeout=120, nproc_per_node=processes)
        run = run_probe(str(script), args, options)
        assert run.problem() is None, run.stderr_tail()
        return
    fixed = [d for d in result.diagnostics if d.status is Status.FIXED]
    report = verify_pair(
        script,
        (folder / SNAPSHOT).read_bytes(),
        level=max(d.safety for d in fixed),
        fixed=[d.code for d in fixed],
        args=args,
        steps=4,
        repeats=1,
        warmup=1,
        timeout=120,
    )
    sys.stdout.write(report.render())
    assert report.error is None, report.error
    assert report.equivalent, report.render()
    assert report.processes == processes
    for run in report.before + report.after:  # every rank stopped after the same step
        assert [r["steps"] for r in run.result.get("other_ranks", [])] == [4] * (processes - 1)
    assert _verify_copies(folder) == leftovers_before

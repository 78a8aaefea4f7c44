"""`optcodemod doctor`: the machine's facts, and which rules pay off on it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import run_cli
from optimizer_codemod.registry import all_rules
from optimizer_codemod.verify.doctor import (
    NO_GAIN,
    NO_SPEED_CHANGE,
    PAYS_OFF,
    CudaDevice,
    Machine,
    advice,
    assess,
    check_compile,
    payoff_for,
    render,
)

torch = pytest.importorskip("torch")


def _machine(**facts) -> Machine:
    base = dict(
        python="3.11.7",
        platform="Linux",
        torch="2.13.0+cpu",
        cpu="x86_64",
        cpu_cores=2,
        usable_cores=2,
        cpu_bf16_instructions=False,
    )
    base.update(facts)
    return Machine(**base)


def _cuda_machine(capability, **facts) -> Machine:
    return _machine(
        torch="2.13.0+cu128",
        cuda=True,
        cuda_version="12.8",
        cudnn_version=91000,
        devices=[CudaDevice("GPU", capability, 80.0)],
        cuda_bf16=capability >= (8, 0),
        tf32=capability >= (8, 0),
        pinned_memory=True,
        **facts,
    )


def _verdicts(machine: Machine) -> dict:
    return {row["code"]: row["verdict"] for row in assess(machine, all_rules())}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a CPU-only machine offers")
def test_doctor_on_this_cpu_machine() -> None:
    result = run_cli(["doctor", "--output-format", "json", "--compile-timeout", "0"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    machine = report["machine"]
    assert machine["torch"] == torch.__version__
    assert machine["cuda"] is False and machine["tf32"] is False and machine["devices"] == []
    assert machine["pinned_memory"] is False
    assert machine["usable_cores"] >= 1 and machine["compile_works"] is None
    verdicts = {row["code"]: row["verdict"] for row in report["rules"]}
    assert [row["code"] for row in report["rules"]] == [rule.code for rule in all_rules()]
    assert verdicts["OPT101"] == verdicts["OPT201"] == verdicts["OPT301"] == NO_GAIN
    assert verdicts["OPT401"] == NO_GAIN
    assert verdicts["OPT501"] == verdicts["OPT502"] == PAYS_OFF
    assert "unknown" not in verdicts.values()


def test_doctor_text_report_lists_the_machine_and_every_rule() -> None:
    result = run_cli(["doctor", "--compile-timeout", "0"])
    assert result.exit_code == 0, result.output
    assert f"torch       {torch.__version__}" in result.stdout
    assert "torch.compile works: not checked" in result.stdout
    for rule in all_rules():
        assert f"  {rule.code} {rule.name} " in result.stdout


def test_ampere_gets_tf32_and_the_cuda_rules() -> None:
    verdicts = _verdicts(_cuda_machine((8, 0)))
    for code in ("OPT101", "OPT201", "OPT301", "OPT401", "OPT501"):
        assert verdicts[code] == PAYS_OFF, code


def test_volta_gets_no_tf32() -> None:
    verdicts = _verdicts(_cuda_machine((7, 0)))
    assert verdicts["OPT301"] == NO_GAIN
    assert verdicts["OPT101"] == verdicts["OPT401"] == PAYS_OFF


def test_cpu_machine_facts_decide_workers_and_fused_optimizers() -> None:
    one_core = _verdicts(_machine(usable_cores=1))
    assert one_core["OPT102"] == one_core["OPT103"] == NO_GAIN
    assert _verdicts(_machine())["OPT102"] == PAYS_OFF
    # Fused CPU optimizer kernels arrived in torch 2.4.
    assert _verdicts(_machine(torch="2.3.1"))["OPT501"] == NO_GAIN
    assert _verdicts(_machine(torch="2.4.0"))["OPT501"] == PAYS_OFF


def test_compile_pays_off_only_where_it_is_emitted() -> None:
    assert _verdicts(_machine())["OPT402"] == NO_GAIN  # CPU: OPT402 emits nothing there
    assert _verdicts(_cuda_machine((8, 0)))["OPT402"] == PAYS_OFF
    assert _verdicts(_machine())["OPT407"] == PAYS_OFF  # channels_last needs no compiler


def test_most_specific_entry_wins_and_families_cover_new_rules() -> None:
    assert payoff_for("OPT301").prefix == "OPT301"
    assert payoff_for("opt399").prefix == "OPT3"
    assert payoff_for("OPT899").test(_machine()) == NO_SPEED_CHANGE
    assert payoff_for("OPT999") is None
    for rule in all_rules():
        assert payoff_for(rule.code) is not None, f"{rule.code} has no entry in doctor.PAYOFF"


def test_compile_check_works_or_says_why() -> None:
    works, seconds, problem = check_compile(timeout=300)
    assert works is not None, problem
    assert works or problem
    assert seconds > 0


def test_compile_check_timeout_means_unknown() -> None:
    works, _, problem = check_compile(timeout=0.01)
    assert works is None and problem == "timed out after 0.01 s"


@pytest.mark.parametrize(
    "command",
    [
        ["doctor", "--compile-timeout", "0"],
        ["verify", "SCRIPT", "--steps", "2"],
        ["bench", "FOLDER", "--steps", "2"],
    ],
    ids=lambda command: command[0],
)
def test_commands_that_run_torch_say_how_to_install_it(tmp_path, command) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    args = [
        str(script) if a == "SCRIPT" else str(tmp_path) if a == "FOLDER" else a for a in command
    ]
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # this Python cannot import torch\n"
        "from optimizer_codemod.cli import main\n"
        f"main({args!r})\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == (
        f"optcodemod {command[0]} needs torch: pip install torch "
        "(the build for your machine: https://pytorch.org/get-started/locally/)\n"
    )
    assert done.stdout == ""


def test_checkpoint_and_distributed_verdicts_follow_what_they_need() -> None:
    cpu, one_gpu = _machine(), _cuda_machine((9, 0))
    two_gpus = _cuda_machine((9, 0))
    two_gpus.devices.append(CudaDevice("GPU", (9, 0), 80.0))
    # A synchronous torch.save has nothing to do with the number of devices: an asynchronous
    # write pays where the device computes while the host writes.
    assert _verdicts(one_gpu)["OPT602"] == PAYS_OFF
    assert _verdicts(cpu)["OPT602"] == NO_GAIN
    [row] = [r for r in assess(cpu, all_rules()) if r["code"] == "OPT602"]
    assert "devices" not in row["why"] and "CPU" in row["why"]
    # no_sync pays wherever DDP runs several processes: GPUs, or CPU processes over gloo.
    assert _verdicts(two_gpus)["OPT601"] == _verdicts(cpu)["OPT601"] == PAYS_OFF
    assert _verdicts(one_gpu)["OPT601"] == NO_GAIN
    assert _verdicts(_machine(usable_cores=1))["OPT601"] == NO_GAIN


def test_doctor_advises_a_cpu_target_only_without_cuda() -> None:
    cpu, gpu = _machine(), _cuda_machine((9, 0))
    (line,) = advice(cpu)
    assert 'target-device = "cpu"' in line and "--target-device cpu" in line
    assert line in render(cpu, assess(cpu, all_rules())).splitlines()
    assert advice(gpu) == []
    assert "target-device" not in render(gpu, assess(gpu, all_rules()))

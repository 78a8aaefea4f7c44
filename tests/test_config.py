"""[tool.optcodemod] in pyproject.toml: every key, and errors that name the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ATTENTION_SCRIPT, FUSED_LINE, TRAINING_SCRIPT, run_cli
from optimizer_codemod import rewrite
from optimizer_codemod.config import CONFIG_KEYS, Settings, find_config, load_settings
from optimizer_codemod.errors import ConfigError
from optimizer_codemod.torch_version import TorchVersion


def project(tmp_path: Path, table: str) -> Path:
    (tmp_path / "pyproject.toml").write_text(
        f"[project]\nname = 'x'\n\n[tool.optcodemod]\n{table}\n"
    )
    source = tmp_path / "src" / "train.py"
    source.parent.mkdir(exist_ok=True)
    source.write_bytes(TRAINING_SCRIPT)
    return source


def test_nearest_pyproject_with_the_table_is_used(tmp_path: Path) -> None:
    source = project(tmp_path, 'select = ["OPT501"]\ntarget-torch = "2.3"')
    (source.parent / "pyproject.toml").write_text("[project]\nname = 'inner'\n")  # no table
    found = find_config(str(source.parent))
    assert found == tmp_path / "pyproject.toml"
    settings = load_settings(found)
    assert settings.select == ("OPT501",)
    assert settings.target_torch == TorchVersion(2, 3)
    result = run_cli(["apply", str(source)])
    assert result.exit_code == 0  # OPT501 needs target-torch 2.4
    assert source.read_bytes() == TRAINING_SCRIPT


@pytest.mark.parametrize(
    "table, words",
    [
        ('selct = ["OPT5"]', "unknown key 'selct' (did you mean 'select'?)"),
        ('select = ["OPT999"]', "select: unknown rule code or prefix 'OPT999'"),
        ('select = "OPT5"', "select: expected a list of rule codes"),
        ("unsafe-fixes = 1", "unsafe-fixes: expected true or false, got 1"),
        ("target-torch = 2.4", 'target-torch: write the version as a string, for example "2.4"'),
        ('target-torch = "latest"', "target-torch: 'latest' is not a torch version"),
        ('per-file-ignores = ["x"]', "per-file-ignores: expected a table of glob = [codes]"),
        ('per-file-ignores = {"t/*.py" = ["NOPE1"]}', "unknown rule code or prefix 'NOPE1'"),
        ("exclude = [1]", "exclude: expected a list of strings"),
        ('precision = "fp8"', "precision: expected one of 'bf16', 'fp16'"),
        ('target-device = "tpu"', "target-device: expected one of 'cuda', 'cpu', got 'tpu'"),
        ("select = [", "cannot read the configuration"),
    ],
)
def test_bad_configuration_names_the_key(tmp_path: Path, table: str, words: str) -> None:
    source = project(tmp_path, table)
    result = run_cli(["apply", str(source)])
    assert result.exit_code == 2
    assert words in result.stderr
    assert str(tmp_path / "pyproject.toml") in result.stderr
    assert source.read_bytes() == TRAINING_SCRIPT


FP16_SCRIPT = b"""import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in batches:
    loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
    loss.backward()
    optimizer.step()
"""


def test_precision_from_the_file_and_the_command_line(tmp_path: Path) -> None:
    source = project(tmp_path, 'select = ["OPT302"]\nprecision = "fp16"')
    source.write_bytes(FP16_SCRIPT)
    assert run_cli(["apply", str(source)]).exit_code == 1  # files were fixed
    text = source.read_text()
    assert "torch.autocast(device.type, dtype=torch.float16)" in text
    assert "scaler.scale(loss).backward()" in text and "scaler.update()" in text
    source.write_bytes(FP16_SCRIPT)
    assert run_cli(["apply", "--precision", "bf16", str(source)]).exit_code == 1
    text = source.read_text()
    assert "dtype=torch.bfloat16" in text and "GradScaler" not in text


def test_per_file_ignores(tmp_path: Path) -> None:
    source = project(tmp_path, '[tool.optcodemod.per-file-ignores]\n"src/*.py" = ["OPT5"]')
    other = tmp_path / "other.py"
    other.write_bytes(TRAINING_SCRIPT)
    result = run_cli(["apply", "--select", "OPT501", str(source), str(other)], cwd=tmp_path)
    assert source.read_bytes() == TRAINING_SCRIPT
    assert FUSED_LINE in other.read_bytes()
    assert result.exit_code == 1


def test_exclude_patterns_apply_to_walked_files(tmp_path: Path) -> None:
    source = project(tmp_path, 'exclude = ["src/"]')
    kept = tmp_path / "kept.py"
    kept.write_bytes(TRAINING_SCRIPT)
    result = run_cli(
        ["apply", "--check", "--output-format", "json", "--select", "OPT501", "."], cwd=tmp_path
    )
    assert json.loads(result.stdout)["changed_files"] == ["kept.py"]
    assert source.read_bytes() == TRAINING_SCRIPT


def test_command_line_overrides_configuration(tmp_path: Path) -> None:
    source = project(tmp_path, 'ignore = ["OPT501"]')
    assert run_cli(["apply", "--check", str(source)]).stdout.count("OPT501") == 0
    result = run_cli(["apply", "--check", "--select", "OPT501", str(source)])
    assert "OPT501" in result.stdout


def test_explicit_config_path(tmp_path: Path) -> None:
    config = tmp_path / "custom.toml"
    config.write_text('[tool.optcodemod]\ntarget-torch = "2.0"\n')
    source = tmp_path / "t.py"
    source.write_bytes(TRAINING_SCRIPT)
    result = run_cli(
        ["apply", "--check", "--config", str(config), "--select", "OPT501", str(source)]
    )
    assert result.exit_code == 0


def test_every_key_is_documented_in_the_configuration_reference() -> None:
    reference = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
    text = reference.read_text(encoding="utf-8")
    for key in CONFIG_KEYS:
        assert f"`{key}`" in text, f"{key} missing from docs/configuration.md"


def test_settings_from_the_python_side_raise_config_errors() -> None:
    with pytest.raises(ConfigError):
        from optimizer_codemod.config import parse_table

        parse_table({"unsafe-fixes": "yes"}, "pyproject.toml")


def test_target_device_from_the_file(tmp_path: Path) -> None:
    source = project(tmp_path, 'target-device = "cpu"')
    settings = load_settings(find_config(str(source)))
    assert settings.target_device == "cpu"
    assert settings.options_for(str(source)).target_device == "cpu"
    source.write_bytes(ATTENTION_SCRIPT)
    assert run_cli(["apply", str(source)]).exit_code == 1  # other rules still apply
    text = source.read_text()
    assert "torch.autocast(device.type" in text and "scaled_dot_product_attention" not in text
    assert "model.compile()" not in text  # OPT402 is not selected for a CPU target


def test_target_device_on_the_command_line(tmp_path: Path) -> None:
    source = tmp_path / "train.py"
    source.write_bytes(ATTENTION_SCRIPT)
    result = run_cli(["apply", "--check", "--target-device", "cpu", str(source)])
    assert "OPT302" in result.stdout  # autocast is added: the attention will run in bfloat16
    assert "OPT406" not in result.stdout and "OPT402" not in result.stdout
    result = run_cli(["apply", "--check", str(source)])  # default: tuned for CUDA
    assert "OPT406" in result.stdout and "OPT402" in result.stdout
    result = run_cli(["apply", "--check", "--target-device", "tpu", str(source)])
    assert result.exit_code == 2 and "tpu" in result.stderr
    assert source.read_bytes() == ATTENTION_SCRIPT


def test_cpu_target_fuses_attention_that_stays_in_float32() -> None:
    source = ATTENTION_SCRIPT.decode()
    alone = rewrite(source, select=["OPT406"], target_device="cpu")
    assert "scaled_dot_product_attention" in alone.source  # no autocast anywhere: fused wins
    with_autocast = source.replace(
        "    loss = model(x)",
        '    with torch.autocast("cpu", dtype=torch.bfloat16):\n        loss = model(x)',
    )
    kept = rewrite(with_autocast, select=["OPT406"], target_device="cpu")
    assert kept.source == with_autocast and not kept.diagnostics
    fused = rewrite(with_autocast, select=["OPT406"])
    assert "scaled_dot_product_attention" in fused.source
    # OPT302 selected but not allowed to apply (extend-unsafe-fixes): no autocast comes.
    settings = Settings(extend_unsafe_fixes=("OPT302",))
    rewritten = rewrite(source, select=["OPT302", "OPT406"], target_device="cpu", settings=settings)
    assert "scaled_dot_product_attention" in rewritten.source and "autocast" not in rewritten.source
    with pytest.raises(ValueError, match="target_device"):
        rewrite(source, target_device="tpu")


def test_rules_limited_to_a_device_are_not_selected_for_the_other() -> None:
    cpu = [rule.code for rule in Settings(target_device="cpu").rules_for("train.py")]
    cuda = [rule.code for rule in Settings().rules_for("train.py")]
    assert "OPT402" in cuda and "OPT402" not in cpu
    assert set(cuda) - set(cpu) == {"OPT101", "OPT201", "OPT203", "OPT301", "OPT401", "OPT402"}
    listing = run_cli(["rules"]).stdout
    (line,) = [line for line in listing.splitlines() if line.startswith("OPT402")]
    assert line.endswith("(CUDA targets only)")
    assert "CUDA targets only" not in run_cli(["explain", "OPT501"]).stdout
    assert "| Target device | CUDA targets only |" in run_cli(["explain", "OPT402"]).stdout


def test_verify_passes_the_target_device_to_the_rewrite(tmp_path: Path, monkeypatch) -> None:
    from optimizer_codemod.verify import equivalence

    seen = []

    def fake_verify_command(script, script_args, settings, echo, **options):
        seen.append(settings.options_for(script))
        return 0

    monkeypatch.setattr(equivalence, "verify_command", fake_verify_command)
    source = tmp_path / "train.py"
    source.write_bytes(ATTENTION_SCRIPT)
    assert run_cli(["verify", "--target-device", "cpu", str(source)]).exit_code == 0
    assert run_cli(["verify", str(source)]).exit_code == 0
    assert [options.target_device for options in seen] == ["cpu", "cuda"]
    assert "OPT402" not in [rule.code for rule in seen[0].rules]

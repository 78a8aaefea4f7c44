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
    assert set(cuda) - set(cpu) == {
        "OPT101",
        "OPT201",
        "OPT203",
        "OPT301",
        "OPT401",
        "OPT402",
        "OPT410",
    }
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


# --- --config: a named file must have the table; ruff's inline `key = value` form -------------


def test_a_named_config_file_without_the_table_is_an_error(tmp_path: Path) -> None:
    config = tmp_path / "pyproject.toml"
    config.write_text("[project]\nname = 'x'\n\n[tool.black]\nline-length = 100\n")
    source = tmp_path / "train.py"
    source.write_bytes(TRAINING_SCRIPT)
    result = run_cli(["apply", "--config", str(config), str(source)])
    assert result.exit_code == 2
    assert f"{config}: no [tool.optcodemod] table in this file" in result.stderr
    assert source.read_bytes() == TRAINING_SCRIPT
    # Found by walking up, the same file is simply not ours: the defaults apply.
    assert run_cli(["apply", "--check", str(source)]).exit_code == 1
    missing = run_cli(["apply", "--config", str(tmp_path / "nope.toml"), str(source)])
    assert missing.exit_code == 2 and "nope.toml: cannot read the configuration" in missing.stderr


def test_inline_config_settings_override_the_file(tmp_path: Path) -> None:
    source = project(tmp_path, 'target-device = "cpu"')
    source.write_bytes(ATTENTION_SCRIPT)
    from_file = run_cli(["apply", "--check", str(source)])
    assert "OPT302" in from_file.stdout and "OPT406" not in from_file.stdout
    inline = run_cli(["apply", "--check", "--config", "target-device='cuda'", str(source)])
    assert "OPT406" in inline.stdout and "OPT402" in inline.stdout
    both = run_cli(
        [
            "apply",
            "--check",
            "--config",
            str(tmp_path / "pyproject.toml"),
            "--config",
            "select = ['OPT406']",
            "--config",
            "target-device = 'cuda'",
            str(source),
        ]
    )
    assert both.exit_code == 1, both.output
    assert {line.split()[1] for line in both.stdout.splitlines() if ": OPT" in line} == {"OPT406"}
    assert source.read_bytes() == ATTENTION_SCRIPT


@pytest.mark.parametrize(
    "setting, words",
    [
        ("target-device='tpu'", "target-device: expected one of 'cuda', 'cpu', got 'tpu'"),
        ("selct = ['OPT5']", "unknown key 'selct' (did you mean 'select'?)"),
        ("target-device = ", "not an existing file, nor a TOML `key = value` setting"),
    ],
)
def test_bad_inline_config_names_the_setting(tmp_path: Path, setting: str, words: str) -> None:
    source = tmp_path / "train.py"
    source.write_bytes(TRAINING_SCRIPT)
    result = run_cli(["apply", "--config", setting, str(source)])
    assert result.exit_code == 2
    assert f"--config {setting!r}: " in result.stderr and words in result.stderr
    assert source.read_bytes() == TRAINING_SCRIPT


def test_at_most_one_config_file(tmp_path: Path) -> None:
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    for config in (first, second):
        config.write_text("[tool.optcodemod]\n")
    result = run_cli(["apply", "--config", str(first), "--config", str(second), str(tmp_path)])
    assert result.exit_code == 2 and "at most one is allowed" in result.stderr


def test_verify_takes_inline_config_too(tmp_path: Path, monkeypatch) -> None:
    from optimizer_codemod.verify import equivalence

    seen = []
    monkeypatch.setattr(
        equivalence,
        "verify_command",
        lambda script, args, settings, echo, **options: seen.append(settings) or 0,
    )
    source = tmp_path / "train.py"
    source.write_bytes(ATTENTION_SCRIPT)
    assert run_cli(["verify", "--config", "target-device='cpu'", str(source)]).exit_code == 0
    assert seen[0].target_device == "cpu"


def test_extend_ignore_in_the_file_and_on_the_command_line(tmp_path: Path) -> None:
    source = project(tmp_path, 'extend-ignore = ["OPT501"]')
    assert "OPT501" not in run_cli(["apply", "--check", str(source)]).stdout
    source = project(tmp_path, "")
    flagged = run_cli(["apply", "--check", "--extend-ignore", "OPT5", str(source)])
    assert "OPT501" not in flagged.stdout
    assert "OPT301" in flagged.stdout  # the rest of the selection still runs


# --- force-exclude: `exclude` for files named on the command line (pre-commit) ---------------


def _excluded_project(tmp_path: Path, table: str) -> tuple:
    source = project(tmp_path, table)
    experiment = tmp_path / "experiments" / "try.py"
    experiment.parent.mkdir()
    experiment.write_bytes(TRAINING_SCRIPT)
    return source, experiment


def test_named_files_ignore_exclude_unless_force_exclude(tmp_path: Path) -> None:
    source, experiment = _excluded_project(tmp_path, 'exclude = ["experiments/"]')
    named = ["apply", "--check", "--select", "OPT501", "--output-format", "json"]
    files = ["src/train.py", "experiments/try.py"]
    plain = json.loads(run_cli([*named, *files], cwd=tmp_path).stdout)
    assert plain["changed_files"] == files  # as black and ruff do without force-exclude
    forced = json.loads(run_cli([*named, "--force-exclude", *files], cwd=tmp_path).stdout)
    assert forced["changed_files"] == ["src/train.py"]
    alone = run_cli(["apply", "--force-exclude", "experiments/try.py"], cwd=tmp_path)
    assert alone.exit_code == 0, alone.output
    assert experiment.read_bytes() == TRAINING_SCRIPT


def test_force_exclude_from_the_file_and_no_force_exclude(tmp_path: Path) -> None:
    source, experiment = _excluded_project(
        tmp_path, 'exclude = ["experiments/"]\nforce-exclude = true'
    )
    result = run_cli(["apply", "-v", str(experiment), str(source)], cwd=tmp_path)
    assert result.exit_code == 1
    assert experiment.read_bytes() == TRAINING_SCRIPT and FUSED_LINE in source.read_bytes()
    assert (
        f"skipped {experiment}: force-exclude: matches exclude pattern 'experiments/'"
        in result.stderr
    )
    assert run_cli(["apply", "--no-force-exclude", str(experiment)]).exit_code == 1
    assert FUSED_LINE in experiment.read_bytes()


def test_force_exclude_skips_named_files_in_folders_always_skipped(tmp_path: Path) -> None:
    source = project(tmp_path, "force-exclude = true")
    vendored = tmp_path / ".venv" / "lib" / "train.py"
    vendored.parent.mkdir(parents=True)
    vendored.write_bytes(TRAINING_SCRIPT)
    result = run_cli(["apply", str(vendored), str(source)], cwd=tmp_path)
    assert result.exit_code == 1
    assert vendored.read_bytes() == TRAINING_SCRIPT and FUSED_LINE in source.read_bytes()


def test_force_exclude_passes_excluded_stdin_through(tmp_path: Path) -> None:
    _excluded_project(tmp_path, 'exclude = ["experiments/"]\nforce-exclude = true')
    result = run_cli(
        ["apply", "-", "--stdin-filename", "experiments/try.py"],
        stdin=TRAINING_SCRIPT,
        cwd=tmp_path,
    )
    assert result.exit_code == 0 and result.stdout_bytes == TRAINING_SCRIPT
    kept = run_cli(
        ["apply", "-", "--stdin-filename", "src/train.py"], stdin=TRAINING_SCRIPT, cwd=tmp_path
    )
    assert kept.exit_code == 1 and FUSED_LINE in kept.stdout_bytes


def test_the_repository_itself_has_nothing_to_change() -> None:
    # Its pyproject.toml excludes the deliberately slow code (fixtures, reference workloads,
    # the example): `optcodemod apply` with no path, run here, must change nothing.
    root = Path(__file__).resolve().parent.parent
    result = run_cli(["apply", "--check", "--output-format", "json"], cwd=root)
    document = json.loads(result.stdout)
    assert (document["changed_files"], document["errors"]) == ([], []), result.stderr
    assert result.exit_code == 0
    # As the pre-commit hook names them (it passes --force-exclude), excluded files stay out;
    # named without it, as in the README's first command, the example is still rewritten.
    named = ["examples/train.py", "fixtures/OPT501/fix_adamw_in_training_loop.py"]
    assert all((root / name).is_file() for name in named)
    forced = run_cli(["apply", "--check", "--force-exclude", *named], cwd=root)
    assert forced.exit_code == 0 and "Nothing to change." in forced.stdout, forced.output
    assert run_cli(["apply", "--check", "examples/train.py"], cwd=root).exit_code == 1

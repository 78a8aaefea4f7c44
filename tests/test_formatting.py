"""Changed lines follow the project's black configuration; every other line stays as it was."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import run_cli
from optimizer_codemod.formatting import (
    black_style_for_directory,
    changed_line_ranges,
    wrap_long_calls,
)

# Deliberately not black-formatted outside the optimizer line: those lines must survive as-is.
SCRIPT = """import torch
model = torch.nn.Linear( 4,2 )
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, betas=(0.9, 0.95))
for step in range(3):
    loss = model(torch.randn(8,4)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
WRAPPED = """optimizer = torch.optim.AdamW(
    model.parameters(), lr=1e-3, weight_decay=0.01, betas=(0.9, 0.95), fused=True
)
"""
EXPLODED = """optimizer = torch.optim.AdamW(
    model.parameters(),
    lr=1e-3,
    weight_decay=0.01,
    betas=(0.9, 0.95),
    fused=True,
)
"""
ONE_LINE = (
    "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, "
    "betas=(0.9, 0.95), fused=True)\n"
)


def _project(tmp_path: Path, pyproject: str) -> Path:
    black_style_for_directory.cache_clear()
    (tmp_path / "pyproject.toml").write_text(pyproject)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return script


def test_black_project_gets_changed_lines_formatted_and_nothing_else(tmp_path: Path) -> None:
    script = _project(tmp_path, "[tool.black]\nline-length = 100\n")
    result = run_cli(["apply", str(script), "--select", "OPT501"])
    assert result.exit_code == 1, result.output
    text = script.read_text()
    assert WRAPPED in text  # 111 characters would exceed 100: black wrapped the statement
    assert max(len(line) for line in WRAPPED.splitlines()) <= 100
    assert "model = torch.nn.Linear( 4,2 )\n" in text  # unformatted and untouched
    assert "    loss = model(torch.randn(8,4)).sum()\n" in text
    assert text == SCRIPT.replace(ONE_LINE.replace(", fused=True", ""), WRAPPED)
    again = run_cli(["apply", str(script), "--select", "OPT501"])
    assert again.exit_code == 0 and script.read_text() == text


def test_black_line_length_from_the_configuration_is_used(tmp_path: Path) -> None:
    script = _project(tmp_path, "[tool.black]\nline-length = 120\n")
    run_cli(["apply", str(script), "--select", "OPT501"])
    assert ONE_LINE in script.read_text()  # fits in 120: black leaves it on one line


def test_without_black_a_call_made_too_long_gets_one_argument_per_line(tmp_path: Path) -> None:
    script = _project(tmp_path, "[tool.ruff]\nline-length = 100\n")
    run_cli(["apply", str(script), "--select", "OPT501"])
    text = script.read_text()
    # 110 characters exceed both 88 and the original's longest line (97): black's layout.
    assert text == SCRIPT.replace(ONE_LINE.replace(", fused=True", ""), EXPLODED)


def test_without_black_a_file_written_wide_keeps_its_width() -> None:
    wide = "x = 1  # " + "w" * 120 + "\n"
    old = wide + "opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)\n"
    new = old.replace("0.01)", "0.01, fused=True)")
    assert wrap_long_calls(old, new) == new


def test_wrapping_keeps_newlines_and_leaves_generator_arguments_alone() -> None:
    head = "import torch\r\n"
    long_call = "total = sum(x * weight_for_each_item_in_the_batch for x in values_with_long_names_for_this)"
    old = head + "y = f(a)\r\n" + long_call + "\r\n"
    new = old.replace("f(a)", "f(a, " + "b" * 90 + "=1)").replace("this)", "this_one)")
    wrapped = wrap_long_calls(old, new)
    assert "y = f(\r\n    a,\r\n    " + "b" * 90 + "=1,\r\n)\r\n" in wrapped
    assert long_call.replace("this)", "this_one)") in wrapped  # `sum(... for ...)` unchanged


def test_black_settings_are_read_from_the_nearest_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.black]\nline-length = 79\ntarget-version = ["py310"]\n'
        "skip-string-normalization = true\n"
    )
    nested = tmp_path / "src" / "pkg"
    nested.mkdir(parents=True)
    black_style_for_directory.cache_clear()
    style = black_style_for_directory(str(nested))
    assert style.line_length == 79
    assert style.target_versions == ("PY310",)
    assert style.string_normalization is False


def test_changed_line_ranges_are_those_of_the_new_text() -> None:
    old = "a\nb\nc\n"
    new = "a\nB\nc\nd\ne\n"
    assert changed_line_ranges(old, new) == [(2, 2), (4, 5)]


def test_files_black_excludes_are_not_formatted(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.black]\nline-length = 100\nextend-exclude = "^/generated/"\n'
    )
    black_style_for_directory.cache_clear()
    generated = tmp_path / "generated"
    generated.mkdir()
    script = generated / "train.py"
    script.write_text(SCRIPT)
    run_cli(["apply", str(script), "--select", "OPT501"])
    assert EXPLODED in script.read_text()  # optcodemod's own layout, not black's at 100


def test_black_configured_but_not_installed_keeps_the_fix_and_says_so(
    tmp_path: Path, monkeypatch
) -> None:
    script = _project(tmp_path, "[tool.black]\nline-length = 100\n")
    monkeypatch.setitem(sys.modules, "black", None)  # makes `import black` raise ImportError
    result = run_cli(["apply", str(script), "--select", "OPT501"])
    assert result.exit_code == 1
    assert EXPLODED in script.read_text()  # optcodemod's own layout instead
    assert "configures black, but black is not installed" in result.stderr

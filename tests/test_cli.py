"""The command line as users meet it: options, exit codes, reports, bad input, nothing lost."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FUSED_LINE, TRAINING_SCRIPT, run_cli
from optimizer_codemod.registry import all_rules

ONLY_FUSED = ["--select", "OPT501"]


def test_apply_rewrites_in_place_and_exits_1(script: Path) -> None:
    result = run_cli(["apply", str(script), *ONLY_FUSED])
    assert result.exit_code == 1
    assert FUSED_LINE in script.read_bytes()
    assert f"{script}:4:13: OPT501 [numerics]" in result.stdout
    assert "Fixed 1 finding in 1 file." in result.stdout


def test_second_apply_changes_nothing_and_exits_0(script: Path) -> None:
    run_cli(["apply", str(script)])
    first = script.read_bytes()
    stat_before = script.stat()
    result = run_cli(["apply", str(script)])
    assert result.exit_code == 0, result.output
    assert script.read_bytes() == first
    assert script.stat().st_mtime_ns == stat_before.st_mtime_ns  # not even rewritten
    assert "Nothing to change." in result.stdout


def test_check_reports_without_writing(script: Path) -> None:
    result = run_cli(["apply", "--check", str(script), *ONLY_FUSED])
    assert result.exit_code == 1
    assert script.read_bytes() == TRAINING_SCRIPT
    assert "Would fix 1 finding in 1 file." in result.stdout
    assert "(fix: Add `fused=True`)" in result.stdout


def test_diff_prints_a_patch_on_stdout_and_report_on_stderr(script: Path, tmp_path: Path) -> None:
    result = run_cli(["apply", "--diff", "train.py", *ONLY_FUSED], cwd=tmp_path)
    assert result.exit_code == 1
    assert script.read_bytes() == TRAINING_SCRIPT
    assert result.stdout.startswith("--- a/train.py\n+++ b/train.py\n@@")
    assert "+" + FUSED_LINE.decode() in result.stdout.splitlines()
    assert "Would fix 1 finding" in result.stderr
    patched = subprocess.run(
        ["git", "apply", "--check", "-"],
        input=result.stdout.encode(),
        cwd=tmp_path,
        capture_output=True,
    )
    assert patched.returncode == 0, patched.stderr


def test_a_diff_of_a_file_without_its_last_newline_applies(script: Path, tmp_path: Path) -> None:
    """The rewritten line is the file's last and has no newline: the diff marks it as git
    does (`\\ No newline at end of file`), or `git apply` and `patch` refuse the hunk."""
    lines = TRAINING_SCRIPT.splitlines()
    fused_at = next(i for i, line in enumerate(lines) if b"torch.optim" in line)
    script.write_bytes(b"\n".join(lines[: fused_at + 1]))
    result = run_cli(["apply", "--diff", "train.py", *ONLY_FUSED], cwd=tmp_path)
    assert result.exit_code == 1
    assert result.stdout.count("\n\\ No newline at end of file\n") == 2  # old and new line
    patched = subprocess.run(
        ["git", "apply", "-"], input=result.stdout.encode(), cwd=tmp_path, capture_output=True
    )
    assert patched.returncode == 0, patched.stderr
    assert script.read_bytes().endswith(FUSED_LINE.rstrip(b"\n"))
    again = run_cli(["apply", "--diff", "train.py", *ONLY_FUSED], cwd=tmp_path)
    assert again.exit_code == 0 and again.stdout == ""


def test_report_counts_fixes_that_need_unsafe_fixes(script: Path) -> None:
    script.write_bytes(TRAINING_SCRIPT.replace(b"zero_grad()", b"zero_grad(set_to_none=False)"))
    only_zero_grad = ["--select", "OPT502"]
    held_back = run_cli(["apply", "--check", str(script), *only_zero_grad])
    assert held_back.exit_code == 0, held_back.output
    assert "1 more fix available with --unsafe-fixes" in held_back.stdout
    assert "OPT502 [behavior]" in held_back.stdout
    applied = run_cli(["apply", str(script), "--unsafe-fixes", *only_zero_grad])
    assert applied.exit_code == 1
    assert b"optimizer.zero_grad()\n" in script.read_bytes()
    assert "more fix" not in applied.stdout


def test_clean_file_exits_0(tmp_path: Path) -> None:
    path = tmp_path / "clean.py"
    path.write_text("import torch\nopt = torch.optim.AdamW(p, fused=True)\n")
    result = run_cli(["apply", "--check", str(path), *ONLY_FUSED])
    assert result.exit_code == 0
    assert "Nothing to change." in result.stdout


def test_stdin_to_stdout() -> None:
    result = run_cli(["apply", "-", *ONLY_FUSED], stdin=TRAINING_SCRIPT)
    assert result.exit_code == 1
    assert result.stdout_bytes == TRAINING_SCRIPT.replace(b"lr=1e-3)", b"lr=1e-3, fused=True)")
    assert "-:4:13: OPT501" in result.stderr


def test_stdin_with_a_syntax_error_echoes_the_input(tmp_path: Path) -> None:
    broken = b"import torch\nopt = torch.optim.Adam(\n"
    result = run_cli(["apply", "-", "--stdin-filename", "x.py"], stdin=broken)
    assert result.exit_code == 2
    assert result.stdout_bytes == broken
    assert "x.py:2:23: cannot parse" in result.stderr


def test_select_ignore_and_extend_select_by_prefix(script: Path) -> None:
    ignored = run_cli(["apply", "--check", str(script), "--select", "OPT5", "--ignore", "OPT501"])
    assert "OPT501" not in ignored.stdout
    more_specific_select_wins = run_cli(
        ["apply", "--check", str(script), "--select", "OPT501", "--ignore", "OPT5"]
    )
    assert "OPT501" in more_specific_select_wins.stdout
    extended = run_cli(
        ["apply", "--check", str(script), "--select", "OPT8", "--extend-select", "OPT501"]
    )
    assert "OPT501" in extended.stdout


def test_unknown_code_is_a_usage_error(script: Path) -> None:
    result = run_cli(["apply", str(script), "--select", "OPT5O1"])
    assert result.exit_code == 2
    assert "unknown rule code or prefix 'OPT5O1'" in result.stderr
    assert script.read_bytes() == TRAINING_SCRIPT


def test_target_torch_disables_rules_that_need_newer_torch(script: Path) -> None:
    result = run_cli(["apply", "--check", str(script), "--target-torch", "2.3", *ONLY_FUSED])
    assert result.exit_code == 0
    bad = run_cli(["apply", "--check", str(script), "--target-torch", "two"])
    assert bad.exit_code == 2 and "is not a torch version" in bad.stderr


def test_json_output_carries_safety_and_status(script: Path) -> None:
    result = run_cli(["apply", "--check", "--output-format", "json", str(script), *ONLY_FUSED])
    document = json.loads(result.stdout)
    [finding] = document["findings"]
    assert finding["code"] == "OPT501"
    assert finding["safety"] == "numerics"
    assert finding["status"] == "fixable"  # --check writes nothing: not "fixed"
    assert finding["location"] == {"row": 4, "column": 13}
    assert document["changed_files"] == [str(script)]
    assert document["written"] is False
    assert document["summary"] == {"fixable": 1}
    written = run_cli(["apply", "--output-format", "json", str(script), *ONLY_FUSED])
    [finding] = json.loads(written.stdout)["findings"]
    assert finding["status"] == "fixed" and FUSED_LINE in script.read_bytes()


def test_statistics_counts_per_rule(script: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.py"
    other.write_bytes(TRAINING_SCRIPT)
    result = run_cli(["apply", "--check", "--statistics", str(tmp_path), *ONLY_FUSED])
    line = next(l for l in result.stdout.splitlines() if "OPT501" in l and "optimizer" in l)
    assert line.split()[:2] == ["2", "2"]


def test_syntax_error_is_reported_others_still_processed(script: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken_text = b"import torch\nopt = torch.optim.Adam(\n"
    broken.write_bytes(broken_text)
    result = run_cli(["apply", str(broken), str(script), *ONLY_FUSED])
    assert result.exit_code == 2
    assert f"{broken}:2:23: cannot parse: '(' was never closed" in result.stderr
    assert broken.read_bytes() == broken_text
    assert FUSED_LINE in script.read_bytes()


def test_syntax_error_without_any_training_pattern_is_still_reported(
    script: Path, tmp_path: Path
) -> None:
    # No rule's trigger text: the pre-filter settles the file, but its syntax is still checked.
    bad = tmp_path / "bad.py"
    bad_text = b"import os\n\nx = = 1\n"
    bad.write_bytes(bad_text)
    alone = run_cli(["apply", str(bad)])
    assert alone.exit_code == 2, alone.output
    assert f"{bad}:3:5: cannot parse: invalid syntax" in alone.stderr
    assert "1 file could not be processed." in alone.stdout
    with_others = run_cli(["apply", str(bad), str(script), *ONLY_FUSED])
    assert with_others.exit_code == 2
    assert bad.read_bytes() == bad_text
    assert FUSED_LINE in script.read_bytes()  # the other file is still rewritten


def test_syntax_error_in_a_notebook_without_training_pattern_names_the_cell(
    tmp_path: Path,
) -> None:
    cells = [
        {"cell_type": "code", "metadata": {}, "source": ["%matplotlib inline\n", "import os\n"]},
        {"cell_type": "code", "metadata": {}, "source": ["x = 1\n", "def f(:\n", "    pass\n"]},
    ]
    notebook = tmp_path / "bad.ipynb"
    notebook.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4}))
    result = run_cli(["apply", str(notebook)])
    assert result.exit_code == 2, result.output
    assert f"{notebook}:cell 2:2:7: cannot parse" in result.stderr


def test_stdin_syntax_error_without_training_pattern_exits_2() -> None:
    broken = b"print('hi'\n"
    result = run_cli(["apply", "-", "--stdin-filename", "x.py"], stdin=broken)
    assert result.exit_code == 2
    assert result.stdout_bytes == broken
    assert "x.py:1:6: cannot parse" in result.stderr


def test_files_without_training_pattern_are_checked_by_compile_not_libcst(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import libcst

    def no_libcst(*args, **kwargs):
        raise AssertionError("a file without trigger text was parsed by LibCST")

    monkeypatch.setattr(libcst, "parse_module", no_libcst)
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("import os\nprint(os.sep)\n")
    bad.write_text("import os\nprint(os.sep\n")
    assert run_cli(["apply", str(good)]).exit_code == 0
    result = run_cli(["apply", str(good), str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:2:6: cannot parse: '(' was never closed" in result.stderr


def test_non_utf8_without_cookie_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "latin.py"
    data = b"import torch\nopt = torch.optim.Adam(p)  # caf\xe9\n"
    path.write_bytes(data)
    result = run_cli(["apply", str(path)])
    assert result.exit_code == 2
    assert f"{path}:2:33: cannot decode as utf-8: byte 0xe9 is invalid" in result.stderr
    assert "PEP 263" in result.stderr
    assert path.read_bytes() == data


def test_empty_file_is_a_warning_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.py"
    path.write_bytes(b"")
    result = run_cli(["apply", str(path)])
    assert result.exit_code == 0
    assert f"{path}: empty file, nothing to do" in result.stderr


def test_read_only_file_is_not_replaced(script: Path, monkeypatch) -> None:
    script.chmod(0o444)
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if mode == os.W_OK else real_access(p, mode)
    )
    result = run_cli(["apply", str(script)])
    assert result.exit_code == 2
    assert f"{script}: file is read-only; not rewritten" in result.stderr
    assert script.read_bytes() == TRAINING_SCRIPT
    assert stat.S_IMODE(script.stat().st_mode) == 0o444


def test_file_mode_is_kept_and_no_temporary_file_is_left(script: Path) -> None:
    script.chmod(0o751)
    run_cli(["apply", str(script)])
    assert stat.S_IMODE(script.stat().st_mode) == 0o751
    assert sorted(p.name for p in script.parent.iterdir()) == ["train.py"]


def test_missing_path_is_an_error_but_others_run(script: Path, tmp_path: Path) -> None:
    result = run_cli(["apply", str(tmp_path / "nope.py"), str(script), *ONLY_FUSED])
    assert result.exit_code == 2
    assert f"{tmp_path / 'nope.py'}: no such file or directory" in result.stderr
    assert FUSED_LINE in script.read_bytes()


def test_directory_argument_is_walked(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    nested = tmp_path / "pkg" / "sub" / "train.py"
    nested.write_bytes(TRAINING_SCRIPT)
    (tmp_path / "pkg" / "notes.txt").write_bytes(TRAINING_SCRIPT)
    result = run_cli(["apply", str(tmp_path / "pkg"), *ONLY_FUSED])
    assert result.exit_code == 1
    assert FUSED_LINE in nested.read_bytes()
    assert (tmp_path / "pkg" / "notes.txt").read_bytes() == TRAINING_SCRIPT


def test_directory_without_sources_says_so(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = run_cli(["apply", str(tmp_path / "empty")])
    assert result.exit_code == 0
    assert "no Python files or notebooks found" in result.stderr


def test_gitignore_and_default_excludes_are_respected(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".gitignore").write_text("generated/\nscratch_*.py\n")
    for relative in ["generated/a.py", "scratch_b.py", ".venv/c.py", "keep/d.py"]:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(TRAINING_SCRIPT)
    result = run_cli(
        ["apply", "--check", "--output-format", "json", ".", *ONLY_FUSED], cwd=tmp_path
    )
    assert json.loads(result.stdout)["changed_files"] == ["keep/d.py"]


def test_skip_file_comment(tmp_path: Path) -> None:
    path = tmp_path / "t.py"
    path.write_bytes(b"# optcodemod: skip-file\n" + TRAINING_SCRIPT)
    result = run_cli(["apply", str(path)])
    assert result.exit_code == 0
    assert path.read_bytes().endswith(TRAINING_SCRIPT)


def test_jobs_runs_worker_processes(tmp_path: Path, monkeypatch) -> None:
    from optimizer_codemod import runner

    monkeypatch.setattr(runner, "PARALLEL_THRESHOLD_BYTES", 0)
    for index in range(4):
        (tmp_path / f"t{index}.py").write_bytes(TRAINING_SCRIPT)
    result = run_cli(["apply", "--jobs", "2", str(tmp_path), *ONLY_FUSED])
    assert result.exit_code == 1
    assert all(FUSED_LINE in p.read_bytes() for p in tmp_path.glob("t*.py"))
    assert result.stdout.count("OPT501") == 4


def test_rules_and_explain() -> None:
    table = run_cli(["rules"])
    assert table.exit_code == 0
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["code", "name", "safety", "torch", "summary"]
    by_code = {row.split()[0]: row.split(maxsplit=4) for row in rows}
    assert by_code["OPT501"][:4] == ["OPT501", "optimizer-without-fused-kernel", "numerics", "2.4"]
    assert sorted(by_code) == sorted(rule.code for rule in all_rules())
    page = run_cli(["explain", "opt501"])
    assert page.stdout.startswith("# OPT501: optimizer-without-fused-kernel")
    for heading in ("What it does", "Why is it slow", "Example", "Fix safety", "Expected gain"):
        assert f"## {heading}" in page.stdout
    unknown = run_cli(["explain", "OPT000"])
    assert unknown.exit_code == 2 and "unknown rule code" in unknown.stderr


def test_no_progress_bar_when_not_a_terminal(tmp_path: Path) -> None:
    for index in range(3):
        (tmp_path / f"t{index}.py").write_bytes(TRAINING_SCRIPT)
    result = run_cli(["apply", "--check", str(tmp_path), *ONLY_FUSED])
    assert "optcodemod [" not in result.stderr and "%" not in result.stderr


def test_progress_bar_and_colour_on_a_terminal(tmp_path: Path) -> None:
    import pty

    for index in range(3):
        (tmp_path / f"t{index}.py").write_bytes(TRAINING_SCRIPT)
    leader, follower = pty.openpty()
    done = subprocess.run(
        [sys.executable, "-m", "optimizer_codemod", "apply", "--diff", ".", *ONLY_FUSED],
        cwd=tmp_path,
        stdout=follower,
        stderr=follower,
        timeout=120,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal is closed once everything is read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    shown = b"".join(chunks).decode()
    assert done.returncode == 1
    assert "optcodemod" in shown and "100%" in shown  # click's progress bar
    assert "\x1b[32m+" in shown  # added lines in green


def test_colour_is_off_when_piped_and_on_when_asked(script: Path) -> None:
    piped = run_cli(["apply", "--diff", str(script), *ONLY_FUSED])
    assert "\x1b[" not in piped.stdout
    forced = run_cli(["apply", "--diff", "--color", "always", str(script), *ONLY_FUSED])
    assert "\x1b[32m+" in forced.stdout


def test_apply_never_imports_torch(tmp_path: Path) -> None:
    path = tmp_path / "t.py"
    path.write_bytes(TRAINING_SCRIPT)
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # any import of torch now raises ImportError\n"
        "from optimizer_codemod.cli import main\n"
        f"main(['apply', {str(path)!r}], standalone_mode=False)\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.returncode == 1, completed.stderr  # 1: the file was rewritten
    assert FUSED_LINE in path.read_bytes()


def test_console_script_entry_point(tmp_path: Path) -> None:
    path = tmp_path / "t.py"
    path.write_bytes(TRAINING_SCRIPT)
    completed = subprocess.run(
        [sys.executable, "-m", "optimizer_codemod", "apply", "--check", str(path)],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 1, completed.stderr
    assert "OPT501" in completed.stdout


# --- ruff's conventions: --show-fixes, --exit-zero, -v, NO_COLOR/FORCE_COLOR, no path ----------


def test_show_fixes_enumerates_the_fixes_per_file_and_rule(script: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.py"
    other.write_bytes(TRAINING_SCRIPT)
    checked = run_cli(["apply", "--check", "--show-fixes", ".", *ONLY_FUSED], cwd=tmp_path)
    assert checked.stdout.endswith(
        "Would fix 2 findings:\n"
        "- other.py:\n    1 × OPT501 (optimizer-without-fused-kernel)\n"
        "- train.py:\n    1 × OPT501 (optimizer-without-fused-kernel)\n"
    )
    assert script.read_bytes() == TRAINING_SCRIPT
    written = run_cli(["apply", "--show-fixes", "train.py", *ONLY_FUSED], cwd=tmp_path)
    assert "Fixed 1 finding:\n- train.py:\n    1 × OPT501" in written.stdout
    again = run_cli(["apply", "--show-fixes", "train.py", *ONLY_FUSED], cwd=tmp_path)
    assert again.stdout.endswith("No fixes made.\n")
    as_json = run_cli(
        ["apply", "--check", "--show-fixes", "--output-format", "json", "other.py", *ONLY_FUSED],
        cwd=tmp_path,
    )
    assert json.loads(as_json.stdout)["findings"]  # stdout stays one JSON document
    assert "Would fix 1 finding:" in as_json.stderr


def test_exit_zero_is_0_on_changes_and_still_2_on_errors(script: Path, tmp_path: Path) -> None:
    changed = run_cli(["apply", "--exit-zero", str(script), *ONLY_FUSED])
    assert changed.exit_code == 0 and FUSED_LINE in script.read_bytes()
    script.write_bytes(TRAINING_SCRIPT)
    assert run_cli(["apply", "--check", "--exit-zero", str(script)]).exit_code == 0
    missing = run_cli(["apply", "--exit-zero", str(tmp_path / "nope.py")])
    assert missing.exit_code == 2
    piped = run_cli(["apply", "-", "--exit-zero", *ONLY_FUSED], stdin=TRAINING_SCRIPT)
    assert piped.exit_code == 0 and FUSED_LINE in piped.stdout_bytes


def test_verbose_names_the_settings_and_every_skipped_file(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / ".git").mkdir(parents=True)
    (root / ".gitignore").write_text("generated/\n")
    (root / "pyproject.toml").write_text('[tool.optcodemod]\nexclude = ["old_*.py"]\n')
    files = {
        "train.py": TRAINING_SCRIPT,
        "old_train.py": TRAINING_SCRIPT,
        "generated/a.py": TRAINING_SCRIPT,
        ".venv/b.py": TRAINING_SCRIPT,
        "utils.py": b"import os\n",
        "vendored.py": b"# optcodemod: skip-file\n" + TRAINING_SCRIPT,
    }
    for relative, content in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(content)
    result = run_cli(["apply", "--check", "-v", "--config", "precision='fp16'"], cwd=root)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert f"settings: {root / 'pyproject.toml'} [tool.optcodemod]" in lines
    assert "settings: --config \"precision='fp16'\"" in lines
    assert "skipped .venv/: a folder always skipped" in lines
    assert f"skipped generated/: ignored by {root / '.gitignore'}" in lines
    assert "skipped old_train.py: matches exclude pattern 'old_*.py'" in lines
    assert "skipped utils.py: no pattern any selected rule looks for" in lines
    assert "skipped vendored.py: # optcodemod: skip-file" in lines
    assert "skipped train.py" not in result.stderr
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "t.py").write_bytes(b"import os\n")
    alone = run_cli(["apply", "--check", "-v", "t.py"], cwd=bare)
    expected = "settings: defaults (no pyproject.toml with [tool.optcodemod] at or above t.py)"
    assert expected in alone.stderr.splitlines()
    quiet = run_cli(["apply", "--check", "."], cwd=root)
    assert "skipped" not in quiet.stderr and "settings:" not in quiet.stderr


@pytest.mark.parametrize(
    "env, option, coloured",
    [
        ({}, "auto", False),  # a pipe
        ({"FORCE_COLOR": "1"}, "auto", True),
        ({"NO_COLOR": "1"}, "always", True),  # the command line wins over the environment
        ({"NO_COLOR": "1", "FORCE_COLOR": "1"}, "auto", False),
        ({"NO_COLOR": "", "FORCE_COLOR": "1"}, "auto", True),  # empty means unset
        ({"FORCE_COLOR": "1"}, "never", False),
    ],
)
def test_no_color_and_force_color(script: Path, monkeypatch, env, option, coloured) -> None:
    for name in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = run_cli(["apply", "--diff", "--color", option, str(script), *ONLY_FUSED])
    assert ("\x1b[32m+" in result.stdout) is coloured


def test_no_color_wins_on_a_terminal_too(monkeypatch) -> None:
    from optimizer_codemod.cli import use_color

    class Terminal:
        def isatty(self) -> bool:
            return True

    assert use_color("auto", Terminal())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color("auto", Terminal())


def test_apply_without_a_path_works_on_the_current_folder(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    nested = tmp_path / "pkg" / "train.py"
    nested.write_bytes(TRAINING_SCRIPT)
    result = run_cli(["apply", *ONLY_FUSED], cwd=tmp_path)
    assert result.exit_code == 1, result.output
    assert FUSED_LINE in nested.read_bytes()
    assert "pkg/train.py:4:13: OPT501" in result.stdout

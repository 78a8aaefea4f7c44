"""Changed lines follow the project's black configuration; every other line stays as it was."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
    # 110 characters exceed both 88 and the original's longest line (97): black's layout,
    # the arguments hugged on one line since they fit there.
    assert text == SCRIPT.replace(ONE_LINE.replace(", fused=True", ""), WRAPPED)


def test_without_black_a_file_written_wide_keeps_its_width() -> None:
    wide = "x = f(" + ", ".join(f"argument_{n}" for n in range(10)) + ")\n"  # 120 columns
    old = wide + "opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)\n"
    new = old.replace("0.01)", "0.01, fused=True)")
    assert wrap_long_calls(old, new) == new


PACKED_OLD = (
    "def main(args):\n"
    "    train_loader = torch.utils.data.DataLoader(\n"
    "        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),\n"
    "        num_workers=args.workers, pin_memory=True, sampler=train_sampler)\n"
)


def test_arguments_packed_several_to_a_line_continue_on_a_new_line_when_too_long() -> None:
    """SimSiam's style: a keyword that no longer fits on the call's last line starts the
    next one, at that line's indentation (black would put every argument on its own)."""
    new = PACKED_OLD.replace("sampler)", "sampler, persistent_workers=True)")
    wrapped = wrap_long_calls(PACKED_OLD, new)
    assert wrapped == PACKED_OLD.replace("sampler)", "sampler,\n        persistent_workers=True)")
    short = PACKED_OLD.replace("sampler)", "sampler, timeout=9)")
    assert wrap_long_calls(PACKED_OLD, short) == short  # still fits: left as it is
    commented = new.replace("(train_sampler is None),", "(train_sampler is None),  # one")
    assert (
        wrap_long_calls(PACKED_OLD.replace("None),", "None),  # one"), commented).count(
            "persistent_workers"
        )
        == 1
    )


@pytest.mark.parametrize(
    "long_line",
    [
        '"""' + "A docstring line that black leaves as long as it is written." * 2 + '"""',
        "# " + "a comment black leaves as long as it is written." * 2,
        "x = 1  # " + "w" * 120,
        'message = "' + "a string black cannot split " * 4 + '"',
    ],
)
def test_long_comments_and_strings_do_not_widen_the_limit(long_line: str) -> None:
    import black

    old = (
        long_line + "\n\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)\n"
    )
    new = old.replace("0.01)", "0.01, betas=(0.9, 0.95), fused=True)")
    wrapped = wrap_long_calls(old, new)
    assert wrapped != new
    assert black.format_str(wrapped, mode=black.Mode()) == wrapped


def test_a_lone_argument_still_too_long_gets_no_trailing_comma() -> None:
    import black

    old = 'for epoch in range(3):\n    print(f"epoch {epoch}: {100.0 * correct / seen:.2f}%")\n'
    new = old.replace('%")', '% ({correct} of {seen}), a longer message than before")')
    wrapped = wrap_long_calls(old, new)
    assert wrapped.splitlines()[1] == "    print("
    assert black.format_str(wrapped, mode=black.Mode()) == wrapped


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
    assert WRAPPED in script.read_text()  # optcodemod's own layout (97 columns), not black's


def test_black_configured_but_not_installed_keeps_the_fix_and_says_so(
    tmp_path: Path, monkeypatch
) -> None:
    script = _project(tmp_path, "[tool.black]\nline-length = 100\n")
    monkeypatch.setitem(sys.modules, "black", None)  # makes `import black` raise ImportError
    result = run_cli(["apply", str(script), "--select", "OPT501"])
    assert result.exit_code == 1
    assert WRAPPED in script.read_text()  # optcodemod's own layout at the configured 100
    assert "configures black, but black is not installed" in result.stderr


# Edits look hand-made on black-formatted files (issue 12 item 7) ----------------------------
BLACK_CLEAN = """import torch
from torch.utils.data import DataLoader

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.AdamW(
    model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1
)
loader = DataLoader(
    dataset, batch_size=opt.batch_size, shuffle=True, num_workers=int(opt.workers)
)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
for epoch in range(3):
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        loss = model(images).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_a_keyword_added_to_a_hugged_call_keeps_its_layout() -> None:
    from optimizer_codemod import rewrite

    new = rewrite(BLACK_CLEAN, select=["OPT501"]).source
    assert (
        "optimizer = torch.optim.AdamW(\n"
        "    model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True\n"
        ")\n"
    ) in new
    assert not [line for line in new.splitlines() if line != line.rstrip()]


@pytest.mark.parametrize(
    "written, expected",
    [
        # one argument per line without a trailing comma: the keyword gets its own line
        (
            "opt = torch.optim.AdamW(\n    params,\n    lr=1e-3\n)\n",
            "opt = torch.optim.AdamW(\n    params,\n    lr=1e-3,\n    fused=True\n)\n",
        ),
        # ... and a comment ending the last argument's line stays on that line
        (
            "opt = torch.optim.AdamW(\n    params,\n    lr=1e-3  # tuned\n)\n",
            "opt = torch.optim.AdamW(\n    params,\n    lr=1e-3,  # tuned\n    fused=True\n)\n",
        ),
        # ... and with `)` hugging the last argument (PyTorch-YOLOv3's train.py), `)` follows
        # the new one, and a comment on the line before is not copied
        (
            "opt = torch.optim.SGD(\n    params,\n    lr=1e-3,  # tuned\n    momentum=0.9)\n",
            "opt = torch.optim.SGD(\n    params,\n    lr=1e-3,  # tuned\n    momentum=0.9,\n"
            "    fused=True)\n",
        ),
        # ... without the spaces that ended the line the break is copied from (yunjey's
        # pytorch-tutorial writes `batch_size=batch_size, ` with one)
        (
            "opt = torch.optim.SGD(params, \n    lr=1e-3, \n    momentum=0.9)\n",
            "opt = torch.optim.SGD(params, \n    lr=1e-3, \n    momentum=0.9,\n"
            "    fused=True)\n",
        ),
        (
            "opt = torch.optim.SGD(params,\n                      lr=1e-3)\n",
            "opt = torch.optim.SGD(params,\n                      lr=1e-3,\n"
            "                      fused=True)\n",
        ),
        # keywords written with spaces around `=` get the new one the same way
        (
            "opt = torch.optim.AdamW(params, lr = 1e-3, betas = (0.9, 0.95))\n",
            "opt = torch.optim.AdamW(params, lr = 1e-3, betas = (0.9, 0.95), fused = True)\n",
        ),
    ],
)
def test_a_keyword_is_added_in_the_call_s_own_style(written: str, expected: str) -> None:
    from optimizer_codemod import rewrite

    head = "import torch\n\n"
    assert rewrite(head + written, select=["OPT501"]).source == head + expected


def test_a_hugged_call_that_no_longer_fits_goes_one_argument_per_line() -> None:
    from optimizer_codemod import rewrite

    new = rewrite(BLACK_CLEAN, select=["OPT101", "OPT103"], unsafe_fixes=True).source
    assert (
        "loader = DataLoader(\n"
        "    dataset,\n"
        "    batch_size=opt.batch_size,\n"
        "    shuffle=True,\n"
        "    num_workers=int(opt.workers),\n"  # the untouched call inside stays as it was
        "    persistent_workers=int(opt.workers) > 0,\n"
        ")\n"
    ) in new


def test_continuation_lines_whose_first_line_grew_too_long_go_one_argument_per_line() -> None:
    # TabSurvey's loaders: OPT104 rewrites the arguments of a call laid out with aligned
    # continuation lines, OPT101/OPT103 add keywords after it; the first line grew to 160
    # columns and stayed so until a bracket closed further down counted as splittable.
    old = (
        "def fit(self, X):\n"
        "    loader = DataLoader(dataset=X, batch_size=self.args.batch_size, shuffle=True,\n"
        "                        num_workers=2)\n"
    )
    new = (
        "def fit(self, X):\n"
        "    loader = DataLoader(dataset=X, batch_size=None, sampler=BatchSampler(RandomSampler(X),"
        " self.args.batch_size, drop_last=False), num_workers=2,\n"
        "                        pin_memory=torch.cuda.is_available())\n"
    )
    assert wrap_long_calls(old, new) == (
        "def fit(self, X):\n"
        "    loader = DataLoader(\n"
        "        dataset=X,\n"
        "        batch_size=None,\n"
        "        sampler=BatchSampler(RandomSampler(X), self.args.batch_size, drop_last=False),\n"
        "        num_workers=2,\n"
        "        pin_memory=torch.cuda.is_available(),\n"
        "    )\n"
    )


def test_untouched_calls_on_an_edited_line_are_not_exploded() -> None:
    from optimizer_codemod import rewrite

    source = BLACK_CLEAN.replace("num_workers=int(opt.workers)", "pin_memory=True")
    new = rewrite(source, select=["OPT201"]).source
    # A line grown past 88 columns goes into parentheses, one element per line (black's
    # layout); each `.to(...)` stays on one line.
    assert (
        "        images, labels = (\n"
        "            images.to(device, non_blocking=True),\n"
        "            labels.to(device, non_blocking=True),\n"
        "        )\n"
    ) in new


def test_a_body_too_long_for_one_line_goes_one_argument_per_line(tmp_path: Path) -> None:
    script = _project(tmp_path, "[tool.ruff]\n")
    old = script.read_text()
    new = old.replace("betas=(0.9, 0.95))", "betas=(0.9, 0.95), fused=True)")
    assert EXPLODED in wrap_long_calls(old, new, line_length=79)  # 82 columns hugged


# The rules that add keywords, arguments or lines; each fixture of theirs is formatted with
# black's defaults, rewritten, and checked with `black --check` (black's defaults again).
ADDING_RULES = (
    "OPT101",
    "OPT102",
    "OPT103",
    "OPT201",
    "OPT301",
    "OPT302",
    "OPT401",
    "OPT402",
    "OPT407",
    "OPT501",
    "OPT801",
    "OPT802",
)


def _black(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "black", "--fast", *args], cwd=cwd, capture_output=True, text=True
    )


def _black_formatted_fixtures(folder: Path, rules=ADDING_RULES) -> list:
    from fixture_cases import fixtures

    cases = [f for f in fixtures() if f.code in rules and f.kind == "fix" and not f.is_notebook]
    for index, fixture in enumerate(cases):
        (folder / f"case_{index}.py").write_bytes(fixture.path.read_bytes())
    assert _black("-q", ".", cwd=folder).returncode == 0
    return cases


def _rewrite_all(folder: Path, cases: list) -> int:
    from optimizer_codemod.api import rewrite_source

    changed = 0
    for index, fixture in enumerate(cases):
        path = folder / f"case_{index}.py"
        options = fixture.settings().options_for(str(path))
        result = rewrite_source(path.read_bytes(), str(path), options)
        path.write_bytes(result.new)
        changed += result.changed
        lines = result.new.decode().splitlines()
        assert not [l for l in lines if l != l.rstrip()], f"trailing whitespace: {fixture.id}"
    return changed


def test_black_formatted_inputs_stay_black_clean(tmp_path: Path) -> None:
    cases = _black_formatted_fixtures(tmp_path)
    assert _rewrite_all(tmp_path, cases) >= 40  # most fixtures still change once formatted
    check = _black("--check", ".", cwd=tmp_path)
    assert check.returncode == 0, check.stderr


def test_black_clean_stays_black_clean_without_black_importable(
    tmp_path: Path, monkeypatch
) -> None:
    # A project that configures black (defaults) on a machine without black: the fallback
    # layout must be black's.
    (tmp_path / "pyproject.toml").write_text("[tool.black]\n")
    black_style_for_directory.cache_clear()
    # The rules whose edits change the layout of existing calls.
    cases = _black_formatted_fixtures(tmp_path, ("OPT101", "OPT103", "OPT201", "OPT501", "OPT802"))
    monkeypatch.setitem(sys.modules, "black", None)  # `import black` raises ImportError
    with pytest.raises(ImportError):
        import black  # noqa: F401
    assert _rewrite_all(tmp_path, cases) >= 15
    monkeypatch.undo()
    check = _black("--check", ".", cwd=tmp_path)
    assert check.returncode == 0, check.stderr


def test_every_fixture_rewritten_by_every_rule_stays_black_clean(tmp_path: Path) -> None:
    # All rules at once, unsafe fixes included: an edit inside a method chain (OPT406 turning
    # `(att @ v).transpose(1, 2).contiguous().view(B, T, C)` into an SDPA call) must be laid
    # out as black lays out chains.
    from fixture_cases import fixtures
    from optimizer_codemod.api import rewrite_source
    from optimizer_codemod.config import Settings

    cases = [f for f in fixtures() if f.kind == "fix" and not f.is_notebook]
    for index, fixture in enumerate(cases):
        (tmp_path / f"case_{index}.py").write_bytes(fixture.path.read_bytes())
    assert _black("-q", ".", cwd=tmp_path).returncode == 0
    settings = Settings().with_overrides(unsafe_fixes=True)
    changed = 0
    for index, fixture in enumerate(cases):
        path = tmp_path / f"case_{index}.py"
        result = rewrite_source(path.read_bytes(), str(path), settings.options_for(str(path)))
        path.write_bytes(result.new)
        changed += result.changed
    assert changed >= len(cases) * 3 // 4
    check = _black("--check", ".", cwd=tmp_path)
    assert check.returncode == 0, check.stderr


CHAIN_OLD = "def forward(self, q, k, v):\n    if self.flash:\n        pass\n"


@pytest.mark.parametrize(
    "statement",
    [
        # two links after a call: in parentheses, one link per line, the first call exploded
        "y = F.scaled_dot_product_attention(query_states, key_states, value_states, "
        "is_causal=True).transpose(1, 2).contiguous().view(B, T, C)",
        # the same chain fits on one line inside the parentheses
        "y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)"
        ".contiguous().view(B, T, C)",
        # a subscript at the end, and an augmented assignment
        "y += F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=s)"
        ".transpose(1, 2).view(B, T, C)[0]",
        "return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=s)"
        ".transpose(1, 2).view(batch_size, sequence_length, heads * head_dim)",
        # one link after a call: black splits the call whose opening line fits
        "y = F.scaled_dot_product_attention(query_states, key_states, value_states, "
        "is_causal=True).view(B, T, C)",
        # a link too long for its own line is split at its brackets
        "y = model(key_states, value_states, query_states, attention_mask, position_ids)"
        ".to(device, non_blocking=True).reshape(batch_size, sequence_length, heads, head_dim,"
        " extra_dimension)",
        # links after an expression in parentheses (OPT201 on an evaluation loop's accuracy)
        "accuracy = (logits.argmax(1) == labels.to(device, non_blocking=True)).float().mean()",
        # a difference in parentheses too long for its own line: split before each `-`/`+`
        "loss = (model(x.to(device, non_blocking=True)).squeeze(-1) - y.to(device, "
        "non_blocking=True) + penalty.to(device)).pow(2).mean()",
        "loss = (prediction_of_the_model * weights.to(device, non_blocking=True) / scale_factor"
        " - y).pow(2).mean()",
        # a bare expression statement gets no parentheses: its last call whose opening line
        # fits is split, with one link after it or several (OPT501 in `Trainer(...).train()`)
        "Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1, fused=True), data, data)"
        ".train()",
        "Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1, fused=True), data, data)"
        ".train().save()",
        "Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1, fused=True), data)"
        ".train(1, 2, 3, 4, 5, 6)",
    ],
)
def test_a_method_chain_made_too_long_is_split_as_black_splits_it(statement: str) -> None:
    _assert_laid_out_as_black_lays_it_out(statement)


@pytest.mark.parametrize(
    "statement",
    [
        # too long in parentheses: `if` and `else` each start a line
        'kwargs = {"num_workers": 1, "pin_memory": True, "persistent_workers": True} '
        "if use_cuda else {}",
        "return compute_something(alpha, beta, gamma, delta) if condition_holds else "
        "other(alpha, beta)",
        # fits on one line in parentheses
        "value = first_option_value_here + second_option_here if condition else fallback_x",
    ],
)
def test_a_conditional_value_made_too_long_is_split_as_black_splits_it(statement: str) -> None:
    _assert_laid_out_as_black_lays_it_out(statement)


def _assert_laid_out_as_black_lays_it_out(statement: str) -> None:
    """`statement`, made too long by an edit in a function, is laid out as black would."""
    import black

    new = CHAIN_OLD.replace("pass", statement)
    wrapped = wrap_long_calls(CHAIN_OLD, new, line_length=88)
    assert wrapped != new
    assert black.format_str(wrapped, mode=black.Mode()) == wrapped


def test_a_method_chain_with_a_comment_on_its_line_is_left_as_written() -> None:
    statement = (
        "y = F.scaled_dot_product_attention(query_states, key_states, value_states, "
        "is_causal=True).transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)"
    )
    new = CHAIN_OLD.replace("pass", statement)
    assert wrap_long_calls(CHAIN_OLD, new, line_length=88) == new


NESTED_SHAPES = {
    "a call in a loop of a function": (
        "def main(loader, target_device):\n"
        "    for x, y in loader:\n"
        "        x, y = x.to(target_device), y.to(target_device)\n"
        "        print(x)\n",
        "x.to(target_device), y.to(target_device)",
        "x.to(target_device, non_blocking=True), y.to(target_device, non_blocking=True)",
    ),
    "a with header that changed": (
        "def evaluate(model, loader):\n"
        "    with torch.no_grad():\n"
        "        for x in loader:\n"
        "            model(x)\n",
        "torch.no_grad()",
        "torch.inference_mode(mode=True, some_very_long_keyword_argument=model.training_flag_value)",
    ),
    "a statement holding a string across lines": (
        "def main(device):\n"
        '    text = """\nkeep  this   text\n"""\n'
        "    x = torch.zeros(4).to(device)\n"
        "    y = torch.zeros(4).to(device, some_other_name=text, and_another_argument=text)\n",
        "and_another_argument=text)",
        "and_another_argument=text, non_blocking=True)",
    ),
    "a statement after `if x:` on its line": (
        "def main(device, x):\n"
        "    if x: y = torch.zeros(4).to(device, some_other_name=x, and_another_argument=x)\n",
        "and_another_argument=x)",
        "and_another_argument=x, non_blocking=True)",
    ),
    "two statements on one line": (
        "def main(device, x):\n"
        "    a = 1; y = torch.zeros(4).to(device, some_other_name=x, and_another_argument=x)\n",
        "and_another_argument=x)",
        "and_another_argument=x, non_blocking=True)",
    ),
    "arguments that fit on one line only without the indentation": (
        "def main(loader, device):\n"
        "    for x, y in loader:\n"
        "        y = f(first_argument_a, second_argument_b, third_argument_c, dddddd)\n",
        "dddddd)",
        "dddddd, non_blocking=True)",
    ),
    "an empty line in brackets": (
        "def main(device, x):\n"
        "    y = torch.zeros(4).to(\n\n        device, some_other_name=x, and_another_argument=x)\n",
        "and_another_argument=x)",
        "and_another_argument=x, non_blocking=True, yet_another_argument=x)",
    ),
}


@pytest.mark.parametrize("shape", sorted(NESTED_SHAPES))
def test_a_statement_laid_out_alone_is_laid_out_as_in_its_function(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimizer_codemod import formatting

    old, before, after = NESTED_SHAPES[shape]
    new = old.replace(before, after)
    assert new != old
    laid_out = []
    relayout = formatting._relayout
    monkeypatch.setattr(
        formatting, "_relayout", lambda text, *a: (laid_out.append(text), relayout(text, *a))[1]
    )
    alone = wrap_long_calls(old, new)
    laid_out_alone = list(laid_out)
    monkeypatch.setattr(formatting, "_innermost_statements", lambda *args: None)
    in_function = wrap_long_calls(old, new)
    assert alone == in_function
    if shape in ("a call in a loop of a function", "a with header that changed") or "fit" in shape:
        assert alone != new  # it was laid out,
        assert laid_out_alone and not any(t.startswith("def ") for t in laid_out_alone)  # alone


@pytest.mark.parametrize(
    "source",
    ["examples/train.py", "fixtures/OPT101/fix_options_from_a_dict.py"],
)
def test_a_rewrite_kept_unformatted_lays_out_as_one_formatted_at_once(source: str) -> None:
    from conftest import ROOT
    from optimizer_codemod.api import format_rewrite, rewrite_source
    from optimizer_codemod.config import Settings

    src = (ROOT / source).read_bytes()
    path = str(ROOT / "examples" / "elsewhere.py")  # the project's black style applies
    options = Settings().options_for(path)
    at_once = rewrite_source(src, path, options)
    kept = rewrite_source(src, path, options, formatted=False)
    assert not kept.formatted and kept.changed
    assert kept.new != at_once.new  # the layout is the only difference...
    assert kept.diagnostics == at_once.diagnostics  # ...findings, lines, statuses the same
    assert format_rewrite(kept, src, path) == at_once


COMPREHENSION_OLD = (
    "def run(self, loader):\n"
    "    for batch in loader:\n"
    "        batch = {k: v.to(self.device) for k, v in batch.items()}\n"
    "        pairs = [t.to(self.device) for t in batch if t is not None]\n"
    "        few = {t.to(self.device) for t in batch}\n"
)


@pytest.mark.parametrize("quote", ['"', "'"])
def test_a_comprehension_a_fix_made_too_long_is_split_as_black_splits_it(quote: str) -> None:
    keyword = f"non_blocking=self.device.type == {quote}cuda{quote}"
    new = COMPREHENSION_OLD.replace("(self.device)", f"(self.device, {keyword})")
    wrapped = wrap_long_calls(COMPREHENSION_OLD, new)
    assert max(len(line) for line in wrapped.splitlines()) <= 88
    black = pytest.importorskip("black")
    assert black.format_str(wrapped, mode=black.Mode()) == wrapped.replace("'", '"')
    # Contents too long for one line: the element and each clause on its own line; short
    # enough: hugged between the brackets.
    assert "\n            for t in batch\n            if t is not None\n        ]\n" in wrapped
    assert (
        f"few = {{\n            t.to(self.device, {keyword}) for t in batch\n        }}\n"
        in wrapped
    )

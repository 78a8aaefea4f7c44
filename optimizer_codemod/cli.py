"""The command line: `optcodemod` apply, rules, explain, verify, doctor, bench, generate-docs.

Exit codes follow ruff, black and pyupgrade: 0 nothing to change, 1 changes made or (with
--check/--diff) would be made, 2 usage, configuration or file error.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import click

from optimizer_codemod import __version__
from optimizer_codemod.cache import open_cache
from optimizer_codemod.config import (
    TABLE,
    RuleSelection,
    Settings,
    resolve_settings,
    validate_codes,
)
from optimizer_codemod.diagnostics import FileOutcome
from optimizer_codemod.discovery import discover, excluded_reason
from optimizer_codemod.engine import PRECISIONS, TARGET_DEVICES
from optimizer_codemod.errors import ConfigError
from optimizer_codemod.extras import missing_torch
from optimizer_codemod.registry import all_rules, rule_by_code
from optimizer_codemod.report import (
    FORMATS,
    FORMATS_WITH_EDITS,
    ReportContext,
    fixes_summary,
    statistics,
)
from optimizer_codemod.measured_gains import load_results
from optimizer_codemod.rule_docs import render_rule_page, stale_pages, write_docs
from optimizer_codemod.rule import Safety
from optimizer_codemod.runner import Mode, process_bytes, run
from optimizer_codemod.torch_version import TorchVersion

EXIT_CLEAN, EXIT_CHANGES, EXIT_ERROR = 0, 1, 2
# 128 + SIGINT, as shells report it: not 1, which would claim the run made its changes.
EXIT_INTERRUPTED = 130


def _split_codes(ctx: click.Context, param: click.Parameter, values: Sequence[str]):
    if not values:
        return None
    codes = [code for value in values for code in value.replace(" ", ",").split(",") if code]
    try:
        return tuple(validate_codes(codes, f"--{param.name.replace('_', '-')}"))
    except ConfigError as error:
        raise click.BadParameter(error.message.split(": ", 1)[-1]) from None


def _target(ctx: click.Context, param: click.Parameter, value: Optional[str]):
    if value is None:
        return None
    try:
        return TorchVersion.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


# Files a run has rewritten so far, kept where an interrupt at any point can still read them.
_WRITTEN = "optcodemod.written"


class _Commands(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as stop:
            _report_interrupted(stop, ctx.meta.get(_WRITTEN, {}))
            sys.exit(EXIT_INTERRUPTED)


def _report_interrupted(stop: KeyboardInterrupt, reported: dict) -> None:
    written = list(dict.fromkeys([*reported, *getattr(stop, "written", [])]))
    in_flight = [p for p in getattr(stop, "in_flight", []) if p not in written]
    if written:
        lines = [f"optcodemod: interrupted; {_files(len(written))} already rewritten:"]
        lines += [f"  {path}" for path in written]
    else:
        lines = ["optcodemod: interrupted; no file was rewritten."]
    if in_flight:
        lines.append(
            f"{_files(len(in_flight))} being rewritten when the workers were stopped; each is "
            "either untouched or completely rewritten:"
        )
        lines += [f"  {path}" for path in in_flight]
    lines.append("Every other file is untouched.")
    click.echo("\n".join(lines), err=True)


def _files(count: int) -> str:
    return f"{count} file was" if count == 1 else f"{count} files were"


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="optcodemod")
def main() -> None:
    """Rewrite PyTorch training scripts to train the same model, faster."""


def _settings_for(paths: Sequence[str], config: Sequence[str]) -> Settings:
    existing = [os.path.abspath(p) for p in paths if p != "-" and os.path.exists(p)]
    start = os.path.commonpath(existing) if existing else os.getcwd()
    return resolve_settings(tuple(config or ()), start)


def _config_option(function):
    return click.option(
        "--config",
        multiple=True,
        metavar="FILE | KEY=VALUE",
        help="A pyproject.toml to use (at most one), or one setting as TOML, "
        "for example --config \"target-device = 'cpu'\" (overrides the file).",
    )(function)


def use_color(choice: str, stream) -> bool:
    """--color, then NO_COLOR and FORCE_COLOR (no-color.org, force-color.org), then a TTY."""
    if choice != "auto":
        return choice == "always"
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return stream.isatty()


def _say_settings(settings: Settings, start_paths: Sequence[str]) -> None:
    if settings.source:
        click.echo(f"settings: {settings.source} [{TABLE}]", err=True)
    else:
        where = ", ".join(start_paths) or "."
        click.echo(
            f"settings: defaults (no pyproject.toml with [{TABLE}] at or above {where})",
            err=True,
        )
    for value in settings.inline:
        click.echo(f"settings: --config {value!r}", err=True)
    if settings.target_torch_from:
        click.echo(
            f"settings: target-torch {settings.target_torch}, {settings.target_torch_from}",
            err=True,
        )


@main.command()
@click.argument("paths", nargs=-1)
@click.option("--diff", is_flag=True, help="Print a unified diff; write nothing.")
@click.option("--check", is_flag=True, help="Report what would change; write nothing.")
@click.option("--select", multiple=True, callback=_split_codes, help="Codes or prefixes to run.")
@click.option("--ignore", multiple=True, callback=_split_codes, help="Codes or prefixes to skip.")
@click.option("--extend-select", multiple=True, callback=_split_codes, help="Add to select.")
@click.option(
    "--extend-ignore", multiple=True, callback=_split_codes, help="Add to ignore (as --ignore)."
)
@click.option(
    "--unsafe-fixes/--no-unsafe-fixes",
    default=None,
    help="Also apply behaviour-level fixes (each changes what the script observably does).",
)
@click.option("--target-torch", callback=_target, help="Oldest torch the output must run on.")
@click.option(
    "--precision",
    type=click.Choice(PRECISIONS),
    help="16-bit type for autocast (default bf16; fp16 adds a GradScaler).",
)
@click.option(
    "--target-device",
    type=click.Choice(TARGET_DEVICES),
    help="Where the script will train: what the output is tuned for (default cuda).",
)
@click.option(
    "--output-format", type=click.Choice(sorted(FORMATS)), default="text", show_default=True
)
@click.option("--statistics", "show_statistics", is_flag=True, help="Count findings per rule.")
@click.option(
    "--why-not",
    is_flag=True,
    help="Also list each site a rule examined and left alone, with the reason.",
)
@click.option("--show-fixes", is_flag=True, help="End with a count of the fixes per file and rule.")
@click.option(
    "--exit-zero", is_flag=True, help="Exit 0 when fixes are made or would be (errors: 2)."
)
@click.option(
    "--force-exclude/--no-force-exclude",
    default=None,
    help="Apply `exclude` to paths named on the command line too (for pre-commit).",
)
@click.option("-j", "--jobs", type=click.IntRange(min=0), default=0, help="Worker processes.")
@_config_option
@click.option("--stdin-filename", help="The path to report for `-` (stdin).")
@click.option("-q", "--quiet", is_flag=True, help="Print errors only.")
@click.option(
    "-v", "--verbose", is_flag=True, help="Say which settings file is used, what is skipped, why."
)
@click.option(
    "--color",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    help="auto: on a terminal, unless NO_COLOR is set (FORCE_COLOR forces it).",
)
@click.option("--no-cache", is_flag=True, help="Neither read nor write the results cache.")
def apply(
    paths: Tuple[str, ...],
    diff: bool,
    check: bool,
    select,
    ignore,
    extend_select,
    extend_ignore,
    unsafe_fixes: Optional[bool],
    target_torch: Optional[TorchVersion],
    precision: Optional[str],
    target_device: Optional[str],
    output_format: str,
    show_statistics: bool,
    why_not: bool,
    show_fixes: bool,
    exit_zero: bool,
    force_exclude: Optional[bool],
    jobs: int,
    config: Tuple[str, ...],
    stdin_filename: Optional[str],
    quiet: bool,
    verbose: bool,
    color: str,
    no_cache: bool,
) -> None:
    """Rewrite PATHS (files, directories, or - for stdin; default: .) in place."""
    paths = paths or (".",)
    try:
        settings = _settings_for(paths, config)
    except ConfigError as error:
        _fail(error.render())
    ignored = tuple(ignore or ()) + tuple(extend_ignore or ())
    settings = settings.with_overrides(
        overrides=(RuleSelection(select, tuple(extend_select or ()), ignored),),
        unsafe_fixes=unsafe_fixes,
        target_torch=target_torch,
        precision=precision,
        target_device=target_device,
        why_not=why_not or None,
        force_exclude=force_exclude,
    )
    if verbose:
        _say_settings(settings, [p for p in paths if p != "-"])
    if "-" in paths:
        if len(paths) > 1:
            _fail("`-` (stdin) cannot be combined with other paths", usage=True)
        _apply_stdin(
            settings, diff, check, stdin_filename or "-", output_format, quiet, verbose, exit_zero
        )
        return
    mode = Mode(
        write=not (diff or check),
        diff=diff,
        cache=open_cache(settings, not no_cache),
        text_shown=not check or diff or output_format in FORMATS_WITH_EDITS,
    )
    found = discover(list(paths), settings)
    if verbose:
        for path, reason in found.skipped:
            click.echo(f"skipped {path}: {reason}", err=True)
    for folder in found.empty_directories:
        click.echo(f"{folder}: no Python files or notebooks found", err=True)
    for message in found.links_outside:
        if not quiet:
            click.echo(message, err=True)
    use_colour = use_color(color, sys.stdout)
    outcomes = _run_with_progress(found.files, settings, mode, jobs, quiet)
    # A path that does not exist is an error of the run: every report format must say so.
    outcomes = [
        FileOutcome(path=missing, error=f"{missing}: no such file or directory")
        for missing in found.missing
    ] + outcomes
    for outcome in outcomes:
        if verbose and outcome.skipped:
            click.echo(f"skipped {outcome.path}: {outcome.skipped}", err=True)
        if outcome.warning and not quiet:
            click.echo(outcome.warning, err=True)
        if outcome.error:
            click.echo(outcome.error, err=True)
    report_stream_is_stdout = not diff
    if diff:
        for outcome in outcomes:
            if outcome.diff:
                # color= so that --color always survives a pipe (click strips ANSI otherwise).
                click.echo(_color_diff(outcome.diff, use_colour), nl=False, color=use_colour)
    context = ReportContext(outcomes, writing=mode.write, color=use_colour)
    if not quiet or output_format != "text":
        click.echo(
            FORMATS[output_format](context),
            nl=False,
            err=not report_stream_is_stdout,
            color=use_colour,
        )
    if show_statistics:
        click.echo(statistics(outcomes), nl=False, err=not report_stream_is_stdout)
    if show_fixes and (not quiet or output_format != "text"):
        # Machine-readable output owns stdout; the enumeration then goes to stderr.
        to_stderr = not report_stream_is_stdout or output_format != "text"
        click.echo(fixes_summary(context), nl=False, err=to_stderr)
    if any(o.error for o in outcomes):
        sys.exit(EXIT_ERROR)
    changed = any(o.changed for o in outcomes)
    sys.exit(EXIT_CHANGES if changed and not exit_zero else EXIT_CLEAN)


def _run_with_progress(files: List[str], settings: Settings, mode: Mode, jobs: int, quiet: bool):
    written = click.get_current_context().meta.setdefault(_WRITTEN, {})

    def done(outcome) -> None:
        if outcome.written:
            written[outcome.path] = None

    if quiet or len(files) < 2 or not sys.stderr.isatty():
        return run(files, settings, mode, jobs, on_done=done)
    with click.progressbar(length=len(files), label="optcodemod", file=sys.stderr) as bar:
        return run(files, settings, mode, jobs, on_done=lambda o: (done(o), bar.update(1)))


def _apply_stdin(settings, diff, check, filename, output_format, quiet, verbose, exit_zero) -> None:
    src = sys.stdin.buffer.read()
    if filename != "-" and settings.force_exclude:
        reason = excluded_reason(filename, settings)
        if reason is not None:
            # As ruff does: an excluded file passes through untouched (editors pipe every file).
            if verbose:
                click.echo(f"skipped {filename}: {reason}", err=True)
            if not (diff or check):
                _write_stdout(src)
            sys.exit(EXIT_CLEAN)
    mode = Mode(write=False, diff=diff, keep_text=True)
    outcome = process_bytes(src, filename, settings, mode)
    if verbose and outcome.skipped:
        click.echo(f"skipped {filename}: {outcome.skipped}", err=True)
    if outcome.error:
        click.echo(outcome.error, err=True)
        if not (diff or check):
            _write_stdout(src)
        sys.exit(EXIT_ERROR)
    if diff:
        click.echo(outcome.diff or "", nl=False)
    elif not check:
        _write_stdout(outcome.new_text or src)
    context = ReportContext([outcome], writing=not (diff or check), color=False)
    if not quiet or output_format != "text":
        click.echo(FORMATS[output_format](context), nl=False, err=True)
    sys.exit(EXIT_CHANGES if outcome.changed and not exit_zero else EXIT_CLEAN)


def _write_stdout(data: bytes) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def _color_diff(text: str, color: bool) -> str:
    if not color:
        return text
    styled = []
    for line in text.splitlines(keepends=True):
        if line.startswith(("+++", "---")):
            styled.append(click.style(line, bold=True))
        elif line.startswith("+"):
            styled.append(click.style(line, fg="green"))
        elif line.startswith("-"):
            styled.append(click.style(line, fg="red"))
        elif line.startswith("@@"):
            styled.append(click.style(line, fg="cyan"))
        else:
            styled.append(line)
    return "".join(styled)


def _require_torch(command: str) -> None:
    # One message and exit code for every command that runs torch, before a child process
    # would crash on `import torch` with a traceback.
    missing = missing_torch(command)
    if missing is not None:
        _fail(missing)


def _fail(message: str, usage: bool = False) -> None:
    click.echo(f"optcodemod: {message}" if usage else message, err=True)
    sys.exit(EXIT_ERROR)


@main.command()
@click.option("--output-format", type=click.Choice(["text", "json"]), default="text")
def rules(output_format: str) -> None:
    """List every rule: code, name, safety, minimum torch, summary."""
    table = all_rules()
    if output_format == "json":
        records = [
            {
                "code": r.code,
                "name": r.name,
                "safety": r.safety.label,
                "min_torch": str(r.min_torch),
                "target_devices": list(r.target_devices),
                "summary": r.message,
                "fix": r.fix_title,
            }
            for r in table
        ]
        click.echo(json.dumps(records, indent=2))
        return
    rows = [("code", "name", "safety", "torch", "summary")]
    rows += [(r.code, r.name, r.safety.label, str(r.min_torch), r.summary()) for r in table]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        click.echo(
            "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4]
        )


@main.command()
@click.argument("code")
def explain(code: str) -> None:
    """Print the page of rule CODE (for example OPT501)."""
    try:
        rule = rule_by_code(code)
    except KeyError:
        known = ", ".join(r.code for r in all_rules())
        _fail(f"optcodemod: unknown rule code {code!r}; known codes: {known}")
    click.echo(render_rule_page(rule), nl=False)


@main.command("generate-docs", hidden=True)
@click.option("--output", type=click.Path(file_okay=False), default="docs/rules")
@click.option("--check", is_flag=True, help="Exit 1 when the pages are stale.")
@click.option(
    "--results",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Folder of bench / rule-gains JSON results (default: the checkout's benchmarks/results).",
)
def generate_docs(output: str, check: bool, results: Optional[str]) -> None:
    """Write docs/rules/ from the rules' docstrings, examples and committed results."""
    folder = Path(output)
    measured = load_results(Path(results) if results else None)
    if check:
        stale = stale_pages(folder, all_rules(), measured)
        for name in stale:
            click.echo(f"{folder / name}: stale", err=True)
        sys.exit(EXIT_CHANGES if stale else EXIT_CLEAN)
    for name in write_docs(folder, all_rules(), measured):
        click.echo(f"wrote {folder / name}")


@main.command()
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Optimizer steps per run.",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Runs of each version.",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Steps left out of timing.",
)
@click.option("--select", multiple=True, callback=_split_codes, help="Codes or prefixes to run.")
@click.option("--ignore", multiple=True, callback=_split_codes, help="Codes or prefixes to skip.")
@click.option("--extend-select", multiple=True, callback=_split_codes, help="Add to select.")
@click.option("--unsafe-fixes/--no-unsafe-fixes", default=None, help="Also apply behaviour fixes.")
@click.option("--target-torch", callback=_target, help="Oldest torch the output must run on.")
@click.option("--precision", type=click.Choice(PRECISIONS), help="16-bit type for autocast.")
@click.option(
    "--target-device",
    type=click.Choice(TARGET_DEVICES),
    help="Where the script will train: what the rewrite is tuned for (default cuda).",
)
@click.option("--timeout", type=click.FloatRange(min=1), help="Seconds allowed for each run.")
@click.option(
    "--nproc-per-node",
    type=click.IntRange(min=1),
    help="Processes under torchrun [default: the script's `# bench: torchrun` line, else 1].",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write all results.")
@_config_option
@click.option(
    "--against",
    type=click.Path(exists=True, dir_okay=False),
    help="Compare SCRIPT with this version of it (written by a person) instead of its rewrite.",
)
@click.option(
    "--level",
    type=click.Choice(["safe", "numerics", "behavior"]),
    help="With --against: the tolerance to judge at [default: numerics].",
)
def verify(script, script_args, select, ignore, extend_select, config, **options) -> None:
    """Run SCRIPT and its rewrite for a few steps; judge losses, step time and memory.

    The rewrite covers the local modules SCRIPT imports. With --against CANDIDATE, nothing is
    rewritten: SCRIPT and CANDIDATE are compared as they are. Arguments after `--` go to the
    script. Exit 0: equivalent; 1: not equivalent; 2: error.
    """
    _require_torch("verify")
    from optimizer_codemod.verify.equivalence import verify_command
    from optimizer_codemod.verify.runner import end_runs_on_sigterm

    end_runs_on_sigterm()

    try:
        settings = _settings_for([script], config)
    except ConfigError as error:
        _fail(error.render())
    settings = settings.with_overrides(
        overrides=(RuleSelection(select, tuple(extend_select or ()), tuple(ignore or ())),),
        unsafe_fixes=options.pop("unsafe_fixes"),
        target_torch=options.pop("target_torch"),
        precision=options.pop("precision"),
        target_device=options.pop("target_device"),
    )
    level = options.pop("level")
    if level and not options.get("against"):
        _fail("--level applies only with --against (a rewrite is judged at its fixes' level)")
    options["level"] = Safety[level.upper()] if level else None
    sys.exit(verify_command(script, script_args, settings, echo=click.echo, **options))


@main.command()
@click.option("--output-format", type=click.Choice(["text", "json"]), default="text")
@click.option("--compile-timeout", type=click.FloatRange(min=0), default=120, show_default=True)
def doctor(output_format: str, compile_timeout: float) -> None:
    """What this machine offers a training script, and which rules pay off here."""
    _require_torch("doctor")
    from optimizer_codemod.verify.doctor import doctor_command

    sys.exit(doctor_command(output_format, compile_timeout, echo=click.echo))


@main.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--size", type=click.Choice(["cpu", "gpu"]), default=None, help="Default: --device.")
@click.option("--steps", type=click.IntRange(min=2), default=20, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True)
@click.option("--timeout", type=click.FloatRange(min=1), help="Seconds allowed for each run.")
@click.option("--ablate", is_flag=True, help="Also measure each applied rule alone.")
@click.option("--unsafe-fixes", is_flag=True, help="Also apply behaviour-level fixes.")
@click.option("--output", type=click.Path(file_okay=False), default=".", show_default=True)
@click.option("--name", help="File name stem of the results [default: bench-DEVICE-SIZE].")
@click.option(
    "--resume",
    is_flag=True,
    help="Keep the workloads already in the results file (same settings) and run the rest.",
)
def bench(path: str, size: Optional[str], **options) -> None:
    """Run every workload under PATH (folders with train.py) before and after the rewrite."""
    _require_torch("bench")
    from optimizer_codemod.verify.bench import bench_command
    from optimizer_codemod.verify.runner import end_runs_on_sigterm

    end_runs_on_sigterm()
    size = size or ("gpu" if options["device"] == "cuda" else "cpu")
    sys.exit(bench_command(path, size=size, echo=click.echo, **options))


if __name__ == "__main__":  # pragma: no cover
    main()

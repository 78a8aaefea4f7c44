"""Settings: `[tool.optcodemod]` in the nearest pyproject.toml, overridden by the command line."""

from __future__ import annotations

import difflib
import os
import sys
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pathspec

from optimizer_codemod.engine import (
    DEFAULT_PRECISION,
    DEFAULT_TARGET_DEVICE,
    PRECISIONS,
    TARGET_DEVICES,
    RewriteOptions,
)
from optimizer_codemod.declared_torch import DeclaredTorch, declared_torch, nearest_pyproject
from optimizer_codemod.errors import ConfigError
from optimizer_codemod.registry import all_rules, is_known_prefix, matches_prefix, select_rules
from optimizer_codemod.torch_version import DEFAULT_TARGET, TorchVersion

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TABLE = "tool.optcodemod"
DEFAULT_EXCLUDE = (
    ".git",
    ".hg",
    ".svn",
    ".venv",
    "venv",
    ".tox",
    ".nox",
    ".mypy_cache",
    ".pytest_cache",
    ".ipynb_checkpoints",
    "__pycache__",
    "__pypackages__",
    "node_modules",
    "site-packages",
    "build",
    "dist",
)


@dataclass(frozen=True)
class RuleSelection:
    """One layer of rule selection (the configuration, then the command line).

    A layer with `select` starts afresh; without it, it refines the previous layer's result.
    Within a layer the more specific of a matching select and ignore prefix wins (ruff's
    rule), so `--select OPT501` re-enables a rule the configuration ignores.
    """

    select: Optional[Tuple[str, ...]] = None
    extend_select: Tuple[str, ...] = ()
    ignore: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Settings:
    select: Tuple[str, ...] = ("ALL",)
    ignore: Tuple[str, ...] = ()
    extend_select: Tuple[str, ...] = ()
    extend_ignore: Tuple[str, ...] = ()  # ruff's older spelling: added to `ignore`
    per_file_ignores: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    unsafe_fixes: bool = False
    extend_safe_fixes: Tuple[str, ...] = ()
    extend_unsafe_fixes: Tuple[str, ...] = ()
    target_torch: TorchVersion = DEFAULT_TARGET
    # Where `target_torch` came from when the project's own torch requirement set it (for
    # `--verbose`); None when it is the default or set by the user.
    target_torch_from: Optional[str] = None
    precision: str = DEFAULT_PRECISION
    target_device: str = DEFAULT_TARGET_DEVICE
    exclude: Tuple[str, ...] = ()
    # Apply `exclude` to paths named on the command line too: pre-commit names every file.
    force_exclude: bool = False
    respect_gitignore: bool = True
    # Leave test suites alone: folders named `tests`, `conftest.py` (discovery.py) and test
    # modules (api.collected_by_test_runners). Their edits buy no training time.
    exclude_tests: bool = True
    why_not: bool = False
    # Where results are cached (relative to `root`); None: `.optcodemod_cache` (cache.py).
    cache_dir: Optional[str] = None
    overrides: Tuple[RuleSelection, ...] = ()  # command-line or API layers, in order
    # Where the configuration came from; relative patterns are relative to `root`.
    root: str = "."
    source: Optional[str] = None
    inline: Tuple[str, ...] = ()  # `--config "key = value"` settings applied over `source`

    @property
    def selection_layers(self) -> Tuple[RuleSelection, ...]:
        own = RuleSelection(
            tuple(self.select),
            tuple(self.extend_select),
            tuple(self.ignore) + tuple(self.extend_ignore),
        )
        return (own, *self.overrides)

    def rules_for(self, path: str) -> Tuple[type, ...]:
        """The rules that run on `path`; per-file ignores always win."""
        file_ignores: List[str] = []
        if self.per_file_ignores:
            relative = _relative_posix(path, self.root)
            for pattern, codes in self.per_file_ignores:
                if _glob_spec((pattern,)).match_file(relative):
                    file_ignores.extend(codes)
        return _selected(
            self.selection_layers, tuple(file_ignores), self.target_torch, self.target_device
        )

    def options_for(self, path: str) -> RewriteOptions:
        return RewriteOptions(
            rules=self.rules_for(path),
            target_torch=self.target_torch,
            unsafe_fixes=self.unsafe_fixes,
            precision=self.precision,
            target_device=self.target_device,
            extend_safe_fixes=self.extend_safe_fixes,
            extend_unsafe_fixes=self.extend_unsafe_fixes,
            why_not=self.why_not,
            exclude_tests=self.exclude_tests,
        )

    def excludes(self, path: str) -> bool:
        """Whether a user `exclude` pattern (relative to the configuration's folder) matches."""
        return self.exclude_pattern(path) is not None

    def exclude_pattern(self, path: str) -> Optional[str]:
        """The first user `exclude` pattern that matches `path`, for messages; else None."""
        if not self.exclude:
            return None
        relative = _relative_posix(path, self.root)
        if not _glob_spec(self.exclude).match_file(relative):
            return None
        # A negated pattern can un-exclude, so only the whole spec decides; this names a culprit.
        return next(
            (p for p in self.exclude if _glob_spec((p,)).match_file(relative)), self.exclude[0]
        )

    def with_overrides(self, **overrides: Any) -> "Settings":
        given = {k: v for k, v in overrides.items() if v is not None}
        if "target_torch" in given:
            given["target_torch_from"] = None
        return replace(self, **given)


@lru_cache(maxsize=256)
def _selected(
    layers: Tuple[RuleSelection, ...],
    file_ignores: Tuple[str, ...],
    target: TorchVersion,
    device: str,
) -> Tuple[type, ...]:
    current: List[type] = []
    for layer in layers:
        if layer.select is not None:
            current = select_rules(layer.select, layer.ignore)
        else:
            current = [
                r for r in current if not any(matches_prefix(r.code, p) for p in layer.ignore)
            ]
        for rule in select_rules(layer.extend_select, layer.ignore):
            if rule not in current:
                current.append(rule)
    return tuple(
        rule
        for rule in sorted(current, key=lambda r: r.code)
        if rule.min_torch <= target
        and device in rule.target_devices
        and not any(matches_prefix(rule.code, p) for p in file_ignores)
    )


@lru_cache(maxsize=256)
def _glob_spec(patterns: Tuple[str, ...]) -> pathspec.PathSpec:
    return pathspec.GitIgnoreSpec.from_lines(patterns)


def _relative_posix(path: str, root: str) -> str:
    try:
        relative = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    except ValueError:  # another drive on Windows
        relative = os.path.abspath(path)
    return Path(relative).as_posix()


# Reading ---------------------------------------------------------------------------------
def find_config(start: str) -> Optional[Path]:
    """The nearest pyproject.toml, at or above `start`, that has a [tool.optcodemod] table."""
    directory = Path(start).resolve()
    if directory.is_file():
        directory = directory.parent
    for folder in (directory, *directory.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            data = _read_toml(candidate)
            if isinstance(data.get("tool"), dict) and "optcodemod" in data["tool"]:
                return candidate
    return None


def load_settings(
    config_path: Optional[Path], explicit: bool = False, start: Optional[str] = None
) -> Settings:
    """Settings from `config_path` (None: the defaults, rooted at the working directory).

    `explicit`: the user named the file (`--config`), so a file without our table is a
    mistake (a typo in the path, the wrong pyproject.toml), not a request for the defaults.
    Without a `target-torch`, the torch the project requires sets it (declared_torch.py):
    from `config_path`, or else from the nearest pyproject.toml at or above `start`.
    """
    if config_path is None:
        project = nearest_pyproject(Path(start).resolve()) if start is not None else None
        declared = declared_torch(project, _read_toml(project)) if project else None
        return _with_declared_torch(Settings(root=os.getcwd()), declared)
    data = _read_toml(config_path)
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise ConfigError("[tool] must be a table", str(config_path))
    if explicit and "optcodemod" not in tool:
        raise ConfigError(
            f"no [{TABLE}] table in this file; put the settings under [{TABLE}]",
            str(config_path),
        )
    table = tool.get("optcodemod", {})
    if not isinstance(table, dict):
        raise ConfigError(f"[{TABLE}] must be a table", str(config_path))
    values = parse_table(table, str(config_path))
    settings = Settings(root=str(config_path.parent), source=str(config_path), **values)
    if "target_torch" in values:
        return settings
    return _with_declared_torch(settings, declared_torch(config_path, data))


def _read_toml(path: Path) -> Dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise ConfigError(f"cannot read the configuration: {exc}", str(path)) from None


def _with_declared_torch(settings: Settings, declared: Optional[DeclaredTorch]) -> Settings:
    if declared is None:
        return settings
    return replace(settings, target_torch=declared.floor, target_torch_from=declared.describe())


def parse_inline(setting: str) -> Dict[str, Any]:
    """The values of one `--config "key = value"` setting (ruff's inline form).

    Raises ConfigError when `setting` is not TOML, or names an unknown key or a bad value.
    """
    label = f"--config {setting!r}"
    try:
        table = tomllib.loads(setting)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"not an existing file, nor a TOML `key = value` setting ({exc})", label
        ) from None
    if not table:
        raise ConfigError("not an existing file, nor a TOML `key = value` setting", label)
    return parse_table(table, label)


def resolve_settings(config: Sequence[str], start: str) -> Settings:
    """Settings for a run: `--config` values (files and inline settings) over the nearest file.

    As in ruff: at most one file; inline `key = value` settings override every file, and the
    nearest pyproject.toml with our table is used when no file is named.
    """
    files = [value for value in config if _looks_like_file(value)]
    if len(files) > 1:
        raise ConfigError(f"--config names {len(files)} files; at most one is allowed", files[1])
    overrides: Dict[str, Any] = {}
    for value in config:
        if value not in files:
            overrides.update(parse_inline(value))
    if files:
        settings = load_settings(Path(files[0]), explicit=True)
    else:
        settings = load_settings(find_config(start), start=start)
    inline = tuple(value for value in config if value not in files)
    if not inline:
        return settings
    return replace(settings, **overrides, inline=inline).with_overrides(
        target_torch=overrides.get("target_torch")
    )


def _looks_like_file(value: str) -> bool:
    # An inline setting always has `=`; a path to a file may too, so the file system decides
    # first, and a `.toml` name that does not exist is reported as a missing file.
    return os.path.exists(value) or value.endswith(".toml") or "=" not in value


def _fail(path: str, key: str, problem: str) -> ConfigError:
    return ConfigError(f"[{TABLE}] {key}: {problem}", path)


def _codes(path: str, key: str, value: Any) -> Tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, key, f"expected a list of rule codes, got {value!r}")
    return tuple(validate_codes(value, key, path))


def validate_codes(codes: Sequence[str], key: str, path: Optional[str] = None) -> List[str]:
    result = []
    for code in codes:
        code = code.strip().upper()
        if not code:
            continue
        if not is_known_prefix(code):
            known = [rule.code for rule in all_rules()]
            hint = difflib.get_close_matches(code, known, n=1)
            suggestion = f" (did you mean {hint[0]}?)" if hint else ""
            raise ConfigError(f"{key}: unknown rule code or prefix {code!r}{suggestion}", path)
        result.append(code)
    return result


def _bool(path: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, key, f"expected true or false, got {value!r}")
    return value


def _strings(path: str, key: str, value: Any) -> Tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, key, f"expected a list of strings, got {value!r}")
    return tuple(value)


def _string(path: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(path, key, f"expected a folder name, got {value!r}")
    return value


def _one_of(choices: Tuple[str, ...]):
    def parse(path: str, key: str, value: Any) -> str:
        if value not in choices:
            raise _fail(
                path, key, f"expected one of {', '.join(map(repr, choices))}, got {value!r}"
            )
        return value

    return parse


def _version(path: str, key: str, value: Any) -> TorchVersion:
    if isinstance(value, float):
        raise _fail(path, key, f'write the version as a string, for example "{value}"')
    try:
        return TorchVersion.parse(str(value))
    except ValueError as exc:
        raise _fail(path, key, str(exc)) from None


def _per_file_ignores(path: str, key: str, value: Any):
    if not isinstance(value, dict):
        raise _fail(path, key, "expected a table of glob = [codes]")
    return tuple(
        (pattern, _codes(path, f"{key}.{pattern!r}", codes)) for pattern, codes in value.items()
    )


_PARSERS: Dict[str, Tuple[str, Any]] = {
    "select": ("select", _codes),
    "ignore": ("ignore", _codes),
    "extend-select": ("extend_select", _codes),
    "extend-ignore": ("extend_ignore", _codes),
    "per-file-ignores": ("per_file_ignores", _per_file_ignores),
    "unsafe-fixes": ("unsafe_fixes", _bool),
    "extend-safe-fixes": ("extend_safe_fixes", _codes),
    "extend-unsafe-fixes": ("extend_unsafe_fixes", _codes),
    "target-torch": ("target_torch", _version),
    "precision": ("precision", _one_of(PRECISIONS)),
    "target-device": ("target_device", _one_of(TARGET_DEVICES)),
    "exclude": ("exclude", _strings),
    "force-exclude": ("force_exclude", _bool),
    "respect-gitignore": ("respect_gitignore", _bool),
    "exclude-tests": ("exclude_tests", _bool),
    "cache-dir": ("cache_dir", _string),
}
CONFIG_KEYS = tuple(_PARSERS)


def parse_table(table: Dict[str, Any], path: str) -> Dict[str, Any]:
    values = {}
    for key, value in table.items():
        if key not in _PARSERS:
            hint = difflib.get_close_matches(key, CONFIG_KEYS, n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            known = ", ".join(CONFIG_KEYS)
            raise ConfigError(
                f"[{TABLE}] unknown key {key!r}{suggestion}; known keys: {known}", path
            )
        attribute, parser = _PARSERS[key]
        values[attribute] = parser(path, key, value)
    return values

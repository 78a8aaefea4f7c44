"""The content cache: what a run learned about a file, so that an unchanged file costs a hash.

As in ruff, an entry is keyed by everything the outcome depends on: the file's bytes and the
path it is reported under, the effective settings, the formatting the file's project asks
for (black's configuration and version), what the other files of the run tell it (the
project index's facts: the calls into it, the scripts that run its loops), and the tool itself (its version and a digest of its
own sources, so that an edited rule never answers from an older rule's entry). An entry holds
the outcome `rewrite_source` returned: the new bytes when they differ, the diagnostics, the
texts a diff shows, and any skip reason or warning. Errors are not cached: a file that failed
is looked at again on the next run.

The folder is `.optcodemod_cache` beside the configuration (or in the working directory),
`cache-dir` in `[tool.optcodemod]`, or `$OPTCODEMOD_CACHE_DIR`; it holds a `.gitignore` that
ignores all of it. Entries are written to a temporary file in their folder and renamed into
place, so parallel runs never see half an entry; each carries a digest of its content, so a
damaged one reads as a miss.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Mapping, Optional, Sequence

from optimizer_codemod import __version__
from optimizer_codemod.diagnostics import Diagnostic, Status
from optimizer_codemod.rule import Safety

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.api import SourceRewrite
    from optimizer_codemod.config import Settings

FOLDER_NAME = ".optcodemod_cache"
ENV_FOLDER = "OPTCODEMOD_CACHE_DIR"
ENV_DISABLE = "OPTCODEMOD_NO_CACHE"
_MAGIC = b"optcodemod-cache 1 "
_GITIGNORE = "# Created by optcodemod: a cache of results, safe to delete.\n*\n"


@dataclasses.dataclass(frozen=True)
class Cache:
    """A cache folder (picklable: worker processes open the same one)."""

    folder: str

    def key(self, src: bytes, path: str, settings: "Settings", project: object = None) -> str:
        """`project`: what the other files of the run told this one (analysis/project.py):
        a change to the script that calls a trainer changes the trainer's rewrite."""
        digest = hashlib.sha256()
        parts = (tool_fingerprint(), path, _settings_text(settings), _style_text(path))
        if project is not None:
            parts += (repr(project),)
        for part in parts:
            digest.update(part.encode("utf-8", "surrogateescape"))
            digest.update(b"\0")
        digest.update(src)
        return digest.hexdigest()

    def project_index(
        self,
        paths: Sequence[str],
        build: Callable[[Sequence[str]], dict],
        context: Sequence[str] = (),
        sources: Optional[Mapping[str, bytes]] = None,
    ) -> dict:
        """The project index (analysis/project.py) of `paths`, stored under a digest of every
        file's path and bytes, the modules read as `context` too: a warm run of an unchanged
        folder parses nothing for it. `sources`: bytes that stand for a file's (by path as
        given), as `build` reads them."""
        sources = sources or {}
        from optimizer_codemod.analysis.project import from_json, to_json

        digest = hashlib.sha256(tool_fingerprint().encode())
        for group in (paths, context):
            digest.update(b"\0files")
            for path in sorted(group):
                try:
                    data = sources[path] if path in sources else Path(path).read_bytes()
                except OSError:
                    data = b"\0unreadable"
                digest.update(path.encode("utf-8", "surrogateescape") + b"\0")
                digest.update(hashlib.sha256(data).digest())
        key = digest.hexdigest()
        entry = Path(self.folder) / tool_fingerprint()[:16] / "project" / key
        try:
            body = entry.read_bytes()
            stored, _, text = body.partition(b"\n")
            if hashlib.sha256(text).hexdigest().encode("ascii") == stored:
                return from_json(json.loads(text))
        except Exception:  # absent or damaged: built again
            pass
        index = build(paths)
        text = json.dumps(to_json(index), ensure_ascii=True).encode("ascii")
        try:
            self._prepare(entry.parent)
            stored = hashlib.sha256(text).hexdigest().encode("ascii")
            write_atomically(entry, stored + b"\n" + text)
        except OSError:
            pass
        return index

    def _entry(self, key: str) -> Path:
        return Path(self.folder) / tool_fingerprint()[:16] / key[:2] / key

    def get(self, key: str, src: bytes) -> Optional["SourceRewrite"]:
        """The outcome stored for `key` (whose bytes are `src`), or None."""
        try:
            data = self._entry(key).read_bytes()
        except OSError:
            return None
        try:
            return _decode(data, src)
        except Exception:  # a damaged or foreign entry is a miss; the next store replaces it
            return None

    def put(self, key: str, result: "SourceRewrite") -> None:
        entry = self._entry(key)
        try:
            self._prepare(entry.parent)
            write_atomically(entry, _encode(result))
        except OSError:
            pass  # a cache that cannot be written (read-only checkout, full disk) is no cache

    def _prepare(self, folder: Path) -> None:
        if folder.is_dir():
            return
        root = Path(self.folder)
        root.mkdir(parents=True, exist_ok=True)
        ignore = root / ".gitignore"
        if not ignore.exists():
            write_atomically(ignore, _GITIGNORE.encode("utf-8"))
        folder.mkdir(parents=True, exist_ok=True)


def open_cache(settings: "Settings", enabled: bool = True) -> Optional[Cache]:
    """The cache for a run under `settings`, or None when caching is off."""
    if not enabled or os.environ.get(ENV_DISABLE, "") not in ("", "0"):
        return None
    folder = os.environ.get(ENV_FOLDER) or settings.cache_dir or FOLDER_NAME
    return Cache(os.path.abspath(os.path.join(settings.root, os.path.expanduser(folder))))


@lru_cache(maxsize=1)
def tool_fingerprint() -> str:
    """The tool's version, its sources' digest and the parser's and Python's versions."""
    digest = hashlib.sha256(f"{__version__}\0{sys.version_info[:2]}\0".encode())
    try:
        from importlib.metadata import version

        digest.update(version("libcst").encode())
    except Exception:  # pragma: no cover - libcst is a dependency
        pass
    for file in _tool_sources():
        digest.update(file.name.encode())
        try:
            digest.update(file.read_bytes())
        except OSError:
            digest.update(b"unreadable")
    return digest.hexdigest()


def _tool_sources() -> List[Path]:
    import importlib.util

    package = Path(__file__).resolve().parent
    folders = [package]
    spec = importlib.util.find_spec("optimizer_codemod.transforms")
    for location in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(location).resolve()
        if package not in folder.parents:
            folders.append(folder)
    return sorted(
        (file for folder in folders for file in folder.rglob("*.py")),
        key=lambda p: p.as_posix(),
    )


def _settings_text(settings: "Settings") -> str:
    # Where results are stored does not change them.
    return repr(dataclasses.replace(settings, cache_dir=None))


def _style_text(path: str) -> str:
    from optimizer_codemod.formatting import black_style_for

    style = black_style_for(path)
    if style is None:
        return "no formatter"
    try:
        from importlib.metadata import version

        black = version("black")
    except Exception:
        black = "absent"
    return f"{style!r} black {black}"


# The entry format: magic, the digest of the body, newline, then the body: one line of JSON,
# a newline, and the new bytes when the file changed.
def _encode(result: "SourceRewrite") -> bytes:
    header = {
        "changed": result.changed,
        "new": result.changed,
        "diagnostics": [_diagnostic_json(d) for d in result.diagnostics],
        "diff_parts": [list(part) for part in result.diff_parts],
        "skipped": result.skipped,
        "warning": result.warning,
        "formatted": result.formatted,
    }
    body = json.dumps(header, ensure_ascii=True).encode("ascii") + b"\n"
    if result.changed:
        body += result.new
    return _MAGIC + hashlib.sha256(body).hexdigest().encode("ascii") + b"\n" + body


def _decode(data: bytes, src: bytes) -> Optional["SourceRewrite"]:
    from optimizer_codemod.api import SourceRewrite

    if not data.startswith(_MAGIC):
        return None
    digest, _, body = data[len(_MAGIC) :].partition(b"\n")
    if hashlib.sha256(body).hexdigest().encode("ascii") != digest:
        return None
    line, _, new = body.partition(b"\n")
    header = json.loads(line)
    return SourceRewrite(
        new=new if header["new"] else src,
        changed=bool(header["changed"]),
        diagnostics=[_diagnostic_from(d) for d in header["diagnostics"]],
        diff_parts=[tuple(part) for part in header["diff_parts"]],
        skipped=header["skipped"],
        warning=header["warning"],
        formatted=header.get("formatted", True),
    )


def _diagnostic_json(diagnostic: Diagnostic) -> dict:
    record = dataclasses.asdict(diagnostic)
    record["safety"] = diagnostic.safety.name
    record["status"] = diagnostic.status.value
    return record


def _diagnostic_from(record: dict) -> Diagnostic:
    fields = dict(record)
    fields["safety"] = Safety[fields["safety"]]
    fields["status"] = Status(fields["status"])
    fields["edit_lines"] = tuple(tuple(pair) for pair in fields["edit_lines"])
    return Diagnostic(**fields)


def write_atomically(target: Path, data: bytes) -> None:
    # A temporary file in the same folder, then a rename: readers in other processes see the
    # old entry or the new one, never a part.
    handle, temporary = tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, target)
    except BaseException:
        _remove(temporary)
        raise


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

"""Reading, parsing and writing source files without losing a byte."""

from __future__ import annotations

import ast
import hashlib
import io
import os
import re
import signal
import stat
import tempfile
import tokenize
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Tuple

import libcst as cst

from optimizer_codemod import nesting
from optimizer_codemod.chunks import block_lines, in_blocks
from optimizer_codemod.errors import (
    FileAccessError,
    FileChangedError,
    SourceParseError,
    TooDeeplyNestedError,
    UnreproducibleSourceError,
)


def detect_encoding(src: bytes, path: str) -> str:
    """The PEP 263 encoding (BOM or cookie) of `src`; utf-8 when it declares none."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(src).readline)
    except SyntaxError as exc:
        raise SourceParseError(f"cannot parse: {exc.msg}", path, exc.lineno or 1, 1) from None
    return encoding


def decode_source(src: bytes, path: str) -> str:
    encoding = detect_encoding(src, path)
    try:
        return src.decode(encoding)
    except UnicodeDecodeError as exc:
        line = src.count(b"\n", 0, exc.start) + 1
        column = exc.start - (src.rfind(b"\n", 0, exc.start) + 1) + 1
        byte = src[exc.start : exc.start + 1].hex()
        advice = (
            "save the file as UTF-8 or declare its encoding with a PEP 263 cookie"
            " (for example `# -*- coding: latin-1 -*-`)"
            if encoding in ("utf-8", "utf-8-sig")
            else "the file does not match its declared encoding"
        )
        raise SourceParseError(
            f"cannot decode as {encoding}: byte 0x{byte} is invalid; {advice}", path, line, column
        ) from None


def parse_source(src: bytes, path: str, nesting_checked: bool = False) -> cst.Module:
    """Parse `src` with LibCST; a syntax error names `path:line:col` as Python reports it."""
    text = decode_source(src, path)
    if not nesting_checked:
        check_nesting(src, text, path)
    try:
        return cst.parse_module(src)
    except cst.ParserSyntaxError as exc:
        line, column, message = exc.raw_line, exc.raw_column + 1, exc.message
    except (SyntaxError, ValueError) as exc:  # encoding problems LibCST found first
        line, column, message = 1, 1, str(exc)
    # Python's own parser locates errors better than LibCST's; prefer it when it agrees
    # that the text is broken.
    python_error = python_syntax_error(text, path)
    if python_error is not None:
        line, column, message = python_error
    raise SourceParseError(f"cannot parse: {message}", path, line, column)


def check_nesting(src: bytes, text: str, path: str) -> None:
    """Refuse, before LibCST parses it, a text nested too deeply for its parser.

    LibCST's parser crashes the process on an expression a few thousand levels deep, and it
    accepts bracket nesting CPython rejects; Python's own verdict is preferred when it has one.
    """
    depth, brackets = nesting.estimate(src)
    if depth <= nesting.MAX_NESTING and brackets <= nesting.PYTHON_MAX_BRACKETS:
        return
    python_error = python_syntax_error(text, path)
    if python_error is not None and python_error[2] != _TOO_DEEP_FOR_PYTHON:
        line, column, message = python_error
        raise SourceParseError(f"cannot parse: {message}", path, line, column)
    if depth <= nesting.MAX_NESTING:
        return
    raise TooDeeplyNestedError(
        f"too deeply nested for the parser (this statement nests up to {depth} levels; at "
        f"most {nesting.MAX_NESTING} are accepted); left untouched",
        path,
        nesting.deepest_line(src),
        1,
    )


def check_syntax(src: bytes, path: str) -> None:
    """Raise SourceParseError (`path:line:col`) unless `src` is valid Python.

    The cheap check for files the pre-filter settles without a LibCST parse: Python's own
    `compile` costs a fraction of a LibCST parse, and a syntax error must never pass silently.
    """
    error = python_syntax_error(decode_source(src, path), path)
    if error is not None:
        line, column, message = error
        raise SourceParseError(f"cannot parse: {message}", path, line, column)


_TOO_DEEP_FOR_PYTHON = "too deeply nested: Python's own compiler gives up on this text"


def _compile_flags(path: str) -> int:
    """A notebook's cells run in IPython, where a top-level `await` is valid (autoawait)."""
    return ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if path.endswith(".ipynb") else 0


def python_syntax_error(text: str, path: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, path, "exec", flags=_compile_flags(path), dont_inherit=True)
    except SyntaxError as exc:
        return exc.lineno or 1, exc.offset or 1, exc.msg
    except ValueError as exc:  # null bytes
        return 1, 1, str(exc)
    except (RecursionError, MemoryError):
        # CPython's compiler runs out of recursion (a 3,000-term `a+a+...`) or of parser
        # stack (`not not ... x`); the file cannot run under Python either.
        return 1, 1, _TOO_DEEP_FOR_PYTHON
    return None


def check_reproducible(
    module: cst.Module, src: bytes, path: str, printed: Optional[bytes] = None
) -> None:
    """Refuse a file LibCST would not print back identically (it would lose text).

    `printed`: `module.bytes` when the caller has printed the module already.
    """
    printed = module.bytes if printed is None else printed
    if printed == src:
        return
    old_lines = src.splitlines(keepends=True)
    new_lines = printed.splitlines(keepends=True)
    line = next(
        (i + 1 for i, (a, b) in enumerate(zip(old_lines, new_lines)) if a != b),
        min(len(old_lines), len(new_lines)) + 1,
    )
    raise UnreproducibleSourceError(
        "LibCST cannot reproduce this file byte for byte (first difference at line "
        f"{line}); left untouched. A known cause is an indented comment before a "
        "whitespace-only last line: removing that trailing whitespace lets it be rewritten.",
        path,
    )


def compile_check(code: bytes, path: str) -> Tuple[bool, str]:
    """Whether `code` compiles as Python; the error text if it does not. A long text is
    compiled in blocks of whole statements (chunks.in_blocks: compiling 50,000 lines at once
    holds 150 MB), the whole text again only to name an error."""
    lines = block_lines(code)
    if lines is not None:

        def compiles(text: str, first: int) -> Optional[bool]:
            # A `__future__` import compiles alone, but only at the start of a file.
            if first and "__future__" in text:
                return None
            return True if _compile(text.encode("utf-8"), path)[0] else None

        if in_blocks(lines, compiles) is not None:
            return True, ""
    return _compile(code, path)


def _compile(code: bytes, path: str) -> Tuple[bool, str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(code, path, "exec", flags=_compile_flags(path), dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        where = f"{getattr(exc, 'lineno', '?')}:{getattr(exc, 'offset', '?')}"
        return False, f"{where}: {getattr(exc, 'msg', exc)}"
    except (RecursionError, MemoryError):
        return False, _TOO_DEEP_FOR_PYTHON
    return True, ""


@dataclass(frozen=True)
class FileStamp:
    """What a file was when it was read: compared again just before it is replaced."""

    size: int
    mtime_ns: int
    inode: int
    device: int
    sha256: str

    @classmethod
    def of(cls, st: os.stat_result, data: bytes) -> "FileStamp":
        digest = hashlib.sha256(data).hexdigest()
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, digest)


def read_bytes(path: str) -> bytes:
    return _read(path, stamped=False)[0]


def read_source(path: str) -> Tuple[bytes, FileStamp]:
    """The file's bytes and its stamp (taken after reading, so a write during the read shows)."""
    data, stamp = _read(path, stamped=True)
    assert stamp is not None
    return data, stamp


def _read(path: str, stamped: bool) -> Tuple[bytes, Optional[FileStamp]]:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
            return data, FileStamp.of(os.fstat(handle.fileno()), data) if stamped else None
    except FileNotFoundError:
        raise FileAccessError("no such file or directory", path) from None
    except IsADirectoryError:
        raise FileAccessError("is a directory, expected a file", path) from None
    except PermissionError:
        raise FileAccessError("permission denied while reading", path) from None
    except OSError as exc:
        raise FileAccessError(f"cannot read: {exc.strerror or exc}", path) from None


TEMP_PREFIX = ".optcodemod-"
TEMP_SUFFIX = ".tmp"
# The pid in a temporary file's name says whether the run that made it is still alive.
_TEMP_RE = re.compile(r"^\.optcodemod-(\d+)-.*\.tmp$")
_DEFERRED_SIGNALS = {
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
}


def write_atomic(
    path: str,
    data: bytes,
    expected: Optional[FileStamp] = None,
    on_replaced: Optional[Callable[[str], None]] = None,
) -> None:
    """Replace the file at `path` by `data` atomically, keeping what makes it that file.

    A symbolic link is written through: its target is replaced and the link stays. The
    replacement keeps the permission bits, owner and group. It is refused, with the file left
    as it is, when the file is read-only, has several hard links (replacing it would split
    them), belongs to an owner this process cannot give the new file, or no longer matches
    `expected` (someone saved it during the run). The folder is synced after the rename, and
    SIGINT, SIGTERM and SIGHUP wait until the file is either the old one or the new one and
    no temporary file is left; `on_replaced(path)` runs before they can, so a caller that is
    interrupted still knows the file was written.
    """
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as exc:
        raise FileAccessError(f"cannot stat before writing: {exc.strerror}", path) from None
    if not os.access(real, os.W_OK):
        raise FileAccessError("file is read-only; not rewritten", path)
    if st.st_nlink > 1:
        raise FileAccessError(
            f"has {st.st_nlink} hard links, and replacing it would split them; not rewritten "
            "(run with --diff and apply the patch, or break the links first)",
            path,
        )
    folder = os.path.dirname(real)
    with _signals_deferred():
        try:
            fd, tmp = tempfile.mkstemp(
                prefix=f"{TEMP_PREFIX}{os.getpid()}-", suffix=TEMP_SUFFIX, dir=folder
            )
        except OSError as exc:
            raise FileAccessError(
                f"cannot create a temporary file in {folder}: {exc.strerror or exc}; "
                "not rewritten",
                path,
            ) from None
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            _keep_owner(tmp, st, path)
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
            if expected is not None:
                _check_unchanged(real, expected, path)
            os.replace(tmp, real)
        except BaseException as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise FileAccessError(f"cannot write: {exc.strerror or exc}", path) from None
            raise
        if on_replaced is not None:
            on_replaced(path)
        _sync_folder(folder)


def _keep_owner(tmp: str, st: os.stat_result, path: str) -> None:
    mine = os.stat(tmp)
    if (mine.st_uid, mine.st_gid) == (st.st_uid, st.st_gid):
        return
    try:
        os.chown(tmp, st.st_uid, st.st_gid)
    except PermissionError:
        raise FileAccessError(
            f"belongs to uid {st.st_uid} gid {st.st_gid}, which this user cannot give the "
            "rewritten file; not rewritten",
            path,
        ) from None


def _check_unchanged(real: str, expected: FileStamp, path: str) -> None:
    try:
        with open(real, "rb") as handle:
            data = handle.read()
            now = FileStamp.of(os.fstat(handle.fileno()), data)
    except OSError:
        now = None
    if now != expected:
        raise FileChangedError(
            "changed on disk while optcodemod was working on it; left as it is now, not "
            "rewritten (run again to rewrite the new text)",
            path,
        )


def _sync_folder(folder: str) -> None:
    # The rename is durable only once the folder's entry is on disk.
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(folder, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot sync a folder
    finally:
        os.close(fd)


@contextmanager
def _signals_deferred() -> Iterator[None]:
    if not _DEFERRED_SIGNALS or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def remove_stale_temporaries(folders) -> None:
    """Remove temporary files that a killed run (SIGKILL while writing) left in `folders`."""
    for folder in folders:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            match = _TEMP_RE.match(name)
            if match is None or _process_alive(int(match.group(1))):
                continue
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


def _process_alive(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":
        return True  # on Windows os.kill would terminate the process, not probe it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process, or no way to tell: keep its file
    return True

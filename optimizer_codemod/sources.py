"""Reading, parsing and writing source files without losing a byte."""

from __future__ import annotations

import io
import os
import stat
import tempfile
import tokenize
import warnings
from typing import Optional, Tuple

import libcst as cst

from optimizer_codemod.errors import (
    FileAccessError,
    SourceParseError,
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


def parse_source(src: bytes, path: str) -> cst.Module:
    """Parse `src` with LibCST; a syntax error names `path:line:col` as Python reports it."""
    text = decode_source(src, path)
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


def check_syntax(src: bytes, path: str) -> None:
    """Raise SourceParseError (`path:line:col`) unless `src` is valid Python.

    The cheap check for files the pre-filter settles without a LibCST parse: Python's own
    `compile` costs a fraction of a LibCST parse, and a syntax error must never pass silently.
    """
    error = python_syntax_error(decode_source(src, path), path)
    if error is not None:
        line, column, message = error
        raise SourceParseError(f"cannot parse: {message}", path, line, column)


def python_syntax_error(text: str, path: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return exc.lineno or 1, exc.offset or 1, exc.msg
    except ValueError as exc:  # null bytes
        return 1, 1, str(exc)
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
    """Whether `code` compiles as Python; the error text if it does not."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(code, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        where = f"{getattr(exc, 'lineno', '?')}:{getattr(exc, 'offset', '?')}"
        return False, f"{where}: {getattr(exc, 'msg', exc)}"
    return True, ""


def read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise FileAccessError("no such file or directory", path) from None
    except IsADirectoryError:
        raise FileAccessError("is a directory, expected a file", path) from None
    except PermissionError:
        raise FileAccessError("permission denied while reading", path) from None
    except OSError as exc:
        raise FileAccessError(f"cannot read: {exc.strerror or exc}", path) from None


def write_atomic(path: str, data: bytes) -> None:
    """Replace `path` by `data` atomically, keeping its permission bits.

    A read-only file is refused rather than replaced: replacing would silently defeat the
    permission the user set.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        raise FileAccessError(f"cannot stat before writing: {exc.strerror}", path) from None
    if not os.access(path, os.W_OK):
        raise FileAccessError("file is read-only; not rewritten", path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".optcodemod-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise FileAccessError(f"cannot write: {exc.strerror or exc}", path) from None
        raise

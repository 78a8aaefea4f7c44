"""Suppression comments: `# noqa`, `# noqa: OPT201,OPT501` and `# optcodemod: skip-file`."""

from __future__ import annotations

import io
import re
import tokenize
from typing import Dict, FrozenSet, Optional

SKIP_FILE_RE = re.compile(
    rb"^(?:\xef\xbb\xbf)?[ \t]*#[ \t]*optcodemod:[ \t]*skip-file\b", re.MULTILINE
)
_SKIP_FILE_COMMENT_RE = re.compile(r"#[ \t]*optcodemod:[ \t]*skip-file\b")
# `noqa` must end there (ruff's reading): `# noqa-ish` or `# noqa_foo` is not a suppression.
_NOQA_RE = re.compile(
    r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:\s*[,\s]\s*[A-Z]+[0-9]+)*))?(?=$|[\s:,#])",
    re.IGNORECASE,
)
_CODE_RE = re.compile(r"[A-Z]+[0-9]+", re.IGNORECASE)

# None in the map means a bare `# noqa`: every code is suppressed on that line.
NoqaMap = Dict[int, Optional[FrozenSet[str]]]


def has_skip_file(src: bytes) -> bool:
    """Whether a comment line says `# optcodemod: skip-file` (a docstring that does, does not)."""
    if SKIP_FILE_RE.search(src) is None:
        return False  # the cheap test settles almost every file
    try:
        for token in tokenize.tokenize(io.BytesIO(src).readline):
            if (
                token.type == tokenize.COMMENT
                and not token.line[: token.start[1]].strip()
                and _SKIP_FILE_COMMENT_RE.match(token.string)
            ):
                return True
    except (tokenize.TokenError, SyntaxError):
        return True  # not Python (a notebook's JSON, or broken text): trust the line as written
    return False


def noqa_lines(code: str) -> NoqaMap:
    """Line number -> suppressed codes, from real comments only (not strings)."""
    if "noqa" not in code.lower():
        return {}
    found: NoqaMap = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return found
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        match = _NOQA_RE.search(token.string)
        if not match:
            continue
        line = token.start[0]
        if match.group("codes") is None:
            found[line] = None
        elif found.get(line, frozenset()) is not None:
            codes = frozenset(c.upper() for c in _CODE_RE.findall(match.group("codes")))
            found[line] = found.get(line, frozenset()) | codes
    return found


def is_suppressed(noqa: NoqaMap, code: str, first_line: int, last_line: int) -> bool:
    for line in {first_line, last_line}:
        if line in noqa:
            codes = noqa[line]
            if codes is None or code in codes:
                return True
    return False

"""Finds the rules: every module in the transforms package registers its Rule subclasses."""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache
from typing import Iterable, List, Sequence

from optimizer_codemod.rule import TRANSFORMS_PACKAGE


@lru_cache(maxsize=None)
def load_transforms() -> None:
    package = importlib.import_module(TRANSFORMS_PACKAGE)
    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{TRANSFORMS_PACKAGE}.{module.name}")


def all_rules() -> Sequence[type]:
    from optimizer_codemod.rule import registered_rules

    return registered_rules()


def rule_by_code(code: str) -> type:
    for rule in all_rules():
        if rule.code == code.upper():
            return rule
    raise KeyError(code)


def matches_prefix(code: str, prefix: str) -> bool:
    prefix = prefix.upper()
    return prefix == "ALL" or code.startswith(prefix)


def _specificity(prefix: str) -> int:
    return 0 if prefix.upper() == "ALL" else len(prefix)


def is_known_prefix(prefix: str) -> bool:
    return any(matches_prefix(rule.code, prefix) for rule in all_rules())


def select_rules(
    select: Iterable[str], ignore: Iterable[str], rules: Sequence[type] = ()
) -> List[type]:
    """Rules whose code matches a `select` prefix and no more specific `ignore` prefix.

    As in ruff, the longer of two matching prefixes wins, so `--select OPT501 --ignore OPT5`
    keeps OPT501.
    """
    select, ignore = list(select), list(ignore)
    chosen = []
    for rule in rules or all_rules():
        best_select = max(
            (_specificity(p) for p in select if matches_prefix(rule.code, p)), default=-1
        )
        best_ignore = max(
            (_specificity(p) for p in ignore if matches_prefix(rule.code, p)), default=-1
        )
        if best_select >= 0 and best_select > best_ignore:
            chosen.append(rule)
    return chosen

"""The rule framework: metadata every rule carries, the edits it may propose, registration.

A rule is a read-only LibCST visitor. It never changes the tree; it reports findings, each with
an optional fix made of small edits on original nodes. The engine runs every selected rule in
one batched traversal, resolves conflicts between fixes and applies them (see engine.py).
"""

from __future__ import annotations

import enum
import re
import textwrap
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    ClassVar,
    FrozenSet,
    Iterable,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import libcst as cst

from optimizer_codemod.torch_version import TorchVersion

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis import ScriptFacts
    from optimizer_codemod.engine import FileContext

TRANSFORMS_PACKAGE = "optimizer_codemod.transforms"
_CODE_RE = re.compile(r"^OPT[1-9][0-9]{2}$")
_NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
DOCSTRING_SECTIONS = (
    "What it does",
    "Why is it slow",
    "Example",
    "Fix safety",
    "Expected gain",
)


class Safety(enum.IntEnum):
    """How far a fix may change what the script computes; ordered from least to most."""

    SAFE = 0
    NUMERICS = 1
    BEHAVIOR = 2
    SUGGEST = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> "Safety":
        try:
            return cls[text.upper()]
        except KeyError:
            choices = ", ".join(s.label for s in cls)
            raise ValueError(f"unknown safety level {text!r} (choose from {choices})")


SAFETY_DESCRIPTIONS = {
    Safety.SAFE: "same results bit for bit (or up to summation order inside one kernel)",
    Safety.NUMERICS: "same algorithm; floating-point results change within a stated tolerance",
    Safety.BEHAVIOR: "observable behaviour changes; applied only with --unsafe-fixes",
    Safety.SUGGEST: "reported, never applied: no sound rewrite exists",
}

# Why a fix in the fallback of a feature check is dropped (guards.py), for --why-not.
FALLBACK_REASON = (
    "the code runs when a feature is missing (the fallback of a feature check: an `except "
    "ImportError` handler, the `else` of a `hasattr` test, an old-torch branch): a rewrite "
    "there would bring back what the branch exists to do without"
)


@dataclass(frozen=True)
class ImportSpec:
    """An import a fix needs: `import module` or `from module import obj [as asname]`."""

    module: str
    obj: Optional[str] = None
    asname: Optional[str] = None


@dataclass(frozen=True)
class Replace:
    """Replace `node` (an original node) by `new`; `cst.RemovalSentinel.REMOVE` deletes it."""

    node: cst.CSTNode
    new: Union[cst.CSTNode, cst.FlattenSentinel, cst.RemovalSentinel]


@dataclass(frozen=True)
class InsertStatements:
    """Insert statements before and/or after `anchor`, a statement in a body or the module.

    Inserts on the same anchor compose; edits inside the anchor compose with them too.
    """

    anchor: cst.BaseStatement
    before: Tuple[cst.BaseStatement, ...] = ()
    after: Tuple[cst.BaseStatement, ...] = ()


Edit = Union[Replace, InsertStatements]


@dataclass(frozen=True)
class Fix:
    edits: Tuple[Edit, ...]
    imports: Tuple[ImportSpec, ...] = ()

    @classmethod
    def replacing(cls, pairs: Iterable[Tuple[cst.CSTNode, cst.CSTNode]]) -> "Fix":
        """A fix of (node, what replaces it) pairs, as the analysis hands them out."""
        return cls(tuple(Replace(node, new) for node, new in pairs))


@dataclass
class Finding:
    """What a rule reports: a location (`node`), a message, a safety level, maybe a fix."""

    rule: type
    node: cst.CSTNode
    message: str
    safety: Safety
    fix: Optional[Fix]
    fix_title: str
    declined: bool = False  # a site examined and left alone; `message` says why


@dataclass(frozen=True)
class Example:
    """A documented case: `after is None` means the rule must leave `before` unchanged."""

    before: str
    after: Optional[str] = None
    options: Tuple[Tuple[str, str], ...] = ()

    @property
    def changes(self) -> bool:
        return self.after is not None


_REGISTRY: dict = {}


class Rule(cst.BatchableCSTVisitor):
    """Base class of every rule. Subclasses in `transforms/` register themselves.

    Class attributes describe the rule; `visit_*`/`leave_*` methods find the pattern and call
    `self.report(...)`. Shared facts about the script come from `self.facts` (computed once per
    pass, only when some rule asks).
    """

    code: ClassVar[str]
    name: ClassVar[str]
    message: ClassVar[str]
    fix_title: ClassVar[str]
    safety: ClassVar[Safety]
    min_torch: ClassVar[TorchVersion] = TorchVersion.parse("1.0")
    # The `target-device` values (engine.TARGET_DEVICES) the rule runs for: a rule whose
    # rewrite only pays off on one device is not selected for the other (config.py), as a
    # rule newer than target-torch is not.
    target_devices: ClassVar[Tuple[str, ...]] = ("cuda", "cpu")
    # Regular expressions over the raw file bytes: a file matching none of the selected rules'
    # triggers is never parsed. Keep them necessary conditions for a finding, and cheap.
    triggers: ClassVar[Tuple[str, ...]]
    # Patterns that must all match as well (a finding needs each of them), for rules whose
    # trigger alone is common: `requires = (BACKWARD_CALL,)` keeps library modules unparsed.
    requires: ClassVar[Tuple[str, ...]] = ()
    # A process-wide setting (TF32, cudnn.benchmark) that belongs in the script running a
    # training loop: the rule also runs on a script whose loops are in other modules of the
    # run (analysis/project.py), whatever its text holds.
    process_wide: ClassVar[bool] = False
    # A per-model rule that also examines the models such a script builds and hands to those
    # loops (analysis/entry_points.py), whatever its text holds.
    examines_entry_points: ClassVar[bool] = False
    examples: ClassVar[Tuple[Example, ...]] = ()
    # The kinds of per-step host sync the rule's fixes take off the step (analysis/syncs.py),
    # with the least safe level of those fixes. Removing one of two per-step syncs gains
    # nothing, so a sync-removing fix is made only when every sync of its step goes: rules
    # ask which kinds the other selected rules will remove in the same run.
    removes_syncs: ClassVar[Mapping[str, Safety]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("abstract", False):
            return
        _validate_rule_class(cls)
        if cls.__module__.startswith(TRANSFORMS_PACKAGE + "."):
            existing = _REGISTRY.get(cls.code)
            if existing is not None and existing.__qualname__ != cls.__qualname__:
                raise TypeError(f"rule code {cls.code} used by {existing} and {cls}")
            _REGISTRY[cls.code] = cls

    def __init__(self, context: "FileContext") -> None:
        super().__init__()
        self.context = context
        self.findings: list = []

    @property
    def facts(self) -> "ScriptFacts":
        return self.context.facts

    @property
    def in_notebook(self) -> bool:
        return self.context.path.endswith(".ipynb")

    @property
    def runs_as_script(self) -> bool:
        """The file is run, not imported (ScriptFacts.runs_as_script), or is a notebook,
        which nothing imports: its cells run top to bottom even where the training is a
        callback the analysis does not follow (ignite's `Engine(train_step).run(...)`)."""
        return self.facts.runs_as_script or self.in_notebook

    def sync_removals_applied(self) -> FrozenSet[str]:
        """The kinds of per-step sync that this run's fixes remove: those of this rule and of
        every other selected rule whose fixes at that level are applied (a `behavior` fix
        only with --unsafe-fixes)."""
        options = self.context.options
        kinds = {
            kind
            for kind, level in self.removes_syncs.items()
            if options.may_apply(self.code, max(level, self.safety))
        }
        for rule in options.rules:
            for kind, level in rule.removes_syncs.items():
                if options.may_apply(rule.code, max(level, rule.safety)):
                    kinds.add(kind)
        return frozenset(kinds)

    def report(
        self,
        node: cst.CSTNode,
        fix: Optional[Fix] = None,
        *,
        message: Optional[str] = None,
        safety: Optional[Safety] = None,
        fix_title: Optional[str] = None,
    ) -> None:
        """Report a finding at `node`. A finding without a fix is reported, never applied.

        `safety` may only lower the rule's level (a higher value), never raise it: an edit
        whose soundness the analysis cannot prove says so.
        """
        # Only edits are held back: a report changes nothing, and a rule that reports without
        # asking for facts must not pay for the whole file's (test_engine checks it).
        if fix is not None and self._in_feature_fallback(node, fix):
            self.decline(node, FALLBACK_REASON)
            return
        level = self.safety if safety is None else max(safety, self.safety)
        if fix is None:
            level = Safety.SUGGEST
        self.findings.append(
            Finding(
                rule=type(self),
                node=node,
                message=message or self.message,
                safety=level,
                fix=fix,
                fix_title=fix_title or self.fix_title,
            )
        )

    def decline(self, node: cst.CSTNode, reason: str) -> None:
        """Say why the site at `node`, which the rule examined, gets no fix: `apply
        --why-not` lists these, so that no miss is silent. `reason` is a sentence about this
        script ("no `__main__` guard: worker processes would re-run the script")."""
        if not self.context.options.why_not:
            return
        self.findings.append(
            Finding(
                rule=type(self),
                node=node,
                message=reason,
                safety=Safety.SUGGEST,
                fix=None,
                fix_title=self.fix_title,
                declined=True,
            )
        )

    def _in_feature_fallback(self, node: cst.CSTNode, fix: Optional[Fix]) -> bool:
        """The finding or one of its edits sits in code that runs when a feature is missing
        (the `else` of `if hasattr(F, "scaled_dot_product_attention")`, an `except
        ImportError` handler, the branch of an old-torch version check): no rule touches it,
        since every rewrite there would bring in what the branch exists to do without."""
        guards = self.facts.feature_guards
        edits = fix.edits if fix is not None else ()
        nodes = [node, *(e.node if isinstance(e, Replace) else e.anchor for e in edits)]
        return any(guards.in_fallback(n) for n in nodes)

    @classmethod
    def summary(cls) -> str:
        """The message, with the device limit when there is one (`rules`, the docs index)."""
        limit = cls.device_limit()
        return f"{cls.message} ({limit})" if limit else cls.message

    @classmethod
    def device_limit(cls) -> Optional[str]:
        """`CUDA targets only` and the like, for a rule limited to some `target-device`s."""
        if set(Rule.target_devices) <= set(cls.target_devices):
            return None
        return " and ".join(d.upper() for d in cls.target_devices) + " targets only"

    @classmethod
    def doc_sections(cls) -> dict:
        return parse_doc_sections(cls.__doc__ or "")


def parse_doc_sections(doc: str) -> dict:
    """Split a rule docstring into its `Heading:` sections (in DOCSTRING_SECTIONS order)."""
    text = textwrap.dedent(doc).strip("\n")
    # textwrap.dedent leaves the first line alone when it starts right after the quotes.
    lines = [line.rstrip() for line in textwrap.dedent("\n".join(text.splitlines())).splitlines()]
    sections: dict = {}
    current: Optional[str] = None
    for line in lines:
        heading = line.strip().rstrip(":")
        if line.strip().endswith(":") and heading in DOCSTRING_SECTIONS:
            current = heading
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {k: textwrap.dedent("\n".join(v)).strip("\n") for k, v in sections.items()}


def _validate_rule_class(cls: type) -> None:
    problems = []
    for attr in ("code", "name", "message", "fix_title", "safety", "triggers"):
        if not hasattr(cls, attr):
            problems.append(f"missing {attr}")
    if problems:
        raise TypeError(f"rule {cls.__qualname__}: " + ", ".join(problems))
    if not _CODE_RE.match(cls.code):
        raise TypeError(f"rule {cls.__qualname__}: code {cls.code!r} is not OPT###")
    if not _NAME_RE.match(cls.name):
        raise TypeError(f"rule {cls.code}: name {cls.name!r} is not kebab-case")
    if not isinstance(cls.safety, Safety):
        raise TypeError(f"rule {cls.code}: safety must be a Safety")
    if isinstance(cls.triggers, (str, bytes)) or not cls.triggers:
        raise TypeError(f"rule {cls.code}: triggers must be a non-empty tuple of patterns")
    if isinstance(cls.requires, (str, bytes)):
        raise TypeError(f"rule {cls.code}: requires must be a tuple of patterns")
    if isinstance(cls.target_devices, (str, bytes)) or not cls.target_devices:
        raise TypeError(f"rule {cls.code}: target_devices must be a non-empty tuple")
    for pattern in (*cls.triggers, *cls.requires):
        re.compile(pattern.encode())


def registered_rules() -> Sequence[type]:
    """Every rule in the transforms package, ordered by code."""
    from optimizer_codemod import registry

    registry.load_transforms()
    return [_REGISTRY[code] for code in sorted(_REGISTRY)]

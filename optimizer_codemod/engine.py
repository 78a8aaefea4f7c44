"""The rewrite loop for one source text: run rules, apply fixes, repeat to a fixpoint, verify.

Promises (DESIGN.md §4): every selected rule runs in one batched traversal with only the
metadata it asks for; passes repeat until nothing changes (bounded); every pass's output is
compiled and re-parsed, and a rule that broke it is named while the text is left as it was;
a text LibCST cannot print back byte for byte is refused before anything is changed.
"""

from __future__ import annotations

import inspect
import re
import traceback
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper

from optimizer_codemod.analysis.walk import walk
from optimizer_codemod.chunks import PieceCache, parse_in_pieces
from optimizer_codemod.diagnostics import Diagnostic, Status
from optimizer_codemod.errors import (
    NonConvergenceError,
    OptcodemodError,
    RuleBrokeOutputError,
)
from optimizer_codemod.fixes import apply_fixes, choose_compatible
from optimizer_codemod.linediff import opcodes
from optimizer_codemod.noqa import is_suppressed, noqa_lines
from optimizer_codemod.positions import StatementTexts, module_code, positions_and_code
from optimizer_codemod.rule import Finding, Rule, Safety
from optimizer_codemod.sources import (
    check_reproducible,
    check_nesting,
    check_syntax,
    compile_check,
    decode_source,
    parse_source,
)
from optimizer_codemod.torch_version import DEFAULT_TARGET, TorchVersion

MAX_PASSES = 10
# The 16-bit type autocast computes in: bfloat16 needs no loss scaling; float16 (for GPUs
# without bfloat16) comes with a GradScaler.
PRECISIONS = ("bf16", "fp16")
DEFAULT_PRECISION = "bf16"
# Where the rewritten script will train: the output runs on both, but is tuned for this one
# (fused attention under bfloat16 autocast is fast on CUDA and slow on CPU).
TARGET_DEVICES = ("cuda", "cpu")
DEFAULT_TARGET_DEVICE = "cuda"


@dataclass(frozen=True)
class RewriteOptions:
    """Everything that decides what the engine does with one text."""

    rules: Tuple[type, ...]
    target_torch: TorchVersion = DEFAULT_TARGET
    unsafe_fixes: bool = False
    # Code prefixes whose behaviour-level fixes apply without --unsafe-fixes, and whose
    # numerics-level fixes need it (ruff's extend-safe-fixes / extend-unsafe-fixes).
    extend_safe_fixes: Tuple[str, ...] = ()
    extend_unsafe_fixes: Tuple[str, ...] = ()
    precision: str = DEFAULT_PRECISION
    target_device: str = DEFAULT_TARGET_DEVICE
    why_not: bool = False  # rules also say which sites they examined and left alone, and why
    exclude_tests: bool = True  # a test module is left alone (api.collected_by_test_runners)
    # What the other modules of the run tell this file (analysis/project.py's ProjectFacts),
    # from the project index the runner builds; None for a file on its own.
    project: Any = None

    def may_apply(self, code: str, safety: Safety) -> bool:
        if safety is Safety.SUGGEST:
            return False
        if any(code.startswith(p) for p in self.extend_unsafe_fixes) and safety > Safety.SAFE:
            return self.unsafe_fixes
        if safety is Safety.BEHAVIOR:
            return self.unsafe_fixes or any(code.startswith(p) for p in self.extend_safe_fixes)
        return True


class FileContext:
    """What a rule may ask about the file in the current pass."""

    def __init__(self, path: str, module: cst.Module, options: RewriteOptions, source: bytes):
        self.path = path
        self.module = module
        self.options = options
        # The text `module` was parsed from: a word absent from it is in no node either.
        self.source = source

    def mentions(self, *words: str) -> bool:
        """Whether any of `words` occurs anywhere in the file's text (strings, comments too)."""
        return any(word.encode() in self.source for word in words)

    @property
    def target_torch(self) -> TorchVersion:
        return self.options.target_torch

    @property
    def precision(self) -> str:
        return self.options.precision

    @property
    def target_device(self) -> str:
        return self.options.target_device

    @cached_property
    def facts(self):
        from optimizer_codemod.analysis import ScriptFacts

        facts = ScriptFacts.of(self.module)
        facts.project = self.options.project
        return facts


@dataclass
class RewriteResult:
    code: bytes
    changed: bool
    diagnostics: List[Diagnostic] = field(default_factory=list)
    passes: int = 0


@lru_cache(maxsize=64)
def _trigger_regex(rules: Tuple[type, ...]) -> "re.Pattern[bytes]":
    parts = [f"(?:{pattern})".encode() for rule in rules for pattern in rule.triggers]
    return re.compile(b"|".join(parts) if parts else b"(?!)")


@lru_cache(maxsize=256)
def _required_regexes(rule: type) -> Tuple[Tuple["re.Pattern[bytes]", ...], "re.Pattern[bytes]"]:
    triggers = re.compile(b"|".join(f"(?:{pattern})".encode() for pattern in rule.triggers))
    return tuple(re.compile(pattern.encode()) for pattern in rule.requires), triggers


def _rule_may_fire(src: bytes, rule: type, project: Any = None) -> bool:
    if _examines_entry_points(rule) and _runs_loops_elsewhere(project):
        return True  # a script whose training loops are in other modules (project.py)
    required, triggers = _required_regexes(rule)
    found = _searches_of(src)
    if not all(_found(r, src, found) for r in required):
        return False
    return _found(triggers, src, found) or bool(triggers.search(_imported_layers(project)))


# What the patterns found in the last few texts: most rules share the backward-call pattern,
# and a pass that changed nothing asks again about the same text. A search of a 100 KB file
# takes 1-4 ms, and 30 rules ask on each pass (torch's nn: a seventh of a run's time).
_RECENT_SEARCHES: Dict[bytes, Dict[str, bool]] = {}
_RECENT_TEXTS = 4


def _searches_of(src: bytes) -> Dict[str, bool]:
    found = _RECENT_SEARCHES.get(src)
    if found is None:
        if len(_RECENT_SEARCHES) >= _RECENT_TEXTS:
            del _RECENT_SEARCHES[next(iter(_RECENT_SEARCHES))]
        found = _RECENT_SEARCHES[src] = {}
    return found


def _found(pattern: "re.Pattern[bytes]", src: bytes, found: Dict[str, bool]) -> bool:
    hit = found.get(pattern.pattern)
    if hit is None:
        hit = found[pattern.pattern] = pattern.search(src) is not None
    return hit


def _examines_entry_points(rule: type) -> bool:
    return getattr(rule, "process_wide", False) or getattr(rule, "examines_entry_points", False)


def _runs_loops_elsewhere(project: Any) -> bool:
    return project is not None and getattr(project, "loops", None) is not None


def _imported_layers(project: Any) -> bytes:
    """The layers of the model classes this file imports from other modules of the run
    (project.ImportedClass), the shape-varying calls of the functions it imports
    (project.ImportedFunction), the parameters the helpers it imports gather into groups
    (project.ImportedGathering), and DataLoaders other modules pass or return it, as text a rule's
    triggers may match: `GeneratorResNet()` from
    models.py is a convolution the file's own text never spells, and `get_data()` from
    data.py pads with `pad_sequence`."""
    if project is None:
        return b""
    classes = getattr(project, "imported_classes", ())
    layers = [layer for c in classes for layer in c.possible_layers]
    for function in getattr(project, "imported_functions", ()):
        layers.extend((function.call, function.code))
    # `utils.set_weight_decay(model, wd)` hands the optimizer `model.parameters()` in groups.
    for function in getattr(project, "gathering_functions", ()):
        layers.append(f"{function.name}: {function.parameter}.parameters()")
    # A DataLoader another module hands to a function of this file (UNet's evaluate.py
    # never spells the word, and loops over the pinned loader train.py passes it), or builds
    # and returns to it (`get_loader(...)` from data_loader.py).
    calls = getattr(project, "calls", ())
    if getattr(project, "imported_loaders", ()) or any(
        argument.loader
        for call in calls
        for argument in (*call.positional, *(argument for _, argument in call.keywords))
    ):
        layers.append("DataLoader")
    return "\n".join(layers).encode()


def may_contain_findings(src: bytes, rules: Sequence[type], project: Any = None) -> bool:
    """The cheap pre-filter: can any of `rules` possibly fire on this text (in a file that
    the project index says `project` about)?"""
    if _runs_loops_elsewhere(project) and any(_examines_entry_points(r) for r in rules):
        return True
    if not rules:
        return False
    combined = _trigger_regex(tuple(rules))
    if combined.search(src) is None and combined.search(_imported_layers(project)) is None:
        return False  # one combined search settles most files
    return any(_rule_may_fire(src, rule, project) for rule in rules)


@dataclass(frozen=True)
class Resume:
    """Where an earlier rewrite of the same source stopped: its text and the fixes it made
    (lines of the source). Going on from there, with what the project tells the file now,
    keeps every fix, as a second `apply` would (runner._settle_project). Its passes report no
    sites they leave alone: they would read the earlier edits as the script's own code (an
    autocast OPT302 added as the script's choice of precision); the caller asks the source."""

    code: bytes
    fixed: Tuple[Diagnostic, ...]


def rewrite_bytes(
    src: bytes, path: str, options: RewriteOptions, resume: Optional[Resume] = None
) -> RewriteResult:
    """Rewrite one Python source; raises an OptcodemodError naming `path` on any problem.
    With `resume`, the passes start from its text; lines are still those of `src`."""
    pieces = PieceCache()
    start = resume.code if resume is not None else src
    # Piece by piece, each statement parses however deep the file; the tree must not.
    check_nesting(start, decode_source(start, path), path)
    module = parse_in_pieces(start, pieces) or parse_source(start, path, nesting_checked=True)
    return _Fixpoint(src, module, path, options, pieces, resume).run()


class _Fixpoint:
    def __init__(
        self,
        src: bytes,
        module: cst.Module,
        path: str,
        options: RewriteOptions,
        pieces: Optional[PieceCache] = None,
        resume: Optional[Resume] = None,
    ):
        self.pieces = pieces
        self.resume = resume
        # The text `module` was parsed from: `src`, or where an earlier rewrite stopped.
        self.start = resume.code if resume is not None else src
        # What each top-level statement printed to: most are printed again by every pass.
        self.texts = StatementTexts()
        # (module, module before, fixes, positions) while that module's round trip is unchecked.
        self._pending: Optional[tuple] = None
        self.src = src
        self.original = module
        self.path = path
        self.options = options
        self.rules = tuple(options.rules)

    def run(self) -> RewriteResult:
        module, code = self.original, self.start
        fixed: List[Diagnostic] = []
        # (fixed, declined) of each pass that fixed something: the sites it left alone
        # (--why-not) were examined even where a later pass no longer looks at them.
        passes: List[Tuple[List[Diagnostic], List[Diagnostic]]] = []
        if self.resume is not None:
            fixed.extend(self.resume.fixed)
        seen = {self.src, code}
        for pass_number in range(1, MAX_PASSES + 2):
            try:
                findings = self._findings(module, code)
            except OptcodemodError:
                self._check_round_trip(module, code, None)  # the likelier cause, if it fails
                raise
            positions, printed = (
                _positions(module, findings, self.texts) if findings else ({}, None)
            )
            self._check_round_trip(module, code, printed)
            _check_nodes_are_in_the_tree(findings, positions, self.path)
            noqa = _noqa_map(module, code) if findings else {}
            findings = [
                f
                for f in findings
                if not is_suppressed(
                    noqa, f.rule.code, positions[f.node].start.line, positions[f.node].end.line
                )
            ]
            applicable = [
                f for f in findings if f.fix and self.options.may_apply(f.rule.code, f.safety)
            ]
            line_map = _line_mapper(self.src, code)
            if not applicable:
                remaining = [
                    self._diagnostic(f, positions, line_map, _left_status(f)) for f in findings
                ]
                # A resumed rewrite reports no declines (see Resume).
                declines = [] if self.resume else _declines_of_every_pass(passes, remaining)
                others = [d for d in remaining if d.status is not Status.DECLINED]
                return RewriteResult(
                    code, code != self.src, fixed + others + declines, pass_number - 1
                )
            if pass_number > MAX_PASSES:
                codes = sorted({f.rule.code for f in applicable})
                raise NonConvergenceError(
                    f"rules did not converge after {MAX_PASSES} passes; still changing the file: "
                    + ", ".join(codes),
                    codes,
                    self.path,
                )
            if module is self.original:
                check_reproducible(
                    self.original, self.start, self.path, printed.encode(module.encoding)
                )
            applicable.sort(key=lambda f: (f.rule.code, _start(positions[f.node])))
            chosen = choose_compatible(applicable, positions)
            new_module, new_code = self._apply_verified(module, chosen, positions)
            fixed_now = [self._diagnostic(f, positions, line_map, Status.FIXED) for f in chosen]
            fixed.extend(fixed_now)
            declined = [
                self._diagnostic(f, positions, line_map, Status.DECLINED)
                for f in findings
                if f.declined
            ]
            passes.append((fixed_now, declined))
            if new_code in seen:
                codes = sorted({f.rule.code for f in chosen})
                raise NonConvergenceError(
                    "rules undo each other's changes (the file returned to an earlier text): "
                    + ", ".join(codes),
                    codes,
                    self.path,
                )
            seen.add(new_code)
            module, code = new_module, new_code
        raise AssertionError("unreachable")  # pragma: no cover

    def _findings(self, module: cst.Module, code: bytes) -> List[Finding]:
        # A rule whose triggers this text lacks cannot fire on it (the triggers' contract);
        # checked per pass, since an earlier pass's edits may add a trigger.
        project = self.options.project
        active = [rule for rule in self.rules if _rule_may_fire(code, rule, project)]
        if not active:
            return []
        context = FileContext(self.path, module, self.options, code)
        rules = [rule(context) for rule in active]
        try:
            _visit_batched(MetadataWrapper(module, unsafe_skip_copy=True), rules)
        except OptcodemodError:
            raise
        except Exception as exc:
            culprit = _rule_in_traceback(exc) or "a rule"
            raise RuleBrokeOutputError(
                f"internal error in {culprit}: {type(exc).__name__}: {exc}; file left untouched",
                [culprit] if culprit.startswith("OPT") else [],
                self.path,
            ) from exc
        return [finding for rule in rules for finding in rule.findings]

    def _apply_verified(
        self, module: cst.Module, chosen: List[Finding], positions
    ) -> Tuple[cst.Module, bytes]:
        problem = _try_apply(module, chosen, self.path, positions, self.pieces, False, self.texts)
        if isinstance(problem, tuple):
            new_module, new_code, printed_back = problem
            if not printed_back:
                # Whether the parse of the output prints back to it is checked on the text
                # the next pass prints anyway (its positions), not by printing it once more.
                self._pending = (new_module, module, chosen, positions)
            return new_module, new_code
        self._raise_broken(module, chosen, positions, problem)

    def _check_round_trip(self, module: cst.Module, code: bytes, printed: Optional[str]) -> None:
        """Raise if `module`, parsed from the last pass's output `code`, does not print back
        to it; `printed`: its text when this pass printed it already."""
        pending, self._pending = self._pending, None
        if pending is None or pending[0] is not module:
            return
        _, before, chosen, positions = pending
        again = module.bytes if printed is None else printed.encode(module.encoding)
        if again != code:
            problem = "LibCST cannot reproduce the output byte for byte"
            self._raise_broken(before, chosen, positions, problem)

    def _raise_broken(self, module: cst.Module, chosen: List[Finding], positions, problem):
        if module is self.original:
            # LibCST accepts some text CPython rejects (too many nested parentheses, `return`
            # outside a function): that is the input's fault, not a rule's.
            check_syntax(self.start, self.path)
        culprits = [
            code
            for code in sorted({f.rule.code for f in chosen})
            if not isinstance(
                _try_apply(
                    module,
                    [f for f in chosen if f.rule.code == code],
                    self.path,
                    positions,
                    self.pieces,
                ),
                tuple,
            )
        ] or sorted({f.rule.code for f in chosen})
        raise RuleBrokeOutputError(
            f"rule {', '.join(culprits)} produced broken code ({problem}); "
            "every change to this file was reverted",
            culprits,
            self.path,
        )

    def _diagnostic(
        self, finding: Finding, positions, line_map: Callable[[int], int], status: Status
    ) -> Diagnostic:
        where = positions[finding.node]
        line, end_line = line_map(where.start.line), line_map(where.end.line)
        edit_lines = ()
        if finding.fix is not None:
            nodes = [getattr(e, "node", None) or e.anchor for e in finding.fix.edits]
            edit_lines = tuple(
                (line_map(positions[n].start.line), line_map(positions[n].end.line)) for n in nodes
            )
        return Diagnostic(
            code=finding.rule.code,
            name=finding.rule.name,
            message=finding.message,
            fix_title=finding.fix_title,
            safety=finding.safety,
            status=status,
            line=line,
            column=where.start.column + 1,
            end_line=max(end_line, line),
            end_column=where.end.column + 1,
            edit_lines=edit_lines,
        )


def _noqa_map(module: cst.Module, code: bytes):
    """The file's `# noqa` comments, read from the text the module was parsed from.

    Printing the module again (`module.code`) would cost a full code generation per pass.
    """
    if b"noqa" not in code.lower():
        return {}
    try:
        text = code.decode(module.encoding)
    except (UnicodeDecodeError, LookupError):
        text = module.code
    return noqa_lines(text)


def _visit_batched(wrapper: MetadataWrapper, rules: Sequence[Rule]) -> None:
    """`MetadataWrapper.visit_batched`, without LibCST's per-instance method discovery.

    LibCST finds each visitor's methods with `inspect.getmembers`, which reads every
    attribute of every rule instance on every pass: it evaluates properties (`facts`, so the
    analysis ran even when no rule asked for it) and cost more than the traversal itself on
    a small script. The method names depend only on the class, so they are found once.
    """
    table: Dict[str, List[Callable[[cst.CSTNode], None]]] = {}
    for rule in rules:
        for name in _visitor_method_names(type(rule)):
            table.setdefault(name, []).append(getattr(rule, name))
    with ExitStack() as stack:
        for rule in rules:
            stack.enter_context(rule.resolve(wrapper))
        if set(table) <= MODULE_METHODS:
            # Rules that work from the shared facts need no walk over every node.
            for method in table.get("visit_Module", ()):
                method(wrapper.module)
            for method in table.get("leave_Module", ()):
                method(wrapper.module)
        else:
            walk(wrapper.module, _BatchedVisitor(table))


MODULE_METHODS = frozenset({"visit_Module", "leave_Module"})


@lru_cache(maxsize=None)
def _visitor_method_names(rule_class: type) -> Tuple[str, ...]:
    """The visit_/leave_ methods a rule class defines, leaving out LibCST's empty stubs.

    Read from the classes' own dictionaries in method resolution order (what
    inspect.getattr_static finds), not by probing each of the ~1,700 names dir() lists.
    """
    found: Dict[str, object] = {}
    for klass in rule_class.__mro__:
        for name, value in vars(klass).items():
            if name.startswith(("visit_", "leave_")) and name not in found:
                found[name] = value
    return tuple(
        sorted(
            name
            for name, method in found.items()
            if inspect.isfunction(method) and not getattr(method, "_is_no_op", False)
        )
    )


class _BatchedVisitor(cst.CSTVisitor):
    """Calls every rule's visit_/leave_ methods for each node, as LibCST's batched visit does."""

    def __init__(self, table: Dict[str, List[Callable[[cst.CSTNode], None]]]) -> None:
        super().__init__()
        self._table = table
        self._attributes = any(name.count("_") > 1 for name in table)

    def on_visit(self, node: cst.CSTNode) -> bool:
        for method in self._table.get("visit_" + type(node).__name__, ()):
            method(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        for method in self._table.get("leave_" + type(original_node).__name__, ()):
            method(original_node)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if self._attributes:
            for method in self._table.get(f"visit_{type(node).__name__}_{attribute}", ()):
                method(node)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        if self._attributes:
            name = f"leave_{type(original_node).__name__}_{attribute}"
            for method in self._table.get(name, ()):
                method(original_node)


def _check_nodes_are_in_the_tree(findings: List[Finding], positions, path: str) -> None:
    """A rule must report and edit nodes of the tree it visited, not copies it made."""
    for finding in findings:
        edits = finding.fix.edits if finding.fix else ()
        nodes = [finding.node] + [getattr(e, "node", None) or e.anchor for e in edits]
        if any(node not in positions for node in nodes):
            code = finding.rule.code
            raise RuleBrokeOutputError(
                f"internal error in {code}: it reported or edited a node that is not in the "
                "file's tree; file left untouched",
                [code],
                path,
            )


def _declines_of_every_pass(
    passes: Sequence[Tuple[Sequence[Diagnostic], Sequence[Diagnostic]]],
    last: Sequence[Diagnostic],
) -> List[Diagnostic]:
    """The declines of all passes, each site's from the first pass that declined it.

    A site is the rule and the original line (an earlier pass's edits shift columns on that
    line). The first pass that declines a site read the user's code there; a later pass reads
    the tool's own edits too (OPT301 sees the autocast OPT302 just added and calls it the
    script's choice), so its reasons for the same site are not listed. A decline whose site
    the same rule fixed in a later pass is dropped: it was waiting for another rule's fix
    (OPT201 declines a copy from a loader that OPT101 pins in the same pass, and fixes the
    copy in the next). A later pass's decline with a reason an earlier pass gave already is
    the same site moved by that pass's edits (OPT402's "after which to compile" anchor is
    the line OPT407 inserted after the model's placement), not a new one.
    """
    rounds = [list(declined) for _, declined in passes]
    rounds.append([d for d in last if d.status is Status.DECLINED])
    fixed_later: Set[Tuple[str, int]] = set()
    for index in range(len(rounds) - 1, -1, -1):
        rounds[index] = [d for d in rounds[index] if (d.code, d.line) not in fixed_later]
        if index < len(passes):  # the last round fixed nothing
            fixed_later.update((d.code, d.line) for d in passes[index][0])
    first: Dict[Tuple[str, int], int] = {}
    first_reason: Dict[Tuple[str, str], int] = {}
    for index, declined in enumerate(rounds):
        for decline in declined:
            first.setdefault((decline.code, decline.line), index)
            first_reason.setdefault((decline.code, decline.message), index)
    return [
        decline
        for index, declined in enumerate(rounds)
        for decline in declined
        if first[(decline.code, decline.line)] == index
        and first_reason[(decline.code, decline.message)] == index
    ]


def _left_status(finding: Finding) -> Status:
    if finding.declined:
        return Status.DECLINED
    if finding.fix is not None and finding.safety is not Safety.SUGGEST:
        return Status.UNSAFE
    return Status.REPORTED


def _start(code_range) -> Tuple[int, int]:
    return (code_range.start.line, code_range.start.column)


def _positions(
    module: cst.Module, findings: Iterable[Finding], texts: Optional[StatementTexts] = None
):
    """The ranges of the findings' nodes, their edits' nodes and the top-level statements
    (which hold the edits, fixes.apply_fixes): the only ones a pass reports or edits; and
    the module's text, printed by the same code generation."""
    wanted: List[cst.CSTNode] = list(module.body)
    for finding in findings:
        wanted.append(finding.node)
        for edit in finding.fix.edits if finding.fix else ():
            wanted.append(getattr(edit, "node", None) or edit.anchor)
    return positions_and_code(module, wanted, texts)


def _try_apply(
    module: cst.Module,
    chosen: List[Finding],
    path: str,
    positions=None,
    pieces=None,
    print_back: bool = True,
    texts: Optional[StatementTexts] = None,
):
    """(new module, new code, whether the new module was checked to print back to the new
    code) when the fixes produce valid code, else the problem's text. Without `print_back`,
    that check is left to the caller."""
    try:
        new_module = apply_fixes(module, [f.fix for f in chosen], positions)
        new_code = module_code(new_module, texts).encode(new_module.encoding)
    except Exception as exc:  # a fix that builds an invalid tree
        return f"{type(exc).__name__}: {exc}"
    ok, error = compile_check(new_code, path)
    if not ok:
        return f"does not compile: {error}"
    # A long output is parsed piece by piece, and only the pieces a fix changed: the same
    # tree, verified to print back the same (chunks.py).
    reparsed = parse_in_pieces(new_code, pieces) if pieces is not None else None
    if reparsed is None:
        try:
            reparsed = cst.parse_module(new_code)
        except Exception as exc:
            return f"LibCST cannot parse the output: {exc}"
    if print_back and reparsed.bytes != new_code:
        return "LibCST cannot reproduce the output byte for byte"
    if len(reparsed.body) != len(new_module.body):
        # A printing fault that still parses (statements dropped from the text) would pass
        # every other check here.
        return (
            f"the output has {len(reparsed.body)} top-level statements where the fixed tree "
            f"has {len(new_module.body)}"
        )
    return reparsed, new_code, print_back


def _rule_in_traceback(exc: BaseException) -> Optional[str]:
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Rule):
            return type(candidate).code
    return None


def _line_mapper(original: bytes, current: bytes) -> Callable[[int], int]:
    """Map a line of the current text to the original line it came from (1-based)."""
    if original == current:
        return lambda line: line
    old, new = original.splitlines(), current.splitlines()
    table: Dict[int, int] = {}
    for tag, i1, i2, j1, j2 in opcodes(old, new):
        for j in range(j1, j2):
            if tag == "equal":
                table[j + 1] = i1 + (j - j1) + 1
            else:
                table[j + 1] = min(i1 + (j - j1), max(i2 - 1, i1)) + 1
    return lambda line: table.get(line, min(line, len(old) or 1))

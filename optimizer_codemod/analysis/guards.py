"""Feature checks: code that runs exactly when a newer API is missing.

Scripts and libraries that support several torch versions test for a feature and fall back
to older code when it is absent:

- `if hasattr(F, "scaled_dot_product_attention"): ... else: <fallback>`, `getattr(mod,
  "name", None)` (the object tested must be imported: `hasattr(model, "module")` is no
  feature check);
- version comparisons: `torch.__version__`/`version.parse(...)`/`sys.version_info` against
  a constant, `is_torch_version(">=", "2.3")`, constants such as
  `_TORCH_GREATER_EQUAL_2_4`, `TORCH_2`, `HAS_FUSED`, `_FLASH_AVAILABLE`;
- `"fused" in inspect.signature(torch.optim.AdamW).parameters`;
- calls and names that say what they test: `use_fused_attn()`, `is_flash_attn_available()`,
  `self.flash`, `fused_attn`, `use_sdpa` (device checks such as `torch.cuda.is_available()`
  are not feature checks);
- flags derived from any of these (`self.flash = hasattr(...)`, then `if not self.flash:`;
  `HAS_X = True` in a `try` whose `except ImportError` sets it False);
- `try: ... except (ImportError, ModuleNotFoundError, AttributeError, TypeError, NameError)`
  (or a bare/`Exception` handler): the handler is the fallback.

A branch is a fallback when it can run while the feature is missing: the test is evaluated
with every feature atom set to "missing" (three-valued: an atom whose direction is unknown,
and anything else, may be either), and a branch whose condition can then hold is a fallback.
`if self.flash and x:` has a fallback `else` only; `if flag or x:` makes both branches
fallbacks. Statements after `if feature: ... return` in the same block are the fallback of
that `if`; a branch that raises is a requirement, not a path of its own, so its `else` and
the statements after it are not (`if args.weights and PM is None: raise ...`). Rules never
rewrite code in a fallback (Rule.report drops such findings): the rewrite would put the
feature back exactly where the branch exists for its absence.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional, Sequence, Set

import libcst as cst

from optimizer_codemod.analysis.calls import literal
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.script import ScriptFacts

Outcomes = FrozenSet[bool]
MISSING: Outcomes = frozenset({False})  # a positive check when the feature is missing
PRESENT_ONLY: Outcomes = frozenset({True})  # a negative check ("old torch") then
EITHER: Outcomes = frozenset({True, False})

# Identifiers that name what they test (matched on the last part of a name or callee).
FEATURE_WORDS = re.compile(
    r"flash|fused|fuse_|sdpa|(^|_)sdp(_|$)|xformers|version|greater|less_than|newer|older"
    r"|(^|_)(ge|gt|lt|le)_?\d|torch_?\d",
    re.IGNORECASE,
)
# Upper-case module constants that state a feature: HAS_FUSED, _APEX_AVAILABLE.
FEATURE_CONSTANTS = re.compile(r"^_?(IS_)?HAS_|_AVAILABLE$")
NEGATIVE_WORDS = re.compile(
    r"less|older|lower|below|before|legacy|(^|_)(lt|le)_?\d|(^|_)(no|not|disable|disabled|without)(_|$)",
    re.IGNORECASE,
)
# Direction words for names; a name matching FEATURE_WORDS with none of these is positive
# unless it only says "version" (TORCH_VERSION: a value, not a yes/no).
VALUE_WORDS = re.compile(r"^_?[A-Za-z_]*version$", re.IGNORECASE)
FALLBACK_EXCEPTIONS = frozenset(
    {
        "ImportError",
        "ModuleNotFoundError",
        "AttributeError",
        "TypeError",
        "NameError",
        "Exception",
        "BaseException",
    }
)
ORDER = (cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual)
_EXITS = (cst.Return, cst.Raise, cst.Continue, cst.Break)
MAX_DEPTH = 4


class FeatureGuards:
    """Which nodes of a module lie in the fallback branch of a feature check."""

    def __init__(self, facts: "ScriptFacts") -> None:
        self.facts = facts
        self._flag_cache: Dict[str, Optional[Outcomes]] = {}

    def in_fallback(self, node: cst.CSTNode) -> bool:
        return node in self._fallback_nodes

    @cached_property
    def _fallback_nodes(self) -> Set[cst.CSTNode]:
        marked: Set[cst.CSTNode] = set()
        for root in self._fallback_roots():
            if root in marked:  # nested in an outer fallback: already walked
                continue
            marked.update(find_all(root, cst.CSTNode))
        return marked

    def _fallback_roots(self) -> List[cst.CSTNode]:
        roots: List[cst.CSTNode] = []
        for node, suite in self.facts.records.branches:
            if isinstance(node, cst.Try):
                roots.extend(h for h in node.handlers if _catches_missing_feature(h))
                continue
            outcomes = self.outcomes(node.test)
            if outcomes is None:
                continue
            if True in outcomes:
                roots.append(node.body)
            if False in outcomes and not _always_raises(node.body):
                if node.orelse is not None:
                    roots.append(node.orelse)
                elif isinstance(node, cst.If):
                    roots.extend(_statements_after_exit(node, suite))
        return roots

    # Feature expressions -----------------------------------------------------------------
    def outcomes(self, node: cst.BaseExpression, depth: int = 0) -> Optional[Outcomes]:
        """The truth values `node` can take while the feature it tests is missing; None when
        it tests no feature."""
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            inner = self.outcomes(node.expression, depth)
            return None if inner is None else frozenset(not v for v in inner)
        if isinstance(node, cst.BooleanOperation):
            left = self.outcomes(node.left, depth)
            right = self.outcomes(node.right, depth)
            if left is None and right is None:
                return None
            left, right = left or EITHER, right or EITHER
            stop = isinstance(node.operator, cst.Or)  # the value that ends the evaluation
            result = {stop} if stop in left else set()
            if (not stop) in left:
                result |= right
            return frozenset(result)
        if isinstance(node, cst.Comparison):
            return self._comparison(node, depth)
        if isinstance(node, cst.Call):
            return self._call(node)
        name = dotted_name(node)
        if name is not None:
            return self._flag(name, depth)
        return None

    def _call(self, call: cst.Call) -> Optional[Outcomes]:
        func = dotted_name(call.func)
        args = [a for a in call.args if a.keyword is None and not a.star]
        if func in ("hasattr", "getattr") and len(args) >= 2 and self._imported(args[0].value):
            if func == "hasattr" or (len(args) == 3 and literal(args[2].value, 1) in (None, False)):
                return MISSING
            return EITHER if len(args) == 3 else None
        qualified = self.facts.qualified_name(call.func) or func or ""
        if qualified.startswith("torch.") and qualified.endswith(".is_available"):
            return None  # a device, not a feature
        last = qualified.rsplit(".", 1)[-1]
        if last in ("startswith", "endswith") and _mentions_version(call.func):
            return EITHER
        if not FEATURE_WORDS.search(last):
            return None
        if args and literal(args[0].value, None) in ("<", "<=", ">", ">=", "==", "!="):
            operator = literal(args[0].value, None)
            return (
                MISSING if operator in (">", ">=") else PRESENT_ONLY if "<" in operator else EITHER
            )
        return _direction(last)

    def _comparison(self, node: cst.Comparison, depth: int) -> Optional[Outcomes]:
        if len(node.comparisons) != 1:
            return EITHER if _mentions_version(node) else None
        target = node.comparisons[0]
        operator, right, left = target.operator, target.comparator, node.left
        if isinstance(operator, (cst.In, cst.NotIn)) and any(
            self.facts.qualified_name(c.func) == "inspect.signature"
            for c in find_all(right, cst.Call)
        ):
            return MISSING if isinstance(operator, cst.In) else PRESENT_ONLY
        if isinstance(operator, (cst.Is, cst.IsNot, cst.Equal, cst.NotEqual)):
            constant = literal(right, "")
            if constant is None or constant is True or constant is False:
                inner = self.outcomes(left, depth)
                if inner is None:
                    return None
                keeps = isinstance(operator, (cst.IsNot, cst.NotEqual)) != (constant is True)
                return inner if keeps else frozenset(not v for v in inner)
        if isinstance(operator, ORDER):
            left_current = _mentions_version(left) and not _constant(left)
            right_current = _mentions_version(right) and not _constant(right)
            if left_current == right_current:
                return EITHER if left_current else None
            greater = isinstance(operator, (cst.GreaterThan, cst.GreaterThanEqual))
            return MISSING if greater == left_current else PRESENT_ONLY
        return EITHER if _mentions_version(node) else None

    def _flag(self, name: str, depth: int) -> Optional[Outcomes]:
        """A name that holds the result of a feature check (memoised per name)."""
        if name in self._flag_cache:
            return self._flag_cache[name]
        self._flag_cache[name] = None  # a cycle (`flag = flag and x`) adds nothing
        last = name.rsplit(".", 1)[-1]
        found: Optional[Outcomes] = None
        if name.endswith("__version__") or VALUE_WORDS.match(last):
            found = EITHER
        elif FEATURE_WORDS.search(last) or FEATURE_CONSTANTS.search(last):
            found = _direction(last)
        elif depth < MAX_DEPTH:
            found = self._derived_flag(name, depth)
        self._flag_cache[name] = found
        return found

    def _derived_flag(self, name: str, depth: int) -> Optional[Outcomes]:
        """What `name` holds while the feature is missing, when some assignment of it is a
        feature check or a `True`/`False`/`None` set in a feature `try` (body: the feature
        is there, so it adds nothing; handler: the value it keeps)."""
        values: List[Outcomes] = []
        feature = False
        for assignment in self.facts.assignments_to(name):
            if assignment.unpacked or assignment.augmented:
                return None
            constant = literal(assignment.value, "")
            if constant is None or constant is True or constant is False:
                role = self._try_roles.get(assignment.site.statement)
                feature = feature or role is not None
                if role != "body":
                    values.append(frozenset({bool(constant)}))
                continue
            outcome = self.outcomes(assignment.value, depth + 1)
            feature = feature or outcome is not None
            values.append(EITHER if outcome is None else outcome)
        if not feature:
            return None
        return frozenset().union(*values) or MISSING

    @cached_property
    def _try_roles(self) -> Dict[cst.CSTNode, str]:
        """Statements directly in a feature `try` ("body") or in its handlers ("handler")."""
        roles: Dict[cst.CSTNode, str] = {}
        for node, _ in self.facts.records.branches:
            if not isinstance(node, cst.Try):
                continue
            handlers = [h for h in node.handlers if _catches_missing_feature(h)]
            if handlers:
                roles.update((s, "body") for s in _statements(node.body))
                roles.update((s, "handler") for h in handlers for s in _statements(h.body))
        return roles

    def _imported(self, node: cst.BaseExpression) -> bool:
        return self.facts.qualified_name(node) is not None


def _statements(suite: cst.CSTNode) -> Sequence[cst.CSTNode]:
    body = getattr(suite, "body", ())
    return body if isinstance(body, (list, tuple)) else ()


def _direction(identifier: str) -> Outcomes:
    return PRESENT_ONLY if NEGATIVE_WORDS.search(identifier) else MISSING


def _mentions_version(node: cst.CSTNode) -> bool:
    for part in find_all(node, cst.Name):
        if part.value in ("__version__", "version_info") or "version" in part.value.lower():
            return True
    return False


def _constant(node: cst.BaseExpression) -> bool:
    """A literal, or a call of literals only (`version.parse("2.0")`, `Version("1.10")`)."""
    if isinstance(node, cst.Call):
        return bool(node.args) and all(_constant(a.value) for a in node.args)
    return literal(node, _NOTHING) is not _NOTHING


_NOTHING = object()


def _catches_missing_feature(handler: cst.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elements if isinstance(handler.type, cst.Tuple) else None
    nodes = [e.value for e in types] if types is not None else [handler.type]
    return any((dotted_name(n) or "").rsplit(".", 1)[-1] in FALLBACK_EXCEPTIONS for n in nodes)


def _statements_after_exit(node: cst.If, suite: Optional[cst.CSTNode]) -> Sequence[cst.CSTNode]:
    """The statements after `node` in its block when its body always leaves the block."""
    body = getattr(suite, "body", None)
    if not isinstance(body, (list, tuple)) or not always_exits(node.body):
        return ()
    for index, statement in enumerate(body):
        if statement is node:
            return tuple(body[index + 1 :])
    return ()


def _always_raises(suite: cst.CSTNode) -> bool:
    """The block ends in `raise`: a requirement (`if args.weights and PM is None: raise`),
    not the feature's own path, so what follows it is the one path for every case."""
    statements = _statements(suite)
    last = statements[-1] if statements else None
    if isinstance(last, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        return isinstance(last.body[-1], cst.Raise)
    return False


def always_exits(suite: cst.CSTNode) -> bool:
    """The block's last statement returns, raises, continues or breaks on every path."""
    statements = _statements(suite)
    last = statements[-1] if statements else None
    if isinstance(last, _EXITS):  # `if flag: return x` on one line
        return True
    if isinstance(last, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        return any(isinstance(small, _EXITS) for small in last.body)
    if isinstance(last, cst.With):
        return always_exits(last.body)
    if isinstance(last, cst.If):
        orelse = last.orelse
        other = orelse.body if isinstance(orelse, cst.Else) else orelse
        return (
            other is not None
            and always_exits(last.body)
            and always_exits(
                cst.IndentedBlock(body=[other]) if isinstance(other, cst.If) else other
            )
        )
    return False

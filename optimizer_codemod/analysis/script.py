"""ScriptFacts: what the rules share about one training script, computed once per pass."""

from __future__ import annotations

import re
from functools import cached_property
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import callee_name, keyword, literal
from optimizer_codemod.analysis.collect import (
    Assignment,
    CallSite,
    Loop,
    Records,
    collect,
    is_main_guard,
)
from optimizer_codemod.analysis.autocast_escapes import AutocastEscapes
from optimizer_codemod.analysis.debugging import DebugSwitches
from optimizer_codemod.analysis.devices import under_views
from optimizer_codemod.analysis.guards import FeatureGuards
from optimizer_codemod.analysis.imports import ImportTable, dotted_name
from optimizer_codemod.analysis.nodes import find_all, is_docstring, is_name
from optimizer_codemod.analysis.walk import parents
from optimizer_codemod.analysis.periodic import LogLines
from optimizer_codemod.analysis.syncs import HostSyncs

DATALOADER = "torch.utils.data.DataLoader"
# Wrappers that iterate their first argument unchanged (for the purpose of batch tracking).
ITERATION_WRAPPERS = frozenset({"enumerate", "iter", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm"})
NOT_OPTIMIZERS = ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.", "torch.optim.Optimizer")
BACKWARD_FUNCTIONS = frozenset({"torch.autograd.backward"})
# Text every file with a backward call contains: a method call `x.backward(` (also
# `torch.autograd.backward(`), or a bare `backward(` that needs `from torch.autograd import`.
# Leaving out `def backward(` keeps autograd Functions in library code unparsed.
BACKWARD_CALL = (
    r"\.\s*backward\s*\("
    r"|from\s+torch\.autograd\s+import\s+(?:\*|\([^)]*\bbackward\b|[\w \t,\\]*\bbackward\b)"
)


class ScriptFacts:
    """Answers about a module; every answer is derived from one Collector pass."""

    def __init__(self, module: cst.Module, records: Records):
        self.module = module
        self.records = records
        self._memos: Dict[str, dict] = {}
        # What the other modules of the run tell this one (project.ProjectFacts), set by the
        # engine from the project index; None for a file analysed on its own.
        self.project = None

    @classmethod
    def of(cls, module: cst.Module) -> "ScriptFacts":
        return cls(module, collect(module))

    def told(self, project) -> "ScriptFacts":
        """Facts of the same parse for what `project` (project.ProjectFacts) tells the module;
        the tables that depend on its text alone are shared."""
        fresh = ScriptFacts(self.module, self.records)
        fresh._memos["parents"] = self.memo("parents")
        fresh.project = project
        return fresh

    @property
    def parents(self) -> Dict[cst.CSTNode, cst.CSTNode]:
        """Each node of the module with its parent, built once per pass (the table escapes.py
        keeps for the module scope)."""
        memo = self.memo("parents")
        table = memo.get(self.module)
        if table is None:
            table = memo[self.module] = parents(self.module)
        return table

    def memo(self, table: str) -> dict:
        """A table for one name-following answer, kept as long as these facts (one pass).

        Answers that follow a name through every assignment to it, file-wide, must be kept:
        recomputed per question, their cost grows with a power of the file's length.
        """
        found = self._memos.get(table)
        if found is None:
            found = self._memos[table] = {}
        return found

    # Names -----------------------------------------------------------------------------
    @property
    def imports(self) -> ImportTable:
        return self.records.imports

    def qualified_name(self, node: cst.BaseExpression) -> Optional[str]:
        return self.imports.qualified_name(node)

    @property
    def classes(self):
        return self.records.classes

    @cached_property
    def _assignments_by_target(self) -> Dict[str, List[Assignment]]:
        table: Dict[str, List[Assignment]] = {}
        for assignment in self.records.assignments:
            table.setdefault(assignment.target, []).append(assignment)
        return table

    @cached_property
    def top_level_definitions(self) -> Dict[str, cst.CSTNode]:
        """The classes and functions the module defines once, at its top level (by name): what
        its importers (and workers that unpickle by module-level name) find under that name."""
        counts = self.records.definition_counts
        return {
            s.name.value: s
            for s in self.module.body
            if isinstance(s, (cst.ClassDef, cst.FunctionDef)) and counts.get(s.name.value) == 1
        }

    def assignments_to(self, name: str) -> Sequence[Assignment]:
        return self._assignments_by_target.get(name, ())

    def assignments_in_scope(
        self, name: str, function: Optional[cst.CSTNode]
    ) -> Sequence[Assignment]:
        """The assignments to `name` made in `function`'s own body (None: module level), in
        source order: one table per file, as a name such as `x` is bound in every function."""
        return self._assignments_by_scope.get((id(function), name), ())

    @cached_property
    def _assignments_by_scope(self) -> Dict[Tuple[int, str], List[Assignment]]:
        table: Dict[Tuple[int, str], List[Assignment]] = {}
        for assignment in self.records.assignments:
            key = (id(assignment.site.function), assignment.target)
            table.setdefault(key, []).append(assignment)
        return table

    def assignment_of(self, value: cst.BaseExpression) -> Optional[Assignment]:
        """The assignment whose value is exactly `value` (`opt = Adam(...)` for the call)."""
        return self._assignment_by_value.get(value)

    @cached_property
    def _assignment_by_value(self) -> Dict[cst.CSTNode, Assignment]:
        return {a.value: a for a in self.records.assignments if not a.unpacked}

    def assignments_taking(self, value: cst.BaseExpression) -> Sequence[Assignment]:
        """Every assignment of `value`, unpacked ones included (`a, b = f()`: two)."""
        return self._assignments_taking.get(id(value), ())

    @cached_property
    def _assignments_taking(self) -> Dict[int, List[Assignment]]:
        table: Dict[int, List[Assignment]] = {}
        for assignment in self.records.assignments:
            table.setdefault(id(assignment.value), []).append(assignment)
        return table

    # Calls -----------------------------------------------------------------------------
    @cached_property
    def _calls_by_qualname(self) -> Dict[str, List[CallSite]]:
        table: Dict[str, List[CallSite]] = {}
        for call in self.records.calls:
            if call.qualname:
                table.setdefault(call.qualname, []).append(call)
        return table

    @cached_property
    def _calls_by_method(self) -> Dict[str, List[CallSite]]:
        table: Dict[str, List[CallSite]] = {}
        for call in self.records.calls:
            if call.method:
                table.setdefault(call.method, []).append(call)
        return table

    @cached_property
    def call_site_of(self) -> Dict[cst.Call, CallSite]:
        return {call.node: call for call in self.records.calls}

    def calls_to(self, *qualnames: str) -> List[CallSite]:
        return [c for q in qualnames for c in self._calls_by_qualname.get(q, ())]

    def calls_with_prefix(self, prefix: str) -> List[CallSite]:
        return [
            c for q, calls in self._calls_by_qualname.items() if q.startswith(prefix) for c in calls
        ]

    def method_calls(self, method: str) -> List[CallSite]:
        return list(self._calls_by_method.get(method, ()))

    @cached_property
    def _calls_by_definition(self) -> Dict[str, List[CallSite]]:
        table: Dict[str, List[CallSite]] = {}
        for call in self.records.calls:
            if call.site.class_name is not None:
                table.setdefault(call.site.class_name, []).append(call)
            elif call.site.function is not None:
                table.setdefault(call.site.function.name.value, []).append(call)
        return table

    def calls_made_in(self, name: str) -> Sequence[CallSite]:
        """The calls made in the methods of class `name`, or in the function(s) `name`."""
        return self._calls_by_definition.get(name, ())

    def uses(self, *qualnames: str) -> bool:
        """Whether any of these names is called, entered (`with`) or assigned to."""
        return any(self._calls_by_qualname.get(q) for q in qualnames) or bool(
            set(qualnames) & self.names_assigned_or_entered
        )

    @cached_property
    def names_assigned_or_entered(self) -> Set[str]:
        names = set()
        for assignment in self.records.assignments:
            node = assignment.statement_node
            targets = getattr(node, "targets", None) or [node]
            for target in targets:
                target = getattr(target, "target", None)
                if target is not None:
                    qualified = self.qualified_name(target)
                    if qualified:
                        names.add(qualified)
        for item, _ in self.records.with_items:
            expr = item.item.func if isinstance(item.item, cst.Call) else item.item
            qualified = self.qualified_name(expr)
            if qualified:
                names.add(qualified)
        return names

    def attribute_assignments(self, qualname: str) -> List[Assignment]:
        """Assignments like `torch.backends.cudnn.benchmark = value`."""
        found = []
        for assignment in self.records.assignments:
            node = assignment.statement_node
            if isinstance(node, cst.Assign):
                for target in node.targets:
                    if self.qualified_name(target.target) == qualname:
                        found.append(assignment)
                        break
        return found

    # Training structure ------------------------------------------------------------------
    @cached_property
    def backward_calls(self) -> List[CallSite]:
        return self.method_calls("backward") + self.calls_to(*BACKWARD_FUNCTIONS)

    @property
    def trains(self) -> bool:
        """The script runs backward passes (and so trains something)."""
        return bool(self.backward_calls)

    @cached_property
    def functions_reaching_backward(self) -> Set[str]:
        """Names of the functions and methods of this file that call backward, directly or
        through other functions of the file (matched by name: a method call `trainer.fit()`
        counts when some `def fit` reaches backward)."""
        names = {c.site.function.name.value for c in self.backward_calls if c.site.function}
        changed = True
        while changed:
            changed = False
            for call in self.records.calls:
                function = call.site.function
                if function is None or function.name.value in names:
                    continue
                if callee_name(call.node) in names:
                    names.add(function.name.value)
                    changed = True
        return names

    @cached_property
    def runs_as_script(self) -> bool:
        """The file is run, not imported: a `__main__` guard, or a module-level statement that
        trains (a backward call, or a call of a function or method of this file that reaches
        one). A process-wide setting added to an importable module would change the numerics
        of whoever imports it. A test module is imported by its runner whatever its guard
        says (pytest collects `unittest.TestCase` classes and `test_*` functions), so it
        does not count (torchtitan's unit tests end in `unittest.main()`)."""
        if self.is_test_module:
            return False
        if self.records.has_main_guard and self.main_guard_may_train:
            return True
        training = self.functions_reaching_backward
        backward = {id(call.node) for call in self.backward_calls}
        return any(
            call.site.function is None
            and call.site.class_name is None
            and (callee_name(call.node) in training or id(call.node) in backward)
            for call in self.records.calls
        )

    @cached_property
    def main_guard_may_train(self) -> bool:
        """The `__main__` guard may run the training this file defines: it calls backward, or
        names a function, method or class of the file from which a chain of mentions leads to
        one that reaches backward (`main()` handing `main_worker` to `mp.spawn`,
        `fire.Fire(Trainer)`). False for a usage demo in a library module
        (denoising-diffusion-pytorch's guided_diffusion.py samples from a model and never
        names its `Trainer`); True when the file's own functions train nothing (the training,
        if any, is imported)."""
        training = self.functions_reaching_backward
        if not training:
            return True
        mentioned_in: Dict[str, Set[str]] = {}
        for definition in find_all(self.module, cst.FunctionDef, cst.ClassDef):
            for name in find_all(definition.body, cst.Name):
                mentioned_in.setdefault(name.value, set()).add(definition.name.value)
        leading = set(training)
        pending = list(training)
        while pending:
            for definer in mentioned_in.get(pending.pop(), ()):
                if definer not in leading:
                    leading.add(definer)
                    pending.append(definer)
        backward = {id(call.node) for call in self.backward_calls}
        for guard in self.module.body:
            if isinstance(guard, cst.If) and is_main_guard(guard):
                for node in find_all(guard, cst.Name, cst.Call):
                    if id(node) in backward or (
                        isinstance(node, cst.Name) and node.value in leading
                    ):
                        return True
        return False

    @cached_property
    def is_test_module(self) -> bool:
        """The module defines a `unittest.TestCase` class, or imports pytest and defines a
        top-level `test_*` function: what test runners collect by importing it. (A
        tutorial's `def test_step(model, loader)` with no pytest is an evaluation step.)"""
        if any(
            (base or "").startswith("unittest.") and (base or "").endswith("TestCase")
            for info in self.classes.values()
            for base in info.bases
        ):
            return True
        imports_pytest = any(
            b.target == "pytest" or b.target.startswith("pytest.") for b in self.imports.bindings
        )
        return imports_pytest and any(
            name.startswith("test_") and isinstance(node, cst.FunctionDef)
            for name, node in self.top_level_definitions.items()
        )

    @cached_property
    def training_loops(self) -> List[Loop]:
        """Innermost loops that contain a backward call, in source order."""
        loops: List[Loop] = []
        for call in self.backward_calls:
            loop = call.site.loop
            if loop is not None and loop not in loops:
                loops.append(loop)
        return sorted(loops, key=lambda loop: loop.start)

    # What each loop holds, indexed once: questions asked per loop (or per call in a loop)
    # must not scan the whole file's records each time.
    def loop_calls(self, loop: Loop) -> List[CallSite]:
        """Calls inside `loop` (nested loops included)."""
        return list(self._inside_loops("calls").get(id(loop), ()))

    def calls_directly_in(self, loop: Loop) -> List[CallSite]:
        """Calls in `loop`'s own body (not in a loop nested in it)."""
        return list(self._directly_in_loops("calls").get(id(loop), ()))

    def assignments_in(self, loop: Loop) -> List[Assignment]:
        """Assignments inside `loop` (nested loops included)."""
        return list(self._inside_loops("assignments").get(id(loop), ()))

    def comprehensions_in(self, loop: Loop) -> list:
        """Comprehensions inside `loop` (nested loops included)."""
        return list(self._inside_loops("comprehensions").get(id(loop), ()))

    def loops_inside(self, loop: Loop) -> List[Loop]:
        """Loops nested in `loop`, at any depth, in source order."""
        return list(self._nested_loops.get(id(loop), ()))

    def in_function(self, kind: str, function: Optional[cst.FunctionDef]) -> list:
        """The `kind` records ("calls", "assignments") whose site is `function`'s own scope
        (None: module level), from one index built per kind."""
        memo = self.memo("in_function")
        table = memo.get(kind)
        if table is None:
            table = memo[kind] = {}
            for item in getattr(self.records, kind):
                table.setdefault(id(item.site.function), []).append(item)
        return table.get(id(function), [])

    def _inside_loops(self, kind: str) -> Dict[int, list]:
        memo = self.memo("inside_loops")
        table = memo.get(kind)
        if table is None:
            table = memo[kind] = {}
            for item in getattr(self.records, kind):
                for loop in item.site.loops:
                    table.setdefault(id(loop), []).append(item)
        return table

    def _directly_in_loops(self, kind: str) -> Dict[int, list]:
        memo = self.memo("directly_in_loops")
        table = memo.get(kind)
        if table is None:
            table = memo[kind] = {}
            for item in getattr(self.records, kind):
                if item.site.loops:
                    table.setdefault(id(item.site.loops[-1]), []).append(item)
        return table

    @cached_property
    def _nested_loops(self) -> Dict[int, List[Loop]]:
        table: Dict[int, List[Loop]] = {}
        for inner in self.records.loops:
            for outer in inner.ancestors:
                table.setdefault(id(outer), []).append(inner)
        return table

    def optimizer_constructions(self) -> List[CallSite]:
        return [
            call
            for call in self.calls_with_prefix("torch.optim.")
            if not call.qualname.startswith(NOT_OPTIMIZERS)
            and call.qualname.rsplit(".", 1)[-1][:1].isupper()
        ]

    def dataloader_constructions(self) -> List[CallSite]:
        return self.calls_to(DATALOADER)

    def is_pinned(self, loader: CallSite) -> bool:
        """The DataLoader pins its batches: `pin_memory=True` or `=torch.cuda.is_available()`
        (on every path that sets it: where the option is left out, the copy it speeds up is
        still correct, only not faster).

        The one test of pinning that every rule shares (OPT101 adds exactly the second form,
        OPT201 relies on either). A name is followed when all its assignments qualify.
        """
        from optimizer_codemod.analysis.loaders import option_values

        # Also from a `**options` dict, and from one filled under a condition (`if use_cuda:
        # options.update(pin_memory=True)`): pinned where it is set, never set otherwise.
        values = option_values(self, loader.node, "pin_memory")
        return bool(values) and all(self._pins(value, 0) for value in values)

    def _pins(self, node: cst.BaseExpression, depth: int) -> bool:
        if literal(node, None) is True:
            return True
        if isinstance(node, cst.Call):
            return not node.args and self.qualified_name(node.func) == "torch.cuda.is_available"
        name = dotted_name(node)
        assignments = self.assignments_to(name) if name and depth < 3 else ()
        return bool(assignments) and all(
            not a.unpacked and not a.augmented and self._pins(a.value, depth + 1)
            for a in assignments
        )

    def class_places_on_accelerator(self, class_name: str) -> bool:
        from optimizer_codemod.analysis.devices import class_may_place_on_accelerator

        return class_may_place_on_accelerator(self, class_name)

    # Data loading ----------------------------------------------------------------------
    def _iterated_name(self, node: Optional[cst.BaseExpression]) -> Optional[str]:
        """`loader` for `loader`, `enumerate(loader)`, `tqdm(loader, ...)`, and for a
        generator that yields its argument's items unchanged (`metric_logger.log_every(loader,
        10)`, handoffs.passed_through)."""
        from optimizer_codemod.analysis.handoffs import pass_through_argument

        while isinstance(node, cst.Call) and node.args:
            func = self.qualified_name(node.func) or dotted_name(node.func)
            if func in ITERATION_WRAPPERS:
                node = node.args[0].value
                continue
            handed = pass_through_argument(self, node)
            if handed is None:
                break
            node = handed
        return dotted_name(node) if node is not None else None

    def loader_of(self, loop: Loop) -> Optional[CallSite]:
        """The DataLoader construction a for loop iterates over, when it is known."""
        name = self._iterated_name(loop.iter)
        if loop.iter is not None and isinstance(loop.iter, cst.Call):
            direct = self.call_site_of.get(loop.iter)
            if direct is not None and direct.qualname == DATALOADER:
                return direct
        return self.loader_named(name, loop.function) if name else None

    def loader_named(
        self, name: str, scope: Optional[cst.CSTNode] = None, depth: int = 0
    ) -> Optional[CallSite]:
        """The DataLoader construction `name` is bound to, read in `scope` (a function, or a
        node inside one, or None: anywhere). A plain name the function assigns itself is
        local to it, so DGCNN's `test_loader` of `train()` is not its `test()`'s; elsewhere
        (attributes, parameters, globals) every assignment of the file counts."""
        if depth > 3:
            return None
        function = self.enclosing_function(scope)
        memo = self.memo("loader_named")
        key = (name, id(function), depth)
        if key not in memo:
            memo[key] = self._loader_named(name, function, depth)
        return memo[key]

    def enclosing_function(self, node: Optional[cst.CSTNode]) -> Optional[cst.FunctionDef]:
        while node is not None and not isinstance(node, cst.FunctionDef):
            node = self.parents.get(node)
        return node

    def _bindings_read_in(self, name: str, function: Optional[cst.FunctionDef]):
        local = self.assignments_in_scope(name, function) if function is not None else ()
        return local if local and "." not in name else self.assignments_to(name)

    def _loader_named(
        self, name: str, function: Optional[cst.FunctionDef], depth: int
    ) -> Optional[CallSite]:
        from optimizer_codemod.analysis.loaders import returned_loader_at

        found = None
        for assignment in self._bindings_read_in(name, function):
            site = self.call_site_of.get(assignment.value)
            # A helper of this file that builds the loader, called once: `loader =
            # get_loader(...)`, or unpacked from its tuple (`train_dl, val_dl, tokenizer =
            # get_ds(config)`). Called in a loop, each call builds another loader.
            helper = site is not None and site.qualname != DATALOADER and not site.site.loops
            if assignment.unpacked:
                if not helper or assignment.index is None:
                    return None
                candidate = returned_loader_at(self, site, assignment.index)
            elif site is not None and site.qualname == DATALOADER:
                candidate = site
            elif helper and (returned := returned_loader_at(self, site, -1)) is not None:
                candidate = returned
            else:
                # `batch_iterator = tqdm(train_loader, desc=...)`, iterated later.
                wrapped = isinstance(assignment.value, cst.Call) and not is_name(
                    assignment.value.func, "iter"
                )
                other = self._iterated_name(assignment.value) if wrapped else None
                other = other or dotted_name(assignment.value)
                where = assignment.site.function
                candidate = self.loader_named(other, where, depth + 1) if other else None
            if candidate is None or (found is not None and found is not candidate):
                return None
            found = candidate
        return found

    def iterated_name(self, node: Optional[cst.BaseExpression]) -> Optional[str]:
        """`loader` for `loader`, `enumerate(loader)`, `tqdm(loader, ...)`."""
        return self._iterated_name(node)

    def names_derived_in(self, loop: Loop, seeds: Set[str]) -> Set[str]:
        """`seeds` and the names inside `loop` bound to parts of them (unpacking, indexing...)
        or to views of those (`flat = images.view(n, -1)`: devices.HOST_VIEW_METHODS)."""
        names = set(seeds)
        inside = self.assignments_in(loop)
        comprehensions = self.comprehensions_in(loop)
        changed = True
        while changed:
            changed = False
            for assignment in inside:
                value = under_views(assignment.value)
                if assignment.target not in names and self.derives_from(value, names):
                    names.add(assignment.target)
                    changed = True
            for comprehension in comprehensions:
                if self.derives_from(comprehension.iter, names):
                    new = set(comprehension.targets) - names
                    if new:
                        names |= new
                        changed = True
        return names

    def derives_from(self, node: cst.BaseExpression, names: Set[str]) -> bool:
        """`node` is one of `names`, or an element, attribute or items() view of one."""
        return derived_root(node, names) is not None

    # Feature checks --------------------------------------------------------------------
    @cached_property
    def feature_guards(self) -> FeatureGuards:
        """Which code runs only when a feature is missing (guards.py)."""
        return FeatureGuards(self)

    # Mixed precision, determinism, anchors ---------------------------------------------
    @cached_property
    def autocast_escapes(self) -> AutocastEscapes:
        """Which 16-bit values would leave an autocast block (autocast_escapes.py)."""
        return AutocastEscapes(self)

    @cached_property
    def host_syncs(self) -> HostSyncs:
        """Per-step host syncs of the training loops (syncs.py)."""
        return HostSyncs(self)

    @cached_property
    def log_lines(self) -> LogLines:
        """Per-step print and log lines that read device values (periodic.py)."""
        return LogLines(self)

    @cached_property
    def debug_switches(self) -> DebugSwitches:
        """Debugging and housekeeping around the training step (debugging.py)."""
        return DebugSwitches(self)

    @cached_property
    def top_import_block(self) -> Tuple[cst.BaseStatement, ...]:
        """The import block at the top of the module, up to its last import or configuration
        statement: configuration of an imported module that sits in the block or closes it
        (`matplotlib.use("Agg")`, `warnings.filterwarnings(...)`, `sys.path.insert(...)`,
        `os.environ[...] = ...`) belongs to it, and `try:` blocks that only import too. A
        setting added after the block runs after that configuration."""
        block: List[cst.BaseStatement] = []
        roots: Set[str] = set()
        end = 0
        for index, statement in enumerate(self.module.body):
            if _is_import_line(statement) or _imports_only(statement):
                roots |= _bound_roots(statement)
            elif not (
                (index == 0 and is_docstring(statement))
                or _is_masked_magic(statement)
                or _is_module_metadata(statement)
                or _configures(statement, roots)
            ):
                break
            block.append(statement)
            if not (
                is_docstring(statement)
                or _is_masked_magic(statement)
                or _is_module_metadata(statement)
            ):
                end = len(block)
        return tuple(block[:end]) if any(map(_is_import_line, block[:end])) else ()

    @cached_property
    def top_level_import_anchor(self) -> Optional[cst.SimpleStatementLine]:
        """The last statement of the import block at the top of the module (top_import_block)."""
        block = self.top_import_block
        return block[-1] if block else None

    def configures_in_import_block(self, statement: cst.CSTNode) -> bool:
        """`statement` is a configuration statement of the top import block."""
        return any(statement is s for s in self.top_import_block) and not (
            _is_import_line(statement) or _imports_only(statement)
        )

    @cached_property
    def uses_sparse_gradients(self) -> bool:
        """`sparse=True` anywhere (nn.Embedding(sparse=True), sparse tensors): fused kernels refuse them."""
        return any(
            isinstance(arg := keyword(call.node, "sparse"), cst.Arg)
            and literal(arg.value, True) is not False
            for call in self.records.calls
        )

    def keyword_is(self, call: cst.Call, name: str, value) -> bool:
        arg = keyword(call, name)
        return arg is not None and literal(arg.value, object()) == value


def _imports_only(statement: cst.CSTNode) -> bool:
    """`try: import x` / `except ImportError: ...`: a try whose body only imports."""
    return (
        isinstance(statement, cst.Try)
        and bool(statement.body.body)
        and all(_is_import_line(line) for line in statement.body.body)
    )


def _bound_roots(statement: cst.CSTNode) -> Set[str]:
    """The names an import line (or an import-only try) binds at module level."""
    roots: Set[str] = set()
    lines = statement.body.body if isinstance(statement, cst.Try) else [statement]
    for line in lines:
        for small in getattr(line, "body", ()):
            names = small.names if isinstance(small, (cst.Import, cst.ImportFrom)) else ()
            for alias in names if not isinstance(names, cst.ImportStar) else ():
                if alias.asname is not None:
                    bound = alias.asname.name
                    roots.add(bound.value if isinstance(bound, cst.Name) else "")
                else:
                    roots.add((dotted_name(alias.name) or "").split(".")[0])
    return roots


def _root(node: cst.BaseExpression) -> Optional[str]:
    """The name an attribute, subscript or call chain starts from (`os` in
    `os.environ["X"]`), when it goes through at least one attribute."""
    through_attribute = False
    while isinstance(node, (cst.Attribute, cst.Subscript, cst.Call)):
        through_attribute |= isinstance(node, cst.Attribute)
        node = node.func if isinstance(node, cst.Call) else node.value
    return node.value if isinstance(node, cst.Name) and through_attribute else None


def _configures(statement: cst.CSTNode, roots: Set[str]) -> bool:
    """A line that only configures imported modules: calls of their functions
    (`warnings.filterwarnings(...)`) and assignments into them (`os.environ["X"] = "1"`)."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for small in statement.body:
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            targets = [small.value.func]
        elif isinstance(small, cst.Assign):
            targets = [target.target for target in small.targets]
        elif isinstance(small, (cst.AugAssign, cst.AnnAssign)) and small.value is not None:
            targets = [small.target]
        else:
            return False
        if not all(_root(target) in roots for target in targets):
            return False
    return True


def _is_import_line(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def derived_root(node: cst.BaseExpression, names: Set[str]) -> Optional[str]:
    """The one of `names` that `node` is, or is an element, attribute or items() view of
    (`batch` for `batch["x"]`), else None."""
    while True:
        name = dotted_name(node)
        if name is not None and name in names:
            return name
        if isinstance(node, (cst.Subscript, cst.Attribute)):
            node = node.value
        elif (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in ("items", "values")
        ):
            node = node.func.value
        else:
            return None


_METADATA_VALUES = (cst.SimpleString, cst.ConcatenatedString, cst.Integer, cst.Float)


def _is_module_metadata(statement: cst.CSTNode) -> bool:
    """`__author__ = 'SherlockLiao'`, `__version__ = "1.0"`, `__all__ = ["Net"]`: a literal
    bound to a dunder name, which runs nothing and may sit among the imports."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return False
    small = statement.body[0]
    if not isinstance(small, cst.Assign):
        return False
    if not all(
        isinstance(t.target, cst.Name) and re.fullmatch(r"__\w+__", t.target.value)
        for t in small.targets
    ):
        return False
    value = small.value
    if isinstance(value, (cst.List, cst.Tuple)):
        return all(isinstance(e.value, _METADATA_VALUES) for e in value.elements)
    return isinstance(value, _METADATA_VALUES)


def _is_masked_magic(statement: cst.CSTNode) -> bool:
    """A notebook's `%magic` or `!shell` line, masked as a bare placeholder name."""
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.Name)
        and statement.body[0].value.value.startswith("__optcodemod_magic_")
    )

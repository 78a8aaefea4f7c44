"""OPT408: a model rebound to its `torch.compile` wrapper, whose `state_dict()` is then read."""

from __future__ import annotations

from functools import cached_property
from typing import List, Optional

import libcst as cst

from optimizer_codemod.analysis.calls import callee_name, positional, without_argument
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.values import alias_in
from optimizer_codemod.rule import Example, Fix, InsertStatements, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

COMPILE = "torch.compile"
# Methods whose answer differs between the wrapper and the module compiled in place: names
# (`_orig_mod.` prefixes), the module tree (the wrapper is one more level), and hooks (on the
# wrapper they run outside the compiled region, on the module inside it).
TREE_METHODS = frozenset(
    {
        "named_parameters",
        "named_buffers",
        "named_modules",
        "named_children",
        "children",
        "modules",
        "get_submodule",
        "get_parameter",
        "register_forward_hook",
        "register_forward_pre_hook",
        "register_full_backward_hook",
        "register_full_backward_pre_hook",
        "register_backward_hook",
        "register_state_dict_pre_hook",
        "register_load_state_dict_post_hook",
    }
)
WRAPPER_WORDS = frozenset({"_orig_mod", "OptimizedModule"})

SCRIPT = """\
import torch

model = Net().to(device)
model = torch.compile(model)
optimizer = torch.optim.AdamW(model.parameters())
for x, y in loader:
    loss_fn(model(x), y).backward()
    optimizer.step()
torch.save(model.state_dict(), "model.pt")
"""


class StateDictSavedFromCompileWrapper(Rule):
    """
    What it does:
        Rewrites `model = torch.compile(model, ...)` to `model.compile(...)` when the script
        reads `model.state_dict()` (to save a checkpoint, or to copy weights), directly or
        through a name bound to it afterwards (nanoGPT's `raw_model = model.module if ddp
        else model`), and `model = torch.compile(Net(...), ...)` to `model = Net(...)`
        followed by `model.compile(...)`. The other arguments of `torch.compile` (`mode`,
        `fullgraph`, `dynamic`, `backend`, `options`) carry over unchanged. The compiled
        object is a module: `torch.compile` returns an `OptimizedModule` (with
        `state_dict()`) only for an `nn.Module`, and a plain function for anything else.

    Why is it slow:
        It is not slower; it breaks checkpoints. `torch.compile(model)` returns an
        `OptimizedModule` that holds the model as its submodule `_orig_mod`, so its
        `state_dict()` names every tensor `_orig_mod.<name>`. A checkpoint saved from it does
        not load into the uncompiled model (`load_state_dict` raises on unexpected and
        missing keys), which is how evaluation scripts, fine-tuning and export load it; the
        usual workaround is a loop that strips the prefix. `nn.Module.compile()` (torch 2.2)
        compiles the module's forward in place: the same compiled code runs, and
        `state_dict()` keeps the model's own names.

    Example:
        ```python
        model = torch.compile(model)
        ...
        torch.save(model.state_dict(), "model.pt")
        ```
        becomes
        ```python
        model.compile()
        ...
        torch.save(model.state_dict(), "model.pt")
        ```

    Fix safety:
        `behavior`: training computes the same (`Module.compile` sets its call to
        `torch.compile(self._call_impl, *args, **kwargs)`, the arguments passed as-is), but the saved checkpoints change their key
        names, which is the point and is observable: a loader that expects the
        `_orig_mod.` prefix (one that loads into another `torch.compile` wrapper) would need
        the plain names. Checked with torch 2.13.0+cpu
        (tests/test_issue16_compile_settings.py): `torch.compile(m).state_dict()` has keys
        `_orig_mod.0.weight`, `m.compile()` leaves `0.weight`.

        Reported without a fix when the rewrite would change more than the key names: the
        script calls `load_state_dict` on the compiled model (checkpoints it saved before
        the rewrite carry the prefix), asks the wrapper for names or the module tree
        (`named_parameters()`, `modules()`, hooks) after compiling, tests its type
        (`isinstance`, `type`), keeps and uses another name for the module bound before the
        compile (`eager = model`: it would be compiled too), mentions `_orig_mod` or
        `OptimizedModule`, or binds the wrapper to another name than the model (both
        objects stay in use; saving `model.state_dict()` instead gives the same tensors
        under plain names). Not rewritten inside a loop (a model compiled again on every
        pass), or when the statement holds more than the assignment. Needs `target-torch`
        2.2.

    Expected gain:
        None in speed: the same graphs are compiled and run. The gain is checkpoints that
        load into the model class without renaming keys. The prefix is a known pitfall:
        pytorch/pytorch issue #101107 ("Make compiled models serializable") collects the
        prefix-stripping workarounds, karpathy/nanoGPT issue #325 reports resumed training
        failing on it, and meta-pytorch/tnt pull request #441 moved TorchTNT to in-place
        `Module.compile` "to avoid changing state dict".
    """

    code = "OPT408"
    name = "state-dict-saved-from-compile-wrapper"
    message = "`state_dict()` of a `torch.compile` wrapper: every key gets an `_orig_mod.` prefix"
    fix_title = "Compile the module in place with `model.compile()`"
    safety = Safety.BEHAVIOR
    min_torch = TorchVersion(2, 2)
    triggers = (r"\bcompile\s*\(",)
    requires = (r"\.state_dict\s*\(",)
    examples = (
        Example(SCRIPT, SCRIPT.replace("model = torch.compile(model)", "model.compile()")),
        Example(
            SCRIPT.replace(
                "model = Net().to(device)\nmodel = torch.compile(model)",
                'model = torch.compile(Net().to(device), mode="max-autotune")',
            ),
            SCRIPT.replace("model = torch.compile(model)", 'model.compile(mode="max-autotune")'),
        ),
        Example(SCRIPT.replace("model = torch.compile(model)", "compiled = torch.compile(model)")),
        Example(SCRIPT.replace('torch.save(model.state_dict(), "model.pt")\n', "")),
    )

    @cached_property
    def _wrapper_named(self) -> bool:
        # Searched only when the text has the words: a visitor method would walk every file.
        return self.context.mentions(*WRAPPER_WORDS) and any(
            node.attr.value in WRAPPER_WORDS
            for node in find_all(self.context.module, cst.Attribute)
        )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        for call in facts.calls_to(COMPILE):
            assignment = facts.assignment_of(call.node)
            args = positional(call.node)
            if not args or any(d.decorator is call.node for d in facts.records.decorators):
                continue  # `torch.compile()` or a decorator: functions, not a module's keys
            if assignment is None or assignment.unpacked or assignment.augmented:
                if facts.method_calls("state_dict"):
                    self.decline(
                        call.node,
                        "the wrapper `torch.compile` returns is not bound to one name here (a "
                        "conditional expression, an argument, an unpacking): its `state_dict()` "
                        "keys are not followed",
                    )
                continue
            target = assignment.target
            if not self._state_dict_read(target, assignment):
                continue  # the wrapper's names never leave the script
            inner = args[0].value
            problem = self._problem(target, inner, assignment)
            if problem is not None:
                self.report(call.node, message=f"{self.message}; {problem}")
                continue
            self.report(call.node, self._fix(target, inner, call.node, assignment))

    def _state_dict_read(self, target: str, assignment) -> bool:
        """`target.state_dict()`, or the state_dict of a name bound to it after compiling
        (`raw_model = model.module if ddp else model`, nanoGPT's spelling)."""
        readers = {target} | {
            a.target
            for a in self._aliases(target)
            if a.site.function is assignment.site.function and a.site.order > assignment.site.order
        }
        return any(
            (c.receiver in readers and self._same_object(target, assignment, c.site))
            or self._passed_in(c.receiver, target, assignment, c.site)
            for c in self.facts.method_calls("state_dict")
        )

    def _used(self, name: str) -> bool:
        """`name` is called, has a method called, is passed to a call or assigned onward
        (nanoGPT binds `unoptimized_model = model` before compiling and never uses it)."""
        records = self.facts.records
        for site in records.calls:
            node = site.node
            if site.receiver == name or dotted_name(node.func) == name:
                return True
            if any(dotted_name(arg.value) == name for arg in node.args):
                return True
        return any(dotted_name(a.value) == name for a in records.assignments)

    def _aliases(self, target: str) -> List:
        """Assignments binding another name to `target` (or its DDP `.module`), directly or
        through either branch of a conditional expression."""
        found = []
        for assignment in self.facts.records.assignments:
            value = assignment.value
            options = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
            names = {dotted_name(option) for option in options}
            if assignment.target != target and names & {target, f"{target}.module"}:
                found.append(assignment)
        return found

    def _same_object(self, target: str, assignment, site) -> bool:
        """`target` in a scope reaching this assignment: the same function, a method of the
        same class for `self.` attributes, or a function that does not bind it itself."""
        function = site.function
        if function is assignment.site.function:
            return True
        if target.startswith("self."):
            return (
                assignment.site.class_name is not None
                and site.class_name == assignment.site.class_name
            )
        return assignment.site.function is None and not any(
            a.site.function is function for a in self.facts.assignments_to(target)
        )

    def _passed_in(self, receiver: Optional[str], target: str, assignment, site) -> bool:
        """`receiver` is the parameter of another function that the wrapper is handed to
        (`train(model, ...)` -> `def train(model, ...)`, through one call site each)."""
        home = assignment.site.function
        if receiver is None or site.function is home or site.function is None:
            return False
        memo = self.facts.memo("compile_wrapper_aliases")
        key = (target, id(home), id(site.function))
        if key not in memo:
            memo[key] = alias_in(self.facts, target, home, site.function)
        return memo[key] == receiver

    def _problem(self, target: str, inner: cst.BaseExpression, assignment) -> Optional[str]:
        """Why `target.compile()` would change more than the key names, or None."""
        facts = self.facts
        inner_name = dotted_name(inner)
        if inner_name is not None and inner_name != target:
            return (
                f"`{target}` holds the wrapper while `{inner_name}` stays the module: save "
                f"`{inner_name}.state_dict()` (the same tensors), or compile it in place with "
                f"`{inner_name}.compile()` and use `{inner_name}`"
            )
        before = [
            a.target
            for a in self._aliases(target)
            if (
                a.site.function is not assignment.site.function
                or a.site.order < assignment.site.order
            )
            and self._used(a.target)
        ]
        if before:
            return (
                f"`{before[0]} = {target}` keeps the module uncompiled; compiling it in place "
                f"would compile `{before[0]}` too"
            )
        if self._wrapper_named:
            return "the script names `_orig_mod` or `OptimizedModule`: move to `.compile()` by hand"
        if assignment.site.loops:
            return "it is compiled inside a loop: compile it once with `.compile()`"
        if len(getattr(assignment.site.statement, "body", ())) != 1:
            return "the statement holds more than the assignment: use `.compile()` by hand"
        later = self._later_calls(target, assignment)
        loads = [c for c in later if c.method == "load_state_dict"]
        if loads:
            return (
                f"`{target}.load_state_dict` after compiling expects the prefixed keys that "
                "checkpoints saved so far carry: strip `_orig_mod.` when loading, then use "
                f"`{target}.compile()`"
            )
        tree = sorted({c.method for c in later if c.method in TREE_METHODS})
        if tree:
            return (
                f"`{target}.{tree[0]}()` after compiling answers for the wrapper (names with "
                f"`_orig_mod.`, one more module level): use `{target}.compile()` by hand"
            )
        for site in facts.records.calls:
            args = positional(site.node)
            if (
                callee_name(site.node) in ("isinstance", "type")
                and isinstance(site.node.func, cst.Name)
                and args
                and (
                    dotted_name(args[0].value) == target
                    or self._passed_in(dotted_name(args[0].value), target, assignment, site.site)
                )
            ):
                return f"the script tests the type of `{target}`, which the rewrite changes"
        return None

    def _later_calls(self, target: str, assignment) -> List:
        """Method calls on `target` that may run after it is compiled."""
        found = []
        for site in self.facts.records.calls:
            if not (
                site.receiver == target and self._same_object(target, assignment, site.site)
            ) and not self._passed_in(site.receiver, target, assignment, site.site):
                continue
            same_body = site.site.function is assignment.site.function
            if not same_body or site.site.order > assignment.site.order or site.site.loops:
                found.append(site)
        return found

    def _fix(self, target: str, inner: cst.BaseExpression, call: cst.Call, assignment) -> Fix:
        module = cst.parse_expression(target)
        compile_call = without_argument(call, call.args[0]).with_changes(
            func=cst.Attribute(value=module, attr=cst.Name("compile"))
        )
        statement = assignment.site.statement
        if dotted_name(inner) == target:
            return Fix((Replace(assignment.statement_node, cst.Expr(compile_call)),))
        built = assignment.statement_node.with_changes(value=inner)
        after = cst.SimpleStatementLine(body=[cst.Expr(compile_call)])
        return Fix(
            (
                Replace(assignment.statement_node, built),
                InsertStatements(statement, after=(after,)),
            )
        )

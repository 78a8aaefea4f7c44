"""OPT403: evaluation under `torch.no_grad()` where `torch.inference_mode()` would do."""

from __future__ import annotations

import libcst as cst

from typing import Iterator, List, Optional, Set, Tuple

from optimizer_codemod.analysis.escapes import (
    block_escape,
    callers_keep_result,
    evaluation_loops,
    host_names,
    is_host_value,
)
from optimizer_codemod.analysis.calls import code_of, excerpt
from optimizer_codemod.analysis.collect import Site
from optimizer_codemod.analysis.loaders import module_name
from optimizer_codemod.analysis.model_calls import (
    TRAINING_FIRST,
    forward_may_keep_for_training,
    model_differentiates_in_forward,
    parameters_made_on_first_forward,
    training_may_follow,
    training_may_follow_calls,
)
from optimizer_codemod.analysis.nodes import find_all, under_with
from optimizer_codemod.analysis.precision import loops_elsewhere
from optimizer_codemod.analysis.training import NO_GRAD_DECORATOR, no_grad_regions
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.rule import Example, Fix, ImportSpec, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

NO_GRAD = frozenset({"torch.no_grad", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad"})


_TRAIN = (
    "import torch\n"
    "for x, y in loader:\n"
    "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
    "    loss.backward()\n"
)


# Why a forward under inference_mode must not keep what it makes when training follows.
_KEPT_TENSOR = (
    "a tensor the model's forward makes under `inference_mode` and keeps would be saved for "
    "backward at a later training step, which raises"
)
# Why the model's first forward must not run under inference_mode when it makes parameters.
_LAZY_PARAMETERS = (
    "parameters made under `inference_mode` are inference tensors that never get a `.grad`, "
    "so the optimizer would never update them: training would leave those layers as "
    "initialised, without an error"
)


class EvaluationUnderNoGrad(Rule):
    """
    What it does:
        Replaces `with torch.no_grad():` by `with torch.inference_mode():` around evaluation
        code, after training or between its steps: a block that runs the model the script
        trains and whose results leave it only as plain Python values (`.item()`, counts,
        `len(...)`) or NumPy arrays (`.numpy()`).
        An evaluation loop with no `no_grad` at all (a `for` loop right after `model.eval()`
        on the model the training loop calls, with no `.train()` between, whose body names
        that model or calls a function of the file: a loop that only logs numbers after
        `teacher_model.eval()`, as cleanrl's, evaluates nothing) is put under
        `with torch.inference_mode():` on the same conditions.

    Why is it slow:
        Under `no_grad`, every tensor still carries autograd bookkeeping: a version counter
        bumped by each in-place operation and view tracking, checked when tensors are used.
        `inference_mode` also skips those, so each operation does less work on the host.
        PyTorch's documentation of `torch.inference_mode` describes it as "analogous to
        no_grad" with "better performance by disabling view tracking and version counter
        bumps" (https://pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html).
        The saving is host time per operator, so it shows with many small operations.

    Example:
        ```python
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in val_loader:
                correct += (model(x).argmax(1) == y).sum().item()
        print(correct / len(val_loader.dataset))
        ```
        becomes
        ```python
        model.eval()
        correct = 0
        with torch.inference_mode():
            for x, y in val_loader:
                correct += (model(x).argmax(1) == y).sum().item()
        print(correct / len(val_loader.dataset))
        ```

    Fix safety:
        `safe`: the same kernels run and compute the same values. What changes is that
        tensors created in the block become inference tensors, which raise when later saved
        for backward or updated in place outside inference mode. So the block is rewritten
        only when nothing it creates can reach later code as a tensor: every name it binds is
        either a plain Python value or a NumPy array wherever the scope binds it (numbers,
        `.item()`, `.numpy()`, `math` functions of them), unused after the block (or bound again before any later use), or
        only read after it for its value (`loss.item()`, `.tolist()`, `.numpy()`, `float(loss)`,
        `print(loss)`, an f-string: reading an inference tensor outside inference mode is
        allowed; tests/test_inference_mode_claims.py runs each case), or followed after it
        as a function's result is (below): through attributes that are not called
        (`outputs.logits`), and into a new tensor computed from it alone with a tensor method
        that returns one (`outputs.logits.argmax(dim=-1)`: outside inference mode that is an
        ordinary tensor, which Accelerate's `gather_for_metrics` may then gather); it stores into no attribute or subscript,
        returns or yields no tensor, updates nothing in place (`x.add_(...)`, `p -= ...`,
        `optimizer.step()`), and wants no autograd (`backward`, `enable_grad`,
        `requires_grad`). Its calls must be known not to keep or replace tensors: a model or
        loss also called in the training loop (which is how the block is recognised as
        evaluation), a parameter that every call of its function in this file binds to one
        of those, to a model the script trains or to a module of `torch.nn` (`test(model,
        criterion, ...)` called from the training step with its own parameters and from the
        script with `gcn` and `nn.NLLLoss()`, as pytorch/examples' gcn does), library functions (`torch`, `numpy`), Accelerate's `gather`,
        `gather_for_metrics`, `reduce` and `pad_across_processes` (on a name bound to
        `Accelerator(...)`: they return new tensors), builtins, tensor methods that
        return new tensors, views or Python values, loggers, and `append`/`update` of plain
        values. Anything else stops the rewrite: a function of the script, `model.to(...)`
        or `load_state_dict` on the trained model, `m.reset_parameters()`,
        `param.materialize(...)` (new parameters made there would be inference tensors).
        A method of the trained model is accepted only when it switches or reads it
        (`eval()`, `parameters()`, or a getter such as `model.get_block_size()`: every
        model the file trains is built from classes of the file deriving from `nn.Module`
        or from each other, and each of them that defines the method defines it as one
        `return` of an expression without calls that reads no property or method of them),
        or when each definition of it only computes, as `forward` does (`model.decode(z)`:
        it calls submodules its class assigns, other such methods, library functions and
        tensor methods that return new values, and stores, updates in place and yields
        nothing); the block then runs the model.
        Inside a training loop (a per-step prediction under `no_grad`, as pytorch/examples'
        time_sequence_prediction makes after each LBFGS step), on the same conditions, every
        use of a name the block binds is checked wherever it is in the scope, the next
        iteration's reads included, even of a name the script also binds before the loop (a
        target computed under `no_grad` and read by the loss is a use that stops the
        rewrite), and the model's own code must keep nothing: every model
        the file trains is built from classes of the file deriving from `nn.Module` (or each
        other), none of whose methods but `__init__` stores on `self` (a forward that keeps
        its hidden state would hand an inference tensor to the next step's backward, which
        raises); buffers updated in place, as batch norm's running statistics, stay ordinary
        tensors (tests/test_inference_mode_claims.py). The same holds for a block that a
        training step may follow (an "initial loss" before the loop, an evaluation at the
        start of each epoch or at the top of the step loop, or a function called there, a
        function decorated with `no_grad` included): its forward may be the model's first,
        which builds what the model caches (a `self.cache` made on first use would be an
        inference tensor, and the first training step would raise saving it for backward;
        tests/test_inference_mode_before_training.py runs it); a block before the first
        step is kept too where the model may be sharded (FSDP, `fully_shard`, DeepSpeed:
        they build their state on the first forward, and the first training step then
        raises, pytorch/pytorch#113203), or where it may create parameters on its first
        forward (a block in the training loop counts only before the step's backward):
        torch's lazy modules (`nn.LazyLinear`, any `torch.nn.Lazy...` class, a class
        deriving from `LazyModuleMixin`, `UninitializedParameter`, `.materialize(...)`)
        among the calls that build the model and its classes of this file or of other
        modules of the run, or, in this file, a class of another library or of the file
        given `-1` as a size (`Linear(-1, 64)`, `SAGEConv((-1, -1), 64)`,
        `HAN(in_channels=-1)`: PyG's lazy input size, which the first input sets; not
        `dim=-1` nor an index keyword). Parameters made under `inference_mode` are inference
        tensors that never get a `.grad`: the optimizer would leave those layers untrained,
        without an error (pytorch_geometric's hetero examples run their model once under
        `no_grad` to "Initialize lazy modules."; tests/test_inference_mode_before_training.py
        runs it). An evaluation once training has started finds them made. Under DeepSpeed
        any block a training step follows is kept, between epochs too (ZeRO-3 keeps the
        parameters a forward gathers for the next: snowflakedb/ArcticTraining#265).
        Training counts as following a block in a function that returns its results after
        the loop (a baseline evaluation, then training, then `return before, after`). A
        block after an epoch's
        steps, in the loop that trains again (the usual validation), meets the caches
        training built, but a model that grows one again (a longer sequence, as a rotary
        table sized on demand) would hand the next epoch's first step an inference tensor:
        there the classes of this file the model is built from must keep nothing outside
        `__init__`; torch's own modules keep nothing from a forward, and a model of other
        code is taken to keep nothing too. A script whose
        training loop is in another module of the run keeps its blocks, with the reason.
        Never in a callback that the file hands to a trainer of another module
        (`trainer.set_callback("on_batch_end", fn)`): it runs inside that trainer's loop,
        out of sight; the decline says so. The model's own `forward` is assumed not to
        keep its inputs. Nor where a comment on or above the `with` line names
        `inference_mode` (mrdbourke's "no_grad() required for PyTorch 2.0, I found some
        errors with `torch.inference_mode()`"): the author chose `no_grad` knowing it, and
        the edit would leave the comment contradicting the code.
        Nothing is changed where a trained model differentiates inside its forward
        (`torch.enable_grad`, `torch.autograd.grad` among its layers, in this file or in its
        classes of other modules of the run: x-transformers' test-time training): under
        `no_grad` `enable_grad` turns autograd back on, under `inference_mode` it does not.
        Wrapping a loop that had autograd on is `behavior`, applied only with
        `--unsafe-fixes`: the analysis sees the loop, not the model's `forward`, which might
        want gradients itself (`torch.autograd.grad` on its inputs); the loop's own target
        and iterable are covered, since the loader's batches become inference tensors too.
        A function decorated with `@torch.no_grad()` (or `@torch.no_grad`) gets
        `@torch.inference_mode()` on the same conditions, its whole body taken as the block,
        when what it returns is a plain Python value, or else when every caller in the run
        only reads what it returns. For a module-level function, the calls of this file and
        those the project index found in the other modules of the run are followed
        (analysis/escapes.py `result_escape`): the result, through indexing, `.items()`,
        `.to("cpu")`/`.cpu()`/`.detach()`, the names it is assigned or unpacked to, loops and
        comprehensions over it, containers it is packed into, `max`/`min` and arithmetic
        with plain values, may only meet the reads accepted after a block, comparisons,
        truth tests, loggers, `str.format`, `json.dumps` and `torch.save` (serialising an
        inference tensor is reading it; tests/test_inference_mode_claims.py runs each).
        A call that hands it to any other function, a store into an attribute or subscript,
        a `return` onward, or arithmetic with a tensor stops the rewrite. So does a caller
        that may not be seen: the function passed around or stored (here or by a module of
        the run), a module that is no script (no `__main__` guard, no training at its top
        level) and that no module of the run imports, a nested function. A method
        (`model.generate(...)`) is followed in a script that no module of the run imports:
        every `.generate` of the file must be a call whose receiver is followed to an
        instance of the class (`model = GPT(config).to(device)`, or `self` in its methods);
        in its body, `self(...)` runs the model when the class is one the trained model is
        built from. Callers outside the files of the run are not known: run the tool on the
        whole project, as for every fact of the project index.
        A `no_grad` block in the fallback branch of a feature check (the `else` of
        `if hasattr(torch, "inference_mode")`, an old-torch version branch) stays: it runs
        where `inference_mode` is missing (analysis/guards.py).

    Expected gain:
        Host time per operator in evaluation, small next to the kernels unless they are
        tiny. `benchmarks/rule_gains/opt403.py` (eval forward of a 6-layer MLP with LayerNorm
        and GELU, `no_grad` against `inference_mode`; 2-core x86_64, torch 2.13.0+cpu,
        2026-11-21, machine shared with other jobs) measured x1.02 to x1.04 in three runs at
        width 64 and batch 1 (about 0.11 ms per forward, dominated by per-operator overhead),
        and x0.95 to x1.00 at width 256 and batch 16 (0.33 ms): no gain beyond noise once the
        kernels do real work.
    """

    code = "OPT403"
    name = "evaluation-under-no-grad"
    message = "Evaluation under `torch.no_grad()`: `torch.inference_mode()` does less work"
    fix_title = "Use `torch.inference_mode()`"
    safety = Safety.SAFE
    min_torch = TorchVersion(1, 9)
    # `no_grad` blocks, and loops after `model.eval()` that run without one.
    triggers = (r"\bno_grad\b", r"\.eval\s*\(\s*\)")
    # The block must call a model the training loop also calls: the file trains. A function
    # decorated with `no_grad` is examined (and its decline explained) in any file: library
    # modules hold `generate`/`evaluate` functions that training scripts call.
    # Callbacks handed to a trainer of another module are examined too (and explained).
    requires = (BACKWARD_CALL + "|" + NO_GRAD_DECORATOR + "|callback",)
    # A script whose loop is in another module is examined too, to say why its blocks stay.
    examines_entry_points = True
    examples = (
        Example(
            _TRAIN + "correct = 0\n"
            "with torch.no_grad():\n"
            "    for x, y in val_loader:\n"
            "        correct += (model(x).argmax(1) == y).sum().item()\n"
            "print(correct)\n",
            _TRAIN + "correct = 0\n"
            "with torch.inference_mode():\n"
            "    for x, y in val_loader:\n"
            "        correct += (model(x).argmax(1) == y).sum().item()\n"
            "print(correct)\n",
        ),
        Example(
            _TRAIN + "with torch.no_grad():\n"
            "    targets = model(x)\n"
            "loss = torch.nn.functional.mse_loss(model(x), targets)\n"
            "loss.backward()\n"
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        self._decorated_functions(original_node)
        if not self.facts.trains:
            # A library module, or a script whose training loop is in another module: only
            # its decorated functions, and blocks in callbacks it hands over, are examined.
            self._blocks_in_callbacks()
            self._blocks_beside_loops_elsewhere()
            return
        training = set(map(id, self.facts.training_loops))
        self._evaluation_without_no_grad(training)
        differentiates = model_differentiates_in_forward(self.facts)
        for call, site in self._no_grad_blocks():
            comment = _comment_naming_inference_mode(site.statement)
            if comment is not None:
                self.decline(
                    call,
                    f"the comment at the block names `inference_mode` (`{comment}`): the author "
                    "chose `no_grad` knowing it, and the edit would leave the comment saying so",
                )
                continue
            if differentiates is not None:
                self.decline(
                    call,
                    f"the trained model differentiates inside its forward ({differentiates}): "
                    "under `no_grad` it turns autograd back on, which `inference_mode` does not "
                    'allow ("element 0 of tensors does not require grad")',
                )
                continue
            scope = site.function if site.function is not None else self.facts.module
            reason = block_escape(self.facts, site.statement, scope)
            inside = any(id(loop) in training for loop in site.loops)
            if reason is None:
                follows = training_may_follow(self.facts, site.statement, site.function, site.order)
                hazard = _before_training_hazard(self.facts, follows, inside)
                if hazard is not None:
                    where = "inside the training loop" if inside else "run before a training step"
                    self.decline(call, f"the block is {where}, and {hazard}")
                    continue
            if reason is not None:
                self.decline(
                    call,
                    f"{reason}, and a tensor made under `inference_mode` may only be read "
                    "later, never saved for backward nor updated in place",
                )
                continue
            self.report(call, _inference_mode_fix(call, call.func))

    def _blocks_in_callbacks(self) -> None:
        """`with torch.no_grad():` in a function this file hands to another call
        (`trainer.set_callback("on_batch_end", batch_end_callback)`): it runs inside a
        training loop this file does not show, so what its tensors meet is unknown."""
        handed = {
            arg.value.value
            for call in self.facts.records.calls
            for arg in call.node.args
            if isinstance(arg.value, cst.Name)
        }
        for item, site in self.facts.records.with_items:
            call = item.item
            function = site.function
            if (
                function is None
                or function.name.value not in handed
                or not isinstance(call, cst.Call)
                or self.facts.qualified_name(call.func) not in NO_GRAD
            ):
                continue
            self.decline(
                call,
                f"the block is in `{function.name.value}()`, which this file hands to a call "
                "as a callback: it runs inside a training loop of another module, where the "
                "analysis cannot tell whether tensors it makes meet the graph",
            )

    def _blocks_beside_loops_elsewhere(self) -> None:
        """`with torch.no_grad():` in a script that trains through a loop of another module
        of the run (LLMs-from-scratch ch07 computes its initial losses with
        previous_chapters.py's `calc_loss_loader`, then trains with its
        `train_model_simple`): what the model keeps from a forward there is not followed into
        that loop."""
        loops = loops_elsewhere(self.facts)
        if loops is None:
            return
        for call, _site in self._no_grad_blocks():
            self.decline(
                call,
                f"the script trains its model through a loop of {', '.join(loops.modules)}, "
                "which the analysis does not follow from here: whether the model's forward "
                f"keeps a tensor it makes in the block for that training is unknown, and "
                f"{_KEPT_TENSOR}",
            )

    def _no_grad_blocks(self) -> Iterator[Tuple[cst.Call, Site]]:
        """`with torch.no_grad():` statements (no arguments), with where each sits."""
        for item, site in self.facts.records.with_items:
            call = item.item
            if (
                isinstance(call, cst.Call)
                and not call.args
                and self.facts.qualified_name(call.func) in NO_GRAD
                and isinstance(site.statement, cst.With)
            ):
                yield call, site

    def _decorated_functions(self, module: cst.Module) -> None:
        """`@torch.no_grad()` on a function: `@torch.inference_mode()` when its body is a
        block whose tensors cannot leave it, and it returns only plain Python values."""
        for function in _decorated_with_no_grad(self.facts, module):
            for decorator in function.decorators:
                expr = decorator.decorator
                target = expr.func if isinstance(expr, cst.Call) else expr
                if isinstance(expr, cst.Call) and expr.args:
                    continue
                if self.facts.qualified_name(target) not in NO_GRAD:
                    continue
                reason = _function_escape(self.facts, function)
                if reason is None:
                    follows = training_may_follow_calls(self.facts, function)
                    hazard = _before_training_hazard(self.facts, follows)
                    if hazard is not None:
                        reason = f"it is called before a training step, and {hazard}"
                if reason is not None:
                    self.decline(
                        expr,
                        f"`{function.name.value}()` cannot run under `torch.inference_mode()`: "
                        f"{reason}",
                    )
                    continue
                self.report(expr, _inference_mode_fix(expr, target))

    def _evaluation_without_no_grad(self, training: Set[int]) -> None:
        """A loop right after `model.eval()` that runs the trained model with autograd on:
        wrapped in `torch.inference_mode()` when nothing it makes reaches later code."""
        facts = self.facts
        regions = no_grad_regions(facts)
        covered = {id(node) for region in regions for node in find_all(region, cst.For)}
        statements = {id(region) for region in regions}
        for loop in evaluation_loops(facts, training):
            if id(loop.node) in covered:
                continue
            if any(id(inner) in statements for inner in find_all(loop.node.body, cst.With)):
                # The body turns autograd off itself (Hugging Face's QA scripts: `with
                # torch.no_grad():` around each batch): the `no_grad` fix converts that block.
                continue
            scope = loop.function if loop.function is not None else facts.module
            reason = block_escape(facts, loop.node, scope)
            differentiates = model_differentiates_in_forward(facts)
            if reason is None and differentiates is not None:
                reason = f"the trained model differentiates inside its forward ({differentiates})"
            if reason is None:
                follows = training_may_follow(facts, loop.node, loop.function, loop.start)
                hazard = _before_training_hazard(facts, follows)
                reason = f"it runs before a training step, and {hazard}" if hazard else None
            if reason is not None:
                self.decline(
                    loop.node,
                    "this evaluation loop (after `.eval()`) builds autograd graphs, but "
                    f"cannot run under `torch.inference_mode()`: {reason}",
                )
                continue
            torch_name = module_name(facts, "torch")
            if torch_name is None:
                self.decline(loop.node, "`torch` is not imported under a name the fix could use")
                continue
            wrapped = under_with([loop.node], f"{torch_name}.inference_mode()")
            imports = () if facts.imports.name_for_module("torch") else (ImportSpec("torch"),)
            self.report(
                loop.node,
                Fix((Replace(loop.node, wrapped),), imports),
                message="Evaluation loop after `.eval()` runs without `torch.no_grad()`: "
                "autograd records a graph for every forward",
                safety=Safety.BEHAVIOR,
                fix_title="Run the loop under `torch.inference_mode()`",
            )


def _before_training_hazard(facts, follows: int, inside: bool = False) -> Optional[str]:
    """Why a forward under `inference_mode` that training of kind `follows` may follow
    (model_calls.training_may_follow) would spoil that training; None when it would not.
    Before the first step, a model that makes parameters on its first forward (lazy
    layers) would make them there. `inside` a training loop, a tensor the forward keeps
    meets the next step wherever the block is, but parameters are made only before the
    first step: after a step's backward they exist."""
    if follows == TRAINING_FIRST:
        lazy = parameters_made_on_first_forward(facts)
        if lazy is not None:
            return (
                f"the model may create parameters on its first forward ({lazy}); "
                f"{_LAZY_PARAMETERS}"
            )
    kept = forward_may_keep_for_training(facts, TRAINING_FIRST if inside else follows)
    return None if kept is None else f"{kept}: {_KEPT_TENSOR}"


def _comment_naming_inference_mode(statement: cst.With) -> Optional[str]:
    """The comment on the `with` line or on the lines right above it, when it mentions
    `inference_mode` (mrdbourke's "no_grad() required for PyTorch 2.0, I found some errors
    with `torch.inference_mode()`"), else None."""
    comments = [line.comment for line in statement.leading_lines]
    if isinstance(statement.body, cst.IndentedBlock):
        comments.append(statement.body.header.comment)
    for comment in comments:
        if comment is not None and "inference_mode" in comment.value:
            return excerpt(comment)
    return None


def _inference_mode_fix(node: cst.BaseExpression, target: cst.BaseExpression) -> Fix:
    """`torch.no_grad()` (or a bare decorator `@torch.no_grad`) as `torch.inference_mode()`:
    the call form always, since a bare `@torch.inference_mode` needs torch 2.0."""
    call = node if isinstance(node, cst.Call) else cst.Call(func=target)
    if isinstance(target, cst.Attribute):
        fixed = call.with_changes(func=target.with_changes(attr=cst.Name("inference_mode")))
        return Fix((Replace(node, fixed),))
    fixed = call.with_changes(func=cst.Name("inference_mode"))
    return Fix((Replace(node, fixed),), (ImportSpec("torch", "inference_mode"),))


def _decorated_with_no_grad(facts, module: cst.Module) -> List[cst.FunctionDef]:
    """Functions and methods with a decorator that may be `no_grad` (checked by the caller)."""
    if not any(_names_no_grad(d.decorator) for d in facts.records.decorators):
        return []
    return [
        function
        for function in find_all(module, cst.FunctionDef)
        if any(_names_no_grad(d.decorator) for d in function.decorators)
    ]


def _names_no_grad(expr: cst.BaseExpression) -> bool:
    target = expr.func if isinstance(expr, cst.Call) else expr
    return (isinstance(target, cst.Attribute) and target.attr.value == "no_grad") or (
        isinstance(target, cst.Name) and target.value == "no_grad"
    )


def _function_escape(facts, function: cst.FunctionDef) -> Optional[str]:
    """Why a tensor made in the decorated `function` may reach code after it runs; None
    when none can: it returns plain values only, or every caller in the run only reads
    what it returns."""
    host = host_names(function, facts)
    returns_read = False
    for node in find_all(function.body, cst.Return, cst.Yield):
        if isinstance(node, cst.Yield):
            return "it is a generator, and what it yields goes to its caller"
        if node.value is not None and not is_host_value(node.value, host, facts):
            text = code_of(node.value).strip().splitlines()[0][:40]
            reason = callers_keep_result(facts, function)
            if reason is not None:
                return (
                    f"it returns `{text}`, maybe a tensor, and {reason}; a caller could save "
                    "it for backward or update it in place (an inference tensor cannot be)"
                )
            returns_read = True
            break
    return block_escape(facts, function, function, returns_read)

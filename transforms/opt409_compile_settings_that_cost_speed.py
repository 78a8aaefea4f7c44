"""OPT409: compile settings that hide or cost the speed compiling is for (reported only)."""

from __future__ import annotations

from typing import List, Set

import libcst as cst

from optimizer_codemod.analysis.calls import keyword, literal, positional
from optimizer_codemod.analysis.cuda_graphs import compile_calls, graph_mode
from optimizer_codemod.analysis.precision import shape_variation
from optimizer_codemod.analysis.training import model_classes, the_trained_model
from optimizer_codemod.rule import Example, Rule, Safety

SUPPRESS_ERRORS = "torch._dynamo.config.suppress_errors"
ISSUE = "pytorch/pytorch#188150"


class CompileSettingsThatCostSpeed(Rule):
    """
    What it does:
        Reports, without changing anything, compile settings a script already has that hide
        or undo what compiling gains:
        `torch._dynamo.config.suppress_errors = True`; `dynamic=True` passed to
        `torch.compile` or `.compile()`; and a CUDA-graph mode (`mode="reduce-overhead"` or
        `"max-autotune"`) where the script shows that shapes change between steps (batches
        padded to their longest sequence, by `pad_sequence` or by hand; detection models),
        or that `.item()` runs inside
        the compiled code (the `forward` of the model's classes, or the compiled function).

    Why is it slow:
        `suppress_errors = True` turns every frame Dynamo fails to compile into a silent
        fallback to eager mode; torch's own config says "you may lose optimization
        opportunities this way ... you should figure out why instead of suppressing it"
        (torch/_dynamo/config.py). `dynamic=True` makes the first compilation generate
        kernels for symbolic sizes, which "may not always work as some
        operations/optimizations will force specialization", where the default (`None`)
        compiles for the sizes seen and turns a dimension dynamic only once it changes
        (`torch.compile`'s docstring, torch 2.13). CUDA graphs replay one
        recorded launch sequence per input shape: each new shape records a new graph
        ("CUDAGraph supports dynamic shapes by recording a new graph for each distinct input
        size", the warning quoted in pytorch/pytorch issue #188150), and a device-to-host
        sync such as `.item()` cannot be captured in a CUDA graph ("Kernels which trigger
        host to device syncs (such as .item()) errors", PyTorch's "CUDAGraph Trees" page):
        Dynamo breaks the graph there, and each piece is graphed and replayed separately.

    Example:
        ```python
        model = torch.compile(model, mode="reduce-overhead")
        loader = DataLoader(data, collate_fn=lambda b: pad_sequence(b, batch_first=True))
        ```
        is reported: "CUDA graphs record a new graph for every batch shape ...".

    Fix safety:
        `suggest`: reported, never applied. Dropping `suppress_errors` makes a script that
        ran (slowly) raise where Dynamo fails; replacing `dynamic=True` or a CUDA-graph mode
        changes what gets compiled, and whether the default is faster depends on the shapes
        the script sees. Each message says which setting and what the script does that
        makes it cost speed. A CUDA-graph mode is only reported with evidence in the file
        (padding or packing sequences, a torchvision detection model, `.item()` in the
        model's `forward` or the compiled function): a fixed-shape script is left alone.
        Gradient accumulation under a CUDA-graph mode, named in the issue that asked for
        this rule, is not reported: we found no published measurement or documented
        mechanism to cite for it. Nor is a `torch.jit.script` function called from a
        compiled model: with torch 2.13.0+cpu Dynamo traces it into one graph without a
        break (tests/test_issue16_compile_settings.py).

    Expected gain:
        None by itself (a report). pytorch/pytorch issue #188150 measured
        `mode="reduce-overhead"` at a 1.5x speedup on fixed shapes that became ~0x ("22s to
        25s" per step, from recompilation) in a training loop padding each batch to its
        longest sequence; padding to a fixed length or `mode="default"` were the
        workarounds. A script that runs in eager mode behind `suppress_errors` gains
        nothing from compiling until the failure is fixed.
    """

    code = "OPT409"
    name = "compile-settings-that-cost-speed"
    message = "Compile setting that hides or costs the speed compiling is for"
    fix_title = "Review the compile setting"
    safety = Safety.SUGGEST
    triggers = (
        r"\bsuppress_errors\b",
        r"\bdynamic\s*=\s*True\b",
        r"['\"](?:reduce-overhead|max-autotune)['\"]",
    )
    examples = (
        Example(
            "import torch\n\ntorch._dynamo.config.suppress_errors = True\n"
            "model = torch.compile(model)\n"
        ),
        Example("import torch\n\nmodel = torch.compile(model, dynamic=True)\n"),
        Example("import torch\n\nmodel = torch.compile(model, dynamic=False)\n"),
        Example('import torch\n\nmodel = torch.compile(model, mode="reduce-overhead")\n'),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        for assignment in facts.attribute_assignments(SUPPRESS_ERRORS):
            if literal(assignment.value, None) is True:
                self.report(
                    assignment.statement_node,
                    message="`torch._dynamo.config.suppress_errors = True` hides compile "
                    "failures: a frame Dynamo cannot compile runs in eager mode, silently",
                )
        calls = compile_calls(facts)
        for call in calls:
            dynamic = keyword(call, "dynamic")
            if dynamic is not None and literal(dynamic.value, None) is True:
                self.report(
                    dynamic,
                    message="`dynamic=True` compiles symbolic-size kernels from the first "
                    "call; the default specialises and makes a "
                    "dimension dynamic only once it changes",
                )
        graphed = [c for c in calls if graph_mode(c) is not None]
        if graphed:
            self._check_graph_modes(graphed)

    def _check_graph_modes(self, calls: List[cst.Call]) -> None:
        facts = self.facts
        variation = shape_variation(facts)
        item = self._item_in_compiled_code(calls)
        for call in calls:
            mode = graph_mode(call)
            mode_arg = keyword(call, "mode")
            assert mode_arg is not None
            reasons = []
            if variation is not None:
                reasons.append(
                    f"batches change shape (`{variation.label}`): "
                    "CUDA graphs record a new graph for every batch shape "
                    f"({ISSUE}: a 1.5x speedup was lost to it)"
                )
            if id(call) in item:
                reasons.append(
                    "`.item()` runs inside the compiled code: a device-to-host sync, which "
                    "no CUDA graph can hold, splits the graph there"
                )
            if not reasons:
                continue
            self.report(
                mode_arg,
                message=f'`mode="{mode}"` uses CUDA graphs, but '
                + "; ".join(reasons)
                + '; `mode="default"` compiles without CUDA graphs',
            )

    def _item_in_compiled_code(self, calls: List[cst.Call]) -> Set[int]:
        """The compile calls whose compiled code (a function of this file, or the trained
        model's classes) calls `.item()`."""
        facts = self.facts
        items = facts.method_calls("item")
        if not items:
            return set()
        model = the_trained_model(facts)
        classes = model_classes(facts, model) if model is not None else set()
        functions = facts.records.functions
        found = set()
        for call in calls:
            targets = positional(call)
            compiled = None
            if targets and isinstance(targets[0].value, cst.Name):
                compiled = functions.get(targets[0].value.value)
            decorated = next(
                (f for f in functions.values() if any(d.decorator is call for d in f.decorators)),
                None,
            )
            compiled = compiled or decorated
            if compiled is not None:
                if any(i.site.function is compiled for i in items):
                    found.add(id(call))
            elif any(
                i.site.class_name in classes
                and i.site.function is not None
                and i.site.function.name.value == "forward"
                for i in items
            ):
                found.add(id(call))
        return found

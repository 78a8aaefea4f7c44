"""OPT603: `DistributedDataParallel(..., find_unused_parameters=True)`: a graph search per step."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.calls import (
    code_of,
    has_double_star,
    keyword,
    literal,
    positional,
    without_argument,
)
from optimizer_codemod.analysis.module_usage import (
    built_class,
    why_parameters_may_go_unused,
    why_training_may_change_used_parameters,
    why_used_parameters_may_change,
)
from optimizer_codemod.analysis.training import DDP_CLASSES
from optimizer_codemod.rule import Example, Fix, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

_NOT_A_LITERAL = object()
# The constructor keyword; `_set_static_graph()` came in 1.9 (pytorch/pytorch#71459).
STATIC_GRAPH_SINCE = TorchVersion(1, 11)
STATIC_TITLE = (
    "Replace `find_unused_parameters=True` with `static_graph=True` (the same parameters are "
    "used every iteration)"
)

NET = """\
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(32, 64)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


model = DDP(Net().to(device), device_ids=[rank], find_unused_parameters=True)
"""
NET_FIXED = NET.replace(", find_unused_parameters=True)", ")")
AUXILIARY = NET.replace(
    "        self.head = nn.Linear(64, 10)\n",
    "        self.head = nn.Linear(64, 10)\n        self.aux = nn.Linear(64, 2)\n",
)
AUXILIARY_STATIC = AUXILIARY.replace("find_unused_parameters=True", "static_graph=True")
ACCUMULATING = AUXILIARY + (
    "for x, y in loader:\n"
    "    with model.no_sync():\n"
    "        loss_fn(model(x), y).backward()\n"
)


class DDPFindUnusedParameters(Rule):
    """
    What it does:
        Reports `DistributedDataParallel(model, ..., find_unused_parameters=True)`. Where the
        wrapped model is an instance of a class of this file whose `forward` uses, on every
        call, every submodule and parameter its `__init__` registers (and the same holds for
        the classes of this file those submodules are built from), removes the keyword.
        Where some registered parameter is never used but every call of `forward` uses the
        same ones, and the script neither switches `requires_grad` nor accumulates under
        `no_sync()`, replaces it with `static_graph=True`: DDP then finds the unused
        parameters once, in the first iteration. Elsewhere it reports, with the reason the
        analysis could not prove either (`--why-not` lists it).

    Why is it slow:
        With `find_unused_parameters=True`, DDP traverses the autograd graph from the outputs
        of every forward to find the parameters that will get no gradient and marks them ready
        for reduction. When every parameter is used, that traversal is pure overhead, paid on
        each iteration on the training thread before backward can start. torch itself warns
        about it at run time (torch 2.13.0, `libtorch_cpu`): "find_unused_parameters=True was
        specified in DDP constructor, but did not find any unused parameters in the forward
        pass. This flag results in an extra traversal of the autograd graph every iteration,
        which can adversely affect performance. If your model indeed never has any unused
        parameters in the forward pass, consider turning this flag off." The documentation
        of `DistributedDataParallel` describes the flag
        (https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html).

    Example:
        ```python
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Linear(32, 64)
                self.head = nn.Linear(64, 10)

            def forward(self, x):
                return self.head(torch.relu(self.body(x)))

        model = DDP(Net().to(device), device_ids=[rank], find_unused_parameters=True)
        ```
        becomes `DDP(Net().to(device), device_ids=[rank])`.

    Fix safety:
        `behavior`: the gradients and the update do not change when every parameter is used,
        but if one is not (on some iteration), DDP without the flag stops with an error at
        the next iteration ("Expected to have finished reduction in the prior iteration")
        where the flagged run trained on. The fix is offered only when the analysis proves
        every parameter used: the model is built here from a class deriving from `nn.Module`
        alone; its `__init__` is straight-line and assigns `self.X = ...` only from
        `torch.nn` layers, `nn.Parameter`, classes of this file (checked the same way) and
        plain values (besides `register_buffer`, `self.apply(...)` and `nn.init` calls); its
        `forward` (and the methods of the class it calls) has no `if`,
        conditional expression, `while`, `try`, `with`, `and`/`or`, early `return` or
        `detach`, loops only over its own containers, returns one value (not a tuple, list or
        dict: a loss using part of it would leave the rest without gradients) and reads every
        registered attribute, never indexing a `ModuleList`/`ModuleDict`. Anything else is
        reported with the reason. A flag set from a variable is reported, not fixed; with
        `static_graph=True` DDP does not search the graph each iteration, so nothing is
        reported. The analysis does not check that the loss uses the model's output, nor
        parameters frozen or unfrozen during training.

        `static_graph=True` in place of the flag is `behavior` too, and needs the same proof
        except that registered attributes `forward` never reads are allowed (their
        parameters stay unused on every iteration: DDP's docstring, "the set of used and
        unused parameters will not change during the whole training loop; in this case, it
        does not matter whether users set `find_unused_parameters = True` or not"; torch
        warns when both are set). Indexing a container, several return values (a loss may
        use different ones per iteration: pytorch/pytorch#97030) and any branch in `forward`
        are declined. So is a script that assigns `requires_grad`, calls `requires_grad_()`
        or sets `require_backward_grad_sync` anywhere (a frozen or unfrozen parameter changes
        the set: torch 2.13 stops with "Expected to have finished reduction in the prior
        iteration"), or that calls `no_sync()`: with a static graph, gradient accumulation
        under `no_sync()` stops at the first backward with an `expect_autograd_hooks_`
        internal assert in torch 2.13 (pytorch/pytorch#143580, huggingface/accelerate#3679;
        checked here on CPU with gloo). A call that sets `static_graph` or passes `**`
        options, or a `target-torch` below 1.11 (the constructor keyword), is reported
        instead. Checked here with two gloo processes on CPU: five SGD steps of a model with
        an unused head end in bit-identical parameters with either setting, and the unused
        head's `.grad` stays None.

    Expected gain:
        One traversal of the autograd graph per iteration (proportional to the number of
        autograd nodes, not to tensor sizes): worth most for deep models with many small
        layers and small per-rank batches. No published figure. Measured here on the shared
        2-core CPU with one gloo process (`benchmarks/ddp_find_unused.py`, steps of both
        settings interleaved) for 48 blocks of Linear(64, 64) + LayerNorm + GELU (192
        parameter tensors), batch 16: median step 17.9 ms with the flag, 17.2 ms without
        (x1.04), with interquartile ranges that overlap: small next to the step on this CPU.
        Not measured on a GPU, where the step is shorter and the host-side traversal weighs
        more. With `static_graph=True` in place of the flag, for the same blocks plus a
        Linear(64, 2) head forward never uses (`--static-graph`): median step 17.0 ms with
        the flag, 16.0 ms with a static graph (x1.06), interquartile ranges overlapping
        again. The first iteration of a static graph all-reduces every bucket at the end of
        backward instead of overlapping it; later ones mark the unused parameters ready
        without a search.
    """

    code = "OPT603"
    name = "ddp-find-unused-parameters"
    message = (
        "`find_unused_parameters=True` makes DistributedDataParallel traverse the autograd "
        "graph every iteration"
    )
    fix_title = "Remove `find_unused_parameters=True` (every parameter of the model is used)"
    safety = Safety.BEHAVIOR
    min_torch = TorchVersion(1, 1)
    triggers = (r"find_unused_parameters\s*=",)
    examples = (
        Example(NET, NET_FIXED),
        Example(AUXILIARY, AUXILIARY_STATIC),
        Example(ACCUMULATING),
        Example(NET.replace("find_unused_parameters=True", "find_unused_parameters=False")),
        Example(
            NET.replace(
                "find_unused_parameters=True", "find_unused_parameters=True, static_graph=True"
            )
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        for site in facts.calls_to(*DDP_CLASSES):
            call = site.node
            arg = keyword(call, "find_unused_parameters")
            if arg is None:
                continue
            value = literal(arg.value, _NOT_A_LITERAL)
            if value is _NOT_A_LITERAL:
                self.report(
                    call,
                    message="`find_unused_parameters` is chosen at run time "
                    f"(`{code_of(arg.value)}`); where it is True, DDP traverses the autograd "
                    "graph every iteration: set it only for models that skip parameters",
                )
                continue
            if value is not True:
                continue
            static = keyword(call, "static_graph")
            if static is not None and literal(static.value, None) is True:
                self.decline(
                    call, "`static_graph=True`: DDP does not search the graph each iteration"
                )
                continue
            class_name, reason = self._model_class(call, site.site.function)
            if class_name is not None:
                reason = why_parameters_may_go_unused(facts, class_name)
            if reason is None:
                self.report(call, Fix((Replace(call, without_argument(call, arg)),)))
                continue
            if class_name is None:
                self.report(
                    call,
                    message=f"{self.message}; not removed because {reason}; where the model "
                    "uses the same parameters every iteration, `static_graph=True` in its "
                    "place finds the unused ones once",
                )
                continue
            static_reason = self._why_not_static(call, class_name)
            if static_reason is None:
                self.report(
                    call,
                    Fix((Replace(arg, arg.with_changes(keyword=cst.Name("static_graph"))),)),
                    message=f"{self.message}, although the same parameters are used every "
                    f"iteration ({reason})",
                    fix_title=STATIC_TITLE,
                )
                continue
            if static_reason == reason:
                message = f"not removed, nor replaced by `static_graph=True`, because {reason}"
            else:
                message = (
                    f"not removed because {reason}; nor replaced by `static_graph=True`, "
                    f"because {static_reason}"
                )
            self.report(call, message=f"{self.message}; {message}")

    def _why_not_static(self, call: cst.Call, class_name: str) -> "str | None":
        if keyword(call, "static_graph") is not None:
            return "the call chooses `static_graph` itself"
        if has_double_star(call):
            return "options arrive through `**` arguments, which may set `static_graph`"
        if STATIC_GRAPH_SINCE > self.context.target_torch:
            return f"the constructor takes `static_graph` from torch {STATIC_GRAPH_SINCE}"
        return why_used_parameters_may_change(
            self.facts, class_name
        ) or why_training_may_change_used_parameters(self.facts)

    def _model_class(
        self, call: cst.Call, function: "cst.CSTNode | None"
    ) -> "tuple[str | None, str | None]":
        """(the class of this file the wrapped model, read in `function`, is built from, or
        why there is none)."""
        args = positional(call)
        if not args:
            return None, "the wrapped model is not passed as the first argument"
        class_name = built_class(self.facts, args[0].value, function)
        if class_name is None:
            return None, (
                f"`{code_of(args[0].value)}` is not built here from one class of this file: "
                "the analysis cannot see its parameters"
            )
        return class_name, None

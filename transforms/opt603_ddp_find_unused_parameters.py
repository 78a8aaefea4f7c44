"""OPT603: `DistributedDataParallel(..., find_unused_parameters=True)`: a graph search per step."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.calls import code_of, keyword, literal, positional, without_argument
from optimizer_codemod.analysis.module_usage import built_class, why_parameters_may_go_unused
from optimizer_codemod.rule import Example, Fix, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

DDP_CLASSES = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
)
_NOT_A_LITERAL = object()

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


class DDPFindUnusedParameters(Rule):
    """
    What it does:
        Reports `DistributedDataParallel(model, ..., find_unused_parameters=True)`. Where the
        wrapped model is an instance of a class of this file whose `forward` uses, on every
        call, every submodule and parameter its `__init__` registers (and the same holds for
        the classes of this file those submodules are built from), removes the keyword.
        Elsewhere it reports, with the reason the analysis could not prove every parameter
        used (`--why-not` lists it).

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

    Expected gain:
        One traversal of the autograd graph per iteration (proportional to the number of
        autograd nodes, not to tensor sizes): worth most for deep models with many small
        layers and small per-rank batches. No published figure. Measured here on the shared
        2-core CPU with one gloo process (`benchmarks/ddp_find_unused.py`, steps of both
        settings interleaved) for 48 blocks of Linear(64, 64) + LayerNorm + GELU (192
        parameter tensors), batch 16: median step 17.9 ms with the flag, 17.2 ms without
        (x1.04), with interquartile ranges that overlap: small next to the step on this CPU.
        Not measured on a GPU, where the step is shorter and the host-side traversal weighs
        more.
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
        Example(AUXILIARY),
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
            reason = self._why_not(call)
            if reason is not None:
                self.report(
                    call,
                    message=f"{self.message}; not removed because {reason}",
                )
                continue
            self.report(call, Fix((Replace(call, without_argument(call, arg)),)))

    def _why_not(self, call: cst.Call) -> "str | None":
        args = positional(call)
        if not args:
            return "the wrapped model is not passed as the first argument"
        class_name = built_class(self.facts, args[0].value)
        if class_name is None:
            return (
                f"`{code_of(args[0].value)}` is not built here from one class of this file: "
                "the analysis cannot see its parameters"
            )
        return why_parameters_may_go_unused(self.facts, class_name)

"""OPT203: a tensor created in host memory and then copied to the device."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt, with_keyword
from optimizer_codemod.analysis.syncs import HOST_FILL
from optimizer_codemod.analysis.transfers import (
    HostCreation,
    host_creations_moved,
    legacy_type_conversions,
)
from optimizer_codemod.analysis.timing import timed_by
from optimizer_codemod.rule import Example, Fix, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

_SETUP = "import torch\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'\n"


class TensorCreatedOnHostThenMoved(Rule):
    """
    What it does:
        Creates tensors directly on their device: `torch.zeros(n).to(device)` becomes
        `torch.zeros(n, device=device)`, for `zeros`, `ones`, `empty`, `eye`, `full`,
        `arange`, their `_like` forms and `.cuda()`. Dtype conversions in between stay where
        they are (`torch.ones(n).long().to(device)` becomes
        `torch.ones(n, device=device).long()`), and a dtype given to `.to(device, dtype)`
        moves into `zeros`, `ones`, `empty` and `eye`. Random factories (`rand`, `randn`,
        `randint`, `randperm`, `normal` and the `_like` forms) are rewritten the same way at
        `behavior` level. With a legacy CUDA tensor type (`Tensor =
        torch.cuda.FloatTensor if cuda else torch.FloatTensor`), `Tensor(np.ones((n, *s)))`
        becomes `Tensor(n, *s).fill_(1.0)` (and `np.zeros`, `fill_(0.0)`). Only code that
        runs more than once is touched: a loop, or a function (a model's `forward`, a
        sampling step); not an `__init__`, nor a function the module runs once (a `main()`
        called under its `__main__` guard), outside their loops: setup gains nothing, and a
        random draw moved there would change a seeded run for nothing.

    Why is it slow:
        The tensor is first allocated and filled in host memory; `.to(device)` then
        allocates it again on the device and copies it over, a blocking copy from pageable
        memory during which the host waits. Created with `device=`, it is one allocation and
        one fill kernel on the device, and random numbers come from the device's generator
        instead of the CPU's, which for a large noise tensor is most of the cost. PyTorch's
        Performance Tuning Guide says the same ("Create tensors directly on the target
        device": `torch.rand(size, device='cuda')` rather than `torch.rand(size).cuda()`,
        https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html).

    Example:
        ```python
        def forward(self, x):
            h0 = torch.zeros(self.layers, x.size(0), self.hidden).to(x.device)
            noise = torch.randn(x.shape).to(x.device)
        ```
        becomes
        ```python
        def forward(self, x):
            h0 = torch.zeros(self.layers, x.size(0), self.hidden, device=x.device)
            noise = torch.randn(x.shape, device=x.device)
        ```

    Fix safety:
        `safe` for the deterministic factories and for `Tensor(np.ones(shape))`: the type
        makes the tensor on the device it would have copied it to, in its own dtype (numpy's
        float64 ones and zeros convert exactly), contiguous as before; the shape is
        rewritten only where the type cannot read it as data instead of sizes (a single
        element must be an int for sure: a literal, `x.size(0)`, `x.shape[0]`), and numpy's
        random draws stay (on the device they would be other numbers). The other
        deterministic factories: the same values, dtype, shape and strides
        (`_like` forms keep the source's layout both ways) arrive on the same device. A dtype
        moves into the call only where the values cannot depend on it (0, 1, uninitialised,
        an identity matrix): `torch.full(n, 0.1).to(device, torch.half)` rounds 0.1 twice
        where `torch.full(n, 0.1, dtype=torch.half)` rounds it once, so it is left alone, as
        is `arange` with a dtype. `torch.tensor(data).to(device)` is left alone:
        `torch.tensor(data, device=device)` builds the tensor on the host and copies it all
        the same (torch's `internal_new_from_data`, torch/csrc/utils/tensor_new.cpp), so the
        edit would save one call, and with a conversion in between
        (`torch.tensor(rows).float().to(device)`) it would copy the float64 data before
        converting it, twice the bytes. `numerics` for an `arange` whose arguments are not integer literals (and
        that has no integer `dtype=`): CUDA computes a floating-point `arange` in float32
        where the CPU uses float64, and a name may hold a float. `behavior` for the random
        factories: the device's generator draws other
        numbers than the CPU's, so a seeded run is not reproduced (applied with
        `--unsafe-fixes`). Never changed: a move whose result is thrown away (`_ =
        torch.zeros(shape).to(device)`, a warm-up of the copy kernels, as in diffusers'
        Neuron tests), `.to(x)` where `x` may be a tensor (it converts the
        dtype too), a target known to be the CPU, `*args`/`**kwargs` in `.to()`,
        `memory_format=`, factories that choose their device themselves (`device="cpu"` on
        purpose: torch's PowerSGD hook draws its random matrices on the CPU so that every
        replica draws the same ones), factories with `generator=` (a CPU generator cannot
        feed a CUDA factory), `requires_grad=` (the result would become a leaf),
        `pin_memory=`, `out=` or `layout=`, `torch.normal` of tensors, random draws inside
        `torch.random.fork_rng()` or beside a `torch.manual_seed(...)` in the same loop or
        function body (the numbers are meant to be the seeded CPU generator's), and
        statements that run once at module level, and a `_like` factory whose source is
        already on the target (`torch.zeros_like(x).to(x.device)`, or `x` bound in the same
        scope by `.to(device)` or `device=device`): it is made there, and the edit would
        change nothing. Nor a move whose time the script measures (a clock read in a loop
        around it, or a `with` around it whose context manager is a function of the file
        that reads one: peft's dora-caching.py times forwards with `with timeit(logs):`):
        the blocking copy waits for the work queued before it, and without it the timer
        counts only launches. `.to(device, non_blocking=True)` loses the keyword, which has
        no copy left to apply to.

    Expected gain:
        On a CUDA device, one host allocation and fill and one blocking host-to-device copy
        per call: for small tensors the latency of a copy, for large ones (noise for a
        diffusion batch) the PCIe transfer and the CPU's random number generation. Not
        measurable on a CPU, where `.to("cpu")` returns the tensor itself and both forms do
        the same work: `benchmarks/rule_gains/opt203.py` (a 64x3x32x32 `randn` and a
        2x64x256 `zeros` per call, one thread; 2-core x86_64, torch 2.13.0+cpu, 2026-11-24)
        measured x0.98 to x0.99 in three runs (0.67 to 0.80 ms either way), no difference
        beyond noise. The rule runs for CUDA targets only (`target-device`); the GPU gain
        was not measured here.
    """

    code = "OPT203"
    name = "tensor-created-on-host-then-moved"
    message = "Tensor created on the host and then copied to the device"
    fix_title = "Create it on the device: pass `device=` to the factory"
    safety = Safety.SAFE
    min_torch = TorchVersion(1, 0)
    # On a CPU target the copy it saves is no copy: `.to("cpu")` returns the tensor itself.
    target_devices = ("cuda",)
    removes_syncs = {HOST_FILL: Safety.SAFE}
    # Every finding is a factory call followed, in the same expression, by `.to(` or `.cuda(`.
    triggers = (r"\b(?:zeros|ones|empty|eye|full|arange|rand\w*|randperm|normal|tensor)\s*\(",)
    requires = (r"\.\s*(?:to|cuda)\s*\(|\bcuda\.\w*Tensor\b",)
    examples = (
        Example(
            _SETUP + "def init_hidden(batch):\n"
            "    return torch.zeros(2, batch, 64).to(device)\n",
            _SETUP + "def init_hidden(batch):\n"
            "    return torch.zeros(2, batch, 64, device=device)\n",
        ),
        Example(
            _SETUP + "for x, y in loader:\n"
            "    noise = torch.randn(x.shape).to(device)\n"
            "    loss = model(x.to(device) + noise, y.to(device))\n"
            "    loss.backward()\n",
            _SETUP + "for x, y in loader:\n"
            "    noise = torch.randn(x.shape, device=device)\n"
            "    loss = model(x.to(device) + noise, y.to(device))\n"
            "    loss.backward()\n",
        ),
        Example(
            "import numpy as np\nimport torch\n"
            "Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else torch.FloatTensor\n"
            "for x, y in loader:\n"
            "    valid = Tensor(np.ones((x.size(0), 1)))\n"
            "    loss = criterion(model(x.type(Tensor)), valid)\n"
            "    loss.backward()\n",
            "import numpy as np\nimport torch\n"
            "Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else torch.FloatTensor\n"
            "for x, y in loader:\n"
            "    valid = Tensor(x.size(0), 1).fill_(1.0)\n"
            "    loss = criterion(model(x.type(Tensor)), valid)\n"
            "    loss.backward()\n",
        ),
        Example(
            _SETUP + "def scale(x):\n"
            "    return torch.full((4,), 0.1).to(device, torch.float16) * x\n"
        ),
        Example(_SETUP + "def cast(x, y):\n    return torch.zeros(4).to(y)\n"),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        for conversion in legacy_type_conversions(self.facts):
            call = conversion.call.node
            if isinstance(conversion.sizes, str):
                self.decline(call, conversion.sizes)
                continue
            value = f"{conversion.fill}.0" if conversion.floating else str(conversion.fill)
            made = cst.Call(call.func, args=conversion.sizes)
            fixed = cst.Call(
                cst.Attribute(made, cst.Name("fill_")), args=[cst.Arg(cst.parse_expression(value))]
            ).with_changes(lpar=call.lpar, rpar=call.rpar)
            self.report(
                call,
                Fix((Replace(call, fixed),)),
                message=f"`{excerpt(conversion.array)}` is filled on the host, then converted and "
                "copied to the device by the tensor type",
                fix_title="Make it on the device: `Tensor(*shape).fill_(value)`",
            )
        for creation in host_creations_moved(self.facts):
            if _result_discarded(self.facts, creation.move.node):
                self.decline(
                    creation.move.node,
                    "the tensor is thrown away (`_ = ...` or a bare expression): the statement is "
                    "there for its host-to-device copy (a warm-up of the copy kernels), which "
                    "creating the tensor on the device would drop",
                )
                continue
            timed = timed_by(self.facts, creation.move.node)
            if timed is not None:
                self.decline(
                    creation.move.node,
                    f"its time is measured ({timed}), and the blocking copy is what waits "
                    "for the work queued before it: made on the device, the timer would "
                    "count only the launches of that work",
                )
                continue
            random = creation.kind == "random"
            message = f"`{excerpt(creation.factory)}` is created on the host, then copied"
            if creation.qualname.endswith("_like"):
                message = (
                    f"`{excerpt(creation.factory)}` is created on its source's device, then "
                    "copied: where that is the host, this is a copy per call"
                )
            if random:
                message += (
                    "; created on the device, its numbers come from the device's generator, "
                    "so a seeded run draws others"
                )
            self.report(
                creation.move.node,
                Fix((Replace(creation.move.node, _created_on_device(creation)),)),
                message=message,
                safety=(
                    Safety.BEHAVIOR if random else (None if creation.bit_exact else Safety.NUMERICS)
                ),
            )


def _result_discarded(facts, move: cst.Call) -> bool:
    """The move is the whole of a statement whose value nobody keeps: `x.to(device)` on its
    own line, or bound to `_`."""
    statement = facts.parents.get(move)
    if isinstance(statement, cst.Expr):
        return True
    if isinstance(statement, cst.Assign) and statement.value is move:
        return all(
            isinstance(target.target, cst.Name) and target.target.value == "_"
            for target in statement.targets
        )
    return False


def _created_on_device(creation: HostCreation) -> cst.BaseExpression:
    """The move's receiver, with `device=` (and the moved dtype) in the factory call."""
    factory = creation.factory
    made = with_keyword(factory, "device", creation.device)
    if creation.dtype is not None:
        made = with_keyword(made, "dtype", creation.dtype)
    move = creation.move.node
    receiver = move.func.value
    result = made if receiver is factory else receiver.deep_replace(factory, made)
    return result.with_changes(lpar=[*move.lpar, *result.lpar], rpar=[*result.rpar, *move.rpar])

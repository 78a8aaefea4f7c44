"""OPT605: DistributedDataParallel copies every gradient into its buckets and back each step."""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from optimizer_codemod.analysis.calls import (
    excerpt,
    has_double_star,
    keyword,
    literal,
    with_keyword,
)
from optimizer_codemod.analysis.gradients import bucket_view_hazards
from optimizer_codemod.analysis.precision import (
    apex_amp_call,
    imported_decider,
    loops_elsewhere,
)
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.analysis.training import DDP_CLASSES
from optimizer_codemod.rule import Example, Fix, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

KEYWORD = "gradient_as_bucket_view"

SCRIPT = """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(Net().to(device), device_ids=[rank])
optimizer = torch.optim.AdamW(model.parameters())
for x, y in loader:
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
"""
FIXED_OPTIONS = "device_ids=[rank], gradient_as_bucket_view=True)"
FIXED = SCRIPT.replace("device_ids=[rank])", FIXED_OPTIONS)
READS_GRAD = SCRIPT.replace(
    "    optimizer.step()\n",
    "    optimizer.step()\n    norms = [p.grad.norm() for p in model.parameters()]\n",
)
DETACHES_GRAD = SCRIPT.replace(
    "    optimizer.step()\n",
    "    optimizer.step()\n    for p in model.parameters():\n        p.grad.detach_()\n",
)


class DDPGradientsCopiedToBuckets(Rule):
    """
    What it does:
        Adds `gradient_as_bucket_view=True` to a `DistributedDataParallel(...)` construction
        that does not choose it, in a script that trains and uses no `.grad` in a way a view
        into a bucket breaks: `p.grad.detach_()` (raises on a view), a gradient kept past its
        statement (bound to a name that outlives it, put in a container, returned), handed
        to a function other than torch's, set to a tensor, or read with `getattr`. Reads that
        compute from a gradient (`p.grad.norm()`, `torch.isfinite(p.grad)`, `p.grad is
        None`, a local name only computed from later in its block, as in a hand-written
        optimizer's step, also when it is bound again to its own value, `grad = grad.float()`,
        or passed only for its dtype and device, `state.to(grad)`: Hugging Face's AdamW and
        Adafactor),
        updates in place (`p.grad.data.mul_(c)`, `p.grad += noise`, `p.grad.zero_()`) and
        `p.grad = None` are sound. Where the script does one of the others, it reports,
        naming the first such line.

    Why is it slow:
        By default DDP keeps each gradient and a copy of it in a flat all-reduce bucket:
        during backward every gradient is copied into its bucket, the bucket is all-reduced,
        and the averaged values are copied back into the gradient. With
        `gradient_as_bucket_view=True` the gradients are views into the buckets, so both
        copies disappear and the memory of one full set of gradients is saved. PyTorch's
        documentation of `DistributedDataParallel` (torch 2.13.0 docstring): "This can reduce
        peak memory usage, where the saved memory size will be equal to the total gradients
        size. Moreover, it avoids the overhead of copying between gradients and allreduce
        communication buckets."
        (https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html)

    Example:
        ```python
        model = DDP(Net().to(device), device_ids=[rank])
        ```
        becomes
        ```python
        model = DDP(Net().to(device), device_ids=[rank], gradient_as_bucket_view=True)
        ```

    Fix safety:
        `behavior`: the gradient values and the update are the same, but each `.grad` is a
        view into a bucket DDP overwrites at the next backward: code that keeps a gradient
        across iterations sees it change, and `p.grad.detach_()` raises ("When gradients are
        views, `detach_()` cannot be called on the gradients", same docstring; `zero_grad()`
        avoids it). Applied only where the script uses no `.grad` in one of those ways
        (reads, updates in place and resets to None are sound: DDP reads and writes the same
        memory, and points a gradient reset to None at its bucket again;
        tests/test_bucket_view_claims.py runs each on DDP with gloo; a file rewritten
        alone reads the local modules it imports for this, analysis/project_context.py;
        `torch.autograd.grad`, which
        returns gradients, touches none: StyleGAN2's R1 penalty trains to the same parameters
        with and without the option, two gloo processes on CPU), with `--unsafe-fixes`. When
        a folder is rewritten, no module of the run it imports, directly or not, may use
        `.grad` so either (guided-diffusion's train_util.py wraps its model in DDP and its
        fp16_util.py calls `param.grad.detach_()`, which raises on a bucket view); else it
        is reported, naming the module. A script that wraps the model and
        hands it to the training loop of another module of the run (`train_one_epoch(model,
        ...)` from engine.py; docs/projects.md) gets the option when neither it nor any
        module of the run it imports, directly or not, uses `.grad` so; else it is reported,
        naming the module. Declined in a script that trains with NVIDIA Apex's amp
        (`amp.initialize`, `amp.scale_loss`): before every backward it stashes each `.grad`
        and sets it to None, so DDP copies into the bucket anyway, and with master weights
        (opt_level O2) its `zero_grad` calls `detach_()` on each gradient, which raises on a
        bucket view (apex/amp/_process_optimizer.py; SwAV). Not applied when the call already
        sets the option (to anything), or passes `**kwargs` that may; needs `target-torch`
        1.7, where the option appeared.

    Expected gain:
        Up to two copies of every gradient per iteration, and a gradient-sized block of
        memory. Where gradients are reset to None every step (`zero_grad()`'s default since
        torch 2.0), torch 2.13's docstring (of its `batched_grad_copy` option) notes that
        "`gradient_as_bucket_view` alone cannot avoid copies because the bucket view alias is
        destroyed every iteration": the copy into the bucket stays, the copy back and the
        second buffer go.
        Measured here on the shared 2-core CPU with one gloo process
        (`benchmarks/ddp_bucket_view.py`, steps of both settings interleaved; the copies happen
        at any world size) for an 8.4M-parameter MLP, batch 32, `zero_grad()` to None: median
        step 95.5 ms without, 85.3 ms with (x1.12; an earlier run of the same method gave
        x1.01), with interquartile ranges that overlap: no gain distinguishable from noise on
        this CPU, as the docstring above leads one to expect when gradients are reset to
        None. The memory saving was not measured. Not measured on a GPU or with several
        processes here.
    """

    code = "OPT605"
    name = "ddp-gradients-copied-to-buckets"
    message = (
        "DistributedDataParallel copies every gradient into its all-reduce buckets and back "
        "each iteration"
    )
    fix_title = "Add `gradient_as_bucket_view=True` (gradients become views into the buckets)"
    safety = Safety.BEHAVIOR
    min_torch = TorchVersion(1, 7)
    triggers = (r"DistributedDataParallel|\bDDP\b",)
    requires = (BACKWARD_CALL,)
    examines_entry_points = True
    examples = (
        Example(SCRIPT, FIXED),
        Example(READS_GRAD, READS_GRAD.replace("device_ids=[rank])", FIXED_OPTIONS)),
        Example(DETACHES_GRAD),
        Example(SCRIPT.replace("device_ids=[rank])", "device_ids=[rank], **options)")),
        Example(SCRIPT.replace("device_ids=[rank])", "gradient_as_bucket_view=False)")),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        # A script that wraps the model and hands it to the loop of another module of the
        # run (`train_one_epoch(model, ...)` from engine.py): the `.grad` check covers the
        # modules it imports too (analysis/project.py).
        elsewhere = loops_elsewhere(facts)
        if not (facts.trains or elsewhere is not None):
            return
        touched: Optional[List[cst.CSTNode]] = None
        for site in facts.calls_to(*DDP_CLASSES):
            call = site.node
            chosen = keyword(call, KEYWORD)
            if chosen is not None:
                if literal(chosen.value, None) is False:
                    self.decline(call, f"`{KEYWORD}=False` is chosen explicitly")
                continue
            if has_double_star(call):
                self.decline(call, "options arrive through `**` arguments, which may set it")
                continue
            apex = apex_amp_call(facts)
            if apex is not None:
                self.decline(
                    call,
                    f"the script trains with NVIDIA Apex's amp (`{excerpt(apex)}`), which sets "
                    "each `.grad` to None before every backward, so DDP copies into its buckets "
                    "anyway, and whose `zero_grad` with master weights (opt_level O2) calls "
                    "`detach_()` on each gradient, which raises on a view into a bucket; "
                    "`torch.amp` has neither problem",
                )
                continue
            if touched is None:
                touched = bucket_view_hazards(facts)
            toucher = imported_decider(facts, "breaks_bucket_views")
            if not touched and toucher:
                self.report(
                    call,
                    message=f"{self.message}; `{KEYWORD}=True` would remove the copies, but "
                    f"{toucher}, uses `.grad` in a way a view into a bucket breaks (calls "
                    "`detach_()` on it, keeps it past its statement or hands it to a function "
                    "of its own)",
                )
                continue
            if touched:
                self.report(
                    call,
                    message=f"{self.message}; `{KEYWORD}=True` would remove the copies, but "
                    f"`{excerpt(touched[0])}` uses `.grad` in a way a view into a bucket DDP "
                    "overwrites breaks (`detach_()` raises on it; a gradient kept past its "
                    "statement changes at the next backward)",
                )
                continue
            self.report(call, Fix((Replace(call, with_keyword(call, KEYWORD, cst.Name("True"))),)))

"""OPT604: training wrapped in `nn.DataParallel`, which PyTorch recommends replacing with DDP."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.analysis.training import DATA_PARALLEL, DDP_CLASSES
from optimizer_codemod.rule import Example, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

SCRIPT = """\
import torch
import torch.nn as nn

model = nn.DataParallel(Net().cuda())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = loss_fn(model(x.cuda()), y.cuda())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


class DataParallelInsteadOfDDP(Rule):
    """
    What it does:
        Reports `torch.nn.DataParallel(...)` (also `torch.nn.parallel.DataParallel`, and under
        any import alias) in a script that trains (calls `backward`). It reports, never
        rewrites: moving to DistributedDataParallel changes how the script is launched. In a
        script that also builds DistributedDataParallel (Hugging Face's examples: DataParallel
        when several GPUs are visible to one process, DDP under a distributed launch) the
        report says to launch that path with torchrun instead.

    Why is it slow:
        DataParallel is one process driving every GPU from Python threads: each forward
        copies the module's parameters and buffers to every device, scatters the batch from
        the first device, gathers the outputs back on it, and reduces the gradients there,
        all under the global interpreter lock. The first device holds more memory and work
        than the others, and the threads contend for the interpreter. DistributedDataParallel
        runs one process per GPU, broadcasts parameters once, and all-reduces gradient
        buckets during backward, overlapping communication with computation. PyTorch's
        documentation of `torch.nn.DataParallel` (torch 2.13.0 docstring, in a warning):
        "It is recommended to use DistributedDataParallel, instead of this class, to do
        multi-GPU training, even if there is only a single node"
        (https://pytorch.org/docs/stable/generated/torch.nn.DataParallel.html, and the
        CUDA semantics note "Use nn.parallel.DistributedDataParallel instead of
        multiprocessing or nn.DataParallel").

    Example:
        ```python
        model = nn.DataParallel(Net().cuda())
        ```
        is reported. The move to DDP is a launch change, not a one-line edit:
        1. launch with `torchrun --nproc-per-node NUM_GPUS train.py` (one process per GPU);
        2. in each process, `torch.distributed.init_process_group("nccl")`, then
           `local_rank = int(os.environ["LOCAL_RANK"])`, `torch.cuda.set_device(local_rank)`;
        3. `model = DistributedDataParallel(Net().to(local_rank), device_ids=[local_rank])`;
        4. give the DataLoader a `DistributedSampler(dataset)` (and call
           `sampler.set_epoch(epoch)` each epoch) so each process reads its own shard; the
           batch size becomes per process;
        5. log, evaluate and save checkpoints on rank 0 only, and call
           `destroy_process_group()` at the end. Checkpoints saved from `model.module` keep
           the same keys as with DataParallel.

    Fix safety:
        `suggest`: no sound rewrite exists. The script must be launched differently
        (torchrun), data must be sharded per process, the effective batch size and the
        random streams change, and every print, metric and save runs once per process unless
        guarded by rank. A script that uses DataParallel outside training (inference only,
        no `backward`) is not reported.

    Expected gain:
        PyTorch's tutorial "Getting Started with Distributed Data Parallel" explains that
        DataParallel "is usually slower than DistributedDataParallel even on a single
        machine due to GIL contention across threads, per-iteration replicated model, and
        additional overhead introduced by scattering inputs and gathering outputs"
        (https://pytorch.org/tutorials/intermediate/ddp_tutorial.html). The gain grows with
        the number of GPUs and was not measured here (no multi-GPU machine).
    """

    code = "OPT604"
    name = "data-parallel-instead-of-ddp"
    message = (
        "`nn.DataParallel` drives every GPU from one process; PyTorch recommends "
        "DistributedDataParallel for multi-GPU training"
    )
    fix_title = (
        "Move to DistributedDataParallel: launch with torchrun, `init_process_group`, "
        "a `DistributedSampler`, one process per GPU"
    )
    safety = Safety.SUGGEST
    min_torch = TorchVersion(1, 0)
    triggers = (r"DataParallel",)
    requires = (BACKWARD_CALL,)
    examples = (
        Example(SCRIPT),
        Example(SCRIPT.replace("nn.DataParallel(Net().cuda())", "Net().cuda()")),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        if not self.facts.trains:
            return
        ddp = next(iter(self.facts.calls_to(*DDP_CLASSES)), None)
        for call in self.facts.calls_to(*DATA_PARALLEL):
            if ddp is None:
                self.report(call.node)
                continue
            self.report(
                call.node,
                message=f"{self.message}; this script has a DistributedDataParallel path "
                f"already (`{excerpt(ddp.node)}`): launch it with torchrun, one process per "
                "GPU, rather than this branch",
                fix_title="Launch with torchrun (the script's own DDP path)",
            )

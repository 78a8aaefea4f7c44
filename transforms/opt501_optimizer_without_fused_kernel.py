"""OPT501: an optimizer that has a fused kernel, built without it."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.calls import (
    argument,
    excerpt,
    has_double_star,
    has_star_args,
    keyword,
    literal,
    with_keyword,
)
from optimizer_codemod.analysis.devices import (
    comment_naming_tpus,
    declares_xla_runs,
    dtensor_parameters,
    may_run_on_the_cpu,
    reads_skipped_steps,
    sharded_grad_scaler,
    xla_device_source,
)
from optimizer_codemod.analysis.checkpoints import restores_optimizer_state
from optimizer_codemod.analysis.gradients import sparse_gradients, stored_gradients
from optimizer_codemod.analysis.precision import (
    fp16_chosen_at_launch,
    fp16_loss_scaling,
    sixteen_bit_conversion,
)
from optimizer_codemod.analysis.training import lightning_module_optimizer, one_training_step
from optimizer_codemod.rule import Example, Fix, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

# The first release where `fused=True` works on both CPU and CUDA parameters: emitted code
# must run wherever the script picks its device at run time.
FUSED_ON_CPU_AND_CUDA = {
    "torch.optim.Adam": TorchVersion(2, 4),
    "torch.optim.AdamW": TorchVersion(2, 4),
    "torch.optim.SGD": TorchVersion(2, 4),
    # CPU since 2.4, CUDA only much later (pytorch/pytorch#153038); 2.13 documents both.
    "torch.optim.Adagrad": TorchVersion(2, 13),
}
# Options that cannot be combined with fused=True unless explicitly False.
EXCLUSIVE_OPTIONS = ("foreach", "differentiable")
# `foreach=False` is allowed beside `fused=True`, but it is the author choosing the for-loop
# implementation (DomainBed's Adam, reading round 7): a choice the rule keeps.
CHOSEN_IMPLEMENTATION = "foreach"


class OptimizerWithoutFusedKernel(Rule):
    """
    What it does:
        Adds `fused=True` to `torch.optim.Adam`, `AdamW`, `SGD` and `Adagrad` when they are
        built without choosing an implementation.

    Why is it slow:
        Without `fused`, these optimizers use the `foreach` implementation: a sequence of
        multi-tensor kernels, one per arithmetic step of the update, each reading and writing
        every parameter and state tensor. The fused implementation does the whole update in
        one pass over memory. PyTorch's documentation ranks the implementations "fused >
        foreach > for-loop" for speed (torch.optim, "Algorithms").

    Example:
        ```python
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        ```
        becomes
        ```python
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
        ```

    Fix safety:
        `numerics`: the fused kernel performs the same update in a different order of
        floating-point operations, so parameters differ in the last bits. Over float16
        parameters the difference can be larger: the fused Adam and AdamW kernels do their
        arithmetic in float32, while the foreach ones do it in float16, where `eps=1e-8`
        rounds to 0, so a gradient of 1e-5 makes foreach Adam's parameters infinite and
        fused Adam's stay finite (torch 2.13, tests/test_fused_optimizer_claims.py): the
        fixed script may keep training where the original diverged. Never applied to
        optimizers without a fused kernel (Adadelta, RMSprop, LBFGS, custom classes), when
        options arrive through `*args`/`**kwargs` (they may already carry `fused`), when
        `foreach` is given (`foreach=False` too: torch accepts it beside `fused=True`, but it
        is the author choosing the for-loop implementation, as DomainBed's Adam does) or
        `differentiable` is set, when the file takes one training step (a module's usage
        demo: one step saves nothing), or when the script, or a module of the run it imports, builds
        a layer with `sparse=` not literally False (transformer-xl's `nn.Embedding(...,
        sparse=sample_softmax>0)`: fused SGD raises on sparse gradients), or sets a `.grad` to
        a tensor of its own (continual-learning's OWM stores slices of one projected matrix:
        the fused kernels assume each gradient has its parameter's strides, and torch 2.13's
        fused Adam and SGD for the CPU then apply wrong updates without an error). Needs
        `target-torch` 2.4 (2.13 for Adagrad), the first release with CPU and CUDA kernels.
        An optimizer built in the fallback branch of a feature check (nanoGPT's `else` of
        `if "fused" in inspect.signature(...).parameters`, a `use_fused` flag, an old-torch
        version branch, an `except TypeError` retry) keeps its options (analysis/guards.py).
        Fused kernels exist for CPU, CUDA, MPS, XPU, HPU and MTIA parameters (torch 2.13
        `torch.utils._foreach_utils._get_fused_kernels_supported_devices`), not for XLA: on a TPU
        `step()` raises. A script that uses `torch_xla` itself is left alone, and so is one
        written to run on TPUs too (a branch on `DistributedType.XLA`, `is_torch_xla_available`,
        an `_mp_fn` for `xla_spawn`, pytorch-ignite's `backend="xla-tpu"`, or in an
        Accelerate script a comment naming TPUs:
        Accelerate's examples and test scripts); in one whose
        device an Accelerate `Accelerator` picks at launch (`accelerate config` may choose a
        TPU with no change to the file, and Accelerate's own examples say they run there)
        the fix is `behavior`, applied with `--unsafe-fixes` only: the tool cannot see where
        the script will be launched, and most Accelerate users train on GPUs, where the fix
        is as sound as elsewhere. Under fp16 loss scaling a fused optimizer's `step()` is
        always called (its kernel skips the update on an overflow), so Accelerate, which
        tells a skipped step by `step()` not being called, steps its wrapped scheduler on
        those steps too; a script that reads `step_was_skipped` or
        `optimizer_step_was_skipped` is left alone. So is one whose fp16 losses FSDP's
        `ShardedGradScaler` may scale (itself, Accelerate's FSDP plugin, or a script that
        reads `accelerator.state.fsdp_plugin`, `is_fsdp2` or `DistributedType.FSDP`, even
        through `getattr(state, "fsdp_plugin", None)`): it all-reduces
        the overflow flag across ranks in `unscale_`, which `GradScaler.step` skips for a
        fused optimizer. Fused SGD and Adagrad have no DTensor sharding strategy (torch 2.13:
        `step()` raises NotImplementedError), so they are left alone where the parameters may
        be DTensors (FSDP2's `fully_shard`, tensor parallelism, a device mesh, torchft,
        Accelerate's `ParallelismConfig` or `fsdp_version=2`); fused Adam and AdamW step
        them. SGD is left alone where parameters may be float16 or bfloat16 (a module, or
        the one whose `.parameters()` it takes, cast by `.half()`, `.bfloat16()` or `.to()`
        a 16-bit dtype; a model built in one, `from_pretrained(torch_dtype=torch.float16)`;
        a 16-bit default dtype) and the script may run on the CPU (anything but a script that places on CUDA
        alone, with `.cuda()` and no `is_available()` fallback): torch 2.13's fused SGD
        kernel for the CPU updates only the last few elements of each 16-bit tensor, so a
        run on the CPU would silently stop training (fused Adam, AdamW and Adagrad update
        them all; airbench's fp16 SGD on CUDA is fused by its author). A script that may
        resume, loading saved optimizer state (`optimizer.load_state_dict`, a helper named for
        loading, resuming or restoring that is handed the optimizer, Accelerate's
        `load_state`), under fp16 loss scaling (a GradScaler, Accelerate's
        `mixed_precision="fp16"`, or an `Accelerator` whose mixed precision the file leaves
        to the launch or the command line, as peft's examples do) is left alone: a state
        saved before the fix loads
        `fused=None` back, and GradScaler's next step raises (vits resumes from its latest
        checkpoint). Without loss scaling such a resume only turns the fused kernel off again.
        An optimizer a LightningModule's `configure_optimizers` builds is left alone: under
        mixed precision with `gradient_clip_val`, both set on the Trainer, Lightning raises for
        a fused optimizer (minGPT's own `configure_optimizers` on a plain nn.Module does not
        count). A ShardedGradScaler that a module of the run the script imports names
        (dinov2's `SSLMetaArch`, llama-recipes' train_utils.py) counts as the script's own; a
        library module that only reads Accelerate's FSDP state in a helper does not. tests/test_fused_optimizer_claims.py runs each
        of these on the installed torch.

    Expected gain:
        Optimizer-step time, which grows with parameter count; the effect on a whole training
        step is largest for small batches and large models.
    """

    code = "OPT501"
    name = "optimizer-without-fused-kernel"
    message = "Optimizer built without its fused kernel"
    fix_title = "Add `fused=True`"
    safety = Safety.NUMERICS
    min_torch = TorchVersion(2, 4)
    # A construction is a call of the class, or of the alias an import gives it.
    triggers = (r"\b(?:Adam|AdamW|SGD|Adagrad)\s*(?:\(|as\b)",)
    examples = (
        Example(
            "import torch\nopt = torch.optim.AdamW(model.parameters(), lr=3e-4)\n",
            "import torch\nopt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)\n",
        ),
        Example("import torch\nopt = torch.optim.RMSprop(model.parameters())\n"),
        Example("import torch\nopt = torch.optim.Adam(model.parameters(), **config)\n"),
        Example("import torch\nopt = torch.optim.Adam(model.parameters(), foreach=True)\n"),
        Example(
            "import torch\nimport torch_xla.core.xla_model as xm\n"
            "opt = torch.optim.AdamW(model.parameters())\n"
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        for site in self.facts.optimizer_constructions():
            since = FUSED_ON_CPU_AND_CUDA.get(site.qualname or "")
            if since is None:
                continue
            call = site.node
            if since > self.context.target_torch:
                self.decline(
                    call,
                    f"its fused kernel needs torch {since}, newer than target-torch "
                    f"{self.context.target_torch}",
                )
                continue
            label = site.qualname.rsplit(".", 1)[-1]
            if keyword(call, "fused") is not None:
                continue
            exclusive = [
                option
                for option in EXCLUSIVE_OPTIONS
                if keyword(call, option) is not None
                and literal(keyword(call, option).value, None) is not False
            ]
            if exclusive:
                self.decline(call, f"`{exclusive[0]}` is set, and torch refuses it with `fused`")
                continue
            if keyword(call, CHOSEN_IMPLEMENTATION) is not None:
                self.decline(
                    call,
                    "`foreach=False` chooses the for-loop implementation: the author picked "
                    "one, and `fused=True` would override it",
                )
                continue
            if has_double_star(call) or has_star_args(call):
                self.report(
                    call,
                    message=f"{label} options arrive through */** arguments, which may already "
                    "set `fused`; add `fused=True` where they are built",
                )
                continue
            sparse = sparse_gradients(self.facts)
            if sparse is not None:
                self.decline(
                    call, f"{sparse} may make sparse gradients, which fused kernels do not take"
                )
                continue
            stored = stored_gradients(self.facts)
            if stored is not None:
                self.decline(
                    call,
                    f"{stored} sets a `.grad` to a tensor of its own, which may not have its "
                    "parameter's strides (a slice of a larger matrix): the fused kernels "
                    "assume they match, and on the CPU torch 2.13's fused step then applies "
                    "wrong updates silently",
                )
                continue
            reason = _why_fused_would_fail(self.facts, label, site)
            if reason is not None:
                self.decline(call, reason)
                continue
            once = one_training_step(self.facts)
            if once is not None:
                self.decline(
                    call,
                    f"{once}: the fused kernel saves launches on every step, and one step "
                    "gains nothing measurable for the numerics it changes",
                )
                continue
            fixed = with_keyword(call, "fused", cst.Name("True"))
            if xla_device_source(self.facts) == "accelerate":
                self.report(
                    call,
                    Fix((Replace(call, fixed),)),
                    message=f"{label} built without its fused kernel; Accelerate picks the "
                    "device at launch, and on a TPU (XLA) a fused optimizer's `step()` raises: "
                    "add it only where the script never runs on one (under fp16 loss scaling "
                    "Accelerate's scheduler then also steps on the steps the scaler skips)",
                    safety=Safety.BEHAVIOR,
                )
                continue
            self.report(
                call,
                Fix((Replace(call, fixed),)),
                message=f"{label} built without its fused kernel",
            )


def _why_fused_would_fail(facts, label: str, site) -> "str | None":
    """Where the parameters or the loss scaler make a fused step raise or change what the
    script sees: XLA devices, DTensor parameters (SGD and Adagrad), FSDP's sharded loss
    scaler, Lightning's clipping under mixed precision, an unfused state resumed under a
    GradScaler, and Accelerate's skipped-step flag."""
    call = site.node
    if xla_device_source(facts) == "torch_xla":
        return (
            "the script uses torch_xla: fused optimizers have no XLA kernel, and `step()` "
            "raises on an XLA device"
        )
    declared = declares_xla_runs(facts)
    if declared is None and xla_device_source(facts) == "accelerate":
        declared = comment_naming_tpus(facts)
    if declared is not None:
        return (
            f"the script is written to run on TPUs too (`{declared}`): fused optimizers have "
            "no XLA kernel, and `step()` raises on an XLA device"
        )
    sharded = dtensor_parameters(facts)
    if sharded is not None and label in ("SGD", "Adagrad"):
        return (
            f"the parameters may be DTensors (`{sharded}`: FSDP2, tensor parallelism), and "
            f"torch has no sharding strategy for the fused {label} kernel: `step()` raises "
            "NotImplementedError (torch 2.13; the fused Adam and AdamW kernels have one)"
        )
    params = argument(call, "params", 0)
    converted = (
        sixteen_bit_conversion(facts, params.value if params is not None else None)
        if label == "SGD"
        else None
    )
    if converted is not None and may_run_on_the_cpu(facts):
        return (
            f"the parameters may be 16-bit (`{excerpt(converted)}`), and torch 2.13's fused "
            "SGD kernel for the CPU updates only the last few elements of each float16 or "
            "bfloat16 tensor (a bfloat16 Linear's 4,096 weights stay as they were): where the "
            "script runs on the CPU, training would silently stop"
        )
    scaler = sharded_grad_scaler(facts)
    if scaler is not None:
        return (
            f"the script may scale fp16 losses with FSDP's ShardedGradScaler (`{scaler}`), "
            "which all-reduces the overflow flag across ranks in `unscale_`; for a fused "
            "optimizer `GradScaler.step` checks each rank's gradients alone, so ranks could "
            "disagree on skipping a step and on the loss scale, and after `unscale_` (to clip "
            "gradients) the fused step raises (torch 2.13)"
        )
    if lightning_module_optimizer(facts, site):
        return (
            "a LightningModule's optimizer: under mixed precision Lightning refuses gradient "
            "clipping with a fused optimizer (`MixedPrecision.clip_gradients` raises), and "
            "the Trainer's `precision` and `gradient_clip_val` are set where this file does "
            "not show them (a config, the command line); add `fused=True` by hand where "
            "they allow it"
        )
    scaling = fp16_loss_scaling(facts)
    launched = fp16_chosen_at_launch(facts) if scaling is None else None
    restored = restores_optimizer_state(facts, call) if scaling or launched else None
    if restored is not None:
        how = (
            f"(`{excerpt(scaling)}`)"
            if scaling is not None
            else f"(`{excerpt(launched)}` does not fix `mixed_precision`: a flag or the launch "
            "may choose fp16)"
        )
        return (
            f"the script may resume (`{excerpt(restored)}`): a state saved before this change "
            "loads `fused=None` back into the optimizer, and under fp16 loss scaling "
            f"{how} its first step then raises (torch 2.13: AssertionError "
            "in the unfused step); add `fused=True` by hand once no such checkpoint is "
            "resumed"
        )
    skipped = reads_skipped_steps(facts)
    if skipped is not None:
        return (
            f"the script reads `{skipped.attr.value}`: Accelerate tells a skipped step by "
            "`GradScaler.step` not calling `step()`, but with a fused optimizer it always "
            "calls it and the kernel skips the update, so the flag would stay False"
        )
    return None

"""OPT302: a model trained in float32 without autocast."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import callee_name, excerpt
from optimizer_codemod.analysis.graph_libraries import (
    feature_knn_use,
    pyg_layer_use,
    torch_sparse_use,
)
from optimizer_codemod.analysis.phases import phase_of_a_product
from optimizer_codemod.analysis.collect import CallSite
from optimizer_codemod.analysis.devices import placed_on_the_cpu
from optimizer_codemod.analysis.gradients import double_backward_calls
from optimizer_codemod.analysis.nodes import find_all, under_with
from optimizer_codemod.analysis.precision import (
    AUTOCAST,
    determinism_request,
    environment_step,
    reduced_precision_use,
)
from optimizer_codemod.analysis.project import AUTOGRAD_FUNCTION, AUTOGRAD_FUNCTION_BASES
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.analysis.solvers import (
    functions_reaching_solvers,
    solver_calls,
    solver_in_model_code,
)
from optimizer_codemod.analysis.training import (
    TrainedModel,
    TrainingStep,
    data_parallel_wrapping,
    device_type_code,
    device_type_code_in,
    enclosing_block,
    GRADIENT_CLIPPING,
    RECURRENT_LAYERS,
    evaluation_forwards,
    gradient_clipping,
    imported_layer,
    is_expression_statement,
    loop_method_calls,
    each_trained_model,
    model_built,
    model_constructed,
    model_device,
    model_placement,
    model_recurrent_layers,
    placement_devices,
    optimizer_name,
    trained_models,
    training_steps,
    visible_at,
    why_no_trained_model,
)
from optimizer_codemod.rule import (
    Edit,
    Example,
    Fix,
    ImportSpec,
    InsertStatements,
    Replace,
    Rule,
    Safety,
)
from optimizer_codemod.torch_version import TorchVersion

# Under CUDA autocast these raise ("unsafe to autocast"); the logits versions are safe.
BINARY_CROSS_ENTROPY = ("torch.nn.BCELoss", "torch.nn.functional.binary_cross_entropy")
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
# `torch.amp.GradScaler(device_type)` (float16 on any device) is 2.3's.
GRAD_SCALER_SINCE = TorchVersion(2, 3)
SOLVER_SLOWDOWN = (
    "an adaptive solver (torchdiffeq's default dopri5) shrinks its steps until its error "
    "estimate fits its tolerance, and bfloat16 rounding in every evaluation makes it take "
    "many more (15 to 35 times the function evaluations in torchdiffeq's ode_demo.py, about "
    "200 times in latent_ode.py, for the same losses), so it would run slower, not faster"
)

SCRIPT = """\
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = Net().to(device)
optimizer = torch.optim.AdamW(model.parameters())
for x, y in loader:
    x, y = x.to(device), y.to(device)
    logits = model(x)
    loss = loss_fn(logits, y)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


class Net(torch.nn.Module):
    pass
"""
WRAPPED = SCRIPT.replace(
    "    logits = model(x)\n    loss = loss_fn(logits, y)\n",
    "    with torch.autocast(device.type, dtype=torch.{dtype}):\n"
    "        logits = model(x)\n        loss = loss_fn(logits, y)\n",
)


class Float32TrainingWithoutAutocast(Rule):
    """
    What it does:
        Wraps the forward pass and loss of the training step (and the forward pass of
        evaluation loops under `no_grad`/`inference_mode`) in `torch.autocast` with
        bfloat16, the device type taken from the device the model is placed on. With the
        setting `precision = "fp16"` it uses float16 and adds a `torch.amp.GradScaler`: the
        loss is scaled before backward, gradients are unscaled before clipping, and the
        optimizer steps through the scaler, which then updates its scale. A value the block
        computes that autocast may have made 16-bit (what a forward or helper returns, a
        matrix product, and what is computed from those), used after the block by code other
        than backward where 16 bits break or change the script (`.numpy()`, `.tolist()`, an
        accumulator such as `total += out.sum()`, `torch.save`, a list or metric function, a
        `return`), is cast back with `.float()` at that use.

    Why is it slow:
        In float32, matrix multiplications and convolutions run at a fraction of the
        throughput the GPU's tensor cores reach in 16-bit types, and every activation costs
        twice the memory traffic. Autocast runs those operations in 16 bits and keeps
        reductions, softmax and losses in float32.

    Example:
        ```python
        logits = model(x)
        loss = loss_fn(logits, y)
        loss.backward()
        ```
        becomes
        ```python
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(x)
            loss = loss_fn(logits, y)
        loss.backward()
        ```

    Fix safety:
        `numerics`: matrix products round to bfloat16 (8 bits of mantissa); PyTorch's autocast
        keeps precision-sensitive operations in float32, and bfloat16 has float32's range so
        no loss scaling is needed. Backward stays outside the autocast region. Not applied
        when the script already chose a precision (autocast, `.half()`, 16-bit dtypes, among a
        dict's values too, as in `dtype_map[args.dtype]`, NVIDIA
        Apex's `amp.initialize`; an autocast named without being called, as timm's
        `amp_autocast = torch.cuda.amp.autocast if args.amp else suppress` or dinov2's
        `partial(torch.cuda.amp.autocast, ...)`, counts too; other
        than its own autocast, `--why-not` says so at the training step, even where the choice
        is made on one path only, as DALLE-pytorch's `--fp16`), when the script asks for
        reproducible numerics (`cudnn.deterministic = True`, `use_deterministic_algorithms`),
        which OPT301 and OPT401 respect too, when
        the model is never placed on a device (a CPU-only script) or, for a CUDA target, is
        placed on the CPU only (`model.to("cpu")`, or a device parameter that every call of
        the file gives as the CPU: llama-recipes' prompt_guard notebook; bfloat16 autocast
        there is for `target-device = "cpu"`), or when the loss is not
        computed in the same block as backward. An evaluation forward in a function where the
        device variable is not bound (a sampler that only receives the model) stays in
        float32: the autocast written there would raise NameError. `BCELoss` and
        `binary_cross_entropy` raise under CUDA autocast: the rule reports them (compute
        logits and use `BCEWithLogitsLoss`, or, for an input that is no sigmoid's output,
        compute the loss after the autocast block in float32) instead of writing a script
        that crashes; custom
        autograd Functions are reported too (they need `torch.amp.custom_fwd`). GPUs without
        bfloat16 (before Ampere) want `precision = "fp16"`; an existing GradScaler is reused.
        Not applied to reinforcement learning (a file that imports gym, gymnasium, envpool...
        and steps an environment, `envs.step(action)`, as cleanrl does): its value and Q
        networks regress returns of a hundred or more, where bfloat16 keeps under 3 digits,
        and PPO's ratios of log-probabilities and its KL early stop, or SAC's tanh-squash
        correction `log(1 - tanh(x)**2 + 1e-6)`, need float32; the networks are small.
        A model with an `nn.RNN`, `nn.LSTM` or `nn.GRU` layer is left alone under bfloat16:
        CUDA autocast casts cuDNN RNNs to float16 whatever dtype it was asked for (ATen
        `aten/src/ATen/cudnn/AutocastRNN.cpp`, `_cudnn_rnn_cast_reflatten` casts to `kHalf`),
        so the layer would train in float16 with no GradScaler; with `precision = "fp16"` the
        rule wraps it and adds the scaler, as for any model. So is, for the same reason, a
        model of which `nn.DataParallel` wraps the whole or a part (TabSurvey's SAINT wraps
        `self.model.transformer`): on several GPUs it runs each replica in a thread under
        `torch.amp.autocast(device_type, enabled=...)`, which carries whether autocast is on
        but not its dtype, so the replicas run in the device's default float16.
        A training step that runs a differential-equation solver (torchdiffeq's `odeint`,
        torchsde's `sdeint`, analysis/solvers.py; in the step, in a function or method of the
        file it calls, or in a method of the model's classes or of any class of the file) is
        left in float32, and so is an evaluation forward that does: an adaptive solver
        (dopri5, torchdiffeq's default, at `rtol=1e-7`) shrinks its steps until its error
        estimate fits the tolerance, so bfloat16 rounding in every evaluation makes it take
        many more. On torchdiffeq's ode_demo.py that was 15 to 35 times the function
        evaluations and about 10 times the time, on latent_ode.py about 200 times, for the
        same losses (measured on CPU in reading round 7).
        A file that uses torch_sparse (imports it, names `SparseTensor`, or builds one with
        PyG's `T.ToSparseTensor()`) is left alone under bfloat16 for a CUDA target: PyG's
        layers then aggregate through `torch_sparse.matmul`, whose CUDA kernel `spmm_sum`
        dispatches `AT_DISPATCH_ALL_TYPES_AND(at::ScalarType::Half, ...)`, without BFloat16
        (rusty1s/pytorch_sparse `csrc/cuda/spmm_cuda.cu`, read at 91feaa5e; its CPU kernel
        has BFloat16), so the first forward would raise "not implemented for 'BFloat16'".
        A file that uses PyG's `DynamicEdgeConv` is left alone for the same reason: it
        searches the k nearest neighbours of features a layer computed, bfloat16 under
        autocast, and the CUDA `knn` kernels of pyg-lib and torch_cluster dispatch float
        types and Half only (pyg-lib `pyg_lib/csrc/ops/cuda/knn_kernel.cu` at cc670773, whose
        CPU kernel has BFloat16; DGCNN in PyG's examples, reading round 10).
        With `precision = "fp16"`, or `target-device = "cpu"`, such files are wrapped.
        So is any file that uses PyG's layers (`torch_geometric.nn`, `torch_scatter`) under
        bfloat16 for a CUDA target, for their numerics: they sum messages with
        `scatter_add_` into a tensor of the messages' dtype and count neighbours for a mean
        the same way (torch_geometric/utils/_scatter.py at 5c6461b2), and on CUDA each
        atomic add rounds to bfloat16, whose integers stop at 256, so a node with more
        neighbours, or a graph with more nodes under `global_mean_pool`, would get a wrong
        count and sum (reading round 10, cluster_gcn_reddit.py: Reddit's nodes have
        hundreds to thousands of neighbours). Adding 1,000 ones to a bfloat16 zero one add
        at a time, as `index_add_` does on the CPU, gives 256, where the CPU's `scatter_add_`
        gives 1,000 (torch 2.13.0+cpu, tests/test_autocast_declines.py); CUDA's atomics add
        one at a time. float16 counts exactly up to 2,048.
        A file that takes the sine or cosine of a phase a layer or matrix product computes
        (PyG's TGN, whose `TimeEncoder` is `self.lin(t).cos()` of time differences in
        seconds; Fourier features `torch.sin(x @ B)`; SIREN's `torch.sin(w0 *
        self.linear(x))`; rotary tables from `torch.einsum`), outside a block that turns
        autocast off, is left alone in any precision: autocast computes the phase in 16
        bits, inputs included, so a phase in the thousands of radians is rounded by whole
        periods and the encoding becomes noise (a Linear(1, 256) time encoding's correlation
        with its float32 self was 0.15 at one hour, 0.01 at one day, torch 2.13.0+cpu,
        tests/test_autocast_phase_claims.py; tgn.py in PyG's examples, reading round 10).
        A training step in the fallback branch of a feature check (`if not hasattr(torch,
        "autocast")`, an old-torch version branch; analysis/guards.py) is left in float32,
        and so is an evaluation forward there while the rest is wrapped. Values that escape
        the block (analysis/autocast_escapes.py) are cast back where they escape rather than
        moved out of the block: the forward and loss must stay inside, and one `.float()` per
        escaping read is the smaller edit. `.numpy()` would raise on bfloat16, and metrics
        accumulated in 16 bits would silently lose precision. Uses that need no cast keep
        their text: backward, integer and boolean results (`correct += (out.argmax(1) ==
        y).sum()`), `.item()` of the value itself, printing, shapes, an explicit `.float()`,
        and values autocast computes in float32 (`F.cross_entropy`, `nn.CrossEntropyLoss`,
        softmax). A name the block binds to what existed before it needs no cast either (an
        int such as PyG's `batch_size = batch["paper"].batch_size`, `x.shape[0]`, `len(x)`,
        a constant): its `.float()` would raise AttributeError; unless a call of the block
        may have stored a tensor there (`model.cache` after `model(x)`, a forward hook's
        dict). A read that sees a later binding of the name (a plain statement before it,
        or one in a `with` body there) is no use of the block's value.
        A value that leaves in the wrapped statement itself (`outputs.append(model(x))`,
        `model(x).cpu().numpy()`, StarGAN's sampling) has no later read to cast back: that
        evaluation statement stays in float32, and such a training step leaves the file's
        steps in float32, `--why-not` naming the call.
        A training step in a method reads the model and device as `self.` attributes of its
        class; one in a function that receives them as parameters (called once in the file)
        gets the device by the function's own name for it (`torch.autocast(dev, ...)` in
        `def train(model, loader, dev)`; analysis/values.py). A step without `torch.optim`
        counts too: backward, then a loop over `model.parameters()` that updates each
        parameter from its gradient (`p -= lr * p.grad`, `p.add_(p.grad, alpha=-lr)`,
        `p.data -= lr * p.grad.data`, SGLD's added noise); the update stays outside the
        autocast block, on the float32 weights, even where it comes before the forward in the
        loop. Such a model gets no float16 autocast: the GradScaler float16 needs steps a
        `torch.optim` optimizer (`--why-not` says so); bfloat16 needs none.
        A model looked up by name counts when every name builds a module: in torchvision's or
        timm's builders (`models.__dict__[args.arch]()`, `getattr(models, name)()`), or in a
        dict of builders of the file or of another module of the run (DiT's
        `DiT_models[args.model](...)`, docs/projects.md), whose every builder is then checked
        for the hazards below.
        A file that trains several models (a GAN's generator and discriminator, each with its
        optimizer and its own backward; two trainer classes each with its `self.model`) gets
        the forward and loss of every training step wrapped, each step's forward starting
        after the backward call before it in the same block, a step that runs several models
        (the generator's loss calls the discriminator) once. It is one finding, at the first
        step: the steps share the cast-back analysis, and a step of one model runs the
        others, so a hazard of any model (a recurrent layer, `BCELoss` in the file, a custom
        autograd Function, a device not visible at a step) leaves all of them in float32,
        `--why-not` naming the model. With `precision = "fp16"` and several optimizers, one
        GradScaler serves them all as PyTorch's AMP examples show ("Working with Multiple
        Models, Losses, and Optimizers"): every loss is scaled, every optimizer steps through
        it, and it updates once per iteration after the last step. The rule declines where
        that cannot be placed soundly: steps in several loops, a backward in the loop that is
        no step it found, an optimizer stepped twice or in another block than the others (a
        generator trained every `n_critic` iterations: an update after the last step would be
        skipped, and a second `scaler.step` before an update raises), gradient clipping
        (which optimizer to unscale is not followed), a gradient differentiated again.

    Expected gain:
        On the 2-core x86_64 CPU (AVX-512 BF16) with torch 2.13.0+cpu (2026-11-21), a GPT
        training step (width 256, 4 layers, context 128, batch 8) took 85 ms with bfloat16
        autocast against 172 ms in float32; the tiny CPU-size GPT (width 32) became slower
        (4.1 ms against 3.0 ms), casts outweighing the smaller matrix products. On that CPU,
        `F.scaled_dot_product_attention` forward+backward under bfloat16 autocast is 2 to 4
        times slower than in float32 (non-causal, head dim 12 to 64: the CPU kernel, not
        the rule), so a script that also got OPT406 lost there (sudoku_diffusion x0.41); with
        `target-device = "cpu"` OPT406 leaves such attention alone (sudoku_diffusion x2.13). On GPUs,
        NVIDIA reports mixed-precision training speedups of 1.5x to 5.5x on Volta-class tensor
        cores (Micikevicius et al., "Mixed Precision Training", ICLR 2018; NVIDIA Deep
        Learning Performance Guide).
    """

    code = "OPT302"
    name = "float32-training-without-autocast"
    message = "Model trained in float32 without autocast: tensor cores stay unused"
    fix_title = "Wrap forward and loss in `torch.autocast(..., dtype=torch.bfloat16)`"
    safety = Safety.NUMERICS
    min_torch = TorchVersion(1, 10)
    triggers = (r"\.(?:named_)?parameters\s*\(", r"\.\w*optimizer\w*\s*\(")
    requires = (BACKWARD_CALL,)
    examples = (
        Example(SCRIPT, WRAPPED.format(dtype="bfloat16")),
        Example(
            SCRIPT,
            WRAPPED.format(dtype="float16")
            .replace(
                "optimizer = torch.optim.AdamW(model.parameters())\n",
                "optimizer = torch.optim.AdamW(model.parameters())\n"
                "scaler = torch.amp.GradScaler(device.type)\n",
            )
            .replace("    loss.backward()\n", "    scaler.scale(loss).backward()\n")
            .replace(
                "    torch.nn.utils.clip_grad_norm_",
                "    scaler.unscale_(optimizer)\n    torch.nn.utils.clip_grad_norm_",
            )
            .replace("    optimizer.step()\n", "    scaler.step(optimizer)\n    scaler.update()\n"),
            options=(("precision", "fp16"),),
        ),
        Example(SCRIPT.replace("model = Net().to(device)", "model = Net().to(device).half()")),
        Example(SCRIPT.replace("model = Net().to(device)", "model = Net()")),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        reduced = reduced_precision_use(facts, count_grad_scalers=False)
        if reduced is not None:
            self._decline_chosen_precision(reduced)
            return
        models = each_trained_model(facts)
        if not models:
            missing = why_no_trained_model(facts)
            if missing is not None:
                self.decline(*missing)
            return
        found = self._steps_of(models)
        if found is None:
            return
        steps, owners = found
        anchor = steps[0].forward[0]
        requested = determinism_request(facts)
        if requested is not None:
            self.decline(
                anchor,
                f"the script asks for reproducible numerics (`{excerpt(requested)}`), even if "
                "only in some runs: bfloat16 matmuls would change them far more than TF32 "
                "(which OPT301 leaves alone here too)",
            )
            return
        environment = environment_step(facts)
        if environment is not None:
            self.decline(
                anchor,
                f"the script trains on a reinforcement-learning environment "
                f"(`{excerpt(environment.node)}`): value and Q regressions of returns, and "
                "the log-probabilities whose ratios and KL estimates drive the update, need more "
                "than bfloat16's 8 significant bits, and the small networks used there gain "
                "nothing from autocast",
            )
            return
        solving = self._solver_reached(
            [statement for step in steps for statement in step.forward], models, "training step"
        )
        if solving is not None:
            self.decline(anchor, f"{solving}: {SOLVER_SLOWDOWN}")
            return
        if self._reports_hazard(anchor) or any(
            self._reports_hazard_elsewhere(model, anchor) for model in models
        ):
            return
        for model in models if self.context.target_device == "cuda" else ():
            cpu = placed_on_the_cpu(facts, model)
            if cpu is not None:
                self.decline(
                    anchor,
                    f"`{model.name}` trains on the CPU ({cpu}): there are no tensor cores for "
                    "autocast to use, and on a CPU without bfloat16 instructions (AMX, "
                    'AVX512-BF16) autocast is slower; run with `target-device = "cpu"` to '
                    "autocast there",
                )
                return
        codes = []
        for step, model in zip(steps, owners):
            placement = model_placement(facts, model)
            home = placement[1] if placement is not None else None
            codes.append(self._device_code(model_device(facts, model), home, step))
        if any(code is None for code in codes):
            self.report(
                anchor,
                message="Float32 training without autocast; the device the model is placed on "
                "is not visible where the loss is computed: pass it (or its type) there and "
                "wrap forward and loss in `torch.autocast(device.type, dtype=torch.bfloat16)`",
            )
            return
        dtype = DTYPES[self.context.precision]
        if self._declines_phase_of_a_product(anchor, dtype):
            return
        if dtype == "bfloat16" and (
            any(self._declines_recurrent(model, anchor) for model in models)
            or any(self._declines_data_parallel(model, anchor) for model in models)
            or self._declines_cuda_kernel_without_bfloat16(anchor)
            or self._declines_pyg_aggregation(anchor)
        ):
            return
        escapes = facts.autocast_escapes
        forwards = [step.forward for step in steps]
        for step in steps:
            leaving = escapes.escape_within(step.forward, forwards)
            if leaving is not None:
                self.decline(anchor, _leaves_the_block(leaving, "training step"))
                return
        torch_name = facts.imports.name_for_module("torch")
        imports = () if torch_name else (ImportSpec("torch"),)
        torch_name = torch_name or "torch"
        autocast = "{torch}.autocast({device}, dtype={torch}.{dtype})"
        guards = facts.feature_guards
        regions = list(forwards)
        contexts = [autocast.format(torch=torch_name, device=code, dtype=dtype) for code in codes]
        for model in models:
            device = model_device(facts, model)
            for statement in evaluation_forwards(facts, model):
                if any(statement is s for region in regions for s in region):
                    continue
                if visible_at(facts, device, statement) and not guards.in_fallback(statement):
                    leaving = escapes.escape_within((statement,), regions)
                    if leaving is not None:
                        self.decline(statement, _leaves_the_block(leaving, "evaluation forward"))
                        continue
                    solving = self._solver_reached((statement,), (), "evaluation forward")
                    if solving is not None:
                        self.decline(statement, f"{solving}: {SOLVER_SLOWDOWN}")
                        continue
                    regions.append((statement,))
                    code = device_type_code(facts, device)
                    contexts.append(autocast.format(torch=torch_name, device=code, dtype=dtype))
        edits: List[Edit] = []
        for region, context in zip(regions, contexts):
            edits.extend(wrapped_in(region, context))
        edits.extend(cast_back(facts, regions))
        if dtype == "float16" and not all(step.scaler for step in steps):
            scaling = self._float16_scaling(models, steps, torch_name, anchor)
            if scaling is None:
                return
            edits.extend(scaling)
        names = ", ".join(
            (
                f"{model.owner}'s `{model.name}`"
                if model.owner and len(models) > 1
                else f"`{model.name}`"
            )
            for model in models
        )
        self.report(
            anchor,
            Fix(tuple(edits), imports),
            message=f"{names} {'is' if len(models) == 1 else 'are'} trained in float32 without "
            "autocast",
            fix_title=f"Wrap forward and loss in `torch.autocast(..., dtype=torch.{dtype})`",
        )

    def _decline_chosen_precision(self, reduced: cst.CSTNode) -> None:
        """Say, at the first training step, that the script chose a precision of its own
        (DALLE-pytorch's `--fp16` path calls `dalle.half()`): autocast is left to it even on
        the paths that train in float32. Nothing is said where no step is found."""
        facts = self.facts
        site = facts.call_site_of.get(reduced)
        if reduced is facts.module or (
            site is not None and (site.qualname in AUTOCAST or site.method == "autocast")
        ):
            return  # it autocasts already (maybe this rule's fix, in an earlier pass)
        steps = [
            step for model in each_trained_model(facts) for step in training_steps(facts, model)
        ]
        if steps and steps[0].forward:
            anchor = steps[0].forward[0]
        else:  # the step of a model the analysis does not follow (DALLE's `dalle = dalle.half()`)
            missing = why_no_trained_model(facts)
            if missing is None:
                return
            anchor = missing[0]
        self.decline(
            anchor,
            f"the script already computes in another precision (`{excerpt(reduced)}`), even if "
            "only in some runs: it chose its precision, and where to add autocast beside that "
            "choice is the script's to decide",
        )

    def _steps_of(
        self, models: Sequence[TrainedModel]
    ) -> Optional[Tuple[List[TrainingStep], List[TrainedModel]]]:
        """The training steps of all `models` in source order, a step whose backward call
        several models share (a GAN's generator step runs the discriminator too) once, with
        its longest forward, and the model each step was found for; None, after saying why,
        when a model has no step or no device."""
        facts = self.facts
        by_backward = {}
        for model in models:
            steps = training_steps(facts, model)
            device = model_device(facts, model)
            if not steps or device is None:
                anchor = model_built(facts, model) or model.optimizer.node
                if len(models) > 1:
                    anchor = model_constructed(facts, model) or anchor
                devices = placement_devices(facts, model) if device is None else []
                self.decline(
                    anchor,
                    (
                        f"`{model.name}` is placed on several devices in this file "
                        f"({', '.join(f'`{d}`' for d in devices)}), in branches the analysis "
                        "does not tell apart, so the one device type autocast needs is unknown"
                        if len(devices) > 1
                        else (
                            f"`{model.name}` is not moved to a device with `.to(device)` or "
                            "`.cuda()` in this file, so the device type autocast needs is unknown"
                            if device is None
                            else f"no step that computes a loss from `{model.name}` and calls "
                            "`.backward()` on it was found"
                        )
                    ),
                )
                return None
            for step in steps:
                known = by_backward.get(id(step.backward.node))
                if known is None or len(step.forward) > len(known[0].forward):
                    by_backward[id(step.backward.node)] = (step, model)
        ordered = sorted(by_backward.values(), key=lambda pair: pair[0].backward.site.order)
        return [step for step, _ in ordered], [model for _, model in ordered]

    def _solver_reached(
        self,
        statements: Sequence[cst.BaseStatement],
        models: Sequence[TrainedModel],
        what: str,
    ) -> Optional[str]:
        """Where `statements` run a differential-equation solver (analysis/solvers.py), said
        for a decline: called in them, or in a function or method of the file they call; for
        a training step of `models`, also in the code of their classes (model_layer_calls, as
        for recurrent layers) or, as for custom autograd Functions, in a method of any class
        of the file (odenet_mnist's `ODEBlock.forward`, in a model built as `nn.Sequential(
        *feature_layers)`, which the model's own analysis does not follow); None where none."""
        facts = self.facts
        solvers = solver_calls(facts)
        if not solvers:
            return None
        solving = {id(call.node) for call in solvers}
        reaching = functions_reaching_solvers(facts)
        for statement in statements:
            for call in find_all(statement, cst.Call):
                if id(call) in solving:
                    return f"this {what} calls the solver `{excerpt(call)}`"
                via = reaching.get(callee_name(call) or "")
                if via is not None:
                    return (
                        f"this {what} calls `{excerpt(call.func)}`, which runs the solver "
                        f"`{excerpt(via.node)}`"
                    )
        for model in models:
            found = solver_in_model_code(facts, model)
            if found is None:
                continue
            call, via, surely = found
            if surely:
                return (
                    f"`{model.name}` runs the solver `{excerpt(call.node)}` in "
                    f"`{_defined_in(call)}`"
                )
            return (
                f"`{_defined_in(call)}` of this file runs the solver `{excerpt(via.node)}`, "
                "and the model this step trains may be built from its class"
            )
        return None

    def _declines_cuda_kernel_without_bfloat16(self, anchor: cst.CSTNode) -> bool:
        """A CUDA target and a file that uses torch_sparse or `DynamicEdgeConv`: their CUDA
        kernels have no bfloat16 version (see the docstring)."""
        if self.context.target_device != "cuda":
            return False
        sparse = torch_sparse_use(self.facts)
        knn = feature_knn_use(self.facts) if sparse is None else None
        if sparse is not None:
            what = (
                f"the file uses torch_sparse (`{excerpt(sparse)}`): PyG's layers multiply a "
                "`SparseTensor` through `torch_sparse.matmul`, whose CUDA kernel has no "
                "bfloat16 version (`spmm_sum` dispatches float types and Half only)"
            )
        elif knn is not None:
            what = (
                f"the file uses `DynamicEdgeConv` (`{excerpt(knn)}`), which searches the "
                "nearest neighbours of features a layer computed, bfloat16 under autocast: "
                "the CUDA `knn` kernels of pyg-lib and torch_cluster have no bfloat16 version"
            )
        else:
            return False
        self.decline(
            anchor,
            f'{what}, so the first forward under bfloat16 autocast would raise "not '
            "implemented for 'BFloat16'\" on CUDA (set precision to fp16, which these kernels "
            "support)",
        )
        return True

    def _declines_pyg_aggregation(self, anchor: cst.CSTNode) -> bool:
        """A CUDA target and a file that uses PyG's layers: they sum and count neighbours by
        atomic adds in the messages' dtype (analysis/graph_libraries.py)."""
        if self.context.target_device != "cuda":
            return False
        use = pyg_layer_use(self.facts)
        if use is None:
            return False
        self.decline(
            anchor,
            f"the file uses PyG's layers (`{excerpt(use)}`), which aggregate messages with "
            "`scatter_add_` into a tensor of the messages' dtype and count neighbours for a "
            "mean the same way: on CUDA each atomic add rounds to bfloat16, whose integers "
            "stop at 256, so a node with more neighbours (or a graph with more nodes under "
            "`global_mean_pool`) would get a wrong count and sum; wrap the step by hand where "
            "no node has that many (fp16 counts exactly up to 2,048)",
        )
        return True

    def _declines_phase_of_a_product(self, anchor: cst.CSTNode, dtype: str) -> bool:
        phase = phase_of_a_product(self.facts)
        if phase is None:
            return False
        what = (
            "the file takes the sine or cosine of a phase a layer or matrix product computes "
            f"(`{excerpt(phase)}`: a time or position encoding)"
            if isinstance(phase, cst.Call)
            else f"the file uses PyG's TGN (`{excerpt(phase)}`), whose `TimeEncoder` takes "
            "the cosine of a Linear layer of time differences"
        )
        self.decline(
            anchor,
            f"{what}: autocast would compute that phase in {dtype}, inputs included, which "
            "rounds a phase in the thousands of radians by whole periods (a time difference "
            "of one day by 512 s in bfloat16), so the encoding becomes noise; turn autocast "
            "off around it first",
        )
        return True

    def _declines_recurrent(self, model: TrainedModel, anchor: cst.CSTNode) -> bool:
        facts = self.facts
        recurrent = model_recurrent_layers(facts, model)
        elsewhere = imported_layer(facts, model, RECURRENT_LAYERS.__contains__)
        if not recurrent and elsewhere is None:
            return False
        shown = (
            f"`{excerpt(recurrent[0].node)}`"
            if recurrent
            else f"`{elsewhere[0]}` in {elsewhere[1].module}"
        )
        self.decline(
            anchor,
            f"`{model.name}` has a cuDNN recurrent layer ({shown}): "
            "CUDA autocast runs it in float16 whatever dtype is asked for, so bfloat16 "
            "autocast would train it in float16 without a GradScaler (set precision to "
            "fp16, which adds one)",
        )
        return True

    def _declines_data_parallel(self, model: TrainedModel, anchor: cst.CSTNode) -> bool:
        wrapping = data_parallel_wrapping(self.facts, model)
        if wrapping is None:
            return False
        self.decline(
            anchor,
            f"`{model.name}` (or a part of it) is wrapped in `nn.DataParallel` "
            f"(`{excerpt(wrapping.node)}`): on several GPUs it runs the replicas in threads, "
            "which it puts under autocast with the device's default dtype (it passes on only "
            "whether autocast is on: torch/nn/parallel/parallel_apply.py), so bfloat16 "
            "autocast would train them in float16 without a GradScaler (set precision to fp16, "
            "which adds one)",
        )
        return True

    def _float16_scaling(
        self,
        models: Sequence[TrainedModel],
        steps: Sequence[TrainingStep],
        torch_name: str,
        anchor: cst.CSTNode,
    ) -> Optional[List[Edit]]:
        """The GradScaler edits float16 needs, or None after saying why there are none."""
        manual = next((model for model in models if model.updated_by is not None), None)
        if manual is not None:
            update = manual.updated_by.loop.node
            self.decline(
                anchor,
                f"`{manual.name}` is updated by hand (`for {excerpt(update.target, 20)} in "
                f"{excerpt(update.iter, 40)}`), not by a `torch.optim` optimizer: float16 needs a "
                "GradScaler, which steps an optimizer (set precision to bf16, which needs none)",
            )
            return None
        # Every optimizer, not only each model's first: a third one over the parameters of
        # two models (InfoGAN's `optimizer_info`) must step through the scaler too.
        every_pair = trained_models(self.facts)
        optimizers = {id(model.optimizer.node) for model in every_pair}
        if len(optimizers) > 1:
            scaling = self._loss_scaling_shared(every_pair, steps, torch_name)
            if scaling is None:
                names = ", ".join(f"`{model.name}`" for model in models)
                self.decline(
                    anchor,
                    f"this file trains several models with their own optimizers ({names}): "
                    "float16 needs one GradScaler that scales every loss, steps every "
                    "optimizer and updates once per iteration after the last step; the "
                    "analysis places it only where one loop runs every step, each optimizer "
                    "steps once in one block and nothing clips gradients or differentiates "
                    "them again (set precision to bf16, which needs no scaler)",
                )
            return scaling
        model = models[0]
        scaling = self._loss_scaling(model, steps, torch_name, model_device(self.facts, model))
        if scaling is None:
            self.report(
                anchor,
                message="Float32 training without autocast; float16 needs a GradScaler "
                "and the analysis cannot place one here (set precision to bf16, or add "
                "autocast and `torch.amp.GradScaler` by hand)",
            )
        return scaling

    def _device_code(
        self,
        device: cst.BaseExpression,
        home: Optional[cst.FunctionDef],
        step: TrainingStep,
    ) -> Optional[str]:
        """The device type's source text where `step` computes its loss: the name its function
        has for the model's device (a parameter bound to it at the one call site, see
        training.device_type_code_in), else the device's own text where it is bound there."""
        facts = self.facts
        if step.loop.function is not home:
            moved = device_type_code_in(facts, device, home, step.loop.function)
            if moved is not None:
                return moved
        if visible_at(facts, device, step.forward[0]):
            return device_type_code(facts, device)
        return None

    def _reports_hazard(self, anchor: cst.CSTNode) -> bool:
        facts = self.facts
        bce = facts.calls_to(*BINARY_CROSS_ENTROPY)
        if bce:
            self.report(
                bce[0].node,
                message="Float32 training without autocast, but `BCELoss`/`binary_cross_entropy` "
                "raise under CUDA autocast: where its input is a sigmoid's output, return "
                "logits and use `BCEWithLogitsLoss` (or `binary_cross_entropy_with_logits`); "
                "otherwise (a cosine similarity, Wav2Lip's sync loss) autocast the forward "
                "only and compute the loss after the block on `.float()` inputs",
            )
            return True
        functions = [
            info.node
            for info in facts.classes.values()
            if any(base in AUTOGRAD_FUNCTION_BASES for base in info.bases)
        ]
        if functions:
            self.report(
                functions[0],
                message="Float32 training without autocast, but this custom autograd Function "
                "would receive 16-bit inputs: decorate its forward with "
                "`torch.amp.custom_fwd(device_type=...)` and backward with `custom_bwd`, then "
                "add autocast",
            )
            return True
        return False

    def _reports_hazard_elsewhere(self, model: TrainedModel, anchor: cst.CSTNode) -> bool:
        """The hazards of _reports_hazard in the model's classes from other modules."""
        found = imported_layer(
            self.facts, model, lambda q: q in BINARY_CROSS_ENTROPY or q == AUTOGRAD_FUNCTION
        )
        if found is None:
            return False
        layer, imported = found
        self.report(
            anchor,
            message=f"Float32 training without autocast, but `{model.name}` calls `{layer}` in "
            f"{imported.module}, which "
            + (
                "would receive 16-bit inputs under autocast: decorate its forward with "
                "`torch.amp.custom_fwd(device_type=...)` and backward with `custom_bwd`"
                if layer == AUTOGRAD_FUNCTION
                else "raises under CUDA autocast: use the logits version"
            )
            + ", then add autocast",
        )
        return True

    def _loss_scaling(
        self,
        model: TrainedModel,
        steps: Sequence[TrainingStep],
        torch_name: str,
        device: cst.BaseExpression,
    ) -> Optional[List[Edit]]:
        """The GradScaler edits for float16, or None when a step cannot be followed."""
        facts = self.facts
        optimizer = optimizer_name(facts, model)
        scaler = self._scaler_built_after(model.optimizer.site.statement, device, torch_name)
        if optimizer is None or scaler is None:
            return None
        name, built = scaler
        edits: List[Edit] = [built]
        for step in steps:
            updates = loop_method_calls(facts, step, optimizer, "step")
            if len(updates) != 1 or not is_expression_statement(
                updates[0].site.statement, updates[0].node
            ):
                return None
            update = updates[0]
            edits.append(_scaled_backward(step, name))
            edits.append(Replace(update.node, cst.parse_expression(f"{name}.step({optimizer})")))
            edits.append(
                InsertStatements(
                    update.site.statement,
                    after=(cst.parse_statement(f"{name}.update()\n"),),
                )
            )
            for clip in gradient_clipping(facts, step):
                if clip.site.order > update.site.order:
                    return None
                edits.append(
                    InsertStatements(
                        clip.site.statement,
                        before=(cst.parse_statement(f"{name}.unscale_({optimizer})\n"),),
                    )
                )
        return edits

    def _loss_scaling_shared(
        self, pairs: Sequence[TrainedModel], steps: Sequence[TrainingStep], torch_name: str
    ) -> Optional[List[Edit]]:
        """One GradScaler for several optimizers (PyTorch's AMP examples, "Working with
        Multiple Models, Losses, and Optimizers"): every loss scaled, every optimizer stepped
        through it, `update()` once after the last step. None unless all steps are in one
        loop whose every backward call is one of them, each optimizer steps once there, all
        those steps stand in one block (the update runs after each of them, every iteration
        that runs one), and nothing clips gradients or differentiates a gradient again."""
        facts = self.facts
        loops = {id(step.loop.node) for step in steps}
        if len(loops) != 1 or double_backward_calls(facts):
            return None
        loop_calls = facts.loop_calls(steps[0].loop)
        backward_calls = [call for call in loop_calls if call.method == "backward"]
        if len(backward_calls) != len(steps) or any(
            call.qualname in GRADIENT_CLIPPING for call in loop_calls
        ):
            return None
        devices = [model_device(facts, model) for model in pairs]
        if len({device_type_code(facts, device) for device in devices}) != 1:
            return None
        updates = []
        seen = set()
        for model in pairs:
            if id(model.optimizer.node) in seen:
                continue
            seen.add(id(model.optimizer.node))
            optimizer = optimizer_name(facts, model)
            calls = loop_method_calls(facts, steps[0], optimizer, "step") if optimizer else []
            if len(calls) != 1 or not is_expression_statement(
                calls[0].site.statement, calls[0].node
            ):
                return None
            updates.append((optimizer, calls[0]))
        # An optimizer of the file that the analysis does not tie to a model, stepped here,
        # would apply the scaled gradients.
        constructed = [facts.assignment_of(call.node) for call in facts.optimizer_constructions()]
        every_optimizer = {assignment.target for assignment in constructed if assignment}
        stepped = {call.receiver for call in loop_calls if call.method == "step"}
        if (stepped & every_optimizer) - {optimizer for optimizer, _ in updates}:
            return None
        statements = [call.site.statement for _, call in updates]
        block = enclosing_block(steps[0].loop.node, statements[0])
        if block is None or not all(any(s is t for t in block) for s in statements):
            return None
        last = max((model.optimizer for model in pairs), key=lambda call: call.site.order)
        if any(model.optimizer.site.function is not last.site.function for model in pairs):
            return None
        scaler = self._scaler_built_after(last.site.statement, devices[0], torch_name)
        if scaler is None:
            return None
        name, built = scaler
        edits: List[Edit] = [built]
        edits.extend(_scaled_backward(step, name) for step in steps)
        for optimizer, call in updates:
            edits.append(Replace(call.node, cst.parse_expression(f"{name}.step({optimizer})")))
        final = max((call for _, call in updates), key=lambda call: call.site.order)
        edits.append(
            InsertStatements(
                final.site.statement, after=(cst.parse_statement(f"{name}.update()\n"),)
            )
        )
        return edits

    def _scaler_built_after(
        self,
        construction: Optional[cst.CSTNode],
        device: cst.BaseExpression,
        torch_name: str,
    ) -> Optional[Tuple[str, Edit]]:
        """(its name, the edit that builds it) for a GradScaler built after `construction`
        (an optimizer's), None where the device is not visible there or no name is free."""
        facts = self.facts
        if not isinstance(construction, cst.SimpleStatementLine):
            return None
        if not visible_at(facts, device, construction):
            return None
        scaler = "scaler" if not facts.imports.is_bound("scaler") else "grad_scaler"
        if facts.imports.is_bound(scaler):
            return None
        device_type = device_type_code(facts, device)
        built = cst.parse_statement(f"{scaler} = {torch_name}.amp.GradScaler({device_type})\n")
        return scaler, InsertStatements(construction, after=(built,))


def _scaled_backward(step: TrainingStep, scaler: str) -> Edit:
    """`scaler.scale(loss).backward()` for the step's `loss.backward()`."""
    backward = step.backward.node
    return Replace(
        backward,
        backward.with_changes(
            func=backward.func.with_changes(
                value=cst.Call(
                    func=cst.parse_expression(f"{scaler}.scale"),
                    # `(loss / 4).backward()`: as an argument the division needs no parentheses
                    args=[cst.Arg(backward.func.value.with_changes(lpar=(), rpar=()))],
                )
            )
        ),
    )


def _defined_in(call: CallSite) -> str:
    """`ODEBlock.forward` for a call in that method, `solve` for one in a function."""
    function = call.site.function
    parts = (call.site.class_name, function.name.value if function is not None else None)
    return ".".join(part for part in parts if part is not None)


def _leaves_the_block(leaving: cst.BaseExpression, where: str) -> str:
    return (
        f"this {where} stays in float32: the value of `{excerpt(leaving)}` would leave the "
        "autocast block in the statement that computes it (`.numpy()`, `.tolist()`, a list's "
        "`.append`, `torch.save` or an attribute), where bfloat16 breaks `.numpy()` or is kept "
        "in 16 bits, and no later read is there to cast it back"
    )


def cast_back(facts, regions: Sequence[Tuple[cst.BaseStatement, ...]]) -> List[Edit]:
    """`.float()` at every read after a wrapped region that takes a 16-bit value it computes
    to `.numpy()`, an accumulator, `torch.save`, a return or a metric function."""
    wrapped = {node for region in regions for s in region for node in find_all(s, cst.Name)}
    reads = {}
    for region in regions:
        for read in facts.autocast_escapes.escaping_reads(region, regions):
            if read not in wrapped:
                reads[read] = None  # one edit per read, in order
    return [
        Replace(read, cst.Call(func=cst.Attribute(value=read, attr=cst.Name("float"))))
        for read in reads
    ]


def wrapped_in(statements: Tuple[cst.BaseStatement, ...], context: str) -> List[Edit]:
    """Edits that put consecutive `statements` under `with context:`, comments kept."""
    edits: List[Edit] = [Replace(statements[0], under_with(statements, context))]
    edits.extend(Replace(statement, cst.RemovalSentinel.REMOVE) for statement in statements[1:])
    return edits

"""OPT402: a model trained without compilation."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.calls import code_of, excerpt
from optimizer_codemod.analysis.devices import deepspeed_engine
from optimizer_codemod.analysis.distributions import unchecked_by_compiling
from optimizer_codemod.analysis.solvers import is_solver, solver_in_model_code
from optimizer_codemod.analysis.entry_points import (
    models_trained_elsewhere,
    placed_device,
    rebound_after_placement,
)
from optimizer_codemod.analysis.gradients import SECOND_DERIVATIVE_CALLS, double_backward_calls
from optimizer_codemod.analysis.precision import (
    determinism_request,
    imported_decider,
    imported_second_derivative_call,
)
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.analysis.training import (
    data_parallel_wrapping,
    RECURRENT_LAYERS,
    class_without_forward,
    model_run_only_through_methods,
    model_run_through_forward,
    one_training_step,
    compiles,
    each_trained_model,
    imported_layer,
    model_classes,
    model_code_call,
    device_type_code,
    model_built,
    model_device,
    model_randomness,
    model_recurrent_layers,
    model_sparse_calls,
    places_while_wrapping,
    torch_own_module,
    visible_at,
    why_no_trained_model,
)
from optimizer_codemod.rule import Example, Fix, InsertStatements, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

SCRIPT = """\
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = Net().to(device)
optimizer = torch.optim.AdamW(model.parameters())
for x, y in loader:
    loss = loss_fn(model(x.to(device)), y.to(device))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


class Net(torch.nn.Module):
    def forward(self, x):
        return x
"""


class ModelTrainedWithoutCompile(Rule):
    """
    What it does:
        Adds `model.compile()` right after the trained model is built and placed on its
        device (before any DistributedDataParallel wrapping), when the device is CUDA.

    Why is it slow:
        In eager mode every operator is a separate kernel launch that reads its inputs from
        and writes its outputs to GPU memory. `torch.compile` captures the forward and
        backward graphs and generates fused kernels, so chains of elementwise operations,
        normalisations and activations cost one pass over memory instead of many, and the
        Python overhead of each step shrinks.

    Example:
        ```python
        model = Net().to(device)
        ```
        becomes
        ```python
        model = Net().to(device)
        if device.type == "cuda":
            model.compile()
        ```

    Fix safety:
        `numerics`: generated kernels fuse and reorder floating-point operations. `behavior`
        for a model whose code applies element-wise dropout or draws random numbers per
        element (`torch.randn_like` for a VAE's noise; the same detection as OPT407), or
        builds a layer with a dropout option that is not literally zero (PyG's `MLP(...,
        dropout=0.5)`, `attn_kwargs={"dropout": 0.5}`: the library applies it inside):
        compiled kernels draw their own random numbers (Inductor, unless
        `torch._inductor.config.fallback_random`), so a seeded run drops other elements from
        the first step (tests/test_compile_claims.py runs it). `behavior` too for a file that
        builds `torch.distributions` objects relying on their default argument checks
        (`Categorical(logits=x)` without `validate_args`, or a class of the file derived
        from one of torch's), or imports a module of the run that does (a policy class in
        `model.py`, a loop in `trainer.py`), unless it compiles or turns the checks off
        already: the first compile turns them off for the whole process (Dynamo's
        `TorchPatcher.patch()` calls `Distribution.set_default_validate_args(False)`,
        torch/_dynamo/eval_frame.py in torch 2.13.0; tests/test_distribution_validation.py
        checks it), so NaN logits or an action outside the support no longer raise. Every
        number on valid arguments stays the same. A distribution built only in a function
        or class that nothing but its own definition names (DiT's unused
        `continuous_gaussian_log_likelihood` in diffusion_utils.py) is never built and does
        not count. Distributions built by libraries the script calls, or by modules outside
        the run, are not seen.
        `model.compile()` compiles the module in place, so `state_dict()` keys keep their
        names (no `_orig_mod.` prefix as with `model = torch.compile(model)`) and saved
        checkpoints load as before; the default mode is used, not `reduce-overhead` (CUDA
        graphs break on changing shapes and on outputs kept across steps). Not for a model
        whose class defines no `forward` (cleanrl's PPO `Agent`, used through
        `get_action_and_value`), nor for one the file never calls itself but only through
        methods of its classes that call `self.forward(...)` or submodules (PyTorch-GAN's
        `D.compute_loss(x, valid)`; also through helpers of the file it is handed to that
        do no more with it: hkproj's `greedy_decode(model, ...)` calling `model.encode`,
        `model.decode` and `model.project`), or only as `model.forward(x)` (PyTorch's
        optimizer-step-in-backward tutorial): `compile()` compiles the module's own call
        only, so nothing would run compiled. Compiling happens
        before a DistributedDataParallel wrapper is built, and before Hugging Face
        Accelerate's `model, opt = accelerator.prepare(model, opt)`, which places the model
        on `accelerator.device` (unless the `Accelerator` is built with `device_placement`)
        and may wrap it as DDP does: the guard is then `accelerator.device.type == "cuda"`.
        A model the script builds, places (`model.to(device)`, `model.cuda()`) and hands to
        the training loop of another module of the run (`train_one_epoch(model, ...)` in
        engine.py, as MAE and ConvNeXt do) is compiled right after that placement (not after
        one in a branch that returns or raises first, such as torchvision's quantization
        script's `if args.test_only: model.to(device); ...; return`, whose compile would
        leave the training eager; the same holds for a placement in the training file), when no
        module the script imports, the loop's among them, compiles already, may differentiate
        a gradient again (a `create_graph` not literally False: a second-order optimizer's
        scaler), defines a custom `torch.autograd.Function` (gradient checkpointing's
        backward calls autograd itself), builds recurrent layers or uses sparse tensors (the
        project index's settings), and the name is bound again before the loop only by a
        data-parallel wrapper. A file that trains several models
        (a GAN's generator and discriminator, each with its optimizer) gets each compiled
        after the statement that places it. Nothing is done when the script already compiles
        anything (`torch.compile`, `.compile()`, TorchScript), or for a model built inside a
        loop or never placed on a device, or when the file takes one training step (its
        `.backward()` runs in no loop that repeats, nor in a function called from one, as in
        a demo; `for _ in range(1):` runs once):
        compiling costs seconds that one step never earns back. Nor when the file
        differentiates a gradient again (`torch.autograd.grad(..., create_graph=True)` for a gradient penalty,
        `backward(create_graph=True)`, `torch.autograd.functional.hessian`), or calls a
        function of another module of the run that does, itself or through the functions of
        its file it calls (aladdinpersson's ProGAN calls utils.py's `gradient_penalty`; the
        project index summarises such functions): the backward of
        a compiled module cannot be differentiated, and the second backward raises
        "torch.compile with aot_autograd does not currently support double backward" (torch
        2.13, `_functorch/_aot_autograd/runtime_wrappers.py`; tests/test_compile_claims.py
        runs it); nor when a class of the model from another module of the run calls
        `torch.autograd.grad` or a Hessian in its methods (x-transformers'
        XLAutoregressiveWrapper trains at test time inside its forward); nor when the
        model's code, here or in its classes of other modules, draws numpy random numbers
        (PyTorch-GAN's UNIT encoder, `Tensor(np.random.normal(0, 1, mu.shape))`: Dynamo traces
        the draw into a float64 tensor and the float32 constructor raises TorchRuntimeError
        on the first step; tests/test_compile_claims.py runs it). Nor for a model that runs
        a differential-equation solver (torchdiffeq's `odeint`, torchsde's `sdeint`) in its
        code, or when a class of the file does (torchdiffeq's odenet_mnist.py assembles its
        network from layer lists the analysis does not all follow): Dynamo traces into the
        solver's loop over time, Inductor cannot lower its `unique(return_counts=True)` and
        AOTAutograd rejects its custom autograd Function, so the first step raises (reading
        round 7, torch 2.13.0). Nor for a model whose `forward` counts its calls in an
        integer attribute (`self.nfe += 1`): Dynamo specialises on it and compiles again on
        every call until its recompile limit (8), after which the forward runs eager. Nor
        when the script imports `higher` or `learn2learn`: their functional copies of a
        module (`higher.innerloop_ctx`, `clone_module`) copy its `__dict__`, the compiled
        call included, so the copy runs the original's parameters (measured with higher:
        the meta-loss of the untrained model, a wrong meta-gradient, no error). A loss module
        of torch's (`CrossEntropyLoss().to(device)`) handed to another module's loop beside
        the model is no model. Nor when the script
        trains under DeepSpeed (it imports `deepspeed` or gives Accelerate a
        `DeepSpeedPlugin`, or a module of the run it imports calls `deepspeed.initialize` or
        builds that plugin, as a launcher helper does; a library that merely supports
        DeepSpeed does not count): DeepSpeed's engine wraps the model, a module
        compiled before it breaks under ZeRO-3's partitioned parameters
        (pytorch/pytorch#115484), and DeepSpeed compiles through `engine.compile()` or the
        `compile` section of its configuration (accelerate's DeepSpeed test scripts had
        their models compiled before this). Nor for a model wrapped in `nn.DataParallel`
        (CutMix's `torch.nn.DataParallel(model).cuda()`): it replicates the module on every
        forward and runs the replicas in threads, and PyTorch documents compiling with
        DistributedDataParallel, which OPT604 suggests. Nor for a model built only from torch's own layers
        (`nn.Sequential(nn.Linear(...), nn.ReLU())`): `Module.compile()` compiles the
        module's `_call_impl`, and Dynamo skips the code of torch's own modules, so nothing
        is compiled (measured on torch 2.13; pytorch/pytorch#150915, with a fix proposed in
        pytorch/pytorch#185722); `model = torch.compile(model)` would compile it, but
        renames its `state_dict()` keys. On CPU the guard leaves the model in eager mode: on the
        2-core x86_64 CPU used for our measurements compilation took about 20 s and made a
        bfloat16-autocast GPT step 5.9 times slower (85 ms eager, 501 ms compiled). For
        the same reason the rule does not run with `target-device = "cpu"`. Not applied when
        the script, or a module of the run it imports, asks for reproducible numerics
        (`cudnn.deterministic = ...`, `use_deterministic_algorithms`, unless the value is a
        literal False), which OPT301, OPT302 and OPT401 respect too: Inductor chooses among
        kernel configurations by timing them on the device, a choice its configuration says
        may affect numerics (torch 2.13 `_inductor/config.py`, `deterministic`), and it keeps
        to one only under `use_deterministic_algorithms` or `TORCHINDUCTOR_DETERMINISTIC=1`,
        so two seeded runs of the compiled model may differ where the eager ones agree
        (cleanrl's scripts, `cudnn.deterministic = args.torch_deterministic`, reading round
        10). Not applied when
        the model is built or placed in the fallback branch of a feature check (`else` of
        `if hasattr(torch, "compile")`, an old-torch version branch; analysis/guards.py).
        Nor where compiling would not pay (DESIGN §6): a model with an `nn.RNN`, `nn.LSTM`
        or `nn.GRU` layer (Dynamo graph-breaks on them unless the experimental
        `torch._dynamo.config.allow_rnn` is set: torch 2.13 `_dynamo/variables/builder.py`,
        "Dynamo does not support RNN, GRU, or LSTM"), or a model (its classes' methods) or
        training loop that builds or multiplies sparse tensors (`.to_sparse()`,
        `torch.sparse_coo_tensor`, `torch.spmm`, `torch.sparse.*`: "torch.compile does not
        support sparse Tensors", torch 2.13 `_dynamo/graph_break_registry.json`); sparse
        preprocessing that ends in dense inputs does not count. `--why-not` says which.
        A model kept as `self.model` is compiled in the method that places it (`__init__`);
        one handed to a function that builds its optimizer (`train(net, ...)`, called once)
        is compiled where the caller builds it. Not applied when `self.model` is built again
        in another method, or when the class, or the function, is called several times with
        models the file cannot follow (analysis/values.py). A model trained without
        `torch.optim`, by a loop over its `.parameters()` that updates each parameter from its
        gradient after backward (`p -= lr * p.grad`), is the trained model too; kept as
        `self.model`, it is compiled in `__init__` when another method updates it. So is a
        model looked up by name when every name builds a module: in torchvision's or timm's
        builders (`models.__dict__[args.arch]()`), or in a dict of builders of the file or of
        another module of the run (DiT's `DiT_models[args.model](...)`, docs/projects.md),
        whose every builder is then checked for the hazards above.
        A model that a script builds and hands to the training loop of another module of
        the run (`train_one_epoch(model, ...)` from engine.py, `TrainLoop(model=model,
        ...).run_loop()`; analysis/entry_points.py) is not compiled: the analysis does not
        follow it into that loop, where the hazards above would show. `--why-not` says so at
        the statement that builds it, naming the loop, and whether its architecture is
        chosen at run time by name (`models.__dict__[args.arch]()`, timm's
        `create_model(args.model)`).

    Expected gain:
        PyTorch 2.0's announcement reports training 43% faster on average (geometric mean
        over 163 open-source models on an NVIDIA A100, 21% in float32, 51% with AMP;
        https://pytorch.org/get-started/pytorch-2.0/). On CPU the rewrite changes nothing
        (the guard).
    """

    code = "OPT402"
    name = "model-trained-without-compile"
    message = "Model trained in eager mode: every operator is a separate kernel"
    fix_title = "Add `model.compile()` (on CUDA) after the model is placed on its device"
    safety = Safety.NUMERICS
    min_torch = TorchVersion(2, 2)
    # On CPU its guard leaves the line dead (compiling there made training slower).
    target_devices = ("cuda",)
    triggers = (r"\.(?:named_)?parameters\s*\(", r"\.\w*optimizer\w*\s*\(")
    requires = (BACKWARD_CALL,)
    examines_entry_points = True
    examples = (
        Example(
            SCRIPT,
            SCRIPT.replace(
                "model = Net().to(device)\n",
                'model = Net().to(device)\nif device.type == "cuda":\n    model.compile()\n',
            ),
        ),
        Example(SCRIPT.replace("model = Net().to(device)\n", "model = torch.compile(Net())\n")),
        Example(SCRIPT.replace("to(device)\n", "to(device)\nmodel.compile()\n", 1)),
        Example(SCRIPT.replace("model = Net().to(device)\n", "model = Net()\n")),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        if compiles(facts):
            return
        models = each_trained_model(facts)
        if not models:
            missing = why_no_trained_model(facts)
            if missing is not None:
                self.decline(*missing)
            for handed in models_trained_elsewhere(facts):
                self._compile_for_another_module(handed)
            return
        twice = double_backward_calls(facts)
        for model in models:
            self._compile(model, twice)

    def _compile(self, model, twice) -> None:
        """Compile `model` after the statement that places it, or say why not."""
        facts = self.facts
        anchor = model_built(facts, model)
        device = model_device(facts, model)
        if anchor is None or device is None or not visible_at(facts, device, anchor):
            self.decline(
                anchor or model.optimizer.node,
                (
                    f"`{model.name}` is built or moved in several places, in a loop, or after its "
                    "optimizer: there is no one statement after which to compile it"
                    if anchor is None
                    else (
                        f"`{model.name}` is not moved to a device with `.to(device)` or `.cuda()` "
                        "in this file"
                        if device is None
                        else f"`{code_of(device)}`, the device the model is moved to, is not "
                        "bound yet (or not visible) where it is built"
                    )
                ),
            )
            return
        reason = (
            _why_numerics_must_reproduce(facts)
            or self._why_compile_would_not_pay(model)
            or _why_compile_would_fail(facts, twice)
            or _why_model_code_would_fail(facts, model)
        )
        if reason is not None:
            self.decline(anchor, reason)
            return
        inserted = _compile_on_cuda(facts, model.name, device)
        # Where the placement also builds the DDP wrapper, compile the inner module first
        # (PyTorch's "Where to apply torch.compile?": DDP is not compiled well).
        side = "before" if places_while_wrapping(facts, anchor, model.name) else "after"
        message = f"`{model.name}` is trained in eager mode: every operator is a separate kernel"
        randomness = model_randomness(facts, model)
        if randomness is not None:
            what = "applies dropout" if randomness[0] == "dropout" else "draws random numbers"
            message += (
                f" (it {what}, {randomness[1]}: compiled kernels draw their own random "
                "numbers, so a seeded run draws others)"
            )
        unchecked = _unchecked_distributions(facts)
        self.report(
            anchor,
            Fix((InsertStatements(anchor, **{side: (inserted,)}),)),
            message=message + unchecked,
            safety=Safety.BEHAVIOR if randomness is not None or unchecked else None,
            fix_title=(
                f"Add `{model.name}.compile()` (on CUDA) before the statement that places it "
                "and wraps it in DistributedDataParallel"
                if side == "before"
                else f"Add `{model.name}.compile()` (on CUDA) after the model is placed on its "
                "device"
            ),
        )

    def _compile_for_another_module(self, handed) -> None:
        """Compile a model this script builds and places for the loop of another module, when
        neither that module nor any other the script imports makes compiling fail or not
        pay (the project index's settings)."""
        facts = self.facts
        device = placed_device(facts, handed)
        reason = (
            _why_numerics_must_reproduce(facts)
            or _why_not_compiled_elsewhere(facts, handed)
            or _why_compile_would_fail(facts, double_backward_calls(facts))
        )
        if reason is None and device is None:
            reason = (
                f"`{handed.name}` is built here and trained by {handed.loop}, but it is not "
                "moved to a device with `.to(device)` or `.cuda()` here before that loop runs"
            )
        if reason is not None:
            self.decline(handed.placed, reason)
            return
        inserted = _compile_on_cuda(facts, handed.name, device)
        unchecked = _unchecked_distributions(facts)
        self.report(
            handed.placed,
            Fix((InsertStatements(handed.placed, after=(inserted,)),)),
            message=f"`{handed.name}` is trained in eager mode (by {handed.loop}): every "
            "operator is a separate kernel" + unchecked,
            safety=Safety.BEHAVIOR if unchecked else None,
            fix_title=f"Add `{handed.name}.compile()` (on CUDA) after the model is placed on its "
            "device",
        )

    def _why_compile_would_not_pay(self, model) -> "str | None":
        """Dynamo graph-breaks around what it cannot trace, leaving most of the step eager;
        and compiling costs seconds that a single step never earns back."""
        counter = _call_counter(self.facts, model)
        if counter is not None:
            return (
                f"`{model.name}` counts its calls in an integer attribute (`{excerpt(counter)}`): "
                "Dynamo specialises on a module's integer attributes, so each call compiles "
                "again until the recompile limit (8), after which the forward runs eager "
                "(torch 2.13.0, measured): compiling would cost and gain nothing"
            )
        unused = class_without_forward(self.facts, model)
        if unused is not None:
            return (
                f"`{unused}` defines no `forward`: `{model.name}` runs through its other "
                "methods (and its submodules), which `Module.compile()` leaves eager, so "
                "nothing would be compiled"
            )
        wrapping = data_parallel_wrapping(self.facts, model)
        if wrapping is not None:
            return (
                f"`{model.name}` is wrapped in `nn.DataParallel` (`{excerpt(wrapping.node)}`), "
                "which replicates the module onto each GPU on every forward and runs the "
                "replicas in threads: PyTorch documents compiling with "
                "DistributedDataParallel, the supported path (OPT604), not with it"
            )
        method = model_run_only_through_methods(self.facts, model)
        if method is not None:
            return (
                f"`{model.name}` is never called itself, only through `{model.name}.{method}(...)` "
                "and other methods that call its `forward` or submodules directly: "
                "`Module.compile()` compiles `__call__` alone, so nothing would be compiled"
            )
        forward = model_run_through_forward(self.facts, model)
        if forward is not None:
            return (
                f"`{model.name}` runs through `{excerpt(forward)}`, which calls the method "
                "itself, past `Module.__call__`: `Module.compile()` compiles `__call__` alone, "
                "so nothing would be compiled (call the module, `model(x)`, to run it compiled)"
            )
        once = one_training_step(self.facts)
        if once is not None:
            return f"{once}: compiling costs seconds, far more than one step could save"
        recurrent = model_recurrent_layers(self.facts, model)
        elsewhere = imported_layer(self.facts, model, RECURRENT_LAYERS.__contains__)
        if recurrent or elsewhere is not None:
            shown = (
                f"`{excerpt(recurrent[0].node)}`"
                if recurrent
                else f"`{elsewhere[0]}` in {elsewhere[1].module}"
            )
            return (
                f"`{model.name}` has a recurrent layer ({shown}): Dynamo "
                "graph-breaks on RNN, GRU and LSTM modules (`torch._dynamo.config.allow_rnn` "
                "is False), so that layer stays eager and compiling the rest buys little"
            )
        own = torch_own_module(self.facts, model)
        if own is not None:
            return (
                f"`{model.name}` is a `{own}` of torch's own layers: `Module.compile()` compiles "
                "its `_call_impl`, and Dynamo skips the code of torch's own modules (its skip "
                "list), so nothing would be compiled (torch 2.13, measured; "
                "pytorch/pytorch#150915)"
            )
        sparse = model_sparse_calls(self.facts, model)
        if sparse:
            return (
                f"`{model.name}` or its training loop uses sparse tensors "
                f"(`{excerpt(sparse[0].node)}`): torch.compile does not support sparse "
                "Tensors and graph-breaks around them, so little is compiled"
            )
        return None


def _why_numerics_must_reproduce(facts) -> "str | None":
    """The script, or a module of the run it imports, asks for reproducible numerics, which
    OPT301, OPT302 and OPT401 respect too: Inductor picks among kernel configurations by
    timing them on the device, and its own configuration says that choice may change
    numerics (torch 2.13 `_inductor/config.py`, `deterministic`); it keeps to one only under
    `use_deterministic_algorithms` or TORCHINDUCTOR_DETERMINISTIC, so two seeded runs of a
    compiled model may differ where the eager ones agree."""
    requested = determinism_request(facts)
    if requested is not None:
        shown = f"the script asks for reproducible numerics (`{excerpt(requested)}`)"
    else:
        decider = imported_decider(facts, "determinism")
        if not decider:
            return None
        shown = f"{decider}, already asks for reproducible numerics"
    return (
        f"{shown}, even if only in some runs: Inductor picks its kernels' configurations by "
        "timing them on the device, which may change the numerics from run to run"
    )


def _compile_on_cuda(facts, name: str, device: cst.BaseExpression) -> cst.BaseStatement:
    """`model.compile()`, under `if <device type> == "cuda":` unless the device is CUDA."""
    device_type = device_type_code(facts, device)
    if device_type == '"cuda"':
        return cst.parse_statement(f"{name}.compile()\n")
    return cst.parse_statement(f'if {device_type} == "cuda":\n    {name}.compile()\n')


def _why_compile_would_fail(facts, twice) -> "str | None":
    engine = deepspeed_engine(facts)
    project = facts.project
    if engine is None and project is not None and project.imported.deepspeed:
        engine = f"in {project.decided_by('deepspeed')}, which this script imports"
    elif engine is not None:
        engine = f"`{engine}`"
    if engine is not None:
        return f"the script trains under DeepSpeed ({engine}), {_DEEPSPEED_WRAPS}"
    if twice:
        return (
            f"this file differentiates a gradient again (`{excerpt(twice[0].node)}`, a gradient "
            f"penalty or a Hessian), {_DOUBLE_BACKWARD_RAISES}"
        )
    helper = imported_second_derivative_call(facts)
    if helper is not None:
        call, function = helper
        return (
            f"`{excerpt(call.node)}` runs `{function.name}` of {function.module}, which "
            f"differentiates a gradient again (`{function.code}`, a gradient penalty or a "
            f"Hessian), {_DOUBLE_BACKWARD_RAISES}"
        )
    copier = next(
        (b for b in facts.imports.bindings if b.target.split(".")[0] in _FUNCTIONAL_COPIERS), None
    )
    if copier is not None:
        return (
            f"the script imports `{copier.target}`, whose functional copies of a module "
            "(`higher.innerloop_ctx`, learn2learn's `clone`) take over its `__dict__`, the "
            "compiled call included: the copy would run the original's parameters, not its "
            "own (measured with higher: a wrong meta-gradient, no error)"
        )
    return None


def _why_model_code_would_fail(facts, model) -> "str | None":
    """A class of the model from another module of the run that differentiates inside its
    methods (x-transformers' XLAutoregressiveWrapper runs test-time training in its forward,
    `torch.autograd.grad(..., create_graph=self.training)`): the loop's backward would then
    differentiate the compiled graph's backward again. (This file's own calls are read with
    their `create_graph`: double_backward_calls.) Or model code, here or there, that draws
    numpy random numbers (PyTorch-GAN's UNIT encoder)."""
    found = imported_layer(facts, model, SECOND_DERIVATIVE_CALLS.__contains__)
    if found is not None:
        call, imported = found
        return (
            f"`{model.name}` is built from `{imported.name}` of {imported.module}, whose methods "
            f"call `{call}`: it may differentiate a gradient again, {_DOUBLE_BACKWARD_RAISES}"
        )
    solver = _solver_in_model_code(facts, model)
    if solver is not None:
        return (
            f"`{model.name}` runs a differential-equation solver in its code ({solver}): "
            "Dynamo traces into the solver's loop over time, which Inductor cannot compile "
            "(torchdiffeq's `unique(return_counts=True)`: DynamicOutputShapeException on the "
            "first forward, torch 2.13.0) and whose custom autograd Functions AOTAutograd "
            "rejects"
        )
    drawn = model_code_call(facts, model, _numpy_random)
    if drawn is None:
        return None
    return (
        f"`{model.name}` draws numpy random numbers in its code ({drawn}): Dynamo traces them "
        "into float64 tensors, and a legacy typed constructor around them (PyTorch-GAN's "
        "`Tensor(np.random.normal(...))`) raises TorchRuntimeError on the first step"
    )


def _solver_in_model_code(facts, model) -> "str | None":
    """The solver call (analysis/solvers.py) the model's code makes, in this file or in its
    classes of other modules, as `` `odeint(...)` ``; None when none."""
    found = solver_in_model_code(facts, model)
    if found is not None:
        return f"`{excerpt(found[1].node, 40)}`"
    return model_code_call(facts, model, is_solver)


def _call_counter(facts, model) -> "cst.CSTNode | None":
    """`self.nfe += 1` in the `forward` of a class of this file the model is built from
    (torchdiffeq's ODE functions count their evaluations so). Other methods are not traced
    unless the forward calls them, and a forward that does not read the count is not
    guarded on it."""
    classes = model_classes(facts, model)
    for assignment in facts.records.assignments:
        function = assignment.site.function
        if (
            assignment.augmented
            and assignment.target.startswith("self.")
            and assignment.site.class_name in classes
            and isinstance(assignment.value, cst.Integer)
            and isinstance(function, cst.FunctionDef)
            and function.name.value == "forward"
        ):
            return assignment.statement_node
    return None


# Libraries whose functional copies of a module copy its `__dict__`.
_FUNCTIONAL_COPIERS = frozenset({"higher", "learn2learn"})


def _numpy_random(qualname: str) -> bool:
    return qualname.startswith("numpy.random.")


_DOUBLE_BACKWARD_RAISES = (
    "and torch.compile does not support double backward: the second backward through a "
    "compiled module raises a RuntimeError"
)


_DEEPSPEED_WRAPS = (
    "whose engine wraps the model: a module compiled before it breaks under ZeRO-3's "
    "partitioned parameters (pytorch/pytorch#115484); DeepSpeed compiles through "
    "`engine.compile()` or the `compile` section of its configuration"
)

# What in a module of the run stops the compile of a model trained in another module, and why.
_ELSEWHERE_HAZARDS = (
    ("deepspeed", "hands models to DeepSpeed, " + _DEEPSPEED_WRAPS),
    ("compiles", "already compiles (`torch.compile`, `.compile()` or TorchScript)"),
    (
        "differentiates_twice",
        "may differentiate a gradient again (a `create_graph` that is not literally False, "
        "a Hessian), and the second backward through a compiled module raises a RuntimeError",
    ),
    (
        "custom_autograd",
        "defines a custom `torch.autograd.Function`, whose backward Dynamo may not trace (it "
        "may call autograd itself, as gradient checkpointing does)",
    ),
    (
        "recurrent_layers",
        "builds recurrent layers, on which Dynamo graph-breaks: compiling the rest buys little",
    ),
    ("sparse_tensors", "uses sparse tensors, which torch.compile does not support"),
)


def _why_not_compiled_elsewhere(facts, handed) -> "str | None":
    """Why a model this script hands to the loop of another module is not compiled here:
    a module of the run it imports (the loop's among them) makes compiling fail or not pay,
    or the model is rebound after its placement by something other than a data-parallel
    wrapper."""
    project = facts.project
    if project is None or project.loops is None:
        return None
    for setting, why in _ELSEWHERE_HAZARDS:
        if getattr(project.imported, setting):
            where = project.decided_by(setting) or "a module this script imports"
            return f"`{handed.name}` is built here and trained by {handed.loop}; {where} {why}"
    rebound = rebound_after_placement(facts, handed)
    if rebound is not None:
        return (
            f"`{handed.name}` is bound again after it is placed (`{excerpt(rebound)}`): the "
            "model the loop trains may not be the one compiled"
        )
    return None


def _unchecked_distributions(facts) -> str:
    """Why compiling changes what the script does beyond its numbers: its `torch.distributions`
    objects, or those of the modules it imports, stop checking their arguments
    (analysis/distributions.py); "" when none would."""
    unchecked = unchecked_by_compiling(facts)
    if unchecked is None:
        return ""
    return (
        f" (compiling also turns off the argument checks of {unchecked}"
        " and every other distribution of the run: invalid arguments no longer raise)"
    )

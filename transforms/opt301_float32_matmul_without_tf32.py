"""OPT301: a float32 training script that leaves float32 matmuls at full FP32 precision."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt
from optimizer_codemod.analysis.devices import TRAINS_ON_THE_CPU, mentions_accelerator
from optimizer_codemod.analysis.matmuls import bare_tensor_training, convolution_only_training
from optimizer_codemod.analysis.precision import (
    determinism_request,
    entry_call,
    entry_points_elsewhere,
    first_backward,
    float32_precision_configured,
    float64_model,
    imported_by_others,
    imported_decider,
    loops_elsewhere,
    setting_placement,
    reduced_precision_use,
    setting_statement,
    trains_elsewhere_on_the_cpu,
)
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.analysis.training import one_training_step
from optimizer_codemod.rule import Example, Fix, ImportSpec, InsertStatements, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion


class Float32MatmulWithoutTF32(Rule):
    """
    What it does:
        Adds `torch.set_float32_matmul_precision("high")` after the top import block (and the
        configuration calls that sit in it, such as `matplotlib.use("Agg")` or
        `os.environ[...] = ...`) of a script that
        trains in plain float32 (no autocast, no GradScaler, no 16-bit model or dtype) and
        never chooses a float32 precision itself. The finding is reported on the script's
        first backward call: put `# noqa: OPT301` on that line to keep full FP32 matmuls.

    Why is it slow:
        Since PyTorch 1.12 float32 matrix multiplications (`nn.Linear`, `@`, `bmm`,
        attention projections) default to full FP32 precision, which on Ampere and later
        GPUs runs on the CUDA cores instead of the tensor cores. With precision "high", cuBLAS
        may use TF32 tensor cores: inputs rounded to a 10-bit mantissa, products accumulated
        in FP32, FP32 range kept. (Convolutions already use TF32 by default through
        `torch.backends.cudnn.allow_tf32`.)

    Example:
        ```python
        import torch
        from torch import nn

        model = nn.Linear(512, 512)
        ```
        becomes
        ```python
        import torch
        from torch import nn

        torch.set_float32_matmul_precision("high")

        model = nn.Linear(512, 512)
        ```

    Fix safety:
        `numerics`: on GPUs with TF32 tensor cores, matmul inputs lose 13 of their 23 mantissa
        bits. PyTorch's TF32 example (see Expected gain) measures a relative error of 0.0022
        against float64 with TF32, 0.000039 without.

        Never applied when the script asks for reproducible numerics
        (`torch.use_deterministic_algorithms(...)`, `cudnn.deterministic = ...`, unless the
        value is a literal False): TF32 is itself run-to-run deterministic, but such a script
        compares numbers across runs and machines, and a silent change of precision defeats
        that. Never applied when the script already sets a float32 precision or a TF32 flag
        (`set_float32_matmul_precision`, `allow_tf32`, `fp32_precision`, `backends.flags`),
        when it does not train (no backward call), or when it already computes in another
        precision (autocast, GradScaler, `.half()`/`.bfloat16()`, a 16-bit dtype, also among a
        dict's values or a conditional's branches,
        `mixed_precision=`, a 16/64-bit default dtype, NVIDIA Apex's `amp.initialize`, an
        autocast aliased or wrapped in `functools.partial`), or when its model computes in float64
        (`model.double()`, `model.to(torch.float64)`, layers built with
        `dtype=torch.float64`): TF32 concerns float32 matmuls only.

        A notebook is never taken for an importable module (nothing imports it).

        Not applied when every model the script trains is built of convolutions and layers
        that multiply no matrices (normalisation, pooling, padding, resampling, dropout,
        embeddings, element-wise activations; a DCGAN, Wav2Lip's SyncNet) and nothing else
        in the file multiplies matrices either: the line would change nothing, because
        cuDNN already runs float32 convolutions on TF32 tensor cores
        (`torch.backends.cudnn.conv.fp32_precision` is "tf32" before and after
        `set_float32_matmul_precision("high")`, torch 2.13; the convolution descriptor asks
        for FMA math only when TF32 is off, `ConvolutionDescriptor::set` in
        aten/src/ATen/cudnn/Descriptors.h). Anything the analysis cannot read keeps the fix:
        an `nn.Linear`, recurrent or attention layer, `@`, `torch.mm`, `x.bmm(y)`, `einsum`,
        `F.affine_grid` or spectral norm anywhere in the file; a model it does not follow
        whole (a torchvision or timm builder, `torch.load`, a base class from a library, a
        module handed to the constructor and called); a call of another module it cannot
        read (pytorch/examples' neural_style computes its style loss with
        `utils.gram_matrix`, a `bmm`); `cudnn.enabled = False`, which sends convolutions
        through im2col and cuBLAS (analysis/matmuls.py). Nor when the file trains no model
        but bare tensors it makes itself, with element-wise arithmetic alone (PyTorch's
        polynomial tutorial fits four scalars, `a + b * x + c * x ** 2 + d * x ** 3`), every
        call it makes being known (a model loaded whole and called, `model(x)`, keeps the
        fix).

        Reported without a fix when the file looks importable (no `__main__` guard, and no
        module-level statement that trains: a backward call, or a call of one of its own
        functions that reaches one), or is a test module (a `unittest.TestCase` class, or
        pytest and `test_*` functions: the runner imports it with the others, whatever its
        guard): the setting is process-wide and would change whoever imports the module.
        When the files are rewritten together (`apply` on a folder), the setting goes into
        the script that runs such a module's loop (`Trainer(...).run()`
        under its `__main__` guard, with `Trainer` from trainer.py), each script when several
        do, as for a loop of its own, and the module declines, naming them; the precision,
        determinism and float64 checks then cover the modules the script imports too, also
        where it runs its loop itself (PyTorch-YOLOv3's train.py calls `provide_determinism`
        of its utils.py, which sets `cudnn.deterministic = True`) (docs/projects.md).
        `--why-not` says, at the backward call (or the call that runs another module's loop),
        what already decides the precision: the statement
        (`cudnn.deterministic = True` in a seeded branch: "even if only in some runs"), or the
        imported module. A script that starts its training processes with
        `mp.spawn(main_worker, ...)` gets the setting after its imports, outside its
        `__main__` guard: each spawned child imports the script again and runs it there.
        Also reported without a fix when torch is not imported in the top
        import block (imported inside functions or after other code, which an added top-level
        import would run before). `import torch` is added when the block only has
        `from torch... import` lines.

        Not applied to a script (a `__main__` guard or module-level training) that never
        places a tensor or module on an accelerator nor names one: no `.cuda()`, no `.to(x)`
        or `device=x` with `x` possibly not the CPU, no import or call of a device API,
        launcher or trainer (`torch.cuda`, `torch.device`, `torch.distributed`, `accelerate`,
        `lightning`, `deepspeed`, `torch_xla`), no name that says device (`args.gpu`,
        `to_device(batch)`; analysis/devices.py `mentions_accelerator`), where a device the
        script pins to the CPU (`device = torch.device("cpu")`, jcjohnson/pytorch-examples)
        names none. Such a script trains
        on the CPU, where the setting changes nothing (below), so the edit would not pay
        (DESIGN §6); nor, with the files rewritten together, to a script whose loop runs in
        another module when neither places or names an accelerator (openai/spinningup's
        exercise scripts). An importable module is still reported as above: its callers may
        place it. Nor to a file that takes one training step (a backward in no loop: the usage demo
        under a package module's `__main__` guard, as in vit-pytorch's modules): one step
        gains nothing, and the setting at the top would reach every program importing it.

        On CPU nothing changes. Measured on a 2-core AMD EPYC x86_64 (avx512_bf16, no AMX),
        torch 2.13.0+cpu, 2026-11-21: the call emits no warning, and five SGD steps of a
        conv+linear model plus 1024x1024 matmul, bmm and linear give bit-identical results
        with and without it (precision "medium" does change them, so the check can see a
        difference). torch 2.13 also sets `torch.backends.mkldnn.matmul.fp32_precision` to
        "tf32" under "high"; PyTorch takes oneDNN's TF32 path for it only on x86 CPUs with
        AMX-FP16 (`use_mkldnn_tf32_matmul` in aten/src/ATen/native/mkldnn/Matmul.cpp), where
        CPU float32 matmul results may change in the same way.

        The rule writes `set_float32_matmul_precision`, not the per-backend
        `torch.backends.cuda.matmul.fp32_precision = "tf32"` of torch >= 2.9, and no rule
        rewrites `allow_tf32 = True` into it: with torch 2.13.0+cpu the old flag emits no
        warning, while after the new-style write alone `torch.get_float32_matmul_precision()`
        raises ("mix of the legacy and new APIs"), and torch's own Inductor still reads it
        for its autotuning cache keys (pytorch/pytorch issue #166387: `torch.compile` failing
        that way when only the new API is used). Checked in
        tests/test_issue16_compile_settings.py.

    Expected gain:
        GPU only, Ampere or later; none on CPUs without AMX-FP16 (bit-identical results, as
        measured above). NVIDIA lists 156 TFLOPS for TF32 tensor cores against 19.5 TFLOPS for
        FP32 on the A100 ("NVIDIA A100 Tensor Core GPU Architecture" whitepaper, 2020).
        PyTorch's documentation ("TensorFloat-32 (TF32) on Ampere (and later) devices", CUDA
        semantics notes) times a 10240x10240 float32 matmul on an A100 at 0.016 s with TF32
        against 0.11 s without: "~7x faster". A whole training step gains less, since only its
        matmul share speeds up.
    """

    code = "OPT301"
    name = "float32-matmul-without-tf32"
    message = "Float32 training with full-precision matmuls: TF32 tensor cores stay unused"
    fix_title = 'Add `torch.set_float32_matmul_precision("high")` after the imports'
    safety = Safety.NUMERICS
    min_torch = TorchVersion(1, 12)
    # "high" leaves CPU matmuls bit-identical (torch 2.13 CPU): a CPU target gains nothing.
    target_devices = ("cuda",)
    triggers = (BACKWARD_CALL,)
    process_wide = True
    examples = (
        Example(
            "import torch\n\nfor x in loader:\n    loss = model(x.cuda()).sum()\n"
            "    loss.backward()\n",
            'import torch\n\ntorch.set_float32_matmul_precision("high")\n\n'
            "for x in loader:\n    loss = model(x.cuda()).sum()\n    loss.backward()\n",
        ),
        Example("import torch\n\nloss = model(x).sum()\nloss.backward()\n"),
        Example(
            "import torch\n\nwith torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "    loss = model(x).sum()\nloss.backward()\n"
        ),
        Example(
            "import torch\n\ntorch.use_deterministic_algorithms(True)\n"
            "loss = model(x).sum()\nloss.backward()\n"
        ),
        Example("import torch\n\nmodel = torch.nn.Linear(8, 8)\n"),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        # A script whose training loop is in another module of the run (`Trainer(net,
        # ds).run()`): the setting goes here, as for a loop of its own (analysis/project.py).
        elsewhere = loops_elsewhere(facts)
        backward = first_backward(facts)
        anchor = backward or entry_call(facts)
        if anchor is None or float32_precision_configured(facts):
            return  # its own choice, or this rule's fix in an earlier pass
        reason = _why_precision_is_decided(facts)
        if reason is not None:
            self.decline(anchor.node, reason)
            return
        convolution = convolution_only_training(facts) if backward is not None else None
        if convolution is not None:
            self.decline(
                anchor.node,
                f"every model it trains is built of convolutions ({convolution}) and layers "
                "that multiply no matrices, and the file multiplies none: cuDNN already runs "
                "float32 convolutions on TF32 tensor cores (`torch.backends.cudnn.conv."
                'fp32_precision` is "tf32" by default), and the setting changes cuBLAS '
                "matmuls only",
            )
            return
        if elsewhere is None and not self.runs_as_script:
            scripts = entry_points_elsewhere(facts)
            if scripts:
                self.decline(
                    anchor.node,
                    "the setting is process-wide and this module is imported: it goes into "
                    f"{', '.join(scripts)}, the script that runs this loop",
                )
                return
            self.report(
                anchor.node,
                message="Float32 training in an importable module; set "
                '`torch.set_float32_matmul_precision("high")` in the script that runs it',
            )
            return
        on_the_cpu = trains_elsewhere_on_the_cpu(facts) if backward is None else None
        if on_the_cpu is not None:
            self.decline(anchor.node, f"{on_the_cpu}, where the setting changes nothing")
            return
        if backward is not None and not mentions_accelerator(facts):
            self.decline(
                backward.node,
                f"{TRAINS_ON_THE_CPU}, where the setting changes nothing",
            )
            return
        imported_by = imported_by_others(facts)
        if imported_by is not None:
            self.decline(anchor.node, imported_by)
            return
        once = one_training_step(facts) if elsewhere is None else None
        if once is not None:
            # A library module's usage demo (vit-pytorch's modules): a process-wide setting at
            # the top would reach every program that imports the module, for one step.
            self.decline(
                anchor.node,
                f"{once}: one step gains nothing from faster matmuls, and the setting at the top "
                "of the file would change the precision of every program that imports it",
            )
            return
        if backward is not None and bare_tensor_training(facts):
            self.decline(
                anchor.node,
                "it trains bare tensors with element-wise arithmetic alone (no model, no "
                "`@`, matmul or linear layer in the file): the setting changes cuBLAS matmuls "
                "only, and there are none",
            )
            return
        message = None
        if backward is None:
            message = (
                f"Float32 training (the loop in {', '.join(elsewhere.modules)}) with "
                "full-precision matmuls: TF32 tensor cores stay unused"
            )
        placement = setting_placement(facts)
        if placement is None:
            self.report(
                anchor.node,
                message="Float32 training with full-precision matmuls; torch is not imported "
                'in the top import block: add `torch.set_float32_matmul_precision("high")` '
                "after its import",
            )
            return
        statement = setting_statement(f'{placement.torch}.set_float32_matmul_precision("high")')
        imports = (ImportSpec("torch"),) if placement.needs_import else ()
        self.report(
            anchor.node,
            Fix((InsertStatements(placement.anchor, after=(statement,)),), imports),
            message=message,
        )


def _why_precision_is_decided(facts) -> "str | None":
    """Why the script's float32 matmul precision is not ours to change: it chose it, asks for
    reproducible numerics, computes in another precision, or so does a module of the run it
    imports (a seeded helper, the module whose loop it runs); else None."""
    requested = determinism_request(facts)
    if requested is not None:
        return (
            f"the script asks for reproducible numerics (`{excerpt(requested)}`), even if only "
            "in some runs: a change of matmul precision would defeat the comparison"
        )
    reduced = reduced_precision_use(facts)
    if reduced is not None:
        shown = "autocast" if reduced is facts.module else excerpt(reduced)
        return (
            f"the script already computes in another precision (`{shown}`), even if only in "
            "some runs: it chose its precision"
        )
    if float64_model(facts):
        return "the model computes in float64: TF32 concerns float32 matmuls only"
    for setting, words in (
        ("precision_configured", "sets a float32 matmul precision or a TF32 flag"),
        ("determinism", "asks for reproducible numerics"),
        (
            "reduced_precision",
            "computes in another precision (autocast, GradScaler, `.half()`"
            " or a 16-bit dtype), even if only in some runs",
        ),
        ("float64", "computes in float64"),
    ):
        decider = imported_decider(facts, setting)
        if decider:
            return f"{decider}, already {words}: it chose the precision"
    return None

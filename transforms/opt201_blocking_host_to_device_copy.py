"""OPT201: a pinned batch copied to the device with a blocking copy."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from optimizer_codemod.analysis.calls import code_of, with_keyword
from optimizer_codemod.analysis.loaders import module_name
from optimizer_codemod.analysis.transfers import blocking_batch_copies
from optimizer_codemod.rule import Example, Fix, ImportSpec, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

_LOADER = (
    "import torch\n"
    "from torch.utils.data import DataLoader\n"
    "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
    "loader = DataLoader(train_set, batch_size=64, pin_memory=True)\n"
)


class BlockingHostToDeviceCopy(Rule):
    """
    What it does:
        Adds `non_blocking=True` to `x.to(device)`, `x.to(device, dtype)`, `x.cuda()` and
        `x.type(T)` with `T` a legacy CUDA tensor type (`torch.cuda.FloatTensor`, or an alias
        `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`) when
        `x` is (part of) a batch from a DataLoader built with `pin_memory=True` (or
        `pin_memory=torch.cuda.is_available()`, which OPT101 adds, or set in an options dict
        filled under a condition: `if use_cuda: kwargs.update(pin_memory=True)`), inside a
        loop over the loader (training or evaluation) of a script that trains,
        and the device is CUDA or chosen at run time between CUDA and the CPU, or any device
        at all in a run that requires CUDA before the loop (`torch.cuda.set_device(...)`,
        `init_process_group("nccl")`, `assert torch.cuda.is_available()`). The loader is
        followed through `self.train_data` set from a parameter, a parameter every call
        binds to a loader, `enumerate`/`iter`, `tqdm` (also through a name,
        `batch_iterator = tqdm(loader)`), a helper that returns the DataLoader (alone, or in a
        tuple every `return` of it gives: `train_dl, val_dl, tokenizer = get_ds(config)`), and a
        generator of the file that only yields the items of a loop over its argument
        (`cycle(dl)`); batches drawn with `batch = next(it)` count as well, and so do those a
        method of a wrapper class of the file returns when each of its returns draws from
        an iterator of a DataLoader the class builds (makemore's InfiniteDataLoader:
        `return next(self.data_iter)`), the loader's options read from the `**kwargs` the
        class's one caller passes (`InfiniteDataLoader(ds, pin_memory=True)`); so are the
        batches of a loop over a parameter for which every call from the other modules of the
        run passes a pinned DataLoader (UNet's `evaluate(net, dataloader, device)`, which
        train.py calls with its pinned `val_loader`; a function the file never calls itself,
        decorated with nothing but a grad mode; also when that function hands the loader on
        to a function of its file that loops over it: engine.py's `train` passing its
        `train_dataloader` to `train_step`), and of a loop over a loader that a function of
        another module of the run builds and returns (`data_loader = get_loader(...)` from
        data_loader.py, alone or in a tuple). A copy that a module-level function of the file
        makes of its parameter, outside any loop of its own and before anything binds the
        parameter again, is fixed when such loops hand it a part of their batch (rasbt's
        `calc_loss_batch(input_batch, target_batch, model, device)` doing `input_batch, ... =
        input_batch.to(device), ...`): every call of the function, all in this file, must pass
        a part of a batch of a pinned DataLoader for that parameter, and no caller may write
        the batch in its loop. Where the device
        may also be MPS or another accelerator but always holds a `torch.device`
        (`torch.device(...)`, or `torch.accelerator.current_accelerator()` in a branch taken
        only when `torch.accelerator.is_available()`, as in pytorch/examples), the keyword
        added is `non_blocking=device.type == "cuda"`: asynchronous on CUDA, blocking
        elsewhere (the test ultralytics/ultralytics#22181 and huggingface/lerobot#702 use).
        Where it holds a device string or an index instead (`"cuda" if ... else "mps"`,
        `int(os.environ["LOCAL_RANK"])`, `config.device`), the keyword is
        `non_blocking=torch.device(device).type == "cuda"`, which reads it as `.to` does.
        Where a name holds a `torch.device` or None (`torch.accelerator.current_accelerator()`
        with no `is_available()` check first: None in a build of torch without an
        accelerator, where `.to(None)` leaves the tensor in place, as pytorch/examples'
        mnist_rnn runs with `--accel` on such a machine), it is
        `non_blocking=device is not None and device.type == "cuda"`.

    Why is it slow:
        A blocking copy makes the Python thread wait until the batch has reached the GPU, and
        the GPU has to finish all the work queued before it first: the host cannot run ahead
        and queue the next kernels, and with several tensors per batch each copy waits for the
        previous one. With a pinned source, `non_blocking=True` only queues the copy on the
        stream; kernels that use the result still run after it (PyTorch's "A guide on good
        usage of non_blocking and pin_memory()"; CUDA notes, "Use pinned memory buffers").

    Example:
        ```python
        for images, labels in loader:  # DataLoader(..., pin_memory=True)
            images = images.to(device)
            labels = labels.cuda()
        ```
        becomes
        ```python
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.cuda(non_blocking=True)
        ```

    Fix safety:
        `safe`: the same values arrive; only the host stops waiting. A host-to-CUDA copy is
        ordered before every later kernel on the stream, and a copy to the CPU returns the
        tensor itself. `Tensor.type(T, non_blocking=True)` is the same copy as
        `.to(device, dtype, non_blocking=True)` (with a dtype to convert to, the pinned batch
        is copied as it is and converted on the GPU). Where a loader is pinned only on the
        path that uses CUDA (options filled under `if use_cuda:`), the other path copies to
        the CPU, where the keyword does nothing; a non-blocking copy from pageable memory is
        correct anyway, only not faster. Only copies of tensors taken from the batch (by unpacking, indexing,
        `.items()`/`.values()`, including `{k: v.to(device) for k, v in batch.items()}`,
        `[t.to(device) for t in batch]` and `tuple(t.to(device) for t in batch)`), or of a
        view of one (`images.reshape(-1, 784).to(device)`, `flat = images.view(n, -1)`: a
        view shares the pinned memory; a reshape or conversion that must copy gives pageable
        memory, where the keyword is correct, only not faster), are changed. Never changed: device-to-host copies (`.cpu()`, `.to("cpu")`, or a copy from
        a name that may already hold a device tensor, since the host could read it before it
        lands; a batch name rebound only in the other branch of an `if`, as imagenet's
        `images = images.cuda(...)` / `else: images = images.to(device)`, still holds the
        batch), targets that may be MPS or another non-CUDA device (asynchronous copies there
        corrupt data, pytorch/pytorch#139550, #189690) unless the target always holds a
        `torch.device`, a device string or an index, whose type the added keyword tests
        (a name that may be None and is no `torch.device` otherwise may not: `torch.device(None)`
        raises). A value read from a configuration that names it a device (`config.device`,
        `args.device`, bound nowhere in the file) is taken for one by that name, as the
        script's own `.to(config.device)` takes it, dtype-only conversions, models and modules,
        tensors not from the batch, copies outside a loop over the loader (`next(iter(loader))`), loaders not pinned,
        copies that already choose `non_blocking` or pass `*args`/`**kwargs`, sources written
        in place in the loop (the write would race with the copy; a copy a loop over the
        batch's keys stores back under its key, `batch[key] = batch[key].to(device)`, writes
        the dict, not the tensor), and, with a custom `collate_fn`, copies of a whole batch or
        of a part the function is not known to build as a tensor (its class's `.to` may take
        no `non_blocking`): a collate function of the file, or of the module that builds the
        loader, whose every `return` gives a tuple tells which parts are tensors it builds
        (`torch.stack(images)`, `torch.zeros(n, longest).long()`).
        A device a function receives as a parameter is followed to what its callers pass, in
        the file and in the other modules of the run (train.py's `device = "cuda" if ...
        else "cpu"` handed to engine.py's `train(..., device)` and on to `train_step`).
        Reported, not fixed, when the device comes from where the analysis cannot see (a
        call's result, an argument not named a device), since it could be MPS; the report quotes a device that names
        the current accelerator (`torch.accelerator.current_accelerator()`, or an integer index,
        which torch takes as one of the current accelerator's devices). Fixed all the same where
        every run reaching the loop has first done what raises without CUDA:
        `torch.cuda.set_device(i)` with `i` never negative (a negative index does nothing),
        `init_process_group("nccl")` (NCCL is built only into CUDA builds of torch) or
        `assert torch.cuda.is_available()` (a run with `python -O` skips an assert: a script that
        asserts CUDA states that it runs nowhere else), at the top level of the loop's function
        before the loop, of a function called there (`ddp_setup()`), of the module, of
        `__init__` for the methods of its class (unless a class of the file derives from it or
        it from one), or before every call of the loop's function in the file (`main()` calls
        `ddp_setup()`, then `Trainer(...).train()`, which runs `_run_epoch`). Such a run has a
        CUDA build of torch, and no build of torch has both CUDA and MPS (MPS needs macOS 12.3,
        and CUDA 10.2 was the last CUDA release for macOS, per its release notes): every device
        it copies to is CUDA or the CPU. Not under an `if`, `try`, `with` (a context manager may
        swallow the error) or loop, not in a function the file does not call before the loop or
        also uses another way (`mp.spawn(main)`), not after the loop, and not with a backend
        chosen at run time (`"nccl" if cuda else "gloo"`).
        Copies of batches from a loader that Hugging Face Accelerate's
        `accelerator.prepare(...)` returned are declined: the prepared loader moves each batch
        to the device itself, and
        `Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))` makes that
        move asynchronous.

    Expected gain:
        Host time per step spent waiting for copies, largest with several tensors per batch
        and small, fast steps. In PyTorch's tutorial "A guide on good usage of non_blocking
        and pin_memory()" (https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html),
        copying 1000 pinned tensors with `non_blocking=True` and one synchronisation is faster
        than blocking copies; the gain depends on the hardware. Not measurable on a CPU-only
        machine, where both forms are the same no-op.
    """

    code = "OPT201"
    name = "blocking-host-to-device-copy"
    message = "Pinned batch copied to the device with a blocking copy"
    fix_title = "Add `non_blocking=True`"
    safety = Safety.SAFE
    min_torch = TorchVersion(1, 0)
    # A non-blocking copy only overlaps with an accelerator's work; on a CPU target it changes nothing.
    target_devices = ("cuda",)
    # A pinned torch DataLoader is necessary for a finding; it may be pinned by position.
    triggers = (r"\bDataLoader\b",)
    examples = (
        Example(
            _LOADER + "for x, y in loader:\n"
            "    x, y = x.to(device), y.to(device)\n"
            "    loss = model(x, y)\n"
            "    loss.backward()\n",
            _LOADER + "for x, y in loader:\n"
            "    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)\n"
            "    loss = model(x, y)\n"
            "    loss.backward()\n",
        ),
        Example(
            _LOADER + "Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else "
            "torch.FloatTensor\n"
            "for x, y in loader:\n"
            "    loss = model(x.type(Tensor), y.to(device))\n"
            "    loss.backward()\n",
            _LOADER + "Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else "
            "torch.FloatTensor\n"
            "for x, y in loader:\n"
            "    loss = model(x.type(Tensor, non_blocking=True), y.to(device, non_blocking=True))\n"
            "    loss.backward()\n",
        ),
        Example(
            _LOADER + "for x, y in loader:\n"
            "    loss = model(x.to(torch.float16), y)\n"
            "    loss.backward()\n"
        ),
        Example(
            _LOADER.replace(", pin_memory=True", "") + "for x, y in loader:\n"
            "    loss = model(x.to(device), y.to(device))\n"
            "    loss.backward()\n"
        ),
        Example(
            _LOADER.replace("'cuda' if", "'mps' if") + "for x, y in loader:\n"
            "    x = x.to(device)\n"
            "    loss = model(x, y)\n"
            "    loss.backward()\n",
            _LOADER.replace("'cuda' if", "'mps' if") + "for x, y in loader:\n"
            '    x = x.to(device, non_blocking=device.type == "cuda")\n'
            "    loss = model(x, y)\n"
            "    loss.backward()\n",
        ),
        Example(
            _LOADER.replace("torch.device('cuda' if", "('mps' if") + "for x, y in loader:\n"
            "    loss = model(x.to(device), y.to(device))\n"
            "    loss.backward()\n"
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        declined: list = []
        copies = blocking_batch_copies(
            self.facts, declined if self.context.options.why_not else None
        )
        for node, reason in declined:
            self.decline(node, reason)
        for copy in copies:
            call = copy.call.node
            source = code_of(call.func.value).strip()
            if copy.async_is_sound:
                fixed = with_keyword(call, "non_blocking", cst.Name("True"))
                why = (
                    f"; the device is chosen out of sight, but the run requires CUDA "
                    f"({copy.cuda_required}), so it is CUDA or the CPU, never MPS"
                    if copy.cuda_required
                    else ""
                )
                self.report(
                    call,
                    Fix((Replace(call, fixed),)),
                    message=f"`{source}` comes from a pinned DataLoader but is copied to the "
                    f"device with a blocking copy{why}",
                )
            elif copy.cuda_only is not None:
                torch_name = module_name(self.facts, "torch") if copy.spec_only else None
                if copy.spec_only and torch_name is None:
                    self.decline(call, "`torch` is not imported under a name the fix could use")
                    continue
                test = _is_cuda(copy.cuda_only, torch_name, copy.maybe_none)
                fixed = with_keyword(call, "non_blocking", test)
                imports = (
                    (ImportSpec("torch"),)
                    if copy.spec_only and not self.facts.imports.name_for_module("torch")
                    else ()
                )
                self.report(
                    call,
                    Fix((Replace(call, fixed),), imports),
                    fix_title=f"Add `non_blocking={code_of(test)}`",
                    message=f"`{source}` comes from a pinned DataLoader but is copied to the "
                    "device with a blocking copy; the device may be MPS, where asynchronous "
                    f"copies corrupt data, so the copy is asynchronous only when "
                    f"`{code_of(test)}`",
                )
            else:
                why = (
                    f"{copy.device_note}: add `non_blocking=True` only where it is CUDA"
                    if copy.device_note
                    else "the device is chosen where the analysis cannot see it: add "
                    "`non_blocking=True` if it is CUDA (never for MPS, where it corrupts data)"
                )
                self.report(
                    call,
                    message=f"`{source}` comes from a pinned DataLoader but is copied with a "
                    f"blocking copy; {why}",
                )


def _is_cuda(
    device: cst.BaseExpression, torch_name: Optional[str], maybe_none: bool = False
) -> cst.BaseExpression:
    """`device.type == "cuda"` for a device that always holds a `torch.device`,
    `torch.device(device).type == "cuda"` for a string or an index (torch_name given), and
    `device is not None and device.type == "cuda"` for a device that may be None."""
    if torch_name is not None:
        device = cst.Call(cst.parse_expression(f"{torch_name}.device"), [cst.Arg(device)])
    test = cst.Comparison(
        cst.Attribute(device, cst.Name("type")),
        [cst.ComparisonTarget(cst.Equal(), cst.SimpleString('"cuda"'))],
    )
    if not maybe_none:
        return test
    return cst.BooleanOperation(
        cst.Comparison(device, [cst.ComparisonTarget(cst.IsNot(), cst.Name("None"))]),
        cst.And(),
        test,
    )

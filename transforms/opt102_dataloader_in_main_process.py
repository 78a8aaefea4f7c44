"""OPT102: a DataLoader that prepares every item in the training process itself."""

from __future__ import annotations

from dataclasses import replace
from typing import Set

import libcst as cst

from optimizer_codemod.analysis.calls import code_of, excerpt, is_literal, with_keyword
from optimizer_codemod.analysis.devices import multithreaded_runtime
from optimizer_codemod.analysis.loaders import (
    DatasetKind,
    collate_places_on_accelerator,
    dataset_classes,
    dataset_kind,
    dataset_mutated,
    in_memory_dataset_class,
    ITERATED_WITHIN_ITS_LOOP,
    batches_read_at_most,
    iterated_once,
    iterated_within_its_own_loop,
    module_name,
    opens_handles_when_built,
    own_random_generator,
    by_options_dict,
    fixes_every_loader,
    hidden_options_reason,
    option,
    option_settings,
    option_values,
    options_unknown,
    outside_dataset,
    runs_only_under_main_guard,
    unguarded_callers,
    unpicklable_for_workers,
)
from optimizer_codemod.rule import Example, Fix, ImportSpec, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

# Why a loader whose items cost nothing to prepare gets no workers, by dataset kind.
# The batches `min(4, os.cpu_count())` workers request at once (DataLoader's prefetch_factor
# is 2): a loop that reads no more than these waits for worker start-up and gains nothing.
FEW_BATCHES = 8
_NO_WORK_FOR_WORKERS = {
    DatasetKind.TENSORS: "the dataset is a TensorDataset: items are slices of tensors in "
    "memory, and workers would only add inter-process copies",
    DatasetKind.ITERABLE: "the dataset is an IterableDataset: each worker would replay it "
    "unless it shards by worker id",
    DatasetKind.ON_DEVICE: "the dataset's tensors may live on the device, which worker "
    "processes cannot share",
    None: "collate_fn places batches on the device, which worker processes cannot do",
}


class DataloaderInMainProcess(Rule):
    """
    What it does:
        Adds `num_workers=min(4, os.cpu_count() or 1)` and `persistent_workers=True` to a
        `torch.utils.data.DataLoader` that loads in the main process (no `num_workers`, or
        `num_workers=0`, on every path: workers the script sets on some path only, as in
        `{"num_workers": 1} if use_accel else {}`, are its choice, and so is a name it binds
        to 0, `num_workers = 0` then `num_workers=num_workers`, left with a reason) over a
        dataset whose
        `__getitem__` does work per item: a map-style
        `Dataset` class defined in the script, or a `torchvision.datasets` dataset.

    Why is it slow:
        With `num_workers=0` every item is read, decoded and augmented by the training
        process between two steps, while the accelerator waits. Worker processes prepare the
        next batches in parallel with the training step (PyTorch's "Performance Tuning
        Guide", "Enable asynchronous data loading and augmentation"). `persistent_workers=True`
        keeps them alive between epochs instead of starting them again each epoch. Four
        workers (fewer on small machines) is a conservative default; tune it to the
        machine. `prefetch_factor` is not emitted: its default (2 batches per worker) already
        applies once `num_workers > 0`, a larger value only costs host memory unless item
        times vary widely, and naming it would tie the call to `num_workers > 0`.

    Example:
        ```python
        loader = DataLoader(ImageFiles(root), batch_size=64, shuffle=True)
        ```
        becomes
        ```python
        loader = DataLoader(
            ImageFiles(root), batch_size=64, shuffle=True,
            num_workers=min(4, os.cpu_count() or 1), persistent_workers=True,
        )
        ```

    Fix safety:
        `behavior`: workers draw random numbers from their own generators (seeded per worker),
        so random augmentations differ from a run without workers, and side effects of
        `__getitem__` (caching into the dataset, logging) happen in other processes; the
        `persistent_workers=True` it adds also moves the main process's random stream from
        the second epoch on (see OPT103). A loader iterated one time (the iterable of a `for`
        or comprehension itself, or a name read once, by its one loop, where the loader is
        built, with nothing repeating that loop) gets `num_workers` alone: persistent workers
        would outlive every use. Never in a script that runs JAX, Flax or TensorFlow,
        whose threads a forked worker would inherit (a deadlock risk JAX warns of at every
        fork). Applied
        only in a file with an `if __name__ == "__main__":` guard that keeps the loader or every
        loop over it from running on import (workers started with `spawn` or `forkserver`, the
        default on macOS, Windows and since Python 3.14 Linux, import the main module again);
        with the files rewritten together, also in a module without one whose classes and
        functions the other files of the run call only under their own guard
        (docs/projects.md); and never in a notebook, whose classes spawned workers cannot unpickle. Never for a
        `TensorDataset`, a dataset class of the file whose `__getitem__` only reads tensors it
        holds at the index (`self.x[i]`, as OPT104 derives it) or calls nothing but size and
        dtype reads and one draw of a window's start (`torch.randint(..., (1,))`,
        `random.randint(a, b)`) (diffusers'
        PromptDataset returns a prompt and the index; x-transformers' TextSamplerDataset slices
        its text at a random start, which in workers would also come from other generators;
        with the files rewritten
        together, the same holds for a class of another module of the run, as accelerate's
        RegressionDataset returning `{"x": self.x[i], "y": self.y[i]}`), or a dataset of device tensors
        (workers add only overhead, or would touch CUDA from a forked process), an `IterableDataset` (each worker would yield the
        whole stream unless it shards by worker), a `collate_fn` that moves batches to the
        device, a `collate_fn`, `worker_init_fn` or dataset class that workers started by
        spawn cannot unpickle (a lambda, or a function or class defined inside a function), a
        dataset that holds one (`ImageFolder(root, transform)` whose `transform` composes
        `transforms.Lambda(lambda x: x.mul(255))`: the names its construction reads are
        followed to their values), a dataset changed from outside after it is built (`dataset.set_epoch(...)`:
        persistent workers keep their own copy), or one whose `__init__` keeps an open file,
        HDF5, LMDB or database handle (forked workers would share its state and read garbage;
        open it lazily in `__getitem__`), or one that keeps its own random generator
        (`self.rng = random.Random(911)`, also NumPy's and torch's: PyTorch seeds the
        `random` module and NumPy's and torch's global generators in each worker, not an
        object the dataset holds, so every worker repeats the same draws). A dataset built
        from a list the script fills with device tensors (`xs.append(torch.tensor(...,
        device=device))`) counts as one of device tensors. Never for a loader that a loop
        over it iterates again or hands to a function that may (`evaluate(loader)` in the
        middle of an epoch; a helper the run shows only reading `len(loader)` does not count): with `persistent_workers=True` the second `iter(loader)` resets the one
        iterator the loader keeps, and the outer epoch ends early without an error
        (tests/test_persistent_worker_claims.py runs both on the installed torch). Options built in a dict (`loader_args = dict(...)` or
        `{...}`, assigned once and passed as `**loader_args`) are read like keywords; the fix
        goes into the dict when every loader built from it gets it, else onto the call.
        Reported, not fixed, when options arrive through `*args`/`**kwargs` the file does not
        show in full (a dict changed after it is built, or passed elsewhere too), or when the
        dataset or collate function is defined in another module the analysis cannot read (a
        dataset class of another module of the run is read from the project index's summary:
        its kind, and whether its `__init__` opens a handle). Left alone, too, a loader whose
        one loop leaves on a count after at most 8 batches (`if ii == 1: break`, the
        `__main__` demos of pytorch-deeplab-xception's datasets): four workers fetch 8 batches
        ahead, so they would start, and load more than the loop reads, for nothing.

    Expected gain:
        The data-loading time that workers move off the training loop, up to the number of
        idle cores; the Performance Tuning Guide gives the rationale ("the main training
        process has to wait for the data to be available"). Measured on CPU (2-core x86_64,
        torch 2.13.0+cpu, 2026-11-21) with `benchmarks/rule_gains/opt102.py`, one epoch of
        128 items of about 1.5 ms of work each: on an otherwise idle machine 192 ms in process
        against 112 ms with two workers (x1.71, `benchmarks/results/rule-gains-cpu.json`);
        with another job keeping one core busy, 195-283 ms against 208-291 ms (x0.86-0.98):
        with no idle core, workers only add their overhead. Their first epoch, which starts
        them, took 0.23-0.48 s. Expect a gain where cores are idle while the training step
        runs, above all with an accelerator doing that step.
    """

    code = "OPT102"
    name = "dataloader-in-main-process"
    message = "DataLoader prepares items in the training process"
    fix_title = "Add `num_workers=min(4, os.cpu_count() or 1)` and `persistent_workers=True`"
    safety = Safety.BEHAVIOR
    min_torch = TorchVersion(1, 7)
    # A construction is a call of the class, or of the alias an import gives it.
    triggers = (r"\bDataLoader\s*(?:\(|as\b)",)
    examples = (
        Example(
            "import torchvision\n"
            "from torch.utils.data import DataLoader\n"
            "\n"
            "def main():\n"
            "    data = torchvision.datasets.FakeData(transform=torchvision.transforms.ToTensor())\n"
            "    loader = DataLoader(data)\n"
            "\n"
            'if __name__ == "__main__":\n'
            "    main()\n",
            "import torchvision\n"
            "from torch.utils.data import DataLoader\n"
            "import os\n"
            "\n"
            "def main():\n"
            "    data = torchvision.datasets.FakeData(transform=torchvision.transforms.ToTensor())\n"
            "    loader = DataLoader(data, num_workers=min(4, os.cpu_count() or 1), persistent_workers=True)\n"
            "\n"
            'if __name__ == "__main__":\n'
            "    main()\n",
        ),
        Example(
            "import torch\n"
            "from torch.utils.data import DataLoader, TensorDataset\n"
            "\n"
            "def main():\n"
            "    loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=32)\n"
            "\n"
            'if __name__ == "__main__":\n'
            "    main()\n",
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        if self.in_notebook:
            for site in facts.dataloader_constructions():
                workers = option_settings(facts, site.node, "num_workers")
                if not workers or all(is_literal(value, 0) for value in workers):
                    self.decline(
                        site.node,
                        "a notebook: worker processes started with spawn (macOS, Windows, and "
                        "Linux from Python 3.14) cannot import what its cells define, and the "
                        "analysis does not prove the loader needs none of it; set "
                        "`num_workers` by hand if its dataset and transforms are all imported",
                    )
            return
        fixable = []
        once: Set[int] = set()  # loaders iterated one time: persistent workers outlive it
        for site in facts.dataloader_constructions():
            call = site.node
            # Chosen on some path counts (`{"num_workers": 1} if use_accel else {}`), as for
            # OPT101's pin_memory: the author decided where workers run.
            workers = option_values(facts, call, "num_workers")
            if workers and any(not is_literal(value, 0) for value in workers):
                settled = option_settings(facts, call, "num_workers")
                if settled and all(is_literal(value, 0) for value in settled):
                    self.decline(
                        call,
                        f"`num_workers` is `{code_of(workers[0])}`, which the script sets to 0: "
                        "a setting of the author's, left as chosen; with it, every item is "
                        "prepared in the training process, so raise it where it is set",
                    )
                continue
            runtime = multithreaded_runtime(facts)
            if runtime is not None:
                self.decline(
                    call,
                    f"the script runs `{runtime}`, which is multithreaded: forking worker "
                    "processes from it may deadlock (JAX warns at every `os.fork()`)",
                )
                continue
            kind = dataset_kind(facts, site)
            collate = collate_places_on_accelerator(facts, call)
            if kind not in (DatasetKind.PER_ITEM, DatasetKind.UNKNOWN) or collate is True:
                self.decline(call, _NO_WORK_FOR_WORKERS.get(kind, _NO_WORK_FOR_WORKERS[None]))
                continue
            in_memory = in_memory_dataset_class(facts, site)
            if in_memory is not None:
                self.decline(
                    call,
                    f"`{in_memory}.__getitem__` only reads what the dataset holds in memory "
                    "(values at the index, or a window at one random start; no loading, decoding "
                    "or transform): workers would only "
                    "add inter-process copies",
                )
                continue
            if not runs_only_under_main_guard(facts, site):
                unguarded = unguarded_callers(facts)
                self.decline(
                    call,
                    (
                        f"{', '.join(unguarded)} call into this module outside an "
                        '`if __name__ == "__main__":` guard: worker processes started with spawn '
                        "would run those calls again"
                        if unguarded and not facts.records.has_main_guard
                        else 'no `if __name__ == "__main__":` guard around the loop over this '
                        "loader: worker processes started with spawn would re-run the script"
                    ),
                )
                continue
            unpicklable = unpicklable_for_workers(facts, site)
            if unpicklable is not None:
                self.decline(call, unpicklable)
                continue
            if dataset_mutated(facts, site):
                self.decline(
                    call,
                    "the dataset is changed after it is built, and each worker would keep "
                    "its own unchanged copy",
                )
                continue
            outside = outside_dataset(facts, site)
            if (outside is not None and outside.handles) or any(
                opens_handles_when_built(facts, name) for name in dataset_classes(facts, site)
            ):
                self.decline(
                    call,
                    "the dataset opens a file handle in `__init__`, which forked workers "
                    "would share: open it lazily in `__getitem__` first",
                )
                continue
            generator = next(
                filter(
                    None, (own_random_generator(facts, n) for n in dataset_classes(facts, site))
                ),
                None,
            )
            if generator is not None:
                self.decline(
                    call,
                    f"the dataset keeps its own random generator (`{generator}`): each worker "
                    "would get a copy in the same state and draw the same numbers (PyTorch "
                    "seeds `random`, NumPy's and torch's generators per worker, not the "
                    "dataset's), so random picks would repeat",
                )
                continue
            nested = iterated_within_its_own_loop(facts, site)
            if nested is not None:
                self.decline(call, ITERATED_WITHIN_ITS_LOOP.format(excerpt(nested)))
                continue
            if options_unknown(facts, call):
                self.report(
                    call,
                    message="DataLoader options arrive through */** arguments, which may already "
                    "set `num_workers`; set `num_workers` and `persistent_workers` where they "
                    f"are built; {hidden_options_reason(facts, call)}",
                )
                continue
            if kind is DatasetKind.UNKNOWN or collate is None:
                what = "dataset" if kind is DatasetKind.UNKNOWN else "collate_fn"
                self.report(
                    call,
                    message=f"DataLoader may prepare items in the training process; its {what} "
                    "is not known to the analysis: if it does CPU work on host tensors, set "
                    "`num_workers` and `persistent_workers=True`",
                )
                continue
            batches = batches_read_at_most(facts, site)
            if batches is not None and batches <= FEW_BATCHES:
                self.decline(
                    call,
                    f"the loop over this loader stops after {batches} "
                    f"batch{'es' if batches > 1 else ''}: fewer than the workers would fetch "
                    "ahead (two each), so their start would not be earned back",
                )
                continue
            fixable.append(call)
            if iterated_once(facts, site):
                once.add(id(call))
        os_name = module_name(facts, "os")
        if os_name is None or facts.imports.is_bound("min"):
            for call in fixable:
                self.decline(call, "`os` or `min` is shadowed here, so the fix cannot name them")
            return
        count = cst.parse_expression(f"min(4, {os_name}.cpu_count() or 1)")
        imports = () if facts.imports.name_for_module("os") else (ImportSpec("os"),)
        plain, groups = by_options_dict(facts, fixable)
        for call in plain:
            persistent = id(call) not in once
            self.report(
                call,
                Fix((Replace(call, _with_workers(call, count, persistent)),), imports),
                fix_title=None if persistent else ONE_PASS_TITLE,
            )
        for found, calls in groups:
            if fixes_every_loader(found, calls) and not any(
                option(call, name) for call in calls for name in OPTIONS_SET
            ):
                fixed = replace(found, node=found.with_entry("num_workers", count))
                if "persistent_workers" not in found.entries:
                    fixed = replace(
                        fixed, node=fixed.with_entry("persistent_workers", cst.Name("True"))
                    )
                self.report(
                    calls[0],
                    Fix((Replace(found.node, fixed.node),), imports),
                    message="DataLoader prepares items in the training process: its options "
                    f"come from `{found.name}`",
                    fix_title=f"Add `num_workers` and `persistent_workers=True` to `{found.name}`",
                )
                continue
            for call in calls:  # `found` builds other loaders too: set the options here
                if "num_workers" in found.entries:
                    self.decline(
                        call,
                        f"`{found.name}` sets `num_workers` for other loaders too, which must "
                        "keep it: set it on this loader alone",
                    )
                    continue
                fixed = _with_workers(call, count)
                if "persistent_workers" in found.entries:
                    fixed = with_keyword(call, "num_workers", count)
                self.report(call, Fix((Replace(call, fixed),), imports))


# The options OPT102 sets.
OPTIONS_SET = ("num_workers", "persistent_workers")


# Workers of a loader iterated one time start once whatever `persistent_workers` says.
ONE_PASS_TITLE = (
    "Add `num_workers=min(4, os.cpu_count() or 1)` (iterated one time: workers start once)"
)


def _with_workers(call: cst.Call, count: cst.BaseExpression, persistent: bool = True) -> cst.Call:
    """`call` with `num_workers=count` (replacing a 0) and, unless told otherwise,
    `persistent_workers=True`."""
    workers = option(call, "num_workers")
    if workers is None:
        fixed = with_keyword(call, "num_workers", count)
    else:
        fixed = call.with_changes(
            args=[a.with_changes(value=count) if a is workers else a for a in call.args]
        )
    if persistent and option(call, "persistent_workers") is None:
        fixed = with_keyword(fixed, "persistent_workers", cst.Name("True"))
    return fixed

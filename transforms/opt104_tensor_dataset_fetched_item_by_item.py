"""OPT104: a DataLoader that fetches a TensorDataset one item at a time and collates it."""

from __future__ import annotations

from typing import List, Optional, Tuple, Union

import libcst as cst

from optimizer_codemod.analysis.batched_items import BatchedItems, batched_items
from optimizer_codemod.analysis.calls import (
    as_keyword,
    bare_line_break,
    code_of,
    is_literal,
    literal,
)
from optimizer_codemod.analysis.loaders import (
    PARAMETERS,
    TENSOR_DATASETS,
    legacy_tensor_dataset,
    dataset_call,
    dataset_classes,
    dataset_parameter,
    dataset_mutated,
    is_pure,
    loader_use_beyond_iteration,
    option,
    options_hidden,
)
from optimizer_codemod.analysis.imports import dotted_name
from optimizer_codemod.rule import Example, Fix, ImportSpec, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

DATA = "torch.utils.data"
# Where each sampler class may be imported from.
SAMPLER_MODULES = (DATA, f"{DATA}.sampler")
_NOT_LITERAL = object()


class TensorDatasetFetchedItemByItem(Rule):
    """
    What it does:
        Rewrites `DataLoader(ds, batch_size=B, shuffle=..., drop_last=...)` over a
        `TensorDataset` into `DataLoader(ds, batch_size=None,
        sampler=BatchSampler(RandomSampler(ds), B, drop_last=...))` (`SequentialSampler`
        without shuffling): the loader asks the dataset for a whole batch of indices at once.

        A dataset class of the script whose `__getitem__` only reads tensor attributes at the
        index (`self.images[index]`, a window `self.tokens[index : index + n + 1]`) and
        computes from them element by element gets the same loader change and a first branch
        in `__getitem__` for a list of indices, which computes the whole batch:
        `self.tokens[starts + torch.arange(n + 1)]` for a window (with `starts =
        torch.tensor(index)[:, None]` first),
        `x.reshape(len(index), -1)` for `x.flatten()`, `x[:, :-1]` for `x[:-1]`. An integer
        index still runs the original code.

    Why is it slow:
        With `batch_size=B` the loader calls `ds[i]` once per index, each call slicing every
        tensor of the dataset, and `default_collate` then stacks the B slices: B small
        indexing operations, B tuples and a stack per batch, all driven from Python. A
        `TensorDataset` indexed with a list of indices returns the whole batch at once (one
        gather per tensor). With `batch_size=None` and a `BatchSampler` as its sampler, the
        loader passes each list of indices to the dataset in a single call.
        pytorch/pytorch#181501 reports per-item fetching plus `default_collate` 3x to over
        100x slower than slicing the tensors. The same holds for tensors already on the
        device: their per-item views and the stack cost as much host time per item.

    Example:
        ```python
        loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, drop_last=True)
        ```
        becomes
        ```python
        loader = DataLoader(
            TensorDataset(x, y),
            batch_size=None,
            sampler=BatchSampler(RandomSampler(TensorDataset(x, y)), 64, drop_last=True),
        )
        ```

    Fix safety:
        `safe`: the batches are the same tensors, bit for bit, in the same order. DataLoader
        itself builds `BatchSampler(RandomSampler(ds, generator=g), B, drop_last)` from these
        options, so the rewritten loader draws the same index lists from the same random
        numbers (the global generator, or the loader's `generator=`, which is passed to the
        sampler and kept on the loader for the workers' base seed); `ds[list]` returns what
        `default_collate` stacks from `ds[i]`, and both loaders yield a list of tensors per
        batch. `tests/test_opt104_batched_loader.py` checks this with torch for shuffled and
        sequential loaders, `drop_last` on and off, a last partial batch, a `generator`,
        workers and `len(loader)`. Applied only to a dataset built by `TensorDataset(...)` in
        this file (not a subclass, `Subset` or `ConcatDataset`), with `shuffle` a literal,
        `batch_size`, `drop_last` and `generator` expressions free of side effects (the fix
        moves or repeats them), and no `sampler`, `batch_sampler` or `collate_fn`. Never
        applied when code reads the loader's `batch_size`, `sampler`, `batch_sampler` or
        `drop_last` (they change: `batch_size` becomes None), when the loader is handed to a
        call other than iteration or a function of this file that loops over it (Lightning,
        Accelerate and others rebuild loaders from those attributes), or when the dataset is
        changed after it is built. Reported, not fixed, when options arrive through
        `*args`/`**kwargs`.

        For a dataset class, the new branch computes what `default_collate` stacks from the
        items, derived statement by statement from `__getitem__`
        (`optimizer_codemod/analysis/batched_items.py`): a tensor attribute read at the
        index, or at a window `index + a : index + b` that `__len__` (`len(self.A) - X`)
        keeps inside the tensor (a slice past the end would come out shorter, a gather
        raises); slices and integers of such a value; `+ - * / // %` with a number; dtype
        conversions, copies and flattening. Nothing combines two per-item values (a batch
        dimension changes how they broadcast) or computes a transcendental function (a
        vectorised kernel may round differently). A value that may be a strided view gets
        `.contiguous()`, as the stack is. Only a list index takes the branch: the sampler's
        integers and every other use of `ds[i]` run the code as written. Applied only to a
        class deriving from `Dataset` alone, built only by calls in this file (its tensors
        followed to `torch` functions through its constructor's arguments), and with a
        dataset argument that is a name (a class's construction may draw random numbers, and
        the fix would repeat it). `tests/test_opt104_batched_loader.py` runs seven
        `__getitem__` shapes with torch and compares every batch (dtype, shape, strides,
        values); the sgld_mnist and char_transformer reference workloads get it.

    Expected gain:
        The per-item fetching and collation of every batch, which runs between two training
        steps. Measured on CPU (2-core AMD EPYC, torch 2.13.0+cpu, one thread, 2026-11-25)
        with `benchmarks/batched_loader.py`, one shuffled epoch in the main process, per
        item against batched: x1.7 to x7.8 over nine datasets
        (`benchmarks/results/batched-loader-cpu.md`): 66 us against 26 us per batch for
        sudoku_diffusion's CPU shape (batch 32 of 81 cells), 325 against 144 us for
        MNIST-shaped tensors (batch 100), 4.2 against 0.53 ms for a batch of 1024 rows of 32
        features. Dataset classes: 1125 against 176 us per batch for sgld_mnist's normalised,
        flattened images (batch 100, x6.4), 77 against 44 us for char_transformer's windows
        at its CPU size (batch 16, x1.7) and 1379 against 440 us at its GPU shape (batch 256
        of 257 tokens, x3.1). The larger the batch and the cheaper the step, the larger the
        share of the step this is: at sudoku_diffusion's CPU size it is 0.1 ms of a 140 ms
        step, too little for `optcodemod bench` to tell apart from noise, as at
        char_transformer's (x0.99 alone); at sgld_mnist's, `optcodemod bench --ablate`
        measures x1.08 for OPT104 alone on a 21 ms step
        (`benchmarks/results/opt104-classes-bench-cpu.md`).
    """

    code = "OPT104"
    name = "tensor-dataset-fetched-item-by-item"
    message = "DataLoader fetches a TensorDataset one item at a time and stacks the batch"
    fix_title = "Fetch whole batches: `batch_size=None, sampler=BatchSampler(...)`"
    safety = Safety.SAFE
    min_torch = TorchVersion(1, 6)  # RandomSampler's `generator`
    # A construction is a call of the class, or of the alias an import gives it.
    triggers = (r"\bDataLoader\s*(?:\(|as\b)",)
    examples = (
        Example(
            "import torch\n"
            "from torch.utils.data import DataLoader, TensorDataset\n"
            "\n"
            "data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))\n"
            "loader = DataLoader(data, batch_size=16, shuffle=True)\n"
            "for x, y in loader:\n"
            "    train_step(x, y)\n",
            "import torch\n"
            "from torch.utils.data import BatchSampler, RandomSampler, DataLoader, TensorDataset\n"
            "\n"
            "data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))\n"
            "loader = DataLoader(\n"
            "    data, batch_size=None, sampler=BatchSampler(RandomSampler(data), 16, drop_last=False)\n"
            ")\n"
            "for x, y in loader:\n"
            "    train_step(x, y)\n",
        ),
        Example(
            "import torch\n"
            "from torch.utils.data import DataLoader, TensorDataset\n"
            "data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))\n"
            "loader = DataLoader(data, batch_size=16, collate_fn=my_collate)\n"
            "for x, y in loader:\n"
            "    train_step(x, y)\n",
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        for site in self.facts.dataloader_constructions():
            call = site.node
            size = option(call, "batch_size")
            if size is not None and is_literal(size.value, None):
                continue  # no automatic batching: the sampler already yields what is fetched
            items = self._batched_class(site)
            if isinstance(items, str):
                self.decline(call, items)
                continue
            problem = self._problem(site, built_by_class=items is not None)
            if problem is not None:
                self.decline(call, problem)
                continue
            if options_hidden(call):
                what = "a TensorDataset" if items is None else f"a `{items.class_name}`"
                self.report(
                    call,
                    message=f"DataLoader fetches {what} item by item; its options "
                    "arrive through */** arguments: if they set no sampler or collate_fn, "
                    "use `batch_size=None, sampler=BatchSampler(...)`",
                )
                continue
            shuffle = option(call, "shuffle")
            shuffled = shuffle is not None and literal(shuffle.value) is True
            sampler = "RandomSampler" if shuffled else "SequentialSampler"
            names = [self._name_for(obj) for obj in ("BatchSampler", sampler)]
            taken = [obj for obj, found in zip(("BatchSampler", sampler), names) if found is None]
            if taken:
                self.decline(
                    call, f"`{taken[0]}` names something else here, so the fix cannot use it"
                )
                continue
            imports = tuple(spec for _, spec in names if spec is not None)
            fixed = _rewrite(call, names[0][0], names[1][0], shuffled)
            if items is None:
                self.report(call, Fix((Replace(call, fixed),), imports))
                continue
            # Every loader over the class carries the same edit of `__getitem__`: made once.
            edits = (Replace(call, fixed), Replace(items.getitem, items.replacement))
            self.report(
                call,
                Fix(edits, imports),
                message=f"DataLoader fetches `{items.class_name}` items one at a time and "
                "stacks the batch",
                fix_title=f"{self.fix_title}, and a branch of `{items.class_name}."
                "__getitem__` that fetches a list of indices at once",
            )

    def _batched_class(self, site) -> Union[None, str, BatchedItems]:
        """None for a `TensorDataset`; the batched `__getitem__` for a dataset class of this
        file that has one; else why the loader's batches cannot be fetched at once."""
        dataset = dataset_call(self.facts, site)
        if dataset is not None and self.facts.qualified_name(dataset.func) in TENSOR_DATASETS:
            if legacy_tensor_dataset(dataset):
                return (
                    "the TensorDataset is built with keywords (`data_tensor=`, "
                    "`target_tensor=`), the signature of torch before 0.4: the code was "
                    "written for a torch whose DataLoader has no `batch_size=None`"
                )
            return None
        local = dotted_name(dataset.func) if dataset is not None else None
        if local is None or self.facts.qualified_name(dataset.func) is not None:
            return _not_tensor_dataset(self.facts, site)
        if local not in self.facts.classes:
            return _not_tensor_dataset(self.facts, site)
        items = batched_items(self.facts, local)
        if isinstance(items, str):
            return (
                f"the dataset is a `{local}`, defined here, which cannot fetch a list of "
                f"indices at once: {items}"
            )
        return items

    def _problem(self, site, built_by_class: bool) -> Optional[str]:
        """Why this loader over a TensorDataset gets no fix; None when it may get one."""
        call = site.node
        for given in ("sampler", "batch_sampler", "collate_fn"):
            arg = option(call, given)
            if arg is not None and not is_literal(arg.value, None):
                return f"`{given}` is given: the loader's batches are not the default ones"
        size = option(call, "batch_size")
        if size is None or _always_one(self.facts, size.value):
            return "batches of one item: there is nothing to fetch at once"
        shuffle = option(call, "shuffle")
        flag = literal(shuffle.value, _NOT_LITERAL) if shuffle is not None else None
        if not (flag is True or flag is False or flag is None):
            return "`shuffle` is not a literal True or False: the sampler to use is unknown"
        dataset = option(call, "dataset")
        for arg in (size, option(call, "drop_last"), option(call, "generator")):
            if arg is not None and not is_pure(self.facts, arg.value):
                return (
                    f"`{code_of(arg.value)}` may have side effects, and the fix moves it "
                    "into the sampler"
                )
        if not self._repeatable(dataset.value, built_by_class):
            return "the dataset expression is built with calls, and the fix would repeat it"
        if dataset_mutated(self.facts, site):
            return "the dataset is changed after the loader is built"
        use = loader_use_beyond_iteration(self.facts, site)
        if use is not None:
            return f"{use}: batching by sampler changes the loader's `batch_size` and `sampler`"
        return None

    def _repeatable(self, node: cst.BaseExpression, built_by_class: bool) -> bool:
        """`node` may be evaluated twice: a name, or `TensorDataset(...)` of such values (not
        a class of the script, whose `__init__` may draw random numbers)."""
        if isinstance(node, cst.Call) and not built_by_class:
            return all(not a.star and is_pure(self.facts, a.value) for a in node.args)
        return is_pure(self.facts, node)

    def _name_for(self, obj: str) -> Optional[Tuple[str, Optional[ImportSpec]]]:
        """The local name of `torch.utils.data.<obj>`, with the import the fix must add when
        it is not imported yet; None when that name is taken by something else."""
        imports = self.facts.imports
        for module in SAMPLER_MODULES:
            bound = imports.name_for_module(f"{module}.{obj}")
            if bound is not None:
                return bound, None
        # The module under a name of its own (`import torch.utils.data as Data`): `Data.obj`.
        alias = imports.name_for_module(DATA)
        if alias is not None and alias != "torch":
            return f"{alias}.{obj}", None
        if imports.is_bound(obj):
            return None
        return obj, ImportSpec(DATA, obj)


def _not_tensor_dataset(facts, site) -> str:
    classes = dataset_classes(facts, site)
    if classes:
        what = (
            f"a `{classes[0]}`, defined here"
            if classes[0] in facts.classes
            else f"built by `{classes[0]}`, from another module of the run"
        )
        return (
            f"the dataset is {what}: its `__getitem__` is not known to return a whole batch "
            "for a list of indices, as a `TensorDataset`'s does"
        )
    unfollowed = dataset_parameter(facts, site)
    if unfollowed is not None:
        # `Trainer(model, ds)` in another module: its summary tells tensors, not the class.
        return (
            f"the dataset {unfollowed}: it is not known to be a plain `TensorDataset` (a "
            "subclass may need its items collated)"
        )
    return (
        "the dataset is not known to be a `TensorDataset` built in this file (a subclass, a "
        "`Subset` or `ConcatDataset`, or a dataset from elsewhere may need its items collated)"
    )


def _keep_comment(args: List[cst.Arg], removed: cst.Arg) -> None:
    """Move the comment after a removed argument (`shuffle=True,  # ...`) to the line of the
    argument before it, when that line has none."""
    comma = removed.comma
    if not isinstance(comma, cst.Comma) or not args:
        return
    after = comma.whitespace_after
    before = args[-1].comma
    if (
        isinstance(after, cst.ParenthesizedWhitespace)
        and after.first_line.comment is not None
        and isinstance(before, cst.Comma)
        and isinstance(before.whitespace_after, cst.ParenthesizedWhitespace)
        and before.whitespace_after.first_line.comment is None
    ):
        line = before.whitespace_after.with_changes(first_line=after.first_line)
        args[-1] = args[-1].with_changes(comma=before.with_changes(whitespace_after=line))


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        ),
    )


def _rewrite(call: cst.Call, batch: str, sampler: str, shuffled: bool) -> cst.Call:
    """`call` with `batch_size=None, sampler=<batch>(<sampler>(ds, ...), B, drop_last=...)`
    in place of `batch_size`, without `shuffle` and `drop_last`, and its other positional
    options passed by keyword (a keyword argument now precedes them)."""
    dataset = option(call, "dataset")
    size = option(call, "batch_size")
    drop_last = option(call, "drop_last")
    generator = option(call, "generator")
    shuffle = option(call, "shuffle")
    # `shuffle`, `drop_last` and the samplers (None: _problem checks) go into the new sampler.
    removed = [
        arg
        for arg in (shuffle, drop_last, option(call, "sampler"), option(call, "batch_sampler"))
        if arg is not None
    ]
    assert dataset is not None and size is not None
    inner_args = [cst.Arg(dataset.value.deep_clone())]
    if shuffled and generator is not None:
        inner_args.append(_keyword("generator", generator.value.deep_clone()))
    drop = drop_last.value.deep_clone() if drop_last is not None else cst.Name("False")
    value = cst.Call(
        func=cst.parse_expression(batch),
        args=[
            cst.Arg(cst.Call(func=cst.parse_expression(sampler), args=inner_args)),
            cst.Arg(size.value.deep_clone()),
            _keyword("drop_last", drop),
        ],
    )
    positional = 0
    args: List[cst.Arg] = []
    for arg in call.args:
        original = arg
        if arg.keyword is None and not arg.star:
            if positional:
                arg = as_keyword(arg, PARAMETERS[positional])
            positional += 1
        if original is size:
            comma = arg.comma
            # The comment ending `batch_size`'s line stays there; the sampler's line gets the
            # one of a removed `shuffle` (below), not a copy of it.
            sampler_comma = (
                comma.with_changes(whitespace_after=bare_line_break(comma.whitespace_after))
                if isinstance(comma, cst.Comma)
                else comma
            )
            sampler_arg = _keyword("sampler", value).with_changes(
                comma=sampler_comma, whitespace_after_arg=arg.whitespace_after_arg
            )
            arg = arg.with_changes(
                value=cst.Name("None"),
                comma=(
                    comma
                    if isinstance(comma, cst.Comma)
                    else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                ),
                whitespace_after_arg=cst.SimpleWhitespace(""),
            )
            args.extend((arg, sampler_arg))
            continue
        if any(original is r for r in removed):
            _keep_comment(args, arg)
            continue
        args.append(arg)
    last = call.args[-1]
    if any(last is r for r in removed):  # the new last argument keeps the layout of `)`
        args[-1] = args[-1].with_changes(
            comma=last.comma, whitespace_after_arg=last.whitespace_after_arg
        )
    fixed = call.with_changes(args=args)
    return fixed


def _always_one(facts, node: cst.BaseExpression) -> bool:
    """`1`, or a name every assignment binds to 1 (d2l's `batch_size, num_epochs, lr = 1,
    100, 0.003`)."""
    if is_literal(node, 1):
        return True
    if not isinstance(node, cst.Name):
        return False
    values = [a.value for a in facts.assignments_to(node.value)]
    return bool(values) and all(is_literal(value, 1) for value in values)

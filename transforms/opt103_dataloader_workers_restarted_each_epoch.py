"""OPT103: a DataLoader with worker processes that are started again for every epoch."""

from __future__ import annotations

import libcst as cst

from optimizer_codemod.analysis.calls import literal, with_keyword
from optimizer_codemod.analysis.loaders import (
    by_options_dict,
    dataset_mutated,
    fixes_every_loader,
    hidden_options_reason,
    is_pure,
    iterated_repeatedly,
    option,
    option_value,
    options_unknown,
    repetition_unknown,
)
from optimizer_codemod.rule import Example, Fix, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

NOT_LITERAL = object()
# Expressions that bind more loosely than `>` and need parentheses as its left operand.
LOOSER_THAN_COMPARISON = (
    cst.IfExp,
    cst.Lambda,
    cst.BooleanOperation,
    cst.Comparison,
    cst.NamedExpr,
)


class DataloaderWorkersRestartedEachEpoch(Rule):
    """
    What it does:
        Adds `persistent_workers=True` to a `torch.utils.data.DataLoader` with worker
        processes (`num_workers` > 0) that is iterated once per epoch; when `num_workers` is
        an expression, adds `persistent_workers=<that expression> > 0` instead, because
        `persistent_workers=True` raises a ValueError with `num_workers=0`. A loader counts as
        iterated once per epoch also when it is handed, from inside the epoch loop, to a
        function that loops over it: a function or method of the same file
        (`self._run_epoch(epoch, self.train_loader)` in a `Trainer`), or one of another module
        of the run (`train_one_epoch(model, data_loader_train, ...)` from engine.py), also
        through a generator that loops over it (`metric_logger.log_every(data_loader, 10)`).

    Why is it slow:
        Without `persistent_workers`, every `for batch in loader` starts `num_workers` new
        processes, each of which receives a copy of the dataset (pickled under `spawn`) and
        runs its imports and `worker_init_fn`, then shuts them down at the end of the epoch.
        The first batches of every epoch wait for that start-up. With persistent workers
        the processes and their state survive from one epoch to the next (DataLoader
        documentation, `persistent_workers`).

    Example:
        ```python
        loader = DataLoader(train_set, batch_size=64, num_workers=args.workers)
        for epoch in range(epochs):
            for x, y in loader:
                ...
        ```
        becomes
        ```python
        loader = DataLoader(
            train_set, batch_size=64, num_workers=args.workers,
            persistent_workers=args.workers > 0,
        )
        ```

    Fix safety:
        `behavior`: workers keep their random generators across epochs instead of being reseeded
        at the start of each, so random augmentations differ from the original run, and
        `worker_init_fn` runs once instead of once per epoch. Never applied when the loader is
        built again for each epoch, when the dataset is changed from outside after it is built
        (`dataset.set_epoch(...)`, assigning its attributes, also `loader.dataset.x = ...` in
        a function the loader is handed to: persistent workers would keep a stale copy), or
        when `persistent_workers` is already chosen. `loader.sampler.set_epoch(epoch)` is fine:
        the sampler runs in the main process, which draws a fresh iterator from it at every
        epoch (torch/utils/data/dataloader.py, `_BaseDataLoaderIter._reset`). A loader handed
        inside the epoch loop to a function that is not in the files of the run (or through
        `*args`) is left alone with a reason naming that function. Options built in a dict
        (`loader_args = dict(...)` or `{...}`, assigned once and passed as `**loader_args`) are
        read like keywords; the fix goes into the dict when every loader built from it gets it,
        else onto the call (`persistent_workers=loader_args["num_workers"] > 0`). Reported, not
        fixed, when options arrive through `*args`/`**kwargs` the file does not show in full
        (they may carry `persistent_workers`) or when `num_workers` is computed by a call that
        might not return the same value twice. A loader in the fallback branch of a feature
        check (the `else` of a version comparison for `persistent_workers`, an `except
        TypeError` handler) is left alone (analysis/guards.py).

    Expected gain:
        The start-up time of the workers, once per epoch after the first. Measured on CPU
        (2-core x86_64, torch 2.13.0+cpu, Python 3.11, 2026-11-21) with
        `benchmarks/rule_gains/opt103.py`, a short epoch of 32 items (about 1.5 ms each)
        through two workers, over seven runs on a machine shared with other jobs: with
        `fork` (Linux), 77-132 ms restarting the workers against 34-64 ms with persistent
        ones (x2.0-2.3); with `spawn` (macOS, Windows), whose workers import torch again,
        1.4-3.1 s against 0.03-0.06 s. Large datasets to pickle and slow `worker_init_fn`s
        add to the start-up; the relative gain shrinks as epochs get longer.
    """

    code = "OPT103"
    name = "dataloader-workers-restarted-each-epoch"
    message = "DataLoader workers are started again for every epoch"
    fix_title = "Add `persistent_workers=True`"
    safety = Safety.BEHAVIOR
    min_torch = TorchVersion(1, 7)
    # A construction is a call of the class, or of the alias an import gives it.
    triggers = (r"\bDataLoader\s*(?:\(|as\b)",)
    examples = (
        Example(
            "from torch.utils.data import DataLoader\n"
            "loader = DataLoader(train_set, batch_size=64, num_workers=4)\n"
            "for epoch in range(10):\n"
            "    for batch in loader:\n"
            "        train_step(batch)\n",
            "from torch.utils.data import DataLoader\n"
            "loader = DataLoader(train_set, batch_size=64, num_workers=4, persistent_workers=True)\n"
            "for epoch in range(10):\n"
            "    for batch in loader:\n"
            "        train_step(batch)\n",
        ),
        Example(
            "from torch.utils.data import DataLoader\n"
            "loader = DataLoader(train_set, num_workers=args.workers)\n"
            "for epoch in range(10):\n"
            "    for batch in loader:\n"
            "        train_step(batch)\n",
            "from torch.utils.data import DataLoader\n"
            "loader = DataLoader(train_set, num_workers=args.workers, persistent_workers=args.workers > 0)\n"
            "for epoch in range(10):\n"
            "    for batch in loader:\n"
            "        train_step(batch)\n",
        ),
        Example(
            "from torch.utils.data import DataLoader\n"
            "for epoch in range(10):\n"
            "    loader = DataLoader(train_set, batch_size=64, num_workers=4)\n"
            "    for batch in loader:\n"
            "        train_step(batch)\n",
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        fixable = []
        for site in facts.dataloader_constructions():
            call = site.node
            workers = option_value(facts, call, "num_workers")
            if option_value(facts, call, "persistent_workers") is not None:
                continue
            if workers is None:
                if options_unknown(facts, call) and iterated_repeatedly(facts, site):
                    self.decline(
                        call,
                        "whether this loader has worker processes is unknown: "
                        + hidden_options_reason(facts, call),
                    )
                continue
            count = literal(workers, NOT_LITERAL)
            if count is not NOT_LITERAL and not (type(count) is int and count > 0):
                continue  # 0 (no workers), or a literal DataLoader would reject anyway
            if not iterated_repeatedly(facts, site):
                unknown = repetition_unknown(facts, site)
                self.decline(
                    call,
                    (
                        f"whether the loader is iterated once per epoch is unknown: {unknown}"
                        if unknown
                        else "the loader is not iterated again and again (once per epoch), so its "
                        "workers start only once"
                    ),
                )
                continue
            if dataset_mutated(facts, site):
                self.decline(
                    call,
                    "the dataset is changed after it is built; persistent workers would "
                    "never see the change",
                )
                continue
            if options_unknown(facts, call):
                self.report(
                    call,
                    message="DataLoader options arrive through */** arguments, which may already "
                    "set `persistent_workers`; add it where they are built; "
                    f"{hidden_options_reason(facts, call)}",
                )
                continue
            if count is NOT_LITERAL and not is_pure(facts, workers):
                self.report(
                    call,
                    message="DataLoader workers are started again for every epoch; "
                    "`num_workers` is computed by a call: store it in a variable and add "
                    "`persistent_workers=<variable> > 0`",
                )
                continue
            fixable.append(call)
        plain, groups = by_options_dict(facts, fixable)
        for call in plain:
            self._fix_call(call, option(call, "num_workers").value)
        for found, calls in groups:
            if fixes_every_loader(found, calls) and all(
                option(call, "num_workers") is None for call in calls
            ):
                value = _persistent(found.entries["num_workers"])
                self.report(
                    calls[0],
                    Fix((Replace(found.node, found.with_entry("persistent_workers", value)),)),
                    message="DataLoader workers are started again for every epoch: its options "
                    f"come from `{found.name}`",
                    fix_title=f"Add `persistent_workers` to `{found.name}`",
                )
                continue
            for call in calls:  # `found` builds other loaders too: set the option here
                own = option(call, "num_workers")
                if own is not None:
                    self._fix_call(call, own.value)
                elif literal(found.entries["num_workers"], NOT_LITERAL) is not NOT_LITERAL:
                    self._fix_call(call, found.entries["num_workers"])
                else:
                    read = cst.parse_expression(f'{found.name}["num_workers"]')
                    self._fix_call(call, read)

    def _fix_call(self, call: cst.Call, workers: cst.BaseExpression) -> None:
        literal_count = literal(workers, NOT_LITERAL) is not NOT_LITERAL
        fixed = with_keyword(call, "persistent_workers", _persistent(workers))
        title = None if literal_count else "Add `persistent_workers=<num_workers> > 0`"
        self.report(call, Fix((Replace(call, fixed),)), fix_title=title)


def _persistent(workers: cst.BaseExpression) -> cst.BaseExpression:
    """`True` for a literal worker count (above 0), else `<workers> > 0`."""
    if literal(workers, NOT_LITERAL) is not NOT_LITERAL:
        return cst.Name("True")
    left = workers.deep_clone()
    if isinstance(left, LOOSER_THAN_COMPARISON) and not left.lpar:
        left = left.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Comparison(
        left=left,
        comparisons=[cst.ComparisonTarget(operator=cst.GreaterThan(), comparator=cst.Integer("0"))],
    )

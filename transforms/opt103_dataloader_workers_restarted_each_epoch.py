"""OPT103: a DataLoader with worker processes that are started again for every epoch."""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt, is_literal, literal, with_keyword
from optimizer_codemod.analysis.loaders import (
    by_options_dict,
    dataset_mutated,
    fixes_every_loader,
    hidden_options_reason,
    is_pure,
    ITERATED_WITHIN_ITS_LOOP,
    iterated_repeatedly,
    iterated_within_its_own_loop,
    OptionsDict,
    option,
    option_sources,
    option_settings,
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
        Also when the epoch loop iterates the copy Accelerate makes of it (`model, loader =
        accelerator.prepare(model, loader)`, prepared once): `prepare` builds a new
        DataLoader with every argument of the original, `persistent_workers` among them
        (`prepare_data_loader` in accelerate's data_loader.py, read at commit 16cb6eb).
        And when a helper returns it, alone or in a tuple, and the caller loops over it inside
        its epoch loop without calling the helper again: a helper of the same file (`loader =
        get_loader(...)` before the loop), or of another module of the run (data_loader.py's
        `get_loader`, which the project index tells what its callers do with the loader, also
        when the caller hands it to a function of its file that loops over it every epoch;
        a caller that reads the loader's `.dataset` may change it, and keeps it declined).
        The dataset counts as changed only through the builder's own variable: a method's
        local of the same name (`coco = self.coco` in `__getitem__`) is another object.

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
        `worker_init_fn` runs once instead of once per epoch. The main process's random
        stream moves too: every new iterator of a loader draws its workers' base seed from
        the loader's `generator` (torch's global CPU generator when none is given), and a
        persistent loader makes its iterator once, so from the second epoch on the global
        generator is one draw behind the original at each epoch, and the shuffle order of a
        `RandomSampler` without its own generator, with every later global draw (CPU dropout,
        `torch.rand`), differs (measured with torch 2.13; a `DistributedSampler` seeded by
        `set_epoch` or a loader given `generator=` keeps its order). Never applied when the
        loader is built again for each epoch, when the dataset is changed from outside after
        it is built (`dataset.set_epoch(...)`, assigning its attributes, also
        `loader.dataset.x = ...` in a function the loader is handed to: persistent workers
        would keep a stale copy; a change earlier in the function that builds the loader,
        outside any loop, is seen by every worker and does not count), when a loop over
        the loader iterates it again or hands it to a function that may (`evaluate(loader)`
        mid-epoch; one the run shows only reading `len(loader)` does not count:
        the second `iter(loader)` would reset the one iterator a persistent loader keeps and
        end the epoch early, silently), when each call of the function that iterates it
        gets a new loader from the function building it (Hugging Face's `evaluate()` calls
        `get_eval_dataloader()`), or when `persistent_workers` is already chosen. A copy prepared by Accelerate counts only
        when it is iterated and nothing else (`loader.set_epoch(epoch)` on it hands the
        epoch to the dataset in the main process, which persistent workers would not see),
        and only when it is prepared once, outside the epoch loop.
        `loader.sampler.set_epoch(epoch)` is fine: the sampler runs in the main process,
        which draws a fresh iterator from it at every epoch (torch/utils/data/dataloader.py,
        `_BaseDataLoaderIter._reset`). A loader handed inside the epoch loop to a function
        that is not in the files of the run (or through `*args`) is left alone with a reason
        naming that function. Options built in a dict (`loader_args = dict(...)` or `{...}`,
        assigned once and passed as `**loader_args`) are read like keywords; the fix goes
        into the dict when every loader built from it gets it, else onto the call
        (`persistent_workers=loader_args["num_workers"] > 0`). A dict chosen by a condition
        (`kwargs = {"num_workers": 1} if use_cuda else {}`) gets the entry only in the
        branches that start workers, never in `{}`; a dict filled by `.update(...)` (`if
        use_accel: train_kwargs.update(accel_kwargs)`) gets it in the one dict that holds
        `num_workers`, once for every loader that dict reaches. Left alone, with the reason,
        when two merged dicts both set `num_workers`, when a loader sharing the dict gets no
        fix (iterated only once, say), or when the merged dict is changed otherwise or
        merged into more than loader options. Reported, not fixed, when options arrive
        through `*args`/`**kwargs` the file does not show in full (they may carry
        `persistent_workers`) or when `num_workers` is computed by a call that might not
        return the same value twice. A loader in the fallback branch of a feature check (the
        `else` of a version comparison for `persistent_workers`, an `except TypeError`
        handler) is left alone (analysis/guards.py).

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
            'kwargs = {"num_workers": 1} if use_cuda else {}\n'
            "loader = DataLoader(train_set, **kwargs)\n"
            "for epoch in range(10):\n"
            "    for batch in loader:\n"
            "        train_step(batch)\n",
            "from torch.utils.data import DataLoader\n"
            'kwargs = {"num_workers": 1, "persistent_workers": True} if use_cuda else {}\n'
            "loader = DataLoader(train_set, **kwargs)\n"
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
        # Dicts chosen by a condition or merged by `.update`: per dict that holds `num_workers`.
        sourced: Dict[int, Tuple[OptionsDict, List[cst.Call]]] = {}
        for site in facts.dataloader_constructions():
            call = site.node
            workers = option_value(facts, call, "num_workers")
            if option_value(facts, call, "persistent_workers") is not None:
                continue
            if workers is None and options_unknown(facts, call):
                holders = self._worker_holders(site)
                if (
                    holders
                    and self._repeated_and_unchanged(site)
                    and self._holders_fixable(call, holders)
                ):
                    for holder in holders:
                        if "num_workers" not in holder.entries:
                            continue
                        sourced.setdefault(id(holder.node), (holder, []))[1].append(call)
                continue
            if workers is None:
                continue
            count = literal(workers, NOT_LITERAL)
            if count is not NOT_LITERAL and not (type(count) is int and count > 0):
                continue  # 0 (no workers), or a literal DataLoader would reject anyway
            settled = option_settings(facts, call, "num_workers")
            if settled and all(is_literal(value, 0) for value in settled):
                continue  # a name the script binds to 0 only: no workers to restart
            if not self._repeated_and_unchanged(site):
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
                self._report_impure(call)
                continue
            fixable.append(call)
        for holder, calls in sourced.values():
            self._fix_source(holder, calls)
        plain, groups = by_options_dict(facts, fixable)
        for call in plain:
            self._fix_call(call, option(call, "num_workers").value)
        for found, calls in groups:
            if fixes_every_loader(found, calls) and all(
                option(call, "num_workers") is None for call in calls
            ):
                for call in calls:
                    self._fix_dict(found, call)
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

    def _repeated_and_unchanged(self, site) -> bool:
        """The loader is iterated once per epoch and its dataset is not changed meanwhile;
        else it is declined with the reason."""
        facts, call = self.facts, site.node
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
            return False
        if dataset_mutated(facts, site):
            self.decline(
                call,
                "the dataset is changed after it is built; persistent workers would "
                "never see the change",
            )
            return False
        nested = iterated_within_its_own_loop(facts, site)
        if nested is not None:
            self.decline(call, ITERATED_WITHIN_ITS_LOOP.format(excerpt(nested)))
            return False
        return True

    def _worker_holders(self, site) -> List[OptionsDict]:
        """The dicts among those the loader's options come from (option_sources) that start
        workers, each to get `persistent_workers`; [] when there is nothing to fix (no worker
        on any path, `persistent_workers` already chosen), or declined or reported."""
        facts, call = self.facts, site.node
        sources = option_sources(facts, call)
        if sources is None:
            if iterated_repeatedly(facts, site):
                self.decline(
                    call,
                    "whether this loader has worker processes is unknown: "
                    + hidden_options_reason(facts, call),
                )
            return []
        if any("persistent_workers" in source.entries for source in sources):
            return []
        return [source for source in sources if "num_workers" in source.entries]

    def _holders_fixable(self, call: cst.Call, holders: List[OptionsDict]) -> bool:
        """Only alternatives hold `num_workers`, each a count a dict entry can test; else the
        loader is declined or reported. Holders whose count is 0 lose their entry."""
        facts = self.facts
        if len({id(h.branch_of) if h.branch_of else id(h) for h in holders}) > 1:
            self.decline(
                call,
                "`num_workers` is set by more than one of the dicts its options are merged "
                f"from ({', '.join(f'`{h.name}`' for h in holders)}): `persistent_workers` "
                "added to one could meet `num_workers=0` from another",
            )
            return False
        for index, holder in enumerate(holders):
            workers = holder.entries["num_workers"]
            count = literal(workers, NOT_LITERAL)
            if count is NOT_LITERAL and not is_pure(facts, workers):
                self._report_impure(call)
                return False
            if count is not NOT_LITERAL and not (type(count) is int and count > 0):
                holders[index] = replace(holder, entries={})  # no workers on this path
        return True

    def _fix_source(self, holder: OptionsDict, calls: List[cst.Call]) -> None:
        """Adds `persistent_workers` next to `num_workers` in `holder` when every loader the
        dict reaches gets it; else declines each loader with the reason."""
        others = [c for c in holder.loaders if c not in calls]
        if holder.problem is not None or others:
            reason = holder.problem or (
                f"`{holder.name}` also gives its options to `{_loader_name(self.facts, others[0])}`"
                ", which must not get persistent workers (see its own reason)"
            )
            for call in calls:
                self.decline(call, reason)
            return
        for call in calls:  # the same edit for each: every loader it fixes is reported fixed
            self._fix_dict(holder, call)

    def _fix_dict(self, found: OptionsDict, call: cst.Call) -> None:
        """Adds `persistent_workers` next to the `num_workers` of options dict `found`."""
        value = _persistent(found.entries["num_workers"])
        self.report(
            call,
            Fix((Replace(found.node, found.with_entry("persistent_workers", value)),)),
            message="DataLoader workers are started again for every epoch: its options "
            f"come from `{found.name}`",
            fix_title=f"Add `persistent_workers` to `{found.name}`",
        )

    def _report_impure(self, call: cst.Call) -> None:
        self.report(
            call,
            message="DataLoader workers are started again for every epoch; "
            "`num_workers` is computed by a call: store it in a variable and add "
            "`persistent_workers=<variable> > 0`",
        )

    def _fix_call(self, call: cst.Call, workers: cst.BaseExpression) -> None:
        literal_count = literal(workers, NOT_LITERAL) is not NOT_LITERAL
        fixed = with_keyword(call, "persistent_workers", _persistent(workers))
        title = None if literal_count else "Add `persistent_workers=<num_workers> > 0`"
        self.report(call, Fix((Replace(call, fixed),)), fix_title=title)


def _loader_name(facts, call: cst.Call) -> str:
    assignment = facts.assignment_of(call)
    return assignment.target if assignment is not None else excerpt(call)


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

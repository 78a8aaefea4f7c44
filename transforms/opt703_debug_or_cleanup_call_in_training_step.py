"""OPT703: anomaly detection, a profiler or per-step cleanup left on in the training step."""

from __future__ import annotations

from typing import Optional, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import excerpt
from optimizer_codemod.analysis.debugging import DebugSite
from optimizer_codemod.analysis.periodic import every_nth_step, step_counter
from optimizer_codemod.analysis.epochs import body_holding
from optimizer_codemod.analysis.script import BACKWARD_CALL
from optimizer_codemod.analysis.syncs import EMPTY_CACHE, SYNCHRONIZE
from optimizer_codemod.rule import Edit, Example, Fix, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion

# How often a per-step `empty_cache()` runs instead: huggingface/peft#2894 settled on every
# 10th step, which kept most of the speed and most of the memory.
EMPTY_CACHE_EVERY = 10
_LOOP = (
    "for step, (x, y) in enumerate(loader):\n"
    "    loss = model(x, y)\n"
    "    loss.backward()\n"
    "    optimizer.step()\n"
)

WHY = {
    "anomaly": "anomaly detection is on for training: every backward op checks its output "
    "for NaN and keeps the traceback of its forward op",
    "anomaly-context": "anomaly detection is on for training: every backward op checks its "
    "output for NaN and keeps the traceback of its forward op",
    "profiler": "the profiler records every op of every training step it encloses",
    "collect": "`gc.collect()` runs a full garbage collection on every step",
    "empty_cache": "`empty_cache()` on every step hands the cached device memory back to the "
    "driver, waiting for the device, and the next step allocates it again",
    "synchronize": "`synchronize()` makes the host wait for the device on every step",
}


class DebugOrCleanupCallInTrainingStep(Rule):
    """
    What it does:
        Takes debugging switches and per-step housekeeping out of training: deletes
        `torch.autograd.set_detect_anomaly(True)` (at module level, or in a function that
        runs a training loop), unwraps `with torch.autograd.detect_anomaly():` around a
        training loop or step, deletes `gc.collect()` and `torch.cuda.synchronize()` that
        run on every step of a training loop, and makes a per-step
        `torch.cuda.empty_cache()` run every 10th step (`if step % 10 == 0:`). Profilers
        that record every step (`torch.autograd.profiler.profile`, `emit_nvtx`,
        `torch.profiler.profile` without a `schedule=`) are reported, not removed. Only
        what runs unconditionally: a switch behind `if args.debug:` or a call under
        `if step % 100 == 0:` is the user's choice, not a leftover. A check of the device
        is no switch: `synchronize()` or `empty_cache()` alone in `if
        args.device.startswith("cuda"):` (or `if torch.cuda.is_available():`, `if
        device == "cuda":`) runs on every step on that device, and the fix deletes (or
        gates) the whole `if`.

    Why is it slow:
        Anomaly mode records the forward traceback of every op and, in backward, checks
        every gradient for NaN, which reads it back on the host: a user in
        Lightning-AI/pytorch-lightning#17359 measured training 2.5x faster once it was off,
        and PyTorch's documentation says to enable it only for debugging. `gc.collect()`
        walks every Python object on every step. `empty_cache()` returns the allocator's
        cached blocks to the driver (`cudaFree`, which synchronises the device), and the next
        step pays `cudaMalloc` for them again. `synchronize()` stops the host from queuing
        the next step while the device works. A profiler without a schedule records every
        op of every step.

    Example:
        ```python
        torch.autograd.set_detect_anomaly(True)
        for step, (x, y) in enumerate(loader):
            loss = model(x, y)
            loss.backward()
            optimizer.step()
            gc.collect()
            torch.cuda.empty_cache()
        ```
        becomes
        ```python
        for step, (x, y) in enumerate(loader):
            loss = model(x, y)
            loss.backward()
            optimizer.step()
            if step % 10 == 0:
                torch.cuda.empty_cache()
        ```

    Fix safety:
        `behavior`: what happens on errors and to memory changes. Without anomaly mode a NaN
        gradient no longer raises and errors in backward no longer name the forward op
        behind them; turn it on again to debug. Without `gc.collect()`, objects in reference
        cycles (and device memory they hold) are freed at Python's next automatic
        collection instead of every step. With `empty_cache()` every 10th step, the
        allocator keeps more memory reserved between calls: other processes on the same GPU
        see less free memory (huggingface/peft#2894: reserved memory 12.0 GB on average with
        the call on every step, 14.5 GB every 10th step, 22.1 GB never). It is never simply
        deleted, and it is only reported where the loop has no step counter
        (`enumerate`, `range`) to count with. `synchronize()` is deleted only where it
        gains something and nothing needs it: reported instead where the loop reads a clock
        (`time.time()`: the sync makes the step time include the device's work), where a
        comment beside it says why it is there, where the script runs work off the default
        stream (`torch.distributed` collectives, DDP, CUDA streams or events: the sync may
        be what makes that work finish before something reads its result), or where
        another sync stays on every step (`loss.item()`), unless another fix of the same run
        takes that one off the step too. Profilers are reported only: removing one discards
        what the user wanted to record (give it a `schedule=` to record a few steps).
        Calls that share their line with other code are reported, not edited.

    Expected gain:
        In huggingface/peft#2894 (LoRA fine-tuning, 250 steps), deleting a per-step
        `gc.collect()` took 108 s to 65 s, and calling `empty_cache()` every 10th step
        instead of every step 65 s to 50 s (45 s without it, at the memory cost above).
        Lightning-AI/pytorch-lightning#17359 reports 2.5x faster training without anomaly
        detection. Guides that recommend `gc.collect()` and `empty_cache()` on every step
        as an optimisation have it backwards. Measured here on the CPU by
        `benchmarks/rule_gains/opt703.py` and `opt703_anomaly.py` (the training step of a
        256-512-10 MLP, batch 64, one thread; 2-core x86_64, torch 2.13.0+cpu, 2026-11-24,
        three runs on a machine shared with other jobs): a per-step `gc.collect()` added 158
        to 235 ms to each step in a process holding 283,000 Python objects (what importing
        torch leaves), against 0.75 to 0.81 ms for the step itself. It costs the same
        whatever the step, so a longer step loses a smaller share; peft's figures come to
        172 ms per step ((108 s - 65 s) / 250). Anomaly detection made the same step 2.9x to 7.6x slower (2.3 to 7.5 ms
        against 0.8 to 1.1 ms). `empty_cache()` and `synchronize()` do nothing on a CPU and
        were not measured here.
    """

    code = "OPT703"
    name = "debug-or-cleanup-call-in-training-step"
    message = "Debugging or cleanup left on in the training step costs time on every step"
    fix_title = "Remove it (turn it on again to debug)"
    safety = Safety.BEHAVIOR
    min_torch = TorchVersion(1, 0)
    triggers = (r"(?:detect_anomaly|\bprofile|emit_nvtx|\bcollect|empty_cache|synchronize)\b",)
    requires = (BACKWARD_CALL,)
    # Anomaly detection is a process-wide autograd switch: a script whose training loops are
    # in other modules of the run turns it on for them, with no backward call of its own.
    process_wide = True
    removes_syncs = {SYNCHRONIZE: Safety.BEHAVIOR, EMPTY_CACHE: Safety.BEHAVIOR}
    examples = (
        Example(
            "import torch\n\ntorch.autograd.set_detect_anomaly(True)\n" + _LOOP,
            "import torch\n\n" + _LOOP,
        ),
        Example(
            "import gc\nimport torch\n"
            + _LOOP
            + "    gc.collect()\n    torch.cuda.empty_cache()\n",
            "import gc\nimport torch\n"
            + _LOOP
            + "    if step % 10 == 0:\n        torch.cuda.empty_cache()\n",
        ),
        Example("import gc\n" + _LOOP + "    if step % 100 == 0:\n        gc.collect()\n"),
        Example(
            "import torch\n"
            "schedule = torch.profiler.schedule(wait=1, warmup=1, active=3)\n"
            "with torch.profiler.profile(schedule=schedule) as prof:\n"
            + "".join(f"    {line}\n" for line in _LOOP.splitlines())
            + "        prof.step()\n"
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        for site in self.facts.debug_switches.sites:
            what = WHY[site.kind]
            if site.kind == "profiler":
                self.report(
                    site.node,
                    message=f"`{excerpt(site.node)}`: {what}",
                    fix_title="Record a few steps (`torch.profiler.profile(schedule=...)`) or "
                    "remove it",
                )
                continue
            obstacle = site.obstacle or self._obstacle(site)
            if obstacle is not None:
                self.report(site.node, message=f"{what}; not changed because {obstacle}")
                continue
            edits, title = self._edits(site)
            self.report(site.node, Fix(edits), message=what, fix_title=title)

    def _obstacle(self, site: DebugSite) -> Optional[str]:
        syncs = self.facts.host_syncs
        if site.kind == "empty_cache" and step_counter(self.facts, site.loop) is None:
            return (
                "the loop has no step counter to run it every 10th step, and deleting it "
                "keeps more device memory reserved"
            )
        if site.kind != "synchronize":
            return None
        needed = syncs.synchronize_obstacle(site.sync)
        if needed is not None:
            return needed
        plan = syncs.plan(site.loop, self.sync_removals_applied())
        for sync in plan.remaining:
            return f"`{excerpt(sync.node)}` waits for the device on every step as well"
        return None

    def _edits(self, site: DebugSite) -> Tuple[Tuple[Edit, ...], str]:
        if site.kind == "empty_cache":
            counter = step_counter(self.facts, site.loop)
            gated = every_nth_step(site.statement, counter, EMPTY_CACHE_EVERY)
            return (Replace(site.statement, gated),), f"Run it every {EMPTY_CACHE_EVERY}th step"
        if site.kind == "anomaly-context":
            return (_unwrapped(site),), "Take the step out of anomaly detection"
        title = self.fix_title if site.kind == "anomaly" else "Remove it"
        return _deleted(self.facts, site.statement), title


def _unwrapped(site: DebugSite) -> Replace:
    """The `with` without the item; with no item left, its block in its place."""
    statement = site.statement
    items = [item for item in statement.items if item.item is not site.node]
    if items:
        items[-1] = items[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return Replace(statement, statement.with_changes(items=items))
    body = list(statement.body.body)
    body[0] = body[0].with_changes(leading_lines=[*statement.leading_lines, *body[0].leading_lines])
    return Replace(statement, cst.FlattenSentinel(body))


def _deleted(facts, line: cst.BaseStatement) -> Tuple[Edit, ...]:
    """Delete `line`. Comments above it go with it when they stand apart (a blank line or the
    block's end follows it); when the next statement follows directly, they head a group
    and stay, with the blank lines above them, on the next statement."""
    edits: Tuple[Edit, ...] = (Replace(line, cst.RemovalSentinel.REMOVE),)
    body = body_holding(facts, line)
    statements = list(body.body) if body is not None else []
    index = next((i for i, s in enumerate(statements) if s is line), None)
    if index is None or index + 1 >= len(statements) or not line.leading_lines:
        return edits
    following = statements[index + 1]
    if following.leading_lines and not following.leading_lines[0].comment:
        return edits  # a blank line: the next statement starts a group of its own
    carried = following.with_changes(leading_lines=[*line.leading_lines, *following.leading_lines])
    return edits + (Replace(following, carried),)

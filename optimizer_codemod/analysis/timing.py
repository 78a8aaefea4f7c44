"""Code whose running time the script measures.

A blocking copy to the device waits for the work queued before it, so in a timed loop it is
what makes the time include the device's work (peft's dora-caching.py times three forwards
with `with timeit(logs):`, a context manager of the file that reads `time.perf_counter()`).
A fix that removes such a wait changes what the script reports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst

from optimizer_codemod.analysis.calls import code_of
from optimizer_codemod.analysis.nodes import find_all

if TYPE_CHECKING:
    from optimizer_codemod.analysis.script import ScriptFacts

# Functions that read the time: a device sync before them makes a step's timing honest.
CLOCKS = frozenset(
    {
        "time.time",
        "time.perf_counter",
        "time.monotonic",
        "time.process_time",
        "time.time_ns",
        "time.perf_counter_ns",
        "time.monotonic_ns",
        "timeit.default_timer",
        "datetime.datetime.now",
    }
)


def timed_by(facts: "ScriptFacts", node: cst.CSTNode) -> Optional[str]:
    """How the time of the code around `node` is measured, as written: a clock read in the
    body of a loop around it (`t0 = time.time()`), or a `with` around it whose context
    manager is a function of this file reading a clock; None when neither is found."""
    memo = facts.memo("timed_by")
    clocking = memo.get("functions")
    if clocking is None:
        clocking = memo["functions"] = _clock_reading_functions(facts)
    loops = memo.setdefault("loops", {})
    current = facts.parents.get(node)
    while current is not None and not isinstance(current, cst.Module):
        if isinstance(current, (cst.For, cst.While)):
            if id(current) not in loops:
                loops[id(current)] = next(
                    (
                        call
                        for call in find_all(current.body, cst.Call)
                        if facts.qualified_name(call.func) in CLOCKS
                    ),
                    None,
                )
            clock = loops[id(current)]
            if clock is not None:
                return f"the loop around it reads the clock (`{code_of(clock)}`)"
        if isinstance(current, cst.With):
            for item in current.items:
                manager = item.item
                if isinstance(manager, cst.Call) and isinstance(manager.func, cst.Name):
                    if manager.func.value in clocking:
                        return (
                            f"`with {code_of(manager)}:` around it reads the clock "
                            f"(`{manager.func.value}` calls `{clocking[manager.func.value]}`)"
                        )
        if isinstance(current, (cst.FunctionDef, cst.ClassDef)):
            return None
        current = facts.parents.get(current)
    return None


def _clock_reading_functions(facts: "ScriptFacts") -> dict:
    found = {}
    for name, definition in facts.top_level_definitions.items():
        if not isinstance(definition, cst.FunctionDef):
            continue
        for call in find_all(definition.body, cst.Call):
            qualname = facts.qualified_name(call.func)
            if qualname in CLOCKS:
                found[name] = qualname
                break
    return found

"""What every rule needs to know about a training script, computed once per pass.

Rules ask `ScriptFacts` (via `self.facts`) instead of matching the script themselves.
"""

from optimizer_codemod.analysis.collect import Assignment, CallSite, Loop, Site
from optimizer_codemod.analysis.devices import DeviceKind
from optimizer_codemod.analysis.imports import ImportTable, dotted_name
from optimizer_codemod.analysis.script import ScriptFacts

__all__ = [
    "Assignment",
    "CallSite",
    "DeviceKind",
    "ImportTable",
    "Loop",
    "ScriptFacts",
    "Site",
    "dotted_name",
]

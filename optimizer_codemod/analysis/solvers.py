"""Calls of differential-equation solvers (torchdiffeq's `odeint`, torchsde's `sdeint`).

Their work depends on the values they see: an adaptive solver (dopri5, torchdiffeq's
default, at `rtol=1e-7, atol=1e-9`) shrinks its steps until its error estimate fits the
tolerance, so rounding every evaluation to bfloat16 makes it take many more steps
(reading round 7: torchdiffeq's ode_demo.py took 15 to 35 times the function evaluations
under autocast, latent_ode.py about 200 times). And their loops over time compile badly:
torchdiffeq's `rk_common.py` calls `unique(return_counts=True)`, which Inductor cannot lower
(a `DynamicOutputShapeException` on the first forward, torch 2.13.0), and its
`_UncheckedAssign` custom Function fails under AOTAutograd.

- `solver_calls(facts)`: the calls of the file to such a solver, whether the name is imported
  once (`from torchdiffeq import odeint`) or under a flag (`odeint_adjoint as odeint` in one
  branch, `odeint` in the other);
- `functions_reaching_solvers(facts)`: the functions and methods of the file that run one,
  themselves or through others of the file;
- `solver_in_model_code(facts, model)`: where a trained model's code runs one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import callee_name

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.collect import CallSite
    from optimizer_codemod.analysis.script import ScriptFacts
    from optimizer_codemod.analysis.training import TrainedModel

SOLVER_PACKAGES = ("torchdiffeq", "torchsde")


def solver_calls(facts: "ScriptFacts") -> List["CallSite"]:
    memo = facts.memo("solver_calls")
    if "all" not in memo:
        memo["all"] = [call for call in facts.records.calls if _solves(facts, call)]
    return memo["all"]


def is_solver(qualname: str) -> bool:
    return qualname.split(".")[0] in SOLVER_PACKAGES


def _solves(facts: "ScriptFacts", call: "CallSite") -> bool:
    if call.qualname is not None:
        return is_solver(call.qualname)
    if not isinstance(call.node.func, cst.Name):
        return False
    targets = facts.imports.possible_targets(call.node.func.value)
    return bool(targets) and all(is_solver(target) for target in targets)


def functions_reaching_solvers(facts: "ScriptFacts") -> Dict[str, "CallSite"]:
    """Names of the functions and methods of the file that run a solver call, directly or
    through other functions of the file (matched by name, as functions_reaching_backward
    does), each with the solver call it reaches: one walk back over the file's calls."""
    memo = facts.memo("functions_reaching_solvers")
    if "all" in memo:
        return memo["all"]
    reaching: Dict[str, "CallSite"] = {}
    pending: List[str] = []
    for call in solver_calls(facts):
        function = call.site.function
        if isinstance(function, cst.FunctionDef) and function.name.value not in reaching:
            reaching[function.name.value] = call
            pending.append(function.name.value)
    if pending:
        callers: Dict[str, List[str]] = {}
        for call in facts.records.calls:
            function = call.site.function
            name = callee_name(call.node)
            if isinstance(function, cst.FunctionDef) and name is not None:
                callers.setdefault(name, []).append(function.name.value)
        while pending:
            callee = pending.pop()
            for caller in callers.get(callee, ()):
                if caller not in reaching:
                    reaching[caller] = reaching[callee]
                    pending.append(caller)
    memo["all"] = reaching
    return reaching


def solver_in_model_code(
    facts: "ScriptFacts", model: "TrainedModel"
) -> Optional[Tuple["CallSite", "CallSite", bool]]:
    """(a call in `model`'s code, the solver call it makes or reaches, whether the call is
    surely the model's): among the model's layer calls in this file
    (training.model_layer_calls), else (not surely) in a method of any class of the file,
    itself or through functions of the file (the layer lists a model is assembled from are
    not all followed: torchdiffeq's odenet_mnist.py builds `nn.Sequential(*feature_layers)`
    from `[ODEBlock(...)] if is_odenet else [...]`); None when none."""
    from optimizer_codemod.analysis.training import model_layer_calls

    solving = {id(call.node) for call in solver_calls(facts)}
    if not solving:
        return None
    for call in model_layer_calls(facts, model):
        if id(call.node) in solving:
            return call, call, True
    reaching = functions_reaching_solvers(facts)
    for call in facts.records.calls:
        if call.site.class_name is None:
            continue
        via = call if id(call.node) in solving else reaching.get(callee_name(call.node) or "")
        if via is not None:
            return call, via, False
    return None

"""`torch.distributions` objects that check their arguments, built where the script loops.

A distribution validates by default (`Distribution._validate_args = __debug__`, pytorch#48743):
its constructor checks each parameter against its constraint, and `log_prob` checks the value,
each with `if not ...all():` on a tensor, so on a CUDA tensor the host waits for the device at
every check. A policy built every step (`Categorical(logits=self.actor(x))` in a PPO agent's
`get_action_and_value`, called on every rollout and update step) waits two or three times a
step. `validate_args=False` skips the checks; on valid arguments every result is the same.

Compiling turns the checks off for the whole process: the first `torch.compile` (also
`Module.compile()`) runs Dynamo's `TorchPatcher.patch()`, which calls
`Distribution.set_default_validate_args(False)` (torch/_dynamo/eval_frame.py, torch 2.13.0;
tests/test_distribution_validation.py checks it). An explicit `validate_args=True` still wins.

- `default_validated(facts)`: the calls that build one relying on the default (no
  `validate_args` by keyword or position, no `*args`/`**kwargs`), in a file that does not turn
  validation off already (by hand, or by compiling anything); what compiling would change;
- `validated_distributions(facts)`: those of them built in a loop of the file or in a function
  of the file that a loop calls (directly or through one more function), from at least one
  argument that may be on a device. Functions are matched by name (`f(...)`, `self.f(...)`,
  `agent.f(...)`) when the file defines that name once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import argument, has_double_star, has_star_args
from optimizer_codemod.analysis.syncs import called_in_a_loop, off_device
from optimizer_codemod.analysis.values import local_function

if TYPE_CHECKING:  # pragma: no cover
    from optimizer_codemod.analysis.collect import CallSite
    from optimizer_codemod.analysis.script import ScriptFacts

# The classes of torch.distributions, each with how many parameters its constructor takes
# before `validate_args` (torch 2.13.0): `Normal(loc, scale, False)` passes it by position.
DISTRIBUTIONS = {
    "Bernoulli": 2,
    "Beta": 2,
    "Binomial": 3,
    "Categorical": 2,
    "Cauchy": 2,
    "Chi2": 1,
    "ContinuousBernoulli": 3,
    "Dirichlet": 1,
    "Exponential": 1,
    "FisherSnedecor": 2,
    "Gamma": 2,
    "Geometric": 2,
    "Gumbel": 2,
    "HalfCauchy": 1,
    "HalfNormal": 1,
    "Independent": 2,
    "Kumaraswamy": 2,
    "Laplace": 2,
    "LogNormal": 2,
    "LogisticNormal": 2,
    "LowRankMultivariateNormal": 3,
    "MixtureSameFamily": 2,
    "Multinomial": 3,
    "MultivariateNormal": 4,
    "NegativeBinomial": 3,
    "Normal": 2,
    "OneHotCategorical": 2,
    "OneHotCategoricalStraightThrough": 2,
    "Pareto": 2,
    "Poisson": 1,
    "RelaxedBernoulli": 3,
    "RelaxedOneHotCategorical": 3,
    "StudentT": 3,
    "TransformedDistribution": 2,
    "Uniform": 2,
    "VonMises": 2,
    "Weibull": 2,
}
_TURNED_OFF = "torch.distributions.Distribution.set_default_validate_args"


@dataclass(frozen=True)
class ValidatedDistribution:
    call: "CallSite"
    kind: str  # the class: "Categorical"
    runs_in: Optional[cst.FunctionDef]  # the function a loop calls, None: in the loop itself


def default_validated(facts: "ScriptFacts") -> List[Tuple["CallSite", str]]:
    memo = facts.memo("default_validated")
    if "all" not in memo:
        memo["all"] = [] if _validation_off(facts) else _default_validated(facts)
    return memo["all"]


def validated_distributions(facts: "ScriptFacts") -> List[ValidatedDistribution]:
    memo = facts.memo("validated_distributions")
    if "all" not in memo:
        memo["all"] = _validated(facts)
    return memo["all"]


def _validation_off(facts: "ScriptFacts") -> bool:
    """The script turns distribution checks off for the process: by hand, or by compiling."""
    if facts.uses(_TURNED_OFF, "torch.compile"):
        return True
    return any(call.qualname is None for call in facts.method_calls("compile"))


def distribution_class(call: "CallSite") -> Optional[str]:
    """`Categorical` for `torch.distributions.Categorical(...)` or
    `torch.distributions.categorical.Categorical(...)`; None for anything else."""
    qualname = call.qualname or ""
    if not qualname.startswith("torch.distributions."):
        return None
    kind = qualname.rsplit(".", 1)[-1]
    return kind if kind in DISTRIBUTIONS else None


def _default_validated(facts: "ScriptFacts") -> List[Tuple["CallSite", str]]:
    found = []
    for call in facts.records.calls:
        kind = distribution_class(call)
        if kind is None or has_double_star(call.node) or has_star_args(call.node):
            continue  # `*args`, `**kwargs` may hold validate_args
        if argument(call.node, "validate_args", DISTRIBUTIONS[kind]) is None:
            found.append((call, kind))  # not chosen by keyword or position (`Normal(m, s, False)`)
    return found


def _validated(facts: "ScriptFacts") -> List[ValidatedDistribution]:
    built = default_validated(facts)
    looping = _functions_called_in_loops(facts) if built else set()
    found = []
    for call, kind in built:
        if all(_on_host(facts, arg.value, call.site.function) for arg in call.node.args):
            continue  # checks of host tensors wait for nothing
        if call.site.loops:
            found.append(ValidatedDistribution(call, kind, None))
            continue
        function = call.site.function
        if function is not None and id(function) in looping:
            found.append(ValidatedDistribution(call, kind, function))
    return found


def _on_host(
    facts: "ScriptFacts", value: cst.BaseExpression, function: Optional[cst.FunctionDef]
) -> bool:
    """A number, `x.cpu()` (`.numpy()`, `.tolist()`), or a name every assignment of the same
    function binds to one (p-christ's REINFORCE: `probs = self.policy.forward(state).cpu()`)."""
    if isinstance(value, (cst.Integer, cst.Float)):
        return True
    if isinstance(value, cst.Call):
        return off_device(facts, value)
    if not isinstance(value, cst.Name):
        return False
    bound = [a for a in facts.assignments_to(value.value) if a.site.function is function]
    return bool(bound) and all(
        not (a.unpacked or a.augmented or isinstance(a.value, cst.Name))
        and _on_host(facts, a.value, function)
        for a in bound
    )


def _functions_called_in_loops(facts: "ScriptFacts") -> Set[int]:
    """ids of the functions of the file a loop calls, or a function so called calls (syncs'
    `called_in_a_loop`, with calls matched by name whatever their receiver)."""
    callers: Dict[int, List["CallSite"]] = {}
    for call in facts.records.calls:
        function = local_function(facts, call, any_receiver=True)
        if function is not None:
            callers.setdefault(id(function), []).append(call)
    return {
        id(function)
        for function in facts.records.functions.values()
        if called_in_a_loop(function, callers) is not None
    }

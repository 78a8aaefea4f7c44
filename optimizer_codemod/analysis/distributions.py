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
  validation off already (by hand, or by compiling anything); what compiling would change.
  A class of the file derived from one of torch's (`class FixedCategorical(Categorical)`, the
  a2c-ppo-acktr-gail shape) builds one too;
- `unchecked_by_compiling(facts)`: what compiling the script would stop checking, its own
  distributions or those of the modules of the run it imports (the project index's
  `checked_distributions` setting), in words; None when nothing. A distribution built in a
  function or class that only its own definition names (DiT's unused
  `continuous_gaussian_log_likelihood`; for the project index, named nowhere else in the
  run) is never built: it does not count;
- `validated_distributions(facts)`: those of them built in a loop of the file or in a function
  of the file that a loop calls (directly or through one more function), from at least one
  argument that may be on a device. Functions are matched by name (`f(...)`, `self.f(...)`,
  `agent.f(...)`) when the file defines that name once. A derived class counts only when it
  takes torch's constructor as it is (one base, no `__init__` of its own): another signature
  may not take `validate_args`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

import libcst as cst

from optimizer_codemod.analysis.calls import (
    argument,
    excerpt,
    has_double_star,
    has_star_args,
    keyword,
)
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
class DerivedDistribution:
    """A class of the file derived, directly or through another, from a torch distribution."""

    kind: str  # torch's class it derives from: "Categorical"
    same_constructor: bool  # one base in the chain, none with an `__init__` of its own


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


def unchecked_by_compiling(facts: "ScriptFacts") -> Optional[str]:
    """`Categorical(logits=x)` (shortened), or "the distributions `core.py` builds": what a
    compile in this script would stop checking; None when nothing would."""
    text = None
    for call, _ in default_validated(facts):
        owner = building_definition(call)
        if owner is not None:
            text = facts.module.code if text is None else text
            if len(re.findall(rf"\b{owner}\b", text)) < 2:
                continue  # only its definition names it: nothing runs it
        return f"`{excerpt(call.node, 40)}`"
    project = facts.project
    if project is None or not project.imported.checked_distributions or _validation_off(facts):
        return None
    return f"the distributions {project.decided_by('checked_distributions')} builds"


def building_definition(call: "CallSite") -> Optional[str]:
    """The class (for a method) or function of the file in which `call` is made; None at the
    top level or in a lambda: code that runs when the module does, or cannot be told apart."""
    site = call.site
    if site.class_name is not None:
        return site.class_name
    function = site.function
    return function.name.value if isinstance(function, cst.FunctionDef) else None


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


def distribution_class(facts: "ScriptFacts", call: "CallSite") -> Optional[str]:
    """`Categorical` for `torch.distributions.Categorical(...)`,
    `torch.distributions.categorical.Categorical(...)`, or `FixedCategorical(...)` of a class
    of the file derived from it; None for anything else."""
    if call.qualname is None:
        name = call.node.func
        derived = (
            derived_distributions(facts).get(name.value) if isinstance(name, cst.Name) else None
        )
        return derived.kind if derived is not None else None
    return _torch_class(call.qualname)


def _torch_class(qualname: Optional[str]) -> Optional[str]:
    if not (qualname or "").startswith("torch.distributions."):
        return None
    kind = qualname.rsplit(".", 1)[-1]
    return kind if kind in DISTRIBUTIONS else None


def derived_distributions(facts: "ScriptFacts") -> Dict[str, DerivedDistribution]:
    """The classes the file defines once at its top level that derive from a torch
    distribution, by name. A base is defined before the class that names it, so one pass in
    the order of the file sees every chain."""
    memo = facts.memo("derived_distributions")
    if "all" not in memo:
        found: Dict[str, DerivedDistribution] = {}
        definitions = facts.top_level_definitions
        for statement in facts.module.body:
            if not isinstance(statement, cst.ClassDef) or statement.name.value not in definitions:
                continue
            bases = facts.classes[statement.name.value].bases
            for base in bases:
                kind = _torch_class(base)
                inherited = found.get(base or "")
                if kind is None and inherited is None:
                    continue
                found[statement.name.value] = DerivedDistribution(
                    kind or inherited.kind,
                    len(bases) == 1
                    and (inherited is None or inherited.same_constructor)
                    and not _defines_init(statement),
                )
                break
        memo["all"] = found
    return memo["all"]


def _defines_init(node: cst.ClassDef) -> bool:
    return any(
        isinstance(s, cst.FunctionDef) and s.name.value == "__init__" for s in node.body.body
    )


def _default_validated(facts: "ScriptFacts") -> List[Tuple["CallSite", str]]:
    found = []
    for call in facts.records.calls:
        kind = distribution_class(facts, call)
        if kind is None or has_double_star(call.node) or has_star_args(call.node):
            continue  # `*args`, `**kwargs` may hold validate_args
        # An `__init__` of a derived class may take other arguments: only the keyword tells.
        chosen = (
            argument(call.node, "validate_args", DISTRIBUTIONS[kind])
            if _same_constructor(facts, call)
            else keyword(call.node, "validate_args")
        )
        if chosen is None:
            found.append((call, kind))  # not chosen by keyword or position (`Normal(m, s, False)`)
    return found


def _same_constructor(facts: "ScriptFacts", call: "CallSite") -> bool:
    """The call runs torch's own constructor: of torch's class, or of a class derived from it
    that keeps it."""
    if call.qualname is not None:
        return True
    derived = derived_distributions(facts).get(getattr(call.node.func, "value", ""))
    return derived is not None and derived.same_constructor


def _validated(facts: "ScriptFacts") -> List[ValidatedDistribution]:
    built = default_validated(facts)
    looping = _functions_called_in_loops(facts) if built else set()
    found = []
    for call, kind in built:
        if not _same_constructor(facts, call):
            continue  # it may not take `validate_args`
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

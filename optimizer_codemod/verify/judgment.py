"""Is a candidate equivalent to the original? Two checks, each held to figures of its own.

Training amplifies last-bit differences, so loss curves alone cannot tell a bug from chaos: a
correct fused optimizer in a GAN drifts by 6e-2 after 20 steps, while a wrong attention scale
moves the loss of a GPT by 1e-5. The judgment therefore separates:

- the **local error**: at a few iterations the candidate takes one step from the original's
  exact training state (`checks.py`), and its loss, gradients and parameter update are compared
  with the original's. Nothing has had time to amplify, so the tolerance is the safety level's
  own: float32 summation order for `safe`, bfloat16 rounding for `numerics`. Fixes at the
  `behavior` level may change random streams (data order, augmentation), so one step from the
  same state may see other data: their local figures are reported, not judged.
- the **trajectory**: the candidate's free-running loss curve against the original's, allowed
  to differ by the level's floor (the old fixed tolerance) or by `ENVELOPE_FACTOR` times what
  chaos alone does, whichever is larger. What chaos alone does is measured: runs of the original
  perturbed after every step by noise as large as the candidate's own measured update error
  (`checks.Perturbation`). The envelope is the running maximum of their distance from the
  original, since two chaotic runs that happen to meet again have not stopped being apart.
  For `numerics` fixes, also `ROUNDING_FACTOR` times how far the original drifts when run
  under bfloat16 autocast: autocast's rounding is a bias repeated every step, which noise of
  the same size does not reproduce.

The figures behind each threshold are in docs/verify.md ("How the judgment works").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from optimizer_codemod.rule import Safety

# The trajectory may differ by this multiple of the perturbed originals' distance. A correct
# rewrite of a chaotic GAN (fused Adam, benchmarks/verify_cases/gan.py, 160 iterations) came
# 3.1x farther from the original than the perturbed runs at its worst step: 20 keeps such a
# rewrite 5x below the threshold. Bugs are caught by the local check, which does not amplify.
ENVELOPE_FACTOR = 20.0
# Perturbed runs are made when the floor alone leaves a margin below this (and not otherwise:
# a deterministic rewrite needs none).
MARGIN_GOAL = 5.0
PERTURBED_RUNS = 2
# A parameter tensor's gradient is compared when it carries at least this share of the norm.
TENSOR_SHARE = 0.01
# Relative noise per parameter and step when no update error was measured (no optimizer).
FALLBACK_RELATIVE_NOISE = 1e-6


# A numerics rewrite's local figures may reach this multiple of the script's own sensitivity to
# bfloat16 rounding (its original, run under bfloat16 autocast). Correct rewrites of the reference
# workloads measured 1.0-1.33x their script's rounding (the most: SDPA under autocast on the
# sudoku denoiser), so 7 keeps them at least 5x below the limit; wrong edits measured far above
# (benchmarks/results/verify-mutants-cpu.md, docs/verify.md).
ROUNDING_FACTOR = 7.0


@dataclass(frozen=True)
class Tolerance:
    """What one safety level allows.

    Trajectory: losses `a` (original) and `b` agree when `|a - b| <= rtol * max(|a|, floor)`
    with `floor = atol / rtol` (absolute near zero), or within the chaos envelope. With
    `window > 1` the curves are first averaged over blocks of that many losses.
    Local: relative differences of one step from the same state (loss, gradient, update).
    """

    level: Safety
    rtol: float
    atol: float
    window: int = 1
    local_loss: float = math.inf
    local_gradient: float = math.inf
    local_update: float = math.inf
    # Local limits grow to this multiple of the script's own bfloat16 rounding (None: fixed).
    rounding_factor: Optional[float] = None

    @property
    def floor(self) -> float:
        return self.atol / self.rtol

    @property
    def judges_local(self) -> bool:
        return math.isfinite(self.local_update)

    def describe(self) -> str:
        text = f"{self.rtol:.1e}"
        if self.window > 1:
            text += f" on means of {self.window} losses"
        return text


TOLERANCES: Dict[Safety, Tolerance] = {
    # One step from the same state: bit-identical, or summation order inside a kernel.
    Safety.SAFE: Tolerance(
        Safety.SAFE, rtol=1e-5, atol=1e-6, local_loss=1e-5, local_gradient=1e-4, local_update=1e-4
    ),
    # bfloat16 autocast, SDPA, fused kernels: measured local errors of correct rewrites are
    # 0.01-2% (docs/verify.md); wrong attention scales, dropped masks and misplaced zero_grad
    # measure 15-100%.
    Safety.NUMERICS: Tolerance(
        Safety.NUMERICS,
        rtol=2e-2,
        atol=1e-3,
        local_loss=5e-2,
        local_gradient=5e-2,
        local_update=0.1,
        rounding_factor=ROUNDING_FACTOR,
    ),
    Safety.BEHAVIOR: Tolerance(Safety.BEHAVIOR, rtol=1e-1, atol=1e-2, window=5),
}


def tolerance_for(level: Safety) -> Tolerance:
    return TOLERANCES[min(level, Safety.BEHAVIOR)]


def relative_difference(a: float, b: float, floor: float) -> float:
    if math.isnan(a) and math.isnan(b):
        return 0.0
    if math.isnan(a) or math.isnan(b):
        return math.inf
    if a == b:  # equal infinities too
        return 0.0
    return abs(a - b) / max(abs(a), floor)


def _margin(threshold: float, measured: float) -> float:
    if measured <= 0:
        return math.inf
    return threshold / measured


# --- local ---------------------------------------------------------------------------------


@dataclass
class LocalStep:
    """One check iteration: the candidate's step from the original's state, against the original's."""

    iteration: int
    loss: float  # largest relative loss difference in the iteration
    gradient: Optional[float]  # largest relative gradient difference (per optimizer step)
    update: Optional[float]  # relative difference of the whole update
    problem: Optional[str] = None  # why the step could not be compared


METRICS = ("loss", "gradient", "update")


@dataclass
class LocalJudgment:
    tolerance: Tolerance
    steps: List[LocalStep] = field(default_factory=list)
    unavailable: Optional[str] = None  # why no step could be checked
    # The original's own step under bfloat16 autocast, against the original: how far rounding
    # alone moves each figure in this script (numerics only; None when not measured).
    rounding: Optional[Dict[str, float]] = None

    @property
    def judged(self) -> bool:
        return self.tolerance.judges_local and self.unavailable is None

    def limit(self, metric: str) -> float:
        """The level's fixed limit, or `ROUNDING_FACTOR` x this script's rounding if larger."""
        fixed = getattr(self.tolerance, f"local_{metric}")
        if self.rounding is None or self.tolerance.rounding_factor is None:
            return fixed
        measured = self.rounding.get(metric) or 0.0
        return max(fixed, self.tolerance.rounding_factor * measured)

    def _figures(self):
        for step in self.steps:
            if step.problem is not None:
                yield step, "structure", 1.0, math.inf
                continue
            for metric in METRICS:
                value = getattr(step, metric)
                if value is not None:
                    yield step, metric, self.limit(metric), value

    @property
    def margin(self) -> Optional[float]:
        if not self.judged:
            return None
        margins = [_margin(limit, value) for _, _, limit, value in self._figures()]
        return min(margins, default=None)

    @property
    def worst(self):
        """(step, what, threshold, value) with the smallest margin."""
        figures = list(self._figures())
        if not figures:
            return None
        return min(figures, key=lambda f: _margin(f[2], f[3]))

    @property
    def passed(self) -> bool:
        return not self.judged or all(value <= limit for _, _, limit, value in self._figures())

    def update_errors(self, checks: Sequence[Dict[str, Any]]) -> Dict[str, float]:
        """The largest measured update error of each parameter: the perturbation's size."""
        sizes: Dict[str, float] = {}
        for check in checks:
            for key, value in (check.get("update_errors") or {}).items():
                sizes[key] = max(sizes.get(key, 0.0), float(value))
        return sizes


def rounding_of(tolerance: Tolerance, result: Optional[Dict[str, Any]]) -> Dict[str, float]:
    """The largest figure of each metric in the rounding reference's compare run."""
    reference = judge_local(tolerance, result)
    figures: Dict[str, float] = {}
    for step in reference.steps:
        if step.problem is not None:
            continue
        for metric in METRICS:
            value = getattr(step, metric)
            if value is not None and math.isfinite(value):
                figures[metric] = max(figures.get(metric, 0.0), value)
    return figures


def judge_local(
    tolerance: Tolerance,
    result: Optional[Dict[str, Any]],
    rounding: Optional[Dict[str, float]] = None,
) -> LocalJudgment:
    """The candidate's compare-run `check` result, judged at `tolerance`."""
    judgment = LocalJudgment(tolerance, rounding=rounding)
    checks = (result or {}).get("checks") or []
    if not checks:
        judgment.unavailable = (
            "no iteration could be restored (the original stepped no optimizer before a "
            "checked iteration: hand-written updates, or too few steps)"
        )
        return judgment
    for check in checks:
        iteration = int(check["iteration"])
        if not check.get("restored"):
            missing = ", ".join(check.get("missing") or [])
            judgment.steps.append(
                LocalStep(iteration, 0.0, None, None, f"could not restore: {missing}")
            )
            continue
        losses_a, losses_b = check["losses"]
        if (
            len(losses_a) != len(losses_b)
            or check["gradient_steps"][0] != check["gradient_steps"][1]
        ):
            judgment.steps.append(
                LocalStep(
                    iteration,
                    0.0,
                    None,
                    None,
                    f"the original made {len(losses_a)} backward calls and "
                    f"{check['gradient_steps'][0]} optimizer steps in this iteration, the "
                    f"candidate {len(losses_b)} and {check['gradient_steps'][1]}",
                )
            )
            continue
        loss = max(
            (relative_difference(a, b, tolerance.floor) for a, b in zip(losses_a, losses_b)),
            default=0.0,
        )
        gradient = _largest_per_tensor(check.get("gradient_tensors") or [])
        if len(check.get("gradient_tensors") or []) < len(check.get("grads") or []):
            gradient = math.inf  # gradients on one side only (set to None before the step)
        update = _relative(check.get("update"))
        judgment.steps.append(LocalStep(iteration, loss, gradient, update))
    return judgment


def _relative(pair: Optional[Sequence[float]]) -> Optional[float]:
    if pair is None:
        return None
    distance, norm = pair
    if distance == 0:
        return 0.0
    return distance / norm if norm > 0 else math.inf


def _largest_per_tensor(steps: Sequence[Sequence[Sequence[float]]]) -> Optional[float]:
    """The largest relative gradient difference of one parameter tensor, over optimizer steps.

    Per tensor, because a wrong edit often touches one part of a model (an attention scale
    moves the query and key weights' gradients by 10-14%, the whole gradient by 2-4%). Tensors
    carrying under `TENSOR_SHARE` of the summed gradient norm are left out: their relative
    difference is rounding of near-zero values, not a signal.
    """
    values = []
    for tensors in steps:
        total = sum(norm for _, norm in tensors)
        for distance, norm in tensors:
            if total > 0 and norm >= TENSOR_SHARE * total:
                values.append(_relative((distance, norm)))
            elif norm == 0 and distance > 0:
                values.append(math.inf)
    return max((v for v in values if v is not None), default=None)


# --- trajectory ----------------------------------------------------------------------------


def _blocks(values: Sequence[float], window: int) -> List[float]:
    if window <= 1:
        return list(values)
    return [
        sum(values[i : i + window]) / len(values[i : i + window])
        for i in range(0, len(values), window)
    ]


@dataclass
class Comparison:
    """Two loss curves side by side (block means when compared in windows), and how far apart."""

    before: List[float]
    after: List[float]
    differences: List[float]  # relative difference at each position
    length_before: int
    length_after: int

    @property
    def lengths_match(self) -> bool:
        return self.length_before == self.length_after

    @property
    def max_relative(self) -> float:
        return max(self.differences, default=0.0)

    @property
    def worst(self) -> Optional[int]:
        if not self.differences:
            return None
        return self.differences.index(self.max_relative)

    def first_beyond(self, rtol: float) -> Optional[int]:
        """The first position (0-based) whose difference exceeds `rtol`."""
        return next((i for i, d in enumerate(self.differences) if d > rtol), None)


def compare_losses(before: Sequence[float], after: Sequence[float], tol: Tolerance) -> Comparison:
    a, b = _blocks(before, tol.window), _blocks(after, tol.window)
    differences = [relative_difference(x, y, tol.floor) for x, y in zip(a, b)]
    return Comparison(a, b, differences, len(before), len(after))


def _distances_scaled_by(
    reference: Sequence[float], a: Sequence[float], b: Sequence[float], tol: Tolerance
) -> List[float]:
    """|a - b| relative to the reference's magnitude, position by position."""
    ref, xs, ys = (_blocks(v, tol.window) for v in (reference, a, b))
    return [
        (abs(x - y) / max(abs(r), tol.floor)) if math.isfinite(x - y) else math.inf
        for r, x, y in zip(ref, xs, ys)
    ]


@dataclass
class TrajectoryJudgment:
    """The candidate's loss curve against the original's, within the floor or the envelope."""

    tolerance: Tolerance
    comparison: Comparison  # the candidate run farthest from the original
    envelope: Optional[List[float]] = None  # relative, running max over perturbed runs
    perturbed_runs: int = 0
    # Relative, running max: how far the original drifts under bfloat16 autocast everywhere.
    rounding_envelope: Optional[List[float]] = None

    def threshold(self, position: int) -> float:
        limit = self.tolerance.rtol
        if self.envelope is not None and position < len(self.envelope):
            limit = max(limit, ENVELOPE_FACTOR * self.envelope[position])
        factor = self.tolerance.rounding_factor
        if factor and self.rounding_envelope is not None and position < len(self.rounding_envelope):
            limit = max(limit, factor * self.rounding_envelope[position])
        return limit

    @property
    def margin(self) -> float:
        differences = self.comparison.differences
        return min(
            (_margin(self.threshold(i), d) for i, d in enumerate(differences)), default=math.inf
        )

    @property
    def first_beyond(self) -> Optional[int]:
        differences = self.comparison.differences
        return next((i for i, d in enumerate(differences) if d > self.threshold(i)), None)

    @property
    def passed(self) -> bool:
        comparison = self.comparison
        return (
            comparison.lengths_match and comparison.length_before > 0 and self.first_beyond is None
        )


def judge_trajectory(
    tolerance: Tolerance,
    reference: Sequence[float],
    candidates: Sequence[Sequence[float]],
    perturbed: Sequence[Sequence[float]] = (),
    rounding: Optional[Sequence[float]] = None,
) -> TrajectoryJudgment:
    comparisons = [compare_losses(reference, losses, tolerance) for losses in candidates]
    mismatched = [c for c in comparisons if not c.lengths_match]
    comparison = mismatched[0] if mismatched else max(comparisons, key=lambda c: c.max_relative)
    judgment = TrajectoryJudgment(tolerance, comparison)
    if perturbed:
        spreads = [compare_losses(reference, losses, tolerance).differences for losses in perturbed]
        # Perturbed runs against each other too: more pairs, a steadier estimate of chaos.
        for i, first in enumerate(perturbed):
            for second in perturbed[i + 1 :]:
                spreads.append(_distances_scaled_by(reference, first, second, tolerance))
        pointwise = [max(values) for values in zip(*spreads)] if spreads else []
        judgment.envelope = _running_max(pointwise)
        judgment.perturbed_runs = len(perturbed)
    if rounding is not None:
        drift = compare_losses(reference, rounding, tolerance)
        if drift.lengths_match:
            judgment.rounding_envelope = _running_max(drift.differences)
    return judgment


def _running_max(values: Sequence[float]) -> List[float]:
    """Two chaotic runs that happen to meet again have not stopped being apart."""
    envelope, running = [], 0.0
    for value in values:
        running = max(running, value if math.isfinite(value) else 0.0)
        envelope.append(running)
    return envelope

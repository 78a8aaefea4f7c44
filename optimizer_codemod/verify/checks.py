"""The probe's side of the equivalence judgment: local steps from a shared state, and perturbation.

Local error (`--check-at`, `--check-dir`, `--check-role`):
- the original (`record`) keeps, during each iteration before a check iteration k, a copy of
  its training state after every optimizer step (the last one is the state iteration k starts
  from) and writes it to the folder when iteration k starts. Through iteration k it records the
  losses, each optimizer's gradients when it steps, and at the start of iteration k+1 the update
  every parameter received;
- the candidate (`compare`) restores that state after the same optimizer step of iteration k-1,
  takes iteration k, records the same things and compares them with the original's: the result
  holds, per check, both losses, `||g_a - g_b||` and `||g_a||` of the gradients, the same for the
  update, and each parameter's update error (the size of the perturbation below).

Perturbation (`--perturb FILE`): a reference run of the original with, after each optimizer
step, random noise added to each parameter whose norm is the candidate's measured update error
for that parameter: how far chaos alone carries two runs apart when they differ by that much
each step. Without such figures (no optimizer to check against) every parameter gets relative
noise of `--perturb-relative` after each backward. The noise comes from a generator of its own,
so the script's random streams (data order, dropout) are the original's.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from optimizer_codemod.verify import state as training_state


class LocalCheck:
    """One role (`record` or `compare`) of the local-error check, driven by the probe's events."""

    def __init__(
        self,
        torch: Any,
        role: str,
        folder: str,
        iterations: Sequence[int],
        rank: str,
        last_iteration: int,
    ):
        self.torch = torch
        self.last_iteration = last_iteration  # the run stops when the one after it starts
        self.role = role
        self.folder = folder
        self.suffix = "" if rank == "0" else f".rank{rank}"
        self.planned: Dict[int, int] = {}  # check iteration -> optimizer steps before the restore
        if role == "compare":
            meta = _read_meta(self._path("meta.json"))
            self.planned = {int(k): int(v) for k, v in meta.get("checks", {}).items()}
            self.pending = sorted(self.planned)
        else:
            self.pending = sorted(k for k in set(iterations) if k >= 2)
        self.optimizers: List[Any] = []
        self.iteration = 0
        self.steps_in_iteration = 0
        self.captured: Optional[Dict[str, Any]] = None
        self.captured_in = -1
        self.captured_after = 0  # optimizer steps of that iteration when it was captured
        self.recording: Optional[Dict[str, Any]] = None  # the check iteration in progress
        self.start_params: Optional[List[List[Any]]] = None
        self.results: List[Dict[str, Any]] = []
        self.checks_written: Dict[int, int] = {}
        self._skipping: Any = None  # the optimizer whose step GradScaler is skipping

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name + self.suffix)

    # --- events --------------------------------------------------------------------------

    def optimizer_pre_step(self, optimizer: Any) -> None:
        self._know(optimizer)
        scale, skipped = scaler_handoff(optimizer)
        if skipped:
            self._skipping = optimizer
            return
        if self.recording is not None:
            grads = [
                None if p.grad is None else p.grad.detach().double().cpu() / scale
                for p in training_state.parameters_of(optimizer)
            ]
            self.recording["grads"].append(grads)

    def optimizer_post_step(self, optimizer: Any) -> None:
        self._know(optimizer)
        if self._skipping is optimizer:
            self._skipping = None
            return  # GradScaler found an inf: unfused, the step would not have been called
        self.steps_in_iteration += 1
        if self.recording is not None:
            self.recording["stepped"] = True
        if not self.pending:
            return
        upcoming = self.pending[0]
        current = max(self.iteration, 1)
        if self.role == "record" and current + 1 >= upcoming:
            self.captured = training_state.capture(self.torch, self.optimizers)
            self.captured_in, self.captured_after = current, self.steps_in_iteration
        elif (
            self.role == "compare"
            and current == upcoming - 1
            and self.steps_in_iteration == self.planned[upcoming]
        ):
            if self.recording is not None:  # its update is complete: measure it before the restore
                self._finish(self.recording)
                self.recording = None
            self.captured = self.torch.load(self._path(f"state-{upcoming}.pt"), weights_only=False)
            missing = training_state.restore(self.torch, self.optimizers, self.captured)
            self.captured_in, self.captured_after = current, self.steps_in_iteration
            if missing:
                self.results.append({"iteration": upcoming, "restored": False, "missing": missing})
                self.pending.pop(0)
                self.captured = None

    def iteration_started(self, index: int) -> None:
        """Iteration `index` (1-based) begins: its first backward is about to run."""
        if self.recording is not None:
            # A check spans the iterations up to one that steps an optimizer: with gradient
            # accumulation the first micro-batches only add to the gradients.
            if not self.recording["stepped"] and index <= self.last_iteration:
                self.iteration, self.steps_in_iteration = index, 0
                return
            self._finish(self.recording)
            self.recording = None
        self.iteration, self.steps_in_iteration = index, 0
        if not self.pending or self.captured is None or self.captured_in != index - 1:
            return
        if self.pending[0] > index:
            return
        check = self.pending.pop(0)
        if self.role == "record":
            self.torch.save(self.captured, self._path(f"state-{index}.pt"))
            self.checks_written[index] = self.captured_after
            _write_meta(self._path("meta.json"), {"checks": self.checks_written})
        self.start_params = [
            [p.detach().clone() for p in training_state.parameters_of(o)] for o in self.optimizers
        ]
        self.recording = {
            "iteration": index,
            "requested": check,
            "losses": [],
            "grads": [],
            "stepped": False,
        }
        self.captured = None

    def loss(self, value: Any) -> None:
        if self.recording is not None:
            self.recording["losses"].append(float(value.detach().float()))

    # --- the record of one check iteration ------------------------------------------------

    def _know(self, optimizer: Any) -> None:
        if not any(optimizer is o for o in self.optimizers):
            self.optimizers.append(optimizer)

    def _updates(self) -> List[List[Any]]:
        assert self.start_params is not None
        return [
            [(p.detach() - before).double().cpu() for p, before in zip(ps, befores)]
            for ps, befores in zip(
                (training_state.parameters_of(o) for o in self.optimizers), self.start_params
            )
        ]

    def _finish(self, recording: Dict[str, Any]) -> None:
        index = recording["iteration"]
        updates = self._updates()
        self.start_params = None
        if self.role == "record":
            record = dict(recording, updates=updates)
            self.torch.save(record, self._path(f"record-{index}.pt"))
            return
        original = self.torch.load(self._path(f"record-{index}.pt"), weights_only=False)
        self.results.append(self._compare(original, dict(recording, updates=updates)))

    def _compare(self, a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
        torch = self.torch
        grads, tensors = [], []
        for step_a, step_b in zip(a["grads"], b["grads"]):
            flat_a = training_state.flat(step_a, torch)
            flat_b = training_state.flat(step_b, torch)
            if flat_a is None or flat_b is None or flat_a.shape != flat_b.shape:
                grads.append(None)
                continue
            grads.append(training_state.relative_distance(flat_a, flat_b))
            tensors.append(
                [
                    training_state.relative_distance(ta, tb)
                    for ta, tb in zip(step_a, step_b)
                    if ta is not None and tb is not None
                ]
            )
        update_errors: Dict[str, float] = {}
        flat_a, flat_b = [], []
        for i, (ua, ub) in enumerate(zip(a["updates"], b["updates"])):
            for j, (ta, tb) in enumerate(zip(ua, ub)):
                if ta.shape != tb.shape:
                    continue
                update_errors[f"o{i}.p{j}"] = float((ta - tb).norm())
                flat_a.append(ta.flatten())
                flat_b.append(tb.flatten())
        update = (
            training_state.relative_distance(torch.cat(flat_a), torch.cat(flat_b))
            if flat_a
            else None
        )
        return {
            "iteration": a["iteration"],
            "restored": True,
            "losses": [a["losses"], b["losses"]],
            "grads": grads,
            "gradient_tensors": tensors,
            "gradient_steps": [len(a["grads"]), len(b["grads"])],
            "update": update,
            "update_errors": update_errors,
        }

    def result(self) -> Dict[str, Any]:
        return {"role": self.role, "checks": self.results, "recorded": self.checks_written}


class Perturbation:
    """Noise added to the parameters after each step, from a generator of its own."""

    def __init__(self, torch: Any, norms: Dict[str, float], relative: float, seed: int):
        self.torch = torch
        self.norms = norms
        self.relative = relative
        self.generator = torch.Generator().manual_seed(seed)
        self.optimizers: List[Any] = []
        self.parameters: Optional[List[Any]] = None  # found once: a gc scan per step is slow

    def _noise_like(self, tensor: Any) -> Any:
        noise = self.torch.randn(tensor.shape, generator=self.generator, dtype=self.torch.float64)
        return noise.to(device=tensor.device)

    def after_optimizer_step(self, optimizer: Any) -> None:
        if not any(optimizer is o for o in self.optimizers):
            self.optimizers.append(optimizer)
        if not self.norms:
            return
        index = next(i for i, o in enumerate(self.optimizers) if o is optimizer)
        with self.torch.no_grad():
            for j, param in enumerate(training_state.parameters_of(optimizer)):
                size = self.norms.get(f"o{index}.p{j}", 0.0)
                if size <= 0 or param.numel() == 0:
                    continue
                noise = self._noise_like(param)
                param.add_((noise * (size / float(noise.norm()))).to(param.dtype))

    def after_backward(self) -> None:
        if self.norms or self.relative <= 0:
            return
        if self.parameters is None:
            self.parameters = [
                p
                for module in training_state.root_modules(self.torch)
                for p in module.parameters()
                if p.requires_grad and p.is_floating_point()
            ]
        with self.torch.no_grad():
            for param in self.parameters:
                noise = self._noise_like(param)
                param.add_((param.double() * noise * self.relative).to(param.dtype))


def scaler_handoff(optimizer: Any) -> Tuple[float, bool]:
    """The scale an optimizer's gradients still carry when its step begins, and whether the step
    is a skipped one.

    GradScaler unscales the gradients before an ordinary optimizer's step, and skips the step
    when they hold an inf or NaN. An optimizer that unscales inside its own kernel (`fused=True`)
    is instead handed `grad_scale` and `found_inf` and called either way: its gradients are
    still scaled here, so they are compared divided by the scale, and a step GradScaler would
    have skipped is not counted."""
    found_inf = getattr(optimizer, "found_inf", None)
    if found_inf is not None and float(found_inf) != 0.0:
        return 1.0, True
    grad_scale = getattr(optimizer, "grad_scale", None)
    return (1.0 if grad_scale is None else float(grad_scale)), False


def load_perturbation(torch: Any, path: Optional[str], relative: float, seed: int):
    if path is None and relative <= 0:
        return None
    norms: Dict[str, float] = {}
    if path is not None:
        with open(path, encoding="utf-8") as handle:
            norms = {k: float(v) for k, v in json.load(handle).items()}
    return Perturbation(torch, norms, relative, seed)


def _read_meta(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError:
        return {}


def _write_meta(path: str, data: Dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
